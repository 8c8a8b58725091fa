//! Stateful fuzzing of iWARP: an [`IwarpQp`] on an established connection fed a
//! fuzzer-chosen stream, and MPA setup fed fuzzer-chosen bytes. Oracles: no panic; output
//! bounded per call; every completion at most once; no byte changed outside what a peer
//! may write; an outcome, once reached, never changes.

use crate::engine::mem::{Access, Mr, MrTable, Pd};
use crate::engine::rng::Rng;
use crate::engine::verbs::{RecvWr, Remote, SendOp, SendWr, Sge, WcOpcode};
use crate::iwarp::qp::IwarpQp;
use crate::iwarp::setup::{CrcPolicy, Negotiated, Policy, RtrKind, Setup};
use crate::proto::iwarp::mpa;
use std::collections::HashSet;

const PATTERN: u8 = 0x5a;
/// Bytes asked of the QP per call, as a driver with a full socket would.
const BUDGET: usize = 64 * 1024;
/// What one call may exceed the budget by: a Read Response chunk and its framing.
const SLACK: usize = 2 * 64 * 1024;

struct Regions {
    mrs: MrTable,
    rw: Mr,
    recv: Mr,
    guards: Vec<Mr>,
}

fn regions() -> Regions {
    let mut mrs = MrTable::new(16);
    let mut rng = Rng::new(3);
    let local_write = Access { local_write: true, ..Access::default() };
    let remote_read = Access { remote_read: true, ..Access::default() };
    let mut reg = |pd, len, a| mrs.register(pd, len, a, &mut rng).expect("room");
    let (rw, recv) = (reg(Pd(1), 64 << 10, Access::ALL), reg(Pd(1), 64 << 10, local_write));
    let guards = vec![reg(Pd(1), 4096, remote_read), reg(Pd(2), 4096, Access::ALL), reg(Pd(1), 4096, local_write)];
    for g in &guards {
        g.mem.fill(0, g.mem.len(), PATTERN);
    }
    Regions { mrs, rw, recv, guards }
}

/// Input: [mode][stream]. Mode bits: 0 markers, 1 CRC, 2 initiator, 3-4 RTR kind (none,
/// Write, Send, Read), 5-7 the size of the pieces the stream arrives in.
pub fn iwarp_qp(data: &[u8]) {
    let Some((&mode, stream)) = data.split_first() else { return };
    let rtr = [None, Some(RtrKind::Write), Some(RtrKind::Send), Some(RtrKind::Read)][usize::from((mode >> 3) & 3)];
    let markers = mode & 1 != 0;
    let neg = Negotiated {
        crc: mode & 2 != 0,
        markers_rx: markers,
        markers_tx: markers,
        revision: 2,
        ird: 4,
        ord: 4,
        rtr,
        peer_private_data: Vec::new(),
    };
    let mut r = regions();
    let mut qp = IwarpQp::new(1, Pd(1), &neg, mode & 4 != 0, 1460, None);
    let mut posted_recvs = 0u64;
    for k in 0..8u64 {
        let sge = Sge { addr: r.recv.addr + k * 4096, length: 4096, lkey: r.recv.lkey };
        if qp.post_recv(RecvWr { wr_id: 1_000 + k, sgl: vec![sge] }).is_ok() {
            posted_recvs += 1;
        }
    }
    let at = |off: u64, len| Sge { addr: r.rw.addr + off, length: len, lkey: r.rw.lkey };
    let remote = Remote { addr: 0x1000, rkey: 0x1234 };
    let mut sends = HashSet::new();
    for wr in [
        SendWr::new(1, SendOp::Send, vec![at(0, 3000)]),
        SendWr::new(2, SendOp::Write(remote), vec![at(0, 100)]),
        SendWr::new(3, SendOp::Read(remote), vec![at(4096, 4096)]),
    ] {
        let id = wr.wr_id;
        if qp.post_send(wr, &r.mrs).is_ok() {
            sends.insert(id);
        }
    }
    let _ = qp.take_output(&r.mrs);
    qp.on_transmitted(qp.output_offset());
    let mut recv_done = 0u64;
    let piece = 1 + usize::from(mode >> 5) * 211;
    for chunk in stream.chunks(piece) {
        qp.on_stream(chunk, &mut r.mrs, None);
        let out = qp.poll_output(BUDGET, &r.mrs);
        assert!(out.len() <= BUDGET + SLACK, "{} bytes of output for a budget of {BUDGET}", out.len());
        qp.on_transmitted(qp.output_offset());
        while let Some(wc) = qp.poll_completion() {
            if wc.opcode == WcOpcode::Recv {
                recv_done += 1;
                assert!(recv_done <= posted_recvs, "more receive completions than receives");
            } else {
                assert!(sends.remove(&wc.wr_id), "send {} completed twice or never posted", wc.wr_id);
            }
        }
    }
    // A write to a guard region stays there: one look at the end finds it.
    for g in &r.guards {
        assert!(g.mem.to_vec().iter().all(|b| *b == PATTERN), "a guard region changed");
    }
}

/// Input: [mode][bytes from the peer]. Mode bits: 0-1 CRC policy, 2 markers, 3 revision 1,
/// 4 no peer-to-peer, 5-6 role (initiator, responder, deferred responder), 7 piece size.
pub fn mpa_setup(data: &[u8]) {
    let Some((&mode, bytes)) = data.split_first() else { return };
    let crc = [CrcPolicy::Off, CrcPolicy::OnRequest, CrcPolicy::Required][usize::from(mode & 3) % 3];
    let policy = Policy {
        crc,
        markers: mode & 4 != 0,
        revision: if mode & 8 != 0 { 1 } else { 2 },
        rtr: if mode & 16 != 0 { Vec::new() } else { Policy::default().rtr },
        timeout_ns: 1_000_000,
        ..Policy::default()
    };
    let mut s = match (mode >> 5) & 3 {
        0 => Setup::initiator(policy, 0),
        1 => Setup::responder(policy, 0),
        _ => Setup::responder_deferred(policy, 0),
    };
    let frame_max = mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA;
    let mut said = s.take_output().len();
    let (mut outcome, mut now) = (None, 0u64);
    let piece = if mode & 128 != 0 { 37 } else { 1 };
    for chunk in bytes.chunks(piece) {
        let used = s.on_bytes(chunk);
        assert!(used <= chunk.len());
        if s.pending_request().is_some() {
            match chunk[0] & 3 {
                0 => s.accept(chunk.to_vec(), 1, 1),
                1 => s.reject(chunk),
                _ => {}
            }
        }
        now += 300_000;
        s.handle_timeout(now);
        said += s.take_output().len();
        assert!(said <= 2 * frame_max, "{said} bytes said in MPA setup");
        match &outcome {
            Some(o) => assert_eq!(Some(o), s.outcome(), "an outcome never changes"),
            None => outcome = s.outcome().cloned(),
        }
    }
}
