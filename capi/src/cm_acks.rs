//! The events `rdma_get_cm_event` handed out and `rdma_ack_cm_event` has not yet taken
//! back, by the id they belong to (a connection request's listener, else the event's id).
//! `rdma_destroy_id` waits until an id has none left, as librdmacm's does: an application
//! whose event thread is still handling an id's last event (rping's DISCONNECTED) finishes
//! with it before the id, and then the channel, go; destroying an id before acknowledging
//! its events blocks, as it does on rdma-core.

use crate::ffi;
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};

static OUTSTANDING: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
static ACKED: Condvar = Condvar::new();

fn outstanding() -> MutexGuard<'static, BTreeMap<usize, usize>> {
    OUTSTANDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// The id event `ev` counts against.
pub(crate) fn owner(ev: &ffi::rdma_cm_event) -> usize {
    if ev.listen_id.is_null() {
        ev.id as usize
    } else {
        ev.listen_id as usize
    }
}

/// An event of `owner` was handed to the application.
pub(crate) fn handed_out(owner: usize) {
    *outstanding().entry(owner).or_default() += 1;
}

/// The application acknowledged an event of `owner`.
pub(crate) fn acked(owner: usize) {
    let mut out = outstanding();
    if let Some(n) = out.get_mut(&owner) {
        *n -= 1;
        if *n == 0 {
            out.remove(&owner);
            ACKED.notify_all();
        }
    }
}

/// Blocks until every event of `id` handed out has been acknowledged.
pub(crate) fn wait_acked(id: usize) {
    let mut out = outstanding();
    while out.contains_key(&id) {
        out = ACKED.wait(out).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destroy_waits_for_the_last_acknowledgement_only() {
        let id = 0x1000;
        wait_acked(id); // nothing handed out: no wait
        handed_out(id);
        handed_out(id);
        let waiter = std::thread::spawn(move || wait_acked(id));
        acked(id);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "one event still out");
        acked(id);
        waiter.join().unwrap();
        acked(id); // an acknowledgement too many changes nothing
        wait_acked(id);
    }
}
