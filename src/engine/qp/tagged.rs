//! An RC QP on a tag-matching SRQ ([`crate::engine::tm`]): the first packet of each SEND
//! is matched against the SRQ's tagged buffers, and a matched rendezvous request becomes
//! an RDMA READ of the sender's buffer, then a FIN, both on this QP's send queue (which
//! the TM-SRQ owns, as Documentation/tag_matching.md says), completing on the SRQ's CQ.

use super::requester::{Requester, SendWqe};
use super::responder::{recv_wc, scatter_recv, Inbound, RecvWqe, Refusal, Responder};
use super::{Ctx, Path};
use crate::engine::mem::Pd;
use crate::engine::tm::{self, Matched, Rvh, TmWc, Tmh, TMH_BYTES};
use crate::engine::verbs::{RecvWr, Remote, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus};
use crate::engine::QpView;
use crate::proto::roce::{Psn, RoceRepr};

/// How a message taken by a TM-SRQ completes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TmRecv {
    opcode: WcOpcode,
    info: TmWc,
    /// A rendezvous request's trailing bytes: received, placed nowhere, not completed
    /// (its completions come from the READ it started).
    pub(crate) discard: bool,
    /// The TM-SRQ's CQ.
    pub(crate) cq: u32,
}

/// A matched rendezvous request, for the requester to read.
#[derive(Debug)]
pub(crate) struct RndvStart {
    recv: RecvWr,
    rvh: Rvh,
    info: TmWc,
    fin: [u8; 32],
    cq: u32,
}

/// A request a TM-SRQ put on a QP's send queue.
#[derive(Debug, Clone)]
pub enum TmJob {
    /// The READ of a matched rendezvous request: completes the tagged buffer.
    RndvRead { cq: u32, fin: [u8; 32] },
    /// The FIN that tells the sender its buffer is free: completes nowhere.
    Fin,
}

/// A tag-matching receive completion.
fn tm_wc(wr_id: u64, status: WcStatus, opcode: WcOpcode, qpn: u32, byte_len: usize, info: TmWc) -> Wc {
    let mut wc = Wc::new(wr_id, status, opcode, qpn, byte_len as u32);
    wc.tm = Some(info);
    wc
}

/// The completion of a receive that ended with `status` after `received` bytes.
pub(crate) fn finish_wc(wqe: &RecvWqe, qpn: u32, status: WcStatus, received: usize, tm: Option<&TmRecv>) -> Wc {
    match tm {
        Some(t) => tm_wc(wqe.wr.wr_id, status, t.opcode, qpn, received, t.info),
        None => recv_wc(&wqe.wr, qpn, status, received),
    }
}

impl Responder {
    /// True when this QP's SRQ matches tags.
    pub(crate) fn srq_is_tagged(&self, ctx: &Ctx<'_>) -> bool {
        self.srq.and_then(|id| ctx.srqs.get(&id)).is_some_and(|s| s.tm.is_some())
    }

    /// Starts a SEND into the TM-SRQ from its first packet `r`: a matched eager message
    /// goes to its tagged buffer, a matched rendezvous request to the requester, anything
    /// else to an ordinary receive (RNR without one). Returns the bytes of the first
    /// packet that are not placed (the headers of a matched message).
    pub(crate) fn start_tagged(
        &mut self,
        r: &RoceRepr<'_>,
        q: &QpView,
        ctx: &mut Ctx<'_>,
        only: bool,
    ) -> Result<usize, Refusal> {
        let Some(id) = self.srq else { return Err(Refusal::Drop) };
        let Some(list) = ctx.srqs.get_mut(&id).and_then(|s| s.tm.as_mut()) else { return Err(Refusal::Drop) };
        let cq = list.cq;
        let tmh = Tmh::parse(r.payload);
        let rvh = Rvh::parse(r.payload);
        let wants_match = match tmh {
            Some(h) if h.op == tm::TMH_EAGER => true,
            Some(h) if h.op == tm::TMH_RNDV => rvh.is_some(),
            _ => false,
        };
        let matched = tmh.filter(|_| wants_match).and_then(|h| list.take_match(h.tag).map(|m| (h, m)));
        if let Some((h, m)) = matched {
            let info = TmWc { flags: tm::WC_TM_MATCH, tag: h.tag, app_ctx: h.app_ctx };
            return match rvh.filter(|_| h.op == tm::TMH_RNDV) {
                Some(rvh) => Ok(self.start_rndv(m, rvh, info, r.payload, q, ctx, cq)),
                None => Ok(self.start_eager(m, info, q, ctx, cq, only)),
            };
        }
        // Not matched (no tag, no buffer for it, or no TMH at all): the whole message, headers
        // included, goes to an ordinary receive, for the application to match.
        let Some(wqe) = self.take_recv(ctx) else { return Err(Refusal::Rnr) };
        let opcode = match tmh {
            Some(h) if h.op == tm::TMH_NO_TAG => WcOpcode::TmNoTag,
            _ => WcOpcode::TmRecv,
        };
        if wants_match {
            // Only a tagged message that found no buffer is unexpected: tags added from
            // now on wait until the application has seen it (SYNC).
            if let Some(list) = ctx.srqs.get_mut(&id).and_then(|s| s.tm.as_mut()) {
                list.count_unexpected();
            }
        }
        let tm = TmRecv { opcode, info: TmWc::default(), discard: false, cq };
        self.cur = Some(Inbound::Send { wqe, received: 0, tm: Some(Box::new(tm)) });
        Ok(0)
    }

    /// A matched eager message: its data after the TMH goes to the tagged buffer. One of
    /// several packets reports the match now and the data when the last arrives.
    fn start_eager(&mut self, m: Matched, mut info: TmWc, q: &QpView, ctx: &mut Ctx<'_>, cq: u32, only: bool) -> usize {
        if only {
            info.flags |= tm::WC_TM_DATA_VALID;
        } else {
            ctx.complete(cq, tm_wc(m.recv.wr_id, WcStatus::Success, WcOpcode::TmRecv, q.qpn, 0, info));
            // The data's completion carries no TMH fields (mlx5's message completion
            // does not, and rdma-core's tests expect them zero).
            info = TmWc { flags: tm::WC_TM_DATA_VALID, ..TmWc::default() };
        }
        let tm = TmRecv { opcode: WcOpcode::TmRecv, info, discard: false, cq };
        self.cur = Some(Inbound::Send { wqe: RecvWqe::new(m.recv), received: 0, tm: Some(Box::new(tm)) });
        TMH_BYTES
    }

    /// A matched rendezvous request: the match completes now, and the requester reads the
    /// sender's buffer into the tagged one; a buffer too small for it gets the headers
    /// instead, completed `TmRndvIncomplete` for the application to finish the transfer.
    #[allow(clippy::too_many_arguments)]
    fn start_rndv(
        &mut self,
        m: Matched,
        rvh: Rvh,
        info: TmWc,
        payload: &[u8],
        q: &QpView,
        ctx: &mut Ctx<'_>,
        cq: u32,
    ) -> usize {
        let room = tm::capacity(&m.recv.sgl);
        if rvh.len as usize > room {
            let headers = &payload[..payload.len().min(TMH_BYTES + tm::RVH_BYTES).min(room)];
            let placed = scatter_recv(&m.recv.sgl, 0, headers, q, ctx);
            let status = if placed { WcStatus::TmRndvIncomplete } else { WcStatus::LocProtErr };
            ctx.complete(cq, tm_wc(m.recv.wr_id, status, WcOpcode::TmRecv, q.qpn, headers.len(), info));
        } else {
            ctx.complete(cq, tm_wc(m.recv.wr_id, WcStatus::Success, WcOpcode::TmRecv, q.qpn, 0, info));
            self.rndv = Some(Box::new(RndvStart { recv: m.recv, rvh, info, fin: tm::fin_payload(payload), cq }));
        }
        let tm = TmRecv { opcode: WcOpcode::TmRecv, info, discard: true, cq };
        let nothing = RecvWqe::new(RecvWr { wr_id: 0, sgl: Vec::new() });
        self.cur = Some(Inbound::Send { wqe: nothing, received: 0, tm: Some(Box::new(tm)) });
        payload.len()
    }
}

/// The first `len` bytes of `sgl`.
fn trim(sgl: &[Sge], mut len: usize) -> Vec<Sge> {
    let mut out = Vec::new();
    for s in sgl {
        if len == 0 {
            break;
        }
        let take = (s.length as usize).min(len);
        out.push(Sge { length: take as u32, ..*s });
        len -= take;
    }
    out
}

impl Requester {
    /// Reads a matched rendezvous request's data into its tagged buffer (the READ goes
    /// on this QP's send queue, which the TM-SRQ owns); a READ that cannot be posted
    /// completes the tagged buffer in error at once.
    pub(crate) fn post_rndv_read(&mut self, s: RndvStart, pd: Pd, path: &Path, ctx: &mut Ctx<'_>) {
        let wr = SendWr {
            wr_id: s.recv.wr_id,
            op: SendOp::Read(Remote { addr: s.rvh.va, rkey: s.rvh.rkey }),
            sgl: trim(&s.recv.sgl, s.rvh.len as usize),
            signaled: false,
            solicited: false,
            ud: None,
            xrc_srqn: 0,
        };
        if self.post_unchecked(wr, pd, ctx.mrs, path).is_err() {
            ctx.complete(s.cq, tm_wc(s.recv.wr_id, WcStatus::LocProtErr, WcOpcode::TmRecv, path.qpn, 0, s.info));
            return;
        }
        if let Some(w) = self.wqes.back_mut() {
            w.tm = Some(Box::new(TmJob::RndvRead { cq: s.cq, fin: s.fin }));
        }
    }

    /// A TM-SRQ's request finished with `status`: a rendezvous READ completes its tagged
    /// buffer (data valid) and, if it succeeded, sends the FIN.
    pub(crate) fn finish_tm_job(&mut self, job: &TmJob, w: &SendWqe, qpn: u32, status: WcStatus, ctx: &mut Ctx<'_>) {
        let TmJob::RndvRead { cq, fin } = *job else { return };
        // As an eager message's data completion: the match reported the TMH's fields.
        let flags = if status == WcStatus::Success { tm::WC_TM_DATA_VALID } else { 0 };
        ctx.complete(cq, tm_wc(w.wr.wr_id, status, WcOpcode::TmRecv, qpn, w.len, TmWc { flags, ..TmWc::default() }));
        if status == WcStatus::Success {
            self.wqes.push_back(fin_wqe(fin, w.pd));
        }
    }
}

/// The FIN SEND: the request's TMH and RVH with the FIN opcode.
fn fin_wqe(fin: [u8; 32], pd: Pd) -> SendWqe {
    let wr = SendWr {
        wr_id: 0,
        op: SendOp::Send,
        sgl: Vec::new(),
        signaled: false,
        solicited: false,
        ud: None,
        xrc_srqn: 0,
    };
    SendWqe {
        wr,
        data: fin.to_vec(),
        pd,
        len: fin.len(),
        first_psn: Psn::new(0),
        npkts: 1,
        started: false,
        next_pkt: 0,
        done_pkts: 0,
        done: None,
        tm: Some(Box::new(TmJob::Fin)),
    }
}

/// The completion a flushed request gives, with the CQ it goes to when that is not the
/// send CQ; a FIN gives none.
pub(crate) fn flushed(w: &SendWqe, qpn: u32) -> Option<(Option<u32>, Wc)> {
    match w.tm.as_deref() {
        None => Some((None, super::requester::wc(w, qpn, WcStatus::WrFlushErr))),
        Some(TmJob::RndvRead { cq, .. }) => {
            Some((Some(*cq), tm_wc(w.wr.wr_id, WcStatus::WrFlushErr, WcOpcode::TmRecv, qpn, 0, TmWc::default())))
        }
        Some(TmJob::Fin) => None,
    }
}
