//! Transports that carry the engine's packets: kernel UDP sockets (unprivileged), and the
//! capture log every transport can write.

pub mod gso;
pub mod headers;
pub mod icrc_routine;
pub mod link;
pub mod pcap;
pub mod raw;
pub mod share;
#[allow(unsafe_code)]
pub mod sys;
pub mod udp;
pub mod udp_floor;
pub mod udp_mcast;

pub use link::{LinkStats, PacketRx, PacketTx};
pub use sys::{enter_netns, tcp_maxseg, wait_readable, RecvBatch, Waker};

/// Sends datagrams with one `sendmmsg` (the plain-UDP baseline uses it too).
pub fn send_batch(s: &std::net::UdpSocket, msgs: &[(std::net::SocketAddr, &[u8])]) -> std::io::Result<usize> {
    sys::send_batch(std::os::fd::AsRawFd::as_raw_fd(s), msgs)
}
