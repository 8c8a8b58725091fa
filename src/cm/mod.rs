//! IB Communication Management as rdma_cm uses it on RoCEv2 (IBTA vol. 1 ch. 12, Annex A11
//! for the IP addressing), sans-I/O.
//!
//! Inputs: MADs from QP1 ([`Cm::handle_mad`]), `now` ([`Cm::handle_timeout`]) and the
//! application's calls (listen, connect, accept, reject, disconnect). Outputs: MADs to send
//! ([`Cm::poll_transmit`]), the next deadline ([`Cm::poll_timeout`]), each connection's
//! status and the requests waiting on a listener. The CM moves the connection's QP through
//! its states itself, through [`QpControl`], at the points ch. 12.9 places them.

mod inbound;
mod msg;
mod sidr;
/// MAD builders, for other modules' tests.
#[cfg(test)]
pub(crate) use msg::{dreq as test_dreq, req as test_req, rtu as test_rtu};
#[cfg(test)]
mod tests;

use crate::engine::rng::Rng;
use crate::engine::verbs::{Gid, Mtu, QpAttr, QpState, VerbsError};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

pub use msg::{reason, req as req_mad};
pub use sidr::{SidrArgs, SidrStatus, UdRequest, SIDR_REP_PRIVATE, SIDR_REQ_USER_PRIVATE};

/// Connections (any state, time-wait included) a device holds at once: what peers' REQs
/// and the application's connects can make the CM keep. A REQ beyond it is rejected with
/// "no resources".
pub const MAX_CONNECTIONS: usize = 4096;
/// REQs on one listener waiting for the application to take them. One more rejects the
/// oldest of them (REJ "no resources"): a peer filling the queue cannot keep a fresh REQ
/// out.
pub const MAX_PENDING_PER_LISTENER: usize = 128;
/// How long a request may wait for the application's answer before it is rejected (REJ
/// "timeout"): a peer that sends REQs and goes away holds nothing longer.
pub const MAX_REQUEST_WAIT_NS: u64 = 60_000_000_000;
/// MADs queued for the wire; beyond, the oldest retransmission waits for its timer.
pub const MAX_QUEUED_MADS: usize = 1024;

/// What the CM asks of the QPs it connects.
pub trait QpControl {
    /// modify-QP.
    fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<(), VerbsError>;
}

/// The CM's timing and retry settings (the values go on the wire in every REQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// How long this side may take to answer a CM message: 4.096 µs × 2^n (rdma_cm: 20,
    /// 4.3 s).
    pub response_timeout: u8,
    /// Times a REQ, REP or DREQ is sent before the CM gives up (rdma_cm: 15).
    pub max_retries: u8,
    /// Packet lifetime assumed for the path: 4.096 µs × 2^n (rdma_cm on RoCE: 16).
    pub packet_life: u8,
    /// The QP's local ACK timeout the REQ proposes (IBTA 9.7.6.1.3): 4.096 µs × 2^n.
    pub local_ack_timeout: u8,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig { response_timeout: 20, max_retries: 15, packet_life: 16, local_ack_timeout: 14 }
    }
}

/// 4.096 µs × 2^code, in ns (IBTA 12.7.x timeouts).
pub fn timeout_ns(code: u8) -> u64 {
    4096u64 << code.min(31)
}

/// A connection's identity: its local communication ID.
pub type ConnId = u32;

/// Where a connection stands, as the application sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnStatus {
    /// Still being set up.
    Pending,
    /// Established: the QP is in RTS.
    Established,
    /// The peer rejected it, or it did not come up.
    Failed(CmFailure),
    /// Torn down by either side (DREQ).
    Disconnected,
}

/// Why a connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmFailure {
    /// REJ from the peer: IBTA Table 103 reason and the peer's private data.
    Rejected {
        /// The reason code.
        reason: u16,
        /// The peer's REJ private data.
        private_data: Vec<u8>,
    },
    /// The peer did not answer after every retry.
    Timeout,
    /// This side's QP refused the attributes the exchange set.
    Qp(VerbsError),
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmError {
    /// No such connection, or not in a state that takes this call.
    NoConnection,
    /// The port is already listened on.
    PortInUse,
    /// A limit was reached.
    Limit(&'static str),
    /// Bad arguments from the application.
    Invalid(&'static str),
    /// The QP refused the attributes.
    Qp(VerbsError),
}

/// The application's side of a connect (`rdma_connect`).
#[derive(Debug, Clone)]
pub struct ConnectArgs {
    /// The QP to connect (in RESET or INIT).
    pub qpn: u32,
    /// This side's GID and address.
    pub local_gid: Gid,
    /// The peer's GID.
    pub peer_gid: Gid,
    /// rdma_cm's source port (any) and the listener's port.
    pub src_port: u16,
    /// The listener's port (ServiceID, Annex A11.2.1).
    pub dst_port: u16,
    /// The PSN this side expects to receive first; the REQ's Starting PSN (Linux's CM
    /// and rxe take it as the PSN to send with, 12.6.5 leaves the direction to them).
    pub psn: u32,
    /// The path MTU this side can do.
    pub mtu: Mtu,
    /// Inbound READs/atomics this side serves at once.
    pub responder_resources: u8,
    /// Outbound READs/atomics this side keeps outstanding.
    pub initiator_depth: u8,
    /// The application's private data (at most 56 bytes after rdma_cm's header).
    pub private_data: Vec<u8>,
}

/// The application's side of an accept (`rdma_accept`).
#[derive(Debug, Clone)]
pub struct AcceptArgs {
    /// The QP to connect (in RESET or INIT).
    pub qpn: u32,
    /// The PSN this side expects to receive first; the REP's Starting PSN.
    pub psn: u32,
    /// The path MTU this side can do.
    pub mtu: Mtu,
    /// Inbound READs/atomics this side serves at once.
    pub responder_resources: u8,
    /// Outbound READs/atomics this side keeps outstanding.
    pub initiator_depth: u8,
    /// Private data (at most 196 bytes).
    pub private_data: Vec<u8>,
}

/// A connection request waiting on a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The connection it becomes.
    pub id: ConnId,
    /// The initiator's private data after rdma_cm's header (56 bytes).
    pub private_data: Vec<u8>,
    /// READs the initiator serves at once (the most this side's initiator depth gets).
    pub responder_resources: u8,
    /// READs the initiator keeps outstanding (what this side's responder resources need).
    pub initiator_depth: u8,
    /// The initiator's IP address and rdma_cm port, from its header.
    pub peer: Option<(IpAddr, u16)>,
}

/// A MAD for QP1 of `dst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutMad {
    /// Destination GID.
    pub dst: Gid,
    /// Source GID (the address to send from).
    pub src: Gid,
    /// The 256-byte MAD.
    pub mad: Box<[u8; msg::MAD_LEN]>,
}

/// Protocol state of one connection (IBTA 12.9.6 active, 12.9.7 passive, 12.9.8 both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: REQ out, waiting for REP (or an MRA extended the wait).
    ReqSent,
    /// Passive: REQ in, waiting for the application.
    ReqRcvd,
    /// Passive: the application is slow; an MRA told the initiator to wait.
    MraSent,
    /// Passive: REP out, waiting for RTU.
    RepSent,
    /// Both: connected.
    Established,
    /// DREQ out, waiting for DREP.
    DreqSent,
    /// Closed; kept a while to answer a late DREQ and to refuse a stale REQ.
    TimeWait,
}

/// What a REQ asked, kept until the application answers it.
#[derive(Debug, Clone)]
struct Offer {
    mtu: Mtu,
    responder_resources: u8,
    local_ack_timeout: u8,
    retry_count: u8,
    rnr_retry_count: u8,
}

#[derive(Debug, Clone)]
struct Conn {
    state: State,
    active: bool,
    remote_id: u32,
    remote_guid: u64,
    qpn: u32,
    remote_qpn: u32,
    /// The PSN the peer's message names: the one it expects first, which this side's
    /// send queue starts with (as Linux's CM reads the Starting PSN field).
    remote_psn: u32,
    local_gid: Gid,
    peer_gid: Gid,
    port: u16,
    /// The last message sent that a timer repeats (REQ, REP, DREQ) or a duplicate asks for
    /// again (MRA, RTU, DREP, REJ).
    last: Option<Box<[u8; msg::MAD_LEN]>>,
    retries_left: u8,
    max_retries: u8,
    timer: Option<u64>,
    interval_ns: u64,
    offer: Option<Offer>,
    /// Passive: the RTS attributes, applied when the RTU (or the first packet) comes.
    rts: Option<QpAttr>,
    /// Active: what this side asked for (the REP's answer is applied against it).
    asked: Option<ConnectArgs>,
    status: ConnStatus,
    peer_private: Vec<u8>,
}

/// The connection manager of one device.
pub struct Cm {
    cfg: CmConfig,
    ca_guid: u64,
    rng: Rng,
    conns: HashMap<ConnId, Conn>,
    listeners: HashMap<u16, VecDeque<Request>>,
    /// UD listeners (RDMA_PS_UDP) and their requests ([`sidr`]).
    ud_listeners: HashMap<u16, VecDeque<UdRequest>>,
    /// UD resolutions asked and answered.
    sidrs: HashMap<ConnId, sidr::Sidr>,
    out: VecDeque<OutMad>,
    /// Counters: MADs in, dropped (malformed, unknown IDs), retransmissions.
    pub stats: CmStats,
    /// The top byte of every local communication ID, if set ([`Cm::set_id_tag`]).
    id_tag: Option<u8>,
}

/// CM counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs handed in.
    pub mads_in: u64,
    /// MADs sent.
    pub mads_out: u64,
    /// MADs that did not parse or named no connection.
    pub mads_dropped: u64,
    /// Retransmissions on a timer.
    pub retransmissions: u64,
    /// Duplicates answered again.
    pub duplicates: u64,
}

impl Cm {
    /// A CM with no connections; `ca_guid` goes in every REQ and REP.
    pub fn new(cfg: CmConfig, ca_guid: u64, rng: Rng) -> Cm {
        Cm {
            cfg,
            ca_guid,
            rng,
            conns: HashMap::new(),
            listeners: HashMap::new(),
            ud_listeners: HashMap::new(),
            sidrs: HashMap::new(),
            out: VecDeque::new(),
            stats: CmStats::default(),
            id_tag: None,
        }
    }

    /// Makes every later local communication ID carry `tag` in its top byte, so a peer's
    /// reply reaches this CM among the devices sharing its address (`transport::share`).
    pub fn set_id_tag(&mut self, tag: u8) {
        self.id_tag = Some(tag);
    }

    /// Starts taking REQs for `port`'s ServiceID (`rdma_listen`).
    pub fn listen(&mut self, port: u16) -> Result<(), CmError> {
        if self.listeners.contains_key(&port) {
            return Err(CmError::PortInUse);
        }
        self.listeners.insert(port, VecDeque::new());
        Ok(())
    }

    /// Stops listening on `port`; requests nobody took are rejected.
    pub fn close_listener(&mut self, now: u64, port: u16) {
        for r in self.listeners.remove(&port).unwrap_or_default() {
            let _ = self.reject(now, r.id, &[]);
        }
    }

    /// The next request on `port`'s listener.
    pub fn take_request(&mut self, port: u16) -> Option<Request> {
        self.listeners.get_mut(&port)?.pop_front()
    }

    /// A connection's status.
    pub fn status(&self, id: ConnId) -> Option<&ConnStatus> {
        self.conns.get(&id).map(|c| &c.status)
    }

    /// The peer's private data from its REP (active side), once established.
    pub fn peer_private_data(&self, id: ConnId) -> Option<&[u8]> {
        self.conns.get(&id).map(|c| c.peer_private.as_slice())
    }

    /// The connection of `qpn`, if any.
    pub fn conn_of_qp(&self, qpn: u32) -> Option<ConnId> {
        self.conns.iter().find(|(_, c)| c.qpn == qpn && c.state != State::TimeWait).map(|(&id, _)| id)
    }

    /// Connections held (time-wait included).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Sends a REQ for `a.qpn` (IBTA 12.9.6: Idle → REQ Sent); the QP goes to INIT.
    pub fn connect(&mut self, now: u64, a: ConnectArgs, qps: &mut dyn QpControl) -> Result<ConnId, CmError> {
        if self.conn_of_qp(a.qpn).is_some() {
            return Err(CmError::Invalid("the QP has a connection already"));
        }
        if self.conns.len() >= MAX_CONNECTIONS {
            return Err(CmError::Limit("connections"));
        }
        if a.private_data.len() > msg::REQ_USER_PRIVATE {
            return Err(CmError::Invalid("REQ private data is at most 56 bytes"));
        }
        to_init(a.qpn, qps).map_err(CmError::Qp)?;
        let id = self.new_id();
        let mad = msg::req(&self.cfg, self.ca_guid, id, &a);
        let interval_ns = 2 * timeout_ns(self.cfg.packet_life) + timeout_ns(self.cfg.response_timeout);
        let conn = Conn {
            state: State::ReqSent,
            active: true,
            remote_id: 0,
            remote_guid: 0,
            qpn: a.qpn,
            remote_qpn: 0,
            remote_psn: 0,
            local_gid: a.local_gid,
            peer_gid: a.peer_gid,
            port: a.dst_port,
            last: None,
            retries_left: self.cfg.max_retries,
            max_retries: self.cfg.max_retries,
            timer: None,
            interval_ns,
            offer: None,
            rts: None,
            asked: Some(a),
            status: ConnStatus::Pending,
            peer_private: Vec::new(),
        };
        self.conns.insert(id, conn);
        self.send_repeating(now, id, mad);
        Ok(id)
    }

    /// Accepts a request onto `a.qpn` (IBTA 12.9.7: REQ Rcvd → REP Sent): the QP goes to
    /// RTR with what the REQ asked, and a REP goes out. RTS follows the RTU.
    pub fn accept(&mut self, now: u64, id: ConnId, a: AcceptArgs, qps: &mut dyn QpControl) -> Result<(), CmError> {
        if a.private_data.len() > msg::REP_PRIVATE {
            return Err(CmError::Invalid("REP private data is at most 196 bytes"));
        }
        let c = self.conns.get_mut(&id).filter(|c| matches!(c.state, State::ReqRcvd | State::MraSent));
        let c = c.ok_or(CmError::NoConnection)?;
        let offer = c.offer.clone().ok_or(CmError::NoConnection)?;
        // The REQ's limits bound this side's: it may not issue more READs than the peer
        // serves (12.7.29), nor a larger MTU than the path's.
        let mtu = offer.mtu.min(a.mtu);
        let initiator_depth = a.initiator_depth.min(offer.responder_resources);
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            dest_gid: Some(c.peer_gid),
            dest_qpn: Some(c.remote_qpn),
            rq_psn: Some(a.psn),
            path_mtu: Some(mtu),
            max_dest_rd_atomic: Some(a.responder_resources),
            min_rnr_timer: Some(12),
            ..QpAttr::default()
        };
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(c.remote_psn),
            timeout: Some(offer.local_ack_timeout),
            retry_cnt: Some(offer.retry_count),
            rnr_retry: Some(offer.rnr_retry_count),
            max_rd_atomic: Some(initiator_depth),
            ..QpAttr::default()
        };
        if let Err(e) = to_init(a.qpn, qps).and_then(|_| qps.modify_qp(a.qpn, &rtr)) {
            let _ = self.reject_with(now, id, reason::NO_QP, &[]);
            return Err(CmError::Qp(e));
        }
        let c = self.conns.get_mut(&id).ok_or(CmError::NoConnection)?;
        c.qpn = a.qpn;
        c.asked = Some(ConnectArgs {
            qpn: a.qpn,
            local_gid: c.local_gid,
            peer_gid: c.peer_gid,
            src_port: 0,
            dst_port: c.port,
            psn: a.psn,
            mtu,
            responder_resources: a.responder_resources,
            initiator_depth,
            private_data: Vec::new(),
        });
        c.pending_rts(rts);
        c.state = State::RepSent;
        c.timer = None;
        c.retries_left = c.max_retries;
        let mad = msg::rep(self.ca_guid, id, c, &a, initiator_depth);
        self.send_repeating(now, id, mad);
        Ok(())
    }

    /// Rejects a request (`rdma_reject`): REJ "consumer reject" with `private_data`.
    pub fn reject(&mut self, now: u64, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        if !self.conns.get(&id).is_some_and(|c| matches!(c.state, State::ReqRcvd | State::MraSent)) {
            return Err(CmError::NoConnection);
        }
        if private_data.len() > msg::REJ_PRIVATE {
            return Err(CmError::Invalid("REJ private data is at most 148 bytes"));
        }
        self.reject_with(now, id, reason::CONSUMER, private_data)
    }

    /// Tears an established connection down (`rdma_disconnect`, IBTA 12.9.8.2): the QP
    /// goes to ERR (its work requests flush) and a DREQ goes out.
    pub fn disconnect(&mut self, now: u64, id: ConnId, qps: &mut dyn QpControl) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id).ok_or(CmError::NoConnection)?;
        match c.state {
            State::Established | State::RepSent => {}
            State::ReqSent => {
                // Not yet connected: a REJ "timeout" tells the peer to forget it (12.9.6).
                // The QP stays as it was (INIT, receives posted) for another attempt.
                let mad = msg::rej(id, 0, msg::REJ_MSG_REQ, reason::TIMEOUT, &[]);
                let (peer, local) = (c.peer_gid, c.local_gid);
                c.status = ConnStatus::Disconnected;
                self.enter_time_wait(now, id);
                self.push(OutMad { dst: peer, src: local, mad });
                return Ok(());
            }
            _ => return Err(CmError::NoConnection),
        }
        let _ = to_error(qps, c.qpn);
        c.status = ConnStatus::Disconnected;
        c.state = State::DreqSent;
        c.retries_left = c.max_retries;
        let mad = msg::dreq(id, c.remote_id, c.remote_qpn);
        self.send_repeating(now, id, mad);
        Ok(())
    }

    /// [`Cm::disconnect`] of the connection QP `qpn` belongs to.
    pub fn disconnect_qp(&mut self, now: u64, qpn: u32, qps: &mut dyn QpControl) -> Result<(), CmError> {
        let id = self.conn_of_qp(qpn).ok_or(CmError::NoConnection)?;
        self.disconnect(now, id, qps)
    }

    /// The device is closing: every connection up is torn down (DREQ), every request
    /// waiting is rejected.
    pub fn disconnect_all(&mut self, now: u64, qps: &mut dyn QpControl) {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            match self.conns.get(&id).map(|c| c.state) {
                Some(State::ReqRcvd | State::MraSent) => {
                    let _ = self.reject_with(now, id, reason::NO_QP, &[]);
                }
                Some(State::Established | State::RepSent | State::ReqSent) => {
                    let _ = self.disconnect(now, id, qps);
                }
                _ => {}
            }
        }
    }

    /// The QP `qpn` is being destroyed: its connection is torn down as by
    /// [`Cm::disconnect`], or, still being set up, rejected.
    pub fn qp_destroyed(&mut self, now: u64, qpn: u32, qps: &mut dyn QpControl) {
        let Some(id) = self.conn_of_qp(qpn) else { return };
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::ReqRcvd | State::MraSent) => {
                let _ = self.reject_with(now, id, reason::NO_QP, &[]);
            }
            Some(_) => {
                let _ = self.disconnect(now, id, qps);
            }
            None => {}
        }
        if let Some(c) = self.conns.get_mut(&id) {
            // The QP number may be drawn again; the record must not name it.
            c.qpn = u32::MAX;
        }
    }

    /// The application is done with a connection that failed or was disconnected: its
    /// record goes once time-wait ends.
    pub fn forget(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get(&id) {
            if matches!(c.status, ConnStatus::Failed(_)) && c.state != State::TimeWait {
                self.conns.remove(&id);
            }
        }
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<OutMad> {
        let m = self.out.pop_front()?;
        self.stats.mads_out += 1;
        Some(m)
    }

    /// The earliest timer.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.conns.values().filter_map(|c| c.timer).chain(self.sidr_timeout()).min()
    }

    /// Fires the timers due at `now` (IBTA 12.7.x): a message not answered is sent again;
    /// after the last retry the connection fails; time-wait ends.
    pub fn handle_timeout(&mut self, now: u64, qps: &mut dyn QpControl) {
        let due: Vec<ConnId> =
            self.conns.iter().filter(|(_, c)| c.timer.is_some_and(|t| t <= now)).map(|(&i, _)| i).collect();
        for id in due {
            self.on_timer(now, id, qps);
        }
        self.sidr_timers(now);
    }

    fn on_timer(&mut self, now: u64, id: ConnId, qps: &mut dyn QpControl) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.timer = None;
        match c.state {
            State::TimeWait => {
                self.conns.remove(&id);
            }
            State::ReqSent | State::RepSent | State::DreqSent if c.retries_left > 0 => {
                c.retries_left -= 1;
                c.timer = Some(now + c.interval_ns);
                let m = OutMad { dst: c.peer_gid, src: c.local_gid, mad: c.last.clone().expect("a repeating message") };
                self.stats.retransmissions += 1;
                self.push(m);
            }
            State::DreqSent => self.enter_time_wait(now, id),
            State::ReqSent | State::RepSent => {
                // 12.9.6/12.9.7: out of retries; REJ "timeout". A QP that got as far as
                // RTR goes to ERR; an initiator's, still in INIT, stays for another try.
                if !c.active {
                    let _ = to_error(qps, c.qpn);
                }
                c.status = ConnStatus::Failed(CmFailure::Timeout);
                let which = if c.active { msg::REJ_MSG_REQ } else { msg::REJ_MSG_REP };
                let mad = msg::rej(id, c.remote_id, which, reason::TIMEOUT, &[]);
                let m = OutMad { dst: c.peer_gid, src: c.local_gid, mad };
                self.enter_time_wait(now, id);
                self.push(m);
            }
            State::ReqRcvd | State::MraSent => {
                let _ = self.reject_with(now, id, reason::TIMEOUT, &[]);
            }
            State::Established => {}
        }
    }

    fn new_id(&mut self) -> ConnId {
        loop {
            let drawn = self.rng.next_u64() as u32;
            let id = self.id_tag.map_or(drawn, |t| u32::from(t) << 24 | drawn & 0xff_ffff);
            if id != 0 && !self.conns.contains_key(&id) && !self.sidrs.contains_key(&id) {
                return id;
            }
        }
    }

    fn push(&mut self, m: OutMad) {
        if self.out.len() < MAX_QUEUED_MADS {
            self.out.push_back(m);
        }
    }

    /// Sends `mad` for `id` and arms its retransmission.
    fn send_repeating(&mut self, now: u64, id: ConnId, mad: Box<[u8; msg::MAD_LEN]>) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.last = Some(mad.clone());
        c.timer = Some(now + c.interval_ns);
        let m = OutMad { dst: c.peer_gid, src: c.local_gid, mad };
        self.push(m);
    }

    /// Sends a REJ for a request this side holds and closes it.
    fn reject_with(&mut self, now: u64, id: ConnId, why: u16, pd: &[u8]) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id).ok_or(CmError::NoConnection)?;
        let mad = msg::rej(id, c.remote_id, msg::REJ_MSG_REQ, why, pd);
        c.last = Some(mad.clone());
        c.status = ConnStatus::Failed(CmFailure::Rejected { reason: why, private_data: pd.to_vec() });
        let m = OutMad { dst: c.peer_gid, src: c.local_gid, mad };
        for q in self.listeners.values_mut() {
            q.retain(|r| r.id != id);
        }
        self.enter_time_wait(now, id);
        self.push(m);
        Ok(())
    }

    /// Time-wait (12.9.8.4): the record stays for two packet lifetimes plus the peer's
    /// response time, to answer a late DREQ and refuse a stale REQ, then goes.
    fn enter_time_wait(&mut self, now: u64, id: ConnId) {
        let wait = 2 * timeout_ns(self.cfg.packet_life) + timeout_ns(self.cfg.response_timeout);
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.timer = Some(now + wait);
        }
    }
}

impl Conn {
    /// The RTS attributes wait in `offer`'s place until the RTU.
    fn pending_rts(&mut self, rts: QpAttr) {
        self.offer = None;
        self.rts = Some(rts);
    }
}

/// Moves a QP to ERR (its work requests flush); a QP already gone is no matter here.
fn to_error(qps: &mut dyn QpControl, qpn: u32) -> Result<(), VerbsError> {
    qps.modify_qp(qpn, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() })
}

/// RESET → INIT with rdma_cm's access (remote READ, WRITE and atomics) and the default
/// P_Key; a QP already in INIT stays.
fn to_init(qpn: u32, qps: &mut dyn QpControl) -> Result<(), VerbsError> {
    let attr = QpAttr {
        state: Some(QpState::Init),
        access: Some(crate::engine::mem::Access::ALL),
        pkey: Some(0xffff),
        ..QpAttr::default()
    };
    match qps.modify_qp(qpn, &attr) {
        Err(VerbsError::IllegalTransition { from: QpState::Init, .. }) => Ok(()),
        r => r,
    }
}
