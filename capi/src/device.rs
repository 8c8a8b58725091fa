//! Devices and contexts: `ibv_get_device_list` from the configuration ([`crate::config`]),
//! `ibv_open_device` and the queries `ibv_devinfo` and every application make first.
//!
//! An `ibv_context` handed out is the tail of a `verbs_context` (rdma-core's layout: the
//! extended operations precede the context, `sz` before it, `abi_compat` marks it), which
//! is the first field of a [`SoftContext`], so either pointer finds the whole.

use crate::config::{self, DeviceConfig};
use crate::ffi;
use crate::query::{query_device_ex_op, query_port_op};
use crate::set_errno;
use softrdma::verbs::{Context, OpenConfig, Transport};
use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of, zeroed};
use std::net::IpAddr;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// A configured device, its `ibv_device` first so that the pointer handed out is its own.
#[repr(C)]
pub struct SoftDevice {
    /// What applications see.
    pub ibv: ffi::ibv_device,
    /// What the configuration says.
    pub cfg: DeviceConfig,
    /// The engine, opened when the first object of any context needs it: every context
    /// of the device in this process shares it (one address, one port), as every context
    /// of a kernel device shares the device. Never freed (the device lives as long).
    engine: AtomicPtr<Context>,
    /// The fork generation ([`FORKS`]) the engine was opened in.
    engine_generation: AtomicU32,
    /// Serializes the opening.
    opening: Mutex<()>,
}

/// Children forked so far on this process's line (a `pthread_atfork` handler counts
/// them). A child has none of its parent's threads, so an engine its parent opened moves
/// no packet there: the child opens its own (rdma-core's Python tests fork each side of
/// a connection from a process that used the device already).
static FORKS: AtomicU32 = AtomicU32::new(0);

extern "C" fn forked_child() {
    FORKS.fetch_add(1, Ordering::AcqRel);
}

#[allow(unsafe_code)]
fn count_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a handler that only increments an atomic, safe after fork.
    ONCE.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(forked_child));
    });
}

impl SoftDevice {
    /// The engine, opened now if not yet (binding the device's address): an errno if it
    /// cannot be (EADDRINUSE when another process holds the port).
    pub fn engine(&self) -> Result<&Context, c_int> {
        if let Some(c) = self.current_engine() {
            return Ok(c);
        }
        let _once = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = self.current_engine() {
            return Ok(c);
        }
        count_forks();
        let generation = FORKS.load(Ordering::Acquire);
        let cfg = &self.cfg;
        let mut open = OpenConfig::new(cfg.addr);
        open.transport = cfg.transport;
        open.port = cfg.port;
        let ctx = crate::rsocket::api::making_own_sockets(|| Context::open(open)).map_err(|e| {
            eprintln!("softrdma: cannot open {} on {}: {e}", cfg.name, cfg.addr);
            e.raw_os_error().unwrap_or(libc::EIO)
        })?;
        crate::event::install_handler(self, &ctx);
        crate::cm_watch::install(crate::event::device_key(self), &ctx);
        let ctx: &'static Context = Box::leak(Box::new(ctx));
        self.engine_generation.store(generation, Ordering::Release);
        self.engine.store((ctx as *const Context).cast_mut(), Ordering::Release);
        Ok(ctx)
    }

    /// The engine this process opened, if it did (not one a parent process opened).
    #[allow(unsafe_code)]
    pub(crate) fn current_engine(&self) -> Option<&Context> {
        let p = self.engine.load(Ordering::Acquire);
        let ours = self.engine_generation.load(Ordering::Acquire) == FORKS.load(Ordering::Acquire);
        // SAFETY: a non-null engine pointer is a leaked Box, valid for the process.
        (!p.is_null() && ours).then(|| unsafe { &*p })
    }
}

/// An open device.
#[repr(C)]
pub struct SoftContext {
    /// rdma-core's extended context, the application's `ibv_context` at its end.
    pub vctx: ffi::verbs_context,
    /// The device it was opened on.
    pub device: &'static SoftDevice,
}

impl SoftContext {
    /// The device's engine ([`SoftDevice::engine`]).
    pub fn engine(&self) -> Result<&Context, c_int> {
        self.device.engine()
    }

    /// The `ibv_context` applications hold for this context.
    pub fn ibv_context(&self) -> *mut ffi::ibv_context {
        (&raw const self.vctx.context).cast_mut()
    }
}

/// The devices of this process, read from the configuration once (rdma-core rescans
/// sysfs; a configuration does not change under a running process).
fn devices() -> Result<&'static [SoftDevice], &'static config::ConfigError> {
    static DEVICES: OnceLock<Result<Vec<SoftDevice>, config::ConfigError>> = OnceLock::new();
    let loaded = DEVICES.get_or_init(|| config::load().map(|cfgs| cfgs.into_iter().map(soft_device).collect()));
    match loaded {
        Ok(v) => Ok(v.as_slice()),
        Err(e) => Err(e),
    }
}

/// The place of `d` in the configuration.
pub fn index_of(d: &SoftDevice) -> Option<usize> {
    devices().ok()?.iter().position(|x| std::ptr::eq(x, d))
}

fn soft_device(cfg: DeviceConfig) -> SoftDevice {
    // SAFETY: ibv_device is plain C data; all-zero is a valid value.
    let mut ibv: ffi::ibv_device = unsafe { zeroed() };
    let (node, transport) = match cfg.transport {
        Transport::RoceV2 => (ffi::IBV_NODE_CA, ffi::IBV_TRANSPORT_IB),
        Transport::Iwarp => (ffi::IBV_NODE_RNIC, ffi::IBV_TRANSPORT_IWARP),
    };
    ibv.node_type = node;
    ibv.transport_type = transport;
    copy_c_string(&mut ibv.name, &cfg.name);
    copy_c_string(&mut ibv.dev_name, &cfg.name);
    SoftDevice {
        ibv,
        cfg,
        engine: AtomicPtr::new(null_mut()),
        engine_generation: AtomicU32::new(0),
        opening: Mutex::new(()),
    }
}

/// Copies `s` into a C string field, truncated to leave its NUL.
fn copy_c_string(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    if let Some(d) = dst.get_mut(n) {
        *d = 0;
    }
}

/// The device's GID 0: its address as an IPv6 (IPv4-mapped) address, as RoCEv2 GIDs are.
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// A node GUID from the device's address: the EUI-64 of a locally administered MAC
/// (02:5e and the address's last four bytes, the MAC a raw softrdma device takes).
pub fn node_guid(addr: IpAddr) -> u64 {
    let g = gid_of(addr);
    let mac = [0x02, 0x5e, g[12], g[13], g[14], g[15]];
    let eui = [mac[0], mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]];
    u64::from_be_bytes(eui)
}

/// `ibv_get_device_list`: a NULL-terminated array the caller frees with
/// `ibv_free_device_list`; NULL with errno set if the configuration cannot be read.
///
/// # Safety
/// `num` is NULL or points to an int.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ffi::ibv_device {
    let devs = match devices() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("softrdma: configuration line {:?}: {}", e.line, e.reason);
            set_errno(libc::EINVAL);
            return null_mut();
        }
    };
    // SAFETY: calloc of n+1 pointers; the caller gives it back to ibv_free_device_list.
    let list =
        unsafe { libc::calloc(devs.len() + 1, size_of::<*mut ffi::ibv_device>()) }.cast::<*mut ffi::ibv_device>();
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    for (i, d) in devs.iter().enumerate() {
        // SAFETY: i < n; the devices live for the process.
        unsafe { *list.add(i) = (&d.ibv as *const ffi::ibv_device).cast_mut() };
    }
    if !num.is_null() {
        // SAFETY: the caller passes a valid int pointer or NULL.
        unsafe { *num = devs.len() as c_int };
    }
    list
}

/// `ibv_free_device_list`.
///
/// # Safety
/// `list` came from [`ibv_get_device_list`] (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ffi::ibv_device) {
    // SAFETY: allocated by calloc in ibv_get_device_list.
    unsafe { libc::free(list.cast()) };
}

/// The [`SoftDevice`] behind an `ibv_device` this library handed out.
///
/// # Safety
/// `dev` came from [`ibv_get_device_list`].
pub unsafe fn soft_device_of(dev: *mut ffi::ibv_device) -> Option<&'static SoftDevice> {
    // SAFETY: `ibv` is the first field of the repr(C) SoftDevice, which lives for the process.
    unsafe { dev.cast::<SoftDevice>().as_ref() }
}

/// `ibv_get_device_name`.
///
/// # Safety
/// `dev` came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ffi::ibv_device) -> *const c_char {
    // SAFETY: the caller's contract.
    match unsafe { soft_device_of(dev) } {
        Some(d) => d.ibv.name.as_ptr(),
        None => std::ptr::null(),
    }
}

/// `ibv_get_device_guid` (network byte order, as `__be64`).
///
/// # Safety
/// `dev` came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ffi::ibv_device) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { soft_device_of(dev) }.map_or(0, |d| node_guid(d.cfg.addr).to_be())
}

/// `ibv_open_device`: a context; nothing is bound until the first object needs the
/// device, so that `ibv_devinfo` beside a running application does not take its port.
///
/// # Safety
/// `dev` came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ffi::ibv_device) -> *mut ffi::ibv_context {
    // SAFETY: the caller's contract.
    let Some(device) = (unsafe { soft_device_of(dev) }) else {
        set_errno(libc::ENODEV);
        return null_mut();
    };
    // SAFETY: eventfd with valid flags.
    // A semaphore: one count per event queued ([`crate::event`]).
    let async_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    // A descriptor where rdma-core has the kernel's uverbs file: applications dup and
    // poll it, and hand it to ibv_import_device ([`crate::import`]). It is never read.
    let cmd_fd = crate::import::open_cmd_fd(dev);
    if async_fd < 0 || cmd_fd < 0 {
        // SAFETY: closing what was opened above, if it was.
        unsafe {
            for fd in [async_fd, cmd_fd].into_iter().filter(|fd| *fd >= 0) {
                libc::close(fd);
            }
        }
        return null_mut();
    }
    // SAFETY: verbs_context is plain C data (pointers, ints, a pthread mutex whose
    // all-zero value is PTHREAD_MUTEX_INITIALIZER on glibc).
    let mut vctx: ffi::verbs_context = unsafe { zeroed() };
    vctx.sz = size_of::<ffi::verbs_context>();
    vctx.query_port = Some(query_port_op);
    vctx.query_device_ex = Some(query_device_ex_op);
    vctx.advise_mr = Some(crate::objects::advise_mr_op);
    vctx.alloc_parent_domain = Some(crate::parent::alloc_parent_domain);
    vctx.alloc_td = Some(crate::parent::alloc_td);
    vctx.alloc_dm = Some(crate::dm::alloc_dm);
    vctx.open_xrcd = Some(crate::xrc::open_xrcd);
    vctx.close_xrcd = Some(crate::xrc::close_xrcd);
    vctx.create_srq_ex = Some(crate::xrc::create_srq_ex);
    vctx.get_srq_num = Some(crate::xrc::get_srq_num);
    vctx.post_srq_ops = Some(crate::tm::post_srq_ops);
    vctx.free_dm = Some(crate::dm::free_dm);
    vctx.reg_dm_mr = Some(crate::dm::reg_dm_mr);
    vctx.dealloc_td = Some(crate::parent::dealloc_td);
    vctx.query_rt_values = Some(crate::query::query_rt_values_op);
    vctx.create_qp_ex = Some(crate::qp::create_qp_ex);
    vctx.create_cq_ex = Some(crate::cq_ex::create_cq_ex);
    vctx.ibv_create_flow = Some(crate::flow::create_flow);
    vctx.ibv_destroy_flow = Some(crate::flow::destroy_flow);
    vctx.create_wq = Some(crate::wq::create_wq);
    vctx.modify_wq = Some(crate::wq::modify_wq);
    vctx.destroy_wq = Some(crate::wq::destroy_wq);
    vctx.create_rwq_ind_table = Some(crate::wq::create_rwq_ind_table);
    vctx.destroy_rwq_ind_table = Some(crate::wq::destroy_rwq_ind_table);
    crate::ops::install(&mut vctx.context.ops);
    vctx.context.device = dev;
    vctx.context.cmd_fd = cmd_fd;
    vctx.context.async_fd = async_fd;
    vctx.context.num_comp_vectors = 1;
    // rdma-core's __VERBS_ABI_IS_EXTENDED: the context is a verbs_context's tail.
    vctx.context.abi_compat = usize::MAX as *mut c_void;
    let ctx = Box::into_raw(Box::new(SoftContext { vctx, device }));
    // SAFETY: just allocated.
    let ibv = unsafe { &raw mut (*ctx).vctx.context };
    crate::event::add_context(ibv, async_fd);
    ibv
}

/// The [`SoftContext`] of an `ibv_context` this library opened.
///
/// # Safety
/// `ctx` came from [`ibv_open_device`] and is not closed.
pub unsafe fn soft_context<'a>(ctx: *mut ffi::ibv_context) -> Option<&'a SoftContext> {
    if ctx.is_null() {
        return None;
    }
    let at = offset_of!(ffi::verbs_context, context);
    // SAFETY: the context is the `context` field of the verbs_context that begins the
    // repr(C) SoftContext.
    unsafe { ctx.cast::<u8>().sub(at).cast::<SoftContext>().as_ref() }
}

/// `ibv_close_device`.
///
/// # Safety
/// `ctx` came from [`ibv_open_device`]; nothing uses it afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ffi::ibv_context) -> c_int {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(ctx) }) else { return libc::EINVAL };
    let owned = (soft as *const SoftContext).cast_mut();
    // SAFETY: allocated by Box in ibv_open_device, given back once.
    let soft = unsafe { Box::from_raw(owned) };
    crate::event::remove_context(ctx);
    // SAFETY: the eventfds opened with the context.
    unsafe {
        libc::close(soft.vctx.context.async_fd);
    }
    crate::import::close_cmd_fd(soft.vctx.context.cmd_fd);
    0
}
