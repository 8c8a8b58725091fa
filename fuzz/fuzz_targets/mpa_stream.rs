#![no_main]
//! Fuzz target: see `softrdma::fuzzing::mpa_stream`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma::fuzzing::mpa_stream(data));
