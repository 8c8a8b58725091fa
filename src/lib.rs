//! softrdma: a complete RDMA engine in software, speaking RoCEv2 and iWARP.
//!
//! This crate holds the engine, its transports and the `softrdma` command-line tools. The
//! wire formats live in the [`softrdma_proto`] crate, re-exported here as [`proto`].

// Every `unsafe` block lives in `transport::sys` or `transport::raw::xdp::sys` (AF_XDP's
// shared memory and bpf(2)), the two modules allowed it.
#![deny(unsafe_code)]

pub use softrdma_proto as proto;

pub mod capture;
pub mod cm;
pub mod conform;
pub mod driver;
pub mod engine;
pub mod fuzzing;
pub mod inject;
pub mod iwarp;
pub mod sim;
pub mod tools;
pub mod transport;
pub mod verbs;
