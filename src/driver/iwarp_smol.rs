//! The iWARP device on smoltcp's TCP over raw Ethernet: the whole stack in userspace, on an
//! address the kernel does not hold (`crate::transport::raw`). smoltcp answers ARP, ND and
//! echo requests for the address and runs TCP; the device's MPA and RDMAP run on its
//! sockets exactly as on kernel TCP.
//!
//! One lock guards the device, the interface and the sockets. Posting runs to completion
//! on the caller's thread (queue, push into TCP, send frames); the poll thread wakes on a
//! frame, a wake-up or the earliest of smoltcp's and the device's timers.

use super::cq::CqQueue;
use super::iwarp::IwarpPort;
use crate::iwarp::config::{ConnectError, CLOSE_LINGER_MS};
use crate::iwarp::device::{ConnId, ConnState, IwarpDevice};
use crate::transport::raw::frame::complete_partial_checksum;
use crate::transport::raw::io::{FrameRx, FrameTx};
use crate::transport::{wait_readable, Waker};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of each TCP socket's receive and send buffers, allocated with the socket: a
/// LAN's bandwidth-delay product (10 Gb/s over 100 µs is 125 KB) with room to spare, and
/// small enough that the sockets a peer can make exist (listening, half-open, held,
/// closing: each bounded) stay tens of MiB, not GiB.
const SOCKET_BUFFER_BYTES: usize = 256 * 1024;
/// Sockets kept listening per listener: SYNs arriving together each find one.
const LISTEN_BACKLOG: usize = 8;
/// The poll thread looks at the timers at least this often.
const TICK: Duration = Duration::from_millis(100);
/// A handshake left half-open this long is dropped (its socket listens again).
const SYN_RECEIVED_NS: u64 = 5_000_000_000;
/// Streams closing at once, at most; beyond, the oldest are reset.
const MAX_CLOSING: usize = 256;

/// smoltcp's view of the link: frames in from a [`FrameRx`], frames out to a [`FrameTx`].
struct Phy {
    rx: Box<dyn FrameRx>,
    tx: Arc<dyn FrameTx>,
    next: usize,
    got: usize,
    out: Vec<Vec<u8>>,
    mtu: usize,
}

struct RxTok(Vec<u8>);
struct TxTok<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0u8; len];
        let r = f(&mut frame);
        self.0.push(frame);
        r
    }
}

impl phy::Device for Phy {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;

    fn receive(&mut self, _now: SmolInstant) -> Option<(RxTok, TxTok<'_>)> {
        // Only the batch in hand: the driver reads the next one between polls, so that a
        // busy link cannot keep one poll (and the lock) going, nor its replies unsent.
        if self.next >= self.got {
            return None;
        }
        let mut frame = self.rx.frame(self.next)?.to_vec();
        if self.rx.checksum_partial(self.next) {
            complete_partial_checksum(&mut frame);
        }
        self.next += 1;
        Some((RxTok(frame), TxTok(&mut self.out)))
    }

    fn transmit(&mut self, _now: SmolInstant) -> Option<TxTok<'_>> {
        Some(TxTok(&mut self.out))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + 14;
        caps
    }
}

impl Phy {
    /// Reads the next batch once the one in hand is used up; true if frames are waiting.
    fn refill(&mut self) -> bool {
        if self.next >= self.got {
            self.got = self.rx.recv().unwrap_or(0);
            self.next = 0;
        }
        self.next < self.got
    }

    fn flush(&mut self) {
        if !self.out.is_empty() {
            self.tx.send(&std::mem::take(&mut self.out));
        }
    }
}

struct Listening {
    port: u16,
    /// Sockets listening, and since when each has been in SYN-RECEIVED (ns).
    sockets: Vec<(SocketHandle, Option<u64>)>,
}

/// What the device lock guards.
struct Core {
    dev: IwarpDevice,
    iface: Interface,
    sockets: SocketSet<'static>,
    phy: Phy,
    conns: HashMap<ConnId, SocketHandle>,
    listeners: HashMap<ConnId, Listening>,
    /// Streams the device ended, closing gracefully until smoltcp lets them go, and since
    /// when (ns).
    closing: Vec<(SocketHandle, u64)>,
    now_ns: u64,
    cqs: HashMap<u32, Arc<CqQueue>>,
    events: Arc<super::event::EventQueue>,
    mss: usize,
    /// The connections to write and the completions to hand out, kept for their room.
    writable: Vec<ConnId>,
    wc_run: Vec<crate::engine::verbs::Wc>,
}

/// The iWARP device on smoltcp, shared by the application's handles and the poll thread.
pub struct IwarpSmol {
    core: Mutex<Core>,
    changed: super::iwarp::Changed,
    waker: Waker,
    stop: AtomicBool,
    ip: IpAddr,
    epoch: Instant,
}

/// Where a raw iWARP device sits: its address, MAC, prefix, gateway and link MTU.
pub struct SmolLink {
    /// The device's address.
    pub ip: IpAddr,
    /// On-link prefix length.
    pub prefix_len: u8,
    /// Next hop off the link.
    pub gateway: Option<IpAddr>,
    /// The device's MAC.
    pub mac: [u8; 6],
    /// The link's MTU (IP bytes per frame).
    pub mtu: usize,
}

/// A random port from the dynamic range (RFC 6335 §6: 49152-65535).
fn ephemeral_port() -> u16 {
    let mut p = [0u8; 2];
    let _ = getrandom::fill(&mut p);
    49152 + u16::from_ne_bytes(p) % 16384
}

fn smol_ip(ip: IpAddr) -> IpAddress {
    match ip {
        IpAddr::V4(v4) => IpAddress::Ipv4(v4),
        IpAddr::V6(v6) => IpAddress::Ipv6(v6),
    }
}

fn std_endpoint(e: IpEndpoint) -> SocketAddr {
    let ip = match e.addr {
        IpAddress::Ipv4(v4) => IpAddr::V4(v4),
        IpAddress::Ipv6(v6) => IpAddr::V6(v6),
    };
    SocketAddr::new(ip, e.port)
}

impl IwarpSmol {
    /// Starts the driver of `dev` on the frames of `rx`/`tx` and its poll thread.
    pub fn start(
        dev: IwarpDevice,
        link: SmolLink,
        rx: Box<dyn FrameRx>,
        tx: Arc<dyn FrameTx>,
    ) -> io::Result<(Arc<IwarpSmol>, JoinHandle<()>)> {
        let mut phy = Phy { rx, tx, next: 0, got: 0, out: Vec::new(), mtu: link.mtu };
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(link.mac)));
        config.random_seed = u64::from_ne_bytes(seed);
        let mut iface = Interface::new(config, &mut phy, SmolInstant::from_micros(0));
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(smol_ip(link.ip), link.prefix_len));
        });
        match link.gateway {
            Some(IpAddr::V4(g)) => drop(iface.routes_mut().add_default_ipv4_route(g)),
            Some(IpAddr::V6(g)) => drop(iface.routes_mut().add_default_ipv6_route(g)),
            None => {}
        }
        let ip_overhead = if link.ip.is_ipv4() { 20 } else { 40 };
        let core = Core {
            dev,
            iface,
            sockets: SocketSet::new(Vec::new()),
            phy,
            conns: HashMap::new(),
            listeners: HashMap::new(),
            closing: Vec::new(),
            now_ns: 0,
            cqs: HashMap::new(),
            events: Arc::default(),
            mss: link.mtu.saturating_sub(ip_overhead + 20).max(536),
            writable: Vec::new(),
            wc_run: Vec::new(),
        };
        let driver = Arc::new(IwarpSmol {
            core: Mutex::new(core),
            changed: super::iwarp::Changed::default(),
            waker: Waker::new()?,
            stop: AtomicBool::new(false),
            ip: link.ip,
            epoch: Instant::now(),
        });
        let d = driver.clone();
        let thread = std::thread::Builder::new().name("softrdma-iwarp-smol".into()).spawn(move || d.poll_loop())?;
        Ok((driver, thread))
    }

    fn now(&self) -> (u64, SmolInstant) {
        let e = self.epoch.elapsed();
        (e.as_nanos() as u64, SmolInstant::from_micros(e.as_micros() as i64))
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        let mut core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        core.dev.set_now(self.now().0);
        core
    }

    /// Runs `f` on the core, then moves bytes and frames until nothing changes, and tells
    /// waiting callers something may have changed.
    fn with_core<T>(&self, f: impl FnOnce(&mut Core) -> T) -> T {
        let mut core = self.lock();
        let out = f(&mut core);
        let (now_ns, now) = self.now();
        core.now_ns = now_ns;
        core.pump(now);
        drop(core);
        self.changed.notify();
        out
    }

    fn poll_loop(self: Arc<Self>) {
        super::spin::ask_short_slice();
        let rx_fd = self.lock().phy.rx.fd();
        let waker_fd = self.waker.as_raw_fd();
        while !self.stop.load(Ordering::Acquire) {
            let timeout = {
                let mut guard = self.lock();
                let core = &mut *guard;
                let (now_ns, now) = self.now();
                let smol = core.iface.poll_delay(now, &core.sockets).map(|d| Duration::from_micros(d.total_micros()));
                let dev = core.dev.poll_timeout().map(|d| Duration::from_nanos(d.saturating_sub(now_ns)));
                [smol, dev].into_iter().flatten().min().unwrap_or(TICK).min(TICK)
            };
            if wait_readable(&[rx_fd, waker_fd], Some(timeout)).is_err() {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.waker.clear();
            self.with_core(|c| c.dev.handle_timeout());
        }
    }
}

impl Core {
    /// Polls the interface and services every socket until neither moves any more (a
    /// bounded number of batches: what is left is read on the poll thread's next turn).
    fn pump(&mut self, now: SmolInstant) {
        for _ in 0..64 {
            let frames = self.phy.refill();
            let changed = self.iface.poll(now, &mut self.phy, &mut self.sockets);
            self.phy.flush();
            let moved = self.service_listeners() | self.service_conns() | self.settle();
            self.phy.flush();
            if changed == smoltcp::iface::PollResult::None && !moved && !frames {
                break;
            }
        }
        self.reap_closing();
        let cqs = &self.cqs;
        self.dev.drain_completions(&mut self.wc_run, |cq, wcs| {
            if let Some(q) = cqs.get(&cq) {
                q.deliver(wcs);
            }
        });
        while let Some(e) = self.dev.dev.poll_async_event() {
            self.events.deliver(e);
        }
        self.events.qps_errored(self.dev.dev.take_errored_qps());
    }

    fn new_socket(&mut self) -> SocketHandle {
        let rx = tcp::SocketBuffer::new(vec![0u8; SOCKET_BUFFER_BYTES]);
        let tx = tcp::SocketBuffer::new(vec![0u8; SOCKET_BUFFER_BYTES]);
        let mut s = tcp::Socket::new(rx, tx);
        // FPDUs are whole messages: no waiting for more to coalesce (TCP_NODELAY).
        s.set_nagle_enabled(false);
        s.set_ack_delay(None);
        self.sockets.add(s)
    }

    /// Accepted connections become the device's; a fresh socket listens in each one's
    /// place. A handshake that stays half-open past [`SYN_RECEIVED_NS`], or a socket that
    /// left the handshake any other way (reset, closed at once), is dropped, so that
    /// peers cannot use the backlog up.
    fn service_listeners(&mut self) -> bool {
        let mut moved = false;
        let now = self.now_ns;
        let ids: Vec<ConnId> = self.listeners.keys().copied().collect();
        for l in ids {
            let Some(listening) = self.listeners.get_mut(&l) else { continue };
            let port = listening.port;
            let mut keep = Vec::new();
            for (h, since) in std::mem::take(&mut listening.sockets) {
                let s = self.sockets.get_mut::<tcp::Socket>(h);
                match s.state() {
                    tcp::State::Listen => keep.push((h, None)),
                    tcp::State::SynReceived if now.saturating_sub(since.unwrap_or(now)) < SYN_RECEIVED_NS => {
                        keep.push((h, Some(since.unwrap_or(now))))
                    }
                    tcp::State::Established => {
                        moved = true;
                        let t = self.dev.on_tcp_accepted(l, self.mss);
                        self.conns.insert(t, h);
                    }
                    _ => {
                        s.abort();
                        self.closing.push((h, now));
                    }
                }
            }
            if let Some(listening) = self.listeners.get_mut(&l) {
                listening.sockets = keep;
            }
            self.keep_listening(l, port);
        }
        moved
    }

    fn keep_listening(&mut self, l: ConnId, port: u16) {
        while self.listeners.get(&l).is_some_and(|x| x.sockets.len() < LISTEN_BACKLOG) {
            let h = self.new_socket();
            if self.sockets.get_mut::<tcp::Socket>(h).listen(port).is_err() {
                self.sockets.remove(h);
                return;
            }
            if let Some(x) = self.listeners.get_mut(&l) {
                x.sockets.push((h, None));
            }
        }
    }

    /// Connections made, bytes received, peers gone: each to the device.
    fn service_conns(&mut self) -> bool {
        let mut moved = false;
        let conns: Vec<(ConnId, SocketHandle)> = self.conns.iter().map(|(t, h)| (*t, *h)).collect();
        for (t, h) in conns {
            let Core { dev, sockets, mss, .. } = self;
            let s = sockets.get_mut::<tcp::Socket>(h);
            if dev.conn_state(t) == Some(ConnState::TcpConnecting) && s.state() == tcp::State::Established {
                dev.on_tcp_connected(t, *mss);
                moved = true;
            }
            while s.can_recv() {
                let got = s.recv(|buf| {
                    dev.on_bytes(t, buf);
                    (buf.len(), buf.len())
                });
                moved |= got.is_ok_and(|n| n > 0);
                if !got.is_ok_and(|n| n > 0) {
                    break;
                }
            }
            if !s.may_recv() && !s.can_recv() && s.state() != tcp::State::SynSent {
                let why = if s.state() == tcp::State::Closed { "the connection reset" } else { "the peer closed" };
                dev.on_tcp_closed(t, why);
                moved = true;
            }
        }
        moved
    }

    /// The device's bytes into TCP, its ended streams closed.
    fn settle(&mut self) -> bool {
        let mut moved = false;
        let mut writable = std::mem::take(&mut self.writable);
        self.dev.take_writable_into(&mut writable);
        for &t in &writable {
            let Some(&h) = self.conns.get(&t) else { continue };
            let s = self.sockets.get_mut::<tcp::Socket>(h);
            loop {
                if self.dev.tx_pending_len(t) == 0 || !s.can_send() {
                    break;
                }
                // smoltcp copies into its send buffer anyway: straight from the queue
                // and registered memory, into the free part it offers.
                let dev = &mut self.dev;
                match s.send(|buf| {
                    let n = dev.tx_copy_pending(t, buf);
                    (n, n)
                }) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        moved = true;
                        self.dev.on_written(t, n);
                    }
                }
            }
            if self.dev.tx_pending_len(t) > 0 {
                // The socket is full: look again after the next poll.
                self.dev.mark_writable(t);
            }
        }
        self.writable = writable;
        for t in self.dev.take_closed() {
            if let Some(h) = self.conns.remove(&t) {
                self.sockets.get_mut::<tcp::Socket>(h).close();
                self.closing.push((h, self.now_ns));
                moved = true;
            }
        }
        moved
    }

    /// Lets go of closed streams; one whose peer does not finish the close within
    /// [`CLOSE_LINGER_MS`] is reset, and beyond [`MAX_CLOSING`] the oldest are.
    fn reap_closing(&mut self) {
        let now = self.now_ns;
        let overflow = self.closing.len().saturating_sub(MAX_CLOSING);
        let sockets = &mut self.sockets;
        let mut i = 0;
        self.closing.retain(|(h, since)| {
            i += 1;
            let s = sockets.get_mut::<tcp::Socket>(*h);
            let lingered = now.saturating_sub(*since) > CLOSE_LINGER_MS * 1_000_000 || i <= overflow;
            if lingered {
                s.abort();
            }
            let done = lingered || matches!(s.state(), tcp::State::Closed | tcp::State::TimeWait);
            if done {
                sockets.remove(*h);
            }
            !done
        });
    }
}

impl IwarpPort for IwarpSmol {
    fn ip(&self) -> IpAddr {
        self.ip
    }

    fn events(&self) -> Arc<super::event::EventQueue> {
        self.lock().events.clone()
    }

    fn run(&self, f: &mut dyn FnMut(&mut IwarpDevice)) {
        self.with_core(|c| f(&mut c.dev));
    }

    fn wait(&self, done: &mut dyn FnMut(&mut IwarpDevice) -> bool, timeout: Duration) -> bool {
        super::iwarp::wait_until(self.lock(), &self.changed, |c| &mut c.dev, done, timeout, TICK)
    }

    fn add_cq(&self, id: u32, queue: Arc<CqQueue>) {
        self.lock().cqs.insert(id, queue);
    }

    fn open_stream(&self, t: ConnId, to: SocketAddr, _timeout: Duration) -> Result<(), ConnectError> {
        self.with_core(|c| {
            // The application may have destroyed the QP meanwhile: then nobody wants it.
            if c.dev.conn_state(t).is_none() {
                return Err(ConnectError::Invalid("the connection was abandoned"));
            }
            let h = c.new_socket();
            let local_port = ephemeral_port();
            let Core { iface, sockets, .. } = c;
            let remote = IpEndpoint::new(smol_ip(to.ip()), to.port());
            if let Err(e) = sockets.get_mut::<tcp::Socket>(h).connect(iface.context(), remote, local_port) {
                sockets.remove(h);
                return Err(ConnectError::Tcp(format!("{e}")));
            }
            c.conns.insert(t, h);
            Ok(())
        })?;
        self.waker.wake();
        Ok(())
    }

    fn listen(&self, addr: SocketAddr) -> io::Result<(ConnId, SocketAddr)> {
        if !addr.ip().is_unspecified() && addr.ip() != self.ip {
            return Err(io::Error::new(io::ErrorKind::AddrNotAvailable, "not this device's address"));
        }
        let port = match addr.port() {
            0 => ephemeral_port(),
            p => p,
        };
        let ip = self.ip;
        let l = self.with_core(|c| {
            if c.listeners.values().any(|x| x.port == port) {
                return Err(io::Error::from(io::ErrorKind::AddrInUse));
            }
            let l = c.dev.listen();
            c.listeners.insert(l, Listening { port, sockets: Vec::new() });
            c.keep_listening(l, port);
            Ok(l)
        })?;
        Ok((l, SocketAddr::new(ip, port)))
    }

    fn close_listener(&self, l: ConnId) {
        self.with_core(|c| {
            if let Some(x) = c.listeners.remove(&l) {
                for (h, _) in x.sockets {
                    c.sockets.remove(h);
                }
            }
            c.dev.close_listener(l);
        });
    }

    fn peer_addr(&self, t: ConnId) -> Option<SocketAddr> {
        let c = self.lock();
        let h = c.conns.get(&t)?;
        c.sockets.get::<tcp::Socket>(*h).remote_endpoint().map(std_endpoint)
    }

    fn stop(&self) {
        // Tell every peer its connection is gone rather than let it time out.
        self.with_core(|c| {
            let handles: Vec<SocketHandle> = c.conns.drain().map(|(_, h)| h).collect();
            for h in handles {
                c.sockets.get_mut::<tcp::Socket>(h).abort();
            }
        });
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
    }
}
