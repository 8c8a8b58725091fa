//! The stream side of the iWARP device: bytes in, bytes out, the MPA outcome, closes and
//! timers, and what the driver collects after each event.

use super::*;
use crate::engine::verbs::{WcOpcode, WcStatus};
use crate::iwarp::config::FIRST_FPDU_DELAY_MAX_MS;
use crate::iwarp::setup::{Negotiated, Outcome};

impl IwarpDevice {
    /// Bytes arrived on connection `t`.
    pub fn on_bytes(&mut self, t: ConnId, data: &[u8]) {
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
            return self.after_setup(t);
        }
        let Some(qpn) = c.qpn else { return };
        let IwarpDevice { dev, qps, .. } = self;
        if let Some(slot) = qps.get_mut(&qpn) {
            let (mrs, srq) = dev.mrs_and_srq_mut(slot.srq);
            let limit_reached = slot.qp.as_mut().is_some_and(|qp| qp.on_stream(data, mrs, srq));
            if let (true, Some(id)) = (limit_reached, slot.srq) {
                dev.srq_limit_reached(id);
            }
        }
        self.pump_qp(qpn);
    }

    /// The peer closed connection `t`, or its stream failed.
    pub fn on_tcp_closed(&mut self, t: ConnId, why: &str) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        if c.tcp_connecting {
            // The TCP connection never came up (refused, unreachable): `connect` fails and
            // the QP, which never had a stream, may connect again (rdma_cm's application
            // retries on RDMA_CM_EVENT_UNREACHABLE or REJECTED).
            if let Some(s) = c.qpn.take().and_then(|q| self.qps.get_mut(&q)) {
                s.conn = None;
            }
            // Closed before it came up: smoltcp's SYN met a reset.
            self.results.insert(t, Err(ConnectError::Refused(why.to_string())));
            return self.close(t);
        }
        if c.setup.is_some() {
            self.fail(t, ConnectError::Tcp(why.to_string()));
        }
        self.close(t);
    }

    /// Octets connection `t` has for its stream.
    pub fn tx_pending_len(&self, t: ConnId) -> usize {
        self.conns.get(&t).map_or(0, |c| c.tx.len())
    }

    /// Copies the octets connection `t` has for its stream into `dst` (none taken; say
    /// what the stream took with [`IwarpDevice::on_written`]); returns how many. A region
    /// whose bytes wait in the queue may have been deregistered since they were queued (the
    /// application broke the rule that a buffer stays registered while its request is
    /// outstanding): the stream cannot carry the octets it promised, so the connection
    /// ends, as it would on a protection fault mid-message: the QP goes to ERR with its
    /// requests flushed, the driver is told to close the stream, and this returns 0.
    pub fn tx_copy_pending(&mut self, t: ConnId, dst: &mut [u8]) -> usize {
        let copied = self.conns.get(&t).map_or(Some(0), |c| c.tx.copy_front(dst));
        copied.unwrap_or_else(|| {
            self.close(t);
            0
        })
    }

    /// The octets connection `t` has for its stream, as up to `max` iovecs for one
    /// `writev`: framed bytes, and registered memory where it lies. They stay valid until
    /// the device is next changed; write them under the lock that guards the device, which
    /// deregistering a region also takes. A region deregistered with its bytes queued ends
    /// the connection as in [`IwarpDevice::tx_copy_pending`], and none are returned.
    pub fn tx_pending_iovecs(&mut self, t: ConnId, max: usize) -> Vec<libc::iovec> {
        let iovs = self.conns.get(&t).map_or(Some(Vec::new()), |c| c.tx.iovecs(max));
        iovs.unwrap_or_else(|| {
            self.close(t);
            Vec::new()
        })
    }

    /// The stream of connection `t` took `n` more bytes: Sends and Writes whose last byte
    /// went complete, and Read Responses top the queue up again.
    pub fn on_written(&mut self, t: ConnId, n: usize) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        let n = n.min(c.tx.len());
        c.tx.consume(n);
        c.written += n as u64;
        let (written, base, qpn) = (c.written, c.qp_base, c.qpn);
        if let Some(qp) = qpn.and_then(|q| self.qps.get_mut(&q)).and_then(|s| s.qp.as_mut()) {
            if written >= base {
                qp.on_transmitted(written - base);
            }
        }
        self.refill(t);
    }

    /// Connection `t` still has bytes its stream did not take: offer them again.
    pub fn mark_writable(&mut self, t: ConnId) {
        if self.conns.contains_key(&t) {
            self.writable.insert(t);
        }
    }

    /// Connections with bytes to write since the last call.
    pub fn take_writable(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.writable).into_iter().filter(|t| self.conns.contains_key(t)).collect()
    }

    /// Connections the device ended since the last call: the driver closes their streams.
    pub fn take_closed(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.closed)
    }

    /// Completions since the last call, by CQ.
    pub fn take_completions(&mut self) -> Vec<(u32, Vec<Wc>)> {
        std::mem::take(&mut self.completions)
    }

    /// The earliest MPA timeout, close linger or held first FPDU deadline (ns).
    pub fn poll_timeout(&self) -> Option<u64> {
        let setup = self.conns.values().filter_map(|c| c.setup.as_ref().and_then(|s| s.poll_timeout()));
        let rtr = self.qps.values().filter_map(|s| s.qp.as_ref().and_then(|q| q.hold_deadline()));
        setup.chain(self.conns.values().filter_map(|c| c.linger_deadline())).chain(rtr).min()
    }

    /// Fires what is due at the time last set: held first FPDUs, MPA timeouts, close lingers.
    pub fn handle_timeout(&mut self) {
        let now = self.now_ns;
        let rtr_due: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, s)| s.qp.as_ref().and_then(|q| q.hold_deadline()).is_some_and(|d| d <= now))
            .map(|(n, _)| *n)
            .collect();
        for qpn in rtr_due {
            let IwarpDevice { dev, qps, .. } = self;
            if let Some(qp) = qps.get_mut(&qpn).and_then(|s| s.qp.as_mut()) {
                qp.release_hold(now, dev.mrs_mut());
            }
            self.pump_qp(qpn);
        }
        let lingering: Vec<ConnId> =
            self.conns.iter().filter(|(_, c)| c.linger_deadline().is_some_and(|d| d <= now)).map(|(t, _)| *t).collect();
        for t in lingering {
            self.close(t);
        }
        let due: Vec<ConnId> = self
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

    /// After the MPA state machine moved: queue its frames, hand a Request to the
    /// listener, bring the QP up or end the connection.
    pub(super) fn after_setup(&mut self, t: ConnId) {
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
        let reject_data = setup.peer_reject_data().to_vec();
        c.queue(out);
        if !c.announced && held {
            c.announced = true;
            if let Some(l) = c.listener.and_then(|l| self.listeners.get_mut(&l)) {
                l.push_back(t);
            }
        }
        match outcome {
            None => self.refill(t),
            Some(Outcome::Established(neg)) => self.establish(t, &neg),
            Some(Outcome::Rejected(why)) => self.fail(t, ConnectError::Rejected { why, private_data: reject_data }),
            Some(Outcome::Failed(why)) => self.fail(t, ConnectError::Mpa(why)),
        }
    }

    fn fail(&mut self, t: ConnId, e: ConnectError) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        c.setup = None;
        c.initiator_policy = None;
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
        let now = self.now_ns;
        if let Some(c) = self.conns.get_mut(&t) {
            c.start_closing(now);
        }
        self.refill(t);
    }

    fn establish(&mut self, t: ConnId, neg: &Negotiated) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        let Some(qpn) = c.qpn else {
            // A held Request is not established before the application accepts it.
            return;
        };
        let Some(s) = self.qps.get_mut(&qpn) else { return self.close(t) };
        c.setup = None;
        c.qp_base = c.queued;
        self.results.insert(t, Ok(neg.peer_private_data.clone()));
        let first_at = first_fpdu_at(&self.cfg, c.opened_ns, self.now_ns);
        let mut qp = IwarpQp::new(qpn, s.pd, neg, c.initiator, c.mss, first_at);
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

    /// Receives posted on a QP that will never connect complete flushed.
    pub(super) fn flush_early_recvs(&mut self, qpn: u32) {
        let Some(s) = self.qps.get_mut(&qpn) else { return };
        if s.qp.is_some() || !s.failed {
            return;
        }
        let wcs: Vec<Wc> =
            s.early_recvs.drain(..).map(|wr| Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn, 0)).collect();
        let cq = s.recv_cq;
        self.deliver(cq, wcs);
    }

    /// After work on QP `qpn`: its bytes queued for the stream, its completions out, and
    /// the stream closing once the QP is in ERR and its last bytes (a Terminate) are out.
    pub(super) fn pump_qp(&mut self, qpn: u32) {
        let IwarpDevice { qps, conns, dev, .. } = self;
        let Some(s) = qps.get_mut(&qpn) else { return };
        let Some(qp) = s.qp.as_mut() else { return };
        let t = s.conn;
        let conn = t.and_then(|t| conns.get_mut(&t));
        // What was posted, up to the connection's buffer; the rest, and Read Responses,
        // as the stream drains ([`IwarpDevice::refill`]).
        let room = conn.as_ref().map_or(0, |c| MAX_TX_BUFFERED.saturating_sub(c.tx.len()));
        let spare = conn.map(|c| c.tx.spare()).unwrap_or_default();
        let out = qp.poll_output_into(room, spare, dev.mrs());
        let err = qp.state() == QpState::Err;
        let now = self.now_ns;
        if let Some(c) = t.and_then(|t| self.conns.get_mut(&t)) {
            c.queue(out);
            if err {
                c.start_closing(now);
            }
        }
        if let Some(t) = t {
            self.refill(t);
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
        if qp.take_errored() {
            self.dev.note_qp_error(qpn);
        }
        if qp.take_fatal() {
            // siw raises the same on a Terminate (IBTA 11.6.3.1 catastrophic error).
            self.dev.raise_async_event(crate::engine::event::AsyncEvent::QpFatal(qpn));
        }
        let (scq, rcq) = (s.send_cq, s.recv_cq);
        self.deliver(scq, sends);
        self.deliver(rcq, recvs);
    }

    fn deliver(&mut self, cq: u32, wcs: Vec<Wc>) {
        if !wcs.is_empty() {
            self.completions.push((cq, wcs));
        }
    }

    /// Tops connection `t`'s queue up with its QP's Read Responses to [`MAX_TX_BUFFERED`];
    /// marks it for writing, or closes it once a closing connection has written all.
    fn refill(&mut self, t: ConnId) {
        let IwarpDevice { conns, qps, dev, .. } = self;
        let Some(c) = conns.get_mut(&t) else { return };
        if let Some(qp) = c.qpn.and_then(|q| qps.get_mut(&q)).and_then(|s| s.qp.as_mut()).filter(|q| q.has_output()) {
            let room = MAX_TX_BUFFERED.saturating_sub(c.tx.len());
            if room > 0 {
                let spare = c.tx.spare();
                c.queue(qp.poll_output_into(room, spare, dev.mrs()));
            }
        }
        let qpn = c.qpn;
        if !c.tx.is_empty() {
            self.writable.insert(t);
        } else if c.closing {
            return self.close(t);
        }
        if let Some(q) = qpn {
            self.completions(q);
        }
    }

    /// Ends connection `t`: its QP (if any) goes to ERR with everything flushed, and the
    /// driver is told to close the stream.
    pub(super) fn close(&mut self, t: ConnId) {
        let Some(c) = self.conns.remove(&t) else { return };
        self.closed.push(t);
        self.writable.remove(&t);
        // A Request the application never took leaves its listener's queue with it, or a
        // peer that connects, asks and resets could grow the queue without end.
        if let Some(queue) = c.listener.and_then(|l| self.listeners.get_mut(&l)) {
            queue.retain(|r| *r != t);
        }
        let Some(qpn) = c.qpn else { return };
        let Some(s) = self.qps.get_mut(&qpn) else { return };
        s.conn = None;
        if let Some(qp) = s.qp.as_mut() {
            qp.on_stream_closed("the connection closed");
            // Dropped unsent: spans are let go without reading their memory.
            drop(qp.poll_output_into(crate::iwarp::qp::OUTPUT_BUDGET, Vec::new(), self.dev.mrs()));
        }
        self.completions(qpn);
    }
}

/// When an initiator's first FPDU may go, connected at `opened_ns` and established at
/// `now_ns` ([`IwarpConfig::first_fpdu_delay_us`]); `None`: at once.
fn first_fpdu_at(cfg: &IwarpConfig, opened_ns: u64, now_ns: u64) -> Option<u64> {
    let floor_ns = cfg.first_fpdu_delay_us.saturating_mul(1_000);
    if floor_ns == 0 {
        return None;
    }
    let setup_ns = now_ns.saturating_sub(opened_ns);
    let delay_ns = floor_ns.max(setup_ns).min(FIRST_FPDU_DELAY_MAX_MS * 1_000_000);
    Some(now_ns.saturating_add(delay_ns))
}
