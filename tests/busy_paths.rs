//! Busy but lossless paths, with the loss window the UDP driver ships: many RC connections
//! sharing it over a simulated link with a finite rate, and one connection whose queue
//! holds more than its Local ACK Timeout. Every message completes and no retransmission
//! timer fires: a busy path is not mistaken for loss (IBTA 9.7.6.1.3, timer stretched by
//! the measured round trip, `engine/qp/rtt.rs`).

mod common;
use common::*;
use softrdma::engine::mem::{Access, Pd};
use softrdma::engine::verbs::*;
use softrdma::engine::{Device, DeviceConfig};
use softrdma::sim::{Faults, Sim};

fn shipped_device(i: u8, qps: usize) -> Device {
    // The UDP driver's defaults.
    let cc = softrdma::verbs::OpenConfig::new(std::net::Ipv4Addr::LOCALHOST.into()).cc;
    Device::new(DeviceConfig {
        gid: gid_from_ipv4([10, 0, 0, i]),
        seed: Some(u64::from(i)),
        max_qps: qps + 8,
        max_mrs: 8,
        cc,
    })
}

/// Messages each connection sends.
const ROUNDS: u64 = 7;

/// `qps` connections, two 64 KiB WRITEs posted on each (then one more per completion, up to
/// [`ROUNDS`]), on a 1 GB/s link with a 10 µs
/// delay; returns (completions, retransmission timeouts, simulated ns).
fn run(qps: usize) -> (usize, u64, u64) {
    let faults = Faults { rate_bytes_per_us: Some(1000), ..Faults::none() };
    let mut sim = Sim::new(vec![shipped_device(1, qps), shipped_device(2, qps)], faults, 3);
    let cqs = [sim.devices[0].create_cq(4 * qps), sim.devices[1].create_cq(4 * qps)];
    let at = Attrs { mtu: Mtu::M4096, timeout: 14, ..Attrs::default() };
    let pairs: Vec<[u32; 2]> = (0..qps).map(|_| connect_qps(&mut sim, QpType::Rc, &at, cqs, None, None)).collect();
    let ma = sim.devices[0].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    for (i, q) in pairs.iter().enumerate() {
        for k in 0..2 {
            let w = wr((i * 16 + k) as u64, SendOp::Write(remote(&mb, 0)), vec![sge(&ma, 0, 1 << 16)]);
            sim.devices[0].post_send(q[0], w).unwrap();
        }
    }
    // As the perftest loop does: each completion makes room for one more, up to 7 a QP.
    let (mut done, mut posted) = (0, vec![2u64; qps]);
    while sim.step() && sim.now < 10_000_000_000 {
        for wc in sim.devices[0].poll_cq(cqs[0], usize::MAX) {
            assert_eq!(wc.status, WcStatus::Success);
            done += 1;
            let i = (wc.wr_id / 16) as usize;
            if posted[i] < ROUNDS {
                let w = wr(i as u64 * 16 + posted[i], SendOp::Write(remote(&mb, 0)), vec![sge(&ma, 0, 1 << 16)]);
                sim.devices[0].post_send(pairs[i][0], w).unwrap();
                posted[i] += 1;
            }
        }
        if done == ROUNDS as usize * qps {
            break;
        }
    }
    (done, sim.devices[0].stats.retransmit_timeouts, sim.now)
}

#[test]
fn a_thousand_connections_share_the_window_with_no_timeout() {
    let (done, timeouts, ns) = run(1000);
    // 459 MB at 1 GB/s: about half a second of link time.
    assert_eq!((done, timeouts), (7000, 0), "after {} ms", ns / 1_000_000);
}

#[test]
fn a_queue_longer_than_the_ack_timeout_is_not_mistaken_for_loss() {
    // 10 MB/s. One connection streams 1 MiB WRITEs, so its loss window's packets queue
    // for about 100 ms, past the 67 ms Local ACK Timeout of timeout 14; a second one
    // writes 1 KiB at a time behind them, each waiting for the last.
    let faults = Faults { rate_bytes_per_us: Some(10), ..Faults::none() };
    let mut sim = Sim::new(vec![shipped_device(1, 2), shipped_device(2, 2)], faults, 5);
    let cqs = [sim.devices[0].create_cq(64), sim.devices[1].create_cq(64)];
    let at = Attrs { mtu: Mtu::M4096, timeout: 14, ..Attrs::default() };
    let bulk = connect_qps(&mut sim, QpType::Rc, &at, cqs, None, None);
    let ping = connect_qps(&mut sim, QpType::Rc, &at, cqs, None, None);
    let ma = sim.devices[0].reg_mr(Pd(1), 1 << 20, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 1 << 20, Access::ALL).unwrap();
    for k in 0..8 {
        let w = wr(k, SendOp::Write(remote(&mb, 0)), vec![sge(&ma, 0, 1 << 20)]);
        sim.devices[0].post_send(bulk[0], w).unwrap();
    }
    let small = |k: u64| wr(100 + k, SendOp::Write(remote(&mb, 0)), vec![sge(&ma, 0, 1024)]);
    sim.devices[0].post_send(ping[0], small(0)).unwrap();
    let (mut bulk_done, mut pings) = (0, 0);
    while (bulk_done < 8 || pings < 12) && sim.step() && sim.now < 60_000_000_000 {
        for w in sim.devices[0].poll_cq(cqs[0], usize::MAX) {
            assert_eq!(w.status, WcStatus::Success);
            if w.wr_id < 100 {
                bulk_done += 1;
            } else if bulk_done < 8 {
                pings += 1;
                sim.devices[0].post_send(ping[0], small(pings)).unwrap();
            }
        }
    }
    let queued_ms = sim.stats.max_backlog_ns / 1_000_000;
    assert!(queued_ms > 67, "the path must queue past the timeout for this to test anything: {queued_ms} ms");
    assert!(pings >= 12, "{pings} small WRITEs done behind the queue");
    // The first small WRITE may time out, before any round trip was measured.
    assert!(sim.devices[0].stats.retransmit_timeouts <= 1, "{:?}", sim.devices[0].stats);
}

/// One connection sending 20 64 KiB WRITEs back to back, beside `idle` connected QPs that
/// send nothing; returns the simulated ns it took.
fn one_busy_beside(idle: usize) -> u64 {
    let faults = Faults { rate_bytes_per_us: Some(1000), ..Faults::none() };
    let mut sim = Sim::new(vec![shipped_device(1, idle + 1), shipped_device(2, idle + 1)], faults, 5);
    let cqs = [sim.devices[0].create_cq(64), sim.devices[1].create_cq(64)];
    let at = Attrs { mtu: Mtu::M4096, timeout: 14, ..Attrs::default() };
    let busy = connect_qps(&mut sim, QpType::Rc, &at, cqs, None, None);
    for _ in 0..idle {
        connect_qps(&mut sim, QpType::Rc, &at, cqs, None, None);
    }
    let ma = sim.devices[0].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    let start = sim.now;
    for k in 0..20 {
        sim.devices[0].post_send(busy[0], wr(k, SendOp::Write(remote(&mb, 0)), vec![sge(&ma, 0, 1 << 16)])).unwrap();
    }
    let mut done = 0;
    while done < 20 && sim.step() {
        done += sim.devices[0].poll_cq(cqs[0], usize::MAX).len();
    }
    assert_eq!(done, 20);
    sim.now - start
}

// The device's in-flight budget is shared by the QPs that have requests outstanding: a
// thousand idle connections leave a busy one its whole window (they once took all but one
// packet of it, 1024 / 1001).
#[test]
fn idle_connections_leave_a_busy_one_its_whole_window() {
    let (alone, beside) = (one_busy_beside(0), one_busy_beside(1000));
    assert!(beside * 10 <= alone * 11, "alone {alone} ns, beside 1000 idle QPs {beside} ns");
}

/// Packets QP `q` of device 0 puts on the wire at once for a 64 KiB WRITE, nothing answered.
fn first_burst(sim: &mut Sim, q: u32, ma: &softrdma::engine::mem::Mr, mb: &softrdma::engine::mem::Mr) -> usize {
    let w = wr(1, SendOp::Write(remote(mb, 0)), vec![sge(ma, 0, 1 << 16)]);
    sim.devices[0].post_send(q, w).unwrap();
    let now = sim.now;
    std::iter::from_fn(|| sim.devices[0].poll_transmit(now)).count()
}

// A QP taken back to RESET and connected again is a new connection: it starts with the
// driver's loss window, as a newly created one does, not with none at all.
#[test]
fn a_qp_reset_and_connected_again_starts_with_the_loss_window() {
    let mut sim = Sim::new(vec![shipped_device(1, 2), shipped_device(2, 2)], Faults::none(), 5);
    let cqs = [sim.devices[0].create_cq(64), sim.devices[1].create_cq(64)];
    let at = Attrs { mtu: Mtu::M4096, ..Attrs::default() };
    let first = connect_qps(&mut sim, QpType::Rc, &at, cqs, None, None);
    let second = connect_qps(&mut sim, QpType::Rc, &at, cqs, None, None);
    let ma = sim.devices[0].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), 1 << 16, Access::ALL).unwrap();
    let initial =
        softrdma::verbs::OpenConfig::new(std::net::Ipv4Addr::LOCALHOST.into()).cc.loss_window_initial_packets as usize;
    assert_eq!(first_burst(&mut sim, first[0], &ma, &mb), initial, "a new QP: the initial window");
    sim.devices[0].modify_qp(second[0], &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    let gid = sim.devices[1].gid();
    let (init, rtr, rts) = attrs_for(QpType::Rc, &at, gid, second[1], at.psn_b, at.psn_a, 0);
    for a in [init, rtr, rts] {
        sim.devices[0].modify_qp(second[0], &a).unwrap();
    }
    assert_eq!(first_burst(&mut sim, second[0], &ma, &mb), initial, "after RESET: the initial window again");
}
