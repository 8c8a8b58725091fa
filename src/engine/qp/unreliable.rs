//! The receive side of UC and UD (IBTA 9.8): no acknowledgements, no NAKs, no retries.
//! UC drops a damaged message and waits for the next FIRST or ONLY; UD checks the Q_Key and
//! delivers each datagram with the sender's QPN and GID.

use super::responder::{recv_wc, scatter_recv, Inbound, QpView, Responder};
use super::Ctx;
use crate::engine::verbs::{WcOpcode, WcStatus};
use crate::proto::roce::opcode::Operation;
use crate::proto::roce::RoceRepr;

/// Bytes of GRH at the start of every UD receive buffer (IBTA 11.4.1.2).
pub const GRH_LEN: usize = 40;

impl Responder {
    /// A UC request packet (IBTA 9.8.3).
    pub fn handle_uc(&mut self, r: &RoceRepr<'_>, q: &QpView, ctx: &mut Ctx<'_>) {
        let Some(info) = r.info() else { return };
        if !matches!(info.operation, Operation::Send | Operation::Write) {
            return;
        }
        let psn = r.bth.psn;
        // A PSN behind the expected one is a duplicate: UC delivers at most once.
        if self.epsn.distance_to(psn) < 0 {
            ctx.stats.duplicates_received += 1;
            return;
        }
        if psn != self.epsn {
            // A packet went missing: the message in progress is lost.
            self.abandon_uc_message(ctx);
            self.epsn = psn;
        }
        if self.uc_resync && !info.starts_message() {
            ctx.stats.uc_dropped += 1;
            self.epsn = psn.next();
            return;
        }
        self.uc_resync = false;
        let result = self
            .check_op_sequence(info.operation, info.position)
            .and_then(|_| self.check_resources(r, info.operation, info.position, ctx))
            .and_then(|_| self.check_length(r, q.mtu, info.position))
            .and_then(|_| match info.operation {
                Operation::Send => self.exec_send(r, info.position, q, ctx),
                _ => self.exec_write(r, info.position, q, ctx),
            });
        if result.is_err() {
            // UC never NAKs: no receive, a bad key or a bad length drops the message.
            ctx.stats.uc_dropped += 1;
            self.abandon_uc_message(ctx);
            self.epsn = psn.next();
        }
    }

    /// Gives an interrupted SEND's receive WQE back, so the next message uses it.
    fn abandon_uc_message(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(Inbound::Send { wqe, .. }) = self.cur.take() {
            self.give_back(wqe, ctx);
        }
        self.cur = None;
        self.uc_resync = true;
    }

    /// A UD datagram (IBTA 9.8.4): Q_Key check, then one receive WQE with a GRH first.
    pub fn handle_ud(&mut self, r: &RoceRepr<'_>, q: &QpView, ctx: &mut Ctx<'_>) {
        let (Some(info), Some(deth)) = (r.info(), r.deth) else { return };
        if info.operation != Operation::Send {
            return;
        }
        // IBTA 10.2.5 (C10-15): a datagram whose Q_Key differs from the QP's is dropped.
        if deth.qkey != q.qkey {
            ctx.stats.qkey_violations += 1;
            return;
        }
        if r.payload.len() > q.mtu {
            ctx.stats.uc_dropped += 1;
            return;
        }
        let Some(wqe) = self.take_recv(ctx) else {
            ctx.stats.ud_no_receive += 1;
            return;
        };
        let total = GRH_LEN + r.payload.len();
        if total > wqe.capacity {
            ctx.complete(q.recv_cq, recv_wc(&wqe.wr, q.qpn, WcStatus::LocLenErr, 0));
            return;
        }
        let grh = grh(q, r.payload.len());
        let ok = scatter_recv(&wqe.wr.sgl, 0, &grh, q, ctx) && scatter_recv(&wqe.wr.sgl, GRH_LEN, r.payload, q, ctx);
        let status = if ok { WcStatus::Success } else { WcStatus::LocProtErr };
        let mut wc = recv_wc(&wqe.wr, q.qpn, status, total);
        wc.opcode = WcOpcode::Recv;
        wc.imm = r.immdt.map(|i| i.imm);
        wc.solicited = r.bth.solicited;
        wc.src_qp = Some(deth.src_qp);
        wc.src_gid = Some(q.src);
        ctx.complete(q.recv_cq, wc);
        self.epsn = r.bth.psn.add(1);
    }
}

/// The 40-byte GRH a UD receive starts with: an IPv6-form header naming the source GID.
fn grh(q: &QpView, payload_len: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    g[0] = 0x60;
    g[4..6].copy_from_slice(&((payload_len + 8) as u16).to_be_bytes());
    g[6] = 0x1b; // next header: IB BTH
    g[7] = 64;
    g[8..24].copy_from_slice(&q.src);
    g
}
