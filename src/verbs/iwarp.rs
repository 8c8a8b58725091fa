//! The verbs API's iWARP device: iWARP QPs ([`crate::iwarp::qp`]) on kernel TCP sockets,
//! one connection per QP, set up as rdma_cm sets up iWARP: TCP connect, then MPA
//! (RFC 5044 §7.1, RFC 6581) carrying the application's private data and read depths.
//!
//! Threading as on RoCE: posting runs to completion on the caller's thread (frame, write
//! what the socket takes), and one poll thread (mio) reads every socket, accepts, writes
//! what was left when a socket was full, and fires MPA timeouts. Socket reads happen
//! outside the device lock; everything else under it. A Send or Write completes when its
//! last byte is in the socket, so a full socket holds the application back.

use crate::driver::cq::CqQueue;
use crate::engine::mem::Pd;
use crate::engine::verbs::{QpCaps, QpState, RecvWr, SendWr, VerbsError, Wc, WcOpcode, WcStatus};
use crate::engine::Device;
use crate::iwarp::qp::IwarpQp;
use crate::iwarp::setup::{CrcPolicy, Outcome, PeerRequest, Policy, RtrKind, Setup};
use crate::proto::iwarp::mpa;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WAKER: Token = Token(0);
/// Bytes read from a socket per system call.
const READ_CHUNK: usize = 256 * 1024;
/// Reads from one socket before the others get a turn.
const READS_PER_TURN: usize = 16;
/// The poll thread looks at the MPA timers at least this often.
const TICK: Duration = Duration::from_millis(100);

/// Connections on one listener whose MPA Request has not fully arrived. One more evicts
/// the oldest of them: a peer holding handshakes open cannot lock a legitimate one out,
/// which sends its Request at once.
pub const MAX_HALF_OPEN_PER_LISTENER: usize = 64;
/// Valid MPA Requests on one listener waiting for the application. One more rejects the
/// oldest the application has not yet taken (or, if it has taken them all, the newcomer)
/// with an MPA reject: a peer filling the backlog cannot keep a fresh Request out.
pub const MAX_HELD_REQUESTS_PER_LISTENER: usize = 128;
/// Bytes a peer may send after its MPA Request while the application has not accepted it
/// (a conforming initiator sends none before the Reply, RFC 5044 §7.1.2); more: rejected.
pub const MAX_EARLY_BYTES: usize = 64 * 1024;
/// Bytes queued for one connection's socket beyond which Read Responses wait for the
/// peer to read: what a peer's Reads can make this side buffer.
pub const MAX_TX_BUFFERED: usize = 1 << 20;
/// How long a closing connection may take to write its last bytes (a Terminate, say) to a
/// peer that does not read before it is dropped, ms.
pub const CLOSE_LINGER_MS: u64 = 2_000;

/// The iWARP settings of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IwarpConfig {
    /// MPA CRC: off, used when the peer asks, or asked for.
    pub crc: CrcPolicy,
    /// Ask for markers in the stream this side receives.
    pub markers: bool,
    /// Peer-to-peer ready-to-receive kinds offered (initiator) or accepted (responder), in
    /// order of preference; empty: no peer-to-peer mode.
    pub rtr: Vec<RtrKind>,
    /// How long a peer may stay silent during MPA setup, ms.
    pub mpa_timeout_ms: u64,
    /// Largest FPDU sent (default: the connection's TCP MSS).
    pub max_fpdu: Option<usize>,
}

impl Default for IwarpConfig {
    fn default() -> Self {
        IwarpConfig {
            crc: CrcPolicy::OnRequest,
            markers: false,
            rtr: vec![RtrKind::Write, RtrKind::Send, RtrKind::Read],
            mpa_timeout_ms: 10_000,
            max_fpdu: None,
        }
    }
}

/// What a connecting or accepting side offers (`struct rdma_conn_param`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer (MPA carries at most 512 bytes, 508 with the IRD/ORD word).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads this side serves at once (IRD).
    pub responder_resources: u16,
    /// Outbound RDMA Reads this side keeps outstanding (ORD).
    pub initiator_depth: u16,
}

/// Why a connection did not come up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// TCP failed (refused, unreachable, reset).
    Tcp(String),
    /// The peer rejected the connection in MPA.
    Rejected(String),
    /// MPA setup failed (a protocol error, or the peer's silence).
    Mpa(String),
    /// Not in time.
    Timeout,
    /// The QP cannot connect (already connected, wrong transport, bad parameters).
    Invalid(&'static str),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Tcp(e) => write!(f, "TCP: {e}"),
            ConnectError::Rejected(e) => write!(f, "rejected: {e}"),
            ConnectError::Mpa(e) => write!(f, "MPA setup: {e}"),
            ConnectError::Timeout => write!(f, "no connection in time"),
            ConnectError::Invalid(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// A QP of the device, connected or not.
struct Slot {
    pd: Pd,
    send_cq: u32,
    recv_cq: u32,
    caps: QpCaps,
    qp: Option<IwarpQp>,
    /// Receives posted before the connection came up.
    early_recvs: Vec<RecvWr>,
    conn: Option<Token>,
    /// The QP went to ERR without a connection (setup failed or the application moved it).
    failed: bool,
}

/// One TCP connection.
struct Conn {
    stream: Arc<TcpStream>,
    setup: Option<Setup>,
    qpn: Option<u32>,
    listener: Option<Token>,
    initiator: bool,
    announced: bool,
    tx: Vec<u8>,
    tx_head: usize,
    queued: u64,
    written: u64,
    /// Stream bytes queued before the QP's first FPDU (the MPA frames).
    qp_base: u64,
    rx_early: Vec<u8>,
    /// Close once everything queued is written.
    closing: bool,
    /// When `closing` was set (ns), for the linger limit.
    closing_since_ns: Option<u64>,
    dead: bool,
    mss: usize,
    /// When the connection was made (ns): the oldest half-open one is evicted first.
    opened_ns: u64,
}

struct Lst {
    listener: TcpListener,
    requests: VecDeque<Token>,
}

/// What the device lock guards.
pub(super) struct IwCore {
    pub(super) dev: Device,
    cfg: IwarpConfig,
    qps: HashMap<u32, Slot>,
    conns: HashMap<Token, Conn>,
    listeners: HashMap<Token, Lst>,
    cqs: HashMap<u32, Arc<CqQueue>>,
    /// How setup ended, for the caller of `connect` or `accept` (kept until taken).
    results: HashMap<Token, Result<Vec<u8>, ConnectError>>,
    next_token: usize,
    epoch: Instant,
    registry: Registry,
}

/// The device, shared by the application's handles and the poll thread.
pub(super) struct IwShared {
    core: Mutex<IwCore>,
    changed: Condvar,
    waker: Waker,
    stop: AtomicBool,
    pub(super) ip: IpAddr,
}

impl IwShared {
    /// Opens the device and starts its poll thread.
    pub(super) fn open(ip: IpAddr, dev: Device, cfg: IwarpConfig) -> io::Result<(Arc<IwShared>, JoinHandle<()>)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let core = IwCore {
            dev,
            cfg,
            qps: HashMap::new(),
            conns: HashMap::new(),
            listeners: HashMap::new(),
            cqs: HashMap::new(),
            results: HashMap::new(),
            next_token: 1,
            epoch: Instant::now(),
            registry: poll.registry().try_clone()?,
        };
        let shared = Arc::new(IwShared {
            core: Mutex::new(core),
            changed: Condvar::new(),
            waker,
            stop: AtomicBool::new(false),
            ip,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("softrdma-iwarp".into()).spawn(move || poll_loop(s, poll))?;
        Ok((shared, thread))
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, IwCore> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the core, then tells waiting callers something may have changed.
    fn with<T>(&self, f: impl FnOnce(&mut IwCore) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.notify_all();
        out
    }

    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
    }

    pub(super) fn add_cq(&self, id: u32, q: Arc<CqQueue>) {
        self.lock().cqs.insert(id, q);
    }

    pub(super) fn create_qp(&self, pd: Pd, send_cq: u32, recv_cq: u32, caps: QpCaps) -> Result<u32, VerbsError> {
        let mut core = self.lock();
        if !core.cqs.contains_key(&send_cq) || !core.cqs.contains_key(&recv_cq) {
            return Err(VerbsError::NotFound);
        }
        let IwCore { dev, qps, .. } = &mut *core;
        let qpn = dev.draw_qpn(|q| qps.contains_key(&q));
        let slot = Slot { pd, send_cq, recv_cq, caps, qp: None, early_recvs: Vec::new(), conn: None, failed: false };
        core.qps.insert(qpn, slot);
        Ok(qpn)
    }

    pub(super) fn destroy_qp(&self, qpn: u32) {
        self.with(|c| {
            if let Some(t) = c.qps.remove(&qpn).and_then(|s| s.conn) {
                c.close(t);
            }
        });
    }

    pub(super) fn qp_state(&self, qpn: u32) -> Option<QpState> {
        let core = self.lock();
        let s = core.qps.get(&qpn)?;
        Some(match &s.qp {
            Some(qp) => qp.state(),
            None if s.failed => QpState::Err,
            None => QpState::Init,
        })
    }

    /// Moves the QP to ERR (`ibv_modify_qp` to ERR): everything flushes, the stream closes.
    pub(super) fn set_error(&self, qpn: u32) -> Result<(), VerbsError> {
        self.with(|c| {
            let s = c.qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
            match s.qp.as_mut() {
                Some(qp) => qp.on_stream_closed("moved to ERR by the application"),
                None => s.failed = true,
            }
            c.flush_early_recvs(qpn);
            c.pump_qp(qpn);
            Ok(())
        })
    }

    pub(super) fn post_send(&self, qpn: u32, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), VerbsError> {
        self.with(|c| {
            let IwCore { dev, qps, .. } = c;
            let s = qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
            let qp = s.qp.as_mut().ok_or(VerbsError::InvalidRequest)?;
            let mut out = Ok(());
            for wr in wrs {
                if wr.sgl.len() > s.caps.max_sge {
                    out = Err(VerbsError::InvalidRequest);
                } else {
                    out = qp.post_send(wr, dev.mrs_mut());
                }
                if out.is_err() {
                    break;
                }
            }
            c.pump_qp(qpn);
            out
        })
    }

    pub(super) fn post_recv(&self, qpn: u32, wr: RecvWr) -> Result<(), VerbsError> {
        self.with(|c| {
            let s = c.qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?;
            if wr.sgl.len() > s.caps.max_sge {
                return Err(VerbsError::InvalidRequest);
            }
            match s.qp.as_mut() {
                Some(qp) => qp.post_recv(wr)?,
                None if s.early_recvs.len() >= s.caps.max_recv_wr => return Err(VerbsError::QueueFull),
                None => s.early_recvs.push(wr),
            }
            if s.failed {
                c.flush_early_recvs(qpn);
            }
            c.pump_qp(qpn);
            Ok(())
        })
    }

    /// Active side: TCP connect, MPA Request, wait for the Reply. Returns the peer's
    /// private data.
    pub(super) fn connect(
        &self,
        qpn: u32,
        to: SocketAddr,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<Vec<u8>, ConnectError> {
        if param.private_data.len() > mpa::MAX_PRIVATE_DATA - mpa::IRD_ORD_LEN {
            return Err(ConnectError::Invalid("private data longer than MPA carries"));
        }
        let deadline = Instant::now() + timeout;
        let std_stream =
            std::net::TcpStream::connect_timeout(&to, timeout).map_err(|e| ConnectError::Tcp(e.to_string()))?;
        let stream = prepare(std_stream).map_err(|e| ConnectError::Tcp(e.to_string()))?;
        let token = {
            let mut c = self.lock();
            let s = c.qps.get(&qpn).ok_or(ConnectError::Invalid("no such QP"))?;
            if s.conn.is_some() || s.qp.is_some() || s.failed {
                return Err(ConnectError::Invalid("the QP is connected already"));
            }
            let now = c.now_ns();
            let policy = c.policy(param);
            let t = c
                .add_conn(stream, Setup::initiator(policy, now), None)
                .map_err(|e| ConnectError::Tcp(e.to_string()))?;
            if let Some(conn) = c.conns.get_mut(&t) {
                conn.qpn = Some(qpn);
                conn.initiator = true;
            }
            if let Some(s) = c.qps.get_mut(&qpn) {
                s.conn = Some(t);
            }
            c.after_setup(t);
            t
        };
        let _ = self.waker.wake();
        self.wait_result(token, deadline)
    }

    fn wait_result(&self, token: Token, deadline: Instant) -> Result<Vec<u8>, ConnectError> {
        let mut c = self.lock();
        loop {
            if let Some(r) = c.results.remove(&token) {
                return r;
            }
            if !c.conns.contains_key(&token) {
                return Err(ConnectError::Tcp("the connection closed during MPA setup".into()));
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                c.close(token);
                return Err(ConnectError::Timeout);
            };
            c = self.changed.wait_timeout(c, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Passive side: listens on `addr`; returns the listener's token and address.
    pub(super) fn listen(&self, addr: SocketAddr) -> io::Result<(Token, SocketAddr)> {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(l);
        let local = listener.local_addr()?;
        let mut c = self.lock();
        let t = c.token();
        c.registry.register(&mut listener, t, Interest::READABLE)?;
        c.listeners.insert(t, Lst { listener, requests: VecDeque::new() });
        Ok((t, local))
    }

    pub(super) fn close_listener(&self, t: Token) {
        self.with(|c| {
            if let Some(mut l) = c.listeners.remove(&t) {
                let _ = c.registry.deregister(&mut l.listener);
                for r in l.requests {
                    c.reject(r, b"");
                }
            }
        });
    }

    /// The next MPA Request on listener `t` (`RDMA_CM_EVENT_CONNECT_REQUEST`).
    pub(super) fn get_request(&self, t: Token, timeout: Duration) -> Option<(Token, PeerRequest, Option<SocketAddr>)> {
        let deadline = Instant::now() + timeout;
        let mut c = self.lock();
        loop {
            while let Some(r) = c.listeners.get_mut(&t)?.requests.pop_front() {
                let Some(conn) = c.conns.get(&r) else { continue };
                if let Some(req) = conn.setup.as_ref().and_then(|s| s.pending_request()) {
                    return Some((r, req, conn.stream.peer_addr().ok()));
                }
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            c = self.changed.wait_timeout(c, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Accepts request `r` onto QP `qpn` (`rdma_accept`).
    pub(super) fn accept(&self, r: Token, qpn: u32, param: &ConnParam) -> Result<(), ConnectError> {
        if param.private_data.len() > mpa::MAX_PRIVATE_DATA - mpa::IRD_ORD_LEN {
            return Err(ConnectError::Invalid("private data longer than MPA carries"));
        }
        self.with(|c| {
            let s = c.qps.get(&qpn).ok_or(ConnectError::Invalid("no such QP"))?;
            if s.conn.is_some() || s.qp.is_some() || s.failed {
                return Err(ConnectError::Invalid("the QP is connected already"));
            }
            let conn = c.conns.get_mut(&r).ok_or(ConnectError::Tcp("the peer left".into()))?;
            let setup = conn.setup.as_mut().ok_or(ConnectError::Invalid("not a pending request"))?;
            setup.accept(param.private_data.clone(), param.responder_resources, param.initiator_depth);
            conn.qpn = Some(qpn);
            if let Some(s) = c.qps.get_mut(&qpn) {
                s.conn = Some(r);
            }
            c.after_setup(r);
            match c.results.remove(&r) {
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => Err(e),
                None => Err(ConnectError::Tcp("the peer left".into())),
            }
        })
    }

    /// Rejects request `r` (`rdma_reject`).
    pub(super) fn reject(&self, r: Token, private_data: &[u8]) {
        self.with(|c| c.reject(r, private_data));
    }
}

/// A connected TCP stream made ready for the poll thread.
fn prepare(s: std::net::TcpStream) -> io::Result<TcpStream> {
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    Ok(TcpStream::from_std(s))
}

impl IwCore {
    /// TCP connections open.
    pub(super) fn connections(&self) -> usize {
        self.conns.len()
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
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

    fn add_conn(&mut self, mut stream: TcpStream, setup: Setup, listener: Option<Token>) -> io::Result<Token> {
        let t = self.token();
        self.registry.register(&mut stream, t, Interest::READABLE | Interest::WRITABLE)?;
        let mss = crate::transport::tcp_maxseg(stream.as_raw_fd()).unwrap_or(1460).max(576);
        let mss = self.cfg.max_fpdu.map_or(mss, |m| m.clamp(128, mss.max(128)));
        let opened_ns = self.now_ns();
        let conn = Conn {
            stream: Arc::new(stream),
            setup: Some(setup),
            qpn: None,
            listener,
            initiator: false,
            announced: false,
            tx: Vec::new(),
            tx_head: 0,
            queued: 0,
            written: 0,
            qp_base: 0,
            rx_early: Vec::new(),
            closing: false,
            closing_since_ns: None,
            dead: false,
            mss,
            opened_ns,
        };
        self.conns.insert(t, conn);
        Ok(t)
    }

    /// Accepts every waiting TCP connection on listener `t`.
    fn accept_all(&mut self, t: Token) {
        loop {
            let Some(l) = self.listeners.get(&t) else { return };
            let stream = match l.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            let _ = stream.set_nodelay(true);
            self.evict_half_open(t);
            let now = self.now_ns();
            let policy = self.policy(&ConnParam::default());
            if self.add_conn(stream, Setup::responder_deferred(policy, now), Some(t)).is_err() {
                continue;
            }
        }
    }

    /// Makes room for one more half-open connection on listener `l` by dropping the
    /// oldest, if it has [`MAX_HALF_OPEN_PER_LISTENER`].
    fn evict_half_open(&mut self, l: Token) {
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
    fn oldest_queued_request(&mut self, l: Token) -> Option<Token> {
        loop {
            let t = self.listeners.get_mut(&l)?.requests.pop_front()?;
            if self.conns.get(&t).and_then(|c| c.setup.as_ref()).is_some_and(|s| s.is_held()) {
                return Some(t);
            }
        }
    }

    /// Requests held on listener `l` for the application.
    fn held_requests(&self, l: Token) -> usize {
        self.conns.values().filter(|c| c.listener == Some(l) && c.setup.as_ref().is_some_and(|s| s.is_held())).count()
    }

    /// Bytes arrived on connection `t`.
    fn on_bytes(&mut self, t: Token, data: &[u8]) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        if let Some(setup) = c.setup.as_mut() {
            let used = setup.on_bytes(data);
            c.rx_early.extend_from_slice(&data[used..]);
            if c.rx_early.len() > MAX_EARLY_BYTES {
                c.rx_early = Vec::new();
                setup.reject(b"FPDUs before the MPA Reply");
                if setup.outcome().is_none() {
                    return self.fail(t, ConnectError::Mpa("FPDUs before the MPA Reply".into()));
                }
            }
            self.after_setup(t);
            return;
        }
        let Some(qpn) = c.qpn else { return };
        let IwCore { dev, qps, .. } = self;
        if let Some(qp) = qps.get_mut(&qpn).and_then(|s| s.qp.as_mut()) {
            qp.on_stream(data, dev.mrs_mut());
        }
        self.pump_qp(qpn);
    }

    /// After the MPA state machine moved: send its frames, hand a Request to the
    /// listener, bring the QP up or end the connection.
    fn after_setup(&mut self, t: Token) {
        let Some(c) = self.conns.get(&t) else { return };
        let newly_held = !c.announced && c.setup.as_ref().is_some_and(|s| s.is_held());
        if let Some(l) = c.listener.filter(|_| newly_held) {
            if self.held_requests(l) > MAX_HELD_REQUESTS_PER_LISTENER {
                let victim = self.oldest_queued_request(l).unwrap_or(t);
                self.reject(victim, b"too many pending connection requests");
            }
        }
        let Some(c) = self.conns.get_mut(&t) else { return };
        let Some(setup) = c.setup.as_mut() else { return };
        let out = setup.take_output();
        let held = setup.pending_request().is_some();
        let outcome = setup.outcome().cloned();
        queue(c, &out);
        if !c.announced && held {
            c.announced = true;
            if let Some(l) = c.listener.and_then(|l| self.listeners.get_mut(&l)) {
                l.requests.push_back(t);
            }
        }
        match outcome {
            None => self.flush(t),
            Some(Outcome::Established(neg)) => self.establish(t, &neg),
            Some(Outcome::Rejected(why)) => self.fail(t, ConnectError::Rejected(why)),
            Some(Outcome::Failed(why)) => self.fail(t, ConnectError::Mpa(why)),
        }
    }

    fn fail(&mut self, t: Token, e: ConnectError) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        c.setup = None;
        if c.qpn.is_some() {
            self.results.insert(t, Err(e));
        }
        if let Some(s) = c.qpn.and_then(|q| self.qps.get_mut(&q)) {
            s.failed = true;
            s.conn = None;
        }
        if let Some(q) = c.qpn.take() {
            self.flush_early_recvs(q);
        }
        // The reject Reply (if any) goes out before the close.
        let now = self.now_ns();
        if let Some(c) = self.conns.get_mut(&t) {
            c.start_closing(now);
        }
        self.flush(t);
    }

    fn establish(&mut self, t: Token, neg: &crate::iwarp::setup::Negotiated) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        let Some(qpn) = c.qpn else {
            // A held Request is not established before the application accepts it.
            return;
        };
        let Some(s) = self.qps.get_mut(&qpn) else { return self.close(t) };
        c.setup = None;
        c.qp_base = c.queued;
        self.results.insert(t, Ok(neg.peer_private_data.clone()));
        let mut qp = IwarpQp::new(qpn, s.pd, neg, c.initiator, c.mss);
        qp.set_queue_depths(s.caps.max_send_wr, s.caps.max_recv_wr);
        for wr in s.early_recvs.drain(..) {
            let _ = qp.post_recv(wr);
        }
        s.qp = Some(qp);
        let early = std::mem::take(&mut c.rx_early);
        if early.is_empty() {
            self.pump_qp(qpn);
        } else {
            self.on_bytes(t, &early);
        }
    }

    fn reject(&mut self, r: Token, private_data: &[u8]) {
        if let Some(setup) = self.conns.get_mut(&r).and_then(|c| c.setup.as_mut()) {
            setup.reject(private_data);
        }
        self.after_setup(r);
    }

    /// Receives posted on a QP that will never connect complete flushed.
    fn flush_early_recvs(&mut self, qpn: u32) {
        let Some(s) = self.qps.get_mut(&qpn) else { return };
        if s.qp.is_some() || !s.failed {
            return;
        }
        let wcs: Vec<Wc> =
            s.early_recvs.drain(..).map(|wr| Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn, 0)).collect();
        let cq = s.recv_cq;
        self.deliver(cq, wcs);
    }

    /// After work on QP `qpn`: its bytes to the socket, its completions to their CQs, and
    /// the stream closed once the QP is in ERR and its last bytes (a Terminate) are out.
    fn pump_qp(&mut self, qpn: u32) {
        let Some(s) = self.qps.get_mut(&qpn) else { return };
        let Some(qp) = s.qp.as_mut() else { return };
        // What the application posted; Read Responses are produced as the socket drains.
        let out = qp.poll_output(0);
        let t = s.conn;
        let err = qp.state() == QpState::Err;
        let now = self.now_ns();
        if let Some(c) = t.and_then(|t| self.conns.get_mut(&t)) {
            queue(c, &out);
            if err {
                c.start_closing(now);
            }
        }
        if let Some(t) = t {
            self.flush(t);
        }
        self.completions(qpn);
    }

    /// The QP's completions, to the send or receive CQ.
    fn completions(&mut self, qpn: u32) {
        let Some(s) = self.qps.get_mut(&qpn) else { return };
        let Some(qp) = s.qp.as_mut() else { return };
        let (mut sends, mut recvs) = (Vec::new(), Vec::new());
        while let Some(wc) = qp.poll_completion() {
            if wc.opcode == WcOpcode::Recv {
                recvs.push(wc)
            } else {
                sends.push(wc)
            }
        }
        let (scq, rcq) = (s.send_cq, s.recv_cq);
        self.deliver(scq, sends);
        self.deliver(rcq, recvs);
    }

    fn deliver(&self, cq: u32, wcs: Vec<Wc>) {
        if wcs.is_empty() {
            return;
        }
        if let Some(q) = self.cqs.get(&cq) {
            q.deliver(wcs);
        }
    }

    /// Writes what the socket takes, topping the queue up with the QP's Read Responses up
    /// to [`MAX_TX_BUFFERED`]; tells the QP how far its stream went; closes a connection
    /// that is done.
    fn flush(&mut self, t: Token) {
        let IwCore { conns, qps, .. } = self;
        let Some(c) = conns.get_mut(&t) else { return };
        let mut qp = c.qpn.and_then(|q| qps.get_mut(&q)).and_then(|s| s.qp.as_mut());
        loop {
            if let Some(qp) = qp.as_deref_mut().filter(|q| q.has_output()) {
                let room = MAX_TX_BUFFERED.saturating_sub(c.tx.len() - c.tx_head);
                queue(c, &qp.poll_output(room));
            }
            let blocked = c.write_some();
            if blocked || c.dead || !qp.as_deref().is_some_and(|q| q.has_output()) {
                break;
            }
        }
        let (written, base) = (c.written, c.qp_base);
        let done = c.dead || (c.closing && c.tx.is_empty());
        if let Some(qp) = qp {
            if written >= base {
                qp.on_transmitted(written - base);
            }
        }
        let qpn = c.qpn;
        if done {
            self.close(t);
        } else if let Some(q) = qpn {
            self.completions(q);
        }
    }

    /// The peer closed or the socket failed.
    fn on_closed(&mut self, t: Token, why: &str) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        c.dead = true;
        if c.setup.is_some() {
            return self.fail(t, ConnectError::Tcp(why.to_string()));
        }
        self.close(t);
    }

    /// Ends connection `t`: its QP (if any) goes to ERR with everything flushed.
    fn close(&mut self, t: Token) {
        let Some(mut c) = self.conns.remove(&t) else { return };
        if let Some(stream) = Arc::get_mut(&mut c.stream) {
            let _ = self.registry.deregister(stream);
        }
        let _ = c.stream.shutdown(Shutdown::Both);
        let Some(qpn) = c.qpn else { return };
        let Some(s) = self.qps.get_mut(&qpn) else { return };
        s.conn = None;
        if let Some(qp) = s.qp.as_mut() {
            qp.on_stream_closed("the connection closed");
            let _ = qp.take_output();
        }
        self.completions(qpn);
    }

    fn next_deadline(&self) -> Option<u64> {
        let setup = self.conns.values().filter_map(|c| c.setup.as_ref().and_then(|s| s.poll_timeout()));
        setup.chain(self.conns.values().filter_map(|c| c.linger_deadline())).min()
    }

    fn on_timers(&mut self) {
        let now = self.now_ns();
        let lingering: Vec<Token> =
            self.conns.iter().filter(|(_, c)| c.linger_deadline().is_some_and(|d| d <= now)).map(|(t, _)| *t).collect();
        for t in lingering {
            self.close(t);
        }
        let due: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.setup.as_ref().and_then(|s| s.poll_timeout()).is_some_and(|d| d <= now))
            .map(|(t, _)| *t)
            .collect();
        for t in due {
            if let Some(s) = self.conns.get_mut(&t).and_then(|c| c.setup.as_mut()) {
                s.handle_timeout(now);
            }
            self.after_setup(t);
        }
    }
}

fn queue(c: &mut Conn, bytes: &[u8]) {
    c.tx.extend_from_slice(bytes);
    c.queued += bytes.len() as u64;
}

impl Conn {
    /// Writes what the socket takes; true when it would block.
    fn write_some(&mut self) -> bool {
        let mut blocked = false;
        while self.tx_head < self.tx.len() && !self.dead {
            match (&*self.stream).write(&self.tx[self.tx_head..]) {
                Ok(n) => {
                    self.tx_head += n;
                    self.written += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    blocked = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
        if self.tx_head == self.tx.len() {
            self.tx.clear();
            self.tx_head = 0;
        } else if self.tx_head > (1 << 20) {
            self.tx.drain(..self.tx_head);
            self.tx_head = 0;
        }
        blocked
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

/// The poll thread.
fn poll_loop(shared: Arc<IwShared>, mut poll: Poll) {
    let mut events = Events::with_capacity(256);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut again: Vec<Token> = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        let timeout = if again.is_empty() {
            let core = shared.lock();
            let now = core.now_ns();
            core.next_deadline().map_or(TICK, |d| Duration::from_nanos(d.saturating_sub(now)).min(TICK))
        } else {
            Duration::ZERO
        };
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut ready: Vec<(Token, bool, bool)> =
            std::mem::take(&mut again).into_iter().map(|t| (t, true, false)).collect();
        ready.extend(
            events
                .iter()
                .filter(|e| e.token() != WAKER)
                .map(|e| (e.token(), e.is_readable() || e.is_read_closed() || e.is_error(), e.is_writable())),
        );
        for (t, readable, writable) in ready {
            if writable {
                shared.with(|c| c.flush(t));
            }
            if readable && shared.read_some(t, &mut buf) {
                again.push(t);
            }
        }
        shared.with(|c| c.on_timers());
    }
}

impl IwShared {
    /// Reads connection or listener `t` until it would block (or for a turn); returns
    /// true if there may be more.
    fn read_some(&self, t: Token, buf: &mut [u8]) -> bool {
        let stream = {
            let mut c = self.lock();
            if c.listeners.contains_key(&t) {
                c.accept_all(t);
                return false;
            }
            match c.conns.get(&t) {
                Some(conn) => conn.stream.clone(),
                None => return false,
            }
        };
        for _ in 0..READS_PER_TURN {
            match (&*stream).read(buf) {
                Ok(0) => {
                    self.with(|c| c.on_closed(t, "the peer closed the connection"));
                    return false;
                }
                Ok(n) => self.with(|c| c.on_bytes(t, &buf[..n])),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.with(|c| c.on_closed(t, &e.to_string()));
                    return false;
                }
            }
        }
        true
    }
}
