//! Congestion control in the simulator (IBTA Annex A17.9): a slow link marks ECN-CE when
//! its queue grows; the responder answers with rate-limited CNPs; the requester's DCQCN
//! pacer slows down, so the queue stays shorter than without it.

mod common;

use common::{remote, sge};
use softrdma::engine::cc::CcConfig;
use softrdma::engine::mem::{Access, Pd};
use softrdma::engine::rng::Rng;
use softrdma::engine::verbs::*;
use softrdma::engine::{Device, DeviceConfig};
use softrdma::sim::swarm::connect;
use softrdma::sim::{Faults, LinkStats, Sim};

const TOTAL: usize = 8 << 20;
const CHUNK: usize = 256 << 10;

fn run(cc_on: bool) -> (LinkStats, [softrdma::engine::Stats; 2], u64) {
    let cc = CcConfig { enabled: cc_on, line_rate_bytes_per_us: 2_000, ..CcConfig::default() };
    let dev = |i: u8| {
        Device::new(DeviceConfig {
            gid: gid_from_ipv4([10, 0, 0, i]),
            seed: Some(u64::from(i)),
            max_qps: 8,
            max_mrs: 8,
            cc,
        })
    };
    let faults = Faults {
        rate_bytes_per_us: Some(200),
        ecn_threshold_ns: Some(50_000),
        delay_ns: (5_000, 5_000),
        ..Faults::none()
    };
    let mut sim = Sim::new(vec![dev(1), dev(2)], faults, 3);
    let (qa, cqa, _qb, _) = connect(&mut sim, 0, 1, &mut Rng::new(9), Mtu::M4096).unwrap();
    let ma = sim.devices[0].reg_mr(Pd(1), CHUNK, Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(Pd(1), TOTAL, Access::ALL).unwrap();
    ma.mem.fill(0, CHUNK, 0x5a);
    for i in 0..TOTAL / CHUNK {
        let wr = SendWr {
            wr_id: i as u64,
            op: SendOp::Write(remote(&mb, i * CHUNK)),
            sgl: vec![sge(&ma, 0, CHUNK)],
            signaled: true,
            solicited: false,
            ud: None,
            xrc_srqn: 0,
        };
        sim.devices[0].post_send(qa, wr).unwrap();
    }
    sim.run_until(u64::MAX);
    let wcs = sim.devices[0].poll_cq(cqa, 1000);
    assert_eq!(wcs.len(), TOTAL / CHUNK);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert!(mb.mem.to_vec().iter().all(|&b| b == 0x5a));
    (sim.stats.clone(), [sim.devices[0].stats.clone(), sim.devices[1].stats.clone()], sim.now)
}

#[test]
fn cnps_slow_the_requester_and_shorten_the_queue() {
    let (link_off, dev_off, _) = run(false);
    let (link_on, dev_on, t_on) = run(true);
    println!(
        "queue: {} ns with CC, {} ns without; CNPs {}",
        link_on.max_backlog_ns, link_off.max_backlog_ns, dev_on[1].cnps_sent
    );
    assert!(link_off.ecn_marked > 0, "the link is congested");
    assert_eq!(dev_off[1].cnps_sent, 0, "CC off: no CNP");
    assert!(dev_on[1].cnps_sent > 0);
    assert_eq!(dev_on[0].cnps_received, dev_on[1].cnps_sent);
    // At most one CNP per QP per interval.
    assert!(dev_on[1].cnps_sent <= t_on / CcConfig::default().cnp_interval_ns + 1);
    assert!(
        link_on.max_backlog_ns * 2 < link_off.max_backlog_ns,
        "queue with CC {} ns, without {} ns",
        link_on.max_backlog_ns,
        link_off.max_backlog_ns
    );
}
