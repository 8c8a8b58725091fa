//! Shared receive queues (IBTA 10.2.9): `ibv_create_srq`, `ibv_modify_srq` (the limit
//! event's arming), `ibv_query_srq`, `ibv_destroy_srq`, and posting through the context's
//! `post_srq_recv` slot. A QP names its SRQ at creation ([`crate::qp`]).

use crate::device::soft_context;
use crate::ffi;
use crate::objects::{fail, soft_pd};
use crate::post::{errno_of, post_recv_chain};
use softrdma::verbs::{SharedReceiveQueue, VerbsError};
use std::ffi::c_int;
use std::sync::Mutex;

/// Most receive requests an SRQ holds, as for a QP's receive queue.
pub const SRQ_MAX_WR: u32 = 16384;
/// Most SGEs of one of its requests.
pub const SRQ_MAX_SGE: u32 = 16;

/// `ibv_srq` and its softrdma SRQ.
#[repr(C)]
pub struct SoftSrq {
    /// What applications see.
    pub ibv: ffi::ibv_srq,
    /// The engine's SRQ.
    pub srq: SharedReceiveQueue,
    /// Its size, and the limit last armed (0: none), as `ibv_query_srq` reports them.
    attr: Mutex<ffi::ibv_srq_attr>,
}

/// The [`SoftSrq`] of an SRQ this library made.
///
/// # Safety
/// `srq` is NULL or came from [`ibv_create_srq`] and is not destroyed.
pub unsafe fn soft_srq<'a>(srq: *mut ffi::ibv_srq) -> Option<&'a SoftSrq> {
    // SAFETY: `ibv` is the first field of the repr(C) SoftSrq.
    unsafe { srq.cast::<SoftSrq>().as_ref() }
}

/// `ibv_create_srq`; `attr.attr` is updated to what the SRQ got.
///
/// # Safety
/// `pd` is a live PD; `attr` points to a `struct ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ffi::ibv_pd, attr: *mut ffi::ibv_srq_init_attr) -> *mut ffi::ibv_srq {
    // SAFETY: the caller's contract.
    let (Some(spd), Some(a)) = (unsafe { soft_pd(pd) }, unsafe { attr.as_mut() }) else { return fail(libc::EINVAL) };
    let want = a.attr;
    if !srq_size_ok(want.max_wr, want.max_sge) {
        return fail(libc::EINVAL);
    }
    // SAFETY: the PD's context is open.
    let Some(soft) = (unsafe { soft_context(spd.ibv.context) }) else { return fail(libc::EINVAL) };
    let Ok(engine) = soft.engine() else { return fail(libc::EIO) };
    let sge = want.max_sge.max(1);
    let srq = engine.create_srq(want.max_wr as usize, sge as usize);
    a.attr.max_sge = sge;
    wrap_srq(soft, srq, pd, a.srq_context, ffi::ibv_srq_attr { max_wr: want.max_wr, max_sge: sge, srq_limit: 0 })
}

/// The `ibv_srq` of the engine's `srq` in PD `pd`, known to the device's events.
pub(crate) fn wrap_srq(
    soft: &crate::device::SoftContext,
    srq: softrdma::verbs::SharedReceiveQueue,
    pd: *mut ffi::ibv_pd,
    srq_context: *mut std::ffi::c_void,
    attr: ffi::ibv_srq_attr,
) -> *mut ffi::ibv_srq {
    // SAFETY: ibv_srq is plain C data (mutex and condvar valid all-zero on glibc).
    let mut ibv: ffi::ibv_srq = unsafe { std::mem::zeroed() };
    ibv.context = soft.ibv_context();
    ibv.srq_context = srq_context;
    ibv.pd = pd;
    let id = srq.srq_num();
    let made: *mut ffi::ibv_srq = Box::into_raw(Box::new(SoftSrq { ibv, srq, attr: Mutex::new(attr) })).cast();
    crate::event::add_object(soft.device, crate::event::Kind::Srq, id, made as usize, soft.ibv_context());
    made
}

/// Whether `max_wr` and `max_sge` are within what an SRQ takes.
pub(crate) fn srq_size_ok(max_wr: u32, max_sge: u32) -> bool {
    max_wr != 0 && max_wr <= SRQ_MAX_WR && max_sge <= SRQ_MAX_SGE
}

/// The SRQ's limit fired: it reads as disarmed (0) until armed again.
///
/// # Safety
/// `srq` is a live SRQ of this library.
pub unsafe fn disarmed(srq: *mut ffi::ibv_srq) {
    // SAFETY: the caller's contract.
    if let Some(s) = unsafe { soft_srq(srq) } {
        s.attr.lock().unwrap_or_else(|e| e.into_inner()).srq_limit = 0;
    }
}

/// `ibv_modify_srq`: arms the limit event (`IBV_SRQ_LIMIT`); resizing is refused.
///
/// # Safety
/// `srq` is a live SRQ; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ffi::ibv_srq, attr: *mut ffi::ibv_srq_attr, mask: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(a)) = (unsafe { soft_srq(srq) }, unsafe { attr.as_ref() }) else { return libc::EINVAL };
    let mask = mask as u32;
    if mask & ffi::IBV_SRQ_MAX_WR != 0 {
        return libc::EINVAL;
    }
    if mask & ffi::IBV_SRQ_LIMIT != 0 {
        // Recorded before arming and not held across it: the limit may fire at once, and
        // its event (raised under the device lock) disarms it here.
        let before = {
            let mut held = s.attr.lock().unwrap_or_else(|e| e.into_inner());
            if a.srq_limit > held.max_wr {
                return libc::EINVAL;
            }
            std::mem::replace(&mut held.srq_limit, a.srq_limit)
        };
        if let Err(e) = s.srq.arm_limit(a.srq_limit as usize) {
            s.attr.lock().unwrap_or_else(|e| e.into_inner()).srq_limit = before;
            return errno_of(e);
        }
    }
    0
}

/// `ibv_query_srq`.
///
/// # Safety
/// `srq` is a live SRQ; `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ffi::ibv_srq, attr: *mut ffi::ibv_srq_attr) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(out)) = (unsafe { soft_srq(srq) }, unsafe { attr.as_mut() }) else { return libc::EINVAL };
    *out = *s.attr.lock().unwrap_or_else(|e| e.into_inner());
    0
}

/// `ibv_destroy_srq`: EBUSY while a QP uses it.
///
/// # Safety
/// `srq` came from [`ibv_create_srq`]; nothing uses it afterwards if this succeeds.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ffi::ibv_srq) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_srq(srq) }) else { return libc::EINVAL };
    match s.srq.destroy() {
        Ok(()) => {}
        Err(VerbsError::InvalidRequest) => return libc::EBUSY,
        Err(e) => return errno_of(e),
    }
    // SAFETY: the SRQ's context is open.
    if let Some(soft) = unsafe { soft_context(s.ibv.context) } {
        crate::event::remove_object(soft.device, crate::event::Kind::Srq, s.srq.srq_num());
    }
    // SAFETY: allocated by Box in ibv_create_srq, given back once.
    drop(unsafe { Box::from_raw(srq.cast::<SoftSrq>()) });
    0
}

/// The `post_srq_recv` operation: requests taken in order until one is refused.
///
/// # Safety
/// `srq` is a live SRQ; `wr` a NULL-terminated chain of requests; `bad` NULL or writable.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ffi::ibv_srq,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_srq(srq) }) else { return libc::EINVAL };
    // SAFETY: the caller's contract.
    unsafe { post_recv_chain(wr, bad, |r| s.srq.post_recv(r)) }
}
