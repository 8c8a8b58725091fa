//! The extended CQ (`ibv_create_cq_ex`, rdma-core's `ibv_create_cq_ex(3)`): an application
//! walks completions with `start_poll`, `next_poll` and `end_poll` and reads each field it
//! asked for with `read_*`, through the `ibv_cq_ex` table [`create_cq_ex`] fills. A
//! completion is taken from the engine one at a time, so nothing is left behind at
//! `end_poll` for `ibv_poll_cq` to miss.

use crate::cq::{ibv_create_cq, soft_cq, to_ibv_wc, SoftCq};
use crate::ffi;
use crate::objects::fail;
use std::ffi::c_int;

/// The fields an extended completion can carry here: the ones `struct ibv_wc` has, and
/// the time the completion reached the CQ (the device clock, ns: `hca_core_clock` 1 GHz)
/// and its wall-clock time. VLANs, flow tags and tag matching are refused (EOPNOTSUPP).
pub const WC_FLAGS_SUPPORTED: u64 = (ffi::IBV_WC_EX_WITH_BYTE_LEN
    | ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
    | ffi::IBV_WC_EX_WITH_IMM
    | ffi::IBV_WC_EX_WITH_QP_NUM
    | ffi::IBV_WC_EX_WITH_SRC_QP
    | ffi::IBV_WC_EX_WITH_SLID
    | ffi::IBV_WC_EX_WITH_SL
    | ffi::IBV_WC_EX_WITH_DLID_PATH_BITS
    | ffi::IBV_WC_EX_WITH_TM_INFO) as u64;

/// `verbs_context.create_cq_ex`, which the inline `ibv_create_cq_ex` calls.
///
/// # Safety
/// `ctx` is an open context; `attr` points to a `struct ibv_cq_init_attr_ex`.
pub unsafe extern "C" fn create_cq_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_cq_init_attr_ex,
) -> *mut ffi::ibv_cq_ex {
    // SAFETY: the caller's contract.
    let Some(a) = (unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
    let single_threaded = ffi::IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
    let flags_ok = a.comp_mask & ffi::IBV_CQ_INIT_ATTR_MASK_FLAGS == 0 || a.flags & !single_threaded == 0;
    if a.wc_flags & !WC_FLAGS_SUPPORTED != 0 || !flags_ok {
        return fail(libc::EOPNOTSUPP);
    }
    // A CQ may be made in a parent domain ([`crate::parent`]), and only in one.
    // SAFETY: the caller's contract: a PD of this library.
    let in_parent = || unsafe { crate::objects::soft_pd(a.parent_domain) }.is_some_and(|p| p.parent.is_some());
    if a.comp_mask & ffi::IBV_CQ_INIT_ATTR_MASK_PD != 0 && !in_parent() {
        return fail(libc::EINVAL);
    }
    let cqe = c_int::try_from(a.cqe).unwrap_or(c_int::MAX);
    let comp_vector = c_int::try_from(a.comp_vector).unwrap_or(c_int::MAX);
    // SAFETY: the caller's contract.
    let cq = unsafe { ibv_create_cq(ctx, cqe, a.cq_context, a.channel, comp_vector) };
    if cq.is_null() {
        return std::ptr::null_mut();
    }
    let ex = cq.cast::<ffi::ibv_cq_ex>();
    // SAFETY: ibv_create_cq made a SoftCq, which begins with an ibv_cq_ex; nobody else
    // holds it yet.
    install(unsafe { &mut *ex });
    let times = (ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) as u64;
    if a.wc_flags & times != 0 {
        // SAFETY: as above.
        if let Some(c) = unsafe { soft_cq(cq) } {
            c.cq.stamp_completions();
        }
    }
    ex
}

fn install(ex: &mut ffi::ibv_cq_ex) {
    ex.start_poll = Some(start_poll);
    ex.next_poll = Some(next_poll);
    ex.end_poll = Some(end_poll);
    ex.read_opcode = Some(read_opcode);
    ex.read_vendor_err = Some(read_vendor_err);
    ex.read_byte_len = Some(read_byte_len);
    ex.read_imm_data = Some(read_imm_data);
    ex.read_qp_num = Some(read_qp_num);
    ex.read_src_qp = Some(read_src_qp);
    ex.read_wc_flags = Some(read_wc_flags);
    ex.read_slid = Some(read_slid);
    ex.read_sl = Some(read_sl);
    ex.read_dlid_path_bits = Some(read_dlid_path_bits);
    ex.read_completion_ts = Some(read_completion_ts);
    ex.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
    ex.read_tm_info = Some(read_tm_info);
}

/// Takes the next completion into the CQ's current one and its `status` and `wr_id`;
/// ENOENT if there is none.
///
/// # Safety
/// `cq` is a live extended CQ this library made.
unsafe fn take_next(cq: *mut ffi::ibv_cq_ex) -> c_int {
    // SAFETY: the caller's contract; the ibv_cq_ex begins the SoftCq.
    let Some(c) = (unsafe { soft_cq(cq.cast()) }) else { return libc::EINVAL };
    let Some((w, ts)) = c.poll_app_stamped(1).pop() else { return libc::ENOENT };
    let wc = to_ibv_wc(&w);
    *c.current.lock().unwrap_or_else(|e| e.into_inner()) = wc;
    *c.current_tm.lock().unwrap_or_else(|e| e.into_inner()) = w.tm.map_or((0, 0), |t| (t.tag, t.app_ctx));
    c.current_ts.store(ts, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the caller's CQ; these two fields are the application's to read.
    unsafe {
        (*cq).status = wc.status;
        (*cq).wr_id = wc.wr_id;
    }
    0
}

unsafe extern "C" fn start_poll(cq: *mut ffi::ibv_cq_ex, _attr: *mut ffi::ibv_poll_cq_attr) -> c_int {
    // SAFETY: the application's CQ (every entry point below likewise).
    unsafe { take_next(cq) }
}

unsafe extern "C" fn next_poll(cq: *mut ffi::ibv_cq_ex) -> c_int {
    // SAFETY: as above.
    unsafe { take_next(cq) }
}

unsafe extern "C" fn end_poll(_cq: *mut ffi::ibv_cq_ex) {}

/// The current completion.
///
/// # Safety
/// As [`take_next`].
unsafe fn current(cq: *mut ffi::ibv_cq_ex) -> ffi::ibv_wc {
    // SAFETY: the caller's contract.
    let c: Option<&SoftCq> = unsafe { soft_cq(cq.cast()) };
    // SAFETY: ibv_wc is plain C data; all-zero is valid.
    c.map_or(unsafe { std::mem::zeroed() }, |c| *c.current.lock().unwrap_or_else(|e| e.into_inner()))
}

unsafe extern "C" fn read_opcode(cq: *mut ffi::ibv_cq_ex) -> ffi::ibv_wc_opcode {
    // SAFETY: as above.
    unsafe { current(cq) }.opcode
}

unsafe extern "C" fn read_vendor_err(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: as above.
    unsafe { current(cq) }.vendor_err
}

unsafe extern "C" fn read_byte_len(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: as above.
    unsafe { current(cq) }.byte_len
}

unsafe extern "C" fn read_imm_data(cq: *mut ffi::ibv_cq_ex) -> ffi::__be32 {
    // SAFETY: as above; the union's members are both a 32-bit integer.
    unsafe { current(cq).__bindgen_anon_1.imm_data }
}

unsafe extern "C" fn read_qp_num(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: as above.
    unsafe { current(cq) }.qp_num
}

unsafe extern "C" fn read_src_qp(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: as above.
    unsafe { current(cq) }.src_qp
}

unsafe extern "C" fn read_wc_flags(cq: *mut ffi::ibv_cq_ex) -> std::ffi::c_uint {
    // SAFETY: as above.
    unsafe { current(cq) }.wc_flags
}

unsafe extern "C" fn read_slid(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: as above.
    u32::from(unsafe { current(cq) }.slid)
}

unsafe extern "C" fn read_sl(cq: *mut ffi::ibv_cq_ex) -> u8 {
    // SAFETY: as above.
    unsafe { current(cq) }.sl
}

unsafe extern "C" fn read_dlid_path_bits(cq: *mut ffi::ibv_cq_ex) -> u8 {
    // SAFETY: as above.
    unsafe { current(cq) }.dlid_path_bits
}

/// The current completion's arrival on the CQ, on the device clock (ns).
unsafe extern "C" fn read_completion_ts(cq: *mut ffi::ibv_cq_ex) -> u64 {
    // SAFETY: as above.
    let c: Option<&SoftCq> = unsafe { soft_cq(cq.cast()) };
    c.map_or(0, |c| c.current_ts.load(std::sync::atomic::Ordering::Relaxed))
}

/// The same instant as wall-clock time (ns since the Unix epoch).
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ffi::ibv_cq_ex) -> u64 {
    // SAFETY: as above.
    let ts = unsafe { read_completion_ts(cq) };
    let age = softrdma::verbs::device_clock_ns().saturating_sub(ts);
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    wall.saturating_sub(age)
}

/// The current completion's tag and the TMH's application context (zero for completions
/// that carry none: unexpected messages, list operations).
unsafe extern "C" fn read_tm_info(cq: *mut ffi::ibv_cq_ex, info: *mut ffi::ibv_wc_tm_info) {
    // SAFETY: as above.
    let c: Option<&SoftCq> = unsafe { soft_cq(cq.cast()) };
    let (tag, app_ctx) = c.map_or((0, 0), |c| *c.current_tm.lock().unwrap_or_else(|e| e.into_inner()));
    // SAFETY: the application's output structure.
    if let Some(i) = unsafe { info.as_mut() } {
        i.tag = tag;
        i.priv_ = app_ctx;
    }
}
