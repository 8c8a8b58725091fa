//! A device's raw packet QPs: a frame posted on one goes, when it is posted, to the raw
//! QPs of the same device whose flow rules take it ([`super::raw`]), as an RDMA NIC's own
//! switch loops a port's frames back to its flows; a frame no rule of the device takes goes
//! to the wire if the device has one ([`Device::set_raw_wire`]: a device on raw Ethernet),
//! and nowhere on kernel UDP sockets. Frames from the wire that are not the device's own
//! traffic come back through [`Device::handle_raw_frame`].

use super::qp::requester::gather;
use super::qp::responder::{recv_wc, scatter_recv, QpView, RecvWqe};
use super::qp::Ctx;
use super::raw::{FlowError, FlowRule, RxHash, HASH_FIELDS_KNOWN};
use super::verbs::{QpState, QpType, SendOp, SendWr, VerbsError, Wc, WcOpcode, WcStatus};
use super::Device;

/// The shortest frame a raw QP sends: an Ethernet header.
pub const RAW_FRAME_MIN_BYTES: usize = 14;
/// The longest: a jumbo frame without its FCS.
pub const RAW_FRAME_MAX_BYTES: usize = 9216;
/// Most frames waiting for the driver to put them on the wire: it takes them after each
/// post, so only a driver that stopped taking them reaches this (the rest are dropped).
pub const RAW_WIRE_QUEUE_MAX: usize = 1024;
/// The largest receive-side scaling indirection table (verbs' `log_ind_tbl_size` up to 16).
pub const RSS_TABLE_MAX: usize = 1 << 16;

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

    /// The device has an Ethernet port (a raw device): frames its raw QPs send that no rule
    /// of its own takes go out ([`Device::poll_raw_frame`]).
    pub fn set_raw_wire(&mut self, on: bool) {
        self.raw_wire = on;
    }

    /// The next frame for the wire, whole.
    pub fn poll_raw_frame(&mut self) -> Option<Vec<u8>> {
        self.raw_out.pop_front()
    }

    /// A frame from the wire that is not the device's RoCEv2, ARP or neighbour traffic:
    /// to the raw QPs whose rules take it, and the sniffers.
    pub fn handle_raw_frame(&mut self, frame: &[u8]) {
        if self.flows.is_empty() {
            return;
        }
        for q in self.flows.targets(frame) {
            self.take_raw_frame(q, frame);
        }
    }

    /// Makes raw packet QP `qpn` a receive-side scaling QP (`ibv_create_qp_ex` with an
    /// indirection table and a hash): what its rules take goes to the work queue the
    /// frame's hash picks, and it sends nothing. Its work queues' SRQs are held until the QP
    /// is destroyed.
    pub fn set_rx_hash(&mut self, qpn: u32, h: RxHash) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound)?;
        if qp.init.qp_type != QpType::RawPacket || self.rss.contains_key(&qpn) {
            return Err(VerbsError::InvalidRequest);
        }
        if h.fields & !HASH_FIELDS_KNOWN != 0 {
            return Err(VerbsError::Unsupported);
        }
        let known = h.table.iter().all(|w| self.srqs.contains_key(&w.srq) && self.cqs.contains(w.cq));
        if !known || h.table.is_empty() || h.table.len() > RSS_TABLE_MAX {
            return Err(VerbsError::InvalidRequest);
        }
        for w in &h.table {
            *self.srq_holders.entry(w.srq).or_default() += 1;
        }
        self.rss.insert(qpn, h);
        Ok(())
    }

    /// QP `qpn` is gone: its work queues are free.
    pub(super) fn forget_raw_qp(&mut self, qpn: u32) {
        self.flows.forget_qp(qpn);
        for w in self.rss.remove(&qpn).map(|h| h.table).unwrap_or_default() {
            self.release_srq(w.srq);
        }
    }

    /// Sends a raw packet QP's frame at once: gathered, handed to the QPs whose rules take
    /// it, and completed (when signaled, or in error).
    pub(super) fn send_raw(&mut self, qpn: u32, wr: SendWr) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound)?;
        if wr.op != SendOp::Send || wr.sgl.len() > qp.init.caps.max_sge {
            return Err(VerbsError::InvalidRequest);
        }
        if self.rss.contains_key(&qpn) {
            return Err(VerbsError::InvalidRequest); // receive-side scaling QPs only receive
        }
        let (pd, send_cq) = (qp.init.pd, qp.init.send_cq);
        let status = match gather(&wr.sgl, pd, &self.mrs) {
            Ok(frame) if (RAW_FRAME_MIN_BYTES..=RAW_FRAME_MAX_BYTES).contains(&frame.len()) => {
                self.switch_frame(qpn, frame);
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

    /// A frame raw QP `from` sent: to the QPs whose rules take it (not back to `from`), the
    /// sniffers, and the wire if no rule of the device took it.
    fn switch_frame(&mut self, from: u32, frame: Vec<u8>) {
        let route = self.flows.route(&frame);
        let takers: Vec<u32> = route.takers.into_iter().filter(|&q| q != from).collect();
        // A QP that both takes the frame and sniffs gets it once.
        let mut to: Vec<u32> = takers.iter().chain(&route.sniffers).copied().filter(|&q| q != from).collect();
        to.sort_unstable();
        to.dedup();
        for q in to {
            self.take_raw_frame(q, &frame);
        }
        if takers.is_empty() && self.raw_wire {
            if self.raw_out.len() < RAW_WIRE_QUEUE_MAX {
                self.raw_out.push_back(frame);
            } else {
                self.stats.raw_wire_dropped += 1;
            }
        }
    }

    /// Raw packet QP `qpn` receives `frame` into its next receive request, whole; with no
    /// request posted, or not yet ready to receive, it drops it, as a NIC does.
    fn take_raw_frame(&mut self, qpn: u32, frame: &[u8]) {
        if let Some(h) = self.rss.get(&qpn) {
            return self.take_hashed_frame(qpn, h.pick(frame), frame);
        }
        let (qps, mut ctx) = self.split(0);
        let Some(qp) = qps.get_mut(&qpn).filter(|q| matches!(q.state, QpState::Rtr | QpState::Rts | QpState::Sqd))
        else {
            return;
        };
        let q = QpView { qpn, pd: qp.init.pd, recv_cq: qp.init.recv_cq, mtu: frame.len(), qkey: 0, src: [0; 16] };
        let wqe = qp.resp.take_recv(&mut ctx);
        place_frame(wqe, frame, &q, &mut ctx);
    }

    /// RSS QP `qpn`'s frame into work queue `wq`: its SRQ's next receive, completed on its
    /// CQ (with the QP's number; no receive: dropped), whatever the QP's state.
    fn take_hashed_frame(&mut self, qpn: u32, wq: Option<super::raw::WorkQueue>, frame: &[u8]) {
        // An RSS QP has no state of its own to wait for (as mlx5's, which only steer).
        let Some(wq) = wq else { return };
        let (_, mut ctx) = self.split(0);
        let wqe = ctx.srqs.get_mut(&wq.srq).and_then(|s| s.take().0);
        let q = QpView { qpn, pd: wq.pd, recv_cq: wq.cq, mtu: frame.len(), qkey: 0, src: [0; 16] };
        place_frame(wqe, frame, &q, &mut ctx);
    }
}

/// `frame`, whole, into receive request `wqe` (none: dropped and counted), completed on
/// `q`'s CQ: in error if it does not fit or its memory refuses it.
fn place_frame(wqe: Option<RecvWqe>, frame: &[u8], q: &QpView, ctx: &mut Ctx<'_>) {
    let Some(wqe) = wqe else {
        ctx.stats.raw_no_receive += 1;
        return;
    };
    let status = if frame.len() > wqe.capacity {
        WcStatus::LocLenErr
    } else if scatter_recv(&wqe.wr.sgl, 0, frame, q, ctx) {
        WcStatus::Success
    } else {
        WcStatus::LocProtErr
    };
    let len = if status == WcStatus::Success { frame.len() } else { 0 };
    ctx.complete(q.recv_cq, recv_wc(&wqe.wr, q.qpn, status, len));
}
