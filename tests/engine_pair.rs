//! Two engines on a clean simulated link: each operation end to end, with data checked.

use softrdma::engine::mem::{Access, Mr, Pd};
use softrdma::engine::rng::Rng;
use softrdma::engine::verbs::*;
use softrdma::engine::{Device, DeviceConfig};
use softrdma::sim::swarm::connect;
use softrdma::sim::{Faults, Sim};

struct Pair {
    sim: Sim,
    qa: u32,
    qb: u32,
    cqa: u32,
    cqb: u32,
    ma: Mr,
    mb: Mr,
}

fn pair(mtu: Mtu) -> Pair {
    let dev = |i: u8| {
        Device::new(DeviceConfig { gid: gid_from_ipv4([10, 0, 0, i]), seed: u64::from(i), max_qps: 8, max_mrs: 8 })
    };
    let mut sim = Sim::new(vec![dev(1), dev(2)], Faults::none(), 7);
    let (qa, cqa, qb, cqb) = connect(&mut sim, 0, 1, &mut Rng::new(3), mtu).unwrap();
    let ma = sim.devices[0].reg_mr(Pd(1), 1 << 20, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 1 << 20, Access::ALL).unwrap();
    Pair { sim, qa, qb, cqa, cqb, ma, mb }
}

fn sge(m: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: m.addr + off as u64, length: len as u32, lkey: m.lkey }
}

fn remote(m: &Mr, off: usize) -> Remote {
    Remote { addr: m.addr + off as u64, rkey: m.rkey }
}

fn wait(p: &mut Pair, dev: usize) -> Wc {
    let cq = if dev == 0 { p.cqa } else { p.cqb };
    for _ in 0..100_000 {
        if let Some(wc) = p.sim.devices[dev].poll_cq(cq, 1).pop() {
            return wc;
        }
        if !p.sim.step() {
            break;
        }
    }
    panic!("no completion; link {:?}, stats {:?}", p.sim.stats, p.sim.devices[dev].stats);
}

fn wr(wr_id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr { wr_id, op, sgl, signaled: true, solicited: false }
}

#[test]
fn write_lands_in_remote_memory() {
    for len in [0usize, 1, 112, 1024, 1025, 5000, 100_000] {
        let mut p = pair(Mtu::M1024);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        p.ma.mem.write(0, &data);
        let op = SendOp::Write(remote(&p.mb, 4096));
        p.sim.devices[0].post_send(p.qa, wr(1, op, vec![sge(&p.ma, 0, len)])).unwrap();
        let wc = wait(&mut p, 0);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::RdmaWrite), "len {len}");
        let mut got = vec![0u8; len];
        p.mb.mem.read(4096, &mut got);
        assert_eq!(got, data, "len {len}");
    }
}

#[test]
fn read_returns_remote_bytes() {
    for len in [0usize, 8, 1024, 3000, 70_000] {
        let mut p = pair(Mtu::M512);
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
        p.mb.mem.write(100, &data);
        p.sim.devices[0].post_send(p.qa, wr(2, SendOp::Read(remote(&p.mb, 100)), vec![sge(&p.ma, 8, len)])).unwrap();
        let wc = wait(&mut p, 0);
        assert_eq!((wc.status, wc.opcode, wc.byte_len as usize), (WcStatus::Success, WcOpcode::RdmaRead, len));
        let mut got = vec![0u8; len];
        p.ma.mem.read(8, &mut got);
        assert_eq!(got, data, "len {len}");
    }
}

#[test]
fn send_with_immediate_reaches_a_posted_receive() {
    let mut p = pair(Mtu::M256);
    let data: Vec<u8> = (0..1000).map(|i| i as u8).collect();
    p.ma.mem.write(0, &data);
    p.sim.devices[1]
        .post_recv(p.qb, RecvWr { wr_id: 9, sgl: vec![sge(&p.mb, 0, 600), sge(&p.mb, 2000, 600)] })
        .unwrap();
    p.sim.devices[0].post_send(p.qa, wr(3, SendOp::SendImm(0xabcd), vec![sge(&p.ma, 0, 1000)])).unwrap();
    let rwc = wait(&mut p, 1);
    assert_eq!((rwc.wr_id, rwc.status, rwc.byte_len, rwc.imm), (9, WcStatus::Success, 1000, Some(0xabcd)));
    let mut got = vec![0u8; 1000];
    p.mb.mem.read(0, &mut got[..600]);
    p.mb.mem.read(2000, &mut got[600..]);
    assert_eq!(got, data);
    assert_eq!(wait(&mut p, 0).status, WcStatus::Success);
}

#[test]
fn atomics_return_the_original_value_once() {
    let mut p = pair(Mtu::M1024);
    p.mb.mem.write(64, &40u64.to_le_bytes());
    let op = SendOp::FetchAdd(remote(&p.mb, 64), 2);
    p.sim.devices[0].post_send(p.qa, wr(4, op, vec![sge(&p.ma, 0, 8)])).unwrap();
    assert_eq!(wait(&mut p, 0).status, WcStatus::Success);
    let op = SendOp::CompareSwap(remote(&p.mb, 64), 42, 7);
    p.sim.devices[0].post_send(p.qa, wr(5, op, vec![sge(&p.ma, 8, 8)])).unwrap();
    assert_eq!(wait(&mut p, 0).status, WcStatus::Success);
    let mut b = [0u8; 16];
    p.ma.mem.read(0, &mut b);
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 40);
    assert_eq!(u64::from_le_bytes(b[8..].try_into().unwrap()), 42);
    p.mb.mem.read(64, &mut b[..8]);
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 7);
}

#[test]
fn lost_read_responses_are_asked_for_again() {
    let mut p = pair(Mtu::M256);
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
    let wc = wait(&mut p, 0);
    assert_eq!(wc.status, WcStatus::Success, "{}", p.sim.devices[0].qp_summary(p.qa));
    let mut got = vec![0u8; 600];
    p.ma.mem.read(0, &mut got);
    assert_eq!(got, data);
}
