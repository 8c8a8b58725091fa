//! Posting: `ibv_send_wr` and `ibv_recv_wr` chains into the engine, through the context's
//! operation table (`ibv_post_send` and `ibv_post_recv` are inline in the application).
//! As rdma-core's providers do, requests are taken in order until one is refused, which
//! `bad_wr` then names; the ones before it stay posted.

use crate::ffi;
use crate::objects::SoftAh;
use crate::qp::{soft_qp, SoftQp, INLINE_MAX_BYTES};
use softrdma::verbs::{RecvWr, Remote, SendOp, SendWr, Sge, UdDest, VerbsError};
use std::ffi::c_int;

/// The request's scatter/gather list.
///
/// # Safety
/// `sg_list` holds `num_sge` entries (or `num_sge` is 0).
pub(crate) unsafe fn sgl_of(sg_list: *const ffi::ibv_sge, num_sge: c_int) -> Result<Vec<Sge>, c_int> {
    if !(0..=16).contains(&num_sge) || (num_sge > 0 && sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let n = num_sge as usize;
    let raw = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(sg_list, n) } };
    Ok(raw.iter().map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect())
}

/// The operation of a send request, and its destination on a UD QP (`is_ud`: only then
/// does the union hold an address handle).
///
/// # Safety
/// `wr` is the application's request; on a UD QP its `ah` is live.
unsafe fn op_of(wr: &ffi::ibv_send_wr, is_ud: bool) -> Result<(SendOp, Option<UdDest>), c_int> {
    // SAFETY (all union reads below): the opcode says which member the caller filled,
    // and every member is plain integers and pointers.
    let rdma = unsafe { wr.wr.rdma };
    let at = Remote { addr: rdma.remote_addr, rkey: rdma.rkey };
    let atomic = unsafe { wr.wr.atomic };
    let at_atomic = Remote { addr: atomic.remote_addr, rkey: atomic.rkey };
    let imm = u32::from_be(unsafe { wr.__bindgen_anon_1.imm_data });
    let op = match wr.opcode {
        ffi::IBV_WR_SEND => SendOp::Send,
        ffi::IBV_WR_SEND_WITH_IMM => SendOp::SendImm(imm),
        ffi::IBV_WR_SEND_WITH_INV => SendOp::SendInv(unsafe { wr.__bindgen_anon_1.invalidate_rkey }),
        ffi::IBV_WR_RDMA_WRITE => SendOp::Write(at),
        ffi::IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm(at, imm),
        ffi::IBV_WR_RDMA_READ => SendOp::Read(at),
        ffi::IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap(at_atomic, atomic.compare_add, atomic.swap),
        ffi::IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd(at_atomic, atomic.compare_add),
        ffi::IBV_WR_LOCAL_INV => SendOp::LocalInv(unsafe { wr.__bindgen_anon_1.invalidate_rkey }),
        ffi::IBV_WR_BIND_MW => {
            let b = unsafe { wr.__bindgen_anon_2.bind_mw };
            // SAFETY: the application names a live window and region of this library.
            unsafe { crate::mw::bind_op(b.mw, b.rkey, &b.bind_info) }?
        }
        _ => return Err(libc::EOPNOTSUPP),
    };
    if !is_ud {
        return Ok((op, None));
    }
    let ud = unsafe { wr.wr.ud };
    // SAFETY: on a UD QP the caller names a live address handle (or NULL).
    let ah = unsafe { ud.ah.cast::<SoftAh>().as_ref() }.ok_or(libc::EINVAL)?;
    Ok((op, Some(UdDest { gid: ah.gid, qpn: ud.remote_qpn, qkey: ud.remote_qkey })))
}

/// Errno for a refused post.
pub(crate) fn errno_of(e: VerbsError) -> c_int {
    match e {
        VerbsError::QueueFull => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// One send request into the engine.
///
/// # Safety
/// `wr` is the application's request, its buffers and handles live.
unsafe fn post_one(sq: &SoftQp, wr: &ffi::ibv_send_wr) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let sgl = unsafe { sgl_of(wr.sg_list, wr.num_sge) }?;
    let is_ud = sq.ibv().qp_type == ffi::IBV_QPT_UD;
    // SAFETY: the caller's contract.
    let (op, ud) = unsafe { op_of(wr, is_ud) }?;
    let flags = wr.send_flags;
    let mut req = SendWr::new(wr.wr_id, op, sgl);
    req.signaled = sq.sig_all || flags & ffi::IBV_SEND_SIGNALED != 0;
    req.solicited = flags & ffi::IBV_SEND_SOLICITED != 0;
    req.ud = ud;
    if sq.ibv().qp_type == ffi::IBV_QPT_XRC_SEND {
        // SAFETY: an XRC initiator's requests name the target SRQ in this member.
        req.xrc_srqn = unsafe { wr.qp_type.xrc.remote_srqn };
    }
    if flags & ffi::IBV_SEND_INLINE == 0 {
        return sq.qp.post_send(req).map_err(errno_of);
    }
    // Inline: the bytes are read now, from the application's addresses, with no key.
    let total: u64 = req.sgl.iter().map(|s| u64::from(s.length)).sum();
    if total > u64::from(INLINE_MAX_BYTES) {
        return Err(libc::EINVAL);
    }
    let parts: Vec<&[u8]> = req
        .sgl
        .iter()
        // SAFETY: an inline request's SGEs point at the caller's readable bytes.
        .map(|s| unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) })
        .collect();
    post_inline(sq, req, &parts)
}

/// Posts `req` with `parts` as its payload, copied into the QP's inline buffer (at most
/// [`INLINE_MAX_BYTES`] in all).
pub(crate) fn post_inline(sq: &SoftQp, mut req: SendWr, parts: &[&[u8]]) -> Result<(), c_int> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    if total > INLINE_MAX_BYTES as usize {
        return Err(libc::EINVAL);
    }
    let bounce = sq.inline.lock().unwrap_or_else(|e| e.into_inner());
    let mut at = 0usize;
    for bytes in parts {
        bounce.write(at, bytes);
        at += bytes.len();
    }
    req.sgl = vec![bounce.sge(0, total as u32)];
    // The engine takes a message this small when it is posted, so the buffer is free
    // again when the post returns.
    sq.qp.post_send(req).map_err(errno_of)
}

/// The `post_send` operation.
///
/// # Safety
/// `qp` is a live QP; `wr` a NULL-terminated chain of requests; `bad` NULL or writable.
pub unsafe extern "C" fn post_send(
    qp: *mut ffi::ibv_qp,
    wr: *mut ffi::ibv_send_wr,
    bad: *mut *mut ffi::ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(sq) = (unsafe { soft_qp(qp) }) else { return libc::EINVAL };
    // SAFETY: a live QP's send CQ is live.
    if let Some(cq) = unsafe { crate::cq::soft_cq(sq.ibv().send_cq) } {
        cq.note_call();
    }
    let mut cur = wr;
    // SAFETY: a NULL-terminated chain of the caller's requests.
    while let Some(w) = unsafe { cur.as_ref() } {
        // SAFETY: the caller's contract.
        if let Err(e) = unsafe { post_one(sq, w) } {
            if !bad.is_null() {
                // SAFETY: a valid out-pointer.
                unsafe { *bad = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// The `post_recv` operation.
///
/// # Safety
/// `qp` is a live QP; `wr` a NULL-terminated chain of requests; `bad` NULL or writable.
pub unsafe extern "C" fn post_recv(
    qp: *mut ffi::ibv_qp,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(sq) = (unsafe { soft_qp(qp) }) else { return libc::EINVAL };
    // SAFETY: the caller's contract.
    unsafe { post_recv_chain(wr, bad, |r| sq.qp.post_recv(r)) }
}

/// Posts a chain of receive requests with `post`, in order until one is refused, which
/// `bad` then names (a QP's receive queue, or an SRQ).
///
/// # Safety
/// `wr` is a NULL-terminated chain of requests; `bad` NULL or writable.
pub(crate) unsafe fn post_recv_chain(
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
    post: impl Fn(RecvWr) -> Result<(), VerbsError>,
) -> c_int {
    let mut cur = wr;
    // SAFETY: a NULL-terminated chain of the caller's requests.
    while let Some(w) = unsafe { cur.as_ref() } {
        // SAFETY: the caller's contract.
        let posted = unsafe { sgl_of(w.sg_list, w.num_sge) }
            .and_then(|sgl| post(RecvWr { wr_id: w.wr_id, sgl }).map_err(errno_of));
        if let Err(e) = posted {
            if !bad.is_null() {
                // SAFETY: a valid out-pointer.
                unsafe { *bad = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}
