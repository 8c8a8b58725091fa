//! Queue pairs: create, modify, query, destroy. Posting is in [`crate::post`].

use crate::cq::soft_cq;
use crate::device::soft_context;
use crate::ffi;
use crate::objects::{fail, soft_pd};
use softrdma::verbs::{Access, Mtu, QpAttr, QpCaps, QpState, QpType, QueuePair};
use std::ffi::c_int;
use std::sync::Mutex;

/// Most inline data a send request carries (`max_inline_data`).
pub const INLINE_MAX_BYTES: u32 = 256;

/// `ibv_qp` and its softrdma QP.
#[repr(C)]
pub struct SoftQp {
    /// What applications see: an `ibv_qp`, extended by the `ibv_wr_*` table
    /// ([`crate::wr`]) when it was made with `ibv_create_qp_ex` and send operations.
    pub ex: ffi::ibv_qp_ex,
    /// Made with send operations: [`ibv_qp_to_qp_ex`] hands out `ex`.
    pub extended: bool,
    /// The requests an application builds with `ibv_wr_*` until `wr_complete`.
    pub batch: Mutex<crate::wr::WrBatch>,
    /// The engine's QP.
    pub qp: QueuePair,
    /// Every send request completes (`sq_sig_all`).
    pub sig_all: bool,
    /// Where inline data is copied for the engine to gather (`IBV_SEND_INLINE`): the
    /// engine takes a small message's bytes when it is posted, so one buffer serves.
    pub inline: Mutex<softrdma::verbs::MemoryRegion>,
    /// The gate of the rdma_cm id that made it (`rdma_create_qp`), closed when the QP is
    /// destroyed, however the application destroys it, so the id's threads stop using it.
    pub cm_gate: Mutex<Option<std::sync::Arc<Mutex<bool>>>>,
    /// The capacities it was created with, as `ibv_query_qp` reports them.
    pub caps: ffi::ibv_qp_cap,
    /// Attributes the engine does not report back: the Q_Key, the destination QP, the
    /// access flags, as last set.
    pub set: Mutex<ffi::ibv_qp_attr>,
    /// The indirection table a receive-side scaling QP uses (0: none), released when the
    /// QP goes ([`crate::wq::table_released`]).
    pub rss_table: std::sync::atomic::AtomicUsize,
}

impl SoftQp {
    /// The `ibv_qp` applications see.
    pub fn ibv(&self) -> &ffi::ibv_qp {
        &self.ex.qp_base
    }
}

/// The [`SoftQp`] of a QP this library made.
///
/// # Safety
/// `qp` came from [`ibv_create_qp`] and is not destroyed.
pub unsafe fn soft_qp<'a>(qp: *mut ffi::ibv_qp) -> Option<&'a SoftQp> {
    // SAFETY: `ex` begins the repr(C) SoftQp, and its `qp_base` begins `ex`.
    unsafe { qp.cast::<SoftQp>().as_ref() }
}

fn qp_type_of(t: ffi::ibv_qp_type) -> Option<QpType> {
    match t {
        ffi::IBV_QPT_RC => Some(QpType::Rc),
        ffi::IBV_QPT_UC => Some(QpType::Uc),
        ffi::IBV_QPT_UD => Some(QpType::Ud),
        ffi::IBV_QPT_RAW_PACKET => Some(QpType::RawPacket),
        _ => None,
    }
}

/// Checks the requested capacities against the device's and returns what the QP gets.
pub(crate) fn caps_of(cap: &ffi::ibv_qp_cap) -> Result<QpCaps, c_int> {
    let sge = cap.max_send_sge.max(cap.max_recv_sge).max(1) as usize;
    if cap.max_send_wr > 16384 || cap.max_recv_wr > 16384 || sge > 16 || cap.max_inline_data > INLINE_MAX_BYTES {
        return Err(libc::EINVAL);
    }
    Ok(QpCaps {
        max_send_wr: cap.max_send_wr.max(1) as usize,
        max_recv_wr: cap.max_recv_wr.max(1) as usize,
        max_sge: sge,
    })
}

/// `ibv_create_qp` (RC, UC, UD); `attr.cap` is updated to what the QP got.
///
/// # Safety
/// `pd` is a live PD; `attr` points to a `struct ibv_qp_init_attr` naming live CQs.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ffi::ibv_pd, attr: *mut ffi::ibv_qp_init_attr) -> *mut ffi::ibv_qp {
    // SAFETY: the caller's contract.
    let xrc = unsafe { attr.as_ref() }.filter(|a| a.qp_type == ffi::IBV_QPT_XRC_SEND);
    // SAFETY: the caller's contract: a PD of this library.
    if let (Some(a), Some(spd)) = (xrc, unsafe { soft_pd(pd) }) {
        // The inline ibv_create_qp_ex comes here for an XRC initiator with a PD alone.
        // SAFETY: plain C data; all-zero is valid.
        let mut ex: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        (ex.qp_context, ex.send_cq, ex.cap, ex.qp_type) = (a.qp_context, a.send_cq, a.cap, a.qp_type);
        (ex.sq_sig_all, ex.comp_mask, ex.pd) = (a.sq_sig_all, ffi::IBV_QP_INIT_ATTR_PD, pd);
        // SAFETY: the caller's contract.
        let qp = unsafe { crate::xrc::create_qp(spd.ibv.context, &mut ex) };
        // SAFETY: the caller's contract: `attr` is writable.
        unsafe { (*attr).cap = ex.cap };
        return qp;
    }
    // SAFETY: the caller's contract.
    unsafe { create_qp(pd, attr, false, false) }
}

/// `verbs_context.create_qp_ex`, which the inline `ibv_create_qp_ex` calls for anything
/// beyond a PD: send operations (the `ibv_wr_*` API) and no creation flags.
///
/// # Safety
/// `attr` points to a `struct ibv_qp_init_attr_ex` naming a live PD and CQs.
pub unsafe extern "C" fn create_qp_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_qp_init_attr_ex,
) -> *mut ffi::ibv_qp {
    // SAFETY: the caller's contract.
    let Some(a) = (unsafe { attr.as_mut() }) else { return fail(libc::EINVAL) };
    if matches!(a.qp_type, ffi::IBV_QPT_XRC_SEND | ffi::IBV_QPT_XRC_RECV) {
        // SAFETY: the caller's contract.
        return unsafe { crate::xrc::create_qp(ctx, a) };
    }
    if a.comp_mask & (ffi::IBV_QP_INIT_ATTR_IND_TABLE | ffi::IBV_QP_INIT_ATTR_RX_HASH) != 0 {
        // SAFETY: the caller's contract.
        return unsafe { crate::wq::create_rss_qp(ctx, a) };
    }
    let (mut basic, extended) = match basic_attr(a) {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    if a.comp_mask & ffi::IBV_QP_INIT_ATTR_PD == 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    let qp = unsafe { create_qp(a.pd, &mut basic, false, extended) };
    a.cap = basic.cap;
    qp
}

/// The basic attributes the extended ones begin with, field for field, and whether
/// they ask for send operations; EOPNOTSUPP for what softrdma does not do (creation
/// flags, XRC, RSS, TSO, an operation outside [`crate::wr::SEND_OPS_SUPPORTED`]).
pub fn basic_attr(a: &ffi::ibv_qp_init_attr_ex) -> Result<(ffi::ibv_qp_init_attr, bool), c_int> {
    let known = ffi::IBV_QP_INIT_ATTR_PD | ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS;
    let has = |m: u32| a.comp_mask & m != 0;
    if a.comp_mask & !known != 0 || (has(ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS) && a.create_flags != 0) {
        return Err(libc::EOPNOTSUPP);
    }
    let extended = has(ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS);
    if extended && a.send_ops_flags & !crate::wr::SEND_OPS_SUPPORTED != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let basic = ffi::ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    Ok((basic, extended))
}

/// A QP for `ibv_create_qp`, or (`for_cm`) an RC QP for `rdma_create_qp`, which the
/// connection manager brings up (on RoCEv2 it starts in INIT, as rdma_cm leaves it).
///
/// # Safety
/// As [`ibv_create_qp`].
pub unsafe fn create_qp(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_qp_init_attr,
    for_cm: bool,
    extended: bool,
) -> *mut ffi::ibv_qp {
    // SAFETY: the caller's contract.
    let (Some(spd), Some(a)) = (unsafe { soft_pd(pd) }, unsafe { attr.as_mut() }) else { return fail(libc::EINVAL) };
    // SAFETY: the caller's contract: live CQs of the same context.
    let (Some(scq), Some(rcq)) = (unsafe { soft_cq(a.send_cq) }, unsafe { soft_cq(a.recv_cq) }) else {
        return fail(libc::EINVAL);
    };
    let Some(kind) = qp_type_of(a.qp_type) else { return fail(libc::EOPNOTSUPP) };
    // SAFETY: the caller's contract: NULL or a live SRQ of the same context.
    let srq = unsafe { crate::srq::soft_srq(a.srq) };
    let caps = match caps_of(&a.cap) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // SAFETY: the PD's context is open.
    let Some(soft) = (unsafe { soft_context(spd.ibv.context) }) else { return fail(libc::EINVAL) };
    let Ok(engine) = soft.engine() else { return fail(libc::EIO) };
    // rdma_cm's ids: RC (connected by the CM) and UD (RDMA_PS_UDP, made here as any UD QP).
    // iWARP has RC QPs only (RFC 5040), as siw.
    let iwarp = engine.transport() == softrdma::verbs::Transport::Iwarp;
    if (for_cm && !matches!(kind, QpType::Rc | QpType::Ud)) || (iwarp && kind != QpType::Rc) {
        return fail(libc::EOPNOTSUPP);
    }
    let made = if for_cm && kind == QpType::Rc {
        engine.create_cm_qp(&spd.pd, (&scq.cq, &rcq.cq), caps, srq.map(|s| &s.srq))
    } else {
        engine.create_qp(&spd.pd, &scq.cq, &rcq.cq, kind, caps, srq.map(|s| &s.srq))
    };
    let qp = match made {
        Ok(q) => q,
        Err(_) => return fail(libc::ENOMEM),
    };
    wrap_qp(soft, qp, (pd, &spd.pd), a, extended, caps)
}

/// The `ibv_qp` of the engine's `qp`, made with `a` in PD `pd` (NULL for an XRC target,
/// whose inline buffer, never used, goes in `inline_pd`), known to the device's events.
pub(crate) fn wrap_qp(
    soft: &crate::device::SoftContext,
    qp: QueuePair,
    (pd, inline_pd): (*mut ffi::ibv_pd, &softrdma::verbs::ProtectionDomain),
    a: &mut ffi::ibv_qp_init_attr,
    extended: bool,
    caps: QpCaps,
) -> *mut ffi::ibv_qp {
    let Ok(engine) = soft.engine() else { return fail(libc::EIO) };
    let Ok(inline) = engine.reg_mr(inline_pd, INLINE_MAX_BYTES as usize, Access::default()) else {
        return fail(libc::ENOMEM);
    };
    a.cap.max_inline_data = INLINE_MAX_BYTES;
    a.cap.max_send_sge = caps.max_sge as u32;
    a.cap.max_recv_sge = caps.max_sge as u32;
    // SAFETY: ibv_qp is plain C data (mutex and condvar valid all-zero on glibc).
    let mut ibv: ffi::ibv_qp = unsafe { std::mem::zeroed() };
    ibv.context = soft.ibv_context();
    ibv.qp_context = a.qp_context;
    ibv.pd = pd;
    ibv.send_cq = a.send_cq;
    ibv.recv_cq = a.recv_cq;
    ibv.qp_num = qp.qp_num();
    ibv.state = qp.state().map_or(ffi::IBV_QPS_RESET, ibv_state);
    ibv.qp_type = a.qp_type;
    // SAFETY: ibv_qp_ex is plain C data; all-zero is valid (every slot empty).
    let mut ex: ffi::ibv_qp_ex = unsafe { std::mem::zeroed() };
    ex.qp_base = ibv;
    if extended {
        crate::wr::install(&mut ex);
    }
    let soft_qp = SoftQp {
        ex,
        extended,
        batch: Mutex::default(),
        qp,
        sig_all: a.sq_sig_all != 0,
        inline: Mutex::new(inline),
        cm_gate: Mutex::new(None),
        caps: a.cap,
        // SAFETY: plain C data; all-zero is valid.
        set: Mutex::new(unsafe { std::mem::zeroed() }),
        rss_table: std::sync::atomic::AtomicUsize::new(0),
    };
    let qpn = soft_qp.qp.qp_num();
    let made: *mut ffi::ibv_qp = Box::into_raw(Box::new(soft_qp)).cast();
    crate::event::add_object(soft.device, crate::event::Kind::Qp, qpn, made as usize, soft.ibv_context());
    made
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// `qp` came from [`ibv_create_qp`]; nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ffi::ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by Box in ibv_create_qp, given back once.
    let owned = unsafe { Box::from_raw(qp.cast::<SoftQp>()) };
    crate::wq::table_released(owned.rss_table.load(std::sync::atomic::Ordering::Acquire));
    // SAFETY: the QP's context is open.
    if let Some(soft) = unsafe { soft_context(owned.ibv().context) } {
        crate::event::remove_object(soft.device, crate::event::Kind::Qp, owned.qp.qp_num());
        crate::cm_watch::forget_qp(crate::event::device_key(soft.device), owned.qp.qp_num());
    }
    let gate = owned.cm_gate.lock().unwrap_or_else(|e| e.into_inner()).take();
    // Closed before the QP goes: a thread holding the gate finishes with the QP first.
    let closed = gate.as_ref().map(|g| {
        let mut open = g.lock().unwrap_or_else(|e| e.into_inner());
        *open = false;
        open
    });
    drop(owned);
    drop(closed);
    0
}

fn state_of(s: ffi::ibv_qp_state) -> Option<QpState> {
    Some(match s {
        ffi::IBV_QPS_RESET => QpState::Reset,
        ffi::IBV_QPS_INIT => QpState::Init,
        ffi::IBV_QPS_RTR => QpState::Rtr,
        ffi::IBV_QPS_RTS => QpState::Rts,
        ffi::IBV_QPS_SQD => QpState::Sqd,
        ffi::IBV_QPS_SQE => QpState::Sqe,
        ffi::IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

fn ibv_state(s: QpState) -> ffi::ibv_qp_state {
    match s {
        QpState::Reset => ffi::IBV_QPS_RESET,
        QpState::Init => ffi::IBV_QPS_INIT,
        QpState::Rtr => ffi::IBV_QPS_RTR,
        QpState::Rts => ffi::IBV_QPS_RTS,
        QpState::Sqd => ffi::IBV_QPS_SQD,
        QpState::Sqe => ffi::IBV_QPS_SQE,
        QpState::Err => ffi::IBV_QPS_ERR,
    }
}

/// `ibv_qp_attr` and its mask to softrdma's attributes (IBTA 11.2.4.2).
fn attr_of(a: &ffi::ibv_qp_attr, mask: c_int) -> Result<QpAttr, c_int> {
    let has = |m: ffi::ibv_qp_attr_mask| mask as u32 & m != 0;
    let mut q = QpAttr::default();
    if has(ffi::IBV_QP_STATE) {
        q.state = Some(state_of(a.qp_state).ok_or(libc::EINVAL)?);
    }
    if has(ffi::IBV_QP_ACCESS_FLAGS) {
        let f = a.qp_access_flags;
        q.access = Some(Access {
            local_write: f & ffi::IBV_ACCESS_LOCAL_WRITE != 0,
            remote_read: f & ffi::IBV_ACCESS_REMOTE_READ != 0,
            remote_write: f & ffi::IBV_ACCESS_REMOTE_WRITE != 0,
            remote_atomic: f & ffi::IBV_ACCESS_REMOTE_ATOMIC != 0,
            remote_invalidate: true,
            mw_bind: f & ffi::IBV_ACCESS_MW_BIND != 0,
        });
    }
    if has(ffi::IBV_QP_PKEY_INDEX) {
        q.pkey = Some(0xffff);
    }
    if has(ffi::IBV_QP_QKEY) {
        q.qkey = Some(a.qkey);
    }
    if has(ffi::IBV_QP_AV) {
        // RoCE addresses by GID: an address vector without the GRH names nothing.
        if a.ah_attr.is_global == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: every bit pattern of the union is a valid array of bytes.
        q.dest_gid = Some(unsafe { a.ah_attr.grh.dgid.raw });
        q.sgid_index = Some(a.ah_attr.grh.sgid_index);
    }
    if has(ffi::IBV_QP_PATH_MTU) {
        q.path_mtu = Some(Mtu::from_code(a.path_mtu as u8).ok_or(libc::EINVAL)?);
    }
    let set = |on: bool, v: u8| on.then_some(v);
    q.timeout = set(has(ffi::IBV_QP_TIMEOUT), a.timeout);
    q.retry_cnt = set(has(ffi::IBV_QP_RETRY_CNT), a.retry_cnt);
    q.rnr_retry = set(has(ffi::IBV_QP_RNR_RETRY), a.rnr_retry);
    q.min_rnr_timer = set(has(ffi::IBV_QP_MIN_RNR_TIMER), a.min_rnr_timer);
    q.max_rd_atomic = set(has(ffi::IBV_QP_MAX_QP_RD_ATOMIC), a.max_rd_atomic);
    q.max_dest_rd_atomic = set(has(ffi::IBV_QP_MAX_DEST_RD_ATOMIC), a.max_dest_rd_atomic);
    q.rq_psn = has(ffi::IBV_QP_RQ_PSN).then_some(a.rq_psn);
    q.sq_psn = has(ffi::IBV_QP_SQ_PSN).then_some(a.sq_psn);
    q.dest_qpn = has(ffi::IBV_QP_DEST_QPN).then_some(a.dest_qp_num);
    Ok(q)
}

/// `ibv_modify_qp`.
///
/// # Safety
/// `qp` is a live QP; `attr` points to a `struct ibv_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ffi::ibv_qp, attr: *mut ffi::ibv_qp_attr, mask: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(sq), Some(a)) = (unsafe { soft_qp(qp) }, unsafe { attr.as_ref() }) else { return libc::EINVAL };
    let q = match attr_of(a, mask) {
        Ok(q) => q,
        Err(e) => return e,
    };
    if sq.qp.modify(&q).is_err() {
        return libc::EINVAL;
    }
    remember(&mut sq.set.lock().unwrap_or_else(|e| e.into_inner()), a, mask);
    if let Some(s) = sq.qp.state() {
        // SAFETY: the QP is live; applications read `state` without a call.
        unsafe { (*qp).state = ibv_state(s) };
    }
    0
}

/// Keeps what `ibv_query_qp` reports from the application's own settings.
fn remember(set: &mut ffi::ibv_qp_attr, a: &ffi::ibv_qp_attr, mask: c_int) {
    let has = |m: ffi::ibv_qp_attr_mask| mask as u32 & m != 0;
    if has(ffi::IBV_QP_QKEY) {
        set.qkey = a.qkey;
    }
    if has(ffi::IBV_QP_DEST_QPN) {
        set.dest_qp_num = a.dest_qp_num;
    }
    if has(ffi::IBV_QP_ACCESS_FLAGS) {
        set.qp_access_flags = a.qp_access_flags;
    }
    if has(ffi::IBV_QP_PATH_MTU) {
        set.path_mtu = a.path_mtu;
    }
    if has(ffi::IBV_QP_AV) {
        set.ah_attr = a.ah_attr;
    }
    let bytes = [
        (ffi::IBV_QP_TIMEOUT, &mut set.timeout, a.timeout),
        (ffi::IBV_QP_RETRY_CNT, &mut set.retry_cnt, a.retry_cnt),
        (ffi::IBV_QP_RNR_RETRY, &mut set.rnr_retry, a.rnr_retry),
        (ffi::IBV_QP_MIN_RNR_TIMER, &mut set.min_rnr_timer, a.min_rnr_timer),
        (ffi::IBV_QP_MAX_QP_RD_ATOMIC, &mut set.max_rd_atomic, a.max_rd_atomic),
        (ffi::IBV_QP_MAX_DEST_RD_ATOMIC, &mut set.max_dest_rd_atomic, a.max_dest_rd_atomic),
    ];
    for (m, field, v) in bytes {
        if has(m) {
            *field = v;
        }
    }
}

/// `ibv_query_qp`: the state and sequence numbers softrdma keeps, and the capacities.
///
/// # Safety
/// `qp` is a live QP; `attr` and `init` point to their structures.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_qp_attr,
    _mask: c_int,
    init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(sq), Some(a)) = (unsafe { soft_qp(qp) }, unsafe { attr.as_mut() }) else { return libc::EINVAL };
    let Some(info) = sq.qp.query() else { return libc::EINVAL };
    *a = *sq.set.lock().unwrap_or_else(|e| e.into_inner());
    a.cap = sq.caps;
    a.port_num = 1;
    a.qp_state = ibv_state(info.state);
    a.cur_qp_state = a.qp_state;
    a.sq_psn = info.sq_psn;
    a.rq_psn = info.rq_psn;
    // SAFETY: the caller's contract.
    if let Some(i) = unsafe { init.as_mut() } {
        i.qp_context = sq.ibv().qp_context;
        i.send_cq = sq.ibv().send_cq;
        i.recv_cq = sq.ibv().recv_cq;
        i.qp_type = sq.ibv().qp_type;
        i.sq_sig_all = c_int::from(sq.sig_all);
        i.cap = sq.caps;
    }
    0
}

/// `ibv_qp_to_qp_ex`: the extended QP of one made with send operations
/// ([`create_qp_ex`]); NULL (EOPNOTSUPP) for any other, which applications take as
/// "use ibv_post_send".
///
/// # Safety
/// `qp` is NULL or a live QP this library made.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ffi::ibv_qp) -> *mut ffi::ibv_qp_ex {
    // SAFETY: the caller's contract.
    match unsafe { soft_qp(qp) } {
        Some(sq) if sq.extended => qp.cast(),
        _ => fail(libc::EOPNOTSUPP),
    }
}
