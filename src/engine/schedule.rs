//! Which QPs the device must visit, so that no call visits every QP: the QPs that may have
//! something to send (the ready set, which `poll_transmit` serves round-robin), and each
//! QP's next deadline (ordered by time, so `poll_timeout` is the first and `handle_timeout`
//! walks only what is due).
//!
//! The device touches a QP after every operation on it (a packet, a post, a modify, a
//! timer, a turn at sending): the QP goes into the ready set and its deadline is filed
//! again. A QP leaves the ready set after a turn that sent less than a burst (it ran out
//! of things to send, or waits for an ACK, a timer or its pacer); only an operation on it
//! can give it something again. The ready set is a line: a QP joins at
//! the back, takes its turn at the front, and goes to the back again if it sent, so that
//! touching one costs a hash lookup however many QPs the device has (an ordered set's
//! search was the largest per-QP cost with a thousand QPs).

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeSet, VecDeque};

/// The ready set and the deadline index of one device.
#[derive(Debug, Default)]
pub struct Schedule {
    /// The ready QPs in the order they are served; each once, except a QP taken out
    /// for its turn ([`Schedule::take_ready`]), which is in `is_ready` only.
    line: VecDeque<u32>,
    is_ready: FxHashSet<u32>,
    by_time: BTreeSet<(u64, u32)>,
    deadline_of: FxHashMap<u32, u64>,
}

impl Schedule {
    /// QP `qpn` was operated on: it may have something to send, and its next deadline is
    /// `deadline`.
    pub fn touch(&mut self, qpn: u32, deadline: Option<u64>) {
        if self.is_ready.insert(qpn) {
            self.line.push_back(qpn);
        }
        self.file(qpn, deadline);
    }

    /// Files QP `qpn`'s next deadline. One earlier than the filed one replaces it; a later
    /// one, or none, leaves the earlier one filed: when it comes, the device's timer check
    /// finds nothing due (each timer checks its own time) and files the QP's real deadline
    /// ([`Schedule::unfile`], then this). An ACK that restarts the retransmission timer then
    /// costs a comparison rather than two tree updates.
    pub fn file(&mut self, qpn: u32, deadline: Option<u64>) {
        let filed = self.deadline_of.get(&qpn).copied();
        if filed.is_some_and(|old| deadline.is_none_or(|d| d >= old)) {
            return;
        }
        self.unfile(qpn);
        if let Some(d) = deadline {
            self.by_time.insert((d, qpn));
            self.deadline_of.insert(qpn, d);
        }
    }

    /// Forgets QP `qpn`'s filed deadline (it came, or the QP is gone).
    pub fn unfile(&mut self, qpn: u32) {
        if let Some(old) = self.deadline_of.remove(&qpn) {
            self.by_time.remove(&(old, qpn));
        }
    }

    /// A turn found QP `qpn` (taken for it) with nothing to send.
    pub fn idle(&mut self, qpn: u32) {
        self.is_ready.remove(&qpn);
    }

    /// QP `qpn` (taken for its turn) sent: it goes to the back of the line.
    pub fn requeue(&mut self, qpn: u32) {
        self.line.push_back(qpn);
    }

    /// QP `qpn` is gone.
    pub fn remove(&mut self, qpn: u32) {
        if self.is_ready.remove(&qpn) {
            self.line.retain(|&q| q != qpn);
        }
        self.unfile(qpn);
    }

    /// Takes at most `limit` QPs from the front of the line for their turns, into `out`
    /// (a fill that stops after a few dozen packets need not list a thousand QPs). Each
    /// goes back with [`Schedule::requeue`], [`Schedule::idle`] or
    /// [`Schedule::put_back`].
    pub fn take_ready(&mut self, out: &mut Vec<u32>, limit: usize) {
        out.clear();
        let n = limit.min(self.line.len());
        out.extend(self.line.drain(..n));
    }

    /// QPs taken that had no turn after all: back to the front, in their order.
    pub fn put_back(&mut self, qpns: &[u32]) {
        for &q in qpns.iter().rev() {
            self.line.push_front(q);
        }
    }

    /// The earliest deadline filed.
    pub fn first_deadline(&self) -> Option<u64> {
        self.by_time.first().map(|&(d, _)| d)
    }

    /// The QPs whose deadline is at or before `now`, earliest first, into `out`.
    pub fn due(&self, now: u64, out: &mut Vec<u32>) {
        out.clear();
        out.extend(self.by_time.range(..=(now, u32::MAX)).map(|&(_, q)| q));
    }

    /// QPs in the ready set (for tests and reports).
    pub fn ready_len(&self) -> usize {
        self.is_ready.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_are_filed_once_and_walked_in_time_order() {
        let mut s = Schedule::default();
        s.touch(7, Some(300));
        s.touch(3, Some(100));
        s.touch(7, Some(50)); // refiled earlier: the old entry goes
        s.touch(9, None);
        assert_eq!(s.first_deadline(), Some(50));
        let mut due = Vec::new();
        s.due(100, &mut due);
        assert_eq!(due, [7, 3]);
        s.remove(7);
        s.due(1000, &mut due);
        assert_eq!(due, [3]);
    }

    #[test]
    fn a_later_deadline_waits_for_the_earlier_one_to_come() {
        let mut s = Schedule::default();
        s.touch(4, Some(100));
        s.touch(4, Some(400)); // an ACK restarted the timer
        s.touch(4, None); // and then nothing is outstanding
        assert_eq!(s.first_deadline(), Some(100), "the earlier one stays filed");
        // At 100 the device finds nothing due and files what the QP says now.
        s.unfile(4);
        s.touch(4, Some(400));
        assert_eq!(s.first_deadline(), Some(400));
        s.unfile(4);
        s.touch(4, None);
        assert_eq!(s.first_deadline(), None);
    }

    #[test]
    fn the_ready_set_is_served_round_robin() {
        let mut s = Schedule::default();
        for q in [5, 1, 9, 3, 5] {
            s.touch(q, None);
        }
        let mut order = Vec::new();
        s.take_ready(&mut order, 3);
        assert_eq!(order, [5, 1, 9], "in the order they became ready, once each, at most the limit");
        s.touch(1, None); // operated on during its turn: still one place in the line
        s.requeue(5);
        s.idle(1);
        s.put_back(&[9]);
        s.take_ready(&mut order, usize::MAX);
        assert_eq!(order, [9, 3, 5], "9 had no turn; 5 sent and went to the back; 1 left");
        assert_eq!(s.ready_len(), 3);
        for q in [9, 3, 5] {
            s.requeue(q);
        }
        s.remove(3);
        s.take_ready(&mut order, usize::MAX);
        assert_eq!(order, [9, 5]);
        assert_eq!(s.ready_len(), 2);
    }
}
