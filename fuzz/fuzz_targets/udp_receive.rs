#![no_main]
//! Fuzz target: see `softrdma::fuzzing::udp_receive`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma::fuzzing::udp_receive(data));
