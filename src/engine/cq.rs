//! Completion queues (IBTA 11.4.2) with solicited/unsolicited notification (11.4.2.2).

use super::verbs::{Wc, WcOpcode};
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
}

impl Cq {
    /// A queue of `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Cq { entries: VecDeque::new(), capacity, overflowed: false, armed: None, event: false }
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
        let n = max.min(self.entries.len());
        self.entries.drain(..n).collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::verbs::WcStatus;

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
}
