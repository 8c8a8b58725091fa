//! Completion queues and completion channels. A channel's `fd` is a real file descriptor
//! (an eventfd counting events, in semaphore mode: one read per event), so poll, select
//! and epoll wait on it as on rdma-core's; the events themselves queue beside it.

use crate::device::soft_context;
use crate::ffi;
use crate::objects::fail;
use softrdma::verbs::{CompletionQueue, Wc, WcOpcode, WcStatus};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// `ibv_comp_channel` and the events waiting on it.
#[repr(C)]
pub struct SoftChannel {
    /// What applications see.
    pub ibv: ffi::ibv_comp_channel,
    /// The CQs whose events are waiting, in order.
    events: Arc<Mutex<VecDeque<usize>>>,
}

/// `ibv_create_comp_channel`.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ffi::ibv_context) -> *mut ffi::ibv_comp_channel {
    // SAFETY: the caller's contract.
    if unsafe { soft_context(ctx) }.is_none() {
        return fail(libc::EINVAL);
    }
    // SAFETY: eventfd with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let ibv = ffi::ibv_comp_channel { context: ctx, fd, refcnt: 0 };
    Box::into_raw(Box::new(SoftChannel { ibv, events: Arc::default() })).cast()
}

/// `ibv_destroy_comp_channel`: EBUSY while a CQ uses it.
///
/// # Safety
/// `ch` came from [`ibv_create_comp_channel`]; nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ffi::ibv_comp_channel) -> c_int {
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { ch.as_ref() }) else { return libc::EINVAL };
    if c.refcnt > 0 {
        return libc::EBUSY;
    }
    // SAFETY: allocated by Box in ibv_create_comp_channel, given back once.
    let owned = unsafe { Box::from_raw(ch.cast::<SoftChannel>()) };
    // SAFETY: the channel's eventfd.
    unsafe { libc::close(owned.ibv.fd) };
    0
}

/// `ibv_cq` and its softrdma CQ.
#[repr(C)]
pub struct SoftCq {
    /// What applications see: an `ibv_cq`, or the `ibv_cq_ex` it begins
    /// ([`crate::cq_ex`]), whose table is filled only for a CQ made by `ibv_create_cq_ex`.
    pub ibv: ffi::ibv_cq_ex,
    /// The engine's CQ.
    pub cq: CompletionQueue,
    /// Cleared (under the channel's event lock) when the CQ is destroyed, so that a late
    /// completion raises no event naming it.
    alive: Arc<AtomicBool>,
    /// When a poll last found completions (monotonic ns; 0: the next poll has looked).
    found_at_ns: AtomicU64,
    /// The completion an extended CQ's `read_*` calls read.
    pub current: Mutex<ffi::ibv_wc>,
    /// When the current completion reached the CQ (the device clock, ns).
    pub current_ts: std::sync::atomic::AtomicU64,
    /// The current completion's tag and application context (`ibv_wc_read_tm_info`).
    pub current_tm: Mutex<(u64, u32)>,
    /// The application went elsewhere after its last finds (it polled again only after
    /// [`ELSEWHERE_GAP_NS`]): a find hands the socket back to the poll thread.
    goes_elsewhere: AtomicBool,
}

/// A call this long after a find means the application did something else in between
/// (perftest's latency tests spin on memory for the peer's WRITE), not a post or a poll
/// (a few µs).
const ELSEWHERE_GAP_NS: u64 = 10_000;

/// Monotonic time, ns.
fn monotonic_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64 + 1
}

// An `ibv_cq` is the head of an `ibv_cq_ex` (rdma-core's layout), so one allocation is
// either.
const _: () = {
    assert!(
        std::mem::offset_of!(ffi::ibv_cq, async_events_completed)
            == std::mem::offset_of!(ffi::ibv_cq_ex, async_events_completed)
    );
    assert!(std::mem::size_of::<ffi::ibv_cq>() <= std::mem::offset_of!(ffi::ibv_cq_ex, status));
};

impl SoftCq {
    /// Up to `n` completions (`ibv_poll_cq`, or one for an extended CQ's poll). An
    /// application spinning on its CQ keeps a core busy: if none is queued it receives
    /// on its own thread, so that what it waits for does not wait for the poll thread.
    pub fn poll_app(&self, n: usize) -> Vec<softrdma::verbs::Wc> {
        self.poll_app_with(n, |cq, n| cq.poll(n))
    }

    /// As [`SoftCq::poll_app`], each completion with the time it reached the CQ.
    pub fn poll_app_stamped(&self, n: usize) -> Vec<(softrdma::verbs::Wc, u64)> {
        self.poll_app_with(n, |cq, n| cq.poll_stamped(n))
    }

    /// [`SoftCq::poll_app`] with the CQ's own poll (plain or stamped), so that neither
    /// builds its list twice.
    fn poll_app_with<T>(&self, n: usize, poll: impl Fn(&CompletionQueue, usize) -> Vec<T>) -> Vec<T> {
        let now = self.note_call();
        let mut got = poll(&self.cq, n);
        // SAFETY: a live CQ's context is open.
        let engine = unsafe { soft_context(self.ibv.context) }.and_then(|s| s.engine().ok());
        if got.is_empty() && engine.is_some_and(|e| e.progress_now() > 0) {
            got = poll(&self.cq, n);
        }
        if !got.is_empty() {
            self.found_at_ns.store(now, Ordering::Relaxed);
            // An application that goes elsewhere after what it waited for (and does not
            // call here again until the peer's next message has come) would leave that
            // message unread for the rest of its polling window: the poll thread takes
            // the socket.
            if self.goes_elsewhere.load(Ordering::Relaxed) {
                engine.inspect(|e| e.stop_polling());
            }
        }
        got
    }

    /// The application calls in (a poll, or a post on a QP completing here): if it is
    /// the first call since a poll found completions, notes whether the application was
    /// elsewhere in between. Returns the time (monotonic ns).
    pub fn note_call(&self) -> u64 {
        let now = monotonic_ns();
        let found_at = self.found_at_ns.swap(0, Ordering::Relaxed);
        if found_at != 0 {
            self.goes_elsewhere.store(now.saturating_sub(found_at) > ELSEWHERE_GAP_NS, Ordering::Relaxed);
        }
        now
    }
}

/// The [`SoftCq`] of a CQ this library made.
///
/// # Safety
/// `cq` came from [`ibv_create_cq`] and is not destroyed.
pub unsafe fn soft_cq<'a>(cq: *mut ffi::ibv_cq) -> Option<&'a SoftCq> {
    // SAFETY: `ibv` is the first field of the repr(C) SoftCq.
    unsafe { cq.cast::<SoftCq>().as_ref() }
}

/// `ibv_create_cq`: room for at least `cqe` completions.
///
/// # Safety
/// `ctx` is an open context; `channel` is NULL or a live channel of it.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ffi::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ffi::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ffi::ibv_cq {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(ctx) }) else { return fail(libc::EINVAL) };
    // One completion vector (`num_comp_vectors`).
    if cqe < 1 || cqe as usize > softrdma::verbs::MAX_CQE || comp_vector != 0 {
        return fail(libc::EINVAL);
    }
    let engine = match soft.engine() {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let cq = engine.create_cq(cqe as usize);
    // SAFETY: ibv_cq_ex is plain C data (its mutex and condition variable are valid
    // all-zero on glibc, as PTHREAD_*_INITIALIZER; its table empty).
    let mut ibv: ffi::ibv_cq_ex = unsafe { std::mem::zeroed() };
    ibv.context = ctx;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    ibv.cqe = cq.capacity() as c_int;
    let alive = Arc::new(AtomicBool::new(true));
    let raw = Box::into_raw(Box::new(SoftCq {
        ibv,
        cq,
        alive: alive.clone(),
        found_at_ns: AtomicU64::new(0),
        goes_elsewhere: AtomicBool::new(false),
        // SAFETY: ibv_wc is plain C data; all-zero is valid.
        current: Mutex::new(unsafe { std::mem::zeroed() }),
        current_ts: std::sync::atomic::AtomicU64::new(0),
        current_tm: Mutex::new((0, 0)),
    }));
    // SAFETY: a channel pointer from the caller is live (contract).
    if let Some(ch) = unsafe { channel.cast::<SoftChannel>().as_mut() } {
        ch.ibv.refcnt += 1;
        let (events, fd, at) = (ch.events.clone(), ch.ibv.fd, raw as usize);
        // SAFETY: just allocated.
        unsafe { &*raw }.cq.set_event_handler(Box::new(move || {
            let mut queued = events.lock().unwrap_or_else(|e| e.into_inner());
            if !alive.load(Ordering::Acquire) {
                return;
            }
            queued.push_back(at);
            drop(queued);
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to the channel's eventfd.
            unsafe { libc::write(fd, (&raw const one).cast(), 8) };
        }));
    }
    raw.cast()
}

/// `ibv_resize_cq`: room for `cqe` completions; EINVAL below what it holds or outside
/// 1..=`max_cqe`. `cq.cqe` says what it got.
///
/// # Safety
/// `cq` is a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ffi::ibv_cq, cqe: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { soft_cq(cq) }) else { return libc::EINVAL };
    if cqe < 1 || cqe as usize > softrdma::verbs::MAX_CQE {
        return libc::EINVAL;
    }
    match c.cq.resize(cqe as usize) {
        Ok(got) => {
            // SAFETY: the caller's live CQ; `cqe` is read by the application only.
            unsafe { (*cq).cqe = got as c_int };
            0
        }
        Err(_) => libc::EINVAL,
    }
}

/// `ibv_destroy_cq`.
///
/// # Safety
/// `cq` came from [`ibv_create_cq`]; no QP uses it, nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ffi::ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by Box in ibv_create_cq, given back once.
    let owned = unsafe { Box::from_raw(cq.cast::<SoftCq>()) };
    // SAFETY: a CQ's channel outlives it (rdma-core's rule, counted in refcnt).
    if let Some(ch) = unsafe { owned.ibv.channel.cast::<SoftChannel>().as_mut() } {
        ch.ibv.refcnt -= 1;
        let mut queued = ch.events.lock().unwrap_or_else(|e| e.into_inner());
        owned.alive.store(false, Ordering::Release);
        queued.retain(|&c| c != cq as usize);
    }
    0
}

/// `ibv_get_cq_event`: waits (unless the fd is non-blocking) for the channel's next event.
///
/// # Safety
/// `ch` is a live channel; `cq` and `cq_context` point to pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ffi::ibv_comp_channel,
    cq: *mut *mut ffi::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { ch.cast::<SoftChannel>().as_ref() }) else { return -1 };
    // The thread blocks now: the device's poll thread must receive for it.
    // SAFETY: a live channel's context is open.
    if let Some(engine) = unsafe { soft_context(c.ibv.context) }.and_then(|s| s.engine().ok()) {
        engine.stop_polling();
    }
    let mut n: u64 = 0;
    // SAFETY: reading 8 bytes from the channel's eventfd (semaphore mode: one event).
    if unsafe { libc::read(c.ibv.fd, (&raw mut n).cast(), 8) } != 8 {
        return -1;
    }
    let Some(at) = c.events.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
        crate::set_errno(libc::EAGAIN);
        return -1;
    };
    let got = at as *mut ffi::ibv_cq;
    // SAFETY: the event's CQ is live: destroying a CQ removes its events.
    unsafe {
        *cq = got;
        *cq_context = (*got).cq_context;
    }
    0
}

/// `ibv_ack_cq_events`.
///
/// # Safety
/// `cq` is a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ffi::ibv_cq, nevents: u32) {
    // SAFETY: the caller's contract.
    if let Some(c) = unsafe { cq.as_mut() } {
        c.comp_events_completed = c.comp_events_completed.wrapping_add(nevents);
    }
}

/// The `poll_cq` operation.
///
/// # Safety
/// `cq` is a live CQ; `wc` has room for `n` completions.
pub unsafe extern "C" fn poll_cq(cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
    // SAFETY: the caller's contract: a live CQ and room for n completions.
    let Some(c) = (unsafe { soft_cq(cq) }) else { return -libc::EINVAL };
    if n <= 0 || wc.is_null() {
        return 0;
    }
    let got = c.poll_app(n as usize);
    for (i, w) in got.iter().enumerate() {
        // SAFETY: i < n.
        unsafe { wc.add(i).write(to_ibv_wc(w)) };
    }
    got.len() as c_int
}

/// The `req_notify_cq` operation.
///
/// # Safety
/// `cq` is a live CQ.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ffi::ibv_cq, _solicited_only: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { soft_cq(cq) }) else { return libc::EINVAL };
    c.cq.req_notify();
    0
}

pub(crate) fn to_ibv_wc(w: &Wc) -> ffi::ibv_wc {
    let mut flags = 0;
    let mut extra = ffi::ibv_wc__bindgen_ty_1 { imm_data: 0 };
    if let Some(imm) = w.imm {
        flags |= ffi::IBV_WC_WITH_IMM;
        extra.imm_data = imm.to_be();
    } else if let Some(rkey) = w.invalidated_rkey {
        flags |= ffi::IBV_WC_WITH_INV;
        extra.invalidated_rkey = rkey;
    }
    if w.src_gid.is_some() {
        flags |= ffi::IBV_WC_GRH;
    }
    if let Some(tm) = w.tm {
        flags |= crate::tm::wc_flags(tm.flags);
    }
    ffi::ibv_wc {
        wr_id: w.wr_id,
        status: status_of(w.status),
        opcode: opcode_of(w.opcode),
        vendor_err: 0,
        byte_len: w.byte_len,
        __bindgen_anon_1: extra,
        qp_num: w.qpn,
        src_qp: w.src_qp.unwrap_or(0),
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

fn status_of(s: WcStatus) -> ffi::ibv_wc_status {
    match s {
        WcStatus::Success => ffi::IBV_WC_SUCCESS,
        WcStatus::LocLenErr => ffi::IBV_WC_LOC_LEN_ERR,
        WcStatus::LocProtErr => ffi::IBV_WC_LOC_PROT_ERR,
        WcStatus::WrFlushErr => ffi::IBV_WC_WR_FLUSH_ERR,
        WcStatus::RemInvReqErr => ffi::IBV_WC_REM_INV_REQ_ERR,
        WcStatus::RemAccessErr => ffi::IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemOpErr => ffi::IBV_WC_REM_OP_ERR,
        WcStatus::RetryExcErr => ffi::IBV_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExcErr => ffi::IBV_WC_RNR_RETRY_EXC_ERR,
        WcStatus::MwBindErr => ffi::IBV_WC_MW_BIND_ERR,
        WcStatus::TmErr => ffi::IBV_WC_TM_ERR,
        WcStatus::TmRndvIncomplete => ffi::IBV_WC_TM_RNDV_INCOMPLETE,
        _ => ffi::IBV_WC_GENERAL_ERR,
    }
}

fn opcode_of(o: WcOpcode) -> ffi::ibv_wc_opcode {
    match o {
        WcOpcode::Send => ffi::IBV_WC_SEND,
        WcOpcode::RdmaWrite => ffi::IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => ffi::IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => ffi::IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => ffi::IBV_WC_FETCH_ADD,
        WcOpcode::AtomicWrite => ffi::IBV_WC_ATOMIC_WRITE,
        WcOpcode::Recv => ffi::IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => ffi::IBV_WC_RECV_RDMA_WITH_IMM,
        WcOpcode::BindMw => ffi::IBV_WC_BIND_MW,
        WcOpcode::LocalInv => ffi::IBV_WC_LOCAL_INV,
        WcOpcode::TmAdd => ffi::IBV_WC_TM_ADD,
        WcOpcode::TmDel => ffi::IBV_WC_TM_DEL,
        WcOpcode::TmSync => ffi::IBV_WC_TM_SYNC,
        WcOpcode::TmRecv => ffi::IBV_WC_TM_RECV,
        WcOpcode::TmNoTag => ffi::IBV_WC_TM_NO_TAG,
    }
}
