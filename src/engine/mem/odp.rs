//! On-demand paging regions (`IBV_ACCESS_ON_DEMAND`): the application's address range is
//! registered without its pages being pinned or even mapped, and may be unmapped and
//! mapped again while registered; an implicit region covers the whole address space. A
//! NIC takes a page fault for an access to a page not there and fails the operation if
//! the kernel cannot map it. Here every access is a fault-tolerant copy through
//! `process_vm_readv`/`process_vm_writev` on this very process: the kernel walks the
//! page tables, maps what it may, and returns `EFAULT` for an address with nothing
//! behind it, so neither the application's own unmapping nor a peer naming any address of
//! an implicit region can make the engine touch an unmapped page.

/// Copies `out.len()` bytes from this process's address `addr`; false if any of them is
/// not mapped readable.
#[allow(unsafe_code)]
pub(super) fn copy_out(addr: usize, out: &mut [u8]) -> bool {
    if out.is_empty() {
        return true;
    }
    let local = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: out.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: out.len() };
    // SAFETY: `local` is `out`, writable for its length; the kernel checks `remote`, an
    // address of this process, and fails with EFAULT where nothing readable is mapped.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == out.len() as isize
}

/// Copies `data` to this process's address `addr`; false if any of it is not mapped
/// writable (what came before the fault may have been written, as a NIC's partial
/// placement before a fault would be).
#[allow(unsafe_code)]
pub(super) fn copy_in(addr: usize, data: &[u8]) -> bool {
    if data.is_empty() {
        return true;
    }
    let local = libc::iovec { iov_base: data.as_ptr().cast_mut().cast(), iov_len: data.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: `local` is `data`, only read; the kernel checks `remote` as in `copy_out`.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == data.len() as isize
}

/// An RDMA atomic on the 8-byte word at `addr` (8-aligned): reads it, writes `f(old)`,
/// returns the old value; `None` if the word is not mapped readable and writable. The
/// engine runs every atomic of a device under the device's lock, so this read-modify-write
/// is atomic with respect to the device's other atomics, which is what IBTA's atomicity
/// (`IBV_ATOMIC_HCA`) promises; a CPU store racing it is the application's own race.
pub(super) fn update_word(addr: usize, f: impl FnOnce(u64) -> u64) -> Option<u64> {
    if !addr.is_multiple_of(8) {
        return None;
    }
    let mut old = [0u8; 8];
    if !copy_out(addr, &mut old) {
        return None;
    }
    let old = u64::from_ne_bytes(old);
    let new = f(old);
    (new == old || copy_in(addr, &new.to_ne_bytes())).then_some(old)
}

/// Maps the pages of `len` bytes at `addr` now, writable if `write` (`ibv_advise_mr`'s
/// prefetch: the faults taken before the traffic rather than during it), without changing
/// a byte; false if part of the range has nothing mapped that allows it.
#[allow(unsafe_code)]
pub(super) fn populate(addr: usize, len: usize, write: bool) -> bool {
    if len == 0 {
        return true;
    }
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let start = addr & !(page - 1);
    let Some(end) = addr.checked_add(len).and_then(|e| e.checked_next_multiple_of(page)) else { return false };
    let advice = if write { libc::MADV_POPULATE_WRITE } else { libc::MADV_POPULATE_READ };
    // SAFETY: MADV_POPULATE_* only faults pages in (Linux 5.14); it changes no contents
    // and fails (EFAULT, ENOMEM, EINVAL) where the range has no suitable mapping.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmapped_addresses_fail_instead_of_faulting() {
        let mut out = [0u8; 16];
        assert!(!copy_out(8, &mut out), "page zero is never mapped");
        assert!(!copy_in(8, &out));
        assert_eq!(update_word(8, |v| v + 1), None);
        let code = unmapped_addresses_fail_instead_of_faulting as *const () as usize;
        assert!(copy_out(code, &mut out), "code is readable");
        assert!(!copy_in(code, &out), "but not writable");
    }

    #[test]
    fn mapped_memory_round_trips_and_atomics_update_it() {
        let mut buf = [0u64; 4];
        let at = buf.as_mut_ptr() as usize;
        assert!(copy_in(at + 3, b"abcdefgh"));
        let mut out = [0u8; 8];
        assert!(copy_out(at + 3, &mut out) && &out == b"abcdefgh");
        assert_eq!(update_word(at + 16, |v| v + 5), Some(0));
        assert_eq!(update_word(at + 16, |v| if v == 5 { 9 } else { v }), Some(5));
        assert_eq!(update_word(at + 17, |v| v), None, "unaligned");
        assert_eq!(std::hint::black_box(&buf)[2], 9);
        assert!(populate(at, 32, true), "mapped and writable");
        let code = mapped_memory_round_trips_and_atomics_update_it as *const () as usize;
        assert!(populate(code, 8, false) && !populate(code, 8, true), "code is read-only");
        assert!(!populate(8, 8, false), "page zero");
    }
}
