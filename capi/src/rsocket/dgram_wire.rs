//! Datagram rsockets on the wire, as librdmacm's `rsocket.c` (rdma-core 44) puts them, so
//! that a `SOCK_DGRAM` rsocket here talks to librdmacm's: every message over UD starts
//! with a [`DsHeader`] naming the sender's socket address (what `rrecvfrom` reports), and
//! until a sender knows its peer's QP it sends over UDP to the peer's socket with a
//! [`UdpHeader`] naming its own QP; the peer answers such a message with a header alone
//! ([`UDP_OP_CTRL`]), which tells the sender the QP to use from then on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Bytes of one message slot, header included (`RS_SNDLOWAT`): a receive's buffer.
pub const SLOT_BYTES: usize = 2048;
/// The GRH a UD receive starts with.
pub const GRH_BYTES: usize = 40;
/// `DS_UDP_TAG`: the first word of a datagram rsocket's UDP message.
pub const UDP_TAG: u32 = 0x5555_5555;
/// `RS_OP_DATA`: a UDP message carrying data after its header.
pub const UDP_OP_DATA: u8 = 0;
/// `RS_OP_CTRL`: a UDP header alone, the answer to data, naming the answerer's QP.
pub const UDP_OP_CTRL: u8 = 7;

/// The header of a message over UD: the sender's socket address (`struct ds_header`: a
/// version, its own length, the port, then an IPv4 address, or an IPv6 flow label and
/// address; port and addresses in network order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsHeader {
    pub addr: SocketAddr,
}

/// `DS_IPV4_HDR_LEN`, `DS_IPV6_HDR_LEN`.
const DS_V4_BYTES: usize = 8;
const DS_V6_BYTES: usize = 24;

impl DsHeader {
    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        if self.addr.is_ipv4() {
            DS_V4_BYTES
        } else {
            DS_V6_BYTES
        }
    }

    /// The header's bytes.
    pub fn emit(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.wire_len());
        b.push(if self.addr.is_ipv4() { 4 } else { 6 });
        b.push(self.wire_len() as u8);
        b.extend_from_slice(&self.addr.port().to_be_bytes());
        match self.addr {
            SocketAddr::V4(a) => b.extend_from_slice(&a.ip().octets()),
            SocketAddr::V6(a) => {
                b.extend_from_slice(&a.flowinfo().to_be_bytes());
                b.extend_from_slice(&a.ip().octets());
            }
        }
        b
    }

    /// The header at the start of `b` and its length, if it is one (librdmacm's
    /// `ds_valid_recv`: version 4 with length 8, or 6 with 24, and the bytes there).
    pub fn parse(b: &[u8]) -> Option<DsHeader> {
        let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
        let addr = match (b.first()?, b.get(1)?) {
            (4, 8) => SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(<[u8; 4]>::try_from(b.get(4..8)?).ok()?), port)),
            (6, 24) => {
                let flow = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
                let ip = Ipv6Addr::from(<[u8; 16]>::try_from(b.get(8..24)?).ok()?);
                SocketAddr::V6(SocketAddrV6::new(ip, port, flow, 0))
            }
            _ => return None,
        };
        Some(DsHeader { addr })
    }
}

/// The header of a datagram rsocket's UDP message (`struct ds_udp_header`): the tag, the
/// version of the address that follows, the operation, its own length, the sender's QPN
/// (24 bits) and the address its QP is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpHeader {
    pub op: u8,
    pub qpn: u32,
    pub qp_addr: IpAddr,
}

/// `DS_UDP_IPV4_HDR_LEN`, `DS_UDP_IPV6_HDR_LEN`.
const UDP_V4_BYTES: usize = 16;
const UDP_V6_BYTES: usize = 28;
/// The longest [`UdpHeader`].
pub const UDP_HEADER_MAX: usize = UDP_V6_BYTES;

impl UdpHeader {
    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        if self.qp_addr.is_ipv4() {
            UDP_V4_BYTES
        } else {
            UDP_V6_BYTES
        }
    }

    /// The header's bytes.
    pub fn emit(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.wire_len());
        b.extend_from_slice(&UDP_TAG.to_be_bytes());
        b.push(if self.qp_addr.is_ipv4() { 4 } else { 6 });
        b.push(self.op);
        b.push(self.wire_len() as u8);
        b.push(0);
        b.extend_from_slice(&(self.qpn & 0xFF_FFFF).to_be_bytes());
        match self.qp_addr {
            IpAddr::V4(a) => b.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => b.extend_from_slice(&a.octets()),
        }
        b
    }

    /// The header of a UDP message from a sender of family `from_v4` (IPv4 or not), as
    /// librdmacm's `udp_svc_valid_udp_hdr` accepts it, and the payload after it.
    pub fn parse(b: &[u8], from_v4: bool) -> Option<(UdpHeader, &[u8])> {
        if u32::from_be_bytes(b.get(0..4)?.try_into().ok()?) != UDP_TAG {
            return None;
        }
        let (version, op, len) = (*b.get(4)?, *b.get(5)?, usize::from(*b.get(6)?));
        let qpn = u32::from_be_bytes(b.get(8..12)?.try_into().ok()?) & 0xFF_FFFF;
        let qp_addr = match (version, len, from_v4) {
            (4, UDP_V4_BYTES, true) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b.get(12..16)?).ok()?)),
            (6, UDP_V6_BYTES, false) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b.get(12..28)?).ok()?)),
            _ => return None,
        };
        Some((UdpHeader { op, qpn, qp_addr }, &b[len..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_header_has_librdmacms_layout() {
        let h = DsHeader { addr: "10.1.2.3:7174".parse().unwrap() };
        assert_eq!(h.emit(), [4, 8, 0x1c, 0x06, 10, 1, 2, 3]);
        let u = UdpHeader { op: UDP_OP_CTRL, qpn: 0x12_3456, qp_addr: "10.1.2.3".parse().unwrap() };
        assert_eq!(u.emit(), [0x55, 0x55, 0x55, 0x55, 4, 7, 16, 0, 0, 0x12, 0x34, 0x56, 10, 1, 2, 3]);
        // A header of the other family than the UDP sender's is refused, as librdmacm does.
        assert!(UdpHeader::parse(&u.emit(), false).is_none());
        assert!(DsHeader::parse(&[4, 24, 0, 0, 1, 2, 3, 4]).is_none());
    }

    proptest! {
        #[test]
        fn headers_read_back(v6 in any::<bool>(), ip in any::<[u8; 16]>(), port in any::<u16>(), flow in any::<u32>(),
                             qpn in any::<u32>(), op in any::<u8>(), tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let addr = if v6 {
                SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, 0))
            } else {
                SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]), port))
            };
            let h = DsHeader { addr };
            let mut b = h.emit();
            prop_assert_eq!(b.len(), h.wire_len());
            b.extend_from_slice(&tail);
            prop_assert_eq!(DsHeader::parse(&b), Some(h));
            let u = UdpHeader { op, qpn: qpn & 0xFF_FFFF, qp_addr: addr.ip() };
            let mut b = u.emit();
            b.extend_from_slice(&tail);
            prop_assert_eq!(UdpHeader::parse(&b, !v6), Some((u, &tail[..])));
        }

        /// Whatever a peer sends, parsing answers without a panic.
        #[test]
        fn any_bytes_parse_or_not(b in proptest::collection::vec(any::<u8>(), 0..64), v4 in any::<bool>()) {
            let _ = DsHeader::parse(&b);
            if let Some((h, rest)) = UdpHeader::parse(&b, v4) {
                prop_assert_eq!(rest.len() + h.wire_len(), b.len());
            }
        }
    }
}
