//! The requester's round-trip estimate and the retransmission timeout it gives.
//!
//! IBTA 9.7.6.1.3 sets the transport timer from the QP's Local ACK Timeout (4.096 µs ×
//! 2^timeout). A fixed timer mistakes a path that is only busy (a deep queue, a slow
//! receiver) for loss, retransmits into the queue, and makes it deeper. So, as TCP does
//! (RFC 6298), the requester measures round trips of packets sent once (Karn's rule) and
//! waits srtt + 4 × rttvar, never less than the QP's timeout and at most four times it, so
//! a peer that is gone is still found gone within a bound the application set (a peer that
//! never answers yields no sample, so its retries stay one timeout apart). A packet resent
//! by the timer stays timed from its first sending: with Karn's rule alone, a path slower
//! than the timeout would never yield a sample, and the sample it gives instead can only
//! be too long, which errs on the side of waiting.

use crate::proto::roce::Psn;

/// Most the measured round trip may stretch the timer, as a multiple of the QP's timeout.
pub const RTO_STRETCH_MAX: u64 = 4;

/// Smoothed round trip and its variation, ns, and the packet being timed.
#[derive(Debug, Clone, Default)]
pub struct RttEstimate {
    srtt_ns: Option<u64>,
    rttvar_ns: u64,
    /// The packet being timed and when it left; one at a time.
    probe: Option<(Psn, u64)>,
}

impl RttEstimate {
    /// A packet `psn` sent for the first time at `now`: timed if no other is.
    pub fn sent(&mut self, psn: Psn, now: u64) {
        if self.probe.is_none() {
            self.probe = Some((psn, now));
        }
    }

    /// Everything through `psn` is acknowledged at `now`: the timed packet's round trip
    /// is a sample (RFC 6298 §2: rttvar ← ¾ rttvar + ¼ |srtt − r|, srtt ← ⅞ srtt + ⅛ r).
    pub fn acked(&mut self, psn: Psn, now: u64) {
        let Some((p, at)) = self.probe else { return };
        if p.serial_cmp(psn).is_gt() {
            return;
        }
        self.probe = None;
        let r = now.saturating_sub(at);
        match self.srtt_ns {
            None => {
                self.srtt_ns = Some(r);
                self.rttvar_ns = r / 2;
            }
            Some(s) => {
                self.rttvar_ns = (3 * self.rttvar_ns + s.abs_diff(r)) / 4;
                self.srtt_ns = Some((7 * s + r) / 8);
            }
        }
    }

    /// A retransmission after a NAK: the packet being timed may be answered for its copy
    /// (Karn's rule). Returns the probe, for a retransmission by the timer to keep.
    pub fn resent(&mut self) -> Option<(Psn, u64)> {
        self.probe.take()
    }

    /// Keeps timing `probe` across a retransmission by the timer.
    pub fn keep(&mut self, probe: Option<(Psn, u64)>) {
        self.probe = probe;
    }

    /// The retransmission timeout for a QP whose Local ACK Timeout is `base_ns`.
    pub fn timeout_ns(&self, base_ns: u64) -> u64 {
        let measured = self.srtt_ns.map_or(0, |s| s + 4 * self.rttvar_ns);
        measured.clamp(base_ns, base_ns.saturating_mul(RTO_STRETCH_MAX))
    }

    /// The smoothed round trip, once measured.
    pub fn srtt_ns(&self) -> Option<u64> {
        self.srtt_ns
    }
}

/// How finely a timer of `timeout_ns` is placed: it may fire up to 1/[`TIMER_SLACK_DIV`]
/// of its length late.
pub const TIMER_SLACK_DIV: u64 = 16;

/// `now + timeout_ns`, rounded up to a power of two at most 1/[`TIMER_SLACK_DIV`] of the
/// timeout, as Linux's timer wheel coarsens long timers. Every ACK restarts a busy QP's
/// timer, and the deadline index keeps the earlier entry until it comes
/// ([`crate::engine::schedule::Schedule::file`]): with exact deadlines a thousand busy QPs'
/// entries came due at a thousand different times per timeout, each a wake-up of the poll
/// thread (1,600 a second with 64 ms timers); on the grid they come due together, at most
/// [`TIMER_SLACK_DIV`] times per timeout. IBTA 9.7.6.1.3 bounds the timer from below only.
pub fn timer_deadline(now: u64, timeout_ns: u64) -> u64 {
    let grid = (timeout_ns / TIMER_SLACK_DIV).checked_ilog2().map_or(1, |b| 1u64 << b);
    (now.saturating_add(timeout_ns)).div_ceil(grid).saturating_mul(grid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_follows_the_round_trip_within_one_to_four_times_the_qps() {
        let base = 67_108_864; // timeout 14
        let mut e = RttEstimate::default();
        assert_eq!(e.timeout_ns(base), base, "no sample yet: the QP's own timeout");
        e.sent(Psn::new(10), 0);
        e.sent(Psn::new(11), 5); // one probe at a time
        e.acked(Psn::new(9), 1_000);
        assert_eq!(e.srtt_ns(), None, "an ACK short of the probe is no sample");
        e.acked(Psn::new(11), 100_000_000);
        assert_eq!(e.srtt_ns(), Some(100_000_000));
        assert_eq!(e.timeout_ns(base), 4 * base, "300 ms measured, capped at 4x");
        for k in 0..40 {
            e.sent(Psn::new(20 + k), 1_000_000 * u64::from(k));
            e.acked(Psn::new(20 + k), 1_000_000 * u64::from(k) + 10_000);
        }
        assert_eq!(e.timeout_ns(base), base, "a fast path: never below the QP's timeout");
        e.sent(Psn::new(100), 0);
        e.resent();
        e.acked(Psn::new(100), 900_000_000);
        assert!(e.srtt_ns().unwrap() < 1_000_000, "a packet resent after a NAK is not timed");
        e.sent(Psn::new(200), 1_000_000_000);
        let probe = e.resent();
        e.keep(probe); // resent by the timer: still timed from its first sending
        e.acked(Psn::new(200), 1_150_000_000);
        assert!(e.srtt_ns().unwrap() > 10_000_000, "the late ACK is a (long) sample");
    }

    #[test]
    fn timers_land_on_a_grid_a_sixteenth_of_their_length_late_at_most() {
        for timeout in [8_192u64, 67_108_864, 4 * 67_108_864, 15, 1] {
            for now in [0u64, 1, 12_345_678_901, u64::MAX / 2] {
                let d = timer_deadline(now, timeout);
                assert!(d >= now + timeout, "never early: {now} + {timeout} -> {d}");
                assert!(d - (now + timeout) <= timeout / TIMER_SLACK_DIV, "late by at most 1/16: {d}");
            }
        }
        // A busy QP's restarts (one per ACK, every 50 µs) within a 64 ms timeout's grid
        // step give one deadline, and a thousand QPs started at random times share at most
        // 17 deadlines per timeout.
        let timeout = 67_108_864;
        let restarts: std::collections::BTreeSet<u64> =
            (0..80u64).map(|k| timer_deadline(1_000_000_000 + k * 50_000, timeout)).collect();
        assert!(restarts.len() <= 2, "{restarts:?}");
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let spread: std::collections::BTreeSet<u64> = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                timer_deadline(x % timeout, timeout)
            })
            .collect();
        assert!(spread.len() <= 17, "{} distinct deadlines", spread.len());
    }
}
