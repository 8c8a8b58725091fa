//! How long a driver's poll thread busy-polls after traffic ([`SpinBudget`]), so that the
//! passive side of a ping-pong or of READs answers with no thread wake-up, while an idle
//! device sleeps. Shared by the RoCEv2 and iWARP drivers, which do not spin at all on a
//! machine with one CPU: there a spinning poll thread can only hold up the thread with
//! work (measured in interop/compare's 1-vCPU VMs: RoCEv2 latency 15-35 % lower without).

/// How long the poll thread busy-polls after traffic, adapted to what it finds: the
/// whole [`SPIN_MAX_NS`] after a spin that found a packet, or a sleep that a packet ended
/// within it; half as long after each spin that found none, down to none at all. A device
/// with a peer in a ping-pong spins; an idle one, or one hearing from peers every few
/// milliseconds, sleeps.
#[derive(Debug, Default)]
pub struct SpinBudget {
    /// How long the next spin may last.
    pub budget_ns: u64,
}

/// The longest the poll thread busy-polls after traffic: about two wake-ups of a sleeping
/// thread on a busy host, so that spinning pays only when it saves one.
pub const SPIN_MAX_NS: u64 = 50_000;
/// Below this, a spin is not worth a look.
pub const SPIN_MIN_NS: u64 = 2_000;

impl SpinBudget {
    /// A spin, or a sleep about as long, found traffic.
    pub fn hit(&mut self) {
        self.budget_ns = SPIN_MAX_NS;
    }

    /// A spin found nothing.
    pub fn miss(&mut self) {
        self.budget_ns /= 2;
        if self.budget_ns < SPIN_MIN_NS {
            self.budget_ns = 0;
        }
    }

    /// A sleep of `slept_ns` ended with traffic: had the thread spun, would it have caught it?
    pub fn woken_after(&mut self, slept_ns: u64) {
        if slept_ns <= SPIN_MAX_NS {
            self.hit();
        }
    }
}

/// The scheduler slice a poll thread asks for: short, so that when a packet wakes it on a
/// CPU where an application thread spins (on its CQ, or on memory, as perftest's latency
/// tests do), Linux's EEVDF scheduler runs it at once rather than after the spinning
/// thread's default slice of about 3 ms.
pub const POLL_THREAD_SLICE_NS: u64 = 100_000;

/// `struct sched_attr` (linux/sched/types.h), which libc does not define.
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime_ns: u64,
    deadline_ns: u64,
    period_ns: u64,
    util_min: u32,
    util_max: u32,
}

/// Asks for a [`POLL_THREAD_SLICE_NS`] slice for the calling thread (normal policy, no
/// privilege needed; Linux 6.12 and later honour it, earlier kernels refuse or ignore it,
/// which leaves the default). Returns whether the kernel took it.
#[allow(unsafe_code)]
pub fn ask_short_slice() -> bool {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: 0,
        priority: 0,
        runtime_ns: POLL_THREAD_SLICE_NS,
        deadline_ns: 0,
        period_ns: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: sched_setattr on the calling thread (pid 0) with a valid, fully
    // initialised attribute structure of the size it states.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) == 0 }
}

/// Blocks the calling thread until one of `fds` is readable or `timeout` passes: how a
/// caller that found nothing to receive waits without spinning. Returns whether one is.
#[allow(unsafe_code)]
pub fn wait_readable(fds: &[std::os::fd::RawFd], timeout: std::time::Duration) -> bool {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // poll(2) counts in milliseconds; ppoll takes the timeout to the nanosecond.
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `pfds` is a valid array of `pfds.len()` initialised pollfds and `ts` a
    // valid timespec, both alive for the call; no signal mask is passed.
    let n = unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, &raw const ts, std::ptr::null()) };
    n > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spin_budget_follows_the_traffic() {
        let mut s = SpinBudget::default();
        assert_eq!(s.budget_ns, 0, "an idle device does not spin");
        s.woken_after(30_000);
        assert_eq!(s.budget_ns, SPIN_MAX_NS, "traffic came within a spin's reach");
        let misses = (0..10).take_while(|_| {
            s.miss();
            s.budget_ns > 0
        });
        assert_eq!(misses.count(), 4, "50, 25, 12.5, 6.25, 3.1 us, then none");
        s.woken_after(5_000_000);
        assert_eq!(s.budget_ns, 0, "a packet every 5 ms is not worth spinning for");
        s.hit();
        assert_eq!(s.budget_ns, SPIN_MAX_NS);
    }

    #[test]
    fn a_waiting_caller_wakes_on_input_and_not_before() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&a);
        let quiet = std::time::Duration::from_millis(20);
        let start = std::time::Instant::now();
        assert!(!wait_readable(&[fd], quiet), "nothing was sent");
        assert!(start.elapsed() >= quiet, "it waited the whole timeout");
        b.send_to(b"x", a.local_addr().unwrap()).unwrap();
        assert!(wait_readable(&[fd], std::time::Duration::from_secs(5)), "a datagram is waiting");
    }
}
