//! Which QPs the device must visit, so that no call visits every QP: the QPs that may have
//! something to send (the ready set, which `poll_transmit` serves round-robin), and each
//! QP's next deadline (ordered by time, so `poll_timeout` is the first and `handle_timeout`
//! walks only what is due).
//!
//! The device touches a QP after every operation on it (a packet, a post, a modify, a
//! timer, a turn at sending): the QP goes into the ready set and its deadline is filed
//! again. A QP leaves the ready set when a turn finds it with nothing to send; only an
//! operation on it can give it something again.

use std::collections::{BTreeSet, HashMap};

/// The ready set and the deadline index of one device.
#[derive(Debug, Default)]
pub struct Schedule {
    ready: BTreeSet<u32>,
    by_time: BTreeSet<(u64, u32)>,
    deadline_of: HashMap<u32, u64>,
}

impl Schedule {
    /// QP `qpn` was operated on: it may have something to send, and its next deadline is
    /// `deadline`.
    pub fn touch(&mut self, qpn: u32, deadline: Option<u64>) {
        self.ready.insert(qpn);
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

    /// A turn found QP `qpn` with nothing to send.
    pub fn idle(&mut self, qpn: u32) {
        self.ready.remove(&qpn);
    }

    /// QP `qpn` is gone.
    pub fn remove(&mut self, qpn: u32) {
        self.idle(qpn);
        self.unfile(qpn);
    }

    /// At most `limit` ready QPs in round-robin order, starting after `cursor`, into `out`
    /// (a fill that stops after a few dozen packets need not list a thousand QPs).
    pub fn ready_from(&self, cursor: u32, out: &mut Vec<u32>, limit: usize) {
        out.clear();
        let after = self.ready.range(cursor.saturating_add(1)..);
        out.extend(after.chain(self.ready.range(..=cursor)).take(limit));
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
        self.ready.len()
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
    fn the_ready_set_is_served_round_robin_from_the_cursor() {
        let mut s = Schedule::default();
        for q in [5, 1, 9, 3] {
            s.touch(q, None);
        }
        let mut order = Vec::new();
        s.ready_from(3, &mut order, usize::MAX);
        assert_eq!(order, [5, 9, 1, 3]);
        s.ready_from(3, &mut order, 3);
        assert_eq!(order, [5, 9, 1], "at most the limit, in the same order");
        s.idle(9);
        s.ready_from(u32::MAX, &mut order, usize::MAX);
        assert_eq!(order, [1, 3, 5]);
        assert_eq!(s.ready_len(), 3);
    }
}
