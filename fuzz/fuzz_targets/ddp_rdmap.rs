#![no_main]
//! Fuzz target: see `softrdma::fuzzing::ddp_rdmap`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma::fuzzing::ddp_rdmap(data));
