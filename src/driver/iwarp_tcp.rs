//! The iWARP device on kernel TCP sockets (mio): the unprivileged default.
//!
//! Threading as on RoCE: posting runs to completion on the caller's thread (frame, write
//! what the socket takes), and one poll thread reads every socket, accepts, writes what
//! was left when a socket was full, and fires MPA timeouts. Socket reads happen outside
//! the device lock; everything else under it.

use super::cq::CqQueue;
use super::iwarp::IwarpPort;
use super::spin::SpinBudget;
use crate::iwarp::config::ConnectError;
use crate::iwarp::device::{ConnId, IwarpDevice};
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use rustc_hash::FxHashMap as HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WAKER: Token = Token(0);
/// Bytes read from a socket per system call.
const READ_CHUNK: usize = 256 * 1024;
/// Queued chunks one vectored write offers the socket.
const WRITE_SLICES: usize = 64;
/// Reads from one socket before the others get a turn.
const READS_PER_TURN: usize = 16;
/// The poll thread looks at the MPA timers at least this often.
const TICK: Duration = Duration::from_millis(100);
/// A spinning poll thread looks at the MPA timers this often.
const SPIN_TIMER_CHECK_NS: u64 = 1_000_000;

/// What a socket's reader holds: the read buffer, and (for a busy poller) the list of
/// streams to look at, kept to spare an allocation per look.
struct Reader {
    buf: Vec<u8>,
    streams: Vec<ConnId>,
    /// The stream the last bytes came from, which a busy-polling caller reads last.
    last_active: Option<ConnId>,
}

/// What the device lock guards.
struct Core {
    dev: IwarpDevice,
    streams: HashMap<ConnId, Arc<TcpStream>>,
    listeners: HashMap<ConnId, TcpListener>,
    cqs: HashMap<u32, Arc<CqQueue>>,
    events: Arc<super::event::EventQueue>,
    registry: Registry,
    /// The connections to write and the completions to hand out at a settle, kept for
    /// their room: a ping-pong's every turn allocated and freed both.
    writable: Vec<ConnId>,
    wc_run: Vec<crate::engine::verbs::Wc>,
}

/// The device on kernel TCP, shared by the application's handles and the poll thread.
pub struct IwarpTcp {
    core: Mutex<Core>,
    changed: super::iwarp::Changed,
    waker: Waker,
    stop: AtomicBool,
    ip: IpAddr,
    epoch: Instant,
    /// Whoever reads a socket holds this (its scratch buffer) from the read until the bytes
    /// are in the device, so that the poll thread and a busy-polling caller never
    /// interleave one stream's bytes.
    reader: Mutex<Reader>,
    /// Application threads busy-polling now: the poll thread leaves reading to them.
    busy_pollers: AtomicUsize,
    /// A busy-polling section ended: the poll thread reads every stream once, since the
    /// readiness it was told of meanwhile went unread.
    resync: AtomicBool,
    one_cpu: bool,
}

impl IwarpTcp {
    /// Starts the driver of `dev` and its poll thread.
    pub fn start(ip: IpAddr, dev: IwarpDevice) -> io::Result<(Arc<IwarpTcp>, JoinHandle<()>)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let core = Core {
            dev,
            streams: HashMap::default(),
            listeners: HashMap::default(),
            cqs: HashMap::default(),
            events: Arc::default(),
            registry: poll.registry().try_clone()?,
            writable: Vec::new(),
            wc_run: Vec::new(),
        };
        let driver = Arc::new(IwarpTcp {
            core: Mutex::new(core),
            changed: super::iwarp::Changed::default(),
            waker,
            stop: AtomicBool::new(false),
            ip,
            epoch: Instant::now(),
            reader: Mutex::new(Reader { buf: vec![0u8; READ_CHUNK], streams: Vec::new(), last_active: None }),
            busy_pollers: AtomicUsize::new(0),
            resync: AtomicBool::new(false),
            one_cpu: std::thread::available_parallelism().map_or(true, |n| n.get() == 1),
        });
        let d = driver.clone();
        let thread = std::thread::Builder::new().name("softrdma-iwarp".into()).spawn(move || d.poll_loop(poll))?;
        Ok((driver, thread))
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        let mut core = self.lock_untimed();
        core.dev.set_now(self.epoch.elapsed().as_nanos() as u64);
        core
    }

    /// The core without a clock reading, for a look at its tables that runs no device
    /// work: a busy-polling caller's every look takes it twice, and the clock was half
    /// of what such a look spent outside the kernel.
    fn lock_untimed(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
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

    /// The poll thread: waits for readiness, the waker or the next MPA deadline; reads,
    /// accepts and writes; then busy-polls for a while after traffic ([`SpinBudget`]).
    /// While an application thread busy-polls, it leaves reading to that thread.
    fn poll_loop(self: Arc<Self>, mut poll: Poll) {
        super::spin::ask_short_slice();
        let mut events = Events::with_capacity(256);
        let mut again: Vec<Token> = Vec::new();
        let mut spin = SpinBudget::default();
        let mut quiet_since = self.now_ns();
        let mut looks = 0u32;
        let mut timers_at = 0;
        while !self.stop.load(Ordering::Acquire) {
            let spinning = spin.budget_ns > 0 && self.now_ns().saturating_sub(quiet_since) < spin.budget_ns;
            let timeout = if !again.is_empty() || spinning { Duration::ZERO } else { self.sleep_for() };
            let slept_at = self.now_ns();
            if let Err(e) = poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            if self.resync.swap(false, Ordering::AcqRel) {
                again.extend(self.lock().streams.keys().map(|&t| Token(t)));
            }
            let moved = self.serve(&events, &mut again);
            let now = self.now_ns();
            // MPA deadlines are coarse: a spinning thread need not take the lock for them
            // at every look.
            if !spinning || now >= timers_at {
                self.with_core(|c| c.dev.handle_timeout());
                timers_at = now + SPIN_TIMER_CHECK_NS;
            }
            // On one CPU a spinning poll thread can only hold up the thread with work.
            if moved && !self.one_cpu {
                if !spinning {
                    spin.woken_after(now.saturating_sub(slept_at));
                } else {
                    spin.hit();
                }
                quiet_since = now;
            } else if spinning && now.saturating_sub(quiet_since) >= spin.budget_ns {
                spin.miss();
            }
            if spinning {
                looks = looks.wrapping_add(1);
                if looks.is_multiple_of(16) {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// How long the poll thread may sleep: until the next MPA deadline, at most [`TICK`].
    fn sleep_for(&self) -> Duration {
        let core = self.lock();
        let now = self.now_ns();
        core.dev.poll_timeout().map_or(TICK, |d| Duration::from_nanos(d.saturating_sub(now)).min(TICK))
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Handles one round of readiness (and the streams left with more to read); true if
    /// any bytes moved in. Streams are not read while a caller busy-polls.
    fn serve(&self, events: &Events, again: &mut Vec<Token>) -> bool {
        let mut ready: Vec<(Token, bool, bool)> = std::mem::take(again).into_iter().map(|t| (t, true, false)).collect();
        ready.extend(
            events
                .iter()
                .filter(|e| e.token() != WAKER)
                .map(|e| (e.token(), e.is_readable() || e.is_read_closed() || e.is_error(), e.is_writable())),
        );
        let busy = self.busy_pollers.load(Ordering::Acquire) > 0;
        let mut moved = false;
        for (t, readable, writable) in ready {
            if writable {
                self.with_core(|c| c.write(t.0));
            }
            // A busy poller reads the streams; listeners are still the poll thread's.
            if readable && (!busy || self.lock().listeners.contains_key(&t.0)) {
                let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
                let (more, got) = self.read_some(t.0, &mut reader.buf, false);
                moved |= got > 0;
                if more {
                    again.push(t);
                }
            }
        }
        moved
    }

    /// Reads connection or listener `t` until it would block (or for a turn, or, with
    /// `stop_at_short`, until a read fills less than `buf`); returns whether there may be
    /// more, and the bytes read. The caller holds `reader`.
    fn read_some(&self, t: ConnId, buf: &mut [u8], stop_at_short: bool) -> (bool, usize) {
        let stream = {
            let c = self.lock_untimed();
            if c.listeners.contains_key(&t) {
                drop(c);
                self.with_core(|c| c.accept_all(t));
                return (false, 0);
            }
            match c.streams.get(&t) {
                Some(s) => s.clone(),
                None => return (false, 0),
            }
        };
        let mut got = 0;
        for _ in 0..READS_PER_TURN {
            match (&*stream).read(buf) {
                Ok(0) => {
                    self.with_core(|c| c.dev.on_tcp_closed(t, "the peer closed the connection"));
                    return (false, got);
                }
                Ok(n) => {
                    got += n;
                    self.with_core(|c| c.dev.on_bytes(t, &buf[..n]));
                    // A read short of the buffer found the stream drained: a busy-polling
                    // caller looks again soon, and reading on until it would block put a
                    // system call that finds nothing between a ping-pong's message and its
                    // answer. The poll thread reads on: its readiness is edge-triggered.
                    if stop_at_short && n < buf.len() {
                        return (true, got);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (false, got),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.with_core(|c| c.dev.on_tcp_closed(t, &e.to_string()));
                    return (false, got);
                }
            }
        }
        (true, got)
    }

    /// Reads every stream on the caller's thread without waiting, if no other thread is
    /// reading; returns the bytes read (a busy-polling caller's [`IwarpPort::progress`]).
    /// The stream that last had bytes is read last: a ping-pong's next message comes on
    /// it, and reading the others after it put their empty reads (a system call each)
    /// between the message and the answer (perftest's `-R` keeps its exchange's
    /// connection open beside the test's).
    fn read_all(&self) -> usize {
        let Ok(mut reader) = self.reader.try_lock() else { return 0 };
        let Reader { buf, streams, last_active } = &mut *reader;
        streams.clear();
        streams.extend(self.lock_untimed().streams.keys());
        hot_last(streams, *last_active);
        let mut total = 0;
        for &t in streams.iter() {
            let got = self.read_some(t, buf, true).1;
            if got > 0 {
                *last_active = Some(t);
            }
            total += got;
        }
        total
    }
}

/// Moves stream `hot`, if it is among `streams`, to the end; the others keep their order.
fn hot_last(streams: &mut Vec<ConnId>, hot: Option<ConnId>) {
    if let Some(i) = hot.and_then(|h| streams.iter().position(|&t| t == h)) {
        let t = streams.remove(i);
        streams.push(t);
    }
}

/// A TCP connection to `to` from the device's address `ip` (as rdma_cm binds an id to its
/// source address): the peer sees the address the device has, not whichever the route
/// picks (127.0.0.1 for any loopback address).
fn connect_from(ip: IpAddr, to: SocketAddr, timeout: Duration) -> io::Result<std::net::TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(to), socket2::Type::STREAM, None)?;
    if !ip.is_unspecified() && ip.is_ipv4() == to.is_ipv4() {
        socket.bind(&SocketAddr::new(ip, 0).into())?;
    }
    socket.connect_timeout(&to.into(), timeout)?;
    Ok(socket.into())
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
        let mut writable = std::mem::take(&mut self.writable);
        for _ in 0..4 {
            self.dev.take_writable_into(&mut writable);
            let closed = self.dev.take_closed();
            if writable.is_empty() && closed.is_empty() {
                break;
            }
            for &t in &writable {
                self.write(t);
            }
            for t in closed {
                self.drop_stream(t);
            }
        }
        self.writable = writable;
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

    /// Writes what connection `t` has queued until the socket would block.
    fn write(&mut self, t: ConnId) {
        let Some(stream) = self.streams.get(&t).cloned() else { return };
        let mut iovs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; WRITE_SLICES];
        loop {
            let n = self.dev.tx_pending_iovecs(t, &mut iovs);
            if n == 0 {
                return;
            }
            match writev(&stream, &iovs[..n]) {
                Ok(n) => self.dev.on_written(t, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.dev.on_tcp_closed(t, &e.to_string()),
            }
        }
    }

    /// Watches every stream for `interest`.
    fn watch_streams(&mut self, interest: Interest) {
        for (&t, s) in &self.streams {
            let _ = self.registry.reregister(&mut SourceFd(&s.as_raw_fd()), Token(t), interest);
        }
    }

    fn drop_stream(&mut self, t: ConnId) {
        let Some(mut stream) = self.streams.remove(&t) else { return };
        if let Some(s) = Arc::get_mut(&mut stream) {
            let _ = self.registry.deregister(s);
        }
        match Arc::try_unwrap(stream) {
            Ok(s) => linger(s),
            // A busy poller still holds it: it reads no more once it is shut.
            Err(shared) => {
                let _ = shared.shutdown(Shutdown::Both);
            }
        }
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

    fn open_stream(&self, t: ConnId, to: SocketAddr, timeout: Duration) -> Result<(), ConnectError> {
        let tcp = |e: io::Error| match e.kind() {
            io::ErrorKind::ConnectionRefused => ConnectError::Refused(e.to_string()),
            _ => ConnectError::Tcp(e.to_string()),
        };
        let (stream, mss) = connect_from(self.ip, to, timeout).and_then(prepare).map_err(tcp)?;
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

    fn progress(&self) -> usize {
        self.read_all()
    }

    fn wait_input(&self, timeout: Duration) -> bool {
        let fds: Vec<std::os::fd::RawFd> = self.lock().streams.values().map(|s| s.as_raw_fd()).collect();
        super::spin::wait_readable(&fds, timeout)
    }

    fn busy_enter(&self) {
        if self.busy_pollers.fetch_add(1, Ordering::AcqRel) == 0 {
            // The caller reads: the poll thread is not woken for every segment meanwhile.
            self.lock().watch_streams(Interest::WRITABLE);
        }
    }

    fn busy_leave(&self) {
        if self.busy_pollers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.lock().watch_streams(Interest::READABLE | Interest::WRITABLE);
            self.resync.store(true, Ordering::Release);
            let _ = self.waker.wake();
        }
    }
}

/// Connections closing gracefully at once; past this a close resets (a peer cannot make
/// the device hold more sockets, or threads, than this by connecting and leaving).
pub const LINGERING_MAX: usize = 64;
/// How long a closing connection's last bytes may take to leave, its peer's dropped.
pub const LINGER: Duration = Duration::from_secs(2);
static LINGERING: AtomicUsize = AtomicUsize::new(0);
/// Lingering connections whose data the peer has not all acknowledged yet: what a process
/// exiting must wait for.
static UNACKED: AtomicUsize = AtomicUsize::new(0);
/// How often a lingering connection looks whether its data is all acknowledged.
const LINGER_LOOK: Duration = Duration::from_millis(2);

/// One vectored send of `iovs` on `stream`, without blocking and without SIGPIPE (a C
/// application that loads the library may not ignore it): the octets the kernel took.
#[allow(unsafe_code)]
fn writev(stream: &TcpStream, iovs: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iovs.as_ptr().cast_mut();
    msg.msg_iovlen = iovs.len().min(libc::UIO_MAXIOV as usize) as _;
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    // SAFETY: each iovec names bytes the device keeps valid while its lock is held (framed
    // bytes it owns, or registered memory not revoked: revoking takes the same lock), and
    // the kernel only reads them.
    let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &raw const msg, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Closes `s` as TCP's orderly release: what the socket holds still goes, then a FIN, while
/// what the peer sends meanwhile (its last credits, its own close) is read and dropped.
/// Closing with unread bytes would make the kernel reset the connection and throw away
/// the data not yet sent, which a peer that completes its sends when they are in its
/// socket (as siw does, and this device) counts as delivered.
fn linger(s: TcpStream) {
    if LINGERING.fetch_add(1, Ordering::AcqRel) >= LINGERING_MAX {
        LINGERING.fetch_sub(1, Ordering::AcqRel);
        let _ = s.shutdown(Shutdown::Both);
        return;
    }
    let _ = s.shutdown(Shutdown::Write);
    UNACKED.fetch_add(1, Ordering::AcqRel);
    let spawned = std::thread::Builder::new().name("softrdma-linger".into()).spawn(move || {
        let fd: std::os::fd::OwnedFd = s.into();
        drain_until_closed(&std::net::TcpStream::from(fd));
        LINGERING.fetch_sub(1, Ordering::AcqRel);
    });
    if spawned.is_err() {
        UNACKED.fetch_sub(1, Ordering::AcqRel);
        LINGERING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads and drops what the peer sends until it closes or [`LINGER`] passes; counts the
/// connection out of [`UNACKED`] once the peer has acknowledged all of its data.
fn drain_until_closed(s: &std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(LINGER_LOOK));
    let deadline = Instant::now() + LINGER;
    let mut acked = false;
    let mut buf = [0u8; 16 * 1024];
    while Instant::now() < deadline {
        if !acked && crate::transport::sys::tcp_unacked(s.as_raw_fd()).map_or(true, |n| n == 0) {
            acked = true;
            UNACKED.fetch_sub(1, Ordering::AcqRel);
        }
        match (&*s).read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
    }
    if !acked {
        UNACKED.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits, at most `limit`, until the peers of the connections closing now have
/// acknowledged all their data: what `rdma_destroy_id` does before it returns (as close(2)
/// with SO_LINGER), so that a process that exits right after (rstream does) does not close
/// its sockets with the peer's last bytes unread, which resets them and loses what they
/// still held. Waiting in the caller's call and not at exit: at exit the application's
/// other threads still run, and one that reads a channel it destroyed meets freed memory.
pub fn wait_closes_acknowledged(limit: Duration) {
    let deadline = Instant::now() + limit;
    while UNACKED.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A connected pair of mio streams on loopback: (ours, the peer's as std).
    fn pair(listener: &std::net::TcpListener) -> (TcpStream, std::net::TcpStream) {
        let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        (TcpStream::from_std(ours), theirs)
    }

    #[test]
    fn a_closed_connection_still_delivers_what_its_socket_held_while_the_peer_keeps_talking() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (ours, mut theirs) = pair(&listener);
        // The peer's bytes sit unread in our socket: a plain close would reset.
        theirs.write_all(&[7u8; 10_000]).unwrap();
        let sent: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut at = 0;
        while at < sent.len() {
            match (&ours).write(&sent[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
        linger(ours);
        let _ = theirs.write_all(&[8u8; 1000]);
        let mut got = Vec::new();
        theirs.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        theirs.read_to_end(&mut got).expect("an orderly end, not a reset");
        assert!(got == sent, "{} bytes of {}", got.len(), sent.len());
    }

    #[test]
    fn the_stream_that_last_had_bytes_is_read_last() {
        let mut streams = vec![3, 7, 5];
        hot_last(&mut streams, Some(7));
        assert_eq!(streams, [3, 5, 7], "the others keep their order");
        hot_last(&mut streams, Some(9));
        assert_eq!(streams, [3, 5, 7], "a stream since closed changes nothing");
        hot_last(&mut streams, None);
        assert_eq!(streams, [3, 5, 7]);
    }

    #[test]
    fn closes_past_the_limit_do_not_linger() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peers = Vec::new();
        for _ in 0..LINGERING_MAX + 8 {
            let (ours, theirs) = pair(&listener);
            linger(ours);
            peers.push(theirs);
        }
        // The peers have not closed: every lingering close still waits for them.
        assert_eq!(LINGERING.load(Ordering::Acquire), LINGERING_MAX, "the limit, and not past it");
        // Every peer sees its connection end: by a FIN (lingering) or at once (past it).
        for mut p in peers {
            p.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 8];
            let end = p.read(&mut b);
            assert!(matches!(end, Ok(0)) || end.is_err(), "{end:?}");
        }
    }
}
