//! Swarm workloads for UC and UD (IBTA 9.8): under the same faults, what an unreliable
//! transport still promises. UD: every delivered datagram was sent, whole, with the right
//! source QPN and GID, and no more often than the link duplicated it. UC: messages arrive
//! whole, in order, at most once. Both: every send completes, in order, successfully.

use super::{Faults, Sim};
use crate::engine::mem::{Access, Mr, Pd};
use crate::engine::rng::Rng;
use crate::engine::verbs::*;
use std::collections::HashMap;

const MTU: Mtu = Mtu::M1024;

struct Side {
    qpn: u32,
    cq: u32,
    mr: Mr,
}

fn side(sim: &mut Sim, d: usize, ty: QpType) -> Result<Side, VerbsError> {
    let cq = sim.devices[d].create_cq(4096);
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 256, max_sge: 1 };
    let qpn = sim.devices[d].create_qp(QpInit {
        qp_type: ty,
        pd: Pd(1),
        send_cq: cq,
        recv_cq: cq,
        caps,
        srq: None,
        xrc: None,
    })?;
    let mr = sim.devices[d].reg_mr(Pd(1), 1 << 20, Access::ALL)?;
    Ok(Side { qpn, cq, mr })
}

fn bring_up(sim: &mut Sim, ty: QpType, s: &[Side; 2]) -> Result<(), VerbsError> {
    for d in 0..2 {
        let peer_gid = sim.devices[1 - d].gid();
        let st = |x| QpAttr { state: Some(x), ..QpAttr::default() };
        let (init, rtr) = if ty == QpType::Ud {
            (QpAttr { qkey: Some(0x7777), ..st(QpState::Init) }, st(QpState::Rtr))
        } else {
            let rtr = QpAttr {
                dest_gid: Some(peer_gid),
                dest_qpn: Some(s[1 - d].qpn),
                rq_psn: Some(0),
                path_mtu: Some(MTU),
                ..st(QpState::Rtr)
            };
            (QpAttr { access: Some(Access::ALL), ..st(QpState::Init) }, rtr)
        };
        let dv = &mut sim.devices[d];
        dv.modify_qp(s[d].qpn, &init)?;
        dv.modify_qp(s[d].qpn, &rtr)?;
        dv.modify_qp(s[d].qpn, &QpAttr { sq_psn: Some(0), ..st(QpState::Rts) })?;
    }
    Ok(())
}

/// A message: an 8-byte sequence number, then random bytes.
fn message(rng: &mut Rng, seq: u64, max: usize) -> Vec<u8> {
    let len = 8 + rng.below(max as u64 - 7) as usize;
    let mut m = seq.to_le_bytes().to_vec();
    while m.len() < len {
        m.push(rng.next_u64() as u8);
    }
    m
}

/// Runs the UC or UD workload of a seed under `faults`; returns messages delivered.
pub fn run(seed: u64, ty: QpType, faults: Faults) -> Result<u64, String> {
    let mut rng = Rng::new(seed ^ 0x0dd_ba11);
    let devs = (0..2).map(|i| super::swarm::device(i, seed)).collect();
    let mut sim = Sim::new(devs, faults, rng.next_u64());
    let e = |e: VerbsError| format!("{e:?}");
    let s = [side(&mut sim, 0, ty).map_err(e)?, side(&mut sim, 1, ty).map_err(e)?];
    bring_up(&mut sim, ty, &s).map_err(e)?;
    let max = if ty == QpType::Ud { MTU.bytes() } else { 4 * MTU.bytes() };
    let n = 20 + rng.below(60);
    let sent: Vec<Vec<u8>> = (0..n).map(|i| message(&mut rng, i, max)).collect();
    for i in 0..256u64 {
        let sge = Sge { addr: s[1].mr.addr + i * 4096, length: 4096, lkey: s[1].mr.lkey };
        sim.devices[1].post_recv(s[1].qpn, RecvWr { wr_id: i, sgl: vec![sge] }).map_err(e)?;
    }
    let mut posted = 0usize;
    let mut completed = 0usize;
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let mut last_uc: Option<u64> = None;
    while completed < sent.len() {
        while posted < sent.len() && posted - completed < 32 {
            let m = &sent[posted];
            let at = (posted % 64) * 8192;
            s[0].mr.mem.write(at, m);
            let sge = Sge { addr: s[0].mr.addr + at as u64, length: m.len() as u32, lkey: s[0].mr.lkey };
            let ud = (ty == QpType::Ud).then(|| UdDest { gid: sim.devices[1].gid(), qpn: s[1].qpn, qkey: 0x7777 });
            let wr = SendWr {
                wr_id: posted as u64,
                op: SendOp::Send,
                sgl: vec![sge],
                signaled: true,
                solicited: false,
                ud,
                xrc_srqn: 0,
            };
            sim.devices[0].post_send(s[0].qpn, wr).map_err(e)?;
            posted += 1;
        }
        let moved = sim.step();
        let done_before = completed;
        for wc in sim.devices[0].poll_cq(s[0].cq, usize::MAX) {
            if wc.status != WcStatus::Success || wc.wr_id != completed as u64 {
                return Err(format!("{ty:?} send completion {wc:?}, expected wr {completed}"));
            }
            completed += 1;
        }
        for wc in sim.devices[1].poll_cq(s[1].cq, usize::MAX) {
            check_delivery(ty, &wc, &s, &sim, &sent, &mut seen, &mut last_uc)?;
        }
        if !moved && completed == done_before && completed < sent.len() {
            return Err(format!("{ty:?}: idle with {} sends outstanding", posted - completed));
        }
        if sim.now > 60_000_000_000 {
            return Err(format!("{ty:?}: sends not done after 60 s ({completed}/{})", sent.len()));
        }
    }
    sim.run_until(u64::MAX);
    for wc in sim.devices[1].poll_cq(s[1].cq, usize::MAX) {
        check_delivery(ty, &wc, &s, &sim, &sent, &mut seen, &mut last_uc)?;
    }
    let dup_allowance = sim.stats.duplicated as u32;
    let extra: u32 = seen.values().map(|&c| c - 1).sum();
    if extra > dup_allowance {
        return Err(format!("{ty:?}: {extra} extra deliveries, the link duplicated {dup_allowance}"));
    }
    Ok(seen.len() as u64)
}

fn check_delivery(
    ty: QpType,
    wc: &Wc,
    s: &[Side; 2],
    sim: &Sim,
    sent: &[Vec<u8>],
    seen: &mut HashMap<u64, u32>,
    last_uc: &mut Option<u64>,
) -> Result<(), String> {
    if wc.status != WcStatus::Success {
        return Err(format!("{ty:?} receive {wc:?}"));
    }
    let skip = if ty == QpType::Ud { 40 } else { 0 };
    let len = wc.byte_len as usize - skip;
    let mut got = vec![0u8; len];
    s[1].mr.mem.read(wc.wr_id as usize * 4096 + skip, &mut got);
    let seq = u64::from_le_bytes(got.get(..8).and_then(|b| b.try_into().ok()).ok_or("short message")?);
    let want = sent.get(seq as usize).ok_or(format!("{ty:?}: delivered a message never sent (seq {seq})"))?;
    if &got != want {
        return Err(format!("{ty:?}: message {seq} arrived damaged ({} bytes, sent {})", got.len(), want.len()));
    }
    if ty == QpType::Ud && (wc.src_qp != Some(s[0].qpn) || wc.src_gid != Some(sim.devices[0].gid())) {
        return Err(format!("UD source {:?}/{:?}", wc.src_qp, wc.src_gid));
    }
    if ty == QpType::Uc {
        if last_uc.is_some_and(|l| seq <= l) {
            return Err(format!("UC message {seq} after {last_uc:?}: out of order or twice"));
        }
        *last_uc = Some(seq);
    }
    *seen.entry(seq).or_insert(0) += 1;
    Ok(())
}
