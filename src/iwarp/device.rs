//! An iWARP device, sans-I/O: QPs, their connections and listeners as state, driven by
//! events (a TCP connection made or accepted, bytes received, bytes the stream took, the
//! stream closed, time) and giving out bytes to write, streams to close, completions and
//! a deadline. The same code runs on kernel TCP sockets (`crate::driver::iwarp_tcp`) and
//! on a userspace TCP stack over raw Ethernet (`crate::driver::iwarp_smol`).
//!
//! One TCP connection per QP, set up as rdma_cm sets up iWARP: MPA (RFC 5044 §7.1, RFC
//! 6581) carrying the application's private data and read depths; then an [`IwarpQp`]
//! on the stream. A Send or Write completes when its last byte is taken by the stream.

use super::config::*;
use super::qp::IwarpQp;
use super::setup::{PeerRequest, Policy, Setup};
use super::txqueue::{Output, TxQueue};
use crate::engine::mem::Pd;
use crate::engine::verbs::{QpCaps, QpState, RecvWr, SendWr, VerbsError, Wc};
use crate::engine::Device;
use crate::proto::iwarp::mpa;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// A connection or listener, as the driver and the device name it.
pub type ConnId = usize;

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Active side: the TCP handshake is under way.
    TcpConnecting,
    /// MPA Request and Reply are being exchanged.
    Mpa,
    /// Passive side: a valid MPA Request waits for the application's accept or reject.
    AwaitAccept,
    /// RDMA traffic flows.
    Established,
    /// The last bytes (an MPA reject, a Terminate) drain, then the stream ends.
    Closing,
}

/// A QP of the device, connected or not.
struct Slot {
    pd: Pd,
    send_cq: u32,
    recv_cq: u32,
    caps: QpCaps,
    /// The shared receive queue its Sends land in, if it has one (IBTA 10.2.9).
    srq: Option<u32>,
    qp: Option<IwarpQp>,
    /// Receives posted before the connection came up.
    early_recvs: Vec<RecvWr>,
    conn: Option<ConnId>,
    /// The QP went to ERR without a connection (setup failed or the application moved it).
    failed: bool,
}

mod stream;

/// One TCP connection.
struct Conn {
    setup: Option<Setup>,
    /// Active side before TCP is up: the MPA Request to send once it is.
    initiator_policy: Option<Policy>,
    tcp_connecting: bool,
    qpn: Option<u32>,
    listener: Option<ConnId>,
    initiator: bool,
    announced: bool,
    tx: TxQueue,
    queued: u64,
    written: u64,
    /// Stream bytes queued before the QP's first FPDU (the MPA frames).
    qp_base: u64,
    rx_early: Vec<u8>,
    /// Close once everything queued is written.
    closing: bool,
    /// When `closing` was set (ns), for the linger limit.
    closing_since_ns: Option<u64>,
    mss: usize,
    /// When the connection was made (ns): the oldest half-open one is evicted first.
    opened_ns: u64,
    /// In the device's list of connections to write, until the driver takes it.
    listed_writable: bool,
}

impl Conn {
    fn state(&self) -> ConnState {
        match &self.setup {
            _ if self.closing => ConnState::Closing,
            _ if self.tcp_connecting => ConnState::TcpConnecting,
            Some(s) if s.is_held() => ConnState::AwaitAccept,
            Some(_) => ConnState::Mpa,
            None => ConnState::Established,
        }
    }

    fn queue(&mut self, out: impl Into<Output>) {
        let out = out.into();
        self.queued += out.len() as u64;
        self.tx.push(out);
    }

    /// Close once the queue is written, or once [`CLOSE_LINGER_MS`] have passed.
    fn start_closing(&mut self, now_ns: u64) {
        self.closing = true;
        self.closing_since_ns.get_or_insert(now_ns);
    }

    /// The time by which a closing connection is dropped, written out or not.
    fn linger_deadline(&self) -> Option<u64> {
        self.closing_since_ns.map(|t| t.saturating_add(CLOSE_LINGER_MS * 1_000_000))
    }
}

/// The iWARP device: every QP, connection and listener, and what is due out.
pub struct IwarpDevice {
    /// Bookkeeping shared with RoCEv2: PDs, MRs, CQ numbers, GIDs, QPNs.
    pub dev: Device,
    cfg: IwarpConfig,
    qps: HashMap<u32, Slot>,
    conns: HashMap<ConnId, Conn>,
    listeners: HashMap<ConnId, VecDeque<ConnId>>,
    /// How setup ended, for the caller of `connect` or `accept` (kept until taken).
    results: HashMap<ConnId, Result<Vec<u8>, ConnectError>>,
    next_id: ConnId,
    now_ns: u64,
    /// Connections with bytes to write, each once (`Conn::listed_writable`), sorted as
    /// they are taken: a set's node, allocated and freed at every turn of a ping-pong,
    /// cost more than the turn's framing. Ids of connections ended since are dropped then.
    writable: Vec<ConnId>,
    /// Connections the device ended: the driver closes their streams.
    closed: Vec<ConnId>,
    /// Completions since they were last taken, each with its CQ, in order.
    completions: Vec<(u32, Wc)>,
    /// A QP's send and receive completions as they are polled (kept for their room).
    polled: (Vec<Wc>, Vec<Wc>),
}

impl IwarpDevice {
    /// A device with no QPs or connections.
    pub fn new(dev: Device, cfg: IwarpConfig) -> Self {
        IwarpDevice {
            dev,
            cfg,
            qps: HashMap::default(),
            conns: HashMap::default(),
            listeners: HashMap::default(),
            results: HashMap::default(),
            next_id: 0,
            now_ns: 0,
            writable: Vec::new(),
            closed: Vec::new(),
            completions: Vec::new(),
            polled: (Vec::new(), Vec::new()),
        }
    }

    /// The time of the events that follow (ns, the driver's clock).
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
    }

    /// A fresh connection or listener id.
    fn next_id(&mut self) -> ConnId {
        self.next_id += 1;
        self.next_id
    }

    /// TCP connections open (connecting, in MPA setup, connected or closing).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Connection `t`'s state, if it is open.
    pub fn conn_state(&self, t: ConnId) -> Option<ConnState> {
        self.conns.get(&t).map(Conn::state)
    }

    /// `ibv_create_qp`: an unconnected RC QP that takes receives until it connects.
    pub fn create_qp(
        &mut self,
        pd: Pd,
        (send_cq, recv_cq): (u32, u32),
        caps: QpCaps,
        srq: Option<u32>,
    ) -> Result<u32, VerbsError> {
        let IwarpDevice { dev, qps, .. } = self;
        if let Some(id) = srq {
            dev.hold_srq(id)?;
        }
        let qpn = dev.draw_qpn(|q| qps.contains_key(&q));
        let slot =
            Slot { pd, send_cq, recv_cq, caps, srq, qp: None, early_recvs: Vec::new(), conn: None, failed: false };
        self.qps.insert(qpn, slot);
        Ok(qpn)
    }

    /// `ibv_destroy_qp`: its connection closes.
    pub fn destroy_qp(&mut self, qpn: u32) {
        let Some(slot) = self.qps.remove(&qpn) else { return };
        if let Some(id) = slot.srq {
            self.dev.release_srq(id);
        }
        if let Some(t) = slot.conn {
            self.close(t);
        }
    }

    /// Tears QP `qpn`'s connection down (`rdma_disconnect`): its stream closes and the QP
    /// goes to ERR, its work requests flushed.
    pub fn disconnect(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let t = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?.conn.take();
        self.set_error(qpn)?;
        if let Some(t) = t {
            self.close(t);
        }
        Ok(())
    }

    /// The QP's state.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        let s = self.qps.get(&qpn)?;
        Some(match &s.qp {
            Some(qp) => qp.state(),
            None if s.failed => QpState::Err,
            None => QpState::Init,
        })
    }

    /// Moves the QP to ERR (`ibv_modify_qp` to ERR): everything flushes, the stream closes.
    pub fn set_error(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let s = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
        match s.qp.as_mut() {
            Some(qp) => qp.on_stream_closed("moved to ERR by the application"),
            None => s.failed = true,
        }
        self.flush_early_recvs(qpn);
        self.pump_qp(qpn);
        Ok(())
    }

    /// `ibv_post_send`, stopping at the first error.
    pub fn post_send(&mut self, qpn: u32, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), VerbsError> {
        let IwarpDevice { dev, qps, .. } = self;
        let s = qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
        let qp = s.qp.as_mut().ok_or(VerbsError::InvalidRequest)?;
        let mut out = Ok(());
        for wr in wrs {
            out = if wr.sgl.len() > s.caps.max_sge {
                Err(VerbsError::InvalidRequest)
            } else {
                qp.post_send(wr, dev.mrs_mut())
            };
            if out.is_err() {
                break;
            }
        }
        self.pump_qp(qpn);
        out
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), VerbsError> {
        let s = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
        // A QP with an SRQ has no receive queue of its own (IBTA 11.4.1.2).
        if wr.sgl.len() > s.caps.max_sge || s.srq.is_some() {
            return Err(VerbsError::InvalidRequest);
        }
        match s.qp.as_mut() {
            Some(qp) => qp.post_recv(wr)?,
            None if s.early_recvs.len() >= s.caps.max_recv_wr => return Err(VerbsError::QueueFull),
            None => s.early_recvs.push(wr),
        }
        if s.failed {
            self.flush_early_recvs(qpn);
        }
        self.pump_qp(qpn);
        Ok(())
    }

    /// Active side, `rdma_connect`: a connection for QP `qpn` in [`ConnState::TcpConnecting`];
    /// the driver makes the TCP connection and reports [`IwarpDevice::on_tcp_connected`].
    pub fn connect(&mut self, qpn: u32, param: &ConnParam) -> Result<ConnId, ConnectError> {
        if param.private_data.len() > mpa::MAX_PRIVATE_DATA - mpa::IRD_ORD_LEN {
            return Err(ConnectError::Invalid("private data longer than MPA carries"));
        }
        let s = self.qps.get(&qpn).ok_or(ConnectError::Invalid("no such QP"))?;
        if s.conn.is_some() || s.qp.is_some() || s.failed {
            return Err(ConnectError::Invalid("the QP is connected already"));
        }
        let mut policy = self.policy(param);
        if !self.cfg.offer_rtr {
            policy.rtr.clear();
        }
        let t = self.add_conn(None, None, 576);
        if let Some(c) = self.conns.get_mut(&t) {
            c.initiator_policy = Some(policy);
            c.tcp_connecting = true;
            c.qpn = Some(qpn);
            c.initiator = true;
        }
        if let Some(s) = self.qps.get_mut(&qpn) {
            s.conn = Some(t);
        }
        Ok(t)
    }

    /// The active side's TCP connection is up, with maximum segment size `mss`: MPA starts.
    pub fn on_tcp_connected(&mut self, t: ConnId, mss: usize) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        c.tcp_connecting = false;
        c.mss = self.cfg.max_fpdu.map_or(mss, |m| m.clamp(128, mss.max(128)));
        // The MPA timer runs from here: the TCP handshake had its own.
        if let Some(policy) = c.initiator_policy.take() {
            c.setup = Some(Setup::initiator(policy, self.now_ns));
        }
        self.after_setup(t);
    }

    /// Passive side, `rdma_listen`: a listener id for the driver's listening socket.
    pub fn listen(&mut self) -> ConnId {
        let l = self.next_id();
        self.listeners.insert(l, VecDeque::new());
        l
    }

    /// The listener is gone: the Requests nobody took are rejected.
    pub fn close_listener(&mut self, l: ConnId) {
        for r in self.listeners.remove(&l).unwrap_or_default() {
            self.reject(r, b"");
        }
    }

    /// A TCP connection accepted on listener `l`: MPA starts (the Request is held for the
    /// application once it arrives). Returns its id.
    pub fn on_tcp_accepted(&mut self, l: ConnId, mss: usize) -> ConnId {
        self.evict_half_open(l);
        let setup = Setup::responder_deferred(self.policy(&ConnParam::default()), self.now_ns);
        let mss = self.cfg.max_fpdu.map_or(mss, |m| m.clamp(128, mss.max(128)));
        self.add_conn(Some(setup), Some(l), mss)
    }

    /// The next MPA Request on listener `l` held for the application. `None` also when
    /// the listener is gone.
    pub fn take_request(&mut self, l: ConnId) -> Option<(ConnId, PeerRequest)> {
        while let Some(r) = self.listeners.get_mut(&l)?.pop_front() {
            let Some(conn) = self.conns.get(&r) else { continue };
            if let Some(req) = conn.setup.as_ref().and_then(|s| s.pending_request()) {
                return Some((r, req));
            }
        }
        None
    }

    /// True while listener `l` exists.
    pub fn has_listener(&self, l: ConnId) -> bool {
        self.listeners.contains_key(&l)
    }

    /// Accepts request `r` onto QP `qpn` (`rdma_accept`).
    pub fn accept(&mut self, r: ConnId, qpn: u32, param: &ConnParam) -> Result<(), ConnectError> {
        if param.private_data.len() > mpa::MAX_PRIVATE_DATA - mpa::IRD_ORD_LEN {
            return Err(ConnectError::Invalid("private data longer than MPA carries"));
        }
        let s = self.qps.get(&qpn).ok_or(ConnectError::Invalid("no such QP"))?;
        if s.conn.is_some() || s.qp.is_some() || s.failed {
            return Err(ConnectError::Invalid("the QP is connected already"));
        }
        let conn = self.conns.get_mut(&r).ok_or(ConnectError::Tcp("the peer left".into()))?;
        let setup = conn.setup.as_mut().ok_or(ConnectError::Invalid("not a pending request"))?;
        setup.accept(param.private_data.clone(), param.responder_resources, param.initiator_depth);
        conn.qpn = Some(qpn);
        if let Some(s) = self.qps.get_mut(&qpn) {
            s.conn = Some(r);
        }
        self.after_setup(r);
        match self.results.remove(&r) {
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(e),
            None => Err(ConnectError::Tcp("the peer left".into())),
        }
    }

    /// Rejects request `r` (`rdma_reject`) with an MPA reject Reply.
    pub fn reject(&mut self, r: ConnId, private_data: &[u8]) {
        if let Some(setup) = self.conns.get_mut(&r).and_then(|c| c.setup.as_mut()) {
            setup.reject(private_data);
        }
        self.after_setup(r);
    }

    /// How connection `t`'s setup ended, once (the peer's private data, or why not).
    pub fn take_result(&mut self, t: ConnId) -> Option<Result<Vec<u8>, ConnectError>> {
        self.results.remove(&t)
    }

    /// Gives up on connection `t` (a `connect` that timed out).
    pub fn abandon(&mut self, t: ConnId) {
        self.close(t);
    }

    fn policy(&self, param: &ConnParam) -> Policy {
        Policy {
            crc: self.cfg.crc,
            markers: self.cfg.markers,
            revision: 2,
            ird: param.responder_resources,
            ord: param.initiator_depth,
            rtr: self.cfg.rtr.clone(),
            private_data: param.private_data.clone(),
            timeout_ns: self.cfg.mpa_timeout_ms.saturating_mul(1_000_000),
        }
    }

    fn add_conn(&mut self, setup: Option<Setup>, listener: Option<ConnId>, mss: usize) -> ConnId {
        let t = self.next_id();
        let conn = Conn {
            setup,
            initiator_policy: None,
            tcp_connecting: false,
            qpn: None,
            listener,
            initiator: false,
            announced: false,
            tx: TxQueue::default(),
            queued: 0,
            written: 0,
            qp_base: 0,
            rx_early: Vec::new(),
            closing: false,
            closing_since_ns: None,
            mss: mss.max(576),
            opened_ns: self.now_ns,
            listed_writable: false,
        };
        self.conns.insert(t, conn);
        t
    }

    /// Makes room for one more half-open connection on listener `l` by dropping the
    /// oldest, if it has [`MAX_HALF_OPEN_PER_LISTENER`].
    fn evict_half_open(&mut self, l: ConnId) {
        let half_open = |c: &Conn| c.listener == Some(l) && c.setup.as_ref().is_some_and(|s| !s.is_held());
        let count = self.conns.values().filter(|c| half_open(c)).count();
        if count < MAX_HALF_OPEN_PER_LISTENER {
            return;
        }
        let oldest = self.conns.iter().filter(|(_, c)| half_open(c)).min_by_key(|(_, c)| c.opened_ns).map(|(t, _)| *t);
        if let Some(t) = oldest {
            self.close(t);
        }
    }

    /// Takes the oldest Request still queued on listener `l` for the application (the
    /// queue may hold connections that have gone since: they are skipped).
    fn oldest_queued_request(&mut self, l: ConnId) -> Option<ConnId> {
        loop {
            let t = self.listeners.get_mut(&l)?.pop_front()?;
            if self.conns.get(&t).and_then(|c| c.setup.as_ref()).is_some_and(|s| s.is_held()) {
                return Some(t);
            }
        }
    }

    /// Requests held on listener `l` for the application.
    fn held_requests(&self, l: ConnId) -> usize {
        self.conns.values().filter(|c| c.listener == Some(l) && c.setup.as_ref().is_some_and(|s| s.is_held())).count()
    }
}
