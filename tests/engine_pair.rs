//! Two engines on a clean simulated link: each operation end to end, with data checked.

mod common;

use common::*;
use softrdma::engine::verbs::*;

fn pair_mtu(mtu: Mtu) -> Pair {
    pair(Attrs { mtu, ..Attrs::default() })
}

#[test]
fn write_lands_in_remote_memory() {
    for len in [0usize, 1, 112, 1024, 1025, 5000, 100_000] {
        let mut p = pair_mtu(Mtu::M1024);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        p.ma.mem.write(0, &data);
        let op = SendOp::Write(remote(&p.mb, 4096));
        p.sim.devices[0].post_send(p.qa, wr(1, op, vec![sge(&p.ma, 0, len)])).unwrap();
        let wc = p.wait(0);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::RdmaWrite), "len {len}");
        let mut got = vec![0u8; len];
        p.mb.mem.read(4096, &mut got);
        assert_eq!(got, data, "len {len}");
    }
}

#[test]
fn read_returns_remote_bytes() {
    for len in [0usize, 8, 1024, 3000, 70_000] {
        let mut p = pair_mtu(Mtu::M512);
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
        p.mb.mem.write(100, &data);
        p.sim.devices[0].post_send(p.qa, wr(2, SendOp::Read(remote(&p.mb, 100)), vec![sge(&p.ma, 8, len)])).unwrap();
        let wc = p.wait(0);
        assert_eq!((wc.status, wc.opcode, wc.byte_len as usize), (WcStatus::Success, WcOpcode::RdmaRead, len));
        let mut got = vec![0u8; len];
        p.ma.mem.read(8, &mut got);
        assert_eq!(got, data, "len {len}");
    }
}

#[test]
fn send_with_immediate_reaches_a_posted_receive() {
    let mut p = pair_mtu(Mtu::M256);
    let data: Vec<u8> = (0..1000).map(|i| i as u8).collect();
    p.ma.mem.write(0, &data);
    p.sim.devices[1]
        .post_recv(p.qb, RecvWr { wr_id: 9, sgl: vec![sge(&p.mb, 0, 600), sge(&p.mb, 2000, 600)] })
        .unwrap();
    p.sim.devices[0].post_send(p.qa, wr(3, SendOp::SendImm(0xabcd), vec![sge(&p.ma, 0, 1000)])).unwrap();
    let rwc = p.wait(1);
    assert_eq!((rwc.wr_id, rwc.status, rwc.byte_len, rwc.imm), (9, WcStatus::Success, 1000, Some(0xabcd)));
    let mut got = vec![0u8; 1000];
    p.mb.mem.read(0, &mut got[..600]);
    p.mb.mem.read(2000, &mut got[600..]);
    assert_eq!(got, data);
    assert_eq!(p.wait(0).status, WcStatus::Success);
}

#[test]
fn atomics_return_the_original_value_once() {
    let mut p = pair_mtu(Mtu::M1024);
    p.mb.mem.write(64, &40u64.to_le_bytes());
    let op = SendOp::FetchAdd(remote(&p.mb, 64), 2);
    p.sim.devices[0].post_send(p.qa, wr(4, op, vec![sge(&p.ma, 0, 8)])).unwrap();
    assert_eq!(p.wait(0).status, WcStatus::Success);
    let op = SendOp::CompareSwap(remote(&p.mb, 64), 42, 7);
    p.sim.devices[0].post_send(p.qa, wr(5, op, vec![sge(&p.ma, 8, 8)])).unwrap();
    assert_eq!(p.wait(0).status, WcStatus::Success);
    let mut b = [0u8; 16];
    p.ma.mem.read(0, &mut b);
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 40);
    assert_eq!(u64::from_le_bytes(b[8..].try_into().unwrap()), 42);
    p.mb.mem.read(64, &mut b[..8]);
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 7);
}

#[test]
fn lost_read_responses_are_asked_for_again() {
    let mut p = pair_mtu(Mtu::M256);
    let data: Vec<u8> = (0..600).map(|i| i as u8).collect();
    p.mb.mem.write(0, &data);
    let mut dropped = 0;
    p.sim.tamper = Some(Box::new(move |from, pkt| {
        // Lose the first two READ responses from B.
        if from == 1 && (0x0d..=0x10).contains(&pkt[0]) && dropped < 2 {
            dropped += 1;
            return false;
        }
        true
    }));
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Read(remote(&p.mb, 0)), vec![sge(&p.ma, 0, 600)])).unwrap();
    let wc = p.wait(0);
    assert_eq!(wc.status, WcStatus::Success, "{}", p.sim.devices[0].qp_summary(p.qa));
    let mut got = vec![0u8; 600];
    p.ma.mem.read(0, &mut got);
    assert_eq!(got, data);
}
