//! The responder's queue of replies, in PSN order, with the count of READ responses and
//! atomic ACKs in it (the responder resources in use, IBTA 9.7.5.1.3) kept as it changes,
//! so that checking a READ or atomic against IRD does not walk the queue.

use super::super::mem::SharedMem;
use crate::proto::roce::ext::Syndrome;
use crate::proto::roce::Psn;
use std::collections::VecDeque;
use std::sync::Arc;

/// Something to send, in PSN order.
#[derive(Debug)]
pub(super) enum Reply {
    Ack,
    Nak(Psn, Syndrome),
    AtomicAck { psn: Psn, original: u64 },
    Read(ReadJob),
}

impl Reply {
    fn holds_resource(&self) -> bool {
        matches!(self, Reply::Read(_) | Reply::AtomicAck { .. })
    }
}

/// A READ response still going out.
#[derive(Debug)]
pub(super) struct ReadJob {
    pub psn: Psn,
    pub mem: Arc<SharedMem>,
    pub offset: usize,
    pub remaining: usize,
    pub first: bool,
}

/// The replies, and how many of them are READ responses or atomic ACKs.
#[derive(Debug, Default)]
pub(super) struct ReplyQueue {
    queue: VecDeque<Reply>,
    resources: usize,
}

impl ReplyQueue {
    pub fn push_back(&mut self, r: Reply) {
        self.resources += usize::from(r.holds_resource());
        self.queue.push_back(r);
    }

    pub fn pop_front(&mut self) {
        if let Some(r) = self.queue.pop_front() {
            self.resources -= usize::from(r.holds_resource());
        }
    }

    pub fn front_mut(&mut self) -> Option<&mut Reply> {
        self.queue.front_mut()
    }

    pub fn back(&self) -> Option<&Reply> {
        self.queue.back()
    }

    pub fn retain(&mut self, keep: impl FnMut(&Reply) -> bool) {
        self.queue.retain(keep);
        self.resources = self.queue.iter().filter(|r| r.holds_resource()).count();
    }

    pub fn clear(&mut self) {
        self.queue.clear();
        self.resources = 0;
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Reply> {
        self.queue.iter()
    }

    /// READ responses and atomic ACKs queued: the responder resources in use.
    pub fn resources_in_use(&self) -> usize {
        self.resources
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reads_and_atomic_acks_through_every_change() {
        let mut q = ReplyQueue::default();
        q.push_back(Reply::Ack);
        q.push_back(Reply::AtomicAck { psn: Psn::new(1), original: 0 });
        q.push_back(Reply::Nak(Psn::new(2), Syndrome::Ack { credits: 0 }));
        q.push_back(Reply::AtomicAck { psn: Psn::new(3), original: 0 });
        assert_eq!(q.resources_in_use(), 2);
        q.pop_front();
        assert_eq!(q.resources_in_use(), 2, "an ACK leaving frees nothing");
        q.pop_front();
        assert_eq!(q.resources_in_use(), 1);
        q.retain(|r| !matches!(r, Reply::AtomicAck { .. }));
        assert_eq!((q.resources_in_use(), q.len()), (0, 1));
        q.push_back(Reply::AtomicAck { psn: Psn::new(4), original: 0 });
        q.clear();
        assert_eq!((q.resources_in_use(), q.len()), (0, 0));
    }
}
