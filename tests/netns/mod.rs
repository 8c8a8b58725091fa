//! The raw-Ethernet tests' stage: `softrdma::tools::netns::VethPair`, skipped without
//! root (and failing instead where `SOFTRDMA_REQUIRE_NETNS` is set, as `.ci/run` does).

#![allow(dead_code)]

pub use softrdma::tools::netns::VethPair;

/// Makes a pair or, without root, prints why the test is skipped and returns `None`.
/// Where `SOFTRDMA_REQUIRE_NETNS` is set (`.ci/run` sets it), a skip is a failure.
pub fn pair_or_skip(test: &str) -> Option<VethPair> {
    match VethPair::new() {
        Ok(p) => Some(p),
        Err(e) if std::env::var_os("SOFTRDMA_REQUIRE_NETNS").is_some() => panic!("{test}: {e}"),
        Err(e) => {
            eprintln!("{test}: skipped: {e}");
            None
        }
    }
}
