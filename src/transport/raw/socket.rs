//! A packet socket on one interface: whole Ethernet frames in and out. The raw device
//! moves its frames through one; tests, and tools that forge or watch traffic, use it
//! directly.

use super::super::sys::{self, RecvBatch};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Frames read per system call.
const BATCH: usize = 32;
/// Largest frame read: a 9000-byte jumbo MTU, Ethernet and one VLAN tag.
pub const FRAME_MAX: usize = 9000 + 18;

/// A bound `AF_PACKET` socket (promiscuous while open; its own frames not seen).
pub struct FrameSocket {
    fd: OwnedFd,
    batch: RecvBatch,
    next: usize,
}

impl FrameSocket {
    /// Opens a packet socket on interface `iface` (needs CAP_NET_RAW).
    pub fn open(iface: &str) -> io::Result<FrameSocket> {
        let (ifindex, _) = sys::interface_info(iface)?;
        let fd = sys::open_packet_socket(ifindex)?;
        Ok(FrameSocket { fd, batch: RecvBatch::new(BATCH, FRAME_MAX), next: 0 })
    }

    /// Sends one whole frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            match sys::send_frames(self.fd.as_raw_fd(), &[frame]) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    sys::wait_writable(self.fd.as_raw_fd())?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The next frame received, waiting at most `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Option<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((frame, _, _)) = self.batch.get(self.next) {
                self.next += 1;
                return Ok(Some(frame.to_vec()));
            }
            self.next = 0;
            if self.batch.recv(self.fd.as_raw_fd())? > 0 {
                continue;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return Ok(None) };
            sys::wait_readable(&[self.fd.as_raw_fd()], Some(left))?;
        }
    }
}

impl AsRawFd for FrameSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
