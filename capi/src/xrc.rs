//! XRC for C applications (IBTA vol.1 14.2; rdma-core's `ibv_open_xrcd`,
//! `ibv_create_srq_ex` with `IBV_SRQT_XRC`, `ibv_get_srq_num`, `IBV_QPT_XRC_SEND` and
//! `IBV_QPT_XRC_RECV` QPs, `wr.qp_type.xrc.remote_srqn` and `ibv_wr_set_xrc_srqn`). A
//! domain opened with a file descriptor is shared by every open of the same file in this
//! process, as the kernel shares it by inode; across processes it cannot be, each process
//! having its own engine (a target QP to share, `ibv_open_qp`, is refused likewise).

use crate::device::soft_context;
use crate::ffi;
use crate::objects::{fail, soft_pd};
use crate::srq::{soft_srq, srq_size_ok, wrap_srq};
use softrdma::verbs::XrcDomain;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, Weak};

/// `ibv_xrcd` and its domain.
#[repr(C)]
pub struct SoftXrcd {
    /// What applications see.
    pub ibv: ffi::ibv_xrcd,
    /// The engine's domain, shared by the opens of one file.
    pub domain: Arc<XrcDomain>,
}

/// Domains opened through a file, by (device, file system device, inode).
type Shared = HashMap<(usize, u64, u64), Weak<XrcDomain>>;
static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

/// The domain of the file `fd` names on `device`, if one is open; a new one if `create`.
fn shared_domain(
    device: usize,
    fd: c_int,
    oflags: c_int,
    open: impl FnOnce() -> Option<XrcDomain>,
) -> Result<Arc<XrcDomain>, c_int> {
    // SAFETY: fstat fills `st` for a valid descriptor and fails otherwise.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(libc::EBADF);
    }
    let key = (device, st.st_dev, st.st_ino);
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let map = shared.get_or_insert_with(HashMap::new);
    map.retain(|_, d| d.strong_count() > 0);
    if let Some(d) = map.get(&key).and_then(Weak::upgrade) {
        let exclusive = oflags & libc::O_CREAT != 0 && oflags & libc::O_EXCL != 0;
        return if exclusive { Err(libc::EEXIST) } else { Ok(d) };
    }
    if oflags & libc::O_CREAT == 0 {
        return Err(libc::ENOENT);
    }
    let d = Arc::new(open().ok_or(libc::EOPNOTSUPP)?);
    map.insert(key, Arc::downgrade(&d));
    Ok(d)
}

/// `verbs_context.open_xrcd`: a private domain for fd -1, else the file's (created with
/// `O_CREAT`, ENOENT without; EEXIST with `O_EXCL` when it exists). EOPNOTSUPP on iWARP.
///
/// # Safety
/// `context` is an open context; `attr` points to a `struct ibv_xrcd_init_attr`.
pub unsafe extern "C" fn open_xrcd(
    context: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_xrcd_init_attr,
) -> *mut ffi::ibv_xrcd {
    // SAFETY: the caller's contract.
    let (Some(soft), Some(a)) = (unsafe { soft_context(context) }, unsafe { attr.as_ref() }) else {
        return fail(libc::EINVAL);
    };
    let needed = ffi::IBV_XRCD_INIT_ATTR_FD | ffi::IBV_XRCD_INIT_ATTR_OFLAGS;
    if a.comp_mask & needed != needed || a.comp_mask & !(needed | ffi::IBV_XRCD_INIT_ATTR_RESERVED) != 0 {
        return fail(libc::EINVAL);
    }
    let engine = match soft.engine() {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let domain = if a.fd == -1 {
        engine.open_xrcd().map(Arc::new).map_err(|_| libc::EOPNOTSUPP)
    } else {
        shared_domain(crate::event::device_key(soft.device), a.fd, a.oflags, || engine.open_xrcd().ok())
    };
    match domain {
        Ok(domain) => Box::into_raw(Box::new(SoftXrcd { ibv: ffi::ibv_xrcd { context }, domain })).cast(),
        Err(e) => fail(e),
    }
}

/// `verbs_context.close_xrcd`: EBUSY while an SRQ or target QP of the domain lives and
/// this is its last open.
///
/// # Safety
/// `xrcd` came from [`open_xrcd`]; nothing uses it afterwards unless EBUSY.
pub unsafe extern "C" fn close_xrcd(xrcd: *mut ffi::ibv_xrcd) -> c_int {
    // SAFETY: the caller's contract.
    let Some(x) = (unsafe { xrcd.cast::<SoftXrcd>().as_ref() }) else { return libc::EINVAL };
    if Arc::strong_count(&x.domain) == 1 && x.domain.close().is_err() {
        return libc::EBUSY;
    }
    // SAFETY: allocated by Box in open_xrcd, given back once.
    drop(unsafe { Box::from_raw(xrcd.cast::<SoftXrcd>()) });
    0
}

/// `verbs_context.create_srq_ex` (the inline `ibv_create_srq_ex` makes basic SRQs
/// through `ibv_create_srq`): an XRC SRQ with its domain, PD and CQ, or a tag-matching
/// one ([`crate::tm`]). EINVAL for a missing domain, PD or CQ.
///
/// # Safety
/// `context` is an open context; `attr` points to a `struct ibv_srq_init_attr_ex` whose
/// PD, domain and CQ this library made.
pub unsafe extern "C" fn create_srq_ex(
    context: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_srq_init_attr_ex,
) -> *mut ffi::ibv_srq {
    // SAFETY: the caller's contract.
    let (Some(soft), Some(a)) = (unsafe { soft_context(context) }, unsafe { attr.as_mut() }) else {
        return fail(libc::EINVAL);
    };
    if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type == ffi::IBV_SRQT_TM {
        // SAFETY: the caller's contract.
        return unsafe { crate::tm::create_tm_srq(soft, a) };
    }
    let needed = ffi::IBV_SRQ_INIT_ATTR_TYPE
        | ffi::IBV_SRQ_INIT_ATTR_PD
        | ffi::IBV_SRQ_INIT_ATTR_XRCD
        | ffi::IBV_SRQ_INIT_ATTR_CQ;
    if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_TYPE == 0 || a.srq_type != ffi::IBV_SRQT_XRC || a.comp_mask & !needed != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's contract: objects of this library.
    let parts = unsafe { (soft_pd(a.pd), a.xrcd.cast::<SoftXrcd>().as_ref(), crate::cq::soft_cq(a.cq)) };
    let (Some(pd), Some(x), Some(cq)) = parts else { return fail(libc::EINVAL) };
    if a.comp_mask & needed != needed || !srq_size_ok(a.attr.max_wr, a.attr.max_sge) {
        return fail(libc::EINVAL);
    }
    let Ok(engine) = soft.engine() else { return fail(libc::EIO) };
    let sge = a.attr.max_sge.max(1);
    let Ok(srq) = engine.create_xrc_srq(&x.domain, &pd.pd, &cq.cq, (a.attr.max_wr as usize, sge as usize)) else {
        return fail(libc::ENOMEM);
    };
    a.attr.max_sge = sge;
    wrap_srq(soft, srq, a.pd, a.srq_context, ffi::ibv_srq_attr { max_wr: a.attr.max_wr, max_sge: sge, srq_limit: 0 })
}

/// `verbs_context.get_srq_num`: the number initiators put in their XRCETH.
///
/// # Safety
/// `srq` is a live SRQ of this library; `num` is writable.
pub unsafe extern "C" fn get_srq_num(srq: *mut ffi::ibv_srq, num: *mut u32) -> c_int {
    // SAFETY: the caller's contract.
    match (unsafe { soft_srq(srq) }, unsafe { num.as_mut() }) {
        (Some(s), Some(n)) => {
            *n = s.srq.srq_num();
            0
        }
        _ => libc::EINVAL,
    }
}

/// `ibv_create_qp_ex` for `IBV_QPT_XRC_SEND` (a PD and a send CQ) and `IBV_QPT_XRC_RECV`
/// (a domain, nothing else).
///
/// # Safety
/// As `ibv_create_qp_ex`.
pub unsafe fn create_qp(context: *mut ffi::ibv_context, a: &mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(context) }) else { return fail(libc::EINVAL) };
    let Ok(engine) = soft.engine() else { return fail(libc::EIO) };
    let mask = ffi::IBV_QP_INIT_ATTR_PD | ffi::IBV_QP_INIT_ATTR_XRCD | ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    let extended = a.comp_mask & ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    if a.comp_mask & !mask != 0 || (extended && a.send_ops_flags & !crate::wr::SEND_OPS_SUPPORTED != 0) {
        return fail(libc::EOPNOTSUPP);
    }
    let caps = match crate::qp::caps_of(&a.cap) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let mut basic = ffi::ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // A target never sends: its unused inline buffer goes in a PD of its own.
    let target_pd;
    let made = if a.qp_type == ffi::IBV_QPT_XRC_SEND {
        // SAFETY: the caller's contract: a PD and CQ of this library.
        let (Some(pd), Some(cq)) = (unsafe { soft_pd(a.pd) }, unsafe { crate::cq::soft_cq(a.send_cq) }) else {
            return fail(libc::EINVAL);
        };
        engine.create_xrc_initiator(&pd.pd, &cq.cq, caps).map(|q| (q, a.pd, &pd.pd))
    } else {
        // SAFETY: the caller's contract: a domain of this library.
        let Some(x) = (unsafe { a.xrcd.cast::<SoftXrcd>().as_ref() }) else { return fail(libc::EINVAL) };
        basic.send_cq = std::ptr::null_mut();
        target_pd = engine.alloc_pd();
        engine.create_xrc_target(&x.domain).map(|q| (q, std::ptr::null_mut(), &target_pd))
    };
    let Ok((qp, pd, inline_pd)) = made else { return fail(libc::ENOMEM) };
    let out = crate::qp::wrap_qp(soft, qp, (pd, inline_pd), &mut basic, extended, caps);
    a.cap = basic.cap;
    out
}
