//! `--pcap` for iWARP cases: the bytes of one TCP connection, both ways, written as the
//! Ethernet/IP/TCP frames a capture on the link would show (a handshake first, then one
//! segment per write or read, sequence numbers counted per direction), so that
//! `softrdma pcap check` and Wireshark follow the MPA stream. Checksums are left zero: the
//! bytes were never on a wire in this form.

use crate::transport::pcap::FrameLog;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const PSH_ACK: u8 = 0x18;
const FIN_ACK: u8 = 0x11;
/// Payload bytes per synthesized segment (a capture shows no larger ones on a 1500 link).
const SEGMENT_BYTES: usize = 1400;

/// One connection's capture.
pub struct TcpLog {
    log: Arc<FrameLog>,
    ends: [SocketAddr; 2],
    /// The next sequence number each way: this side's, the target's.
    seq: [u32; 2],
}

impl TcpLog {
    /// Starts a connection's record from `local` to `remote` with its handshake.
    pub fn new(log: Arc<FrameLog>, local: SocketAddr, remote: SocketAddr) -> TcpLog {
        let mut t = TcpLog { log, ends: [local, remote], seq: [1000, 5000] };
        t.segment(0, SYN, &[]);
        t.segment(1, SYN | ACK, &[]);
        t.seq = [1001, 5001];
        t.segment(0, ACK, &[]);
        t
    }

    /// Bytes this side wrote.
    pub fn sent(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(SEGMENT_BYTES) {
            self.segment(0, PSH_ACK, chunk);
        }
    }

    /// Bytes the target wrote.
    pub fn received(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(SEGMENT_BYTES) {
            self.segment(1, PSH_ACK, chunk);
        }
    }

    /// A FIN from this side (0) or the target (1).
    pub fn fin(&mut self, from: usize) {
        self.segment(from, FIN_ACK, &[]);
    }

    fn segment(&mut self, from: usize, flags: u8, payload: &[u8]) {
        let (src, dst) = (self.ends[from], self.ends[1 - from]);
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&src.port().to_be_bytes());
        tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
        tcp[4..8].copy_from_slice(&self.seq[from].to_be_bytes());
        tcp[8..12].copy_from_slice(&self.seq[1 - from].to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = flags;
        tcp[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
        let len = 20 + payload.len();
        let ip = ip_header(src.ip(), dst.ip(), len);
        let mut frame = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        frame.extend_from_slice(if src.is_ipv4() { &[0x08, 0x00] } else { &[0x86, 0xdd] });
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&tcp);
        frame.extend_from_slice(payload);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        self.log.record_frame(&frame, now);
        let used = payload.len() as u32 + u32::from(flags & (SYN | 0x01) != 0);
        self.seq[from] = self.seq[from].wrapping_add(used);
    }
}

fn ip_header(src: IpAddr, dst: IpAddr, tcp_len: usize) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
            h[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let sum = crate::transport::headers::ipv4_checksum(&h);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            h
        }
        _ => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(x) => x.octets(),
                IpAddr::V4(x) => x.to_ipv6_mapped().octets(),
            };
            let mut h = vec![0x60, 0, 0, 0];
            h.extend_from_slice(&(tcp_len as u16).to_be_bytes());
            h.extend_from_slice(&[6, 64]);
            h.extend_from_slice(&v6(src));
            h.extend_from_slice(&v6(dst));
            h
        }
    }
}
