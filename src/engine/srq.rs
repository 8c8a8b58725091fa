//! Shared receive queues (IBTA 10.2.9) with the limit event (IBTA 11.6.3.3: "SRQ limit
//! reached", raised once when the queue falls below its armed limit).

use super::qp::responder::RecvWqe;
use super::verbs::{RecvWr, VerbsError};
use std::collections::VecDeque;

pub use super::event::AsyncEvent;

/// A shared receive queue.
#[derive(Debug)]
pub struct Srq {
    wqes: VecDeque<RecvWqe>,
    max_wr: usize,
    max_sge: usize,
    limit: Option<usize>,
    /// An XRC SRQ's domain, PD and CQ ([`XrcSrq`]); `None` for a basic SRQ.
    pub xrc: Option<XrcSrq>,
    /// A tag-matching SRQ's tagged buffers (`IBV_SRQT_TM`); `None` for the others.
    pub tm: Option<super::tm::TagList>,
}

/// What an XRC SRQ is bound to (IBTA vol.1 14.2): requests that name it come through any
/// XRC target QP of its domain, are checked in its PD, and complete on its CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XrcSrq {
    /// The XRC domain.
    pub xrcd: u32,
    /// Memory of the requests it receives is checked in this PD.
    pub pd: crate::engine::mem::Pd,
    /// Receive completions go to this CQ.
    pub cq: u32,
}

impl Srq {
    /// An SRQ holding at most `max_wr` requests of at most `max_sge` SGEs.
    pub fn new(max_wr: usize, max_sge: usize) -> Self {
        Srq { wqes: VecDeque::new(), max_wr, max_sge, limit: None, xrc: None, tm: None }
    }
    /// Adds a receive request.
    pub fn post(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        if self.wqes.len() >= self.max_wr {
            return Err(VerbsError::QueueFull);
        }
        if wr.sgl.len() > self.max_sge {
            return Err(VerbsError::InvalidRequest);
        }
        self.wqes.push_back(RecvWqe::new(wr));
        Ok(())
    }
    /// Arms the limit event: raised once when fewer than `limit` requests remain.
    pub fn arm(&mut self, limit: usize) {
        self.limit = Some(limit);
    }
    /// True when a request is waiting.
    pub fn has_wqe(&self) -> bool {
        !self.wqes.is_empty()
    }
    /// Takes the next request; returns the limit event if this crossed the armed limit.
    pub fn take(&mut self) -> (Option<RecvWqe>, bool) {
        let w = self.wqes.pop_front();
        let fired = self.limit.is_some_and(|l| self.wqes.len() < l);
        if fired {
            self.limit = None;
        }
        (w, fired)
    }
    /// Puts back a request a UC message abandoned.
    pub fn give_back(&mut self, w: RecvWqe) {
        self.wqes.push_front(w);
    }
    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.wqes.len()
    }
    /// True when none wait.
    pub fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }
}
