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

pub fn dev(i: u8) -> Device {
    Device::new(DeviceConfig {
        gid: gid_from_ipv4([10, 0, 0, i]),
        seed: Some(u64::from(i)),
        max_qps: 8,
        max_mrs: 8,
        cc: Default::default(),
    })
}

/// Creates a QP of type `ty` on each device (with `cqs` and, on device 1, `srq_b`) and
/// takes both through RESET, INIT, RTR, RTS towards each other. `gids` names the GIDs the
/// QPs address each other by (default: each device's first) and `sgid_index` the local one.
pub fn connect_qps(
    sim: &mut Sim,
    ty: QpType,
    at: &Attrs,
    cqs: [u32; 2],
    srq_b: Option<u32>,
    gids: Option<([Gid; 2], u8)>,
) -> [u32; 2] {
    let mut q = [0u32; 2];
    for d in 0..2 {
        let srq = if d == 1 { srq_b } else { None };
        let init = QpInit {
            qp_type: ty,
            pd: Pd(1),
            send_cq: cqs[d],
            recv_cq: cqs[d],
            caps: QpCaps::default(),
            srq,
            xrc: None,
        };
        q[d] = sim.devices[d].create_qp(init).unwrap();
    }
    let psns = [at.psn_a, at.psn_b];
    for d in 0..2 {
        let peer_gid = gids.map_or(sim.devices[1 - d].gid(), |(g, _)| g[1 - d]);
        let dv = &mut sim.devices[d];
        let (init, rtr, rts) = attrs_for(ty, at, peer_gid, q[1 - d], psns[1 - d], psns[d], d);
        let rtr = QpAttr { sgid_index: gids.map(|(_, i)| i), ..rtr };
        dv.modify_qp(q[d], &init).unwrap();
        dv.modify_qp(q[d], &rtr).unwrap();
        dv.modify_qp(q[d], &rts).unwrap();
    }
    q
}

/// The INIT, RTR and RTS attributes of one side, by transport (IBTA 11.2.5.2 tables).
pub fn attrs_for(
    ty: QpType,
    at: &Attrs,
    peer_gid: Gid,
    peer_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
    d: usize,
) -> (QpAttr, QpAttr, QpAttr) {
    let state = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    if ty == QpType::Ud {
        let init = QpAttr { qkey: Some(0x1111_0000 + d as u32), ..state(QpState::Init) };
        return (init, state(QpState::Rtr), QpAttr { sq_psn: Some(sq_psn), ..state(QpState::Rts) });
    }
    let init = QpAttr { access: Some(Access::ALL), ..state(QpState::Init) };
    let mut rtr = QpAttr {
        dest_gid: Some(peer_gid),
        dest_qpn: Some(peer_qpn),
        rq_psn: Some(rq_psn),
        path_mtu: Some(at.mtu),
        ..state(QpState::Rtr)
    };
    let mut rts = QpAttr { sq_psn: Some(sq_psn), ..state(QpState::Rts) };
    if ty == QpType::Rc {
        rtr = QpAttr { max_dest_rd_atomic: Some(at.ord), min_rnr_timer: Some(at.min_rnr_timer), ..rtr };
        rts = QpAttr {
            timeout: Some(at.timeout),
            retry_cnt: Some(at.retry_cnt),
            rnr_retry: Some(at.rnr_retry),
            max_rd_atomic: Some(at.ord),
            ..rts
        };
    }
    (init, rtr, rts)
}

/// Two devices on a clean link (device seeds 1 and 2; link seed `seed`).
pub fn sim_pair(faults: Faults, seed: u64) -> Sim {
    Sim::new(vec![dev(1), dev(2)], faults, seed)
}

pub fn pair(at: Attrs) -> Pair {
    let mut sim = sim_pair(Faults::none(), 7);
    let cqs = [sim.devices[0].create_cq(1024), sim.devices[1].create_cq(1024)];
    let q = connect_qps(&mut sim, QpType::Rc, &at, cqs, None, None);
    let ma = sim.devices[0].reg_mr(Pd(1), 1 << 20, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 1 << 20, Access::ALL).unwrap();
    Pair { sim, qa: q[0], qb: q[1], cqa: cqs[0], cqb: cqs[1], ma, mb }
}

pub fn sge(m: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: m.addr + off as u64, length: len as u32, lkey: m.lkey }
}

pub fn remote(m: &Mr, off: usize) -> Remote {
    Remote { addr: m.addr + off as u64, rkey: m.rkey }
}

pub fn wr(wr_id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr { wr_id, op, sgl, signaled: true, solicited: false, ud: None, xrc_srqn: 0 }
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
    RoceRepr::bare(bth, payload)
}
