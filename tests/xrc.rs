//! XRC (IBTA vol.1 9.3.6, 14.2) between two engines in the simulator: one initiator
//! reaches every XRC SRQ of the target's domain through one target QP; each request is
//! received from, checked in the PD of, and completed on the CQ of the SRQ its XRCETH
//! names; an SRQ of another domain, or none, is an invalid request.

mod common;

use common::*;
use softrdma::engine::mem::{Access, Pd};
use softrdma::engine::srq::XrcSrq;
use softrdma::engine::verbs::*;
use softrdma::engine::Device;
use softrdma::proto::roce::ext::{NakCode, Syndrome, XrcEthRepr};
use softrdma::proto::roce::Psn;
use softrdma::sim::{Faults, Sim};

struct Xrc2 {
    sim: Sim,
    ini: u32,
    tgt: u32,
    send_cq: u32,
    srq_cqs: [u32; 2],
    srqs: [u32; 2],
    other_domain_srq: u32,
}

fn connect(d: &mut Device, qpn: u32, peer: Gid, peer_qpn: u32, psns: (u32, u32), rts: bool) {
    let state = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    d.modify_qp(qpn, &QpAttr { access: Some(Access::ALL), ..state(QpState::Init) }).unwrap();
    let rtr = QpAttr {
        dest_gid: Some(peer),
        dest_qpn: Some(peer_qpn),
        rq_psn: Some(psns.0),
        path_mtu: Some(Mtu::M1024),
        max_dest_rd_atomic: Some(4),
        min_rnr_timer: Some(1),
        ..state(QpState::Rtr)
    };
    d.modify_qp(qpn, &rtr).unwrap();
    if rts {
        let rts = QpAttr {
            sq_psn: Some(psns.1),
            timeout: Some(10),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..state(QpState::Rts)
        };
        d.modify_qp(qpn, &rts).unwrap();
    }
}

/// Device 0 holds an initiator; device 1 a target in domain X with two SRQs of X (in PDs
/// 1 and 2, each with its CQ) and one SRQ of another domain Y.
fn setup(faults: Faults) -> Xrc2 {
    let mut sim = Sim::new(vec![dev(1), dev(2)], faults, 11);
    let send_cq = sim.devices[0].create_cq(256);
    let b = &mut sim.devices[1];
    let (x, y) = (b.alloc_xrcd(), b.alloc_xrcd());
    let srq_cqs = [b.create_cq(256), b.create_cq(256)];
    let srqs = [
        b.create_xrc_srq(XrcSrq { xrcd: x, pd: Pd(1), cq: srq_cqs[0] }, 64, 2).unwrap(),
        b.create_xrc_srq(XrcSrq { xrcd: x, pd: Pd(2), cq: srq_cqs[1] }, 64, 2).unwrap(),
    ];
    let other_domain_srq = b.create_xrc_srq(XrcSrq { xrcd: y, pd: Pd(1), cq: srq_cqs[0] }, 64, 2).unwrap();
    let caps = QpCaps::default();
    let tgt_init = QpInit {
        qp_type: QpType::Rc,
        pd: Pd(0),
        send_cq: 0,
        recv_cq: 0,
        caps,
        srq: None,
        xrc: Some(Xrc::Target { xrcd: x }),
    };
    let tgt = b.create_qp(tgt_init).unwrap();
    let ini_init =
        QpInit { qp_type: QpType::Rc, pd: Pd(1), send_cq, recv_cq: 0, caps, srq: None, xrc: Some(Xrc::Initiator) };
    let ini = sim.devices[0].create_qp(ini_init).unwrap();
    let (ga, gb) = (sim.devices[0].gid(), sim.devices[1].gid());
    connect(&mut sim.devices[0], ini, gb, tgt, (0x300, 0x100), true);
    connect(&mut sim.devices[1], tgt, ga, ini, (0x100, 0x300), false);
    Xrc2 { sim, ini, tgt, send_cq, srq_cqs, srqs, other_domain_srq }
}

fn xrc_wr(id: u64, op: SendOp, sgl: Vec<Sge>, srqn: u32) -> SendWr {
    SendWr { xrc_srqn: srqn, ..wr(id, op, sgl) }
}

fn wait(sim: &mut Sim, d: usize, cq: u32) -> Wc {
    for _ in 0..1_000_000 {
        if let Some(wc) = sim.devices[d].poll_cq(cq, 1).pop() {
            return wc;
        }
        if !sim.step() {
            break;
        }
    }
    panic!("no completion on device {d} CQ {cq}");
}

#[test]
fn one_initiator_reaches_each_srq_of_the_domain_through_one_target() {
    let mut x = setup(Faults::none());
    let src = x.sim.devices[0].reg_mr(Pd(1), 8192, Access::ALL).unwrap();
    src.mem.write(0, &pattern_bytes(3000));
    let bufs = [
        x.sim.devices[1].reg_mr(Pd(1), 8192, Access::ALL).unwrap(),
        x.sim.devices[1].reg_mr(Pd(2), 8192, Access::ALL).unwrap(),
    ];
    for (i, (srq, buf)) in x.srqs.iter().zip(&bufs).enumerate() {
        let recv = RecvWr { wr_id: 50 + i as u64, sgl: vec![sge(buf, 0, 4096)] };
        x.sim.devices[1].post_srq_recv(*srq, recv).unwrap();
    }
    // A 3000-byte SEND (three packets at MTU 1024) to each SRQ: each lands in its own.
    for (i, srq) in x.srqs.iter().enumerate() {
        x.sim.devices[0].post_send(x.ini, xrc_wr(i as u64, SendOp::Send, vec![sge(&src, 0, 3000)], *srq)).unwrap();
        let wc = wait(&mut x.sim, 1, x.srq_cqs[i]);
        assert_eq!((wc.wr_id, wc.status, wc.byte_len, wc.qpn), (50 + i as u64, WcStatus::Success, 3000, x.tgt));
        assert_eq!(bufs[i].mem.to_vec()[..3000], pattern_bytes(3000)[..], "SRQ {i}'s buffer");
        assert_eq!(wait(&mut x.sim, 0, x.send_cq).status, WcStatus::Success);
    }
    // A WRITE is checked in the PD of the SRQ it names: PD 2's region through SRQ 1 only.
    let into_pd2 = remote(&bufs[1], 4096);
    x.sim.devices[0].post_send(x.ini, xrc_wr(7, SendOp::Write(into_pd2), vec![sge(&src, 0, 100)], x.srqs[1])).unwrap();
    assert_eq!(wait(&mut x.sim, 0, x.send_cq).status, WcStatus::Success);
    x.sim.devices[0]
        .post_send(x.ini, xrc_wr(8, SendOp::Read(into_pd2), vec![sge(&src, 4096, 100)], x.srqs[1]))
        .unwrap();
    assert_eq!(wait(&mut x.sim, 0, x.send_cq).status, WcStatus::Success);
    assert_eq!(src.mem.to_vec()[4096..4196], pattern_bytes(100)[..], "READ through the target");
    x.sim.devices[0].post_send(x.ini, xrc_wr(9, SendOp::Write(into_pd2), vec![sge(&src, 0, 8)], x.srqs[0])).unwrap();
    assert_eq!(wait(&mut x.sim, 0, x.send_cq).status, WcStatus::RemAccessErr, "PD 1 does not hold it");
}

#[test]
fn an_srq_of_another_domain_or_none_is_an_invalid_request() {
    for srqn in [0x00ab_cdef, 0] {
        let mut x = setup(Faults::none());
        let other = if srqn == 0 { x.other_domain_srq } else { srqn };
        let src = x.sim.devices[0].reg_mr(Pd(1), 64, Access::ALL).unwrap();
        x.sim.devices[0].post_send(x.ini, xrc_wr(1, SendOp::Send, vec![sge(&src, 0, 8)], other)).unwrap();
        assert_eq!(wait(&mut x.sim, 0, x.send_cq).status, WcStatus::RemInvReqErr, "SRQ {other:#x}");
        assert_eq!(x.sim.devices[1].qp_state(x.tgt), Some(QpState::Err));
    }
}

// A hostile initiator that starts a SEND into one SRQ and continues it naming another
// gets an invalid request NAK: the first SRQ's receive never completes on the second's CQ.
#[test]
fn a_message_keeps_the_srq_its_first_packet_named() {
    let mut x = setup(Faults::none());
    let buf = x.sim.devices[1].reg_mr(Pd(1), 4096, Access::ALL).unwrap();
    x.sim.devices[1].post_srq_recv(x.srqs[0], RecvWr { wr_id: 1, sgl: vec![sge(&buf, 0, 4096)] }).unwrap();
    let packet = |opcode: u8, psn: u32, srqn: u32| {
        let mut bth = softrdma::engine::qp::Path { xrc: false, ..path_to(x.tgt) }.bth(opcode, Psn::new(psn), 1024);
        bth.ack_req = true;
        let mut r = softrdma::engine::qp::requester::bare(bth, None, None);
        r.xrceth = Some(XrcEthRepr { srqn });
        r.payload = &[7u8; 1024];
        r
    };
    let (src, now) = (x.sim.devices[0].gid(), x.sim.now);
    for r in [packet(0xa0, 0x100, x.srqs[0]), packet(0xa2, 0x101, x.srqs[1])] {
        let mut bytes = vec![0u8; r.buffer_len()];
        r.emit(&mut bytes).unwrap();
        x.sim.devices[1].handle_packet(now, src, &bytes);
    }
    let out = drain(&mut x.sim.devices[1], now);
    let replies: Vec<_> =
        out.iter().filter_map(|r| r.aeth.map(|a| (r.bth.opcode, r.bth.psn.value(), a.syndrome))).collect();
    let ack = Syndrome::Ack { credits: 31 };
    assert_eq!(replies, vec![(0xb1, 0x100, ack), (0xb1, 0x101, Syndrome::Nak(NakCode::InvalidRequest))]);
    assert!(x.sim.devices[1].poll_cq(x.srq_cqs[1], 8).is_empty(), "nothing on the second SRQ's CQ");
    assert_eq!(x.sim.devices[1].qp_state(x.tgt), Some(QpState::Err));
}

/// A path whose BTHs name `qpn` (for hand-made requests to the target).
fn path_to(qpn: u32) -> softrdma::engine::qp::Path {
    softrdma::engine::qp::Path {
        qpn: 0,
        src_gid: [0; 16],
        dest_gid: [0; 16],
        dest_qpn: qpn,
        mtu: 1024,
        pkey: 0xffff,
        qp_type: QpType::Rc,
        qkey: 0,
        xrc: false,
    }
}

#[test]
fn xrc_qps_refuse_what_their_half_does_not_do() {
    let mut x = setup(Faults::none());
    let src = x.sim.devices[0].reg_mr(Pd(1), 64, Access::ALL).unwrap();
    let at = Remote { addr: 0, rkey: 0 };
    let refused = x.sim.devices[0].post_send(x.ini, xrc_wr(1, SendOp::AtomicWrite(at, [0; 8]), vec![], x.srqs[0]));
    assert_eq!(refused, Err(VerbsError::InvalidRequest), "XRC has no ATOMIC WRITE");
    let recv = RecvWr { wr_id: 1, sgl: vec![sge(&src, 0, 8)] };
    assert_eq!(x.sim.devices[0].post_recv(x.ini, recv), Err(VerbsError::InvalidRequest), "an initiator only sends");
    let send = x.sim.devices[1].post_send(x.tgt, wr(1, SendOp::Send, vec![]));
    assert_eq!(send, Err(VerbsError::InvalidRequest), "a target only receives");
    assert_eq!(x.sim.devices[1].dealloc_xrcd(1), Err(VerbsError::InvalidRequest), "in use");
}

fn pattern_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}
