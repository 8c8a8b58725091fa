//! The iWARP swarm (`softrdma::sim::iwarp`): two sans-I/O iWARP devices over a simulated
//! TCP stream cut at random, random MPA settings, random Sends, Writes and Reads both ways,
//! across many seeds; every request completes once and every byte lands where it should.

#[test]
fn iwarp_swarm_seeds_0_to_300() {
    let mut failures = Vec::new();
    let mut total = softrdma::sim::iwarp::IwarpReport::default();
    for seed in 0..300 {
        match softrdma::sim::iwarp::run(seed) {
            Ok(r) => {
                total.completions += r.completions;
                total.bytes += r.bytes;
                total.turns += r.turns;
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{} failing seeds, first: {:?}", failures.len(), failures.first());
    assert!(total.completions > 300 * 10, "{total:?}");
}
