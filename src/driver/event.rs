//! Asynchronous events on their way from the engine to the application: queued for
//! [`EventQueue::poll`], or handed to a handler (a C context's event file descriptor).

use crate::engine::event::{AsyncEvent, ASYNC_EVENTS_MAX};
use std::collections::VecDeque;
use std::sync::Mutex;

/// A handler of asynchronous events.
pub type EventHandler = Box<dyn Fn(AsyncEvent) + Send + Sync>;

/// A handler of QPs entering ERR (their QPN).
pub type QpErrorHandler = Box<dyn Fn(u32) + Send + Sync>;

/// The events of one device.
#[derive(Default)]
pub struct EventQueue {
    /// The events nobody took yet and the handler, under one lock so that an event is
    /// either queued or handed to the handler, never lost between the two.
    inner: Mutex<(VecDeque<AsyncEvent>, Option<EventHandler>)>,
    /// Who is told of QPs entering ERR; nobody keeps them when none is set.
    qp_errors: Mutex<Option<QpErrorHandler>>,
}

impl EventQueue {
    /// Hands `e` to the handler, or queues it (at most [`ASYNC_EVENTS_MAX`], as the engine).
    pub fn deliver(&self, e: AsyncEvent) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match &inner.1 {
            Some(h) => h(e),
            None if inner.0.len() < ASYNC_EVENTS_MAX => inner.0.push_back(e),
            None => {}
        }
    }

    /// The oldest queued event.
    pub fn poll(&self) -> Option<AsyncEvent> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0.pop_front()
    }

    /// The QPs in `qpns` entered ERR: tells the handler, if any. Called with the device
    /// locked, so the handler must not call into the device.
    pub fn qps_errored(&self, qpns: Vec<u32>) {
        if qpns.is_empty() {
            return;
        }
        if let Some(h) = &*self.qp_errors.lock().unwrap_or_else(|e| e.into_inner()) {
            qpns.into_iter().for_each(h);
        }
    }

    /// Tells `f` of every QP entering ERR from now on; false if a handler is set.
    pub fn set_qp_error_handler(&self, f: QpErrorHandler) -> bool {
        let mut h = self.qp_errors.lock().unwrap_or_else(|e| e.into_inner());
        if h.is_some() {
            return false;
        }
        *h = Some(f);
        true
    }

    /// Sends every later event, and those queued now, to `f`; false if a handler is set.
    pub fn set_handler(&self, f: EventHandler) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.1.is_some() {
            return false;
        }
        for e in inner.0.drain(..) {
            f(e);
        }
        inner.1 = Some(f);
        true
    }
}
