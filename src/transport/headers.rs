//! The IP and UDP headers a RoCEv2 datagram travels in, as the kernel builds them (and as
//! the simulator frames its packets): pure functions, no sockets.

use crate::engine::verbs::Gid;
use std::net::{IpAddr, Ipv6Addr};

/// The IP address a GID stands for (IPv4-mapped GIDs are IPv4).
pub fn gid_to_ip(g: &Gid) -> IpAddr {
    let v6 = Ipv6Addr::from(*g);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The GID of an IP address.
pub fn ip_to_gid(a: IpAddr) -> Gid {
    match a {
        IpAddr::V4(v4) => crate::engine::verbs::gid_from_ipv4(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IPv4 or IPv6 header the kernel builds for a datagram of `udp_len` bytes, as far as
/// the ICRC covers it: IPv4 Identification 0 with DF (unconnected socket, DF set).
pub fn ip_header(src: IpAddr, dst: IpAddr, udp_len: usize, ident: u16, df: bool, tos: u8) -> ([u8; 40], usize) {
    let (mut h, len) = ip_header_for_icrc(src, dst, udp_len, ident, df, tos);
    if len == 20 {
        let sum = ipv4_checksum(&h[..20]);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
    }
    (h, len)
}

/// As [`ip_header`] without the IPv4 header checksum, which the ICRC masks (IBTA A17.3.3):
/// what a sender needs per packet unless it also logs the frame.
pub fn ip_header_for_icrc(
    src: IpAddr,
    dst: IpAddr,
    udp_len: usize,
    ident: u16,
    df: bool,
    tos: u8,
) -> ([u8; 40], usize) {
    let mut h = [0u8; 40];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            h[0] = 0x45;
            h[1] = tos;
            h[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            h[4..6].copy_from_slice(&ident.to_be_bytes());
            h[6] = if df { 0x40 } else { 0 };
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            (h, 20)
        }
        _ => {
            let as6 = |a: IpAddr| match a {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            h[0] = 0x60 | (tos >> 4);
            h[1] = tos << 4;
            h[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            h[6] = 17;
            h[7] = 64;
            h[8..24].copy_from_slice(&as6(src).octets());
            h[24..40].copy_from_slice(&as6(dst).octets());
            (h, 40)
        }
    }
}

/// The RFC 791 checksum of IPv4 header `h` (its checksum field taken as it is: 0 when
/// building; a header that carries a good checksum gives 0).
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A UDP header for `payload_len` bytes, checksum 0 (the ICRC masks it).
pub fn udp_header(sport: u16, dport: u16, payload_len: usize) -> [u8; 8] {
    let mut u = [0u8; 8];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    u
}
