//! Congestion control for RoCEv2 (IBTA Annex A17.9): a responder that receives a packet
//! marked ECN-CE sends the requester a CNP (opcode 0x81), at most one per QP per
//! `cnp_interval_ns`; a requester that receives CNPs paces its sending with a DCQCN-style
//! rate limiter (Zhu et al., SIGCOMM 2015): multiplicative decrease on each CNP, then fast
//! recovery and additive increase while no CNP arrives. Off by default.

/// Configuration of congestion control on a device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CcConfig {
    /// Send CNPs and react to them.
    pub enabled: bool,
    /// At most one CNP per QP per this many ns (the notification point's rate limit).
    pub cnp_interval_ns: u64,
    /// The line rate a requester starts at and never exceeds, bytes per µs.
    pub line_rate_bytes_per_us: u64,
    /// Lowest rate the limiter goes down to, bytes per µs.
    pub min_rate_bytes_per_us: u64,
    /// Time between rate increases without a CNP, ns.
    pub increase_interval_ns: u64,
    /// Additive increase step, bytes per µs.
    pub additive_step_bytes_per_us: u64,
    /// DCQCN's g: the weight of a new CNP in alpha, as a fraction (1/256ths).
    pub g_256: u32,
    /// Largest loss window, packets in flight per QP; 0: no window. Independent of
    /// `enabled`: a path that drops instead of marking (kernel UDP sockets) needs it.
    pub loss_window_max_packets: u32,
    /// The loss window a QP starts with.
    pub loss_window_initial_packets: u32,
    /// Packets in flight on the whole device at most: each RC QP's window is capped at its
    /// share, so that many QPs together do not overrun the peer (0: no device cap).
    pub loss_window_device_packets: u32,
}

impl Default for CcConfig {
    fn default() -> Self {
        CcConfig {
            enabled: false,
            cnp_interval_ns: 50_000,
            line_rate_bytes_per_us: 12_500,
            min_rate_bytes_per_us: 10,
            increase_interval_ns: 55_000,
            additive_step_bytes_per_us: 50,
            g_256: 16,
            loss_window_max_packets: 0,
            loss_window_initial_packets: 16,
            loss_window_device_packets: 0,
        }
    }
}

/// A loss-driven window on a requester's unacknowledged packets (AIMD as TCP's congestion
/// avoidance): RoCE assumes a lossless fabric, but a UDP socket's buffer overflows when a
/// requester sends faster than its peer drains. Slow start doubles the window per round
/// trip up to `ssthresh`, then it grows by one packet per window acknowledged; a
/// retransmission timeout or a sequence NAK halves it. IBTA leaves the requester's send
/// rate to the implementation (9.7.7 flow control concerns the responder's credits).
#[derive(Debug, Clone)]
pub struct LossWindow {
    /// Packets allowed in flight.
    pub packets: u32,
    max: u32,
    ssthresh: u32,
    credit: u32,
    /// What [`LossWindow::new`] was given, for [`LossWindow::restarted`].
    configured: (u32, u32),
}

impl LossWindow {
    /// A window of `initial` packets growing to at most `max`.
    pub fn new(initial: u32, max: u32) -> Self {
        let cap = max.max(1);
        LossWindow { packets: initial.clamp(1, cap), max: cap, ssthresh: cap, credit: 0, configured: (initial, max) }
    }

    /// The window a new connection of the same QP starts with (after RESET): as
    /// configured, whatever this one learnt or was capped to.
    pub fn restarted(&self) -> Self {
        LossWindow::new(self.configured.0, self.configured.1)
    }

    /// True when one more packet may go out with `in_flight` unacknowledged, within the
    /// window and the QP's share `cap` of the device's budget.
    pub fn allows(&self, in_flight: u32, cap: u32) -> bool {
        in_flight < self.packets.min(cap.max(1))
    }

    /// `n` packets were acknowledged.
    pub fn on_acked(&mut self, n: u32) {
        if self.packets < self.ssthresh {
            self.packets = (self.packets + n).min(self.ssthresh).min(self.max);
            return;
        }
        self.credit += n;
        while self.credit >= self.packets {
            self.credit -= self.packets;
            self.packets = (self.packets + 1).min(self.max);
        }
    }

    /// Never more than `max` packets from now on (the path's MTU, once known, puts a
    /// byte limit on what is in flight): a window that grew past what may be sent would
    /// still be past it after halving, and a loss would not slow the sender.
    pub fn cap_at(&mut self, max: u32) {
        if max < self.max {
            self.max = max.max(1);
            self.packets = self.packets.min(self.max);
            self.ssthresh = self.ssthresh.min(self.max);
        }
    }

    /// A sequence NAK reported a hole while later packets got through: halve.
    pub fn on_loss(&mut self) {
        self.ssthresh = (self.packets / 2).max(2);
        self.packets = (self.packets / 2).max(1);
        self.credit = 0;
    }

    /// The retransmit timer fired: nothing got through, so start again from one packet
    /// and slow-start back to half the old window (TCP's loss window, RFC 5681 §3.1).
    pub fn on_timeout(&mut self) {
        self.ssthresh = (self.packets / 2).max(2);
        self.packets = 1;
        self.credit = 0;
    }
}

/// Rounds of fast recovery before additive increase (DCQCN's F).
const FAST_RECOVERY_ROUNDS: u32 = 5;

/// A requester's DCQCN rate state (the reaction point).
#[derive(Debug, Clone)]
pub struct RateLimiter {
    /// Current rate, bytes per µs.
    pub rate: u64,
    target: u64,
    /// alpha in 1/1024ths.
    alpha_1024: u64,
    rounds: u32,
    next_increase: Option<u64>,
    next_send: u64,
    /// CNPs received.
    pub cnps: u64,
}

impl RateLimiter {
    /// A limiter at line rate.
    pub fn new(cfg: &CcConfig) -> Self {
        let r = cfg.line_rate_bytes_per_us;
        RateLimiter { rate: r, target: r, alpha_1024: 1024, rounds: 0, next_increase: None, next_send: 0, cnps: 0 }
    }

    /// A CNP arrived: cut the rate by alpha/2 and raise alpha.
    pub fn on_cnp(&mut self, now: u64, cfg: &CcConfig) {
        self.cnps += 1;
        self.target = self.rate;
        let cut = self.rate * self.alpha_1024 / 2048;
        self.rate = (self.rate - cut).max(cfg.min_rate_bytes_per_us);
        let g = u64::from(cfg.g_256);
        self.alpha_1024 = (self.alpha_1024 * (256 - g) + 1024 * g) / 256;
        self.rounds = 0;
        self.next_increase = Some(now + cfg.increase_interval_ns);
    }

    /// Raises the rate for every increase interval that passed without a CNP.
    pub fn tick(&mut self, now: u64, cfg: &CcConfig) {
        while let Some(t) = self.next_increase.filter(|&t| now >= t) {
            let g = u64::from(cfg.g_256);
            self.alpha_1024 = self.alpha_1024 * (256 - g) / 256;
            if self.rounds >= FAST_RECOVERY_ROUNDS {
                self.target = (self.target + cfg.additive_step_bytes_per_us).min(cfg.line_rate_bytes_per_us);
            }
            // Rounded up, so the rate reaches the target rather than creeping under it.
            self.rate = (self.rate + self.target).div_ceil(2);
            self.rounds += 1;
            self.next_increase = (self.rate < cfg.line_rate_bytes_per_us).then_some(t + cfg.increase_interval_ns);
        }
    }

    /// True when a packet may go out now.
    pub fn may_send(&self, now: u64) -> bool {
        now >= self.next_send
    }

    /// Accounts for `bytes` sent at `now`.
    pub fn sent(&mut self, now: u64, bytes: usize) {
        let ns = bytes as u64 * 1000 / self.rate.max(1);
        self.next_send = self.next_send.max(now) + ns;
    }

    /// When the next packet may go out.
    pub fn next_send(&self) -> u64 {
        self.next_send
    }

    /// When the rate next rises, if it is below line rate.
    pub fn next_increase(&self) -> Option<u64> {
        self.next_increase
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cnp_halves_then_recovers() {
        let cfg = CcConfig { enabled: true, ..CcConfig::default() };
        let mut r = RateLimiter::new(&cfg);
        r.on_cnp(0, &cfg);
        assert_eq!(r.rate, 12_500 / 2, "alpha starts at 1: the first CNP halves the rate");
        let after_one = r.rate;
        r.on_cnp(1, &cfg);
        assert!(r.rate < after_one);
        let low = r.rate;
        r.tick(10 * cfg.increase_interval_ns, &cfg);
        assert!(r.rate > low, "recovers without CNPs");
        r.tick(10_000 * cfg.increase_interval_ns, &cfg);
        assert_eq!(r.rate, cfg.line_rate_bytes_per_us, "back to line rate, and no further");
    }

    #[test]
    fn loss_window_slow_starts_halves_on_loss_then_grows_by_one_per_window() {
        let mut w = LossWindow::new(4, 64);
        assert!(w.allows(3, u32::MAX) && !w.allows(4, u32::MAX));
        assert!(!w.allows(2, 2), "the device's share caps it too");
        w.on_acked(4);
        assert_eq!(w.packets, 8, "slow start: one more per packet acknowledged");
        w.on_acked(100);
        assert_eq!(w.packets, 64, "never beyond the maximum");
        w.on_loss();
        assert_eq!(w.packets, 32);
        w.on_acked(31);
        assert_eq!(w.packets, 32, "congestion avoidance: a whole window for one more");
        w.on_acked(1);
        assert_eq!(w.packets, 33);
        for _ in 0..10 {
            w.on_loss();
        }
        assert_eq!(w.packets, 1, "down to one packet, never zero");
        let mut w = LossWindow::new(64, 64);
        w.on_timeout();
        assert_eq!(w.packets, 1, "a timeout restarts from one packet");
        w.on_acked(40);
        assert_eq!(w.packets, 32, "slow start up to half the old window");
    }

    #[test]
    fn a_window_capped_below_its_size_halves_from_the_cap() {
        let mut w = LossWindow::new(4, 1024);
        w.on_acked(2000);
        assert_eq!(w.packets, 1024);
        w.cap_at(256);
        assert_eq!(w.packets, 256, "a path MTU of 4096 allows 256 packets of 1 MiB");
        w.on_acked(2000);
        assert_eq!(w.packets, 256, "it does not grow past the cap");
        w.on_loss();
        assert_eq!(w.packets, 128, "so a loss slows the sender at once");
        w.cap_at(512);
        w.on_acked(100_000);
        assert_eq!(w.packets, 256, "a larger cap later does not lift it");
        let mut again = w.restarted();
        assert_eq!(again.packets, 4, "a restarted window starts as configured");
        again.on_acked(2000);
        assert_eq!(again.packets, 1024, "and is no longer capped");
    }

    #[test]
    fn pacing_spaces_packets_by_rate() {
        let cfg = CcConfig { enabled: true, line_rate_bytes_per_us: 1000, ..CcConfig::default() };
        let mut r = RateLimiter::new(&cfg);
        assert!(r.may_send(0));
        r.sent(0, 1000); // 1000 bytes at 1000 B/µs: 1 µs
        assert!(!r.may_send(999));
        assert!(r.may_send(1000));
    }
}
