//! Queue pairs: attributes and state (this file), the requester and completer (send side)
//! and the responder (receive side).

pub mod completer;
mod replies;
pub mod requester;
pub mod responder;
pub mod rtt;
pub mod state;
pub(crate) mod tagged;
pub mod unreliable;

use super::mem::{MrTable, Pd};
use super::verbs::{Gid, Mtu, QpAttr, QpInit, QpState, QpType, VerbsError, Wc};
use super::{Stats, Transmit};
use crate::proto::roce::bth::BthRepr;
use crate::proto::roce::{Psn, RoceRepr};
use requester::Requester;
use responder::Responder;
use std::collections::VecDeque;

/// Minimum RNR NAK timer values in ns, by 5-bit code (IBTA 9.7.5.2.8, Table 45).
pub const RNR_TIMER_NS: [u64; 32] = [
    655_360_000,
    10_000,
    20_000,
    30_000,
    40_000,
    60_000,
    80_000,
    120_000,
    160_000,
    240_000,
    320_000,
    480_000,
    640_000,
    960_000,
    1_280_000,
    1_920_000,
    2_560_000,
    3_840_000,
    5_120_000,
    7_680_000,
    10_240_000,
    15_360_000,
    20_480_000,
    30_720_000,
    40_960_000,
    61_440_000,
    81_920_000,
    122_880_000,
    163_840_000,
    245_760_000,
    327_680_000,
    491_520_000,
];

/// The local ACK timeout, 4.096 µs × 2^timeout (IBTA 9.7.6.1.3); 0 means infinite.
pub fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    (timeout != 0).then(|| 4096u64 << timeout.min(31))
}

/// What a QP borrows from its device while it works.
pub struct Ctx<'a> {
    /// Virtual time in ns.
    pub now: u64,
    /// Memory regions.
    pub mrs: &'a mut MrTable,
    /// Completion queues.
    pub cqs: &'a mut crate::engine::cq::CqTable,
    /// Packets to send.
    pub out: &'a mut VecDeque<Transmit>,
    /// Buffers to build packets in (`Device::recycle`).
    pub spare: &'a mut Vec<Vec<u8>>,
    /// Counters.
    pub stats: &'a mut Stats,
    /// Shared receive queues.
    pub srqs: &'a mut rustc_hash::FxHashMap<u32, crate::engine::srq::Srq>,
    /// Asynchronous events for the application.
    pub events: &'a mut crate::engine::event::AsyncEvents,
    /// Packets each QP may have in flight as its share of the device's loss-window budget
    /// (`u32::MAX`: no device budget).
    pub window_cap: u32,
}

impl Ctx<'_> {
    /// Adds a completion to a CQ.
    pub fn complete(&mut self, cq: u32, wc: Wc) {
        if self.cqs.push(cq, wc) {
            self.stats.completions += 1;
        }
    }
}

/// The connection attributes a QP uses on the wire.
#[derive(Debug, Clone)]
pub struct Path {
    /// This QP's number.
    pub qpn: u32,
    /// Local GID the QP sends from.
    pub src_gid: Gid,
    /// Peer GID.
    pub dest_gid: Gid,
    /// Peer QP number.
    pub dest_qpn: u32,
    /// Path MTU in bytes.
    pub mtu: usize,
    /// P_Key.
    pub pkey: u16,
    /// Transport.
    pub qp_type: QpType,
    /// Q_Key (UD).
    pub qkey: u32,
    /// An XRC QP: its packets carry XRC opcodes (RC's with the transport bits 101).
    pub xrc: bool,
}

impl Path {
    /// A BTH for this connection.
    pub fn bth(&self, opcode: u8, psn: Psn, payload_len: usize) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: crate::proto::roce::packet::pad_for(payload_len),
            tver: 0,
            pkey: self.pkey,
            fecn: false,
            becn: false,
            dest_qp: self.dest_qpn,
            ack_req: false,
            psn,
        }
    }
    /// Serializes `repr` (ICRC left for the transport) and queues it for the peer.
    pub fn send(&self, ctx: &mut Ctx<'_>, repr: &RoceRepr<'_>) {
        self.send_to(ctx, self.dest_gid, repr);
    }
    /// As [`Path::send`], with the payload (a placeholder in `repr`) written in place by
    /// `fill` from registered memory; false (nothing sent) when `fill` fails.
    pub fn send_filled(
        &self,
        ctx: &mut Ctx<'_>,
        repr: &RoceRepr<'_>,
        fill: impl FnOnce(&MrTable, &mut [u8]) -> bool,
    ) -> bool {
        self.emit_and_queue(ctx, self.dest_gid, repr, Some(fill))
    }

    /// Serializes `repr` and queues it for `dst` (UD).
    pub fn send_to(&self, ctx: &mut Ctx<'_>, dst: Gid, repr: &RoceRepr<'_>) {
        self.emit_and_queue(ctx, dst, repr, None::<fn(&MrTable, &mut [u8]) -> bool>);
    }

    /// Serializes `repr`, lets `fill` (if given) write its payload in place of the
    /// placeholder, and queues it for `dst`.
    fn emit_and_queue(
        &self,
        ctx: &mut Ctx<'_>,
        dst: Gid,
        repr: &RoceRepr<'_>,
        fill: Option<impl FnOnce(&MrTable, &mut [u8]) -> bool>,
    ) -> bool {
        // XRC opcodes are RC's with the transport bits 101 (IBTA 9.2.1, Table 38); the
        // requester has put the XRCETH on its requests.
        let xrc;
        let repr = if self.xrc && repr.bth.opcode < 0x20 {
            xrc = RoceRepr { bth: BthRepr { opcode: repr.bth.opcode | 0xa0, ..repr.bth }, ..*repr };
            &xrc
        } else {
            repr
        };
        // A recycled buffer keeps its old bytes: every one is written below (headers,
        // payload, pad, a zero ICRC), and clearing 4 KiB first, then copying a placeholder
        // payload over it, were 2.5 % and 3.1 % of a WRITE sender's samples.
        let mut buf = ctx.spare.pop().unwrap_or_default();
        buf.resize(repr.buffer_len(), 0);
        let written = match fill {
            None => repr.emit(&mut buf).is_ok(),
            Some(fill) => match repr.emit_around_payload(&mut buf) {
                Ok(at) => fill(ctx.mrs, &mut buf[at..at + repr.payload.len()]),
                Err(_) => false,
            },
        };
        if !written {
            ctx.spare.push(buf);
            return false;
        }
        ctx.stats.tx_packets += 1;
        ctx.out.push_back(Transmit { dst, src: self.src_gid, src_qpn: self.qpn, packet: buf });
        true
    }
}

/// The payload of a packet whose bytes [`Path::send_filled`] reads from registered memory
/// in place: a slice of its length (at most the largest MTU), never copied.
pub(super) fn placeholder(len: usize) -> &'static [u8] {
    static NONE_YET: [u8; 4096] = [0; 4096];
    &NONE_YET[..len]
}

/// A queue pair.
pub struct Qp {
    /// Creation parameters.
    pub init: QpInit,
    /// Current state.
    pub state: QpState,
    /// Wire attributes.
    pub path: Path,
    /// Send side.
    pub req: Requester,
    /// Receive side.
    pub resp: Responder,
    /// When this QP last sent a CNP.
    pub last_cnp: Option<u64>,
    /// Counted among the device's QPs with requests outstanding, which share its
    /// loss-window budget.
    pub window_busy: bool,
}

impl Qp {
    /// A new QP in RESET.
    pub fn new(qpn: u32, init: QpInit) -> Self {
        let mtu = if init.qp_type == QpType::Ud { Mtu::M4096 } else { Mtu::M1024 }.bytes();
        let path = Path {
            qpn,
            src_gid: [0; 16],
            dest_gid: [0; 16],
            dest_qpn: 0,
            mtu,
            pkey: 0xffff,
            qp_type: init.qp_type,
            qkey: 0,
            xrc: init.xrc.is_some(),
        };
        let mut resp = Responder::new(init.caps);
        resp.srq = init.srq;
        Qp {
            init,
            state: QpState::Reset,
            path,
            req: Requester::new(init.caps),
            resp,
            last_cnp: None,
            window_busy: false,
        }
    }

    /// The QP's protection domain.
    pub fn pd(&self) -> Pd {
        self.init.pd
    }

    /// modify-QP (IBTA 11.2.5.2): checks the transition table, applies the attributes.
    pub fn modify(&mut self, a: &QpAttr, ctx: &mut Ctx<'_>) -> Result<(), VerbsError> {
        let a = &state::without_other_half(self.init.xrc, a);
        let to = state::check(self.init.qp_type, self.init.xrc, self.state, a)?;
        if let Some(q) = a.qkey {
            self.path.qkey = q;
        }
        if let Some(g) = a.dest_gid {
            self.path.dest_gid = g;
        }
        if let Some(q) = a.dest_qpn {
            self.path.dest_qpn = q;
        }
        if let Some(m) = a.path_mtu {
            self.path.mtu = m.bytes();
        }
        if let Some(p) = a.pkey {
            self.path.pkey = p;
        }
        self.req.apply(a);
        self.resp.apply(a);
        if to == QpState::Reset {
            // The loss window is the device's setting, not the old connection's state.
            let window = self.req.window.as_ref().map(crate::engine::cc::LossWindow::restarted);
            self.req = Requester::new(self.init.caps);
            self.req.window = window;
            self.resp = Responder::new(self.init.caps);
            self.resp.srq = self.init.srq;
        }
        let was = self.state;
        self.state = to;
        if to == QpState::Err {
            self.flush(ctx);
            self.note_last_wqe(was, ctx);
            if was != QpState::Err {
                ctx.events.note_qp_error(self.path.qpn);
            }
        }
        Ok(())
    }

    /// Moves to ERR and flushes every outstanding work request (IBTA 10.3.1.7).
    pub fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        let was = self.state;
        self.state = QpState::Err;
        self.flush(ctx);
        self.note_last_wqe(was, ctx);
        if was != QpState::Err {
            ctx.events.note_qp_error(self.path.qpn);
        }
    }

    /// Moves a UD or UC QP to SQE after a send failed: the rest of its send queue is
    /// flushed and it sends nothing more until moved back to RTS, while its receive queue
    /// goes on (IBTA vol. 1 10.3.1, the SQEr state).
    pub fn enter_send_queue_error(&mut self, ctx: &mut Ctx<'_>) {
        self.state = QpState::Sqe;
        for (cq, wc) in self.req.flush(self.path.qpn) {
            ctx.complete(cq.unwrap_or(self.init.send_cq), wc);
        }
    }

    /// A QP on an SRQ entering ERR raises "last WQE reached" once (IBTA 10.2.9.5): the
    /// application may then take it off the SRQ knowing no receive is still in flight.
    fn note_last_wqe(&self, was: QpState, ctx: &mut Ctx<'_>) {
        if was != QpState::Err && self.resp.srq.is_some() {
            ctx.events.raise(crate::engine::event::AsyncEvent::LastWqeReached(self.path.qpn));
        }
    }

    fn flush(&mut self, ctx: &mut Ctx<'_>) {
        let (qpn, send_cq, recv_cq) = (self.path.qpn, self.init.send_cq, self.init.recv_cq);
        for (cq, wc) in self.req.flush(qpn) {
            ctx.complete(cq.unwrap_or(send_cq), wc);
        }
        for wc in self.resp.flush(qpn) {
            ctx.complete(recv_cq, wc);
        }
    }

    /// The earliest timer deadline of this QP.
    pub fn deadline(&self) -> Option<u64> {
        if self.state == QpState::Err {
            return None;
        }
        self.req.deadline()
    }
}
