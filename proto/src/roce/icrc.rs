//! The RoCEv2 Invariant CRC (IBTA Annex A17.3.3).
//!
//! The ICRC is a CRC-32 over a pseudo packet: 8 bytes of ones standing in for the LRH, then
//! the real IP header with its variant fields set to ones (IPv4: TOS, TTL, header checksum;
//! IPv6: traffic class, flow label, hop limit), the UDP header with its checksum set to
//! ones, the BTH with its reserved byte 4 (FECN/BECN) set to ones, and the rest of the
//! packet up to the ICRC. It is carried little-endian in the last 4 bytes.
//!
//! The IPv4 Identification is covered: rxe puts a running counter there, so the caller
//! passes the IP header exactly as it was (or will be) on the wire.

use super::{bth, ICRC_LEN};
use crate::{Error, Result};
use core::fmt;

/// The IP header that carried (or will carry) the packet, as on the wire.
#[derive(Debug, Clone, Copy)]
pub enum IpHeader<'a> {
    /// An IPv4 header including options (IHL × 4 bytes).
    V4(&'a [u8]),
    /// The fixed 40-byte IPv6 header.
    V6(&'a [u8]),
}

/// Result of checking one packet's ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcCheck {
    /// The ICRC carried by the packet.
    pub carried: u32,
    /// The ICRC computed over it.
    pub computed: u32,
}

impl IcrcCheck {
    /// True when they agree.
    pub fn is_ok(&self) -> bool {
        self.carried == self.computed
    }
}

impl fmt::Display for IcrcCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ok() {
            f.write_str("ok")
        } else {
            write!(f, "BAD(carried 0x{:08x}, computed 0x{:08x})", self.carried, self.computed)
        }
    }
}

const UDP_HEADER_LEN: usize = 8;

/// Bytes after the BTH that join the headers in one run through the CRC: all of a small
/// packet (an ACK, a READ request, a short WRITE or SEND), whose CRC is then one call.
const SMALL_TAIL: usize = 64;

/// Copies `ip` into `scratch` (room for the longest IPv4 header, 60 bytes) with the
/// variant fields masked; returns the header's length.
fn masked_ip(ip: IpHeader<'_>, scratch: &mut [u8; 60]) -> Result<usize> {
    match ip {
        IpHeader::V4(h) => {
            Error::check_len(20, h.len())?;
            let ihl = usize::from(h[0] & 0x0f) * 4;
            if h[0] >> 4 != 4 || ihl < 20 {
                return Err(Error::BadValue("not an IPv4 header"));
            }
            Error::check_len(ihl, h.len())?;
            let m = &mut scratch[..ihl];
            m.copy_from_slice(&h[..ihl]);
            m[1] = 0xff; // TOS (DSCP + ECN)
            m[8] = 0xff; // TTL
            m[10] = 0xff; // header checksum
            m[11] = 0xff;
            Ok(ihl)
        }
        IpHeader::V6(h) => {
            Error::check_len(40, h.len())?;
            if h[0] >> 4 != 6 {
                return Err(Error::BadValue("not an IPv6 header"));
            }
            let m = &mut scratch[..40];
            m.copy_from_slice(&h[..40]);
            m[0] |= 0x0f; // traffic class, high nibble
            m[1] = 0xff; // traffic class low nibble + flow label
            m[2] = 0xff;
            m[3] = 0xff;
            m[7] = 0xff; // hop limit
            Ok(40)
        }
    }
}

/// Computes the ICRC of `packet` (BTH through ICRC; the last 4 bytes are not covered).
pub fn compute(ip: IpHeader<'_>, udp_header: &[u8], packet: &[u8]) -> Result<u32> {
    Error::check_len(UDP_HEADER_LEN, udp_header.len())?;
    Error::check_len(bth::LEN + ICRC_LEN, packet.len())?;
    // The masked headers (and a small packet's rest) go to the CRC as one run: on small
    // packets (ACKs, READ requests) per-call overhead is most of the CRC's cost.
    let mut ip_masked = [0u8; 60];
    let ip_len = masked_ip(ip, &mut ip_masked)?;
    let mut run = [0xffu8; 8 + 60 + UDP_HEADER_LEN + bth::LEN + SMALL_TAIL];
    run[8..8 + ip_len].copy_from_slice(&ip_masked[..ip_len]);
    let udp_at = 8 + ip_len;
    run[udp_at..udp_at + 6].copy_from_slice(&udp_header[..6]);
    // The UDP checksum (bytes 6 and 7) stays masked.
    let bth_at = udp_at + UDP_HEADER_LEN;
    run[bth_at..bth_at + bth::LEN].copy_from_slice(&packet[..bth::LEN]);
    run[bth_at + bth::RESV8A_OFFSET] = 0xff;
    let end = bth_at + bth::LEN;
    let rest = &packet[bth::LEN..packet.len() - ICRC_LEN];

    let mut h = crate::crc::Crc32::for_len(end + rest.len());
    if rest.len() <= SMALL_TAIL {
        run[end..end + rest.len()].copy_from_slice(rest);
        h.update(&run[..end + rest.len()]);
    } else {
        h.update(&run[..end]);
        h.update(rest);
    }
    Ok(h.finalize())
}

/// The ICRC a packet carries in its last 4 bytes.
pub fn carried(packet: &[u8]) -> Result<u32> {
    Error::check_len(ICRC_LEN, packet.len())?;
    let t = &packet[packet.len() - ICRC_LEN..];
    Ok(u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
}

/// Computes and compares, returning both values.
pub fn check(ip: IpHeader<'_>, udp_header: &[u8], packet: &[u8]) -> Result<IcrcCheck> {
    Ok(IcrcCheck { carried: carried(packet)?, computed: compute(ip, udp_header, packet)? })
}

/// Verifies the ICRC. Under `cfg(fuzzing)` every ICRC passes, so that a fuzzer reaches
/// the parsers behind it.
pub fn verify(ip: IpHeader<'_>, udp_header: &[u8], packet: &[u8]) -> Result<()> {
    let c = check(ip, udp_header, packet)?;
    if c.is_ok() || cfg!(fuzzing) {
        Ok(())
    } else {
        Err(Error::BadChecksum { carried: c.carried, computed: c.computed })
    }
}

/// Computes the ICRC and writes it into the last 4 bytes of `packet`.
pub fn fill(ip: IpHeader<'_>, udp_header: &[u8], packet: &mut [u8]) -> Result<()> {
    let crc = compute(ip, udp_header, packet)?;
    let n = packet.len();
    packet[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// What an IPv4 receiver without the IP header learns from a packet's ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveredIpv4 {
    /// The sender's IPv4 Identification.
    pub ident: u16,
    /// The sender's Don't Fragment flag.
    pub dont_fragment: bool,
}

/// The CRC-32 polynomial, bit-reflected as crc32fast uses it.
const POLY_REFLECTED: u32 = 0xedb8_8320;

/// a·b mod P over GF(2), bit 31 being x^0 (the reflected form).
fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut m = 1u32 << 31;
    while m != 0 {
        if a & m != 0 {
            product ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY_REFLECTED } else { b >> 1 };
    }
    product
}

/// x^(8·n) mod P: the effect on a CRC register of `n` more zero bytes.
fn x_pow_8n(n: usize) -> u32 {
    let mut result = 1u32 << 31; // x^0
    let mut square = 1u32 << 23; // x^8
    let mut e = n;
    while e != 0 {
        if e & 1 != 0 {
            result = mul_mod(result, square);
        }
        square = mul_mod(square, square);
        e >>= 1;
    }
    result
}

/// The change in the final ICRC when byte `at` of an ICRC message of `len` bytes has the
/// bits `bits` flipped (CRC-32 without its constants is linear over GF(2)).
fn syndrome_of(at: usize, bits: u8, len: usize) -> u32 {
    let one = crc32fast::hash(&[bits]) ^ crc32fast::hash(&[0]);
    mul_mod(x_pow_8n(len - at - 1), one)
}

/// Finds the IPv4 Identification and DF flag the sender had, for a receiver that sees the
/// UDP payload but not the IP header (a kernel UDP socket).
///
/// `ip` is the header as the receiver reconstructs it (version, IHL 5, total length,
/// protocol, addresses) with a guess of the Identification and DF flag (the fragment
/// offset and the other flags zero). The ICRC covers those 17 bits (Annex A17.3.3) and
/// nothing else of the header is unknown, so the difference between the carried ICRC and
/// the one computed with the guess must be a combination of 17 known syndromes: solving
/// for it recovers the fields (a right guess costs one CRC and nothing more). A corrupted
/// packet passes only if its error happens to fall in that 17-dimensional subspace of the
/// 32-bit ICRC: the check keeps 15 of its 32 bits against random corruption. `None`: no Identification/DF explains the
/// ICRC (a corrupted packet, or a sender with IP options).
pub fn recover_ipv4(ip: &[u8], udp_header: &[u8], packet: &[u8]) -> Result<Option<RecoveredIpv4>> {
    recover_ipv4_cached(&mut RecoveryCache::default(), ip, udp_header, packet)
}

/// The reduced syndrome basis of one ICRC message length: (vector, which unknowns).
#[derive(Debug, Clone, Copy)]
struct Basis {
    rows: [(u32, u32); 17],
    rank: usize,
}

/// The ICRC message length the one basis is reduced for: longer than any packet's, so that
/// every length maps onto it. A syndrome of a message `len` bytes long, times
/// x^(8·(BASIS_LEN - len)), is the same flip's syndrome in a message of BASIS_LEN bytes
/// (the flip lies that many more bytes from the end), so one basis serves every length.
const BASIS_LEN: usize = 1 << 17;

/// The basis, and the shift of the last few packet lengths seen, so that a receiver
/// solves each packet with a multiplication and a few XORs: lengths repeat (full-MTU
/// packets, ACKs), and a length not seen costs one exponentiation, not a new basis
/// (datagrams of every size: rsockets, UD).
#[derive(Debug, Clone, Default)]
pub struct RecoveryCache {
    basis: Option<Basis>,
    shifts: [Option<(usize, u32)>; 4],
    next: usize,
}

impl RecoveryCache {
    fn basis(&mut self) -> Basis {
        *self.basis.get_or_insert_with(|| basis_for(BASIS_LEN))
    }

    /// x^(8·(BASIS_LEN - len)) mod P.
    fn shift(&mut self, len: usize) -> u32 {
        if let Some((_, s)) = self.shifts.iter().flatten().find(|(l, _)| *l == len) {
            return *s;
        }
        let s = x_pow_8n(BASIS_LEN - len);
        self.shifts[self.next] = Some((len, s));
        self.next = (self.next + 1) % self.shifts.len();
        s
    }
}

/// The 17 syndromes of an ICRC message of `len` bytes, reduced to a basis.
fn basis_for(len: usize) -> Basis {
    // Unknowns: 16 Identification bits (IP bytes 4-5), then DF (byte 6, 0x40); the ICRC
    // message starts with 8 bytes standing for the LRH.
    let mut rows = [(0u32, 0u32); 17];
    let mut rank = 0;
    for unknown in 0..17u32 {
        let (at, bits) = match unknown {
            0..=15 => (8 + 5 - (unknown as usize / 8), 1u8 << (unknown % 8)),
            _ => (8 + 6, 0x40),
        };
        let mut v = syndrome_of(at, bits, len);
        let mut which = 1u32 << unknown;
        for &(bv, bw) in &rows[..rank] {
            if v & top_bit(bv) != 0 {
                v ^= bv;
                which ^= bw;
            }
        }
        if v != 0 {
            rows[rank] = (v, which);
            rank += 1;
        }
    }
    Basis { rows, rank }
}

/// As [`recover_ipv4`], reusing the basis and recent packet lengths' shifts from `cache`.
pub fn recover_ipv4_cached(
    cache: &mut RecoveryCache,
    ip: &[u8],
    udp_header: &[u8],
    packet: &[u8],
) -> Result<Option<RecoveredIpv4>> {
    let computed = compute(IpHeader::V4(ip), udp_header, packet)?;
    let carried = carried(packet)?;
    Error::check_len(20, ip.len())?;
    let guess = RecoveredIpv4 { ident: u16::from_be_bytes([ip[4], ip[5]]), dont_fragment: ip[6] & 0x40 != 0 };
    // A right guess (the caller's: for softrdma's own packets, DF with a GSO send's
    // segments numbered from 0) costs this one CRC and no solving.
    if carried == computed {
        return Ok(Some(guess));
    }
    let len = 8 + 20 + UDP_HEADER_LEN + packet.len() - ICRC_LEN;
    if len > BASIS_LEN {
        return Ok(None);
    }
    let basis = cache.basis();
    // The difference solves for the bits in which the sender's fields differ from the guess.
    let (mut rest, mut solution) = (mul_mod(cache.shift(len), carried ^ computed), 0u32);
    for &(bv, bw) in &basis.rows[..basis.rank] {
        if rest & top_bit(bv) != 0 {
            rest ^= bv;
            solution ^= bw;
        }
    }
    Ok((rest == 0).then_some(RecoveredIpv4 {
        ident: guess.ident ^ solution as u16,
        dont_fragment: guess.dont_fragment ^ (solution & (1 << 16) != 0),
    }))
}

fn top_bit(v: u32) -> u32 {
    1u32 << (31 - v.leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    // rxe-head.pcap frame 5: an RC ACKNOWLEDGE from 10.77.0.2 to 10.77.0.3, as captured.
    // The IPv4 Identification (0x0091) is rxe's running counter.
    const IP: [u8; 20] = [
        0x45, 0x00, 0x00, 0x30, 0x00, 0x91, 0x40, 0x00, 0x40, 0x11, 0x25, 0x8e, 0x0a, 0x4d, 0x00, 0x02, 0x0a, 0x4d,
        0x00, 0x03,
    ];
    const UDP: [u8; 8] = [0xe8, 0xea, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00];
    const ACK: [u8; 20] = [
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x31, 0xa9, 0xf1, 0x1f, 0x00, 0x00, 0x01, 0x11, 0xf7,
        0x89, 0xa1,
    ];

    #[test]
    fn known_answer_from_rxe() {
        let c = check(IpHeader::V4(&IP), &UDP, &ACK).unwrap();
        assert_eq!(c, IcrcCheck { carried: 0xa189_f711, computed: 0xa189_f711 });
        let mut refilled = ACK;
        refilled[16..].fill(0);
        fill(IpHeader::V4(&IP), &UDP, &mut refilled).unwrap();
        assert_eq!(refilled, ACK);
    }

    /// Small packets run through the CRC with their headers in one call, longer ones in
    /// two: either way the ICRC is the CRC-32 of the masked headers and the rest, written
    /// out here byte by byte (Annex A17.3.3), for every length around the switch.
    #[test]
    fn one_run_or_two_the_icrc_is_the_same() {
        for rest_len in 0..=SMALL_TAIL + 70 {
            let mut packet = [0u8; bth::LEN + SMALL_TAIL + 70 + ICRC_LEN];
            let packet = &mut packet[..bth::LEN + rest_len + ICRC_LEN];
            for (i, b) in packet.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(29).wrapping_add(rest_len as u8);
            }
            let mut whole = [0u8; 8 + 20 + UDP_HEADER_LEN + bth::LEN + SMALL_TAIL + 70];
            whole[..8].fill(0xff);
            whole[8..28].copy_from_slice(&IP);
            for at in [8 + 1, 8 + 8, 8 + 10, 8 + 11] {
                whole[at] = 0xff; // TOS, TTL, header checksum
            }
            whole[28..36].copy_from_slice(&UDP);
            whole[34..36].fill(0xff); // UDP checksum
            whole[36..36 + bth::LEN].copy_from_slice(&packet[..bth::LEN]);
            whole[36 + 4] = 0xff; // BTH resv8a
            whole[48..48 + rest_len].copy_from_slice(&packet[bth::LEN..bth::LEN + rest_len]);
            let expected = crate::crc::crc32(&whole[..48 + rest_len]);
            assert_eq!(compute(IpHeader::V4(&IP), &UDP, packet).unwrap(), expected, "{rest_len} bytes after the BTH");
        }
    }

    #[test]
    fn ipv6_masks_traffic_class_flow_label_and_hop_limit_only() {
        let mut ip6 = [0u8; 40];
        ip6[0] = 0x60;
        ip6[4..6].copy_from_slice(&28u16.to_be_bytes());
        ip6[6] = 17;
        ip6[7] = 64;
        ip6[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        ip6[24..40].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        let base = compute(IpHeader::V6(&ip6), &UDP, &ACK).unwrap();
        let mut varied = ip6;
        varied[0] = 0x6f; // traffic class
        varied[1] = 0xab; // traffic class + flow label
        varied[3] = 0x12; // flow label
        varied[7] = 1; // hop limit
        assert_eq!(compute(IpHeader::V6(&varied), &UDP, &ACK).unwrap(), base);
        let mut other_dst = ip6;
        other_dst[39] = 3;
        assert_ne!(compute(IpHeader::V6(&other_dst), &UDP, &ACK).unwrap(), base);
        let mut other_len = ip6;
        other_len[5] = 29;
        assert_ne!(compute(IpHeader::V6(&other_len), &UDP, &ACK).unwrap(), base);
    }

    #[test]
    fn masking_ignores_variant_fields_only() {
        let udp = [0xc0, 0x00, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00];
        let pkt = [0x11, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0x31, 0xa9, 0xf1, 0x1f, 0, 0, 1, 0, 0, 0, 0];
        let base = compute(IpHeader::V4(&IP), &udp, &pkt).unwrap();
        let mut ip2 = IP;
        ip2[1] = 0x02; // ECN CE
        ip2[8] = 0x3f; // TTL decremented by a router
        ip2[10] = 0x12;
        let mut udp2 = udp;
        udp2[7] = 0x99;
        let mut pkt2 = pkt;
        pkt2[4] = 0x80; // FECN
        assert_eq!(compute(IpHeader::V4(&ip2), &udp2, &pkt2).unwrap(), base);
        let mut ip3 = IP;
        ip3[5] ^= 1; // Identification is covered
        assert_ne!(compute(IpHeader::V4(&ip3), &udp, &pkt).unwrap(), base);
    }

    #[test]
    fn fill_then_verify() {
        let udp = [0xc0, 0x00, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00];
        let mut pkt = [0u8; 20];
        pkt[0] = 0x11;
        fill(IpHeader::V4(&IP), &udp, &mut pkt).unwrap();
        assert!(verify(IpHeader::V4(&IP), &udp, &pkt).is_ok());
        pkt[13] ^= 0x10;
        assert!(matches!(verify(IpHeader::V4(&IP), &udp, &pkt), Err(Error::BadChecksum { .. })));
    }

    /// One cache across packets of every length (datagrams of any size), longer ones
    /// than its few shifts hold, each solved right; a flipped bit is caught.
    #[test]
    fn one_cache_recovers_packets_of_every_length() {
        let mut blank = IP;
        blank[4..8].fill(0);
        let mut cache = RecoveryCache::default();
        let mut buf = [0u8; 65_100];
        for (i, payload) in (0..2100).step_by(7).chain([4096, 9000, 65_000]).enumerate() {
            let (ident, df) = ((i as u16).wrapping_mul(40_503), i % 3 == 0);
            let mut ip = blank;
            ip[2..4].copy_from_slice(&((20 + 8 + 16 + payload) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&ident.to_be_bytes());
            ip[6] = if df { 0x40 } else { 0 };
            let pkt = &mut buf[..12 + payload + 4];
            pkt.fill(0);
            pkt[0] = 0x64;
            pkt.iter_mut().skip(12).take(payload).enumerate().for_each(|(j, b)| *b = (j * 31 + i) as u8);
            let mut udp = UDP;
            udp[4..6].copy_from_slice(&((8 + pkt.len()) as u16).to_be_bytes());
            fill(IpHeader::V4(&ip), &udp, pkt).unwrap();
            let mut seen = ip;
            seen[4..8].fill(0);
            let got = recover_ipv4_cached(&mut cache, &seen, &udp, pkt).unwrap();
            assert_eq!(got, Some(RecoveredIpv4 { ident, dont_fragment: df }), "payload {payload}");
            pkt[5] ^= 0x01;
            assert_eq!(recover_ipv4_cached(&mut cache, &seen, &udp, pkt).unwrap(), None, "payload {payload}");
        }
    }

    #[test]
    fn recovers_identification_and_df_from_the_icrc() {
        // rxe-head.pcap frame 5 again: Identification 0x0091, DF set.
        let mut blank = IP;
        blank[4..8].fill(0);
        let r = recover_ipv4(&blank, &UDP, &ACK).unwrap();
        assert_eq!(r, Some(RecoveredIpv4 { ident: 0x0091, dont_fragment: true }));
        for (ident, df) in [(0u16, false), (0xffff, true), (0x1234, false), (0x8000, true)] {
            let mut ip = IP;
            ip[4..6].copy_from_slice(&ident.to_be_bytes());
            ip[6] = if df { 0x40 } else { 0 };
            let mut pkt = [0u8; 64];
            pkt[0] = 0x0a;
            pkt[20] = ident as u8;
            fill(IpHeader::V4(&ip), &UDP, &mut pkt).unwrap();
            let got = recover_ipv4(&blank, &UDP, &pkt).unwrap();
            assert_eq!(got, Some(RecoveredIpv4 { ident, dont_fragment: df }));
            pkt[30] ^= 0x04;
            assert_eq!(recover_ipv4(&blank, &UDP, &pkt).unwrap(), None);
        }
    }

    /// The receiver's guess of the fields (right: one CRC; wrong: solved from it) changes
    /// nothing in the answer, and a flipped bit is caught with a right guess as with a wrong one.
    #[test]
    fn every_guess_of_the_fields_recovers_the_same() {
        let guesses = [(0u16, true), (0, false), (1, true), (0x0091, true), (0x0091, false), (0xffff, true)];
        for (ident, df) in [(0u16, true), (1, true), (0x0091, true), (0x0091, false), (0, false)] {
            let mut ip = IP;
            ip[4..6].copy_from_slice(&ident.to_be_bytes());
            ip[6] = if df { 0x40 } else { 0 };
            let mut pkt = [0u8; 40];
            pkt[0] = 0x0a;
            fill(IpHeader::V4(&ip), &UDP, &mut pkt).unwrap();
            let mut cache = RecoveryCache::default();
            for (g_ident, g_df) in guesses {
                let mut guess = ip;
                guess[4..6].copy_from_slice(&g_ident.to_be_bytes());
                guess[6] = if g_df { 0x40 } else { 0 };
                let got = recover_ipv4_cached(&mut cache, &guess, &UDP, &pkt).unwrap();
                assert_eq!(got, Some(RecoveredIpv4 { ident, dont_fragment: df }), "guess {g_ident:#x} {g_df}");
                let mut bad = pkt;
                bad[13] ^= 0x10;
                assert_eq!(recover_ipv4_cached(&mut cache, &guess, &UDP, &bad).unwrap(), None);
            }
        }
    }

    #[test]
    fn bad_ip_headers_are_errors() {
        let udp = [0u8; 8];
        let pkt = [0u8; 16];
        assert!(compute(IpHeader::V4(&IP[..19]), &udp, &pkt).is_err());
        assert!(compute(IpHeader::V6(&IP), &udp, &pkt).is_err());
        let mut v4_as_v6 = [0u8; 40];
        v4_as_v6[0] = 0x45;
        assert!(compute(IpHeader::V6(&v4_as_v6), &udp, &pkt).is_err());
        assert!(compute(IpHeader::V4(&IP), &udp, &pkt[..15]).is_err());
    }
}
