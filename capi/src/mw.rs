//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, `ibv_dealloc_mw`, and the bind and
//! local-invalidate work requests of both post-send APIs): RoCEv2 only, as siw has none.

use crate::device::soft_context;
use crate::ffi;
use crate::objects::soft_pd;
use crate::qp::soft_qp;
use softrdma::verbs::{Access, MemoryWindow, MwBind, MwType, SendOp, SendWr, VerbsError};
use std::ffi::{c_int, c_uint};

/// A window as applications see it, and the engine's.
#[repr(C)]
pub struct SoftMw {
    /// What applications see (first, so the pointers are one).
    pub ibv: ffi::ibv_mw,
    mw: MemoryWindow,
}

/// The key a bind gives a window whose key is `rkey` now: the same index, the next value
/// of the low 8 bits (`ibv_inc_rkey`, verbs.h).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

/// A window's remote rights (`mw_access_flags`); EINVAL for anything else (a window
/// grants no local rights; zero-based windows are not offered).
fn rights_of(flags: c_uint) -> Result<Access, c_int> {
    let known = ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_ATOMIC;
    // Local write is what the region needs, and applications pass it along harmlessly.
    if flags & !(known | ffi::IBV_ACCESS_LOCAL_WRITE) != 0 {
        return Err(libc::EINVAL);
    }
    Ok(Access {
        remote_write: flags & ffi::IBV_ACCESS_REMOTE_WRITE != 0,
        remote_read: flags & ffi::IBV_ACCESS_REMOTE_READ != 0,
        remote_atomic: flags & ffi::IBV_ACCESS_REMOTE_ATOMIC != 0,
        ..Access::default()
    })
}

/// The bind of window `mw` to `info` under `new_key`, as the engine takes it; EINVAL for
/// a window or region this library did not make.
///
/// # Safety
/// `mw` is NULL or a live window of this library; `info.mr` NULL or a live region.
pub unsafe fn bind_of(mw: *mut ffi::ibv_mw, new_key: u32, info: &ffi::ibv_mw_bind_info) -> Result<MwBind, c_int> {
    // SAFETY: the caller's contract.
    let mw = unsafe { mw.as_ref() }.ok_or(libc::EINVAL)?;
    // SAFETY: the caller's contract.
    let mr_lkey = match unsafe { info.mr.as_ref() } {
        Some(mr) => mr.lkey,
        None if info.length == 0 => 0,
        None => return Err(libc::EINVAL),
    };
    let access = rights_of(info.mw_access_flags)?;
    Ok(MwBind { mw_key: mw.rkey, new_key, mr_lkey, addr: info.addr, len: info.length, access })
}

/// A type 2 window's bind work request (`IBV_WR_BIND_MW`); a type 1 window is bound with
/// `ibv_bind_mw` only.
///
/// # Safety
/// As [`bind_of`].
pub unsafe fn bind_op(mw: *mut ffi::ibv_mw, new_key: u32, info: &ffi::ibv_mw_bind_info) -> Result<SendOp, c_int> {
    // SAFETY: the caller's contract.
    if unsafe { mw.as_ref() }.is_none_or(|m| m.type_ != ffi::IBV_MW_TYPE_2) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    Ok(SendOp::BindMw(unsafe { bind_of(mw, new_key, info) }?))
}

/// `ibv_alloc_mw` (through the context's table).
///
/// # Safety
/// `pd` is a live PD of this library.
pub unsafe extern "C" fn alloc_mw(pd: *mut ffi::ibv_pd, kind: ffi::ibv_mw_type) -> *mut ffi::ibv_mw {
    let fail = |e: c_int| {
        crate::set_errno(e);
        std::ptr::null_mut()
    };
    let kind_of = match kind {
        ffi::IBV_MW_TYPE_1 => MwType::One,
        ffi::IBV_MW_TYPE_2 => MwType::Two,
        _ => return fail(libc::EINVAL),
    };
    // SAFETY: the caller's contract.
    let Some(sp) = (unsafe { soft_pd(pd) }) else { return fail(libc::EINVAL) };
    // SAFETY: a live PD's context is open.
    let Some(engine) = (unsafe { soft_context(sp.ibv.context) }).and_then(|c| c.engine().ok()) else {
        return fail(libc::EINVAL);
    };
    let mw = match engine.alloc_mw(&sp.pd, kind_of) {
        Ok(mw) => mw,
        Err(VerbsError::Unsupported) => return fail(libc::EOPNOTSUPP),
        Err(_) => return fail(libc::ENOMEM),
    };
    let ibv = ffi::ibv_mw { context: sp.ibv.context, pd, rkey: mw.key(), handle: mw.key() >> 8, type_: kind };
    Box::into_raw(Box::new(SoftMw { ibv, mw })).cast()
}

/// `ibv_dealloc_mw`: the window's key opens nothing from now on.
///
/// # Safety
/// `mw` came from [`alloc_mw`] and is not used again.
pub unsafe extern "C" fn dealloc_mw(mw: *mut ffi::ibv_mw) -> c_int {
    if mw.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's contract; `ibv` begins the repr(C) SoftMw.
    drop(unsafe { Box::from_raw(mw.cast::<SoftMw>()) });
    0
}

/// `ibv_bind_mw` for a type 1 window (verbs.h checked the type and the PDs): a bind work
/// request on `qp`, and the window's next key, which peers use once it completes.
///
/// # Safety
/// `qp`, `mw` and `bind` are live and this library's.
pub unsafe extern "C" fn bind_mw(qp: *mut ffi::ibv_qp, mw: *mut ffi::ibv_mw, bind: *mut ffi::ibv_mw_bind) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(sq), Some(b), Some(w)) = (unsafe { soft_qp(qp) }, unsafe { bind.as_ref() }, unsafe { mw.as_mut() })
    else {
        return libc::EINVAL;
    };
    if w.type_ != ffi::IBV_MW_TYPE_1 {
        return libc::EINVAL;
    }
    let new_key = inc_rkey(w.rkey);
    // SAFETY: the caller's contract.
    let op = match unsafe { bind_of(mw, new_key, &b.bind_info) } {
        Ok(m) => SendOp::BindMw(m),
        Err(e) => return e,
    };
    let mut wr = SendWr::new(b.wr_id, op, Vec::new());
    wr.signaled = sq.sig_all || b.send_flags & ffi::IBV_SEND_SIGNALED != 0;
    match sq.qp.post_send(wr) {
        Ok(()) => {
            w.rkey = new_key;
            0
        }
        Err(e) => crate::post::errno_of(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_changes_only_the_low_eight_bits_of_the_key() {
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(0x1234_5601), 0x1234_5602);
    }
}
