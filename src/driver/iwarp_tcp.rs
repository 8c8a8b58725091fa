//! The iWARP device on kernel TCP sockets (mio): the unprivileged default.
//!
//! Threading as on RoCE: posting runs to completion on the caller's thread (frame, write
//! what the socket takes), and one poll thread reads every socket, accepts, writes what
//! was left when a socket was full, and fires MPA timeouts. Socket reads happen outside
//! the device lock; everything else under it.

use super::cq::CqQueue;
use super::iwarp::IwarpPort;
use crate::iwarp::config::ConnectError;
use crate::iwarp::device::{ConnId, IwarpDevice};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WAKER: Token = Token(0);
/// Bytes read from a socket per system call.
const READ_CHUNK: usize = 256 * 1024;
/// Reads from one socket before the others get a turn.
const READS_PER_TURN: usize = 16;
/// The poll thread looks at the MPA timers at least this often.
const TICK: Duration = Duration::from_millis(100);

/// What the device lock guards.
struct Core {
    dev: IwarpDevice,
    streams: HashMap<ConnId, Arc<TcpStream>>,
    listeners: HashMap<ConnId, TcpListener>,
    cqs: HashMap<u32, Arc<CqQueue>>,
    registry: Registry,
}

/// The device on kernel TCP, shared by the application's handles and the poll thread.
pub struct IwarpTcp {
    core: Mutex<Core>,
    changed: super::iwarp::Changed,
    waker: Waker,
    stop: AtomicBool,
    ip: IpAddr,
    epoch: Instant,
}

impl IwarpTcp {
    /// Starts the driver of `dev` and its poll thread.
    pub fn start(ip: IpAddr, dev: IwarpDevice) -> io::Result<(Arc<IwarpTcp>, JoinHandle<()>)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let core = Core {
            dev,
            streams: HashMap::new(),
            listeners: HashMap::new(),
            cqs: HashMap::new(),
            registry: poll.registry().try_clone()?,
        };
        let driver = Arc::new(IwarpTcp {
            core: Mutex::new(core),
            changed: super::iwarp::Changed::default(),
            waker,
            stop: AtomicBool::new(false),
            ip,
            epoch: Instant::now(),
        });
        let d = driver.clone();
        let thread = std::thread::Builder::new().name("softrdma-iwarp".into()).spawn(move || d.poll_loop(poll))?;
        Ok((driver, thread))
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        let mut core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        core.dev.set_now(self.epoch.elapsed().as_nanos() as u64);
        core
    }

    /// Runs `f` on the core, settles, and tells waiting callers something changed.
    fn with_core<T>(&self, f: impl FnOnce(&mut Core) -> T) -> T {
        let mut core = self.lock();
        let out = f(&mut core);
        core.settle();
        drop(core);
        self.changed.notify();
        out
    }

    /// The poll thread.
    fn poll_loop(self: Arc<Self>, mut poll: Poll) {
        let mut events = Events::with_capacity(256);
        let mut buf = vec![0u8; READ_CHUNK];
        let mut again: Vec<Token> = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            let timeout = if again.is_empty() {
                let core = self.lock();
                let now = self.epoch.elapsed().as_nanos() as u64;
                core.dev.poll_timeout().map_or(TICK, |d| Duration::from_nanos(d.saturating_sub(now)).min(TICK))
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
                    self.with_core(|c| c.write(t.0));
                }
                if readable && self.read_some(t.0, &mut buf) {
                    again.push(t);
                }
            }
            self.with_core(|c| c.dev.handle_timeout());
        }
    }

    /// Reads connection or listener `t` until it would block (or for a turn); returns
    /// true if there may be more.
    fn read_some(&self, t: ConnId, buf: &mut [u8]) -> bool {
        let stream = {
            let c = self.lock();
            if c.listeners.contains_key(&t) {
                drop(c);
                self.with_core(|c| c.accept_all(t));
                return false;
            }
            match c.streams.get(&t) {
                Some(s) => s.clone(),
                None => return false,
            }
        };
        for _ in 0..READS_PER_TURN {
            match (&*stream).read(buf) {
                Ok(0) => {
                    self.with_core(|c| c.dev.on_tcp_closed(t, "the peer closed the connection"));
                    return false;
                }
                Ok(n) => self.with_core(|c| c.dev.on_bytes(t, &buf[..n])),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.with_core(|c| c.dev.on_tcp_closed(t, &e.to_string()));
                    return false;
                }
            }
        }
        true
    }
}

/// A connected TCP stream made ready for the poll thread; its MSS.
fn prepare(s: std::net::TcpStream) -> io::Result<(TcpStream, usize)> {
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let mss = crate::transport::tcp_maxseg(s.as_raw_fd()).unwrap_or(1460).max(576);
    Ok((TcpStream::from_std(s), mss))
}

impl Core {
    /// After any device work: write what it queued, close what it ended, hand out
    /// completions.
    fn settle(&mut self) {
        for _ in 0..4 {
            let writable = self.dev.take_writable();
            let closed = self.dev.take_closed();
            if writable.is_empty() && closed.is_empty() {
                break;
            }
            for t in writable {
                self.write(t);
            }
            for t in closed {
                self.drop_stream(t);
            }
        }
        for (cq, wcs) in self.dev.take_completions() {
            if let Some(q) = self.cqs.get(&cq) {
                q.deliver(wcs);
            }
        }
    }

    /// Writes what connection `t` has queued until the socket would block.
    fn write(&mut self, t: ConnId) {
        let Some(stream) = self.streams.get(&t).cloned() else { return };
        loop {
            let pending = self.dev.tx_pending(t);
            if pending.is_empty() {
                return;
            }
            match (&*stream).write(pending) {
                Ok(n) => self.dev.on_written(t, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.dev.on_tcp_closed(t, &e.to_string()),
            }
        }
    }

    fn drop_stream(&mut self, t: ConnId) {
        let Some(mut stream) = self.streams.remove(&t) else { return };
        if let Some(s) = Arc::get_mut(&mut stream) {
            let _ = self.registry.deregister(s);
        }
        let _ = stream.shutdown(Shutdown::Both);
    }

    fn add_stream(&mut self, t: ConnId, mut stream: TcpStream) -> io::Result<()> {
        self.registry.register(&mut stream, Token(t), Interest::READABLE | Interest::WRITABLE)?;
        self.streams.insert(t, Arc::new(stream));
        Ok(())
    }

    /// Accepts every waiting TCP connection on listener `l`.
    fn accept_all(&mut self, l: ConnId) {
        loop {
            let Some(listener) = self.listeners.get(&l) else { return };
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            let _ = stream.set_nodelay(true);
            let mss = crate::transport::tcp_maxseg(stream.as_raw_fd()).unwrap_or(1460).max(576);
            let t = self.dev.on_tcp_accepted(l, mss);
            if self.add_stream(t, stream).is_err() {
                self.dev.on_tcp_closed(t, "could not register the socket");
            }
        }
    }
}

impl IwarpPort for IwarpTcp {
    fn ip(&self) -> IpAddr {
        self.ip
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

    fn open_stream(&self, t: ConnId, to: SocketAddr, timeout: Duration) -> Result<(), ConnectError> {
        let tcp = |e: io::Error| ConnectError::Tcp(e.to_string());
        let (stream, mss) = std::net::TcpStream::connect_timeout(&to, timeout).and_then(prepare).map_err(tcp)?;
        self.with_core(|c| {
            // The application may have destroyed the QP meanwhile: then nobody wants it.
            if c.dev.conn_state(t).is_none() {
                return Err(ConnectError::Invalid("the connection was abandoned"));
            }
            c.add_stream(t, stream).map_err(tcp)?;
            c.dev.on_tcp_connected(t, mss);
            Ok(())
        })?;
        let _ = self.waker.wake();
        Ok(())
    }

    fn listen(&self, addr: SocketAddr) -> io::Result<(ConnId, SocketAddr)> {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(l);
        let local = listener.local_addr()?;
        let mut c = self.lock();
        let id = c.dev.listen();
        c.registry.register(&mut listener, Token(id), Interest::READABLE)?;
        c.listeners.insert(id, listener);
        Ok((id, local))
    }

    fn close_listener(&self, l: ConnId) {
        self.with_core(|c| {
            if let Some(mut listener) = c.listeners.remove(&l) {
                let _ = c.registry.deregister(&mut listener);
            }
            c.dev.close_listener(l);
        });
    }

    fn peer_addr(&self, t: ConnId) -> Option<SocketAddr> {
        self.lock().streams.get(&t).and_then(|s| s.peer_addr().ok())
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
    }
}
