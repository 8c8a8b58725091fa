//! Link, IP and transport layers of a captured frame (with `etherparse`, in its lax mode so
//! that frames cut short by the snaplen still show their headers).

use super::reader::Frame;
use etherparse::{IpNumber, LaxNetSlice, LaxSlicedPacket, TcpHeaderSlice, UdpHeaderSlice};
use pcap_parser::Linktype;
use std::net::IpAddr;

/// The IP header a datagram came in, as captured (copied: at most 60 bytes).
#[derive(Debug, Clone)]
pub enum IpHeaderBytes {
    /// IPv4, options included.
    V4(Vec<u8>),
    /// IPv6 fixed header.
    V6(Vec<u8>),
}

/// A UDP datagram.
#[derive(Debug, Clone)]
pub struct UdpDatagram<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dst_port: u16,
    /// The IP header.
    pub ip_header: IpHeaderBytes,
    /// IPv4 ECN bits or IPv6 ECN bits.
    pub ecn: u8,
    /// The 8-byte UDP header.
    pub udp_header: &'a [u8],
    /// The payload as captured.
    pub payload: &'a [u8],
    /// True when the capture cut the datagram short.
    pub truncated: bool,
}

/// A TCP segment.
#[derive(Debug, Clone)]
pub struct TcpSegment<'a> {
    /// Source address and port.
    pub src: (IpAddr, u16),
    /// Destination address and port.
    pub dst: (IpAddr, u16),
    /// Sequence number.
    pub seq: u32,
    /// SYN flag.
    pub syn: bool,
    /// FIN flag.
    pub fin: bool,
    /// RST flag.
    pub rst: bool,
    /// Payload as captured.
    pub payload: &'a [u8],
    /// True when the capture cut the segment short.
    pub truncated: bool,
}

/// What a frame turned out to be.
#[derive(Debug, Clone)]
pub enum Dissected<'a> {
    /// UDP over IPv4/IPv6.
    Udp(UdpDatagram<'a>),
    /// TCP over IPv4/IPv6.
    Tcp(TcpSegment<'a>),
    /// Something else (ARP, ICMP, fragments, ...).
    Other,
    /// A link type this tool does not decode.
    Unsupported(i32),
}

fn link_slice(f: &Frame) -> Option<Result<LaxSlicedPacket<'_>, ()>> {
    match f.link {
        Linktype::ETHERNET => Some(LaxSlicedPacket::from_ethernet(&f.data).map_err(|_| ())),
        Linktype::RAW | Linktype::IPV4 | Linktype::IPV6 => Some(LaxSlicedPacket::from_ip(&f.data).map_err(|_| ())),
        _ => None,
    }
}

/// Dissects one frame down to its UDP or TCP payload.
pub fn dissect(f: &Frame) -> Dissected<'_> {
    let Some(sliced) = link_slice(f) else {
        return Dissected::Unsupported(f.link.0);
    };
    let Ok(sliced) = sliced else {
        return Dissected::Other;
    };
    let (src, dst, ip_header, ecn, payload) = match sliced.net {
        Some(LaxNetSlice::Ipv4(v4)) => {
            let h = v4.header();
            let ecn = h.ecn().value();
            let hdr = IpHeaderBytes::V4(h.slice().to_vec());
            (IpAddr::from(h.source_addr()), IpAddr::from(h.destination_addr()), hdr, ecn, v4.payload().clone())
        }
        Some(LaxNetSlice::Ipv6(v6)) => {
            let h = v6.header();
            let ecn = h.ecn().value();
            let hdr = IpHeaderBytes::V6(h.slice().to_vec());
            (IpAddr::from(h.source_addr()), IpAddr::from(h.destination_addr()), hdr, ecn, v6.payload().clone())
        }
        _ => return Dissected::Other,
    };
    if payload.fragmented {
        return Dissected::Other;
    }
    let truncated = payload.incomplete || f.truncated();
    let bytes = payload.payload;
    match payload.ip_number {
        IpNumber::UDP => match UdpHeaderSlice::from_slice(bytes) {
            Ok(u) => Dissected::Udp(UdpDatagram {
                src,
                dst,
                dst_port: u.destination_port(),
                ip_header,
                ecn,
                udp_header: u.slice(),
                payload: &bytes[8..],
                truncated,
            }),
            Err(_) => Dissected::Other,
        },
        IpNumber::TCP => match TcpHeaderSlice::from_slice(bytes) {
            Ok(t) => Dissected::Tcp(TcpSegment {
                src: (src, t.source_port()),
                dst: (dst, t.destination_port()),
                seq: t.sequence_number(),
                syn: t.syn(),
                fin: t.fin(),
                rst: t.rst(),
                payload: &bytes[t.slice().len()..],
                truncated,
            }),
            Err(_) => Dissected::Other,
        },
        _ => Dissected::Other,
    }
}
