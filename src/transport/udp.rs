//! RoCEv2 over kernel UDP sockets (IBTA Annex A17.2: UDP destination port 4791), unprivileged.
//!
//! Transmit: the engine's packet gets its ICRC over the IP and UDP headers the kernel will
//! build. Those are predictable because the sockets are unconnected with DF set: Linux then
//! sends IPv4 Identification 0 and flags DF; TTL, TOS and checksums are masked by the ICRC.
//! Each QP sends from one of a pool of sockets, so its UDP source port is fixed and QPs spread
//! over several ports (ECMP entropy, as hardware does).
//!
//! Receive: a UDP socket hides the IP header. For IPv6 nothing the ICRC covers is hidden
//! (traffic class, flow label and hop limit are masked), so the ICRC is verified in full.
//! For IPv4 the Identification and DF flag are hidden and covered: they are recovered from
//! the ICRC ([`icrc::recover_ipv4`]), which leaves 15 of its 32 bits to detect corruption, on
//! top of the UDP checksum the kernel has verified.

use super::gso;
pub use super::headers::{gid_to_ip, ip_header, ip_to_gid};
use super::headers::{ip_header_for_icrc, udp_header};
use super::link::{LinkStats, PacketRx, PacketTx};
use super::pcap::FrameLog;
use super::share::{self, Share};
use super::sys::{self, RecvBatch};
use super::udp_mcast::McastSockets;
use crate::engine::rng::Rng;
use crate::engine::verbs::Gid;
use crate::engine::{Device, Transmit};
use crate::proto::roce::icrc::{self, IpHeader};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The RoCEv2 UDP port (IBTA Annex A17.2.1).
pub const ROCE_PORT: u16 = 4791;

/// Datagrams read per `recvmmsg`.
pub(super) const RX_BATCH: usize = 32;
/// A receive buffer's size with GRO on: the largest datagram the kernel coalesces.
pub(super) const GRO_BUFFER_BYTES: usize = 65536;
/// The most datagrams the kernel coalesces into one GRO buffer (`UDP_GRO_CNT_MAX`,
/// net/ipv4/udp_offload.c).
pub(super) const GRO_SEGMENTS_MAX: usize = 64;
/// Packets queued before a send (two full GSO sends of the smallest packets).
const TX_BATCH: usize = 128;
/// Largest datagram accepted (4096-byte MTU plus every header, with room for jumbo frames).
const RX_DATAGRAM_MAX: usize = 9216;
/// Socket buffer size asked for: twice the device's loss-window budget of 4 KiB packets
/// (8192 of them, `OpenConfig`), so the buffer holds what many QPs have in flight.
pub const SOCKET_BUFFER_BYTES: usize = 64 << 20;

/// The largest IB path MTU that fits the MTU of the interface holding `addr`, with every
/// header of a RoCEv2 packet around it (the netdev MTU less the raw device's headroom,
/// as rxe sizes its port's active MTU); `None` if no interface holds it.
pub fn active_mtu(addr: IpAddr) -> Option<crate::engine::verbs::Mtu> {
    let iface = sys::interface_of_address(addr).ok()?;
    let link = sys::interface_info(&iface).ok()?.1 as usize;
    Some(super::raw::path_mtu_for_link(link))
}

/// The name of the interface holding `addr`, if one does.
pub fn interface_of(addr: IpAddr) -> Option<String> {
    sys::interface_of_address(addr).ok()
}

/// Whether UDP offloads are on by default for a device on `addr`: on loopback, where a
/// GSO send crosses the stack whole; on an interface backed by a device (a NIC, or
/// virtio-net in a VM), whose driver, or the kernel just before it, cuts a GSO send into
/// datagrams for the wire; and, from Linux 6.2, on virtual links too (veth, bridge, tap,
/// macvlan). A link that cannot take a GSO send whole has the kernel cut it first; a veth
/// hands it to its peer whole, where a UDP socket takes it as datagrams, a native XDP
/// program (softrdma's AF_XDP device) has the kernel cut it first, and softrdma's packet
/// sockets (the raw transport, `softrdma inject`) split it back into frames
/// ([`super::raw::gso`]) by the segment size a virtio-net header gives them, which Linux
/// 6.2 brought. A capture on a link that takes GSO sends whole (a veth, a bridge) shows
/// each as one long frame, as it shows TCP's; one on a tap or a NIC shows the datagrams.
/// [`OFFLOAD_ENV`] set to `on` or `off` decides instead.
pub fn offload_by_default(addr: IpAddr) -> bool {
    if let Some(on) = offload_from_env() {
        return on;
    }
    match sys::interface_of_address(addr) {
        Ok(iface) => iface == "lo" || backed_by_device(&iface) || super::raw::gso::packet_sockets_carry_udp_gso(),
        Err(_) => addr.is_loopback(),
    }
}

/// The environment variable that turns UDP offloads `on` or `off` for every device a
/// process opens (tools and applications on the C library alike), whatever the link.
pub const OFFLOAD_ENV: &str = "SOFTRDMA_UDP_OFFLOAD";

fn offload_from_env() -> Option<bool> {
    match std::env::var(OFFLOAD_ENV).ok()?.as_str() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

/// True if network interface `iface` (an address label such as `eth0:1` names `eth0`)
/// is a device's rather than a virtual link's: sysfs gives it a `device`.
fn backed_by_device(iface: &str) -> bool {
    let name = iface.split(':').next().unwrap_or(iface);
    !name.is_empty() && !name.contains('/') && std::path::Path::new("/sys/class/net").join(name).join("device").exists()
}

/// How an endpoint's UDP sockets are set up.
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// The local address (its GID is the device's GID 0).
    pub addr: IpAddr,
    /// The UDP port to receive on and to send to (4791 unless testing).
    pub port: u16,
    /// Sockets QPs send from (at least 1).
    pub source_ports: usize,
    /// UDP segmentation and receive offload (GSO, GRO): runs of equal-sized datagrams to
    /// one peer leave as one send, and come in as one buffer.
    pub offload: bool,
    /// Share the address and port with softrdma devices in other processes
    /// ([`super::share`]): the port is bound with `SO_REUSEPORT` and packets for another
    /// device's QPs are handed on to it.
    pub share: bool,
    /// Read each datagram's ECN field (`IP_RECVTOS`), which only congestion control acts
    /// on (CE marks answered with CNPs, IBTA Annex A17.9.2). Each receive then carries one
    /// more control message: about 130 ns of a ping-pong's 4.8 µs one-way on loopback.
    pub ecn: bool,
}

impl UdpConfig {
    /// Port 4791 on `addr`, with 8 source ports, offloads as [`offload_by_default`].
    pub fn new(addr: IpAddr) -> Self {
        UdpConfig { addr, port: ROCE_PORT, source_ports: 8, offload: offload_by_default(addr), share: true, ecn: false }
    }
}

/// The sockets of one endpoint, shared by its send and receive halves.
struct Sockets {
    rx: UdpSocket,
    tx: Vec<(UdpSocket, u16)>,
    local: IpAddr,
    port: u16,
}

pub(super) fn open_socket(addr: SocketAddr, shared: bool, ecn: bool) -> io::Result<UdpSocket> {
    let s = if shared { sys::bind_udp_shared(addr)? } else { UdpSocket::bind(addr)? };
    s.set_nonblocking(true)?;
    let fd = s.as_raw_fd();
    sys::set_dont_fragment(fd, addr.is_ipv6())?;
    if ecn {
        sys::set_recv_tos(fd, addr.is_ipv6())?;
    }
    sys::set_buffers(fd, SOCKET_BUFFER_BYTES);
    Ok(s)
}

/// Opens the receive socket on `cfg.addr:cfg.port` and the source-port pool; returns the two
/// halves.
pub fn open(cfg: &UdpConfig, log: Option<Arc<FrameLog>>) -> io::Result<(UdpTx, UdpRx)> {
    let rx = open_socket(SocketAddr::new(cfg.addr, cfg.port), cfg.share, cfg.ecn)?;
    // Without GRO the kernel cuts a GSO send back into datagrams for us; with it, one
    // buffer holds them all, which needs room for a whole GSO send.
    let offload = cfg.offload && sys::set_udp_gro(rx.as_raw_fd()).is_ok();
    let rx_buffer = if offload { GRO_BUFFER_BYTES } else { RX_DATAGRAM_MAX };
    let mut tx = Vec::new();
    for _ in 0..cfg.source_ports.max(1) {
        // Nothing is read from the sending sockets.
        let s = open_socket(SocketAddr::new(cfg.addr, 0), false, false)?;
        // Multicast leaves from the device's interface (loopback too), not the default route's.
        match cfg.addr {
            IpAddr::V4(v4) => socket2::SockRef::from(&s).set_multicast_if_v4(&v4)?,
            // An address no interface holds yet (tests bind before they route) sends
            // multicast by the routing table.
            IpAddr::V6(_) => {
                if let Ok(i) = super::udp_mcast::interface_index(cfg.addr) {
                    socket2::SockRef::from(&s).set_multicast_if_v6(i)?;
                }
            }
        }
        let port = s.local_addr()?.port();
        tx.push((s, port));
    }
    let port = rx.local_addr()?.port();
    let stats = Arc::new(LinkStats::default());
    let share = match cfg.share {
        true => Some(Share::claim(cfg.addr, port, rx.as_raw_fd(), &mut Rng::os(), stats.clone())?),
        false => None,
    };
    let sockets = Arc::new(Sockets { rx, tx, local: cfg.addr, port });
    let tx_half = UdpTx {
        sockets: sockets.clone(),
        stats: stats.clone(),
        log: log.clone(),
        peer_ports: rustc_hash::FxHashMap::default(),
        batch: Vec::new(),
        chunks: Vec::new(),
        offload,
    };
    let poll_set = match share {
        Some(_) => None,
        None => {
            let set = sys::Epoll::new()?;
            set.add(sockets.rx.as_raw_fd())?;
            Some(set)
        }
    };
    let rx_half = UdpRx {
        sockets,
        stats,
        log,
        batch: RecvBatch::new(RX_BATCH, rx_buffer),
        recovery: icrc::RecoveryCache::default(),
        poll_set,
        share,
        looks: 0,
        mcast: McastSockets::default(),
    };
    Ok((tx_half, rx_half))
}

/// The sending half: fills ICRCs and sends batches.
pub struct UdpTx {
    sockets: Arc<Sockets>,
    stats: Arc<LinkStats>,
    log: Option<Arc<FrameLog>>,
    peer_ports: rustc_hash::FxHashMap<IpAddr, u16>,
    batch: Vec<Pending>,
    /// The messages of the last send, kept so that a send allocates none.
    chunks: Vec<sys::Segmented>,
    offload: bool,
}

/// A packet queued to send, its ICRC not yet filled (it depends on the IPv4
/// Identification, which depends on its place in a GSO send).
struct Pending {
    dst: SocketAddr,
    packet: Vec<u8>,
    socket: usize,
}

impl AsRef<[u8]> for Pending {
    fn as_ref(&self) -> &[u8] {
        &self.packet
    }
}

impl UdpTx {
    /// The counters shared with the receiving half.
    pub fn stats(&self) -> &Arc<LinkStats> {
        &self.stats
    }

    /// The port of the receive socket.
    pub fn port(&self) -> u16 {
        self.sockets.port
    }

    /// Sends to `peer` on `port` instead of the endpoint's own port (tests with several
    /// endpoints on one address).
    pub fn set_peer_port(&mut self, peer: IpAddr, port: u16) {
        self.peer_ports.insert(peer, port);
    }

    /// Takes every packet the engine has to send, fills its ICRC and sends them in batches.
    pub fn flush(&mut self, dev: &mut Device, now_ns: u64) {
        while let Some(t) = dev.poll_transmit(now_ns) {
            self.queue(t);
            if self.batch.len() >= TX_BATCH {
                self.send_queued(&mut |p| dev.recycle(p));
            }
        }
        self.send_queued(&mut |p| dev.recycle(p));
    }

    fn queue(&mut self, t: Transmit) {
        let dst = gid_to_ip(&t.dst);
        let slot = (t.src_qpn as usize).wrapping_mul(0x9e37_79b9) >> 8;
        let socket = slot % self.sockets.tx.len();
        let dport = self.peer_ports.get(&dst).copied().unwrap_or(self.sockets.port);
        self.batch.push(Pending { dst: SocketAddr::new(dst, dport), packet: t.packet, socket });
    }

    /// Fills the ICRC of `p` over the IP and UDP headers the kernel will build for it, with
    /// IPv4 Identification `ident`; false (counted) if it cannot be.
    fn seal(&self, p: &mut Pending, ident: u16) -> bool {
        let sport = self.sockets.tx[p.socket].1;
        let udp = udp_header(sport, p.dst.port(), p.packet.len());
        let build = if self.log.is_some() { ip_header } else { ip_header_for_icrc };
        let (ip, ip_len) = build(self.sockets.local, p.dst.ip(), 8 + p.packet.len(), ident, true, 0);
        let ip_ref = if ip_len == 20 { IpHeader::V4(&ip[..20]) } else { IpHeader::V6(&ip[..40]) };
        if icrc::fill(ip_ref, &udp, &mut p.packet).is_err() {
            self.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if let Some(log) = &self.log {
            log.record(&ip[..ip_len], &udp, &p.packet);
        }
        true
    }

    /// Sends the queue: one `sendmmsg` per run of packets leaving from one socket, and with
    /// offloads, one GSO send per run of equal-sized packets to one peer in it.
    fn send_queued(&mut self, recycle: &mut dyn FnMut(Vec<u8>)) {
        let mut batch = std::mem::take(&mut self.batch);
        // One system call per socket: packets of many QPs interleave sockets, and runs of
        // one packet each made a thousand QPs' ACKs a sendmmsg apiece. A QP always sends
        // from one socket, so a stable sort keeps each QP's packets in order.
        batch.sort_by_key(|p| p.socket);
        let mut start = 0;
        while start < batch.len() {
            let socket = batch[start].socket;
            let end = start + batch[start..].iter().take_while(|b| b.socket == socket).count();
            self.send_run(&mut batch[start..end]);
            start = end;
        }
        for p in batch.drain(..) {
            recycle(p.packet);
        }
        self.batch = batch;
    }

    /// Seals and sends `run` (one socket's packets).
    fn send_run(&mut self, run: &mut [Pending]) {
        let mut chunks = std::mem::take(&mut self.chunks);
        chunks.clear();
        let mut i = 0;
        while i < run.len() {
            let dst = run[i].dst;
            let same = run[i..].iter().take_while(|p| p.dst == dst).count();
            if self.offload {
                gso::responses_last(&mut run[i..i + same], |p| gso::is_response(&p.packet));
            }
            let mut j = i;
            while j < i + same {
                let n = if self.offload { gso::chunk_len(run[j..i + same].iter().map(|p| p.packet.len())) } else { 1 };
                chunks.push(sys::Segmented { dst, first: j, count: n });
                j += n;
            }
            i += same;
        }
        // A chunk one of whose packets cannot be sealed is not sent (counted by `seal`).
        chunks.retain(|c| (0..c.count).all(|k| self.seal(&mut run[c.first + k], gso::segment_ident(k))));
        if let Some(refused) = self.send_messages(run, &chunks) {
            // The kernel cannot segment on this path (Linux refuses UDP_SEGMENT when the
            // link has no checksum offload): offload stays off, and what was refused goes
            // out one datagram each, sealed again with the Identification a lone datagram
            // gets.
            self.offload = false;
            let mut singles = Vec::new();
            for i in chunks[refused..].iter().flat_map(|c| c.first..c.first + c.count) {
                if self.seal(&mut run[i], 0) {
                    singles.push(sys::Segmented { dst: run[i].dst, first: i, count: 1 });
                }
            }
            self.send_messages(run, &singles);
        }
        self.chunks = chunks;
    }

    /// Sends `msgs`, datagrams of `run`, from `run`'s socket; returns the index of a GSO
    /// send the kernel refused (nothing from it on was sent), if one was.
    fn send_messages(&self, run: &[Pending], msgs: &[sys::Segmented]) -> Option<usize> {
        let socket = run.first()?.socket;
        let fd = self.sockets.tx[socket].0.as_raw_fd();
        let mut sent = 0;
        let mut refused = None;
        while sent < msgs.len() {
            match sys::send_segmented(fd, run, &msgs[sent..]) {
                Ok(n) => sent += n.max(1),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let _ = sys::wait_writable(fd);
                }
                Err(e) if msgs[sent].count > 1 && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                    refused = Some(sent);
                    break;
                }
                Err(_) => {
                    // The datagrams are lost, as on a wire; the engine's retransmission covers them.
                    self.stats.tx_errors.fetch_add(msgs[sent].count as u64, Ordering::Relaxed);
                    sent += 1;
                }
            }
        }
        let count: usize = msgs[..sent].iter().map(|m| m.count).sum();
        self.stats.tx_datagrams.fetch_add(count as u64, Ordering::Relaxed);
        refused
    }
}

/// What the ICRC check of one received datagram found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatagramCheck {
    /// The ICRC holds: the sender's GID, ECN-CE, and (IPv4) the Identification and DF the
    /// sender must have used for it to hold.
    Good {
        /// The sender.
        src: Gid,
        /// ECN Congestion Experienced.
        ce: bool,
        /// IPv4 Identification recovered from the ICRC (0 on IPv6).
        ident: u16,
        /// IPv4 Don't Fragment recovered from the ICRC.
        dont_fragment: bool,
    },
    /// No IP header the sender could have built makes the ICRC hold.
    BadIcrc,
    /// Too short to carry a BTH and an ICRC.
    Runt,
}

fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The receive check of a kernel UDP socket, pure: the datagram `payload` from `src` to
/// `local` (address, port) with TOS byte `tos`, its ICRC checked over the IP and UDP
/// headers the sender built (Annex A17.3.3; on IPv4 the Identification and DF, which the
/// socket does not show, are solved from the ICRC). `segment` is the datagram's place in
/// the buffer the kernel coalesced it into (0 for a lone datagram).
pub fn check_datagram(
    cache: &mut icrc::RecoveryCache,
    src: SocketAddr,
    local: (IpAddr, u16),
    tos: u8,
    payload: &[u8],
    segment: usize,
) -> DatagramCheck {
    let src_ip = unmapped(src.ip());
    let udp = udp_header(src.port(), local.1, payload.len());
    // The guess is what softrdma's own sockets send (DF set, so Linux numbers a GSO send's
    // segments from 0): right, it costs one CRC; wrong (rxe's running counter, a buffer
    // coalesced from several sends), the fields are solved for.
    let ident = gso::segment_ident(segment);
    // The ICRC masks the IPv4 header checksum: it is not computed here.
    let (ip, ip_len) = ip_header_for_icrc(src_ip, local.0, 8 + payload.len(), ident, true, tos);
    let good =
        |ident, dont_fragment| DatagramCheck::Good { src: ip_to_gid(src_ip), ce: tos & 3 == 3, ident, dont_fragment };
    if ip_len == 20 {
        match icrc::recover_ipv4_cached(cache, &ip[..20], &udp, payload) {
            Ok(Some(r)) => good(r.ident, r.dont_fragment),
            // A fuzzer cannot forge ICRCs; let it reach what lies behind them.
            Ok(None) if cfg!(fuzzing) => good(0, true),
            Ok(None) => DatagramCheck::BadIcrc,
            Err(_) => DatagramCheck::Runt,
        }
    } else {
        match icrc::verify(IpHeader::V6(&ip[..40]), &udp, payload) {
            Ok(()) => good(0, false),
            Err(crate::proto::Error::BadChecksum { .. }) => DatagramCheck::BadIcrc,
            Err(_) => DatagramCheck::Runt,
        }
    }
}

/// The receiving half: reads batches and checks ICRCs.
pub struct UdpRx {
    sockets: Arc<Sockets>,
    stats: Arc<LinkStats>,
    log: Option<Arc<FrameLog>>,
    batch: RecvBatch,
    recovery: icrc::RecoveryCache,
    /// The other devices on this address, if it is shared.
    share: Option<Share>,
    /// Calls to [`UdpRx::recv`], to look at forwarded packets now and then while the
    /// UDP socket is busy.
    looks: u32,
    /// The multicast groups joined.
    mcast: McastSockets,
    /// The poll set when the address is not shared (the share has its own): the receive
    /// socket and the groups' sockets.
    poll_set: Option<sys::Epoll>,
}

/// Forwarded packets are looked for once in this many reads, busy or idle: a spinning
/// poller's idle looks are what a ping-pong's latency is made of, and a second system
/// call in each cost 0.5-2.5 µs per message (`softrdma demo`); a forwarded packet waits
/// at most this many looks.
const FORWARD_LOOK_EVERY: u32 = 16;

/// What one received datagram becomes, before the engine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxVerdict {
    /// ICRC good: the source GID and whether the IP header was marked ECN-CE.
    Good {
        /// The sender.
        src: Gid,
        /// ECN Congestion Experienced.
        ce: bool,
    },
    /// Dropped (counted).
    Dropped,
}

impl UdpRx {
    /// The receive socket's descriptor, for a poll.
    pub fn fd(&self) -> RawFd {
        match (&self.share, &self.poll_set) {
            (Some(share), _) => share.fd(),
            (None, Some(set)) => set.as_raw_fd(),
            (None, None) => self.sockets.rx.as_raw_fd(),
        }
    }

    /// The set [`UdpRx::fd`] stands for.
    fn poll_set(&self) -> Option<&sys::Epoll> {
        self.share.as_ref().map(Share::poll_set).or(self.poll_set.as_ref())
    }

    /// Starts receiving multicast group `mgid` on the device's port.
    pub fn join(&mut self, mgid: &Gid) -> io::Result<()> {
        let fd = self.mcast.join(mgid, self.sockets.local, self.sockets.port)?;
        if let Some(set) = self.poll_set() {
            set.add(fd)?;
        }
        Ok(())
    }

    /// Stops receiving group `mgid`.
    pub fn leave(&mut self, mgid: &Gid) {
        if let Some(fd) = self.mcast.leave(mgid) {
            if let Some(set) = self.poll_set() {
                set.remove(fd);
            }
        }
    }

    /// Reads what is queued (up to one batch, and what other devices on a shared address
    /// handed on) without blocking; returns the count.
    pub fn recv(&mut self) -> io::Result<usize> {
        let udp = self.recv_udp();
        self.looks = self.looks.wrapping_add(1);
        let multicast = if self.mcast.any() { self.mcast.recv() } else { 0 };
        let forwarded = match self.share.as_mut() {
            Some(share) if self.looks.is_multiple_of(FORWARD_LOOK_EVERY) => share.recv(),
            _ => 0,
        };
        match udp {
            Ok(n) => Ok(n + forwarded + multicast),
            Err(_) if forwarded + multicast > 0 => Ok(forwarded + multicast),
            Err(e) => Err(e),
        }
    }

    fn recv_udp(&mut self) -> io::Result<usize> {
        let n = self.batch.recv(self.sockets.rx.as_raw_fd())?;
        let datagrams: usize = (0..n).map(|i| self.batch.datagrams_in(i)).sum();
        self.stats.rx_datagrams.fetch_add(datagrams as u64, Ordering::Relaxed);
        Ok(datagrams)
    }

    /// Checks every datagram of the last [`UdpRx::recv`] and hands the good ones to `dev`.
    pub fn deliver(&mut self, dev: &mut Device, now_ns: u64) {
        // Borrowed field by field: moving the batch out and back cost a ping-pong's every
        // receive two copies of it.
        let UdpRx { batch, share, sockets, recovery, log, stats, .. } = self;
        let local = (sockets.local, sockets.port);
        for i in 0..batch.len() {
            let Some((bytes, src, tos)) = batch.get(i) else { break };
            let segment = batch.segment_bytes(i).unwrap_or(bytes.len()).max(1);
            for (k, payload) in bytes.chunks(segment).enumerate() {
                if let Some(share) = share.as_mut() {
                    if share.forward(share::owner_of(payload), src, tos, payload) {
                        continue;
                    }
                }
                let got = (src, tos, payload, k);
                if let RxVerdict::Good { src, ce } = check_received(recovery, local, log.as_deref(), stats, got) {
                    dev.handle_packet_ecn(now_ns, src, ce, payload);
                }
            }
        }
        self.deliver_forwarded(dev, now_ns);
        self.deliver_multicast(dev, now_ns);
    }

    /// Checks and hands to `dev` what the group sockets read: each datagram's ICRC over an
    /// IP header addressed to its group.
    fn deliver_multicast(&mut self, dev: &mut Device, now_ns: u64) {
        let port = self.sockets.port;
        for (mgid, src, payload) in self.mcast.received() {
            let group = gid_to_ip(&mgid);
            match check_datagram(&mut self.recovery, src, (group, port), 0, payload, 0) {
                DatagramCheck::Good { src, ce, .. } => dev.handle_multicast(now_ns, src, mgid, ce, payload),
                DatagramCheck::BadIcrc => {
                    self.stats.rx_icrc_bad.fetch_add(1, Ordering::Relaxed);
                }
                DatagramCheck::Runt => {
                    self.stats.rx_runt.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Checks and hands to `dev` what other devices on the address handed on to this one.
    fn deliver_forwarded(&mut self, dev: &mut Device, now_ns: u64) {
        // Taking the share out and putting it back copies it (some 300 bytes) twice, on
        // every receive of a ping-pong: only when something was handed on.
        if self.share.as_ref().is_none_or(|s| s.pending() == 0) {
            return;
        }
        let Some(mut share) = self.share.take() else { return };
        for i in 0..share.pending() {
            let Some(f) = share.received(i) else {
                self.runt();
                continue;
            };
            if let RxVerdict::Good { src, ce } = self.check(f.src, f.tos, f.payload, 0) {
                dev.handle_packet_ecn(now_ns, src, ce, f.payload);
            }
        }
        share.clear();
        self.share = Some(share);
    }

    fn check(&mut self, src: SocketAddr, tos: u8, payload: &[u8], segment: usize) -> RxVerdict {
        let local = (self.sockets.local, self.sockets.port);
        check_received(&mut self.recovery, local, self.log.as_deref(), &self.stats, (src, tos, payload, segment))
    }

    fn runt(&self) -> RxVerdict {
        self.stats.rx_runt.fetch_add(1, Ordering::Relaxed);
        RxVerdict::Dropped
    }
}

/// Checks the ICRC of `payload`, segment `segment` of a datagram from `src` with TOS `tos`
/// received at `local`; records it in the capture, if one is kept, and counts a drop.
fn check_received(
    recovery: &mut icrc::RecoveryCache,
    local: (IpAddr, u16),
    log: Option<&FrameLog>,
    stats: &LinkStats,
    (src, tos, payload, segment): (SocketAddr, u8, &[u8], usize),
) -> RxVerdict {
    let checked = check_datagram(recovery, src, local, tos, payload, segment);
    if let Some(log) = log {
        // Only the capture needs the header as it was sent.
        let (ident, df) = match checked {
            DatagramCheck::Good { ident, dont_fragment, .. } => (ident, dont_fragment),
            _ => (0, false),
        };
        let (ip, ip_len) = ip_header(unmapped(src.ip()), local.0, 8 + payload.len(), ident, df, tos);
        log.record(&ip[..ip_len], &udp_header(src.port(), local.1, payload.len()), payload);
    }
    let counter = match checked {
        DatagramCheck::Good { src, ce, ident, .. } => {
            if ident != 0 {
                stats.rx_ipv4_ident_nonzero.fetch_add(1, Ordering::Relaxed);
            }
            return RxVerdict::Good { src, ce };
        }
        DatagramCheck::BadIcrc => &stats.rx_icrc_bad,
        DatagramCheck::Runt => &stats.rx_runt,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    RxVerdict::Dropped
}

impl PacketTx for UdpTx {
    fn flush(&mut self, dev: &mut Device, now_ns: u64) {
        UdpTx::flush(self, dev, now_ns)
    }
    fn port(&self) -> u16 {
        UdpTx::port(self)
    }
    fn set_peer_port(&mut self, peer: IpAddr, port: u16) {
        UdpTx::set_peer_port(self, peer, port)
    }
    fn describe(&self) -> String {
        let offload = if self.offload { " with GSO and GRO" } else { "" };
        format!("kernel UDP sockets{offload}")
    }
}

impl PacketRx for UdpRx {
    fn fd(&self) -> RawFd {
        UdpRx::fd(self)
    }
    fn recv(&mut self) -> io::Result<usize> {
        UdpRx::recv(self)
    }
    fn deliver(&mut self, dev: &mut Device, now_ns: u64) {
        UdpRx::deliver(self, dev, now_ns)
    }
    fn id_tag(&self) -> Option<u8> {
        self.share.as_ref().map(Share::tag)
    }
    fn claim_service(&mut self, port: u16) -> io::Result<()> {
        self.share.as_mut().map_or(Ok(()), |s| s.claim_service(port))
    }
    fn release_service(&mut self, port: u16) {
        if let Some(s) = self.share.as_mut() {
            s.release_service(port);
        }
    }
    fn join(&mut self, mgid: &Gid) -> io::Result<()> {
        UdpRx::join(self, mgid)
    }
    fn leave(&mut self, mgid: &Gid) {
        UdpRx::leave(self, mgid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn offloads_are_on_for_loopback_and_devices_and_virtual_links_on_linux_6_2() {
        assert!(offload_by_default(IpAddr::from([127, 0, 0, 1])));
        assert!(!backed_by_device("lo") && !backed_by_device("lo:1"), "loopback is not a device");
        assert!(!backed_by_device("") && !backed_by_device("../../devices"), "not an interface name");
    }

    /// A path whose kernel refuses GSO sends (here: a socket without UDP checksums, which
    /// Linux refuses like a link without checksum offload): the datagrams still arrive,
    /// one by one with ICRCs that hold, and offload is off from then on.
    #[test]
    fn a_refused_gso_send_goes_out_datagram_by_datagram() {
        let local = IpAddr::from([127, 0, 0, 1]);
        let cfg = UdpConfig { addr: local, port: 0, source_ports: 1, offload: true, share: false, ecn: false };
        let (mut tx, _rx) = open(&cfg, None).unwrap();
        assert!(tx.offload, "loopback takes GSO");
        sys::set_int_option(tx.sockets.tx[0].0.as_raw_fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1).unwrap();
        let sink = UdpSocket::bind((local, 0)).unwrap();
        sink.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        tx.set_peer_port(local, sink.local_addr().unwrap().port());
        let n = 20;
        for i in 0..n {
            let mut packet = vec![0u8; 100];
            packet[0] = 0x64; // UD SEND Only: any BTH will do for the ICRC
            packet[11] = i as u8;
            tx.queue(Transmit { dst: ip_to_gid(local), src: ip_to_gid(local), src_qpn: 7, packet });
        }
        tx.send_queued(&mut drop);
        assert!(!tx.offload, "offload is off after the refusal");
        let (mut got, mut cache, mut buf) = (0, icrc::RecoveryCache::default(), [0u8; 2048]);
        let deadline = Instant::now() + Duration::from_secs(2);
        while got < n && Instant::now() < deadline {
            let Ok((len, from)) = sink.recv_from(&mut buf) else { continue };
            let port = sink.local_addr().unwrap().port();
            let check = check_datagram(&mut cache, from, (local, port), 0, &buf[..len], 0);
            assert!(matches!(check, DatagramCheck::Good { ident: 0, .. }), "{check:?}");
            got += 1;
        }
        assert_eq!(got, n, "every datagram arrived");
        assert_eq!(tx.stats.tx_errors.load(Ordering::Relaxed), 0);
    }

    /// The ECN field is read only when asked for (congestion control on): a datagram
    /// marked CE shows it to a socket that asked, and nothing to one that did not.
    #[test]
    fn the_ecn_field_is_read_only_when_asked_for() {
        let local = IpAddr::from([127, 0, 0, 1]);
        for ecn in [false, true] {
            let cfg = UdpConfig { addr: local, port: 0, source_ports: 1, offload: false, share: false, ecn };
            let (_tx, mut rx) = open(&cfg, None).unwrap();
            let marker = UdpSocket::bind((local, 0)).unwrap();
            sys::set_int_option(marker.as_raw_fd(), libc::IPPROTO_IP, libc::IP_TOS, 3).unwrap();
            marker.send_to(&[0u8; 32], (local, rx.sockets.port)).unwrap();
            let deadline = Instant::now() + Duration::from_secs(2);
            while rx.recv().unwrap_or(0) == 0 {
                assert!(Instant::now() < deadline, "the datagram arrived");
            }
            let (_, _, tos) = rx.batch.get(0).unwrap();
            assert_eq!(tos & 3, if ecn { 3 } else { 0 }, "asked for the ECN field: {ecn}");
        }
    }
}
