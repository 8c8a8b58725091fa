//! The raw device's neighbour table: IP address to MAC, learned from ARP (RFC 826) and
//! Neighbour Discovery (RFC 4861), with frames held while a next hop resolves. Pure: time
//! is passed in.
//!
//! A peer can make the device create entries (ARP requests for our address teach their
//! sender, as RFC 826 says), so the table and what waits in it are bounded.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

/// Most neighbours remembered; beyond it the one heard from longest ago is forgotten.
pub const MAX_NEIGHBOURS: usize = 1024;
/// Most frames held for one unresolved next hop; beyond it the oldest is dropped.
pub const MAX_PENDING_FRAMES: usize = 64;
/// Time between two requests for the same unresolved next hop.
pub const RESOLVE_RETRY_NS: u64 = 200_000_000;
/// Frames held longer than this for a next hop that never answered are dropped.
pub const RESOLVE_TIMEOUT_NS: u64 = 3_000_000_000;

#[derive(Debug)]
enum Entry {
    Known { mac: [u8; 6], seen_ns: u64 },
    Pending { frames: VecDeque<Vec<u8>>, asked_ns: u64, since_ns: u64 },
}

impl Entry {
    fn stamp(&self) -> u64 {
        match self {
            Entry::Known { seen_ns, .. } => *seen_ns,
            Entry::Pending { since_ns, .. } => *since_ns,
        }
    }
}

/// What to do with a frame for a next hop.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Known: send it to this MAC.
    Known([u8; 6]),
    /// Held; `ask` says a request should go out now; `dropped` frames fell out.
    Held {
        /// Send a request for the next hop now.
        ask: bool,
        /// Frames dropped to make room (the oldest, or all of a timed-out wait).
        dropped: usize,
    },
}

/// IP to MAC, with the frames waiting for an answer.
#[derive(Debug, Default)]
pub struct Neighbours {
    map: HashMap<IpAddr, Entry>,
    /// The last next hop found known, and its MAC: every frame to one peer asks for the
    /// same hop, and hashing it (SipHash: the table's keys come from the wire) was about
    /// 190 instructions a frame. Forgotten whenever an entry is learnt or evicted.
    last_known: Option<(IpAddr, [u8; 6])>,
}

impl Neighbours {
    /// Entries held (known and pending).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is known or pending.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The MAC of `ip`, if known.
    pub fn mac(&self, ip: IpAddr) -> Option<[u8; 6]> {
        match self.map.get(&ip)? {
            Entry::Known { mac, .. } => Some(*mac),
            Entry::Pending { .. } => None,
        }
    }

    /// Where `frame` for next hop `hop` goes: at once, or held until `hop` resolves.
    pub fn resolve(&mut self, hop: IpAddr, frame: Vec<u8>, now_ns: u64) -> (Resolution, Option<Vec<u8>>) {
        if let Some((ip, mac)) = self.last_known.filter(|&(ip, _)| ip == hop) {
            debug_assert_eq!(self.mac(ip), Some(mac));
            return (Resolution::Known(mac), Some(frame));
        }
        if let Some(mac) = self.mac(hop) {
            self.last_known = Some((hop, mac));
            return (Resolution::Known(mac), Some(frame));
        }
        self.make_room(hop);
        let entry =
            self.map.entry(hop).or_insert(Entry::Pending { frames: VecDeque::new(), asked_ns: 0, since_ns: now_ns });
        let Entry::Pending { frames, asked_ns, since_ns } = entry else {
            return (Resolution::Held { ask: false, dropped: 0 }, None);
        };
        let mut dropped = 0;
        if now_ns.saturating_sub(*since_ns) > RESOLVE_TIMEOUT_NS {
            // Nobody answered for a while: what waited is stale, start over.
            dropped = frames.len();
            frames.clear();
            *since_ns = now_ns;
            *asked_ns = 0;
        }
        if frames.len() >= MAX_PENDING_FRAMES {
            frames.pop_front();
            dropped += 1;
        }
        frames.push_back(frame);
        let ask = *asked_ns == 0 || now_ns.saturating_sub(*asked_ns) >= RESOLVE_RETRY_NS;
        if ask {
            *asked_ns = now_ns.max(1);
        }
        (Resolution::Held { ask, dropped }, None)
    }

    /// Learns that `ip` is at `mac`; returns the frames that waited for it, destination
    /// MAC still unset.
    pub fn learn(&mut self, ip: IpAddr, mac: [u8; 6], now_ns: u64) -> Vec<Vec<u8>> {
        self.last_known = None;
        self.make_room(ip);
        let old = self.map.insert(ip, Entry::Known { mac, seen_ns: now_ns });
        match old {
            Some(Entry::Pending { frames, .. }) => frames.into(),
            _ => Vec::new(),
        }
    }

    /// As [`Neighbours::learn`], but only for an address the table already holds (known,
    /// or asked for): an unsolicited advertisement creates nothing (RFC 4861 §7.2.5).
    pub fn update(&mut self, ip: IpAddr, mac: [u8; 6], now_ns: u64) -> Vec<Vec<u8>> {
        if self.map.contains_key(&ip) {
            self.learn(ip, mac, now_ns)
        } else {
            Vec::new()
        }
    }

    /// Forgets the entry heard from longest ago if the table is full and `ip` is new.
    fn make_room(&mut self, ip: IpAddr) {
        if self.map.len() < MAX_NEIGHBOURS || self.map.contains_key(&ip) {
            return;
        }
        if let Some(oldest) = self.map.iter().min_by_key(|(_, e)| e.stamp()).map(|(ip, _)| *ip) {
            self.map.remove(&oldest);
            self.last_known = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn frames_wait_for_the_answer_and_leave_with_it() {
        let mut n = Neighbours::default();
        let (r, f) = n.resolve(ip(1), vec![1], 10);
        assert_eq!((r, f), (Resolution::Held { ask: true, dropped: 0 }, None));
        // A second frame soon after does not ask again.
        assert_eq!(n.resolve(ip(1), vec![2], 20).0, Resolution::Held { ask: false, dropped: 0 });
        // After the retry interval it does.
        assert_eq!(n.resolve(ip(1), vec![3], 20 + RESOLVE_RETRY_NS).0, Resolution::Held { ask: true, dropped: 0 });
        assert_eq!(n.learn(ip(1), [2; 6], 30), vec![vec![1], vec![2], vec![3]]);
        assert_eq!(n.resolve(ip(1), vec![4], 40), (Resolution::Known([2; 6]), Some(vec![4])));
    }

    #[test]
    fn the_last_hop_remembered_follows_what_is_learnt_and_evicted() {
        let mut n = Neighbours::default();
        n.learn(ip(1), [1; 6], 1);
        assert_eq!(n.resolve(ip(1), vec![], 2).0, Resolution::Known([1; 6]));
        n.learn(ip(1), [7; 6], 3);
        assert_eq!(n.resolve(ip(1), vec![], 4).0, Resolution::Known([7; 6]), "a new MAC, not the one remembered");
        // Fill the table with newer entries until ip(1), the oldest, is evicted.
        for i in 2..=MAX_NEIGHBOURS as u32 + 1 {
            n.learn(ip(i), [2; 6], 10 + u64::from(i));
        }
        assert_eq!(n.mac(ip(1)), None, "evicted");
        assert!(matches!(n.resolve(ip(1), vec![], 5_000).0, Resolution::Held { .. }), "asked for again");
    }

    #[test]
    fn a_next_hop_holds_at_most_max_pending_frames() {
        let mut n = Neighbours::default();
        let mut dropped = 0;
        for i in 0..MAX_PENDING_FRAMES + 5 {
            if let (Resolution::Held { dropped: d, .. }, _) = n.resolve(ip(1), vec![i as u8], 1) {
                dropped += d;
            }
        }
        assert_eq!(dropped, 5);
        let released = n.learn(ip(1), [2; 6], 2);
        assert_eq!(released.len(), MAX_PENDING_FRAMES);
        assert_eq!(released[0], vec![5], "the oldest were dropped");
    }

    #[test]
    fn a_wait_past_the_timeout_is_dropped_and_asked_again() {
        let mut n = Neighbours::default();
        n.resolve(ip(1), vec![1], 1);
        let later = 2 + RESOLVE_TIMEOUT_NS;
        assert_eq!(n.resolve(ip(1), vec![2], later).0, Resolution::Held { ask: true, dropped: 1 });
        assert_eq!(n.learn(ip(1), [3; 6], later), vec![vec![2]]);
    }

    #[test]
    fn an_advertisement_updates_what_is_there_and_creates_nothing() {
        let mut n = Neighbours::default();
        assert!(n.update(ip(1), [1; 6], 1).is_empty());
        assert!(n.is_empty(), "unsolicited: nothing created");
        n.resolve(ip(2), vec![7], 1);
        assert_eq!(n.update(ip(2), [2; 6], 2), vec![vec![7]], "the frames that waited leave");
        n.update(ip(2), [3; 6], 3);
        assert_eq!(n.mac(ip(2)), Some([3; 6]));
    }

    #[test]
    fn the_table_holds_at_most_max_neighbours() {
        let mut n = Neighbours::default();
        for i in 0..(MAX_NEIGHBOURS as u32 + 100) {
            n.learn(ip(i), [1; 6], u64::from(i));
        }
        assert_eq!(n.len(), MAX_NEIGHBOURS);
        assert_eq!(n.mac(ip(0)), None, "the one heard from longest ago went first");
        assert_eq!(n.mac(ip(MAX_NEIGHBOURS as u32 + 99)), Some([1; 6]));
    }
}
