//! Thread domains and parent domains (`ibv_alloc_td`, `ibv_alloc_parent_domain`), which
//! UCX and rdma-core's tests use. A thread domain promises that one thread at a time uses
//! the objects made in it, which lets mlx5 drop its locks; softrdma's objects take the
//! engine's lock either way, so a thread domain is a handle and no more. A parent domain
//! is a PD: its regions, QPs, SRQs and CQs belong to the PD it wraps. Its allocators are
//! for memory a NIC reads (queues, doorbells); softrdma's queues are the engine's own and
//! never device-visible, so the allocators are kept, as the application passed them, and
//! not called (rdma-core lets a provider use them or not).

use crate::device::soft_context;
use crate::ffi;
use crate::objects::{fail, soft_pd, SoftPd};
use std::ffi::c_void;

/// `ibv_td`.
#[repr(C)]
pub struct SoftTd {
    /// What applications see.
    pub ibv: ffi::ibv_td,
}

/// What a parent domain was made with.
pub struct ParentDomain {
    /// The PD it wraps.
    pub pd: *mut ffi::ibv_pd,
    /// Its thread domain, or NULL.
    pub td: *mut ffi::ibv_td,
    /// The application's `pd_context` (`IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT`).
    pub pd_context: *mut c_void,
    /// Whether allocators were given (`IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`).
    pub allocators: bool,
}

/// `verbs_context.alloc_td`: a thread domain of `context`; EINVAL for extension bits.
///
/// # Safety
/// `context` is an open context; `attr` points to a `struct ibv_td_init_attr`.
pub unsafe extern "C" fn alloc_td(
    context: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_td_init_attr,
) -> *mut ffi::ibv_td {
    // SAFETY: the caller's contract.
    let (Some(_), Some(a)) = (unsafe { soft_context(context) }, unsafe { attr.as_ref() }) else {
        return fail(libc::EINVAL);
    };
    if a.comp_mask != 0 {
        return fail(libc::EINVAL);
    }
    Box::into_raw(Box::new(SoftTd { ibv: ffi::ibv_td { context } })).cast()
}

/// `verbs_context.dealloc_td`.
///
/// # Safety
/// `td` came from [`alloc_td`]; no parent domain uses it any more.
pub unsafe extern "C" fn dealloc_td(td: *mut ffi::ibv_td) -> libc::c_int {
    if td.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by Box in alloc_td, given back once.
    drop(unsafe { Box::from_raw(td.cast::<SoftTd>()) });
    0
}

/// `verbs_context.alloc_parent_domain`: a PD of `attr.pd`'s objects, freed with
/// `ibv_dealloc_pd`. EINVAL for a missing or parent `pd`, a thread domain of another
/// context, or unknown `comp_mask` bits.
///
/// # Safety
/// `context` is an open context; `attr` points to a `struct ibv_parent_domain_init_attr`
/// whose `pd` (and `td`, if set) this library made.
pub unsafe extern "C" fn alloc_parent_domain(
    context: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_parent_domain_init_attr,
) -> *mut ffi::ibv_pd {
    let known = ffi::IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | ffi::IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    // SAFETY: the caller's contract.
    let Some(a) = (unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
    // SAFETY: the caller's contract: a PD of this library, if not NULL.
    let Some(inner) = (unsafe { soft_pd(a.pd) }).filter(|p| p.parent.is_none() && p.ibv.context == context) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: the caller's contract: a TD of this library, if not NULL.
    let td_ok = unsafe { a.td.as_ref() }.is_none_or(|td| td.context == context);
    let allocators = a.comp_mask & ffi::IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0;
    if a.comp_mask & !known != 0 || !td_ok || (allocators && (a.alloc.is_none() || a.free.is_none())) {
        return fail(libc::EINVAL);
    }
    let has_context = a.comp_mask & ffi::IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0;
    let parent = ParentDomain {
        pd: a.pd,
        td: a.td,
        pd_context: if has_context { a.pd_context } else { std::ptr::null_mut() },
        allocators,
    };
    let ibv = ffi::ibv_pd { context, handle: 0 };
    Box::into_raw(Box::new(SoftPd { ibv, pd: inner.pd.parent_domain(), parent: Some(parent) })).cast()
}
