//! Tag matching (rdma-core's TM-SRQ, Documentation/tag_matching.md) between two engines in
//! the simulator: device 0 sends tagged messages as ordinary SENDs, device 1's QP sits on a
//! TM-SRQ. Expected eager messages land in their tagged buffer without the TMH, unexpected
//! ones whole in an ordinary receive and hold back later tags until a SYNC, rendezvous
//! requests become a READ of the sender's buffer and a FIN back.

mod common;

use common::*;
use softrdma::engine::mem::{Access, Mr, Pd};
use softrdma::engine::tm::{self, OpsWr, TagOp};
use softrdma::engine::verbs::*;
use softrdma::sim::{Faults, Sim};

struct Tm {
    sim: Sim,
    qp: [u32; 2],
    cq: [u32; 2],
    srq: u32,
    mr: [Mr; 2],
}

/// Path MTU 256: a 600-byte eager message takes three packets.
fn setup(faults: Faults) -> Tm {
    let mut sim = sim_pair(faults, 5);
    let cq = [sim.devices[0].create_cq(256), sim.devices[1].create_cq(256)];
    let srq = sim.devices[1].create_tm_srq(64, 4, cq[1], 16).unwrap();
    let qp = connect_qps(&mut sim, QpType::Rc, &Attrs::default(), cq, Some(srq), None);
    let mr = [
        sim.devices[0].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap(),
        sim.devices[1].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap(),
    ];
    Tm { sim, qp, cq, srq, mr }
}

fn tmh(op: u8, app_ctx: u32, tag: u64) -> Vec<u8> {
    let mut h = vec![op, 0, 0, 0];
    h.extend_from_slice(&app_ctx.to_be_bytes());
    h.extend_from_slice(&tag.to_be_bytes());
    h
}

fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

impl Tm {
    fn add(&mut self, tag: u64, id: u64, off: usize, len: usize, cnt: u32) -> u32 {
        let recv = RecvWr { wr_id: id, sgl: vec![sge(&self.mr[1], off, len)] };
        let op = OpsWr { wr_id: 900 + id, op: TagOp::Add { recv, tag, mask: !0 }, unexpected_cnt: cnt, signaled: true };
        let handle = self.sim.devices[1].post_srq_op(self.srq, &op).unwrap().unwrap();
        let wc = self.wait(1);
        assert_eq!((wc.wr_id, wc.opcode, wc.status), (900 + id, WcOpcode::TmAdd, WcStatus::Success));
        handle
    }

    /// Sends `msg` (written at the start of device 0's region) as one SEND.
    fn send(&mut self, msg: &[u8]) {
        self.mr[0].mem.write(0, msg);
        let w = wr(1, SendOp::Send, vec![sge(&self.mr[0], 0, msg.len())]);
        self.sim.devices[0].post_send(self.qp[0], w).unwrap();
        let wc = self.wait(0);
        assert_eq!((wc.opcode, wc.status), (WcOpcode::Send, WcStatus::Success));
    }

    fn wait(&mut self, d: usize) -> Wc {
        for _ in 0..1_000_000 {
            if let Some(wc) = self.sim.devices[d].poll_cq(self.cq[d], 1).pop() {
                return wc;
            }
            if !self.sim.step() {
                break;
            }
        }
        panic!("no completion on device {d}");
    }

    fn tm_of(wc: &Wc) -> (u8, u64, u32) {
        let t = wc.tm.expect("a tag-matching completion");
        (t.flags, t.tag, t.app_ctx)
    }
}

#[test]
fn an_expected_eager_message_lands_in_its_tagged_buffer_without_the_header() {
    for len in [100usize, 600] {
        let mut t = setup(Faults::none());
        t.add(0x77, 5, 4096, 2048, 0);
        let mut msg = tmh(tm::TMH_EAGER, 0xabc, 0x77);
        msg.extend(body(len));
        t.send(&msg);
        let mut wc = t.wait(1);
        if len > 256 - 16 {
            // Several packets: the match is reported first, the data when it is all there.
            assert_eq!((wc.wr_id, wc.opcode), (5, WcOpcode::TmRecv));
            assert_eq!(Tm::tm_of(&wc), (tm::WC_TM_MATCH, 0x77, 0xabc));
            wc = t.wait(1);
            assert_eq!(Tm::tm_of(&wc), (tm::WC_TM_DATA_VALID, 0, 0), "the data's completion has no TMH fields");
        } else {
            assert_eq!(Tm::tm_of(&wc), (tm::WC_TM_MATCH | tm::WC_TM_DATA_VALID, 0x77, 0xabc));
        }
        assert_eq!((wc.wr_id, wc.opcode, wc.status, wc.byte_len), (5, WcOpcode::TmRecv, WcStatus::Success, len as u32));
        assert_eq!(t.mr[1].mem.to_vec()[4096..4096 + len], body(len)[..], "{len} bytes after the TMH");
    }
}

#[test]
fn an_unexpected_message_lands_whole_and_holds_back_later_tags_until_a_sync() {
    let mut t = setup(Faults::none());
    t.add(1, 11, 0, 1024, 0);
    t.sim.devices[1].post_srq_recv(t.srq, RecvWr { wr_id: 70, sgl: vec![sge(&t.mr[1], 8192, 1024)] }).unwrap();
    let mut msg = tmh(tm::TMH_EAGER, 0, 2);
    msg.extend(body(40));
    t.send(&msg);
    let wc = t.wait(1);
    assert_eq!((wc.wr_id, wc.opcode, wc.byte_len, Tm::tm_of(&wc)), (70, WcOpcode::TmRecv, 56, (0, 0, 0)));
    assert_eq!(t.mr[1].mem.to_vec()[8192..8192 + 56], msg[..], "the whole message, TMH included");
    // Added before the application reports the unexpected message: not matched yet.
    let recv = RecvWr { wr_id: 12, sgl: vec![sge(&t.mr[1], 2048, 1024)] };
    let op = OpsWr { wr_id: 13, op: TagOp::Add { recv, tag: 3, mask: !0 }, unexpected_cnt: 0, signaled: true };
    t.sim.devices[1].post_srq_op(t.srq, &op).unwrap();
    assert_eq!(Tm::tm_of(&t.wait(1)).0, tm::WC_TM_SYNC_REQ);
    t.sim.devices[1].post_srq_recv(t.srq, RecvWr { wr_id: 71, sgl: vec![sge(&t.mr[1], 9216, 1024)] }).unwrap();
    t.send(&tmh(tm::TMH_EAGER, 0, 3));
    assert_eq!(t.wait(1).wr_id, 71, "tag 3 is not matched before the sync");
    let sync = OpsWr { wr_id: 14, op: TagOp::Sync, unexpected_cnt: 2, signaled: true };
    t.sim.devices[1].post_srq_op(t.srq, &sync).unwrap();
    assert_eq!(t.wait(1).opcode, WcOpcode::TmSync);
    t.send(&tmh(tm::TMH_EAGER, 0, 3));
    let wc = t.wait(1);
    assert_eq!((wc.wr_id, Tm::tm_of(&wc).0), (12, tm::WC_TM_MATCH | tm::WC_TM_DATA_VALID));
    // The first tag still matches; a no-tag message goes to an ordinary receive.
    t.sim.devices[1].post_srq_recv(t.srq, RecvWr { wr_id: 72, sgl: vec![sge(&t.mr[1], 8192, 1024)] }).unwrap();
    t.send(&tmh(tm::TMH_NO_TAG, 0, 1));
    let wc = t.wait(1);
    assert_eq!((wc.wr_id, wc.opcode), (72, WcOpcode::TmNoTag));
}

#[test]
fn a_rendezvous_request_is_read_from_the_sender_and_answered_with_a_fin() {
    let mut t = setup(Faults { loss: 0.05, duplicate: 0.02, ..Faults::none() });
    t.add(9, 21, 16384, 8192, 0);
    // The sender's buffer: 5000 bytes at offset 32768 of its region.
    t.mr[0].mem.write(32768, &body(5000));
    t.sim.devices[0].post_recv(t.qp[0], RecvWr { wr_id: 40, sgl: vec![sge(&t.mr[0], 60000, 64)] }).unwrap();
    let mut msg = tmh(tm::TMH_RNDV, 0x55, 9);
    msg.extend_from_slice(&(t.mr[0].addr + 32768).to_be_bytes());
    msg.extend_from_slice(&t.mr[0].rkey.to_be_bytes());
    msg.extend_from_slice(&5000u32.to_be_bytes());
    msg.extend_from_slice(&[0xee; 32]);
    t.send(&msg);
    let wc = t.wait(1);
    assert_eq!((wc.wr_id, wc.status, Tm::tm_of(&wc)), (21, WcStatus::Success, (tm::WC_TM_MATCH, 9, 0x55)));
    let fin = t.wait(0);
    assert_eq!((fin.wr_id, fin.opcode, fin.byte_len), (40, WcOpcode::Recv, 32));
    let mut want = msg[..32].to_vec();
    want[0] = tm::TMH_FIN;
    assert_eq!(t.mr[0].mem.to_vec()[60000..60032], want[..], "the FIN repeats TMH and RVH");
    let wc = t.wait(1);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (21, WcStatus::Success, 5000));
    assert_eq!(Tm::tm_of(&wc), (tm::WC_TM_DATA_VALID, 0, 0));
    assert_eq!(t.mr[1].mem.to_vec()[16384..16384 + 5000], body(5000)[..]);
    assert!(t.sim.devices[1].poll_cq(t.cq[1], 4).is_empty(), "the READ and FIN complete nowhere else");
}

#[test]
fn a_rendezvous_larger_than_its_buffer_leaves_the_headers_for_the_application() {
    let mut t = setup(Faults::none());
    t.add(4, 31, 0, 100, 0);
    let mut msg = tmh(tm::TMH_RNDV, 1, 4);
    msg.extend_from_slice(&t.mr[0].addr.to_be_bytes());
    msg.extend_from_slice(&t.mr[0].rkey.to_be_bytes());
    msg.extend_from_slice(&4000u32.to_be_bytes());
    t.send(&msg);
    let wc = t.wait(1);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (31, WcStatus::TmRndvIncomplete, 32));
    assert_eq!(t.mr[1].mem.to_vec()[..32], msg[..]);
}

#[test]
fn a_tm_srq_holds_at_most_its_tags_and_the_device_limit() {
    let mut t = setup(Faults::none());
    for i in 0..16 {
        t.add(i, i, 0, 8, 0);
    }
    let recv = RecvWr { wr_id: 99, sgl: vec![] };
    let op = OpsWr { wr_id: 1, op: TagOp::Add { recv, tag: 99, mask: !0 }, unexpected_cnt: 0, signaled: true };
    assert_eq!(t.sim.devices[1].post_srq_op(t.srq, &op), Err(VerbsError::QueueFull));
    let cq = t.cq[1];
    assert!(t.sim.devices[1].create_tm_srq(4, 1, cq, tm::MAX_TAGS + 1).is_err());
    let big = t.sim.devices[1].create_tm_srq(4, 1, cq, tm::MAX_TAGS).unwrap();
    for i in 0..tm::MAX_TAGS as u64 {
        let recv = RecvWr { wr_id: i, sgl: vec![] };
        let op = OpsWr { wr_id: i, op: TagOp::Add { recv, tag: i, mask: !0 }, unexpected_cnt: 0, signaled: false };
        t.sim.devices[1].post_srq_op(big, &op).unwrap();
    }
    assert_eq!(t.sim.devices[1].post_srq_op(big, &op), Err(VerbsError::QueueFull));
}

/// Every tagged buffer at once: the peer's rendezvous requests fill the whole matching
/// list, so the QP's send queue (sized by the application at its default) holds a READ per
/// tag and then a FIN per tag; all of them complete, each data completion once.
#[test]
fn a_full_list_of_rendezvous_requests_is_read_and_finished() {
    let mut t = setup(Faults::none());
    for tag in 0..16u64 {
        t.add(tag, 300 + tag, tag as usize * 2048, 2048, 0);
    }
    t.mr[0].mem.write(32768, &body(2000));
    for i in 0..16usize {
        let recv = RecvWr { wr_id: 500 + i as u64, sgl: vec![sge(&t.mr[0], 40960 + i * 64, 64)] };
        t.sim.devices[0].post_recv(t.qp[0], recv).unwrap();
    }
    for tag in 0..16u64 {
        let mut msg = tmh(tm::TMH_RNDV, 0, tag);
        msg.extend_from_slice(&(t.mr[0].addr + 32768).to_be_bytes());
        msg.extend_from_slice(&t.mr[0].rkey.to_be_bytes());
        msg.extend_from_slice(&2000u32.to_be_bytes());
        let at = tag as usize * 64;
        t.mr[0].mem.write(at, &msg);
        t.sim.devices[0].post_send(t.qp[0], wr(600 + tag, SendOp::Send, vec![sge(&t.mr[0], at, msg.len())])).unwrap();
    }
    let (mut matched, mut data, mut sends, mut fins) = (0, 0, 0, 0);
    for _ in 0..1_000_000 {
        for wc in t.sim.devices[1].poll_cq(t.cq[1], 64) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            match Tm::tm_of(&wc).0 {
                tm::WC_TM_MATCH => matched += 1,
                tm::WC_TM_DATA_VALID => data += 1,
                f => panic!("flags {f:#x}"),
            }
        }
        for wc in t.sim.devices[0].poll_cq(t.cq[0], 64) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Recv {
                fins += 1;
            } else {
                sends += 1;
            }
        }
        if !t.sim.step() {
            break;
        }
    }
    assert_eq!((matched, data, sends, fins), (16, 16, 16, 16));
    for tag in 0..16usize {
        assert_eq!(t.mr[1].mem.to_vec()[tag * 2048..tag * 2048 + 2000], body(2000)[..], "tag {tag}");
    }
}

use proptest::prelude::*;

/// A tagged message of `kind` (0 no tag, 1 rendezvous, 2 FIN, 3 eager, 4 an unknown
/// opcode, 5 shorter than a TMH) for tag `tag`, `len` bytes long; a rendezvous names
/// `rvh_at` (an offset that may run past the sender's region), `rvh_len` bytes and, when
/// `good_key`, the region's rkey.
fn hostile_message(t: &Tm, kind: u8, tag: u64, len: usize, rvh: (u64, u32, bool)) -> Vec<u8> {
    if kind == 5 {
        return body(len % 16);
    }
    let op = [tm::TMH_NO_TAG, tm::TMH_RNDV, tm::TMH_FIN, tm::TMH_EAGER, 9][kind as usize];
    let mut m = tmh(op, 1, tag);
    if kind == 1 {
        let key = if rvh.2 { t.mr[0].rkey } else { t.mr[0].rkey ^ 0x5a5a };
        m.extend_from_slice(&(t.mr[0].addr + rvh.0).to_be_bytes());
        m.extend_from_slice(&key.to_be_bytes());
        m.extend_from_slice(&rvh.1.to_be_bytes());
    }
    m.extend(body(len));
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever a peer puts in its SENDs (the TM headers are application data to the
    /// transport): no panic, nothing written outside the tagged and ordinary buffers, at
    /// most two receive completions per tagged buffer, and every SEND completed at the
    /// sender unless the receiving QP ended in error (a rendezvous READ refused).
    #[test]
    fn hostile_tagged_payloads_stay_inside_the_buffers(
        msgs in proptest::collection::vec((0u8..6, 0u64..6, 0usize..900, 0u64..70_000, 0u32..12_000, any::<bool>()), 1..8)
    ) {
        let mut t = setup(Faults::none());
        // Tags 0..4, 4 KiB each in [0, 16 KiB); ordinary receives 1 KiB each in [16, 24 KiB);
        // [24 KiB, 64 KiB) of the receiver's region must stay as it was.
        t.mr[1].mem.fill(24 << 10, 40 << 10, 0xa5);
        for tag in 0..4u64 {
            t.add(tag, 100 + tag, tag as usize * 4096, 4096, 0);
        }
        for i in 0..8usize {
            let recv = RecvWr { wr_id: 200 + i as u64, sgl: vec![sge(&t.mr[1], (16 << 10) + i * 1024, 1024)] };
            t.sim.devices[1].post_srq_recv(t.srq, recv).unwrap();
        }
        let mut sent = 0;
        for (kind, tag, len, at, rvh_len, good) in msgs {
            let m = hostile_message(&t, kind, tag, len, (at, rvh_len, good));
            t.mr[0].mem.write(0, &m);
            let w = wr(sent, SendOp::Send, vec![sge(&t.mr[0], 0, m.len())]);
            if t.sim.devices[0].post_send(t.qp[0], w).is_err() {
                break;
            }
            sent += 1;
            for _ in 0..200_000 {
                if !t.sim.step() {
                    break;
                }
            }
        }
        let mut per_buffer = std::collections::HashMap::new();
        for wc in t.sim.devices[1].poll_cq(t.cq[1], 4096) {
            *per_buffer.entry(wc.wr_id).or_insert(0) += 1;
        }
        prop_assert!(per_buffer.iter().all(|(id, n)| *n <= 2 || *id >= 900), "{per_buffer:?}");
        prop_assert!(t.mr[1].mem.to_vec()[24 << 10..].iter().all(|b| *b == 0xa5), "bytes outside the buffers changed");
        let done = t.sim.devices[0].poll_cq(t.cq[0], 4096).iter().filter(|w| w.opcode == WcOpcode::Send).count();
        let errored = t.sim.devices[1].qp_state(t.qp[1]) == Some(QpState::Err)
            || t.sim.devices[0].qp_state(t.qp[0]) == Some(QpState::Err);
        prop_assert!(done as u64 == sent || errored, "{done} of {sent} SENDs completed");
    }
}
