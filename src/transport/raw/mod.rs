//! RoCEv2 on raw Ethernet: a device that owns an IP address (and a MAC) the kernel does
//! not hold, on a network interface, moving whole frames through a packet socket
//! (`AF_PACKET`) or an AF_XDP socket ([`xdp`]). It answers ARP, Neighbour Discovery and echo requests for its address,
//! builds every header as an RDMA NIC does ([`frame::roce_frame`]), verifies the ICRC
//! over the real headers (all 32 bits), takes ECN-CE from the IP header and drops
//! fragments.
//!
//! Coexistence with the kernel, by design: frames go out from the device's own MAC
//! (locally administered, derived from its address unless given), so the kernel's stack
//! sees the replies to them as for another host (`PACKET_OTHERHOST`) and drops them
//! before IP: it never answers for the address, never sends a TCP RST or ICMP
//! port-unreachable for it. The interface is put in promiscuous mode through a membership
//! of the packet socket, which the kernel removes with the socket, also when the process
//! dies. The address must not be one the kernel holds.

pub mod frame;
pub mod gso;
pub mod io;
pub mod neighbour;
pub mod socket;
pub mod xdp;

pub use socket::FrameSocket;

use super::link::{LinkStats, PacketRx, PacketTx};
use super::pcap::FrameLog;
use super::sys;
use crate::engine::verbs::Mtu;
use crate::engine::Device;
use crate::transport::headers::gid_to_ip;
use crate::transport::udp::ROCE_PORT;
use frame::{DropReason, Inbound, Local, RoceFields};
use io::{FrameRx, FrameTx, Frames};
use neighbour::{Neighbours, Resolution};
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Frames sent per batch: as many as one GSO send of a packet socket merges, so that a
/// 64 KiB message at path MTU 1024 can leave as one (raw-to-raw across a veth, three
/// alternated rounds: WRITE 1,927-2,186 MB/s and READ 1,858-2,145 against 1,895-1,906 and
/// 1,484-1,892 at 32).
const TX_BATCH: usize = gso::MERGE_FRAMES_MAX;
/// The IPv4 TOS an RDMA NIC sends RoCEv2 with by default: DSCP 0, ECN-capable (ECT(0)), so
/// that a switch can mark congestion instead of dropping (DCQCN).
pub const DEFAULT_TOS: u8 = 0b10;
/// Bytes a RoCEv2 packet adds to its payload at most: IPv6 (40), UDP (8), BTH (12), the
/// largest extension headers (RETH 16 + ImmDt 4, or AtomicETH 28) and the ICRC (4).
pub const HEADROOM: usize = 96;
/// The largest IB path MTU whose packets, with [`HEADROOM`], fit a link of `link_bytes`
/// (as rxe sizes its port's active MTU from the netdev's).
pub fn path_mtu_for_link(link_bytes: usize) -> Mtu {
    let fits = [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512];
    fits.into_iter().find(|m| m.bytes() + HEADROOM <= link_bytes).unwrap_or(Mtu::M256)
}

/// Linux's capability numbers (linux/capability.h).
const CAP_NET_RAW: u32 = 13;
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// How a raw device sits on its link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawConfig {
    /// The network interface (e.g. `veth0`, `eth1`).
    pub iface: String,
    /// The device's own IP address, which the kernel must not hold.
    pub ip: IpAddr,
    /// The on-link prefix length (`/24`): other addresses go through `gateway`.
    pub prefix_len: u8,
    /// The next hop for addresses off the link.
    pub gateway: Option<IpAddr>,
    /// The device's MAC; `None`: a locally administered one derived from `ip`.
    pub mac: Option<[u8; 6]>,
    /// DSCP and ECN bits of every RoCEv2 packet (default [`DEFAULT_TOS`]).
    pub tos: u8,
    /// How frames move: a packet socket (default) or AF_XDP.
    pub frame_io: FrameIo,
}

/// How a raw device moves its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrameIo {
    /// A packet socket (`AF_PACKET`): works on every interface.
    #[default]
    PacketSocket,
    /// AF_XDP, with an XDP program that hands the device only frames for its address.
    Xdp,
}

impl std::str::FromStr for FrameIo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "packet" | "af_packet" => Ok(FrameIo::PacketSocket),
            "xdp" | "af_xdp" => Ok(FrameIo::Xdp),
            other => Err(format!("unknown frame I/O {other:?} (packet or xdp)")),
        }
    }
}

impl RawConfig {
    /// A device at `ip/prefix_len` on `iface`, with defaults for the rest.
    pub fn new(iface: &str, ip: IpAddr, prefix_len: u8) -> Self {
        RawConfig {
            iface: iface.to_string(),
            ip,
            prefix_len,
            gateway: None,
            mac: None,
            tos: DEFAULT_TOS,
            frame_io: FrameIo::PacketSocket,
        }
    }

    /// Parses `ADDR/LEN` (e.g. `10.9.0.2/24`); a bare address is a host route (/32, /128).
    pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), String> {
        let (addr, len) = s.split_once('/').map_or((s, None), |(a, l)| (a, Some(l)));
        let ip: IpAddr = addr.parse().map_err(|e| format!("{addr:?} is not an IP address: {e}"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len = match len {
            Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max).ok_or(format!("{l:?} is not a prefix length"))?,
            None => max,
        };
        Ok((ip, len))
    }

    /// The MAC the device uses: the given one, or `02:5e` and the address's last four bytes.
    pub fn mac(&self) -> [u8; 6] {
        self.mac.unwrap_or_else(|| {
            let tail = match self.ip {
                IpAddr::V4(v4) => v4.octets(),
                IpAddr::V6(v6) => v6.octets()[12..].try_into().unwrap_or([0; 4]),
            };
            [0x02, 0x5e, tail[0], tail[1], tail[2], tail[3]]
        })
    }

    /// The largest IB path MTU that fits the interface's MTU with every header of a
    /// RoCEv2 packet around it (as rxe sizes its port's active MTU: the netdev MTU less
    /// [`HEADROOM`]). Over AF_XDP a frame must also fit one UMEM chunk after the headroom
    /// the kernel leaves in it ([`xdp::FRAME_MAX`], 3840 bytes): a 4096-byte payload does
    /// not, whatever the link's MTU, so the path MTU is at most 2048 there.
    pub fn active_mtu(&self) -> std::io::Result<Mtu> {
        let link = sys::interface_info(&self.iface)?.1 as usize;
        let room = match self.frame_io {
            FrameIo::Xdp => link.min(xdp::FRAME_MAX - frame::ETH_HEADER_LEN),
            FrameIo::PacketSocket => link,
        };
        Ok(path_mtu_for_link(room))
    }

    /// The next hop for `dst`: itself on the link, else the gateway.
    fn next_hop(&self, dst: IpAddr) -> Option<IpAddr> {
        let on_link = match (self.ip, dst) {
            (IpAddr::V4(a), IpAddr::V4(b)) => prefix_eq(&a.octets(), &b.octets(), self.prefix_len),
            (IpAddr::V6(a), IpAddr::V6(b)) => prefix_eq(&a.octets(), &b.octets(), self.prefix_len),
            _ => return None,
        };
        if on_link {
            Some(dst)
        } else {
            self.gateway
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], len: u8) -> bool {
    let bits = usize::from(len);
    let whole = bits / 8;
    if a[..whole] != b[..whole] {
        return false;
    }
    let rest = bits % 8;
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

/// Why a raw device could not open, said so that the user knows what to do.
fn open_error(cfg: &RawConfig, what: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("raw device on {}: {what}: {e}", cfg.iface))
}

/// True if this process holds capability `cap` (from /proc/self/status `CapEff`).
fn has_capability(cap: u32) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim);
    eff.and_then(|h| u64::from_str_radix(h, 16).ok()).is_some_and(|bits| bits >> cap & 1 == 1)
}

/// What both halves share.
struct RawShared {
    frames: Arc<dyn FrameTx>,
    cfg: RawConfig,
    local: Local,
    neighbours: Mutex<Neighbours>,
    stats: Arc<LinkStats>,
    log: Option<Arc<FrameLog>>,
}

/// Checks privileges and the interface, and opens the way frames move (`cfg.frame_io`);
/// returns both halves and the interface's MTU.
pub fn open_frames(cfg: &RawConfig) -> std::io::Result<Frames> {
    if !has_capability(CAP_NET_RAW) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "raw device on {}: a packet socket needs CAP_NET_RAW (run as root, or `setcap cap_net_raw+ep` on the binary)",
                cfg.iface
            ),
        ));
    }
    let may_bpf = has_capability(CAP_BPF) || has_capability(CAP_SYS_ADMIN);
    if cfg.frame_io == FrameIo::Xdp && !(may_bpf && has_capability(CAP_NET_ADMIN)) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "raw device on {}: AF_XDP loads and attaches an XDP program, which needs CAP_BPF and CAP_NET_ADMIN as well as CAP_NET_RAW (run as root)",
                cfg.iface
            ),
        ));
    }
    let (ifindex, mtu) = sys::interface_info(&cfg.iface).map_err(|e| open_error(cfg, "interface", e))?;
    match cfg.frame_io {
        FrameIo::PacketSocket => {
            let (tx, rx) = io::packet_socket(ifindex, true).map_err(|e| open_error(cfg, "packet socket", e))?;
            Ok(Frames { tx: Arc::new(tx), rx: Box::new(rx), mtu: mtu as usize })
        }
        FrameIo::Xdp => {
            let (tx, rx) = xdp::open(ifindex, cfg.ip).map_err(|e| open_error(cfg, "AF_XDP", e))?;
            Ok(Frames { tx: Arc::new(tx), rx: Box::new(rx), mtu: mtu as usize })
        }
    }
}

/// Opens the raw RoCEv2 device's two halves.
pub fn open(cfg: &RawConfig, log: Option<Arc<FrameLog>>) -> std::io::Result<(RawTx, RawRx, Arc<LinkStats>)> {
    let Frames { tx: frames, rx: frames_rx, .. } = open_frames(cfg)?;
    let stats = Arc::new(LinkStats::default());
    let local = Local { mac: cfg.mac(), ip: cfg.ip };
    let shared = Arc::new(RawShared {
        frames,
        cfg: cfg.clone(),
        local,
        neighbours: Mutex::new(Neighbours::default()),
        stats: stats.clone(),
        log,
    });
    let mut ident = [0u8; 2];
    let _ = getrandom::fill(&mut ident);
    let tx = RawTx { shared: shared.clone(), batch: Vec::new(), spare: Vec::new(), ident: u16::from_be_bytes(ident) };
    let rx = RawRx { shared, frames: frames_rx, groups: Vec::new() };
    Ok((tx, rx, stats))
}

impl RawShared {
    fn send(&self, frames: &[Vec<u8>]) {
        let refused = self.frames.send(frames);
        // A refused frame is lost, as on a wire (too big for the link, link down): the
        // engine retransmits.
        self.stats.tx_errors.fetch_add(refused as u64, Ordering::Relaxed);
        self.stats.tx_datagrams.fetch_add((frames.len() - refused) as u64, Ordering::Relaxed);
    }

    /// The request (ARP or Neighbour Solicitation) that resolves `hop`.
    fn request_for(&self, hop: IpAddr) -> Option<Vec<u8>> {
        self.stats.neighbour_requests.fetch_add(1, Ordering::Relaxed);
        match (self.local.ip, hop) {
            (IpAddr::V4(ours), IpAddr::V4(h)) => Some(frame::arp_request(&self.local, ours, h)),
            (IpAddr::V6(ours), IpAddr::V6(h)) => Some(frame::neighbour_solicitation(&self.local, ours, h)),
            _ => None,
        }
    }

    fn record(&self, frame: &[u8]) {
        let Some(log) = &self.log else { return };
        let ip_len = if frame.get(12..14) == Some(&[0x86, 0xdd]) { 40 } else { 20 };
        let (udp_at, payload_at) = (frame::ETH_HEADER_LEN + ip_len, frame::ETH_HEADER_LEN + ip_len + 8);
        let total = match ip_len {
            20 => frame.get(16..18).map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]]))),
            _ => frame.get(18..20).map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])) + 40),
        };
        let end = (frame::ETH_HEADER_LEN + total).min(frame.len());
        if end > payload_at {
            log.record(&frame[frame::ETH_HEADER_LEN..udp_at], &frame[udp_at..payload_at], &frame[payload_at..end]);
        }
    }
}

/// The sending half of a raw device.
pub struct RawTx {
    shared: Arc<RawShared>,
    batch: Vec<Vec<u8>>,
    /// Buffers of frames sent, to build the next ones in (at most [`TX_BATCH`]): one
    /// allocated and freed a packet was about 320 instructions of a ping-pong's turn.
    spare: Vec<Vec<u8>>,
    ident: u16,
}

impl RawTx {
    /// A UDP source port per QP in 0xC000..=0xFFFF, as RDMA NICs spread QPs for ECMP.
    fn source_port(qpn: u32) -> u16 {
        let h = qpn.wrapping_mul(0x9e37_79b9) >> 16;
        0xc000 | (h as u16 & 0x3fff)
    }

    /// Sends the batch; keeps its buffers for the next frames.
    fn send_batch(&mut self) {
        self.shared.send(&self.batch);
        let room = TX_BATCH.saturating_sub(self.spare.len());
        self.spare.extend(self.batch.drain(..).take(room));
    }

    fn queue(&mut self, dst: IpAddr, src_qpn: u32, packet: &[u8], now_ns: u64) {
        let s = &self.shared;
        let dst = match dst {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        self.ident = self.ident.wrapping_add(1);
        let fields = RoceFields { sport: Self::source_port(src_qpn), ident: self.ident, tos: s.cfg.tos };
        if dst.is_multicast() {
            // A group has no neighbour to ask: its frames go to the group's own MAC.
            let Ok(mut frame) = frame::roce_frame(&s.local, dst, fields, packet) else {
                s.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
                return;
            };
            frame::set_dst_mac(&mut frame, frame::multicast_mac(dst));
            s.record(&frame);
            self.batch.push(frame);
            return;
        }
        let mut frame = self.spare.pop().unwrap_or_default();
        let (Ok(()), Some(hop)) =
            (frame::roce_frame_into(&mut frame, &s.local, dst, fields, packet), s.cfg.next_hop(dst))
        else {
            s.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
            return;
        };
        s.record(&frame);
        let (resolution, frame) = s.neighbours.lock().unwrap_or_else(|e| e.into_inner()).resolve(hop, frame, now_ns);
        match (resolution, frame) {
            (Resolution::Known(mac), Some(mut frame)) => {
                frame::set_dst_mac(&mut frame, mac);
                self.batch.push(frame);
            }
            (Resolution::Held { ask, dropped }, _) => {
                s.stats.tx_unresolved.fetch_add(dropped as u64, Ordering::Relaxed);
                if let Some(request) = ask.then(|| s.request_for(hop)).flatten() {
                    self.batch.push(request);
                }
            }
            _ => {}
        }
    }
}

impl PacketTx for RawTx {
    fn flush(&mut self, dev: &mut Device, now_ns: u64) {
        while let Some(t) = dev.poll_transmit(now_ns) {
            self.queue(gid_to_ip(&t.dst), t.src_qpn, &t.packet, now_ns);
            dev.recycle(t.packet);
            if self.batch.len() >= TX_BATCH {
                self.send_batch();
            }
        }
        // Raw packet QPs' frames, whole, as they were posted.
        while let Some(f) = dev.poll_raw_frame() {
            self.batch.push(f);
            if self.batch.len() >= TX_BATCH {
                self.send_batch();
            }
        }
        if !self.batch.is_empty() {
            self.send_batch();
        }
    }

    fn port(&self) -> u16 {
        ROCE_PORT
    }

    fn describe(&self) -> String {
        format!("raw Ethernet on {}, {}", self.shared.cfg.iface, self.shared.frames.describe())
    }
}

/// The receiving half of a raw device.
pub struct RawRx {
    shared: Arc<RawShared>,
    frames: Box<dyn FrameRx>,
    /// The multicast groups joined (at most `MAX_MCAST_GROUPS`, the engine's bound).
    groups: Vec<IpAddr>,
}

impl RawRx {
    fn on_frame(&self, dev: &mut Device, now_ns: u64, data: &[u8], replies: &mut Vec<Vec<u8>>) {
        let s = &self.shared;
        let count = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        match frame::classify(&s.local, data) {
            Inbound::Roce { src, ce, packet } => {
                s.record(data);
                dev.handle_packet_ecn(now_ns, src, ce, packet);
            }
            Inbound::Neighbour { learned, reply } => {
                if let Some((ip, mac)) = learned {
                    let held = s.neighbours.lock().unwrap_or_else(|e| e.into_inner()).learn(ip, mac, now_ns);
                    replies.extend(held.into_iter().map(|mut f| {
                        frame::set_dst_mac(&mut f, mac);
                        f
                    }));
                }
                if let Some(r) = reply {
                    count(&s.stats.neighbour_replies);
                    replies.push(r);
                }
            }
            Inbound::Advertised { ip, mac } => {
                let held = s.neighbours.lock().unwrap_or_else(|e| e.into_inner()).update(ip, mac, now_ns);
                replies.extend(held.into_iter().map(|mut f| {
                    frame::set_dst_mac(&mut f, mac);
                    f
                }));
            }
            Inbound::Echo(reply) => {
                count(&s.stats.echo_replies);
                replies.push(reply);
            }
            Inbound::RoceMulticast { group, src, ce, packet } if self.groups.contains(&group) => {
                dev.handle_multicast(now_ns, src, crate::transport::headers::ip_to_gid(group), ce, packet);
            }
            Inbound::RoceMulticast { .. } => count(&s.stats.rx_not_ours),
            Inbound::Dropped(why @ (DropReason::NotOurs | DropReason::Malformed)) => {
                count(if why == DropReason::NotOurs { &s.stats.rx_not_ours } else { &s.stats.rx_runt });
                // Not the device's own traffic: maybe a raw packet QP's.
                dev.handle_raw_frame(data);
            }
            Inbound::Dropped(why) => count(match why {
                DropReason::NotOurs => &s.stats.rx_not_ours,
                DropReason::Fragment => &s.stats.rx_fragments,
                DropReason::Malformed => &s.stats.rx_runt,
                DropReason::Icrc => &s.stats.rx_icrc_bad,
            }),
        }
    }
}

impl PacketRx for RawRx {
    fn fd(&self) -> RawFd {
        self.frames.fd()
    }

    fn recv(&mut self) -> std::io::Result<usize> {
        let n = self.frames.recv()?;
        self.shared.stats.rx_datagrams.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn join(&mut self, mgid: &crate::engine::verbs::Gid) -> std::io::Result<()> {
        let group = crate::transport::headers::gid_to_ip(mgid);
        let family_ok = group.is_ipv4() == self.shared.local.ip.is_ipv4();
        if !group.is_multicast() || !family_ok {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a multicast group of the device's family",
            ));
        }
        if self.groups.len() >= crate::engine::mcast::MAX_MCAST_GROUPS {
            return Err(std::io::Error::new(std::io::ErrorKind::OutOfMemory, "too many groups"));
        }
        if !self.groups.contains(&group) {
            self.groups.push(group);
        }
        Ok(())
    }

    fn leave(&mut self, mgid: &crate::engine::verbs::Gid) {
        let group = crate::transport::headers::gid_to_ip(mgid);
        self.groups.retain(|g| *g != group);
    }

    fn deliver(&mut self, dev: &mut Device, now_ns: u64) {
        let mut replies = Vec::new();
        let mut i = 0;
        while let Some(data) = self.frames.frame(i) {
            self.on_frame(dev, now_ns, data, &mut replies);
            i += 1;
        }
        if !replies.is_empty() {
            self.shared.send(&replies);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_and_without_a_prefix() {
        assert_eq!(RawConfig::parse_cidr("10.9.0.2/24"), Ok(("10.9.0.2".parse().unwrap(), 24)));
        assert_eq!(RawConfig::parse_cidr("fd00::2"), Ok(("fd00::2".parse().unwrap(), 128)));
        assert!(RawConfig::parse_cidr("10.9.0.2/33").is_err());
        assert!(RawConfig::parse_cidr("ten/8").is_err());
    }

    #[test]
    fn next_hops_are_on_link_or_the_gateway() {
        let mut c = RawConfig::new("veth0", "10.9.0.2".parse().unwrap(), 23);
        assert_eq!(c.next_hop("10.9.1.7".parse().unwrap()), Some("10.9.1.7".parse().unwrap()));
        assert_eq!(c.next_hop("10.9.2.7".parse().unwrap()), None);
        c.gateway = Some("10.9.0.1".parse().unwrap());
        assert_eq!(c.next_hop("8.8.8.8".parse().unwrap()), c.gateway);
        assert_eq!(c.mac(), [0x02, 0x5e, 10, 9, 0, 2]);
    }

    #[test]
    fn source_ports_spread_over_the_top_quarter() {
        let ports: std::collections::HashSet<u16> = (0..64).map(|q| RawTx::source_port(0x100 + q)).collect();
        assert!(ports.iter().all(|p| *p >= 0xc000));
        assert!(ports.len() > 32, "QPs spread over many ports: {}", ports.len());
    }
}
