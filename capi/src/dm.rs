//! Device memory (`ibv_alloc_dm`, `ibv_memcpy_to_dm`/`_from_dm`, `ibv_reg_dm_mr`): memory
//! that belongs to the device, which the application reaches only through copies and
//! through zero-based regions over it, as it reaches a NIC's on-chip memory. Here it is
//! the engine's own memory ([`softrdma::verbs::DeviceMemory`]). Copies move whole 4-byte
//! words at 4-byte offsets, the granularity mlx5 enforces and rdma-core's tests expect.

use crate::device::soft_context;
use crate::ffi;
use crate::objects::{access_of, fail, soft_pd, SoftMr};
use softrdma::verbs::DeviceMemory;
use std::ffi::{c_int, c_uint, c_void};

/// `ibv_dm` and its memory.
#[repr(C)]
pub struct SoftDm {
    /// What applications see.
    pub ibv: ffi::ibv_dm,
    /// The device's memory (shared with the `ibv_dm`s that import it, [`crate::import`]).
    pub dm: std::sync::Arc<DeviceMemory>,
}

/// Copies move words of this many bytes, at offsets that are multiples of it.
const DM_WORD_BYTES: u64 = 4;

/// `verbs_context.alloc_dm`: EINVAL for extension bits or no bytes, ENOMEM beyond what the
/// device has left ([`softrdma::engine::MAX_DEVICE_MEMORY_BYTES`] in all).
///
/// # Safety
/// `context` is an open context; `attr` points to a `struct ibv_alloc_dm_attr`.
pub unsafe extern "C" fn alloc_dm(
    context: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_alloc_dm_attr,
) -> *mut ffi::ibv_dm {
    // SAFETY: the caller's contract.
    let (Some(soft), Some(a)) = (unsafe { soft_context(context) }, unsafe { attr.as_ref() }) else {
        return fail(libc::EINVAL);
    };
    if a.comp_mask != 0 || a.length == 0 {
        return fail(libc::EINVAL);
    }
    let engine = match soft.engine() {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let Ok(dm) = engine.alloc_dm(a.length) else { return fail(libc::ENOMEM) };
    let handle = crate::import::next_handle();
    let made = wrap_dm(context, handle, std::sync::Arc::new(dm));
    crate::import::register_dm(handle, std::ptr::from_ref(soft.device) as usize, made);
    made.cast()
}

/// A new `ibv_dm` on `context` for `dm` (allocated, or imported: the same memory).
pub(crate) fn wrap_dm(context: *mut ffi::ibv_context, handle: u32, dm: std::sync::Arc<DeviceMemory>) -> *mut SoftDm {
    let ibv = ffi::ibv_dm {
        context,
        memcpy_to_dm: Some(memcpy_to_dm),
        memcpy_from_dm: Some(memcpy_from_dm),
        comp_mask: 0,
        handle,
    };
    Box::into_raw(Box::new(SoftDm { ibv, dm }))
}

/// `verbs_context.free_dm`: the memory goes back to the device once no region uses it.
///
/// # Safety
/// `dm` came from [`alloc_dm`]; nothing uses it afterwards.
pub unsafe extern "C" fn free_dm(dm: *mut ffi::ibv_dm) -> c_int {
    if dm.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by Box in alloc_dm, given back once.
    let owned = unsafe { Box::from_raw(dm.cast::<SoftDm>()) };
    crate::import::forget_dm(owned.ibv.handle, dm.cast());
    drop(owned);
    0
}

/// The byte range `offset..offset + length` if it is whole words within `dm`.
fn words(dm: &SoftDm, offset: u64, length: usize) -> Result<usize, c_int> {
    let end = offset.checked_add(length as u64).ok_or(libc::EINVAL)?;
    if !offset.is_multiple_of(DM_WORD_BYTES)
        || !(length as u64).is_multiple_of(DM_WORD_BYTES)
        || end > dm.dm.len() as u64
    {
        return Err(libc::EINVAL);
    }
    Ok(offset as usize)
}

/// `ibv_dm.memcpy_to_dm`.
///
/// # Safety
/// `dm` came from [`alloc_dm`]; `host` holds `length` readable bytes.
unsafe extern "C" fn memcpy_to_dm(dm: *mut ffi::ibv_dm, offset: u64, host: *const c_void, length: usize) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        copy(dm, offset, length, |d, at| {
            // SAFETY: the caller's contract: `length` readable bytes at `host`.
            d.write(at, std::slice::from_raw_parts(host.cast::<u8>(), length))
        })
    }
}

/// `ibv_dm.memcpy_from_dm`.
///
/// # Safety
/// `dm` came from [`alloc_dm`]; `host` holds `length` writable bytes.
unsafe extern "C" fn memcpy_from_dm(host: *mut c_void, dm: *mut ffi::ibv_dm, offset: u64, length: usize) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        copy(dm, offset, length, |d, at| {
            // SAFETY: the caller's contract: `length` writable bytes at `host`.
            d.read(at, std::slice::from_raw_parts_mut(host.cast::<u8>(), length))
        })
    }
}

/// One copy in or out of `dm`'s bytes `offset..offset + length` by `f(memory, offset)`,
/// once they are known to be whole words inside it; 0 or the errno.
///
/// # Safety
/// `dm` came from [`alloc_dm`]; `f` is the caller's copy, sound for `length` bytes.
unsafe fn copy(
    dm: *mut ffi::ibv_dm,
    offset: u64,
    length: usize,
    f: impl FnOnce(&DeviceMemory, usize) -> bool,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { dm.cast::<SoftDm>().as_ref() }) else { return libc::EINVAL };
    match words(d, offset, length) {
        Ok(_) if length == 0 => 0,
        Ok(at) if f(&d.dm, at) => 0,
        Ok(_) => libc::EINVAL,
        Err(e) => e,
    }
}

/// `verbs_context.reg_dm_mr`: a region over `length` bytes of `dm` from `offset`, which
/// SGEs and peers address from 0 (`IBV_ACCESS_ZERO_BASED` is required, EINVAL without it
/// or past the memory's end).
///
/// # Safety
/// `pd` is a live PD and `dm` came from [`alloc_dm`]; the region is deregistered before
/// the memory is freed, as rdma-core requires.
pub unsafe extern "C" fn reg_dm_mr(
    pd: *mut ffi::ibv_pd,
    dm: *mut ffi::ibv_dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ffi::ibv_mr {
    // SAFETY: the caller's contract.
    let (Some(spd), Some(d)) = (unsafe { soft_pd(pd) }, unsafe { dm.cast::<SoftDm>().as_ref() }) else {
        return fail(libc::EINVAL);
    };
    if access & ffi::IBV_ACCESS_ZERO_BASED == 0 {
        return fail(libc::EINVAL);
    }
    let rights = match access_of(access & !ffi::IBV_ACCESS_ZERO_BASED) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    // SAFETY: the PD's context is open.
    let Some(soft) = (unsafe { soft_context(spd.ibv.context) }) else { return fail(libc::EINVAL) };
    let Ok(engine) = soft.engine() else { return fail(libc::EIO) };
    let Ok(start) = usize::try_from(offset) else { return fail(libc::EINVAL) };
    let Ok(mr) = engine.reg_dm_mr(&spd.pd, &d.dm, (start, length), rights) else { return fail(libc::EINVAL) };
    let ibv = ffi::ibv_mr {
        context: spd.ibv.context,
        pd,
        addr: std::ptr::null_mut(),
        length,
        handle: crate::import::next_handle(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    crate::objects::publish(SoftMr { ibv, mr: std::sync::Arc::new(mr) })
}
