//! The ways a raw device moves whole Ethernet frames, behind two small traits, so that
//! the device's logic (headers, ICRC, neighbours, ARP) is written once: a packet socket
//! (`AF_PACKET`) here, AF_XDP in [`super::xdp`].

use crate::transport::sys::{self, RecvBatch};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Sends batches of frames. Shared: the device's sending half and its receiving half
/// (which answers ARP and echo requests) both send.
pub trait FrameTx: Send + Sync {
    /// Sends every frame, waiting for room if the link is busy; returns how many the
    /// kernel refused (each is lost, as on a wire).
    fn send(&self, frames: &[Vec<u8>]) -> usize;
    /// How frames move, for people (e.g. "AF_PACKET").
    fn describe(&self) -> String;
}

/// Receives batches of frames.
pub trait FrameRx: Send {
    /// The descriptor that becomes readable when frames may be waiting.
    fn fd(&self) -> RawFd;
    /// Reads what is waiting (up to one batch) without blocking; returns the count. The
    /// frames of the previous batch are given back first.
    fn recv(&mut self) -> io::Result<usize>;
    /// Frame `i` of the last batch.
    fn frame(&self, i: usize) -> Option<&[u8]>;
    /// True if frame `i` came from a sender on this host with its TCP or UDP checksum
    /// left partial for offload (only a packet socket can tell).
    fn checksum_partial(&self, _i: usize) -> bool {
        false
    }
    /// When the kernel received frame `i` (ns since the Unix epoch), if it was asked to say.
    fn timestamp_ns(&self, _i: usize) -> Option<u64> {
        None
    }
}

/// A link, opened: both ways of moving frames and the interface's MTU (IP bytes).
pub struct Frames {
    /// Sending.
    pub tx: Arc<dyn FrameTx>,
    /// Receiving.
    pub rx: Box<dyn FrameRx>,
    /// The interface's MTU.
    pub mtu: usize,
}

/// Frames read per `recvmmsg`.
const RX_BATCH: usize = 32;
/// Largest frame accepted: an IP packet of 64 KiB, Ethernet and one VLAN tag. Links are
/// 1500 or 9000 bytes, but a sender on this host (a veth peer) hands over unsegmented
/// GSO packets of up to 64 KiB, which a shorter buffer would cut.
const RX_FRAME_MAX: usize = 65535 + 18;
/// Frames sent per `sendmmsg`.
const TX_BATCH: usize = 32;

/// A packet socket's sending side.
pub struct PacketSocketTx {
    socket: Arc<OwnedFd>,
}

/// A packet socket's receiving side.
pub struct PacketSocketRx {
    socket: Arc<OwnedFd>,
    batch: RecvBatch,
}

/// Opens a packet socket on interface `ifindex` (promiscuous while open) and splits it.
pub fn packet_socket(ifindex: u32) -> io::Result<(PacketSocketTx, PacketSocketRx)> {
    let socket = Arc::new(sys::open_packet_socket(ifindex)?);
    sys::set_buffers(socket.as_raw_fd(), crate::transport::udp::SOCKET_BUFFER_BYTES);
    sys::set_packet_auxdata(socket.as_raw_fd())?;
    let rx = PacketSocketRx { socket: socket.clone(), batch: RecvBatch::new(RX_BATCH, RX_FRAME_MAX) };
    Ok((PacketSocketTx { socket }, rx))
}

impl FrameTx for PacketSocketTx {
    fn send(&self, frames: &[Vec<u8>]) -> usize {
        let fd = self.socket.as_raw_fd();
        let mut refused = 0;
        for chunk in frames.chunks(TX_BATCH) {
            let refs: Vec<&[u8]> = chunk.iter().map(|f| &f[..]).collect();
            let mut sent = 0;
            while sent < refs.len() {
                match sys::send_frames(fd, &refs[sent..]) {
                    Ok(n) => sent += n.max(1),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let _ = sys::wait_writable(fd);
                    }
                    Err(_) => {
                        refused += 1;
                        sent += 1;
                    }
                }
            }
        }
        refused
    }

    fn describe(&self) -> String {
        "AF_PACKET".into()
    }
}

impl FrameRx for PacketSocketRx {
    fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    fn recv(&mut self) -> io::Result<usize> {
        self.batch.recv(self.socket.as_raw_fd())
    }

    fn frame(&self, i: usize) -> Option<&[u8]> {
        self.batch.get(i).map(|(f, _, _)| f)
    }

    fn checksum_partial(&self, i: usize) -> bool {
        self.batch.checksum_partial(i)
    }

    fn timestamp_ns(&self, i: usize) -> Option<u64> {
        self.batch.timestamp_ns(i)
    }
}
