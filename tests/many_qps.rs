//! Many RC connections between two devices sharing the loss window the UDP driver ships,
//! over a simulated link with a finite rate: every message completes and, the link being
//! lossless, no retransmission timer fires.

mod common;
use common::*;
use softrdma::engine::cc::CcConfig;
use softrdma::engine::mem::{Access, Pd};
use softrdma::engine::verbs::*;
use softrdma::engine::{Device, DeviceConfig};
use softrdma::sim::{Faults, Sim};

fn shipped_device(i: u8, qps: usize) -> Device {
    // The UDP driver's defaults (`OpenConfig::new`).
    let cc = CcConfig {
        loss_window_max_packets: 256,
        loss_window_initial_packets: 4,
        loss_window_device_packets: 1024,
        ..CcConfig::default()
    };
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
