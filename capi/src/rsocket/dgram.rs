//! Datagram rsockets (`SOCK_DGRAM`), speaking librdmacm's protocol ([`super::dgram_wire`]):
//! a kernel UDP socket names the rsocket (its fd is the rsocket's number, as librdmacm
//! numbers them) and carries the first messages to a peer; messages then go over a UD QP,
//! one per local address the socket sends from. librdmacm answers UDP messages on a
//! service thread; here the calls that look for messages (`rrecv`, `rpoll`, a send waiting
//! for room) read the UDP socket too, so a peer is answered as soon as the application
//! looks, and no thread runs.
//!
//! Unlike librdmacm's, the address handle to a peer names the address its QP is bound to
//! (the UDP header says it) rather than the UDP message's source, and an unbound socket
//! binds to its device's address before it sends, so that both name the same address.

use super::completions::set_nonblocking;
use super::dgram_qp::{Done, DsQp};
use super::dgram_wire::{DsHeader, UdpHeader, SLOT_BYTES, UDP_HEADER_MAX, UDP_OP_CTRL, UDP_OP_DATA};
use super::socket::{Step, Wait, DEFAULT_BUF_BYTES, DEFAULT_INLINE, DEFAULT_QP_SIZE, QP_SIZE_MAX, QP_SIZE_MIN};
use crate::ffi;
use libc::c_int;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The most peers a socket remembers (each with an address handle): a UDP message from
/// anyone makes an entry, so past this the oldest entry (but the connected peer's) is
/// forgotten; a forgotten peer that sends again is learnt again from its UDP message.
pub const DESTS_MAX: usize = 4096;
/// The most UDP messages read in one look, so that a flood cannot hold a call for ever.
const UDP_READS_MAX: usize = 64;

/// A peer: the QP that sends to it and, once its QP is known, an address handle to it.
struct Dest {
    qp: usize,
    ah: *mut ffi::ibv_ah,
    qpn: u32,
}

/// A message waiting to be read.
enum Rx {
    /// In receive slot `slot` of QP `qp`, header included.
    Qp { qp: usize, slot: u32, len: u32 },
    /// Came over UDP (from a peer that does not yet know this socket's QP).
    Udp { from: SocketAddr, data: Vec<u8> },
}

pub struct DSocket {
    udp: UdpSocket,
    /// An epoll set of the UDP socket and every QP's completion channel: one fd to sleep on.
    epoll: OwnedFd,
    pub nonblock: bool,
    pub sq_size: u16,
    pub rq_size: u16,
    pub inline: u32,
    /// Buffer bytes (SO_SNDBUF, SO_RCVBUF doubled), which bound the queue depths.
    pub sbuf_bytes: u32,
    pub rbuf_bytes: u32,
    qps: Vec<DsQp>,
    dests: HashMap<SocketAddr, Dest>,
    /// The peers in the order they were learnt, oldest first.
    learnt: VecDeque<SocketAddr>,
    received: VecDeque<Rx>,
    readable: bool,
    writable: bool,
    /// The peer `rconnect` named (the UDP socket's, kept to spare a system call a send).
    peer: Option<SocketAddr>,
    /// Messages sent and received, over UDP and over UD.
    pub counts: Counts,
}

/// What a socket carried, by path (what `SOFTRDMA_RSOCKET_STATS` prints at `rclose`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub sent_udp: u64,
    pub sent_ud: u64,
    pub received_udp: u64,
    pub received_ud: u64,
}

// SAFETY: the address handles are this library's objects, used from any thread (the C
// API's rule); a socket is only reached under its lock.
unsafe impl Send for DSocket {}

fn os_err(e: &std::io::Error) -> c_int {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl DSocket {
    /// A datagram rsocket of `domain` (AF_INET or AF_INET6).
    pub fn new(domain: c_int, nonblock: bool) -> Result<DSocket, c_int> {
        // SAFETY: plain socket calls; the fds are owned below.
        let (fd, ep) = unsafe {
            (libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0), libc::epoll_create1(libc::EPOLL_CLOEXEC))
        };
        if fd < 0 || ep < 0 {
            return Err(super::completions::errno());
        }
        // SAFETY: fresh fds, owned from here.
        let (udp, epoll) = unsafe { (UdpSocket::from_raw_fd(fd), OwnedFd::from_raw_fd(ep)) };
        // The socket never blocks in the kernel: waits happen in poll(2) on the epoll set.
        // SAFETY: our fd.
        unsafe { set_nonblocking(fd, true) };
        let s = DSocket {
            udp,
            epoll,
            nonblock,
            sq_size: DEFAULT_QP_SIZE,
            rq_size: DEFAULT_QP_SIZE,
            inline: DEFAULT_INLINE,
            sbuf_bytes: DEFAULT_BUF_BYTES,
            rbuf_bytes: DEFAULT_BUF_BYTES,
            qps: Vec::new(),
            dests: HashMap::new(),
            learnt: VecDeque::new(),
            received: VecDeque::new(),
            readable: true,
            writable: true,
            peer: None,
            counts: Counts::default(),
        };
        s.watch(fd)?;
        Ok(s)
    }

    /// The rsocket's number: its UDP socket's fd.
    pub fn fd(&self) -> c_int {
        self.udp.as_raw_fd()
    }

    fn watch(&self, fd: c_int) -> Result<(), c_int> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        // SAFETY: our epoll fd, a live fd, a valid event.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            return Err(super::completions::errno());
        }
        Ok(())
    }

    /// The queue depths, as librdmacm's `ds_set_qp_size` takes them: a message slot is
    /// [`SLOT_BYTES`], so a buffer of N bytes bounds a queue to N / 2048 messages.
    fn depths(&self) -> (u16, u16) {
        let depth = |q: u16, bytes: u32| {
            let fit = (bytes / SLOT_BYTES as u32).min(u32::from(QP_SIZE_MAX)) as u16;
            q.min(fit).clamp(QP_SIZE_MIN, QP_SIZE_MAX)
        };
        (depth(self.sq_size, self.sbuf_bytes), depth(self.rq_size, self.rbuf_bytes))
    }

    /// Whether queue sizes may still change.
    pub fn unused(&self) -> bool {
        self.qps.is_empty()
    }

    pub fn local_addr(&self) -> Result<SocketAddr, c_int> {
        self.udp.local_addr().map_err(|e| os_err(&e))
    }

    pub fn peer_addr(&self) -> Result<SocketAddr, c_int> {
        self.peer.ok_or(libc::ENOTCONN)
    }
}

/// The address of the device that reaches `peer` (the first of its family).
fn device_ip(peer: IpAddr) -> Result<IpAddr, c_int> {
    let ctx = crate::cm_addr::context_for(None, Some(peer)).ok_or(libc::EADDRNOTAVAIL)?;
    // SAFETY: an open context of this library.
    unsafe { crate::device::soft_context(ctx) }.map(|s| s.device.cfg.addr).ok_or(libc::ENODEV)
}

/// bind(2) of `fd` to `addr`.
fn sys_bind(fd: c_int, addr: SocketAddr) -> Result<(), c_int> {
    // SAFETY: plain C data; all-zero is valid.
    let mut storage: ffi::sockaddr_storage = unsafe { std::mem::zeroed() };
    crate::cm_addr::to_storage(addr, &mut storage);
    let len = if addr.is_ipv4() { size_of::<libc::sockaddr_in>() } else { size_of::<libc::sockaddr_in6>() };
    // SAFETY: a live fd and a socket address of `len` bytes.
    if unsafe { libc::bind(fd, (&raw const storage).cast(), len as libc::socklen_t) } != 0 {
        return Err(super::completions::errno());
    }
    Ok(())
}

impl DSocket {
    /// bind(2) of the UDP socket, which names the rsocket.
    ///
    /// # Safety
    /// `addr` points at a socket address of `len` bytes.
    pub unsafe fn bind(&mut self, addr: *const ffi::sockaddr, len: libc::socklen_t) -> Result<(), c_int> {
        // SAFETY: the caller's contract.
        if unsafe { libc::bind(self.fd(), addr.cast(), len) } != 0 {
            return Err(super::completions::errno());
        }
        Ok(())
    }

    /// connect(2): `rsend` goes to `peer`, and only its messages are received over UDP.
    pub fn connect(&mut self, peer: SocketAddr) -> Result<(), c_int> {
        // Bound first: connect(2) would bind an unbound socket to the route's source
        // (127.0.0.1 on loopback), not to the device's address.
        self.source_for(peer)?;
        self.udp.connect(peer).map_err(|e| os_err(&e))?;
        self.peer = Some(peer);
        self.ensure_dest(peer)
    }

    /// The address this socket sends from toward `peer`: the bound one, the device's
    /// address in place of a wildcard. An unbound socket binds to the device's address
    /// first, so that its UDP messages and its UD messages name the same address.
    fn source_for(&mut self, peer: SocketAddr) -> Result<SocketAddr, c_int> {
        let mut local = self.local_addr()?;
        if local.port() == 0 {
            sys_bind(self.fd(), SocketAddr::new(device_ip(peer.ip())?, 0))?;
            local = self.local_addr()?;
        }
        if local.ip().is_unspecified() {
            local.set_ip(device_ip(peer.ip())?);
        }
        Ok(local)
    }

    /// Makes the entry of peer `addr` (and a QP on the address toward it) if there is none.
    fn ensure_dest(&mut self, addr: SocketAddr) -> Result<(), c_int> {
        if self.dests.contains_key(&addr) {
            return Ok(());
        }
        let src = self.source_for(addr)?;
        let qp = match self.qps.iter().position(|q| q.hdr.addr.ip() == src.ip()) {
            Some(i) => i,
            None => self.add_qp(src)?,
        };
        while self.dests.len() >= DESTS_MAX {
            self.forget_oldest();
        }
        self.dests.insert(addr, Dest { qp, ah: std::ptr::null_mut(), qpn: 0 });
        self.learnt.push_back(addr);
        Ok(())
    }

    /// Forgets the peer learnt first, unless it is the connected one (then the next).
    fn forget_oldest(&mut self) {
        let peer = self.peer;
        let Some(at) = self.learnt.iter().position(|a| Some(*a) != peer) else { return };
        let Some(addr) = self.learnt.remove(at) else { return };
        if let Some(d) = self.dests.remove(&addr) {
            if !d.ah.is_null() {
                // SAFETY: made in `learn`, destroyed once.
                unsafe { crate::objects::ibv_destroy_ah(d.ah) };
            }
        }
    }

    /// Peers remembered now.
    pub fn peers(&self) -> usize {
        self.dests.len()
    }

    fn add_qp(&mut self, src: SocketAddr) -> Result<usize, c_int> {
        let (sq, rq) = self.depths();
        let qp = DsQp::create(src, sq, rq, self.inline)?;
        self.watch(qp.comp().fd())?;
        self.qps.push(qp);
        Ok(self.qps.len() - 1)
    }

    /// The peer at `peer` has its QP `qpn` on `ip`: an address handle to it, unless the
    /// one there already names it.
    fn learn(&mut self, peer: SocketAddr, qpn: u32, ip: IpAddr) {
        let Some(d) = self.dests.get_mut(&peer) else { return };
        if !d.ah.is_null() && d.qpn == qpn {
            return;
        }
        if !d.ah.is_null() {
            // SAFETY: made below, destroyed once.
            unsafe { crate::objects::ibv_destroy_ah(d.ah) };
        }
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        attr.is_global = 1;
        attr.port_num = 1;
        attr.grh.dgid.raw = crate::device::gid_of(ip);
        attr.grh.hop_limit = 64;
        // SAFETY: the QP's PD and our attributes.
        d.ah = unsafe { crate::objects::ibv_create_ah(self.qps[d.qp].pd(), &mut attr) };
        d.qpn = qpn;
    }

    /// A UDP message to `to` from QP `qp`'s address: header, then `payload`.
    fn send_udp(&self, to: SocketAddr, op: u8, qp: usize, payload: &[u8]) -> Result<(), c_int> {
        let q = &self.qps[qp];
        let mut b = UdpHeader { op, qpn: q.qpn, qp_addr: q.hdr.addr.ip() }.emit();
        b.extend_from_slice(payload);
        self.udp.send_to(&b, to).map(|_| ()).map_err(|e| os_err(&e))
    }

    /// Reads what the UDP socket holds (a bounded number of messages).
    fn read_udp(&mut self) {
        // A message's UDP header is longer than its UD one: room for both, so that the
        // longest message is whole on either path.
        let mut buf = [0u8; SLOT_BYTES + UDP_HEADER_MAX];
        for _ in 0..UDP_READS_MAX {
            let Ok((n, from)) = self.udp.recv_from(&mut buf) else { return };
            self.on_udp(&buf[..n], from);
        }
    }

    /// A UDP message from `from`: learn its QP; answer data with a header naming ours
    /// (so the peer sends over UD from then on) and keep the data for reading.
    fn on_udp(&mut self, b: &[u8], from: SocketAddr) {
        let Some((h, payload)) = UdpHeader::parse(b, from.is_ipv4()) else { return };
        if self.ensure_dest(from).is_err() {
            return;
        }
        let qp = self.dests[&from].qp;
        if h.op == UDP_OP_DATA {
            let _ = self.send_udp(from, UDP_OP_CTRL, qp, &[]);
        }
        let ip = if h.qp_addr.is_unspecified() { from.ip() } else { h.qp_addr };
        self.learn(from, h.qpn, ip);
        if h.op == UDP_OP_DATA && self.room() {
            self.received.push_back(Rx::Udp { from, data: payload.to_vec() });
            self.counts.received_udp += 1;
        }
    }

    /// Room for another message to wait for reading (librdmacm's `rqe_avail`).
    fn room(&self) -> bool {
        self.readable && self.received.len() < usize::from(self.depths().1)
    }

    /// Reads the UDP socket and every QP's completions; `polling`: for a caller that looks
    /// in a loop (a non-blocking call, `rpoll`), which has the device's socket to itself
    /// while it keeps looking.
    fn progress(&mut self, polling: bool) {
        self.read_udp();
        for i in 0..self.qps.len() {
            for d in self.qps[i].completions(polling) {
                if let Done::Received { slot, len } = d {
                    self.arrived(i, slot, len);
                }
            }
        }
    }

    /// A message in QP `qp`'s receive slot `slot`: kept if it starts with a header and
    /// there is room, else its slot goes back to the QP (dropped, as UDP drops).
    fn arrived(&mut self, qp: usize, slot: u32, len: u32) {
        let mut hdr = [0u8; 24];
        let n = hdr.len().min(len as usize);
        self.qps[qp].read(slot, 0, &mut hdr[..n]);
        if DsHeader::parse(&hdr[..n]).is_some() && self.room() {
            self.received.push_back(Rx::Qp { qp, slot, len });
            self.counts.received_ud += 1;
        } else {
            let _ = self.qps[qp].release(slot);
        }
    }

    /// Goes on (`Ok`) once `ready` holds; else what to return: EWOULDBLOCK for a
    /// non-blocking caller, or the fd to sleep on (after arming every CQ and looking once
    /// more, so a completion that came before the arming is not missed).
    fn ready_or_wait<T>(&mut self, nonblock: bool, ready: impl Fn(&Self) -> bool) -> Result<(), Step<T>> {
        self.ready_or_wait_polling(nonblock, nonblock, ready)
    }

    /// As [`DSocket::ready_or_wait`], saying whether the caller looks in a loop.
    fn ready_or_wait_polling<T>(
        &mut self,
        nonblock: bool,
        polling: bool,
        ready: impl Fn(&Self) -> bool,
    ) -> Result<(), Step<T>> {
        for _ in 0..2 {
            self.progress(polling);
            if ready(self) {
                return Ok(());
            }
            if nonblock {
                return Err(Step::Done(Err(libc::EWOULDBLOCK)));
            }
            if self.qps.iter().all(|q| q.comp().armed) {
                break;
            }
            self.qps.iter_mut().for_each(|q| q.comp_mut().arm());
        }
        self.qps.iter().for_each(|q| q.comp().before_sleep());
        Err(Step::Wait(Wait::Readable(self.epoll.as_raw_fd())))
    }
}

impl DSocket {
    /// Sends `data` as one message to `to` (the connected peer if `None`): over UDP until
    /// the peer's QP is known, then over UD.
    pub fn send(&mut self, data: &[u8], to: Option<SocketAddr>, nonblock: bool) -> Step<usize> {
        let to = match self.destination(to) {
            Ok(t) => t,
            Err(e) => return Step::Done(Err(e)),
        };
        let qp = self.dests[&to].qp;
        if data.len() + self.qps[qp].hdr.wire_len() > SLOT_BYTES {
            return Step::Done(Err(libc::EMSGSIZE));
        }
        if self.dests[&to].ah.is_null() {
            // Read first: the peer's answer to an earlier message may be waiting.
            self.progress(nonblock);
        }
        let d = &self.dests[&to];
        if d.ah.is_null() {
            self.counts.sent_udp += 1;
            return Step::Done(self.send_udp(to, UDP_OP_DATA, qp, data).map(|()| data.len()));
        }
        if let Err(step) = self.ready_or_wait(nonblock, |s| s.qps[qp].can_send()) {
            return step;
        }
        let d = &self.dests[&to];
        let (ah, qpn) = (d.ah, d.qpn);
        self.counts.sent_ud += 1;
        Step::Done(self.qps[qp].send(ah, qpn, data).map(|()| data.len()))
    }

    /// Where a send goes: `to`, or the connected peer; its entry made.
    fn destination(&mut self, to: Option<SocketAddr>) -> Result<SocketAddr, c_int> {
        if !self.writable {
            return Err(libc::EPIPE);
        }
        let to = match to {
            Some(t) => t,
            None => self.peer.ok_or(libc::EDESTADDRREQ)?,
        };
        self.ensure_dest(to)?;
        Ok(to)
    }

    /// Receives one message into `out` (truncated to it, as UDP truncates): its length
    /// and its sender's address.
    pub fn recv(&mut self, out: &mut [u8], nonblock: bool, peek: bool) -> Step<(usize, SocketAddr)> {
        if !self.readable {
            return Step::Done(Err(libc::EINVAL));
        }
        if let Err(step) = self.ready_or_wait(nonblock, |s| !s.received.is_empty()) {
            return step;
        }
        let got = match self.received.front() {
            Some(Rx::Udp { from, data }) => {
                let n = out.len().min(data.len());
                out[..n].copy_from_slice(&data[..n]);
                (n, *from)
            }
            Some(&Rx::Qp { qp, slot, len }) => {
                let mut hdr = [0u8; 24];
                let n = hdr.len().min(len as usize);
                self.qps[qp].read(slot, 0, &mut hdr[..n]);
                let Some(h) = DsHeader::parse(&hdr[..n]) else { return Step::Done(Err(libc::EIO)) };
                let n = out.len().min(len as usize - h.wire_len());
                self.qps[qp].read(slot, h.wire_len(), &mut out[..n]);
                (n, h.addr)
            }
            None => return Step::Done(Err(libc::EWOULDBLOCK)),
        };
        if !peek {
            self.pop();
        }
        Step::Done(Ok(got))
    }

    /// Drops the first message waiting, its slot back to its QP.
    fn pop(&mut self) {
        if let Some(Rx::Qp { qp, slot, .. }) = self.received.pop_front() {
            let _ = self.qps[qp].release(slot);
        }
    }

    /// `events` that hold now, or the fd to wait on.
    pub fn poll_events(&mut self, events: i16) -> Result<i16, c_int> {
        match self.ready_or_wait_polling::<()>(false, true, |s| s.events_now(events) != 0) {
            Ok(()) => Ok(self.events_now(events)),
            Err(Step::Wait(Wait::Readable(fd))) => Err(fd),
            Err(Step::Done(_)) => Ok(libc::POLLERR),
        }
    }

    fn events_now(&self, events: i16) -> i16 {
        let mut r = 0;
        if events & libc::POLLIN != 0 && !self.received.is_empty() {
            r |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0 && self.writable && self.qps.iter().all(DsQp::can_send) {
            r |= libc::POLLOUT;
        }
        r
    }

    /// shutdown(2): no more reading (what waits is dropped) or sending; done once the
    /// messages sent are out.
    pub fn shutdown(&mut self, how: c_int) -> Step<()> {
        if how == libc::SHUT_RD || how == libc::SHUT_RDWR {
            self.readable = false;
            while !self.received.is_empty() {
                self.pop();
            }
        }
        if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
            self.writable = false;
        }
        let sq = self.depths().0;
        match self.ready_or_wait(false, |s| s.qps.iter().all(|q| q.sends_done(sq))) {
            Ok(()) => Step::Done(Ok(())),
            Err(step) => step,
        }
    }
}

impl Drop for DSocket {
    fn drop(&mut self) {
        for d in self.dests.values() {
            if !d.ah.is_null() {
                // SAFETY: made in `learn`, destroyed once.
                unsafe { crate::objects::ibv_destroy_ah(d.ah) };
            }
        }
    }
}
