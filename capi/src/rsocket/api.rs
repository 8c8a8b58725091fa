//! The rsocket calls of `rdma/rsocket.h`, exported with librdmacm's symbol version. A socket
//! is named by its rdma_cm id's channel fd, as librdmacm names it, so its numbers never
//! collide with the process's other fds and `rpoll` can take both kinds at once.
//!
//! Datagram sockets (`SOCK_DGRAM`) are named by their UDP socket's fd and served by
//! [`super::dgram_api`].

use super::dgram_api as dgram;
use super::socket::{RSocket, State, Step, Wait};
use crate::ffi;
use libc::{c_int, c_void, socklen_t};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `SOL_RDMA` (rsocket.h) and its options.
pub(super) const SOL_RDMA: c_int = 0x10000;
pub(super) const RDMA_SQSIZE: c_int = 0;
pub(super) const RDMA_RQSIZE: c_int = 1;
pub(super) const RDMA_INLINE: c_int = 2;
pub(super) const RDMA_IOMAPSIZE: c_int = 3;
pub(super) const RDMA_ROUTE: c_int = 4;

/// The longest a waiting call sleeps before it looks again: another thread of the same
/// socket may have taken the completion event it waited for.
const WAIT_SLICE: Duration = Duration::from_millis(50);

type Shared = Arc<Mutex<RSocket>>;

fn table() -> MutexGuard<'static, BTreeMap<c_int, Shared>> {
    static T: Mutex<BTreeMap<c_int, Shared>> = Mutex::new(BTreeMap::new());
    T.lock().unwrap_or_else(|e| e.into_inner())
}

fn lookup(fd: c_int) -> Result<Shared, c_int> {
    table().get(&fd).cloned().ok_or(libc::EBADF)
}

fn lock(s: &Shared) -> MutexGuard<'_, RSocket> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn fail<T: From<i8>>(e: c_int) -> T {
    crate::set_errno(e);
    T::from(-1)
}

fn int(r: Result<(), c_int>) -> c_int {
    r.map_or_else(fail, |()| 0)
}

fn size(r: Result<usize, c_int>) -> isize {
    r.map_or_else(fail, |n| n as isize)
}

pub(super) fn sleep_on(w: Wait) {
    let Wait::Readable(fd) = w;
    softrdma::driver::spin::wait_readable(&[fd], WAIT_SLICE);
}

/// Runs `f` on socket `fd` until it is done, sleeping (unlocked) whenever it waits.
fn run<T>(fd: c_int, mut f: impl FnMut(&mut RSocket) -> Step<T>) -> Result<T, c_int> {
    let s = lookup(fd)?;
    loop {
        let step = f(&mut lock(&s));
        match step {
            Step::Done(r) => return r,
            Step::Wait(w) => sleep_on(w),
        }
    }
}

thread_local! {
    /// Set while this library makes sockets of its own (a device's UDP socket).
    static OWN_SOCKETS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, in which this library makes sockets of its own: under librspreload, whose
/// `socket` asks `rsocket` first for every socket a process makes, `rsocket` refuses
/// them (ENOTSUP) so that they are the kernel's, as a device needs.
pub(crate) fn making_own_sockets<T>(f: impl FnOnce() -> T) -> T {
    let was = OWN_SOCKETS.replace(true);
    let r = f();
    OWN_SOCKETS.set(was);
    r
}

/// `rsocket`: a stream socket over RDMA, or a datagram socket over UD (IPv4 or IPv6).
/// Unlike librdmacm's, it takes
/// `SOCK_NONBLOCK` and `SOCK_CLOEXEC` in the type as socket(2) does, so programs that
/// always pass them (Python's socket module does) get RDMA through librspreload rather
/// than its fallback to TCP.
#[no_mangle]
pub extern "C" fn rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    if OWN_SOCKETS.get() {
        return fail(libc::ENOTSUP);
    }
    let nonblock = kind & libc::SOCK_NONBLOCK != 0;
    let kind = kind & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return fail(libc::ENOTSUP);
    }
    if kind == libc::SOCK_DGRAM && (protocol == 0 || protocol == libc::IPPROTO_UDP) {
        return dgram::create(domain, nonblock).unwrap_or_else(fail);
    }
    if kind != libc::SOCK_STREAM {
        return fail(libc::ENOTSUP);
    }
    if protocol != 0 && protocol != libc::IPPROTO_TCP {
        return fail(libc::ENOTSUP);
    }
    match RSocket::new() {
        Ok(mut s) => {
            s.nonblock = nonblock;
            let fd = s.fd();
            table().insert(fd, Arc::new(Mutex::new(s)));
            fd
        }
        Err(e) => fail(e),
    }
}

/// `rbind`.
///
/// # Safety
/// `addr` points at a socket address of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rbind(fd: c_int, addr: *const ffi::sockaddr, len: socklen_t) -> c_int {
    if let Some(d) = dgram::lookup(fd) {
        // SAFETY: the caller's contract.
        return int(unsafe { dgram::lock(&d).bind(addr, len) });
    }
    int(lookup(fd).and_then(|s| lock(&s).bind(addr)))
}

/// `rlisten`.
#[no_mangle]
pub extern "C" fn rlisten(fd: c_int, backlog: c_int) -> c_int {
    if dgram::lookup(fd).is_some() {
        return fail(libc::EOPNOTSUPP);
    }
    int(lookup(fd).and_then(|s| lock(&s).listen(backlog)))
}

/// `raccept`: the next connection, set up and accepted.
///
/// # Safety
/// `addr`/`len` are NULL or a buffer for the peer's address and its size.
#[no_mangle]
pub unsafe extern "C" fn raccept(fd: c_int, addr: *mut ffi::sockaddr, len: *mut socklen_t) -> c_int {
    if dgram::lookup(fd).is_some() {
        return fail(libc::EOPNOTSUPP);
    }
    match run(fd, RSocket::accept) {
        Ok(child) => {
            let new_fd = child.fd();
            table().insert(new_fd, Arc::new(Mutex::new(child)));
            if !addr.is_null() && !len.is_null() {
                // SAFETY: the caller's buffers.
                unsafe { rgetpeername(new_fd, addr, len) };
            }
            new_fd
        }
        Err(e) => fail(e),
    }
}

/// `rconnect`: EINPROGRESS on a non-blocking socket until `rpoll` reports POLLOUT.
///
/// # Safety
/// `addr` points at a socket address.
#[no_mangle]
pub unsafe extern "C" fn rconnect(fd: c_int, addr: *const ffi::sockaddr, _len: socklen_t) -> c_int {
    if let Some(d) = dgram::lookup(fd) {
        // SAFETY: the caller's contract.
        let Some(peer) = (unsafe { crate::cm_addr::from_c(addr) }) else { return fail(libc::EAFNOSUPPORT) };
        return int(dgram::lock(&d).connect(peer));
    }
    int(lookup(fd).and_then(|s| lock(&s).connect(addr)))
}

fn nonblocking(s: &RSocket, flags: c_int) -> bool {
    s.nonblock || flags & libc::MSG_DONTWAIT != 0
}

/// Sends all of `data` (a blocking socket) or what fits now (non-blocking).
fn send_all(fd: c_int, data: &[u8], flags: c_int) -> Result<usize, c_int> {
    send_loop(fd, data.len(), flags, |s, done, nb| s.send(&data[done..], nb))
}

/// Runs `step` (given the bytes done so far and whether to block) until `len` bytes are
/// done, it makes no progress, or it fails: the bytes done, or the error if none were.
fn send_loop(
    fd: c_int,
    len: usize,
    flags: c_int,
    mut step: impl FnMut(&mut RSocket, usize, bool) -> Step<usize>,
) -> Result<usize, c_int> {
    let s = lookup(fd)?;
    lock(&s).new_send();
    let mut done = 0;
    while done < len {
        let next = {
            let mut g = lock(&s);
            let nb = nonblocking(&g, flags);
            step(&mut g, done, nb)
        };
        match next {
            Step::Done(Ok(0)) => break,
            Step::Done(Ok(n)) => done += n,
            Step::Done(Err(e)) if done == 0 => return Err(e),
            Step::Done(Err(_)) => break,
            Step::Wait(w) => sleep_on(w),
        }
    }
    Ok(done)
}

/// Receives into `out`: what has come (waiting for something unless non-blocking), or all
/// of it with MSG_WAITALL; 0 at the end of the stream.
fn recv_some(fd: c_int, out: &mut [u8], flags: c_int) -> Result<usize, c_int> {
    let s = lookup(fd)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let mut got = 0;
    loop {
        let step = {
            let mut g = lock(&s);
            let nb = nonblocking(&g, flags);
            g.recv(&mut out[got..], nb, peek)
        };
        match step {
            Step::Done(Ok(n)) => {
                got += n;
                if n == 0 || got == out.len() || peek || flags & libc::MSG_WAITALL == 0 {
                    return Ok(got);
                }
            }
            Step::Done(Err(e)) if got == 0 => return Err(e),
            Step::Done(Err(_)) => return Ok(got),
            Step::Wait(w) => sleep_on(w),
        }
    }
}

/// # Safety
/// `buf` holds `len` bytes (or `len` is 0).
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if len == 0 || buf.is_null() {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(buf.cast(), len) }
}

/// # Safety
/// `buf` has room for `len` bytes (or `len` is 0).
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> &'a mut [u8] {
    if len == 0 || buf.is_null() {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
}

/// `rsend`.
///
/// # Safety
/// `buf` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rsend(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    // SAFETY: the caller's contract.
    let data = unsafe { bytes(buf, len) };
    if let Some(d) = dgram::lookup(fd) {
        return size(dgram::send(&d, data, None, flags));
    }
    size(send_all(fd, data, flags))
}

/// `rrecv`.
///
/// # Safety
/// `buf` has room for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rrecv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    // SAFETY: the caller's contract.
    let out = unsafe { bytes_mut(buf, len) };
    if let Some(d) = dgram::lookup(fd) {
        return size(dgram::recv(&d, out, flags).map(|(n, _)| n));
    }
    size(recv_some(fd, out, flags))
}

/// `rread`.
///
/// # Safety
/// As [`rrecv`].
#[no_mangle]
pub unsafe extern "C" fn rread(fd: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: the caller's contract.
    unsafe { rrecv(fd, buf, len, 0) }
}

/// `rwrite`.
///
/// # Safety
/// As [`rsend`].
#[no_mangle]
pub unsafe extern "C" fn rwrite(fd: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: the caller's contract.
    unsafe { rsend(fd, buf, len, 0) }
}

/// `rsendto`: a connected stream takes no address; a datagram socket sends to `to` (its
/// peer if NULL).
///
/// # Safety
/// As [`rsend`].
#[no_mangle]
pub unsafe extern "C" fn rsendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    to: *const ffi::sockaddr,
    to_len: socklen_t,
) -> isize {
    if let Some(d) = dgram::lookup(fd) {
        // SAFETY: the caller's contract.
        let (data, to) = unsafe { (bytes(buf, len), crate::cm_addr::from_c(to)) };
        return size(dgram::send(&d, data, to, flags));
    }
    if !to.is_null() || to_len != 0 {
        return fail(libc::EISCONN);
    }
    // SAFETY: the caller's contract.
    unsafe { rsend(fd, buf, len, flags) }
}

/// `rrecvfrom`: as `rrecv`; a stream reports no source, a datagram its sender.
///
/// # Safety
/// As [`rrecv`].
#[no_mangle]
pub unsafe extern "C" fn rrecvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    from: *mut ffi::sockaddr,
    from_len: *mut socklen_t,
) -> isize {
    if let Some(d) = dgram::lookup(fd) {
        // SAFETY: the caller's contract.
        let got = dgram::recv(&d, unsafe { bytes_mut(buf, len) }, flags);
        if let Ok((_, a)) = got {
            // SAFETY: the caller's contract.
            unsafe { dgram::write_addr(a, from, from_len) };
        }
        return size(got.map(|(n, _)| n));
    }
    // SAFETY: the caller's contract.
    unsafe { rrecv(fd, buf, len, flags) }
}

/// # Safety
/// `iov` holds `n` valid iovecs (or `n` is 0).
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: c_int) -> &'a [libc::iovec] {
    if iov.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(iov, n as usize) }
}

/// Gathers `iov` and sends it (one message to `to`, or the peer, on a datagram socket).
///
/// # Safety
/// `iov` holds `n` iovecs naming readable memory.
unsafe fn sendv(fd: c_int, iov: *const libc::iovec, n: c_int, flags: c_int, to: Option<SocketAddr>) -> isize {
    let mut all = Vec::new();
    // SAFETY: the caller's contract.
    for v in unsafe { iovecs(iov, n) } {
        // SAFETY: as above.
        all.extend_from_slice(unsafe { bytes(v.iov_base, v.iov_len) });
    }
    if let Some(d) = dgram::lookup(fd) {
        return size(dgram::send(&d, &all, to, flags));
    }
    size(send_all(fd, &all, flags))
}

/// Receives and scatters into `iov`; a datagram's sender goes to `from` (if not NULL).
///
/// # Safety
/// `iov` holds `n` iovecs naming writable memory; `from` is NULL or as `rrecvfrom`'s.
unsafe fn recvv(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    flags: c_int,
    from: (*mut ffi::sockaddr, *mut socklen_t),
) -> isize {
    // SAFETY: the caller's contract.
    let iov = unsafe { iovecs(iov, n) };
    let mut all = vec![0u8; iov.iter().map(|v| v.iov_len).sum()];
    let got = match dgram::lookup(fd) {
        Some(d) => dgram::recv(&d, &mut all, flags).map(|(n, a)| {
            // SAFETY: the caller's contract.
            unsafe { dgram::write_addr(a, from.0, from.1) };
            n
        }),
        None => recv_some(fd, &mut all, flags),
    };
    let got = match got {
        Ok(g) => g,
        Err(e) => return fail(e),
    };
    let mut at = 0;
    for v in iov {
        let n = v.iov_len.min(got - at);
        // SAFETY: the caller's contract; `n` within both.
        unsafe { bytes_mut(v.iov_base, n) }.copy_from_slice(&all[at..at + n]);
        at += n;
    }
    got as isize
}

/// `rwritev`.
///
/// # Safety
/// `iov` holds `n` iovecs.
#[no_mangle]
pub unsafe extern "C" fn rwritev(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    // SAFETY: the caller's contract.
    unsafe { sendv(fd, iov, n, 0, None) }
}

/// `rreadv`.
///
/// # Safety
/// `iov` holds `n` iovecs.
#[no_mangle]
pub unsafe extern "C" fn rreadv(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    // SAFETY: the caller's contract.
    unsafe { recvv(fd, iov, n, 0, (std::ptr::null_mut(), std::ptr::null_mut())) }
}

/// `rsendmsg` (no control data; a datagram socket sends to the message's name, if any).
///
/// # Safety
/// `msg` is a valid msghdr.
#[no_mangle]
pub unsafe extern "C" fn rsendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    // SAFETY: the caller's contract.
    let Some(m) = (unsafe { msg.as_ref() }) else { return fail(libc::EINVAL) };
    // SAFETY: the message's name, if any.
    let to = unsafe { crate::cm_addr::from_c(m.msg_name.cast()) };
    // SAFETY: the message's iovecs.
    unsafe { sendv(fd, m.msg_iov, m.msg_iovlen as c_int, flags, to) }
}

/// `rrecvmsg`.
///
/// # Safety
/// `msg` is a valid msghdr.
#[no_mangle]
pub unsafe extern "C" fn rrecvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    // SAFETY: the caller's contract.
    let Some(m) = (unsafe { msg.as_mut() }) else { return fail(libc::EINVAL) };
    m.msg_controllen = 0;
    m.msg_flags = 0;
    let from = if m.msg_name.is_null() { std::ptr::null_mut() } else { &raw mut m.msg_namelen };
    // SAFETY: the message's iovecs and name.
    unsafe { recvv(fd, m.msg_iov, m.msg_iovlen as c_int, flags, (m.msg_name.cast(), from)) }
}

/// `rshutdown`.
#[no_mangle]
pub extern "C" fn rshutdown(fd: c_int, how: c_int) -> c_int {
    if let Some(d) = dgram::lookup(fd) {
        return int(dgram::shutdown(&d, how));
    }
    int(run(fd, |s| s.shutdown(how)))
}

/// `rclose`: shuts a connected socket down (the peer hears it), then frees it.
#[no_mangle]
pub extern "C" fn rclose(fd: c_int) -> c_int {
    if dgram::close(fd) {
        return 0;
    }
    let Some(s) = table().remove(&fd) else { return fail(libc::EBADF) };
    let connected = lock(&s).ep.as_ref().and_then(|e| e.flow.as_ref()).is_some_and(|f| f.connected);
    if connected {
        loop {
            let step = lock(&s).shutdown(libc::SHUT_RDWR);
            match step {
                Step::Done(_) => break,
                Step::Wait(w) => sleep_on(w),
            }
        }
    }
    drop(s);
    0
}

/// One pass of `rpoll` over `fds`: rsockets looked at, the kernel's fds and what the
/// rsockets wait on polled for at most `wait_ms`. The count of entries with events.
fn poll_pass(fds: &mut [libc::pollfd], wait_ms: c_int) -> c_int {
    let mut kernel = Vec::with_capacity(fds.len());
    let mut ready = 0;
    let mut is_rs = Vec::with_capacity(fds.len());
    for p in fds.iter_mut() {
        p.revents = 0;
        let events = match lookup(p.fd) {
            Ok(s) => Some(lock(&s).poll_events(p.events)),
            Err(_) => dgram::lookup(p.fd).map(|d| dgram::lock(&d).poll_events(p.events)),
        };
        let Some(events) = events else {
            is_rs.push(false);
            kernel.push(libc::pollfd { fd: p.fd, events: p.events, revents: 0 });
            continue;
        };
        is_rs.push(true);
        match events {
            Ok(r) => {
                p.revents = r;
                ready += c_int::from(r != 0);
                kernel.push(libc::pollfd { fd: -1, events: 0, revents: 0 });
            }
            Err(wait_fd) => kernel.push(libc::pollfd { fd: wait_fd, events: libc::POLLIN, revents: 0 }),
        }
    }
    let wait = if ready > 0 { 0 } else { wait_ms };
    // SAFETY: `kernel` is a valid array of its length.
    unsafe { libc::poll(kernel.as_mut_ptr(), kernel.len() as libc::nfds_t, wait) };
    for (i, p) in fds.iter_mut().enumerate() {
        if !is_rs[i] && kernel[i].revents != 0 {
            p.revents = kernel[i].revents;
            ready += 1;
        }
    }
    ready
}

/// `rpoll`: rsockets and other fds together.
///
/// # Safety
/// `fds` holds `n` pollfds.
#[no_mangle]
pub unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout_ms: c_int) -> c_int {
    let fds: &mut [libc::pollfd] = if n == 0 || fds.is_null() {
        &mut []
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(fds, n as usize) }
    };
    let deadline = (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
    loop {
        let left = deadline.map_or(WAIT_SLICE, |d| d.saturating_duration_since(Instant::now()).min(WAIT_SLICE));
        let ready = poll_pass(fds, left.as_millis() as c_int);
        if ready > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
            return ready;
        }
    }
}

fn fd_isset(fd: c_int, set: *mut libc::fd_set) -> bool {
    // SAFETY: a valid fd_set (or NULL, checked) and an fd below FD_SETSIZE.
    !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
}

/// `rselect`, through `rpoll`.
///
/// # Safety
/// The sets are NULL or valid fd_sets; `timeout` NULL or a timeval.
#[no_mangle]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let mut polls = Vec::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut events = 0;
        if fd_isset(fd, readfds) {
            events |= libc::POLLIN;
        }
        if fd_isset(fd, writefds) {
            events |= libc::POLLOUT;
        }
        if events != 0 || fd_isset(fd, exceptfds) {
            polls.push(libc::pollfd { fd, events, revents: 0 });
        }
    }
    // SAFETY: the caller's timeval, if any.
    let ms = unsafe { timeout.as_ref() }.map_or(-1, |t| (t.tv_sec * 1000 + t.tv_usec / 1000) as c_int);
    // SAFETY: a valid array of its length.
    let r = unsafe { rpoll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
    if r < 0 {
        return r;
    }
    let mut count = 0;
    for set in [readfds, writefds, exceptfds] {
        if !set.is_null() {
            // SAFETY: a valid fd_set.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    for p in &polls {
        for (set, bits) in
            [(readfds, libc::POLLIN | libc::POLLHUP), (writefds, libc::POLLOUT), (exceptfds, libc::POLLERR)]
        {
            if !set.is_null() && p.revents & bits != 0 {
                // SAFETY: a valid fd_set and an fd below FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        }
    }
    count
}

/// Writes `addr` into the caller's buffer, truncating as getsockname(2) does; a
/// zero length asks only for the size (librspreload asks so with no buffer).
///
/// # Safety
/// `out` has room for `*len` bytes.
pub(super) unsafe fn copy_addr(
    from: *const libc::sockaddr_storage,
    out: *mut ffi::sockaddr,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: the caller's length, if any.
    if len.is_null() || (out.is_null() && unsafe { *len } != 0) {
        return fail(libc::EFAULT);
    }
    // SAFETY: a storage this library filled.
    let family = c_int::from(unsafe { (*from).ss_family });
    let size = if family == libc::AF_INET6 {
        std::mem::size_of::<libc::sockaddr_in6>()
    } else {
        std::mem::size_of::<libc::sockaddr_in>()
    };
    // SAFETY: the caller's contract; at most the smaller of both.
    unsafe {
        let n = size.min(*len as usize);
        if n > 0 {
            std::ptr::copy_nonoverlapping(from.cast::<u8>(), out.cast::<u8>(), n);
        }
        *len = size as socklen_t;
    }
    0
}

/// `rgetpeername`.
///
/// # Safety
/// As getpeername(2).
#[no_mangle]
pub unsafe extern "C" fn rgetpeername(fd: c_int, addr: *mut ffi::sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(d) = dgram::lookup(fd) {
        let peer = dgram::lock(&d).peer_addr();
        // SAFETY: the caller's contract.
        return peer.map_or_else(fail, |a| unsafe { dgram::write_addr(a, addr, len) });
    }
    let Ok(s) = lookup(fd) else { return fail(libc::EBADF) };
    let g = lock(&s);
    // SAFETY: a live id's route; its storage member is what this library writes.
    unsafe { copy_addr((&raw const (*g.id).route.addr.__bindgen_anon_2.dst_storage).cast(), addr, len) }
}

/// `rgetsockname`.
///
/// # Safety
/// As getsockname(2).
#[no_mangle]
pub unsafe extern "C" fn rgetsockname(fd: c_int, addr: *mut ffi::sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(d) = dgram::lookup(fd) {
        let local = dgram::lock(&d).local_addr();
        // SAFETY: the caller's contract.
        return local.map_or_else(fail, |a| unsafe { dgram::write_addr(a, addr, len) });
    }
    let Ok(s) = lookup(fd) else { return fail(libc::EBADF) };
    let g = lock(&s);
    // SAFETY: as in rgetpeername.
    unsafe { copy_addr((&raw const (*g.id).route.addr.__bindgen_anon_1.src_storage).cast(), addr, len) }
}

/// `rfcntl`: F_GETFL and F_SETFL (O_NONBLOCK). The C prototype is variadic; on the
/// platforms this library builds for, an `int` third argument arrives as a fixed one does.
#[no_mangle]
pub extern "C" fn rfcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int {
    let flags = |nonblock: &mut bool| match cmd {
        libc::F_GETFL => libc::O_RDWR | if *nonblock { libc::O_NONBLOCK } else { 0 },
        libc::F_SETFL => {
            *nonblock = arg & libc::O_NONBLOCK != 0;
            0
        }
        _ => fail(libc::ENOTSUP),
    };
    if let Some(d) = dgram::lookup(fd) {
        return flags(&mut dgram::lock(&d).nonblock);
    }
    let Ok(s) = lookup(fd) else { return fail(libc::EBADF) };
    let r = flags(&mut lock(&s).nonblock);
    r
}

/// # Safety
/// `val` holds at least `len` bytes.
pub(super) unsafe fn read_int(val: *const c_void, len: socklen_t) -> Result<c_int, c_int> {
    if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract; an unaligned read of an int.
    Ok(unsafe { val.cast::<c_int>().read_unaligned() })
}

/// `rsetsockopt`: sizes (SO_SNDBUF, SO_RCVBUF doubled as librdmacm does; SOL_RDMA queue
/// depths and inline size) before connecting; socket and TCP flags kept for
/// `rgetsockopt` (a reliable connection needs no TCP tuning).
///
/// # Safety
/// `val` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rsetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if let Some(d) = dgram::lookup(fd) {
        // SAFETY: the caller's contract.
        return unsafe { dgram::setsockopt(&d, level, name, val, len) };
    }
    let Ok(s) = lookup(fd) else { return fail(libc::EBADF) };
    let mut g = lock(&s);
    if level == libc::SOL_SOCKET && name == libc::SO_LINGER {
        return 0;
    }
    // SAFETY: the caller's contract.
    let v = match unsafe { read_int(val, len) } {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let unconnected = g.ep.is_none();
    let to_u16 = |v: c_int| v.clamp(0, c_int::from(u16::MAX)) as u16;
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) if unconnected => g.sizes.rbuf_size = (v.max(0) as u32).saturating_mul(2),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) if unconnected => g.sizes.sbuf_size = (v.max(0) as u32).saturating_mul(2),
        (libc::SOL_SOCKET, libc::SO_RCVBUF | libc::SO_SNDBUF) => {}
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE)
        | (
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY | libc::TCP_KEEPIDLE | libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG,
        )
        | (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
            g.flags.retain(|(k, _)| *k != (level, name));
            g.flags.push(((level, name), v));
        }
        // Before connecting; a listener's settings pass to the sockets it accepts.
        (SOL_RDMA, _) if !unconnected || !matches!(g.state, State::Idle | State::Listening) => {
            return fail(libc::EINVAL)
        }
        (SOL_RDMA, RDMA_SQSIZE) => g.sizes.sq_size = to_u16(v),
        (SOL_RDMA, RDMA_RQSIZE) => g.sizes.rq_size = to_u16(v),
        (SOL_RDMA, RDMA_INLINE) => g.inline = v.clamp(0, c_int::from(u16::MAX)) as u32,
        (SOL_RDMA, RDMA_IOMAPSIZE) => {
            let v = v.clamp(0, c_int::from(super::socket::IOMAP_ENTRIES_MAX)) as u32;
            g.iomap_entries = super::wire::scale_to_value(super::wire::value_to_scale(v)) as u16;
        }
        (SOL_RDMA, RDMA_ROUTE) => {}
        _ => return fail(libc::ENOTSUP),
    }
    0
}

/// `rgetsockopt`.
///
/// # Safety
/// `val` has room for `*len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rgetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(d) = dgram::lookup(fd) {
        // SAFETY: the caller's contract.
        return unsafe { dgram::getsockopt(&d, level, name, val, len) };
    }
    let Ok(s) = lookup(fd) else { return fail(libc::EBADF) };
    let mut g = lock(&s);
    let v = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut g.err),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => (g.sizes.rbuf_size / 2) as c_int,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => (g.sizes.sbuf_size / 2) as c_int,
        (SOL_RDMA, RDMA_SQSIZE) => c_int::from(g.sizes.sq_size),
        (SOL_RDMA, RDMA_RQSIZE) => c_int::from(g.sizes.rq_size),
        (SOL_RDMA, RDMA_INLINE) => g.inline as c_int,
        (SOL_RDMA, RDMA_IOMAPSIZE) => c_int::from(g.iomap_entries),
        (libc::SOL_SOCKET | libc::IPPROTO_TCP | libc::IPPROTO_IPV6, _) => {
            g.flags.iter().find(|(k, _)| *k == (level, name)).map_or(0, |(_, v)| *v)
        }
        _ => return fail(libc::ENOTSUP),
    };
    // SAFETY: the caller's contract.
    unsafe { write_int(v, val, len) }
}

/// Writes `v` into an option buffer as getsockopt(2) does.
///
/// # Safety
/// `val` has room for `*len` bytes.
pub(super) unsafe fn write_int(v: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    if val.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller's buffer of *len bytes.
    unsafe {
        let bytes = v.to_ne_bytes();
        let n = (*len as usize).min(bytes.len());
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), val.cast::<u8>(), n);
        *len = n as socklen_t;
    }
    0
}

/// `riomap`: maps `len` bytes at `buf` for the peer's direct writes (`PROT_WRITE`) at
/// `offset` (-1: the buffer's address); the offset, or -1.
///
/// # Safety
/// `buf` holds `len` bytes that stay valid until `riounmap` or `rclose`.
#[no_mangle]
pub unsafe extern "C" fn riomap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: i64,
) -> i64 {
    if prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 || prot & libc::PROT_WRITE == 0 {
        // A read-only mapping serves nothing here: the peer only ever writes.
        return fail(libc::EINVAL);
    }
    let offset = (offset != -1).then_some(offset as u64);
    // SAFETY: the caller's contract.
    match lookup(fd).and_then(|s| unsafe { lock(&s).map(buf, len, offset) }) {
        Ok(o) => o as i64,
        Err(e) => fail(e),
    }
}

/// `riounmap`.
///
/// # Safety
/// As `riomap`.
#[no_mangle]
pub unsafe extern "C" fn riounmap(fd: c_int, buf: *mut c_void, len: usize) -> c_int {
    int(lookup(fd).and_then(|s| lock(&s).unmap(buf, len)))
}

/// `riowrite`: writes into the peer's mapping at `offset` with no message to it; the bytes
/// written ((size_t) -1 on error).
///
/// # Safety
/// `buf` holds `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn riowrite(fd: c_int, buf: *const c_void, count: usize, offset: i64, flags: c_int) -> usize {
    // SAFETY: the caller's contract.
    let data = unsafe { bytes(buf, count) };
    // No mapping covering the offset is a step with no progress: librdmacm then writes
    // nothing and says 0.
    let r =
        send_loop(fd, data.len(), flags, |s, done, nb| s.write_direct(&data[done..], offset as u64 + done as u64, nb));
    r.unwrap_or_else(|e| {
        crate::set_errno(e);
        usize::MAX
    })
}
