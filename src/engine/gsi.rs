//! The General Services Interface on QP1 (IBTA 13.5.3): UD with the well-known Q_Key, MADs
//! in and out on the same UDP port as the data. Its only class here is the CM
//! ([`crate::cm`]), which rdma_cm speaks on RoCEv2.

use super::qp::Ctx;
use super::verbs::{Gid, QpAttr, VerbsError};
use super::{Device, Transmit};
use crate::cm::{Cm, QpControl};
use crate::proto::cm::mad::MAD_LEN;
use crate::proto::cm::{GSI_QKEY, GSI_QPN};
use crate::proto::roce::ext::DethRepr;
use crate::proto::roce::{BthRepr, Psn, RoceRepr};

/// UD SEND Only: the one opcode a MAD travels in (IBTA 13.5.3.1).
const UD_SEND_ONLY: u8 = 0x64;

/// The QPs, as the CM may change them.
pub(super) struct QpsOf<'a> {
    pub qps: &'a mut super::QpMap,
    pub ctx: Ctx<'a>,
}

impl QpControl for QpsOf<'_> {
    fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<(), VerbsError> {
        self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound)?.modify(attr, &mut self.ctx)
    }
}

/// GSI counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsiStats {
    /// Datagrams for QP1 dropped: not UD SEND Only, a P_Key outside the default partition,
    /// a Q_Key other than 0x80010000, or shorter than a MAD.
    pub dropped: u64,
}

impl Device {
    /// Runs `f` on the CM with the QPs it may change, then queues the MADs it produced.
    pub fn with_cm<T>(&mut self, now: u64, f: impl FnOnce(&mut Cm, &mut dyn QpControl) -> T) -> T {
        let (qps, ctx, cm) = self.split_cm(now);
        let out = f(cm, &mut QpsOf { qps, ctx });
        self.send_mads();
        self.touch_all();
        out
    }

    /// The CM's counters.
    pub fn cm_stats(&self) -> crate::cm::CmStats {
        self.cm.stats
    }

    /// A datagram for QP1 (IBTA 13.5.3): checked as the GSI must, then to the CM.
    pub(super) fn gsi_receive(&mut self, now: u64, src: Gid, r: &RoceRepr<'_>) {
        // 10.9.4 / C13-11: QP1 takes any P_Key of the port's table (here the default
        // partition, full or limited member) and only the GSI Q_Key.
        let pkey_ok = r.bth.pkey & 0x7fff == 0x7fff;
        let qkey_ok = r.deth.is_some_and(|d| d.qkey == GSI_QKEY);
        if r.bth.opcode != UD_SEND_ONLY || !pkey_ok || !qkey_ok || r.payload.len() < MAD_LEN {
            self.gsi_stats.dropped += 1;
            return;
        }
        let local = self.cfg.gid;
        let mad = &r.payload[..MAD_LEN];
        self.with_cm(now, |cm, qps| cm.handle_mad(now, src, local, mad, qps));
    }

    /// Wraps each MAD the CM produced in a UD SEND from QP1 to QP1.
    fn send_mads(&mut self) {
        while let Some(m) = self.cm.poll_transmit() {
            let bth = BthRepr {
                opcode: UD_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                tver: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: GSI_QPN,
                ack_req: false,
                psn: Psn::new(self.gsi_psn),
            };
            self.gsi_psn = (self.gsi_psn + 1) & 0xff_ffff;
            let mut repr = super::qp::requester::bare(bth, None, None);
            repr.deth = Some(DethRepr { qkey: GSI_QKEY, src_qp: GSI_QPN });
            repr.payload = &m.mad[..];
            let mut packet = vec![0u8; repr.buffer_len()];
            if repr.emit(&mut packet).is_ok() {
                self.stats.tx_packets += 1;
                self.out.push_back(Transmit { dst: m.dst, src: m.src, src_qpn: GSI_QPN, packet });
            }
        }
    }
}
