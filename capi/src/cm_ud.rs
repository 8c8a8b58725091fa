//! librdmacm's UD port space (`RDMA_PS_UDP`, what `udaddy` uses) on RoCEv2: the id's QP is
//! a UD QP brought to RTS with rdma_cm's Q_Key when made; `rdma_connect` resolves the
//! listener's QP by SIDR (IBTA 12.11) and reports ESTABLISHED with its QPN, Q_Key and an
//! address handle's attributes; a listener reports each resolution request as
//! CONNECT_REQUEST, answered by `rdma_accept` (no event follows, as with the kernel's) or
//! `rdma_reject`. iWARP has no UD QPs: their creation fails.

use crate::cm::{einval, event, EventBox, Ptr, SoftId};
use crate::device::soft_context;
use crate::ffi;
use crate::qp::soft_qp;
use softrdma::proto::cm::msg::sidr_status;
use softrdma::verbs::{ConnectError, QpAttr, QpState, UdListener, UdPeer, RDMA_UDP_QKEY};
use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a resolution waits for the listener's answer (the CM repeats its request
/// meanwhile).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(15);

/// True for an id of the UD port space.
pub fn is_ud(s: &SoftId) -> bool {
    s.ibv.ps == ffi::RDMA_PS_UDP
}

/// Takes a UD id's new QP to RTS with rdma_cm's Q_Key (librdmacm does the same when it
/// makes the QP); EINVAL for a QP that is not UD.
pub fn ready_qp(qp: *mut ffi::ibv_qp) -> Result<(), c_int> {
    // SAFETY: a QP this library just made.
    let q = unsafe { soft_qp(qp) }.ok_or(libc::EINVAL)?;
    if q.ibv().qp_type != ffi::IBV_QPT_UD {
        return Err(libc::EINVAL);
    }
    let st = |state| QpAttr { state: Some(state), ..QpAttr::default() };
    let steps = [
        QpAttr { pkey: Some(0xffff), qkey: Some(RDMA_UDP_QKEY), ..st(QpState::Init) },
        st(QpState::Rtr),
        QpAttr { sq_psn: Some(0), ..st(QpState::Rts) },
    ];
    steps.iter().try_for_each(|a| q.qp.modify(a)).map_err(|_| libc::EINVAL)?;
    // What ibv_query_qp reports (udaddy answers with the Q_Key it reads there).
    let mut set = q.set.lock().unwrap_or_else(|e| e.into_inner());
    set.qkey = RDMA_UDP_QKEY;
    set.port_num = 1;
    Ok(())
}

/// The ESTABLISHED event of a resolved peer: `param.ud` with its QPN, Q_Key, private data
/// and the attributes of an address handle to it.
fn resolved(id: *mut ffi::rdma_cm_id, p: UdPeer) -> Box<EventBox> {
    let mut b = event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_ESTABLISHED, 0);
    b.private_data = p.private_data;
    // SAFETY: the ud member is the one UD events fill; plain C data.
    let ud = unsafe { &mut b.ev.param.ud };
    ud.private_data = b.private_data.as_ptr().cast();
    ud.private_data_len = b.private_data.len().min(255) as u8;
    ud.qp_num = p.qpn;
    ud.qkey = p.qkey;
    ud.ah_attr.is_global = 1;
    ud.ah_attr.port_num = 1;
    ud.ah_attr.grh.dgid.raw = p.gid;
    ud.ah_attr.grh.hop_limit = 64;
    b
}

/// The failure event of a resolution: UNREACHABLE, with the SIDR_REP status when the
/// listener's side refused (1: nobody listens), as the kernel's rdma_cm reports it.
fn unresolved(id: *mut ffi::rdma_cm_id, e: &ConnectError) -> Box<EventBox> {
    let status = match e {
        ConnectError::NoListener(_) => c_int::from(sidr_status::UNSUPPORTED_SERVICE),
        ConnectError::Rejected { .. } => c_int::from(sidr_status::REJECTED),
        _ => -libc::ETIMEDOUT,
    };
    event(id, std::ptr::null_mut(), ffi::RDMA_CM_EVENT_UNREACHABLE, status)
}

/// `rdma_connect` on a UD id: the resolution runs on a thread; ESTABLISHED or UNREACHABLE
/// follows on the id's channel.
pub fn connect(s: &SoftId, id: *mut ffi::rdma_cm_id, peer: SocketAddr, private_data: Vec<u8>) -> c_int {
    // SAFETY: a bound id's context is open.
    let Some(engine) = (unsafe { soft_context(s.ibv.verbs) }).and_then(|c| c.engine().ok()) else { return einval() };
    let (queue, at) = (s.queue.clone(), Ptr(id as usize));
    std::thread::spawn(move || {
        let ev = match engine.resolve_ud(peer, &private_data, RESOLVE_TIMEOUT) {
            Ok(p) => resolved(at.0 as *mut _, p),
            Err(e) => unresolved(at.0 as *mut _, &e),
        };
        queue.push(ev);
    });
    0
}

/// `rdma_listen` on a UD id: a thread turns each resolution request into a child id and
/// a CONNECT_REQUEST event.
pub fn listen(s: &SoftId, id: *mut ffi::rdma_cm_id, local: SocketAddr) -> c_int {
    // SAFETY: a bound id's context is open.
    let Some(engine) = (unsafe { soft_context(s.ibv.verbs) }).and_then(|c| c.engine().ok()) else { return einval() };
    let listener = match engine.listen_ud(local) {
        Ok(l) => l,
        Err(e) => {
            let errno = if e.kind() == std::io::ErrorKind::Unsupported { libc::EOPNOTSUPP } else { libc::EADDRINUSE };
            crate::set_errno(errno);
            return -1;
        }
    };
    let (stop, at) = (s.stop.clone(), Ptr(id as usize));
    let handle = std::thread::spawn(move || serve(listener, at, stop));
    *s.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
    0
}

fn serve(listener: UdListener, listen_id: Ptr, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let Some(req) = listener.get_request(Duration::from_millis(100)) else { continue };
        // SAFETY: the listening id lives until its thread is joined (rdma_destroy_id).
        let parent = unsafe { &*(listen_id.0 as *const SoftId) };
        let Some(child) = crate::cm::child_id(parent, req.peer) else {
            req.reject(&[]);
            continue;
        };
        // SAFETY: just made.
        let c = unsafe { &mut *child };
        let mut ev = event(child.cast(), listen_id.0 as *mut _, ffi::RDMA_CM_EVENT_CONNECT_REQUEST, 0);
        ev.private_data = req.private_data.clone();
        // SAFETY: the ud member is the one UD events fill.
        let ud = unsafe { &mut ev.ev.param.ud };
        ud.private_data = ev.private_data.as_ptr().cast();
        ud.private_data_len = ev.private_data.len().min(255) as u8;
        *c.ud_request.lock().unwrap_or_else(|e| e.into_inner()) = Some(req);
        parent.queue.push(ev);
    }
}

/// `rdma_accept` on a UD request's id: the SIDR_REP names the id's QP and rdma_cm's Q_Key,
/// which [`ready_qp`] gave it.
pub fn accept(s: &SoftId, private_data: &[u8]) -> c_int {
    let Some(req) = s.ud_request.lock().unwrap_or_else(|e| e.into_inner()).take() else { return einval() };
    let live = s.qp_gate.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the gate is held and says the QP lives.
    let Some(q) = (*live).then(|| unsafe { soft_qp(s.ibv.qp) }).flatten() else {
        req.reject(&[]);
        return einval();
    };
    match req.accept(&q.qp, RDMA_UDP_QKEY, private_data) {
        Ok(()) => 0,
        Err(_) => einval(),
    }
}

/// `rdma_reject` on a UD request's id; false if the id holds none.
pub fn reject(s: &SoftId, private_data: &[u8]) -> bool {
    let Some(req) = s.ud_request.lock().unwrap_or_else(|e| e.into_inner()).take() else { return false };
    req.reject(private_data);
    true
}
