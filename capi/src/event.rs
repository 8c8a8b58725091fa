//! Asynchronous events (`ibv_get_async_event`, `ibv_ack_async_event`): the engine's
//! events (IBTA 11.6.3), each turned into the `ibv_async_event` of the QP or SRQ it names
//! and queued on the context that made that object. The context's `async_fd` is a
//! semaphore eventfd counting them, so poll/epoll see it readable while one waits.

use crate::device::{soft_context, SoftDevice};
use crate::ffi;
use crate::set_errno;
use softrdma::engine::event::ASYNC_EVENTS_MAX;
use softrdma::verbs::AsyncEvent;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::sync::{LazyLock, Mutex, MutexGuard};

/// What kind of object an event names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A QP (`element.qp`).
    Qp,
    /// An SRQ (`element.srq`).
    Srq,
}

/// One event waiting for the application: the object's address and the event type.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    kind: Kind,
    object: usize,
    event_type: ffi::ibv_event_type,
}

/// A context's events and the descriptor that counts them.
struct ContextEvents {
    fd: c_int,
    queue: VecDeque<Waiting>,
}

/// Which context made each live object, and each open context's events. Addresses are
/// kept as integers: an entry goes before its object is freed, under this lock, so the
/// handler never reaches a freed one.
#[derive(Default)]
struct Registry {
    owners: HashMap<(usize, Kind, u32), (usize, usize)>,
    contexts: HashMap<usize, ContextEvents>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn device_key(d: &SoftDevice) -> usize {
    d as *const SoftDevice as usize
}

/// A context opened: its events go to `fd`.
pub fn add_context(ctx: *mut ffi::ibv_context, fd: c_int) {
    registry().contexts.insert(ctx as usize, ContextEvents { fd, queue: VecDeque::new() });
}

/// A context about to close: its events and its objects' entries go.
pub fn remove_context(ctx: *mut ffi::ibv_context) {
    let mut r = registry();
    r.contexts.remove(&(ctx as usize));
    r.owners.retain(|_, (_, c)| *c != ctx as usize);
}

/// Object `id` of `device`, made by `ctx` and handed out as `object`, now gets its events.
pub fn add_object(device: &SoftDevice, kind: Kind, id: u32, object: usize, ctx: *mut ffi::ibv_context) {
    registry().owners.insert((device_key(device), kind, id), (object, ctx as usize));
}

/// The live object `id` of `kind` on `device` (its address as handed out), if any.
pub fn object(device: &SoftDevice, kind: Kind, id: u32) -> Option<usize> {
    registry().owners.get(&(device_key(device), kind, id)).map(|&(object, _)| object)
}

/// An object about to be freed: no event names it any more, not even one queued.
pub fn remove_object(device: &SoftDevice, kind: Kind, id: u32) {
    let mut r = registry();
    let Some((object, ctx)) = r.owners.remove(&(device_key(device), kind, id)) else { return };
    if let Some(c) = r.contexts.get_mut(&ctx) {
        // The eventfd keeps its count: a read finding no event reads again.
        c.queue.retain(|w| !(w.kind == kind && w.object == object));
    }
}

/// The object an engine event names, and the `ibv_event_type` it becomes.
fn translate(e: AsyncEvent) -> Option<(Kind, u32, ffi::ibv_event_type)> {
    Some(match e {
        AsyncEvent::SrqLimitReached(n) => (Kind::Srq, n, ffi::IBV_EVENT_SRQ_LIMIT_REACHED),
        AsyncEvent::QpRequestError(n) => (Kind::Qp, n, ffi::IBV_EVENT_QP_REQ_ERR),
        AsyncEvent::QpAccessError(n) => (Kind::Qp, n, ffi::IBV_EVENT_QP_ACCESS_ERR),
        AsyncEvent::QpFatal(n) => (Kind::Qp, n, ffi::IBV_EVENT_QP_FATAL),
        AsyncEvent::LastWqeReached(n) => (Kind::Qp, n, ffi::IBV_EVENT_QP_LAST_WQE_REACHED),
        _ => return None,
    })
}

/// Sends `device`'s engine events to the contexts that made the objects they name.
pub fn install_handler(device: &SoftDevice, engine: &softrdma::verbs::Context) {
    let key = device_key(device);
    engine.set_async_event_handler(Box::new(move |e| {
        let Some((kind, id, event_type)) = translate(e) else { return };
        let mut r = registry();
        let Some(&(object, ctx)) = r.owners.get(&(key, kind, id)) else { return };
        if kind == Kind::Srq {
            // IBTA 11.6.3.3: the limit fired and is disarmed, as ibv_query_srq reports.
            // SAFETY: a registered SRQ is live until its entry goes, under this lock.
            unsafe { crate::srq::disarmed(object as *mut ffi::ibv_srq) };
        }
        let Some(c) = r.contexts.get_mut(&ctx) else { return };
        if c.queue.len() >= ASYNC_EVENTS_MAX {
            return;
        }
        c.queue.push_back(Waiting { kind, object, event_type });
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to the context's eventfd, open while it is registered.
        unsafe { libc::write(c.fd, (&raw const one).cast(), 8) };
    }));
}

/// `ibv_get_async_event`: the next event of the context, waiting for one unless the
/// application made `async_fd` non-blocking (then -1 with EAGAIN).
///
/// # Safety
/// `ctx` is an open context; `event` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(ctx: *mut ffi::ibv_context, event: *mut ffi::ibv_async_event) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(soft), Some(out)) = (unsafe { soft_context(ctx) }, unsafe { event.as_mut() }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let fd = soft.vctx.context.async_fd;
    loop {
        let mut n: u64 = 0;
        // SAFETY: reading 8 bytes from the context's eventfd into `n`.
        if unsafe { libc::read(fd, (&raw mut n).cast(), 8) } != 8 {
            return -1;
        }
        let next = registry().contexts.get_mut(&(ctx as usize)).and_then(|c| c.queue.pop_front());
        if let Some(w) = next {
            out.event_type = w.event_type;
            match w.kind {
                Kind::Qp => out.element.qp = w.object as *mut ffi::ibv_qp,
                Kind::Srq => out.element.srq = w.object as *mut ffi::ibv_srq,
            }
            return 0;
        }
    }
}

/// `ibv_ack_async_event`: counts the event on its object, as rdma-core does.
///
/// # Safety
/// `event` came from [`ibv_get_async_event`] and its object is live.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ffi::ibv_async_event) {
    // SAFETY: the caller's contract.
    let Some(e) = (unsafe { event.as_ref() }) else { return };
    // SAFETY: the union member the event type names; the objects are live.
    unsafe {
        match e.event_type {
            ffi::IBV_EVENT_SRQ_LIMIT_REACHED => {
                if let Some(s) = e.element.srq.as_mut() {
                    counted(&raw mut s.mutex, &raw mut s.cond, &mut s.events_completed);
                }
            }
            _ => {
                if let Some(q) = e.element.qp.as_mut() {
                    counted(&raw mut q.mutex, &raw mut q.cond, &mut q.events_completed);
                }
            }
        }
    }
}

/// One more event completed on an object, under its mutex, its waiters told.
///
/// # Safety
/// The three belong to one live object whose mutex and condvar are initialized.
unsafe fn counted(mutex: *mut ffi::pthread_mutex_t, cond: *mut ffi::pthread_cond_t, n: &mut u32) {
    // SAFETY: bindgen's pthread types are glibc's, field for field.
    unsafe {
        libc::pthread_mutex_lock(mutex.cast());
        *n += 1;
        libc::pthread_cond_signal(cond.cast());
        libc::pthread_mutex_unlock(mutex.cast());
    }
}
