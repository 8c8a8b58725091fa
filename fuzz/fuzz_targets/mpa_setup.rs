#![no_main]
//! Fuzz target: see `softrdma::fuzzing::mpa_setup`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma::fuzzing::mpa_setup(data));
