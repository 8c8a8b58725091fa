//! An iWARP queue pair on one established MPA connection, sans-I/O: RDMAP (RFC 5040) over
//! DDP (RFC 5041) over MPA FPDUs (RFC 5044). Stream bytes go in ([`IwarpQp::on_stream`]),
//! stream bytes and completions come out. TCP is reliable, so there is no retransmission:
//! a Send or Write completes once the transport says its last byte went into the TCP
//! socket ([`IwarpQp::on_transmitted`]), as siw does, so a full socket holds posting back;
//! a Read completes when its last response segment is placed.
//! Every error is a Terminate with the layer, type and code of RFC 5040 §7 / RFC 5041 §7
//! and the offending headers copied, then the QP goes to ERR with flushed completions.

use super::deframer::{CrcCheck, Deframer};
use super::framer::Framer;
use super::setup::{Negotiated, RtrKind};
use super::txqueue::{MemSpan, Output};
use crate::engine::mem::{MemError, MrTable, Need, Pd, SharedMem};
use crate::engine::qp::responder::RecvWqe;
use crate::engine::srq::Srq;
use crate::engine::verbs::{QpState, RecvWr, SendOp, SendWr, VerbsError, Wc, WcOpcode, WcStatus};
use crate::proto::iwarp::ddp::{DdpBuffer, DdpRepr, VERSION as DDP_VERSION};
use crate::proto::iwarp::rdmap::{
    Body, Control, Layer, MessageRepr, Opcode, ReadRequestRepr, TerminateRepr, QN_READ_REQUEST, QN_SEND, QN_TERMINATE,
    VERSION as RDMAP_VERSION,
};
use std::collections::VecDeque;
use std::sync::Arc;

/// The STag a ready-to-receive zero-length Write or Read carries (siw's choice, since some
/// hardware rejects 0); any is accepted.
const RTR_STAG: u32 = 1;

/// Read Response bytes [`IwarpQp::take_output`] produces per call at most: a peer's Read
/// Requests turn into output only as fast as the transport takes it.
pub const OUTPUT_BUDGET: usize = 1 << 20;
/// Bytes of a Read's source copied at a time while its response is produced.
const READ_CHUNK: usize = 64 * 1024;
/// FPDU payloads below this are copied into the stream rather than spliced in from
/// registered memory: the kernel's cost per iovec outweighs the copy for small ones.
/// Measured with `write-bw --transport iwarp` (MB/s, splice against copy): on loopback
/// (one FPDU per message) 1 KiB messages 1,703 / 2,425, 4 KiB about even, 8 KiB 5,531-6,078
/// / 4,795-4,905, 16 KiB 7,093-7,476 / 4,493-5,028; on a veth of MTU 1500 (FPDUs of 1.4 KiB)
/// 64 KiB messages 2,800-2,901 / 3,267-3,401. So Ethernet-sized FPDUs are copied; jumbo
/// frames' and loopback's are spliced.
const SPLICE_MIN_BYTES: usize = 8192;

/// A send-queue entry until it completes, in posting order.
#[derive(Debug)]
struct SqEntry {
    wr_id: u64,
    opcode: WcOpcode,
    len: u32,
    signaled: bool,
    done: Option<WcStatus>,
    /// For a Read: where its response must land, and how much of it has.
    read: Option<ReadSink>,
    /// Output stream offset after the entry's last byte, until that byte is transmitted.
    tx_end: Option<u64>,
    /// The QP's own (the RTR's Read): never completes to the application, even flushed.
    internal: bool,
    /// What of the request is still to be framed (nothing once it is all in the stream).
    unframed: Option<Unframed>,
}

/// A posted request not yet all in the output stream. Requests are framed in posting
/// order as the transport has room ([`IwarpQp::poll_output_into`]), their payload read
/// from registered memory FPDU by FPDU: a connection buffers a bounded amount however
/// much is posted.
#[derive(Debug)]
struct Unframed {
    kind: UnframedKind,
    sgl: Vec<crate::engine::verbs::Sge>,
    len: usize,
    /// Payload octets framed so far.
    off: usize,
}

#[derive(Debug)]
enum UnframedKind {
    Write {
        stag: u32,
        to: u64,
    },
    /// A Send of `opcode`; its MSN is taken when its first segment is framed.
    Send {
        opcode: Opcode,
        inv: u32,
        msn: Option<u32>,
    },
    Read(ReadRequestRepr),
}

/// The Data Sink of an outstanding Read (RFC 5040 §5.2): its Read Response must carry
/// this STag and tagged offsets from `to`, in order, `len` bytes in all.
#[derive(Debug, Clone, Copy)]
struct ReadSink {
    stag: u32,
    to: u64,
    len: u32,
    placed: u32,
}

/// An inbound Read being answered (one of IRD): its source, already checked.
#[derive(Debug)]
struct ReadJob {
    sink_stag: u32,
    sink_to: u64,
    mem: Arc<SharedMem>,
    offset: usize,
    remaining: usize,
}

/// A receive being filled by the current Send message.
#[derive(Debug)]
struct Filling {
    wr: RecvWr,
    capacity: usize,
    /// Bytes placed so far: the next segment's MO must be this (in-order placement).
    received: usize,
}

/// Why the stream stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminated {
    /// Sent by this side (true) or received from the peer.
    pub local: bool,
    /// The layer, type and code, in words.
    pub reason: String,
}

/// One iWARP QP on one MPA connection.
#[derive(Debug)]
pub struct IwarpQp {
    qpn: u32,
    pd: Pd,
    state: QpState,
    framer: Framer,
    deframer: Deframer,
    mulpdu: usize,
    out: Output,
    sq: VecDeque<SqEntry>,
    waiting: VecDeque<SendWr>,
    rq: VecDeque<RecvWr>,
    filling: Option<Filling>,
    next_msn: [u32; 3],
    expect_msn: [u32; 2],
    ord: usize,
    reads_out: usize,
    /// IRD: inbound Reads answered at once at most (RFC 5040 §5.3, RFC 6581).
    ird: usize,
    reads_in: VecDeque<ReadJob>,
    rtr_expected: bool,
    /// The first FPDU (the initiator's RTR, if any, else the first request) is held
    /// until this time (ns), and everything posted behind it.
    hold: Option<(Option<RtrKind>, u64)>,
    completions: VecDeque<Wc>,
    /// A Terminate was sent or received and the application has not been told yet.
    fatal_unreported: bool,
    /// The QP entered ERR and the device has not noted it yet.
    errored_unreported: bool,
    terminated: Option<Terminated>,
    max_send_wr: usize,
    max_recv_wr: usize,
}

impl IwarpQp {
    /// A QP in RTS on a connection set up with `neg`, sending FPDUs of at most `mss`
    /// octets. The initiator of a peer-to-peer connection sends its RTR first; an
    /// initiator sends nothing before `first_at_ns` (at once if that is `None`).
    pub fn new(qpn: u32, pd: Pd, neg: &Negotiated, initiator: bool, mss: usize, first_at_ns: Option<u64>) -> IwarpQp {
        // FPDU overhead: length, pad, CRC and, with markers, one per 512 octets of the
        // segment (RFC 5044's MULPDU, EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)). A
        // fixed 3 markers held only for Ethernet's MSS: on loopback's 64 KiB one an FPDU
        // grew past 65,535 wire octets and its last markers' 16-bit FPDUPTR wrapped.
        let overhead = if neg.markers_tx { 6 + 4 * mss.div_ceil(512) + mss % 4 } else { 2 + 3 + 4 };
        let mut qp = IwarpQp {
            qpn,
            pd,
            state: QpState::Rts,
            framer: Framer::new(neg.markers_tx, neg.crc),
            deframer: Deframer::new(neg.markers_rx, neg.crc),
            mulpdu: mss.saturating_sub(overhead).max(64),
            out: Output::default(),
            sq: VecDeque::new(),
            waiting: VecDeque::new(),
            rq: VecDeque::new(),
            filling: None,
            next_msn: [1; 3],
            expect_msn: [1; 2],
            ord: usize::from(neg.ord.max(1)),
            reads_out: 0,
            ird: usize::from(neg.ird),
            reads_in: VecDeque::new(),
            rtr_expected: !initiator && neg.rtr.is_some(),
            hold: None,
            completions: VecDeque::new(),
            terminated: None,
            fatal_unreported: false,
            errored_unreported: false,
            max_send_wr: usize::MAX,
            max_recv_wr: usize::MAX,
        };
        let rtr = initiator.then_some(neg.rtr).flatten();
        // The responder holds its first FPDU too: Linux siw 6.1 as initiator fails the
        // connection (CONNECT_ERROR, -EINVAL to its application) when a Send lands right
        // behind the Reply, before it has moved its QP to RTS (ucmatose served by softrdma,
        // 2 runs of the interop matrix in 2).
        match first_at_ns {
            Some(at) => qp.hold = Some((rtr, at)),
            None => {
                if let Some(kind) = rtr {
                    qp.send_rtr(kind);
                }
            }
        }
        qp
    }

    /// When the held first FPDU goes (ns), if one is held.
    pub fn hold_deadline(&self) -> Option<u64> {
        self.hold.map(|(_, at)| at)
    }

    /// Ends the hold if it is due at `now_ns`: the RTR, then what was posted behind it.
    pub fn release_hold(&mut self, now_ns: u64, mrs: &MrTable) {
        match self.hold {
            Some((rtr, at)) if at <= now_ns => {
                self.hold = None;
                if let (Some(kind), QpState::Rts) = (rtr, self.state) {
                    self.send_rtr(kind);
                }
                self.start_waiting(mrs);
            }
            _ => {}
        }
    }

    /// Bounds the send and receive queues (`ibv_qp_cap`): posting beyond is `QueueFull`.
    pub fn set_queue_depths(&mut self, max_send_wr: usize, max_recv_wr: usize) {
        self.max_send_wr = max_send_wr.max(1);
        self.max_recv_wr = max_recv_wr.max(1);
    }

    /// The stream offset just after the last byte produced so far.
    pub fn output_offset(&self) -> u64 {
        self.framer.offset()
    }

    /// The transport has put the output stream up to `offset` into the TCP socket: Sends
    /// and Writes whose last byte is before it complete.
    pub fn on_transmitted(&mut self, offset: u64) {
        for e in self.sq.iter_mut() {
            if e.tx_end.is_some_and(|end| end <= offset) {
                e.tx_end = None;
                e.done = Some(WcStatus::Success);
            }
        }
        self.retire();
    }

    /// The TCP stream ended (closed or reset by the peer, or failed): the QP goes to ERR.
    pub fn on_stream_closed(&mut self, why: &str) {
        if self.state != QpState::Err {
            self.terminated = Some(Terminated { local: false, reason: why.to_string() });
            self.enter_error();
        }
    }

    /// The QP's state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// True once after a Terminate took the QP to ERR: its asynchronous event is due.
    pub fn take_fatal(&mut self) -> bool {
        std::mem::take(&mut self.fatal_unreported)
    }

    /// True once after the QP entered ERR, for whatever reason.
    pub fn take_errored(&mut self) -> bool {
        std::mem::take(&mut self.errored_unreported)
    }

    /// Why the stream stopped, if it did.
    pub fn terminated(&self) -> Option<&Terminated> {
        self.terminated.as_ref()
    }

    /// Bytes for the TCP stream, about [`OUTPUT_BUDGET`] of them; call again while
    /// [`IwarpQp::has_output`].
    pub fn take_output(&mut self, mrs: &MrTable) -> Vec<u8> {
        self.poll_output(OUTPUT_BUDGET, mrs)
    }

    /// Bytes for the TCP stream: posted requests in order, then Read Responses, while
    /// fewer than `budget` octets are out (and what is framed already, such as a
    /// Terminate), so that neither the application's posts nor a peer's Reads outrun the
    /// transport.
    pub fn poll_output(&mut self, budget: usize, mrs: &MrTable) -> Vec<u8> {
        self.poll_output_into(budget, Vec::new(), mrs).to_vec()
    }

    /// As [`IwarpQp::poll_output`], payloads left in registered memory as spans where the
    /// framing allows ([`Framer::splices`]); `spare` (empty, a written buffer given back)
    /// becomes the buffer the next posts are framed into, so that large messages do not map
    /// and fault in fresh pages for every buffer.
    pub fn poll_output_into(&mut self, budget: usize, spare: Vec<u8>, mrs: &MrTable) -> Output {
        debug_assert!(spare.is_empty());
        self.frame_requests(budget, mrs);
        while self.out.len() < budget && self.state != QpState::Err {
            let Some(job) = self.reads_in.front_mut() else { break };
            let room = budget - self.out.len();
            let n = job.remaining.min(room.clamp(self.mulpdu, READ_CHUNK.max(self.mulpdu)));
            let mem = job.mem.clone();
            let (to, offset) = (job.sink_to, job.offset);
            let (stag, done) = (job.sink_stag, n == job.remaining);
            job.offset += n;
            job.remaining -= n;
            job.sink_to = job.sink_to.wrapping_add(n as u64);
            self.send_tagged_part(Opcode::ReadResponse, stag, to, &Payload::Mem { mem: &mem, offset, len: n }, done);
            if done {
                self.reads_in.pop_front();
            }
        }
        std::mem::replace(&mut self.out, Output::from(spare))
    }

    /// True while output waits: posted frames, or Read Responses not yet produced.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || (self.state != QpState::Err && (!self.reads_in.is_empty() || self.has_unframed()))
    }

    /// The next completion.
    pub fn poll_completion(&mut self) -> Option<Wc> {
        self.completions.pop_front()
    }

    /// True when a completion, an error or a fatal event waits to be taken.
    pub fn has_news(&self) -> bool {
        !self.completions.is_empty() || self.errored_unreported || self.fatal_unreported
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        if self.state == QpState::Err {
            self.completions.push_back(Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn, 0));
            return Ok(());
        }
        if self.rq.len() >= self.max_recv_wr {
            return Err(VerbsError::QueueFull);
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// `ibv_post_send`: Send (with solicited event and invalidate), Write, Read.
    pub fn post_send(&mut self, wr: SendWr, mrs: &MrTable) -> Result<(), VerbsError> {
        if !matches!(self.state, QpState::Rts | QpState::Err) {
            return Err(VerbsError::InvalidRequest);
        }
        let rfc7306 =
            matches!(wr.op, SendOp::SendImm(_) | SendOp::WriteImm(..) | SendOp::CompareSwap(..) | SendOp::FetchAdd(..));
        if rfc7306 || matches!(wr.op, SendOp::AtomicWrite(..)) {
            // Immediate data and atomics are RFC 7306, not yet spoken; iWARP has no
            // ATOMIC WRITE (an InfiniBand memory placement extension).
            return Err(VerbsError::InvalidRequest);
        }
        if wr.op.is_local() {
            // No memory windows on iWARP (siw has none either).
            return Err(VerbsError::InvalidRequest);
        }
        let is_read = matches!(wr.op, SendOp::Read(_));
        if is_read && wr.sgl.len() != 1 {
            // An iWARP Read places into one tagged buffer (RFC 5040 §5.2).
            return Err(VerbsError::InvalidRequest);
        }
        if self.state == QpState::Err {
            // Taken and flushed at once (IBTA vol. 1 10.3.1.7, as siw does): a drain
            // (`ib_drain_sq`) posts one there and waits for its completion.
            self.completions.push_back(Wc::new(wr.wr_id, WcStatus::WrFlushErr, wr.op.wc_opcode(), self.qpn, 0));
            return Ok(());
        }
        if self.sq.len() + self.waiting.len() >= self.max_send_wr {
            return Err(VerbsError::QueueFull);
        }
        // Requests go on the wire in posting order: behind a Read that waits for the ORD,
        // and, on the responder of a peer-to-peer connection, until the initiator's RTR
        // has arrived (RFC 6581 §6: the responder must not send before it).
        let rtr_first = self.rtr_expected || self.hold.is_some();
        if rtr_first || !self.waiting.is_empty() || (is_read && self.reads_out >= self.ord) {
            self.waiting.push_back(wr);
            return Ok(());
        }
        self.start(wr, mrs);
        Ok(())
    }

    fn start(&mut self, wr: SendWr, mrs: &MrTable) {
        let len: u32 = wr.sgl.iter().map(|s| s.length).sum();
        let opcode = wr.op.wc_opcode();
        let is_read = matches!(wr.op, SendOp::Read(_));
        let read = is_read.then(|| ReadSink { stag: wr.sgl[0].lkey, to: wr.sgl[0].addr, len, placed: 0 });
        let (wr_id, signaled) = (wr.wr_id, wr.signaled);
        let mut entry =
            SqEntry { wr_id, opcode, len, signaled, done: None, read, tx_end: None, internal: false, unframed: None };
        let need = if is_read { Need::LocalWrite } else { Need::LocalRead };
        if !sgl_permits(&wr, self.pd, mrs, need) {
            entry.done = Some(WcStatus::LocProtErr);
        } else {
            let kind = match wr.op {
                SendOp::Write(r) => UnframedKind::Write { stag: r.rkey, to: r.addr },
                SendOp::Read(r) => {
                    let s = wr.sgl[0];
                    self.reads_out += 1;
                    UnframedKind::Read(ReadRequestRepr {
                        sink_stag: s.lkey,
                        sink_to: s.addr,
                        size: len,
                        src_stag: r.rkey,
                        src_to: r.addr,
                    })
                }
                op => {
                    let (opcode, inv) = send_opcode(op, wr.solicited);
                    UnframedKind::Send { opcode, inv, msn: None }
                }
            };
            entry.unframed = Some(Unframed { kind, sgl: wr.sgl, len: len as usize, off: 0 });
        }
        self.sq.push_back(entry);
        self.retire();
    }

    /// True while a posted request is not all framed.
    fn has_unframed(&self) -> bool {
        self.sq.iter().any(|e| e.unframed.is_some())
    }

    /// Frames posted requests in order while fewer than `budget` octets are out (at least
    /// one FPDU): a Send or Write segment by segment, a Read Request whole.
    fn frame_requests(&mut self, budget: usize, mrs: &MrTable) {
        while self.state == QpState::Rts && self.out.len() < budget {
            let Some(i) = self.sq.iter().position(|e| e.unframed.is_some()) else { return };
            let Some(mut u) = self.sq[i].unframed.take() else { return };
            let done = self.frame_some(&mut u, budget, mrs);
            if self.state != QpState::Rts {
                // Framing failed (the request's memory went since the post: deregistered,
                // or on demand and unmapped): the QP entered ERR and flushed its send
                // queue, entry `i` with it.
                return;
            }
            if !done {
                self.sq[i].unframed = Some(u);
                return;
            }
            if !matches!(u.kind, UnframedKind::Read(_)) {
                self.sq[i].tx_end = Some(self.framer.offset());
            }
        }
    }

    /// Frames FPDUs of `u` until it is all out (true) or `budget` octets are.
    fn frame_some(&mut self, u: &mut Unframed, budget: usize, mrs: &MrTable) -> bool {
        let payload = Payload::Sgl { sgl: &u.sgl, pd: self.pd, mrs, len: u.len };
        loop {
            let last = match &mut u.kind {
                UnframedKind::Read(rr) => {
                    self.send_read_request(*rr);
                    return true;
                }
                UnframedKind::Write { stag, to } => {
                    let n = (self.mulpdu - crate::proto::iwarp::ddp::TAGGED_LEN).min(u.len - u.off);
                    let last = u.off + n == u.len;
                    let buffer = DdpBuffer::Tagged { stag: *stag, to: to.wrapping_add(u.off as u64) };
                    let ddp = DdpRepr { last, version: DDP_VERSION, rsvd_ulp: 0, buffer };
                    self.emit_data(ddp, Opcode::Write, &payload, u.off, n);
                    u.off += n;
                    last
                }
                UnframedKind::Send { opcode, inv, msn } => {
                    let msn = *msn.get_or_insert_with(|| self.take_msn(QN_SEND));
                    let n = (self.mulpdu - crate::proto::iwarp::ddp::UNTAGGED_LEN).min(u.len - u.off);
                    let last = u.off + n == u.len;
                    let buffer = DdpBuffer::Untagged { rsvd_ulp: *inv, qn: QN_SEND, msn, mo: u.off as u32 };
                    let ddp = DdpRepr { last, version: DDP_VERSION, rsvd_ulp: 0, buffer };
                    self.emit_data(ddp, *opcode, &payload, u.off, n);
                    u.off += n;
                    last
                }
            };
            if last || self.state != QpState::Rts {
                return true;
            }
            if self.out.len() >= budget {
                return false;
            }
        }
    }

    /// Completes finished send-queue entries in posting order; an error takes the QP to ERR.
    fn retire(&mut self) {
        while let Some(status) = self.sq.front().and_then(|e| e.done) {
            let Some(e) = self.sq.pop_front() else { break };
            if !e.internal && (e.signaled || status != WcStatus::Success) {
                self.completions.push_back(Wc::new(e.wr_id, status, e.opcode, self.qpn, e.len));
            }
            if status != WcStatus::Success {
                self.enter_error();
                return;
            }
        }
    }

    fn emit(&mut self, m: &MessageRepr<'_>) {
        // The header fields are built here within their ranges, so emitting cannot fail;
        // a failure would be a bug, reported as a local catastrophic error.
        if self.framer.frame_with(m.buffer_len(), self.out.bytes_mut(), |b| m.emit(b)).is_err() {
            self.enter_error();
        }
    }

    fn control(opcode: Opcode) -> Control {
        Control { version: RDMAP_VERSION, opcode }
    }

    /// A tagged message (Write or Read Response), segmented to the MULPDU.
    fn send_tagged(&mut self, opcode: Opcode, stag: u32, to: u64, data: &Payload<'_>) {
        self.send_tagged_part(opcode, stag, to, data, true);
    }

    /// A part of a tagged message, segmented to the MULPDU; `ends` sets L on its last
    /// segment.
    fn send_tagged_part(&mut self, opcode: Opcode, stag: u32, to: u64, data: &Payload<'_>, ends: bool) {
        let room = self.mulpdu - crate::proto::iwarp::ddp::TAGGED_LEN;
        let mut off = 0;
        loop {
            let n = room.min(data.len() - off);
            let last = ends && off + n == data.len();
            let ddp = DdpRepr {
                last,
                version: DDP_VERSION,
                rsvd_ulp: 0,
                buffer: DdpBuffer::Tagged { stag, to: to.wrapping_add(off as u64) },
            };
            self.emit_data(ddp, opcode, data, off, n);
            off += n;
            if off == data.len() {
                break;
            }
        }
    }

    /// One FPDU of a data message: its header, then `n` payload octets from `off`, left
    /// in registered memory as spans where the framing allows and the payload is worth an
    /// iovec ([`SPLICE_MIN_BYTES`]), otherwise copied straight into the stream.
    fn emit_data(&mut self, ddp: DdpRepr, opcode: Opcode, data: &Payload<'_>, off: usize, n: usize) {
        let head = MessageRepr { ddp, control: Self::control(opcode), body: Body::Data(&[]) };
        let head_len = head.buffer_len();
        let went = || crate::proto::Error::BadLength("the payload's memory went");
        let framed = if self.framer.splices() && n >= SPLICE_MIN_BYTES {
            let splice = |out: &mut Output| data.splice_to(off, n, out).then_some(()).ok_or_else(went);
            self.framer.frame_spliced((head_len, n), &mut self.out, |b| head.emit(b), splice)
        } else {
            self.framer.frame_with(head_len + n, self.out.bytes_mut(), |b| {
                head.emit(&mut b[..head_len])?;
                data.copy_to(off, &mut b[head_len..]).then_some(()).ok_or_else(went)
            })
        };
        // Header fields are in range and the memory was checked at post time, under the
        // same lock: only on-demand memory unmapped since (or a bug) fails here, and the QP
        // enters the error state, as a NIC's unresolvable page fault on a send would.
        if framed.is_err() {
            self.enter_error();
        }
    }

    /// The zero-length Send of an RTR (posted Sends go through [`IwarpQp::frame_some`]).
    fn send_empty_send(&mut self) {
        let msn = self.take_msn(QN_SEND);
        let buffer = DdpBuffer::Untagged { rsvd_ulp: 0, qn: QN_SEND, msn, mo: 0 };
        let ddp = DdpRepr { last: true, version: DDP_VERSION, rsvd_ulp: 0, buffer };
        self.emit_data(ddp, Opcode::Send, &Payload::Bytes(&[]), 0, 0);
    }

    fn send_read_request(&mut self, rr: ReadRequestRepr) {
        let msn = self.take_msn(QN_READ_REQUEST);
        let buffer = DdpBuffer::Untagged { rsvd_ulp: 0, qn: QN_READ_REQUEST, msn, mo: 0 };
        let ddp = DdpRepr { last: true, version: DDP_VERSION, rsvd_ulp: 0, buffer };
        self.emit(&MessageRepr { ddp, control: Self::control(Opcode::ReadRequest), body: Body::ReadRequest(rr) });
    }

    fn take_msn(&mut self, qn: u32) -> u32 {
        let i = qn as usize;
        let msn = self.next_msn[i];
        self.next_msn[i] = msn.wrapping_add(1);
        msn
    }

    /// The ready-to-receive message (RFC 6581 §6): zero-length, as negotiated.
    fn send_rtr(&mut self, kind: RtrKind) {
        match kind {
            RtrKind::Write => self.send_tagged(Opcode::Write, RTR_STAG, 0, &Payload::Bytes(&[])),
            RtrKind::Send => self.send_empty_send(),
            RtrKind::Read => {
                let rr = ReadRequestRepr { sink_stag: RTR_STAG, sink_to: 0, size: 0, src_stag: RTR_STAG, src_to: 0 };
                self.send_read_request(rr);
                // Its zero-length response is awaited like any Read's, and completes silently.
                let read = Some(ReadSink { stag: RTR_STAG, to: 0, len: 0, placed: 0 });
                let opcode = WcOpcode::RdmaRead;
                self.sq.push_back(SqEntry {
                    wr_id: 0,
                    opcode,
                    len: 0,
                    signaled: false,
                    done: None,
                    read,
                    tx_end: None,
                    internal: true,
                    unframed: None,
                });
                self.reads_out += 1;
            }
        }
    }

    /// Stream bytes from TCP. A QP with a shared receive queue takes each Send's receive
    /// from `srq` (IBTA 10.2.9); returns whether that crossed the SRQ's armed limit.
    pub fn on_stream(&mut self, data: &[u8], mrs: &mut MrTable, mut srq: Option<&mut Srq>) -> bool {
        let mut limit_reached = false;
        if self.state == QpState::Err {
            return false;
        }
        // The deframer hands ULPDUs over in place; it is set aside meanwhile so that the
        // QP may act on each one.
        let mut deframer = std::mem::replace(&mut self.deframer, Deframer::new(false, false));
        let fed = deframer.feed(data, |ulpdu, crc| {
            if matches!(crc, CrcCheck::Bad { .. }) {
                self.terminate(Layer::Llp, 0, 2, None);
            } else {
                let mut rx = Receives { srq: srq.as_deref_mut(), limit_reached: false };
                self.on_ulpdu(ulpdu, mrs, &mut rx);
                limit_reached |= rx.limit_reached;
            }
            self.state != QpState::Err
        });
        self.deframer = deframer;
        if fed.is_err() {
            self.terminate(Layer::Llp, 0, 3, None);
        }
        limit_reached
    }

    fn on_ulpdu(&mut self, ulpdu: &[u8], mrs: &mut MrTable, rx: &mut Receives<'_>) {
        let m = match MessageRepr::parse(ulpdu) {
            Ok(m) => m,
            Err(_) => return self.terminate(Layer::Rdmap, 2, 6, Some(ulpdu)),
        };
        if m.ddp.version != DDP_VERSION {
            let etype = if matches!(m.ddp.buffer, DdpBuffer::Tagged { .. }) { 1 } else { 2 };
            return self.terminate(Layer::Ddp, etype, if etype == 1 { 4 } else { 6 }, Some(ulpdu));
        }
        if m.control.version != RDMAP_VERSION {
            return self.terminate(Layer::Rdmap, 2, 5, Some(ulpdu));
        }
        if self.rtr_expected {
            self.rtr_expected = false;
            self.start_waiting(mrs);
            match (m.control.opcode, m.body) {
                (Opcode::Write | Opcode::Send, Body::Data([])) => {
                    return; // The initiator's ready-to-receive: nothing to place.
                }
                (Opcode::ReadRequest, Body::ReadRequest(rr)) if rr.size == 0 => {
                    // A Read RTR is answered outside the IRD (RFC 6581 §6).
                    self.expect_msn[1] = self.expect_msn[1].wrapping_add(1);
                    return self.send_tagged(Opcode::ReadResponse, rr.sink_stag, rr.sink_to, &Payload::Bytes(&[]));
                }
                _ => {}
            }
        }
        match (m.control.opcode, m.ddp.buffer, m.body) {
            (Opcode::Write, DdpBuffer::Tagged { stag, to }, Body::Data(d)) => {
                self.place_tagged(stag, to, d, Need::RemoteWrite, ulpdu, mrs);
            }
            (Opcode::ReadResponse, DdpBuffer::Tagged { stag, to }, Body::Data(d)) => {
                self.on_read_response(stag, to, d, m.ddp.last, ulpdu, mrs);
            }
            (op, DdpBuffer::Untagged { qn, msn, mo, rsvd_ulp }, Body::Data(d)) if is_send(op) => {
                self.on_send(Untagged { qn, msn, mo, inv: rsvd_ulp, last: m.ddp.last }, op, d, ulpdu, mrs, rx);
            }
            (Opcode::ReadRequest, DdpBuffer::Untagged { qn, msn, .. }, Body::ReadRequest(rr)) => {
                self.on_read_request(qn, msn, rr, ulpdu, mrs);
            }
            (Opcode::Terminate, _, Body::Terminate(t)) => {
                self.terminated = Some(Terminated { local: false, reason: t.to_string() });
                self.fatal_unreported = self.state != QpState::Err;
                self.enter_error();
            }
            _ => self.terminate(Layer::Rdmap, 2, 6, Some(ulpdu)),
        }
    }

    /// Places tagged data after checking STag, PD, access and bounds (RFC 5041 §7.2 codes).
    /// A zero-length segment is checked all the same: it names a buffer like any other.
    /// Memory that refuses the copy (revoked, or on demand with nothing mapped) is an
    /// access violation as a key's missing right is.
    fn place_tagged(&mut self, stag: u32, to: u64, d: &[u8], need: Need, ulpdu: &[u8], mrs: &MrTable) -> bool {
        let placed = mrs.resolve(stag, self.pd, to, d.len(), need).and_then(|(mem, off)| {
            if mem.write(off, d) {
                Ok(())
            } else {
                Err(MemError::Access)
            }
        });
        match placed {
            Ok(()) => true,
            Err(e) => {
                let (layer, etype, code) = tagged_error(e);
                self.terminate(layer, etype, code, Some(ulpdu));
                false
            }
        }
    }

    /// A Read Response segment belongs to the oldest outstanding Read (RFC 5040 §5.2,
    /// responses come in request order): it must name that Read's sink STag, continue at
    /// the next offset, stay within its length, and end exactly at its end. Anything else
    /// places nothing, fails the Read and terminates.
    fn on_read_response(&mut self, stag: u32, to: u64, d: &[u8], last: bool, ulpdu: &[u8], mrs: &MrTable) {
        let Some(i) = self.sq.iter().position(|e| e.read.is_some() && e.done.is_none()) else {
            return self.terminate(Layer::Rdmap, 2, 6, Some(ulpdu));
        };
        let Some(sink) = self.sq[i].read else { return };
        let fault = if stag != sink.stag {
            Some((Layer::Ddp, 1, 0))
        } else if to != sink.to.wrapping_add(u64::from(sink.placed))
            || d.len() > (sink.len - sink.placed) as usize
            || (last && d.len() != (sink.len - sink.placed) as usize)
        {
            Some((Layer::Ddp, 1, 1))
        } else {
            None
        };
        if let Some((layer, etype, code)) = fault {
            self.sq[i].done = Some(WcStatus::RemOpErr);
            return self.terminate(layer, etype, code, Some(ulpdu));
        }
        // The RTR's zero-length Read has no buffer to check.
        if !self.sq[i].internal && !self.place_tagged(stag, to, d, Need::LocalWrite, ulpdu, mrs) {
            return;
        }
        if let Some(s) = self.sq[i].read.as_mut() {
            s.placed += d.len() as u32;
        }
        if last {
            self.sq[i].done = Some(WcStatus::Success);
            self.reads_out -= 1;
            self.retire();
            self.start_waiting(mrs);
        }
    }

    fn start_waiting(&mut self, mrs: &MrTable) {
        while self.state == QpState::Rts && !self.rtr_expected && self.hold.is_none() {
            let Some(front) = self.waiting.front() else { break };
            if matches!(front.op, SendOp::Read(_)) && self.reads_out >= self.ord {
                break;
            }
            let Some(wr) = self.waiting.pop_front() else { break };
            self.start(wr, mrs);
        }
    }

    /// A Send segment on queue 0: MSN and MO place it in the head receive (RFC 5041 §5.3).
    fn on_send(&mut self, u: Untagged, op: Opcode, d: &[u8], ulpdu: &[u8], mrs: &mut MrTable, rx: &mut Receives<'_>) {
        if u.qn != QN_SEND {
            return self.terminate(Layer::Ddp, 2, 1, Some(ulpdu));
        }
        if u.msn != self.expect_msn[0] {
            return self.terminate(Layer::Ddp, 2, 3, Some(ulpdu));
        }
        if self.filling.is_none() {
            let Some(wr) = rx.take(&mut self.rq) else {
                return self.terminate(Layer::Ddp, 2, 2, Some(ulpdu));
            };
            let capacity = wr.sgl.iter().map(|s| s.length as usize).sum();
            self.filling = Some(Filling { wr, capacity, received: 0 });
        }
        let Some(f) = self.filling.as_mut() else { return };
        // TCP delivers a message's segments in order, so each continues where the last
        // ended (as siw requires): a gap or overlap would complete bytes never written.
        if u.mo as usize != f.received {
            return self.terminate(Layer::Ddp, 2, 4, Some(ulpdu));
        }
        let end = f.received + d.len();
        if end > f.capacity {
            return self.terminate(Layer::Ddp, 2, 5, Some(ulpdu));
        }
        if !scatter(&f.wr, f.received, d, self.pd, mrs) {
            return self.terminate(Layer::Rdmap, 2, 7, Some(ulpdu));
        }
        f.received = end;
        if u.last {
            self.finish_receive(u, op, end, mrs);
        }
    }

    fn finish_receive(&mut self, u: Untagged, op: Opcode, len: usize, mrs: &mut MrTable) {
        let Some(f) = self.filling.take() else { return };
        self.expect_msn[0] = self.expect_msn[0].wrapping_add(1);
        let mut wc = Wc::new(f.wr.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn, len as u32);
        wc.solicited = matches!(op, Opcode::SendSolicited | Opcode::SendSolicitedInvalidate);
        if matches!(op, Opcode::SendInvalidate | Opcode::SendSolicitedInvalidate) {
            // RFC 5040 §6.4.1: only an STag of this QP's PD that allows remote
            // invalidation. A refusal completes the receive in error, then terminates.
            if mrs.remote_invalidate(u.inv, self.pd, self.qpn).is_err() {
                wc.status = WcStatus::RemInvReqErr;
                self.completions.push_back(wc);
                return self.terminate(Layer::Rdmap, 2, 9, None);
            }
            wc.invalidated_rkey = Some(u.inv);
        }
        self.completions.push_back(wc);
    }

    /// A Read Request on queue 1: checked, then queued as one of at most IRD Reads being
    /// answered; its Read Response is produced as the transport takes output.
    fn on_read_request(&mut self, qn: u32, msn: u32, rr: ReadRequestRepr, ulpdu: &[u8], mrs: &MrTable) {
        if qn != QN_READ_REQUEST {
            return self.terminate(Layer::Ddp, 2, 1, Some(ulpdu));
        }
        if msn != self.expect_msn[1] {
            return self.terminate(Layer::Ddp, 2, 3, Some(ulpdu));
        }
        if self.reads_in.len() >= self.ird {
            // RFC 5040 §5.3: IRD bounds the Reads a peer may have outstanding; one more is
            // fatal to the stream (as siw answers an IRQ overflow).
            return self.terminate(Layer::Rdmap, 2, 7, Some(ulpdu));
        }
        self.expect_msn[1] = self.expect_msn[1].wrapping_add(1);
        match mrs.resolve(rr.src_stag, self.pd, rr.src_to, rr.size as usize, Need::RemoteRead) {
            Ok((mem, offset)) => self.reads_in.push_back(ReadJob {
                sink_stag: rr.sink_stag,
                sink_to: rr.sink_to,
                mem,
                offset,
                remaining: rr.size as usize,
            }),
            Err(e) => {
                let (_, _, code) = tagged_error(e);
                // RFC 5040 §7.1: a bad source is a remote protection error of the Read Request.
                self.terminate(Layer::Rdmap, 1, code.min(3), Some(ulpdu));
            }
        }
    }

    /// Sends a Terminate naming the offending segment, then stops (RFC 5040 §5.4.4).
    fn terminate(&mut self, layer: Layer, etype: u8, ecode: u8, offending: Option<&[u8]>) {
        let hdr_len = offending.and_then(|u| crate::proto::iwarp::ddp::header_len(u).ok());
        let ddp_header = offending.zip(hdr_len).filter(|(u, n)| u.len() >= *n).map(|(u, n)| &u[..n]);
        let rdmap_header = offending.zip(hdr_len).and_then(|(u, n)| {
            let read_req = u.len() == n + ReadRequestRepr::LEN && (u[1] & 0x0f) == Opcode::ReadRequest as u8;
            read_req.then(|| &u[n..])
        });
        let t = TerminateRepr {
            layer,
            etype,
            ecode,
            ddp_segment_len: offending.map(|u| u.len().min(u16::MAX as usize) as u16),
            ddp_header,
            rdmap_header,
            reserved: 0,
            trailing: &[],
        };
        let reason = t.to_string();
        let msn = self.take_msn(QN_TERMINATE);
        let buffer = DdpBuffer::Untagged { rsvd_ulp: 0, qn: QN_TERMINATE, msn, mo: 0 };
        let ddp = DdpRepr { last: true, version: DDP_VERSION, rsvd_ulp: 0, buffer };
        self.emit(&MessageRepr { ddp, control: Self::control(Opcode::Terminate), body: Body::Terminate(t) });
        self.terminated = Some(Terminated { local: true, reason });
        self.fatal_unreported = self.state != QpState::Err;
        self.enter_error();
    }

    /// ERR: every outstanding request completes flushed (IBTA 10.3.1.7 semantics, as siw).
    fn enter_error(&mut self) {
        self.errored_unreported |= self.state != QpState::Err;
        self.state = QpState::Err;
        self.reads_in.clear();
        let qpn = self.qpn;
        for e in self.sq.drain(..).filter(|e| !e.internal) {
            let status = e.done.filter(|s| *s != WcStatus::Success).unwrap_or(WcStatus::WrFlushErr);
            self.completions.push_back(Wc::new(e.wr_id, status, e.opcode, qpn, e.len));
        }
        for wr in self.waiting.drain(..) {
            self.completions.push_back(Wc::new(wr.wr_id, WcStatus::WrFlushErr, wr.op.wc_opcode(), qpn, 0));
        }
        let receives = self.filling.take().map(|f| f.wr).into_iter().chain(self.rq.drain(..));
        let flushed: Vec<Wc> =
            receives.map(|wr| Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn, 0)).collect();
        self.completions.extend(flushed);
    }
}

/// Where a QP's receives come from while it takes in stream bytes: its own queue, or a
/// shared receive queue (IBTA 10.2.9), whose armed limit a take may cross (11.6.3.3).
struct Receives<'a> {
    srq: Option<&'a mut Srq>,
    limit_reached: bool,
}

impl Receives<'_> {
    /// The receive the next Send lands in: the SRQ's head if the QP has one, else its own.
    fn take(&mut self, rq: &mut VecDeque<RecvWr>) -> Option<RecvWr> {
        let Some(srq) = self.srq.as_deref_mut() else { return rq.pop_front() };
        let (wqe, fired) = srq.take();
        self.limit_reached |= fired;
        wqe.map(RecvWqe::into_wr)
    }
}

/// Untagged DDP fields of one Send segment.
#[derive(Debug, Clone, Copy)]
struct Untagged {
    qn: u32,
    msn: u32,
    mo: u32,
    inv: u32,
    last: bool,
}

fn is_send(op: Opcode) -> bool {
    matches!(op, Opcode::Send | Opcode::SendInvalidate | Opcode::SendSolicited | Opcode::SendSolicitedInvalidate)
}

/// The Terminate a tagged-buffer failure gets (RFC 5041 §7.2, RFC 5040 §7.1).
fn tagged_error(e: MemError) -> (Layer, u8, u8) {
    match e {
        MemError::BadKey => (Layer::Ddp, 1, 0),
        MemError::Bounds | MemError::Alignment => (Layer::Ddp, 1, 1),
        MemError::WrongPd => (Layer::Ddp, 1, 2),
        MemError::Access => (Layer::Rdmap, 1, 2),
    }
}

/// The RDMAP opcode of a Send flavour, and the STag it invalidates (RFC 5040 §4.3).
fn send_opcode(op: SendOp, solicited: bool) -> (Opcode, u32) {
    match (op, solicited) {
        (SendOp::SendInv(k), false) => (Opcode::SendInvalidate, k),
        (SendOp::SendInv(k), true) => (Opcode::SendSolicitedInvalidate, k),
        (_, true) => (Opcode::SendSolicited, 0),
        _ => (Opcode::Send, 0),
    }
}

/// True when every SGE of `wr` names memory of `pd` granting `need` (a Read's sink is
/// written, a Send's or Write's source read): checked at post, before anything is framed.
fn sgl_permits(wr: &SendWr, pd: Pd, mrs: &MrTable, need: Need) -> bool {
    wr.sgl.iter().all(|s| mrs.resolve(s.lkey, pd, s.addr, s.length as usize, need).is_ok())
}

/// Where a message's payload comes from as its FPDUs are framed: bytes in hand, a posted
/// request's scatter/gather list, or a region's bytes (a Read Response). The last two are
/// read segment by segment into the stream, so a large message is copied once, with no
/// buffer of its size allocated (and faulted in) per message.
enum Payload<'a> {
    Bytes(&'a [u8]),
    Sgl { sgl: &'a [crate::engine::verbs::Sge], pd: Pd, mrs: &'a MrTable, len: usize },
    Mem { mem: &'a Arc<SharedMem>, offset: usize, len: usize },
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Sgl { len, .. } | Payload::Mem { len, .. } => *len,
        }
    }

    /// Copies the payload's octets from `off` into `dst`; false if its memory refused.
    fn copy_to(&self, off: usize, dst: &mut [u8]) -> bool {
        match self {
            Payload::Bytes(b) => {
                dst.copy_from_slice(&b[off..off + dst.len()]);
                true
            }
            Payload::Sgl { sgl, pd, mrs, .. } => {
                let range = (off, dst.len());
                mrs.for_sgl_range(sgl, *pd, range, Need::LocalRead, |mem, at_mem, at, n| {
                    mem.read(at_mem, &mut dst[at..at + n])
                })
            }
            Payload::Mem { mem, offset, .. } => mem.read(offset + off, dst),
        }
    }

    /// Appends the payload's `n` octets from `off` to `out`: memory as spans, sent where
    /// it lies, but an on-demand region's copied (only checked copies reach its pages);
    /// false if its memory refused.
    fn splice_to(&self, off: usize, n: usize, out: &mut Output) -> bool {
        match self {
            Payload::Bytes(b) => {
                out.bytes_mut().extend_from_slice(&b[off..off + n]);
                true
            }
            Payload::Sgl { sgl, pd, mrs, .. } => {
                mrs.for_sgl_range(sgl, *pd, (off, n), Need::LocalRead, |mem, at_mem, _, k| splice(mem, at_mem, k, out))
            }
            Payload::Mem { mem, offset, .. } => splice(mem, offset + off, n, out),
        }
    }
}

/// Appends `n` octets of `mem` from `at` to `out`, as a span where the kernel can read
/// them in place, else copied; false if the memory refused.
fn splice(mem: &Arc<SharedMem>, at: usize, n: usize, out: &mut Output) -> bool {
    if mem.raw_span(at, n).is_some() {
        out.splice(MemSpan { mem: mem.clone(), offset: at, len: n });
        return true;
    }
    let bytes = out.bytes_mut();
    let start = bytes.len();
    bytes.resize(start + n, 0);
    let read = mem.read(at, &mut bytes[start..]);
    if !read {
        bytes.truncate(start);
    }
    read
}

/// Writes `d` at message offset `mo` across a receive's scatter list.
fn scatter(wr: &RecvWr, mo: usize, d: &[u8], pd: Pd, mrs: &MrTable) -> bool {
    mrs.for_sgl_range(&wr.sgl, pd, (mo, d.len()), Need::LocalWrite, |mem, off, at, n| mem.write(off, &d[at..at + n]))
}
