//! UC and UD queue pairs (IBTA 9.8): unacknowledged delivery, UC's drop-until-FIRST rule,
//! UD's Q_Key check, GRH and source reporting.

mod common;

use common::{connect_qps, drain, remote, sge, sim_pair, Attrs};
use softrdma::engine::mem::{Access, Mr, Pd};
use softrdma::engine::verbs::*;
use softrdma::sim::{Faults, Sim};

struct Two {
    sim: Sim,
    q: [u32; 2],
    cq: [u32; 2],
    m: [Mr; 2],
}

fn two(ty: QpType) -> Two {
    let mut sim = sim_pair(Faults::none(), 1);
    let cq = [sim.devices[0].create_cq(256), sim.devices[1].create_cq(256)];
    let at = Attrs { psn_a: 100, psn_b: 100, ..Attrs::default() };
    let q = connect_qps(&mut sim, ty, &at, cq, None, None);
    let m = [0, 1].map(|d| sim.devices[d].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap());
    Two { sim, q, cq, m }
}

fn send(wr_id: u64, op: SendOp, sgl: Vec<Sge>, ud: Option<UdDest>) -> SendWr {
    SendWr { wr_id, op, sgl, signaled: true, solicited: false, ud, xrc_srqn: 0 }
}

impl Two {
    fn settle(&mut self) {
        self.sim.run_until(u64::MAX);
    }
    fn wcs(&mut self, d: usize) -> Vec<Wc> {
        self.sim.devices[d].poll_cq(self.cq[d], 100)
    }
    fn dest(&self, to: usize, qkey: u32) -> UdDest {
        UdDest { gid: self.sim.devices[to].gid(), qpn: self.q[to], qkey }
    }
}

// IBTA 9.8.4, 11.4.1.2: a UD receive reports the sender's QPN and GID after a 40-byte GRH.
#[test]
fn ud_datagram_carries_source_and_grh() {
    let mut t = two(QpType::Ud);
    t.m[0].mem.write(0, b"datagram!");
    t.sim.devices[1].post_recv(t.q[1], RecvWr { wr_id: 7, sgl: vec![sge(&t.m[1], 0, 100)] }).unwrap();
    let dest = t.dest(1, 0x1111_0001);
    t.sim.devices[0].post_send(t.q[0], send(1, SendOp::SendImm(42), vec![sge(&t.m[0], 0, 9)], Some(dest))).unwrap();
    t.settle();
    assert_eq!(t.wcs(0)[0].status, WcStatus::Success);
    let r = t.wcs(1);
    assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len, r[0].imm), (7, WcStatus::Success, 49, Some(42)));
    assert_eq!((r[0].src_qp, r[0].src_gid), (Some(t.q[0]), Some(t.sim.devices[0].gid())));
    let mut got = [0u8; 49];
    t.m[1].mem.read(0, &mut got);
    assert_eq!(&got[40..], b"datagram!");
    assert_eq!(&got[8..24], &t.sim.devices[0].gid(), "GRH source GID");
}

// IBTA 10.2.5 (C10-15): a wrong Q_Key is dropped; a Q_Key with its high bit set means the
// sender QP's own.
#[test]
fn ud_qkey_is_checked() {
    let mut t = two(QpType::Ud);
    t.sim.devices[1].post_recv(t.q[1], RecvWr { wr_id: 7, sgl: vec![sge(&t.m[1], 0, 100)] }).unwrap();
    let wrong = t.dest(1, 0x2222);
    t.sim.devices[0].post_send(t.q[0], send(1, SendOp::Send, vec![sge(&t.m[0], 0, 4)], Some(wrong))).unwrap();
    t.settle();
    assert!(t.wcs(1).is_empty());
    assert_eq!(t.sim.devices[1].stats.qkey_violations, 1);
    // Device 0's QP has Q_Key 0x11110000, device 1's 0x11110001: "use mine" is still wrong.
    let own = t.dest(1, 0x8000_0000);
    t.sim.devices[0].post_send(t.q[0], send(2, SendOp::Send, vec![sge(&t.m[0], 0, 4)], Some(own))).unwrap();
    t.settle();
    assert_eq!(t.sim.devices[1].stats.qkey_violations, 2);
    let right = t.dest(1, 0x1111_0001);
    t.sim.devices[0].post_send(t.q[0], send(3, SendOp::Send, vec![sge(&t.m[0], 0, 4)], Some(right))).unwrap();
    t.settle();
    assert_eq!(t.wcs(1).len(), 1);
}

// IBTA 9.8.4: a UD message is one packet; longer is a local length error; UD has no RDMA.
#[test]
fn ud_limits() {
    let mut t = two(QpType::Ud);
    let dest = t.dest(1, 0x1111_0001);
    t.sim.devices[0].post_send(t.q[0], send(1, SendOp::Send, vec![sge(&t.m[0], 0, 5000)], Some(dest))).unwrap();
    t.settle();
    assert_eq!(t.wcs(0)[0].status, WcStatus::LocLenErr);
    let write = send(2, SendOp::Write(remote(&t.m[1], 0)), vec![], Some(dest));
    assert_eq!(t.sim.devices[0].post_send(t.q[0], write), Err(VerbsError::InvalidRequest));
    // No receive posted: the datagram is dropped, not RNR-NAKed.
    let mut t = two(QpType::Ud);
    let dest = t.dest(1, 0x1111_0001);
    t.sim.devices[0].post_send(t.q[0], send(3, SendOp::Send, vec![sge(&t.m[0], 0, 5)], Some(dest))).unwrap();
    t.settle();
    assert_eq!(t.sim.devices[1].stats.ud_no_receive, 1);
    assert!(drain(&mut t.sim.devices[1], 0).is_empty());
}

// IBTA vol. 1 10.3.1 (SQEr): a UD or UC send that fails locally takes the QP to SQE, not
// ERR: the rest of the send queue and later posts are flushed, receives go on, and a move
// back to RTS sends again.
#[test]
fn a_failed_ud_or_uc_send_stops_the_send_queue_only() {
    for ty in [QpType::Ud, QpType::Uc] {
        let mut t = two(ty);
        let (to_1, to_0) = match ty {
            QpType::Ud => (Some(t.dest(1, 0x1111_0001)), Some(t.dest(0, 0x1111_0000))),
            _ => (None, None),
        };
        let too_long = if ty == QpType::Ud { 5000 } else { 4 };
        let bad = Sge { lkey: t.m[0].lkey ^ 0xff, ..sge(&t.m[0], 0, too_long) };
        let first = if ty == QpType::Ud { sge(&t.m[0], 0, too_long) } else { bad };
        let dev0 = |t: &mut Two, wr| t.sim.devices[0].post_send(t.q[0], wr);
        dev0(&mut t, send(1, SendOp::Send, vec![first], to_1)).unwrap();
        let four = sge(&t.m[0], 0, 4);
        dev0(&mut t, send(2, SendOp::Send, vec![four], to_1)).unwrap();
        t.settle();
        let want = if ty == QpType::Ud { WcStatus::LocLenErr } else { WcStatus::LocProtErr };
        let s: Vec<_> = t.wcs(0).iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(s, [(1, want), (2, WcStatus::WrFlushErr)], "{ty:?}");
        assert_eq!(t.sim.devices[0].qp_state(t.q[0]), Some(QpState::Sqe), "{ty:?}");
        dev0(&mut t, send(3, SendOp::Send, vec![four], to_1)).unwrap();
        t.settle();
        assert_eq!(t.wcs(0)[0].status, WcStatus::WrFlushErr, "{ty:?}: posted in SQE, flushed");
        assert_eq!(t.sim.devices[1].stats.rx_packets, 0, "{ty:?}: nothing was sent");
        // The receive queue still serves the peer.
        t.sim.devices[0].post_recv(t.q[0], RecvWr { wr_id: 8, sgl: vec![sge(&t.m[0], 0, 100)] }).unwrap();
        t.sim.devices[1].post_send(t.q[1], send(4, SendOp::Send, vec![sge(&t.m[1], 0, 4)], to_0)).unwrap();
        t.settle();
        let r = t.wcs(0);
        assert_eq!((r[0].wr_id, r[0].status), (8, WcStatus::Success), "{ty:?}");
        // Back to RTS, it sends again.
        let rts = QpAttr { state: Some(QpState::Rts), ..QpAttr::default() };
        t.sim.devices[0].modify_qp(t.q[0], &rts).unwrap();
        t.sim.devices[1].post_recv(t.q[1], RecvWr { wr_id: 9, sgl: vec![sge(&t.m[1], 0, 100)] }).unwrap();
        dev0(&mut t, send(5, SendOp::Send, vec![four], to_1)).unwrap();
        t.settle();
        assert_eq!(t.wcs(0)[0].status, WcStatus::Success, "{ty:?}");
        assert_eq!(
            t.wcs(1).iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(4, WcStatus::Success), (9, WcStatus::Success)]
        );
    }
}

// IBTA 9.8.3: UC delivers WRITE and SEND without acknowledgements.
#[test]
fn uc_write_and_send() {
    let mut t = two(QpType::Uc);
    let data: Vec<u8> = (0..700).map(|i| i as u8).collect();
    t.m[0].mem.write(0, &data);
    t.sim.devices[1].post_recv(t.q[1], RecvWr { wr_id: 9, sgl: vec![sge(&t.m[1], 4096, 1000)] }).unwrap();
    t.sim.devices[0]
        .post_send(t.q[0], send(1, SendOp::Write(remote(&t.m[1], 0)), vec![sge(&t.m[0], 0, 700)], None))
        .unwrap();
    t.sim.devices[0].post_send(t.q[0], send(2, SendOp::Send, vec![sge(&t.m[0], 0, 700)], None)).unwrap();
    t.settle();
    let s: Vec<_> = t.wcs(0).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(s, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(t.m[1].mem.to_vec()[..700], data[..], "{:?}", t.sim.devices[1].stats);
    let r = t.wcs(1);
    assert_eq!((r[0].wr_id, r[0].byte_len), (9, 700));
    assert_eq!(t.sim.devices[1].stats.tx_packets, 0, "UC never answers");
    let read = send(3, SendOp::Read(remote(&t.m[1], 0)), vec![sge(&t.m[0], 0, 8)], None);
    assert_eq!(t.sim.devices[0].post_send(t.q[0], read), Err(VerbsError::InvalidRequest));
}

// IBTA 9.8.3: after a lost packet, UC drops the damaged message and resumes at the next
// FIRST/ONLY; the receive WQE the damaged message held serves the next one.
#[test]
fn uc_drops_a_damaged_message_and_resumes() {
    let mut t = two(QpType::Uc);
    let mut seen = 0;
    t.sim.tamper = Some(Box::new(move |_, _| {
        seen += 1;
        seen != 2 // lose the MIDDLE of the first SEND
    }));
    t.m[0].mem.write(0, &[1u8; 768]);
    t.m[0].mem.write(1000, b"second");
    t.sim.devices[1].post_recv(t.q[1], RecvWr { wr_id: 9, sgl: vec![sge(&t.m[1], 0, 1000)] }).unwrap();
    t.sim.devices[0].post_send(t.q[0], send(1, SendOp::Send, vec![sge(&t.m[0], 0, 768)], None)).unwrap();
    t.sim.devices[0].post_send(t.q[0], send(2, SendOp::Send, vec![sge(&t.m[0], 1000, 6)], None)).unwrap();
    t.settle();
    let r = t.wcs(1);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].wr_id, r[0].byte_len), (9, 6));
    let mut got = [0u8; 6];
    t.m[1].mem.read(0, &mut got);
    assert_eq!(&got, b"second");
    assert!(t.sim.devices[1].stats.uc_dropped >= 1);
}

// IBTA 10.2.9: QPs sharing a receive queue take from it in order; IBTA 11.6.3.3: the armed
// limit raises one event when the queue falls below it.
#[test]
fn srq_is_shared_and_raises_its_limit_event() {
    use softrdma::engine::event::AsyncEvent;
    let mut sim = sim_pair(Faults::none(), 1);
    let srq = sim.devices[1].create_srq(16, 1);
    let mut pairs = Vec::new();
    for _ in 0..2 {
        let cqs = [sim.devices[0].create_cq(64), sim.devices[1].create_cq(64)];
        let at = Attrs { psn_a: 0, psn_b: 0, mtu: Mtu::M1024, ..Attrs::default() };
        pairs.push((connect_qps(&mut sim, QpType::Uc, &at, cqs, Some(srq), None), cqs));
    }
    let ma = sim.devices[0].reg_mr(Pd(1), 4096, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 4096, Access::ALL).unwrap();
    for i in 0..4u64 {
        sim.devices[1].post_srq_recv(srq, RecvWr { wr_id: i, sgl: vec![sge(&mb, 100 * i as usize, 100)] }).unwrap();
    }
    assert_eq!(
        sim.devices[1].post_recv(pairs[0].0[1], RecvWr { wr_id: 9, sgl: vec![] }),
        Err(VerbsError::InvalidRequest)
    );
    sim.devices[1].arm_srq_limit(srq, 2).unwrap();
    for (k, (q, _)) in pairs.iter().enumerate() {
        sim.devices[0].post_send(q[0], send(k as u64, SendOp::Send, vec![sge(&ma, 0, 10)], None)).unwrap();
    }
    sim.run_until(u64::MAX);
    let mut ids: Vec<u64> = pairs.iter().flat_map(|(_, c)| sim.devices[1].poll_cq(c[1], 10)).map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, vec![0, 1], "both QPs took from the one SRQ");
    assert_eq!(sim.devices[1].srq_len(srq), 2);
    assert_eq!(sim.devices[1].poll_async_event(), None, "2 left: not below the limit yet");
    sim.devices[0].post_send(pairs[0].0[0], send(5, SendOp::Send, vec![sge(&ma, 0, 10)], None)).unwrap();
    sim.run_until(u64::MAX);
    assert_eq!(sim.devices[1].poll_async_event(), Some(AsyncEvent::SrqLimitReached(srq)));
    sim.devices[0].post_send(pairs[1].0[0], send(6, SendOp::Send, vec![sge(&ma, 0, 10)], None)).unwrap();
    sim.run_until(u64::MAX);
    assert_eq!(sim.devices[1].poll_async_event(), None, "one-shot");
    assert_eq!(sim.devices[1].destroy_srq(srq), Err(VerbsError::InvalidRequest), "QPs use it (EBUSY)");
    // IBTA 10.2.9.5: a QP on an SRQ entering ERR raises "last WQE reached", once.
    let to_err = QpAttr { state: Some(QpState::Err), ..QpAttr::default() };
    sim.devices[1].modify_qp(pairs[0].0[1], &to_err).unwrap();
    sim.devices[1].modify_qp(pairs[0].0[1], &to_err).unwrap();
    assert_eq!(sim.devices[1].poll_async_event(), Some(AsyncEvent::LastWqeReached(pairs[0].0[1])));
    assert_eq!(sim.devices[1].poll_async_event(), None, "once");
    for (q, _) in &pairs {
        sim.devices[1].destroy_qp(q[1]).unwrap();
    }
    assert_eq!(sim.devices[1].destroy_srq(srq), Ok(()));
    assert_eq!(sim.devices[1].post_srq_recv(srq, RecvWr { wr_id: 7, sgl: vec![] }), Err(VerbsError::NotFound));
}

// IBTA 9.8.3: UC delivers a message at most once: a duplicated packet is dropped.
#[test]
fn uc_never_delivers_twice() {
    let mut t = two(QpType::Uc);
    t.sim.faults.duplicate = 1.0;
    for i in 0..3 {
        t.sim.devices[1].post_recv(t.q[1], RecvWr { wr_id: i, sgl: vec![sge(&t.m[1], 0, 100)] }).unwrap();
    }
    t.sim.devices[0].post_send(t.q[0], send(1, SendOp::Send, vec![sge(&t.m[0], 0, 10)], None)).unwrap();
    t.settle();
    assert_eq!(t.wcs(1).len(), 1);
    assert_eq!(t.sim.devices[1].stats.duplicates_received, 1);
}

// IBTA 9.1 / Annex A17.4: a device has a table of GIDs (IPv4-mapped and IPv6); a QP sends
// from the one its sgid_index names. Over IPv6 the ICRC covers the IPv6 header: every
// corrupted packet is still caught.
#[test]
fn rc_over_ipv6_gids() {
    let v6 = |i: u8| {
        let mut g = [0u8; 16];
        g[..2].copy_from_slice(&[0xfd, 0x00]);
        g[15] = i;
        g
    };
    let mut sim = sim_pair(Faults { corrupt: 0.05, ..Faults::none() }, 5);
    let idx = [sim.devices[0].add_gid(v6(1)), sim.devices[1].add_gid(v6(2))];
    assert_eq!(idx, [1, 1]);
    let cq = [sim.devices[0].create_cq(64), sim.devices[1].create_cq(64)];
    let at = Attrs { psn_a: 0, psn_b: 0, mtu: Mtu::M1024, ..Attrs::default() };
    let q = connect_qps(&mut sim, QpType::Rc, &at, cq, None, Some(([v6(1), v6(2)], 1)));
    let bad = QpAttr { sgid_index: Some(9), ..QpAttr::default() };
    assert_eq!(sim.devices[0].modify_qp(q[0], &bad), Err(VerbsError::InvalidAttribute("sgid_index")));
    let ma = sim.devices[0].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    let data: Vec<u8> = (0..40_000).map(|i| (i % 253) as u8).collect();
    ma.mem.write(0, &data);
    sim.devices[0].post_send(q[0], send(1, SendOp::Write(remote(&mb, 0)), vec![sge(&ma, 0, 40_000)], None)).unwrap();
    sim.run_until(u64::MAX);
    assert_eq!(sim.devices[0].poll_cq(cq[0], 8)[0].status, WcStatus::Success);
    assert_eq!(mb.mem.to_vec()[..40_000], data[..]);
    assert!(sim.stats.corrupted > 0 && sim.stats.icrc_failed == sim.stats.corrupted, "{:?}", sim.stats);
    assert_eq!(sim.stats.corruption_missed, 0);
}
