//! Driver loops: what runs a sans-I/O device on real I/O. One driver per device; the
//! verbs API (`crate::verbs`) calls into it and never touches a socket itself.
//!
//! - [`roce`]: a RoCEv2 [`crate::engine::Device`] on any [`crate::transport::PacketTx`] /
//!   [`crate::transport::PacketRx`] pair (kernel UDP sockets, or raw Ethernet frames).
//! - [`iwarp`]: what an iWARP device needs from a TCP stack ([`iwarp::IwarpPort`]) and the
//!   connection verbs built on it; [`iwarp_tcp`]: the device on kernel TCP sockets;
//!   [`iwarp_smol`]: on smoltcp's TCP over raw Ethernet.
//! - [`cq`]: the completion queues the application polls, shared by every driver.
//! - [`spin`]: how long a poll thread busy-polls after traffic, shared by every driver.

pub mod cq;
pub mod event;
pub mod iwarp;
pub mod iwarp_smol;
pub mod iwarp_tcp;
pub mod roce;
pub mod roce_cm;
pub mod spin;
