//! iWARP on a byte stream: MPA connection setup (RFC 5044 §7, RFC 6581), and FPDU framing
//! and deframing (RFC 5044 §4-5).

pub mod deframer;
pub mod framer;
pub mod qp;
pub mod setup;
