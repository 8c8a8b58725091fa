//! Importing a context, a PD, a region or device memory into another context of this
//! process (`ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`, `ibv_import_dm` and the
//! `unimport` calls).
//! rdma-core shares the kernel's objects through the uverbs file a context's `cmd_fd`
//! names; here a context's `cmd_fd` is a memfd of its own, found again by its inode (a
//! `dup` of it, too), and PDs and regions carry process-wide handles. An imported PD or
//! region is the same engine object under a second `ibv_*` structure: unimporting frees
//! that structure only. Across processes nothing can be imported (each process has its
//! own engine): another process's descriptor is not one of this process's contexts, and
//! `ibv_import_device` answers EOPNOTSUPP.

use crate::device::soft_context;
use crate::ffi;
use crate::objects::{fail, soft_pd, SoftMr, SoftPd};
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Contexts by their `cmd_fd`'s (device, inode): the `ibv_device` each was opened on.
static CONTEXTS: Mutex<Option<HashMap<(u64, u64), usize>>> = Mutex::new(None);
/// PDs by handle: (their device, the `SoftPd`).
static PDS: Mutex<Option<HashMap<u32, (usize, usize)>>> = Mutex::new(None);
/// Regions by handle: (their device, the owner's `SoftMr`). An import reads the owner
/// under this lock, which the owner's deregistration takes before it frees anything; no
/// `Weak` is kept, so a region nobody imported stays the owner's alone (`ibv_rereg_mr`).
static MRS: Mutex<Option<HashMap<u32, (usize, usize)>>> = Mutex::new(None);
/// Device memory by handle: (its device, the owner's `SoftDm`), likewise.
static DMS: Mutex<Option<HashMap<u32, (usize, usize)>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

fn with<K, V, T>(m: &Mutex<Option<HashMap<K, V>>>, f: impl FnOnce(&mut HashMap<K, V>) -> T) -> T {
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// A handle no other PD or region of this process has.
pub fn next_handle() -> u32 {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)
}

/// The (device, inode) of descriptor `fd`.
fn inode_of(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat fills `st` for a valid descriptor and fails otherwise.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The `cmd_fd` of a new context on `dev`: a memfd, so that a `dup` of it names the context.
pub fn open_cmd_fd(dev: *mut ffi::ibv_device) -> c_int {
    // SAFETY: a valid name and flags.
    let fd = unsafe { libc::memfd_create(c"softrdma-context".as_ptr(), libc::MFD_CLOEXEC) };
    if let Some(key) = (fd >= 0).then(|| inode_of(fd)).flatten() {
        with(&CONTEXTS, |m| m.insert(key, dev as usize));
    }
    fd
}

/// A context's `cmd_fd` closes with it.
pub fn close_cmd_fd(fd: c_int) {
    if let Some(key) = inode_of(fd) {
        with(&CONTEXTS, |m| m.remove(&key));
    }
    // SAFETY: the context's own descriptor, closed once.
    unsafe { libc::close(fd) };
}

/// PD `pd` (handle `handle`, on `device`) can be imported.
pub fn register_pd(handle: u32, device: usize, pd: *mut SoftPd) {
    with(&PDS, |m| m.insert(handle, (device, pd as usize)));
}

/// PD `pd` is deallocated (an imported copy, which has the same handle, is not it).
pub fn forget_pd(handle: u32, pd: *mut SoftPd) {
    with(&PDS, |m| {
        if m.get(&handle).is_some_and(|e| e.1 == pd as usize) {
            m.remove(&handle);
        }
    });
}

/// Region `owner` (handle `handle`, on `device`) can be imported.
pub fn register_mr(handle: u32, device: usize, owner: *const SoftMr) {
    with(&MRS, |m| m.insert(handle, (device, owner as usize)));
}

/// Region `mr` is deregistered.
pub fn forget_mr(handle: u32, mr: *const SoftMr) {
    with(&MRS, |m| {
        if m.get(&handle).is_some_and(|e| e.1 == mr as usize) {
            m.remove(&handle);
        }
    });
}

/// `ibv_import_device`: a new context on the device whose context `cmd_fd` (or a `dup`
/// of it) belongs to; EOPNOTSUPP for any other descriptor.
///
/// # Safety
/// None beyond a descriptor number.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ffi::ibv_context {
    let dev = inode_of(cmd_fd).and_then(|k| with(&CONTEXTS, |m| m.get(&k).copied()));
    match dev {
        // SAFETY: a device of this library's list, which lives as long as the process.
        Some(d) => unsafe { crate::device::ibv_open_device(d as *mut ffi::ibv_device) },
        None => fail(libc::EOPNOTSUPP),
    }
}

/// `ibv_import_pd`: PD `handle` of the context's device under a new `ibv_pd`.
///
/// # Safety
/// `context` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(context: *mut ffi::ibv_context, handle: u32) -> *mut ffi::ibv_pd {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(context) }) else { return fail(libc::EINVAL) };
    let device = std::ptr::from_ref(soft.device) as usize;
    let Some((dev, pd)) = with(&PDS, |m| m.get(&handle).copied()) else { return fail(libc::ENOENT) };
    if dev != device {
        return fail(libc::EINVAL);
    }
    // SAFETY: registered while allocated; forgotten before it is freed.
    let Some(orig) = (unsafe { soft_pd(pd as *mut ffi::ibv_pd) }) else { return fail(libc::ENOENT) };
    let ibv = ffi::ibv_pd { context, handle };
    Box::into_raw(Box::new(SoftPd { ibv, pd: orig.pd.parent_domain(), parent: None })).cast()
}

/// `ibv_unimport_pd`: the imported `ibv_pd` goes; the PD stays its owner's.
///
/// # Safety
/// `pd` came from [`ibv_import_pd`] and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ffi::ibv_pd) {
    if !pd.is_null() {
        // SAFETY: allocated by Box in ibv_import_pd, given back once.
        drop(unsafe { Box::from_raw(pd.cast::<SoftPd>()) });
    }
}

/// `ibv_import_mr`: region `handle` of the PD's device under a new `ibv_mr`.
///
/// # Safety
/// `pd` is a live PD of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ffi::ibv_pd, handle: u32) -> *mut ffi::ibv_mr {
    // SAFETY: the caller's contract.
    let Some(spd) = (unsafe { soft_pd(pd) }) else { return fail(libc::EINVAL) };
    // SAFETY: the PD's context is open.
    let Some(soft) = (unsafe { soft_context(spd.ibv.context) }) else { return fail(libc::EINVAL) };
    let device = std::ptr::from_ref(soft.device) as usize;
    let found = with(&MRS, |m| {
        let &(dev, owner) = m.get(&handle)?;
        // SAFETY: registered while its owner lives; forgotten (under this lock) first.
        let o = unsafe { &*(owner as *const SoftMr) };
        Some((dev, o.mr.clone(), o.ibv.addr as usize, o.ibv.length))
    });
    let Some((dev, region, addr, length)) = found else { return fail(libc::ENOENT) };
    if dev != device {
        return fail(libc::EINVAL);
    }
    let ibv = ffi::ibv_mr {
        context: spd.ibv.context,
        pd,
        addr: addr as *mut std::ffi::c_void,
        length,
        handle,
        lkey: region.lkey(),
        rkey: region.rkey(),
    };
    Box::into_raw(Box::new(SoftMr { ibv, mr: region })).cast()
}

/// `ibv_unimport_mr`: the imported `ibv_mr` goes; the region stays while its owner's does.
///
/// # Safety
/// `mr` came from [`ibv_import_mr`] and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut ffi::ibv_mr) {
    if !mr.is_null() {
        // SAFETY: allocated by Box in ibv_import_mr, given back once.
        drop(unsafe { Box::from_raw(mr.cast::<SoftMr>()) });
    }
}

/// Device memory `owner` (handle `handle`, on `device`) can be imported.
pub fn register_dm(handle: u32, device: usize, owner: *const crate::dm::SoftDm) {
    with(&DMS, |m| m.insert(handle, (device, owner as usize)));
}

/// Device memory `dm` is freed.
pub fn forget_dm(handle: u32, dm: *const crate::dm::SoftDm) {
    with(&DMS, |m| {
        if m.get(&handle).is_some_and(|e| e.1 == dm as usize) {
            m.remove(&handle);
        }
    });
}

/// `ibv_import_dm`: device memory `handle` of the context's device under a new `ibv_dm`.
///
/// # Safety
/// `context` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(context: *mut ffi::ibv_context, handle: u32) -> *mut ffi::ibv_dm {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(context) }) else { return fail(libc::EINVAL) };
    let device = std::ptr::from_ref(soft.device) as usize;
    let found = with(&DMS, |m| {
        let &(dev, owner) = m.get(&handle)?;
        // SAFETY: registered while its owner lives; forgotten (under this lock) first.
        Some((dev, unsafe { &*(owner as *const crate::dm::SoftDm) }.dm.clone()))
    });
    let Some((dev, dm)) = found else { return fail(libc::ENOENT) };
    if dev != device {
        return fail(libc::EINVAL);
    }
    crate::dm::wrap_dm(context, handle, dm).cast()
}

/// `ibv_unimport_dm`: the imported `ibv_dm` goes; the memory stays its owner's.
///
/// # Safety
/// `dm` came from [`ibv_import_dm`] and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(dm: *mut ffi::ibv_dm) {
    if !dm.is_null() {
        // SAFETY: allocated by Box in ibv_import_dm, given back once.
        drop(unsafe { Box::from_raw(dm.cast::<crate::dm::SoftDm>()) });
    }
}
