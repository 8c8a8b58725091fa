//! The extended post-send API (`ibv_qp_ex` and `ibv_wr_*`, rdma-core's `ibv_wr_post(3)`):
//! an application opens a batch with `wr_start`, adds a request one call at a time (its
//! operation, then its SGEs, inline bytes or UD address) and posts the batch in order with
//! `wr_complete`. perftest builds its posts this way by default. The calls are inline in the
//! application and jump through the `ibv_qp_ex` table [`install`] fills; every slot holds a
//! function, and what softrdma does not do makes `wr_complete` fail with EOPNOTSUPP.

use crate::ffi;
use crate::objects::SoftAh;
use crate::post::{errno_of, post_inline};
use crate::qp::{soft_qp, SoftQp, INLINE_MAX_BYTES};
use softrdma::verbs::{Remote, SendOp, SendWr, Sge, UdDest};
use std::ffi::{c_int, c_void};

/// The operations a QP made with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` may ask for.
pub const SEND_OPS_SUPPORTED: u64 = (ffi::IBV_QP_EX_WITH_RDMA_WRITE
    | ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | ffi::IBV_QP_EX_WITH_SEND
    | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM
    | ffi::IBV_QP_EX_WITH_RDMA_READ
    | ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | ffi::IBV_QP_EX_WITH_SEND_WITH_INV
    | ffi::IBV_QP_EX_WITH_BIND_MW
    | ffi::IBV_QP_EX_WITH_LOCAL_INV
    | ffi::IBV_QP_EX_WITH_ATOMIC_WRITE) as u64;

/// One request of a batch, and its inline bytes, copied when the application gave them
/// (it may reuse its buffer before `wr_complete`).
struct Pending {
    wr: SendWr,
    inline: Option<Vec<u8>>,
}

/// The requests between `wr_start` and `wr_complete`; at most the QP's send queue depth.
#[derive(Default)]
pub struct WrBatch {
    reqs: Vec<Pending>,
    /// The first error a builder call met; `wr_complete` returns it and posts nothing.
    error: c_int,
}

/// Fills the builder slots of `ex`.
pub fn install(ex: &mut ffi::ibv_qp_ex) {
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
    ex.wr_send = Some(wr_send);
    ex.wr_send_imm = Some(wr_send_imm);
    ex.wr_send_inv = Some(wr_send_inv);
    ex.wr_rdma_write = Some(wr_rdma_write);
    ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    ex.wr_rdma_read = Some(wr_rdma_read);
    ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_bind_mw = Some(wr_bind_mw);
    ex.wr_local_inv = Some(wr_local_inv);
    ex.wr_send_tso = Some(wr_send_tso);
    ex.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    ex.wr_atomic_write = Some(wr_atomic_write);
}

/// Runs `f` on the QP's batch.
///
/// # Safety
/// `qp` is a live extended QP this library made.
unsafe fn with_batch<T>(qp: *mut ffi::ibv_qp_ex, f: impl FnOnce(&SoftQp, &mut WrBatch) -> T) -> Option<T> {
    // SAFETY: the caller's contract; `qp_base` begins the ibv_qp_ex.
    let sq = unsafe { soft_qp(qp.cast()) }?;
    let mut batch = sq.batch.lock().unwrap_or_else(|e| e.into_inner());
    Some(f(sq, &mut batch))
}

/// Adds a request for `op`, with the `wr_id` and `wr_flags` the application set in `qp`.
///
/// # Safety
/// As [`with_batch`].
unsafe fn add(qp: *mut ffi::ibv_qp_ex, op: SendOp) {
    // SAFETY: the caller's contract.
    let (wr_id, flags) = unsafe { ((*qp).wr_id, (*qp).wr_flags) };
    // SAFETY: the caller's contract.
    unsafe {
        with_batch(qp, |sq, b| {
            if b.reqs.len() >= sq.caps.max_send_wr as usize {
                b.error = libc::ENOMEM;
                return;
            }
            let mut wr = SendWr::new(wr_id, op, Vec::new());
            wr.signaled = sq.sig_all || flags & ffi::IBV_SEND_SIGNALED != 0;
            wr.solicited = flags & ffi::IBV_SEND_SOLICITED != 0;
            b.reqs.push(Pending { wr, inline: None });
        })
    };
}

/// Applies `f` to the request added last; EINVAL if there is none.
///
/// # Safety
/// As [`with_batch`].
unsafe fn set_last(qp: *mut ffi::ibv_qp_ex, f: impl FnOnce(&mut Pending) -> Result<(), c_int>) {
    // SAFETY: the caller's contract.
    unsafe {
        with_batch(qp, |_, b| match b.reqs.last_mut().map(f) {
            Some(Ok(())) => {}
            Some(Err(e)) => b.error = e,
            None => b.error = libc::EINVAL,
        })
    };
}

/// Marks the batch failed with `e`.
///
/// # Safety
/// As [`with_batch`].
unsafe fn refuse(qp: *mut ffi::ibv_qp_ex, e: c_int) {
    // SAFETY: the caller's contract.
    unsafe { with_batch(qp, |_, b| b.error = e) };
}

unsafe extern "C" fn wr_start(qp: *mut ffi::ibv_qp_ex) {
    // SAFETY: the application's QP (all entry points below likewise).
    unsafe { with_batch(qp, |_, b| *b = WrBatch::default()) };
}

unsafe extern "C" fn wr_abort(qp: *mut ffi::ibv_qp_ex) {
    // SAFETY: as above.
    unsafe { with_batch(qp, |_, b| *b = WrBatch::default()) };
}

/// Posts the batch in order; an error a builder call met posts nothing. A request the
/// engine refuses (a full queue) stops the batch there: those before it stay posted.
unsafe extern "C" fn wr_complete(qp: *mut ffi::ibv_qp_ex) -> c_int {
    // SAFETY: as above.
    let posted = unsafe {
        with_batch(qp, |sq, b| {
            let batch = std::mem::take(b);
            if batch.error != 0 {
                return batch.error;
            }
            for p in batch.reqs {
                let result = match p.inline {
                    Some(bytes) => post_inline(sq, p.wr, &[&bytes]),
                    None => sq.qp.post_send(p.wr).map_err(errno_of),
                };
                if let Err(e) = result {
                    return e;
                }
            }
            0
        })
    };
    posted.unwrap_or(libc::EINVAL)
}

unsafe extern "C" fn wr_send(qp: *mut ffi::ibv_qp_ex) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::Send) };
}

unsafe extern "C" fn wr_send_imm(qp: *mut ffi::ibv_qp_ex, imm_data: ffi::__be32) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::SendImm(u32::from_be(imm_data))) };
}

unsafe extern "C" fn wr_send_inv(qp: *mut ffi::ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::SendInv(invalidate_rkey)) };
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ffi::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::Write(Remote { addr: remote_addr, rkey })) };
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ffi::ibv_qp_ex, rkey: u32, remote_addr: u64, imm: ffi::__be32) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::WriteImm(Remote { addr: remote_addr, rkey }, u32::from_be(imm))) };
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ffi::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::Read(Remote { addr: remote_addr, rkey })) };
}

unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut ffi::ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::CompareSwap(Remote { addr: remote_addr, rkey }, compare, swap)) };
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ffi::ibv_qp_ex, rkey: u32, remote_addr: u64, add_value: u64) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::FetchAdd(Remote { addr: remote_addr, rkey }, add_value)) };
}

unsafe extern "C" fn wr_set_sge(qp: *mut ffi::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: as above.
    unsafe {
        set_last(qp, |p| {
            p.wr.sgl = vec![Sge { addr, length, lkey }];
            Ok(())
        })
    };
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ffi::ibv_qp_ex, num_sge: usize, sg_list: *const ffi::ibv_sge) {
    let max = i32::try_from(num_sge).unwrap_or(i32::MAX);
    // SAFETY: the application's list of `num_sge` entries.
    let sgl = unsafe { crate::post::sgl_of(sg_list, max) };
    // SAFETY: as above.
    unsafe {
        set_last(qp, |p| {
            p.wr.sgl = sgl?;
            Ok(())
        })
    };
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ffi::ibv_qp_ex, addr: *mut c_void, length: usize) {
    let buf = ffi::ibv_data_buf { addr, length };
    // SAFETY: as above; one buffer.
    unsafe { wr_set_inline_data_list(qp, 1, &buf) };
}

/// Copies the inline bytes now, as rdma-core's providers do: the application may reuse
/// its buffers once the call returns.
unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ffi::ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ffi::ibv_data_buf,
) {
    let bufs = if num_buf == 0 || buf_list.is_null() {
        &[][..]
    } else {
        // SAFETY: the application's list of `num_buf` buffers.
        unsafe { std::slice::from_raw_parts(buf_list, num_buf) }
    };
    let total: usize = bufs.iter().map(|b| b.length).sum();
    if total > INLINE_MAX_BYTES as usize || (num_buf > 0 && buf_list.is_null()) {
        // SAFETY: as above.
        return unsafe { refuse(qp, libc::EINVAL) };
    }
    let mut bytes = Vec::with_capacity(total);
    for b in bufs.iter().filter(|b| b.length > 0) {
        // SAFETY: each buffer is the application's readable bytes.
        bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(b.addr.cast::<u8>(), b.length) });
    }
    // SAFETY: as above.
    unsafe {
        set_last(qp, |p| {
            p.inline = Some(bytes);
            Ok(())
        })
    };
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ffi::ibv_qp_ex, ah: *mut ffi::ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    // SAFETY: the application names a live address handle this library made (or NULL).
    let Some(ah) = (unsafe { ah.cast::<SoftAh>().as_ref() }) else {
        // SAFETY: as above.
        return unsafe { refuse(qp, libc::EINVAL) };
    };
    let dest = UdDest { gid: ah.gid, qpn: remote_qpn, qkey: remote_qkey };
    // SAFETY: as above.
    unsafe {
        set_last(qp, |p| {
            p.wr.ud = Some(dest);
            Ok(())
        })
    };
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ffi::ibv_qp_ex,
    mw: *mut ffi::ibv_mw,
    rkey: u32,
    info: *const ffi::ibv_mw_bind_info,
) {
    // SAFETY: the application's window and bind information, live and this library's.
    let op = unsafe { info.as_ref() }.ok_or(libc::EINVAL).and_then(|i| unsafe { crate::mw::bind_op(mw, rkey, i) });
    match op {
        // SAFETY: as above.
        Ok(op) => unsafe { add(qp, op) },
        // SAFETY: as above.
        Err(e) => unsafe { refuse(qp, e) },
    }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ffi::ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: as above.
    unsafe { add(qp, SendOp::LocalInv(invalidate_rkey)) };
}

unsafe extern "C" fn wr_send_tso(qp: *mut ffi::ibv_qp_ex, _: *mut c_void, _: u16, _: u16) {
    // SAFETY: as above.
    unsafe { refuse(qp, libc::EOPNOTSUPP) };
}

/// `ibv_wr_set_xrc_srqn`: the target SRQ of an XRC initiator's request.
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ffi::ibv_qp_ex, remote_srqn: u32) {
    // SAFETY: as above.
    unsafe {
        set_last(qp, |p| {
            p.wr.xrc_srqn = remote_srqn;
            Ok(())
        })
    };
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr`, copied now, stored at once at the
/// remote address (IBTA vol.1 1.5, Memory Placement Extensions).
unsafe extern "C" fn wr_atomic_write(qp: *mut ffi::ibv_qp_ex, rkey: u32, remote_addr: u64, atomic_wr: *const c_void) {
    if atomic_wr.is_null() {
        // SAFETY: as above.
        return unsafe { refuse(qp, libc::EINVAL) };
    }
    let mut bytes = [0u8; 8];
    // SAFETY: the caller's contract: 8 readable bytes at `atomic_wr`.
    unsafe { std::ptr::copy_nonoverlapping(atomic_wr.cast::<u8>(), bytes.as_mut_ptr(), 8) };
    // SAFETY: as above.
    unsafe { add(qp, SendOp::AtomicWrite(Remote { addr: remote_addr, rkey }, bytes)) };
}
