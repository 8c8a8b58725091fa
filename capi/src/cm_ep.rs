//! librdmacm's synchronous endpoint calls (`rdma_create_ep`, `rdma_get_request`,
//! `rdma_destroy_ep`, as rdma_server and rdma_client use them), moving an id between
//! channels, an id's SRQ, its ports, and the rest of the id calls beside `cm.rs`.

use crate::cm::{ack_held, einval, queue_of, soft_id, SoftId};
use crate::cm_addr::from_c;
use crate::ffi;
use std::ffi::{c_int, c_void};

/// `RAI_PASSIVE` (rdma/rdma_cma.h): the address is the local one, to listen on.
const RAI_PASSIVE: c_int = 1;

/// `rdma_create_ep`: a synchronous id for `res`: bound (passive: requests then come
/// through `rdma_get_request`, each with a QP made from `qp_init` if given), or with its
/// address and route resolved and a QP made from `qp_init` if given (active).
///
/// # Safety
/// `out` writable; `res` from `rdma_getaddrinfo`; `pd` NULL or a PD of the device;
/// `qp_init` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    out: *mut *mut ffi::rdma_cm_id,
    res: *mut ffi::rdma_addrinfo,
    pd: *mut ffi::ibv_pd,
    qp_init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(r) = (unsafe { res.as_ref() }) else { return einval() };
    if out.is_null() {
        return einval();
    }
    let mut id = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    if unsafe { crate::cm::rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), r.ai_port_space as _) }
        != 0
    {
        return -1;
    }
    // SAFETY: the id just made; the caller's contract for the rest.
    let made = unsafe {
        if r.ai_flags & RAI_PASSIVE != 0 {
            passive_ep(id, r, pd, qp_init)
        } else {
            active_ep(id, r, pd, qp_init)
        }
    };
    if made != 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
        // SAFETY: the id just made, used by nothing else.
        unsafe { rdma_destroy_ep(id) };
        crate::set_errno(errno);
        return -1;
    }
    // SAFETY: a valid out-pointer.
    unsafe { *out = id };
    0
}

/// # Safety
/// As [`rdma_create_ep`].
unsafe fn passive_ep(
    id: *mut ffi::rdma_cm_id,
    r: &ffi::rdma_addrinfo,
    pd: *mut ffi::ibv_pd,
    qp_init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    if unsafe { crate::cm::rdma_bind_addr(id, r.ai_src_addr) } != 0 {
        return -1;
    }
    // SAFETY: a live id.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    if !pd.is_null() {
        s.ibv.pd = pd;
    }
    // SAFETY: the caller's contract.
    if let Some(a) = unsafe { qp_init.as_ref() } {
        let mut a = *a;
        a.qp_type = r.ai_qp_type as _;
        *s.qp_init.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
    }
    0
}

/// # Safety
/// As [`rdma_create_ep`].
unsafe fn active_ep(
    id: *mut ffi::rdma_cm_id,
    r: &ffi::rdma_addrinfo,
    pd: *mut ffi::ibv_pd,
    qp_init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract; the id is synchronous, so each call has finished.
    unsafe {
        if crate::cm::rdma_resolve_addr(id, r.ai_src_addr, r.ai_dst_addr, 2000) != 0
            || crate::cm::rdma_resolve_route(id, 2000) != 0
        {
            return -1;
        }
        match qp_init.as_mut() {
            Some(a) => {
                a.qp_type = r.ai_qp_type as _;
                crate::cm::rdma_create_qp(id, pd, a)
            }
            None => 0,
        }
    }
}

/// `rdma_destroy_ep`: the id's QP, SRQ and the id.
///
/// # Safety
/// `id` is a live id; nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut ffi::rdma_cm_id) {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return };
    // SAFETY: the id's own objects, destroyed once.
    unsafe {
        if !s.ibv.qp.is_null() {
            crate::cm::rdma_destroy_qp(id);
        }
        if !s.ibv.srq.is_null() {
            rdma_destroy_srq(id);
        }
        crate::cm::rdma_destroy_id(id);
    }
}

/// `rdma_get_request`: the next connection request of a synchronous listener, as a new
/// synchronous id (with a QP if the listener was made with QP attributes).
///
/// # Safety
/// `listen` is a synchronous listening id; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(listen: *mut ffi::rdma_cm_id, out: *mut *mut ffi::rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(listen) }) else { return einval() };
    if !s.sync || out.is_null() {
        return einval();
    }
    ack_held(s);
    let mut ev = std::ptr::null_mut();
    // SAFETY: the listener's own channel.
    if unsafe { crate::cm::rdma_get_cm_event(s.ibv.channel, &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: just taken from the queue.
    let e = unsafe { &*ev };
    let errno = match (e.event, e.status) {
        (ffi::RDMA_CM_EVENT_REJECTED, _) => libc::ECONNREFUSED,
        (_, st) if st != 0 => st.abs(),
        (ffi::RDMA_CM_EVENT_CONNECT_REQUEST, _) => 0,
        _ => libc::EINVAL,
    };
    let made = match (errno, *s.qp_init.lock().unwrap_or_else(|e| e.into_inner())) {
        (0, Some(mut a)) => {
            // SAFETY: the request's new id; the listener's PD (or none: one is made).
            unsafe { crate::cm::rdma_create_qp(e.id, s.ibv.pd, &mut a) }
        }
        (0, None) => 0,
        (errno, _) => {
            crate::set_errno(errno);
            -1
        }
    };
    if made != 0 {
        s.ibv.event = ev;
        return -1;
    }
    // SAFETY: the request's id, live; `out` writable.
    unsafe {
        (*e.id).event = ev;
        *out = e.id;
    }
    0
}

/// `rdma_migrate_id`: the id's later events go to `channel` (NULL: the id becomes
/// synchronous), with those it has waiting. A connection already being set up or watched
/// keeps reporting where it began.
///
/// # Safety
/// `id` is a live id; `channel` NULL or a live channel.
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(id: *mut ffi::rdma_cm_id, channel: *mut ffi::rdma_event_channel) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    if s.sync && channel.is_null() {
        return einval();
    }
    let sync = channel.is_null();
    let channel = if sync { crate::cm::rdma_create_event_channel() } else { channel };
    // SAFETY: a live channel, the caller's or just made.
    let Some(queue) = (unsafe { queue_of(channel) }) else { return einval() };
    s.queue.move_events_of(id, &queue);
    if s.sync {
        ack_held(s);
        // SAFETY: the id's own channel, made with it.
        unsafe { crate::cm::rdma_destroy_event_channel(s.ibv.channel) };
    }
    s.queue = queue;
    s.sync = sync;
    s.ibv.channel = channel;
    0
}

/// `rdma_create_srq`: an SRQ for the id's QP to come (on the id's PD, or `pd`).
///
/// # Safety
/// `id` is a live id bound to a device; `pd` NULL or its PD; `attr` valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_srq_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return einval() };
    let pd = if pd.is_null() { s.ibv.pd } else { pd };
    if pd.is_null() || !s.ibv.srq.is_null() {
        return einval();
    }
    // SAFETY: the caller's contract.
    let srq = unsafe { crate::srq::ibv_create_srq(pd, attr) };
    if srq.is_null() {
        return -1;
    }
    s.ibv.srq = srq;
    s.ibv.pd = pd;
    0
}

/// `rdma_create_srq_ex`: a basic SRQ as `rdma_create_srq` makes it; a typed one (XRC with
/// its domain, tag matching) through `ibv_create_srq_ex`, in the id's PD and with the id's
/// receive CQ unless `attr` names others, as librdmacm fills them. An XRC SRQ without a
/// domain answers EOPNOTSUPP (librdmacm would open one for the device).
///
/// # Safety
/// `id` is a live id bound to a device; `attr` valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(id: *mut ffi::rdma_cm_id, attr: *mut ffi::ibv_srq_init_attr_ex) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(a)) = (unsafe { soft_id(id) }, unsafe { attr.as_mut() }) else { return einval() };
    let typed = a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != ffi::IBV_SRQT_BASIC;
    if !typed {
        if a.comp_mask & !(ffi::IBV_SRQ_INIT_ATTR_TYPE | ffi::IBV_SRQ_INIT_ATTR_PD) != 0 {
            crate::set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        let pd = if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_PD != 0 { a.pd } else { std::ptr::null_mut() };
        let mut basic = ffi::ibv_srq_init_attr { srq_context: a.srq_context, attr: a.attr };
        // SAFETY: the caller's contract; `basic` is ours.
        let made = unsafe { rdma_create_srq(id, pd, &mut basic) };
        a.attr = basic.attr;
        return made;
    }
    if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_PD == 0 {
        a.comp_mask |= ffi::IBV_SRQ_INIT_ATTR_PD;
        a.pd = s.ibv.pd;
    }
    if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
        a.comp_mask |= ffi::IBV_SRQ_INIT_ATTR_CQ;
        a.cq = s.ibv.recv_cq;
    }
    if a.srq_type == ffi::IBV_SRQT_XRC && a.xrcd.is_null() {
        crate::set_errno(libc::EOPNOTSUPP);
        return -1;
    }
    // SAFETY: the id's device context; `a` the caller's, its objects this library's.
    let srq = unsafe { crate::xrc::create_srq_ex(s.ibv.verbs, a) };
    if srq.is_null() {
        return -1;
    }
    s.ibv.srq = srq;
    0
}

/// `rdma_destroy_srq`.
///
/// # Safety
/// `id` is a live id whose SRQ no QP uses any more.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut ffi::rdma_cm_id) {
    // SAFETY: the caller's contract.
    let Some(s) = (unsafe { soft_id(id) }) else { return };
    let srq = std::mem::replace(&mut s.ibv.srq, std::ptr::null_mut());
    if !srq.is_null() {
        // SAFETY: the id's SRQ, destroyed once.
        unsafe { crate::srq::ibv_destroy_srq(srq) };
    }
}

/// A port of the id's route, in network byte order as librdmacm returns it (0: none).
fn port_of(s: &SoftId, dst: bool) -> u16 {
    let a = &s.ibv.route.addr;
    // SAFETY: the storage members are what this library writes; a zeroed one reads None.
    let addr = unsafe {
        if dst {
            from_c((&raw const a.__bindgen_anon_2.dst_storage).cast())
        } else {
            from_c((&raw const a.__bindgen_anon_1.src_storage).cast())
        }
    };
    addr.map_or(0, |a| a.port().to_be())
}

/// `rdma_get_src_port`.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut ffi::rdma_cm_id) -> u16 {
    // SAFETY: the caller's contract.
    unsafe { soft_id(id) }.map_or(0, |s| port_of(s, false))
}

/// `rdma_get_dst_port`.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut ffi::rdma_cm_id) -> u16 {
    // SAFETY: the caller's contract.
    unsafe { soft_id(id) }.map_or(0, |s| port_of(s, true))
}

/// `rdma_notify`: tells the CM of a QP event (communication established before the
/// RTU). softrdma's CM moves its QPs itself, so there is nothing to do.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut ffi::rdma_cm_id, _event: ffi::ibv_event_type) -> c_int {
    // SAFETY: the caller's contract.
    if unsafe { soft_id(id) }.is_none() {
        return einval();
    }
    0
}

/// `rdma_reject_ece`: as `rdma_reject` (softrdma negotiates no ECE).
///
/// # Safety
/// As `rdma_reject`.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(id: *mut ffi::rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { crate::cm::rdma_reject(id, data, len) }
}
