//! Tag matching for C applications (rdma-core's `Documentation/tag_matching.md`):
//! `tm_caps` in `ibv_query_device_ex`, `ibv_create_srq_ex` with `IBV_SRQT_TM`,
//! `ibv_post_srq_ops` through the context's slot, and the TM fields of completions
//! (`ibv_wc_read_tm_info`, in [`crate::cq_ex`]). The matching itself is the engine's
//! (`softrdma::engine::tm`), on RoCEv2 devices; iWARP devices report no tag matching.

use crate::ffi;
use crate::objects::fail;
use crate::srq::{soft_srq, srq_size_ok, wrap_srq};
use softrdma::engine::tm::{self, OpsWr, TagOp};
use softrdma::engine::verbs::{RecvWr, VerbsError};
use std::ffi::c_int;

/// `ibv_device_attr_ex.tm_caps`: RC tag matching on RoCEv2 devices, none on iWARP.
pub fn tm_caps(roce: bool) -> ffi::ibv_tm_caps {
    if !roce {
        return ffi::ibv_tm_caps { max_rndv_hdr_size: 0, max_num_tags: 0, flags: 0, max_ops: 0, max_sge: 0 };
    }
    ffi::ibv_tm_caps {
        max_rndv_hdr_size: tm::MAX_RNDV_HDR_BYTES as u32,
        max_num_tags: tm::MAX_TAGS as u32,
        flags: ffi::IBV_TM_CAP_RC,
        max_ops: tm::MAX_OPS as u32,
        max_sge: tm::MAX_TAG_SGE as u32,
    }
}

/// `ibv_create_srq_ex` for `IBV_SRQT_TM`: a PD, a CQ and `tm_cap` are needed (EINVAL
/// without, or beyond `tm_caps`); EOPNOTSUPP on iWARP.
///
/// # Safety
/// `soft` is an open context; `a` names a PD and CQ of this library.
pub unsafe fn create_tm_srq(soft: &crate::device::SoftContext, a: &mut ffi::ibv_srq_init_attr_ex) -> *mut ffi::ibv_srq {
    let needed =
        ffi::IBV_SRQ_INIT_ATTR_TYPE | ffi::IBV_SRQ_INIT_ATTR_PD | ffi::IBV_SRQ_INIT_ATTR_CQ | ffi::IBV_SRQ_INIT_ATTR_TM;
    if a.comp_mask & !needed != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's contract: objects of this library.
    let (pd, cq) = unsafe { (crate::objects::soft_pd(a.pd), crate::cq::soft_cq(a.cq)) };
    let (Some(_), Some(cq)) = (pd, cq) else { return fail(libc::EINVAL) };
    let tags = a.tm_cap.max_num_tags as usize;
    let sized = srq_size_ok(a.attr.max_wr, a.attr.max_sge) && (1..=tm::MAX_TAGS).contains(&tags);
    if a.comp_mask & needed != needed || !sized || a.tm_cap.max_ops as usize > tm::MAX_OPS {
        return fail(libc::EINVAL);
    }
    let Ok(engine) = soft.engine() else { return fail(libc::EIO) };
    let sge = a.attr.max_sge.max(1);
    let srq = match engine.create_tm_srq(&cq.cq, (a.attr.max_wr as usize, sge as usize), tags) {
        Ok(s) => s,
        Err(VerbsError::Unsupported) => return fail(libc::EOPNOTSUPP),
        Err(_) => return fail(libc::EINVAL),
    };
    a.attr.max_sge = sge;
    wrap_srq(soft, srq, a.pd, a.srq_context, ffi::ibv_srq_attr { max_wr: a.attr.max_wr, max_sge: sge, srq_limit: 0 })
}

/// One `ibv_ops_wr` as the engine takes it.
///
/// # Safety
/// `w.tm.add.sg_list` holds `num_sge` SGEs for an ADD.
unsafe fn op_of(w: &ffi::ibv_ops_wr) -> Result<OpsWr, c_int> {
    let op = match w.opcode {
        ffi::IBV_WR_TAG_ADD => {
            let add = &w.tm.add;
            // SAFETY: the caller's contract.
            let sgl = unsafe { crate::post::sgl_of(add.sg_list, add.num_sge) }?;
            TagOp::Add { recv: RecvWr { wr_id: add.recv_wr_id, sgl }, tag: add.tag, mask: add.mask }
        }
        ffi::IBV_WR_TAG_DEL => TagOp::Del { handle: w.tm.handle },
        ffi::IBV_WR_TAG_SYNC => TagOp::Sync,
        _ => return Err(libc::EINVAL),
    };
    let signaled = w.flags & ffi::IBV_OPS_SIGNALED as c_int != 0;
    Ok(OpsWr { wr_id: w.wr_id, op, unexpected_cnt: w.tm.unexpected_cnt, signaled })
}

/// `verbs_context.post_srq_ops`: each operation of the list in turn; an ADD's handle is
/// written back into its `tm.handle`. The first that fails is `*bad_op` (ENOMEM with the
/// list full, EINVAL otherwise).
///
/// # Safety
/// `srq` is a live SRQ of this library; `op` a valid list; `bad_op` writable.
pub unsafe extern "C" fn post_srq_ops(
    srq: *mut ffi::ibv_srq,
    op: *mut ffi::ibv_ops_wr,
    bad_op: *mut *mut ffi::ibv_ops_wr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_srq(srq) }) else { return libc::EINVAL };
    let mut cur = op;
    // SAFETY: the caller's contract: a NULL-terminated list of valid operations.
    while let Some(w) = unsafe { cur.as_mut() } {
        // SAFETY: as above.
        let result = unsafe { op_of(w) }.and_then(|o| {
            s.srq.post_op(&o).map_err(|e| if e == VerbsError::QueueFull { libc::ENOMEM } else { libc::EINVAL })
        });
        match result {
            Ok(handle) => {
                if let Some(h) = handle {
                    w.tm.handle = h;
                }
            }
            Err(e) => {
                // SAFETY: the caller's contract: `bad_op` is writable.
                if let Some(b) = unsafe { bad_op.as_mut() } {
                    *b = cur;
                }
                return e;
            }
        }
        cur = w.next;
    }
    0
}

/// The `ibv_wc_flags` of an engine completion's `WC_TM_*` flags.
pub fn wc_flags(flags: u8) -> std::ffi::c_uint {
    let mut out = 0;
    if flags & tm::WC_TM_SYNC_REQ != 0 {
        out |= ffi::IBV_WC_TM_SYNC_REQ;
    }
    if flags & tm::WC_TM_MATCH != 0 {
        out |= ffi::IBV_WC_TM_MATCH;
    }
    if flags & tm::WC_TM_DATA_VALID != 0 {
        out |= ffi::IBV_WC_TM_DATA_VALID;
    }
    out
}
