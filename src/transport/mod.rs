//! Transports that carry the engine's packets: kernel UDP sockets (unprivileged), and the
//! capture log every transport can write.

pub mod pcap;
mod sys;
pub mod udp;

pub use sys::{wait_readable, Waker};
