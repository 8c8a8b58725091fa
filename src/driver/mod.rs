//! Driver loops: what runs a sans-I/O device on real I/O. One driver per device; the
//! verbs API (`crate::verbs`) calls into it and never touches a socket itself.
//!
//! - [`roce`]: a RoCEv2 [`crate::engine::Device`] on any [`crate::transport::PacketTx`] /
//!   [`crate::transport::PacketRx`] pair (kernel UDP sockets, or raw Ethernet frames).
//! - [`cq`]: the completion queues the application polls, shared by both drivers.

pub mod cq;
pub mod roce;
