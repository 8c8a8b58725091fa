//! Completion queues (IBTA 11.4.2) with solicited/unsolicited notification (11.4.2.2).

use super::verbs::{Wc, WcOpcode};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// What a requested notification waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notify {
    /// The next completion.
    Any,
    /// The next solicited receive completion (or any error completion).
    Solicited,
}

/// A completion queue.
#[derive(Debug)]
pub struct Cq {
    entries: VecDeque<Wc>,
    capacity: usize,
    overflowed: bool,
    armed: Option<Notify>,
    event: bool,
    /// Listed in its table's touched CQs.
    touched: bool,
}

impl Cq {
    /// A queue of `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Cq { entries: VecDeque::new(), capacity, overflowed: false, armed: None, event: false, touched: false }
    }
    /// Adds a completion; on overflow the completion is lost and the CQ is in error
    /// (IBTA 11.4.2.1 "CQ overrun").
    pub fn push(&mut self, wc: Wc) {
        if self.entries.len() >= self.capacity {
            self.overflowed = true;
            return;
        }
        let fires = match self.armed {
            Some(Notify::Any) => true,
            Some(Notify::Solicited) => {
                wc.status != super::verbs::WcStatus::Success
                    || (wc.solicited && matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm))
            }
            None => false,
        };
        if fires {
            self.armed = None;
            self.event = true;
        }
        self.entries.push_back(wc);
    }
    /// Holds up to `capacity` from now on; refused while it holds more (IBTA 11.2.7.3).
    pub fn resize(&mut self, capacity: usize) -> Result<(), super::verbs::VerbsError> {
        if self.entries.len() > capacity || capacity == 0 {
            return Err(super::verbs::VerbsError::InvalidRequest);
        }
        self.capacity = capacity;
        Ok(())
    }
    /// Takes up to `max` completions.
    pub fn poll(&mut self, max: usize) -> Vec<Wc> {
        let mut out = Vec::new();
        self.poll_into(max, &mut out);
        out
    }
    /// As [`Cq::poll`], appending to `out` (a buffer the caller reuses).
    pub fn poll_into(&mut self, max: usize, out: &mut Vec<Wc>) {
        let n = max.min(self.entries.len());
        out.extend(self.entries.drain(..n));
    }
    /// Arms a one-shot notification.
    pub fn req_notify(&mut self, what: Notify) {
        self.armed = Some(what);
    }
    /// Takes a pending notification event.
    pub fn take_event(&mut self) -> bool {
        std::mem::take(&mut self.event)
    }
    /// True once a completion was lost to overflow.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }
    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// True when no completion waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The device's CQs, and the ones that gained a completion since the driver last asked:
/// handing completions out visits those, not every CQ (a thousand QPs, each with its CQ,
/// would otherwise cost a thousand looks per received batch).
#[derive(Debug, Default)]
pub struct CqTable {
    cqs: FxHashMap<u32, Cq>,
    touched: Vec<u32>,
}

impl CqTable {
    /// Adds CQ `id`.
    pub fn insert(&mut self, id: u32, cq: Cq) {
        self.cqs.insert(id, cq);
    }
    /// Removes CQ `id`.
    pub fn remove(&mut self, id: u32) -> Option<Cq> {
        self.cqs.remove(&id)
    }
    /// CQ `id`.
    pub fn get(&self, id: u32) -> Option<&Cq> {
        self.cqs.get(&id)
    }
    /// CQ `id`, to change.
    pub fn get_mut(&mut self, id: u32) -> Option<&mut Cq> {
        self.cqs.get_mut(&id)
    }
    /// True if CQ `id` exists.
    pub fn contains(&self, id: u32) -> bool {
        self.cqs.contains_key(&id)
    }
    /// Adds a completion to CQ `id` and notes the CQ as touched; false if there is no
    /// such CQ.
    pub fn push(&mut self, id: u32, wc: Wc) -> bool {
        let Some(cq) = self.cqs.get_mut(&id) else { return false };
        cq.push(wc);
        if !std::mem::replace(&mut cq.touched, true) {
            self.touched.push(id);
        }
        true
    }
    /// The CQs that gained completions since the last call, each once, in `out` (which
    /// is cleared first; its buffer and this table's are swapped, so neither allocates).
    pub fn take_touched_into(&mut self, out: &mut Vec<u32>) {
        out.clear();
        std::mem::swap(&mut self.touched, out);
        for id in out.iter() {
            if let Some(cq) = self.cqs.get_mut(id) {
                cq.touched = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::verbs::WcStatus;

    /// The touched CQs, taken into a buffer that held something (it must be cleared).
    fn touched(t: &mut CqTable) -> Vec<u32> {
        let mut ids = vec![99];
        t.take_touched_into(&mut ids);
        ids
    }

    fn wc(opcode: WcOpcode, solicited: bool, status: WcStatus) -> Wc {
        Wc { solicited, ..Wc::new(1, status, opcode, 16, 0) }
    }

    // IBTA 11.4.2.2: a solicited-only notification ignores unsolicited successes.
    #[test]
    fn solicited_notification() {
        let mut cq = Cq::new(8);
        cq.req_notify(Notify::Solicited);
        cq.push(wc(WcOpcode::Recv, false, WcStatus::Success));
        cq.push(wc(WcOpcode::Send, true, WcStatus::Success));
        assert!(!cq.take_event());
        cq.push(wc(WcOpcode::Recv, true, WcStatus::Success));
        assert!(cq.take_event());
        cq.push(wc(WcOpcode::Recv, true, WcStatus::Success));
        assert!(!cq.take_event(), "one-shot");
        cq.req_notify(Notify::Any);
        cq.push(wc(WcOpcode::Send, false, WcStatus::Success));
        assert!(cq.take_event());
    }

    #[test]
    fn overflow_is_flagged() {
        let mut cq = Cq::new(1);
        cq.push(wc(WcOpcode::Send, false, WcStatus::Success));
        cq.push(wc(WcOpcode::Send, false, WcStatus::Success));
        assert!(cq.overflowed());
        assert_eq!(cq.poll(10).len(), 1);
    }

    #[test]
    fn only_cqs_that_gained_completions_are_listed_each_once() {
        let mut t = CqTable::default();
        for id in 1..=1000 {
            t.insert(id, Cq::new(4));
        }
        assert!(t.push(7, wc(WcOpcode::Send, false, WcStatus::Success)));
        assert!(t.push(900, wc(WcOpcode::Recv, false, WcStatus::Success)));
        assert!(t.push(7, wc(WcOpcode::Send, false, WcStatus::Success)));
        assert!(!t.push(5000, wc(WcOpcode::Send, false, WcStatus::Success)), "no such CQ");
        assert_eq!(touched(&mut t), vec![7, 900]);
        assert!(touched(&mut t).is_empty(), "listed once, until it gains another");
        t.push(7, wc(WcOpcode::Send, false, WcStatus::Success));
        t.remove(7);
        assert_eq!(touched(&mut t), vec![7], "a CQ destroyed meanwhile is the caller's to skip");
        assert_eq!(t.get(900).map(Cq::len), Some(1));
    }
}
