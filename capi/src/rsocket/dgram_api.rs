//! The rsocket calls on datagram sockets: [`super::api`]'s exports come here when the fd
//! names a [`DSocket`].

use super::api::{
    copy_addr, fail, sleep_on, RDMA_INLINE, RDMA_IOMAPSIZE, RDMA_ROUTE, RDMA_RQSIZE, RDMA_SQSIZE, SOL_RDMA,
};
use super::dgram::DSocket;
use super::socket::Step;
use crate::ffi;
use libc::{c_int, c_void, socklen_t};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long `rclose` waits for the messages sent to leave.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

pub(crate) type Shared = Arc<Mutex<DSocket>>;

fn table() -> MutexGuard<'static, BTreeMap<c_int, Shared>> {
    static T: Mutex<BTreeMap<c_int, Shared>> = Mutex::new(BTreeMap::new());
    T.lock().unwrap_or_else(|e| e.into_inner())
}

/// The datagram rsocket `fd` names, if it names one.
pub(crate) fn lookup(fd: c_int) -> Option<Shared> {
    table().get(&fd).cloned()
}

pub(crate) fn lock(s: &Shared) -> MutexGuard<'_, DSocket> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new datagram rsocket: its number.
pub(crate) fn create(domain: c_int, nonblock: bool) -> Result<c_int, c_int> {
    let s = DSocket::new(domain, nonblock)?;
    let fd = s.fd();
    table().insert(fd, Arc::new(Mutex::new(s)));
    Ok(fd)
}

/// Runs `f` until it is done, sleeping (unlocked) whenever it waits.
fn run<T>(s: &Shared, mut f: impl FnMut(&mut DSocket) -> Step<T>) -> Result<T, c_int> {
    loop {
        let step = f(&mut lock(s));
        match step {
            Step::Done(r) => return r,
            Step::Wait(w) => sleep_on(w),
        }
    }
}

fn nonblocking(s: &DSocket, flags: c_int) -> bool {
    s.nonblock || flags & libc::MSG_DONTWAIT != 0
}

/// One message to `to` (the connected peer if `None`).
pub(crate) fn send(s: &Shared, data: &[u8], to: Option<SocketAddr>, flags: c_int) -> Result<usize, c_int> {
    run(s, |d| {
        let nb = nonblocking(d, flags);
        d.send(data, to, nb)
    })
}

/// One message into `out`, and its sender.
pub(crate) fn recv(s: &Shared, out: &mut [u8], flags: c_int) -> Result<(usize, SocketAddr), c_int> {
    let peek = flags & libc::MSG_PEEK != 0;
    run(s, |d| {
        let nb = nonblocking(d, flags);
        d.recv(out, nb, peek)
    })
}

/// Writes `a` into the caller's address buffer (if it gave one).
///
/// # Safety
/// `out` and `len` are NULL or as getsockname(2) takes them.
pub(crate) unsafe fn write_addr(a: SocketAddr, out: *mut ffi::sockaddr, len: *mut socklen_t) -> c_int {
    if out.is_null() || len.is_null() {
        return 0;
    }
    // SAFETY: plain C data; all-zero is valid.
    let mut storage: ffi::sockaddr_storage = unsafe { std::mem::zeroed() };
    crate::cm_addr::to_storage(a, &mut storage);
    // SAFETY: the caller's contract; a storage just filled.
    unsafe { copy_addr((&raw const storage).cast(), out, len) }
}

/// `rshutdown`.
pub(crate) fn shutdown(s: &Shared, how: c_int) -> Result<(), c_int> {
    run(s, |d| d.shutdown(how))
}

/// `rclose` of a datagram rsocket: what was sent leaves (for at most [`CLOSE_WAIT`]),
/// then the socket goes; with `SOFTRDMA_RSOCKET_STATS` set, what it carried is printed on
/// stderr. Whether `fd` named one.
pub(crate) fn close(fd: c_int) -> bool {
    let Some(s) = table().remove(&fd) else { return false };
    let deadline = Instant::now() + CLOSE_WAIT;
    while Instant::now() < deadline {
        let step = lock(&s).shutdown(libc::SHUT_RDWR);
        match step {
            Step::Done(_) => break,
            Step::Wait(w) => sleep_on(w),
        }
    }
    if std::env::var_os("SOFTRDMA_RSOCKET_STATS").is_some() {
        let (c, peers) = {
            let d = lock(&s);
            (d.counts, d.peers())
        };
        eprintln!(
            "softrdma rsocket {fd}: sent {} over UD, {} over UDP; received {} over UD, {} over UDP; {peers} peers",
            c.sent_ud, c.sent_udp, c.received_ud, c.received_udp
        );
    }
    true
}

/// `rsetsockopt`: queue and inline sizes (SOL_RDMA) before the first message; every other
/// option is the UDP socket's, as librdmacm passes them on, and SO_SNDBUF and SO_RCVBUF
/// also size the queues.
///
/// # Safety
/// `val` holds `len` bytes.
pub(crate) unsafe fn setsockopt(s: &Shared, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    let mut d = lock(s);
    if level != SOL_RDMA {
        // SAFETY: the caller's contract.
        if unsafe { libc::setsockopt(d.fd(), level, name, val, len) } != 0 {
            return -1;
        }
    }
    // SAFETY: the caller's contract.
    let v = match unsafe { super::api::read_int(val, len) } {
        Ok(v) => v.max(0),
        Err(_) if level != SOL_RDMA => return 0,
        Err(e) => return fail(e),
    };
    let to_u16 = |v: c_int| v.min(c_int::from(u16::MAX)) as u16;
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) if d.unused() => d.rbuf_bytes = (v as u32).saturating_mul(2),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) if d.unused() => d.sbuf_bytes = (v as u32).saturating_mul(2),
        (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE) if !d.unused() => return fail(libc::EINVAL),
        (SOL_RDMA, RDMA_SQSIZE) => d.sq_size = to_u16(v),
        (SOL_RDMA, RDMA_RQSIZE) => d.rq_size = to_u16(v),
        (SOL_RDMA, RDMA_INLINE) => d.inline = v as u32,
        (SOL_RDMA, RDMA_IOMAPSIZE | RDMA_ROUTE) => {}
        (SOL_RDMA, _) => return fail(libc::ENOTSUP),
        _ => {}
    }
    0
}

/// `rgetsockopt`: SOL_RDMA's sizes, and the buffer sizes as set; the rest is the UDP
/// socket's.
///
/// # Safety
/// `val` has room for `*len` bytes.
pub(crate) unsafe fn getsockopt(s: &Shared, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    let d = lock(s);
    let v = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => (d.rbuf_bytes / 2) as c_int,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => (d.sbuf_bytes / 2) as c_int,
        (SOL_RDMA, RDMA_SQSIZE) => c_int::from(d.sq_size),
        (SOL_RDMA, RDMA_RQSIZE) => c_int::from(d.rq_size),
        (SOL_RDMA, RDMA_INLINE) => d.inline as c_int,
        (SOL_RDMA, _) => return fail(libc::ENOTSUP),
        // SAFETY: the caller's contract.
        _ => return unsafe { libc::getsockopt(d.fd(), level, name, val, len) },
    };
    // SAFETY: the caller's contract.
    unsafe { super::api::write_int(v, val, len) }
}
