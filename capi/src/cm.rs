//! librdmacm on softrdma's connection managers: the IB CM's MADs on RoCEv2 (IBTA ch. 12)
//! and MPA on iWARP (RFC 5044), both behind the verbs API's `listen` / `connect` /
//! `accept`. Those calls block; rdma_cm is asynchronous, so each runs on a thread of its
//! own and reports through the id's event channel, a real file descriptor (an eventfd in
//! semaphore mode, one count per queued event).

use crate::cm_addr::{context_for, from_c, to_storage};
use crate::device::soft_context;
use crate::ffi;
use crate::objects::{ibv_alloc_pd, ibv_dealloc_pd};
use crate::qp::{create_qp, ibv_destroy_qp, soft_qp};
use softrdma::verbs::{ConnParam, ConnRequest, ConnectError, Listener, QpState, QueuePair};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long `rdma_connect` and `rdma_accept` wait for the peer before reporting failure.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Events waiting on a channel, and the eventfd that counts them.
pub struct Queue {
    fd: c_int,
    /// `None` once the channel is destroyed: a thread still reporting to it (a connection
    /// watch ending) then drops its event rather than write to a closed descriptor.
    events: Mutex<Option<VecDeque<usize>>>,
}

impl Queue {
    pub(crate) fn push(&self, ev: Box<EventBox>) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let Some(q) = q.as_mut() else { return };
        q.push_back(Box::into_raw(ev) as usize);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to the channel's eventfd, open while the queue is.
        unsafe { libc::write(self.fd, (&raw const one).cast(), 8) };
    }

    fn pop(&self) -> Option<*mut ffi::rdma_cm_event> {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        q.as_mut()?.pop_front().map(|e| e as *mut ffi::rdma_cm_event)
    }

    /// Moves the events of `id` waiting here to `to` (an id changing channels).
    pub(crate) fn move_events_of(&self, id: *mut ffi::rdma_cm_id, to: &Queue) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let Some(q) = q.as_mut() else { return };
        let mut kept = VecDeque::new();
        for ev in q.drain(..) {
            // SAFETY: a queued event, owned by the queue.
            if unsafe { (*(ev as *mut ffi::rdma_cm_event)).id } == id {
                let mut n: u64 = 0;
                // SAFETY: taking one count for the event moved (semaphore eventfd).
                unsafe { libc::read(self.fd, (&raw mut n).cast(), 8) };
                // SAFETY: the box leaves this queue for the other.
                to.push(unsafe { Box::from_raw(ev as *mut EventBox) });
            } else {
                kept.push_back(ev);
            }
        }
        *q = kept;
    }

    /// Frees the events of `owner` not yet handed out (its id is being destroyed, and
    /// librdmacm's kernel drops them then); their counts stay, and are read past.
    pub(crate) fn withdraw(&self, owner: usize) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let Some(q) = q.as_mut() else { return };
        q.retain(|&ev| {
            // SAFETY: queued events are boxes the queue owns.
            let mine = crate::cm_acks::owner(unsafe { &*(ev as *const ffi::rdma_cm_event) }) == owner;
            if mine {
                // SAFETY: leaving the queue, freed once.
                drop(unsafe { Box::from_raw(ev as *mut EventBox) });
            }
            !mine
        });
    }

    /// Frees what waits and closes the descriptor, under the lock `push` takes.
    fn close(&self) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        for ev in q.take().into_iter().flatten() {
            // SAFETY: queued events are boxes nobody else holds.
            drop(unsafe { Box::from_raw(ev as *mut EventBox) });
        }
        // SAFETY: the channel's eventfd, closed once (the queue is closed now).
        unsafe { libc::close(self.fd) };
    }
}

/// `rdma_event_channel` and its queue.
#[repr(C)]
pub struct SoftEventChannel {
    ibv: ffi::rdma_event_channel,
    queue: Arc<Queue>,
}

/// An event and the private data it points into, freed together by `rdma_ack_cm_event`.
#[repr(C)]
pub(crate) struct EventBox {
    pub(crate) ev: ffi::rdma_cm_event,
    pub(crate) private_data: Vec<u8>,
}

/// `rdma_cm_id` and what softrdma keeps for it.
#[repr(C)]
pub struct SoftId {
    pub(crate) ibv: ffi::rdma_cm_id,
    /// The channel's queue (the id's own channel's when it is synchronous).
    pub(crate) queue: Arc<Queue>,
    /// Made with no channel: each call waits for its own event (librdmacm's synchronous
    /// mode) on a channel this library made and destroys with the id.
    pub(crate) sync: bool,
    /// What `rdma_get_request` makes each request's QP with (a passive `rdma_create_ep`).
    pub(crate) qp_init: Mutex<Option<ffi::ibv_qp_init_attr>>,
    /// The CQs and completion channels `rdma_create_qp` made when given none, which
    /// `rdma_destroy_qp` destroys.
    own_cqs: Mutex<bool>,
    /// Set when the id goes: its listener thread ends.
    pub(crate) stop: Arc<AtomicBool>,
    /// A connection request this id (a listener's child) answers.
    request: Mutex<Option<ConnRequest>>,
    /// A UD resolution request this id (a UD listener's child) answers ([`crate::cm_ud`]).
    pub(crate) ud_request: Mutex<Option<softrdma::verbs::UdRequest>>,
    pub(crate) listener: Mutex<Option<JoinHandle<()>>>,
    /// Held while a thread uses the QP, and by `rdma_destroy_qp`: true while it lives.
    pub(crate) qp_gate: Arc<Mutex<bool>>,
    /// The PD `rdma_create_qp` made when given none.
    own_pd: Mutex<usize>,
    /// Multicast groups joined, and whether the id's QP was attached ([`crate::mcast`]).
    pub(crate) groups: Mutex<Vec<([u8; 16], bool)>>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the Local ACK Timeout the QP gets in RTS.
    ack_timeout: Mutex<Option<u8>>,
    /// The application's own QP (`ibv_create_qp`) this id connects, named by the
    /// connection parameters' `qp_num`, when the id has none of its own (`id->qp` NULL).
    external_qp: Mutex<usize>,
}

/// A raw pointer a worker thread carries (the objects it names outlive the thread by
/// rdma_cm's rules, and `qp_gate` guards the QP).
#[derive(Clone, Copy)]
pub(crate) struct Ptr(pub(crate) usize);

pub(crate) fn event(
    id: *mut ffi::rdma_cm_id,
    listen: *mut ffi::rdma_cm_id,
    kind: ffi::rdma_cm_event_type,
    status: c_int,
) -> Box<EventBox> {
    // SAFETY: plain C data; all-zero is valid.
    let mut ev: ffi::rdma_cm_event = unsafe { std::mem::zeroed() };
    ev.id = id;
    ev.listen_id = listen;
    ev.event = kind;
    ev.status = status;
    Box::new(EventBox { ev, private_data: Vec::new() })
}

/// A connection event carrying the peer's private data and read depths.
fn conn_event(
    id: *mut ffi::rdma_cm_id,
    listen: *mut ffi::rdma_cm_id,
    kind: ffi::rdma_cm_event_type,
    data: Vec<u8>,
    depths: (u16, u16),
) -> Box<EventBox> {
    let mut b = event(id, listen, kind, 0);
    b.private_data = data;
    // SAFETY: the conn member is the one connection events fill.
    let conn = unsafe { &mut b.ev.param.conn };
    conn.private_data = b.private_data.as_ptr().cast();
    conn.private_data_len = b.private_data.len().min(255) as u8;
    conn.responder_resources = depths.0.min(255) as u8;
    conn.initiator_depth = depths.1.min(255) as u8;
    b
}

/// `rdma_create_event_channel`.
#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut ffi::rdma_event_channel {
    // SAFETY: eventfd with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let queue = Arc::new(Queue { fd, events: Mutex::new(Some(VecDeque::new())) });
    let ch: *mut ffi::rdma_event_channel =
        Box::into_raw(Box::new(SoftEventChannel { ibv: ffi::rdma_event_channel { fd }, queue })).cast();
    live_channels().insert(ch as usize);
    ch
}

/// `rdma_destroy_event_channel` (events not acknowledged are freed with it); a channel
/// this library did not make, or destroyed already, is left alone.
///
/// # Safety
/// `ch` came from [`rdma_create_event_channel`]; no id uses it any more.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut ffi::rdma_event_channel) {
    if !live_channels().remove(&(ch as usize)) {
        return;
    }
    // SAFETY: allocated by Box in rdma_create_event_channel, given back once (it has
    // just left the registry).
    let owned = unsafe { Box::from_raw(ch.cast::<SoftEventChannel>()) };
    owned.queue.close();
}

/// `rdma_get_cm_event`: the next event, waiting unless the channel's fd is non-blocking.
///
/// # Safety
/// `ch` is a live channel; `out` points to an event pointer.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    ch: *mut ffi::rdma_event_channel,
    out: *mut *mut ffi::rdma_cm_event,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(c), false) = (unsafe { live_channel(ch) }, out.is_null()) else {
        crate::set_errno(libc::EINVAL);
        return -1;
    };
    let ev = loop {
        let mut n: u64 = 0;
        // SAFETY: reading 8 bytes from the channel's eventfd (semaphore mode: one event).
        if unsafe { libc::read(c.ibv.fd, (&raw mut n).cast(), 8) } != 8 {
            return -1;
        }
        // A count whose event was withdrawn (its id destroyed) is read past.
        if let Some(ev) = c.queue.pop() {
            break ev;
        }
    };
    // SAFETY: a queued event, now the application's.
    crate::cm_acks::handed_out(crate::cm_acks::owner(unsafe { &*ev }));
    // SAFETY: a queued event; `ev` is the first field of its EventBox.
    unsafe {
        if let Some(id) = (*ev).id.as_mut() {
            id.event = ev;
        }
        *out = ev;
    }
    0
}

/// `rdma_ack_cm_event`.
///
/// # Safety
/// `ev` came from [`rdma_get_cm_event`] and is acknowledged once.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(ev: *mut ffi::rdma_cm_event) -> c_int {
    if ev.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: an event this library queued, freed once.
    let ev = unsafe { Box::from_raw(ev.cast::<EventBox>()) };
    crate::cm_acks::acked(crate::cm_acks::owner(&ev.ev));
    0
}

/// The queue of channel `ch`.
///
/// # Safety
/// `ch` came from [`rdma_create_event_channel`] and is not destroyed.
pub(crate) unsafe fn queue_of(ch: *mut ffi::rdma_event_channel) -> Option<Arc<Queue>> {
    // SAFETY: the caller's contract.
    unsafe { live_channel(ch) }.map(|c| c.queue.clone())
}

/// A new id on channel `channel`, or (NULL) a synchronous one on a channel of its own.
pub(crate) fn new_id(
    channel: *mut ffi::rdma_event_channel,
    context: *mut c_void,
    ps: ffi::rdma_port_space,
) -> Option<*mut SoftId> {
    let sync = channel.is_null();
    let channel = if sync { rdma_create_event_channel() } else { channel };
    // SAFETY: a live channel, the caller's or just made.
    let queue = unsafe { queue_of(channel) }?;
    // SAFETY: plain C data; all-zero is valid.
    let mut ibv: ffi::rdma_cm_id = unsafe { std::mem::zeroed() };
    ibv.channel = channel;
    ibv.context = context;
    ibv.ps = ps;
    ibv.qp_type = if ps == ffi::RDMA_PS_UDP { ffi::IBV_QPT_UD } else { ffi::IBV_QPT_RC };
    let id = SoftId {
        ibv,
        queue,
        sync,
        qp_init: Mutex::new(None),
        own_cqs: Mutex::new(false),
        stop: Arc::new(AtomicBool::new(false)),
        request: Mutex::new(None),
        ud_request: Mutex::new(None),
        listener: Mutex::new(None),
        qp_gate: Arc::new(Mutex::new(false)),
        own_pd: Mutex::new(0),
        groups: Mutex::new(Vec::new()),
        ack_timeout: Mutex::new(None),
        external_qp: Mutex::new(0),
    };
    let id = Box::into_raw(Box::new(id));
    live_ids().insert(id as usize);
    Some(id)
}

/// The [`SoftId`] of an id this library made.
///
/// # Safety
/// `id` came from [`rdma_create_id`] (or a CONNECT_REQUEST event) and is not destroyed.
pub(crate) unsafe fn soft_id<'a>(id: *mut ffi::rdma_cm_id) -> Option<&'a mut SoftId> {
    if !live_ids().contains(&(id as usize)) {
        return None;
    }
    // SAFETY: `ibv` is the first field of the repr(C) SoftId, which new_id registered and
    // rdma_destroy_id took out of the registry (its memory is kept, so an id another
    // thread is still using stays readable).
    unsafe { id.cast::<SoftId>().as_mut() }
}

/// The ids this library made and has not destroyed: an id used after `rdma_destroy_id`,
/// or a pointer that never was one (perftest 4.5 retries a connection with ids read from
/// memory it freed), is refused with EINVAL rather than dereferenced.
static LIVE_IDS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn live_ids() -> std::sync::MutexGuard<'static, BTreeSet<usize>> {
    LIVE_IDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The event channels this library made and has not destroyed: a channel used after
/// `rdma_destroy_event_channel` (perftest 4.5's connection retry does) is refused with
/// EINVAL rather than read after it was freed.
static LIVE_CHANNELS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn live_channels() -> std::sync::MutexGuard<'static, BTreeSet<usize>> {
    LIVE_CHANNELS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Channel `ch` if this library made it and it is not destroyed.
///
/// # Safety
/// A channel in the registry is a live `SoftEventChannel`.
unsafe fn live_channel<'a>(ch: *mut ffi::rdma_event_channel) -> Option<&'a SoftEventChannel> {
    if !live_channels().contains(&(ch as usize)) {
        return None;
    }
    // SAFETY: registered by rdma_create_event_channel, removed before it is freed.
    unsafe { ch.cast::<SoftEventChannel>().as_ref() }
}

/// `rdma_create_id`: RC ids (RDMA_PS_TCP, and RDMA_PS_IB taken the same way) and UD ids
/// (RDMA_PS_UDP, [`crate::cm_ud`]); with no channel, a synchronous id.
///
/// # Safety
/// `ch` is NULL or a live channel; `out` points to an id pointer.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    ch: *mut ffi::rdma_event_channel,
    out: *mut *mut ffi::rdma_cm_id,
    context: *mut c_void,
    ps: ffi::rdma_port_space,
) -> c_int {
    if out.is_null() || ![ffi::RDMA_PS_TCP, ffi::RDMA_PS_IB, ffi::RDMA_PS_UDP].contains(&ps) {
        return einval();
    }
    let Some(id) = new_id(ch, context, ps) else {
        crate::set_errno(libc::EMFILE);
        return -1;
    };
    // SAFETY: a valid out-pointer.
    unsafe { *out = id.cast() };
    0
}

pub(crate) fn einval() -> c_int {
    crate::set_errno(libc::EINVAL);
    -1
}

/// A synchronous id's wait for the event of the call just made (librdmacm's rule: the
/// previous event is acknowledged first, this one is kept in `id.event` until the next
/// call): -1 with the errno its status gives, ECONNREFUSED for a rejection.
///
/// # Safety
/// `id` is a live id.
pub(crate) unsafe fn complete(id: *mut ffi::rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    if !s.sync {
        return 0;
    }
    ack_held(s);
    let mut ev = std::ptr::null_mut();
    // SAFETY: the id's own channel; `ev` is ours.
    if unsafe { rdma_get_cm_event(s.ibv.channel, &mut ev) } != 0 {
        return -1;
    }
    s.ibv.event = ev;
    // SAFETY: just taken from the queue.
    let (kind, status) = unsafe { ((*ev).event, (*ev).status) };
    let errno = match (kind, status) {
        (ffi::RDMA_CM_EVENT_REJECTED, _) => libc::ECONNREFUSED,
        (_, 0) => return 0,
        (_, st) => st.abs(),
    };
    crate::set_errno(errno);
    -1
}

/// Acknowledges the event a synchronous call left in `id.event`.
pub(crate) fn ack_held(s: &mut SoftId) {
    let held = std::mem::replace(&mut s.ibv.event, std::ptr::null_mut());
    if !held.is_null() {
        // SAFETY: an event this library queued and handed to this id only.
        unsafe { rdma_ack_cm_event(held) };
    }
}

/// The id's source and destination addresses.
fn addrs(id: &SoftId) -> (Option<SocketAddr>, Option<SocketAddr>) {
    let a = &id.ibv.route.addr;
    // SAFETY: the storage members are what this library writes; a zeroed one reads None.
    unsafe {
        (
            from_c((&raw const a.__bindgen_anon_1.src_storage).cast()),
            from_c((&raw const a.__bindgen_anon_2.dst_storage).cast()),
        )
    }
}

/// Binds `id` to the device owning `local` (or serving `peer`).
fn bind_device(id: &mut SoftId, local: Option<SocketAddr>, peer: Option<SocketAddr>) -> Result<(), c_int> {
    let ctx = context_for(local.map(|a| a.ip()), peer.map(|a| a.ip())).ok_or(libc::EADDRNOTAVAIL)?;
    id.ibv.verbs = ctx;
    id.ibv.port_num = 1;
    id.ibv.pd = default_pd(ctx);
    // A wildcard source becomes the device's own address, keeping the port.
    // SAFETY: an open context.
    let dev_ip = unsafe { soft_context(ctx) }.map(|s| s.device.cfg.addr).ok_or(libc::ENODEV)?;
    let src = SocketAddr::new(dev_ip, local.map_or(0, |a| a.port()));
    // SAFETY: writing the storage member of the union.
    to_storage(src, unsafe { &mut id.ibv.route.addr.__bindgen_anon_1.src_storage });
    if let Some(p) = peer {
        // SAFETY: as above.
        to_storage(p, unsafe { &mut id.ibv.route.addr.__bindgen_anon_2.dst_storage });
    }
    Ok(())
}

/// `rdma_bind_addr`.
///
/// # Safety
/// `id` is a live id; `addr` a socket address.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut ffi::rdma_cm_id, addr: *mut ffi::sockaddr) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(a)) = (unsafe { soft_id(id) }, unsafe { from_c(addr) }) else { return einval() };
    match bind_device(s, Some(a), None) {
        Ok(()) => 0,
        Err(e) => {
            crate::set_errno(e);
            -1
        }
    }
}

/// `rdma_resolve_addr`: the device is chosen now; ADDR_RESOLVED (or ADDR_ERROR) follows.
///
/// # Safety
/// `id` is a live id; `src` NULL or a socket address; `dst` a socket address.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut ffi::rdma_cm_id,
    src: *mut ffi::sockaddr,
    dst: *mut ffi::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(peer)) = (unsafe { soft_id(id) }, unsafe { from_c(dst) }) else { return einval() };
    // SAFETY: the caller's contract.
    let local = unsafe { from_c(src) }.or(addrs(s).0);
    let kind = match bind_device(s, local, Some(peer)) {
        Ok(()) => ffi::RDMA_CM_EVENT_ADDR_RESOLVED,
        Err(_) => ffi::RDMA_CM_EVENT_ADDR_ERROR,
    };
    let status = if kind == ffi::RDMA_CM_EVENT_ADDR_RESOLVED { 0 } else { -libc::EADDRNOTAVAIL };
    s.queue.push(event(id, std::ptr::null_mut(), kind, status));
    // SAFETY: the caller's contract.
    unsafe { complete(id) }
}

/// `rdma_resolve_route`: RoCE and iWARP route by IP; ROUTE_RESOLVED follows.
///
/// # Safety
/// `id` is a live id whose address is resolved.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut ffi::rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    if s.ibv.verbs.is_null() {
        return einval();
    }
    s.queue.push(event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
    // SAFETY: the caller's contract.
    unsafe { complete(id) }
}

/// `rdma_create_qp`: an RC QP the CM brings up; a PD is made if none is given.
///
/// # Safety
/// `id` is a live id bound to a device; `pd` NULL or a PD of that device; `attr` names
/// the CQs.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { attach_qp(id, pd, attr, false) }
}

/// `rdma_create_qp_ex`: as [`rdma_create_qp`], with the PD and send operations (the
/// `ibv_wr_*` API) in the extended attributes, checked as `ibv_create_qp_ex` checks them.
///
/// # Safety
/// `id` is a live id bound to a device; `attr` names the CQs and, if it says so, a PD.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut ffi::rdma_cm_id, attr: *mut ffi::ibv_qp_init_attr_ex) -> c_int {
    // SAFETY: the caller's contract.
    let Some(a) = (unsafe { attr.as_mut() }) else { return einval() };
    let (mut basic, extended) = match crate::qp::basic_attr(a) {
        Ok(b) => b,
        Err(e) => {
            crate::set_errno(e);
            return -1;
        }
    };
    let pd = if a.comp_mask & ffi::IBV_QP_INIT_ATTR_PD != 0 { a.pd } else { std::ptr::null_mut() };
    // SAFETY: the caller's contract.
    let made = unsafe { attach_qp(id, pd, &mut basic, extended) };
    a.cap = basic.cap;
    made
}

/// Makes the id's QP, [`SoftQp::extended`](crate::qp::SoftQp) if asked.
///
/// # Safety
/// As [`rdma_create_qp`].
unsafe fn attach_qp(
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_qp_init_attr,
    extended: bool,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    if s.ibv.verbs.is_null() || !s.ibv.qp.is_null() {
        return einval();
    }
    let pd = if pd.is_null() && !s.ibv.pd.is_null() {
        s.ibv.pd
    } else if pd.is_null() {
        // SAFETY: the id's context is open.
        let own = unsafe { ibv_alloc_pd(s.ibv.verbs) };
        *s.own_pd.lock().unwrap_or_else(|e| e.into_inner()) = own as usize;
        own
    } else {
        pd
    };
    // SAFETY: the caller's contract.
    if let Err(e) = unsafe { own_cqs(s, attr) } {
        crate::set_errno(e);
        return -1;
    }
    // SAFETY: the caller's contract.
    let qp = unsafe { create_qp(pd, attr, true, extended) };
    let ready = if qp.is_null() || !crate::cm_ud::is_ud(s) { Ok(()) } else { crate::cm_ud::ready_qp(qp) };
    if let Err(e) = ready {
        // SAFETY: just made, used by nothing yet.
        unsafe { ibv_destroy_qp(qp) };
        crate::set_errno(e);
    }
    if qp.is_null() || ready.is_err() {
        // SAFETY: the CQs made above, if any; no QP uses them.
        unsafe { drop_own_cqs(s) };
        return -1;
    }
    s.ibv.qp = qp;
    s.ibv.pd = pd;
    // SAFETY: the QP was just made from `attr`.
    unsafe {
        s.ibv.send_cq = (*qp).send_cq;
        s.ibv.recv_cq = (*qp).recv_cq;
    }
    *s.qp_gate.lock().unwrap_or_else(|e| e.into_inner()) = true;
    // SAFETY: just made by create_qp.
    if let Some(q) = unsafe { soft_qp(qp) } {
        *q.cm_gate.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.qp_gate.clone());
    }
    0
}

/// CQs for a QP created with none, as librdmacm makes them: a completion channel and a
/// CQ per direction, sized for its queue, in `id.send_cq`/`recv_cq` and their channels
/// (`rdma_get_send_comp` and `rdma_get_recv_comp` wait on those).
///
/// # Safety
/// `s` is bound to a device; `attr` is valid.
unsafe fn own_cqs(s: &mut SoftId, attr: *mut ffi::ibv_qp_init_attr) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
    if !a.send_cq.is_null() && !a.recv_cq.is_null() {
        return Ok(());
    }
    if !a.send_cq.is_null() || !a.recv_cq.is_null() {
        // librdmacm makes only the one missing; one of each or none here.
        return Err(libc::EINVAL);
    }
    *s.own_cqs.lock().unwrap_or_else(|e| e.into_inner()) = true;
    let ctx = s.ibv.verbs;
    let me: *mut c_void = (&raw mut s.ibv).cast();
    // SAFETY: the id's context is open; the CQs are made on fresh channels.
    unsafe {
        s.ibv.send_cq_channel = crate::cq::ibv_create_comp_channel(ctx);
        s.ibv.recv_cq_channel = crate::cq::ibv_create_comp_channel(ctx);
        let depth = |n: u32| n.max(1) as c_int;
        s.ibv.send_cq = crate::cq::ibv_create_cq(ctx, depth(a.cap.max_send_wr), me, s.ibv.send_cq_channel, 0);
        s.ibv.recv_cq = crate::cq::ibv_create_cq(ctx, depth(a.cap.max_recv_wr), me, s.ibv.recv_cq_channel, 0);
    }
    let made = [s.ibv.send_cq_channel.is_null(), s.ibv.recv_cq_channel.is_null()];
    if made.contains(&true) || s.ibv.send_cq.is_null() || s.ibv.recv_cq.is_null() {
        // SAFETY: what was made above, used by nothing.
        unsafe { drop_own_cqs(s) };
        return Err(libc::ENOMEM);
    }
    a.send_cq = s.ibv.send_cq;
    a.recv_cq = s.ibv.recv_cq;
    Ok(())
}

/// Destroys the CQs and channels [`own_cqs`] made, if it made them.
///
/// # Safety
/// No QP uses them.
unsafe fn drop_own_cqs(s: &mut SoftId) {
    if !std::mem::take(&mut *s.own_cqs.lock().unwrap_or_else(|e| e.into_inner())) {
        return;
    }
    // SAFETY: the caller's contract; each was made by own_cqs and goes once.
    unsafe {
        for cq in [&mut s.ibv.send_cq, &mut s.ibv.recv_cq] {
            if !cq.is_null() {
                crate::cq::ibv_destroy_cq(std::mem::replace(cq, std::ptr::null_mut()));
            }
        }
        for ch in [&mut s.ibv.send_cq_channel, &mut s.ibv.recv_cq_channel] {
            if !ch.is_null() {
                crate::cq::ibv_destroy_comp_channel(std::mem::replace(ch, std::ptr::null_mut()));
            }
        }
    }
}

/// `rdma_destroy_qp`.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut ffi::rdma_cm_id) {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return };
    let live = *s.qp_gate.lock().unwrap_or_else(|e| e.into_inner());
    if live {
        // SAFETY: the id's QP, made by rdma_create_qp; destroying it closes the gate.
        unsafe { ibv_destroy_qp(s.ibv.qp) };
    }
    s.ibv.qp = std::ptr::null_mut();
    // SAFETY: their QP is gone.
    unsafe { drop_own_cqs(s) };
}

fn conn_param(p: Option<&ffi::rdma_conn_param>) -> ConnParam {
    let Some(p) = p else {
        return ConnParam { private_data: Vec::new(), responder_resources: 16, initiator_depth: 16 };
    };
    let data = if p.private_data.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller's private data of the length it gives.
        unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), usize::from(p.private_data_len)) }.to_vec()
    };
    ConnParam {
        private_data: data,
        responder_resources: u16::from(p.responder_resources),
        initiator_depth: u16::from(p.initiator_depth),
    }
}

/// The failure event of a connection that did not come up.
fn failure(id: *mut ffi::rdma_cm_id, e: &ConnectError) -> Box<EventBox> {
    match e {
        // The status of a rejection is the CM's REJ reason (IBTA 12.6.7.2): 28 consumer
        // reject, 8 invalid ServiceID (nobody listens).
        ConnectError::Rejected { private_data, .. } => {
            let mut b = event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_REJECTED, 28);
            // The rejecting side's private data, as librdmacm hands it over.
            b.private_data = private_data.clone();
            // SAFETY: the conn member is the one connection events fill; plain C data.
            let conn = unsafe { &mut b.ev.param.conn };
            conn.private_data = b.private_data.as_ptr().cast();
            conn.private_data_len = b.private_data.len().min(255) as u8;
            b
        }
        ConnectError::NoListener(_) => event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_REJECTED, 8),
        // As the kernel's rdma_cm reports an iWARP connect the peer's TCP refused.
        ConnectError::Refused(_) => event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_REJECTED, -libc::ECONNREFUSED),
        ConnectError::Timeout | ConnectError::Tcp(_) => {
            event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
        }
        _ => event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_CONNECT_ERROR, -libc::ECONNABORTED),
    }
}

/// What a thread bringing a connection up needs of its id.
struct Setup {
    at: Ptr,
    gate: Arc<Mutex<bool>>,
    queue: Arc<Queue>,
    ack_timeout: Option<u8>,
    /// The application's own QP, when the id has none ([`SoftId::external_qp`]).
    external: usize,
}

impl Setup {
    fn of(s: &SoftId, id: *mut ffi::rdma_cm_id) -> Setup {
        let ack_timeout = *s.ack_timeout.lock().unwrap_or_else(|e| e.into_inner());
        let external = if s.ibv.qp.is_null() { *s.external_qp.lock().unwrap_or_else(|e| e.into_inner()) } else { 0 };
        Setup { at: Ptr(id as usize), gate: s.qp_gate.clone(), queue: s.queue.clone(), ack_timeout, external }
    }

    /// The QP being connected: the id's, or the application's own.
    ///
    /// # Safety
    /// The gate is held and says the QP lives.
    unsafe fn qp(&self) -> Option<&crate::qp::SoftQp> {
        // SAFETY: the caller's contract; the id outlives its setup thread.
        let own = unsafe { (*(self.at.0 as *mut ffi::rdma_cm_id)).qp };
        let qp = if own.is_null() { self.external as *mut ffi::ibv_qp } else { own };
        // SAFETY: a live QP of this library (the gate).
        unsafe { soft_qp(qp) }
    }

    /// Runs `f` on the QP with the gate held (so the QP cannot go meanwhile).
    fn with_qp<T>(&self, f: impl FnOnce(&QueuePair) -> Result<T, ConnectError>) -> Result<T, ConnectError> {
        let live = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the gate is held and says the QP lives.
        let qp = (*live).then(|| unsafe { self.qp() }).flatten();
        qp.map_or(Err(ConnectError::Invalid("the QP went")), |q| f(&q.qp))
    }

    fn established(&self, data: Vec<u8>, p: &ConnParam) -> Box<EventBox> {
        self.event(ffi::RDMA_CM_EVENT_ESTABLISHED, data, p)
    }

    fn event(&self, kind: ffi::rdma_cm_event_type, data: Vec<u8>, p: &ConnParam) -> Box<EventBox> {
        let depths = (p.responder_resources, p.initiator_depth);
        conn_event(self.at.0 as *mut _, std::ptr::null_mut(), kind, data, depths)
    }

    /// Queues how the setup ended; a connection that came up is then watched for its end
    /// ([`crate::cm_watch`]), and reported at once if its QP is in ERR already.
    fn report(self, ev: Box<EventBox>) {
        let up = matches!(ev.ev.event, ffi::RDMA_CM_EVENT_ESTABLISHED | ffi::RDMA_CM_EVENT_CONNECT_RESPONSE);
        if !up {
            self.queue.push(ev);
            return;
        }
        let live = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the gate is held and says the QP lives.
        let Some(q) = (*live).then(|| unsafe { self.qp() }).flatten() else {
            self.queue.push(ev);
            return;
        };
        if let Some(t) = self.ack_timeout {
            // The kernel's rdma_cm sets the option's timeout as it moves the QP to RTS.
            let _ = q.qp.modify(&softrdma::verbs::QpAttr { timeout: Some(t), ..Default::default() });
        }
        self.queue.push(ev);
        // SAFETY: a live QP's context is open.
        let Some(device) = (unsafe { soft_context(q.ibv().context) }).map(|c| crate::event::device_key(c.device))
        else {
            return;
        };
        let qpn = q.qp.qp_num();
        crate::cm_watch::watch(device, qpn, self.at.0 as *mut _, self.queue.clone());
        if q.qp.state().is_none_or(|s| s == QpState::Err) {
            crate::cm_watch::ended(device, qpn);
        }
    }
}

/// `rdma_connect`: the CM's REQ (RoCEv2) or TCP and the MPA Request (iWARP) go out on a
/// thread; ESTABLISHED, REJECTED or UNREACHABLE follows.
///
/// # Safety
/// `id` is a live id with a QP; `param` NULL or connection parameters.
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut ffi::rdma_cm_id, param: *mut ffi::rdma_conn_param) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    let Some(peer) = addrs(s).1 else { return einval() };
    // SAFETY: the caller's contract.
    if s.ibv.qp.is_null() && !crate::cm_ud::is_ud(s) && !unsafe { take_external_qp(s, param) } {
        return einval();
    }
    // SAFETY: the caller's contract.
    let p = conn_param(unsafe { param.as_ref() });
    if crate::cm_ud::is_ud(s) {
        let started = crate::cm_ud::connect(s, id, peer, p.private_data);
        // SAFETY: the caller's contract.
        return if started == 0 { unsafe { complete(id) } } else { started };
    }
    let conn = Setup::of(s, id);
    let mut ticket = crate::cm_order::Ticket::take();
    std::thread::spawn(move || {
        ticket.wait_turn(crate::cm_order::TURN_WAIT_MAX);
        let sent = &mut || ticket.sent();
        let ev = match conn.with_qp(|q| q.connect_reporting(peer, &p, CONNECT_TIMEOUT, sent)) {
            // The application's own QP: it calls rdma_establish after this event.
            Ok(data) if conn.external != 0 => conn.event(ffi::RDMA_CM_EVENT_CONNECT_RESPONSE, data, &p),
            Ok(data) => conn.established(data, &p),
            Err(e) => failure(conn.at.0 as *mut _, &e),
        };
        conn.report(ev);
    });
    // SAFETY: the caller's contract.
    unsafe { complete(id) }
}

/// An id with no QP of its own connects the application's QP the connection parameters
/// name (`qp_num`, a QP of the id's device): the CM moves it as it moves an id's QP, and
/// destroying it closes the id's gate. False if there is no such QP.
///
/// # Safety
/// `param` is NULL or connection parameters.
unsafe fn take_external_qp(s: &SoftId, param: *const ffi::rdma_conn_param) -> bool {
    // SAFETY: the caller's contract.
    let Some(p) = (unsafe { param.as_ref() }) else { return false };
    // SAFETY: a bound id's context is open.
    let Some(ctx) = (unsafe { soft_context(s.ibv.verbs) }) else { return false };
    let Some(qp) = crate::event::object(ctx.device, crate::event::Kind::Qp, p.qp_num) else { return false };
    // SAFETY: a live QP of this library (just found in the registry).
    let Some(q) = (unsafe { soft_qp(qp as *mut ffi::ibv_qp) }) else { return false };
    *s.external_qp.lock().unwrap_or_else(|e| e.into_inner()) = qp;
    *q.cm_gate.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.qp_gate.clone());
    *s.qp_gate.lock().unwrap_or_else(|e| e.into_inner()) = true;
    true
}

/// `rdma_init_qp_attr`: what an application that made its own QP changes to bring it to
/// `attr->qp_state`. INIT: the port, the default P_Key and rdma_cm's access (remote READ,
/// WRITE and atomics; a UD id's Q_Key), as the kernel's rdma_cm gives them. RTR and RTS:
/// nothing (`*mask` 0), because softrdma's CM moves that QP itself at the points IBTA
/// 12.9 places the transitions, as it moves an id's own QP (RTR as the REQ or REP goes,
/// RTS on the REP or RTU), so a modify with what this returns changes nothing.
///
/// # Safety
/// `id` is a live id; `attr` and `mask` point at writable values.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut ffi::rdma_cm_id,
    attr: *mut ffi::ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(a), false) = (unsafe { soft_id(id) }, unsafe { attr.as_mut() }, mask.is_null()) else {
        return einval();
    };
    if s.ibv.verbs.is_null() {
        return einval();
    }
    let state = a.qp_state;
    // SAFETY: plain C data; all-zero is valid.
    *a = unsafe { std::mem::zeroed() };
    a.qp_state = state;
    a.port_num = 1;
    let mut m = 0;
    // SAFETY: the id's QP or the application's it connects, live while the id is.
    if state == ffi::IBV_QPS_INIT && !unsafe { past_init(s) } {
        m = ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT;
        if crate::cm_ud::is_ud(s) {
            a.qkey = softrdma::verbs::RDMA_UDP_QKEY;
            m |= ffi::IBV_QP_QKEY;
        } else {
            a.qp_access_flags = ffi::IBV_ACCESS_LOCAL_WRITE
                | ffi::IBV_ACCESS_REMOTE_WRITE
                | ffi::IBV_ACCESS_REMOTE_READ
                | ffi::IBV_ACCESS_REMOTE_ATOMIC;
            m |= ffi::IBV_QP_ACCESS_FLAGS;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { *mask = m as c_int };
    0
}

/// Whether the QP the id connects (its own, or the application's) is past INIT: the CM
/// has moved it on already (the initiator's, once the REP came).
///
/// # Safety
/// The id's QPs are live.
unsafe fn past_init(s: &SoftId) -> bool {
    let external = *s.external_qp.lock().unwrap_or_else(|e| e.into_inner());
    let qp = if s.ibv.qp.is_null() { external as *mut ffi::ibv_qp } else { s.ibv.qp };
    // SAFETY: the caller's contract.
    let state = unsafe { soft_qp(qp) }.and_then(|q| q.qp.state());
    state.is_some_and(|st| !matches!(st, QpState::Reset | QpState::Init))
}

/// `rdma_establish`: the RTU already went when the REP brought the QP to RTS.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut ffi::rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    if unsafe { soft_id(id) }.is_none() {
        return einval();
    }
    0
}

/// `rdma_listen`: requests arrive as CONNECT_REQUEST events, each with a new id.
///
/// # Safety
/// `id` is a live id bound with `rdma_bind_addr`.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut ffi::rdma_cm_id, _backlog: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    let Some(local) = addrs(s).0 else { return einval() };
    if crate::cm_ud::is_ud(s) {
        return crate::cm_ud::listen(s, id, local);
    }
    // SAFETY: a bound id's context is open.
    let Some(engine) = (unsafe { soft_context(s.ibv.verbs) }).and_then(|c| c.engine().ok()) else { return einval() };
    let listener = match engine.listen(local) {
        Ok(l) => l,
        Err(_) => {
            crate::set_errno(libc::EADDRINUSE);
            return -1;
        }
    };
    let (stop, at) = (s.stop.clone(), Ptr(id as usize));
    let handle = std::thread::spawn(move || serve(listener, at, stop));
    *s.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
    0
}

/// The PD librdmacm gives every id bound to device `ctx` (`id->pd`, what `rdma_create_qp`
/// uses when given none; pyverbs makes its PD object from it before the QP exists): one
/// per device, made on first use and kept for the process, as librdmacm keeps it while
/// the device is open.
pub(crate) fn default_pd(ctx: *mut ffi::ibv_context) -> *mut ffi::ibv_pd {
    static PDS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    let mut pds = PDS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: an open context of this library, open for the process (cm_addr::contexts).
    let pd = *pds.entry(ctx as usize).or_insert_with(|| unsafe { ibv_alloc_pd(ctx) } as usize);
    pd as *mut ffi::ibv_pd
}

/// A new id for a request on listener `parent` from `peer`, on the listener's device and
/// route. A synchronous listener's requests are synchronous ids too (librdmacm migrates
/// them to channels of their own); the others report on the listener's channel.
pub(crate) fn child_id(parent: &SoftId, peer: Option<SocketAddr>) -> Option<*mut SoftId> {
    let channel = if parent.sync { std::ptr::null_mut() } else { parent.ibv.channel };
    let child = new_id(channel, parent.ibv.context, parent.ibv.ps)?;
    // SAFETY: just made.
    let c = unsafe { &mut *child };
    c.ibv.verbs = parent.ibv.verbs;
    c.ibv.port_num = 1;
    c.ibv.pd = parent.ibv.pd;
    c.ibv.route = parent.ibv.route;
    if let Some(peer) = peer {
        // SAFETY: writing the storage member of the union.
        to_storage(peer, unsafe { &mut c.ibv.route.addr.__bindgen_anon_2.dst_storage });
    }
    Some(child)
}

/// The listening thread: each request becomes a child id and a CONNECT_REQUEST event.
fn serve(listener: Listener, listen_id: Ptr, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let Some(req) = listener.get_request(Duration::from_millis(100)) else { continue };
        // SAFETY: the listening id lives until its thread is joined (rdma_destroy_id).
        let parent = unsafe { &*(listen_id.0 as *const SoftId) };
        let Some(child) = child_id(parent, req.peer) else {
            req.reject(&[]);
            continue;
        };
        // SAFETY: just made.
        let c = unsafe { &mut *child };
        let depths = (req.responder_resources, req.initiator_depth);
        let data = req.private_data.clone();
        *c.request.lock().unwrap_or_else(|e| e.into_inner()) = Some(req);
        let ev = conn_event(child.cast(), listen_id.0 as *mut _, ffi::RDMA_CM_EVENT_CONNECT_REQUEST, data, depths);
        parent.queue.push(ev);
    }
}

/// `rdma_accept`: the MPA Reply or the CM's REP goes out on a thread; ESTABLISHED (or
/// CONNECT_ERROR) follows.
///
/// # Safety
/// `id` is a CONNECT_REQUEST's id with a QP; `param` NULL or connection parameters.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut ffi::rdma_cm_id, param: *mut ffi::rdma_conn_param) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    if crate::cm_ud::is_ud(s) {
        // SAFETY: the caller's contract.
        return crate::cm_ud::accept(s, &conn_param(unsafe { param.as_ref() }).private_data);
    }
    // SAFETY: the caller's contract.
    if s.ibv.qp.is_null() && !unsafe { take_external_qp(s, param) } {
        return einval();
    }
    let Some(req) = s.request.lock().unwrap_or_else(|e| e.into_inner()).take() else { return einval() };
    // SAFETY: the caller's contract.
    let p = conn_param(unsafe { param.as_ref() });
    let conn = Setup::of(s, id);
    std::thread::spawn(move || {
        let ev = match conn.with_qp(|q| req.accept(q, &p)) {
            Ok(()) => conn.established(Vec::new(), &p),
            Err(_) => {
                event(conn.at.0 as *mut _, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_CONNECT_ERROR, -libc::ECONNABORTED)
            }
        };
        conn.report(ev);
    });
    // SAFETY: the caller's contract.
    unsafe { complete(id) }
}

/// `rdma_reject`.
///
/// # Safety
/// `id` is a CONNECT_REQUEST's id; `data` holds `len` bytes (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut ffi::rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    let bytes = if data.is_null() {
        &[][..]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }
    };
    if crate::cm_ud::reject(s, bytes) {
        return 0;
    }
    let Some(req) = s.request.lock().unwrap_or_else(|e| e.into_inner()).take() else { return einval() };
    req.reject(bytes);
    0
}

/// `rdma_disconnect`: a DREQ (RoCEv2) or the stream closed (iWARP); both sides then get
/// DISCONNECTED.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut ffi::rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    let live = s.qp_gate.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the gate is held and says the QP lives.
    if let Some(q) = (*live).then(|| unsafe { soft_qp(s.ibv.qp) }).flatten() {
        let _ = q.qp.disconnect();
    }
    0
}

/// `rdma_destroy_id`: its threads end, an unanswered request is rejected.
///
/// # Safety
/// `id` is a live id whose QP was destroyed; nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut ffi::rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    live_ids().remove(&(id as usize));
    s.stop.store(true, Ordering::Release);
    crate::cm_watch::forget_id(id);
    if let Some(h) = s.listener.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = h.join();
    }
    // The QP is the application's to destroy (rdma_destroy_qp or ibv_destroy_qp) first.
    let pd = *s.own_pd.lock().unwrap_or_else(|e| e.into_inner());
    if pd != 0 {
        // SAFETY: the PD rdma_create_qp made; its QP is gone.
        unsafe { ibv_dealloc_pd(pd as *mut ffi::ibv_pd) };
    }
    if s.sync {
        ack_held(s);
        // SAFETY: the id's own channel, made with it; nothing else holds it.
        unsafe { rdma_destroy_event_channel(s.ibv.channel) };
    } else {
        s.queue.withdraw(id as usize);
    }
    crate::cm_acks::wait_acked(id as usize);
    // SAFETY: a bound id's context stays open.
    if let Some(engine) = unsafe { soft_context(s.ibv.verbs) }.and_then(|c| c.device.current_engine()) {
        engine.wait_closes_acknowledged();
    }
    // A connecting thread still running holds its own handles and may still read `id`
    // for a moment, so the id's memory is kept (a few hundred bytes).
    0
}

/// `rdma_set_option`: `RDMA_OPTION_ID_ACK_TIMEOUT` sets the Local ACK Timeout the id's
/// QP gets in RTS (and that `ibv_query_qp` reports from now); the others (type of service,
/// address reuse) are accepted and ignored.
///
/// # Safety
/// `id` is a live id; `val` points at `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut ffi::rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    let ack_timeout = level == ffi::RDMA_OPTION_ID as c_int && name == ffi::RDMA_OPTION_ID_ACK_TIMEOUT as c_int;
    if !ack_timeout {
        return 0;
    }
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    if val.is_null() || len != 1 {
        return einval();
    }
    // SAFETY: one byte at `val`.
    let t = unsafe { *val.cast::<u8>() };
    if t > 31 {
        return einval();
    }
    *s.ack_timeout.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    // SAFETY: the id's QP, if any, is this library's.
    if let Some(q) = unsafe { soft_qp(s.ibv.qp) } {
        q.set.lock().unwrap_or_else(|e| e.into_inner()).timeout = t;
    }
    0
}

/// `rdma_event_str`.
#[no_mangle]
pub extern "C" fn rdma_event_str(e: ffi::rdma_cm_event_type) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 16] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    NAMES.get(e as usize).copied().unwrap_or(c"UNKNOWN EVENT").as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// What perftest 4.5's connection retry does after a failed attempt: it destroys its ids
    /// and channel, then uses them again, or pointers read from memory it freed. Each use
    /// is refused with EINVAL; nothing freed or foreign is read.
    #[test]
    fn an_id_or_channel_used_after_it_was_destroyed_is_refused() {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut id = std::ptr::null_mut();
        // SAFETY: a live channel and a place for the id.
        assert_eq!(unsafe { rdma_create_id(ch, &mut id, std::ptr::null_mut(), ffi::RDMA_PS_TCP) }, 0);
        // SAFETY: the id and channel just made, destroyed once each.
        unsafe {
            assert_eq!(rdma_destroy_id(id), 0);
            rdma_destroy_event_channel(ch);
        }
        // SAFETY: plain C data; all-zero is valid.
        let mut dst: ffi::sockaddr_storage = unsafe { std::mem::zeroed() };
        to_storage("127.0.0.1:7000".parse().unwrap(), &mut dst);
        let mut ev = std::ptr::null_mut();
        // SAFETY: the stale handles are what is being tested; `dst` and `ev` are valid.
        unsafe {
            assert_eq!(rdma_resolve_addr(id, std::ptr::null_mut(), (&raw mut dst).cast(), 2000), -1);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!(rdma_destroy_id(id), -1, "destroyed twice");
            rdma_destroy_event_channel(ch); // a second destroy is ignored
            let garbage = 0x5555_0000_1000usize as *mut ffi::rdma_cm_id;
            assert_eq!(rdma_resolve_addr(garbage, std::ptr::null_mut(), (&raw mut dst).cast(), 2000), -1);
            assert_eq!(rdma_destroy_id(garbage), -1);
            rdma_destroy_event_channel(0x5555_0000_2000usize as *mut ffi::rdma_event_channel);
        }
        assert!(ev.is_null());
    }
}
