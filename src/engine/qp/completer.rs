//! The completer (IBTA 9.7.5.2 from the requester's side): ACKs, NAKs, READ responses and
//! atomic ACKs retire work requests in posting order; the retransmit and RNR timers.

use super::requester::{wc, Requester, SendWqe};
use super::{Ctx, Path, RNR_TIMER_NS};
use crate::engine::mem::{MrTable, Need, Pd};
use crate::engine::verbs::{SendOp, WcStatus};
use crate::proto::roce::ext::{NakCode, Syndrome};
use crate::proto::roce::opcode::Position;
use crate::proto::roce::{Psn, RoceRepr};

/// What the QP must do after the completer ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Carry on.
    Ok,
    /// A work request failed: the QP goes to ERR (IBTA 10.3.1.7).
    Error,
}

impl Requester {
    /// Retires, in order, every finished WQE at the head of the queue.
    pub fn retire(&mut self, qpn: u32, send_cq: u32, ctx: &mut Ctx<'_>) -> Verdict {
        while let Some(status) = self.wqes.front().and_then(|w| w.done) {
            let Some(w) = self.wqes.pop_front() else {
                break;
            };
            self.send_idx = self.send_idx.saturating_sub(1);
            if let Some(job) = w.tm.as_deref() {
                self.finish_tm_job(job, &w, qpn, status, ctx);
            } else if w.wr.signaled || status != WcStatus::Success {
                ctx.complete(send_cq, wc(&w, qpn, status));
            }
            if status != WcStatus::Success {
                return Verdict::Error;
            }
        }
        if !self.wqes.iter().any(|w| w.started && w.done.is_none()) {
            self.timer = None;
        }
        Verdict::Ok
    }

    /// Marks done every SEND/WRITE wholly at or before `psn` (cumulative ACK, IBTA
    /// 9.7.5.2.1); stops at the first READ/atomic, whose data only its response brings.
    fn ack_through(&mut self, psn: Psn) -> bool {
        let mut progress = false;
        // Any advance of the acknowledged PSN is progress (IBTA 9.7.6.1.3), even inside a
        // message that has not finished.
        if self.acked.is_none_or(|a| a.serial_cmp(psn).is_lt()) && self.outstanding_or_before(psn) {
            // Before the first ACK, progress is measured from the oldest request sent, so
            // the first ACK of a QP restarts the timer too (else its deadline stays that
            // of the first packet, and later packets time out early), while an ACK of a
            // PSN before anything sent is no progress.
            let oldest = self.wqes.iter().find(|w| w.started && w.done.is_none()).map(|w| w.first_psn.sub(1));
            if let Some(from) = self.acked.or(oldest).filter(|f| f.serial_cmp(psn).is_lt()) {
                progress = true;
                if let Some(win) = self.window.as_mut() {
                    win.on_acked(from.distance_to(psn).max(0) as u32);
                }
            }
            self.acked = Some(psn);
        }
        for w in self.wqes.iter_mut() {
            if w.done.is_some() {
                continue;
            }
            let acked = w.started && w.end_psn().sub(1).serial_cmp(psn).is_le();
            if !acked || w.wr.op.is_read_or_atomic() {
                break;
            }
            w.done = Some(WcStatus::Success);
            progress = true;
        }
        progress
    }

    fn progress(&mut self, now: u64) {
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        let pending = self.awaiting_response();
        self.timer = if pending { self.retransmit_deadline(now) } else { None };
    }

    /// True while a message is sent and not complete, or part of one is sent and not yet
    /// acknowledged: what the retransmit timer covers (IBTA 9.7.6.1.3). A message the loss
    /// window holds back halfway, with everything sent of it acknowledged, waits for
    /// nothing from the responder and must not time out.
    pub(super) fn awaiting_response(&self) -> bool {
        self.wqes.iter().any(|w| {
            if !w.started || w.done.is_some() || w.next_pkt == 0 {
                return false;
            }
            // A message sent whole waits for its ACK, even one whose PSNs an ACK already
            // covered while a READ ahead of it was unfinished.
            if w.wr.op.is_read_or_atomic() || w.next_pkt >= w.npkts {
                return true;
            }
            let last_sent = w.first_psn.add(w.next_pkt - 1);
            self.acked.is_none_or(|a| a.serial_cmp(last_sent).is_lt())
        })
    }

    /// True when `psn` is at or before the last PSN sent: an acknowledgement of it is real.
    fn outstanding_or_before(&self, psn: Psn) -> bool {
        psn.serial_cmp(self.next_psn).is_lt()
    }

    /// True when `psn` belongs to a request that is sent and not yet finished.
    fn outstanding(&self, psn: Psn) -> bool {
        self.wqes.iter().any(|w| w.started && w.done.is_none() && psn.in_window(w.first_psn, w.npkts))
    }

    /// An ACK or NAK (IBTA 9.7.5.2.8).
    pub fn on_ack(&mut self, psn: Psn, syndrome: Syndrome, ctx: &mut Ctx<'_>) {
        // A NAK for a request no longer outstanding is stale (a reordered or duplicated
        // packet): it says nothing about what is in flight now.
        if !matches!(syndrome, Syndrome::Ack { .. }) && !self.outstanding(psn) {
            if self.ack_through(psn.sub(1)) {
                self.progress(ctx.now);
            }
            return;
        }
        match syndrome {
            Syndrome::Ack { .. } => {
                self.rtt.acked(psn, ctx.now);
                if self.ack_through(psn) {
                    self.progress(ctx.now);
                }
                self.reread_if_skipped(psn);
            }
            Syndrome::RnrNak { timer } => {
                self.ack_through(psn.sub(1));
                if self.rnr_left == 0 {
                    self.fail_at(psn, WcStatus::RnrRetryExcErr);
                    return;
                }
                if self.rnr_retry != 7 {
                    self.rnr_left -= 1;
                }
                ctx.stats.rnr_naks_received += 1;
                self.rewind(psn);
                self.rnr_until = Some(ctx.now + RNR_TIMER_NS[usize::from(timer & 31)]);
                self.timer = None;
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                if self.ack_through(psn.sub(1)) {
                    self.progress(ctx.now);
                }
                ctx.stats.seq_naks_received += 1;
                // The same hole NAKed again while its resend is under way: stale packets
                // sent before the rewind provoked it. A NAK further on is new information.
                if self.rewound_to != Some(psn) || !self.already_resending(psn) {
                    if let Some(win) = self.window.as_mut() {
                        win.on_loss();
                    }
                    self.rewind(psn);
                }
            }
            Syndrome::Nak(code) => {
                self.ack_through(psn.sub(1));
                let status = match code {
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    _ => WcStatus::RemInvReqErr,
                };
                self.fail_at(psn, status);
            }
        }
    }

    /// An ACK beyond an unanswered READ or atomic means its responses were lost
    /// (IBTA 9.7.5.2.1): ask again at once rather than wait for the timer.
    fn reread_if_skipped(&mut self, psn: Psn) {
        let Some(w) = self.wqes.iter().find(|w| w.done.is_none()) else { return };
        if !w.started || !w.wr.op.is_read_or_atomic() {
            return;
        }
        let resume = w.first_psn.add(w.done_pkts);
        if resume.serial_cmp(psn).is_le() && !self.already_resending(resume) {
            self.rewind(resume);
        }
    }

    /// The WQE holding `psn` (or the first unfinished one) completes with `status`.
    fn fail_at(&mut self, psn: Psn, status: WcStatus) {
        let at = self.wqes.iter().position(|w| w.started && w.done.is_none() && psn.in_window(w.first_psn, w.npkts));
        let at = at.or_else(|| self.wqes.iter().position(|w| w.done.is_none()));
        if let Some(i) = at {
            self.wqes[i].done = Some(status);
        }
    }

    /// The unfinished READ or atomic a response with `psn` answers, after implicitly
    /// acknowledging everything before it (IBTA 9.7.5.2.1).
    fn responder_target(&mut self, psn: Psn) -> Option<usize> {
        for i in 0..self.wqes.len() {
            let w = &self.wqes[i];
            if w.done.is_some() {
                continue;
            }
            if !w.started {
                return None;
            }
            if psn.in_window(w.first_psn, w.npkts) {
                return w.wr.op.is_read_or_atomic().then_some(i);
            }
            // Only a request wholly before the response is implicitly acknowledged; a stale
            // response (a duplicate of an earlier READ) acknowledges nothing.
            let before = w.end_psn().sub(1).serial_cmp(psn).is_lt();
            if w.wr.op.is_read_or_atomic() || !before {
                return None;
            }
            self.wqes[i].done = Some(WcStatus::Success);
        }
        None
    }

    /// An RDMA READ response packet.
    pub fn on_read_response(&mut self, r: &RoceRepr<'_>, path: &Path, pd: Pd, ctx: &mut Ctx<'_>) {
        let psn = r.bth.psn;
        let Some(i) = self.responder_target(psn) else {
            return;
        };
        let w = &mut self.wqes[i];
        let SendOp::Read(_) = w.wr.op else { return };
        let expected = w.first_psn.add(w.done_pkts);
        if psn != expected {
            ctx.stats.out_of_order_responses += 1;
            // A response is missing (IBTA 9.7.5.2.4): ask again for the rest at once, once:
            // responses of the earlier request still in flight arrive out of order too, and
            // answering each with a new request would restart the whole response each time.
            if expected.serial_cmp(psn).is_lt()
                && !self.already_resending(expected)
                && self.rewound_to != Some(expected)
            {
                self.rewind(expected);
            }
            return;
        }
        let last = w.done_pkts + 1 == w.npkts;
        let pos = r.info().map(|i| i.position);
        let offset = w.done_pkts as usize * path.mtu;
        let want = if last { w.len - offset } else { path.mtu };
        let pos_ok = matches!(
            (pos, last),
            (Some(Position::Last | Position::Only), true) | (Some(Position::First | Position::Middle), false)
        );
        if !pos_ok || r.payload.len() != want {
            ctx.stats.bad_responses += 1;
            return;
        }
        if !scatter(w, offset, r.payload, pd, ctx.mrs) {
            w.done = Some(WcStatus::LocProtErr);
            return;
        }
        w.done_pkts += 1;
        if last {
            w.done = Some(WcStatus::Success);
        }
        if let Some(win) = self.window.as_mut() {
            win.on_acked(1);
        }
        self.progress(ctx.now);
    }

    /// An ATOMIC ACKNOWLEDGE: the original value lands in the local buffer.
    pub fn on_atomic_ack(&mut self, psn: Psn, original: u64, pd: Pd, ctx: &mut Ctx<'_>) {
        let Some(i) = self.responder_target(psn) else {
            return;
        };
        let w = &mut self.wqes[i];
        if w.wr.op.is_read_or_atomic() && !matches!(w.wr.op, SendOp::Read(_)) && w.first_psn == psn {
            let ok = scatter(w, 0, &original.to_le_bytes(), pd, ctx.mrs);
            w.done = Some(if ok { WcStatus::Success } else { WcStatus::LocProtErr });
            self.progress(ctx.now);
        }
    }

    /// The retransmit timer fired (IBTA 9.7.6.1.3): retry from the oldest unacknowledged
    /// PSN, or fail the oldest request when the retry count is spent.
    pub fn on_timer(&mut self, ctx: &mut Ctx<'_>) {
        self.timer = None;
        let Some(w) = self.wqes.iter().find(|w| w.started && w.done.is_none()) else {
            return;
        };
        let resume = if matches!(w.wr.op, SendOp::Read(_)) { w.first_psn.add(w.done_pkts) } else { w.first_psn };
        if self.retry_left == 0 {
            self.fail_at(resume, WcStatus::RetryExcErr);
            return;
        }
        self.retry_left -= 1;
        ctx.stats.retransmit_timeouts += 1;
        if let Some(win) = self.window.as_mut() {
            win.on_timeout();
        }
        // A late ACK of what the timer resends still times it from its first sending.
        let probe = self.rtt.resent();
        self.rewind(resume);
        self.rtt.keep(probe);
    }

    /// Ends an RNR wait whose time has come.
    pub fn on_rnr_elapsed(&mut self, now: u64) {
        if self.rnr_until.is_some_and(|t| now >= t) {
            self.rnr_until = None;
            self.timer = None;
        }
    }
}

/// Places `data` at byte `offset` of a WQE's scatter list.
fn scatter(w: &SendWqe, offset: usize, data: &[u8], pd: Pd, mrs: &MrTable) -> bool {
    mrs.for_sgl_range(&w.wr.sgl, pd, (offset, data.len()), Need::LocalWrite, |mem, off, at, n| {
        mem.write(off, &data[at..at + n])
    })
}
