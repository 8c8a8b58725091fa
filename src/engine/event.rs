//! Asynchronous events (IBTA 11.6.3): what the device tells the application outside any
//! completion, queued up to [`ASYNC_EVENTS_MAX`].

use std::collections::VecDeque;

/// Most events held for the application; later ones are dropped and counted. Each QP
/// raises at most two (its error, then "last WQE reached") and each SRQ one per arming,
/// so only an application that never reads them reaches this.
pub const ASYNC_EVENTS_MAX: usize = 4096;

/// An asynchronous event (IBTA 11.6.3.1 affiliated, 11.6.3.3 SRQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// An SRQ fell below its armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached(u32),
    /// The responder refused an invalid request and the QP went to ERR ("Invalid Request
    /// Local Work Queue Error", `IBV_EVENT_QP_REQ_ERR`).
    QpRequestError(u32),
    /// The responder refused a request outside the QP's rights and went to ERR ("Local
    /// Access Violation Work Queue Error", `IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError(u32),
    /// The QP went to ERR for an error no completion reports, such as a Terminate sent or
    /// received on iWARP ("Local Work Queue Catastrophic Error", `IBV_EVENT_QP_FATAL`).
    QpFatal(u32),
    /// A QP on an SRQ went to ERR: no receive completes on it after those already
    /// queued (IBTA 10.2.9.5, `IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached(u32),
}

/// The device's event queue.
#[derive(Debug, Default)]
pub struct AsyncEvents {
    queue: VecDeque<AsyncEvent>,
    /// Events dropped because [`ASYNC_EVENTS_MAX`] were waiting.
    pub dropped: u64,
    /// QPs that entered ERR since the driver last looked ([`AsyncEvents::take_errored`]):
    /// no IBTA event, but what rdma_cm reports as DISCONNECTED.
    errored: Vec<u32>,
}

impl AsyncEvents {
    /// Queues `e`, or drops and counts it when the queue is full.
    pub fn raise(&mut self, e: AsyncEvent) {
        if self.queue.len() >= ASYNC_EVENTS_MAX {
            self.dropped += 1;
            return;
        }
        self.queue.push_back(e);
    }

    /// The oldest event.
    pub fn pop(&mut self) -> Option<AsyncEvent> {
        self.queue.pop_front()
    }

    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// QP `qpn` entered ERR. Held for the driver up to [`ASYNC_EVENTS_MAX`] (a driver takes
    /// them after every call; a device driven without one keeps the first).
    pub fn note_qp_error(&mut self, qpn: u32) {
        if self.errored.len() < ASYNC_EVENTS_MAX {
            self.errored.push(qpn);
        }
    }

    /// The QPs that entered ERR since the last call, in order.
    pub fn take_errored(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.errored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_holds_its_limit_and_counts_what_it_drops() {
        let mut q = AsyncEvents::default();
        for n in 0..ASYNC_EVENTS_MAX as u32 + 10 {
            q.raise(AsyncEvent::QpFatal(n));
        }
        assert_eq!(q.dropped, 10);
        let kept: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(kept.len(), ASYNC_EVENTS_MAX);
        assert_eq!(kept[0], AsyncEvent::QpFatal(0), "the oldest are kept");
        assert_eq!(kept[ASYNC_EVENTS_MAX - 1], AsyncEvent::QpFatal(ASYNC_EVENTS_MAX as u32 - 1));
    }
}
