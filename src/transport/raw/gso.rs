//! UDP GSO sends through a packet socket, both ways. Received: a GSO send split back into
//! the datagrams it stands for ([`split_udp_gso`]). A sender on this host
//! (a UDP socket with `UDP_SEGMENT` behind a veth, as softrdma's UDP transport is) hands
//! the peer end one frame holding a whole run of datagrams; a packet socket with a
//! virtio-net header ([`super::super::sys::set_packet_vnet_hdr`]) learns the segment size
//! from it, and [`split_udp_gso`] makes the frames the wire would have carried, as the
//! kernel's own segmentation would (`__udp_gso_segment`): each with its own IP and UDP
//! lengths, the IPv4 Identification counting up from the first's, and the UDP checksum
//! left partial (the pseudo-header sum, as the sender left it) for whoever completes it.
//!
//! Sent: a run of frames that differ only where the kernel's segmentation would make
//! them differ (the same Ethernet, IP and UDP headers, the IPv4 Identification counting up,
//! the same length but for a shorter last one) leaves as one GSO frame after a virtio-net
//! header ([`merge_udp_run`]); the kernel cuts it into those same frames (with their UDP
//! checksums computed, which the ICRC masks), or hands it whole to a veth peer.

use super::frame::ETH_HEADER_LEN;
use crate::transport::headers::ipv4_checksum;

/// The most datagrams one GSO send holds (`UDP_MAX_SEGMENTS`, include/linux/udp.h): a
/// frame that would split into more is not split.
pub const GSO_SEGMENTS_MAX: usize = 128;

/// virtio-net header `gso_type` of a UDP GSO send (`VIRTIO_NET_HDR_GSO_UDP_L4`).
pub const VNET_GSO_UDP_L4: u8 = 5;
/// Length of the virtio-net header (`struct virtio_net_hdr`) before each frame.
pub const VNET_HDR_LEN: usize = 10;
/// virtio-net header flag: the checksum at `csum_start + csum_offset` is left for the
/// device (`VIRTIO_NET_HDR_F_NEEDS_CSUM`).
const VNET_F_NEEDS_CSUM: u8 = 1;
/// The most frames merged into one GSO send.
pub const MERGE_FRAMES_MAX: usize = 64;
/// The most bytes of IP packet a merged send may hold (its length field's range).
const IP_PACKET_MAX: usize = 65535;

/// True on kernels whose packet sockets carry UDP GSO sends in their virtio-net header
/// (`VIRTIO_NET_HDR_GSO_UDP_L4`, Linux 6.2): softrdma's own can then split one it reads,
/// and hand the kernel one it merged.
pub fn packet_sockets_carry_udp_gso() -> bool {
    crate::transport::sys::kernel_version().is_some_and(|v| v >= (6, 2))
}

/// What a virtio-net header says of the frame after it: its segment size when it is a
/// UDP GSO send, else `None`. Fields are in the host's byte order (legacy virtio on a
/// packet socket).
pub fn udp_gso_segment_bytes(vnet: &[u8]) -> Option<usize> {
    let hdr: &[u8; VNET_HDR_LEN] = vnet.get(..VNET_HDR_LEN)?.try_into().ok()?;
    // Bit 7 of gso_type is the ECN flag, which only TCP sends carry.
    let size = usize::from(u16::from_ne_bytes([hdr[4], hdr[5]]));
    (hdr[1] & 0x7f == VNET_GSO_UDP_L4 && size > 0).then_some(size)
}

/// The frames one receive split into, end to end in one reused buffer: its size is that of
/// the largest batch split (the frames' bytes plus a set of headers per datagram), so a
/// sender cannot make it grow beyond what one batch of frames holds.
#[derive(Debug, Default)]
pub struct Segments {
    bytes: Vec<u8>,
    /// Where each frame ends in `bytes`.
    ends: Vec<usize>,
}

impl Segments {
    /// Forgets the frames (keeps the buffer).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Frame `i` since the last [`Segments::clear`].
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// Where the IP and UDP headers of an Ethernet frame are, and how long its UDP payload is.
struct UdpFrame {
    ipv4: bool,
    /// Offset of the UDP header.
    udp_at: usize,
    /// Bytes of UDP payload (within the IP packet's own length).
    payload: usize,
}

fn udp_frame(frame: &[u8]) -> Option<UdpFrame> {
    let be16 = |at: usize| frame.get(at..at + 2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    let (ipv4, udp_at, ip_end) = match frame.get(12..14)? {
        [0x08, 0x00] => {
            let ihl = usize::from(frame.get(ETH_HEADER_LEN)? & 0x0f) * 4;
            (ihl >= 20 && *frame.get(23)? == 17).then_some(())?;
            (true, ETH_HEADER_LEN + ihl, ETH_HEADER_LEN + be16(16)?)
        }
        // IPv6 with the UDP header straight after its own (no extension headers).
        [0x86, 0xdd] => {
            (*frame.get(20)? == 17).then_some(())?;
            (false, ETH_HEADER_LEN + 40, ETH_HEADER_LEN + 40 + be16(18)?)
        }
        _ => return None,
    };
    let end = ip_end.min(frame.len());
    let payload = end.checked_sub(udp_at + 8)?;
    Some(UdpFrame { ipv4, udp_at, payload })
}

/// The one's-complement sum of the UDP pseudo-header (RFC 768, RFC 8200 §8.1) for a
/// datagram of `udp_len` bytes, folded: what a sender leaves in the checksum field for
/// the NIC to finish.
fn pseudo_header_sum(frame: &[u8], ipv4: bool, udp_len: usize) -> u16 {
    let addrs = if ipv4 { &frame[26..34] } else { &frame[22..54] };
    let mut sum: u64 = addrs.chunks(2).map(|c| u64::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    sum += 17 + udp_len as u64;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Sets the lengths of `frame` (headers as [`udp_frame`] found them) for `udp_len` bytes of
/// UDP (header and payload), its IPv4 Identification to `ident` (IPv4 only) with the
/// header checksum to match, and its UDP checksum to the pseudo-header sum: a partial
/// checksum, as a sender leaves one for the NIC.
fn set_headers(frame: &mut [u8], f: &UdpFrame, udp_len: usize, ident: u16) {
    if f.ipv4 {
        let ip_len = (f.udp_at - ETH_HEADER_LEN + udp_len) as u16;
        frame[16..18].copy_from_slice(&ip_len.to_be_bytes());
        frame[18..20].copy_from_slice(&ident.to_be_bytes());
        frame[24..26].fill(0);
        let sum = ipv4_checksum(&frame[ETH_HEADER_LEN..f.udp_at]);
        frame[24..26].copy_from_slice(&sum.to_be_bytes());
    } else {
        frame[18..20].copy_from_slice(&(udp_len as u16).to_be_bytes());
    }
    frame[f.udp_at + 4..f.udp_at + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    let partial = pseudo_header_sum(frame, f.ipv4, udp_len);
    frame[f.udp_at + 6..f.udp_at + 8].copy_from_slice(&partial.to_be_bytes());
}

/// Splits `frame`, an Ethernet frame holding one UDP GSO send of `segment_bytes`-byte
/// datagrams (the last may be shorter), into one frame per datagram, appended to `out`.
/// Returns how many; 0 (and nothing appended) when it is not a UDP frame over IPv4 or
/// IPv6, holds one datagram only, or would make more than [`GSO_SEGMENTS_MAX`].
pub fn split_udp_gso(frame: &[u8], segment_bytes: usize, out: &mut Segments) -> usize {
    let Some(f) = udp_frame(frame) else { return 0 };
    if segment_bytes == 0 || f.payload <= segment_bytes || f.payload.div_ceil(segment_bytes) > GSO_SEGMENTS_MAX {
        return 0;
    }
    let headers = &frame[..f.udp_at + 8];
    let ident = u16::from_be_bytes([frame[18], frame[19]]);
    let payload = &frame[f.udp_at + 8..f.udp_at + 8 + f.payload];
    let chunks = payload.chunks(segment_bytes);
    let n = chunks.len();
    for (k, chunk) in chunks.enumerate() {
        let at = out.bytes.len();
        out.bytes.extend_from_slice(headers);
        out.bytes.extend_from_slice(chunk);
        out.ends.push(out.bytes.len());
        set_headers(&mut out.bytes[at..], &f, 8 + chunk.len(), ident.wrapping_add(k as u16));
    }
    n
}

/// True if `f` can follow `first` as the `k`-th datagram of one GSO send: the same
/// headers but for the lengths, checksums and (IPv4) an Identification `k` above
/// `first`'s.
fn follows(first: &[u8], f: &[u8], uf: &UdpFrame, k: usize) -> bool {
    let same = |r: std::ops::Range<usize>| first.get(r.clone()) == f.get(r);
    let ports = uf.udp_at..uf.udp_at + 4;
    if uf.ipv4 {
        let ident = |x: &[u8]| u16::from_be_bytes([x[18], x[19]]);
        same(0..16)
            && same(20..24)
            && same(26..uf.udp_at)
            && same(ports)
            && ident(f) == ident(first).wrapping_add(k as u16)
    } else {
        same(0..18) && same(20..54) && same(ports)
    }
}

/// How many of `frames` (from the first) can leave as one GSO send: the first, and each
/// next one that [`follows`] it with the first's length (the last may be shorter), within
/// [`MERGE_FRAMES_MAX`] and an IP packet's length. 1 when the first is not UDP over IP.
pub fn udp_run_len(frames: &[&[u8]]) -> usize {
    let Some(&first) = frames.first() else { return 0 };
    let Some(uf) = udp_frame(first) else { return 1 };
    // Only whole frames (no Ethernet padding after the IP packet) merge.
    if uf.udp_at + 8 + uf.payload != first.len() || uf.payload == 0 {
        return 1;
    }
    let mut bytes = uf.udp_at - ETH_HEADER_LEN + 8 + uf.payload;
    let mut n = 1;
    while n < frames.len().min(MERGE_FRAMES_MAX) {
        let f = frames[n];
        let Some(u) = udp_frame(f) else { break };
        let fits = u.udp_at == uf.udp_at && u.udp_at + 8 + u.payload == f.len() && u.payload > 0;
        if !fits || u.payload > uf.payload || bytes + u.payload > IP_PACKET_MAX || !follows(first, f, &uf, n) {
            break;
        }
        bytes += u.payload;
        n += 1;
        if u.payload < uf.payload {
            break;
        }
    }
    n
}

/// The virtio-net header that asks the kernel to cut the frame after it into datagrams
/// of `segment_bytes` of UDP payload, completing each one's UDP checksum (at `udp_at`).
fn gso_vnet_header(udp_at: usize, segment_bytes: usize) -> [u8; VNET_HDR_LEN] {
    let mut h = [0u8; VNET_HDR_LEN];
    h[0] = VNET_F_NEEDS_CSUM;
    h[1] = VNET_GSO_UDP_L4;
    for (i, field) in [udp_at + 8, segment_bytes, udp_at, 6].into_iter().enumerate() {
        h[2 + 2 * i..4 + 2 * i].copy_from_slice(&(field as u16).to_ne_bytes());
    }
    h
}

/// Writes into `out` the one frame that carries `run` (frames [`udp_run_len`] accepted, at
/// least two) as a GSO send, and returns the virtio-net header to send it after: the
/// first's headers with the whole length, the UDP checksum left to the kernel, and every
/// frame's UDP payload.
pub fn merge_udp_run(run: &[&[u8]], out: &mut Vec<u8>) -> [u8; VNET_HDR_LEN] {
    let first = run[0];
    let uf = udp_frame(first).expect("a run udp_run_len accepted");
    let payload: usize = run.iter().map(|f| f.len() - uf.udp_at - 8).sum();
    out.clear();
    out.extend_from_slice(&first[..uf.udp_at + 8]);
    for f in run {
        out.extend_from_slice(&f[uf.udp_at + 8..]);
    }
    // The first's Identification stays: the kernel counts up from it.
    let ident = u16::from_be_bytes([first[18], first[19]]);
    set_headers(out, &uf, 8 + payload, ident);
    gso_vnet_header(uf.udp_at, uf.payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::raw::frame::complete_partial_checksum;
    use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};

    /// A frame as a veth peer hands over a GSO send: one UDP header and IP header over the
    /// whole payload, the checksum left partial over the whole length.
    fn super_frame(ipv4: bool, payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let b = if ipv4 { b.ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64) } else { b.ipv6([0xfd; 16], [0xfe; 16], 64) };
        let mut f = Vec::new();
        b.udp(0xc000, 4791).write(&mut f, payload).unwrap();
        if ipv4 {
            f[18..20].copy_from_slice(&0xfff0u16.to_be_bytes());
            f[24..26].fill(0);
            let sum = ipv4_checksum(&f[14..34]);
            f[24..26].copy_from_slice(&sum.to_be_bytes());
        }
        let at = if ipv4 { 34 } else { 54 };
        let partial = pseudo_header_sum(&f, ipv4, 8 + payload.len());
        f[at + 6..at + 8].copy_from_slice(&partial.to_be_bytes());
        f
    }

    #[test]
    fn a_gso_send_splits_into_the_datagrams_the_wire_would_carry() {
        let payload: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        for ipv4 in [true, false] {
            let mut out = Segments::default();
            assert_eq!(split_udp_gso(&super_frame(ipv4, &payload), 1000, &mut out), 3);
            for (k, want) in payload.chunks(1000).enumerate() {
                let mut f = out.get(k).unwrap().to_vec();
                complete_partial_checksum(&mut f);
                let p = SlicedPacket::from_ethernet(&f).expect("a well-formed frame");
                let Some(TransportSlice::Udp(udp)) = p.transport else { panic!("UDP") };
                assert_eq!(udp.payload(), want, "segment {k}");
                assert_eq!(usize::from(udp.length()), 8 + want.len());
                match p.net {
                    Some(etherparse::NetSlice::Ipv4(ip)) => {
                        assert_eq!(ip.header().identification(), 0xfff0u16.wrapping_add(k as u16));
                        assert_eq!(ipv4_checksum(ip.header().slice()), 0, "the IPv4 header checksum holds");
                        let sum = udp.to_header().calc_checksum_ipv4(&ip.header().to_header(), want).unwrap();
                        assert_eq!(udp.checksum(), sum, "completed, the UDP checksum holds");
                    }
                    Some(etherparse::NetSlice::Ipv6(ip)) => {
                        let sum = udp.to_header().calc_checksum_ipv6(&ip.header().to_header(), want).unwrap();
                        assert_eq!(udp.checksum(), sum, "completed, the UDP checksum holds");
                    }
                    _ => panic!("IP"),
                }
            }
        }
    }

    #[test]
    fn frames_that_are_not_a_gso_send_of_udp_stay_whole() {
        let mut out = Segments::default();
        let one = super_frame(true, &[7; 1000]);
        assert_eq!(split_udp_gso(&one, 1000, &mut out), 0, "one datagram only");
        assert_eq!(split_udp_gso(&one, 0, &mut out), 0, "no segment size");
        assert_eq!(split_udp_gso(&super_frame(true, &[7; 1290]), 10, &mut out), 0, "129 segments");
        let mut tcp = one.clone();
        tcp[23] = 6;
        assert_eq!(split_udp_gso(&tcp, 100, &mut out), 0, "not UDP");
        // Cut short of two 4-byte datagrams (42 bytes of headers): nothing to split.
        for cut in 0..=46 {
            assert_eq!(split_udp_gso(&one[..cut], 4, &mut out), 0, "cut at {cut}");
        }
        assert!(out.is_empty());
        // A header claiming more than arrived splits only what arrived.
        let short = super_frame(true, &[7; 3000]);
        assert_eq!(split_udp_gso(&short[..short.len() - 1500], 1000, &mut out), 2);
    }

    #[test]
    fn the_split_frames_take_one_batch_worth_of_memory_however_often_they_come() {
        let mut out = Segments::default();
        let largest = super_frame(true, &[7; 128 * 500]);
        assert_eq!(split_udp_gso(&largest, 500, &mut out), GSO_SEGMENTS_MAX, "at the limit");
        let held = out.bytes.len();
        assert_eq!(held, GSO_SEGMENTS_MAX * (42 + 500), "each datagram with its own headers");
        let cap = out.bytes.capacity();
        for size in [500, 1000, 64, 8000] {
            out.clear();
            split_udp_gso(&largest, size, &mut out);
            assert!(out.bytes.len() <= held && out.bytes.capacity() == cap, "no growth at {size}");
        }
    }

    /// Frames as the raw device sends them: one QP's packets to one peer, Identifications
    /// counting up from 0xfffe (so they wrap), the last `last` bytes long.
    fn frames_of_a_qp(ipv4: bool, n: usize, size: usize, last: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|k| {
                let len = if k + 1 == n { last } else { size };
                let body: Vec<u8> = (0..len).map(|i| (i + k) as u8).collect();
                let mut f = super_frame(ipv4, &body);
                if ipv4 {
                    f[18..20].copy_from_slice(&0xfffeu16.wrapping_add(k as u16).to_be_bytes());
                    f[24..26].fill(0);
                    let sum = ipv4_checksum(&f[14..34]);
                    f[24..26].copy_from_slice(&sum.to_be_bytes());
                }
                f
            })
            .collect()
    }

    #[test]
    fn a_run_of_a_qps_frames_merges_into_a_send_that_splits_back_into_them() {
        for ipv4 in [true, false] {
            let frames = frames_of_a_qp(ipv4, 5, 1000, 300);
            let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
            assert_eq!(udp_run_len(&refs), 5);
            let mut frame = Vec::new();
            let vnet = merge_udp_run(&refs, &mut frame);
            assert_eq!(udp_gso_segment_bytes(&vnet), Some(1000));
            assert_eq!(u16::from_ne_bytes([vnet[6], vnet[7]]), if ipv4 { 34 } else { 54 }, "csum_start");
            let mut out = Segments::default();
            assert_eq!(split_udp_gso(&frame, 1000, &mut out), 5);
            for (k, want) in frames.iter().enumerate() {
                let got = out.get(k).unwrap();
                let at = if ipv4 { 34 } else { 54 };
                // All but the UDP checksum, which the sender left to the kernel.
                assert_eq!(got[..at + 6], want[..at + 6], "headers of frame {k}");
                assert_eq!(got[at + 8..], want[at + 8..], "payload of frame {k}");
            }
        }
    }

    #[test]
    fn frames_that_the_kernel_would_not_cut_alike_do_not_merge() {
        let frames = frames_of_a_qp(true, 4, 1000, 1000);
        let run = |fs: &[Vec<u8>]| udp_run_len(&fs.iter().map(|f| &f[..]).collect::<Vec<_>>());
        assert_eq!(run(&frames), 4);
        assert_eq!(run(&frames[..0]), 0);
        let mut longer = frames.clone();
        longer[2] = frames_of_a_qp(true, 3, 1000, 1004).pop().unwrap();
        assert_eq!(run(&longer), 2, "a longer frame ends the run before it");
        let mut shorter = frames.clone();
        shorter[1] = frames_of_a_qp(true, 2, 1000, 996).pop().unwrap();
        assert_eq!(run(&shorter), 2, "a shorter frame ends the run after it");
        for (at, what) in
            [(5, "destination MAC"), (15, "TOS"), (19, "Identification"), (22, "TTL"), (29, "source"), (35, "port")]
        {
            let mut other = frames.clone();
            other[3][at] ^= 1;
            assert_eq!(run(&other), 3, "{what}");
        }
        let mut arp = frames.clone();
        arp[0][12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(run(&arp), 1, "not IP");
        let many = frames_of_a_qp(true, 70, 100, 100);
        assert_eq!(run(&many), MERGE_FRAMES_MAX);
        let big = frames_of_a_qp(true, 70, 1400, 1400);
        assert_eq!(run(&big), (IP_PACKET_MAX - 28) / 1400, "within an IP packet's length");
    }

    #[test]
    fn the_virtio_net_header_says_which_frames_are_udp_gso_sends() {
        let mut hdr = [0u8; VNET_HDR_LEN];
        assert_eq!(udp_gso_segment_bytes(&hdr), None, "no GSO");
        hdr[1] = VNET_GSO_UDP_L4;
        hdr[4..6].copy_from_slice(&1052u16.to_ne_bytes());
        assert_eq!(udp_gso_segment_bytes(&hdr), Some(1052));
        hdr[1] = 1; // TCPv4
        assert_eq!(udp_gso_segment_bytes(&hdr), None);
        assert_eq!(udp_gso_segment_bytes(&hdr[..9]), None, "too short");
    }
}
