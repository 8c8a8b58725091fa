//! Whole words between a region's atomic words and plain bytes, as fast as the CPU copies.
//!
//! The loop of relaxed 64-bit loads (or stores) that [`super::SharedMem`] is built on is
//! what the memory model asks for, but the compiler never widens or vectorises atomic
//! accesses: a 64 KiB RoCEv2 WRITE sender spent 17.6 % of its samples copying eight bytes
//! at a time. On x86-64 the copy is one `rep movsq`: every element is an aligned
//! quadword, which lies within one cache line and is read and written in one access
//! (Intel SDM vol. 3A, "Guaranteed Atomic Operations"), whether the processor moves it
//! alone or inside a wider fast-string move. So the instruction is a sequence of relaxed
//! 64-bit atomic accesses, the semantics these functions promise; elsewhere they are the
//! portable loop. Partial words stay with the caller.

use std::sync::atomic::{AtomicU64, Ordering};

/// Below this many words the loop is faster: `rep movsq` starts in microcode, which cost
/// an 8-byte WRITE about 50 ns more per message in `cargo bench --bench engine` (544 ns
/// against 592 ns with every copy a `rep movsq`).
pub const STRING_COPY_MIN_WORDS: usize = 32;

/// Copies `src` (whole words) into `dst`, which is exactly `8 * src.len()` bytes long.
pub fn load(src: &[AtomicU64], dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len() * 8, "a word copy covers whole words");
    if src.len() < STRING_COPY_MIN_WORDS {
        portable_load(src, dst);
    } else {
        load_words(src, dst);
    }
}

/// Copies `src`, exactly `8 * dst.len()` bytes long, into the words `dst`.
pub fn store(src: &[u8], dst: &[AtomicU64]) {
    assert_eq!(src.len(), dst.len() * 8, "a word copy covers whole words");
    if dst.len() < STRING_COPY_MIN_WORDS {
        portable_store(src, dst);
    } else {
        store_words(src, dst);
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn load_words(src: &[AtomicU64], dst: &mut [u8]) {
    // SAFETY: `src` is `n` aligned, initialised words and `dst` is `8 n` writable bytes
    // (checked by `load`), exclusively ours; the two cannot overlap (`dst` is a unique
    // borrow). `rep movsq` reads each word once as an aligned 64-bit access (a relaxed
    // atomic load, as other threads' accesses to the words are atomic) and writes `dst`
    // forwards (the direction flag is clear on entry to asm, per the ABI).
    unsafe {
        std::arch::asm!(
            "rep movsq",
            inout("rcx") src.len() => _,
            inout("rsi") src.as_ptr() => _,
            inout("rdi") dst.as_mut_ptr() => _,
            options(nostack, preserves_flags)
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn store_words(src: &[u8], dst: &[AtomicU64]) {
    // SAFETY: `dst` is `n` aligned words, which atomics make writable through a shared
    // reference (the pointer comes from `AtomicU64::as_ptr`), and `src` is `8 n` readable
    // bytes (checked by `store`) that no one writes meanwhile (a shared borrow of plain
    // bytes). Each element is one aligned 64-bit store: a relaxed atomic store.
    unsafe {
        std::arch::asm!(
            "rep movsq",
            inout("rcx") dst.len() => _,
            inout("rsi") src.as_ptr() => _,
            inout("rdi") dst.as_ptr().cast::<u64>().cast_mut() => _,
            options(nostack, preserves_flags)
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn load_words(src: &[AtomicU64], dst: &mut [u8]) {
    portable_load(src, dst);
}

#[cfg(not(target_arch = "x86_64"))]
fn store_words(src: &[u8], dst: &[AtomicU64]) {
    portable_store(src, dst);
}

/// The word-by-word load every target can run.
fn portable_load(src: &[AtomicU64], dst: &mut [u8]) {
    for (chunk, word) in dst.chunks_exact_mut(8).zip(src) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
}

/// The word-by-word store every target can run.
fn portable_store(src: &[u8], dst: &[AtomicU64]) {
    for (chunk, word) in src.chunks_exact(8).zip(dst) {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        word.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(n: usize, seed: u64) -> Vec<AtomicU64> {
        (0..n as u64).map(|i| AtomicU64::new((i + 1).wrapping_mul(seed))).collect()
    }

    #[test]
    fn the_fast_copy_matches_the_portable_one_and_stays_in_bounds() {
        for n in [0usize, 1, 2, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65, 512, 513] {
            let src = words(n, 0x9e37_79b9_7f4a_7c15);
            // A guard word on each side of the destination must come through untouched.
            let mut fast = vec![0xa5u8; 8 * n + 16];
            let mut slow = vec![0u8; 8 * n];
            load(&src, &mut fast[8..8 + 8 * n]);
            portable_load(&src, &mut slow);
            assert_eq!(&fast[8..8 + 8 * n], &slow[..], "load of {n} words");
            assert!(fast[..8].iter().chain(&fast[8 + 8 * n..]).all(|&b| b == 0xa5), "load of {n}: guard bytes");

            let bytes: Vec<u8> = (0..8 * n).map(|i| (i * 31 + 7) as u8).collect();
            let dst = words(n + 2, 3);
            let before: Vec<u64> = dst.iter().map(|w| w.load(Ordering::Relaxed)).collect();
            store(&bytes, &dst[1..1 + n]);
            let check = words(n, 1);
            portable_store(&bytes, &check);
            for i in 0..n {
                assert_eq!(
                    dst[1 + i].load(Ordering::Relaxed),
                    check[i].load(Ordering::Relaxed),
                    "store word {i} of {n}"
                );
            }
            assert_eq!(dst[0].load(Ordering::Relaxed), before[0], "store of {n}: word before");
            assert_eq!(dst[n + 1].load(Ordering::Relaxed), before[n + 1], "store of {n}: word after");
        }
    }

    #[test]
    #[should_panic(expected = "whole words")]
    fn a_copy_of_a_partial_word_is_refused() {
        let src = words(2, 1);
        let mut dst = [0u8; 15];
        load(&src, &mut dst);
    }
}
