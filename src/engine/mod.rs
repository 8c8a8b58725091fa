//! The RoCEv2 engine, sans-I/O (IBTA vol.1 ch. 9–11, Annex A17).
//!
//! Nothing here reads a clock, touches a socket or starts a thread. Inputs: verbs calls,
//! [`Device::handle_packet`] with a datagram and `now`, [`Device::handle_timeout`] with
//! `now`. Outputs: [`Device::poll_transmit`] (packets, BTH to ICRC with a zero ICRC the
//! transport fills over the real IP header), [`Device::poll_timeout`] (the next deadline)
//! and [`Device::poll_cq`] (completions).
//!
//! Polling order after any input: drain `poll_transmit` until `None`, then arm a timer for
//! `poll_timeout`, then poll the CQs. `poll_transmit` produces packets lazily, a few per QP
//! in turn, so one QP cannot starve the others.

pub mod cc;
pub mod cq;
pub mod event;
pub mod gsi;
pub mod mcast;
pub mod mem;
pub mod qp;
pub mod raw;
pub mod raw_qp;
pub mod rng;
pub mod schedule;
pub mod srq;
pub mod tm;
pub mod verbs;

use crate::proto::roce::opcode::{Operation, Transport};
use crate::proto::roce::{RocePacket, RoceRepr};
use cq::{Cq, Notify};
use mem::{Access, Mr, MrTable, Pd, SharedMem};
use qp::completer::Verdict;
use qp::responder::QpView;
use qp::{Ctx, Qp};
use rng::Rng;
use rustc_hash::FxHashMap;
use std::collections::{HashMap, VecDeque};

/// The device's QPs by number. QPNs come from the CSPRNG and a peer cannot choose which
/// exist, so the hash need not resist chosen keys: Fx (rustc-hash) is a multiply per
/// lookup, where SipHash or a B-tree of a thousand QPs cost several percent of a
/// 1,000-QP run (`perf`); its order is fixed by the keys, so the simulator stays
/// deterministic. Boxed, so that the table's spare buckets (it doubles as it grows) cost a
/// pointer each rather than a whole QP: 1,000 idle QPs measured 1.50 KiB each unboxed.
pub(crate) type QpMap = FxHashMap<u32, Box<Qp>>;
use std::sync::Arc;
use verbs::*;

/// A packet for the transport to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Destination GID.
    pub dst: Gid,
    /// Source GID (from the QP's `sgid_index`): the transport sends from this address.
    pub src: Gid,
    /// The sending QP (the transport derives the UDP source port from it).
    pub src_qpn: u32,
    /// BTH through ICRC; the ICRC is zero.
    pub packet: Vec<u8>,
}

/// Device counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets handed to the transport.
    pub tx_packets: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Received packets that did not parse.
    pub rx_malformed: u64,
    /// Received packets for a QP that does not exist or is not connected to the sender.
    pub rx_unknown_qp: u64,
    /// Duplicate requests answered.
    pub duplicates_received: u64,
    /// PSN sequence error NAKs sent.
    pub seq_naks_sent: u64,
    /// PSN sequence error NAKs received.
    pub seq_naks_received: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Other NAKs sent.
    pub naks_sent: u64,
    /// Retransmit timer expiries.
    pub retransmit_timeouts: u64,
    /// READ responses out of order (dropped).
    pub out_of_order_responses: u64,
    /// Responses of the wrong shape (dropped).
    pub bad_responses: u64,
    /// UC packets dropped (after a gap, or no receive, a bad key or length).
    pub uc_dropped: u64,
    /// UD datagrams dropped for a wrong Q_Key.
    pub qkey_violations: u64,
    /// UD datagrams dropped for want of a receive.
    pub ud_no_receive: u64,
    /// Frames for a raw packet QP dropped for want of a receive.
    pub raw_no_receive: u64,
    /// Raw packet QPs' frames dropped because the driver did not take them to the wire.
    pub raw_wire_dropped: u64,
    /// Packets whose opcode belongs to another transport than the QP's.
    pub rx_wrong_transport: u64,
    /// Packets whose P_Key does not match their QP's (IBTA 10.9.3), dropped.
    pub rx_pkey_violations: u64,
    /// Packets received marked ECN-CE.
    pub rx_ecn_ce: u64,
    /// CNPs sent.
    pub cnps_sent: u64,
    /// CNPs received.
    pub cnps_received: u64,
    /// Completions queued on any CQ (lets a driver skip CQs when nothing completed).
    pub completions: u64,
}

/// Device configuration.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The device's first GID (index 0); more can be added with [`Device::add_gid`].
    pub gid: Gid,
    /// Seed of every random choice (keys, QPNs, initial PSNs), for the simulator and
    /// reproducible tests; `None` (a real device): the OS CSPRNG.
    pub seed: Option<u64>,
    /// Most QPs.
    pub max_qps: usize,
    /// Most memory regions.
    pub max_mrs: usize,
    /// Congestion control (off unless enabled).
    pub cc: cc::CcConfig,
}

/// Packets a QP may send per turn of `poll_transmit`.
const BURST: usize = 16;
/// Most sent packets' buffers a device keeps to build packets in ([`Device::recycle`]):
/// a send queue's burst, about 1 MiB of 4 KiB packets.
pub const SPARE_PACKETS_MAX: usize = 256;
/// Largest buffer kept: a packet of the largest MTU with its headers.
pub const SPARE_PACKET_BYTES_MAX: usize = 4096 + 128;
/// Packets one pass over the QPs queues before it stops ([`Device::poll_transmit`]).
const FILL_PACKETS: usize = 64;

/// The most device memory (`ibv_alloc_dm`) one device hands out, in all: a NIC's on-chip
/// memory is a few hundred KiB, and here, where it is the engine's own memory, the bound
/// keeps an application that allocates in a loop from taking the host's.
pub const MAX_DEVICE_MEMORY_BYTES: usize = 256 << 10;

/// A software RDMA device.
pub struct Device {
    cfg: DeviceConfig,
    rng: Rng,
    mrs: MrTable,
    cqs: cq::CqTable,
    qps: QpMap,
    next_pd: u32,
    /// Device memory handed out ([`Device::reserve_device_memory`]), bytes.
    device_memory_bytes: usize,
    next_cq: u32,
    out: VecDeque<Transmit>,
    /// Buffers of packets sent, for the next packets to be built in ([`Device::recycle`]).
    spare: Vec<Vec<u8>>,
    /// Multicast groups and their QPs.
    mcast: mcast::McastTable,
    /// Raw packet QPs' flow rules.
    flows: raw::FlowTable,
    /// The device has an Ethernet port for its raw QPs' frames.
    raw_wire: bool,
    /// Their frames for it, until the driver takes them.
    raw_out: VecDeque<Vec<u8>>,
    /// Raw packet QPs that scale their receives over work queues.
    rss: FxHashMap<u32, raw::RxHash>,
    /// Groups a destroyed QP left with no member, for the transport to leave.
    mcast_emptied: Vec<Gid>,
    srqs: FxHashMap<u32, srq::Srq>,
    /// SRQs that QPs outside the engine (iWARP) take receives from: how many QPs each.
    srq_holders: HashMap<u32, usize>,
    next_srq: u32,
    /// XRC domains open ([`Device::alloc_xrcd`]).
    xrcds: std::collections::BTreeSet<u32>,
    gids: Vec<Gid>,
    events: event::AsyncEvents,
    /// The QPs to visit: ready to send, or with a deadline.
    schedule: schedule::Schedule,
    /// Scratch lists, kept to spare allocations per visit: QPNs to visit, and each one's
    /// turn at sending (packets, next deadline).
    visit: Vec<u32>,
    turns: Vec<(u32, bool, Option<u64>)>,
    /// RC QPs with a loss window and requests outstanding: they share the device's
    /// loss-window budget, idle ones take none of it.
    window_busy_qps: u32,
    /// The connection manager, reached through QP1.
    cm: crate::cm::Cm,
    /// The PSN of QP1's next MAD.
    gsi_psn: u32,
    /// The latest `now` seen, for calls that take none.
    now_hint: u64,
    /// Counters.
    pub stats: Stats,
    /// QP1's counters.
    pub gsi_stats: gsi::GsiStats,
    /// The top byte of every QPN, when the address is shared ([`Device::set_id_tag`]).
    id_tag: Option<u8>,
}

impl Device {
    /// A device with no objects.
    pub fn new(cfg: DeviceConfig) -> Self {
        let mrs = MrTable::new(cfg.max_mrs);
        let mut rng = cfg.seed.map_or_else(Rng::os, Rng::new);
        let ca_guid = rng.next_u64();
        let cm = crate::cm::Cm::new(crate::cm::CmConfig::default(), ca_guid, rng.fork());
        Device {
            gids: vec![cfg.gid],
            rng,
            cm,
            gsi_psn: 0,
            now_hint: 0,
            gsi_stats: gsi::GsiStats::default(),
            id_tag: None,
            cfg,
            mrs,
            cqs: cq::CqTable::default(),
            qps: QpMap::default(),
            next_pd: 1,
            device_memory_bytes: 0,
            next_cq: 1,
            out: VecDeque::new(),
            spare: Vec::new(),
            mcast: mcast::McastTable::default(),
            flows: raw::FlowTable::default(),
            rss: FxHashMap::default(),
            raw_wire: false,
            raw_out: VecDeque::new(),
            mcast_emptied: Vec::new(),
            srqs: FxHashMap::default(),
            srq_holders: HashMap::new(),
            next_srq: 1,
            xrcds: std::collections::BTreeSet::new(),
            events: event::AsyncEvents::default(),
            schedule: schedule::Schedule::default(),
            visit: Vec::new(),
            turns: Vec::new(),
            window_busy_qps: 0,
            stats: Stats::default(),
        }
    }

    /// The device's GID.
    pub fn gid(&self) -> Gid {
        self.cfg.gid
    }

    /// Adds a GID (an IPv6 address, or an IPv4 one mapped) and returns its index.
    pub fn add_gid(&mut self, gid: Gid) -> u8 {
        if let Some(i) = self.gids.iter().position(|g| *g == gid) {
            return i as u8;
        }
        self.gids.push(gid);
        (self.gids.len() - 1) as u8
    }

    /// The GID table (IBTA 9.1: index 0 first).
    pub fn gids(&self) -> &[Gid] {
        &self.gids
    }

    /// A random 24-bit PSN for a new connection (IBTA 9.7.1: initial PSNs should vary).
    pub fn random_psn(&mut self) -> u32 {
        self.rng.next_u64() as u32 & 0xff_ffff
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> Pd {
        self.next_pd += 1;
        Pd(self.next_pd - 1)
    }

    /// Registers `len` bytes of memory.
    pub fn reg_mr(&mut self, pd: Pd, len: usize, access: Access) -> Result<Mr, VerbsError> {
        self.mrs.register(pd, len, access, &mut self.rng).ok_or(VerbsError::OutOfResources)
    }

    /// Registers `mem`, which the caller allocated (so a large region's allocation does
    /// not happen under the driver's device lock).
    pub fn reg_mem(&mut self, pd: Pd, mem: Arc<SharedMem>, access: Access) -> Result<Mr, VerbsError> {
        self.mrs.register_mem(pd, mem, access, None, &mut self.rng).ok_or(VerbsError::OutOfResources)
    }

    /// Registers `mem` with its first byte at address `addr`, as the application names it
    /// (a C application's own buffer: `ibv_reg_mr` with its pointer or an IOVA).
    pub fn reg_mem_at(&mut self, pd: Pd, mem: Arc<SharedMem>, access: Access, addr: u64) -> Result<Mr, VerbsError> {
        if addr.checked_add(mem.len() as u64).is_none() {
            return Err(VerbsError::InvalidAttribute("the region wraps the address space"));
        }
        self.mrs.register_mem(pd, mem, access, Some(addr), &mut self.rng).ok_or(VerbsError::OutOfResources)
    }

    /// The memory-region table, read (iWARP frames payloads from it).
    pub fn mrs(&self) -> &MrTable {
        &self.mrs
    }

    /// The memory-region table, for a transport that places data itself (iWARP).
    pub fn mrs_mut(&mut self) -> &mut MrTable {
        &mut self.mrs
    }

    /// The regions and, if `srq` names one, that SRQ: what an iWARP QP taking its
    /// receives from a shared queue needs at once.
    pub fn mrs_and_srq_mut(&mut self, srq: Option<u32>) -> (&mut MrTable, Option<&mut srq::Srq>) {
        (&mut self.mrs, srq.and_then(|id| self.srqs.get_mut(&id)))
    }

    /// A QP outside the engine (iWARP) takes its receives from SRQ `srq`: `destroy_srq`
    /// refuses while it does.
    pub fn hold_srq(&mut self, srq: u32) -> Result<(), VerbsError> {
        if !self.srqs.contains_key(&srq) {
            return Err(VerbsError::NotFound);
        }
        *self.srq_holders.entry(srq).or_default() += 1;
        Ok(())
    }

    /// That QP is gone.
    pub fn release_srq(&mut self, srq: u32) {
        if let Some(n) = self.srq_holders.get_mut(&srq) {
            *n -= 1;
            if *n == 0 {
                self.srq_holders.remove(&srq);
            }
        }
    }

    /// A take by a QP outside the engine crossed SRQ `srq`'s armed limit (IBTA 11.6.3.3).
    pub fn srq_limit_reached(&mut self, srq: u32) {
        self.events.raise(event::AsyncEvent::SrqLimitReached(srq));
    }

    /// Reregisters a region, keeping its keys (IBTA 11.2.8.4).
    pub fn rereg_mr(&mut self, mr: &Mr, change: mem::Rereg) -> Result<Mr, VerbsError> {
        if let Some((m, addr)) = &change.mem {
            if addr.checked_add(m.len() as u64).is_none() {
                return Err(VerbsError::InvalidAttribute("the region wraps the address space"));
            }
        }
        self.mrs.reregister(mr.lkey, change).ok_or(VerbsError::NotFound)
    }

    /// Deregisters a region.
    pub fn dereg_mr(&mut self, mr: &Mr) -> Result<(), VerbsError> {
        self.mrs.deregister(mr.lkey).then_some(()).ok_or(VerbsError::NotFound)
    }

    /// Takes `len` bytes of the device's memory (`ibv_alloc_dm`) from its
    /// [`MAX_DEVICE_MEMORY_BYTES`]; false when they are not left.
    pub fn reserve_device_memory(&mut self, len: usize) -> bool {
        let total = self.device_memory_bytes.saturating_add(len);
        (total <= MAX_DEVICE_MEMORY_BYTES).then(|| self.device_memory_bytes = total).is_some()
    }

    /// Gives back `len` bytes of device memory (`ibv_free_dm`).
    pub fn release_device_memory(&mut self, len: usize) {
        self.device_memory_bytes = self.device_memory_bytes.saturating_sub(len);
    }

    /// Registers `len` bytes of `mem` from `start` (part of device memory, `ibv_reg_dm_mr`)
    /// in `pd`, named from `addr`.
    pub fn reg_span_at(
        &mut self,
        pd: Pd,
        span: (Arc<SharedMem>, usize, usize),
        access: Access,
        addr: u64,
    ) -> Result<Mr, VerbsError> {
        if addr.checked_add(span.2 as u64).is_none() {
            return Err(VerbsError::InvalidAttribute("the region wraps the address space"));
        }
        self.mrs.register_span(pd, span, access, Some(addr), &mut self.rng).ok_or(VerbsError::OutOfResources)
    }

    /// A memory window in `pd`, bound to nothing (`ibv_alloc_mw`); its key.
    pub fn alloc_mw(&mut self, pd: Pd, kind: mem::mw::MwType) -> Result<u32, VerbsError> {
        self.mrs.alloc_window(pd, kind, &mut self.rng).ok_or(VerbsError::OutOfResources)
    }

    /// Frees a memory window (`ibv_dealloc_mw`); its key opens nothing from now on.
    pub fn dealloc_mw(&mut self, key: u32) -> Result<(), VerbsError> {
        self.mrs.dealloc_window(key).then_some(()).ok_or(VerbsError::NotFound)
    }

    /// Local invalidate of an rkey (IBTA 10.6.7.2).
    pub fn invalidate(&mut self, rkey: u32) -> Result<(), VerbsError> {
        self.mrs.invalidate(rkey).then_some(()).ok_or(VerbsError::NotFound)
    }

    /// Creates a CQ with room for `capacity` completions.
    pub fn create_cq(&mut self, capacity: usize) -> u32 {
        let id = self.next_cq;
        self.next_cq += 1;
        self.cqs.insert(id, Cq::new(capacity));
        id
    }

    /// Resize CQ (IBTA 11.2.7.3): refused below the completions it holds.
    pub fn resize_cq(&mut self, cq: u32, capacity: usize) -> Result<(), VerbsError> {
        self.cqs.get_mut(cq).ok_or(VerbsError::NotFound)?.resize(capacity)
    }

    /// Takes up to `max` completions.
    pub fn poll_cq(&mut self, cq: u32, max: usize) -> Vec<Wc> {
        self.cqs.get_mut(cq).map(|c| c.poll(max)).unwrap_or_default()
    }

    /// As [`Device::poll_cq`], appending to `out` (a buffer the caller reuses).
    pub fn poll_cq_into(&mut self, cq: u32, max: usize, out: &mut Vec<Wc>) {
        if let Some(c) = self.cqs.get_mut(cq) {
            c.poll_into(max, out);
        }
    }

    /// True once a completion found the CQ full and was lost (IBTA 11.4.2.1 CQ overrun).
    pub fn cq_overflowed(&self, cq: u32) -> bool {
        self.cqs.get(cq).is_some_and(|c| c.overflowed())
    }

    /// Arms a CQ notification; [`Device::take_cq_event`] reports it.
    pub fn req_notify_cq(&mut self, cq: u32, what: Notify) {
        if let Some(c) = self.cqs.get_mut(cq) {
            c.req_notify(what);
        }
    }

    /// The CQs that gained completions since the last call, each once (the ones to poll),
    /// into `out`: cleared first, its buffer reused, so handing out allocates nothing.
    pub fn take_touched_cqs_into(&mut self, out: &mut Vec<u32>) {
        self.cqs.take_touched_into(out);
    }

    /// Takes a CQ's pending notification.
    pub fn take_cq_event(&mut self, cq: u32) -> bool {
        self.cqs.get_mut(cq).is_some_and(|c| c.take_event())
    }

    /// Creates a shared receive queue.
    pub fn create_srq(&mut self, max_wr: usize, max_sge: usize) -> u32 {
        let id = self.next_srq;
        self.next_srq += 1;
        self.srqs.insert(id, srq::Srq::new(max_wr, max_sge));
        id
    }

    /// Opens an XRC domain (`ibv_open_xrcd`); its number.
    pub fn alloc_xrcd(&mut self) -> u32 {
        let id = self.xrcds.last().map_or(1, |l| l + 1);
        self.xrcds.insert(id);
        id
    }

    /// Closes an XRC domain; refused (`InvalidRequest`) while an SRQ or a QP is in it, as
    /// `ibv_close_xrcd` refuses with EBUSY.
    pub fn dealloc_xrcd(&mut self, xrcd: u32) -> Result<(), VerbsError> {
        let srq_in = self.srqs.values().any(|s| s.xrc.is_some_and(|x| x.xrcd == xrcd));
        let qp_in = self.qps.values().any(|q| q.init.xrc == Some(Xrc::Target { xrcd }));
        if srq_in || qp_in {
            return Err(VerbsError::InvalidRequest);
        }
        self.xrcds.remove(&xrcd).then_some(()).ok_or(VerbsError::NotFound)
    }

    /// Creates an XRC SRQ in domain `xrcd` (`ibv_create_srq_ex`, `IBV_SRQT_XRC`): requests
    /// naming it are checked in `pd` and complete on `cq`. Its number is what initiators
    /// put in their XRCETH (`ibv_get_srq_num`).
    pub fn create_xrc_srq(&mut self, x: srq::XrcSrq, max_wr: usize, max_sge: usize) -> Result<u32, VerbsError> {
        if !self.xrcds.contains(&x.xrcd) || !self.cqs.contains(x.cq) {
            return Err(VerbsError::NotFound);
        }
        let id = self.create_srq(max_wr, max_sge);
        if let Some(s) = self.srqs.get_mut(&id) {
            s.xrc = Some(x);
        }
        Ok(id)
    }

    /// Creates a tag-matching SRQ (`ibv_create_srq_ex`, `IBV_SRQT_TM`): at most `max_tags`
    /// tagged buffers (up to [`tm::MAX_TAGS`]) besides its ordinary receives, and its
    /// receive and list-operation completions on `cq` ([`tm`]).
    pub fn create_tm_srq(
        &mut self,
        max_wr: usize,
        max_sge: usize,
        cq: u32,
        max_tags: usize,
    ) -> Result<u32, VerbsError> {
        if !self.cqs.contains(cq) {
            return Err(VerbsError::NotFound);
        }
        if max_tags > tm::MAX_TAGS {
            return Err(VerbsError::InvalidRequest);
        }
        let id = self.create_srq(max_wr, max_sge);
        if let Some(s) = self.srqs.get_mut(&id) {
            s.tm = Some(tm::TagList::new(max_tags, cq));
        }
        Ok(id)
    }

    /// One `ibv_post_srq_ops` operation on TM-SRQ `srq`; an added buffer's handle.
    pub fn post_srq_op(&mut self, srq: u32, op: &tm::OpsWr) -> Result<Option<u32>, VerbsError> {
        let list =
            self.srqs.get_mut(&srq).ok_or(VerbsError::NotFound)?.tm.as_mut().ok_or(VerbsError::InvalidRequest)?;
        let cq = list.cq;
        let (wc, handle) = list.apply(op)?;
        if let Some(wc) = wc {
            if self.cqs.push(cq, wc) {
                self.stats.completions += 1;
            }
        }
        Ok(handle)
    }

    /// Destroys a shared receive queue; refused (`InvalidRequest`) while a QP uses it,
    /// as `ibv_destroy_srq` refuses with EBUSY.
    pub fn destroy_srq(&mut self, srq: u32) -> Result<(), VerbsError> {
        if self.qps.values().any(|q| q.init.srq == Some(srq)) || self.srq_holders.contains_key(&srq) {
            return Err(VerbsError::InvalidRequest);
        }
        self.srqs.remove(&srq).map(drop).ok_or(VerbsError::NotFound)
    }

    /// Posts a receive to a shared receive queue.
    pub fn post_srq_recv(&mut self, srq: u32, wr: RecvWr) -> Result<(), VerbsError> {
        self.srqs.get_mut(&srq).ok_or(VerbsError::NotFound)?.post(wr)
    }

    /// Arms an SRQ's limit event (IBTA 11.2.3.3, modify SRQ with srq_limit).
    pub fn arm_srq_limit(&mut self, srq: u32, limit: usize) -> Result<(), VerbsError> {
        self.srqs.get_mut(&srq).ok_or(VerbsError::NotFound)?.arm(limit);
        Ok(())
    }

    /// Receives waiting in an SRQ.
    pub fn srq_len(&self, srq: u32) -> usize {
        self.srqs.get(&srq).map_or(0, |s| s.len())
    }

    /// The next asynchronous event, if any.
    pub fn poll_async_event(&mut self) -> Option<event::AsyncEvent> {
        self.events.pop()
    }

    /// True when an asynchronous event waits.
    pub fn has_async_event(&self) -> bool {
        !self.events.is_empty()
    }

    /// Events dropped because the application left [`event::ASYNC_EVENTS_MAX`] unread.
    pub fn async_events_dropped(&self) -> u64 {
        self.events.dropped
    }

    /// Queues an event a layer above the engine detected (an iWARP QP's Terminate).
    pub fn raise_async_event(&mut self, e: event::AsyncEvent) {
        self.events.raise(e);
    }

    /// QP `qpn` entered ERR (an iWARP QP, whose device notes it here).
    pub fn note_qp_error(&mut self, qpn: u32) {
        self.events.note_qp_error(qpn);
    }

    /// The QPs that entered ERR since the last call: the driver tells rdma_cm's ids
    /// (DISCONNECTED) without a thread watching each.
    pub fn take_errored_qps(&mut self) -> Vec<u32> {
        self.events.take_errored()
    }

    /// A random QPN for a new QP: 24 bits, never 0 or 1 (SMI, GSI) nor the rest of the
    /// first 16, drawn from the device's random source so that a peer cannot guess one.
    pub fn draw_qpn(&mut self, taken: impl Fn(u32) -> bool) -> u32 {
        draw_qpn(&mut self.rng, self.id_tag, taken)
    }

    /// Makes every later QPN and CM communication ID carry `tag` in its top byte (the
    /// rest stays random): the devices of several processes sharing one address tell
    /// their packets apart by it (`transport::share`).
    pub fn set_id_tag(&mut self, tag: u8) {
        self.id_tag = Some(tag);
        self.cm.set_id_tag(tag);
    }

    /// Creates a QP in RESET with a random QPN, never one of a live QP.
    pub fn create_qp(&mut self, init: QpInit) -> Result<u32, VerbsError> {
        if self.qps.len() >= self.cfg.max_qps {
            return Err(VerbsError::OutOfResources);
        }
        // An XRC initiator only sends, a target has no CQ of its own (its SRQs have).
        let (needs_send_cq, needs_recv_cq) = match init.xrc {
            Some(Xrc::Initiator) => (true, false),
            Some(Xrc::Target { xrcd }) if self.xrcds.contains(&xrcd) => (false, false),
            Some(Xrc::Target { .. }) => return Err(VerbsError::NotFound),
            None => (true, true),
        };
        if init.xrc.is_some() && (init.qp_type != QpType::Rc || init.srq.is_some()) {
            return Err(VerbsError::InvalidAttribute("XRC is RC-like and takes no SRQ of its own"));
        }
        if (needs_send_cq && !self.cqs.contains(init.send_cq)) || (needs_recv_cq && !self.cqs.contains(init.recv_cq)) {
            return Err(VerbsError::NotFound);
        }
        if init.srq.is_some_and(|s| !self.srqs.contains_key(&s)) {
            return Err(VerbsError::NotFound);
        }
        let qpn = draw_qpn(&mut self.rng, self.id_tag, |q| self.qps.contains_key(&q));
        let mut qp = Qp::new(qpn, init);
        qp.path.src_gid = self.cfg.gid;
        if self.cfg.cc.enabled {
            // DCQCN's reaction point paces at line rate until the first CNP.
            qp.req.limiter = Some(cc::RateLimiter::new(&self.cfg.cc));
        }
        if self.cfg.cc.loss_window_max_packets > 0 && init.qp_type == QpType::Rc {
            let cc = &self.cfg.cc;
            qp.req.window = Some(cc::LossWindow::new(cc.loss_window_initial_packets, cc.loss_window_max_packets));
        }
        self.qps.insert(qpn, Box::new(qp));
        Ok(qpn)
    }

    /// Destroys a QP.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbsError> {
        self.destroy_qp_at(self.now_hint, qpn)
    }

    /// Destroys a QP at `now`; a connection the CM holds for it is torn down (DREQ).
    pub fn destroy_qp_at(&mut self, now: u64, qpn: u32) -> Result<(), VerbsError> {
        self.with_cm(now, |cm, qps| cm.qp_destroyed(now, qpn, qps));
        let qp = self.qps.remove(&qpn).ok_or(VerbsError::NotFound)?;
        let emptied = self.mcast.forget(qpn);
        self.mcast_emptied.extend(emptied);
        self.forget_raw_qp(qpn);
        if qp.window_busy {
            self.window_busy_qps -= 1;
        }
        self.schedule.remove(qpn);
        Ok(())
    }

    /// Each busy QP's share of the device's in-flight budget (IBTA leaves the requester's
    /// rate to the implementation): the budget split evenly over the QPs with requests
    /// outstanding, so a thousand idle QPs leave a busy one its whole window.
    fn window_cap(&self) -> u32 {
        let device = self.cfg.cc.loss_window_device_packets;
        if device == 0 {
            return u32::MAX;
        }
        (device / self.window_busy_qps.max(1)).max(1)
    }

    /// Counts QP `qpn` among the busy ones, or no longer, after an operation on it.
    fn note_window_busy(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            count_window_busy(qp, &mut self.window_busy_qps);
        }
    }

    /// QP `qpn` was operated on: it may have something to send, and its deadline may
    /// have moved ([`schedule::Schedule`]).
    fn touch(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            self.schedule.touch(qpn, qp.deadline());
            count_window_busy(qp, &mut self.window_busy_qps);
        }
    }

    /// Every QP was (or may have been) operated on: after the CM's calls.
    fn touch_all(&mut self) {
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        for qpn in qpns {
            self.touch(qpn);
        }
    }

    /// The SRQ QP `qpn` takes its receives from, if any.
    pub fn qp_srq(&self, qpn: u32) -> Option<u32> {
        self.qps.get(&qpn).and_then(|q| q.init.srq)
    }

    /// A one-line account of a QP's send and receive state, for failure reports.
    pub fn qp_summary(&self, qpn: u32) -> String {
        let Some(q) = self.qps.get(&qpn) else { return format!("QP {qpn}: none") };
        let r = &q.req;
        let wqes: Vec<String> = r
            .wqes
            .iter()
            .take(6)
            .map(|w| {
                format!(
                    "{:?}@{}+{} next={} done_pkts={} done={:?}",
                    w.wc_opcode(),
                    w.first_psn,
                    w.npkts,
                    w.next_pkt,
                    w.done_pkts,
                    w.done
                )
            })
            .collect();
        format!(
            "QP {qpn} {:?}: next_psn={} send_idx={} acked={:?} rewound_to={:?} timer={:?} retry_left={} {} wqes [{}]",
            q.state,
            r.next_psn,
            r.send_idx,
            r.acked,
            r.rewound_to,
            r.timer,
            r.retry_left,
            q.resp.summary(),
            wqes.join(", ")
        )
    }

    /// The next PSN the QP's requester will assign and the PSN its responder expects.
    pub fn qp_psns(&self, qpn: u32) -> Option<(u32, u32)> {
        self.qps.get(&qpn).map(|q| (q.req.next_psn.value(), q.resp.epsn.value()))
    }

    /// Replies a QP's responder holds, waiting to be sent.
    pub fn qp_pending_replies(&self, qpn: u32) -> usize {
        self.qps.get(&qpn).map_or(0, |q| q.resp.pending_replies())
    }

    /// The state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(&qpn).map(|q| q.state)
    }

    fn split_cm(&mut self, now: u64) -> (&mut QpMap, Ctx<'_>, &mut crate::cm::Cm) {
        let window_cap = self.window_cap();
        let ctx = Ctx {
            now,
            mrs: &mut self.mrs,
            cqs: &mut self.cqs,
            out: &mut self.out,
            spare: &mut self.spare,
            stats: &mut self.stats,
            srqs: &mut self.srqs,
            events: &mut self.events,
            window_cap,
        };
        (&mut self.qps, ctx, &mut self.cm)
    }

    fn split(&mut self, now: u64) -> (&mut QpMap, Ctx<'_>) {
        let (qps, ctx, _) = self.split_cm(now);
        (qps, ctx)
    }

    /// modify-QP.
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<(), VerbsError> {
        let sgid = match attr.sgid_index {
            Some(i) => Some(*self.gids.get(usize::from(i)).ok_or(VerbsError::InvalidAttribute("sgid_index"))?),
            None => None,
        };
        let (qps, mut ctx) = self.split(0);
        let qp = qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
        let out = qp.modify(attr, &mut ctx);
        if let (Some(g), true) = (sgid, out.is_ok()) {
            qp.path.src_gid = g;
        }
        self.touch(qpn);
        out
    }

    /// Posts a send work request (IBTA 11.4.1.1).
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
        let xrc_target = matches!(qp.init.xrc, Some(Xrc::Target { .. }));
        if matches!(qp.state, QpState::Err | QpState::Sqe) && !xrc_target {
            return self.flush_posted_send(qpn, wr);
        }
        if !matches!(qp.state, QpState::Rts | QpState::Sqd) || xrc_target {
            return Err(VerbsError::InvalidRequest);
        }
        if qp.init.qp_type == QpType::RawPacket {
            return self.send_raw(qpn, wr);
        }
        qp.req.post(wr, qp.init.pd, &self.mrs, &qp.path)?;
        // A request that failed its local checks completes now, if nothing is ahead of it.
        let (qps, mut ctx) = self.split(0);
        if let Some(qp) = qps.get_mut(&qpn) {
            settle(qp, &mut ctx);
        }
        self.touch(qpn);
        Ok(())
    }

    /// A send request posted to a QP in the Error state is taken and completes at once with
    /// a flush error (IBTA vol. 1 10.3.1.7), as rxe, siw and hardware do: a drain (the
    /// kernel's `ib_drain_sq`) posts one there and waits for its completion. So does one
    /// posted in the Send Queue Error state (10.3.1, SQEr).
    fn flush_posted_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound)?;
        let raw = qp.init.qp_type == QpType::RawPacket;
        if wr.sgl.len() > qp.req.max_sge() || !(raw || qp::requester::op_allowed(&wr, &qp.path)) {
            return Err(VerbsError::InvalidRequest);
        }
        let wc = Wc::new(wr.wr_id, WcStatus::WrFlushErr, wr.op.wc_opcode(), qpn, 0);
        if self.cqs.push(qp.init.send_cq, wc) {
            self.stats.completions += 1;
        }
        Ok(())
    }

    /// Posts a receive work request.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
        if qp.state == QpState::Reset || qp.init.srq.is_some() || qp.init.xrc.is_some() {
            return Err(VerbsError::InvalidRequest);
        }
        if qp.state == QpState::Err {
            let wc = Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn, 0);
            let cq = qp.init.recv_cq;
            if self.cqs.push(cq, wc) {
                self.stats.completions += 1;
            }
            return Ok(());
        }
        qp.resp.post(wr)
    }

    /// A RoCEv2 datagram whose ICRC the transport has verified, from `src`.
    pub fn handle_packet(&mut self, now: u64, src: Gid, packet: &[u8]) {
        self.handle_packet_ecn(now, src, false, packet);
    }

    /// As [`Device::handle_packet`], for a datagram whose IP header was marked ECN-CE
    /// (`ce`) by a congested hop.
    pub fn handle_packet_ecn(&mut self, now: u64, src: Gid, ce: bool, packet: &[u8]) {
        self.stats.rx_packets += 1;
        let Ok(r) = RocePacket::new_checked(packet).and_then(|p| RoceRepr::parse(&p)) else {
            self.stats.rx_malformed += 1;
            return;
        };
        // IBTA 9.6.1: a transport header version other than 0 is not this transport's.
        if r.bth.tver != 0 {
            self.stats.rx_malformed += 1;
            return;
        }
        self.now_hint = now;
        if r.bth.dest_qp == crate::proto::cm::GSI_QPN {
            return self.gsi_receive(now, src, &r);
        }
        self.receive_on_qp(now, src, ce, &r);
        self.touch(r.bth.dest_qp);
    }

    /// Attaches UD QP `qpn` to multicast group `mgid` (IBTA 10.5, `ibv_attach_mcast`);
    /// `First` when the group had no member on this device (the transport joins it).
    pub fn attach_mcast(&mut self, qpn: u32, mgid: Gid) -> Result<mcast::GroupChange, VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound)?;
        if qp.init.qp_type != QpType::Ud {
            return Err(VerbsError::InvalidRequest);
        }
        self.mcast.attach(mgid, qpn)
    }

    /// Detaches QP `qpn` from `mgid`; `Last` when the group has no member left.
    pub fn detach_mcast(&mut self, qpn: u32, mgid: Gid) -> Result<mcast::GroupChange, VerbsError> {
        self.mcast.detach(mgid, qpn)
    }

    /// The groups destroyed QPs left with no member since the last call.
    pub fn take_emptied_groups(&mut self) -> Vec<Gid> {
        std::mem::take(&mut self.mcast_emptied)
    }

    /// A datagram the transport received for multicast group `mgid` (its ICRC verified):
    /// a UD SEND to DestQP 0xFFFFFF, delivered to each QP attached to the group (IBTA
    /// 9.8.1, 10.5); anything else is dropped.
    pub fn handle_multicast(&mut self, now: u64, src: Gid, mgid: Gid, ce: bool, packet: &[u8]) {
        self.stats.rx_packets += 1;
        let Ok(r) = RocePacket::new_checked(packet).and_then(|p| RoceRepr::parse(&p)) else {
            self.stats.rx_malformed += 1;
            return;
        };
        if r.bth.tver != 0 || r.bth.dest_qp != mcast::MCAST_QPN || r.deth.is_none() {
            self.stats.rx_unknown_qp += 1;
            return;
        }
        self.now_hint = now;
        let members = self.mcast.members(&mgid).to_vec();
        for qpn in members {
            let mut copy = r;
            copy.bth.dest_qp = qpn;
            self.receive_on_qp(now, src, ce, &copy);
            self.touch(qpn);
        }
    }

    /// A parsed packet for QP `r.bth.dest_qp` (not QP1).
    fn receive_on_qp(&mut self, now: u64, src: Gid, ce: bool, r: &RoceRepr<'_>) {
        let cc = self.cfg.cc;
        let (qps, mut ctx) = self.split(now);
        let Some(qp) = qps.get_mut(&r.bth.dest_qp) else {
            ctx.stats.rx_unknown_qp += 1;
            return;
        };
        // Only the QP's own peer may reach it, with a CNP or a CE mark as with anything
        // else: a stranger must not slow a connection down.
        let connected = qp.init.qp_type != QpType::Ud;
        if (connected && qp.path.dest_gid != src)
            || !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
        {
            ctx.stats.rx_unknown_qp += 1;
            return;
        }
        if !pkey_matches(r.bth.pkey, qp.path.pkey) {
            ctx.stats.rx_pkey_violations += 1;
            return;
        }
        if r.bth.opcode == CNP_OPCODE {
            // Annex A17.9.3: a CNP slows this QP's requester (when CC is on); UD has none.
            ctx.stats.cnps_received += 1;
            if cc.enabled && connected {
                qp.req.limiter.get_or_insert_with(|| cc::RateLimiter::new(&cc)).on_cnp(now, &cc);
            }
            return;
        }
        if ce {
            ctx.stats.rx_ecn_ce += 1;
            if cc.enabled {
                send_cnp(qp, &cc, &mut ctx);
            }
        }
        // 12.9.7: a packet on a QP in RTR tells the CM its peer is in RTS.
        let first = connected && qp.state == QpState::Rtr;
        dispatch(qp, r, src, &mut ctx);
        if first {
            self.with_cm(now, |cm, qps| cm.qp_received(r.bth.dest_qp, qps));
        }
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        self.now_hint = now;
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.with_cm(now, |cm, qps| cm.handle_timeout(now, qps));
        }
        let cc = self.cfg.cc;
        let mut due = std::mem::take(&mut self.visit);
        self.schedule.due(now, &mut due);
        let (qps, mut ctx) = self.split(now);
        for qpn in &due {
            let Some(qp) = qps.get_mut(qpn) else { continue };
            if qp.state == QpState::Err {
                continue;
            }
            qp.req.on_rnr_elapsed(now);
            if let Some(l) = qp.req.limiter.as_mut() {
                l.tick(now, &cc);
            }
            if qp.req.timer.is_some_and(|t| now >= t) {
                qp.req.on_timer(&mut ctx);
                settle(qp, &mut ctx);
            }
        }
        for &qpn in &due {
            // Its filed deadline came (perhaps earlier than its timers now say): file
            // the real one.
            self.schedule.unfile(qpn);
            self.touch(qpn);
        }
        self.visit = due;
    }

    /// The earliest deadline of any QP.
    pub fn poll_timeout(&self) -> Option<u64> {
        let qps = self.schedule.first_deadline();
        match (qps, self.cm.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes back the buffer of a packet [`Device::poll_transmit`] gave out, once sent, to
    /// build a later packet in: a fresh allocation per packet cost malloc, zeroing and, for
    /// 4 KiB packets, page faults (6 % of a 4 KiB WRITE sender's samples). At most
    /// [`SPARE_PACKETS_MAX`] are kept.
    pub fn recycle(&mut self, packet: Vec<u8>) {
        if self.spare.len() < SPARE_PACKETS_MAX && packet.capacity() <= SPARE_PACKET_BYTES_MAX {
            self.spare.push(packet);
        }
    }

    /// Buffers kept for packets to be built in.
    pub fn spare_packets(&self) -> usize {
        self.spare.len()
    }

    /// The next packet to send, if any.
    pub fn poll_transmit(&mut self, now: u64) -> Option<Transmit> {
        if self.out.is_empty() {
            self.fill(now);
        }
        self.out.pop_front()
    }

    /// Lets each QP in turn queue a burst of packets, starting after the last one served,
    /// until [`FILL_PACKETS`] are queued or every QP had its turn: one pass over the QPs
    /// serves all that have something to send, so a device with many idle or blocked QPs
    /// does not look at each of them again for every packet.
    fn fill(&mut self, now: u64) {
        // A turn lists a bounded slice of the ready QPs (a thousand need not be listed for
        // a few dozen packets); each QP in it sends or leaves the ready set, so turns end
        // once one queued packets or nothing is ready.
        while self.out.is_empty() && self.schedule.ready_len() > 0 {
            self.fill_turn(now);
        }
    }

    /// One pass over at most `2 * FILL_PACKETS` ready QPs from the front of the line.
    fn fill_turn(&mut self, now: u64) {
        let mut order = std::mem::take(&mut self.visit);
        let mut turns = std::mem::take(&mut self.turns);
        self.schedule.take_ready(&mut order, 2 * FILL_PACKETS);
        let (qps, mut ctx) = self.split(now);
        for &qpn in &order {
            let Some(qp) = qps.get_mut(&qpn) else {
                turns.push((qpn, false, None));
                continue;
            };
            let more = pump_qp(qp, &mut ctx);
            turns.push((qpn, more, qp.deadline()));
            if ctx.out.len() >= FILL_PACKETS {
                break;
            }
        }
        self.schedule.put_back(&order[turns.len()..]);
        for (qpn, more, deadline) in turns.drain(..) {
            self.schedule.file(qpn, deadline);
            self.note_window_busy(qpn);
            if more {
                self.schedule.requeue(qpn);
            } else {
                self.schedule.idle(qpn);
            }
        }
        self.visit = order;
        self.turns = turns;
    }
}

/// Counts `qp` among the `busy` QPs (those with a loss window and requests outstanding),
/// or no longer, as it now is.
fn count_window_busy(qp: &mut Qp, busy: &mut u32) {
    let now_busy = qp.req.window.is_some() && qp.req.has_outstanding();
    if now_busy != qp.window_busy {
        qp.window_busy = now_busy;
        if now_busy {
            *busy += 1;
        } else {
            *busy -= 1;
        }
    }
}

/// IBTA 10.9.3: the 15-bit keys are equal and at least one side is a full member.
fn pkey_matches(packet: u16, qp: u16) -> bool {
    packet & 0x7fff == qp & 0x7fff && (packet | qp) & 0x8000 != 0
}

/// A QPN from `rng` that `taken` does not refuse: 24 bits (the top 8 `tag`, if given), not
/// the 16 reserved ones, nor 0xFFFFFF (the multicast QPN, IBTA 9.6.1).
fn draw_qpn(rng: &mut Rng, tag: Option<u8>, taken: impl Fn(u32) -> bool) -> u32 {
    loop {
        let drawn = rng.next_u64() as u32;
        let q = tag.map_or(drawn & 0xff_ffff, |t| u32::from(t) << 16 | drawn & 0xffff);
        if q >= 16 && q != 0xff_ffff && !taken(q) {
            return q;
        }
    }
}

/// One QP's turn: a burst of its responder's replies, then (in RTS) a burst of its
/// requester's packets; true if it may have more.
/// A side that sent less than its burst stopped for want of something to send or of an
/// event that touches the QP again (an ACK freeing the ORD or the window, the pacer's or
/// the RNR timer), so the QP leaves the ready set at once rather than after another,
/// empty turn.
fn pump_qp(qp: &mut Qp, ctx: &mut Ctx<'_>) -> bool {
    let replies = qp.resp.pump(&qp.path, ctx, BURST);
    let mut requests = 0;
    if matches!(qp.state, QpState::Rts) {
        requests = qp.req.pump(&qp.path, ctx, BURST);
        // A request whose memory could not be read as it was sent is finished at once.
        if qp.init.qp_type != QpType::Rc || qp.req.wqes.front().is_some_and(|w| w.done.is_some()) {
            settle(qp, ctx);
        }
    }
    replies >= BURST || requests >= BURST
}

/// The BTH opcode of a Congestion Notification Packet (Annex A17.9.3).
const CNP_OPCODE: u8 = 0x81;

/// Sends a CNP to the QP's peer, unless one went out less than `cnp_interval_ns` ago.
fn send_cnp(qp: &mut Qp, cc: &cc::CcConfig, ctx: &mut Ctx<'_>) {
    if qp.last_cnp.is_some_and(|t| ctx.now < t + cc.cnp_interval_ns) || qp.init.qp_type == QpType::Ud {
        return;
    }
    qp.last_cnp = Some(ctx.now);
    ctx.stats.cnps_sent += 1;
    let mut bth = qp.path.bth(CNP_OPCODE, crate::proto::roce::Psn::new(0), 16);
    bth.becn = true;
    let mut repr = qp::requester::bare(bth, None, None);
    repr.payload = &[0u8; 16];
    qp.path.send(ctx, &repr);
}

fn dispatch(qp: &mut Qp, r: &RoceRepr<'_>, src: Gid, ctx: &mut Ctx<'_>) {
    let Some(info) = r.info() else { return };
    let pd = qp.init.pd;
    let mut view = QpView { qpn: qp.path.qpn, pd, recv_cq: qp.init.recv_cq, mtu: qp.path.mtu, qkey: qp.path.qkey, src };
    let wanted = match qp.init.qp_type {
        _ if qp.path.xrc => Transport::Xrc,
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
        QpType::RawPacket => {
            ctx.stats.rx_wrong_transport += 1;
            return;
        }
    };
    if info.transport != wanted {
        ctx.stats.rx_wrong_transport += 1;
        return;
    }
    if r.xrceth.is_some() && !xrc_target_takes(qp, r, &mut view, ctx) {
        return;
    }
    match qp.init.qp_type {
        QpType::Uc => return qp.resp.handle_uc(r, &view, ctx),
        QpType::Ud => return qp.resp.handle_ud(r, &view, ctx),
        QpType::Rc | QpType::RawPacket => {}
    }
    match info.operation {
        Operation::Acknowledge => {
            if let Some(aeth) = r.aeth {
                qp.req.on_ack(r.bth.psn, aeth.syndrome, ctx);
            }
        }
        Operation::ReadResponse => {
            if let Some(aeth) = r.aeth.filter(|a| !matches!(a.syndrome, crate::proto::roce::ext::Syndrome::Ack { .. }))
            {
                qp.req.on_ack(r.bth.psn, aeth.syndrome, ctx);
            } else {
                qp.req.on_read_response(r, &qp.path, pd, ctx);
            }
        }
        Operation::AtomicAcknowledge => {
            if let Some(orig) = r.atomic_ack_eth {
                qp.req.on_atomic_ack(r.bth.psn, orig.original_data, pd, ctx);
            }
        }
        _ => {
            if let Some(nak) = qp.resp.handle(r, &view, ctx) {
                responder_failed(qp, nak, ctx);
            }
            if let Some(start) = qp.resp.rndv.take() {
                qp.req.post_rndv_read(*start, pd, &qp.path, ctx);
            }
            return;
        }
    }
    settle(qp, ctx);
}

/// An XRC request (it carries an XRCETH) at `qp`: an initiator takes none; a target takes
/// it into the SRQ it names, which must be an XRC SRQ of the target's domain, checking
/// memory in that SRQ's PD and completing on its CQ (IBTA vol.1 14.2), and, within a
/// message, the SRQ its first packet named (else one SRQ's receive would complete on
/// another's CQ). Anything else is an invalid request: NAKed, and the target enters the
/// error state.
fn xrc_target_takes(qp: &mut Qp, r: &RoceRepr<'_>, view: &mut QpView, ctx: &mut Ctx<'_>) -> bool {
    let Some(Xrc::Target { xrcd }) = qp.init.xrc else {
        ctx.stats.rx_wrong_transport += 1;
        return false;
    };
    let srqn = r.xrceth.map_or(0, |x| x.srqn);
    let switched = qp.resp.cur.is_some() && qp.resp.srq != Some(srqn);
    match ctx.srqs.get(&srqn).and_then(|s| s.xrc).filter(|x| x.xrcd == xrcd && !switched) {
        Some(x) => {
            (view.pd, view.recv_cq) = (x.pd, x.cq);
            qp.resp.srq = Some(srqn);
            true
        }
        None => {
            if let Some(nak) = qp.resp.refuse(r.bth.psn, crate::proto::roce::ext::NakCode::InvalidRequest, ctx) {
                responder_failed(qp, nak, ctx);
            }
            false
        }
    }
}

/// The responder NAKed a request with `nak`: the NAK goes out before the QP stops
/// sending, the application hears why (IBTA 11.6.3.1), and the QP enters ERR.
fn responder_failed(qp: &mut Qp, nak: crate::proto::roce::ext::NakCode, ctx: &mut Ctx<'_>) {
    qp.resp.pump(&qp.path, ctx, usize::MAX);
    ctx.events.raise(responder_error_event(nak, qp.path.qpn));
    qp.enter_error(ctx);
}

/// The event of a responder that NAKed a request and went to ERR (IBTA 11.6.3.1).
fn responder_error_event(nak: crate::proto::roce::ext::NakCode, qpn: u32) -> event::AsyncEvent {
    use crate::proto::roce::ext::NakCode;
    match nak {
        NakCode::RemoteAccessError => event::AsyncEvent::QpAccessError(qpn),
        NakCode::InvalidRequest => event::AsyncEvent::QpRequestError(qpn),
        _ => event::AsyncEvent::QpFatal(qpn),
    }
}

/// Retires finished send WQEs; a failed one takes an RC QP to ERR, and a UD or UC QP to
/// SQE, whose receive queue goes on (IBTA vol. 1 10.3.1, the SQEr state).
fn settle(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    if qp.req.retire(qp.path.qpn, qp.init.send_cq, ctx) == Verdict::Error {
        if matches!(qp.init.qp_type, QpType::Ud | QpType::Uc) {
            qp.enter_send_queue_error(ctx);
        } else {
            qp.enter_error(ctx);
        }
    }
}
