//! `softrdma inject`: an in-path event injector, Lumina (SIGCOMM 2023) without the switch.
//!
//! It sits between two RoCEv2 peers as a forwarding bridge on two interfaces, forwards every
//! frame both ways, and applies declared events to chosen packets: drop the Nth request of
//! a QP (or of an opcode), mark it ECN-CE, corrupt a byte, delay it (so later packets pass
//! it), or duplicate it. Every forwarded frame is recorded; [`micro`] then reads the
//! peers' micro-behaviour around each event from that record (time to the retransmission
//! and how far it went back, NAK reaction, CNP generation and spacing, rate reaction,
//! whether a corrupted packet was dropped).
//!
//! This module is the sans-I/O core: frames and `now` in, frames with the time they are
//! due out. [`bridge`] moves them between two packet sockets.

pub mod bridge;
pub mod micro;

use crate::transport::headers::ipv4_checksum;
use std::net::IpAddr;

/// What an event does to the packet it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Not forwarded.
    Drop,
    /// IP ECN field set to CE (11); the ICRC masks it (IBTA A17.3.3), so it stays valid.
    Ecn,
    /// One byte of the RoCEv2 packet XORed with 0xff, at this offset from the BTH (the
    /// last payload byte before the ICRC when `None`): the ICRC no longer holds.
    Corrupt(Option<usize>),
    /// Held back this long while later frames pass it.
    Delay { us: u64 },
    /// Forwarded twice.
    Duplicate,
}

/// One declared event: `action` on the `nth` (1-based) packet that matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    /// What to do.
    pub action: Action,
    /// Which matching packet (1 = the first).
    pub nth: u64,
    /// Only packets to this destination QP (any data QP when `None`).
    pub qpn: Option<u32>,
    /// Only this BTH opcode (any request when `None`: not an ACK, response or CNP).
    pub opcode: Option<u8>,
    /// Only packets from this address.
    pub from: Option<IpAddr>,
    /// The event hits this many matching packets in a row from the Nth (a run of ECN
    /// marks shows CNP spacing; a run of drops, a burst loss).
    pub run: u64,
}

impl std::str::FromStr for EventSpec {
    type Err = String;

    /// `KIND@N[,qp=HEX][,op=HEX][,from=ADDR][,us=N][,byte=N][,count=N]`, KIND one of drop,
    /// ecn, corrupt, delay, dup: e.g. `drop@200`, `delay@50,us=2000`, `ecn@10,count=100`.
    fn from_str(s: &str) -> Result<EventSpec, String> {
        let mut parts = s.split(',');
        let head = parts.next().unwrap_or_default();
        let (kind, n) = head.split_once('@').ok_or(format!("{s}: expected KIND@N"))?;
        let nth: u64 = n.parse().map_err(|_| format!("{s}: N must be a number"))?;
        if nth == 0 {
            return Err(format!("{s}: N counts from 1"));
        }
        let mut spec = EventSpec { action: Action::Drop, nth, qpn: None, opcode: None, from: None, run: 1 };
        let (mut us, mut byte) = (1000u64, None);
        for kv in parts {
            let (k, v) = kv.split_once('=').ok_or(format!("{s}: expected key=value, got {kv}"))?;
            let hex =
                |v: &str| u32::from_str_radix(v.trim_start_matches("0x"), 16).map_err(|_| format!("{s}: {k}={v}"));
            match k {
                "qp" => spec.qpn = Some(hex(v)? & 0xff_ffff),
                "op" => spec.opcode = Some(hex(v)? as u8),
                "from" => spec.from = Some(v.parse().map_err(|_| format!("{s}: from={v}"))?),
                "us" => us = v.parse().map_err(|_| format!("{s}: us={v}"))?,
                "byte" => byte = Some(v.parse().map_err(|_| format!("{s}: byte={v}"))?),
                "count" => spec.run = v.parse().ok().filter(|&n| n >= 1).ok_or(format!("{s}: count={v}"))?,
                _ => return Err(format!("{s}: unknown key {k}")),
            }
        }
        spec.action = match kind {
            "drop" => Action::Drop,
            "ecn" => Action::Ecn,
            "corrupt" => Action::Corrupt(byte),
            "delay" => Action::Delay { us },
            "dup" => Action::Duplicate,
            _ => return Err(format!("{s}: KIND is drop, ecn, corrupt, delay or dup")),
        };
        Ok(spec)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Drop => write!(f, "drop"),
            Action::Ecn => write!(f, "ECN-CE mark"),
            Action::Corrupt(_) => write!(f, "corrupt a byte"),
            Action::Delay { us } => write!(f, "delay {us} µs"),
            Action::Duplicate => write!(f, "duplicate"),
        }
    }
}

/// Which way a frame goes through the bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// In on interface A, out on B.
    AtoB,
    /// In on B, out on A.
    BtoA,
}

/// A RoCEv2 packet's identity, read from a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceId {
    /// IP source.
    pub src: IpAddr,
    /// IP destination.
    pub dst: IpAddr,
    /// BTH opcode.
    pub opcode: u8,
    /// BTH destination QP.
    pub dest_qp: u32,
    /// BTH PSN.
    pub psn: u32,
    /// Where the IP header starts, where the BTH starts and where the IP packet ends
    /// (Ethernet may pad beyond it).
    ip_at: usize,
    pub(crate) bth_at: usize,
    pub(crate) end: usize,
}

/// An event as it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The declared event.
    pub spec: EventSpec,
    /// When (ns since the Unix epoch, the capture's clock).
    pub time_ns: u64,
    /// The packet it hit.
    pub packet: RoceId,
}

/// Frames held by a delay event beyond this many are forwarded at once: a peer flooding
/// the bridge cannot grow its memory without bound.
pub const MAX_HELD_FRAMES: usize = 4096;

/// The injector's state: the declared events, how many packets each has matched so far,
/// the events applied, and frames held back.
pub struct Injector {
    specs: Vec<(EventSpec, u64)>,
    applied: Vec<Applied>,
    held: Vec<(u64, Side, Vec<u8>, usize)>,
    released: Vec<(usize, u64)>,
}

impl Injector {
    /// An injector for `specs`.
    pub fn new(specs: Vec<EventSpec>) -> Injector {
        Injector {
            specs: specs.into_iter().map(|s| (s, 0)).collect(),
            applied: Vec::new(),
            held: Vec::new(),
            released: Vec::new(),
        }
    }

    /// A frame that came in on `side` at `now_ns`: the frames to forward now (to the other
    /// side), after any event it triggers.
    pub fn on_frame(&mut self, now_ns: u64, side: Side, mut frame: Vec<u8>) -> Vec<Vec<u8>> {
        let Some(id) = roce_id(&frame) else { return vec![frame] };
        let Some((i, first)) = self.trigger(&id) else { return vec![frame] };
        let spec = self.specs[i].0.clone();
        // A run of packets is one event, placed at its first.
        if first {
            self.applied.push(Applied { spec: spec.clone(), time_ns: now_ns, packet: id });
        }
        match spec.action {
            Action::Drop => vec![],
            Action::Ecn => {
                mark_ce(&mut frame, id.ip_at);
                vec![frame]
            }
            Action::Corrupt(at) => {
                let last = id.end - 5;
                let off = at.map_or(last, |o| id.bth_at + o).min(id.end - 1);
                frame[off] ^= 0xff;
                vec![frame]
            }
            Action::Delay { us } => {
                if self.held.len() >= MAX_HELD_FRAMES {
                    return vec![frame];
                }
                self.held.push((now_ns + us * 1000, side, frame, self.applied.len() - 1));
                vec![]
            }
            Action::Duplicate => vec![frame.clone(), frame],
        }
    }

    /// The first event whose run this packet falls in (each event fires once), and
    /// whether it is the run's first packet.
    fn trigger(&mut self, id: &RoceId) -> Option<(usize, bool)> {
        let mut hit = None;
        for (i, (spec, count)) in self.specs.iter_mut().enumerate() {
            let last = spec.nth + spec.run - 1;
            if *count >= last || !matches(spec, id) {
                continue;
            }
            *count += 1;
            if *count >= spec.nth && hit.is_none() {
                hit = Some((i, *count == spec.nth));
            }
        }
        hit
    }

    /// Held frames due by `now_ns`, with the side each came in on.
    pub fn due(&mut self, now_ns: u64) -> Vec<(Side, Vec<u8>)> {
        self.release(now_ns, now_ns)
    }

    /// Every held frame, due or not (the bridge is stopping).
    pub fn flush(&mut self, now_ns: u64) -> Vec<(Side, Vec<u8>)> {
        self.release(u64::MAX, now_ns)
    }

    fn release(&mut self, due_by_ns: u64, now_ns: u64) -> Vec<(Side, Vec<u8>)> {
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held).into_iter().partition(|h| h.0 <= due_by_ns);
        self.held = keep;
        due.into_iter()
            .map(|(_, s, f, i)| {
                self.released.push((i, now_ns));
                (s, f)
            })
            .collect()
    }

    /// Delayed frames as they went out: (index into [`Injector::applied`], time ns).
    pub fn released(&self) -> &[(usize, u64)] {
        &self.released
    }

    /// When the next held frame is due.
    pub fn next_due_ns(&self) -> Option<u64> {
        self.held.iter().map(|h| h.0).min()
    }

    /// The events applied so far.
    pub fn applied(&self) -> &[Applied] {
        &self.applied
    }

    /// Events declared that never found their packet.
    pub fn unmet(&self) -> Vec<EventSpec> {
        self.specs.iter().filter(|(s, c)| *c < s.nth + s.run - 1).map(|(s, _)| s.clone()).collect()
    }
}

fn matches(spec: &EventSpec, id: &RoceId) -> bool {
    if id.dest_qp == 1 || spec.qpn.is_some_and(|q| q != id.dest_qp) || spec.from.is_some_and(|a| a != id.src) {
        return false;
    }
    match spec.opcode {
        Some(op) => op == id.opcode,
        None => is_request(id.opcode),
    }
}

/// RC, UC, RD and UD requests: not acknowledgements, READ/atomic responses or CNPs.
pub fn is_request(opcode: u8) -> bool {
    let op = opcode & 0x1f;
    let response = opcode < 0x20 && (0x0d..=0x12).contains(&op);
    opcode != 0x81 && !response
}

/// The RoCEv2 packet in an Ethernet frame (IPv4 or IPv6, UDP to port 4791), if any.
pub fn roce_id(frame: &[u8]) -> Option<RoceId> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip_at = 14;
    let be16 = |i: usize| Some(u16::from_be_bytes([*frame.get(i)?, *frame.get(i + 1)?]));
    let (src, dst, udp_at, end) = match ethertype {
        0x0800 => {
            let ihl = usize::from(frame.get(ip_at)? & 0x0f) * 4;
            let end = ip_at + usize::from(be16(ip_at + 2)?);
            let flags_frag = u16::from_be_bytes([*frame.get(ip_at + 6)?, *frame.get(ip_at + 7)?]);
            if *frame.get(ip_at + 9)? != 17 || flags_frag & 0x3fff != 0 || ihl < 20 {
                return None;
            }
            let a: [u8; 4] = frame.get(ip_at + 12..ip_at + 16)?.try_into().ok()?;
            let b: [u8; 4] = frame.get(ip_at + 16..ip_at + 20)?.try_into().ok()?;
            (IpAddr::from(a), IpAddr::from(b), ip_at + ihl, end)
        }
        0x86dd => {
            if *frame.get(ip_at + 6)? != 17 {
                return None;
            }
            let a: [u8; 16] = frame.get(ip_at + 8..ip_at + 24)?.try_into().ok()?;
            let b: [u8; 16] = frame.get(ip_at + 24..ip_at + 40)?.try_into().ok()?;
            (IpAddr::from(a), IpAddr::from(b), ip_at + 40, ip_at + 40 + usize::from(be16(ip_at + 4)?))
        }
        _ => return None,
    };
    let dport = u16::from_be_bytes([*frame.get(udp_at + 2)?, *frame.get(udp_at + 3)?]);
    let bth_at = udp_at + 8;
    let bth = frame.get(bth_at..bth_at + 12)?;
    if dport != crate::proto::roce::UDP_PORT || end > frame.len() || end < bth_at + 16 {
        return None;
    }
    let be24 = |b: &[u8]| u32::from_be_bytes([0, b[0], b[1], b[2]]);
    Some(RoceId { src, dst, opcode: bth[0], dest_qp: be24(&bth[5..8]), psn: be24(&bth[9..12]), ip_at, bth_at, end })
}

/// Sets the IP ECN field to CE, keeping an IPv4 header checksum right.
fn mark_ce(frame: &mut [u8], ip_at: usize) {
    if frame[ip_at] >> 4 == 4 {
        frame[ip_at + 1] |= 0x03;
        let ihl = usize::from(frame[ip_at] & 0x0f) * 4;
        frame[ip_at + 10..ip_at + 12].fill(0);
        let sum = ipv4_checksum(&frame[ip_at..ip_at + ihl]);
        frame[ip_at + 10..ip_at + 12].copy_from_slice(&sum.to_be_bytes());
    } else {
        // Traffic class straddles bytes 0 and 1; ECN is its low two bits (bits 4-5 of byte 1).
        frame[ip_at + 1] |= 0x30;
    }
}

#[cfg(test)]
mod tests;
