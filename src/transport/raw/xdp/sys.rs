//! The system calls and shared memory of AF_XDP: the UMEM, the four rings, the socket,
//! the BPF map, program and link, and the membership that makes the interface
//! promiscuous. Every `unsafe` block of the AF_XDP path is here, each with its reason.
//!
//! Ownership of UMEM chunks is carried by values: a [`Chunk`] can only be made here (the
//! UMEM's initial split, or taken off the RX or completion ring) and is given to the
//! kernel by value (onto the fill or TX ring), so the slices handed out of the UMEM only
//! ever cover chunks the kernel is not writing.
//!
//! The rings follow the protocol of net/xdp/xsk_queue.h (and libxdp's xsk.h): the
//! producer writes entries, then publishes its index with a release store; the consumer
//! reads the producer's index with an acquire load before reading the entries, and
//! publishes its own with a release store once done with them.

use super::program::Insn;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Bytes of one UMEM chunk.
pub const CHUNK_SIZE: usize = 4096;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Takes ownership of a descriptor the kernel just returned.
fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful call that creates a descriptor; no
    // one else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn set_option<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is live for the call and the length passed is its size.
    let rc = unsafe { libc::setsockopt(fd, level, name, (value as *const T).cast(), size_of::<T>() as u32) };
    check(rc).map(drop)
}

/// A memory mapping, unmapped when dropped.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory; what may be read or written where is the business of
// its owners below (chunk ownership, ring indices), not of the thread that holds it.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access only goes through the raw pointer, never through Rust
// references to memory another thread or the kernel writes.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(len: usize, prot: libc::c_int, flags: libc::c_int, fd: RawFd, offset: libc::off_t) -> io::Result<Self> {
        // SAFETY: a fresh mapping at an address of the kernel's choosing; it overlaps
        // nothing of ours.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, offset) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    /// The ring index word at `at`, one of the offsets the kernel gave for the ring.
    fn word(&self, at: usize) -> &AtomicU32 {
        assert!(at + 4 <= self.len && at.is_multiple_of(4), "a ring index outside its mapping");
        // SAFETY: aligned and inside the mapping (asserted); the word is shared with the
        // kernel, so it is only ever accessed atomically, through this reference.
        unsafe { &*self.ptr.as_ptr().add(at).cast::<AtomicU32>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are the mapping made in `new`; nothing borrows it any
        // more (its owner is being dropped). The kernel keeps its own pin on UMEM pages
        // until the socket is gone.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One UMEM chunk, owned by whoever holds this value (never copied, made only here).
#[derive(Debug)]
pub struct Chunk(u64);

/// A received frame: its chunk, where the frame starts in it and its length, checked
/// against the chunk when it was taken off the RX ring.
#[derive(Debug)]
pub struct RxFrame {
    chunk: Chunk,
    offset: u32,
    len: u32,
}

impl RxFrame {
    /// Gives the chunk back, to be put on the fill ring.
    pub fn into_chunk(self) -> Chunk {
        self.chunk
    }
}

/// The packet buffer shared with the kernel: `chunks` chunks of [`CHUNK_SIZE`] bytes.
pub struct Umem {
    map: Mapping,
}

impl Umem {
    /// A zeroed, page-aligned area of `chunks` chunks, and a [`Chunk`] for each.
    pub fn new(chunks: u32) -> io::Result<(Umem, Vec<Chunk>)> {
        let len = chunks as usize * CHUNK_SIZE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        let map = Mapping::new(len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)?;
        let all = (0..u64::from(chunks)).map(|i| Chunk(i * CHUNK_SIZE as u64)).collect();
        Ok((Umem { map }, all))
    }

    fn holds(&self, addr: u64) -> bool {
        addr.is_multiple_of(CHUNK_SIZE as u64) && addr < self.map.len as u64
    }

    /// The bytes of a received frame, borrowed as long as the frame is held.
    pub fn frame<'a>(&'a self, f: &'a RxFrame) -> &'a [u8] {
        let start = f.chunk.0 as usize + f.offset as usize;
        // SAFETY: `RxFrame`s are made only by `RxRing::take`, which checked that the
        // chunk lies in this UMEM and `offset + len` within the chunk; the chunk is not
        // on the fill ring while the frame is held, so the kernel does not write it.
        unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr().add(start), f.len as usize) }
    }

    /// Copies `data` (at most a chunk) to the start of `chunk`; returns the length.
    pub fn write(&self, chunk: &mut Chunk, data: &[u8]) -> u32 {
        let n = data.len().min(CHUNK_SIZE);
        assert!(self.holds(chunk.0), "a chunk of another UMEM");
        // SAFETY: the chunk lies in this mapping (checked) and `n` fits in it; whoever
        // holds `chunk` mutably is its only user (the kernel has given it back).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.ptr.as_ptr().add(chunk.0 as usize), n) };
        n as u32
    }

    fn reg(&self) -> libc::xdp_umem_reg {
        libc::xdp_umem_reg {
            addr: self.map.ptr.as_ptr() as u64,
            len: self.map.len as u64,
            chunk_size: CHUNK_SIZE as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        }
    }
}

/// One mmap'd ring: the producer and consumer indices, the flags word and `size`
/// entries of `T`.
struct Ring<T> {
    map: Arc<Mapping>,
    producer: usize,
    consumer: usize,
    flags: usize,
    descs: usize,
    size: u32,
    /// Our own index (producer or consumer), published by `publish`.
    local: u32,
    /// The other side's index as last read.
    cached: u32,
    _entry: std::marker::PhantomData<T>,
}

impl<T: Copy> Ring<T> {
    fn map(fd: RawFd, page_offset: u64, off: &libc::xdp_ring_offset, size: u32) -> io::Result<Self> {
        let fields = [off.producer, off.consumer, off.flags];
        if fields.iter().any(|o| !o.is_multiple_of(4)) || !off.desc.is_multiple_of(std::mem::align_of::<T>() as u64) {
            return Err(io::Error::other("AF_XDP ring offsets misaligned"));
        }
        let len = off.desc as usize + size as usize * size_of::<T>();
        let flags = libc::MAP_SHARED | libc::MAP_POPULATE;
        let map =
            Arc::new(Mapping::new(len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, page_offset as libc::off_t)?);
        let [producer, consumer, flags] = fields.map(|o| o as usize);
        Ok(Ring {
            map,
            producer,
            consumer,
            flags,
            descs: off.desc as usize,
            size,
            local: 0,
            cached: 0,
            _entry: std::marker::PhantomData,
        })
    }

    fn index(&self, at: usize) -> &AtomicU32 {
        self.map.word(at)
    }

    /// Whether the kernel asked to be woken for this ring (`XDP_RING_NEED_WAKEUP`).
    fn needs_wakeup(&self) -> bool {
        self.index(self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    fn slot(&self, i: u32) -> *mut T {
        // SAFETY: the index is masked to the ring's size, and `descs + size * size_of<T>`
        // is inside the mapping (its length was computed so).
        unsafe { self.map.ptr.as_ptr().add(self.descs).cast::<T>().add((i & (self.size - 1)) as usize) }
    }

    // Producer side (fill, TX): entries written at `local`, then published.

    /// Free entries, re-reading the kernel's consumer index only when the cached one
    /// shows fewer than `want`.
    fn free(&mut self, want: u32) -> u32 {
        let free = self.size - self.local.wrapping_sub(self.cached);
        if free >= want {
            return free;
        }
        self.cached = self.index(self.consumer).load(Ordering::Acquire);
        self.size - self.local.wrapping_sub(self.cached)
    }

    fn push(&mut self, entry: T) {
        // SAFETY: the caller checked `free` first, so the kernel is not reading this slot.
        unsafe { self.slot(self.local).write(entry) };
        self.local = self.local.wrapping_add(1);
    }

    /// Publishes what was pushed: the entries' writes happen before the kernel sees the
    /// new producer index.
    fn submit(&self) {
        self.index(self.producer).store(self.local, Ordering::Release);
    }

    /// Entries pushed that the kernel has not consumed yet.
    fn unconsumed(&self) -> u32 {
        self.local.wrapping_sub(self.index(self.consumer).load(Ordering::Acquire))
    }

    // Consumer side (RX, completion): entries read from `local` up to the producer.

    fn available(&mut self, max: u32) -> u32 {
        let mut n = self.cached.wrapping_sub(self.local);
        if n == 0 {
            self.cached = self.index(self.producer).load(Ordering::Acquire);
            n = self.cached.wrapping_sub(self.local);
        }
        n.min(max)
    }

    fn pop(&mut self) -> T {
        // SAFETY: `available` said this slot was published (the acquire load orders this
        // read after the kernel's write).
        let e = unsafe { self.slot(self.local).read() };
        self.local = self.local.wrapping_add(1);
        e
    }

    /// Gives the entries read back to the kernel, after they were read.
    fn release(&self) {
        self.index(self.consumer).store(self.local, Ordering::Release);
    }
}

/// The fill ring: chunks for the kernel to receive into.
pub struct FillRing(Ring<u64>);

impl FillRing {
    /// Puts as many of `chunks` on the ring as fit (from the end) and publishes them.
    pub fn give(&mut self, chunks: &mut Vec<Chunk>) {
        let n = self.0.free(chunks.len() as u32) as usize;
        for c in chunks.drain(chunks.len() - n.min(chunks.len())..) {
            self.0.push(c.0);
        }
        self.0.submit();
    }

    /// Whether the kernel waits for a wakeup to take from the ring.
    pub fn needs_wakeup(&self) -> bool {
        self.0.needs_wakeup()
    }
}

/// The completion ring: chunks the kernel has sent.
pub struct CompletionRing(Ring<u64>);

impl CompletionRing {
    /// Takes every completed chunk into `into`.
    pub fn take(&mut self, umem: &Umem, into: &mut Vec<Chunk>) {
        let n = self.0.available(u32::MAX);
        for _ in 0..n {
            let addr = self.0.pop();
            // The kernel returns the addresses it was given; any other is dropped.
            if umem.holds(addr) {
                into.push(Chunk(addr));
            }
        }
        self.0.release();
    }
}

/// The RX ring: frames received.
pub struct RxRing(Ring<libc::xdp_desc>);

impl RxRing {
    /// Takes up to `max` frames into `into`; returns how many.
    pub fn take(&mut self, umem: &Umem, max: usize, into: &mut Vec<RxFrame>) -> usize {
        let n = self.0.available(max as u32);
        for _ in 0..n {
            let d = self.0.pop();
            let base = d.addr - d.addr % CHUNK_SIZE as u64;
            let offset = (d.addr - base) as u32;
            // The kernel keeps a frame inside its chunk; check rather than trust.
            if umem.holds(base) && offset as usize + d.len as usize <= CHUNK_SIZE {
                into.push(RxFrame { chunk: Chunk(base), offset, len: d.len });
            }
        }
        self.0.release();
        n as usize
    }
}

/// The TX ring: frames to send.
pub struct TxRing(Ring<libc::xdp_desc>);

impl TxRing {
    /// Room for another descriptor.
    pub fn has_room(&mut self) -> bool {
        self.0.free(1) > 0
    }

    /// Queues `len` bytes at the start of `chunk` (seen by the kernel at [`TxRing::submit`]).
    /// The caller checked [`TxRing::has_room`].
    pub fn push(&mut self, chunk: Chunk, len: u32) {
        self.0.push(libc::xdp_desc { addr: chunk.0, len, options: 0 });
    }

    /// Publishes what was pushed.
    pub fn submit(&self) {
        self.0.submit()
    }

    /// Descriptors published that the kernel has not taken yet.
    pub fn unconsumed(&self) -> u32 {
        self.0.unconsumed()
    }

    /// Whether the kernel waits for a `sendto` to send.
    pub fn needs_wakeup(&self) -> bool {
        self.0.needs_wakeup()
    }

    /// A view of the ring's two indices for another thread, which can see how much is
    /// queued without holding the ring.
    pub fn watch(&self) -> TxWatch {
        TxWatch { map: self.0.map.clone(), producer: self.0.producer, consumer: self.0.consumer }
    }
}

/// The TX ring's indices, read only.
pub struct TxWatch {
    map: Arc<Mapping>,
    producer: usize,
    consumer: usize,
}

impl TxWatch {
    /// Descriptors published that the kernel has not taken yet.
    pub fn unconsumed(&self) -> u32 {
        let produced = self.map.word(self.producer).load(Ordering::Acquire);
        produced.wrapping_sub(self.map.word(self.consumer).load(Ordering::Acquire))
    }
}

/// An AF_XDP socket's rings, mapped.
pub struct Rings {
    /// Fill.
    pub fill: FillRing,
    /// Completion.
    pub completion: CompletionRing,
    /// RX.
    pub rx: RxRing,
    /// TX.
    pub tx: TxRing,
}

/// An AF_XDP socket (non-blocking) with `umem` registered and four rings of `size`
/// entries, mapped; not bound yet (the rings can only be mapped before bind).
pub fn xdp_socket(umem: &Umem, size: u32) -> io::Result<(OwnedFd, Rings)> {
    // SAFETY: no pointer arguments; the result is checked and owned below.
    let fd = owned(check(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?);
    let raw = fd.as_raw_fd();
    set_option(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &umem.reg())?;
    let size_c = size as libc::c_int;
    for ring in [libc::XDP_UMEM_FILL_RING, libc::XDP_UMEM_COMPLETION_RING, libc::XDP_RX_RING, libc::XDP_TX_RING] {
        set_option(raw, libc::SOL_XDP, ring, &size_c)?;
    }
    // SAFETY: xdp_mmap_offsets is plain data; all-zero is a valid value.
    let mut off: libc::xdp_mmap_offsets = unsafe { zeroed() };
    let mut len = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: `off` and `len` are live and `len` is the size of `off`.
    let rc = unsafe {
        libc::getsockopt(
            raw,
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            (&mut off as *mut libc::xdp_mmap_offsets).cast(),
            &mut len,
        )
    };
    check(rc)?;
    if len as usize != size_of::<libc::xdp_mmap_offsets>() {
        return Err(io::Error::other("the kernel's AF_XDP rings have no flags word (Linux before 5.4)"));
    }
    let rings = Rings {
        fill: FillRing(Ring::map(raw, libc::XDP_UMEM_PGOFF_FILL_RING, &off.fr, size)?),
        completion: CompletionRing(Ring::map(raw, libc::XDP_UMEM_PGOFF_COMPLETION_RING, &off.cr, size)?),
        rx: RxRing(Ring::map(raw, libc::XDP_PGOFF_RX_RING as u64, &off.rx, size)?),
        tx: TxRing(Ring::map(raw, libc::XDP_PGOFF_TX_RING as u64, &off.tx, size)?),
    };
    Ok((fd, rings))
}

/// Binds `fd` to queue `queue` of interface `ifindex` with bind `flags` (`XDP_*`).
pub fn bind(fd: RawFd, ifindex: u32, queue: u32, flags: u16) -> io::Result<()> {
    let sa = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: flags,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: 0,
    };
    // SAFETY: `sa` is live for the call and the length passed is its size.
    let rc = unsafe {
        libc::bind(fd, (&sa as *const libc::sockaddr_xdp).cast(), size_of::<libc::sockaddr_xdp>() as libc::socklen_t)
    };
    check(rc).map(drop)
}

/// Whether the bound socket runs zero-copy (`XDP_OPTIONS`).
pub fn is_zero_copy(fd: RawFd) -> bool {
    let mut opts = libc::xdp_options { flags: 0 };
    let mut len = size_of::<libc::xdp_options>() as libc::socklen_t;
    // SAFETY: `opts` and `len` are live and `len` is the size of `opts`.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_XDP, libc::XDP_OPTIONS, (&mut opts as *mut libc::xdp_options).cast(), &mut len)
    };
    rc == 0 && opts.flags & libc::XDP_OPTIONS_ZEROCOPY != 0
}

/// The socket's drop counters (`XDP_STATISTICS`).
pub fn statistics(fd: RawFd) -> io::Result<libc::xdp_statistics> {
    // SAFETY: xdp_statistics is plain data; all-zero is a valid value.
    let mut s: libc::xdp_statistics = unsafe { zeroed() };
    let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
    // SAFETY: `s` and `len` are live and `len` is the size of `s`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            (&mut s as *mut libc::xdp_statistics).cast(),
            &mut len,
        )
    };
    check(rc).map(|_| s)
}

/// Tells the kernel to send what the TX ring holds: `sendto(fd, NULL, 0, MSG_DONTWAIT)`.
pub fn kick_tx(fd: RawFd) -> io::Result<()> {
    // SAFETY: a zero-length send with no buffer and no address; nothing is read.
    let rc = unsafe { libc::sendto(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Tells the kernel the fill ring has chunks again: `recvfrom(fd, NULL, 0, MSG_DONTWAIT)`.
pub fn kick_rx(fd: RawFd) {
    // SAFETY: a zero-length receive with no buffer and no address; nothing is written.
    let _ = unsafe {
        libc::recvfrom(fd, std::ptr::null_mut(), 0, libc::MSG_DONTWAIT, std::ptr::null_mut(), std::ptr::null_mut())
    };
}

/// Sets the socket's send buffer (`SO_SNDBUFFORCE`, else `SO_SNDBUF`): in copy mode every
/// frame in flight is an skb charged to it.
pub fn set_send_buffer(fd: RawFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    if set_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &v).is_err() {
        let _ = set_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &v);
    }
}

/// Keeps interface `ifindex` promiscuous while the returned socket is open, as the
/// packet-socket path does: a packet socket's membership, which the kernel drops with the
/// socket (also when the process dies). The socket is opened for protocol 0, so it is
/// hooked into no receive path, and it carries a classic BPF filter that accepts nothing
/// (one `ret #0`): it never queues a frame, so it costs nothing per frame and holds no
/// memory, whatever the traffic.
pub fn promiscuous(ifindex: u32) -> io::Result<OwnedFd> {
    // SAFETY: no pointer arguments; the result is checked and owned below.
    let fd = owned(check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?);
    let mut reject_all = [libc::sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k: 0 }];
    let prog = libc::sock_fprog { len: 1, filter: reject_all.as_mut_ptr() };
    set_option(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)?;
    // SAFETY: packet_mreq is plain data; all-zero is a valid value.
    let mut mreq: libc::packet_mreq = unsafe { zeroed() };
    mreq.mr_ifindex = ifindex as i32;
    mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
    set_option(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)?;
    Ok(fd)
}

// The bpf(2) commands used and the parts of `union bpf_attr` (linux/bpf.h) they read. The
// kernel takes a shorter attribute than its own and treats the rest as zero.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`: BPF_XDP.
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_SKB_MODE` and `XDP_FLAGS_DRV_MODE` (linux/if_link.h).
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// Native (driver) XDP.
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// `bpf(cmd, attr, sizeof attr)`.
fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a live, initialised #[repr(C)] prefix of `union bpf_attr` for
    // `cmd`, of the length passed; every pointer in it points at memory live for the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, (attr as *mut A).cast::<libc::c_void>(), size_of::<A>()) };
    check(rc as libc::c_int)
}

/// An XSKMAP of `entries` slots (keys: queue indices; values: AF_XDP sockets).
pub fn xskmap(entries: u32) -> io::Result<OwnedFd> {
    let mut a =
        MapCreateAttr { map_type: BPF_MAP_TYPE_XSKMAP, key_size: 4, value_size: 4, max_entries: entries, map_flags: 0 };
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

/// Puts socket `xsk` at `key` of XSKMAP `map`.
pub fn xskmap_set(map: RawFd, key: u32, xsk: RawFd) -> io::Result<()> {
    let value = xsk as u32;
    let mut a = MapElemAttr {
        map_fd: map as u32,
        key: &key as *const u32 as u64,
        value: &value as *const u32 as u64,
        ..MapElemAttr::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
}

/// Loads an XDP program; on refusal, loads it again with the verifier's log and returns
/// the log in the error.
pub fn load_xdp(insns: &[Insn], name: &str) -> io::Result<OwnedFd> {
    let license = c"Dual MIT/GPL";
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        expected_attach_type: BPF_XDP,
        ..ProgLoadAttr::default()
    };
    let first = match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => return Ok(owned(fd)),
        Err(e) => e,
    };
    let mut log = vec![0u8; 1 << 16];
    attr.log_level = 1;
    attr.log_size = log.len() as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(owned(fd)),
        Err(_) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            Err(io::Error::new(first.kind(), format!("the verifier refused the XDP program ({first}):\n{text}")))
        }
    }
}

/// Attaches XDP program `prog` to interface `ifindex` through a BPF link in mode `flags`
/// ([`XDP_FLAGS_DRV_MODE`] or [`XDP_FLAGS_SKB_MODE`]). The program stays attached while the
/// returned descriptor is open: closing it, or the process dying, detaches it.
pub fn link_xdp(prog: RawFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut a = LinkCreateAttr { prog_fd: prog as u32, target_ifindex: ifindex, attach_type: BPF_XDP, flags };
    bpf(BPF_LINK_CREATE, &mut a).map(owned)
}
