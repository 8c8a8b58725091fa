#![no_main]
//! Fuzz target: see `softrdma::fuzzing::cm_mad`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma::fuzzing::cm_mad(data));
