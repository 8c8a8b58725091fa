//! DISCONNECTED without a thread per connection: each connected id is registered by its
//! device and QP number, and the engine's QP-error handler (a QP entering ERR: the peer's
//! DREQ or closed stream, this side's rdma_disconnect, a fatal error) queues the id's
//! DISCONNECTED event once. The handler runs with the device locked, so nothing here calls
//! into the engine while holding the registry.

use crate::ffi;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

/// A connected id waiting for its end: its address and the queue its events go to.
struct Watched {
    id: usize,
    queue: Arc<crate::cm::Queue>,
}

/// Watched ids by (device, QPN).
fn watched() -> MutexGuard<'static, HashMap<(usize, u32), Watched>> {
    static WATCHED: LazyLock<Mutex<HashMap<(usize, u32), Watched>>> = LazyLock::new(Mutex::default);
    WATCHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tells the ids of `device` (by its key) when their QPs enter ERR.
pub fn install(device: usize, engine: &softrdma::verbs::Context) {
    engine.set_qp_error_handler(Box::new(move |qpn| ended(device, qpn)));
}

/// Id `id`, connected through QP `qpn` of `device`, gets DISCONNECTED when the QP enters
/// ERR. The caller then checks whether it did already (it may have before this call).
pub fn watch(device: usize, qpn: u32, id: *mut ffi::rdma_cm_id, queue: Arc<crate::cm::Queue>) {
    watched().insert((device, qpn), Watched { id: id as usize, queue });
}

/// QP `qpn` of `device` entered ERR (or was found there): its id's DISCONNECTED, once.
pub fn ended(device: usize, qpn: u32) {
    let mut w = watched();
    if let Some(e) = w.remove(&(device, qpn)) {
        // Queued with the registry held: after `forget_*` returns, no event names the id.
        e.queue.push(crate::cm::event(e.id as *mut _, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_DISCONNECTED, 0));
    }
}

/// QP `qpn` of `device` is being destroyed: its id hears nothing more of it.
pub fn forget_qp(device: usize, qpn: u32) {
    watched().remove(&(device, qpn));
}

/// Id `id` is being destroyed.
pub fn forget_id(id: *mut ffi::rdma_cm_id) {
    watched().retain(|_, w| w.id != id as usize);
}
