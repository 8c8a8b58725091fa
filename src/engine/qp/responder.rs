//! The responder (IBTA 9.7.5): a chain of named checks in the spec's order, then execute
//! and reply. Duplicates follow IBTA 9.7.5.1.1; READ and atomic results are kept in a
//! bounded set of responder resources (IRD).

use super::replies::{ReadJob, Reply, ReplyQueue};
use super::requester::bare;
use super::{Ctx, Path};
use crate::engine::mem::{Access, MemError, Need, Pd, SharedMem};
use crate::engine::verbs::{QpAttr, QpCaps, RecvWr, Sge, VerbsError, Wc, WcOpcode, WcStatus};
use crate::proto::roce::ext::{AethRepr, AtomicAckEthRepr, NakCode, Syndrome};
use crate::proto::roce::opcode::{Operation, Position};
use crate::proto::roce::{Psn, RoceRepr};
use std::collections::VecDeque;
use std::sync::Arc;

/// Why a request packet was not executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Silently dropped (out of sequence after the one NAK, or nothing to say).
    Drop,
    /// NAK with a code; for all but the sequence error the QP goes to ERR.
    Nak(NakCode),
    /// RNR NAK: no receive WQE.
    Rnr,
}

type Check = Result<(), Refusal>;

/// Most replies a responder holds: IRD worth of READ/atomic responses plus ACKs and NAKs.
pub const MAX_REPLIES: usize = 64;

#[derive(Debug)]
pub struct RecvWqe {
    pub(crate) wr: RecvWr,
    pub(crate) capacity: usize,
}

impl RecvWqe {
    /// Wraps a receive request.
    pub fn new(wr: RecvWr) -> Self {
        let capacity = wr.sgl.iter().map(|s| s.length as usize).sum();
        RecvWqe { wr, capacity }
    }

    /// The receive request it wraps.
    pub fn into_wr(self) -> RecvWr {
        self.wr
    }
}

/// A message being received over several packets.
#[derive(Debug)]
pub(crate) enum Inbound {
    Send { wqe: RecvWqe, received: usize, tm: Option<Box<super::tagged::TmRecv>> },
    Write { mem: Arc<SharedMem>, offset: usize, remaining: usize },
}

#[derive(Debug, Clone)]
enum ResourceKind {
    Read,
    Atomic { original: u64 },
}

/// A responder resource (IBTA 9.7.5.1.1: kept to answer duplicates).
#[derive(Debug, Clone)]
struct Resource {
    first_psn: Psn,
    npkts: u32,
    kind: ResourceKind,
}

/// Receive-side state of a QP.
#[derive(Debug)]
pub struct Responder {
    /// Expected PSN.
    pub epsn: Psn,
    msn: u32,
    nak_sent: bool,
    /// Requests executed in order since the last ACK or NAK went out, none asking for one.
    ack_owed: bool,
    /// A sequence NAK went out and no ACK since: the requester is going back.
    nak_unanswered: bool,
    pub(crate) cur: Option<Inbound>,
    pub(crate) rq: VecDeque<RecvWqe>,
    /// The shared receive queue this QP takes from instead of `rq`.
    pub srq: Option<u32>,
    /// UC: a message was lost; drop until the next FIRST/ONLY.
    pub(crate) uc_resync: bool,
    resources: VecDeque<Resource>,
    replies: ReplyQueue,
    /// IRD.
    pub max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    access: Access,
    caps: QpCaps,
    /// A rendezvous request a TM-SRQ matched, for the requester to read.
    pub(crate) rndv: Option<Box<super::tagged::RndvStart>>,
}

impl Responder {
    /// An empty receive side.
    pub fn new(caps: QpCaps) -> Self {
        Responder {
            epsn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            ack_owed: false,
            nak_unanswered: false,
            uc_resync: false,
            srq: None,
            cur: None,
            rq: VecDeque::new(),
            resources: VecDeque::new(),
            replies: ReplyQueue::default(),
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            access: Access::default(),
            caps,
            rndv: None,
        }
    }

    /// Takes the receive-side attributes of a modify-QP.
    pub fn apply(&mut self, a: &QpAttr) {
        if let Some(p) = a.rq_psn {
            self.epsn = Psn::new(p);
        }
        if let Some(m) = a.max_dest_rd_atomic {
            self.max_dest_rd_atomic = m.max(1);
        }
        if let Some(t) = a.min_rnr_timer {
            self.min_rnr_timer = t;
        }
        if let Some(a) = a.access {
            self.access = a;
        }
    }

    /// Queues a receive work request.
    pub fn post(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        if self.rq.len() >= self.caps.max_recv_wr {
            return Err(VerbsError::QueueFull);
        }
        if wr.sgl.len() > self.caps.max_sge {
            return Err(VerbsError::InvalidRequest);
        }
        self.rq.push_back(RecvWqe::new(wr));
        Ok(())
    }

    /// True when a receive WQE is available, from the QP's RQ or its SRQ.
    pub(crate) fn has_recv(&self, ctx: &Ctx<'_>) -> bool {
        match self.srq {
            Some(id) => ctx.srqs.get(&id).is_some_and(|s| s.has_wqe()),
            None => !self.rq.is_empty(),
        }
    }

    /// Takes the next receive WQE; an SRQ crossing its limit raises the event.
    pub(crate) fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<RecvWqe> {
        let Some(id) = self.srq else { return self.rq.pop_front() };
        let (w, fired) = ctx.srqs.get_mut(&id)?.take();
        if fired {
            ctx.events.raise(crate::engine::event::AsyncEvent::SrqLimitReached(id));
        }
        w
    }

    /// Gives back a WQE an abandoned message held.
    pub(crate) fn give_back(&mut self, w: RecvWqe, ctx: &mut Ctx<'_>) {
        match self.srq.and_then(|id| ctx.srqs.get_mut(&id)) {
            Some(s) => s.give_back(w),
            None => self.rq.push_front(w),
        }
    }

    /// Flushes receive WQEs (IBTA 10.3.1.7).
    pub fn flush(&mut self, qpn: u32) -> Vec<Wc> {
        let mut out = Vec::new();
        if let Some(Inbound::Send { wqe, .. }) = self.cur.take() {
            out.push(recv_wc(&wqe.wr, qpn, WcStatus::WrFlushErr, 0));
        }
        out.extend(self.rq.drain(..).map(|w| recv_wc(&w.wr, qpn, WcStatus::WrFlushErr, 0)));
        self.replies.clear();
        out
    }

    /// Handles one request packet addressed to this QP. Returns the NAK sent when the QP
    /// must go to ERR (any NAK but a sequence error or RNR).
    pub fn handle(&mut self, r: &RoceRepr<'_>, q: &QpView, ctx: &mut Ctx<'_>) -> Option<NakCode> {
        let info = r.info()?;
        // IBTA 9.7.5.1.1: PSN first; duplicates and gaps never reach the other checks.
        match self.check_psn(r.bth.psn) {
            Psn3::Expected => {}
            Psn3::Duplicate => {
                self.duplicate(r, q, ctx);
                return None;
            }
            Psn3::Ahead => {
                if !self.nak_sent {
                    self.nak_sent = true;
                    ctx.stats.seq_naks_sent += 1;
                    // The NAK acknowledges what came before it (IBTA 9.7.5.2.1), but rxe
                    // ignores a second sequence NAK within one message until an ACK has
                    // come, and waits for its timer instead: so after a NAK, what was
                    // executed since is acknowledged first, by an ACK of its own.
                    if self.ack_owed && self.nak_unanswered {
                        self.push_ack();
                    }
                    let syn = Syndrome::Nak(NakCode::PsnSequenceError);
                    self.replies.push_back(Reply::Nak(self.epsn, syn));
                    self.ack_owed = false;
                    self.nak_unanswered = true;
                }
                return None;
            }
        }
        let result = self
            .check_op_sequence(info.operation, info.position)
            .and_then(|_| self.check_resources(r, info.operation, info.position, ctx))
            .and_then(|_| self.check_length(r, q.mtu, info.position))
            .and_then(|_| self.execute(r, info.operation, info.position, q, ctx));
        match result {
            Ok(()) => {
                self.nak_sent = false;
                // READ responses and atomic ACKs are themselves the acknowledgement.
                let answered =
                    matches!(info.operation, Operation::ReadRequest | Operation::CompareSwap | Operation::FetchAdd);
                if r.bth.ack_req && !answered {
                    self.push_ack();
                } else {
                    self.ack_owed = !answered;
                }
                None
            }
            Err(Refusal::Drop) => None,
            Err(Refusal::Rnr) => {
                ctx.stats.rnr_naks_sent += 1;
                let syn = Syndrome::RnrNak { timer: self.min_rnr_timer };
                self.replies.push_back(Reply::Nak(r.bth.psn, syn));
                None
            }
            Err(Refusal::Nak(code)) => {
                ctx.stats.naks_sent += 1;
                self.replies.push_back(Reply::Nak(r.bth.psn, Syndrome::Nak(code)));
                Some(code)
            }
        }
    }

    /// Refuses the request at `psn` with NAK `code` if it is the expected one (a duplicate
    /// or a PSN ahead is left to [`Responder::handle`]'s rules); the code when it was.
    pub(crate) fn refuse(&mut self, psn: Psn, code: NakCode, ctx: &mut Ctx<'_>) -> Option<NakCode> {
        if !matches!(self.check_psn(psn), Psn3::Expected) {
            return None;
        }
        ctx.stats.naks_sent += 1;
        self.replies.push_back(Reply::Nak(psn, Syndrome::Nak(code)));
        Some(code)
    }

    fn check_psn(&self, psn: Psn) -> Psn3 {
        match self.epsn.distance_to(psn) {
            0 => Psn3::Expected,
            d if d < 0 => Psn3::Duplicate,
            _ => Psn3::Ahead,
        }
    }

    /// IBTA 9.7.5.1.2: a FIRST/ONLY may only start a message, MIDDLE/LAST only continue
    /// one of the same kind.
    pub(crate) fn check_op_sequence(&self, op: Operation, pos: Position) -> Check {
        let starts = matches!(pos, Position::First | Position::Only);
        let ok = match &self.cur {
            None => starts,
            Some(Inbound::Send { .. }) => !starts && op == Operation::Send,
            Some(Inbound::Write { .. }) => !starts && op == Operation::Write,
        };
        if ok {
            Ok(())
        } else {
            Err(Refusal::Nak(NakCode::InvalidRequest))
        }
    }

    /// IBTA 9.7.5.1.3: a receive WQE for a SEND (or WRITE with immediate); a free
    /// responder resource for READ/atomic.
    pub(crate) fn check_resources(&mut self, r: &RoceRepr<'_>, op: Operation, pos: Position, ctx: &Ctx<'_>) -> Check {
        let needs_wqe = (op == Operation::Send && matches!(pos, Position::First | Position::Only))
            || (op == Operation::Write && r.immdt.is_some());
        // A TM-SRQ decides when it has seen the tag (`start_tagged`): a tagged buffer or
        // an ordinary receive.
        if needs_wqe && !self.has_recv(ctx) && !(op == Operation::Send && self.srq_is_tagged(ctx)) {
            return Err(Refusal::Rnr);
        }
        if matches!(op, Operation::ReadRequest | Operation::CompareSwap | Operation::FetchAdd) {
            if !self.access_allows(op) {
                return Err(Refusal::Nak(NakCode::RemoteAccessError));
            }
            // IBTA 9.7.5.1.3: more READ/atomic responses pending than IRD allows is an
            // invalid request.
            if self.pending_reads() >= usize::from(self.max_dest_rd_atomic) {
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            }
            // The oldest resource is done at a requester that keeps to its ORD.
            if self.resources.len() >= usize::from(self.max_dest_rd_atomic) {
                self.resources.pop_front();
            }
        }
        Ok(())
    }

    /// READ responses and atomic ACKs queued: the responder resources in use.
    fn pending_reads(&self) -> usize {
        self.replies.resources_in_use()
    }

    fn access_allows(&self, op: Operation) -> bool {
        match op {
            Operation::ReadRequest => self.access.remote_read,
            Operation::CompareSwap | Operation::FetchAdd => self.access.remote_atomic,
            Operation::Write | Operation::AtomicWrite => self.access.remote_write,
            _ => true,
        }
    }

    /// IBTA 9.7.5.1.4: FIRST and MIDDLE carry exactly one MTU, LAST and ONLY at most one;
    /// fixed-size requests carry nothing.
    pub(crate) fn check_length(&self, r: &RoceRepr<'_>, mtu: usize, pos: Position) -> Check {
        let n = r.payload.len();
        let ok = match pos {
            Position::First | Position::Middle => n == mtu,
            Position::Last => (1..=mtu).contains(&n),
            Position::Only => n <= mtu,
        };
        if ok {
            Ok(())
        } else {
            Err(Refusal::Nak(NakCode::InvalidRequest))
        }
    }

    fn execute(&mut self, r: &RoceRepr<'_>, op: Operation, pos: Position, q: &QpView, ctx: &mut Ctx<'_>) -> Check {
        match op {
            Operation::Send => self.exec_send(r, pos, q, ctx)?,
            Operation::Write => self.exec_write(r, pos, q, ctx)?,
            Operation::ReadRequest => self.exec_read(r, q, ctx)?,
            Operation::CompareSwap | Operation::FetchAdd => self.exec_atomic(r, op, q, ctx)?,
            Operation::AtomicWrite => self.exec_atomic_write(r, q, ctx)?,
            _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
        }
        Ok(())
    }

    fn advance(&mut self, npkts: u32, ends_message: bool) {
        self.epsn = self.epsn.add(npkts);
        if ends_message {
            self.msn = (self.msn + 1) & 0xff_ffff;
        }
    }

    pub(crate) fn exec_send(&mut self, r: &RoceRepr<'_>, pos: Position, q: &QpView, ctx: &mut Ctx<'_>) -> Check {
        let mut payload = r.payload;
        if matches!(pos, Position::First | Position::Only) {
            if self.srq_is_tagged(ctx) {
                let skip = self.start_tagged(r, q, ctx, pos == Position::Only)?;
                payload = &payload[skip.min(payload.len())..];
            } else {
                let Some(wqe) = self.take_recv(ctx) else {
                    return Err(Refusal::Rnr);
                };
                self.cur = Some(Inbound::Send { wqe, received: 0, tm: None });
            }
        }
        let Some(Inbound::Send { wqe, received, tm }) = &mut self.cur else {
            return Err(Refusal::Drop);
        };
        let discard = tm.as_ref().is_some_and(|t| t.discard);
        // IBTA 9.7.5.1.4: a message longer than the receive buffers is a local length error
        // (the requester's fault: Invalid Request); a receive buffer the WQE's keys do not
        // grant is a local protection error (ours: Remote Operational Error, 9.9.3.1.2).
        let refusal = if discard {
            None
        } else if *received + payload.len() > wqe.capacity {
            Some((WcStatus::LocLenErr, NakCode::InvalidRequest))
        } else if !scatter_recv(&wqe.wr.sgl, *received, payload, q, ctx) {
            Some((WcStatus::LocProtErr, NakCode::RemoteOperationalError))
        } else {
            None
        };
        if let Some((status, nak)) = refusal {
            if let Some(Inbound::Send { wqe, tm, .. }) = self.cur.take() {
                let cq = tm.as_ref().map_or(q.recv_cq, |t| t.cq);
                ctx.complete(cq, super::tagged::finish_wc(&wqe, q.qpn, status, 0, tm.as_deref()));
            }
            return Err(Refusal::Nak(nak));
        }
        *received += payload.len();
        let ends = matches!(pos, Position::Last | Position::Only);
        if ends {
            let Some(Inbound::Send { wqe, received, tm }) = self.cur.take() else {
                return Err(Refusal::Drop);
            };
            if !discard {
                self.complete_send(r, &wqe, received, tm, q, ctx)?;
            }
        }
        self.advance(1, ends);
        Ok(())
    }

    /// The receive completion of a SEND's last packet `r`.
    fn complete_send(
        &mut self,
        r: &RoceRepr<'_>,
        wqe: &RecvWqe,
        received: usize,
        tm: Option<Box<super::tagged::TmRecv>>,
        q: &QpView,
        ctx: &mut Ctx<'_>,
    ) -> Check {
        let cq = tm.as_ref().map_or(q.recv_cq, |t| t.cq);
        let mut wc = super::tagged::finish_wc(wqe, q.qpn, WcStatus::Success, received, tm.as_deref());
        wc.imm = r.immdt.map(|i| i.imm);
        wc.solicited = r.bth.solicited;
        if let Some(ieth) = r.ieth {
            // IBTA 10.6.7.2: only a key of this PD that allows remote invalidation. A
            // refusal completes the receive in error and ends the QP (rxe's class J),
            // and the requester is told with a NAK.
            if ctx.mrs.remote_invalidate(ieth.rkey, q.pd, q.qpn).is_err() {
                ctx.complete(cq, super::tagged::finish_wc(wqe, q.qpn, WcStatus::RemInvReqErr, received, tm.as_deref()));
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            }
            wc.invalidated_rkey = Some(ieth.rkey);
        }
        ctx.complete(cq, wc);
        Ok(())
    }

    pub(crate) fn exec_write(&mut self, r: &RoceRepr<'_>, pos: Position, q: &QpView, ctx: &mut Ctx<'_>) -> Check {
        if let Some(reth) = r.reth {
            // IBTA 9.7.5.1.4 comes before 9.7.5.1.5: a length that cannot match the RETH is
            // an invalid request whatever the key (the responder's checks are ordered).
            let remaining = reth.dma_len as usize;
            if (pos == Position::Only && r.payload.len() != remaining) || r.payload.len() > remaining {
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            }
            if remaining == 0 {
                // C9-88: a zero-length WRITE names no memory, so neither its R_Key nor its
                // VA is checked (rsockets sends its credits as zero-length WRITEs with
                // immediate data and a zero key).
                self.cur = None;
                return self.finish_write(r, true, q, ctx);
            }
            // IBTA 9.7.5.1.5 (C9-88): rkey, PD, access and bounds; nothing is written otherwise.
            if !self.access.remote_write {
                return Err(Refusal::Nak(NakCode::RemoteAccessError));
            }
            let (mem, offset) = ctx
                .mrs
                .resolve_remote(reth.rkey, (q.pd, q.qpn), reth.va, reth.dma_len as usize, Need::RemoteWrite)
                .map_err(access_nak)?;
            self.cur = Some(Inbound::Write { mem, offset, remaining });
        }
        let Some(Inbound::Write { mem, offset, remaining }) = &mut self.cur else {
            return Err(Refusal::Drop);
        };
        let last = matches!(pos, Position::Last | Position::Only);
        if r.payload.len() > *remaining || (last && r.payload.len() != *remaining) {
            self.cur = None;
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        if !mem.write(*offset, r.payload) {
            // The region was revoked, or is on demand with nothing mapped there (C9-88).
            self.cur = None;
            return Err(Refusal::Nak(NakCode::RemoteAccessError));
        }
        *offset += r.payload.len();
        *remaining -= r.payload.len();
        if last {
            self.cur = None;
        }
        self.finish_write(r, last, q, ctx)
    }

    /// A WRITE packet placed: the last one of a WRITE with immediate data consumes a
    /// receive and completes it.
    fn finish_write(&mut self, r: &RoceRepr<'_>, last: bool, q: &QpView, ctx: &mut Ctx<'_>) -> Check {
        if last {
            if let Some(imm) = r.immdt {
                let Some(wqe) = self.take_recv(ctx) else {
                    return Err(Refusal::Rnr);
                };
                let mut wc = recv_wc(&wqe.wr, q.qpn, WcStatus::Success, 0);
                wc.opcode = WcOpcode::RecvRdmaWithImm;
                wc.imm = Some(imm.imm);
                wc.solicited = r.bth.solicited;
                ctx.complete(q.recv_cq, wc);
            }
        }
        self.advance(1, last);
        Ok(())
    }

    fn exec_read(&mut self, r: &RoceRepr<'_>, q: &QpView, ctx: &mut Ctx<'_>) -> Check {
        let Some(reth) = r.reth else {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        };
        let len = reth.dma_len as usize;
        let (mem, offset) =
            ctx.mrs.resolve_remote(reth.rkey, (q.pd, q.qpn), reth.va, len, Need::RemoteRead).map_err(access_nak)?;
        let npkts = len.div_ceil(q.mtu).max(1) as u32;
        let psn = r.bth.psn;
        self.resources.push_back(Resource { first_psn: psn, npkts, kind: ResourceKind::Read });
        self.replies.push_back(Reply::Read(ReadJob { psn, mem, offset, remaining: len, first: true }));
        self.advance(npkts, true);
        Ok(())
    }

    /// ATOMIC WRITE (IBTA vol.1 1.5, Memory Placement Extensions): 8 bytes to an 8-aligned
    /// address under remote write access, stored at once; acknowledged as a WRITE. A
    /// duplicate is only acknowledged again, never stored a second time.
    fn exec_atomic_write(&mut self, r: &RoceRepr<'_>, q: &QpView, ctx: &mut Ctx<'_>) -> Check {
        let Some(reth) = r.reth.filter(|t| t.dma_len == 8 && r.payload.len() == 8 && t.va.is_multiple_of(8)) else {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        };
        if !self.access.remote_write {
            return Err(Refusal::Nak(NakCode::RemoteAccessError));
        }
        let (mem, offset) =
            ctx.mrs.resolve_remote(reth.rkey, (q.pd, q.qpn), reth.va, 8, Need::RemoteWrite).map_err(access_nak)?;
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(r.payload);
        if !mem.atomic_store(offset, bytes) {
            return Err(Refusal::Nak(NakCode::RemoteAccessError));
        }
        self.advance(1, true);
        Ok(())
    }

    fn exec_atomic(&mut self, r: &RoceRepr<'_>, op: Operation, q: &QpView, ctx: &mut Ctx<'_>) -> Check {
        let Some(a) = r.atomic_eth else {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        };
        if !a.va.is_multiple_of(8) {
            // IBTA 9.4.5: an atomic must be naturally aligned.
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let (mem, offset) =
            ctx.mrs.resolve_remote(a.rkey, (q.pd, q.qpn), a.va, 8, Need::RemoteAtomic).map_err(access_nak)?;
        let original = match op {
            Operation::FetchAdd => mem.fetch_add(offset, a.swap_add),
            _ => mem.compare_swap(offset, a.compare, a.swap_add),
        }
        .ok_or(Refusal::Nak(NakCode::RemoteAccessError))?;
        let psn = r.bth.psn;
        self.resources.push_back(Resource { first_psn: psn, npkts: 1, kind: ResourceKind::Atomic { original } });
        self.advance(1, true);
        self.replies.push_back(Reply::AtomicAck { psn, original });
        Ok(())
    }

    /// IBTA 9.7.5.1.1: re-ACK a duplicate SEND/WRITE, re-execute a duplicate READ from its
    /// resource, answer a duplicate atomic from its saved result (never executing it again).
    fn duplicate(&mut self, r: &RoceRepr<'_>, q: &QpView, ctx: &mut Ctx<'_>) {
        ctx.stats.duplicates_received += 1;
        // A flood of duplicates must not grow the reply queue: beyond a bound they are
        // dropped, and the requester's timer recovers whatever was really lost.
        if self.replies.len() >= MAX_REPLIES {
            return;
        }
        let psn = r.bth.psn;
        let Some(info) = r.info() else { return };
        let res = self.resources.iter().rev().find(|x| psn.in_window(x.first_psn, x.npkts)).cloned();
        match (info.operation, res) {
            (Operation::ReadRequest, Some(Resource { kind: ResourceKind::Read, first_psn, npkts })) => {
                let Some(reth) = r.reth else { return };
                let len = reth.dma_len as usize;
                // IBTA 9.7.5.1.1: a duplicate READ re-reads part of its original, never more:
                // its last response PSN must fall inside the original's.
                let dup_pkts = len.div_ceil(q.mtu).max(1) as u32;
                if !psn.add(dup_pkts - 1).in_window(first_psn, npkts) {
                    return;
                }
                let Ok((mem, offset)) =
                    ctx.mrs.resolve_remote(reth.rkey, (q.pd, q.qpn), reth.va, len, Need::RemoteRead)
                else {
                    return;
                };
                // A resumed READ supersedes any response still going out for it.
                self.replies.retain(|x| !matches!(x, Reply::Read(j) if j.psn.in_window(psn, 1 << 23)));
                if self.pending_reads() >= usize::from(self.max_dest_rd_atomic) {
                    return; // Never more responses in flight than IRD, duplicates included.
                }
                self.replies.push_back(Reply::Read(ReadJob { psn, mem, offset, remaining: len, first: true }));
            }
            (
                Operation::CompareSwap | Operation::FetchAdd,
                Some(Resource { kind: ResourceKind::Atomic { original }, first_psn, .. }),
            ) if first_psn == psn => self.replies.push_back(Reply::AtomicAck { psn, original }),
            (Operation::Send | Operation::Write | Operation::AtomicWrite, _) => self.push_ack(),
            _ => {}
        }
    }

    fn push_ack(&mut self) {
        self.ack_owed = false;
        self.nak_unanswered = false;
        // Coalesce: one ACK stands for every request before it (IBTA 9.7.5.2.1).
        if !matches!(self.replies.back(), Some(Reply::Ack)) {
            self.replies.push_back(Reply::Ack);
        }
    }

    /// Sends up to `budget` response packets, in PSN order.
    pub fn pump(&mut self, path: &Path, ctx: &mut Ctx<'_>, budget: usize) -> usize {
        let mut sent = 0;
        while sent < budget {
            let Some(front) = self.replies.front_mut() else {
                break;
            };
            match front {
                Reply::Ack => {
                    let aeth = AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn: self.msn };
                    path.send(ctx, &bare(path.bth(0x11, self.epsn.sub(1), 0), None, Some(aeth)));
                    self.replies.pop_front();
                }
                Reply::Nak(psn, syndrome) => {
                    let aeth = AethRepr { syndrome: *syndrome, msn: self.msn };
                    path.send(ctx, &bare(path.bth(0x11, *psn, 0), None, Some(aeth)));
                    self.replies.pop_front();
                }
                Reply::AtomicAck { psn, original } => {
                    let aeth = AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn: self.msn };
                    let mut repr = bare(path.bth(0x12, *psn, 0), None, Some(aeth));
                    repr.atomic_ack_eth = Some(AtomicAckEthRepr { original_data: *original });
                    path.send(ctx, &repr);
                    self.replies.pop_front();
                }
                Reply::Read(job) => {
                    if send_read_packet(job, self.msn, path, ctx) {
                        self.replies.pop_front();
                    }
                }
            }
            sent += 1;
        }
        sent
    }

    /// A short account for failure reports.
    pub fn summary(&self) -> String {
        let res: Vec<String> = self.resources.iter().map(|r| format!("{}+{}", r.first_psn, r.npkts)).collect();
        let replies: Vec<String> = self
            .replies
            .iter()
            .take(4)
            .map(|r| match r {
                Reply::Ack => "ack".to_string(),
                Reply::Nak(p, s) => format!("nak{p}{s:?}"),
                Reply::AtomicAck { psn, .. } => format!("aack{psn}"),
                Reply::Read(j) => format!("read{}:{}", j.psn, j.remaining),
            })
            .collect();
        format!(
            "epsn={} rq={} cur={} resources=[{}] replies({})=[{}]",
            self.epsn,
            self.rq.len(),
            self.cur.is_some(),
            res.join(","),
            self.replies.len(),
            replies.join(",")
        )
    }

    /// Replies waiting to be sent.
    pub fn pending_replies(&self) -> usize {
        self.replies.len()
    }
}

/// Sends the next READ response packet of `job`; true when it was the last.
fn send_read_packet(job: &mut ReadJob, msn: u32, path: &Path, ctx: &mut Ctx<'_>) -> bool {
    let n = job.remaining.min(path.mtu);
    let last = n == job.remaining;
    let opcode = match (job.first, last) {
        (true, true) => 0x10,
        (true, false) => 0x0d,
        (false, true) => 0x0f,
        (false, false) => 0x0e,
    };
    let aeth = (opcode != 0x0e).then_some(AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn });
    let mut repr = bare(path.bth(opcode, job.psn, n), None, aeth);
    repr.payload = super::placeholder(n);
    let (mem, offset) = (&job.mem, job.offset);
    if !path.send_filled(ctx, &repr, |_, out| mem.read(offset, out)) {
        // The region was revoked, or is on demand with nothing mapped there: the READ ends
        // with a Remote Access Error NAK at this response's PSN (IBTA 9.7.5.2.4), the
        // responses before it stand.
        ctx.stats.naks_sent += 1;
        let aeth = AethRepr { syndrome: Syndrome::Nak(NakCode::RemoteAccessError), msn };
        path.send(ctx, &bare(path.bth(0x11, job.psn, 0), None, Some(aeth)));
        return true;
    }
    job.psn = job.psn.next();
    job.offset += n;
    job.remaining -= n;
    job.first = false;
    last
}

enum Psn3 {
    Expected,
    Duplicate,
    Ahead,
}

/// What the responder needs of its QP.
pub struct QpView {
    /// QP number.
    pub qpn: u32,
    /// Protection domain.
    pub pd: Pd,
    /// Receive CQ.
    pub recv_cq: u32,
    /// Path MTU.
    pub mtu: usize,
    /// Q_Key (UD).
    pub qkey: u32,
    /// The sender's GID.
    pub src: crate::engine::verbs::Gid,
}

fn access_nak(_: MemError) -> Refusal {
    Refusal::Nak(NakCode::RemoteAccessError)
}

pub(crate) fn scatter_recv(sgl: &[Sge], mut offset: usize, mut data: &[u8], q: &QpView, ctx: &mut Ctx<'_>) -> bool {
    for s in sgl {
        let len = s.length as usize;
        if offset >= len {
            offset -= len;
            continue;
        }
        if data.is_empty() {
            return true;
        }
        let n = (len - offset).min(data.len());
        let Ok((mem, base)) = ctx.mrs.resolve(s.lkey, q.pd, s.addr + offset as u64, n, Need::LocalWrite) else {
            return false;
        };
        if !mem.write(base, &data[..n]) {
            return false;
        }
        data = &data[n..];
        offset = 0;
    }
    data.is_empty()
}

pub(crate) fn recv_wc(wr: &RecvWr, qpn: u32, status: WcStatus, byte_len: usize) -> Wc {
    Wc::new(wr.wr_id, status, WcOpcode::Recv, qpn, byte_len as u32)
}
