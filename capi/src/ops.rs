//! The context's operation table, which applications call straight through (the inline
//! `ibv_post_send`, `ibv_poll_cq`, `ibv_req_notify_cq` of `<infiniband/verbs.h>`). Every
//! slot holds a function: what softrdma does not do yet answers as rdma-core does for an
//! operation a provider lacks (EOPNOTSUPP), never a jump through NULL.

use crate::ffi;
use std::ffi::c_int;

/// Fills every operation of `ops`.
pub fn install(ops: &mut ffi::ibv_context_ops) {
    ops.alloc_mw = Some(alloc_mw);
    ops.bind_mw = Some(bind_mw);
    ops.dealloc_mw = Some(dealloc_mw);
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    ops.post_send = Some(crate::post::post_send);
    ops.post_recv = Some(crate::post::post_recv);
}

unsafe extern "C" fn alloc_mw(_pd: *mut ffi::ibv_pd, _kind: ffi::ibv_mw_type) -> *mut ffi::ibv_mw {
    crate::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

unsafe extern "C" fn bind_mw(_qp: *mut ffi::ibv_qp, _mw: *mut ffi::ibv_mw, _bind: *mut ffi::ibv_mw_bind) -> c_int {
    libc::EOPNOTSUPP
}

unsafe extern "C" fn dealloc_mw(_mw: *mut ffi::ibv_mw) -> c_int {
    libc::EOPNOTSUPP
}
