//! A packet socket on one interface: whole Ethernet frames in and out. The raw device
//! moves its frames through one; tests, and tools that forge or watch traffic, use it
//! directly.

use super::super::sys;
use super::io::{packet_socket, FrameRx, PacketSocketRx};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Largest frame read: a 9000-byte jumbo MTU, Ethernet and one VLAN tag.
pub const FRAME_MAX: usize = 9000 + 18;

/// A bound `AF_PACKET` socket (promiscuous while open; its own frames not seen). A GSO send
/// from a sender on this host reads as the frames a wire would carry ([`PacketSocketRx`]).
pub struct FrameSocket {
    rx: PacketSocketRx,
    vnet: bool,
    received: usize,
    next: usize,
}

impl FrameSocket {
    /// Opens a packet socket on interface `iface` (needs CAP_NET_RAW).
    pub fn open(iface: &str) -> io::Result<FrameSocket> {
        let (ifindex, _) = sys::interface_info(iface)?;
        let (tx, rx) = packet_socket(ifindex, false)?;
        Ok(FrameSocket { rx, vnet: tx.vnet(), received: 0, next: 0 })
    }

    /// Sends one whole frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            match sys::send_frames(self.as_raw_fd(), &[frame], self.vnet.then_some(&[][..])) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    sys::wait_writable(self.as_raw_fd())?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// GSO sends from this host read as frames since the socket opened.
    pub fn gso_sends_split(&self) -> u64 {
        self.rx.gso_sends_split()
    }

    /// The next frame received, waiting at most `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Option<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.next < self.received {
                self.next += 1;
                return Ok(Some(self.rx.frame(self.next - 1).unwrap_or_default().to_vec()));
            }
            self.next = 0;
            self.received = self.rx.recv()?;
            if self.received > 0 {
                continue;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return Ok(None) };
            sys::wait_readable(&[self.as_raw_fd()], Some(left))?;
        }
    }
}

impl AsRawFd for FrameSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.rx.fd()
    }
}
