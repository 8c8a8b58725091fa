//! The engine alone: RDMA WRITEs and SENDs between two devices with no I/O and no
//! simulator, packets handed from one's `poll_transmit` to the other's `handle_packet`.
//! Its packets per second per core are the ceiling the transports chase (issue 14).
//!
//!     cargo bench --bench engine

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softrdma::engine::mem::{Access, Mr, Pd};
use softrdma::engine::verbs::*;
use softrdma::engine::{Device, DeviceConfig};

struct Pair {
    d: [Device; 2],
    q: [u32; 2],
    cq: [u32; 2],
    m: [Mr; 2],
    now: u64,
}

fn device(i: u8) -> Device {
    let gid = gid_from_ipv4([10, 0, 0, i]);
    Device::new(DeviceConfig { gid, seed: Some(u64::from(i)), max_qps: 8, max_mrs: 8, cc: Default::default() })
}

/// Two RC QPs at path MTU 4096, connected, each with a 4 MiB region.
fn pair() -> Pair {
    let mut d = [device(1), device(2)];
    let cq = [d[0].create_cq(4096), d[1].create_cq(4096)];
    let mut q = [0u32; 2];
    for i in 0..2 {
        let init = QpInit {
            qp_type: QpType::Rc,
            pd: Pd(1),
            send_cq: cq[i],
            recv_cq: cq[i],
            caps: QpCaps::default(),
            srq: None,
            xrc: None,
        };
        q[i] = d[i].create_qp(init).unwrap();
    }
    let state = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    for i in 0..2 {
        let peer_gid = d[1 - i].gid();
        let init = QpAttr { access: Some(Access::ALL), ..state(QpState::Init) };
        let rtr = QpAttr {
            dest_gid: Some(peer_gid),
            dest_qpn: Some(q[1 - i]),
            rq_psn: Some(0x100),
            path_mtu: Some(Mtu::M4096),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(1),
            ..state(QpState::Rtr)
        };
        let rts = QpAttr {
            sq_psn: Some(0x100),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..state(QpState::Rts)
        };
        for a in [&init, &rtr, &rts] {
            d[i].modify_qp(q[i], a).unwrap();
        }
    }
    let m = [d[0].reg_mr(Pd(1), 4 << 20, Access::ALL).unwrap(), d[1].reg_mr(Pd(1), 4 << 20, Access::ALL).unwrap()];
    Pair { d, q, cq, m, now: 0 }
}

impl Pair {
    /// Moves packets both ways until neither device has one to send; returns how many.
    fn pump(&mut self) -> usize {
        let mut moved = 0;
        loop {
            let mut any = false;
            for i in 0..2 {
                let src = self.d[i].gid();
                while let Some(t) = self.d[i].poll_transmit(self.now) {
                    self.d[1 - i].handle_packet(self.now, src, &t.packet);
                    // As the transports do: the next packets are built in this buffer.
                    self.d[i].recycle(t.packet);
                    moved += 1;
                    any = true;
                }
            }
            self.now += 1_000;
            if !any {
                return moved;
            }
        }
    }

    /// One message of `len` bytes from device 0, moved and completed.
    fn message(&mut self, op: SendOp, len: usize) -> usize {
        if matches!(op, SendOp::Send) {
            let sge = Sge { addr: self.m[1].addr, length: len as u32, lkey: self.m[1].lkey };
            self.d[1].post_recv(self.q[1], RecvWr { wr_id: 1, sgl: vec![sge] }).unwrap();
        }
        let sge = Sge { addr: self.m[0].addr, length: len as u32, lkey: self.m[0].lkey };
        let wr = SendWr { wr_id: 1, op, sgl: vec![sge], signaled: true, solicited: false, ud: None, xrc_srqn: 0 };
        self.d[0].post_send(self.q[0], wr).unwrap();
        let moved = self.pump();
        let done = self.d[0].poll_cq(self.cq[0], 16);
        assert!(done.iter().all(|w| w.status == WcStatus::Success) && !done.is_empty());
        self.d[1].poll_cq(self.cq[1], 16);
        moved
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    for (name, len) in [("write", 65536usize), ("write", 1 << 20), ("send", 65536), ("write", 8)] {
        let mut p = pair();
        let remote = Remote { addr: p.m[1].addr, rkey: p.m[1].rkey };
        let op = if name == "write" { SendOp::Write(remote) } else { SendOp::Send };
        let packets = p.message(op, len);
        g.throughput(Throughput::Elements(packets as u64));
        g.bench_with_input(BenchmarkId::new(format!("{name} packets"), len), &len, |b, &len| {
            b.iter(|| p.message(op, len))
        });
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new(format!("{name} bytes"), len), &len, |b, &len| {
            b.iter(|| p.message(op, len))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
