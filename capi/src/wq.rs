//! Receive work queues, their indirection tables and receive-side scaling QPs
//! (`ibv_create_wq`, `ibv_create_rwq_ind_table`, `ibv_create_qp_ex` with
//! `IBV_QP_INIT_ATTR_RX_HASH`): a raw packet QP whose flow rules' frames go to the work
//! queue their Toeplitz hash picks. A work queue is an engine SRQ with its own CQ.

use crate::cq::soft_cq;
use crate::device::soft_context;
use crate::ffi;
use crate::objects::soft_pd;
use softrdma::engine::verbs::{QpCaps, QpType};
use softrdma::verbs::{SharedReceiveQueue, VerbsError};
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Most receives and scatter entries a work queue takes (as a QP's receive queue).
const WQ_MAX_WR: u32 = 16384;
const WQ_MAX_SGE: u32 = 16;
/// The largest indirection table: 2^16 entries (`log_ind_tbl_size` 16).
const LOG_IND_TBL_MAX: u32 = 16;
/// Most indirection tables a process holds (`rss_caps.max_rwq_indirection_tables`).
pub const IND_TABLES_MAX: usize = 1024;
/// Indirection tables held now.
static IND_TABLES: AtomicUsize = AtomicUsize::new(0);

/// An `ibv_wq` and its engine SRQ.
#[repr(C)]
struct SoftWq {
    ibv: ffi::ibv_wq,
    srq: SharedReceiveQueue,
}

/// An `ibv_rwq_ind_table`, its work queues, and how many QPs use it.
#[repr(C)]
struct SoftIndTable {
    ibv: ffi::ibv_rwq_ind_table,
    wqs: Vec<*mut ffi::ibv_wq>,
    users: AtomicUsize,
}

fn fail<T>(errno: c_int) -> *mut T {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = errno };
    std::ptr::null_mut()
}

/// The `create_wq` operation: receive queues only (`IBV_WQT_RQ`), no creation flags.
///
/// # Safety
/// `attr` names a live PD and CQ of `ctx`.
pub unsafe extern "C" fn create_wq(ctx: *mut ffi::ibv_context, attr: *mut ffi::ibv_wq_init_attr) -> *mut ffi::ibv_wq {
    // SAFETY: the caller's contract.
    let Some(a) = (unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
    if a.wq_type != ffi::IBV_WQT_RQ || a.comp_mask != 0 || a.create_flags != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's contract.
    let (Some(soft), Some(_), Some(_)) =
        (unsafe { soft_context(ctx) }, unsafe { soft_pd(a.pd) }, unsafe { soft_cq(a.cq) })
    else {
        return fail(libc::EINVAL);
    };
    if a.max_wr == 0 || a.max_wr > WQ_MAX_WR || a.max_sge > WQ_MAX_SGE {
        return fail(libc::EINVAL);
    }
    let Ok(engine) = soft.engine() else { return fail(libc::EIO) };
    let srq = engine.create_srq(a.max_wr as usize, a.max_sge.max(1) as usize);
    // SAFETY: ibv_wq is plain C data; all-zero is valid (the inline caller sets the rest).
    let mut ibv: ffi::ibv_wq = unsafe { std::mem::zeroed() };
    (ibv.context, ibv.pd, ibv.cq, ibv.wq_num) = (ctx, a.pd, a.cq, srq.srq_num());
    (ibv.state, ibv.wq_type) = (ffi::IBV_WQS_RESET, a.wq_type);
    ibv.post_recv = Some(post_wq_recv);
    Box::into_raw(Box::new(SoftWq { ibv, srq })).cast()
}

/// The `modify_wq` operation: the state only.
///
/// # Safety
/// `wq` came from [`create_wq`].
pub unsafe extern "C" fn modify_wq(wq: *mut ffi::ibv_wq, attr: *mut ffi::ibv_wq_attr) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(w), Some(a)) = (unsafe { wq.as_mut() }, unsafe { attr.as_ref() }) else { return libc::EINVAL };
    if a.attr_mask & !ffi::IBV_WQ_ATTR_STATE != 0 {
        return libc::EOPNOTSUPP;
    }
    if a.attr_mask & ffi::IBV_WQ_ATTR_STATE != 0 {
        if a.wq_state > ffi::IBV_WQS_ERR {
            return libc::EINVAL;
        }
        w.state = a.wq_state;
    }
    0
}

/// The `destroy_wq` operation: EBUSY while an indirection table's QP takes from it.
///
/// # Safety
/// `wq` came from [`create_wq`]; nothing uses it afterwards.
pub unsafe extern "C" fn destroy_wq(wq: *mut ffi::ibv_wq) -> c_int {
    // SAFETY: the caller's contract: a SoftWq.
    let Some(w) = (unsafe { wq.cast::<SoftWq>().as_ref() }) else { return libc::EINVAL };
    if w.srq.destroy().is_err() {
        return libc::EBUSY;
    }
    // SAFETY: made by create_wq as a boxed SoftWq; destroyed once.
    drop(unsafe { Box::from_raw(wq.cast::<SoftWq>()) });
    0
}

/// `ibv_post_wq_recv` (the work queue's `post_recv`).
///
/// # Safety
/// `wq` came from [`create_wq`]; `wr` is a NULL-terminated chain.
unsafe extern "C" fn post_wq_recv(
    wq: *mut ffi::ibv_wq,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's contract: a SoftWq.
    let Some(w) = (unsafe { wq.cast::<SoftWq>().as_ref() }) else { return libc::EINVAL };
    // SAFETY: the caller's contract.
    unsafe { crate::post::post_recv_chain(wr, bad, |r| w.srq.post_recv(r)) }
}

/// The `create_rwq_ind_table` operation: 2^`log_ind_tbl_size` work queues.
///
/// # Safety
/// `attr.ind_tbl` holds that many live work queues of `ctx`.
pub unsafe extern "C" fn create_rwq_ind_table(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_rwq_ind_table_init_attr,
) -> *mut ffi::ibv_rwq_ind_table {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    // SAFETY: the caller's contract.
    let Some(a) = (unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
    if a.comp_mask != 0 || a.log_ind_tbl_size > LOG_IND_TBL_MAX || a.ind_tbl.is_null() {
        return fail(libc::EINVAL);
    }
    let n = 1usize << a.log_ind_tbl_size;
    // SAFETY: the caller's contract: n entries.
    let wqs: Vec<*mut ffi::ibv_wq> = unsafe { std::slice::from_raw_parts(a.ind_tbl, n) }.to_vec();
    if wqs.iter().any(|w| w.is_null()) {
        return fail(libc::EINVAL);
    }
    if IND_TABLES.fetch_add(1, Ordering::AcqRel) >= IND_TABLES_MAX {
        IND_TABLES.fetch_sub(1, Ordering::AcqRel);
        return fail(libc::ENOMEM);
    }
    let num = NEXT.fetch_add(1, Ordering::Relaxed) as c_int;
    let ibv = ffi::ibv_rwq_ind_table { context: ctx, ind_tbl_handle: num, ind_tbl_num: num, comp_mask: 0 };
    Box::into_raw(Box::new(SoftIndTable { ibv, wqs, users: AtomicUsize::new(0) })).cast()
}

/// The `destroy_rwq_ind_table` operation: EBUSY while a QP uses it.
///
/// # Safety
/// `t` came from [`create_rwq_ind_table`]; nothing uses it afterwards.
pub unsafe extern "C" fn destroy_rwq_ind_table(t: *mut ffi::ibv_rwq_ind_table) -> c_int {
    // SAFETY: the caller's contract: a SoftIndTable.
    let Some(table) = (unsafe { t.cast::<SoftIndTable>().as_ref() }) else { return libc::EINVAL };
    if table.users.load(Ordering::Acquire) > 0 {
        return libc::EBUSY;
    }
    // SAFETY: made by create_rwq_ind_table as a boxed SoftIndTable; destroyed once.
    drop(unsafe { Box::from_raw(t.cast::<SoftIndTable>()) });
    IND_TABLES.fetch_sub(1, Ordering::AcqRel);
    0
}

/// `ibv_create_qp_ex` for a receive-side scaling QP: a raw packet QP with an indirection
/// table and a Toeplitz hash, and nothing to send.
///
/// # Safety
/// `a` names a live PD and indirection table of `ctx`.
pub unsafe fn create_rss_qp(ctx: *mut ffi::ibv_context, a: &mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp {
    let wanted = ffi::IBV_QP_INIT_ATTR_PD | ffi::IBV_QP_INIT_ATTR_IND_TABLE | ffi::IBV_QP_INIT_ATTR_RX_HASH;
    let known = wanted | ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if a.comp_mask & wanted != wanted || a.comp_mask & !known != 0 || a.qp_type != ffi::IBV_QPT_RAW_PACKET {
        return fail(libc::EOPNOTSUPP);
    }
    let h = &a.rx_hash_conf;
    if h.rx_hash_function != ffi::IBV_RX_HASH_FUNC_TOEPLITZ as u8 || h.rx_hash_key.is_null() || a.create_flags != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's contract.
    let (Some(soft), Some(spd), Some(table)) = (unsafe { soft_context(ctx) }, unsafe { soft_pd(a.pd) }, unsafe {
        a.rwq_ind_tbl.cast::<SoftIndTable>().as_ref()
    }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: the table's work queues are live (destroying one in use is refused).
    let wqs: Vec<&SoftWq> = table.wqs.iter().filter_map(|&w| unsafe { w.cast::<SoftWq>().as_ref() }).collect();
    // SAFETY: each work queue's CQ is live.
    let cqs: Vec<_> = wqs.iter().filter_map(|w| unsafe { soft_cq(w.ibv.cq) }).collect();
    let (Some(first), Ok(engine)) = (cqs.first(), soft.engine()) else { return fail(libc::EINVAL) };
    let caps = QpCaps { max_send_wr: 1, max_recv_wr: 1, max_sge: 1 };
    let Ok(qp) = engine.create_qp(&spd.pd, &first.cq, &first.cq, QpType::RawPacket, caps, None) else {
        return fail(libc::ENOMEM);
    };
    // SAFETY: rx_hash_key_len bytes at rx_hash_key (the caller's contract).
    let key = unsafe { std::slice::from_raw_parts(h.rx_hash_key, usize::from(h.rx_hash_key_len)) }.to_vec();
    let pairs: Vec<_> = wqs.iter().zip(&cqs).map(|(w, c)| (&w.srq, &c.cq)).collect();
    match qp.set_rx_hash(key, h.rx_hash_fields_mask, &pairs, &spd.pd) {
        Ok(()) => {}
        Err(VerbsError::Unsupported) => return fail(libc::EOPNOTSUPP),
        Err(_) => return fail(libc::EINVAL),
    }
    // SAFETY: plain C data; all-zero is valid (no CQs: the QP neither sends nor completes).
    let mut basic: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    (basic.qp_context, basic.qp_type) = (a.qp_context, a.qp_type);
    let made = crate::qp::wrap_qp(soft, qp, (a.pd, &spd.pd), &mut basic, false, caps);
    // SAFETY: just made by wrap_qp (or NULL).
    if let Some(sq) = unsafe { crate::qp::soft_qp(made) } {
        table.users.fetch_add(1, Ordering::AcqRel);
        sq.rss_table.store(a.rwq_ind_tbl as usize, Ordering::Release);
    }
    made
}

/// A QP that used indirection table `table` (0: none) is gone: the table may go.
pub fn table_released(table: usize) {
    // SAFETY: a table in use is live (its destruction is refused while it is).
    if let Some(t) = unsafe { (table as *const SoftIndTable).as_ref() } {
        t.users.fetch_sub(1, Ordering::AcqRel);
    }
}
