//! A two-device harness over the simulator, with fixed connection attributes, and helpers
//! to inject hand-made packets and read what comes out.
#![allow(dead_code)]

use softrdma::engine::mem::{Access, Mr, Pd};
use softrdma::engine::verbs::*;
use softrdma::engine::{Device, DeviceConfig, Transmit};
use softrdma::proto::roce::bth::BthRepr;
use softrdma::proto::roce::packet::pad_for;
use softrdma::proto::roce::{Psn, RocePacket, RoceRepr};
use softrdma::sim::{Faults, Sim};

pub struct Pair {
    pub sim: Sim,
    pub qa: u32,
    pub qb: u32,
    pub cqa: u32,
    pub cqb: u32,
    pub ma: Mr,
    pub mb: Mr,
}

/// Connection attributes the tests choose.
#[derive(Clone, Copy)]
pub struct Attrs {
    pub mtu: Mtu,
    pub psn_a: u32,
    pub psn_b: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub ord: u8,
}

impl Default for Attrs {
    fn default() -> Self {
        Attrs {
            mtu: Mtu::M256,
            psn_a: 0x10,
            psn_b: 0x2000,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            ord: 4,
        }
    }
}

fn dev(i: u8) -> Device {
    Device::new(DeviceConfig {
        gid: gid_from_ipv4([10, 0, 0, i]),
        seed: u64::from(i),
        max_qps: 8,
        max_mrs: 8,
        cc: Default::default(),
    })
}

pub fn pair(at: Attrs) -> Pair {
    let mut sim = Sim::new(vec![dev(1), dev(2)], Faults::none(), 7);
    let mut qps = Vec::new();
    for d in 0..2 {
        let dv = &mut sim.devices[d];
        let cq = dv.create_cq(1024);
        let init =
            QpInit { qp_type: QpType::Rc, pd: Pd(1), send_cq: cq, recv_cq: cq, caps: QpCaps::default(), srq: None };
        qps.push((dv.create_qp(init).unwrap(), cq));
    }
    let psns = [at.psn_a, at.psn_b];
    for d in 0..2 {
        let (q, peer) = (qps[d].0, qps[1 - d].0);
        let peer_gid = sim.devices[1 - d].gid();
        let dv = &mut sim.devices[d];
        dv.modify_qp(q, &QpAttr { state: Some(QpState::Init), access: Some(Access::ALL), ..QpAttr::default() })
            .unwrap();
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            dest_gid: Some(peer_gid),
            dest_qpn: Some(peer),
            rq_psn: Some(psns[1 - d]),
            path_mtu: Some(at.mtu),
            max_dest_rd_atomic: Some(at.ord),
            min_rnr_timer: Some(at.min_rnr_timer),
            ..QpAttr::default()
        };
        dv.modify_qp(q, &rtr).unwrap();
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(psns[d]),
            timeout: Some(at.timeout),
            retry_cnt: Some(at.retry_cnt),
            rnr_retry: Some(at.rnr_retry),
            max_rd_atomic: Some(at.ord),
            ..QpAttr::default()
        };
        dv.modify_qp(q, &rts).unwrap();
    }
    let ma = sim.devices[0].reg_mr(Pd(1), 1 << 20, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 1 << 20, Access::ALL).unwrap();
    Pair { sim, qa: qps[0].0, qb: qps[1].0, cqa: qps[0].1, cqb: qps[1].1, ma, mb }
}

pub fn sge(m: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: m.addr + off as u64, length: len as u32, lkey: m.lkey }
}

pub fn remote(m: &Mr, off: usize) -> Remote {
    Remote { addr: m.addr + off as u64, rkey: m.rkey }
}

pub fn wr(wr_id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr { wr_id, op, sgl, signaled: true, solicited: false, ud: None }
}

impl Pair {
    pub fn cq(&self, dev: usize) -> u32 {
        if dev == 0 {
            self.cqa
        } else {
            self.cqb
        }
    }

    /// Steps until a completion shows on `dev`'s CQ.
    pub fn wait(&mut self, dev: usize) -> Wc {
        let cq = self.cq(dev);
        for _ in 0..1_000_000 {
            if let Some(wc) = self.sim.devices[dev].poll_cq(cq, 1).pop() {
                return wc;
            }
            if !self.sim.step() {
                break;
            }
        }
        panic!("no completion on device {dev}; {}", self.sim.devices[dev].qp_summary(self.qa));
    }

    /// Runs until nothing is left to happen.
    pub fn settle(&mut self) {
        self.sim.run_until(u64::MAX);
    }

    /// Everything completed on `dev` so far.
    pub fn completions(&mut self, dev: usize) -> Vec<Wc> {
        let cq = self.cq(dev);
        self.sim.devices[dev].poll_cq(cq, usize::MAX)
    }

    /// The PSN device 1 (B) expects next from A.
    pub fn b_epsn(&self) -> Psn {
        Psn::new(self.sim.devices[1].qp_psns(self.qb).unwrap().1)
    }

    /// Hands a hand-made packet from A to B directly (no link) and returns what B sends.
    pub fn inject_to_b(&mut self, r: &RoceRepr<'_>) -> Vec<RoceRepr<'static>> {
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf).unwrap();
        let src = self.sim.devices[0].gid();
        let now = self.sim.now;
        self.sim.devices[1].handle_packet(now, src, &buf);
        drain(&mut self.sim.devices[1], now)
    }
}

/// Takes every packet a device has to send, parsed (leaked: test-only).
pub fn drain(d: &mut Device, now: u64) -> Vec<RoceRepr<'static>> {
    let mut out = Vec::new();
    while let Some(Transmit { packet, .. }) = d.poll_transmit(now) {
        let bytes: &'static [u8] = Box::leak(packet.into_boxed_slice());
        out.push(RoceRepr::parse(&RocePacket::new_checked(bytes).unwrap()).unwrap());
    }
    out
}

/// A request packet from A to B's QP.
pub fn request(p: &Pair, opcode: u8, psn: Psn, payload: &'static [u8]) -> RoceRepr<'static> {
    let bth = BthRepr {
        opcode,
        solicited: false,
        mig_req: true,
        pad_count: pad_for(payload.len()),
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: p.qb,
        ack_req: true,
        psn,
    };
    RoceRepr {
        bth,
        deth: None,
        feth: None,
        reth: None,
        atomic_eth: None,
        aeth: None,
        atomic_ack_eth: None,
        immdt: None,
        ieth: None,
        payload,
    }
}
