//! The verbs API: a RoCEv2 device over kernel UDP sockets or an iWARP device over kernel
//! TCP sockets, with names after libibverbs (and, for iWARP connections, rdma_cm).
//!
//! [`Context::open`] (`ibv_open_device`) takes the transport in [`OpenConfig::transport`].
//! RoCEv2 binds an address's port 4791 and starts the device's poll thread; QPs are
//! connected with [`QueuePair::connect_rc`] after an out-of-band exchange. iWARP QPs are
//! connected as rdma_cm does it: [`QueuePair::connect`] on one side, [`Context::listen`],
//! [`Listener::get_request`] and [`ConnRequest::accept`] on the other; everything else
//! (memory, CQs, posting, completions) is the same for both. Objects hang off the context: [`Context::alloc_pd`],
//! [`Context::reg_mr`], [`Context::create_cq`], [`Context::create_srq`],
//! [`Context::create_qp`]; a QP is driven with [`QueuePair::modify`], [`QueuePair::post_send`]
//! and [`QueuePair::post_recv`], and completions come from [`CompletionQueue::poll`] or the
//! blocking [`CompletionQueue::wait`].
//!
//! Threading: posting runs to completion on the caller's thread (the engine segments the
//! request and the caller's thread sends the packets), so a send costs no thread hop. The
//! poll thread receives, runs timers and sends replies. Both take the device lock for the
//! engine work only; completions then move to each CQ's own queue, so polling a CQ never
//! waits for the device lock.
//!
//! A complete RC exchange between two devices on one machine:
//!
//! ```
//! use softrdma::verbs::*;
//! use std::time::Duration;
//!
//! // Two devices on loopback addresses; port 0 picks a free port (tests); real peers use 4791.
//! let open = |ip: [u8; 4]| {
//!     let mut cfg = OpenConfig::new(std::net::Ipv4Addr::from(ip).into());
//!     cfg.port = 0;
//!     Context::open(cfg).unwrap()
//! };
//! let (a, b) = (open([127, 0, 0, 1]), open([127, 0, 0, 2]));
//! a.set_peer_port(b.ip(), b.port());
//! b.set_peer_port(a.ip(), a.port());
//!
//! let qp_for = |ctx: &Context| {
//!     let pd = ctx.alloc_pd();
//!     let cq = ctx.create_cq(64);
//!     let mr = ctx.reg_mr(&pd, 4096, Access::ALL).unwrap();
//!     let qp = ctx.create_qp(&pd, &cq, &cq, QpType::Rc, QpCaps::default(), None).unwrap();
//!     (pd, cq, mr, qp)
//! };
//! let (_pda, cqa, mra, qpa) = qp_for(&a);
//! let (_pdb, cqb, mrb, qpb) = qp_for(&b);
//!
//! // The out-of-band exchange a real application does over TCP: GID, QPN, PSN.
//! let (psn_a, psn_b) = (a.random_psn(), b.random_psn());
//! qpa.connect_rc(b.gid(0).unwrap(), qpb.qp_num(), psn_b, psn_a, Mtu::M1024).unwrap();
//! qpb.connect_rc(a.gid(0).unwrap(), qpa.qp_num(), psn_a, psn_b, Mtu::M1024).unwrap();
//!
//! // A SEND into a posted receive, then an RDMA WRITE into b's region.
//! qpb.post_recv(RecvWr { wr_id: 7, sgl: vec![mrb.sge(0, 64)] }).unwrap();
//! mra.write(0, b"hello over RoCEv2");
//! qpa.post_send(SendWr::new(1, SendOp::Send, vec![mra.sge(0, 17)])).unwrap();
//! let wc = cqb.wait(Duration::from_secs(5)).expect("a receive completion");
//! assert_eq!((wc.wr_id, wc.status, wc.byte_len), (7, WcStatus::Success, 17));
//!
//! let remote = Remote { addr: mrb.addr() + 1024, rkey: mrb.rkey() };
//! qpa.post_send(SendWr::new(2, SendOp::Write(remote), vec![mra.sge(0, 17)])).unwrap();
//! assert_eq!(cqa.wait(Duration::from_secs(5)).map(|w| w.wr_id), Some(1));
//! assert_eq!(cqa.wait(Duration::from_secs(5)).map(|w| (w.wr_id, w.status)), Some((2, WcStatus::Success)));
//! let mut got = [0u8; 17];
//! mrb.read(1024, &mut got);
//! assert_eq!(&got, b"hello over RoCEv2");
//! ```

mod ud_cm;
pub use ud_cm::{UdListener, UdPeer, UdRequest, RDMA_UDP_QKEY};

use crate::driver;
use crate::driver::cq::CqQueue;
use crate::driver::iwarp::IwarpPort;
use crate::driver::iwarp_smol::{IwarpSmol, SmolLink};
use crate::driver::iwarp_tcp::IwarpTcp;
use crate::driver::roce::{Link, Poller, RoceDriver};
use crate::engine::mem::{MemError, Mr, Need, SharedMem};
use crate::engine::{Device, DeviceConfig, Stats};
use crate::iwarp::device::{ConnId, IwarpDevice};
use crate::transport::pcap::FrameLog;
use crate::transport::raw;
use crate::transport::udp::{self, UdpConfig};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use crate::driver::cq::clock_ns as device_clock_ns;
pub use crate::engine::cc::CcConfig;
pub use crate::engine::event::AsyncEvent;
pub use crate::engine::mem::mw::{MwBind, MwType};
pub use crate::engine::mem::{Access, Pd};
pub use crate::engine::verbs::{
    Gid, Mtu, QpAttr, QpCaps, QpState, QpType, RecvWr, Remote, SendOp, SendWr, Sge, UdDest, VerbsError, Wc, WcOpcode,
    WcStatus,
};
pub use crate::iwarp::config::{
    ConnParam, ConnectError, IwarpConfig, CLOSE_LINGER_MS, MAX_EARLY_BYTES, MAX_HALF_OPEN_PER_LISTENER,
    MAX_HELD_REQUESTS_PER_LISTENER, MAX_TX_BUFFERED,
};
pub use crate::iwarp::setup::{CrcPolicy, RtrKind};
pub use crate::transport::raw::RawConfig;

/// The wire protocol of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// RoCEv2: the InfiniBand transport over UDP port 4791.
    #[default]
    RoceV2,
    /// iWARP: RDMAP over DDP over MPA over TCP.
    Iwarp,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "roce" | "rocev2" => Ok(Transport::RoceV2),
            "iwarp" => Ok(Transport::Iwarp),
            other => Err(format!("unknown transport {other:?} (rocev2 or iwarp)")),
        }
    }
}

/// What [`Context::open`] takes.
#[derive(Debug, Clone)]
pub struct OpenConfig {
    /// RoCEv2 (default) or iWARP.
    pub transport: Transport,
    /// iWARP settings (MPA CRC, markers, peer-to-peer).
    pub iwarp: IwarpConfig,
    /// The local address; its GID is index 0.
    pub addr: IpAddr,
    /// UDP port to receive on and send to: 4791, or 0 for a free port (tests).
    pub port: u16,
    /// Seed of keys, QPNs and initial PSNs, for reproducible tests only; `None` (the
    /// default): the OS CSPRNG, so that a peer can guess none of them.
    pub seed: Option<u64>,
    /// Most QPs.
    pub max_qps: usize,
    /// Most memory regions.
    pub max_mrs: usize,
    /// Write every frame sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Congestion control (off by default).
    pub cc: CcConfig,
    /// UDP source ports QPs spread over.
    pub source_ports: usize,
    /// UDP segmentation and receive offload on the kernel UDP sockets; `None` (the
    /// default) decides when the device opens, in the network namespace it opens in
    /// ([`udp::offload_by_default`]: `SOFTRDMA_UDP_OFFLOAD` if set; else on, on virtual
    /// links from Linux 6.2).
    pub udp_offload: Option<bool>,
    /// RoCEv2 on raw Ethernet frames on a network interface, with an address of its own
    /// (`addr` is then `raw.ip`); `None`: kernel UDP sockets.
    pub raw: Option<RawConfig>,
    /// Kernel UDP sockets: let softrdma devices in other processes (of the same user) open
    /// the same address and port, each with its own QPs (on by default, as rxe devices
    /// share their host's address).
    pub share_address: bool,
}

impl OpenConfig {
    /// Port 4791 on `addr`, with defaults for the rest.
    pub fn new(addr: IpAddr) -> Self {
        OpenConfig {
            transport: Transport::RoceV2,
            iwarp: IwarpConfig::default(),
            addr,
            port: udp::ROCE_PORT,
            seed: None,
            max_qps: 16384,
            max_mrs: 16384,
            pcap: None,
            // Sockets drop rather than mark: a loss window keeps a requester from flooding
            // its peer's receive buffer. The device's 8192 packets (32 MiB of 4 KiB ones,
            // half the socket buffer asked for) leave a thousand busy QPs 8 packets each, so
            // a QP's window does not close before its ACK is back. `softrdma demo --qps 1000`,
            // aggregate over one QP: at 1024 packets 0.41x (one ACK per packet), at 4096
            // 0.67-0.93x (median 0.82 of 12 runs), at 8192 0.85-0.99x (median 0.90 of 12,
            // alternated with those), never a retransmission timeout.
            cc: CcConfig {
                loss_window_max_packets: crate::engine::qp::requester::MAX_INFLIGHT_PSNS,
                loss_window_initial_packets: 4,
                loss_window_device_packets: 8192,
                ..CcConfig::default()
            },
            source_ports: 8,
            udp_offload: None,
            raw: None,
            share_address: true,
        }
    }

    /// The port's active MTU (`ibv_port_attr.active_mtu`): the largest path MTU that fits
    /// the link the device would use, or `None` if that link is not known (an address no
    /// interface holds).
    pub fn active_mtu(&self) -> Option<Mtu> {
        match &self.raw {
            Some(r) => r.active_mtu().ok(),
            None => udp::active_mtu(self.addr),
        }
    }

    /// A RoCEv2 device on raw Ethernet: address `ip/prefix_len` (which the kernel must not
    /// hold) on interface `iface`. Needs CAP_NET_RAW.
    pub fn raw(iface: &str, ip: IpAddr, prefix_len: u8) -> Self {
        let mut cfg = OpenConfig::new(ip);
        cfg.raw = Some(RawConfig::new(iface, ip, prefix_len));
        cfg
    }
}

pub use crate::driver::cq::MAX_CQE;

/// The device behind a handle: RoCEv2 on UDP or iWARP on TCP.
#[derive(Clone)]
enum Backend {
    Roce(Arc<RoceDriver>),
    Iwarp(Arc<dyn IwarpPort>),
}

impl Backend {
    /// Runs `f` on the device's bookkeeping (PDs, MRs, CQs, GIDs) under its lock.
    fn with_dev<T>(&self, f: impl FnOnce(&mut Device) -> T) -> T {
        match self {
            Backend::Roce(s) => s.with_core(f),
            Backend::Iwarp(s) => driver::iwarp::with(&**s, |d| f(&mut d.dev)),
        }
    }
}

/// An open device (`ibv_context`).
pub struct Context {
    backend: Backend,
    thread: Option<JoinHandle<()>>,
}

/// Device and transport counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// The engine's counters.
    pub engine: Stats,
    /// UDP datagrams received.
    pub rx_datagrams: u64,
    /// Datagrams dropped for a bad ICRC.
    pub rx_icrc_bad: u64,
    /// Datagrams too short to be RoCEv2.
    pub rx_runt: u64,
    /// IPv4 datagrams that came with a non-zero Identification.
    pub rx_ipv4_ident_nonzero: u64,
    /// UDP datagrams sent.
    pub tx_datagrams: u64,
    /// Datagrams the kernel refused.
    pub tx_errors: u64,
    /// Raw: IP fragments dropped (RoCEv2 is never fragmented).
    pub rx_fragments: u64,
    /// Raw: frames for another host or protocol, ignored.
    pub rx_not_ours: u64,
    /// Raw: ARP requests and Neighbour Solicitations answered.
    pub neighbour_replies: u64,
    /// Raw: ARP requests and Neighbour Solicitations sent.
    pub neighbour_requests: u64,
    /// Raw: ICMP echo requests answered.
    pub echo_replies: u64,
    /// Shared address: packets read for another process's device and handed on.
    pub forwarded_out: u64,
    /// Times the device's poll thread woke (RoCEv2).
    pub poll_thread_wakeups: u64,
    /// Packets the device's poll thread received, rather than an application thread
    /// (RoCEv2).
    pub poll_thread_packets: u64,
    /// Shared address: packets another process's device handed on to this one.
    pub forwarded_in: u64,
    /// Shared address: packets for another device whose queue was full (lost).
    pub forward_dropped: u64,
    /// Raw: packets dropped because their next hop did not resolve.
    pub tx_unresolved: u64,
    /// iWARP: TCP connections open (in MPA setup, connected, or closing).
    pub iwarp_connections: u64,
}

impl Context {
    /// Opens a device on `cfg.addr` (`ibv_open_device`) and starts its poll thread.
    pub fn open(cfg: OpenConfig) -> io::Result<Context> {
        if cfg.transport == Transport::Iwarp {
            return Context::open_iwarp(cfg);
        }
        let log = match &cfg.pcap {
            Some(p) => Some(Arc::new(FrameLog::create(p)?)),
            None => None,
        };
        let link = match &cfg.raw {
            Some(raw_cfg) => {
                if raw_cfg.ip != cfg.addr {
                    return Err(io::Error::new(io::ErrorKind::InvalidInput, "OpenConfig::addr differs from raw.ip"));
                }
                let (tx, rx, stats) = raw::open(raw_cfg, log.clone())?;
                Link { tx: Box::new(tx), rx: Box::new(rx), stats, log }
            }
            None => {
                let ucfg = UdpConfig {
                    addr: cfg.addr,
                    port: cfg.port,
                    source_ports: cfg.source_ports,
                    offload: cfg.udp_offload.unwrap_or_else(|| udp::offload_by_default(cfg.addr)),
                    share: cfg.share_address,
                    ecn: cfg.cc.enabled,
                };
                let (tx, rx) = udp::open(&ucfg, log.clone())?;
                let stats = tx.stats().clone();
                Link { tx: Box::new(tx), rx: Box::new(rx), stats, log }
            }
        };
        let mut dev = Device::new(DeviceConfig {
            gid: udp::ip_to_gid(cfg.addr),
            seed: cfg.seed,
            max_qps: cfg.max_qps,
            max_mrs: cfg.max_mrs,
            cc: cfg.cc,
        });
        if let Some(tag) = link.rx.id_tag() {
            dev.set_id_tag(tag);
        }
        dev.set_raw_wire(cfg.raw.is_some());
        let path_mtu = cfg.active_mtu().unwrap_or(Mtu::M1024);
        let (driver, thread) = RoceDriver::start(dev, link, cfg.addr, path_mtu)?;
        Ok(Context { backend: Backend::Roce(driver), thread: Some(thread) })
    }

    /// An iWARP device: on kernel TCP (no socket until a QP connects or the application
    /// listens), or with `cfg.raw` on smoltcp's TCP over raw Ethernet.
    fn open_iwarp(cfg: OpenConfig) -> io::Result<Context> {
        let dev = Device::new(DeviceConfig {
            gid: udp::ip_to_gid(cfg.addr),
            seed: cfg.seed,
            max_qps: cfg.max_qps,
            max_mrs: cfg.max_mrs,
            cc: CcConfig::default(),
        });
        let device = IwarpDevice::new(dev, cfg.iwarp);
        let Some(raw_cfg) = &cfg.raw else {
            let (driver, thread) = IwarpTcp::start(cfg.addr, device)?;
            return Ok(Context { backend: Backend::Iwarp(driver), thread: Some(thread) });
        };
        if raw_cfg.ip != cfg.addr {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "OpenConfig::addr differs from raw.ip"));
        }
        if raw_cfg.frame_io == raw::FrameIo::Xdp {
            // A peer on this host hands TCP segments over with their checksum left partial
            // for offload; a packet socket says which, AF_XDP cannot, and smoltcp would
            // drop them as corrupt.
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "iWARP on raw Ethernet moves its frames through a packet socket (--frame-io packet), not AF_XDP",
            ));
        }
        let raw::io::Frames { tx, rx, mtu } = raw::open_frames(raw_cfg)?;
        let link = SmolLink {
            ip: raw_cfg.ip,
            prefix_len: raw_cfg.prefix_len,
            gateway: raw_cfg.gateway,
            mac: raw_cfg.mac(),
            mtu,
        };
        let (driver, thread) = IwarpSmol::start(device, link, rx, tx)?;
        Ok(Context { backend: Backend::Iwarp(driver), thread: Some(thread) })
    }

    /// The device's transport.
    pub fn transport(&self) -> Transport {
        match self.backend {
            Backend::Roce(_) => Transport::RoceV2,
            Backend::Iwarp(_) => Transport::Iwarp,
        }
    }

    /// The local IP address.
    pub fn ip(&self) -> IpAddr {
        match &self.backend {
            Backend::Roce(s) => s.ip,
            Backend::Iwarp(s) => s.ip(),
        }
    }

    /// The UDP port the device receives on (0 for iWARP, whose ports are per connection).
    pub fn port(&self) -> u16 {
        match &self.backend {
            Backend::Roce(s) => s.port,
            Backend::Iwarp(_) => 0,
        }
    }

    /// Sends to `peer` on `port` rather than this device's own port (several devices on
    /// one address, in tests). RoCEv2 only.
    pub fn set_peer_port(&self, peer: IpAddr, port: u16) {
        if let Backend::Roce(s) = &self.backend {
            s.lock().tx.set_peer_port(peer, port);
        }
    }

    /// The whole GID table.
    pub fn gids(&self) -> Vec<Gid> {
        self.backend.with_dev(|d| d.gids().to_vec())
    }

    /// A GID of the table (`ibv_query_gid`).
    pub fn gid(&self, index: u8) -> Option<Gid> {
        self.backend.with_dev(|d| d.gids().get(usize::from(index)).copied())
    }

    /// Adds a GID (another local address) and returns its index.
    pub fn add_gid(&self, gid: Gid) -> u8 {
        self.backend.with_dev(|d| d.add_gid(gid))
    }

    /// A random initial PSN.
    pub fn random_psn(&self) -> u32 {
        self.backend.with_dev(|d| d.random_psn())
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain { pd: self.backend.with_dev(|d| d.alloc_pd()) }
    }

    /// `ibv_reg_mr`: `len` zeroed bytes the application and remote peers share.
    pub fn reg_mr(&self, pd: &ProtectionDomain, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        // Allocated and its pages mapped before taking the device lock.
        let mem = Arc::new(SharedMem::new(len));
        mem.prefault();
        let mr = self.backend.with_dev(|d| d.reg_mem(pd.pd, mem, access))?;
        Ok(MemoryRegion { mr, backend: self.backend.clone() })
    }

    /// `ibv_alloc_mw`: a window in `pd`, bound to nothing. Unsupported on iWARP.
    pub fn alloc_mw(&self, pd: &ProtectionDomain, kind: MwType) -> Result<MemoryWindow, VerbsError> {
        if matches!(self.backend, Backend::Iwarp(_)) {
            return Err(VerbsError::Unsupported);
        }
        let key = self.backend.with_dev(|d| d.alloc_mw(pd.pd, kind))?;
        Ok(MemoryWindow { key, kind, backend: self.backend.clone() })
    }

    /// `ibv_reg_mr` on memory the caller owns (a C application's buffer): the region is
    /// the `len` bytes at `ptr`, named `iova` on the wire and in SGEs.
    ///
    /// # Safety
    /// `ptr..ptr + len` stays allocated and writable until the returned region is dropped
    /// (and every QP that used it is destroyed): the engine copies into and out of it.
    #[allow(unsafe_code)]
    pub unsafe fn reg_user_mr(
        &self,
        pd: &ProtectionDomain,
        ptr: std::ptr::NonNull<u8>,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        // SAFETY: the caller's contract is SharedMem::foreign's.
        let mem = Arc::new(unsafe { SharedMem::foreign(ptr, len) });
        let mr = self.backend.with_dev(|d| d.reg_mem_at(pd.pd, mem, access, iova))?;
        Ok(MemoryRegion { mr, backend: self.backend.clone() })
    }

    /// `ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND`: the `len` bytes of this process's
    /// address space at `addr` (all of it for an implicit region: 0 and `usize::MAX`),
    /// named `iova`, with nothing pinned or required to be mapped. An access where nothing
    /// is mapped fails as a NIC's unresolvable page fault does (a local protection error,
    /// or a NAK to the peer); it never touches the page.
    pub fn reg_on_demand_mr(
        &self,
        pd: &ProtectionDomain,
        addr: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        let mem = Arc::new(SharedMem::on_demand(addr, len));
        let mr = self.backend.with_dev(|d| d.reg_mem_at(pd.pd, mem, access, iova))?;
        Ok(MemoryRegion { mr, backend: self.backend.clone() })
    }

    /// `ibv_advise_mr`'s prefetch: the pages of the bytes `sge` names (in `pd`, writable
    /// if `write`) are mapped before traffic needs them.
    pub fn prefetch(&self, pd: &ProtectionDomain, sge: Sge, write: bool) -> Result<(), PrefetchError> {
        let need = if write { Need::LocalWrite } else { Need::LocalRead };
        let len = sge.length as usize;
        let (mem, offset) = self
            .backend
            .with_dev(|d| d.mrs().resolve(sge.lkey, pd.pd, sge.addr, len, need))
            .map_err(PrefetchError::Region)?;
        // Outside the device lock: populating may fault in many pages.
        if mem.prefetch(offset, len, write) {
            Ok(())
        } else {
            Err(PrefetchError::NotMapped)
        }
    }

    /// `ibv_alloc_dm`: `len` bytes of the device's own memory, zeroed. The application
    /// reaches them only through [`DeviceMemory::write`] and [`DeviceMemory::read`] and
    /// through regions over them ([`Context::reg_dm_mr`]), as it reaches a NIC's on-chip
    /// memory. At most [`crate::engine::MAX_DEVICE_MEMORY_BYTES`] in all.
    pub fn alloc_dm(&self, len: usize) -> Result<DeviceMemory, VerbsError> {
        if len == 0 {
            return Err(VerbsError::InvalidAttribute("device memory of no bytes"));
        }
        if !self.backend.with_dev(|d| d.reserve_device_memory(len)) {
            return Err(VerbsError::OutOfResources);
        }
        Ok(DeviceMemory { mem: Arc::new(SharedMem::new(len)), backend: self.backend.clone() })
    }

    /// `ibv_reg_dm_mr`: a region over the `len` bytes of `dm` from `offset`, in `pd`,
    /// addressed from 0 (`IBV_ACCESS_ZERO_BASED`, which device memory requires).
    pub fn reg_dm_mr(
        &self,
        pd: &ProtectionDomain,
        dm: &DeviceMemory,
        (offset, len): (usize, usize),
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        if offset.checked_add(len).is_none_or(|end| end > dm.len()) {
            return Err(VerbsError::InvalidAttribute("the region is not within the device memory"));
        }
        let span = (dm.mem.clone(), offset, len);
        let mr = self.backend.with_dev(|d| d.reg_span_at(pd.pd, span, access, 0))?;
        Ok(MemoryRegion { mr, backend: self.backend.clone() })
    }

    /// `ibv_create_cq` with room for `cqe` completions (1 to [`MAX_CQE`]). Completions
    /// beyond that while unpolled overrun the CQ ([`CompletionQueue::overrun`]).
    pub fn create_cq(&self, cqe: usize) -> CompletionQueue {
        let queue = Arc::new(CqQueue::new(cqe));
        let id = self.backend.with_dev(|d| d.create_cq(queue.capacity()));
        match &self.backend {
            Backend::Roce(s) => s.add_cq(id, queue.clone()),
            Backend::Iwarp(s) => s.add_cq(id, queue.clone()),
        }
        CompletionQueue { id, queue, backend: self.backend.clone() }
    }

    /// `ibv_get_async_event` without waiting: the oldest event no handler took.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        match &self.backend {
            Backend::Roce(s) => s.events.poll(),
            Backend::Iwarp(s) => s.events().poll(),
        }
    }

    /// Where asynchronous events go from now on (those queued first); false if a handler
    /// is set already. It runs on whichever thread raised the event: it must not call the
    /// device.
    pub fn set_async_event_handler(&self, f: Box<dyn Fn(AsyncEvent) + Send + Sync>) -> bool {
        match &self.backend {
            Backend::Roce(s) => s.events.set_handler(f),
            Backend::Iwarp(s) => s.events().set_handler(f),
        }
    }

    /// Tells `f` the QPN of every QP of this device that enters ERR from now on, whatever
    /// took it there (an error, the peer's disconnect, the application): what rdma_cm
    /// reports as DISCONNECTED. `f` runs with the device locked and must not call into it.
    /// False if a handler is set already.
    pub fn set_qp_error_handler(&self, f: Box<dyn Fn(u32) + Send + Sync>) -> bool {
        match &self.backend {
            Backend::Roce(s) => s.events.set_qp_error_handler(f),
            Backend::Iwarp(s) => s.events().set_qp_error_handler(f),
        }
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: usize, max_sge: usize) -> SharedReceiveQueue {
        let id = self.backend.with_dev(|d| d.create_srq(max_wr, max_sge));
        SharedReceiveQueue { id, backend: self.backend.clone() }
    }

    /// Listens for connections on `addr` (`rdma_listen`; port 0 picks a free one): TCP and
    /// MPA on iWARP, the CM's ServiceID for the port on RoCEv2.
    pub fn listen(&self, addr: SocketAddr) -> io::Result<Listener> {
        let kind = match &self.backend {
            Backend::Iwarp(s) => {
                let (id, local) = s.listen(addr)?;
                return Ok(Listener { local, kind: ListenerKind::Iwarp { id, port: s.clone() } });
            }
            Backend::Roce(s) => {
                let port = driver::roce_cm::listen(s, addr.port())
                    .map_err(|e| io::Error::new(io::ErrorKind::AddrInUse, e.to_string()))?;
                ListenerKind::Roce { port, driver: s.clone() }
            }
        };
        let ListenerKind::Roce { port, .. } = &kind else { unreachable!("built above") };
        Ok(Listener { local: SocketAddr::new(self.ip(), *port), kind })
    }

    /// `ibv_create_qp`: a QP in RESET (RoCEv2), or an unconnected RC QP (iWARP) that takes
    /// receives until [`QueuePair::connect`] or [`ConnRequest::accept`] brings it up.
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        qp_type: QpType,
        caps: QpCaps,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<QueuePair, VerbsError> {
        let init = crate::engine::verbs::QpInit {
            qp_type,
            pd: pd.pd,
            send_cq: send_cq.id,
            recv_cq: recv_cq.id,
            caps,
            srq: srq.map(|s| s.id),
            xrc: None,
        };
        let qpn = match &self.backend {
            Backend::Roce(s) => s.lock().dev.create_qp(init)?,
            Backend::Iwarp(s) => {
                if qp_type != QpType::Rc {
                    return Err(VerbsError::InvalidAttribute("iWARP QPs are RC"));
                }
                let srq = srq.map(|q| q.id);
                driver::iwarp::with(&**s, |d| d.create_qp(pd.pd, (send_cq.id, recv_cq.id), caps, srq))?
            }
        };
        Ok(QueuePair { qpn, backend: self.backend.clone() })
    }

    /// `ibv_open_xrcd`: an XRC domain (RoCEv2 only; iWARP has no XRC).
    pub fn open_xrcd(&self) -> Result<XrcDomain, VerbsError> {
        match &self.backend {
            Backend::Roce(s) => Ok(XrcDomain { id: s.lock().dev.alloc_xrcd(), backend: self.backend.clone() }),
            Backend::Iwarp(_) => Err(VerbsError::Unsupported),
        }
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of `xrcd` whose receives are
    /// checked in `pd` and complete on `cq`; initiators name it by
    /// [`SharedReceiveQueue::srq_num`].
    pub fn create_xrc_srq(
        &self,
        xrcd: &XrcDomain,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        (max_wr, max_sge): (usize, usize),
    ) -> Result<SharedReceiveQueue, VerbsError> {
        let x = crate::engine::srq::XrcSrq { xrcd: xrcd.id, pd: pd.pd, cq: cq.id };
        let id = self.backend.with_dev(|d| d.create_xrc_srq(x, max_wr, max_sge))?;
        Ok(SharedReceiveQueue { id, backend: self.backend.clone() })
    }

    /// A tag-matching SRQ (`ibv_create_srq_ex` with `IBV_SRQT_TM`): ordinary receives for
    /// unexpected messages, at most `max_tags` tagged buffers, every completion on `cq`
    /// (`engine::tm`). RoCEv2 only: an iWARP device answers `Unsupported`.
    pub fn create_tm_srq(
        &self,
        cq: &CompletionQueue,
        (max_wr, max_sge): (usize, usize),
        max_tags: usize,
    ) -> Result<SharedReceiveQueue, VerbsError> {
        if matches!(self.backend, Backend::Iwarp(_)) {
            return Err(VerbsError::Unsupported);
        }
        let id = self.backend.with_dev(|d| d.create_tm_srq(max_wr, max_sge, cq.id, max_tags))?;
        Ok(SharedReceiveQueue { id, backend: self.backend.clone() })
    }

    /// True when this device matches tags (`tm_caps.flags & IBV_TM_CAP_RC`).
    pub fn matches_tags(&self) -> bool {
        matches!(self.backend, Backend::Roce(_))
    }

    /// An XRC initiator (`IBV_QPT_XRC_SEND`): sends only, each request to the target SRQ
    /// its `SendWr::xrc_srqn` names. Brought up as an RC QP is.
    pub fn create_xrc_initiator(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        caps: QpCaps,
    ) -> Result<QueuePair, VerbsError> {
        let xrc = Some(crate::engine::verbs::Xrc::Initiator);
        self.create_xrc_qp(crate::engine::verbs::QpInit { pd: pd.pd, send_cq: send_cq.id, ..xrc_init(xrc, caps) })
    }

    /// An XRC target (`IBV_QPT_XRC_RECV`) of `xrcd`: receives only, into the SRQ of the
    /// domain each request names. Brought up to RTR as an RC QP is.
    pub fn create_xrc_target(&self, xrcd: &XrcDomain) -> Result<QueuePair, VerbsError> {
        let xrc = Some(crate::engine::verbs::Xrc::Target { xrcd: xrcd.id });
        self.create_xrc_qp(xrc_init(xrc, QpCaps::default()))
    }

    fn create_xrc_qp(&self, init: crate::engine::verbs::QpInit) -> Result<QueuePair, VerbsError> {
        match &self.backend {
            Backend::Roce(s) => Ok(QueuePair { qpn: s.lock().dev.create_qp(init)?, backend: self.backend.clone() }),
            Backend::Iwarp(_) => Err(VerbsError::Unsupported),
        }
    }

    /// `rdma_create_qp`: an RC QP for [`QueuePair::connect`] or [`ConnRequest::accept`]
    /// that takes receives before it connects (from `srq` if given), on either
    /// transport: on RoCEv2 it is in INIT with remote READ, WRITE and atomic access, as
    /// rdma_cm leaves it.
    pub fn create_cm_qp(
        &self,
        pd: &ProtectionDomain,
        (send_cq, recv_cq): (&CompletionQueue, &CompletionQueue),
        caps: QpCaps,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<QueuePair, VerbsError> {
        let qp = self.create_qp(pd, send_cq, recv_cq, QpType::Rc, caps, srq)?;
        if let Backend::Roce(_) = &self.backend {
            let init = QpAttr {
                state: Some(QpState::Init),
                access: Some(Access::ALL),
                pkey: Some(0xffff),
                ..QpAttr::default()
            };
            qp.modify(&init)?;
        }
        Ok(qp)
    }

    /// Receives and processes what has arrived, on the caller's thread, without waiting.
    /// Returns the number of datagrams (RoCEv2) or bytes (iWARP) handled. Latency-bound
    /// loops call this while they spin, inside a [`Context::busy_poll`] section.
    pub fn progress(&self) -> usize {
        match &self.backend {
            Backend::Roce(s) => s.progress(Poller::BusyPolling),
            Backend::Iwarp(s) => s.progress(),
        }
    }

    /// `ibv_destroy_flow`: removes flow rule `id` of this device, made by
    /// [`QueuePair::create_flow`] (gone already if its QP was destroyed: `NotFound`).
    pub fn destroy_flow(&self, id: u32) -> Result<(), VerbsError> {
        match &self.backend {
            Backend::Roce(s) => s.with_core(|d| d.destroy_flow(id)),
            Backend::Iwarp(_) => Err(VerbsError::Unsupported),
        }
    }

    /// Blocks until something may have arrived for [`Context::progress`] to receive, or
    /// `timeout` passes; returns whether input is waiting. A busy-polling caller whose
    /// looks find nothing waits here instead of spinning, which on a machine with one
    /// CPU leaves it to the threads (the kernel's, a hypervisor's) that bring the input.
    pub fn wait_input(&self, timeout: std::time::Duration) -> bool {
        match &self.backend {
            Backend::Roce(s) => s.wait_input(timeout),
            Backend::Iwarp(s) => s.wait_input(timeout),
        }
    }

    /// As [`Context::progress`], for a caller outside a busy-polling section (a C
    /// application polling its CQ): replies to what arrived go out at once rather than
    /// waiting for this thread's next post.
    pub fn progress_now(&self) -> usize {
        match &self.backend {
            Backend::Roce(s) => {
                s.app_polling();
                let n = s.progress(Poller::Application);
                s.app_polled();
                n
            }
            Backend::Iwarp(s) => s.progress(),
        }
    }

    /// Waits (at most [`crate::driver::iwarp_tcp::LINGER`]) until the peers of the
    /// connections this process is closing have acknowledged all their data (iWARP on
    /// kernel TCP; nothing to wait for elsewhere).
    pub fn wait_closes_acknowledged(&self) {
        if let Backend::Iwarp(_) = &self.backend {
            driver::iwarp_tcp::wait_closes_acknowledged(driver::iwarp_tcp::LINGER);
        }
    }

    /// Receives once on the caller's thread without claiming the socket from the poll
    /// thread (as [`Context::progress_now`] does for a loop polling a CQ): for a library
    /// on top of the verbs (rsockets) whose callers return to the application between
    /// calls, and may spin on memory there.
    pub fn progress_once(&self) -> usize {
        match &self.backend {
            Backend::Roce(s) => s.progress(Poller::Application),
            Backend::Iwarp(s) => s.progress(),
        }
    }

    /// The caller stopped polling and is about to block (for a completion event): the
    /// poll thread receives for it again from now ([`Context::progress_now`] had it leave
    /// the socket to the caller for a while).
    pub fn stop_polling(&self) {
        if let Backend::Roce(s) = &self.backend {
            s.app_waiting();
        }
    }

    /// Receives and answers on the caller's thread while `keep_going` holds, replies leaving
    /// at once: the passive side of a test (a READ target) then answers with no thread
    /// wake-up, as an RDMA NIC's responder does with no CPU at all. Looks that find nothing
    /// for [`BUSY_POLL_IDLE_NS`] turn into waits in `poll(2)`, at most [`LOOK_WAIT_MAX`]
    /// at a time, so an idle server does not hold a CPU.
    pub fn serve_while(&self, mut keep_going: impl FnMut() -> bool) {
        let _section = self.busy_poll();
        let reply_at_once = || match &self.backend {
            Backend::Roce(s) => s.progress(Poller::Application),
            Backend::Iwarp(s) => s.progress(),
        };
        look_until(self, reply_at_once, || !keep_going(), None);
    }

    /// Starts a busy-polling section: until the guard drops, the poll thread leaves the
    /// socket(s) to callers of [`Context::progress`] (and keeps firing timers), so what
    /// arrives is handled on the spinning thread with no thread hand-off.
    pub fn busy_poll(&self) -> BusyPoll<'_> {
        match &self.backend {
            Backend::Roce(s) => s.busy_enter(),
            Backend::Iwarp(s) => s.busy_enter(),
        }
        BusyPoll { ctx: self }
    }

    /// How the device's packets move, for reports: e.g. "kernel UDP sockets", or "raw
    /// Ethernet on veth0, AF_XDP, copy mode, native XDP".
    pub fn link(&self) -> String {
        match &self.backend {
            Backend::Roce(s) => s.lock().tx.describe(),
            Backend::Iwarp(_) => "kernel TCP".into(),
        }
    }

    /// The device's counters.
    pub fn stats(&self) -> DeviceStats {
        let shared = match &self.backend {
            Backend::Roce(shared) => shared,
            Backend::Iwarp(s) => {
                let (engine, conns) = driver::iwarp::with(&**s, |d| (d.dev.stats.clone(), d.connections()));
                return DeviceStats { engine, iwarp_connections: conns as u64, ..DeviceStats::default() };
            }
        };
        let engine = shared.lock().dev.stats.clone();
        let u = &shared.link_stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DeviceStats {
            engine,
            rx_datagrams: get(&u.rx_datagrams),
            rx_icrc_bad: get(&u.rx_icrc_bad),
            rx_runt: get(&u.rx_runt),
            rx_ipv4_ident_nonzero: get(&u.rx_ipv4_ident_nonzero),
            tx_datagrams: get(&u.tx_datagrams),
            tx_errors: get(&u.tx_errors),
            rx_fragments: get(&u.rx_fragments),
            rx_not_ours: get(&u.rx_not_ours),
            neighbour_replies: get(&u.neighbour_replies),
            neighbour_requests: get(&u.neighbour_requests),
            echo_replies: get(&u.echo_replies),
            tx_unresolved: get(&u.tx_unresolved),
            forwarded_out: get(&u.forwarded_out),
            forwarded_in: get(&u.forwarded_in),
            forward_dropped: get(&u.forward_dropped),
            poll_thread_wakeups: get(&shared.poll_thread_wakeups),
            poll_thread_packets: get(&shared.poll_thread_packets),
            iwarp_connections: 0,
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        match &self.backend {
            Backend::Roce(s) => s.stop(),
            Backend::Iwarp(s) => s.stop(),
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Backend::Roce(s) = &self.backend {
            s.close_log();
        }
    }
}

/// Device memory ([`Context::alloc_dm`]); given back to the device when dropped. Regions
/// over it keep its bytes alive.
pub struct DeviceMemory {
    mem: Arc<SharedMem>,
    backend: Backend,
}

impl DeviceMemory {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    /// True for none (never: [`Context::alloc_dm`] refuses zero bytes).
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }
    /// `ibv_memcpy_from_dm`: copies out from `offset`; false if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        self.mem.read(offset, out)
    }
    /// `ibv_memcpy_to_dm`: copies in at `offset`; false if out of bounds.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        self.mem.write(offset, data)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        let len = self.mem.len();
        self.backend.with_dev(|d| d.release_device_memory(len));
    }
}

/// An XRC QP's creation attributes, the CQs and PD left for the caller.
fn xrc_init(xrc: Option<crate::engine::verbs::Xrc>, caps: QpCaps) -> crate::engine::verbs::QpInit {
    crate::engine::verbs::QpInit { qp_type: QpType::Rc, pd: Pd(0), send_cq: 0, recv_cq: 0, caps, srq: None, xrc }
}

/// `ibv_xrcd`: an XRC domain ([`Context::open_xrcd`]); closed when dropped, unless an SRQ
/// or a target QP is still in it.
pub struct XrcDomain {
    id: u32,
    backend: Backend,
}

impl XrcDomain {
    /// `ibv_close_xrcd`: refused (`InvalidRequest`) while an SRQ or target QP is in it.
    pub fn close(&self) -> Result<(), VerbsError> {
        self.backend.with_dev(|d| d.dealloc_xrcd(self.id))
    }
}

impl Drop for XrcDomain {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Why [`Context::prefetch`] failed; the caller's fault either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchError {
    /// The key, PD, access or bounds do not hold for the range.
    Region(MemError),
    /// Part of the range has nothing mapped there (or not writable, for a write).
    NotMapped,
}

/// A busy-polling section ([`Context::busy_poll`]).
pub struct BusyPoll<'a> {
    ctx: &'a Context,
}

/// How long a busy-poller's looks may find nothing before it waits in `poll(2)` instead:
/// several round trips on the slowest path it is meant for (two one-vCPU QEMU/TCG guests,
/// whose ping-pong round trips run 0.4-1 ms and often several), where waiting at once was
/// measured slower than spinning (RoCEv2 64-byte WRITE latency 579-874 µs against 415-458
/// µs), and so was waiting after 1 ms (the WRITE, READ and SEND ping-pongs 211-267, 288-498
/// and 216-247 µs against 206-226, 270-272 and 204-205 after 5 ms; 30 % of the client's
/// context switches were that sleep), and short enough that a caller whose peer went
/// quiet stops burning a CPU within a few milliseconds.
pub const BUSY_POLL_IDLE_NS: u64 = 5_000_000;

/// The longest a [`BusyPoll::until`] waits for input before it looks again and lets its caller
/// check again (a completion can also come from the poll thread: a timer, a write the
/// socket took later).
pub const LOOK_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(1);

impl BusyPoll<'_> {
    /// Looks for input on the caller's thread ([`Context::progress`]) until `cond` holds,
    /// for at most `limit`; returns whether it held. Looks spin while they find traffic;
    /// once they have found nothing for [`BUSY_POLL_IDLE_NS`], the caller waits in
    /// `poll(2)` for input, at most [`LOOK_WAIT_MAX`] at a time, instead of spinning.
    pub fn until(&mut self, cond: impl FnMut() -> bool, limit: std::time::Duration) -> bool {
        let ctx = self.ctx;
        look_until(ctx, || ctx.progress(), cond, Some(limit))
    }

    /// The next completion of `cq`, looking for input meanwhile ([`BusyPoll::until`]);
    /// `None` if none came within `limit`.
    pub fn next_completion(&mut self, cq: &CompletionQueue, limit: std::time::Duration) -> Option<Wc> {
        let mut wc = None;
        self.until(
            || {
                wc = cq.poll_one();
                wc.is_some()
            },
            limit,
        );
        wc
    }
}

/// Looks for input with `look` (returning what it handled) until `cond` holds, or `limit`
/// passes; returns whether it held. Looks spin while they find traffic; after
/// [`BUSY_POLL_IDLE_NS`] of nothing, the caller waits in `poll(2)`, at most
/// [`LOOK_WAIT_MAX`] at a time; every 64 looks it yields the CPU. The clock is read once
/// the first look is due and then only by looks that find nothing: a condition already
/// true, and the look that brought what made it true (a ping-pong's critical path), read
/// none.
fn look_until(
    ctx: &Context,
    mut look: impl FnMut() -> usize,
    mut cond: impl FnMut() -> bool,
    limit: Option<std::time::Duration>,
) -> bool {
    let (mut start, mut idle_since) = (None, None);
    let mut looks = 0u32;
    while !cond() {
        let start = *start.get_or_insert_with(std::time::Instant::now);
        // A wait that ends with input leaves it to the next look, which counts it as
        // traffic: the caller spins again while input keeps coming.
        if look() > 0 {
            idle_since = None;
        } else {
            let now = std::time::Instant::now();
            let since = *idle_since.get_or_insert(now);
            if now.duration_since(since).as_nanos() as u64 >= BUSY_POLL_IDLE_NS {
                ctx.wait_input(LOOK_WAIT_MAX);
            }
        }
        looks = looks.wrapping_add(1);
        if looks.is_multiple_of(64) {
            if limit.is_some_and(|l| start.elapsed() > l) {
                return false;
            }
            std::thread::yield_now();
        }
    }
    true
}

impl Drop for BusyPoll<'_> {
    fn drop(&mut self) {
        match &self.ctx.backend {
            Backend::Roce(s) => s.busy_leave(),
            Backend::Iwarp(s) => s.busy_leave(),
        }
    }
}

/// `ibv_pd`.
#[derive(Debug)]
pub struct ProtectionDomain {
    pd: Pd,
}

impl ProtectionDomain {
    /// The same protection domain under a second handle: a parent domain
    /// (`ibv_alloc_parent_domain`) is a PD whose objects belong to the PD it wraps.
    pub fn parent_domain(&self) -> ProtectionDomain {
        ProtectionDomain { pd: self.pd }
    }
}

/// `ibv_mr`: registered memory. Its bytes are atomic words the engine and the application
/// share (see ARCHITECTURE.md), read and written by copy.
pub struct MemoryRegion {
    mr: Mr,
    backend: Backend,
}

impl MemoryRegion {
    /// `ibv_rereg_mr`: a new PD, access, or buffer (`ptr`, `len`, named `iova` by peers),
    /// each kept when `None`; the keys stay. The old buffer is never touched again.
    ///
    /// # Safety
    /// A new buffer is as for [`Context::reg_user_mr`]: the caller's, valid, until the
    /// region is deregistered or reregistered again.
    #[allow(unsafe_code)]
    pub unsafe fn rereg(
        &mut self,
        pd: Option<&ProtectionDomain>,
        access: Option<Access>,
        buffer: Option<(std::ptr::NonNull<u8>, usize, u64)>,
        on_demand: Option<bool>,
    ) -> Result<(), VerbsError> {
        // An on-demand region stays one unless the new access says otherwise; a flip with
        // no new buffer takes the old one's addresses.
        let was = self.mr.mem.is_on_demand();
        let odp = on_demand.unwrap_or(was);
        let buffer = match (buffer, self.mr.mem.foreign_addr()) {
            (None, Some(addr)) if odp != was => Some((
                std::ptr::NonNull::new(addr as *mut u8).ok_or(VerbsError::InvalidRequest)?,
                self.mr.len,
                self.mr.addr,
            )),
            (b, _) => b,
        };
        let mem = buffer.map(|(ptr, len, iova)| {
            let mem = match odp {
                true => SharedMem::on_demand(ptr.as_ptr() as usize, len),
                // SAFETY: the caller's contract is SharedMem::foreign's.
                false => unsafe { SharedMem::foreign(ptr, len) },
            };
            (Arc::new(mem), iova)
        });
        let change = crate::engine::mem::Rereg { pd: pd.map(|p| p.pd), access, mem };
        self.mr = self.backend.with_dev(|d| d.rereg_mr(&self.mr, change))?;
        Ok(())
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey
    }
    /// The address of the first byte, as remote peers name it.
    pub fn addr(&self) -> u64 {
        self.mr.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len
    }
    /// True for an empty region.
    pub fn is_empty(&self) -> bool {
        self.mr.len == 0
    }
    /// An SGE of `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge { addr: self.mr.addr + offset as u64, length: len, lkey: self.mr.lkey }
    }
    /// Copies out of the region; false if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        self.in_bounds(offset, out.len()) && self.mr.mem.read(self.mr.start + offset, out)
    }
    /// Copies into the region; false if out of bounds.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        self.in_bounds(offset, data.len()) && self.mr.mem.write(self.mr.start + offset, data)
    }
    fn in_bounds(&self, offset: usize, n: usize) -> bool {
        offset.checked_add(n).is_some_and(|end| end <= self.mr.len)
    }
    /// The shared bytes (for a region over part of device memory, all of that memory).
    pub fn mem(&self) -> &Arc<SharedMem> {
        &self.mr.mem
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _ = self.backend.with_dev(|d| d.dereg_mr(&self.mr));
    }
}

/// `ibv_mw`: a memory window (IBTA 10.6.7), bound with a [`SendOp::BindMw`] work request.
/// RoCEv2 only (siw has none either).
pub struct MemoryWindow {
    key: u32,
    kind: MwType,
    backend: Backend,
}

impl MemoryWindow {
    /// The key it was allocated with (its index names it whatever a bind made its low 8
    /// bits).
    pub fn key(&self) -> u32 {
        self.key
    }
    /// Type 1 or 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let _ = self.backend.with_dev(|d| d.dealloc_mw(self.key));
    }
}

/// `ibv_cq`.
pub struct CompletionQueue {
    id: u32,
    queue: Arc<CqQueue>,
    backend: Backend,
}

impl CompletionQueue {
    /// One completion if there is one, without waiting (`ibv_poll_cq` for one entry).
    pub fn poll_one(&self) -> Option<Wc> {
        self.queue.poll_one()
    }

    /// `ibv_poll_cq`: up to `max` completions, without waiting.
    pub fn poll(&self, max: usize) -> Vec<Wc> {
        self.queue.poll(max)
    }

    /// As [`CompletionQueue::poll`], each completion with the [`device_clock_ns`] time it
    /// reached the CQ (`ibv_wc_read_completion_ts`), once [`CompletionQueue::stamp_completions`]
    /// asked for it (0 before).
    pub fn poll_stamped(&self, max: usize) -> Vec<(Wc, u64)> {
        self.queue.poll_stamped(max)
    }

    /// Completions from now on carry the time they reached the CQ.
    pub fn stamp_completions(&self) {
        self.queue.stamp_completions();
    }

    /// True once a completion found the CQ full and was lost (IBTA 11.4.2.1 CQ overrun,
    /// an application error: the CQ was created smaller than the work it completes).
    pub fn overrun(&self) -> bool {
        self.queue.overrun()
    }

    /// The number of completions the CQ holds at most.
    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }

    /// One completion, waiting at most `timeout` for it.
    pub fn wait(&self, timeout: Duration) -> Option<Wc> {
        self.queue.wait(timeout)
    }

    /// `ibv_resize_cq`: room for `cqe` completions (at most [`MAX_CQE`]) from now on;
    /// `InvalidRequest` while the CQ holds more than that. Returns the new capacity.
    pub fn resize(&self, cqe: usize) -> Result<usize, VerbsError> {
        let cqe = cqe.min(MAX_CQE);
        let old = self.queue.capacity();
        self.backend.with_dev(|d| d.resize_cq(self.id, cqe))?;
        if !self.queue.resize(cqe) {
            let _ = self.backend.with_dev(|d| d.resize_cq(self.id, old));
            return Err(VerbsError::InvalidRequest);
        }
        Ok(cqe)
    }

    /// `ibv_req_notify_cq`: the next completion raises one event.
    pub fn req_notify(&self) {
        self.queue.arm();
    }

    /// Where events go (a completion channel); false if the CQ already has a handler. The
    /// handler runs on whichever thread delivers the completion, outside the CQ's lock.
    pub fn set_event_handler(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        self.queue.set_event_handler(f)
    }
}

/// `ibv_srq`.
pub struct SharedReceiveQueue {
    id: u32,
    backend: Backend,
}

impl SharedReceiveQueue {
    /// The SRQ's number, as its asynchronous events name it.
    pub fn srq_num(&self) -> u32 {
        self.id
    }

    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        self.backend.with_dev(|d| d.post_srq_recv(self.id, wr))
    }
    /// One `ibv_post_srq_ops` operation on a tag-matching SRQ; an added buffer's handle.
    pub fn post_op(&self, op: &crate::engine::tm::OpsWr) -> Result<Option<u32>, VerbsError> {
        self.backend.with_dev(|d| d.post_srq_op(self.id, op))
    }
    /// Arms the limit event (`ibv_modify_srq` with `srq_limit`).
    pub fn arm_limit(&self, limit: usize) -> Result<(), VerbsError> {
        self.backend.with_dev(|d| d.arm_srq_limit(self.id, limit))
    }
    /// `ibv_destroy_srq`: refused (`InvalidRequest`) while a QP uses it; dropping the
    /// handle afterwards is then all that is left.
    pub fn destroy(&self) -> Result<(), VerbsError> {
        self.backend.with_dev(|d| d.destroy_srq(self.id))
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // Gone already if `destroy` ran; still used by a QP, it stays for that QP.
        let _ = self.destroy();
    }
}

/// What [`QueuePair::query`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qp_num: u32,
    /// State.
    pub state: QpState,
    /// The PSN the send queue assigns next.
    pub sq_psn: u32,
    /// The PSN the receive queue expects next.
    pub rq_psn: u32,
}

/// `ibv_qp`.
pub struct QueuePair {
    qpn: u32,
    backend: Backend,
}

impl QueuePair {
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// `ibv_attach_mcast`: this UD QP receives the datagrams sent to multicast group
    /// `mgid` (an IPv4-mapped class D address, as rdma_cm maps groups on RoCEv2) with
    /// DestQP 0xFFFFFF. RoCEv2 on kernel UDP sockets only (IPv4); iWARP has no multicast.
    pub fn attach_mcast(&self, mgid: Gid) -> Result<(), VerbsError> {
        match &self.backend {
            Backend::Roce(s) => s.attach_mcast(self.qpn, mgid),
            Backend::Iwarp(_) => Err(VerbsError::Unsupported),
        }
    }

    /// `ibv_detach_mcast`.
    pub fn detach_mcast(&self, mgid: Gid) -> Result<(), VerbsError> {
        match &self.backend {
            Backend::Roce(s) => s.detach_mcast(self.qpn, mgid),
            Backend::Iwarp(_) => Err(VerbsError::Unsupported),
        }
    }

    /// `ibv_create_flow`: frames the device's raw packet QPs send that `rule` takes come
    /// to this raw packet QP; returns the rule's id. RoCEv2 devices only.
    pub fn create_flow(&self, rule: crate::engine::raw::FlowRule) -> Result<u32, VerbsError> {
        match &self.backend {
            Backend::Roce(s) => s.with_core(|d| d.create_flow(self.qpn, rule)),
            Backend::Iwarp(_) => Err(VerbsError::Unsupported),
        }
    }

    /// Makes this raw packet QP scale its receives over `table`'s work queues, each an
    /// SRQ whose receives complete on its CQ, in `pd` (`ibv_create_qp_ex` with
    /// `IBV_QP_INIT_ATTR_RX_HASH` and an indirection table): the Toeplitz hash of the
    /// `fields` (verbs' `IBV_RX_HASH_*` bits) under `key` picks the queue. RoCEv2 only.
    pub fn set_rx_hash(
        &self,
        key: Vec<u8>,
        fields: u64,
        table: &[(&SharedReceiveQueue, &CompletionQueue)],
        pd: &ProtectionDomain,
    ) -> Result<(), VerbsError> {
        let table =
            table.iter().map(|(srq, cq)| crate::engine::raw::WorkQueue { srq: srq.id, cq: cq.id, pd: pd.pd }).collect();
        let h = crate::engine::raw::RxHash { key, fields, table };
        match &self.backend {
            Backend::Roce(s) => s.with_core(|d| d.set_rx_hash(self.qpn, h)),
            Backend::Iwarp(_) => Err(VerbsError::Unsupported),
        }
    }

    /// `ibv_modify_qp`. On iWARP, where connections move the state, only ERR is taken.
    /// A reset drops the QP's completions nobody polled yet, as mlx5 does (an
    /// application restarting a failed QP does not meet the old one's flushes).
    pub fn modify(&self, attr: &QpAttr) -> Result<(), VerbsError> {
        match &self.backend {
            Backend::Roce(s) => {
                s.with_core(|d| d.modify_qp(self.qpn, attr))?;
                if attr.state == Some(QpState::Reset) {
                    s.remove_completions_of(self.qpn);
                }
                Ok(())
            }
            Backend::Iwarp(s) if attr.state == Some(QpState::Err) => {
                driver::iwarp::with(&**s, |d| d.set_error(self.qpn))
            }
            Backend::Iwarp(_) => Err(VerbsError::InvalidAttribute("iWARP QPs connect with connect/accept")),
        }
    }

    /// The QP's state.
    pub fn state(&self) -> Option<QpState> {
        match &self.backend {
            Backend::Roce(s) => s.lock().dev.qp_state(self.qpn),
            Backend::Iwarp(s) => driver::iwarp::with(&**s, |d| d.qp_state(self.qpn)),
        }
    }

    /// `ibv_query_qp`: state and sequence numbers (0 on iWARP, which has none).
    pub fn query(&self) -> Option<QpInfo> {
        let Backend::Roce(s) = &self.backend else {
            return self.state().map(|state| QpInfo { qp_num: self.qpn, state, sq_psn: 0, rq_psn: 0 });
        };
        let core = s.lock();
        let state = core.dev.qp_state(self.qpn)?;
        let (sq_psn, rq_psn) = core.dev.qp_psns(self.qpn)?;
        Some(QpInfo { qp_num: self.qpn, state, sq_psn, rq_psn })
    }

    /// `ibv_post_send`: the caller's thread segments and sends.
    pub fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
        self.post_send_batch([wr])
    }

    /// Posts several send requests under one lock; stops at the first error.
    pub fn post_send_batch(&self, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), VerbsError> {
        match &self.backend {
            Backend::Roce(s) => s.with_core(|d| wrs.into_iter().try_for_each(|wr| d.post_send(self.qpn, wr))),
            Backend::Iwarp(s) => driver::iwarp::with(&**s, |d| d.post_send(self.qpn, wrs)),
        }
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        match &self.backend {
            Backend::Roce(s) => s.with_core_holding(|d| d.post_recv(self.qpn, wr)),
            Backend::Iwarp(s) => driver::iwarp::with(&**s, |d| d.post_recv(self.qpn, wr)),
        }
    }

    /// Connects to a listener at `to` (`rdma_connect`), waiting at most `timeout`: TCP, the
    /// MPA Request and Reply on iWARP; the CM's REQ, REP and RTU through QP1 on RoCEv2.
    /// Returns the peer's private data; the QP is in RTS.
    pub fn connect(&self, to: SocketAddr, param: &ConnParam, timeout: Duration) -> Result<Vec<u8>, ConnectError> {
        self.connect_reporting(to, param, timeout, &mut || {})
    }

    /// As [`QueuePair::connect`], calling `request_sent` once the connection request (the
    /// MPA Request, the REQ) is on its way, before the reply: a caller that starts several
    /// connections can let each go out only after the one before, so that a listener sees
    /// them in the order they were made (see capi's `rdma_connect`).
    pub fn connect_reporting(
        &self,
        to: SocketAddr,
        param: &ConnParam,
        timeout: Duration,
        request_sent: &mut dyn FnMut(),
    ) -> Result<Vec<u8>, ConnectError> {
        match &self.backend {
            Backend::Iwarp(s) => driver::iwarp::connect(&**s, self.qpn, to, param, timeout, request_sent),
            Backend::Roce(s) => driver::roce_cm::connect(s, self.qpn, to, param, timeout, request_sent),
        }
    }

    /// Tears the QP's connection down (`rdma_disconnect`): the QP goes to ERR (its work
    /// requests flush) and the peer hears of it: a DREQ on RoCEv2 (IBTA 12.9.8.2), the TCP
    /// stream closed on iWARP. NotFound if the QP was not connected by the CM.
    pub fn disconnect(&self) -> Result<(), VerbsError> {
        match &self.backend {
            Backend::Roce(s) => s.with_core_at(|d, now| {
                d.with_cm(now, |cm, qps| cm.disconnect_qp(now, self.qpn, qps)).map_err(|_| VerbsError::NotFound)
            }),
            Backend::Iwarp(s) => driver::iwarp::with(&**s, |d| d.disconnect(self.qpn)),
        }
    }

    /// Takes an RC or UC QP from RESET to RTS towards `dest_qpn` at `dest_gid`, the way
    /// perftest and ibv_rc_pingpong do: `rq_psn` is the PSN the peer starts sending with,
    /// `sq_psn` the one this QP starts with. Timeout 14 (67 ms), 7 retries, infinite RNR
    /// retries; up to 128 READs/atomics from the peer served at once (rxe's limit, and what
    /// perftest then asks for), 16 outstanding of its own until the caller raises it.
    pub fn connect_rc(
        &self,
        dest_gid: Gid,
        dest_qpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        mtu: Mtu,
    ) -> Result<(), VerbsError> {
        let state = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        self.modify(&QpAttr { access: Some(Access::ALL), pkey: Some(0xffff), ..state(QpState::Init) })?;
        self.modify(&QpAttr {
            dest_gid: Some(dest_gid),
            dest_qpn: Some(dest_qpn),
            rq_psn: Some(rq_psn),
            path_mtu: Some(mtu),
            max_dest_rd_atomic: Some(128),
            min_rnr_timer: Some(12),
            ..state(QpState::Rtr)
        })?;
        self.modify(&QpAttr {
            sq_psn: Some(sq_psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..state(QpState::Rts)
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        match &self.backend {
            Backend::Roce(s) => {
                let _ = s.with_core_at(|d, now| d.destroy_qp_at(now, self.qpn));
                s.leave_emptied_groups();
            }
            Backend::Iwarp(s) => driver::iwarp::with(&**s, |d| d.destroy_qp(self.qpn)),
        }
    }
}

/// A listener (`rdma_listen` on a bound `rdma_cm_id`). Dropping it stops listening and
/// rejects the requests nobody took.
pub struct Listener {
    local: SocketAddr,
    kind: ListenerKind,
}

enum ListenerKind {
    Iwarp { id: ConnId, port: Arc<dyn IwarpPort> },
    Roce { port: u16, driver: Arc<RoceDriver> },
}

impl Listener {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next connection request (`RDMA_CM_EVENT_CONNECT_REQUEST`): a peer whose MPA
    /// Request or CM REQ arrived, waiting for [`ConnRequest::accept`] or
    /// [`ConnRequest::reject`].
    pub fn get_request(&self, timeout: Duration) -> Option<ConnRequest> {
        match &self.kind {
            ListenerKind::Iwarp { id, port } => {
                let (id, req, peer) = driver::iwarp::get_request(&**port, *id, timeout)?;
                Some(ConnRequest {
                    private_data: req.private_data,
                    responder_resources: req.ord,
                    initiator_depth: req.ird,
                    peer,
                    kind: RequestKind::Iwarp { id, port: port.clone() },
                    answered: false,
                })
            }
            ListenerKind::Roce { port, driver } => {
                let r = driver::roce_cm::get_request(driver, *port, timeout)?;
                Some(ConnRequest {
                    private_data: r.private_data,
                    responder_resources: u16::from(r.initiator_depth),
                    initiator_depth: u16::from(r.responder_resources),
                    peer: r.peer.map(|(ip, port)| SocketAddr::new(ip, port)),
                    kind: RequestKind::Roce { id: r.id, driver: driver.clone() },
                    answered: false,
                })
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        match &self.kind {
            ListenerKind::Iwarp { id, port } => port.close_listener(*id),
            ListenerKind::Roce { port, driver } => driver::roce_cm::close_listener(driver, *port),
        }
    }
}

/// A peer's connection request. Dropping it unanswered rejects it.
pub struct ConnRequest {
    /// The initiator's private data (on RoCEv2, what follows rdma_cm's IP header).
    pub private_data: Vec<u8>,
    /// Reads the initiator may have outstanding towards this side (its ORD), the most
    /// this side's `responder_resources` needs.
    pub responder_resources: u16,
    /// Reads the initiator serves at once (its IRD), the most this side's
    /// `initiator_depth` gets.
    pub initiator_depth: u16,
    /// The initiator's address.
    pub peer: Option<SocketAddr>,
    kind: RequestKind,
    answered: bool,
}

enum RequestKind {
    Iwarp { id: ConnId, port: Arc<dyn IwarpPort> },
    Roce { id: crate::cm::ConnId, driver: Arc<RoceDriver> },
}

impl ConnRequest {
    /// Accepts onto `qp` (`rdma_accept`): the MPA Reply, or the CM's REP, goes out, and
    /// this returns once the QP is in RTS.
    pub fn accept(mut self, qp: &QueuePair, param: &ConnParam) -> Result<(), ConnectError> {
        self.answered = true;
        match (&self.kind, &qp.backend) {
            (RequestKind::Iwarp { id, port }, Backend::Iwarp(s))
                if std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(port)) =>
            {
                let (id, qpn) = (*id, qp.qpn);
                driver::iwarp::with(&**port, |d| d.accept(id, qpn, param))
            }
            (RequestKind::Roce { id, driver }, Backend::Roce(s)) if Arc::ptr_eq(s, driver) => {
                driver::roce_cm::accept(driver, *id, qp.qpn, param)
            }
            _ => Err(ConnectError::Invalid("the QP is not on this listener's device")),
        }
    }

    /// Rejects (`rdma_reject`) with `private_data`: an MPA Reply with the reject bit, or
    /// the CM's REJ "consumer reject".
    pub fn reject(mut self, private_data: &[u8]) {
        self.answered = true;
        self.send_reject(private_data);
    }

    fn send_reject(&self, private_data: &[u8]) {
        match &self.kind {
            RequestKind::Iwarp { id, port } => {
                let id = *id;
                driver::iwarp::with(&**port, |d| d.reject(id, private_data));
            }
            RequestKind::Roce { id, driver } => driver::roce_cm::reject(driver, *id, private_data),
        }
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if !self.answered {
            self.send_reject(b"");
        }
    }
}

impl SendWr {
    /// A signaled, unsolicited request on a connected QP.
    pub fn new(wr_id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
        SendWr { wr_id, op, sgl, signaled: true, solicited: false, ud: None, xrc_srqn: 0 }
    }
}
