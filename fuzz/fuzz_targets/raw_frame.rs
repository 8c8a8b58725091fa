#![no_main]
//! Fuzz target: see `softrdma::fuzzing::raw_frame`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma::fuzzing::raw_frame(data));
