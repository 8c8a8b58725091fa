//! A CQ's completions once they left the engine: the queue the application polls, with its
//! own lock, so polling never waits for a device lock.

use crate::engine::verbs::Wc;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The device clock: nanoseconds since this process first read it, monotonic, as an
/// HCA's free-running clock is (`hca_core_clock` 1 GHz, `ibv_query_rt_values_ex`).
/// Completions are stamped with it as they reach their CQ.
pub fn clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Most entries a CQ may be created with (`ibv_device_attr.max_cqe`); a larger request
/// gets this many.
pub const MAX_CQE: usize = 1 << 22;

/// A CQ's completions, once they left the engine, at most `capacity` of them.
pub struct CqQueue {
    /// Each completion with the device clock's time it arrived ([`clock_ns`]), or 0 when
    /// nobody asked for timestamps ([`CqQueue::stamp_completions`]).
    entries: Mutex<VecDeque<(Wc, u64)>>,
    /// Completions are stamped: reading the clock per delivery is a system call on some
    /// guests' clock sources, so only CQs that want the time pay for it.
    stamped: AtomicBool,
    ready: Condvar,
    /// Threads in [`CqQueue::wait`]: a delivery wakes them only if there are any, because a
    /// condition variable's wake-up is a system call even with nobody to wake.
    waiters: AtomicUsize,
    capacity: AtomicUsize,
    /// A completion found the queue full (IBTA 11.4.2.1 "CQ overrun"): the CQ is in error.
    overrun: AtomicBool,
    /// Armed for one completion event (`ibv_req_notify_cq`, IBTA 11.4.2.2).
    armed: AtomicBool,
    /// Where a completion event goes (a completion channel).
    on_event: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl CqQueue {
    /// An empty queue for `capacity` completions (clamped to 1..=[`MAX_CQE`]).
    pub fn new(capacity: usize) -> Self {
        CqQueue {
            entries: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            waiters: AtomicUsize::new(0),
            capacity: AtomicUsize::new(capacity.clamp(1, MAX_CQE)),
            overrun: AtomicBool::new(false),
            armed: AtomicBool::new(false),
            on_event: OnceLock::new(),
            stamped: AtomicBool::new(false),
        }
    }

    /// From now on, each completion carries the time it arrived ([`CqQueue::poll_stamped`]).
    pub fn stamp_completions(&self) {
        self.stamped.store(true, Ordering::Release);
    }

    /// Sets where completion events go; false if already set.
    pub fn set_event_handler(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        self.on_event.set(f).is_ok()
    }

    /// Arms the CQ: the next completion added raises one event. (Solicited-only requests
    /// arm the same way: an event for any completion is a superset, which applications
    /// handle by polling.)
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    /// The most completions it holds.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Acquire)
    }

    /// Holds up to `capacity` (clamped to [`MAX_CQE`]) from now on; false (unchanged)
    /// while it holds more than that.
    pub fn resize(&self, capacity: usize) -> bool {
        let q = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let capacity = capacity.min(MAX_CQE);
        if q.len() > capacity || capacity == 0 {
            return false;
        }
        self.capacity.store(capacity, Ordering::Release);
        true
    }

    /// True once a completion was lost to a full queue.
    pub fn overrun(&self) -> bool {
        self.overrun.load(Ordering::Acquire)
    }

    /// Marks the CQ overrun (the engine's own queue overflowed).
    pub fn set_overrun(&self) {
        self.overrun.store(true, Ordering::Release);
    }

    /// Queues completions up to the capacity; what does not fit is lost and the CQ is
    /// marked overrun, as a NIC's CQ is (the application sized it too small). `wcs` is
    /// left empty with its buffer, for the caller's next batch.
    pub fn deliver(&self, wcs: &mut Vec<Wc>) {
        if wcs.is_empty() {
            return;
        }
        let mut q = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.capacity().saturating_sub(q.len());
        if wcs.len() > room {
            self.set_overrun();
        }
        let now = if self.stamped.load(Ordering::Acquire) { clock_ns() } else { 0 };
        q.extend(wcs.drain(..).take(room).map(|w| (w, now)));
        // A waiter registers under the queue's lock before it looks, so one that found the
        // queue empty is counted by now.
        let waiting = self.waiters.load(Ordering::Acquire) > 0;
        drop(q);
        if waiting {
            self.ready.notify_all();
        }
        if self.armed.swap(false, Ordering::AcqRel) {
            if let Some(f) = self.on_event.get() {
                f();
            }
        }
    }

    /// Removes the completions of QP `qpn` not yet polled (a QP reset: mlx5's providers
    /// clean them too, and IBTA 10.3.1 leaves it to the device).
    pub fn remove_qp(&self, qpn: u32) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).retain(|(wc, _)| wc.qpn != qpn);
    }

    /// The oldest completion, if any, without waiting (and without a vector to hold it).
    pub fn poll_one(&self) -> Option<Wc> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).pop_front().map(|(w, _)| w)
    }

    /// Up to `max` completions, without waiting.
    pub fn poll(&self, max: usize) -> Vec<Wc> {
        let mut q = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let n = max.min(q.len());
        q.drain(..n).map(|(w, _)| w).collect()
    }

    /// As [`CqQueue::poll`], each completion with the time it reached the CQ
    /// ([`clock_ns`]): the completion timestamp of `ibv_wc_read_completion_ts`.
    pub fn poll_stamped(&self, max: usize) -> Vec<(Wc, u64)> {
        let mut q = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    /// One completion, waiting at most `timeout` for it.
    pub fn wait(&self, timeout: Duration) -> Option<Wc> {
        let deadline = Instant::now() + timeout;
        let mut q = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let got = loop {
            if let Some((wc, _)) = q.pop_front() {
                break Some(wc);
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { break None };
            q = self.ready.wait_timeout(q, left).unwrap_or_else(|e| e.into_inner()).0;
        };
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        got
    }
}
