//! The swarm: 2,000 seeds of random workloads under random faults, every invariant checked
//! after every step (see `softrdma::sim::swarm`). Split in four so they run in parallel.
//! A failure prints `reproduce with: softrdma sim --seed N`.

fn seeds(range: std::ops::Range<u64>) {
    for seed in range {
        if let Err(f) = softrdma::sim::swarm::run(seed) {
            panic!("{f}");
        }
    }
}

#[test]
fn swarm_seeds_0_to_500() {
    seeds(0..500);
}

#[test]
fn swarm_seeds_500_to_1000() {
    seeds(500..1000);
}

#[test]
fn swarm_seeds_1000_to_1500() {
    seeds(1000..1500);
}

#[test]
fn swarm_seeds_1500_to_2000() {
    seeds(1500..2000);
}

#[test]
fn every_fault_kind_is_drawn_across_the_seeds() {
    let mut seen = [0u32; 7];
    for seed in 0..2000u64 {
        // As `swarm::run` does: the seed's first draws pick its faults.
        let f = softrdma::sim::swarm::pick_faults(&mut softrdma::engine::rng::Rng::new(seed));
        let on = [
            f.loss > 0.0,
            f.duplicate > 0.0,
            f.reorder > 0.0,
            f.corrupt > 0.0,
            f.rate_bytes_per_us.is_some(),
            f.partition.is_some(),
            f.delay_ns.1 > f.delay_ns.0,
        ];
        for (i, o) in on.iter().enumerate() {
            seen[i] += u32::from(*o);
        }
    }
    assert!(seen.iter().all(|&n| n > 300), "{seen:?}");
}
