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

    /// The octets connection `t` has for its stream, as up to `out.len()` iovecs for one
    /// `writev` (how many are filled): framed bytes, and registered memory where it lies.
    /// They stay valid until the device is next changed; write them under the lock that
    /// guards the device, which deregistering a region also takes. A region deregistered
    /// with its bytes queued ends the connection as in [`IwarpDevice::tx_copy_pending`],
    /// and none are returned.
    pub fn tx_pending_iovecs(&mut self, t: ConnId, out: &mut [libc::iovec]) -> usize {
        let filled = self.conns.get(&t).map_or(Some(0), |c| c.tx.iovecs(out));
        filled.unwrap_or_else(|| {
            self.close(t);
            0
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
        if let Some(c) = self.conns.get_mut(&t) {
            list_writable(&mut self.writable, t, c);
        }
    }

    /// The connections with bytes to write since the last call, in the order of their
    /// ids, into `out` (cleared first; it keeps its room for the next call).
    pub fn take_writable_into(&mut self, out: &mut Vec<ConnId>) {
        out.clear();
        for t in self.writable.drain(..) {
            if let Some(c) = self.conns.get_mut(&t) {
                c.listed_writable = false;
                out.push(t);
            }
        }
        out.sort_unstable();
    }

    /// Connections the device ended since the last call: the driver closes their streams.
    pub fn take_closed(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.closed)
    }

    /// Completions since the last call, by CQ (a run of one CQ's in order, each).
    pub fn take_completions(&mut self) -> Vec<(u32, Vec<Wc>)> {
        let mut out = Vec::new();
        self.drain_completions(&mut Vec::new(), |cq, run| out.push((cq, std::mem::take(run))));
        out
    }

    /// Hands each completion since the last call to `deliver` with its CQ's id, in order,
    /// a run of one CQ's at a time in `run` (left empty, with its room); nothing is
    /// allocated once `run` has room for a run.
    pub fn drain_completions(&mut self, run: &mut Vec<Wc>, mut deliver: impl FnMut(u32, &mut Vec<Wc>)) {
        run.clear();
        let mut cq_of_run = None;
        for (cq, wc) in self.completions.drain(..) {
            if cq_of_run.is_some_and(|c| c != cq) {
                deliver(cq_of_run.unwrap_or(cq), run);
                run.clear();
            }
            cq_of_run = Some(cq);
            run.push(wc);
        }
        if let Some(cq) = cq_of_run {
            deliver(cq, run);
            run.clear();
        }
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
        let cq = s.recv_cq;
        let flushed = s.early_recvs.drain(..).map(|wr| Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn, 0));
        self.completions.extend(flushed.map(|w| (cq, w)));
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
        // Asked after every step of a QP's work, five times a ping-pong's turn: most find
        // nothing.
        let Some(qp) = s.qp.as_mut().filter(|q| q.has_news()) else { return };
        let (sends, recvs) = &mut self.polled;
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
        self.completions.extend(sends.drain(..).map(|w| (scq, w)));
        self.completions.extend(recvs.drain(..).map(|w| (rcq, w)));
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
            list_writable(&mut self.writable, t, c);
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

/// Puts connection `t` (`c`) on the list of connections to write, unless it is on it.
fn list_writable(writable: &mut Vec<ConnId>, t: ConnId, c: &mut Conn) {
    if !c.listed_writable {
        c.listed_writable = true;
        writable.push(t);
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

#[cfg(test)]
mod tests {
    use crate::engine::verbs::{QpCaps, Wc, WcOpcode, WcStatus};
    use crate::engine::{Device, DeviceConfig};
    use crate::iwarp::config::{ConnParam, IwarpConfig};
    use crate::iwarp::device::IwarpDevice;

    fn wc(id: u64) -> Wc {
        Wc::new(id, WcStatus::Success, WcOpcode::Send, 1, 0)
    }

    #[test]
    fn completions_are_handed_out_in_order_a_run_of_one_cq_at_a_time() {
        let mut d = device();
        d.completions.extend([(4, wc(1)), (4, wc(2)), (9, wc(3)), (4, wc(4))]);
        let mut run = Vec::new();
        let mut seen = Vec::new();
        d.drain_completions(&mut run, |cq, wcs| {
            seen.push((cq, wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>()));
            wcs.clear();
        });
        assert_eq!(seen, [(4, vec![1, 2]), (9, vec![3]), (4, vec![4])]);
        assert!(run.is_empty() && d.take_completions().is_empty(), "each handed out once");
        d.completions.extend([(4, wc(5)), (4, wc(6)), (9, wc(7))]);
        let taken: Vec<(u32, Vec<u64>)> =
            d.take_completions().into_iter().map(|(cq, w)| (cq, w.iter().map(|w| w.wr_id).collect())).collect();
        assert_eq!(taken, [(4, vec![5, 6]), (9, vec![7])]);
    }

    #[test]
    fn writable_connections_are_taken_once_each_in_id_order_and_only_if_open() {
        let mut d = device();
        let pd = d.dev.alloc_pd();
        let cq = d.dev.create_cq(16);
        let mut conn = || {
            let qpn = d.create_qp(pd, (cq, cq), QpCaps::default(), None).unwrap();
            d.connect(qpn, &ConnParam::default()).unwrap()
        };
        let (a, b) = (conn(), conn());
        let mut out = vec![99];
        d.take_writable_into(&mut out);
        for _ in 0..1000 {
            for t in [b, a, 1000] {
                d.mark_writable(t);
            }
        }
        assert_eq!(d.writable.len(), 2, "each open one listed once, however often marked");
        d.writable.push(2000);
        d.take_writable_into(&mut out);
        assert_eq!(out, [a.min(b), a.max(b)], "in id order, and none that is not open");
        assert!(d.writable.is_empty());
        d.take_writable_into(&mut out);
        assert!(out.is_empty(), "nothing marked since");
        d.mark_writable(b);
        d.take_writable_into(&mut out);
        assert_eq!(out, [b], "listed again once taken");
    }

    fn device() -> IwarpDevice {
        let cfg = DeviceConfig { gid: [0; 16], seed: Some(1), max_qps: 16, max_mrs: 16, cc: Default::default() };
        IwarpDevice::new(Device::new(cfg), IwarpConfig::default())
    }
}
