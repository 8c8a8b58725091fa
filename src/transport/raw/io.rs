//! The ways a raw device moves whole Ethernet frames, behind two small traits, so that
//! the device's logic (headers, ICRC, neighbours, ARP) is written once: a packet socket
//! (`AF_PACKET`) here, AF_XDP in [`super::xdp`].

use super::gso::{
    merge_udp_run, packet_sockets_carry_udp_gso, split_udp_gso, udp_gso_segment_bytes, udp_run_len, Segments,
    VNET_HDR_LEN,
};
use crate::transport::sys::{self, RecvBatch};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Each frame goes after a virtio-net header ([`packet_socket`] asks for them).
    vnet: bool,
    /// Runs of frames that can leave as one GSO send do ([`merge_udp_run`]), until the
    /// kernel refuses one.
    merge: AtomicBool,
}

/// A packet socket's receiving side. Each frame comes with a virtio-net header, so a GSO
/// send from a sender on this host (a veth peer's UDP socket) is split back into its
/// datagrams ([`super::gso`]) and reads as the frames a wire would carry.
pub struct PacketSocketRx {
    socket: Arc<OwnedFd>,
    batch: RecvBatch,
    vnet: bool,
    /// Frames split out of this batch's GSO sends.
    split: Segments,
    /// The batch's frames in order: the buffer each is (or was split from), and which
    /// split frame it is.
    order: Vec<(usize, Option<usize>)>,
    /// GSO sends split since the socket opened.
    gso_sends_split: u64,
}

/// Opens a packet socket on interface `ifindex` (promiscuous while open) and splits it.
/// Frames carry virtio-net headers where the kernel has them (`PACKET_VNET_HDR`); with
/// `merge`, runs of frames sent that can leave as one GSO send do (the raw device's own
/// frames; a bridge passing frames on sends them as they came).
pub fn packet_socket(ifindex: u32, merge: bool) -> io::Result<(PacketSocketTx, PacketSocketRx)> {
    let socket = Arc::new(sys::open_packet_socket(ifindex)?);
    sys::set_buffers(socket.as_raw_fd(), crate::transport::udp::SOCKET_BUFFER_BYTES);
    sys::set_packet_auxdata(socket.as_raw_fd())?;
    let vnet = sys::set_packet_vnet_hdr(socket.as_raw_fd()).is_ok();
    let rx = PacketSocketRx {
        socket: socket.clone(),
        batch: RecvBatch::new(RX_BATCH, RX_FRAME_MAX + VNET_HDR_LEN),
        vnet,
        split: Segments::default(),
        order: Vec::with_capacity(RX_BATCH),
        gso_sends_split: 0,
    };
    let merge = merge && vnet && packet_sockets_carry_udp_gso();
    Ok((PacketSocketTx { socket, vnet, merge: AtomicBool::new(merge) }, rx))
}

/// Sends `frames` on packet socket `fd`, waiting for room while the link is busy; returns
/// which the kernel refused. `vnet`: the socket wants a virtio-net header before each
/// frame, `vnet[i]` before frame `i` (all-zero after the last given).
pub(crate) fn send_all(fd: RawFd, frames: &[&[u8]], vnet: Option<&[[u8; VNET_HDR_LEN]]>) -> Vec<usize> {
    let mut refused = Vec::new();
    let mut sent = 0;
    while sent < frames.len() {
        let end = (sent + TX_BATCH).min(frames.len());
        let hdrs = vnet.map(|h| h.get(sent..end.min(h.len())).unwrap_or_default());
        match sys::send_frames(fd, &frames[sent..end], hdrs) {
            Ok(n) => sent += n.max(1),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = sys::wait_writable(fd);
            }
            Err(_) => {
                refused.push(sent);
                sent += 1;
            }
        }
    }
    refused
}

/// A run of frames to send as one message: `count` frames from `first`, merged into
/// `merged` after header `vnet` when there are several.
struct Run {
    first: usize,
    count: usize,
    vnet: [u8; VNET_HDR_LEN],
    merged: Vec<u8>,
}

/// `frames` cut into runs, each one that can leave as one GSO send merged
/// ([`merge_udp_run`]), the others one frame each.
fn merge_runs(frames: &[&[u8]]) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut first = 0;
    while first < frames.len() {
        let count = udp_run_len(&frames[first..]).max(1);
        let mut run = Run { first, count, vnet: [0; VNET_HDR_LEN], merged: Vec::new() };
        if count >= 2 {
            run.vnet = merge_udp_run(&frames[first..first + count], &mut run.merged);
        }
        runs.push(run);
        first += count;
    }
    runs
}

impl PacketSocketRx {
    /// GSO sends this socket has split into frames since it opened.
    pub fn gso_sends_split(&self) -> u64 {
        self.gso_sends_split
    }
}

impl PacketSocketTx {
    /// True if each frame goes after a virtio-net header.
    pub fn vnet(&self) -> bool {
        self.vnet
    }
}

impl FrameTx for PacketSocketTx {
    fn send(&self, frames: &[Vec<u8>]) -> usize {
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let fd = self.socket.as_raw_fd();
        if !(self.vnet && self.merge.load(Ordering::Relaxed)) {
            return send_all(fd, &refs, self.vnet.then_some(&[][..])).len();
        }
        let runs = merge_runs(&refs);
        let out: Vec<&[u8]> = runs.iter().map(|r| if r.count >= 2 { &r.merged[..] } else { refs[r.first] }).collect();
        let hdrs: Vec<[u8; VNET_HDR_LEN]> = runs.iter().map(|r| r.vnet).collect();
        let refused = send_all(fd, &out, Some(&hdrs));
        let merged_refused: Vec<&Run> = refused.iter().map(|&k| &runs[k]).filter(|r| r.count >= 2).collect();
        if merged_refused.is_empty() {
            return refused.len();
        }
        // The kernel took no GSO send (one without UDP GSO in its virtio-net header, before
        // Linux 6.2, says EINVAL): frames go one by one from now on, these ones too.
        self.merge.store(false, Ordering::Relaxed);
        let again: Vec<&[u8]> =
            merged_refused.iter().flat_map(|r| refs[r.first..r.first + r.count].iter().copied()).collect();
        refused.len() - merged_refused.len() + send_all(fd, &again, Some(&[])).len()
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
        let n = self.batch.recv(self.socket.as_raw_fd())?;
        self.split.clear();
        self.order.clear();
        for i in 0..n {
            let split_from = self.split.len();
            let made = match self.batch.get(i) {
                Some((data, _, _)) if self.vnet && data.len() >= VNET_HDR_LEN => {
                    let (vnet, frame) = data.split_at(VNET_HDR_LEN);
                    udp_gso_segment_bytes(vnet).map_or(0, |size| split_udp_gso(frame, size, &mut self.split))
                }
                _ => 0,
            };
            match made {
                0 => self.order.push((i, None)),
                _ => {
                    self.gso_sends_split += 1;
                    self.order.extend((split_from..split_from + made).map(|k| (i, Some(k))));
                }
            }
        }
        Ok(self.order.len())
    }

    fn frame(&self, i: usize) -> Option<&[u8]> {
        match *self.order.get(i)? {
            (_, Some(k)) => self.split.get(k),
            (j, None) => {
                let data = self.batch.get(j)?.0;
                // A frame shorter than its header is malformed; it reads as empty.
                Some(if self.vnet { data.get(VNET_HDR_LEN..).unwrap_or_default() } else { data })
            }
        }
    }

    fn checksum_partial(&self, i: usize) -> bool {
        // A split frame's checksum is partial as its sender left the whole one.
        self.order.get(i).is_some_and(|&(j, k)| k.is_some() || self.batch.checksum_partial(j))
    }

    fn timestamp_ns(&self, i: usize) -> Option<u64> {
        self.batch.timestamp_ns(self.order.get(i)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;

    /// Frames as a raw device sends them: IPv4 UDP to one peer, Identifications counting up.
    fn run_of(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|k| {
                let mut f = Vec::new();
                etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
                    .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
                    .udp(0xc000, 4791)
                    .write(&mut f, &[k as u8; 100])
                    .unwrap();
                f[18..20].copy_from_slice(&(k as u16).to_be_bytes());
                f
            })
            .collect()
    }

    #[test]
    fn a_refused_gso_send_stops_merging_and_its_frames_go_again_one_by_one() {
        // A socket that takes no frame at all (a UDP socket with nowhere to send): every
        // message is refused, so every frame counts as lost once, merged or not.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = PacketSocketTx { socket: Arc::new(OwnedFd::from(udp)), vnet: true, merge: AtomicBool::new(true) };
        let mut frames = run_of(5);
        frames.push(vec![0; 60]);
        assert_eq!(tx.send(&frames), 6, "each frame counted once");
        assert!(!tx.merge.load(Ordering::Relaxed), "no more merging after a refusal");
        assert_eq!(tx.send(&frames), 6);
    }
}
