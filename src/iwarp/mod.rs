//! iWARP on a byte stream: MPA connection setup (RFC 5044 §7, RFC 6581), FPDU framing
//! and deframing (RFC 5044 §4-5), the QP on an established stream, and the device that
//! holds QPs, connections and listeners (all sans-I/O).

pub mod config;
pub mod deframer;
pub mod device;
pub mod framer;
pub mod qp;
pub mod setup;
pub mod txqueue;
