#![no_main]
//! Fuzz target: see `softrdma::fuzzing::roce_device`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma::fuzzing::roce_device(data));
