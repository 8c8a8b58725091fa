//! TCP reassembly per direction and MPA following: the MPA Request/Reply frames, the
//! negotiated CRC and markers (RFC 5044 §7.1.1: a frame's M bit asks its receiver to send
//! markers; a C bit in either frame turns CRC on both ways), then FPDUs.

use super::frame::TcpSegment;
use super::report::{Check, Record};
use crate::iwarp::deframer::{CrcCheck, Deframer};
use crate::proto::iwarp::mpa::{self, FrameKind, MpaFramePacket, MpaFrameRepr};
use crate::proto::iwarp::rdmap::MessageRepr;
use crate::proto::Error;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

type Endpoint = (IpAddr, u16);
type DirKey = (Endpoint, Endpoint);

/// Segments held while waiting for a gap to fill; beyond this the stream is dropped.
const MAX_PENDING_SEGMENTS: usize = 4096;
/// Bytes held in those segments, and bytes held after an MPA frame while the other
/// side's frame has not been seen; beyond either the stream is not followed further.
const MAX_HELD_BYTES: usize = 16 << 20;

#[derive(Debug)]
enum Phase {
    /// No payload yet: the first bytes tell whether this is MPA.
    Start,
    /// Not MPA: ignored.
    NotMpa,
    /// Collecting the MPA Request or Reply.
    MpaFrame(Vec<u8>),
    /// MPA frame done; waiting for the other side's frame to know CRC and markers.
    AwaitPeer(Vec<u8>),
    /// Following FPDUs.
    Fpdus(Deframer),
    /// Lost sync (malformed data, capture gap): not followed further.
    Lost,
}

#[derive(Debug)]
struct Direction {
    isn: Option<u32>,
    next: u64,
    pending: BTreeMap<u64, Vec<u8>>,
    pending_bytes: usize,
    phase: Phase,
    sent: Option<FrameKind>,
    frames: u64,
}

impl Default for Direction {
    fn default() -> Self {
        Direction {
            isn: None,
            next: 0,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            phase: Phase::Start,
            sent: None,
            frames: 0,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Negotiation {
    request: Option<(bool, bool)>,     // (markers, crc) of the Request
    reply: Option<(bool, bool, bool)>, // (markers, crc, reject) of the Reply
}

/// All TCP directions of a capture.
#[derive(Debug, Default)]
pub struct Streams {
    dirs: HashMap<DirKey, Direction>,
    conns: HashMap<(Endpoint, Endpoint), Negotiation>,
}

fn conn_key(k: DirKey) -> (Endpoint, Endpoint) {
    if k.0 <= k.1 {
        k
    } else {
        (k.1, k.0)
    }
}

fn endpoint(e: Endpoint) -> String {
    match e.0 {
        IpAddr::V4(a) => format!("{a}:{}", e.1),
        IpAddr::V6(a) => format!("[{a}]:{}", e.1),
    }
}

impl Streams {
    /// Feeds one segment; returns the RDMA records it completed.
    pub fn segment(&mut self, frame: u64, seg: &TcpSegment<'_>) -> Vec<Record> {
        let key = (seg.src, seg.dst);
        let dir = self.dirs.entry(key).or_default();
        dir.frames += 1;
        if seg.syn {
            let frames = dir.frames;
            let isn = Some(seg.seq.wrapping_add(1));
            *dir = Direction { isn, frames, ..Direction::default() };
            return Vec::new();
        }
        if seg.payload.is_empty() || matches!(dir.phase, Phase::NotMpa | Phase::Lost) {
            return Vec::new();
        }
        let isn = *dir.isn.get_or_insert(seg.seq);
        let mut out = Vec::new();
        if seg.truncated {
            dir.phase = Phase::Lost;
            out.push(stream_record(
                frame,
                key,
                "TCP segment cut by the snaplen: stream not followed further",
                Check::Truncated,
            ));
            return out;
        }
        let rel = u64::from(seg.seq.wrapping_sub(isn));
        let mut data = seg.payload;
        if rel + data.len() as u64 <= dir.next {
            return out; // retransmission of bytes already seen
        }
        if rel < dir.next {
            data = &data[(dir.next - rel) as usize..];
        } else if rel > dir.next {
            if dir.pending.len() >= MAX_PENDING_SEGMENTS || dir.pending_bytes + data.len() > MAX_HELD_BYTES {
                dir.phase = Phase::Lost;
                dir.pending.clear();
            } else if let Some(old) = dir.pending.insert(rel, data.to_vec()) {
                dir.pending_bytes -= old.len();
                dir.pending_bytes += data.len();
            } else {
                dir.pending_bytes += data.len();
            }
            return out;
        }
        dir.next += data.len() as u64;
        self.deliver(frame, key, data, &mut out);
        // Held segments the gap was waiting for follow one by one, each pushed as it is.
        while let Some(seg) = self.take_next_held(key) {
            self.deliver(frame, key, &seg, &mut out);
        }
        out
    }

    /// The held segment that continues direction `key`'s stream, cut to its new bytes.
    fn take_next_held(&mut self, key: DirKey) -> Option<Vec<u8>> {
        let dir = self.dirs.get_mut(&key)?;
        loop {
            let (&at, _) = dir.pending.first_key_value()?;
            if at > dir.next {
                return None;
            }
            let (at, seg) = dir.pending.pop_first()?;
            dir.pending_bytes -= seg.len();
            let skip = (dir.next - at) as usize;
            if skip < seg.len() {
                dir.next += (seg.len() - skip) as u64;
                return Some(seg[skip..].to_vec());
            }
        }
    }

    fn deliver(&mut self, frame: u64, key: DirKey, data: &[u8], out: &mut Vec<Record>) {
        let Some(dir) = self.dirs.get_mut(&key) else {
            return;
        };
        let phase = std::mem::replace(&mut dir.phase, Phase::Lost);
        let phase = match phase {
            Phase::Start => {
                let n = data.len().min(16);
                if mpa::KEY_REQUEST[..n] == data[..n] || mpa::KEY_REPLY[..n] == data[..n] {
                    Phase::MpaFrame(Vec::new())
                } else {
                    Phase::NotMpa
                }
            }
            other => other,
        };
        let phase = match phase {
            Phase::MpaFrame(mut buf) => {
                buf.extend_from_slice(data);
                self.mpa_frame(frame, key, buf, out)
            }
            Phase::AwaitPeer(mut buf) => {
                buf.extend_from_slice(data);
                if buf.len() > MAX_HELD_BYTES {
                    Phase::Lost
                } else {
                    Phase::AwaitPeer(buf)
                }
            }
            Phase::Fpdus(mut d) => {
                d.push(data);
                drain_fpdus(frame, key, d, out)
            }
            other => other,
        };
        self.set_phase(key, phase);
        self.advance_waiting(frame, key, out);
        self.advance_waiting(frame, (key.1, key.0), out);
    }

    fn set_phase(&mut self, key: DirKey, phase: Phase) {
        if let Some(dir) = self.dirs.get_mut(&key) {
            dir.phase = phase;
        }
    }

    fn mpa_frame(&mut self, frame: u64, key: DirKey, buf: Vec<u8>, out: &mut Vec<Record>) -> Phase {
        let parsed = MpaFramePacket::new_checked(&buf[..]).and_then(|p| Ok((p.frame_len(), MpaFrameRepr::parse(&p)?)));
        match parsed {
            Err(Error::Truncated { .. }) => Phase::MpaFrame(buf),
            Err(e) => {
                out.push(stream_record(frame, key, "MPA frame", Check::Malformed { error: e.to_string() }));
                Phase::Lost
            }
            Ok((len, repr)) => {
                out.push(stream_record(frame, key, &repr.to_string(), Check::NoChecksum));
                let neg = self.conns.entry(conn_key(key)).or_default();
                match repr.kind {
                    FrameKind::Request => neg.request = Some((repr.markers, repr.crc)),
                    FrameKind::Reply => neg.reply = Some((repr.markers, repr.crc, repr.reject)),
                }
                if let Some(dir) = self.dirs.get_mut(&key) {
                    dir.sent = Some(repr.kind);
                }
                if repr.kind == FrameKind::Reply && repr.reject {
                    return Phase::NotMpa;
                }
                Phase::AwaitPeer(buf[len..].to_vec())
            }
        }
    }

    /// Moves a direction from AwaitPeer to Fpdus once both MPA frames are known.
    fn advance_waiting(&mut self, frame: u64, key: DirKey, out: &mut Vec<Record>) {
        let Some(neg) = self.conns.get(&conn_key(key)).copied() else {
            return;
        };
        let (Some((req_m, req_c)), Some((rep_m, rep_c, _))) = (neg.request, neg.reply) else {
            return;
        };
        let Some(dir) = self.dirs.get_mut(&key) else {
            return;
        };
        if !matches!(dir.phase, Phase::AwaitPeer(_)) {
            return;
        }
        let Phase::AwaitPeer(buf) = std::mem::replace(&mut dir.phase, Phase::Lost) else {
            return;
        };
        // A sender adds markers if the MPA frame it received had M set.
        let sent_reply = dir.sent == Some(FrameKind::Reply);
        let markers = if sent_reply { req_m } else { rep_m };
        let mut d = Deframer::new(markers, req_c || rep_c);
        d.push(&buf);
        let phase = drain_fpdus(frame, key, d, out);
        self.set_phase(key, phase);
    }

    /// TCP frames of directions that never carried MPA.
    pub fn non_rdma_frames(&self) -> u64 {
        let not_mpa = |d: &&Direction| matches!(d.phase, Phase::Start | Phase::NotMpa);
        self.dirs.values().filter(not_mpa).map(|d| d.frames).sum()
    }

    /// Notes for what is left when the capture ends.
    pub fn finish(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for (key, dir) in &self.dirs {
            let left = match &dir.phase {
                Phase::MpaFrame(b) | Phase::AwaitPeer(b) => b.len(),
                Phase::Fpdus(d) => d.buffered(),
                _ => 0,
            };
            if left > 0 {
                notes.push(format!(
                    "{} -> {}: {left} bytes of an incomplete FPDU or frame at the end of the capture",
                    endpoint(key.0),
                    endpoint(key.1)
                ));
            }
            if !dir.pending.is_empty() {
                notes.push(format!(
                    "{} -> {}: segments missing from the capture; {} later segments not followed",
                    endpoint(key.0),
                    endpoint(key.1),
                    dir.pending.len()
                ));
            }
        }
        notes.sort();
        notes
    }
}

fn stream_record(frame: u64, key: DirKey, summary: &str, check: Check) -> Record {
    Record { frame, src: endpoint(key.0), dst: endpoint(key.1), summary: summary.to_string(), check }
}

fn drain_fpdus(frame: u64, key: DirKey, mut d: Deframer, out: &mut Vec<Record>) -> Phase {
    loop {
        match d.next_fpdu() {
            Ok(Some(f)) => {
                let (summary, parse_err) = match MessageRepr::parse(&f.ulpdu) {
                    Ok(m) => (m.to_string(), None),
                    Err(e) => (format!("FPDU ulpdu_len={}", f.ulpdu.len()), Some(e)),
                };
                let check = match (f.crc, parse_err) {
                    (CrcCheck::Bad { carried, computed }, _) => Check::BadChecksum { carried, computed },
                    (_, Some(e)) => Check::Malformed { error: e.to_string() },
                    (CrcCheck::Ok, None) => Check::Ok,
                    (CrcCheck::NotNegotiated, None) => Check::NotNegotiated,
                };
                out.push(stream_record(frame, key, &summary, check));
            }
            Ok(None) => return Phase::Fpdus(d),
            Err(e) => {
                out.push(stream_record(frame, key, "FPDU stream", Check::Malformed { error: e.to_string() }));
                return Phase::Lost;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(seq: u32, payload: &[u8]) -> TcpSegment<'_> {
        let ip = IpAddr::from([10, 0, 0, 1]);
        TcpSegment {
            src: (ip, 5000),
            dst: (ip, 7174),
            seq,
            syn: false,
            fin: false,
            rst: false,
            payload,
            truncated: false,
        }
    }

    #[test]
    fn segments_held_behind_a_gap_stay_under_the_byte_limit() {
        let mut s = Streams::default();
        let key = ((IpAddr::from([10, 0, 0, 1]), 5000), (IpAddr::from([10, 0, 0, 1]), 7174));
        s.segment(1, &seg(0, mpa::KEY_REQUEST));
        // A gap at 16, then 400 segments of 60,000 bytes after it: 24 MB if all were held.
        let big = vec![0u8; 60_000];
        for i in 0..400u32 {
            s.segment(2 + u64::from(i), &seg(100 + i * 60_000, &big));
            let held: usize = s.dirs[&key].pending.values().map(Vec::len).sum();
            assert!(held <= MAX_HELD_BYTES, "{held} bytes held after {} segments", i + 1);
        }
        assert!(matches!(s.dirs[&key].phase, Phase::Lost), "the stream is given up, not buffered");
    }

    #[test]
    fn held_segments_are_delivered_one_by_one_once_the_gap_fills() {
        let mut s = Streams::default();
        let key = ((IpAddr::from([10, 0, 0, 1]), 5000), (IpAddr::from([10, 0, 0, 1]), 7174));
        s.segment(1, &seg(0, mpa::KEY_REQUEST));
        s.segment(2, &seg(20, &[0u8; 30]));
        s.segment(3, &seg(50, &[0u8; 30]));
        assert_eq!(s.dirs[&key].pending_bytes, 60);
        s.segment(4, &seg(16, &[0u8; 4]));
        assert_eq!((s.dirs[&key].next, s.dirs[&key].pending_bytes), (80, 0));
    }
}
