//! A device's raw packet QPs: a frame posted on one goes, when it is posted, to the raw
//! QPs of the same device whose flow rules take it ([`super::raw`]), as an RDMA NIC's own
//! switch loops a port's frames back to its flows. A softrdma device on kernel UDP sockets
//! has no Ethernet port of its own, so a frame no rule takes goes nowhere.

use super::qp::requester::gather;
use super::qp::responder::{recv_wc, scatter_recv, QpView};
use super::raw::{FlowError, FlowRule};
use super::verbs::{QpState, QpType, SendOp, SendWr, VerbsError, Wc, WcOpcode, WcStatus};
use super::Device;

/// The shortest frame a raw QP sends: an Ethernet header.
pub const RAW_FRAME_MIN_BYTES: usize = 14;
/// The longest: a jumbo frame without its FCS.
pub const RAW_FRAME_MAX_BYTES: usize = 9216;

impl Device {
    /// Adds a flow rule steering frames to raw packet QP `qpn` (`ibv_create_flow`);
    /// returns its id.
    pub fn create_flow(&mut self, qpn: u32, rule: FlowRule) -> Result<u32, VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound)?;
        if qp.init.qp_type != QpType::RawPacket {
            return Err(VerbsError::Unsupported);
        }
        self.flows.add(qpn, rule).map_err(|e| match e {
            FlowError::Malformed => VerbsError::InvalidRequest,
            FlowError::TooMany => VerbsError::QueueFull,
        })
    }

    /// Removes flow rule `id` (`ibv_destroy_flow`).
    pub fn destroy_flow(&mut self, id: u32) -> Result<(), VerbsError> {
        self.flows.remove(id).then_some(()).ok_or(VerbsError::NotFound)
    }

    /// Sends a raw packet QP's frame at once: gathered, handed to the QPs whose rules take
    /// it, and completed (when signaled, or in error).
    pub(super) fn send_raw(&mut self, qpn: u32, wr: SendWr) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound)?;
        if wr.op != SendOp::Send || wr.sgl.len() > qp.init.caps.max_sge {
            return Err(VerbsError::InvalidRequest);
        }
        let (pd, send_cq) = (qp.init.pd, qp.init.send_cq);
        let status = match gather(&wr.sgl, pd, &self.mrs) {
            Ok(frame) if (RAW_FRAME_MIN_BYTES..=RAW_FRAME_MAX_BYTES).contains(&frame.len()) => {
                for target in self.flows.targets(&frame) {
                    if target != qpn {
                        self.take_raw_frame(target, &frame);
                    }
                }
                WcStatus::Success
            }
            Ok(_) => WcStatus::LocLenErr,
            Err(()) => WcStatus::LocProtErr,
        };
        if wr.signaled || status != WcStatus::Success {
            let len = wr.sgl.iter().map(|s| s.length).sum();
            if self.cqs.push(send_cq, Wc::new(wr.wr_id, status, WcOpcode::Send, qpn, len)) {
                self.stats.completions += 1;
            }
        }
        Ok(())
    }

    /// Raw packet QP `qpn` receives `frame` into its next receive request, whole; with no
    /// request posted, or not yet ready to receive, it drops it, as a NIC does.
    fn take_raw_frame(&mut self, qpn: u32, frame: &[u8]) {
        let (qps, mut ctx) = self.split(0);
        let Some(qp) = qps.get_mut(&qpn).filter(|q| matches!(q.state, QpState::Rtr | QpState::Rts | QpState::Sqd))
        else {
            return;
        };
        let q = QpView { qpn, pd: qp.init.pd, recv_cq: qp.init.recv_cq, mtu: frame.len(), qkey: 0, src: [0; 16] };
        let Some(wqe) = qp.resp.take_recv(&mut ctx) else {
            ctx.stats.raw_no_receive += 1;
            return;
        };
        let status = if frame.len() > wqe.capacity {
            WcStatus::LocLenErr
        } else if scatter_recv(&wqe.wr.sgl, 0, frame, &q, &mut ctx) {
            WcStatus::Success
        } else {
            WcStatus::LocProtErr
        };
        let len = if status == WcStatus::Success { frame.len() } else { 0 };
        ctx.complete(q.recv_cq, recv_wc(&wqe.wr, qpn, status, len));
    }
}
