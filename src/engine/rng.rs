//! Where a device's random choices come from. A real device draws keys, QPNs and initial
//! PSNs from the OS CSPRNG, so that a peer cannot predict them (ReDMArk, USENIX Security
//! 2021). The simulator seeds SplitMix64 instead, so a seed reproduces every key, PSN and
//! fault exactly, across dependency upgrades.

/// A random source: the OS CSPRNG, or SplitMix64 from a seed (simulation and tests).
#[derive(Debug, Clone)]
pub struct Rng(Source);

#[derive(Debug, Clone)]
enum Source {
    /// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, full period; not for secrets.
    Seeded(u64),
    /// getrandom(2): every draw independent, none reveals another.
    Os,
}

impl Rng {
    /// A deterministic generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(Source::Seeded(seed))
    }
    /// The operating system's CSPRNG.
    pub fn os() -> Self {
        Rng(Source::Os)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        match &mut self.0 {
            Source::Seeded(state) => {
                *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = *state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            }
            // The OS CSPRNG does not fail on Linux once booted; if it ever did, no key may
            // be made from a weaker source, so this is a panic rather than a fallback.
            Source::Os => getrandom::u64().expect("the OS random number generator failed"),
        }
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
        match self.0 {
            Source::Seeded(_) => Rng::new(self.next_u64()),
            Source::Os => Rng::os(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn seeded_draws_repeat_and_os_draws_do_not() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        assert_eq!((a.next_u64(), a.next_u64()), (b.next_u64(), b.next_u64()));
        let mut os = Rng::os();
        let draws: std::collections::HashSet<u64> = (0..64).map(|_| os.next_u64()).collect();
        assert_eq!(draws.len(), 64, "64 OS draws are distinct");
    }
}
