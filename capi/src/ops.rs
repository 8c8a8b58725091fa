//! The context's operation table, which applications call straight through (the inline
//! `ibv_post_send`, `ibv_poll_cq`, `ibv_req_notify_cq` of `<infiniband/verbs.h>`). Every
//! slot holds a function: what softrdma does not do yet answers as rdma-core does for an
//! operation a provider lacks (EOPNOTSUPP), never a jump through NULL.

use crate::ffi;

/// Fills every operation of `ops`.
pub fn install(ops: &mut ffi::ibv_context_ops) {
    ops.alloc_mw = Some(crate::mw::alloc_mw);
    ops.bind_mw = Some(crate::mw::bind_mw);
    ops.dealloc_mw = Some(crate::mw::dealloc_mw);
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    ops.post_send = Some(crate::post::post_send);
    ops.post_recv = Some(crate::post::post_recv);
}
