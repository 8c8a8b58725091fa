//! A deterministic network simulator: devices joined by one link that, driven by one seed,
//! loses, duplicates, reorders, delays, corrupts, rate-limits and partitions. Time is
//! virtual (ns); nothing here reads a clock.
//!
//! Each packet is framed with a real IPv4/UDP header and a real ICRC on the way in, and
//! the ICRC is checked on the way out, as a NIC would: a corrupted packet must fail it.

pub mod iwarp;
pub mod swarm;
pub mod unreliable;

use crate::engine::rng::Rng;
use crate::engine::verbs::Gid;
use crate::engine::{Device, Transmit};
use crate::proto::roce::icrc::{self, IpHeader};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// What the link does to packets. Probabilities are per packet.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Lose the packet.
    pub loss: f64,
    /// Deliver it twice.
    pub duplicate: f64,
    /// Hold it back so later packets overtake it.
    pub reorder: f64,
    /// Flip 1 to 3 bits of it.
    pub corrupt: f64,
    /// One-way delay range, ns.
    pub delay_ns: (u64, u64),
    /// Serialization rate, bytes per µs (None: unlimited).
    pub rate_bytes_per_us: Option<u64>,
    /// Partitions: about every `period` ns (random phase) the link is down for `down` ns.
    pub partition: Option<(u64, u64)>,
    /// Mark packets ECN-CE when the sender's queue holds more than this many ns of data.
    pub ecn_threshold_ns: Option<u64>,
}

impl Faults {
    /// A clean link with a fixed 10 µs delay.
    pub fn none() -> Self {
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay_ns: (10_000, 10_000),
            rate_bytes_per_us: None,
            partition: None,
            ecn_threshold_ns: None,
        }
    }
}

/// A test's hook on every packet: (sender index, packet) -> keep it.
pub type Tamper = Box<dyn FnMut(usize, &mut Vec<u8>) -> bool>;

/// Counters of what the link did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Packets offered.
    pub sent: u64,
    /// Packets delivered.
    pub delivered: u64,
    /// Lost by the loss fault.
    pub lost: u64,
    /// Lost to a partition.
    pub partitioned: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Held back to reorder.
    pub reordered: u64,
    /// Corrupted.
    pub corrupted: u64,
    /// Dropped at delivery because the ICRC failed.
    pub icrc_failed: u64,
    /// Corrupted packets whose ICRC still passed (must stay 0).
    pub corruption_missed: u64,
    /// Packets marked ECN-CE.
    pub ecn_marked: u64,
    /// The longest queue seen at a sender, ns of data.
    pub max_backlog_ns: u64,
}

struct InFlight {
    to: usize,
    src: Gid,
    frame: Vec<u8>,
    corrupted: bool,
    ce: bool,
}

/// Bytes of IP and UDP header in front of a framed packet.
fn headers_len(frame: &[u8]) -> usize {
    if frame[0] >> 4 == 4 {
        28
    } else {
        48
    }
}

/// Devices on a simulated link.
pub struct Sim {
    /// Virtual time, ns.
    pub now: u64,
    /// The devices; a packet goes to the one whose GID it names.
    pub devices: Vec<Device>,
    /// Current faults.
    pub faults: Faults,
    /// Counters.
    pub stats: LinkStats,
    rng: Rng,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    slots: HashMap<u64, InFlight>,
    seq: u64,
    busy_until: Vec<u64>,
    last_arrival: Vec<u64>,
    partition_window: (u64, u64),
    ip_id: u16,
    /// Sees every packet before the faults (sender index, packet BTH..ICRC); returning
    /// false drops it. For tests that lose or alter one particular packet.
    pub tamper: Option<Tamper>,
    /// The last packets delivered or dropped, for failure reports.
    pub trace: std::collections::VecDeque<String>,
}

impl Sim {
    /// A simulator over `devices`, its faults drawn from `seed`.
    pub fn new(devices: Vec<Device>, faults: Faults, seed: u64) -> Self {
        let n = devices.len();
        Sim {
            now: 0,
            devices,
            faults,
            stats: LinkStats::default(),
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            slots: HashMap::new(),
            seq: 0,
            busy_until: vec![0; n],
            last_arrival: vec![0; n],
            partition_window: (0, 0),
            ip_id: 1,
            tamper: None,
            trace: std::collections::VecDeque::new(),
        }
    }

    /// Frames a packet as IPv4/UDP (IPv4-mapped GIDs) or IPv6/UDP with its ICRC, as a
    /// transport would.
    fn frame(&mut self, src: Gid, t: &Transmit) -> Vec<u8> {
        use crate::transport::headers::{gid_to_ip, ip_header, udp_header};
        let (src_ip, dst_ip) = (gid_to_ip(&src), gid_to_ip(&t.dst));
        let (ip, ip_len) = ip_header(src_ip, dst_ip, 8 + t.packet.len(), self.ip_id, true, 0);
        if ip_len == 20 {
            self.ip_id = self.ip_id.wrapping_add(1);
        }
        let sport = 0xc000 | (t.src_qpn as u16 & 0x3fff);
        let mut f = Vec::with_capacity(ip_len + 8 + t.packet.len());
        f.extend_from_slice(&ip[..ip_len]);
        f.extend_from_slice(&udp_header(sport, 4791, t.packet.len()));
        f.extend_from_slice(&t.packet);
        let (hdr, pkt) = f.split_at_mut(ip_len + 8);
        let ip = if ip_len == 20 { IpHeader::V4(&hdr[..20]) } else { IpHeader::V6(&hdr[..40]) };
        let _ = icrc::fill(ip, &hdr[ip_len..], pkt);
        f
    }

    /// True inside a partition. Partitions come every `period` ns on average, at random
    /// phases, so that they cannot line up with the engine's timers.
    fn partitioned(&mut self) -> bool {
        let Some((period, down)) = self.faults.partition else { return false };
        while self.now >= self.partition_window.1 {
            let start = self.partition_window.1 + period / 2 + self.rng.below(period.max(1));
            self.partition_window = (start, start + down);
        }
        self.now >= self.partition_window.0
    }

    fn offer(&mut self, from: usize, t: &mut Transmit) {
        self.stats.sent += 1;
        if let Some(f) = self.tamper.as_mut() {
            if !f(from, &mut t.packet) {
                self.stats.lost += 1;
                return;
            }
        }
        let Some(to) = self.devices.iter().position(|d| d.gids().contains(&t.dst)) else { return };
        if self.partitioned() {
            self.stats.partitioned += 1;
            return;
        }
        if self.rng.chance(self.faults.loss) {
            self.stats.lost += 1;
            return;
        }
        let src = t.src;
        let frame = self.frame(src, t);
        let copies = if self.rng.chance(self.faults.duplicate) { 2 } else { 1 };
        self.stats.duplicated += copies - 1;
        let serialize = self.faults.rate_bytes_per_us.map_or(0, |r| frame.len() as u64 * 1000 / r.max(1));
        let start = self.now.max(self.busy_until[from]);
        let backlog = start - self.now;
        self.stats.max_backlog_ns = self.stats.max_backlog_ns.max(backlog);
        let ce = self.faults.ecn_threshold_ns.is_some_and(|k| backlog > k);
        self.stats.ecn_marked += u64::from(ce);
        self.busy_until[from] = start + serialize;
        for _ in 0..copies {
            self.schedule(to, src, frame.clone(), start + serialize, ce);
        }
    }

    fn schedule(&mut self, to: usize, src: Gid, mut frame: Vec<u8>, ready: u64, ce: bool) {
        let (lo, hi) = self.faults.delay_ns;
        let mut at = ready + lo + self.rng.below(hi.saturating_sub(lo) + 1);
        if self.rng.chance(self.faults.reorder) {
            self.stats.reordered += 1;
            at += self.rng.below(4 * hi.max(1) + 1);
        } else {
            // A link keeps its order: jitter delays a packet, it does not let later ones
            // overtake it. Only the reorder fault does that.
            at = at.max(self.last_arrival[to] + 1);
            self.last_arrival[to] = at;
        }
        let corrupted = self.rng.chance(self.faults.corrupt);
        if corrupted {
            self.stats.corrupted += 1;
            // 1 to 3 distinct bits, none in BTH byte 4: FECN/BECN may change in flight and the
            // ICRC masks them (Annex A17.3.3).
            let hl = headers_len(&frame);
            let bits = (frame.len() - hl) as u64 * 8;
            let mut flipped: Vec<u64> = Vec::new();
            while flipped.len() < 1 + self.rng.below(3) as usize {
                let bit = self.rng.below(bits);
                if bit / 8 != 4 && !flipped.contains(&bit) {
                    flipped.push(bit);
                }
            }
            for bit in flipped {
                frame[hl + bit as usize / 8] ^= 1 << (bit % 8);
            }
        }
        self.seq += 1;
        self.slots.insert(self.seq, InFlight { to, src, frame, corrupted, ce });
        self.queue.push(Reverse((at, self.seq)));
    }

    fn deliver(&mut self, seq: u64) {
        let Some(p) = self.slots.remove(&seq) else { return };
        let hl = headers_len(&p.frame);
        let (hdr, pkt) = p.frame.split_at(hl);
        let ip = if hl == 28 { IpHeader::V4(&hdr[..20]) } else { IpHeader::V6(&hdr[..40]) };
        if icrc::verify(ip, &hdr[hl - 8..], pkt).is_err() {
            self.stats.icrc_failed += 1;
            return;
        }
        if p.corrupted {
            self.stats.corruption_missed += 1;
        }
        self.stats.delivered += 1;
        if self.trace.len() >= 60 {
            self.trace.pop_front();
        }
        let aeth = if matches!(pkt[0], 0x0d | 0x0f | 0x10 | 0x11 | 0x12) {
            format!(" aeth={:02x}", pkt[12])
        } else {
            String::new()
        };
        self.trace.push_back(format!(
            "t={} to={} op={:02x} qp={} psn={:06x}{aeth}",
            self.now,
            p.to,
            pkt[0],
            u32::from_be_bytes([0, pkt[5], pkt[6], pkt[7]]),
            u32::from_be_bytes([0, pkt[9], pkt[10], pkt[11]])
        ));
        self.devices[p.to].handle_packet_ecn(self.now, p.src, p.ce, pkt);
    }

    /// Moves every device's pending packets onto the link.
    pub fn flush_transmits(&mut self) {
        for i in 0..self.devices.len() {
            while let Some(mut t) = self.devices[i].poll_transmit(self.now) {
                self.offer(i, &mut t);
                // As the UDP and raw drivers do once a packet is sent.
                self.devices[i].recycle(t.packet);
            }
        }
    }

    /// Advances to the next event (a delivery or a timer) and runs it. False when nothing
    /// is left to happen.
    pub fn step(&mut self) -> bool {
        self.flush_transmits();
        let next_packet = self.queue.peek().map(|Reverse((t, _))| *t);
        let next_timer = self.devices.iter().filter_map(|d| d.poll_timeout()).min();
        let Some(next) = [next_packet, next_timer].into_iter().flatten().min() else { return false };
        self.now = self.now.max(next);
        while let Some(Reverse((t, seq))) = self.queue.peek().copied() {
            if t > self.now {
                break;
            }
            self.queue.pop();
            self.deliver(seq);
        }
        for d in &mut self.devices {
            if d.poll_timeout().is_some_and(|t| t <= self.now) {
                d.handle_timeout(self.now);
            }
        }
        self.flush_transmits();
        true
    }

    /// Runs until nothing is left to happen or `until` ns.
    pub fn run_until(&mut self, until: u64) {
        while self.now < until && self.step() {}
    }
}
