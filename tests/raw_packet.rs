//! Raw packet QPs on one device: a frame one sends reaches the raw QP whose flow rule takes
//! it, whole, and no other; a QP without a rule, without a receive or not yet ready gets
//! nothing; a rule outlives neither its removal nor its QP.

mod common;

use common::*;
use softrdma::engine::mem::{Access, Mr, Pd};
use softrdma::engine::raw::{FlowKind, FlowRule, FlowSpec, Layer};
use softrdma::engine::verbs::*;
use softrdma::engine::Device;

struct Raw {
    d: Device,
    cq: u32,
    qps: [u32; 3],
    mr: Mr,
}

fn setup() -> Raw {
    let mut d = dev(1);
    let cq = d.create_cq(64);
    let init = QpInit {
        qp_type: QpType::RawPacket,
        pd: Pd(1),
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        srq: None,
        xrc: None,
    };
    let qps = [d.create_qp(init).unwrap(), d.create_qp(init).unwrap(), d.create_qp(init).unwrap()];
    for q in qps {
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            d.modify_qp(q, &QpAttr { state: Some(s), ..QpAttr::default() }).unwrap();
        }
    }
    let mr = d.reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    Raw { d, cq, qps, mr }
}

/// An Ethernet/IPv4/UDP frame to 02:00:00:00:00:01, UDP port `dport`, with `n` bytes of
/// payload.
fn frame(dport: u16, n: usize) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
    let total = (28 + n) as u16;
    f.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, 0, 2, 10, 0, 0, 1, 0x13, 0x88]);
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + n) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend((0..n).map(|i| i as u8));
    f
}

fn udp_port_rule(port: u16) -> FlowRule {
    let mut value = vec![0u8; 4];
    value[..2].copy_from_slice(&port.to_be_bytes());
    let spec = FlowSpec { layer: Layer::Udp, value, mask: vec![0xff, 0xff, 0, 0] };
    FlowRule { kind: FlowKind::Normal, priority: 0, specs: vec![spec] }
}

impl Raw {
    /// Posts `f` from QP 0, from the region's start.
    fn send(&mut self, f: &[u8]) {
        self.mr.mem.write(0, f);
        let wr = wr(1, SendOp::Send, vec![sge(&self.mr, 0, f.len())]);
        self.d.post_send(self.qps[0], wr).unwrap();
    }

    /// Posts a receive of `len` bytes at `off` on QP `i`.
    fn recv(&mut self, i: usize, off: usize, len: usize) {
        let wr = RecvWr { wr_id: 100 + i as u64, sgl: vec![sge(&self.mr, off, len)] };
        self.d.post_recv(self.qps[i], wr).unwrap();
    }
}

#[test]
fn a_frame_reaches_the_qp_whose_rule_takes_it_whole() {
    let mut r = setup();
    r.recv(1, 4096, 2048);
    r.recv(2, 8192, 2048);
    r.d.create_flow(r.qps[1], udp_port_rule(6000)).unwrap();
    r.d.create_flow(r.qps[2], udp_port_rule(7000)).unwrap();
    let f = frame(6000, 100);
    r.send(&f);
    let wcs = r.d.poll_cq(r.cq, 8);
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    let recv = wcs.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
    assert_eq!((recv.qpn, recv.status, recv.byte_len as usize), (r.qps[1], WcStatus::Success, f.len()));
    let mut got = vec![0u8; f.len()];
    assert!(r.mr.mem.read(4096, &mut got));
    assert_eq!(got, f, "the frame arrives whole, headers and all");
    assert!(wcs.iter().any(|w| w.opcode == WcOpcode::Send && w.qpn == r.qps[0] && w.status == WcStatus::Success));

    r.send(&frame(7000, 10));
    let wcs = r.d.poll_cq(r.cq, 8);
    assert!(wcs.iter().any(|w| w.opcode == WcOpcode::Recv && w.qpn == r.qps[2]), "{wcs:?}");
}

#[test]
fn no_rule_no_receive_or_no_longer_a_rule_means_no_frame() {
    let mut r = setup();
    r.send(&frame(6000, 10));
    assert_eq!(r.d.poll_cq(r.cq, 8).len(), 1, "only the send completes: nobody takes the frame");
    let id = r.d.create_flow(r.qps[1], udp_port_rule(6000)).unwrap();
    r.send(&frame(6000, 10));
    assert_eq!(r.d.poll_cq(r.cq, 8).len(), 1, "a rule without a receive posted drops the frame");
    r.d.destroy_flow(id).unwrap();
    assert_eq!(r.d.destroy_flow(id), Err(VerbsError::NotFound));
    r.recv(1, 4096, 2048);
    r.send(&frame(6000, 10));
    assert_eq!(r.d.poll_cq(r.cq, 8).len(), 1, "the rule is gone");
    r.d.create_flow(r.qps[1], udp_port_rule(6000)).unwrap();
    r.d.destroy_qp(r.qps[1]).unwrap();
    r.send(&frame(6000, 10));
    assert_eq!(r.d.poll_cq(r.cq, 8).len(), 1, "its QP is gone, and its rules with it");
}

#[test]
fn a_receive_too_short_fails_and_malformed_sends_are_refused() {
    let mut r = setup();
    r.recv(1, 4096, 20);
    r.d.create_flow(r.qps[1], udp_port_rule(6000)).unwrap();
    r.send(&frame(6000, 100));
    let wcs = r.d.poll_cq(r.cq, 8);
    assert!(wcs.iter().any(|w| w.qpn == r.qps[1] && w.status == WcStatus::LocLenErr), "{wcs:?}");
    // Shorter than an Ethernet header: a local length error, and nothing sent.
    let short = wr(2, SendOp::Send, vec![sge(&r.mr, 0, 10)]);
    r.d.post_send(r.qps[0], short).unwrap();
    assert_eq!(r.d.poll_cq(r.cq, 8).pop().map(|w| w.status), Some(WcStatus::LocLenErr));
    let write = wr(3, SendOp::Write(remote(&r.mr, 0)), vec![sge(&r.mr, 0, 64)]);
    assert_eq!(r.d.post_send(r.qps[0], write), Err(VerbsError::InvalidRequest), "raw QPs send frames only");
    let rc = r.d.create_cq(4);
    let rc_qp =
        r.d.create_qp(QpInit {
            qp_type: QpType::Rc,
            pd: Pd(1),
            send_cq: rc,
            recv_cq: rc,
            caps: QpCaps::default(),
            srq: None,
            xrc: None,
        })
        .unwrap();
    assert_eq!(r.d.create_flow(rc_qp, udp_port_rule(1)), Err(VerbsError::Unsupported), "rules steer to raw QPs");
}

#[test]
fn a_qp_not_yet_ready_to_receive_gets_nothing() {
    let mut r = setup();
    r.d.modify_qp(r.qps[1], &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    r.d.modify_qp(r.qps[1], &QpAttr { state: Some(QpState::Init), ..QpAttr::default() }).unwrap();
    r.recv(1, 4096, 2048);
    r.d.create_flow(r.qps[1], udp_port_rule(6000)).unwrap();
    r.send(&frame(6000, 10));
    assert_eq!(r.d.poll_cq(r.cq, 8).len(), 1, "INIT does not receive");
    r.d.modify_qp(r.qps[1], &QpAttr { state: Some(QpState::Rtr), ..QpAttr::default() }).unwrap();
    r.send(&frame(6000, 10));
    assert_eq!(r.d.poll_cq(r.cq, 8).len(), 2, "RTR does");
}

#[test]
fn an_rss_qp_spreads_frames_over_its_work_queues_and_holds_them() {
    use softrdma::engine::raw::{RxHash, WorkQueue, HASH_DST_IPV4, HASH_SRC_IPV4};
    let mut r = setup();
    let wqs: Vec<WorkQueue> =
        (0..4).map(|_| WorkQueue { srq: r.d.create_srq(64, 1), cq: r.d.create_cq(64), pd: Pd(1) }).collect();
    let rss = r.qps[2];
    let h = RxHash { key: vec![0x6d; 40], fields: HASH_SRC_IPV4 | HASH_DST_IPV4, table: wqs.clone() };
    r.d.set_rx_hash(rss, h).unwrap();
    r.d.create_flow(rss, udp_port_rule(6000)).unwrap();
    for (i, w) in wqs.iter().enumerate() {
        for k in 0..8 {
            let off = 4096 + (i * 8 + k) * 128;
            r.d.post_srq_recv(w.srq, RecvWr { wr_id: off as u64, sgl: vec![sge(&r.mr, off, 128)] }).unwrap();
        }
    }
    for src in 0..16u8 {
        let mut f = frame(6000, 10);
        f[26] = src;
        r.send(&f);
    }
    let per_queue: Vec<usize> = wqs.iter().map(|w| r.d.poll_cq(w.cq, 64).len()).collect();
    assert_eq!(per_queue.iter().sum::<usize>(), 16, "{per_queue:?}");
    assert!(per_queue.iter().filter(|&&n| n > 0).count() > 1, "spread: {per_queue:?}");
    let write = wr(9, SendOp::Send, vec![sge(&r.mr, 0, 64)]);
    assert_eq!(r.d.post_send(rss, write), Err(VerbsError::InvalidRequest), "an RSS QP only receives");
    assert_eq!(r.d.destroy_srq(wqs[0].srq), Err(VerbsError::InvalidRequest), "held by the RSS QP");
    r.d.destroy_qp(rss).unwrap();
    r.d.destroy_srq(wqs[0].srq).unwrap();
}

#[test]
fn a_qp_that_takes_and_sniffs_a_frame_gets_it_once_and_the_sender_never() {
    let mut r = setup();
    r.recv(1, 4096, 2048);
    r.recv(1, 6144, 2048);
    r.d.create_flow(r.qps[1], udp_port_rule(6000)).unwrap();
    r.d.create_flow(r.qps[1], FlowRule { kind: FlowKind::Sniffer, priority: 0, specs: vec![] }).unwrap();
    r.d.create_flow(r.qps[0], FlowRule { kind: FlowKind::Sniffer, priority: 0, specs: vec![] }).unwrap();
    r.send(&frame(6000, 10));
    let wcs = r.d.poll_cq(r.cq, 8);
    let recvs: Vec<u32> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).map(|w| w.qpn).collect();
    assert_eq!(recvs, vec![r.qps[1]], "{wcs:?}");
}
