//! The RoCEv2 driver: one [`Device`] on one transport, a poll thread, and posting that
//! runs to completion on the caller's thread (ARCHITECTURE.md, "The driver").

use super::cq::CqQueue;
use super::spin::SpinBudget;
use crate::engine::mcast::GroupChange;
use crate::engine::verbs::{Gid, VerbsError};
use crate::engine::Device;
use crate::transport::pcap::FrameLog;
use crate::transport::{wait_readable, LinkStats, PacketRx, PacketTx, Waker};
use rustc_hash::FxHashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the device lock guards: the engine and the sending half of the transport.
pub struct Core {
    /// The engine.
    pub dev: Device,
    /// The sending half of the transport.
    pub tx: Box<dyn PacketTx>,
    completions_seen: u64,
    /// Buffers handing out completions reuses: the CQs touched, and their completions.
    touched_cqs: Vec<u32>,
    wcs: Vec<crate::engine::verbs::Wc>,
}

/// A running RoCEv2 device, shared by the application's handles and the poll thread.
pub struct RoceDriver {
    core: Mutex<Core>,
    cqs: RwLock<FxHashMap<u32, Arc<CqQueue>>>,
    /// Asynchronous events for the application.
    pub events: super::event::EventQueue,
    waker: Waker,
    /// The deadline the poll thread sleeps towards (ns since `epoch`; `u64::MAX`: none).
    armed_ns: AtomicU64,
    stop: AtomicBool,
    epoch: Instant,
    /// The transport's counters.
    pub link_stats: Arc<LinkStats>,
    log: Option<Arc<FrameLog>>,
    /// The device's address.
    pub ip: IpAddr,
    /// The UDP port it receives on.
    pub port: u16,
    /// The path MTU the CM offers: the link's, at most 4096.
    pub path_mtu: crate::engine::verbs::Mtu,
    /// The receiving half of the transport: the poll thread's, or a busy-polling caller's.
    rx: Mutex<Box<dyn PacketRx>>,
    /// The receiving half's descriptor, for callers waiting for input without the lock.
    rx_fd: std::os::fd::RawFd,
    /// Application threads busy-polling now.
    busy_pollers: AtomicUsize,
    /// A busy-polling caller left replies in the engine for its next call to send.
    replies_held: AtomicBool,
    /// The process may run on one CPU only: the poll thread does not spin.
    one_cpu: bool,
    /// When the socket was last read (ns since `epoch`).
    last_rx_ns: AtomicU64,
    /// Until when (ns since `epoch`) an application thread is taken to be polling its CQ
    /// and receiving on its own thread ([`RoceDriver::app_polling`]).
    app_poll_until_ns: AtomicU64,
    /// When an application thread's last poll ended (ns since `epoch`).
    app_last_poll_ns: AtomicU64,
    /// Times the poll thread woke from its sleep.
    pub poll_thread_wakeups: AtomicU64,
    /// Packets the poll thread received (the rest came in on application threads).
    pub poll_thread_packets: AtomicU64,
}

/// A transport, opened: both halves, their counters and the capture they write.
pub struct Link {
    /// Sending half.
    pub tx: Box<dyn PacketTx>,
    /// Receiving half.
    pub rx: Box<dyn PacketRx>,
    /// Counters both halves keep.
    pub stats: Arc<LinkStats>,
    /// The capture, closed when the device is.
    pub log: Option<Arc<FrameLog>>,
}

impl RoceDriver {
    /// Starts the driver of `dev` on `link` and its poll thread.
    pub fn start(
        dev: Device,
        link: Link,
        ip: IpAddr,
        path_mtu: crate::engine::verbs::Mtu,
    ) -> io::Result<(Arc<RoceDriver>, JoinHandle<()>)> {
        crate::transport::icrc_routine::choose_once();
        let driver = Arc::new(RoceDriver {
            port: link.tx.port(),
            path_mtu,
            core: Mutex::new(Core { dev, tx: link.tx, completions_seen: 0, touched_cqs: Vec::new(), wcs: Vec::new() }),
            cqs: RwLock::new(FxHashMap::default()),
            events: super::event::EventQueue::default(),
            waker: Waker::new()?,
            armed_ns: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
            link_stats: link.stats,
            log: link.log,
            ip,
            rx_fd: link.rx.fd(),
            rx: Mutex::new(link.rx),
            busy_pollers: AtomicUsize::new(0),
            replies_held: AtomicBool::new(false),
            one_cpu: std::thread::available_parallelism().map_or(true, |n| n.get() == 1),
            last_rx_ns: AtomicU64::new(0),
            app_poll_until_ns: AtomicU64::new(0),
            app_last_poll_ns: AtomicU64::new(0),
            poll_thread_wakeups: AtomicU64::new(0),
            poll_thread_packets: AtomicU64::new(0),
        });
        let d = driver.clone();
        let thread = std::thread::Builder::new().name("softrdma-poll".into()).spawn(move || d.poll_loop())?;
        Ok((driver, thread))
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The device lock.
    pub fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock is a bug in the engine; the state is still the
        // engine's own, so carry on rather than poison every later call.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the CM requests for `port` among the devices sharing the address (fails if
    /// another one listens there).
    pub fn claim_service(&self, port: u16) -> io::Result<()> {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).claim_service(port)
    }

    /// Gives up `port`'s CM requests.
    pub fn release_service(&self, port: u16) {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).release_service(port)
    }

    /// Attaches UD QP `qpn` to multicast group `mgid`, the transport joining the group
    /// with its first member here (IBTA 10.5).
    pub fn attach_mcast(&self, qpn: u32, mgid: Gid) -> Result<(), VerbsError> {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let change = self.lock().dev.attach_mcast(qpn, mgid)?;
        if change == GroupChange::First {
            if let Err(e) = rx.join(&mgid) {
                let _ = self.lock().dev.detach_mcast(qpn, mgid);
                return Err(match e.kind() {
                    io::ErrorKind::Unsupported => VerbsError::Unsupported,
                    _ => VerbsError::OutOfResources,
                });
            }
        }
        Ok(())
    }

    /// Detaches QP `qpn` from `mgid`, the transport leaving the group after its last member.
    pub fn detach_mcast(&self, qpn: u32, mgid: Gid) -> Result<(), VerbsError> {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        if self.lock().dev.detach_mcast(qpn, mgid)? == GroupChange::Last {
            rx.leave(&mgid);
        }
        Ok(())
    }

    /// Leaves the groups destroyed QPs left with no member.
    pub fn leave_emptied_groups(&self) {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        for g in self.lock().dev.take_emptied_groups() {
            rx.leave(&g);
        }
    }

    /// Drops the completions of QP `qpn` that no one polled yet (its reset).
    pub fn remove_completions_of(&self, qpn: u32) {
        for q in self.cqs.read().unwrap_or_else(|e| e.into_inner()).values() {
            q.remove_qp(qpn);
        }
    }

    /// A CQ's queue, so that completions for CQ `id` reach it.
    pub fn add_cq(&self, id: u32, queue: Arc<CqQueue>) {
        self.cqs.write().unwrap_or_else(|e| e.into_inner()).insert(id, queue);
    }

    /// After any engine work: send what it produced, hand out completions, and wake the
    /// poll thread if the next deadline moved earlier.
    fn settle(&self, core: &mut Core, now_ns: u64) {
        let Core { dev, tx, .. } = core;
        tx.flush(dev, now_ns);
        self.replies_held.store(false, Ordering::Release);
        self.hand_out(core);
    }

    /// Completions to their CQ queues; the poll thread woken if the deadline moved earlier.
    fn hand_out(&self, core: &mut Core) {
        if core.dev.stats.completions != core.completions_seen {
            core.completions_seen = core.dev.stats.completions;
            let cqs = self.cqs.read().unwrap_or_else(|e| e.into_inner());
            core.dev.take_touched_cqs_into(&mut core.touched_cqs);
            for &id in &core.touched_cqs {
                let Some(q) = cqs.get(&id) else { continue };
                core.dev.poll_cq_into(id, usize::MAX, &mut core.wcs);
                if core.dev.cq_overflowed(id) {
                    q.set_overrun();
                }
                q.deliver(&mut core.wcs);
            }
        }
        while let Some(e) = core.dev.poll_async_event() {
            self.events.deliver(e);
        }
        self.events.qps_errored(core.dev.take_errored_qps());
        let deadline = core.dev.poll_timeout().unwrap_or(u64::MAX);
        if deadline < self.armed_ns.fetch_min(deadline, Ordering::AcqRel) {
            self.waker.wake();
        }
    }

    /// Runs `f` on the engine under the device lock, then sends what it produced and hands
    /// out completions (posting runs to completion on the caller's thread).
    pub fn with_core<T>(&self, f: impl FnOnce(&mut Device) -> T) -> T {
        let mut core = self.lock();
        let out = f(&mut core.dev);
        let now = self.now_ns();
        self.read_if_stale(&mut core, now);
        self.settle(&mut core, now);
        out
    }

    /// A thread posting in a loop can hold the device lock nearly all the time, and the
    /// poll thread then waits for it while ACKs queue in the socket (a thousand QPs' first
    /// posts kept it out for 120 ms, past their retransmit timers): when nobody has read
    /// the socket for [`RX_STALE_NS`], the posting thread reads what is there.
    fn read_if_stale(&self, core: &mut Core, now_ns: u64) {
        // A stopped device hears nothing: a call after the stop (an MR deregistered as its
        // context goes) must not answer what queued since, with that MR already gone.
        let stale = now_ns.saturating_sub(self.last_rx_ns.load(Ordering::Relaxed)) >= RX_STALE_NS;
        if !stale || self.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut rx) = self.rx.try_lock() else { return };
        self.last_rx_ns.store(now_ns, Ordering::Relaxed);
        drain(&mut **rx, &mut core.dev, now_ns);
    }

    /// As [`RoceDriver::with_core`] for calls that send nothing themselves (posting a
    /// receive): replies a busy-polling caller holds stay held for its next send or look,
    /// so an ACK and the request that follows leave together.
    pub fn with_core_holding<T>(&self, f: impl FnOnce(&mut Device) -> T) -> T {
        let mut core = self.lock();
        let out = f(&mut core.dev);
        if self.replies_held.load(Ordering::Acquire) {
            self.hand_out(&mut core);
        } else {
            let now = self.now_ns();
            self.settle(&mut core, now);
        }
        out
    }

    /// As [`RoceDriver::with_core`], with the device's clock (ns) for calls that take it.
    pub fn with_core_at<T>(&self, f: impl FnOnce(&mut Device, u64) -> T) -> T {
        let mut core = self.lock();
        let now = self.now_ns();
        let out = f(&mut core.dev, now);
        self.settle(&mut core, now);
        out
    }

    /// The poll thread: sleeps until a packet, a wake-up or the engine's next deadline,
    /// then busy-polls for a while after traffic ([`SpinBudget`]). While an application
    /// thread busy-polls, it leaves the socket to that thread and keeps only the timers.
    fn poll_loop(self: Arc<Self>) {
        super::spin::ask_short_slice();
        let rx_fd = self.rx.lock().unwrap_or_else(|e| e.into_inner()).fd();
        let waker_fd = self.waker.as_raw_fd();
        let mut spin = SpinBudget::default();
        while !self.stop.load(Ordering::Acquire) {
            let armed = self.armed_ns.load(Ordering::Acquire);
            let app_until = self.app_poll_until_ns.load(Ordering::Acquire);
            let now = self.now_ns();
            let app_busy = now < app_until;
            let wake_at = if app_busy { armed.min(app_until) } else { armed };
            let timeout = (wake_at != u64::MAX).then(|| Duration::from_nanos(wake_at.saturating_sub(now)));
            let busy = app_busy || self.busy_pollers.load(Ordering::Acquire) > 0;
            let fds: &[std::os::fd::RawFd] = if busy { &[waker_fd] } else { &[rx_fd, waker_fd] };
            let slept_at = self.now_ns();
            if wait_readable(fds, timeout).is_err() {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.waker.clear();
            self.poll_thread_wakeups.fetch_add(1, Ordering::Relaxed);
            let mut handled = 0;
            while let n @ 1.. = self.progress(Poller::PollThread) {
                handled += n;
            }
            // On one CPU a spinning poll thread can only hold up the thread with work.
            if handled > 0 && !self.one_cpu {
                spin.woken_after(self.now_ns().saturating_sub(slept_at));
                self.spin(&mut spin);
            }
        }
    }

    /// Busy-polls the socket for up to the spin budget, starting over after each packet, so
    /// that a peer's next request (a ping-pong's, a READ's) is answered with no wake-up.
    /// It yields the CPU every 16 looks; on a one-CPU machine it does not run at all.
    fn spin(&self, spin: &mut SpinBudget) {
        let mut since = self.now_ns();
        let mut looks = 0u32;
        while spin.budget_ns > 0 && !self.stop.load(Ordering::Acquire) {
            if self.busy_pollers.load(Ordering::Acquire) > 0
                || self.now_ns() < self.app_poll_until_ns.load(Ordering::Acquire)
            {
                return;
            }
            if self.progress(Poller::PollThread) > 0 {
                spin.hit();
                since = self.now_ns();
            } else if self.now_ns().saturating_sub(since) > spin.budget_ns {
                spin.miss();
                return;
            }
            looks = looks.wrapping_add(1);
            if looks.is_multiple_of(16) {
                std::thread::yield_now();
            }
        }
    }

    /// Receives one batch (if the socket is free), fires due timers and settles; returns
    /// the number of packets handled. For a busy-polling caller ([`Poller::BusyPolling`]),
    /// the replies to what arrived (ACKs) wait for the caller's next post or look, so
    /// that they leave with the caller's own request in one batch.
    pub fn progress(&self, who: Poller) -> usize {
        match self.rx.try_lock() {
            Ok(rx) => self.progress_on(rx, who),
            Err(_) if who == Poller::PollThread => self.tend_timers(),
            Err(_) => 0,
        }
    }

    /// The poll thread, finding the socket taken (a caller busy-polls): fires the timers
    /// if one is due (waiting for the socket, so an ACK in it is read first), else sleeps
    /// again towards the engine's deadline. Leaving the sleep's deadline as it was made a
    /// deadline already past (one that moved later meanwhile) wake the thread at once,
    /// again and again, on a CPU the busy-polling threads wanted: one wake-up every 5 µs
    /// of a WRITE ping-pong.
    fn tend_timers(&self) -> usize {
        let core = self.lock();
        let now = self.now_ns();
        match core.dev.poll_timeout() {
            Some(t) if t <= now => {
                drop(core);
                let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
                self.progress_on(rx, Poller::PollThread)
            }
            deadline => {
                self.armed_ns.store(deadline.unwrap_or(u64::MAX), Ordering::Release);
                0
            }
        }
    }

    fn progress_on(&self, mut rx: std::sync::MutexGuard<'_, Box<dyn PacketRx>>, who: Poller) -> usize {
        let mut n = rx.recv().unwrap_or(0);
        // A look that found a stream rather than a ping-pong's packet or two sends its
        // ACKs now: a receiver that posts no requests would otherwise hold them until a
        // look finds the socket empty, and its sender waits for them.
        let hold_replies = who == Poller::BusyPolling && n <= HOLD_REPLIES_MAX_PACKETS;
        let now = self.now_ns();
        self.last_rx_ns.store(now, Ordering::Relaxed);
        let held = self.replies_held.load(Ordering::Acquire);
        if n == 0 && !held && now < self.armed_ns.load(Ordering::Acquire) {
            return 0;
        }
        let mut core = self.lock();
        if n > 0 {
            rx.deliver(&mut core.dev, now);
        }
        if core.dev.poll_timeout().is_some_and(|t| t <= now) {
            // An acknowledgement already in the socket is not a loss: read what is queued
            // before any timer fires (a thread that held the lock for a while, posting,
            // leaves hundreds of ACKs behind it).
            n += drain(&mut **rx, &mut core.dev, now);
            core.dev.handle_timeout(now);
        }
        drop(rx);
        if who == Poller::PollThread {
            self.poll_thread_packets.fetch_add(n as u64, Ordering::Relaxed);
            // The poll thread re-arms from scratch; another caller leaves its sleep alone
            // (settle only ever moves it earlier), or every look would wake it.
            self.armed_ns.store(u64::MAX, Ordering::Release);
        }
        if n > 0 && hold_replies {
            self.replies_held.store(true, Ordering::Release);
            self.hand_out(&mut core);
        } else {
            self.settle(&mut core, now);
        }
        n
    }

    /// Blocks the caller until a packet may be waiting or `timeout` passes: a busy-polling
    /// caller that found nothing waits here rather than spinning.
    pub fn wait_input(&self, timeout: std::time::Duration) -> bool {
        super::spin::wait_readable(&[self.rx_fd], timeout)
    }

    /// An application thread polled its CQ and received on its own thread. One that polls
    /// in a tight loop (a C application spinning on `ibv_poll_cq`: two polls within
    /// [`APP_POLL_GAP_NS`]) has the socket for [`APP_POLL_WINDOW_NS`]: the poll thread
    /// keeps only the timers, instead of waking for every packet on a CPU the spinning
    /// thread wants. One that polls now and then (perftest's latency tests poll once per
    /// iteration and spin on memory in between) leaves the socket to the poll thread.
    pub fn app_polling(&self) {
        let now = self.now_ns();
        let last_end = self.app_last_poll_ns.load(Ordering::Acquire);
        if now.saturating_sub(last_end) <= APP_POLL_GAP_NS {
            self.app_poll_until_ns.store(now + APP_POLL_WINDOW_NS, Ordering::Release);
        }
    }

    /// An application thread's poll ([`RoceDriver::app_polling`]) ended.
    pub fn app_polled(&self) {
        self.app_last_poll_ns.store(self.now_ns(), Ordering::Release);
    }

    /// The application thread stopped polling (it is about to block for a completion
    /// event): the poll thread takes the socket back now.
    pub fn app_waiting(&self) {
        if self.app_poll_until_ns.swap(0, Ordering::AcqRel) > self.now_ns() {
            self.waker.wake();
        }
    }

    /// Enters a busy-polling section: the poll thread leaves the socket to the caller.
    pub fn busy_enter(&self) {
        self.busy_pollers.fetch_add(1, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Leaves a busy-polling section, sending whatever replies it held back.
    pub fn busy_leave(&self) {
        let mut core = self.lock();
        let now = self.now_ns();
        self.settle(&mut core, now);
        drop(core);
        self.busy_pollers.fetch_sub(1, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Stops the poll thread (the caller joins it). Connections still up are torn down
    /// first (a DREQ each), as a device closing does.
    pub fn stop(&self) {
        self.with_core_at(|dev, now| dev.with_cm(now, |cm, qps| cm.disconnect_all(now, qps)));
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Closes the capture, once the poll thread has stopped.
    pub fn close_log(&self) {
        if let Some(log) = &self.log {
            let _ = log.close();
        }
    }
}

/// Who calls [`RoceDriver::progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poller {
    /// The device's poll thread.
    PollThread,
    /// An application thread in a busy-polling section: replies wait for its next post.
    BusyPolling,
    /// An application thread polling its CQ outside such a section: replies go at once.
    Application,
}

/// How long an application's poll of its CQ keeps the poll thread off the socket: the
/// poll thread wakes about this often while an application spins, and a thread that
/// stops polling without saying so ([`RoceDriver::app_waiting`]) waits at most this long
/// for the poll thread to read for it.
pub const APP_POLL_WINDOW_NS: u64 = 1_000_000;

/// A poll of a CQ that starts this soon after the previous one ended is a thread polling
/// in a loop. Measured from the end, not the start: an empty poll, a receive attempt
/// included, takes about a microsecond on the host but 10-20 µs in a QEMU/TCG guest,
/// where a start-to-start gap of 5 µs never held and the poll thread kept waking for
/// every packet beside an application spinning on its CQ.
pub const APP_POLL_GAP_NS: u64 = 5_000;

/// How long the socket may go unread before a posting thread reads it itself.
const RX_STALE_NS: u64 = 1_000_000;

/// The most packets a busy-polling caller's look may find and still hold the replies to
/// them for the caller's next request ([`RoceDriver::progress`]): a ping-pong's look finds
/// one request and perhaps the ACK of the caller's own.
const HOLD_REPLIES_MAX_PACKETS: usize = 4;

/// Most receive batches read before timers fire ([`RoceDriver::progress`]): the socket
/// buffer's worth of small ACKs, bounded so a flood cannot hold the timers off for ever.
const DRAIN_BATCHES_MAX: usize = 256;

/// Reads and delivers what the socket holds, up to [`DRAIN_BATCHES_MAX`] batches; returns
/// the packets handled.
fn drain(rx: &mut dyn PacketRx, dev: &mut Device, now_ns: u64) -> usize {
    let mut handled = 0;
    for _ in 0..DRAIN_BATCHES_MAX {
        match rx.recv() {
            Ok(n @ 1..) => {
                rx.deliver(dev, now_ns);
                handled += n;
            }
            _ => break,
        }
    }
    handled
}
