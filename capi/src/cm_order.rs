//! The order in which one process's `rdma_connect` calls reach the wire.
//!
//! rdma_connect returns at once and the connection is made on a thread of its own, so two
//! calls in a row would race to send their requests. Applications count on the kernel's
//! order: perftest's server numbers its QPs by the order of CONNECT_REQUEST events, its
//! client by the order of its calls, and then sends each QP's buffer addresses by that
//! number (iWARP Sends with `-q 2` write their credits into the other QP's slot and stall
//! when the order flips). Each call takes a ticket; its thread sends its request only once
//! the call before has sent its own, or [`TURN_WAIT_MAX`] has passed (a peer that does not
//! answer the one before holds the next back no longer than that).

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest a connect waits for the one made before it to send its request.
pub const TURN_WAIT_MAX: Duration = Duration::from_millis(200);

struct Turns {
    /// The next ticket to hand out.
    next: u64,
    /// Every ticket below this one has sent its request (or given up).
    sent_below: u64,
}

static TURNS: Mutex<Turns> = Mutex::new(Turns { next: 0, sent_below: 0 });
static TURN_CHANGED: Condvar = Condvar::new();

/// One connect's place in line; sending is marked when it drops, if not before.
pub struct Ticket {
    number: u64,
    sent: bool,
}

impl Ticket {
    /// The next place in line (taken on the caller's thread, so in call order).
    pub fn take() -> Ticket {
        let mut t = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        let number = t.next;
        t.next += 1;
        Ticket { number, sent: false }
    }

    /// Waits until every connect before this one has sent its request, at most `max`.
    pub fn wait_turn(&self, max: Duration) {
        let deadline = Instant::now() + max;
        let mut t = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        while t.sent_below < self.number {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            t = TURN_CHANGED.wait_timeout(t, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// This connect's request is out (or it failed before sending one): the next may go.
    pub fn sent(&mut self) {
        if std::mem::replace(&mut self.sent, true) {
            return;
        }
        let mut t = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        t.sent_below = t.sent_below.max(self.number + 1);
        drop(t);
        TURN_CHANGED.notify_all();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.sent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn connects_send_in_the_order_they_were_made() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let tickets: Vec<Ticket> = (0..8).map(|_| Ticket::take()).collect();
        let first = tickets[0].number;
        let threads: Vec<_> = tickets
            .into_iter()
            .rev()
            .map(|mut ticket| {
                let order = order.clone();
                std::thread::spawn(move || {
                    ticket.wait_turn(Duration::from_secs(10));
                    order.lock().unwrap().push(ticket.number - first);
                    ticket.sent();
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<u64>>());
    }

    #[test]
    fn a_connect_that_never_sends_holds_the_next_back_only_so_long() {
        let stuck = Ticket::take();
        let next = Ticket::take();
        let start = Instant::now();
        next.wait_turn(Duration::from_millis(50));
        assert!(start.elapsed() >= Duration::from_millis(50));
        drop(stuck);
        let start = Instant::now();
        next.wait_turn(Duration::from_secs(10));
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
