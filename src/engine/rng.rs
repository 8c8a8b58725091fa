//! A small deterministic random generator (SplitMix64). The engine takes its seed from the
//! device configuration and never asks the OS, so a simulation seed reproduces every key,
//! initial PSN and fault exactly, across dependency upgrades.

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, full period, good enough for keys,
/// PSNs and fault injection (not for cryptography).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    /// A generator for a sub-stream, so that adding draws in one place does not shift another.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}
