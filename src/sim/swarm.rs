//! The swarm test: one seed picks a workload (every RC opcode, sizes from 0 to hundreds of
//! KiB, several QPs, random signaling, receives withheld to force RNR) and a fault mix,
//! then runs it on two devices and checks invariants after every step:
//! every work request completes once, in order, successfully; remote memory holds what was
//! written; a READ returns exactly the region's bytes; each atomic is applied once;
//! every corrupted packet fails its ICRC; once faults stop, everything finishes.

use super::{Faults, LinkStats, Sim};
use crate::engine::mem::{Access, Mr};
use crate::engine::rng::Rng;
use crate::engine::verbs::*;
use crate::engine::{Device, DeviceConfig};
use std::collections::VecDeque;
use std::fmt;

/// Ring size of most seeds; three seeds in a hundred use `BIG_RING` and move multi-MiB
/// messages.
const RING: usize = 1 << 21;
const BIG_RING: usize = 1 << 23;
const MAX_WQE: usize = 64;
/// Longest a sent message waits for the harness to post its receive.
const MAX_RNR_STARVATION_NS: u64 = 5_000_000;

/// Why a seed failed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// What went wrong.
    pub what: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {} failed: {}\nreproduce with: softrdma sim --seed {}", self.seed, self.what, self.seed)
    }
}

/// What a passing seed did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Work requests completed.
    pub work_requests: u64,
    /// Bytes moved by them.
    pub bytes: u64,
    /// Virtual time taken, ns.
    pub virtual_ns: u64,
    /// What the link did.
    pub link: LinkStats,
    /// The fault mix.
    pub faults: Faults,
    /// QPs.
    pub qps: usize,
    /// Each device's counters.
    pub devices: Vec<crate::engine::Stats>,
    /// UC and UD messages delivered.
    pub unreliable_delivered: u64,
    /// CM MADs the devices sent (connections made through the CM, and their repeats).
    pub cm_mads: u64,
}

#[derive(Debug, Clone)]
enum Kind {
    Send { imm: Option<u32> },
    Write { remote: usize, imm: Option<u32> },
    Read { remote: usize },
    FetchAdd { add: u64, expect: u64 },
    CompareSwap { compare: u64, swap: u64, expect: u64 },
    AtomicWrite { remote: usize, bytes: [u8; 8] },
}

#[derive(Debug, Clone)]
struct Op {
    wr_id: u64,
    kind: Kind,
    len: usize,
    local: usize,
    data: Vec<u8>,
    signaled: bool,
}

/// A message the responder must see arrive, in order.
#[derive(Debug, Clone)]
struct Incoming {
    len: usize,
    imm: Option<u32>,
    write_imm: bool,
    data: Vec<u8>,
    buf: Option<usize>,
}

/// One direction of one connection: requests from `req` to `resp`.
struct Flow {
    /// Bytes in each ring (local buffers, remote write area, receive area); the READ pattern
    /// is half as long.
    ring: usize,
    req: usize,
    resp: usize,
    qpn: u32,
    peer_qpn: u32,
    /// The SRQ the responder's QP takes receives from, if any.
    srq: Option<u32>,
    send_cq: u32,
    src: Mr,
    dst: Mr,
    todo: VecDeque<Op>,
    pending: VecDeque<Op>,
    incoming: VecDeque<Incoming>,
    recv_next: usize,
    local_next: usize,
    remote_next: usize,
    recv_ring_next: usize,
    /// Since when the oldest message without a receive has waited for one.
    recv_wait_since: Option<u64>,
    atomic_model: u64,
    done_ops: u64,
    bytes: u64,
}

fn pattern_byte(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 7)) as u8
}

fn fill_random(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A message size: mostly small, some up to 64 KiB, a few up to 512 KiB, and on big seeds
/// a few up to 3 MiB.
fn pick_len(rng: &mut Rng, big: bool) -> usize {
    match rng.below(100) {
        0..=39 => rng.below(257) as usize,
        40..=79 => rng.below(8193) as usize,
        80..=94 => rng.below(65_537) as usize,
        95..=96 if big => rng.below(3 * 1024 * 1024 + 1) as usize,
        _ => rng.below(512 * 1024 + 1) as usize,
    }
}

/// Picks the fault mix of a seed: each fault is on or off, at a random strength.
pub fn pick_faults(rng: &mut Rng) -> Faults {
    let on =
        |p: f64, max: f64, rng: &mut Rng| if rng.chance(p) { max * (rng.below(1000) as f64 / 1000.0) } else { 0.0 };
    let loss = on(0.6, 0.05, rng);
    let duplicate = on(0.5, 0.05, rng);
    let reorder = on(0.5, 0.1, rng);
    let corrupt = on(0.5, 0.03, rng);
    let lo = 1_000 + rng.below(20_000);
    let delay_ns = (lo, lo + rng.below(50_000));
    let rate_bytes_per_us = rng.chance(0.4).then(|| 100 + rng.below(5_000));
    // A partition lasts at most a tenth of the shortest period, so that with the worst loss
    // and corruption the eight sendings of one packet (retry_cnt 7) are all lost with
    // probability below 1e-6: a correct QP then ends in RetryExcErr, as IBTA wants, and
    // the swarm would call that a failure. Partitions up to 1.6 ms in 5 ms did that once
    // (seed 1622: five partitions and three losses of one packet).
    let partition = rng.chance(0.3).then(|| (5_000_000 + rng.below(20_000_000), 100_000 + rng.below(400_000)));
    Faults { loss, duplicate, reorder, corrupt, delay_ns, rate_bytes_per_us, partition, ecn_threshold_ns: None }
}

/// Device `i` of a seed's simulation.
pub fn device(i: usize, seed: u64) -> Device {
    // The loss window ships on (the UDP and raw drivers turn it on), so three seeds in four
    // run with one: every third of those with the drivers' own sizes, the rest with sizes
    // drawn from the seed. SOFTRDMA_SIM_LOSS_WINDOW=1 turns it on for every seed.
    let mut cc = crate::engine::cc::CcConfig::default();
    let forced = std::env::var_os("SOFTRDMA_SIM_LOSS_WINDOW").is_some_and(|v| v == "1");
    if forced || !seed.is_multiple_of(4) {
        let shipped = crate::verbs::OpenConfig::new(std::net::Ipv4Addr::LOCALHOST.into()).cc;
        if seed.is_multiple_of(3) {
            cc.loss_window_max_packets = shipped.loss_window_max_packets;
            cc.loss_window_initial_packets = shipped.loss_window_initial_packets;
            cc.loss_window_device_packets = shipped.loss_window_device_packets;
        } else {
            cc.loss_window_max_packets = 1 + (seed % 64) as u32;
            cc.loss_window_initial_packets = 1 + (seed / 64 % 16) as u32;
        }
    }
    // Congestion control (CNPs, DCQCN) is a switch the tools and OpenConfig offer: one
    // seed in five runs with it, on a link that marks ECN-CE (`pick_faults`).
    cc.enabled = cc_on(seed);
    Device::new(DeviceConfig { gid: gid_of(i, seed), seed: Some(seed ^ (0x5eed << i)), max_qps: 64, max_mrs: 256, cc })
}

/// Whether seed `seed` runs with congestion control on.
pub fn cc_on(seed: u64) -> bool {
    seed % 5 == 1
}

/// Device `i`'s GID: an IPv6 address (fd00::1, fd00::2) in one seed in four, so that the
/// link frames IPv6/UDP and the ICRC covers an IPv6 header (Annex A17.3.3); otherwise
/// IPv4-mapped.
fn gid_of(i: usize, seed: u64) -> crate::engine::verbs::Gid {
    if seed % 4 == 2 {
        std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1 + i as u16).octets()
    } else {
        gid_from_ipv4([10, 0, 0, 1 + i as u8])
    }
}

/// Whether seed `seed`'s responders take receives from a shared receive queue (one per
/// QP, so the checker still knows which message each receive is for).
fn srq_on(seed: u64) -> bool {
    seed % 3 == 2
}

/// An RC QP and its CQ for the swarm.
fn make_qp(d: &mut Device, with_srq: bool) -> Result<(u32, u32), VerbsError> {
    let pd = crate::engine::mem::Pd(1);
    let cq = d.create_cq(4096);
    let srq = with_srq.then(|| d.create_srq(MAX_WQE, 4));
    let qpn = d.create_qp(QpInit {
        xrc: None,
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps { max_send_wr: MAX_WQE, max_recv_wr: MAX_WQE, max_sge: 4 },
        srq,
    })?;
    Ok((qpn, cq))
}

/// Connects a QP on `a` to one on `b` as rdma_cm does (IBTA ch. 12): `b` listens on `port`,
/// `a` sends a REQ, `b` accepts, and the MADs cross the same faulty link as the data,
/// lost, repeated, reordered or corrupted with it. Returns once both QPs are in RTS.
pub fn connect_cm(
    sim: &mut Sim,
    (a, b): (usize, usize),
    rng: &mut Rng,
    mtu: Mtu,
    port: u16,
    srq: bool,
) -> Result<(u32, u32, u32, u32), String> {
    use crate::cm::{AcceptArgs, ConnStatus, ConnectArgs};
    let e = |e: VerbsError| format!("{e:?}");
    let (qa, cqa) = make_qp(&mut sim.devices[a], srq).map_err(e)?;
    let (qb, cqb) = make_qp(&mut sim.devices[b], srq).map_err(e)?;
    // Small depths, and the depths the tools connect with (16 over rdma_cm, 128 over the
    // TCP exchange, as rxe's perftest asks for).
    let ord = match rng.below(4) {
        0 => 128,
        1 => 16,
        _ => 1 + rng.below(8) as u8,
    };
    let now = sim.now;
    sim.devices[b].with_cm(now, |cm, _| cm.listen(port)).map_err(|e| format!("listen: {e:?}"))?;
    let args = ConnectArgs {
        qpn: qa,
        local_gid: sim.devices[a].gid(),
        peer_gid: sim.devices[b].gid(),
        src_port: 0xc000 | port,
        dst_port: port,
        psn: sim.devices[a].random_psn(),
        mtu,
        responder_resources: ord,
        initiator_depth: ord,
        private_data: Vec::new(),
    };
    let id =
        sim.devices[a].with_cm(now, |cm, qps| cm.connect(now, args, qps)).map_err(|e| format!("connect: {e:?}"))?;
    let mut accepted = None;
    let status = |d: &mut Device, id, now| d.with_cm(now, |cm, _| cm.status(id).cloned());
    loop {
        let now = sim.now;
        if accepted.is_none() {
            if let Some(r) = sim.devices[b].with_cm(now, |cm, _| cm.take_request(port)) {
                let psn = sim.devices[b].random_psn();
                let args = AcceptArgs {
                    qpn: qb,
                    psn,
                    mtu,
                    responder_resources: ord,
                    initiator_depth: ord,
                    private_data: Vec::new(),
                };
                sim.devices[b]
                    .with_cm(now, |cm, qps| cm.accept(now, r.id, args, qps))
                    .map_err(|e| format!("accept: {e:?}"))?;
                accepted = Some(r.id);
            }
        }
        let up_a = status(&mut sim.devices[a], id, now);
        let up_b = accepted.and_then(|i| status(&mut sim.devices[b], i, now));
        match (up_a, up_b) {
            (Some(ConnStatus::Established), Some(ConnStatus::Established)) => return Ok((qa, cqa, qb, cqb)),
            (Some(ConnStatus::Failed(f)), _) | (_, Some(ConnStatus::Failed(f))) => return Err(format!("CM: {f:?}")),
            _ => {}
        }
        if !sim.step() {
            return Err("the CM exchange stalled".into());
        }
    }
}

/// Connects a QP on device `a` to one on device `b` (RESET → INIT → RTR → RTS both ways).
pub fn connect(sim: &mut Sim, a: usize, b: usize, rng: &mut Rng, mtu: Mtu) -> Result<(u32, u32, u32, u32), VerbsError> {
    connect_with(sim, (a, b), rng, mtu, false)
}

/// As [`connect`], each QP taking its receives from an SRQ of its own when `srq`.
fn connect_with(
    sim: &mut Sim,
    (a, b): (usize, usize),
    rng: &mut Rng,
    mtu: Mtu,
    srq: bool,
) -> Result<(u32, u32, u32, u32), VerbsError> {
    let (qa, cqa) = make_qp(&mut sim.devices[a], srq)?;
    let (qb, cqb) = make_qp(&mut sim.devices[b], srq)?;
    let (psn_a, psn_b) = (sim.devices[a].random_psn(), sim.devices[b].random_psn());
    // Small depths, and the depths the tools connect with (16 over rdma_cm, 128 over the
    // TCP exchange, as rxe's perftest asks for).
    let ord = match rng.below(4) {
        0 => 128,
        1 => 16,
        _ => 1 + rng.below(8) as u8,
    };
    let rnr_timer = 1 + rng.below(14) as u8;
    for (d, q, peer, peer_q, my_psn, peer_psn) in [(a, qa, b, qb, psn_a, psn_b), (b, qb, a, qa, psn_b, psn_a)] {
        let peer_gid = sim.devices[peer].gid();
        let dev = &mut sim.devices[d];
        dev.modify_qp(q, &QpAttr { state: Some(QpState::Init), access: Some(Access::ALL), ..QpAttr::default() })?;
        dev.modify_qp(
            q,
            &QpAttr {
                state: Some(QpState::Rtr),
                dest_gid: Some(peer_gid),
                dest_qpn: Some(peer_q),
                rq_psn: Some(peer_psn),
                path_mtu: Some(mtu),
                max_dest_rd_atomic: Some(ord),
                min_rnr_timer: Some(rnr_timer),
                ..QpAttr::default()
            },
        )?;
        dev.modify_qp(
            q,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(my_psn),
                timeout: Some(12),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(ord),
                ..QpAttr::default()
            },
        )?;
    }
    Ok((qa, cqa, qb, cqb))
}

fn make_flow(
    sim: &mut Sim,
    req: usize,
    resp: usize,
    qpn: u32,
    peer_qpn: u32,
    cqs: (u32, u32),
    ring: usize,
) -> Result<Flow, VerbsError> {
    let pd = crate::engine::mem::Pd(1);
    let src = sim.devices[req].reg_mr(pd, ring, Access::ALL)?;
    let dst = sim.devices[resp].reg_mr(pd, ring * 2 + ring / 2 + 64, Access::ALL)?;
    let pattern: Vec<u8> = (0..ring / 2).map(pattern_byte).collect();
    dst.mem.write(ring * 2, &pattern);
    Ok(Flow {
        ring,
        req,
        resp,
        qpn,
        peer_qpn,
        srq: sim.devices[resp].qp_srq(peer_qpn),
        send_cq: cqs.0,
        src,
        dst,
        todo: VecDeque::new(),
        pending: VecDeque::new(),
        incoming: VecDeque::new(),
        recv_next: 0,
        local_next: 0,
        remote_next: 0,
        recv_ring_next: 0,
        recv_wait_since: None,
        atomic_model: 0,
        done_ops: 0,
        bytes: 0,
    })
}

fn plan(flow: &mut Flow, rng: &mut Rng, n: usize, base_id: u64) {
    let big = flow.ring > RING;
    for i in 0..n {
        let len = pick_len(rng, big);
        let imm = rng.chance(0.3).then(|| rng.next_u64() as u32);
        let kind = match rng.below(7) {
            0 | 1 => Kind::Send { imm },
            2 => Kind::Write { remote: 0, imm },
            3 => Kind::Read { remote: 0 },
            4 => Kind::FetchAdd { add: rng.next_u64() >> rng.below(64), expect: 0 },
            5 => Kind::CompareSwap { compare: 0, swap: rng.next_u64(), expect: 0 },
            _ => Kind::AtomicWrite { remote: 0, bytes: rng.next_u64().to_le_bytes() },
        };
        let fixed = matches!(kind, Kind::FetchAdd { .. } | Kind::CompareSwap { .. } | Kind::AtomicWrite { .. });
        let len = if fixed { 8 } else { len };
        let data =
            if matches!(kind, Kind::Send { .. } | Kind::Write { .. }) { fill_random(rng, len) } else { Vec::new() };
        flow.todo.push_back(Op { wr_id: base_id + i as u64, kind, len, local: 0, data, signaled: rng.chance(0.7) });
    }
    if let Some(last) = flow.todo.back_mut() {
        last.signaled = true; // the last one must complete visibly
    }
}

fn ring_alloc(next: &mut usize, len: usize, align: usize, ring: usize) -> usize {
    let mut at = next.div_ceil(align) * align;
    if at + len > ring {
        at = 0;
    }
    *next = at + len;
    at
}

fn outstanding_bytes(flow: &Flow) -> usize {
    flow.pending.iter().map(|o| o.len).sum()
}

/// Posts the next planned work request of `flow` if the queue and the rings have room.
fn post_next(sim: &mut Sim, flow: &mut Flow, rng: &mut Rng) -> Result<bool, String> {
    let Some(op) = flow.todo.front() else { return Ok(false) };
    if flow.pending.len() >= MAX_WQE || outstanding_bytes(flow) + op.len > flow.ring / 2 {
        return Ok(false);
    }
    let Some(mut op) = flow.todo.pop_front() else { return Ok(false) };
    // If the next request will have to wait for this one's room, this one must complete
    // visibly: an unsignaled request's completion is never seen (IBTA 10.8.6).
    let next_len = flow.todo.front().map_or(0, |o| o.len);
    if flow.pending.len() + 2 > MAX_WQE || outstanding_bytes(flow) + op.len + next_len > flow.ring / 2 {
        op.signaled = true;
    }
    let ring = flow.ring;
    op.local = ring_alloc(&mut flow.local_next, op.len, 8, ring);
    let remote = Remote { addr: flow.dst.addr, rkey: flow.dst.rkey };
    let sge = Sge { addr: flow.src.addr + op.local as u64, length: op.len as u32, lkey: flow.src.lkey };
    let at = |off: usize| Remote { addr: remote.addr + off as u64, ..remote };
    let atomic_at = at(ring * 2 + ring / 2 + 8 * (flow.qpn as usize % 8));
    let sendop = match &mut op.kind {
        Kind::Send { imm } => {
            flow.src.mem.write(op.local, &op.data);
            flow.incoming.push_back(Incoming {
                len: op.len,
                imm: *imm,
                write_imm: false,
                data: op.data.clone(),
                buf: None,
            });
            imm.map_or(SendOp::Send, SendOp::SendImm)
        }
        Kind::Write { remote: r, imm } => {
            flow.src.mem.write(op.local, &op.data);
            *r = ring_alloc(&mut flow.remote_next, op.len, 1, ring);
            if let Some(i) = imm {
                flow.incoming.push_back(Incoming {
                    len: 0,
                    imm: Some(*i),
                    write_imm: true,
                    data: Vec::new(),
                    buf: None,
                });
                SendOp::WriteImm(at(*r), *i)
            } else {
                SendOp::Write(at(*r))
            }
        }
        Kind::Read { remote: r } => {
            *r = rng.below((ring / 2 - op.len) as u64 + 1) as usize;
            SendOp::Read(at(ring * 2 + *r))
        }
        Kind::FetchAdd { add, expect } => {
            *expect = flow.atomic_model;
            flow.atomic_model = flow.atomic_model.wrapping_add(*add);
            SendOp::FetchAdd(atomic_at, *add)
        }
        Kind::CompareSwap { compare, swap, expect } => {
            *expect = flow.atomic_model;
            *compare = if rng.chance(0.5) { flow.atomic_model } else { rng.next_u64() };
            if *compare == flow.atomic_model {
                flow.atomic_model = *swap;
            }
            SendOp::CompareSwap(atomic_at, *compare, *swap)
        }
        Kind::AtomicWrite { remote: r, bytes } => {
            *r = ring_alloc(&mut flow.remote_next, 8, 8, ring);
            SendOp::AtomicWrite(at(*r), *bytes)
        }
    };
    let wr = SendWr {
        wr_id: op.wr_id,
        op: sendop,
        sgl: vec![sge],
        signaled: op.signaled,
        solicited: rng.chance(0.1),
        ud: None,
        xrc_srqn: 0,
    };
    sim.devices[flow.req].post_send(flow.qpn, wr).map_err(|e| format!("post_send: {e:?}"))?;
    flow.pending.push_back(op);
    Ok(true)
}

/// Posts a receive for the next message that has none, sized exactly or with room to spare.
fn post_recv(sim: &mut Sim, flow: &mut Flow, rng: &mut Rng) -> Result<bool, String> {
    let Some(inc) = flow.incoming.get_mut(flow.recv_next) else { return Ok(false) };
    let size = inc.len + if rng.chance(0.5) { rng.below(64) as usize } else { 0 };
    let at = ring_alloc(&mut flow.recv_ring_next, size, 8, flow.ring);
    inc.buf = Some(at);
    let sge = Sge { addr: flow.dst.addr + (flow.ring + at) as u64, length: size as u32, lkey: flow.dst.lkey };
    let wr = RecvWr { wr_id: flow.recv_next as u64, sgl: vec![sge] };
    let posted = match flow.srq {
        Some(srq) => sim.devices[flow.resp].post_srq_recv(srq, wr),
        None => sim.devices[flow.resp].post_recv(flow.peer_qpn, wr),
    };
    match posted {
        Ok(()) => {
            flow.recv_next += 1;
            Ok(true)
        }
        Err(VerbsError::QueueFull) => Ok(false),
        Err(e) => Err(format!("post_recv: {e:?}")),
    }
}

fn check_effect(flow: &Flow, op: &Op) -> Result<(), String> {
    match &op.kind {
        Kind::Write { remote, .. } => {
            let mut got = vec![0u8; op.len];
            flow.dst.mem.read(*remote, &mut got);
            if got != op.data {
                let first = got.iter().zip(&op.data).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "WRITE wr {} ({} bytes at {remote}): remote memory differs from byte {first}",
                    op.wr_id, op.len
                ));
            }
        }
        Kind::Read { remote } => {
            let mut got = vec![0u8; op.len];
            flow.src.mem.read(op.local, &mut got);
            let want: Vec<u8> = (*remote..*remote + op.len).map(pattern_byte).collect();
            if got != want {
                return Err(format!("READ wr {} ({} bytes at {}): wrong bytes", op.wr_id, op.len, remote));
            }
        }
        Kind::FetchAdd { expect, .. } | Kind::CompareSwap { expect, .. } => {
            let mut b = [0u8; 8];
            flow.src.mem.read(op.local, &mut b);
            let got = u64::from_le_bytes(b);
            if got != *expect {
                return Err(format!("atomic wr {}: original {got:#x}, model says {expect:#x}", op.wr_id));
            }
        }
        Kind::AtomicWrite { remote, bytes } => {
            let mut got = [0u8; 8];
            flow.dst.mem.read(*remote, &mut got);
            if got != *bytes {
                return Err(format!("ATOMIC WRITE wr {} at {remote}: {got:02x?}, sent {bytes:02x?}", op.wr_id));
            }
        }
        Kind::Send { .. } => {}
    }
    Ok(())
}

/// Checks send completions: in order, exactly once, successful, with their effects.
fn check_send_cq(flow: &mut Flow, wcs: &[Wc]) -> Result<(), String> {
    for wc in wcs {
        if wc.status != WcStatus::Success {
            return Err(format!("wr {} completed with {:?}", wc.wr_id, wc.status));
        }
        loop {
            let Some(op) = flow.pending.pop_front() else {
                return Err(format!("completion for wr {} that is not outstanding", wc.wr_id));
            };
            check_effect(flow, &op)?;
            flow.done_ops += 1;
            flow.bytes += op.len as u64;
            if op.wr_id == wc.wr_id {
                break;
            }
            if op.signaled {
                return Err(format!("wr {} completed before signaled wr {}", wc.wr_id, op.wr_id));
            }
        }
    }
    Ok(())
}

/// Checks receive completions: in posting order, with the sender's bytes and immediate.
fn check_recv_cq(flow: &mut Flow, wcs: &[Wc]) -> Result<(), String> {
    for wc in wcs {
        if wc.status != WcStatus::Success {
            return Err(format!("receive completed with {:?}", wc.status));
        }
        let Some(inc) = flow.incoming.pop_front() else { return Err("receive completion with no message sent".into()) };
        flow.recv_next = flow.recv_next.saturating_sub(1);
        let opcode = if inc.write_imm { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv };
        if wc.opcode != opcode || wc.imm != inc.imm || (!inc.write_imm && wc.byte_len as usize != inc.len) {
            return Err(format!(
                "receive {:?} imm {:?} len {} != expected {:?} {:?} {}",
                wc.opcode, wc.imm, wc.byte_len, opcode, inc.imm, inc.len
            ));
        }
        if let Some(at) = inc.buf.filter(|_| !inc.write_imm) {
            let mut got = vec![0u8; inc.len];
            flow.dst.mem.read(flow.ring + at, &mut got);
            if got != inc.data {
                return Err(format!("received {} bytes differ from those sent", inc.len));
            }
        }
    }
    Ok(())
}

/// Builds the devices, connections and workload of a seed.
fn setup(seed: u64) -> Result<(Sim, Vec<Flow>, Rng), String> {
    let mut rng = Rng::new(seed);
    let mut faults = pick_faults(&mut rng);
    if cc_on(seed) {
        // A marking link for the CNPs to answer: a rate, and a queue threshold.
        faults.rate_bytes_per_us.get_or_insert(500 + seed % 2_000);
        faults.ecn_threshold_ns = Some(10_000 + seed % 90_000);
    }
    let mut sim = Sim::new(vec![device(0, seed), device(1, seed)], faults, rng.next_u64());
    let mtu = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096][rng.below(5) as usize];
    let nqps = 1 + rng.below(3) as usize;
    let ring = if rng.chance(0.03) { BIG_RING } else { RING };
    let mut flows = Vec::new();
    for i in 0..nqps {
        // Half the connections come up through the CM, as rdma_cm applications' do.
        let (qa, cqa, qb, cqb) = if rng.chance(0.5) {
            connect_cm(&mut sim, (0, 1), &mut rng, mtu, 7000 + i as u16, srq_on(seed))?
        } else {
            connect_with(&mut sim, (0, 1), &mut rng, mtu, srq_on(seed)).map_err(|e| format!("connect: {e:?}"))?
        };
        let ops = 5 + rng.below(40) as usize;
        for (req, resp, q, pq, cq, pcq) in [(0, 1, qa, qb, cqa, cqb), (1, 0, qb, qa, cqb, cqa)] {
            let mut f = make_flow(&mut sim, req, resp, q, pq, (cq, pcq), ring).map_err(|e| format!("{e:?}"))?;
            plan(&mut f, &mut rng, ops, (i as u64) << 32 | (req as u64) << 24);
            flows.push(f);
        }
    }
    Ok((sim, flows, rng))
}

/// Runs one seed: its RC workload, then its UC and UD workloads under the same faults.
pub fn run(seed: u64) -> Result<Report, Failure> {
    let mut report = run_with(seed, None)?;
    for ty in [QpType::Uc, QpType::Ud] {
        let delivered =
            super::unreliable::run(seed, ty, report.faults.clone()).map_err(|what| Failure { seed, what })?;
        report.unreliable_delivered += delivered;
    }
    Ok(report)
}

/// Runs one seed's workload, with `faults` instead of the seed's own when given.
pub fn run_with(seed: u64, faults: Option<Faults>) -> Result<Report, Failure> {
    run_inner(seed, faults).map_err(|what| Failure { seed, what })
}

fn run_inner(seed: u64, forced: Option<Faults>) -> Result<Report, String> {
    let (mut sim, mut flows, mut rng) = setup(seed)?;
    if let Some(f) = forced {
        sim.faults = f;
    }
    drive(&mut sim, &mut flows, &mut rng).map_err(|e| {
        let mut devices: Vec<String> = sim.devices.iter().map(|d| format!("{:?}", d.stats)).collect();
        for f in &flows {
            devices.push(sim.devices[f.req].qp_summary(f.qpn));
        }
        if std::env::var_os("SOFTRDMA_SIM_TRACE").is_some() {
            devices.extend(sim.trace.iter().cloned());
        }
        format!(
            "{e}\n  at t={} ns, faults {:?}\n  link {:?}\n  devices {}",
            sim.now,
            sim.faults,
            sim.stats,
            devices.join("\n          ")
        )
    })
}

fn drive(sim: &mut Sim, flows: &mut [Flow], rng: &mut Rng) -> Result<Report, String> {
    let faults = sim.faults.clone();
    let recv_eagerness = [0.02, 0.2, 1.0][rng.below(3) as usize];
    let fault_end = 50_000_000 + rng.below(100_000_000);
    let deadline = fault_end + 30_000_000_000;
    let mut faults_on = true;
    let tracing = std::env::var_os("SOFTRDMA_SIM_TRACE").is_some();
    let mut snapshot = String::new();
    let mut still = 0u32;
    loop {
        let mut posted_any = false;
        for f in flows.iter_mut() {
            while post_next(sim, f, rng)? {
                posted_any = true;
            }
            // Receives are withheld to provoke RNR, but never for longer than MAX_RNR_STARVATION:
            // a requester whose RNR NAKs are lost to partitions meanwhile would rightly
            // exhaust its retries, which is not what this workload tests.
            let starving = f.recv_next < f.incoming.len();
            let since = *f.recv_wait_since.get_or_insert(sim.now);
            let overdue = starving && sim.now - since > MAX_RNR_STARVATION_NS;
            if !starving {
                f.recv_wait_since = None;
            }
            if overdue || rng.chance(recv_eagerness) {
                let posted = post_recv(sim, f, rng)?;
                if posted {
                    f.recv_wait_since = None;
                }
                posted_any |= posted;
            }
        }
        let before = sim.now;
        let moved = sim.step();
        // A step that does not move time must be rare: the engine may not busy-loop.
        still = if sim.now == before { still + 1 } else { 0 };
        if still > 1_000_000 {
            return Err(stuck(sim, flows, "a million steps without time moving"));
        }
        if tracing {
            snapshot = flows.iter().map(|f| sim.devices[f.req].qp_summary(f.qpn)).collect::<Vec<_>>().join("\n  ");
        }
        poll_and_check(sim, flows).map_err(|e| format!("{e}\n  state one step before:\n  {snapshot}"))?;
        if sim.stats.corruption_missed > 0 {
            return Err("a corrupted packet passed its ICRC".into());
        }
        if faults_on && sim.now >= fault_end {
            faults_on = false;
            sim.faults = Faults { delay_ns: sim.faults.delay_ns, ..Faults::none() };
        }
        let finished = flows.iter().all(|f| f.todo.is_empty() && f.pending.is_empty() && f.incoming.is_empty());
        if finished {
            break;
        }
        if !moved {
            // Nothing in flight and no timer: only withheld receives can be missing.
            let mut posted = false;
            for f in flows.iter_mut() {
                posted |= post_recv(sim, f, rng)?;
            }
            if !posted && !posted_any {
                return Err(stuck(sim, flows, "idle with work outstanding"));
            }
        }
        if sim.now > deadline {
            return Err(stuck(sim, flows, "not finished 30 s after the faults stopped"));
        }
    }
    for f in flows.iter() {
        let mut b = [0u8; 8];
        f.dst.mem.read(f.ring * 2 + f.ring / 2 + 8 * (f.qpn as usize % 8), &mut b);
        if u64::from_le_bytes(b) != f.atomic_model {
            return Err(format!(
                "atomic word of QP {} is {:#x}, model {:#x}",
                f.qpn,
                u64::from_le_bytes(b),
                f.atomic_model
            ));
        }
    }
    Ok(Report {
        work_requests: flows.iter().map(|f| f.done_ops).sum(),
        bytes: flows.iter().map(|f| f.bytes).sum(),
        virtual_ns: sim.now,
        link: sim.stats.clone(),
        faults,
        qps: flows.len() / 2,
        devices: sim.devices.iter().map(|d| d.stats.clone()).collect(),
        unreliable_delivered: 0,
        cm_mads: sim.devices.iter().map(|d| d.cm_stats().mads_out).sum(),
    })
}

fn poll_and_check(sim: &mut Sim, flows: &mut [Flow]) -> Result<(), String> {
    for i in 0..flows.len() {
        let (req, send_cq) = (flows[i].req, flows[i].send_cq);
        let wcs = sim.devices[req].poll_cq(send_cq, usize::MAX);
        for wc in wcs {
            // Send and receive completions share a CQ per QP: route by opcode and QP.
            let owner = flows.iter().position(|f| {
                let is_recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                if is_recv {
                    f.resp == req && f.peer_qpn == wc.qpn
                } else {
                    f.req == req && f.qpn == wc.qpn
                }
            });
            let Some(o) = owner else { return Err(format!("completion for unknown QP {}", wc.qpn)) };
            if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                check_recv_cq(&mut flows[o], &[wc])?;
            } else {
                check_send_cq(&mut flows[o], &[wc])?;
            }
        }
    }
    Ok(())
}

fn stuck(sim: &Sim, flows: &[Flow], why: &str) -> String {
    let mut s = format!("{why} at t={} ns", sim.now);
    for f in flows {
        s += &format!(
            "; QP {}->{}: {} to post, {} outstanding, {} messages unreceived ({} receives posted), state {:?}",
            f.qpn,
            f.peer_qpn,
            f.todo.len(),
            f.pending.len(),
            f.incoming.len(),
            f.recv_next,
            sim.devices[f.req].qp_state(f.qpn)
        );
    }
    s
}
