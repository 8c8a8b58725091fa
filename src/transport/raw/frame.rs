//! Whole Ethernet frames of a raw RoCEv2 device, pure (no I/O): the frames it sends
//! (RoCEv2 as an RDMA NIC builds them, ARP and Neighbour Discovery, echo replies) and what
//! one received frame is to it ([`classify`]).
//!
//! A RoCEv2 frame is Ethernet II, IPv4 (DF, the device's own Identification, DSCP and ECN
//! from the device) or IPv6, UDP to port 4791 from a per-QP source port, the BTH...payload,
//! and the ICRC computed over the real IP and UDP headers (IBTA Annex A17.3.3). The UDP
//! checksum is 0 over IPv4, as RDMA NICs and rxe send it (A17.4.2 leaves integrity to the
//! ICRC); over IPv6, where RFC 8200 wants one, it is computed.

use crate::engine::verbs::Gid;
use crate::proto::roce::icrc::{self, IpHeader};
use crate::transport::headers::{ip_header, ip_to_gid, ipv4_checksum, udp_header};
use crate::transport::udp::ROCE_PORT;
use etherparse::{
    ArpEthIpv4Packet, ArpOperation, Icmpv4Type, Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The ICRC at the end of every RoCEv2 packet.
const ICRC_LEN: usize = 4;
/// Ethernet II header length.
pub const ETH_HEADER_LEN: usize = 14;
/// Shortest Ethernet frame without its FCS; shorter frames are padded.
const MIN_FRAME_LEN: usize = 60;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_ARP: u16 = 0x0806;
/// The all-ones Ethernet broadcast address.
pub const BROADCAST: [u8; 6] = [0xff; 6];
/// NDP option types (RFC 4861 §4.6.1).
const ND_OPT_SOURCE_LL: u8 = 1;
const ND_OPT_TARGET_LL: u8 = 2;

/// Who the device is on the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    /// Its MAC address.
    pub mac: [u8; 6],
    /// Its IP address (the kernel does not hold it).
    pub ip: IpAddr,
}

/// Why a RoCEv2 frame could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildError {
    /// The destination is not of the device's address family.
    FamilyMismatch,
    /// The engine's packet is too short to carry an ICRC, or too long for IP.
    BadLength,
}

/// The fields of the IP and UDP headers a RoCEv2 frame takes from its sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFields {
    /// UDP source port (per QP, for ECMP entropy).
    pub sport: u16,
    /// IPv4 Identification (the device's own counter; ignored on IPv6).
    pub ident: u16,
    /// The IPv4 TOS byte or IPv6 traffic class: DSCP and ECN.
    pub tos: u8,
}

fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, frame: &mut Vec<u8>) {
    frame.extend_from_slice(&dst);
    frame.extend_from_slice(&src);
    frame.extend_from_slice(&ethertype.to_be_bytes());
}

fn pad(mut frame: Vec<u8>) -> Vec<u8> {
    pad_in_place(&mut frame);
    frame
}

fn pad_in_place(frame: &mut Vec<u8>) {
    if frame.len() < MIN_FRAME_LEN {
        frame.resize(MIN_FRAME_LEN, 0);
    }
}

/// The frame of one engine packet (BTH...ICRC, ICRC ignored) from `local` to `dst`, with
/// the destination MAC left zero for the neighbour table to fill ([`set_dst_mac`]).
pub fn roce_frame(local: &Local, dst: IpAddr, f: RoceFields, packet: &[u8]) -> Result<Vec<u8>, BuildError> {
    let mut frame = Vec::new();
    roce_frame_into(&mut frame, local, dst, f, packet)?;
    Ok(frame)
}

/// As [`roce_frame`], into `frame` (cleared first): a sender that keeps its sent frames'
/// buffers builds the next ones in them instead of allocating one a packet.
pub fn roce_frame_into(
    frame: &mut Vec<u8>,
    local: &Local,
    dst: IpAddr,
    f: RoceFields,
    packet: &[u8],
) -> Result<(), BuildError> {
    if local.ip.is_ipv4() != dst.is_ipv4() {
        return Err(BuildError::FamilyMismatch);
    }
    if packet.len() < ICRC_LEN || packet.len() > usize::from(u16::MAX) - 60 {
        return Err(BuildError::BadLength);
    }
    let (ip, ip_len) = ip_header(local.ip, dst, 8 + packet.len(), f.ident, true, f.tos);
    let udp = udp_header(f.sport, ROCE_PORT, packet.len());
    let ethertype = if ip_len == 20 { ETHERTYPE_IPV4 } else { ETHERTYPE_IPV6 };
    frame.clear();
    frame.reserve(ETH_HEADER_LEN + ip_len + 8 + packet.len());
    ethernet([0; 6], local.mac, ethertype, frame);
    frame.extend_from_slice(&ip[..ip_len]);
    frame.extend_from_slice(&udp);
    frame.extend_from_slice(packet);
    let udp_at = ETH_HEADER_LEN + ip_len;
    let (headers, payload) = frame.split_at_mut(udp_at + 8);
    let ip_ref = if ip_len == 20 { IpHeader::V4(&headers[ETH_HEADER_LEN..udp_at]) } else { IpHeader::V6(&ip[..40]) };
    icrc::fill(ip_ref, &headers[udp_at..], payload).map_err(|_| BuildError::BadLength)?;
    if let (IpAddr::V6(s), IpAddr::V6(d)) = (local.ip, dst) {
        let sum = udp6_checksum(s, d, &frame[udp_at..]);
        frame[udp_at + 6..udp_at + 8].copy_from_slice(&sum.to_be_bytes());
    }
    pad_in_place(frame);
    Ok(())
}

/// Writes the destination MAC of a frame built with a zero one.
pub fn set_dst_mac(frame: &mut [u8], mac: [u8; 6]) {
    if frame.len() >= 6 {
        frame[..6].copy_from_slice(&mac);
    }
}

/// Completes the TCP or UDP checksum of a frame a sender on this host left partial for
/// offload (the field holds the pseudo-header sum; the rest is summed here, as the NIC
/// would). Frames of other kinds are left as they are.
pub fn complete_partial_checksum(frame: &mut [u8]) {
    let (l4_at, proto) = match frame.get(12..14) {
        Some([0x08, 0x00]) => match frame.get(14) {
            Some(v) => (ETH_HEADER_LEN + usize::from(v & 0x0f) * 4, frame.get(23).copied()),
            None => return,
        },
        Some([0x86, 0xdd]) => (ETH_HEADER_LEN + 40, frame.get(20).copied()),
        _ => return,
    };
    let ip_len = match frame[12] {
        0x08 => frame.get(16..18).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]]))),
        _ => frame.get(18..20).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])) + 40),
    };
    let end = ip_len.map_or(0, |l| (ETH_HEADER_LEN + l).min(frame.len()));
    let field = match proto {
        Some(6) => 16,
        Some(17) => 6,
        _ => return,
    };
    if end < l4_at + field + 2 {
        return;
    }
    let mut sum: u64 = 0;
    for c in frame[l4_at..end].chunks(2) {
        sum += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let mut csum = !(sum as u16);
    if csum == 0 && proto == Some(17) {
        csum = 0xffff;
    }
    frame[l4_at + field..l4_at + field + 2].copy_from_slice(&csum.to_be_bytes());
}

/// The UDP checksum over IPv6 (RFC 8200 §8.1) of `udp` (header with checksum 0, payload).
fn udp6_checksum(src: Ipv6Addr, dst: Ipv6Addr, udp: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        for c in bytes.chunks(2) {
            sum += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(udp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 17]);
    add(udp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        // RFC 768: a computed 0 goes out as all ones.
        0 => 0xffff,
        s => s,
    }
}

/// An ARP request (RFC 826) from `local` for `target`, broadcast.
pub fn arp_request(local: &Local, local_ip: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    arp(ArpOperation::REQUEST, local.mac, local_ip, ([0; 6], target), BROADCAST)
}

fn arp(op: ArpOperation, mac: [u8; 6], ip: Ipv4Addr, target: ([u8; 6], Ipv4Addr), to: [u8; 6]) -> Vec<u8> {
    let p = ArpEthIpv4Packet {
        operation: op,
        sender_mac: mac,
        sender_ipv4: ip.octets(),
        target_mac: target.0,
        target_ipv4: target.1.octets(),
    };
    let mut frame = Vec::with_capacity(MIN_FRAME_LEN);
    ethernet(to, mac, ETHERTYPE_ARP, &mut frame);
    frame.extend_from_slice(&p.to_bytes());
    pad(frame)
}

/// The solicited-node multicast address of `ip` (RFC 4291 §2.7.1) and its MAC (RFC 2464 §7).
fn solicited_node(ip: Ipv6Addr) -> (Ipv6Addr, [u8; 6]) {
    let o = ip.octets();
    let group = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | u16::from(o[13]), u16::from_be_bytes([o[14], o[15]]));
    let g = group.octets();
    (group, [0x33, 0x33, g[12], g[13], g[14], g[15]])
}

/// A Neighbour Solicitation (RFC 4861 §4.3) from `local` for `target`, to its
/// solicited-node group.
pub fn neighbour_solicitation(local: &Local, local_ip: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let (group, group_mac) = solicited_node(target);
    let mut body = target.octets().to_vec();
    body.extend_from_slice(&[ND_OPT_SOURCE_LL, 1]);
    body.extend_from_slice(&local.mac);
    icmpv6(local, group_mac, local_ip, group, Icmpv6Type::NeighborSolicitation, &body)
}

fn icmpv6(local: &Local, to_mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, ty: Icmpv6Type, body: &[u8]) -> Vec<u8> {
    // Neighbour Discovery must arrive with hop limit 255 (RFC 4861 §7.1).
    let b = PacketBuilder::ethernet2(local.mac, to_mac).ipv6(src.octets(), dst.octets(), 255).icmpv6(ty);
    let mut frame = Vec::with_capacity(b.size(body.len()));
    // Writing to a Vec fails only for a payload beyond IPv6's length field: ours are small.
    let _ = b.write(&mut frame, body);
    pad(frame)
}

/// What one received frame is to the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// A RoCEv2 packet for the device whose ICRC holds over its real headers.
    Roce {
        /// The sender's GID.
        src: Gid,
        /// The IP header was marked ECN Congestion Experienced.
        ce: bool,
        /// BTH...ICRC.
        packet: &'a [u8],
    },
    /// A RoCEv2 packet to multicast group `group` whose ICRC holds: the device's if it
    /// joined the group.
    RoceMulticast {
        /// The group (the IP destination).
        group: IpAddr,
        /// The sender's GID.
        src: Gid,
        /// The IP header was marked ECN Congestion Experienced.
        ce: bool,
        /// BTH...ICRC.
        packet: &'a [u8],
    },
    /// ARP or Neighbour Discovery: what it taught (an address and its MAC) and the frame
    /// to answer with (a reply to a request for the device's address).
    Neighbour {
        /// The neighbour learned.
        learned: Option<(IpAddr, [u8; 6])>,
        /// The reply to send.
        reply: Option<Vec<u8>>,
    },
    /// A Neighbour Advertisement: `ip` is at `mac`. It updates an entry the device has
    /// (asked for, or known) and creates none (RFC 4861 §7.2.5).
    Advertised {
        /// The advertised address.
        ip: IpAddr,
        /// Its link-layer address.
        mac: [u8; 6],
    },
    /// An ICMP or ICMPv6 echo request for the device: the reply to send.
    Echo(Vec<u8>),
    /// Dropped, and why.
    Dropped(DropReason),
}

/// Why a received frame went no further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// For another host or another protocol: not the device's business.
    NotOurs,
    /// An IP fragment for the device (RoCEv2 is never fragmented, IBTA A17.4.1).
    Fragment,
    /// Too short or malformed to be what its headers claim.
    Malformed,
    /// The ICRC did not hold.
    Icrc,
}

/// Classifies one received frame for the device `local`.
pub fn classify<'a>(local: &Local, frame: &'a [u8]) -> Inbound<'a> {
    let Ok(p) = SlicedPacket::from_ethernet(frame) else {
        return Inbound::Dropped(DropReason::Malformed);
    };
    let dst_mac = frame.get(..6).unwrap_or(&[]);
    let for_our_mac = dst_mac == local.mac;
    let src_mac: [u8; 6] = frame.get(6..12).and_then(|m| m.try_into().ok()).unwrap_or([0; 6]);
    match (&p.net, local.ip) {
        (Some(NetSlice::Arp(arp)), IpAddr::V4(ip)) => on_arp(local, ip, arp.slice()),
        (Some(NetSlice::Ipv4(v4)), IpAddr::V4(ip)) if for_our_mac || is_multicast_mac(dst_mac) => {
            let h = v4.header();
            let group = h.destination_addr().is_multicast();
            if h.destination_addr() != ip && !group {
                return Inbound::Dropped(DropReason::NotOurs);
            }
            if v4.payload().fragmented {
                return Inbound::Dropped(DropReason::Fragment);
            }
            if ipv4_checksum(h.slice()) != 0 {
                return Inbound::Dropped(DropReason::Malformed);
            }
            let header_len = usize::from(h.ihl()) * 4;
            let payload_at = offset_in(frame, v4.payload().payload);
            let Some(ip_bytes) = payload_at.checked_sub(header_len).map(|at| &frame[at..payload_at]) else {
                return Inbound::Dropped(DropReason::Malformed);
            };
            let ip = IpHeaderInfo {
                src: IpAddr::V4(h.source_addr()),
                dst: IpAddr::V4(h.destination_addr()),
                tos: ip_bytes[1],
                hop_limit: h.ttl(),
            };
            let to = ip.dst;
            let r = on_ip(local, ip, ip_bytes, &p, src_mac);
            if group {
                as_multicast(r, to)
            } else {
                r
            }
        }
        (Some(NetSlice::Ipv6(v6)), IpAddr::V6(ip)) => {
            let h = v6.header();
            if v6.payload().fragmented || v6.extensions().first_header().is_some() {
                // Extension headers (a fragment header among them) are not RoCEv2's.
                return if h.destination_addr() == ip {
                    Inbound::Dropped(DropReason::Fragment)
                } else {
                    Inbound::Dropped(DropReason::NotOurs)
                };
            }
            let unicast_to_us = for_our_mac && h.destination_addr() == ip;
            let neighbour_discovery =
                h.destination_addr().is_multicast() && matches!(p.transport, Some(TransportSlice::Icmpv6(_)));
            let group = h.destination_addr().is_multicast() && matches!(p.transport, Some(TransportSlice::Udp(_)));
            if !(unicast_to_us || neighbour_discovery || group) {
                return Inbound::Dropped(DropReason::NotOurs);
            }
            let ip = IpHeaderInfo {
                src: IpAddr::V6(h.source_addr()),
                dst: IpAddr::V6(h.destination_addr()),
                tos: h.traffic_class(),
                hop_limit: h.hop_limit(),
            };
            let to = ip.dst;
            let r = on_ip(local, ip, h.slice(), &p, src_mac);
            if group {
                as_multicast(r, to)
            } else {
                r
            }
        }
        _ => Inbound::Dropped(DropReason::NotOurs),
    }
}

/// A RoCEv2 packet to a group is the device's only as a member; nothing else sent to a
/// group (an echo request among them) is answered.
fn as_multicast(r: Inbound<'_>, group: IpAddr) -> Inbound<'_> {
    match r {
        Inbound::Roce { src, ce, packet } => Inbound::RoceMulticast { group, src, ce, packet },
        Inbound::Dropped(why) => Inbound::Dropped(why),
        _ => Inbound::Dropped(DropReason::NotOurs),
    }
}

/// An Ethernet multicast address (the group bit).
fn is_multicast_mac(mac: &[u8]) -> bool {
    mac.first().is_some_and(|b| b & 1 == 1)
}

/// The Ethernet address IP multicast group `group` maps to (RFC 1112 §6.4, RFC 2464 §7).
pub fn multicast_mac(group: IpAddr) -> [u8; 6] {
    match group {
        IpAddr::V4(g) => {
            let o = g.octets();
            [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
        }
        IpAddr::V6(g) => {
            let o = g.octets();
            [0x33, 0x33, o[12], o[13], o[14], o[15]]
        }
    }
}

/// Where `sub`, a slice of `whole`, starts in it.
fn offset_in(whole: &[u8], sub: &[u8]) -> usize {
    (sub.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize).min(whole.len())
}

fn on_arp<'a>(local: &Local, ip: Ipv4Addr, bytes: &[u8]) -> Inbound<'a> {
    let Ok(p) = etherparse::ArpPacket::from_slice(bytes).map_err(drop).and_then(|a| a.try_eth_ipv4().map_err(drop))
    else {
        return Inbound::Dropped(DropReason::Malformed);
    };
    if p.target_ipv4 != ip.octets() {
        return Inbound::Dropped(DropReason::NotOurs);
    }
    let sender = Ipv4Addr::from(p.sender_ipv4);
    // RFC 826: the sender is learned whenever the request is for us; a zero sender address
    // is a probe (RFC 5227) and teaches nothing.
    let learned = (!sender.is_unspecified()).then_some((IpAddr::V4(sender), p.sender_mac));
    let reply = (p.operation == ArpOperation::REQUEST)
        .then(|| arp(ArpOperation::REPLY, local.mac, ip, (p.sender_mac, sender), p.sender_mac));
    Inbound::Neighbour { learned, reply }
}

/// What the IP header says that the layers above need.
struct IpHeaderInfo {
    src: IpAddr,
    dst: IpAddr,
    /// The TOS byte or traffic class (ECN in its low bits).
    tos: u8,
    /// TTL or hop limit.
    hop_limit: u8,
}

fn on_ip<'a>(local: &Local, h: IpHeaderInfo, ip: &'a [u8], p: &SlicedPacket<'a>, src_mac: [u8; 6]) -> Inbound<'a> {
    let src = h.src;
    match &p.transport {
        Some(TransportSlice::Udp(udp)) if udp.destination_port() == ROCE_PORT => on_roce(src, ip, h.tos, udp),
        Some(TransportSlice::Icmpv4(icmp)) => match icmp.icmp_type() {
            Icmpv4Type::EchoRequest(echo) if icmp.icmp_type().calc_checksum(icmp.payload()) == icmp.checksum() => {
                let IpAddr::V4(s) = src else { return Inbound::Dropped(DropReason::NotOurs) };
                let ours = local_v4(local);
                let b = PacketBuilder::ethernet2(local.mac, src_mac).ipv4(ours.octets(), s.octets(), 64);
                let b = b.icmpv4_echo_reply(echo.id, echo.seq);
                let mut frame = Vec::with_capacity(b.size(icmp.payload().len()));
                let _ = b.write(&mut frame, icmp.payload());
                Inbound::Echo(pad(frame))
            }
            _ => Inbound::Dropped(DropReason::NotOurs),
        },
        Some(TransportSlice::Icmpv6(icmp)) => on_icmpv6(local, &h, icmp, src_mac),
        _ => Inbound::Dropped(DropReason::NotOurs),
    }
}

fn local_v4(local: &Local) -> Ipv4Addr {
    match local.ip {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    }
}

fn on_roce<'a>(src: IpAddr, ip: &'a [u8], tos: u8, udp: &etherparse::UdpSlice<'a>) -> Inbound<'a> {
    let udp_bytes = udp.slice();
    let Some(udp_header) = udp_bytes.get(..8) else { return Inbound::Dropped(DropReason::Malformed) };
    let packet = udp.payload();
    // The UDP checksum is not checked: the ICRC covers every byte it covers (the pseudo
    // header's addresses and length too) and more, and a frame from a sender on the same
    // host reaches a packet socket with its checksum still partial (offloaded).
    let ip_ref = if ip.len() >= 40 && src.is_ipv6() { IpHeader::V6(&ip[..40]) } else { IpHeader::V4(ip) };
    match icrc::verify(ip_ref, udp_header, packet) {
        Ok(()) => Inbound::Roce { src: ip_to_gid(src), ce: tos & 3 == 3, packet },
        Err(crate::proto::Error::BadChecksum { .. }) => Inbound::Dropped(DropReason::Icrc),
        Err(_) => Inbound::Dropped(DropReason::Malformed),
    }
}

fn on_icmpv6<'a>(local: &Local, h: &IpHeaderInfo, icmp: &etherparse::Icmpv6Slice<'a>, src_mac: [u8; 6]) -> Inbound<'a> {
    let src = h.src;
    let (IpAddr::V6(s), IpAddr::V6(ours)) = (src, local.ip) else { return Inbound::Dropped(DropReason::NotOurs) };
    let body = icmp.payload();
    let neighbour_discovery =
        matches!(icmp.icmp_type(), Icmpv6Type::NeighborSolicitation | Icmpv6Type::NeighborAdvertisement(_));
    let IpAddr::V6(dst) = h.dst else { return Inbound::Dropped(DropReason::NotOurs) };
    if neighbour_discovery && (h.hop_limit != 255 || !icmp.is_checksum_valid(s.octets(), dst.octets())) {
        // RFC 4861 §7.1.1, §7.1.2: ND from off the link (or corrupt) is silently dropped.
        return Inbound::Dropped(DropReason::Malformed);
    }
    match icmp.icmp_type() {
        Icmpv6Type::EchoRequest(echo) => {
            let ty = Icmpv6Type::EchoReply(echo);
            let reply = icmpv6(local, src_mac, ours, s, ty, body);
            // The echo builder recomputes the header: id and seq come from `ty`.
            Inbound::Echo(reply)
        }
        Icmpv6Type::NeighborSolicitation if body.get(..16) == Some(&ours.octets()[..]) => {
            let learned = nd_option(&body[16..], ND_OPT_SOURCE_LL).filter(|_| !s.is_unspecified()).map(|m| (src, m));
            let to_mac = learned.map_or(src_mac, |l| l.1);
            let to = if s.is_unspecified() { Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1) } else { s };
            let na = etherparse::icmpv6::NeighborAdvertisementHeader {
                router: false,
                solicited: !s.is_unspecified(),
                r#override: true,
            };
            let mut reply_body = ours.octets().to_vec();
            reply_body.extend_from_slice(&[ND_OPT_TARGET_LL, 1]);
            reply_body.extend_from_slice(&local.mac);
            let reply = icmpv6(local, to_mac, ours, to, Icmpv6Type::NeighborAdvertisement(na), &reply_body);
            Inbound::Neighbour { learned, reply: Some(reply) }
        }
        Icmpv6Type::NeighborAdvertisement(_) if body.len() >= 16 => {
            let target = Ipv6Addr::from(<[u8; 16]>::try_from(&body[..16]).unwrap_or([0; 16]));
            let mac = nd_option(&body[16..], ND_OPT_TARGET_LL).unwrap_or(src_mac);
            Inbound::Advertised { ip: IpAddr::V6(target), mac }
        }
        _ => Inbound::Dropped(DropReason::NotOurs),
    }
}

/// The link-layer address in NDP option `kind` among `options` (RFC 4861 §4.6).
fn nd_option(mut options: &[u8], kind: u8) -> Option<[u8; 6]> {
    while options.len() >= 8 {
        let len = usize::from(options[1]) * 8;
        if len == 0 || len > options.len() {
            return None;
        }
        if options[0] == kind && len >= 8 {
            return options[2..8].try_into().ok();
        }
        options = &options[len..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{Icmpv4Slice, Icmpv6Slice};

    const A: Local = Local { mac: [2, 0, 0, 0, 0, 0xa], ip: IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1)) };
    const B: Local = Local { mac: [2, 0, 0, 0, 0, 0xb], ip: IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2)) };

    /// A SEND Only to QP 0x11 (BTH, 5 bytes, room for the ICRC).
    fn send_only() -> Vec<u8> {
        let mut p = vec![0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 7];
        p.extend_from_slice(b"hello");
        p.extend_from_slice(&[0; 4]);
        p
    }

    fn fix_ipv4_checksum(frame: &mut [u8]) {
        frame[24..26].fill(0);
        let sum = ipv4_checksum(&frame[14..34]);
        frame[24..26].copy_from_slice(&sum.to_be_bytes());
    }

    fn frame_a_to_b(tos: u8) -> Vec<u8> {
        let f = RoceFields { sport: 0xc123, ident: 0x4242, tos };
        let mut frame = roce_frame(&A, B.ip, f, &send_only()).unwrap();
        set_dst_mac(&mut frame, B.mac);
        frame
    }

    #[test]
    fn a_roce_frame_carries_what_a_nic_sends_and_its_icrc_holds() {
        let frame = frame_a_to_b(0b10);
        let p = SlicedPacket::from_ethernet(&frame).unwrap();
        let Some(NetSlice::Ipv4(v4)) = &p.net else { panic!("IPv4") };
        let h = v4.header();
        assert!(h.dont_fragment() && !h.more_fragments());
        assert_eq!((h.identification(), h.ttl(), frame[15] & 3), (0x4242, 64, 0b10));
        let Some(TransportSlice::Udp(udp)) = &p.transport else { panic!("UDP") };
        assert_eq!((udp.source_port(), udp.destination_port(), udp.checksum()), (0xc123, 4791, 0));
        match classify(&B, &frame) {
            Inbound::Roce { src, ce, packet } => {
                assert_eq!((src, ce), (ip_to_gid(A.ip), false));
                assert_eq!(&packet[..17], &send_only()[..17]);
            }
            other => panic!("{other:?}"),
        }
        // The same frame seen by a host it is not for.
        assert_eq!(classify(&A, &frame), Inbound::Dropped(DropReason::NotOurs));
    }

    #[test]
    fn every_covered_bit_is_checked_and_ce_reaches_the_engine() {
        let mut frame = frame_a_to_b(0b11);
        assert!(matches!(classify(&B, &frame), Inbound::Roce { ce: true, .. }));
        // The Identification is covered by the ICRC (a UDP socket could only guess it).
        frame[18] ^= 1;
        fix_ipv4_checksum(&mut frame);
        assert_eq!(classify(&B, &frame), Inbound::Dropped(DropReason::Icrc));
        // A payload byte, with the UDP checksum that RoCEv2 over IPv4 leaves at 0 made up:
        // the ICRC is what decides.
        let mut frame = frame_a_to_b(0b10);
        frame[14 + 20 + 8 + 13] ^= 0x80;
        frame[14 + 20 + 6] = 0x12;
        assert_eq!(classify(&B, &frame), Inbound::Dropped(DropReason::Icrc));
        // The IPv4 header checksum.
        let mut frame = frame_a_to_b(0b10);
        frame[24] ^= 1;
        assert_eq!(classify(&B, &frame), Inbound::Dropped(DropReason::Malformed));
    }

    #[test]
    fn a_partial_checksum_is_completed_as_a_nic_would() {
        let (IpAddr::V4(a), IpAddr::V4(b)) = (A.ip, B.ip) else { unreachable!() };
        let tcp = PacketBuilder::ethernet2(A.mac, B.mac).ipv4(a.octets(), b.octets(), 64).tcp(1000, 2000, 7, 4096);
        let mut frame = Vec::new();
        tcp.write(&mut frame, b"iwarp bytes").unwrap();
        let good = frame.clone();
        // What the kernel hands a packet socket for offload: the pseudo-header sum only.
        let mut pseudo: u32 = 0;
        for c in [&a.octets()[..], &b.octets()[..], &[0, 6], &((frame.len() - 34) as u16).to_be_bytes()] {
            for w in c.chunks(2) {
                pseudo += u32::from(u16::from_be_bytes([w[0], w[1]]));
            }
        }
        while pseudo > 0xffff {
            pseudo = (pseudo & 0xffff) + (pseudo >> 16);
        }
        frame[50..52].copy_from_slice(&(pseudo as u16).to_be_bytes());
        assert_ne!(frame, good);
        complete_partial_checksum(&mut frame);
        assert_eq!(frame, good);
    }

    #[test]
    fn fragments_are_dropped() {
        let mut frame = frame_a_to_b(0b10);
        frame[20] = 0x20; // MF, DF cleared
        fix_ipv4_checksum(&mut frame);
        assert_eq!(classify(&B, &frame), Inbound::Dropped(DropReason::Fragment));
    }

    #[test]
    fn arp_requests_for_our_address_are_answered_and_teach_the_sender() {
        let (IpAddr::V4(a), IpAddr::V4(b)) = (A.ip, B.ip) else { unreachable!() };
        let request = arp_request(&A, a, b);
        assert_eq!(request.len(), MIN_FRAME_LEN);
        let Inbound::Neighbour { learned, reply: Some(reply) } = classify(&B, &request) else { panic!("a reply") };
        assert_eq!(learned, Some((A.ip, A.mac)));
        assert_eq!(&reply[..6], &A.mac, "unicast back to the asker");
        // The reply teaches A about B, and asks for nothing.
        assert_eq!(classify(&A, &reply), Inbound::Neighbour { learned: Some((B.ip, B.mac)), reply: None });
        // A request for another address is not ours.
        let other = arp_request(&A, a, Ipv4Addr::new(10, 9, 0, 3));
        assert_eq!(classify(&B, &other), Inbound::Dropped(DropReason::NotOurs));
    }

    #[test]
    fn echo_requests_get_echo_replies() {
        let (IpAddr::V4(a), IpAddr::V4(b)) = (A.ip, B.ip) else { unreachable!() };
        let req = PacketBuilder::ethernet2(A.mac, B.mac).ipv4(a.octets(), b.octets(), 64).icmpv4_echo_request(7, 9);
        let mut frame = Vec::new();
        req.write(&mut frame, b"ping").unwrap();
        let Inbound::Echo(reply) = classify(&B, &frame) else { panic!("an echo reply") };
        let p = SlicedPacket::from_ethernet(&reply).unwrap();
        let Some(TransportSlice::Icmpv4(icmp)) = p.transport else { panic!("ICMP") };
        let icmp: Icmpv4Slice = icmp;
        assert!(matches!(icmp.icmp_type(), Icmpv4Type::EchoReply(e) if e.id == 7 && e.seq == 9));
        assert_eq!(icmp.icmp_type().calc_checksum(icmp.payload()), icmp.checksum());
        assert_eq!(&reply[..6], &A.mac);
    }

    #[test]
    fn neighbour_discovery_resolves_ipv6_peers() {
        let (a6, b6): (Ipv6Addr, Ipv6Addr) = ("fd00::a".parse().unwrap(), "fd00::b".parse().unwrap());
        let a = Local { mac: A.mac, ip: IpAddr::V6(a6) };
        let b = Local { mac: B.mac, ip: IpAddr::V6(b6) };
        let ns = neighbour_solicitation(&a, a6, b6);
        assert_eq!(&ns[..2], &[0x33, 0x33]);
        let Inbound::Neighbour { learned, reply: Some(na) } = classify(&b, &ns) else { panic!("an advertisement") };
        assert_eq!(learned, Some((a.ip, a.mac)));
        let p = SlicedPacket::from_ethernet(&na).unwrap();
        let Some(TransportSlice::Icmpv6(icmp)) = p.transport else { panic!("ICMPv6") };
        let icmp: Icmpv6Slice = icmp;
        assert!(icmp.is_checksum_valid(b6.octets(), a6.octets()));
        assert_eq!(classify(&a, &na), Inbound::Advertised { ip: b.ip, mac: b.mac });
        // ND from off the link (hop limit below 255) is dropped (RFC 4861 §7.1.1).
        let mut far = ns.clone();
        far[14 + 7] = 64;
        assert_eq!(classify(&b, &far), Inbound::Dropped(DropReason::Malformed));
    }

    #[test]
    fn ipv6_roce_frames_carry_a_udp_checksum_that_holds() {
        let (a6, b6): (Ipv6Addr, Ipv6Addr) = ("fd00::a".parse().unwrap(), "fd00::b".parse().unwrap());
        let a = Local { mac: A.mac, ip: IpAddr::V6(a6) };
        let b = Local { mac: B.mac, ip: IpAddr::V6(b6) };
        let mut frame = roce_frame(&a, b.ip, RoceFields { sport: 0xc001, ident: 0, tos: 3 }, &send_only()).unwrap();
        set_dst_mac(&mut frame, b.mac);
        assert_ne!(u16::from_be_bytes([frame[60], frame[61]]), 0);
        assert!(matches!(classify(&b, &frame), Inbound::Roce { ce: true, .. }));
        assert_eq!(
            roce_frame(&a, A.ip, RoceFields { sport: 1, ident: 0, tos: 0 }, &send_only()),
            Err(BuildError::FamilyMismatch)
        );
    }

    #[test]
    fn groups_map_to_their_ethernet_addresses() {
        let mac = |g: &str| multicast_mac(g.parse().unwrap());
        assert_eq!(mac("224.0.0.251"), [0x01, 0x00, 0x5e, 0x00, 0x00, 0xfb]);
        assert_eq!(mac("239.255.255.250"), [0x01, 0x00, 0x5e, 0x7f, 0xff, 0xfa], "23 bits of the group");
        assert_eq!(mac("ff02::1"), [0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(mac("ff0e::9:2"), [0x33, 0x33, 0, 9, 0, 2]);
    }
}
