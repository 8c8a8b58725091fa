//! The few Linux socket calls std does not offer: Don't-Fragment and TOS reception options,
//! batched `recvmmsg`/`sendmmsg`, an eventfd to wake a sleeping poll thread, and `ppoll`
//! with a sub-millisecond timeout, packet sockets for raw Ethernet, and `setns`. Every `unsafe` block of the crate is in this file.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub(crate) fn set_int_option(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` outlives the call and the length passed is its size.
    let rc = unsafe {
        libc::setsockopt(fd, level, name, (&value as *const libc::c_int).cast(), size_of::<libc::c_int>() as u32)
    };
    check(rc).map(drop)
}

/// Sets DF on every datagram (IPv4) or forbids fragmentation (IPv6). With DF set and no
/// connected peer, Linux sends IPv4 Identification 0, which the ICRC then covers.
pub fn set_dont_fragment(fd: RawFd, v6: bool) -> io::Result<()> {
    if v6 {
        set_int_option(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)
    } else {
        set_int_option(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
    }
}

/// Asks for each datagram's TOS / traffic class byte (for ECN-CE) as ancillary data.
pub fn set_recv_tos(fd: RawFd, v6: bool) -> io::Result<()> {
    if v6 {
        set_int_option(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)
    } else {
        set_int_option(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)
    }
}

/// Sets the socket's receive and send buffer sizes: beyond the system's limit when
/// privileged (`SO_RCVBUFFORCE`), else as far as the limit allows.
pub fn set_buffers(fd: RawFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    if set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v).is_err() {
        let _ = set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v);
    }
    if set_int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
        let _ = set_int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v);
    }
}

// Room for a packet socket's auxdata and a receive timestamp together.
const CMSG_SPACE: usize = 128;

/// Room for the ancillary data of one datagram, aligned as the kernel and the CMSG macros
/// expect a `cmsghdr` to be.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_SPACE]);

const _: () = assert!(std::mem::align_of::<CmsgBuf>() >= std::mem::align_of::<libc::cmsghdr>());

/// Reusable buffers for one `recvmmsg` call. Every vector has the one length given at
/// creation, and none is reachable from outside: the raw pointers handed to the kernel
/// can only ever point into them.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<CmsgBuf>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    meta: Vec<(usize, SocketAddr, u8, u32, Option<u64>, u16)>,
    /// Headers the kernel wrote lengths into since they were last reset.
    used: usize,
    /// The last call found nothing: the next reads one datagram with `recvmsg`, which
    /// returns as soon as it has it, where `recvmmsg` would look for a second one first.
    /// A poller spinning for a ping-pong's next packet answers it sooner (0.2-0.4 us a
    /// packet on loopback); a busy socket is read in batches.
    single_next: bool,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point into heap buffers the batch owns and
// never resizes, so they stay valid wherever the batch moves; only `recv` hands them out.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// Room for `count` datagrams of `size` bytes.
    pub fn new(count: usize, size: usize) -> Self {
        let mut b = RecvBatch {
            bufs: (0..count).map(|_| vec![0u8; size]).collect(),
            // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
            addrs: (0..count).map(|_| unsafe { zeroed() }).collect(),
            cmsgs: vec![CmsgBuf([0u8; CMSG_SPACE]); count],
            iovs: Vec::with_capacity(count),
            // SAFETY: mmsghdr is plain data; all-zero is a valid value.
            hdrs: (0..count).map(|_| unsafe { zeroed() }).collect(),
            meta: Vec::with_capacity(count),
            used: count,
            single_next: false,
        };
        // The pointers are set once: a spinning poller calls `recv` millions of times, and
        // rebuilding 32 headers per call was 6 % of a ping-pong's time.
        b.iovs.extend(b.bufs.iter_mut().map(|v| libc::iovec { iov_base: v.as_mut_ptr().cast(), iov_len: v.len() }));
        for (i, h) in b.hdrs.iter_mut().enumerate() {
            h.msg_hdr.msg_name = (&mut b.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_iov = &mut b.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = b.cmsgs[i].0.as_mut_ptr().cast();
        }
        b.reset_lengths();
        b
    }

    /// Restores the lengths and flags the kernel overwrote in the headers it filled.
    fn reset_lengths(&mut self) {
        for h in &mut self.hdrs[..self.used] {
            h.msg_len = 0;
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            h.msg_hdr.msg_controllen = CMSG_SPACE;
            h.msg_hdr.msg_flags = 0;
        }
        self.used = 0;
    }

    /// Datagrams the last [`RecvBatch::recv`] received.
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// True when the last call received nothing.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// Datagram `i` of the last call: its bytes, source and TOS byte.
    pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr, u8)> {
        let &(len, src, tos, _, _, _) = self.meta.get(i)?;
        Some((&self.bufs[i][..len], src, tos))
    }

    /// True if frame `i` (from a packet socket with [`set_packet_auxdata`]) came from this
    /// host with its transport checksum still partial (offloaded, `TP_STATUS_CSUMNOTREADY`).
    pub fn checksum_partial(&self, i: usize) -> bool {
        self.meta.get(i).is_some_and(|m| m.3 & TP_STATUS_CSUMNOTREADY != 0)
    }

    /// The segment size of buffer `i` when the kernel coalesced several datagrams into it
    /// (on a socket with [`set_udp_gro`]): every datagram but the last is that long.
    pub fn segment_bytes(&self, i: usize) -> Option<usize> {
        self.meta.get(i).and_then(|m| (m.5 > 0).then_some(m.5 as usize))
    }

    /// How many datagrams buffer `i` holds: one, or several that GRO coalesced.
    pub fn datagrams_in(&self, i: usize) -> usize {
        let len = self.get(i).map_or(0, |(bytes, _, _)| bytes.len());
        len.div_ceil(self.segment_bytes(i).unwrap_or(len).max(1)).max(1)
    }

    /// When the kernel received datagram `i` (ns since the Unix epoch), on a socket with
    /// [`set_receive_timestamps`].
    pub fn timestamp_ns(&self, i: usize) -> Option<u64> {
        self.meta.get(i).and_then(|m| m.4)
    }

    /// Receives what is queued without blocking; returns the number of datagrams.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        let n = if self.single_next { 1 } else { self.hdrs.len() };
        self.reset_lengths();
        // A failed call may have written the first header's lengths before failing.
        self.used = 1;
        let rc = if n == 1 {
            // SAFETY: the first header points into buffers the batch owns, with the
            // lengths given (set in `new`, restored by `reset_lengths`).
            let got = unsafe { libc::recvmsg(fd, &mut self.hdrs[0].msg_hdr, libc::MSG_DONTWAIT) };
            if got >= 0 {
                // One datagram, perhaps an empty one (which the caller counts as malformed).
                self.hdrs[0].msg_len = got as u32;
                1
            } else {
                -1
            }
        } else {
            // SAFETY: every pointer in `hdrs` points into buffers the batch owns, with the
            // lengths given (set in `new`, lengths restored by `reset_lengths`).
            unsafe { libc::recvmmsg(fd, self.hdrs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT, std::ptr::null_mut()) }
        };
        self.single_next = rc <= 0;
        self.meta.clear();
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EAGAIN) { Ok(0) } else { Err(e) };
        }
        let got = (rc as usize).min(n);
        self.used = got.max(1);
        for (i, h) in self.hdrs.iter().take(got).enumerate() {
            let src = sockaddr_to_std(&self.addrs[i]).unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            // The kernel never reports more than the iovec's length; clamp all the same.
            let len = (h.msg_len as usize).min(self.bufs[i].len());
            let a = ancillary_of(&h.msg_hdr);
            self.meta.push((len, src, a.tos, a.status, a.stamp, a.segment));
        }
        Ok(got)
    }
}

/// `struct tpacket_auxdata` (linux/if_packet.h), which libc does not define.
#[repr(C)]
#[derive(Clone, Copy)]
struct TpacketAuxdata {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
}
/// `PACKET_AUXDATA` (linux/if_packet.h).
const PACKET_AUXDATA: libc::c_int = 8;
/// `TP_STATUS_CSUMNOTREADY`: the checksum is partial, to be completed by hardware.
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;

/// Asks a packet socket for each frame's `tpacket_auxdata` (its checksum status).
pub fn set_packet_auxdata(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::SOL_PACKET, PACKET_AUXDATA, 1)
}

/// Asks for each datagram's kernel receive time (`SO_TIMESTAMPNS`, the real-time clock):
/// what a bridge that measures reaction times must stamp, rather than when it read a batch.
pub fn set_receive_timestamps(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

/// The TOS byte (IP sockets), the packet status (packet sockets) and the receive time (with
/// [`set_receive_timestamps`]) in a message's ancillary data.
/// What a received datagram's ancillary data said.
#[derive(Default)]
struct Ancillary {
    tos: u8,
    status: u32,
    stamp: Option<u64>,
    segment: u16,
}

fn ancillary_of(h: &libc::msghdr) -> Ancillary {
    let mut a = Ancillary::default();
    // SAFETY: the kernel filled msg_control with well-formed cmsgs of msg_controllen bytes;
    // the CMSG macros walk them within those bounds, and each payload is read unaligned
    // with the type its level and type say it holds.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let (level, ty) = ((*c).cmsg_level, (*c).cmsg_type);
            let data = libc::CMSG_DATA(c);
            if level == libc::IPPROTO_IP && ty == libc::IP_TOS {
                a.tos = *data;
            } else if level == libc::IPPROTO_IPV6 && ty == libc::IPV6_TCLASS {
                a.tos = (data.cast::<libc::c_int>().read_unaligned()) as u8;
            } else if level == libc::SOL_PACKET && ty == PACKET_AUXDATA {
                a.status = data.cast::<TpacketAuxdata>().read_unaligned().tp_status;
            } else if level == libc::SOL_SOCKET && ty == libc::SCM_TIMESTAMPNS {
                let t = data.cast::<libc::timespec>().read_unaligned();
                a.stamp = Some(t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64);
            } else if level == libc::SOL_UDP && ty == UDP_GRO {
                a.segment = data.cast::<libc::c_int>().read_unaligned().clamp(0, 65535) as u16;
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    a
}

fn sockaddr_to_std(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match s.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let a: &libc::sockaddr_in = unsafe { &*(s as *const libc::sockaddr_storage).cast() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let a: &libc::sockaddr_in6 = unsafe { &*(s as *const libc::sockaddr_storage).cast() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(a.sin6_port), 0, a.sin6_scope_id)))
        }
        _ => None,
    }
}

fn std_to_sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, u32) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut s: libc::sockaddr_storage = unsafe { zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            let sin: &mut libc::sockaddr_in = unsafe { &mut *(&mut s as *mut libc::sockaddr_storage).cast() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            (s, size_of::<libc::sockaddr_in>() as u32)
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above.
            let sin6: &mut libc::sockaddr_in6 = unsafe { &mut *(&mut s as *mut libc::sockaddr_storage).cast() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            (s, size_of::<libc::sockaddr_in6>() as u32)
        }
    }
}

/// Sends each `(destination, datagram)` with one `sendmmsg`; returns how many went out.
pub fn send_batch(fd: RawFd, msgs: &[(SocketAddr, &[u8])]) -> io::Result<usize> {
    let mut addrs: Vec<(libc::sockaddr_storage, u32)> = msgs.iter().map(|(a, _)| std_to_sockaddr(a)).collect();
    let mut iovs: Vec<libc::iovec> =
        msgs.iter().map(|(_, d)| libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() }).collect();
    // SAFETY: mmsghdr is plain data; all-zero is a valid value.
    let mut hdrs: Vec<libc::mmsghdr> = (0..msgs.len()).map(|_| unsafe { zeroed() }).collect();
    for (i, h) in hdrs.iter_mut().enumerate() {
        h.msg_hdr.msg_name = (&mut addrs[i].0 as *mut libc::sockaddr_storage).cast();
        h.msg_hdr.msg_namelen = addrs[i].1;
        h.msg_hdr.msg_iov = &mut iovs[i];
        h.msg_hdr.msg_iovlen = 1;
    }
    send_headers(fd, &mut hdrs)
}

/// `UDP_SEGMENT` and `UDP_GRO` (linux/udp.h, level `SOL_UDP`), which libc does not
/// define for glibc targets.
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Most segments one UDP GSO send may carry (`UDP_MAX_SEGMENTS` in Linux 6.1).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one UDP GSO send may carry: an IP datagram's limit less the largest IP
/// and UDP headers.
pub const GSO_MAX_BYTES: usize = 65535 - 40 - 8;

/// Asks a UDP socket to hand over datagrams the kernel coalesced (GRO, and whole GSO
/// sends on loopback) as one buffer with their segment size ([`RecvBatch::segment_bytes`]).
pub fn set_udp_gro(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::SOL_UDP, UDP_GRO, 1)
}

/// One message of [`send_segmented`]: datagrams `first..first + count` of the ones given
/// with it, for one destination, every one as long as the first except the last, which
/// may be shorter; sent as one UDP GSO send when there are several. (Indexes rather than
/// slices, so that a sender keeps its list of messages from send to send.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmented {
    /// Where they go.
    pub dst: SocketAddr,
    /// The first datagram's index.
    pub first: usize,
    /// How many.
    pub count: usize,
}

/// The buffers [`send_segmented`] builds its system call in, kept per thread: a sender
/// (a ping-pong's reply above all) does not allocate four vectors for every send. Each
/// call refills them whole before it takes a pointer into them.
#[derive(Default)]
struct SendScratch {
    addrs: Vec<(libc::sockaddr_storage, u32)>,
    iovs: Vec<libc::iovec>,
    cmsgs: Vec<CmsgBuf>,
    hdrs: Vec<libc::mmsghdr>,
}

thread_local! {
    static SEND_SCRATCH: std::cell::RefCell<SendScratch> = std::cell::RefCell::new(SendScratch::default());
}

/// Sends each message with one `sendmmsg`, a message of several datagrams as one GSO send
/// (`UDP_SEGMENT`); returns how many messages went out.
pub fn send_segmented<D: AsRef<[u8]>>(fd: RawFd, datagrams: &[D], msgs: &[Segmented]) -> io::Result<usize> {
    SEND_SCRATCH.with(|s| send_segmented_in(&mut s.borrow_mut(), fd, datagrams, msgs))
}

fn send_segmented_in<D: AsRef<[u8]>>(
    s: &mut SendScratch,
    fd: RawFd,
    datagrams: &[D],
    msgs: &[Segmented],
) -> io::Result<usize> {
    let SendScratch { addrs, iovs, cmsgs, hdrs } = s;
    addrs.clear();
    addrs.extend(msgs.iter().map(|m| std_to_sockaddr(&m.dst)));
    iovs.clear();
    iovs.extend(
        msgs.iter()
            .flat_map(|m| &datagrams[m.first..m.first + m.count])
            .map(|d| libc::iovec { iov_base: d.as_ref().as_ptr() as *mut libc::c_void, iov_len: d.as_ref().len() }),
    );
    cmsgs.clear();
    cmsgs.resize(msgs.len(), CmsgBuf([0u8; CMSG_SPACE]));
    hdrs.clear();
    // SAFETY: mmsghdr is plain data; all-zero is a valid value.
    hdrs.extend((0..msgs.len()).map(|_| unsafe { zeroed::<libc::mmsghdr>() }));
    let mut first_iov = 0;
    for (i, (h, m)) in hdrs.iter_mut().zip(msgs).enumerate() {
        h.msg_hdr.msg_name = (&mut addrs[i].0 as *mut libc::sockaddr_storage).cast();
        h.msg_hdr.msg_namelen = addrs[i].1;
        h.msg_hdr.msg_iov = &mut iovs[first_iov];
        h.msg_hdr.msg_iovlen = m.count;
        first_iov += m.count;
        if m.count > 1 {
            let segment = datagrams[m.first].as_ref().len() as u16;
            h.msg_hdr.msg_control = cmsgs[i].0.as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE of a u16 is far below the buffer's CMSG_SPACE bytes.
            h.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
            // SAFETY: msg_control points at an aligned buffer of msg_controllen bytes, so the
            // first header and its data lie inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                libc::CMSG_DATA(c).cast::<u16>().write_unaligned(segment);
            }
        }
    }
    send_headers(fd, hdrs)
}

/// Sends the messages `hdrs` describe: one with `sendmsg` (a ping-pong's reply, cheaper
/// than `sendmmsg` by a few hundred nanoseconds), several with one `sendmmsg`; returns
/// how many went out.
fn send_headers(fd: RawFd, hdrs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    if let [one] = hdrs {
        // SAFETY: the header points at an address, iovecs and control buffers alive for
        // the call; sendmsg only reads the payloads.
        let rc = unsafe { libc::sendmsg(fd, &one.msg_hdr, 0) };
        return if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(1) };
    }
    // SAFETY: the headers point at addresses, iovecs and control buffers alive for the
    // call; sendmmsg only reads the payloads.
    let rc = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), hdrs.len() as u32, 0) };
    check(rc).map(|n| n as usize)
}

/// An eventfd: one thread writes to wake another sleeping in [`wait_readable`].
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// A new, unsignalled eventfd.
    pub fn new() -> io::Result<Waker> {
        // SAFETY: eventfd has no pointer arguments; on success we own the returned fd.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Waker { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }
    /// Signals the eventfd.
    pub fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
    /// Clears the signal.
    pub fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Sleeps until one of `fds` is readable or `timeout` passes (`None`: no timeout).
pub fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<()> {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` and `ts` live across the call; no signal mask is passed.
    let rc = unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ts_ptr, std::ptr::null()) };
    match check(rc) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        Err(e) => Err(e),
    }
}

/// Waits (at most 10 ms) until `fd` can take another datagram.
pub fn wait_writable(fd: RawFd) -> io::Result<()> {
    let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one live pollfd.
    check(unsafe { libc::poll(&mut p, 1, 10) }).map(drop)
}

/// Waits up to `timeout_ms` for one of `fds` to be ready (`poll(2)`); returns how many are.
pub fn poll_ms(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a live array of its length.
    check(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }).map(|n| n as usize)
}

/// The TCP connection's maximum segment size (`TCP_MAXSEG`): the effective MSS that
/// iWARP sizes its FPDUs to (RFC 5044 §8).
pub fn tcp_maxseg(fd: RawFd) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and sized for an int option.
    let rc = unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, (&mut v as *mut libc::c_int).cast(), &mut len)
    };
    check(rc).map(|_| v.max(0) as usize)
}

/// Bytes a TCP socket has sent or queued that its peer has not acknowledged yet
/// (`SIOCOUTQ`, tcp(7)).
pub fn tcp_unacked(fd: RawFd) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int into the live `v`.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut v as *mut libc::c_int) };
    check(rc).map(|_| v.max(0) as usize)
}

/// `PACKET_IGNORE_OUTGOING` (Linux 4.20): a packet socket does not see its own frames.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// A packet socket (`AF_PACKET`, `SOCK_RAW`) bound to interface `ifindex`, non-blocking,
/// that receives every frame the interface sees (promiscuous membership, which the kernel
/// drops with the socket, so a crash leaves the interface as it was) and not its own.
pub fn open_packet_socket(ifindex: u32) -> io::Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // Protocol 0 until bound: a socket made with ETH_P_ALL hears every interface at once,
    // and frames from another link would be queued before `bind` narrows it to ours.
    // SAFETY: socket has no pointer arguments; on success we own the returned fd.
    let fd =
        check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` lives across the call and the length passed is its size.
    let rc = unsafe {
        libc::bind(fd, (&sll as *const libc::sockaddr_ll).cast(), size_of::<libc::sockaddr_ll>() as libc::socklen_t)
    };
    check(rc)?;
    // Older kernels lack it; the driver then sees its own frames and ignores them (wrong MAC).
    let _ = set_int_option(fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1);
    // SAFETY: packet_mreq is plain data; all-zero is a valid value.
    let mut mreq: libc::packet_mreq = unsafe { zeroed() };
    mreq.mr_ifindex = ifindex as i32;
    mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
    // SAFETY: `mreq` lives across the call and the length passed is its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            (&mreq as *const libc::packet_mreq).cast(),
            size_of::<libc::packet_mreq>() as libc::socklen_t,
        )
    };
    check(rc)?;
    Ok(owned)
}

/// `PACKET_VNET_HDR` (linux/if_packet.h): every frame read from or written to the socket
/// has a `struct virtio_net_hdr` before it, which says a GSO frame's segment size.
const PACKET_VNET_HDR: libc::c_int = 15;

/// Puts a virtio-net header before every frame a packet socket reads (and wants one before
/// every frame it writes: [`send_frames`] with headers).
pub fn set_packet_vnet_hdr(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::SOL_PACKET, PACKET_VNET_HDR, 1)
}

/// Sends whole frames on a bound packet socket with one `sendmmsg`; returns how many went.
/// `vnet`: the socket has [`set_packet_vnet_hdr`], and frame `i` goes after header `i`.
pub fn send_frames(fd: RawFd, frames: &[&[u8]], vnet: Option<&[[u8; 10]]>) -> io::Result<usize> {
    // A frame without a header of its own goes after this one: no offload asked for.
    static NO_OFFLOAD: [u8; 10] = [0; 10];
    let iov = |d: &[u8]| libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() };
    let per = if vnet.is_some() { 2 } else { 1 };
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(per * frames.len());
    for (i, f) in frames.iter().enumerate() {
        if let Some(h) = vnet.and_then(|hs| hs.get(i)) {
            iovs.push(iov(h));
        } else if vnet.is_some() {
            iovs.push(iov(&NO_OFFLOAD));
        }
        iovs.push(iov(f));
    }
    // SAFETY: mmsghdr is plain data; all-zero is a valid value.
    let mut hdrs: Vec<libc::mmsghdr> = (0..frames.len()).map(|_| unsafe { zeroed() }).collect();
    for (h, iov) in hdrs.iter_mut().zip(iovs.chunks_mut(per)) {
        h.msg_hdr.msg_iov = iov.as_mut_ptr();
        h.msg_hdr.msg_iovlen = per;
    }
    // SAFETY: the headers point at buffers alive for the call; sendmmsg only reads them.
    let rc = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), hdrs.len() as u32, 0) };
    check(rc).map(|n| n as usize)
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not an interface name"));
    }
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

/// The index and MTU of interface `name` in the calling thread's network namespace
/// (sysfs shows the namespace it was mounted in, which a thread that entered another
/// does not see).
pub fn interface_info(name: &str) -> io::Result<(u32, u32)> {
    let mut req = ifreq_for(name)?;
    // SAFETY: socket has no pointer arguments; on success we own the returned fd.
    let fd = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: SIOCGIFINDEX reads the name from and writes the index into the live `req`.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) })
        .map_err(|e| io::Error::new(e.kind(), format!("no interface {name:?} here: {e}")))?;
    // SAFETY: the kernel filled the index member of the union.
    let index = unsafe { req.ifr_ifru.ifru_ifindex };
    // SAFETY: SIOCGIFMTU reads the name from and writes the MTU into the live `req`.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU, &mut req) })?;
    // SAFETY: the kernel filled the MTU member of the union.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok((index.max(0) as u32, mtu.max(0) as u32))
}

/// The running kernel's version, (major, minor), from `uname`.
pub fn kernel_version() -> Option<(u32, u32)> {
    // SAFETY: utsname is plain data; all-zero is a valid value.
    let mut uts: libc::utsname = unsafe { zeroed() };
    // SAFETY: uname fills the live struct it is given.
    check(unsafe { libc::uname(&mut uts) }).ok()?;
    // SAFETY: the kernel NUL-terminates the release string.
    let release = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }.to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The name of the interface that holds address `ip`, from `getifaddrs` (in the calling
/// thread's network namespace).
pub fn interface_of_address(ip: std::net::IpAddr) -> io::Result<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    check(unsafe { libc::getifaddrs(&mut list) })?;
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() && found.is_none() {
        // SAFETY: `cur` is a node of the list the kernel's answer built, alive until freed.
        let node = unsafe { &*cur };
        if !node.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr of at least the size its family says;
            // sockaddr_storage is read only as far as that family's struct.
            let family = unsafe { (*node.ifa_addr).sa_family } as libc::c_int;
            let addr = match family {
                libc::AF_INET | libc::AF_INET6 => {
                    // SAFETY: as above; copy out only the bytes of the family's struct.
                    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
                    let len = if family == libc::AF_INET {
                        size_of::<libc::sockaddr_in>()
                    } else {
                        size_of::<libc::sockaddr_in6>()
                    };
                    // SAFETY: both pointers are valid for `len` bytes and do not overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            node.ifa_addr.cast::<u8>(),
                            (&mut ss as *mut libc::sockaddr_storage).cast::<u8>(),
                            len,
                        )
                    };
                    sockaddr_to_std(&ss).map(|a| a.ip())
                }
                _ => None,
            };
            if addr == Some(ip) {
                // SAFETY: ifa_name is a NUL-terminated string owned by the list.
                let name = unsafe { std::ffi::CStr::from_ptr(node.ifa_name) };
                found = Some(name.to_string_lossy().into_owned());
            }
        }
        cur = node.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface holds {ip}")))
}

/// Moves the calling thread into the network namespace whose handle is `path` (e.g.
/// `/var/run/netns/NAME`); sockets it opens afterwards live there.
pub fn enter_netns(path: &std::path::Path) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    // SAFETY: setns takes a live descriptor and a flag; it touches no memory of ours.
    check(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }).map(drop)
}

static STOP_REQUESTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn note_stop(_: libc::c_int) {
    STOP_REQUESTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// From now on SIGINT and SIGTERM only set a flag that [`stop_requested`] reads, so that a
/// long-running tool (the injector) can finish its files before it exits.
pub fn catch_stop_signals() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, note_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, note_stop as *const () as libc::sighandler_t);
    }
}

/// True once SIGINT or SIGTERM came after [`catch_stop_signals`].
pub fn stop_requested() -> bool {
    STOP_REQUESTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// A UDP socket bound to `addr` with `SO_REUSEPORT` set first, so that other processes of
/// the same user can bind the same address and port (several softrdma devices on one
/// address, [`super::share`]).
pub fn bind_udp_shared(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let family = if addr.is_ipv6() { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket has no pointer arguments; on success we own the returned fd.
    let fd = check(unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    set_int_option(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    let (sa, len) = std_to_sockaddr(&addr);
    // SAFETY: `sa` is a sockaddr of `len` bytes that lives across the call.
    check(unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_storage).cast(), len) })?;
    Ok(std::net::UdpSocket::from(owned))
}

/// An epoll set: one descriptor that is readable while any member is, so a poll thread
/// waiting on one descriptor waits on a set that changes under it.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// An empty set.
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: no pointer arguments; on success we own the returned fd.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Epoll { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Adds `fd` (level-triggered, readable).
    pub fn add(&self, fd: RawFd) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        // SAFETY: `ev` lives across the call.
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(drop)
    }

    /// Removes `fd`.
    pub fn remove(&self, fd: RawFd) {
        // SAFETY: a null event is allowed for EPOLL_CTL_DEL.
        let _ = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_receives_within_its_own_buffers() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        set_recv_tos(rx.as_raw_fd(), false).unwrap();
        let to = rx.local_addr().unwrap();
        // Three datagrams for a batch of two 8-byte buffers: two arrive, cut to 8 bytes.
        for d in [&[1u8; 20][..], &[2u8; 3][..], &[3u8; 5][..]] {
            tx.send_to(d, to).unwrap();
        }
        let mut b = RecvBatch::new(2, 8);
        for c in &b.cmsgs {
            assert_eq!(c.0.as_ptr() as usize % std::mem::align_of::<libc::cmsghdr>(), 0);
        }
        wait_readable(&[rx.as_raw_fd()], Some(Duration::from_secs(1))).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(b.recv(rx.as_raw_fd()).unwrap(), 2);
        assert_eq!(b.get(0).map(|d| d.0.to_vec()), Some(vec![1u8; 8]));
        assert_eq!(b.get(1).map(|d| d.0.to_vec()), Some(vec![2u8; 3]));
        assert!(b.get(2).is_none());
    }
}
