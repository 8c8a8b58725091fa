//! libibverbs.so.1 (and, later, librdmacm.so.1) on softrdma: the C ABI of rdma-core 44 as
//! Debian 12 ships it, so that unmodified RDMA applications run on softrdma devices with
//! `LD_LIBRARY_PATH` pointing here, with no kernel driver and no privilege.
//!
//! The structures are rdma-core's own, generated from the installed headers at build time
//! ([`ffi`]); the exported symbols carry rdma-core's symbol versions ([`symver`]). Devices
//! come from a configuration ([`config`]), not from sysfs.

#![allow(unsafe_code)]

pub mod cm;
mod cm_acks;
mod cm_addr;
pub mod cm_ep;
mod cm_order;
mod cm_ud;
mod cm_watch;
pub mod config;
pub mod cq;
pub mod cq_ex;
pub mod device;
pub mod dm;
pub mod event;
pub mod flow;
pub mod import;
pub mod mcast;
pub mod mw;
pub mod objects;
mod ops;
pub mod parent;
pub mod post;
pub mod qp;
pub mod query;
pub mod rate;
pub mod rsocket;
pub mod srq;
mod symver;
pub mod tm;
pub mod unsupported;
pub mod wq;
pub mod wr;
pub mod xrc;

/// rdma-core's structures and constants, generated from `<infiniband/verbs.h>`.
#[allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code, missing_docs)]
#[allow(clippy::all, clippy::pedantic)]
pub mod ffi {
    include!(concat!(env!("OUT_DIR"), "/verbs.rs"));
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}
