//! What an iWARP device needs from a TCP stack, as one small trait, and the verbs built on
//! it once for every stack: kernel TCP sockets ([`super::iwarp_tcp`]) or a userspace TCP
//! over raw Ethernet ([`super::iwarp_smol`]).

use super::cq::CqQueue;
use crate::iwarp::config::{ConnParam, ConnectError};
use crate::iwarp::device::{ConnId, IwarpDevice};
use crate::iwarp::setup::PeerRequest;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, MutexGuard};
use std::time::{Duration, Instant};

/// A TCP stack running an [`IwarpDevice`]: it owns the device lock, the streams and a poll
/// thread, feeds the device's events in and moves its bytes out.
pub trait IwarpPort: Send + Sync {
    /// The device's address.
    fn ip(&self) -> IpAddr;
    /// Runs `f` on the device under its lock, then writes what it queued, closes what it
    /// ended, hands out completions and wakes waiters.
    fn run(&self, f: &mut dyn FnMut(&mut IwarpDevice));
    /// Waits (at most `timeout`) until `done` holds, checking it under the lock after every
    /// change; true if it held.
    fn wait(&self, done: &mut dyn FnMut(&mut IwarpDevice) -> bool, timeout: Duration) -> bool;
    /// The device's asynchronous events.
    fn events(&self) -> Arc<super::event::EventQueue>;
    /// Completions for CQ `id` go to `queue`.
    fn add_cq(&self, id: u32, queue: Arc<CqQueue>);
    /// Makes the TCP connection of connection `t` to `to` and reports it to the device
    /// (`on_tcp_connected`), now or later from the poll thread.
    fn open_stream(&self, t: ConnId, to: SocketAddr, timeout: Duration) -> Result<(), ConnectError>;
    /// Listens on `addr`; returns the listener's id and address.
    fn listen(&self, addr: SocketAddr) -> io::Result<(ConnId, SocketAddr)>;
    /// Stops listening (the device rejects what nobody took).
    fn close_listener(&self, l: ConnId);
    /// The peer's address on connection `t`.
    fn peer_addr(&self, t: ConnId) -> Option<SocketAddr>;
    /// Stops the poll thread.
    fn stop(&self);
    /// Reads what has arrived on the caller's thread, without waiting; the bytes read
    /// (a busy-polling caller's look). A stack without it leaves reading to its thread.
    fn progress(&self) -> usize {
        0
    }
    /// Blocks the caller until a stream may have bytes to read or `timeout` passes (a
    /// busy-polling caller that found nothing). A stack without it yields the CPU once.
    fn wait_input(&self, _timeout: std::time::Duration) -> bool {
        std::thread::yield_now();
        false
    }
    /// A caller starts busy-polling: the poll thread leaves reading to it.
    fn busy_enter(&self) {}
    /// The caller stopped busy-polling.
    fn busy_leave(&self) {}
}

/// Runs `f` on `port`'s device and returns what it returns.
pub fn with<T>(port: &dyn IwarpPort, f: impl FnOnce(&mut IwarpDevice) -> T) -> T {
    let mut f = Some(f);
    let mut out = None;
    port.run(&mut |d| {
        if let Some(f) = f.take() {
            out = Some(f(d));
        }
    });
    out.expect("IwarpPort::run calls its closure once")
}

/// Active side (`rdma_connect`): TCP, then the MPA Request with `param` and the Reply,
/// waiting at most `timeout`. Returns the peer's private data; the QP is in RTS.
pub fn connect(
    port: &dyn IwarpPort,
    qpn: u32,
    to: SocketAddr,
    param: &ConnParam,
    timeout: Duration,
    request_sent: &mut dyn FnMut(),
) -> Result<Vec<u8>, ConnectError> {
    let deadline = Instant::now() + timeout;
    let t = with(port, |d| d.connect(qpn, param))?;
    if let Err(e) = port.open_stream(t, to, timeout) {
        with(port, |d| d.abandon(t));
        return Err(e);
    }
    // The stream is up and the MPA Request written (or queued behind a full socket).
    request_sent();
    let mut result = None;
    let left = deadline.saturating_duration_since(Instant::now());
    port.wait(
        &mut |d| {
            result = d.take_result(t);
            if result.is_none() && d.conn_state(t).is_none() {
                result = Some(Err(ConnectError::Tcp("the connection closed during MPA setup".into())));
            }
            result.is_some()
        },
        left,
    );
    result.unwrap_or_else(|| {
        with(port, |d| d.abandon(t));
        Err(ConnectError::Timeout)
    })
}

/// The next MPA Request on listener `l` (`RDMA_CM_EVENT_CONNECT_REQUEST`), waiting at
/// most `timeout`.
pub fn get_request(
    port: &dyn IwarpPort,
    l: ConnId,
    timeout: Duration,
) -> Option<(ConnId, PeerRequest, Option<SocketAddr>)> {
    let mut got = None;
    let mut gone = false;
    port.wait(
        &mut |d| {
            got = d.take_request(l);
            gone = !d.has_listener(l);
            got.is_some() || gone
        },
        timeout,
    );
    let (r, req) = got?;
    Some((r, req, port.peer_addr(r)))
}

/// A condition variable that wakes only when someone waits: `Condvar::notify_all` is a
/// system call even with nobody to wake, and a driver signals after every piece of work.
#[derive(Default)]
pub(super) struct Changed {
    cv: Condvar,
    waiters: AtomicUsize,
}

impl Changed {
    /// Wakes the waiters, if any. Call it after releasing the lock the waiters wait with.
    pub(super) fn notify(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.cv.notify_all();
        }
    }
}

/// A driver's `IwarpPort::wait`: checks `done` on the device in `guard`'s core after every
/// change signalled on `changed` (and at least every `tick`), until it holds or `timeout`.
pub(super) fn wait_until<C>(
    guard: MutexGuard<'_, C>,
    changed: &Changed,
    dev: impl Fn(&mut C) -> &mut IwarpDevice,
    done: &mut dyn FnMut(&mut IwarpDevice) -> bool,
    timeout: Duration,
    tick: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    // Counted under the lock before the first look, so a change made after it is signalled.
    changed.waiters.fetch_add(1, Ordering::AcqRel);
    let mut guard = guard;
    let held = loop {
        if done(dev(&mut guard)) {
            break true;
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else { break false };
        guard = changed.cv.wait_timeout(guard, left.min(tick)).unwrap_or_else(|e| e.into_inner()).0;
    };
    changed.waiters.fetch_sub(1, Ordering::AcqRel);
    held
}
