//! softrdma wire formats: every header the engine speaks, exact to the byte.
//!
//! * RoCEv2 (IBTA vol.1 ch. 9, Annex A17): [`roce`] — BTH, the extended transport headers,
//!   the opcode table, PSN arithmetic and the ICRC.
//! * iWARP: [`iwarp`] — MPA (RFC 5044, RFC 6581), DDP (RFC 5041), RDMAP (RFC 5040).
//! * InfiniBand CM MADs as rdma_cm sends them over RoCE (IBTA ch. 12): [`cm`].
//!
//! Each header has a checked zero-copy view over a byte buffer (`new_checked` validates the
//! length once, so accessors never panic) and a small owned `Repr` with `parse` and `emit`.
//! The crate does no I/O, no allocation and no `unsafe`, and builds with `no_std`.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

pub mod cm;
pub mod crc;
mod error;
pub mod iwarp;
pub mod roce;
mod wire;

pub use error::{Error, Result};
