//! AF_XDP frame I/O for the raw device (Documentation/networking/af_xdp.rst): an XDP
//! program on the interface hands the device's frames (and only those, see `program.rs`)
//! to an AF_XDP socket bound to queue 0; frames leave through the same socket's TX ring.
//!
//! One UMEM of [`CHUNKS`] chunks of [`CHUNK_SIZE`] bytes: half live on the fill ring for
//! the kernel to receive into, half are for sending. Received frames are read in place (a
//! batch at a time, their chunks going back to the fill ring at the next read); frames to
//! send are copied into a free chunk, posted on the TX ring, and their chunks come back
//! through the completion ring. In copy mode, where the kernel sends inside `sendto`,
//! batches of more than a couple of frames are sent by a TX thread of the device's own
//! (`TxThread`), so that the kernel's work runs beside the engine's rather than after it
//! (not on a machine with one CPU, where it could not).
//!
//! Everything the kernel holds for the device is owned by a descriptor: the socket, the
//! XSKMAP, the program and the BPF link that attaches it. Nothing is pinned, so when the
//! device closes, or the process dies, the kernel detaches the program and frees the rest.

mod program;
#[allow(unsafe_code)]
mod sys;

use super::io::{FrameRx, FrameTx};
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use sys::{Chunk, CompletionRing, FillRing, RxFrame, RxRing, TxRing, TxWatch, Umem};

pub use sys::CHUNK_SIZE;

/// Chunks in the UMEM (16 MiB): half to receive into, half to send from.
pub const CHUNKS: u32 = 4096;
/// Entries in each ring: the fill ring holds every receive chunk, the TX ring every send
/// chunk, so neither ever refuses a chunk its owner holds.
const RING_SIZE: u32 = CHUNKS / 2;
/// Where the kernel puts a received frame in its chunk (`XDP_PACKET_HEADROOM`,
/// linux/bpf.h): room for an XDP program to grow headers into.
const XDP_PACKET_HEADROOM: usize = 256;
/// The largest frame, received or sent: what fits a chunk after that headroom.
pub const FRAME_MAX: usize = CHUNK_SIZE - XDP_PACKET_HEADROOM;
/// Frames taken off the RX ring per read.
const RX_BATCH: usize = 32;
/// Frames posted on the TX ring per wakeup.
const TX_BATCH: usize = 32;
/// XSKMAP slots: the program looks up the frame's queue; only queue 0 has a socket, so
/// the device's frames that arrive on other queues go to the kernel (which drops them).
const XSKMAP_SLOTS: u32 = 64;
/// The send buffer: in copy mode every frame in flight is an skb charged to it.
const SEND_BUFFER_BYTES: usize = 32 << 20;
/// The longest a send waits without progress (no chunk coming back, the device not
/// taking frames) before it refuses what is left, so that a stuck link never hangs it.
const TX_STALL: Duration = Duration::from_millis(10);
/// Copy mode: a send that leaves at most this many frames queued sends them itself (a
/// request, a reply: no hand-over on the latency path); more go to the TX thread.
const INLINE_SEND_MAX: u32 = 2;

/// How the AF_XDP path runs on the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpMode {
    /// The driver reads and writes the UMEM itself (`XDP_ZEROCOPY`); else the kernel
    /// copies each frame (`XDP_COPY`).
    pub zero_copy: bool,
    /// The program runs in the driver (native XDP); else on the kernel's skb path
    /// (generic XDP, which every interface has).
    pub native: bool,
}

impl fmt::Display for XdpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let copy = if self.zero_copy { "zero-copy" } else { "copy mode" };
        let xdp = if self.native { "native XDP" } else { "generic XDP" };
        write!(f, "AF_XDP, {copy}, {xdp}")
    }
}

/// What both halves share. Fields drop in order: the link first (the program leaves the
/// interface before the socket it redirects to closes), the UMEM last.
struct Shared {
    _link: OwnedFd,
    _program: OwnedFd,
    _xskmap: OwnedFd,
    socket: OwnedFd,
    _promiscuous: OwnedFd,
    umem: Umem,
    mode: XdpMode,
}

/// The sending half: the TX and completion rings and the free send chunks, behind a
/// lock, since the device sends from its poll thread (replies) and from the
/// application's (requests). In copy mode, a TX thread of its own.
pub struct XdpTx {
    shared: Arc<Shared>,
    side: Mutex<TxSide>,
    tx_thread: Option<TxThread>,
}

/// Copy mode's TX thread. There the kernel sends inside `sendto` on the caller's CPU, and
/// on a veth it also runs the peer's receive path there (XDP, the copy into the peer's
/// UMEM, its wakeup): the device's poll thread would spend most of its time in the
/// kernel. Handing large batches to this thread lets the engine go on building frames
/// on one CPU while the kernel sends on another, as a NIC's TX queue runs beside its
/// driver. (The poll thread still sends some: in copy mode a `poll` of the socket sends
/// what the TX ring holds, net/xdp/xsk.c xsk_poll. Measured on a veth pair, that help is
/// worth more than the lock it shares with this thread: a second socket for sending
/// alone, sharing the UMEM, was slower.)
struct TxThread {
    handle: JoinHandle<()>,
    state: Arc<TxThreadState>,
}

#[derive(Default)]
struct TxThreadState {
    stop: AtomicBool,
    /// Awake and sending: frames queued now go out without a wakeup, and a sender calling
    /// `sendto` itself would only wait for the socket's lock, which the thread holds.
    busy: AtomicBool,
}

struct TxSide {
    tx: TxRing,
    completion: CompletionRing,
    free: Vec<Chunk>,
}

/// The receiving half: the fill and RX rings, the last batch and the chunks not yet
/// back on the fill ring.
pub struct XdpRx {
    shared: Arc<Shared>,
    fill: FillRing,
    rx: RxRing,
    batch: Vec<RxFrame>,
    spare: Vec<Chunk>,
}

fn context(what: &'static str) -> impl Fn(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Opens the AF_XDP path of a device at `ip` on interface `ifindex`: socket, UMEM and
/// rings, bound to queue 0, and the program that sends it the device's frames, attached.
pub fn open(ifindex: u32, ip: IpAddr) -> io::Result<(XdpTx, XdpRx)> {
    let promiscuous = sys::promiscuous(ifindex).map_err(context("promiscuous membership"))?;
    let (umem, mut receive_chunks) = Umem::new(CHUNKS).map_err(context("UMEM"))?;
    let send_chunks = receive_chunks.split_off(RING_SIZE as usize);
    let (socket, rings) = sys::xdp_socket(&umem, RING_SIZE).map_err(context("AF_XDP socket"))?;
    let zero_copy = bind(&socket, ifindex)?;
    sys::set_send_buffer(socket.as_raw_fd(), SEND_BUFFER_BYTES);
    let sys::Rings { mut fill, completion, rx, tx } = rings;
    fill.give(&mut receive_chunks);
    if fill.needs_wakeup() {
        sys::kick_rx(socket.as_raw_fd());
    }
    let xskmap = sys::xskmap(XSKMAP_SLOTS).map_err(context("XSKMAP"))?;
    sys::xskmap_set(xskmap.as_raw_fd(), 0, socket.as_raw_fd()).map_err(context("XSKMAP entry"))?;
    let insns = program::build(ip, xskmap.as_raw_fd());
    let prog = sys::load_xdp(&insns, "softrdma_dev").map_err(context("loading the XDP program"))?;
    let (link, native) = attach(&prog, ifindex)?;
    let mode = XdpMode { zero_copy, native };
    let shared = Arc::new(Shared {
        _link: link,
        _program: prog,
        _xskmap: xskmap,
        socket,
        _promiscuous: promiscuous,
        umem,
        mode,
    });
    // On one CPU the thread could only run instead of the engine, never beside it, and
    // each batch handed over would cost two context switches.
    let one_cpu = std::thread::available_parallelism().map_or(true, |n| n.get() == 1);
    let tx_thread = if zero_copy || one_cpu { None } else { Some(TxThread::start(shared.clone(), tx.watch())?) };
    let side = Mutex::new(TxSide { tx, completion, free: send_chunks });
    let rx = XdpRx { shared: shared.clone(), fill, rx, batch: Vec::with_capacity(RX_BATCH), spare: Vec::new() };
    Ok((XdpTx { shared, side, tx_thread }, rx))
}

/// Binds to queue 0 with `XDP_USE_NEED_WAKEUP`, zero-copy if the driver can, else in copy
/// mode (af_xdp.rst, "XDP_COPY and XDP_ZEROCOPY bind flags": a forced zero-copy bind
/// fails where the driver lacks it, and the socket can be bound again). Returns whether
/// zero-copy.
fn bind(socket: &OwnedFd, ifindex: u32) -> io::Result<bool> {
    let fd = socket.as_raw_fd();
    let wakeup = libc::XDP_USE_NEED_WAKEUP;
    match sys::bind(fd, ifindex, 0, wakeup | libc::XDP_ZEROCOPY) {
        Ok(()) => return Ok(sys::is_zero_copy(fd)),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            let why = "queue 0 already has an AF_XDP socket (one XDP raw device per interface)";
            return Err(io::Error::new(e.kind(), format!("binding the AF_XDP socket: {why}: {e}")));
        }
        Err(_) => {}
    }
    sys::bind(fd, ifindex, 0, wakeup | libc::XDP_COPY).map_err(context("binding the AF_XDP socket"))?;
    Ok(false)
}

/// Attaches the program through a BPF link: native XDP if the driver has it, else
/// generic. Returns the link and whether native.
fn attach(prog: &OwnedFd, ifindex: u32) -> io::Result<(OwnedFd, bool)> {
    let native = match sys::link_xdp(prog.as_raw_fd(), ifindex, sys::XDP_FLAGS_DRV_MODE) {
        Ok(link) => return Ok((link, true)),
        Err(e) => e,
    };
    match sys::link_xdp(prog.as_raw_fd(), ifindex, sys::XDP_FLAGS_SKB_MODE) {
        Ok(link) => Ok((link, false)),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("attaching the XDP program: native: {native}; generic: {e} (another XDP program there?)"),
        )),
    }
}

impl TxThread {
    fn start(shared: Arc<Shared>, watch: TxWatch) -> io::Result<TxThread> {
        let state = Arc::new(TxThreadState::default());
        let theirs = state.clone();
        let handle = std::thread::Builder::new()
            .name("softrdma-xdp-tx".into())
            .spawn(move || copy_mode_sender(&shared, &watch, &theirs))?;
        Ok(TxThread { handle, state })
    }

    fn is_busy(&self) -> bool {
        self.state.busy.load(Ordering::Acquire)
    }

    /// Wakes the thread: there is something to send.
    fn wake(&self) {
        self.handle.thread().unpark();
    }
}

/// The TX thread: `sendto` while the TX ring holds frames (the kernel sends at most 32 a
/// call), sleeping when it is empty until a sender wakes it. A sender publishes its frames
/// before waking it, and a wake that comes between the check and the sleep is kept by
/// `park`, so nothing queued is left unsent.
fn copy_mode_sender(shared: &Shared, watch: &TxWatch, state: &TxThreadState) {
    let fd = shared.socket.as_raw_fd();
    while !state.stop.load(Ordering::Acquire) {
        let left = watch.unconsumed();
        if left == 0 {
            state.busy.store(false, Ordering::Release);
            std::thread::park();
            state.busy.store(true, Ordering::Release);
            continue;
        }
        match sys::kick_tx(fd) {
            // EAGAIN: more wait, or the device is busy; EBUSY: it dropped a frame.
            Err(e) if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                // The link is down or the socket broken: try again later, not in a loop.
                std::thread::park_timeout(TX_STALL);
            }
            _ if watch.unconsumed() >= left => std::thread::sleep(Duration::from_micros(20)),
            _ => {}
        }
    }
}

impl Drop for XdpTx {
    fn drop(&mut self) {
        if let Some(t) = self.tx_thread.take() {
            t.state.stop.store(true, Ordering::Release);
            t.wake();
            let _ = t.handle.join();
        }
    }
}

impl XdpTx {
    /// How the path runs.
    pub fn mode(&self) -> XdpMode {
        self.shared.mode
    }

    /// A free send chunk (with room on the TX ring for it): one reclaimed from the
    /// completion ring if none is free, else, after sending what is queued, waiting for
    /// one; `None` once nothing has come back for [`TX_STALL`].
    fn free_chunk(&self, side: &mut TxSide) -> Option<Chunk> {
        let mut stalled_since = None;
        loop {
            if side.free.is_empty() {
                side.completion.take(&self.shared.umem, &mut side.free);
            }
            if !side.free.is_empty() && side.tx.has_room() {
                return side.free.pop();
            }
            let since = *stalled_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= TX_STALL {
                return None;
            }
            side.tx.submit();
            match &self.tx_thread {
                Some(t) => t.wake(),
                None => self.kick(side),
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Has what was submitted sent: by the TX thread if there is one and it is sending
    /// already or more than a few frames wait, else here.
    fn send_queued(&self, side: &TxSide) {
        match &self.tx_thread {
            Some(t) if t.is_busy() || side.tx.unconsumed() > INLINE_SEND_MAX => t.wake(),
            _ => self.kick(side),
        }
    }

    /// Has the kernel send what the TX ring holds. Zero-copy: a `sendto` when the ring
    /// asks for one (af_xdp.rst, "XDP_USE_NEED_WAKEUP bind flag"). Copy mode: the kernel
    /// sends inside `sendto`, at most 32 frames a call (net/xdp/xsk.c, TX_BATCH_SIZE),
    /// saying EAGAIN while more wait or the device is busy, so call until the ring is
    /// empty, giving up after [`TX_STALL`] without progress (the frames stay queued for
    /// the next call).
    fn kick(&self, side: &TxSide) {
        let fd = self.shared.socket.as_raw_fd();
        if self.shared.mode.zero_copy {
            if side.tx.needs_wakeup() {
                let _ = sys::kick_tx(fd);
            }
            return;
        }
        let mut left = side.tx.unconsumed();
        let mut stalled_since: Option<Instant> = None;
        while left > 0 {
            match sys::kick_tx(fd) {
                // EBUSY: the device dropped a frame (gone, as on a wire; its chunk completes).
                Err(e) if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => return,
                _ => {}
            }
            let now_left = side.tx.unconsumed();
            if now_left < left {
                stalled_since = None;
            } else if stalled_since.get_or_insert_with(Instant::now).elapsed() >= TX_STALL {
                return;
            } else {
                std::thread::yield_now();
            }
            left = now_left;
        }
    }
}

impl FrameTx for XdpTx {
    fn send(&self, frames: &[Vec<u8>]) -> usize {
        let mut side = self.side.lock().unwrap_or_else(|e| e.into_inner());
        let mut refused = 0;
        let mut posted = 0;
        let mut stuck = false;
        for frame in frames {
            let chunk = if frame.len() > FRAME_MAX || stuck { None } else { self.free_chunk(&mut side) };
            let Some(mut chunk) = chunk else {
                // Too big for a chunk, or no chunk came back: lost, as on a wire. Once stuck,
                // the rest of the batch does not wait again.
                stuck |= frame.len() <= FRAME_MAX;
                refused += 1;
                continue;
            };
            let len = self.shared.umem.write(&mut chunk, frame);
            side.tx.push(chunk, len);
            posted += 1;
            if posted == TX_BATCH {
                side.tx.submit();
                self.send_queued(&side);
                posted = 0;
            }
        }
        if posted > 0 {
            side.tx.submit();
            self.send_queued(&side);
        }
        refused
    }

    fn describe(&self) -> String {
        self.shared.mode.to_string()
    }
}

impl FrameRx for XdpRx {
    fn fd(&self) -> RawFd {
        self.shared.socket.as_raw_fd()
    }

    /// Gives the last batch's chunks back to the fill ring (af_xdp.rst, "UMEM Fill
    /// Ring"), waking the kernel if it asks (af_xdp.rst, "XDP_USE_NEED_WAKEUP bind
    /// flag"), then takes up to a batch off the RX ring.
    fn recv(&mut self) -> io::Result<usize> {
        self.spare.extend(self.batch.drain(..).map(RxFrame::into_chunk));
        if !self.spare.is_empty() {
            self.fill.give(&mut self.spare);
            if self.fill.needs_wakeup() {
                sys::kick_rx(self.shared.socket.as_raw_fd());
            }
        }
        self.rx.take(&self.shared.umem, RX_BATCH, &mut self.batch);
        Ok(self.batch.len())
    }

    fn frame(&self, i: usize) -> Option<&[u8]> {
        self.batch.get(i).map(|f| self.shared.umem.frame(f))
    }
}

impl XdpRx {
    /// The kernel's drop counters for the socket (`XDP_STATISTICS`): frames dropped for a
    /// full RX ring or an empty fill ring, invalid descriptors.
    pub fn statistics(&self) -> io::Result<libc::xdp_statistics> {
        sys::statistics(self.shared.socket.as_raw_fd())
    }
}
