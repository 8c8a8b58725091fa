//! Multicast: `ibv_attach_mcast` / `ibv_detach_mcast` on a UD QP, and librdmacm's
//! `rdma_join_multicast` (what `mckey` uses) on a UD id. On RoCEv2 a group is an IP
//! multicast address and its GID the address (an IPv4 one IPv4-mapped), as Linux's rdma_cm
//! maps it; joining needs no subnet administrator: the id's QP is attached at once and
//! MULTICAST_JOIN reports DestQP 0xFFFFFF, rdma_cm's Q_Key and an address handle's
//! attributes for sending to the group. iWARP has no multicast (EOPNOTSUPP).

use crate::cm::{complete, einval, event, soft_id, SoftId};
use crate::cm_addr::from_c;
use crate::ffi;
use crate::qp::soft_qp;
use softrdma::engine::mcast::{is_multicast, MCAST_QPN};
use softrdma::engine::verbs::{Gid, VerbsError};
use softrdma::transport::headers::ip_to_gid;
use softrdma::verbs::RDMA_UDP_QKEY;
use std::ffi::{c_int, c_void};

fn errno_of(e: VerbsError) -> c_int {
    match e {
        VerbsError::Unsupported => libc::EOPNOTSUPP,
        VerbsError::OutOfResources => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// Attaches or detaches `qp`'s QP; an errno.
///
/// # Safety
/// `qp` is NULL or a QP of this library; `gid` NULL or a GID.
unsafe fn with_qp(qp: *mut ffi::ibv_qp, gid: *const ffi::ibv_gid, attach: bool) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(q), Some(gid)) = (unsafe { soft_qp(qp) }, unsafe { gid.as_ref() }) else { return libc::EINVAL };
    // SAFETY: every bit pattern is a valid `raw`.
    let mgid = unsafe { gid.raw };
    let done = if attach { q.qp.attach_mcast(mgid) } else { q.qp.detach_mcast(mgid) };
    done.map_or_else(errno_of, |()| 0)
}

/// `ibv_attach_mcast`: the UD QP receives the group's datagrams (the LID is unused on
/// RoCE). Returns 0 or an errno, as rdma-core's does.
///
/// # Safety
/// `qp` is a QP of this library; `gid` points at a GID.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ffi::ibv_qp, gid: *const ffi::ibv_gid, _lid: u16) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_qp(qp, gid, true) }
}

/// `ibv_detach_mcast`.
///
/// # Safety
/// As [`ibv_attach_mcast`].
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ffi::ibv_qp, gid: *const ffi::ibv_gid, _lid: u16) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_qp(qp, gid, false) }
}

/// The group `addr` names, if it is an IP multicast address.
///
/// # Safety
/// `addr` is NULL or a socket address.
unsafe fn group_of(addr: *const ffi::sockaddr) -> Option<Gid> {
    // SAFETY: the caller's contract.
    let a = unsafe { from_c(addr) }?;
    let gid = ip_to_gid(a.ip());
    is_multicast(&gid).then_some(gid)
}

/// The MULTICAST_JOIN event: `param.ud` to send to the group, with the join's context as
/// its private data (librdmacm's convention).
fn joined(id: *mut ffi::rdma_cm_id, mgid: Gid, context: *mut c_void) -> Box<crate::cm::EventBox> {
    let mut b = event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_MULTICAST_JOIN, 0);
    // SAFETY: the ud member is the one multicast events fill; plain C data.
    let ud = unsafe { &mut b.ev.param.ud };
    ud.private_data = context.cast_const();
    ud.qp_num = MCAST_QPN;
    ud.qkey = RDMA_UDP_QKEY;
    ud.ah_attr.is_global = 1;
    ud.ah_attr.port_num = 1;
    ud.ah_attr.grh.dgid.raw = mgid;
    ud.ah_attr.grh.hop_limit = 1;
    b
}

/// Joins `mgid` on a UD id bound to a device: its QP (if it has one and `attach`)
/// attached, then MULTICAST_JOIN.
///
/// # Safety
/// `id` is a live id of this library.
unsafe fn join(id: *mut ffi::rdma_cm_id, s: &mut SoftId, mgid: Gid, attach: bool, context: *mut c_void) -> c_int {
    if s.ibv.ps != ffi::RDMA_PS_UDP || s.ibv.verbs.is_null() {
        return einval();
    }
    if attach && !s.ibv.qp.is_null() {
        // SAFETY: the id's QP, made by this library.
        let rc = unsafe { with_qp(s.ibv.qp, (&raw const mgid).cast(), true) };
        if rc != 0 {
            crate::set_errno(rc);
            return -1;
        }
    }
    s.groups.lock().unwrap_or_else(|e| e.into_inner()).push((mgid, attach));
    s.queue.push(joined(id, mgid, context));
    // SAFETY: the caller's contract.
    unsafe { complete(id) }
}

/// `rdma_join_multicast`: a full member.
///
/// # Safety
/// `id` is a live id; `addr` a socket address.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut ffi::rdma_cm_id,
    addr: *mut ffi::sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(mgid)) = (unsafe { soft_id(id) }, unsafe { group_of(addr) }) else { return einval() };
    // SAFETY: as above.
    unsafe { join(id, s, mgid, true, context) }
}

/// `rdma_join_multicast_ex`: the address, and a send-only member's QP left unattached.
///
/// # Safety
/// `id` is a live id; `attr` points at the attributes.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut ffi::rdma_cm_id,
    attr: *mut ffi::rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(a)) = (unsafe { soft_id(id) }, unsafe { attr.as_ref() }) else { return einval() };
    let known = ffi::RDMA_CM_JOIN_MC_ATTR_ADDRESS | ffi::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    if a.comp_mask & !known != 0 || a.comp_mask & ffi::RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 {
        return einval();
    }
    let flags = if a.comp_mask & ffi::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS != 0 {
        a.join_flags
    } else {
        ffi::RDMA_MC_JOIN_FLAG_FULLMEMBER
    };
    let full = match flags {
        ffi::RDMA_MC_JOIN_FLAG_FULLMEMBER => true,
        ffi::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => false,
        _ => return einval(),
    };
    // SAFETY: the caller's contract.
    let Some(mgid) = (unsafe { group_of(a.addr) }) else { return einval() };
    // SAFETY: as above.
    unsafe { join(id, s, mgid, full, context) }
}

/// `rdma_leave_multicast`: the id's QP detached; EADDRNOTAVAIL for a group it did not join.
///
/// # Safety
/// `id` is a live id; `addr` a socket address.
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut ffi::rdma_cm_id, addr: *mut ffi::sockaddr) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(s), Some(mgid)) = (unsafe { soft_id(id) }, unsafe { group_of(addr) }) else { return einval() };
    let mut groups = s.groups.lock().unwrap_or_else(|e| e.into_inner());
    let Some(at) = groups.iter().position(|g| g.0 == mgid) else {
        crate::set_errno(libc::EADDRNOTAVAIL);
        return -1;
    };
    let (_, attached) = groups.remove(at);
    if attached && !s.ibv.qp.is_null() {
        // SAFETY: the id's QP; a QP destroyed first left its groups already.
        let _ = unsafe { with_qp(s.ibv.qp, (&raw const mgid).cast(), false) };
    }
    0
}
