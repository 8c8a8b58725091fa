#![no_main]
//! Fuzz target: see `softrdma::fuzzing::iwarp_qp`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma::fuzzing::iwarp_qp(data));
