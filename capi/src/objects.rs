//! Protection domains, memory regions and address handles: each a C structure first, the
//! softrdma object after it, so the pointer handed out finds both.

use crate::device::soft_context;
use crate::ffi;
use crate::set_errno;
use softrdma::verbs::{Access, Gid, MemoryRegion, ProtectionDomain};
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::{null_mut, NonNull};

/// `ibv_pd` and its softrdma PD.
#[repr(C)]
pub struct SoftPd {
    /// What applications see.
    pub ibv: ffi::ibv_pd,
    /// The engine's PD.
    pub pd: ProtectionDomain,
    /// Set for a parent domain ([`crate::parent`]): what it was made with.
    pub parent: Option<crate::parent::ParentDomain>,
}

/// The [`SoftPd`] of a PD this library made.
///
/// # Safety
/// `pd` came from [`ibv_alloc_pd`] and is not deallocated.
pub unsafe fn soft_pd<'a>(pd: *mut ffi::ibv_pd) -> Option<&'a SoftPd> {
    // SAFETY: `ibv` is the first field of the repr(C) SoftPd.
    unsafe { pd.cast::<SoftPd>().as_ref() }
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ffi::ibv_context) -> *mut ffi::ibv_pd {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(ctx) }) else { return fail(libc::EINVAL) };
    let engine = match soft.engine() {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let pd = engine.alloc_pd();
    let handle = crate::import::next_handle();
    let made = Box::into_raw(Box::new(SoftPd { ibv: ffi::ibv_pd { context: ctx, handle }, pd, parent: None }));
    crate::import::register_pd(handle, std::ptr::from_ref(soft.device) as usize, made);
    made.cast()
}

/// `ibv_dealloc_pd`.
///
/// # Safety
/// `pd` came from [`ibv_alloc_pd`]; nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ffi::ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by Box in ibv_alloc_pd, given back once.
    let owned = unsafe { Box::from_raw(pd.cast::<SoftPd>()) };
    crate::import::forget_pd(owned.ibv.handle, pd.cast());
    drop(owned);
    0
}

/// NULL with errno `e`.
pub(crate) fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

/// `ibv_mr` and its softrdma region.
#[repr(C)]
pub struct SoftMr {
    /// What applications see.
    pub ibv: ffi::ibv_mr,
    /// The engine's region over the application's buffer (shared with the `ibv_mr`s that
    /// import it, [`crate::import`]).
    pub mr: std::sync::Arc<MemoryRegion>,
}

/// Access flags (`enum ibv_access_flags`) to softrdma's; EINVAL for a remote write or
/// atomic without local write (IBTA 10.6.3.1), EOPNOTSUPP for what softrdma lacks.
pub(crate) fn access_of(flags: c_uint) -> Result<Access, c_int> {
    // Optional flags (relaxed ordering and its kin, bit 20 up) may be ignored.
    let flags = flags & ((1 << 20) - 1);
    let has = |f: c_uint| flags & f != 0;
    // On-demand regions take their own path ([`register`]); huge pages are a hint about
    // the memory, which needs none.
    let known = ffi::IBV_ACCESS_LOCAL_WRITE
        | ffi::IBV_ACCESS_REMOTE_WRITE
        | ffi::IBV_ACCESS_REMOTE_READ
        | ffi::IBV_ACCESS_REMOTE_ATOMIC
        | ffi::IBV_ACCESS_MW_BIND
        | ffi::IBV_ACCESS_ON_DEMAND
        | ffi::IBV_ACCESS_HUGETLB;
    if flags & !known != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let a = Access {
        local_write: has(ffi::IBV_ACCESS_LOCAL_WRITE),
        remote_read: has(ffi::IBV_ACCESS_REMOTE_READ),
        remote_write: has(ffi::IBV_ACCESS_REMOTE_WRITE),
        remote_atomic: has(ffi::IBV_ACCESS_REMOTE_ATOMIC),
        remote_invalidate: true,
        mw_bind: has(ffi::IBV_ACCESS_MW_BIND),
    };
    if (a.remote_write || a.remote_atomic) && !a.local_write {
        return Err(libc::EINVAL);
    }
    Ok(a)
}

/// `ibv_reg_mr_iova2`: the `length` bytes at `addr`, named `iova` by peers and SGEs.
///
/// # Safety
/// `pd` is a live PD; `addr..addr + length` is the caller's memory until deregistered.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ffi::ibv_mr {
    // SAFETY: the caller's contract.
    match unsafe { register(pd, addr, length, iova, access) } {
        Ok(soft) => publish(soft),
        Err(e) => fail(e),
    }
}

/// A region of `length` bytes at `addr` on `pd`, or the errno why not.
///
/// # Safety
/// As [`ibv_reg_mr_iova2`].
unsafe fn register(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    flags: c_uint,
) -> Result<SoftMr, c_int> {
    // SAFETY: the caller's contract.
    let spd = unsafe { soft_pd(pd) }.ok_or(libc::EINVAL)?;
    // SAFETY: the PD's context is open.
    let soft = unsafe { soft_context(spd.ibv.context) }.ok_or(libc::EINVAL)?;
    let access = access_of(flags)?;
    let engine = soft.engine().map_err(|_| libc::EIO)?;
    let mr = if flags & ffi::IBV_ACCESS_ON_DEMAND != 0 {
        // rdma-core's implicit region: no address and SIZE_MAX bytes, the whole space.
        let (addr, length, iova) =
            if addr.is_null() && length == usize::MAX { (0, usize::MAX, 0) } else { (addr as usize, length, iova) };
        if addr == 0 && length != usize::MAX {
            return Err(libc::EINVAL);
        }
        engine.reg_on_demand_mr(&spd.pd, addr, length, iova, access).map_err(|_| libc::ENOMEM)?
    } else {
        let ptr = NonNull::new(addr.cast::<u8>()).ok_or(libc::EINVAL)?;
        // SAFETY: ibv_reg_mr's contract is reg_user_mr's: the buffer stays the caller's,
        // valid, until ibv_dereg_mr.
        unsafe { engine.reg_user_mr(&spd.pd, ptr, length, iova, access) }.map_err(|_| libc::ENOMEM)?
    };
    let handle = crate::import::next_handle();
    let ibv = ffi::ibv_mr { context: spd.ibv.context, pd, addr, length, handle, lkey: mr.lkey(), rkey: mr.rkey() };
    Ok(SoftMr { ibv, mr: std::sync::Arc::new(mr) })
}

/// The `ibv_mr` of a new region, which other contexts of its device may import.
pub(crate) fn publish(soft: SoftMr) -> *mut ffi::ibv_mr {
    let (handle, context) = (soft.ibv.handle, soft.ibv.context);
    let made = Box::into_raw(Box::new(soft));
    // SAFETY: the region's context is open.
    if let Some(ctx) = unsafe { soft_context(context) } {
        crate::import::register_mr(handle, std::ptr::from_ref(ctx.device) as usize, made);
    }
    made.cast()
}

/// `verbs_context.advise_mr`, which the inline `ibv_advise_mr` calls: a prefetch maps
/// the pages of each SGE's range now (writable for `PREFETCH_WRITE`), as an ODP NIC
/// faults them in ahead of traffic; `PREFETCH_NO_FAULT` maps nothing new, so there is
/// nothing to do. Errors as rdma-core documents them: EFAULT for a key, access or range
/// that does not resolve, or memory not there when `IBV_ADVISE_MR_FLAG_FLUSH` asks for a
/// synchronous prefetch; EINVAL for unknown flags or an empty list; ENOTSUP for an advice
/// this library does not know.
///
/// # Safety
/// `pd` is a live PD; `sg_list` holds `num_sge` entries.
pub unsafe extern "C" fn advise_mr_op(
    pd: *mut ffi::ibv_pd,
    advice: ffi::ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ffi::ibv_sge,
    num_sge: u32,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(spd) = (unsafe { soft_pd(pd) }) else { return libc::EINVAL };
    // SAFETY: the PD's context is open.
    let Some(soft) = (unsafe { soft_context(spd.ibv.context) }) else { return libc::EINVAL };
    let sync = flags & ffi::IB_UVERBS_ADVISE_MR_FLAG_FLUSH != 0;
    if flags & !ffi::IB_UVERBS_ADVISE_MR_FLAG_FLUSH != 0 || sg_list.is_null() || num_sge == 0 {
        return libc::EINVAL;
    }
    let write = match advice {
        ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH => false,
        ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE => true,
        ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT => return 0,
        _ => return libc::ENOTSUP,
    };
    let Ok(engine) = soft.engine() else { return libc::EIO };
    // SAFETY: the caller's contract: num_sge entries.
    let sges = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
    for s in sges {
        let sge = softrdma::verbs::Sge { addr: s.addr, length: s.length, lkey: s.lkey };
        match engine.prefetch(&spd.pd, sge, write) {
            Ok(()) => {}
            Err(softrdma::verbs::PrefetchError::NotMapped) if !sync => {}
            Err(_) => return libc::EFAULT,
        }
    }
    0
}

/// `ibv_rereg_mr` (IBTA 11.2.8.4 "Reregister Memory Region"): a new translation, PD or
/// access for a region, its keys kept (as rxe and mlx5 keep them); the registration is
/// unchanged if the new one is refused. 0, or rdma-core's `IBV_REREG_MR_ERR_*` with
/// errno set.
///
/// # Safety
/// `mr` is a live region nothing uses meanwhile; `pd` and `addr..addr + length` as for
/// [`ibv_reg_mr_iova2`] when the flags say they change.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ffi::ibv_mr,
    flags: c_int,
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let flags = flags as u32;
    let has = |f: u32| flags & f != 0;
    let translation = has(ffi::IBV_REREG_MR_CHANGE_TRANSLATION);
    // SAFETY: the caller's contract: a live region of this library, used by no one else.
    let Some(old) = (unsafe { mr.cast::<SoftMr>().as_mut() }) else { return rereg_failed(libc::EINVAL, true) };
    let new_pd = if has(ffi::IBV_REREG_MR_CHANGE_PD) { unsafe { soft_pd(pd) }.map(|p| &p.pd) } else { None };
    let buffer = if translation { NonNull::new(addr.cast::<u8>()).filter(|_| length > 0) } else { None };
    if flags == 0
        || flags & !ffi::IBV_REREG_MR_FLAGS_SUPPORTED != 0
        || (translation && buffer.is_none())
        || (has(ffi::IBV_REREG_MR_CHANGE_PD) && new_pd.is_none())
    {
        return rereg_failed(libc::EINVAL, true);
    }
    let new_access = if has(ffi::IBV_REREG_MR_CHANGE_ACCESS) {
        match access_of(access as c_uint) {
            Ok(a) => Some(a),
            Err(e) => return rereg_failed(e, true),
        }
    } else {
        None
    };
    // SAFETY: the caller's contract for a new buffer; peers name it by its address.
    let on_demand = has(ffi::IBV_REREG_MR_CHANGE_ACCESS).then_some(access as c_uint & ffi::IBV_ACCESS_ON_DEMAND != 0);
    // An imported region is shared: it cannot change under its other users.
    let Some(region) = std::sync::Arc::get_mut(&mut old.mr) else { return rereg_failed(libc::EBUSY, false) };
    let done = unsafe { region.rereg(new_pd, new_access, buffer.map(|p| (p, length, addr as u64)), on_demand) };
    if let Err(e) = done {
        return rereg_failed(crate::post::errno_of(e), false);
    }
    if translation {
        (old.ibv.addr, old.ibv.length) = (addr, length);
    }
    if new_pd.is_some() {
        old.ibv.pd = pd;
    }
    0
}

/// rdma-core's rereg failures: bad input, or the device refused (the old region stays).
fn rereg_failed(errno: c_int, input: bool) -> c_int {
    set_errno(errno);
    if input {
        ffi::IBV_REREG_MR_ERR_INPUT
    } else {
        ffi::IBV_REREG_MR_ERR_CMD
    }
}

/// `ibv_reg_mr`: the region is named by its own address.
///
/// # Safety
/// As [`ibv_reg_mr_iova2`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ffi::ibv_mr {
    // SAFETY: the caller's contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

/// `ibv_reg_mr_iova`.
///
/// # Safety
/// As [`ibv_reg_mr_iova2`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ffi::ibv_mr {
    // SAFETY: the caller's contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

/// `ibv_dereg_mr`: from its return on, the engine never touches the buffer again.
///
/// # Safety
/// `mr` came from one of the `ibv_reg_mr` calls; nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ffi::ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by Box in ibv_reg_mr_iova2, given back once.
    let owned = unsafe { Box::from_raw(mr.cast::<SoftMr>()) };
    crate::import::forget_mr(owned.ibv.handle, mr.cast());
    drop(owned);
    0
}

/// `ibv_ah` and the destination it names.
#[repr(C)]
pub struct SoftAh {
    /// What applications see.
    pub ibv: ffi::ibv_ah,
    /// The destination GID.
    pub gid: Gid,
}

/// `ibv_create_ah`: RoCE needs the GRH (its GID is the destination's address).
///
/// # Safety
/// `pd` is a live PD; `attr` points to a `struct ibv_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ffi::ibv_pd, attr: *mut ffi::ibv_ah_attr) -> *mut ffi::ibv_ah {
    // SAFETY: the caller's contract.
    let (Some(spd), Some(attr)) = (unsafe { soft_pd(pd) }, unsafe { attr.as_ref() }) else {
        return fail(libc::EINVAL);
    };
    if attr.is_global == 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: every bit pattern of the union is a valid array of bytes.
    let gid = unsafe { attr.grh.dgid.raw };
    let ibv = ffi::ibv_ah { context: spd.ibv.context, pd, handle: 0 };
    Box::into_raw(Box::new(SoftAh { ibv, gid })).cast()
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` came from [`ibv_create_ah`]; nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ffi::ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by Box in ibv_create_ah, given back once.
    drop(unsafe { Box::from_raw(ah.cast::<SoftAh>()) });
    0
}

/// `ibv_init_ah_from_wc`: the address of the sender of a UD receive, from the GRH in the
/// first 40 bytes of its buffer (RoCE always carries one): -1 without it.
///
/// # Safety
/// `wc` is a UD receive completion; `grh` its buffer's first 40 bytes; `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    _ctx: *mut ffi::ibv_context,
    port: u8,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    attr: *mut ffi::ibv_ah_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(wc), Some(grh), Some(out)) = (unsafe { wc.as_ref() }, unsafe { grh.as_ref() }, unsafe { attr.as_mut() })
    else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: plain C data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    out.dlid = wc.slid;
    out.sl = wc.sl;
    out.port_num = if port == 0 { 1 } else { port };
    if wc.wc_flags & ffi::IBV_WC_GRH == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    out.is_global = 1;
    out.grh.dgid = grh.sgid;
    out.grh.hop_limit = 0xff;
    let flow = u32::from_be(grh.version_tclass_flow);
    out.grh.traffic_class = (flow >> 20) as u8;
    out.grh.flow_label = flow & 0xf_ffff;
    0
}

/// `ibv_create_ah_from_wc`: an address handle back to the sender of a UD receive.
///
/// # Safety
/// `pd` is a live PD; `wc` a UD receive completion; `grh` its buffer's first 40 bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ffi::ibv_pd,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    port: u8,
) -> *mut ffi::ibv_ah {
    // SAFETY: plain C data; all-zero is valid.
    let mut attr: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's contract; `attr` is ours.
    if unsafe { ibv_init_ah_from_wc(std::ptr::null_mut(), port, wc, grh, &mut attr) } != 0 {
        return null_mut();
    }
    // SAFETY: the attributes are ours, the PD the caller's.
    unsafe { ibv_create_ah(pd, &mut attr) }
}
