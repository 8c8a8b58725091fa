//! Which CRC-32 routine the ICRC takes on this CPU, measured once per process as the first
//! RoCEv2 device opens ([`softrdma_proto::crc::set_crc32_table_below`]): crc32fast's
//! carry-less multiply is the fastest on a real x86 CPU at every length, but where the CPU
//! is emulated (a QEMU/TCG guest, which runs each carry-less multiply as a helper call) a
//! 16-way table was faster up to a few KiB, and the ICRC was 18 % of a sending guest's CPU.

use softrdma_proto::crc::{self, Crc32};
use std::sync::Once;
use std::time::Instant;

/// The ICRC message lengths compared, bytes: an ACK's to a 4096-byte MTU packet's.
const LENGTHS: [usize; 5] = [64, 256, 1024, 2048, 4096];

/// A routine's time at a length is the best of this many runs (an interrupt in one only
/// lengthens that one) ...
const RUNS: usize = 5;
/// ... of this many CRCs each.
const CRCS_PER_RUN: usize = 4;

/// Measures the two routines and sets the choice, the first time it is called.
pub fn choose_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| crc::set_crc32_table_below(table_below(&measure())));
}

/// Nanoseconds per CRC at each of [`LENGTHS`]: (crc32fast, table). The two routines'
/// runs alternate, so that a stretch of interference (an interrupt, another thread, an
/// emulator translating code) lands on both rather than on one.
fn measure() -> [(u64, u64); LENGTHS.len()] {
    let data: Vec<u8> = (0..LENGTHS[LENGTHS.len() - 1]).map(|i| (i as u8).wrapping_mul(151)).collect();
    LENGTHS.map(|len| {
        let mut best = (u64::MAX, u64::MAX);
        for _ in 0..RUNS {
            best.0 = best.0.min(run_ns(&data[..len], Crc32::fast));
            best.1 = best.1.min(run_ns(&data[..len], Crc32::table));
        }
        best
    })
}

fn run_ns(data: &[u8], routine: fn() -> Crc32) -> u64 {
    let start = Instant::now();
    for _ in 0..CRCS_PER_RUN {
        let mut c = routine();
        c.update(std::hint::black_box(data));
        std::hint::black_box(c.finalize());
    }
    start.elapsed().as_nanos() as u64
}

/// The limit from the measurements: of the choices "the table below `LENGTHS[k]`, crc32fast
/// from there" (none, each length, all), the one with the least time summed over the
/// lengths measured. One routine ahead by chance where both are close costs little time
/// and so moves the limit little; a first-win rule would swing on it from "always" to
/// "never" (a guest once took the emulated carry-less multiply at every length that way).
fn table_below(ns: &[(u64, u64); LENGTHS.len()]) -> usize {
    let total =
        |k: usize| -> u64 { ns[..k].iter().map(|p| p.1).sum::<u64>() + ns[k..].iter().map(|p| p.0).sum::<u64>() };
    match (0..=LENGTHS.len()).min_by_key(|&k| total(k)) {
        Some(0) | None => 0,
        Some(k) if k < LENGTHS.len() => LENGTHS[k],
        Some(_) => usize::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_one_with_the_least_summed_time() {
        // This machine's figures (ns): crc32fast ahead everywhere.
        let host = [(24, 33), (30, 60), (50, 220), (70, 430), (90, 860)];
        assert_eq!(table_below(&host), 0);
        // A QEMU 7.2/TCG guest's: the table ahead up to a few KiB.
        let tcg = [(950, 260), (1300, 700), (3400, 2300), (6000, 4500), (11000, 16500)];
        assert_eq!(table_below(&tcg), 4096);
        let table_always = [(950, 260), (1300, 700), (3400, 2300), (6000, 4500), (16000, 11000)];
        assert_eq!(table_below(&table_always), usize::MAX);
        // A guest's measurement where crc32fast came out ahead at the shortest length by
        // chance (the emulated carry-less multiply is slower at every length): the table
        // is still taken up to where crc32fast wins for good.
        let noisy = [(250, 260), (1300, 700), (3400, 2300), (6000, 4500), (11000, 16500)];
        assert_eq!(table_below(&noisy), 4096);
        // The host's, with the table ahead by chance at the longest: still crc32fast throughout.
        let host_noisy = [(24, 33), (30, 60), (50, 220), (70, 430), (900, 860)];
        assert_eq!(table_below(&host_noisy), 0);
    }

    #[test]
    fn both_routines_are_measured_at_every_length() {
        let ns = measure();
        assert!(ns.iter().all(|&(fast, table)| fast > 0 && table > 0), "{ns:?}");
        // The longest takes longer than the shortest for each routine (4096 bytes against 64).
        assert!(ns[4].0 > ns[0].0 && ns[4].1 > ns[0].1, "{ns:?}");
    }
}
