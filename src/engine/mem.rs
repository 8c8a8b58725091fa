//! Registered memory (IBTA 10.6): protection domains, memory regions, keys.
//!
//! The remote side writes registered memory while the application holds it. So that safe
//! code cannot cause undefined behaviour, a region's bytes live in [`SharedMem`]: 64-bit
//! atomic words. The application and the engine both go through its copy-in/copy-out
//! methods; concurrent access is a race on values, never a data race in Rust's sense. The
//! same words give RDMA atomics their atomicity with respect to each other on one device.

use super::rng::Rng;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub mod mw;
mod odp;
mod words;

const WORD: usize = 8;

/// Bytes shared between the application and the engine, stored in atomic words, or the
/// memory of a C application that registered its own buffer ([`SharedMem::foreign`]).
#[derive(Debug)]
pub struct SharedMem {
    words: Box<[AtomicU64]>,
    len: usize,
    foreign: Option<Foreign>,
}

/// A C application's buffer: `ibv_reg_mr`'s contract keeps it valid until the region is
/// deregistered, and the application reads and writes it while the engine does, as it
/// does with a NIC's DMA. Rust code never holds a reference into it: every access is a
/// raw copy, and atomics go through `AtomicU64::from_ptr` on aligned words.
///
/// A region still in use when the application deregisters it (a multi-packet WRITE or a
/// READ being answered holds it) is revoked under the device lock: after `ibv_dereg_mr`
/// returns, the engine never touches the buffer again, whatever it was doing with it.
///
/// An on-demand region ([`SharedMem::on_demand`]) promises less: its pages may be
/// unmapped at any time, so it is only ever reached through [`odp`]'s checked copies.
#[derive(Debug)]
struct Foreign {
    addr: usize,
    revoked: std::sync::atomic::AtomicBool,
    on_demand: bool,
}

// SAFETY: the pointer is only dereferenced by raw copies and atomic operations within the
// registered length; the buffer is the application's, valid for every thread until the
// region is deregistered (the contract `SharedMem::foreign` states).
#[allow(unsafe_code)]
unsafe impl Send for Foreign {}
// SAFETY: as for Send: no shared reference into the buffer is ever formed.
#[allow(unsafe_code)]
unsafe impl Sync for Foreign {}

impl SharedMem {
    /// `len` zero bytes. The allocation is zeroed by the allocator (fresh pages from the
    /// kernel for a large region), so registering 100 MiB costs no pass over it: writing
    /// each word here took 70 ms for a thousand QPs' buffers, under the device lock.
    #[allow(unsafe_code)]
    pub fn new(len: usize) -> Self {
        let n = len.div_ceil(WORD);
        let Ok(layout) = std::alloc::Layout::array::<AtomicU64>(n) else {
            panic!("a region of {len} bytes does not fit the address space");
        };
        if n == 0 {
            return SharedMem { words: Box::new([]), len, foreign: None };
        }
        // SAFETY: the layout has a non-zero size. All-zero bytes are a valid AtomicU64 (it
        // has the in-memory representation of u64), so the n words are initialised, and a
        // boxed slice of n AtomicU64 is deallocated with this same layout.
        let words = unsafe {
            let ptr = std::alloc::alloc_zeroed(layout).cast::<AtomicU64>();
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n))
        };
        SharedMem { words, len, foreign: None }
    }

    /// The `len` bytes at `ptr`, which a C application registered (`ibv_reg_mr`).
    ///
    /// # Safety
    /// `ptr..ptr + len` stays allocated and writable until the last clone of the returned
    /// region (and of the `Arc` the engine keeps) is dropped, which deregistration does.
    #[allow(unsafe_code)]
    pub unsafe fn foreign(ptr: std::ptr::NonNull<u8>, len: usize) -> Self {
        let revoked = std::sync::atomic::AtomicBool::new(false);
        let foreign = Foreign { addr: ptr.as_ptr() as usize, revoked, on_demand: false };
        SharedMem { words: Box::new([]), len, foreign: Some(foreign) }
    }

    /// The `len` bytes of this process's address space from `addr`, registered on demand
    /// (`IBV_ACCESS_ON_DEMAND`; the whole address space for an implicit region): nothing
    /// need be mapped there, now or later. Each access is a checked copy ([`odp`]) that
    /// fails where nothing is mapped, so this needs no promise from the caller.
    pub fn on_demand(addr: usize, len: usize) -> Self {
        let revoked = std::sync::atomic::AtomicBool::new(false);
        SharedMem { words: Box::new([]), len, foreign: Some(Foreign { addr, revoked, on_demand: true }) }
    }

    /// True for a region registered on demand ([`SharedMem::on_demand`]).
    pub fn is_on_demand(&self) -> bool {
        self.foreign.as_ref().is_some_and(|f| f.on_demand)
    }

    /// The address of bytes `offset..offset + len`, for the kernel to read in place (a
    /// vectored write from registered memory, as a NIC's DMA reads it); `None` when out of
    /// bounds, revoked, or on demand (whose pages only checked copies reach). It stays
    /// valid while this region lives and, for a foreign one, until it is revoked. Rust
    /// code never reads through it: only a system call does.
    pub fn raw_span(&self, offset: usize, len: usize) -> Option<*const u8> {
        if !self.in_bounds(offset, len) {
            return None;
        }
        match &self.foreign {
            None => Some(self.words.as_ptr().cast::<u8>().wrapping_add(offset)),
            Some(f) if f.on_demand || !f.live() => None,
            Some(f) => Some(f.addr.wrapping_add(offset) as *const u8),
        }
    }

    /// Where a C application's buffer starts (`None`: the engine's own memory).
    pub fn foreign_addr(&self) -> Option<usize> {
        self.foreign.as_ref().map(|f| f.addr)
    }

    /// Stops every later access to a foreign region (it was deregistered: the buffer is
    /// the application's again); reads and writes then fail as out of bounds.
    pub fn revoke(&self) {
        if let Some(f) = &self.foreign {
            f.revoked.store(true, Ordering::Release);
        }
    }
    /// Touches every page once, so the kernel maps them now rather than on the first
    /// placement (as `ibv_reg_mr` pins a region's pages when it registers it).
    pub fn prefault(&self) {
        if self.foreign.is_some() {
            return;
        }
        const WORDS_PER_PAGE: usize = 4096 / WORD;
        for word in self.words.iter().step_by(WORDS_PER_PAGE) {
            word.fetch_or(0, Ordering::Relaxed);
        }
    }
    /// `ibv_advise_mr`'s prefetch of `len` bytes at `offset`: an on-demand region's pages
    /// are mapped now (writable if `write`); false where nothing is mapped there or the
    /// range is out of bounds. Other regions' pages are there already.
    pub fn prefetch(&self, offset: usize, len: usize, write: bool) -> bool {
        match self.foreign.as_ref().filter(|f| f.on_demand) {
            Some(f) => self.in_bounds(offset, len) && f.live() && odp::populate(f.addr + offset, len, write),
            None => self.in_bounds(offset, len),
        }
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn in_bounds(&self, offset: usize, n: usize) -> bool {
        offset.checked_add(n).is_some_and(|end| end <= self.len)
    }
    /// Copies `out.len()` bytes from `offset`; false (nothing copied) when out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if !self.in_bounds(offset, out.len()) {
            return false;
        }
        if let Some(f) = &self.foreign {
            return f.read(offset, out);
        }
        // A partial first word, then whole words, then a partial last word.
        let total = out.len();
        let head = ((WORD - offset % WORD) % WORD).min(total);
        let (first, rest) = out.split_at_mut(head);
        self.read_partial(offset, first);
        let at = offset + head;
        let whole = rest.len() / WORD;
        let (middle, tail) = rest.split_at_mut(whole * WORD);
        words::load(&self.words[at / WORD..at / WORD + whole], middle);
        let tail_at = offset + total - tail.len();
        self.read_partial(tail_at, tail);
        true
    }
    /// Bytes within one word.
    fn read_partial(&self, offset: usize, out: &mut [u8]) {
        if out.is_empty() {
            return;
        }
        let skip = offset % WORD;
        let bytes = self.words[offset / WORD].load(Ordering::Relaxed).to_le_bytes();
        out.copy_from_slice(&bytes[skip..skip + out.len()]);
    }
    /// Copies `data` to `offset`; false (nothing written) when out of bounds.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        if !self.in_bounds(offset, data.len()) {
            return false;
        }
        if let Some(f) = &self.foreign {
            return f.write(offset, data);
        }
        let head = ((WORD - offset % WORD) % WORD).min(data.len());
        let (first, rest) = data.split_at(head);
        self.write_partial(offset, first);
        let at = offset + head;
        let whole = rest.len() / WORD;
        let (middle, tail) = rest.split_at(whole * WORD);
        words::store(middle, &self.words[at / WORD..at / WORD + whole]);
        self.write_partial(offset + data.len() - tail.len(), tail);
        true
    }
    /// Bytes within one word: merged with what is there, atomically.
    fn write_partial(&self, offset: usize, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let skip = offset % WORD;
        let _ = self.words[offset / WORD].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            let mut b = old.to_le_bytes();
            b[skip..skip + data.len()].copy_from_slice(data);
            Some(u64::from_le_bytes(b))
        });
    }
    /// Fills `n` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: usize, n: usize, byte: u8) -> bool {
        self.write(offset, &vec![byte; n])
    }
    /// Atomic fetch-and-add on the 8-byte word at `offset` (8-aligned); returns the old value.
    pub fn fetch_add(&self, offset: usize, add: u64) -> Option<u64> {
        self.update(offset, |v| v.wrapping_add(add))
    }
    /// Atomic compare-and-swap on the word at `offset` (8-aligned); returns the old value.
    pub fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Option<u64> {
        self.update(offset, |v| if v == compare { swap } else { v })
    }
    /// ATOMIC WRITE: the 8 `bytes` stored at `offset` (8-aligned) at once, never torn;
    /// false when out of bounds, unaligned, or the memory refuses.
    pub fn atomic_store(&self, offset: usize, bytes: [u8; 8]) -> bool {
        // An owned word holds its bytes as its little-endian value; a foreign one is the
        // application's memory, in the CPU's order.
        let value = if self.foreign.is_some() { u64::from_ne_bytes(bytes) } else { u64::from_le_bytes(bytes) };
        self.update(offset, |_| value).is_some()
    }
    /// Replaces the 8-byte word at `offset` (8-aligned) by `f` of it, atomically with
    /// respect to the device's other atomics; the old value. An on-demand region's word
    /// goes through checked copies ([`Foreign::update_word`]).
    fn update(&self, offset: usize, f: impl Fn(u64) -> u64) -> Option<u64> {
        match self.foreign.as_ref().filter(|fo| fo.on_demand) {
            Some(fo) => fo.update_word(offset, self.in_bounds(offset, WORD), f),
            None => self.word(offset)?.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(f(v))).ok(),
        }
    }
    fn word(&self, offset: usize) -> Option<&AtomicU64> {
        if !self.in_bounds(offset, WORD) {
            return None;
        }
        if let Some(f) = &self.foreign {
            return f.word(offset);
        }
        offset.is_multiple_of(WORD).then(|| &self.words[offset / WORD])
    }
    /// A copy of every byte.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.read(0, &mut v);
        v
    }
}

#[allow(unsafe_code)]
impl Foreign {
    fn live(&self) -> bool {
        !self.revoked.load(Ordering::Acquire)
    }
    fn ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
    /// Copies out, unless revoked; the caller checked the bounds.
    fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if self.on_demand {
            return self.live() && odp::copy_out(self.addr + offset, out);
        }
        // SAFETY: offset + out.len() is within the registered length (checked by the
        // caller), which SharedMem::foreign's contract keeps allocated until revoked.
        self.live() && {
            unsafe { std::ptr::copy_nonoverlapping(self.ptr().add(offset), out.as_mut_ptr(), out.len()) };
            true
        }
    }
    /// Copies in, unless revoked; the caller checked the bounds.
    fn write(&self, offset: usize, data: &[u8]) -> bool {
        if self.on_demand {
            return self.live() && odp::copy_in(self.addr + offset, data);
        }
        // SAFETY: as in `read`, and the region is writable by the same contract.
        self.live() && {
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(offset), data.len()) };
            true
        }
    }
    /// An on-demand region's atomic ([`odp::update_word`]), if `in_bounds` and live.
    fn update_word(&self, offset: usize, in_bounds: bool, f: impl FnOnce(u64) -> u64) -> Option<u64> {
        (in_bounds && self.live()).then(|| odp::update_word(self.addr + offset, f)).flatten()
    }
    /// The word at `offset` if its address is 8-aligned and the region live; the caller
    /// checked the bounds. Never for an on-demand region, whose words may be unmapped.
    fn word(&self, offset: usize) -> Option<&AtomicU64> {
        if !self.live() || self.on_demand {
            return None;
        }
        // SAFETY: within the region (checked by the caller).
        let p = unsafe { self.ptr().add(offset) };
        // SAFETY: aligned, in bounds, valid for the region's life; concurrent access to it
        // is the application's, on the same word, as RDMA atomics promise no more.
        (p as usize).is_multiple_of(WORD).then(|| unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }
}

/// Access rights of a memory region (IBTA 10.6.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// The local HCA may write (receive buffers, READ targets, atomic results).
    pub local_write: bool,
    /// A remote peer may READ.
    pub remote_read: bool,
    /// A remote peer may WRITE.
    pub remote_write: bool,
    /// A remote peer may perform atomics.
    pub remote_atomic: bool,
    /// A remote peer may invalidate the key with SEND_WITH_INVALIDATE (IBTA 10.6.7.2) or
    /// Send with Invalidate (RFC 5040 §6.4.1).
    pub remote_invalidate: bool,
    /// Memory windows may be bound to the region (IBTA 10.6.7.1).
    pub mw_bind: bool,
}

impl Access {
    /// Everything allowed.
    pub const ALL: Access = Access {
        local_write: true,
        remote_read: true,
        remote_write: true,
        remote_atomic: true,
        remote_invalidate: true,
        mw_bind: true,
    };
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pd(pub u32);

/// A registered memory region as the application sees it.
#[derive(Debug, Clone)]
pub struct Mr {
    /// Local key, for SGEs.
    pub lkey: u32,
    /// Remote key, for RETH/AtomicETH.
    pub rkey: u32,
    /// The virtual address of the first byte.
    pub addr: u64,
    /// The bytes: the region is `len` of them from `start` (all of them, but for a region
    /// over part of device memory).
    pub mem: Arc<SharedMem>,
    /// Where the region begins in `mem`.
    pub start: usize,
    /// The region's length.
    pub len: usize,
}

#[derive(Debug)]
struct Region {
    pd: Pd,
    access: Access,
    addr: u64,
    mem: Arc<SharedMem>,
    /// The region is `len` bytes of `mem` from `start`.
    start: usize,
    len: usize,
    key: u32,
    valid: bool,
}

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No valid region with that key.
    BadKey,
    /// The region belongs to another PD.
    WrongPd,
    /// The region does not allow the access.
    Access,
    /// The range is outside the region.
    Bounds,
    /// An atomic on an address that is not 8-aligned.
    Alignment,
}

/// What a re-registration changes (`None`: kept).
#[derive(Debug, Default)]
pub struct Rereg {
    /// A new protection domain.
    pub pd: Option<Pd>,
    /// New access rights.
    pub access: Option<Access>,
    /// New memory and the address peers name its first byte by.
    pub mem: Option<(Arc<SharedMem>, u64)>,
}

/// The device's memory regions, indexed by the 24 index bits of their keys.
#[derive(Debug, Default)]
pub struct MrTable {
    regions: FxHashMap<u32, Region>,
    /// Memory windows, in the same index space as the regions ([`mw`]).
    windows: FxHashMap<u32, mw::Window>,
    max_regions: usize,
}

/// The access a lookup asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Local read (SGE of a send).
    LocalRead,
    /// Local write.
    LocalWrite,
    /// Remote read.
    RemoteRead,
    /// Remote write.
    RemoteWrite,
    /// Remote atomic.
    RemoteAtomic,
}

impl MrTable {
    /// A table holding at most `max_regions`.
    pub fn new(max_regions: usize) -> Self {
        MrTable { regions: FxHashMap::default(), windows: FxHashMap::default(), max_regions }
    }

    /// Registers `len` bytes. All 32 key bits are drawn from `rng` (the OS CSPRNG on a real
    /// device): the 24 index bits among the free indices, the 8 key bits freely, so that a
    /// key says nothing of any other and a re-registration gets a new one. The advertised
    /// address is a separate draw, so it reveals nothing of the keys.
    pub fn register(&mut self, pd: Pd, len: usize, access: Access, rng: &mut Rng) -> Option<Mr> {
        self.register_mem(pd, Arc::new(SharedMem::new(len)), access, None, rng)
    }

    /// Registers `mem`, allocated by the caller (outside any lock it holds), at `addr` if
    /// given (the application's own address for its buffer), else at a drawn address.
    pub fn register_mem(
        &mut self,
        pd: Pd,
        mem: Arc<SharedMem>,
        access: Access,
        addr: Option<u64>,
        rng: &mut Rng,
    ) -> Option<Mr> {
        let len = mem.len();
        self.register_span(pd, (mem, 0, len), access, addr, rng)
    }

    /// As [`MrTable::register_mem`], for the `len` bytes of `mem` from `start` (a region
    /// over part of device memory); `None` if they are not all in `mem`.
    pub fn register_span(
        &mut self,
        pd: Pd,
        (mem, start, len): (Arc<SharedMem>, usize, usize),
        access: Access,
        addr: Option<u64>,
        rng: &mut Rng,
    ) -> Option<Mr> {
        if start.checked_add(len).is_none_or(|end| end > mem.len()) {
            return None;
        }
        if self.regions.len() >= self.max_regions {
            return None;
        }
        let key = self.fresh_key(rng);
        let index = key >> 8;
        let addr = addr.unwrap_or_else(|| (rng.next_u64() & 0x0000_7fff_ffff_f000) | 0x1000);
        self.regions.insert(index, Region { pd, access, addr, mem: mem.clone(), start, len, key, valid: true });
        Some(Mr { lkey: key, rkey: key, addr, mem, start, len })
    }

    /// A key whose 24 index bits name neither a region nor a window; index 0 is never
    /// used, so that a zeroed key never names anything.
    fn fresh_key(&self, rng: &mut Rng) -> u32 {
        loop {
            let k = rng.next_u64() as u32;
            let index = k >> 8;
            if index != 0 && !self.regions.contains_key(&index) && !self.windows.contains_key(&index) {
                return k;
            }
        }
    }

    /// Reregisters the region of `key` (IBTA 11.2.8.4): a new PD, access, or memory at an
    /// address, each kept when `None`; the keys stay. Memory replaced is revoked, so the
    /// engine never touches the old buffer again.
    pub fn reregister(&mut self, key: u32, change: Rereg) -> Option<Mr> {
        let r = self.regions.get_mut(&(key >> 8)).filter(|r| r.key == key)?;
        if let Some(pd) = change.pd {
            r.pd = pd;
        }
        if let Some(access) = change.access {
            r.access = access;
        }
        if let Some((mem, addr)) = change.mem {
            (r.start, r.len) = (0, mem.len());
            std::mem::replace(&mut r.mem, mem).revoke();
            r.addr = addr;
        }
        Some(Mr { lkey: r.key, rkey: r.key, addr: r.addr, mem: r.mem.clone(), start: r.start, len: r.len })
    }

    /// Deregisters a region; a foreign one is revoked ([`SharedMem::revoke`]).
    pub fn deregister(&mut self, key: u32) -> bool {
        self.regions.remove(&(key >> 8)).inspect(|r| r.mem.revoke()).is_some()
    }

    /// Invalidates an rkey (local invalidate, send with invalidate).
    pub fn invalidate(&mut self, key: u32) -> bool {
        match self.regions.get_mut(&(key >> 8)) {
            Some(r) if r.key == key => {
                r.valid = false;
                true
            }
            _ => false,
        }
    }

    /// Invalidation by the peer of a QP in `pd`: only a valid key of that PD whose region
    /// allows remote invalidation (IBTA 10.6.7.2, RFC 5040 §6.4.1). Nothing changes on an
    /// error.
    pub fn remote_invalidate(&mut self, key: u32, pd: Pd, qpn: u32) -> Result<(), MemError> {
        if self.windows.contains_key(&(key >> 8)) {
            return self.invalidate_window(key, pd, qpn);
        }
        let r = self.regions.get_mut(&(key >> 8)).filter(|r| r.key == key && r.valid).ok_or(MemError::BadKey)?;
        if r.pd != pd {
            return Err(MemError::WrongPd);
        }
        if !r.access.remote_invalidate {
            return Err(MemError::Access);
        }
        r.valid = false;
        Ok(())
    }

    /// As [`MrTable::resolve`], for an access by the peer of QP `qpn`: `key` may also
    /// name a memory window ([`mw`]).
    pub fn resolve_remote(
        &self,
        key: u32,
        (pd, qpn): (Pd, u32),
        va: u64,
        len: usize,
        need: Need,
    ) -> Result<(Arc<SharedMem>, usize), MemError> {
        match self.windows.get(&(key >> 8)) {
            Some(w) => self.resolve_window(w, key, (pd, qpn), va, len, need),
            None => self.resolve(key, pd, va, len, need),
        }
    }

    /// Finds the bytes for `[va, va + len)` under `key`, checking PD, access and bounds.
    pub fn resolve(
        &self,
        key: u32,
        pd: Pd,
        va: u64,
        len: usize,
        need: Need,
    ) -> Result<(Arc<SharedMem>, usize), MemError> {
        let r = self.regions.get(&(key >> 8)).filter(|r| r.key == key && r.valid).ok_or(MemError::BadKey)?;
        if r.pd != pd {
            return Err(MemError::WrongPd);
        }
        let ok = match need {
            Need::LocalRead => true,
            Need::LocalWrite => r.access.local_write,
            Need::RemoteRead => r.access.remote_read,
            Need::RemoteWrite => r.access.remote_write,
            Need::RemoteAtomic => r.access.remote_atomic,
        };
        if !ok {
            return Err(MemError::Access);
        }
        let off = va.checked_sub(r.addr).ok_or(MemError::Bounds)?;
        let end = off.checked_add(len as u64).ok_or(MemError::Bounds)?;
        if end > r.len as u64 {
            return Err(MemError::Bounds);
        }
        if need == Need::RemoteAtomic && !va.is_multiple_of(8) {
            return Err(MemError::Alignment);
        }
        Ok((r.mem.clone(), r.start + off as usize))
    }

    /// Bytes `start..start + len` of the message a scatter/gather list describes (IBTA
    /// 10.7.2.1): `f(mem, offset in mem, offset in the range, n)` for each piece, in order;
    /// false when a piece does not resolve for `need`, the list is too short, or `f`
    /// returns false (the memory refused the copy: revoked, or on demand and not mapped).
    pub fn for_sgl_range(
        &self,
        sgl: &[crate::engine::verbs::Sge],
        pd: Pd,
        (mut start, len): (usize, usize),
        need: Need,
        mut f: impl FnMut(&Arc<SharedMem>, usize, usize, usize) -> bool,
    ) -> bool {
        let mut done = 0;
        for s in sgl {
            let sge_len = s.length as usize;
            if start >= sge_len {
                start -= sge_len;
                continue;
            }
            let n = (sge_len - start).min(len - done);
            let Ok((mem, off)) = self.resolve(s.lkey, pd, s.addr + start as u64, n, need) else {
                return false;
            };
            if !f(&mem, off, done, n) {
                return false;
            }
            done += n;
            start = 0;
            if done == len {
                break;
            }
        }
        done == len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // IBTA 11.2.8.4: a re-registration keeps the keys and takes new memory, access and PD;
    // the old memory is no longer reachable by them.
    #[test]
    fn reregistration_keeps_the_keys_and_moves_everything_else() {
        let mut t = MrTable::new(4);
        let mut rng = Rng::new(7);
        let a = t.register(Pd(1), 64, Access::ALL, &mut rng).unwrap();
        let new = Arc::new(SharedMem::new(128));
        let change = Rereg { pd: Some(Pd(2)), access: Some(Access::default()), mem: Some((new.clone(), 0x5000)) };
        let b = t.reregister(a.lkey, change).unwrap();
        assert_eq!((b.lkey, b.rkey, b.addr), (a.lkey, a.rkey, 0x5000));
        assert!(Arc::ptr_eq(&b.mem, &new));
        assert_eq!(t.resolve(a.rkey, Pd(2), a.addr, 8, Need::LocalRead).err(), Some(MemError::Bounds), "old address");
        assert_eq!(t.resolve(a.rkey, Pd(1), 0x5000, 8, Need::LocalRead).err(), Some(MemError::WrongPd));
        assert_eq!(t.resolve(a.rkey, Pd(2), 0x5000, 8, Need::RemoteWrite).err(), Some(MemError::Access));
        let (mem, off) = t.resolve(a.rkey, Pd(2), 0x5000 + 120, 8, Need::LocalRead).unwrap();
        assert!(Arc::ptr_eq(&mem, &new) && off == 120);
        assert!(t.reregister(a.lkey ^ 1, Rereg::default()).is_none(), "a stale key names nothing");
    }

    // A region over part of device memory: its addresses start at 0 and name the memory
    // from the span's start; nothing outside the span is reachable through it.
    #[test]
    fn a_span_region_reaches_its_part_of_the_memory_only() {
        let mut t = MrTable::new(4);
        let mut rng = Rng::new(3);
        let mem = Arc::new(SharedMem::new(256));
        assert!(
            t.register_span(Pd(1), (mem.clone(), 200, 57), Access::ALL, Some(0), &mut rng).is_none(),
            "past the end"
        );
        let mr = t.register_span(Pd(1), (mem.clone(), 64, 128), Access::ALL, Some(0), &mut rng).unwrap();
        assert_eq!((mr.addr, mr.start, mr.len), (0, 64, 128));
        let (m, off) = t.resolve(mr.rkey, Pd(1), 120, 8, Need::RemoteWrite).unwrap();
        assert!(Arc::ptr_eq(&m, &mem) && off == 184);
        assert_eq!(t.resolve(mr.rkey, Pd(1), 121, 8, Need::RemoteWrite).err(), Some(MemError::Bounds));
    }

    #[test]
    fn unaligned_copies_round_trip() {
        let m = SharedMem::new(37);
        let data: Vec<u8> = (1..=30).collect();
        assert!(m.write(3, &data));
        let mut out = vec![0u8; 30];
        assert!(m.read(3, &mut out));
        assert_eq!(out, data);
        assert_eq!(m.to_vec()[..3], [0, 0, 0]);
        assert!(!m.write(30, &data), "out of bounds writes nothing");
        assert_eq!(m.to_vec()[33..], [0, 0, 0, 0]);
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_foreign_region_is_the_callers_buffer_until_deregistered() {
        // A C application's buffer, unaligned on purpose, with guard bytes either side.
        let mut buf = [0xeeu8; 48];
        let base = std::ptr::NonNull::new(buf[3..].as_mut_ptr()).unwrap();
        // SAFETY: `buf` outlives the region and nothing else touches it meanwhile.
        let mem = Arc::new(unsafe { SharedMem::foreign(base, 40) });
        let mut table = MrTable::new(4);
        let mut rng = Rng::new(7);
        let va = base.as_ptr() as u64;
        let mr = table.register_mem(Pd(1), mem.clone(), Access::ALL, Some(va), &mut rng).unwrap();
        assert_eq!(mr.addr, va, "the region is named by the application's own address");
        let (m, off) = table.resolve(mr.rkey, Pd(1), va + 5, 8, Need::RemoteWrite).unwrap();
        assert!(m.write(off, b"placed!!"));
        assert!(!m.write(36, b"too long"), "nothing past the registered length");
        // An 8-aligned word past the bytes placed above.
        let aligned = (8 - (va as usize % 8)) % 8 + 16;
        assert_eq!(m.fetch_add(aligned, 1), Some(0xeeee_eeee_eeee_eeee));
        assert_eq!(m.fetch_add(aligned + 1, 1), None, "atomics need an aligned address");
        assert!(table.deregister(mr.lkey));
        assert!(!mem.write(0, b"late"), "a deregistered region is never written again");
        let mut out = [0u8; 4];
        assert!(!mem.read(0, &mut out));
        assert_eq!(mem.fetch_add(aligned, 1), None);
        drop(mem);
        assert_eq!(&buf[8..16], b"placed!!");
        assert_eq!(buf[..3], [0xee; 3], "the guard bytes before are untouched");
        assert_eq!(buf[43..], [0xee; 5], "the guard bytes after are untouched");
        let word = u64::from_le_bytes(buf[3 + aligned..11 + aligned].try_into().unwrap());
        assert!(word != 0xeeee_eeee_eeee_eeee, "the atomic changed the application's word");
    }

    #[test]
    fn new_regions_read_as_zeros_at_every_size() {
        assert!(SharedMem::new(0).is_empty());
        for len in [1, 7, 8, 9, 4096, 3 << 20] {
            let m = SharedMem::new(len);
            let mut out = vec![0xffu8; len];
            assert!(m.read(0, &mut out));
            assert!(out.iter().all(|&b| b == 0), "{len} bytes");
            assert!(m.write(len - 1, &[7]) && !m.write(len, &[7]));
        }
    }

    #[test]
    fn atomics_need_alignment() {
        let m = SharedMem::new(16);
        assert_eq!(m.fetch_add(8, 5), Some(0));
        assert_eq!(m.compare_swap(8, 5, 9), Some(5));
        assert_eq!(m.compare_swap(8, 5, 1), Some(9), "compare fails: unchanged");
        assert_eq!(m.fetch_add(4, 1), None);
        assert_eq!(m.fetch_add(16, 1), None);
    }

    #[test]
    fn keys_are_not_sequential_and_change_on_reregistration() {
        let mut t = MrTable::new(100);
        let mut rng = Rng::new(1);
        let a = t.register(Pd(1), 64, Access::ALL, &mut rng).unwrap();
        let b = t.register(Pd(1), 64, Access::ALL, &mut rng).unwrap();
        assert_ne!((b.rkey >> 8).wrapping_sub(a.rkey >> 8), 1);
        assert!(t.deregister(a.rkey));
        let keys: Vec<u32> = (0..50).map(|_| t.register(Pd(1), 8, Access::ALL, &mut rng).unwrap().rkey).collect();
        assert!(!keys.contains(&a.rkey) || keys.iter().filter(|k| **k >> 8 == a.rkey >> 8).count() <= 1);
        assert!(t.resolve(a.rkey, Pd(1), a.addr, 1, Need::RemoteRead).is_err(), "old key is dead");
    }

    #[test]
    fn resolve_checks_pd_access_bounds() {
        let mut t = MrTable::new(10);
        let mut rng = Rng::new(2);
        let ro = Access { remote_read: true, ..Access::default() };
        let m = t.register(Pd(1), 100, ro, &mut rng).unwrap();
        assert!(t.resolve(m.rkey, Pd(1), m.addr + 10, 90, Need::RemoteRead).is_ok());
        assert_eq!(t.resolve(m.rkey, Pd(2), m.addr, 1, Need::RemoteRead).unwrap_err(), MemError::WrongPd);
        assert_eq!(t.resolve(m.rkey, Pd(1), m.addr, 1, Need::RemoteWrite).unwrap_err(), MemError::Access);
        assert_eq!(t.resolve(m.rkey, Pd(1), m.addr + 10, 91, Need::RemoteRead).unwrap_err(), MemError::Bounds);
        assert_eq!(t.resolve(m.rkey, Pd(1), m.addr - 1, 1, Need::RemoteRead).unwrap_err(), MemError::Bounds);
        assert_eq!(t.resolve(m.rkey ^ 1, Pd(1), m.addr, 1, Need::RemoteRead).unwrap_err(), MemError::BadKey);
        assert!(t.invalidate(m.rkey));
        assert_eq!(t.resolve(m.rkey, Pd(1), m.addr, 1, Need::RemoteRead).unwrap_err(), MemError::BadKey);
    }
}
