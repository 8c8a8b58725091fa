//! The requester (IBTA 9.7.4.1): turns send work requests into request packets: PSN
//! assignment, segmentation to the path MTU, AckReq, the ORD limit, and go-back-N.

use super::{Ctx, Path};
use crate::engine::mem::{MrTable, Need, Pd};
use crate::engine::verbs::{QpAttr, QpCaps, QpType, SendOp, SendWr, Sge, VerbsError, Wc, WcOpcode, WcStatus};
use crate::proto::roce::ext::{AtomicEthRepr, DethRepr, IethRepr, ImmDtRepr, RethRepr, XrcEthRepr};
use crate::proto::roce::{Psn, RoceRepr};
use std::collections::VecDeque;

/// AckReq on at least every this many packets of a long message (IBTA 9.7.2).
pub const ACK_REQ_EVERY: u32 = 16;
/// Bytes of request packets in flight at most, so PSNs in flight at most
/// [`max_inflight_psns`] (far below the 2^23 window of IBTA 9.7.1.1): go-back-N resends
/// everything after a loss, so the window bounds the cost of one, and the queue a window
/// can build on a slow path must drain within the stretched retransmission timer
/// (`tests/busy_paths.rs`: 2,048 packets of 4 KiB on a 10 MB/s path timed out 47 times).
/// Counted in bytes, not packets, so a small path MTU does not shrink it: between two
/// QEMU/TCG VMs (path MTU 1024, interop/compare) 64 KiB WRITEs moved 20.9-22.4 MB/s with
/// 256 packets (256 KiB) in flight, both sides partly idle, and 31.8-33.7 with 1,024.
pub const MAX_INFLIGHT_BYTES: usize = 1 << 20;
/// The most packets in flight: [`MAX_INFLIGHT_BYTES`] at the smallest path MTU that
/// carries data in bulk (1024), the loss window's largest for the drivers.
pub const MAX_INFLIGHT_PSNS: u32 = (MAX_INFLIGHT_BYTES / 1024) as u32;

/// PSNs in flight at most on a path of `mtu` bytes.
pub fn max_inflight_psns(mtu: usize) -> u32 {
    (MAX_INFLIGHT_BYTES / mtu.max(1)).clamp(1, MAX_INFLIGHT_PSNS as usize) as u32
}

/// Longest SEND/WRITE copied at post (a cache line: the latency tests' 8 and 64 bytes
/// keep the path they were tuned on); longer ones are read from memory in place, packet by
/// packet, as a NIC reads by DMA. Copied at post, a 4 KiB message cost an allocation, a
/// zeroing and a second copy into its packet (`write-bw -s 4096` on loopback: 2,067-2,138
/// MB/s gathered at 4 KiB, 2,222-2,374 read in place, client CPU 5-10 % lower); at 64 KiB,
/// 64 KiB WRITEs moved 730-1125 MB/s, against 1375-1762 read in place.
pub const GATHER_MAX_BYTES: usize = 64;

/// One posted send work request and its progress.
#[derive(Debug)]
pub struct SendWqe {
    /// The request.
    pub wr: SendWr,
    /// Gathered payload of a SEND/WRITE of at most [`GATHER_MAX_BYTES`]; a longer one is
    /// read from its registered memory packet by packet, as a NIC reads it by DMA.
    pub data: Vec<u8>,
    /// The protection domain the scatter/gather list is resolved in.
    pub pd: Pd,
    /// Message length (READ: bytes requested).
    pub len: usize,
    /// PSN of the first packet; valid once started.
    pub first_psn: Psn,
    /// PSNs the message takes (READ: one per response packet).
    pub npkts: u32,
    /// PSNs assigned.
    pub started: bool,
    /// Next packet to (re)send; READ and atomics: 0 = request unsent, 1 = sent.
    pub next_pkt: u32,
    /// READ: response packets placed, in order.
    pub done_pkts: u32,
    /// Finished; completes when it reaches the head of the queue.
    pub done: Option<WcStatus>,
    /// A request a TM-SRQ made (a rendezvous READ, a FIN), not the application: it
    /// completes as [`super::tagged::TmJob`] says, never on the send CQ.
    pub tm: Option<Box<super::tagged::TmJob>>,
}

impl SendWqe {
    /// The PSN after the message.
    pub fn end_psn(&self) -> Psn {
        self.first_psn.add(self.npkts)
    }
    /// Packets this request puts on the wire.
    fn request_pkts(&self) -> u32 {
        if self.wr.op.is_read_or_atomic() {
            1
        } else {
            self.npkts
        }
    }
    /// The completion opcode.
    pub fn wc_opcode(&self) -> WcOpcode {
        self.wr.op.wc_opcode()
    }
}

/// Send-side state of a QP.
#[derive(Debug)]
pub struct Requester {
    /// Posted, not yet completed, in order.
    pub wqes: VecDeque<SendWqe>,
    /// First WQE with packets left to send.
    pub send_idx: usize,
    /// Next PSN to assign.
    pub next_psn: Psn,
    /// Transport retries left.
    pub retry_left: u8,
    /// RNR retries left (7 = infinite).
    pub rnr_left: u8,
    /// Configured retry_cnt.
    pub retry_cnt: u8,
    /// Configured rnr_retry.
    pub rnr_retry: u8,
    /// ACK timeout attribute.
    pub timeout: u8,
    /// ORD.
    pub max_rd_atomic: u8,
    /// Retransmit timer.
    pub timer: Option<u64>,
    /// After an RNR NAK: no sending before this time.
    pub rnr_until: Option<u64>,
    /// The PSN of the last go-back-N, while packets from it are being resent.
    pub rewound_to: Option<Psn>,
    /// The first PSN no request had covered when that go-back-N began: past it, packets
    /// are sent for the first time and a loss among them is a new one.
    resend_end: Option<Psn>,
    /// The highest PSN the responder has acknowledged.
    pub acked: Option<Psn>,
    /// DCQCN pacing, once a CNP has arrived (congestion control on).
    pub limiter: Option<crate::engine::cc::RateLimiter>,
    /// Sending is held back by the pacer until this time.
    pub paced_until: Option<u64>,
    /// The loss window on unacknowledged packets, when the device has one.
    pub window: Option<crate::engine::cc::LossWindow>,
    /// The measured round trip, which stretches the retransmission timer on a busy path.
    pub rtt: super::rtt::RttEstimate,
    /// The highest PSN sent so far: a packet beyond it is sent for the first time.
    max_sent: Option<Psn>,
    caps: QpCaps,
}

impl Requester {
    /// An empty send side.
    pub fn new(caps: QpCaps) -> Self {
        Requester {
            wqes: VecDeque::new(),
            send_idx: 0,
            next_psn: Psn::new(0),
            retry_left: 7,
            rnr_left: 7,
            retry_cnt: 7,
            rnr_retry: 7,
            timeout: 14,
            max_rd_atomic: 1,
            timer: None,
            rnr_until: None,
            rewound_to: None,
            resend_end: None,
            acked: None,
            limiter: None,
            paced_until: None,
            window: None,
            rtt: super::rtt::RttEstimate::default(),
            max_sent: None,
            caps,
        }
    }

    /// Takes the send-side attributes of a modify-QP.
    pub fn apply(&mut self, a: &QpAttr) {
        if let Some(p) = a.sq_psn {
            self.next_psn = Psn::new(p);
        }
        if let Some(t) = a.timeout {
            self.timeout = t;
        }
        if let Some(r) = a.retry_cnt {
            (self.retry_cnt, self.retry_left) = (r, r);
        }
        if let Some(r) = a.rnr_retry {
            (self.rnr_retry, self.rnr_left) = (r, r);
        }
        if let Some(m) = a.max_rd_atomic {
            self.max_rd_atomic = m.max(1);
        }
    }

    /// Queues a work request (IBTA 11.4.1.1); local protection errors complete in error.
    /// The most scatter/gather elements a request may carry.
    pub fn max_sge(&self) -> usize {
        self.caps.max_sge
    }

    pub fn post(&mut self, wr: SendWr, pd: Pd, mrs: &MrTable, path: &Path) -> Result<(), VerbsError> {
        if self.wqes.len() >= self.caps.max_send_wr {
            return Err(VerbsError::QueueFull);
        }
        if wr.sgl.len() > self.caps.max_sge {
            return Err(VerbsError::InvalidRequest);
        }
        self.post_unchecked(wr, pd, mrs, path)
    }

    /// [`Requester::post`] without the send queue's limits: a TM-SRQ's own requests, at
    /// most one per tagged buffer it held, go on a send queue the application sized.
    pub(crate) fn post_unchecked(&mut self, wr: SendWr, pd: Pd, mrs: &MrTable, path: &Path) -> Result<(), VerbsError> {
        let mtu = path.mtu;
        if !op_allowed(&wr, path) {
            return Err(VerbsError::InvalidRequest);
        }
        let sgl_len: usize = wr.sgl.iter().map(|s| s.length as usize).sum();
        let (len, need) = match wr.op {
            SendOp::Read(_) => (sgl_len, Need::LocalWrite),
            SendOp::CompareSwap(..) | SendOp::FetchAdd(..) => (8, Need::LocalWrite),
            _ => (sgl_len, Need::LocalRead),
        };
        let mut done = None;
        let mut data = Vec::new();
        if let SendOp::AtomicWrite(_, bytes) = wr.op {
            // The 8 bytes come with the request (ibv_wr_atomic_write), not from an SGE.
            data = bytes.to_vec();
        } else if wr.op.is_read_or_atomic() {
            if check_sgl(&wr.sgl, pd, mrs, need).is_err() || (len == 8 && sgl_len < 8) {
                done = Some(WcStatus::LocProtErr);
            }
        } else if len > GATHER_MAX_BYTES && path.qp_type != QpType::Ud {
            // Copied at post, a 1 MiB message cost a fresh megabyte (mapped and faulted in)
            // and a second pass over its bytes.
            if check_sgl(&wr.sgl, pd, mrs, need).is_err() {
                done = Some(WcStatus::LocProtErr);
            }
        } else {
            match gather(&wr.sgl, pd, mrs) {
                Ok(d) => data = d,
                Err(()) => done = Some(WcStatus::LocProtErr),
            }
        }
        if path.qp_type == QpType::Ud && len > mtu {
            done = Some(WcStatus::LocLenErr);
        }
        let npkts = match wr.op {
            SendOp::BindMw(_) | SendOp::LocalInv(_) => 0,
            SendOp::CompareSwap(..) | SendOp::FetchAdd(..) | SendOp::AtomicWrite(..) => 1,
            _ => len.div_ceil(mtu).max(1) as u32,
        };
        self.wqes.push_back(SendWqe {
            wr,
            data,
            pd,
            len,
            first_psn: Psn::new(0),
            npkts,
            started: false,
            next_pkt: 0,
            done_pkts: 0,
            done,
            tm: None,
        });
        Ok(())
    }

    fn outstanding_rd_atomic(&self) -> usize {
        self.wqes.iter().filter(|w| w.started && w.done.is_none() && w.wr.op.is_read_or_atomic()).count()
    }

    fn inflight_psns(&self) -> u32 {
        match self.wqes.iter().find(|w| w.started) {
            Some(w) => w.first_psn.distance_to(self.next_psn).max(0) as u32,
            None => 0,
        }
    }

    /// Sends up to `budget` request packets; returns how many went out.
    pub fn pump(&mut self, path: &Path, ctx: &mut Ctx<'_>, budget: usize) -> usize {
        self.paced_until = None;
        if self.rnr_until.is_some_and(|t| ctx.now < t) {
            return 0;
        }
        self.rnr_until = None;
        let max_inflight = max_inflight_psns(path.mtu);
        if let Some(win) = self.window.as_mut() {
            win.cap_at(max_inflight);
        }
        let mut sent = 0;
        while sent < budget && self.send_idx < self.wqes.len() {
            let w = &mut self.wqes[self.send_idx];
            if w.wr.op.is_local() {
                // Done in send queue order, when the queue reaches it; nothing goes out.
                if w.done.is_none() {
                    w.done = Some(exec_local(&w.wr.op, w.pd, path.qpn, ctx.mrs));
                }
                self.send_idx += 1;
                continue;
            }
            if let Some(l) = self.limiter.as_ref().filter(|l| !l.may_send(ctx.now)) {
                self.paced_until = Some(l.next_send());
                break;
            }
            self.paced_until = None;
            if self.window.as_ref().is_some_and(|win| !win.allows(self.unacked_in_flight(), ctx.window_cap)) {
                break;
            }
            if !self.start_next(max_inflight) {
                break;
            }
            let ack_at_edge = self.ack_at_window_edge(ctx.window_cap);
            let w = &mut self.wqes[self.send_idx];
            if w.done.is_some() || w.next_pkt >= w.request_pkts() {
                self.send_idx += 1;
                continue;
            }
            let before = ctx.out.back().map(|t| t.packet.len());
            if !build_and_send(w, path, ctx, ack_at_edge) {
                // Its memory went between the post and this packet (IBTA 10.6.3.5).
                w.done = Some(WcStatus::LocProtErr);
                continue;
            }
            if !w.wr.op.is_read_or_atomic() {
                let psn = w.first_psn.add(w.next_pkt);
                if self.max_sent.is_none_or(|m| m.serial_cmp(psn).is_lt()) {
                    self.max_sent = Some(psn);
                    self.rtt.sent(psn, ctx.now);
                }
            }
            if let Some(l) = self.limiter.as_mut() {
                let bytes = ctx.out.back().map_or(0, |t| t.packet.len());
                l.sent(ctx.now, bytes.max(before.unwrap_or(0)));
            }
            let w = &mut self.wqes[self.send_idx];
            w.next_pkt += 1;
            sent += 1;
            // Unacknowledged transports are done once the last packet is out (IBTA 9.8).
            if path.qp_type != QpType::Rc && w.next_pkt == w.npkts {
                w.done = Some(WcStatus::Success);
            }
        }
        if path.qp_type != QpType::Rc {
            return sent;
        }
        // Whatever is outstanding is covered by the timer (IBTA 9.7.6.1.3), whether it was
        // sent just now or before an RNR wait.
        if self.awaiting_response() && self.timer.is_none() {
            self.timer = self.retransmit_deadline(ctx.now);
        }
        sent
    }

    /// Assigns PSNs to the WQE at `send_idx` if it has none; false when it must wait.
    /// Called for every packet: the send queue is scanned (for the ORD) only when a READ
    /// or atomic starts, never per packet of a message already under way.
    fn start_next(&mut self, max_inflight: u32) -> bool {
        let w = &self.wqes[self.send_idx];
        if w.started || w.done.is_some() {
            return true;
        }
        if w.wr.op.is_read_or_atomic() && self.outstanding_rd_atomic() >= usize::from(self.max_rd_atomic) {
            return false;
        }
        let inflight = self.inflight_psns();
        let w = &mut self.wqes[self.send_idx];
        if inflight + w.npkts > max_inflight && inflight > 0 {
            return false;
        }
        w.started = true;
        w.first_psn = self.next_psn;
        self.next_psn = self.next_psn.add(w.npkts);
        true
    }

    /// How long the retransmit timer runs: the Local ACK Timeout, stretched by the
    /// measured round trip ([`super::rtt`]); `None` when the timeout is infinite.
    pub fn retransmit_timeout_ns(&self) -> Option<u64> {
        super::ack_timeout_ns(self.timeout).map(|base| self.rtt.timeout_ns(base))
    }

    /// When a retransmit timer started at `now` expires, on the grid
    /// [`super::rtt::timer_deadline`] puts it.
    pub fn retransmit_deadline(&self, now: u64) -> Option<u64> {
        self.retransmit_timeout_ns().map(|t| super::rtt::timer_deadline(now, t))
    }

    /// Go-back-N (IBTA 9.7.4.1.5): resend from `psn`, which lies in a started WQE.
    pub fn rewind(&mut self, psn: Psn) {
        let _ = self.rtt.resent();
        let Some(i) =
            self.wqes.iter().position(|w| w.started && w.done.is_none() && psn.in_window(w.first_psn, w.npkts))
        else {
            return;
        };
        // Within a SEND/WRITE, resume after what the responder already acknowledged
        // (IBTA 9.7.4.1.5); a READ or atomic needs its responses whatever was ACKed.
        let w = &self.wqes[i];
        let psn = match self.acked {
            Some(a)
                if !w.wr.op.is_read_or_atomic()
                    && a.serial_cmp(psn).is_ge()
                    && a.next().in_window(w.first_psn, w.npkts) =>
            {
                a.next()
            }
            _ => psn,
        };
        for (j, w) in self.wqes.iter_mut().enumerate().skip(i) {
            if !w.started || w.done.is_some() {
                continue;
            }
            w.next_pkt =
                if j == i && !w.wr.op.is_read_or_atomic() { w.first_psn.distance_to(psn).max(0) as u32 } else { 0 };
        }
        self.resend_end = self.sent_end();
        self.send_idx = i;
        self.rewound_to = Some(psn);
    }

    /// The PSN after the last one a request sent so far covers (a READ's request covers
    /// its responses' PSNs).
    fn sent_end(&self) -> Option<Psn> {
        let m = self.max_sent?;
        let w = self.wqes.iter().rev().find(|w| w.started && m.in_window(w.first_psn, w.npkts));
        Some(match w {
            Some(w) if w.wr.op.is_read_or_atomic() => w.end_psn(),
            _ => m.next(),
        })
    }

    /// With a loss window, the responder must be asked to acknowledge before the window
    /// closes, and twice per window to keep ACKs flowing (IBTA 9.7.2 leaves AckReq to the
    /// requester): true when the next packet is such a one.
    fn ack_at_window_edge(&self, cap: u32) -> bool {
        let Some(win) = self.window.as_ref() else { return false };
        let packets = win.packets.min(cap).max(1);
        let in_flight = self.unacked_in_flight() + 1;
        in_flight >= packets || (packets >= 8 && in_flight.is_multiple_of(packets / 2))
    }

    /// True while requests are posted and not yet retired (the QP holds part of the
    /// device's loss-window budget).
    pub fn has_outstanding(&self) -> bool {
        !self.wqes.is_empty()
    }

    /// PSNs sent and not yet acknowledged (a READ counts its whole response once asked).
    fn unacked_in_flight(&self) -> u32 {
        let Some(first) = self.wqes.iter().find(|w| w.started && w.done.is_none()) else { return 0 };
        let mut base = first.first_psn.add(first.done_pkts);
        if let Some(a) = self.acked.filter(|a| base.serial_cmp(*a).is_le()) {
            base = a.next();
        }
        let cursor = match self.wqes.get(self.send_idx) {
            Some(w) if w.started && w.wr.op.is_read_or_atomic() && w.next_pkt > 0 => w.end_psn(),
            Some(w) if w.started => w.first_psn.add(w.next_pkt),
            _ => self.next_psn,
        };
        base.distance_to(cursor).max(0) as u32
    }

    /// The PSN of the next packet the requester will put on the wire.
    pub fn send_cursor(&self) -> Psn {
        match self.wqes.get(self.send_idx) {
            Some(w) if w.started && !w.wr.op.is_read_or_atomic() => w.first_psn.add(w.next_pkt),
            Some(w) if w.started => w.first_psn.add(w.done_pkts),
            _ => self.next_psn,
        }
    }

    /// True when a go-back-N to `psn` would only repeat one already under way: `psn` lies
    /// between the last rewind point and what has been resent since, and had been sent
    /// before that rewind. Packets sent before that rewind, still in flight, make the
    /// responder NAK again; following each such NAK would resend the window over and over.
    pub fn already_resending(&self, psn: Psn) -> bool {
        let before_end = self.resend_end.is_some_and(|e| psn.serial_cmp(e).is_lt());
        match self.rewound_to {
            Some(r) => r.serial_cmp(psn).is_le() && psn.serial_cmp(self.send_cursor()).is_lt() && before_end,
            None => false,
        }
    }

    /// Flushes every request (IBTA 10.3.1.7): the completions, each with the CQ it goes
    /// to when that is not the send CQ (a TM-SRQ's requests).
    pub fn flush(&mut self, qpn: u32) -> Vec<(Option<u32>, Wc)> {
        let out = self.wqes.drain(..).filter_map(|w| super::tagged::flushed(&w, qpn)).collect();
        self.send_idx = 0;
        self.timer = None;
        self.rnr_until = None;
        out
    }

    /// The next deadline: the retransmit timer or the end of an RNR wait.
    pub fn deadline(&self) -> Option<u64> {
        let increase = self.limiter.as_ref().and_then(|l| l.next_increase());
        [self.timer, self.rnr_until, self.paced_until, increase].into_iter().flatten().min()
    }
}

/// True if the QP's transport has `wr`'s operation: IBTA 9.8.1 / 9.8.4, UC has no READ or
/// atomics and UD sends single-packet SENDs only; XRC has no ATOMIC WRITE opcode.
pub fn op_allowed(wr: &SendWr, path: &Path) -> bool {
    match path.qp_type {
        QpType::Rc => !(path.xrc && matches!(wr.op, SendOp::AtomicWrite(..))),
        QpType::Uc => !wr.op.is_read_or_atomic() && !matches!(wr.op, SendOp::AtomicWrite(..)),
        QpType::Ud => wr.ud.is_some() && matches!(wr.op, SendOp::Send | SendOp::SendImm(_)),
        // The device sends a raw QP's frames when they are posted (Device::post_send).
        QpType::RawPacket => false,
    }
}

/// The completion of a WQE.
pub fn wc(w: &SendWqe, qpn: u32, status: WcStatus) -> Wc {
    Wc::new(w.wr.wr_id, status, w.wc_opcode(), qpn, w.len as u32)
}

/// A bind (IBTA 10.6.7.2.2) or local invalidation (10.6.7.2.4) of QP `qpn` in `pd`.
fn exec_local(op: &SendOp, pd: Pd, qpn: u32, mrs: &mut MrTable) -> WcStatus {
    match op {
        SendOp::BindMw(b) => match mrs.bind_window(b, pd, qpn) {
            Ok(()) => WcStatus::Success,
            Err(_) => WcStatus::MwBindErr,
        },
        SendOp::LocalInv(key) if mrs.is_window(*key) => match mrs.invalidate_window(*key, pd, qpn) {
            Ok(()) => WcStatus::Success,
            Err(_) => WcStatus::LocProtErr,
        },
        SendOp::LocalInv(key) if mrs.invalidate(*key) => WcStatus::Success,
        _ => WcStatus::LocProtErr,
    }
}

fn check_sgl(sgl: &[Sge], pd: Pd, mrs: &MrTable, need: Need) -> Result<(), ()> {
    for s in sgl {
        mrs.resolve(s.lkey, pd, s.addr, s.length as usize, need).map_err(|_| ())?;
    }
    Ok(())
}

pub(crate) fn gather(sgl: &[Sge], pd: Pd, mrs: &MrTable) -> Result<Vec<u8>, ()> {
    let mut data = Vec::with_capacity(sgl.iter().map(|s| s.length as usize).sum());
    for s in sgl {
        let (mem, off) = mrs.resolve(s.lkey, pd, s.addr, s.length as usize, Need::LocalRead).map_err(|_| ())?;
        let start = data.len();
        data.resize(start + s.length as usize, 0);
        if !mem.read(off, &mut data[start..]) {
            return Err(());
        }
    }
    Ok(data)
}

/// Opcode for packet `k` of `n` of a SEND or WRITE (IBTA 9.2.1, Table 38).
fn data_opcode(op: SendOp, k: u32, n: u32) -> u8 {
    let last = k + 1 == n;
    let (first_c, middle, last_c, only) = match op {
        SendOp::Send => (0x00, 0x01, 0x02, 0x04),
        SendOp::SendImm(_) => (0x00, 0x01, 0x03, 0x05),
        SendOp::SendInv(_) => (0x00, 0x01, 0x16, 0x17),
        SendOp::Write(_) => (0x06, 0x07, 0x08, 0x0a),
        _ => (0x06, 0x07, 0x09, 0x0b),
    };
    match (n, k == 0, last) {
        (1, _, _) => only,
        (_, true, _) => first_c,
        (_, _, true) => last_c,
        _ => middle,
    }
}

/// Builds and queues the next packet of `w`; false when its memory cannot be read.
fn build_and_send(w: &SendWqe, path: &Path, ctx: &mut Ctx<'_>, ack_req: bool) -> bool {
    if let (QpType::Ud, Some(dest)) = (path.qp_type, w.wr.ud) {
        send_ud(w, dest, path, ctx);
        return true;
    }
    match w.wr.op {
        SendOp::Read(remote) => {
            // A resumed READ asks only for what has not arrived (IBTA 9.7.4.1.5).
            let skip = w.done_pkts as usize * path.mtu;
            let reth = RethRepr { va: remote.addr + skip as u64, rkey: remote.rkey, dma_len: (w.len - skip) as u32 };
            let mut bth = path.bth(0x0c, w.first_psn.add(w.done_pkts), 0);
            bth.ack_req = true;
            path.send(ctx, &xrc_request(bare(bth, Some(reth), None), path, w));
        }
        SendOp::CompareSwap(remote, compare, swap) => send_atomic(path, ctx, w, 0x13, remote, swap, compare),
        SendOp::FetchAdd(remote, add) => send_atomic(path, ctx, w, 0x14, remote, add, 0),
        SendOp::AtomicWrite(remote, bytes) => {
            // IBTA vol.1 1.5 (Memory Placement Extensions): RETH and the 8 bytes.
            let mut bth = path.bth(0x1d, w.first_psn, 8);
            bth.ack_req = true;
            let mut repr = bare(bth, Some(RethRepr { va: remote.addr, rkey: remote.rkey, dma_len: 8 }), None);
            repr.payload = &bytes;
            path.send(ctx, &xrc_request(repr, path, w));
        }
        op => return send_data(w, op, path, ctx, ack_req),
    }
    true
}

fn send_atomic(
    path: &Path,
    ctx: &mut Ctx<'_>,
    w: &SendWqe,
    opcode: u8,
    r: crate::engine::verbs::Remote,
    swap_add: u64,
    compare: u64,
) {
    let mut bth = path.bth(opcode, w.first_psn, 0);
    bth.ack_req = true;
    let mut repr = bare(bth, None, None);
    repr.atomic_eth = Some(AtomicEthRepr { va: r.addr, rkey: r.rkey, swap_add, compare });
    path.send(ctx, &xrc_request(repr, path, w));
}

/// On an XRC initiator, `repr` with the XRCETH naming the target's SRQ the request is for
/// (IBTA 9.3.6); otherwise `repr` as it is.
fn xrc_request<'a>(mut repr: RoceRepr<'a>, path: &Path, w: &SendWqe) -> RoceRepr<'a> {
    if path.xrc {
        repr.xrceth = Some(XrcEthRepr { srqn: w.wr.xrc_srqn });
    }
    repr
}

fn send_data(w: &SendWqe, op: SendOp, path: &Path, ctx: &mut Ctx<'_>, ack_req: bool) -> bool {
    let (k, n) = (w.next_pkt, w.npkts);
    let start = (k as usize * path.mtu).min(w.len);
    let end = (start + path.mtu).min(w.len);
    let gathered = w.data.len() == w.len;
    // Not gathered: a placeholder of the payload's length, read in place below.
    let payload = if gathered { &w.data[start..end] } else { super::placeholder(end - start) };
    // UC opcodes are the RC ones with the transport bits 001 (IBTA 9.2.1, Table 38).
    let uc = if path.qp_type == QpType::Uc { 0x20 } else { 0 };
    let opcode = data_opcode(op, k, n) | uc;
    let mut bth = path.bth(opcode, w.first_psn.add(k), payload.len());
    let last = k + 1 == n;
    bth.ack_req = ack_req || last || k % ACK_REQ_EVERY == ACK_REQ_EVERY - 1;
    bth.solicited = last && w.wr.solicited;
    let reth = match op {
        SendOp::Write(r) | SendOp::WriteImm(r, _) if k == 0 => {
            Some(RethRepr { va: r.addr, rkey: r.rkey, dma_len: w.len as u32 })
        }
        _ => None,
    };
    let mut repr = bare(bth, reth, None);
    repr.payload = payload;
    if last {
        match op {
            SendOp::SendImm(imm) | SendOp::WriteImm(_, imm) => repr.immdt = Some(ImmDtRepr { imm }),
            SendOp::SendInv(rkey) => repr.ieth = Some(IethRepr { rkey }),
            _ => {}
        }
    }
    let repr = xrc_request(repr, path, w);
    if gathered {
        path.send(ctx, &repr);
        return true;
    }
    path.send_filled(ctx, &repr, |mrs, out| read_sgl(&w.wr.sgl, w.pd, mrs, start, out))
}

/// Reads bytes `start..start + out.len()` of the message `sgl` describes into `out`.
fn read_sgl(sgl: &[Sge], pd: Pd, mrs: &MrTable, start: usize, out: &mut [u8]) -> bool {
    mrs.for_sgl_range(sgl, pd, (start, out.len()), Need::LocalRead, |mem, off, at, n| {
        mem.read(off, &mut out[at..at + n])
    })
}

/// A UD SEND (IBTA 9.8.4): one packet with a DETH naming this QP and the Q_Key.
fn send_ud(w: &SendWqe, dest: crate::engine::verbs::UdDest, path: &Path, ctx: &mut Ctx<'_>) {
    let imm = if let SendOp::SendImm(i) = w.wr.op { Some(ImmDtRepr { imm: i }) } else { None };
    let mut bth = path.bth(if imm.is_some() { 0x65 } else { 0x64 }, w.first_psn, w.data.len());
    bth.dest_qp = dest.qpn;
    bth.solicited = w.wr.solicited;
    // IBTA 10.2.5: a Q_Key with the high bit set means the QP's own.
    let qkey = if dest.qkey & 0x8000_0000 != 0 { path.qkey } else { dest.qkey };
    let mut repr = bare(bth, None, None);
    repr.deth = Some(DethRepr { qkey, src_qp: path.qpn });
    repr.immdt = imm;
    repr.payload = &w.data;
    path.send_to(ctx, dest.gid, &repr);
}

/// A packet with only a BTH and optionally a RETH.
pub fn bare(
    bth: crate::proto::roce::BthRepr,
    reth: Option<RethRepr>,
    aeth: Option<crate::proto::roce::ext::AethRepr>,
) -> RoceRepr<'static> {
    RoceRepr {
        bth,
        deth: None,
        xrceth: None,
        feth: None,
        reth,
        atomic_eth: None,
        aeth,
        atomic_ack_eth: None,
        immdt: None,
        ieth: None,
        payload: &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_flight_limit_is_a_mebibyte_whatever_the_path_mtu() {
        assert_eq!(max_inflight_psns(4096), 256);
        assert_eq!(max_inflight_psns(1024), 1024);
        assert_eq!(max_inflight_psns(256), MAX_INFLIGHT_PSNS, "never past the packet limit");
        assert_eq!(max_inflight_psns(usize::MAX), 1);
    }
}
