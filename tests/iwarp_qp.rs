//! Two iWARP QPs over an in-memory byte pipe cut at random points: every operation with the
//! data checked, with CRC and markers on and off; and the bad input that must end in a
//! Terminate with the right layer, type and code, nothing written and everything flushed.

use softrdma::engine::mem::{Access, Mr, MrTable, Pd};
use softrdma::engine::rng::Rng;
use softrdma::engine::verbs::*;
use softrdma::iwarp::qp::IwarpQp;
use softrdma::iwarp::setup::{CrcPolicy, Outcome, Policy, Setup};

struct Side {
    qp: IwarpQp,
    mrs: MrTable,
    mr: Mr,
    wcs: Vec<Wc>,
}

fn side(qp: IwarpQp, seed: u64) -> Side {
    let mut mrs = MrTable::new(8);
    let mr = mrs.register(Pd(1), 1 << 20, Access::ALL, &mut Rng::new(seed)).unwrap();
    Side { qp, mrs, mr, wcs: Vec::new() }
}

/// Negotiates with `Setup` as the real connection does, then makes the two QPs.
fn pair(crc: bool, markers: bool, ord: u16) -> (Side, Side) {
    pair_mss(crc, markers, ord, 1460)
}

/// As [`pair`], on a connection whose TCP MSS is `mss`.
fn pair_mss(crc: bool, markers: bool, ord: u16, mss: usize) -> (Side, Side) {
    let crc = if crc { CrcPolicy::Required } else { CrcPolicy::OnRequest };
    let p = Policy { crc, markers, ord, ird: ord, ..Policy::default() };
    let mut ini = Setup::initiator(p.clone(), 0);
    let mut res = Setup::responder(p, 0);
    res.on_bytes(&ini.take_output());
    ini.on_bytes(&res.take_output());
    let neg = |s: &Setup| match s.outcome() {
        Some(Outcome::Established(n)) => n.clone(),
        o => panic!("{o:?}"),
    };
    let a = IwarpQp::new(1, Pd(1), &neg(&ini), true, mss, None);
    let b = IwarpQp::new(2, Pd(1), &neg(&res), false, mss, None);
    (side(a, 1), side(b, 2))
}

/// Moves stream bytes both ways in random pieces until nothing is left to move.
fn pump(a: &mut Side, b: &mut Side, rng: &mut Rng) {
    loop {
        let (ab, ba) = (a.qp.take_output(&a.mrs), b.qp.take_output(&b.mrs));
        // What is taken is transmitted: its Sends and Writes complete.
        for s in [&mut *a, &mut *b] {
            s.qp.on_transmitted(s.qp.output_offset());
        }
        if ab.is_empty() && ba.is_empty() {
            break;
        }
        for (bytes, to) in [(ab, &mut *b), (ba, &mut *a)] {
            let mut at = 0;
            while at < bytes.len() {
                let n = (1 + rng.below(3000) as usize).min(bytes.len() - at);
                to.qp.on_stream(&bytes[at..at + n], &mut to.mrs, None);
                at += n;
            }
        }
    }
    for s in [a, b] {
        while let Some(wc) = s.qp.poll_completion() {
            s.wcs.push(wc);
        }
    }
}

fn sge(m: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: m.addr + off as u64, length: len as u32, lkey: m.lkey }
}

fn wr(id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr { wr_id: id, op, sgl, signaled: true, solicited: false, ud: None, xrc_srqn: 0 }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

fn read(m: &Mr, off: usize, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    m.mem.read(off, &mut v);
    v
}

/// With markers, an FPDU (markers included) fits the MSS whatever its size, as RFC 5044's
/// MULPDU has it: on loopback's 64 KiB MSS a fixed allowance of 3 markers made FPDUs of over
/// 65,535 wire octets, whose last markers' 16-bit FPDUPTR wrapped and the peer terminated.
#[test]
fn marked_fpdus_fit_every_mss_up_to_loopbacks() {
    for (mss, crc) in [(1460, false), (8948, true), (65483, false), (65483, true)] {
        let (mut a, mut b) = pair_mss(crc, true, 2, mss);
        let mut rng = Rng::new(mss as u64);
        pump(&mut a, &mut b, &mut rng);
        let data = pattern(300_000, 3);
        a.mr.mem.write(0, &data);
        let remote = Remote { addr: b.mr.addr + 400_000, rkey: b.mr.rkey };
        a.qp.post_send(wr(1, SendOp::Write(remote), vec![sge(&a.mr, 0, data.len())]), &a.mrs).unwrap();
        pump(&mut a, &mut b, &mut rng);
        assert!(a.qp.terminated().is_none() && b.qp.terminated().is_none(), "mss {mss}: {:?}", b.qp.terminated());
        assert_eq!(a.wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), [(1, WcStatus::Success)]);
        assert!(read(&b.mr, 400_000, data.len()) == data, "mss {mss}: the Write placed");
    }
}

/// A region deregistered while a request on it waits to be framed (posted behind a full
/// output budget) takes the QP to ERR with every request flushed, on either framing path
/// (payloads copied, with a CRC; spliced in, without): the engine neither panics nor reads
/// the application's buffer after it was given back.
#[test]
#[allow(unsafe_code)]
fn a_region_deregistered_before_its_request_is_framed_fails_the_qp_cleanly() {
    for crc in [false, true] {
        let (mut a, mut b) = pair_mss(crc, false, 2, 65483);
        let mut rng = Rng::new(7);
        pump(&mut a, &mut b, &mut rng);
        let mut app = vec![7u8; 256 * 1024];
        let ptr = std::ptr::NonNull::new(app.as_mut_ptr()).unwrap();
        // SAFETY: `app` outlives the region, which is deregistered (revoked) below.
        let mem = std::sync::Arc::new(unsafe { softrdma::engine::mem::SharedMem::foreign(ptr, app.len()) });
        let theirs = a.mrs.register_mem(Pd(1), mem, Access::ALL, None, &mut Rng::new(8)).unwrap();
        let remote = Remote { addr: b.mr.addr, rkey: b.mr.rkey };
        // The first fills the output budget; the second waits unframed behind it.
        a.qp.post_send(wr(1, SendOp::Write(remote), vec![sge(&a.mr, 0, 1 << 20)]), &a.mrs).unwrap();
        a.qp.post_send(wr(2, SendOp::Write(remote), vec![sge(&theirs, 0, 200_000)]), &a.mrs).unwrap();
        let first = a.qp.poll_output(1 << 20, &a.mrs);
        assert!(!first.is_empty());
        assert!(a.mrs.deregister(theirs.lkey));
        let _ = a.qp.take_output(&a.mrs);
        let wcs: Vec<(u64, WcStatus)> =
            std::iter::from_fn(|| a.qp.poll_completion()).map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(wcs.len(), 2, "crc {crc}: each request completes once: {wcs:?}");
        assert!(wcs.iter().all(|(_, s)| *s != WcStatus::Success), "crc {crc}: {wcs:?}");
        drop(app);
    }
}

#[test]
fn every_operation_with_crc_and_markers_on_and_off() {
    for (crc, markers) in [(false, false), (true, false), (false, true), (true, true)] {
        let (mut a, mut b) = pair(crc, markers, 2);
        let mut rng = Rng::new(u64::from(crc) * 2 + u64::from(markers));
        pump(&mut a, &mut b, &mut rng); // the RTR
        let data = pattern(100_000, 5);
        a.mr.mem.write(0, &data);
        b.qp.post_recv(RecvWr { wr_id: 100, sgl: vec![sge(&b.mr, 0, 5000), sge(&b.mr, 8000, 10_000)] }).unwrap();
        b.qp.post_recv(RecvWr { wr_id: 101, sgl: vec![sge(&b.mr, 20_000, 64)] }).unwrap();
        b.qp.post_recv(RecvWr { wr_id: 102, sgl: vec![] }).unwrap();
        let extra = b.mrs.register(Pd(1), 4096, Access::ALL, &mut Rng::new(9)).unwrap();
        let mut solicited = wr(2, SendOp::SendInv(extra.rkey), vec![sge(&a.mr, 0, 64)]);
        solicited.solicited = true;
        let remote = |off: usize| Remote { addr: b.mr.addr + off as u64, rkey: b.mr.rkey };
        let posts = vec![
            wr(1, SendOp::Send, vec![sge(&a.mr, 0, 12_000)]),
            solicited,
            wr(3, SendOp::Send, vec![]),
            wr(4, SendOp::Write(remote(100_000)), vec![sge(&a.mr, 0, 100_000)]),
        ];
        for w in posts {
            a.qp.post_send(w, &a.mrs).unwrap();
        }
        for i in 0..5u64 {
            let w = wr(
                10 + i,
                SendOp::Read(remote(100_000 + 1000 * i as usize)),
                vec![sge(&a.mr, 300_000 + 10_000 * i as usize, 9000)],
            );
            a.qp.post_send(w, &a.mrs).unwrap();
        }
        pump(&mut a, &mut b, &mut rng);
        let ids: Vec<(u64, WcStatus)> = a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        let want: Vec<(u64, WcStatus)> =
            [1, 2, 3, 4, 10, 11, 12, 13, 14].iter().map(|&i| (i, WcStatus::Success)).collect();
        assert_eq!(ids, want, "crc={crc} markers={markers}: in posting order, the ORD of 2 respected");
        let recv: Vec<(u64, u32, bool, Option<u32>)> =
            b.wcs.iter().map(|w| (w.wr_id, w.byte_len, w.solicited, w.invalidated_rkey)).collect();
        assert_eq!(recv, [(100, 12_000, false, None), (101, 64, true, Some(extra.rkey)), (102, 0, false, None)]);
        let mut sent = read(&b.mr, 0, 5000);
        sent.extend(read(&b.mr, 8000, 7000));
        assert_eq!(sent, data[..12_000], "the Send scattered over two SGEs");
        assert!(read(&b.mr, 100_000, 100_000) == data, "the Write placed");
        for i in 0..5 {
            assert_eq!(read(&a.mr, 300_000 + 10_000 * i, 9000), data[1000 * i..1000 * i + 9000], "Read {i}");
        }
        assert!(b.mrs.resolve(extra.rkey, Pd(1), extra.addr, 1, softrdma::engine::mem::Need::RemoteWrite).is_err());
        assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
    }
}

/// Posts one request that the responder must refuse; returns both sides afterwards.
fn refused(op: impl Fn(&Mr) -> SendOp, post_recv: bool) -> (Side, Side) {
    let (mut a, mut b) = pair(true, false, 4);
    let mut rng = Rng::new(7);
    pump(&mut a, &mut b, &mut rng);
    if post_recv {
        b.qp.post_recv(RecvWr { wr_id: 50, sgl: vec![sge(&b.mr, 0, 16)] }).unwrap();
    }
    b.qp.post_recv(RecvWr { wr_id: 51, sgl: vec![sge(&b.mr, 0, 16)] }).unwrap();
    a.mr.mem.write(0, &[0xee; 64]);
    let w = op(&b.mr);
    a.qp.post_send(wr(1, w, vec![sge(&a.mr, 0, 64)]), &a.mrs).unwrap();
    a.qp.post_send(wr(2, SendOp::Read(Remote { addr: b.mr.addr, rkey: b.mr.rkey }), vec![sge(&a.mr, 0, 8)]), &a.mrs)
        .unwrap();
    pump(&mut a, &mut b, &mut rng);
    (a, b)
}

fn terminated_with(s: &Side, words: &str) {
    let t = s.qp.terminated().expect("a Terminate");
    assert!(t.reason.contains(words), "{t:?}");
    assert_eq!(s.qp.state(), QpState::Err);
}

#[test]
fn a_bad_stag_or_bounds_is_a_tagged_buffer_terminate_and_nothing_is_written() {
    let (a, b) = refused(|m| SendOp::Write(Remote { addr: m.addr, rkey: m.rkey ^ 0x100 }), false);
    terminated_with(&b, "tagged buffer: invalid STag");
    assert!(!a.qp.terminated().unwrap().local, "A learns it from B's Terminate");
    assert_eq!(read(&b.mr, 0, 64), vec![0; 64], "nothing written");
    let st: Vec<WcStatus> = a.wcs.iter().map(|w| w.status).collect();
    assert_eq!(st, [WcStatus::Success, WcStatus::WrFlushErr], "the Write was sent; the Read is flushed");
    assert_eq!(b.wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), [(51, WcStatus::WrFlushErr)]);

    let (_, b) = refused(|m| SendOp::Write(Remote { addr: m.addr + (1 << 20) - 8, rkey: m.rkey }), false);
    terminated_with(&b, "base or bounds violation");
    assert_eq!(read(&b.mr, (1 << 20) - 8, 8), vec![0; 8]);
}

/// A QP in ERR (here after the peer's Terminate) takes what is posted and flushes it at
/// once, as siw does and a drain expects (IBTA vol. 1 10.3.1.7); nothing more goes on the
/// stream, and a request malformed in any state is still refused.
#[test]
fn a_request_posted_in_error_completes_flushed_and_sends_nothing() {
    let (mut a, mut b) = refused(|m| SendOp::Write(Remote { addr: m.addr, rkey: m.rkey ^ 0x100 }), false);
    assert_eq!(a.qp.state(), QpState::Err);
    a.wcs.clear();
    let remote = Remote { addr: b.mr.addr, rkey: b.mr.rkey };
    a.qp.post_send(wr(3, SendOp::Write(remote), vec![sge(&a.mr, 0, 8)]), &a.mrs).unwrap();
    a.qp.post_send(wr(4, SendOp::Send, vec![sge(&a.mr, 0, 8)]), &a.mrs).unwrap();
    let two_sges = vec![sge(&a.mr, 0, 4), sge(&a.mr, 4, 4)];
    assert_eq!(a.qp.post_send(wr(5, SendOp::Read(remote), two_sges), &a.mrs), Err(VerbsError::InvalidRequest));
    assert!(a.qp.take_output(&a.mrs).is_empty(), "nothing is sent");
    pump(&mut a, &mut b, &mut Rng::new(8));
    let got: Vec<_> = a.wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(got, [(3, WcStatus::WrFlushErr, WcOpcode::RdmaWrite), (4, WcStatus::WrFlushErr, WcOpcode::Send)]);
}

#[test]
fn a_send_with_no_receive_and_a_too_long_send_are_untagged_terminates() {
    let (a, b) = refused(|_| SendOp::Send, false);
    // One receive was posted (51, 16 bytes): the 64-byte Send is too long for it.
    terminated_with(&b, "message too long");
    assert_eq!(a.qp.state(), QpState::Err);

    let (mut a, mut b) = pair(false, false, 1);
    let mut rng = Rng::new(3);
    pump(&mut a, &mut b, &mut rng);
    a.qp.post_send(wr(1, SendOp::Send, vec![]), &a.mrs).unwrap();
    pump(&mut a, &mut b, &mut rng);
    terminated_with(&b, "no buffer available");
}

#[test]
fn a_bad_crc_and_garbage_on_the_stream_end_it() {
    let (mut a, mut b) = pair(true, false, 1);
    let mut rng = Rng::new(4);
    pump(&mut a, &mut b, &mut rng);
    b.qp.post_recv(RecvWr { wr_id: 1, sgl: vec![sge(&b.mr, 0, 64)] }).unwrap();
    a.qp.post_send(wr(1, SendOp::Send, vec![sge(&a.mr, 0, 64)]), &a.mrs).unwrap();
    let mut bytes = a.qp.take_output(&a.mrs);
    bytes[30] ^= 0x20;
    b.qp.on_stream(&bytes, &mut b.mrs, None);
    terminated_with(&b, "received CRC error");
    assert_eq!(read(&b.mr, 0, 64), vec![0; 64]);

    let (mut a, mut b) = pair(false, false, 1);
    pump(&mut a, &mut b, &mut rng);
    // A well-framed FPDU whose ULPDU is garbage (reserved DDP bits set).
    let mut fpdu = vec![0u8, 38];
    fpdu.extend([0xffu8; 38]);
    fpdu.extend([0u8; 4]);
    b.qp.on_stream(&fpdu, &mut b.mrs, None);
    terminated_with(&b, "unexpected opcode");
    // A Terminate went out: A reads it and stops too.
    a.qp.on_stream(&b.qp.take_output(&b.mrs), &mut a.mrs, None);
    assert_eq!(a.qp.state(), QpState::Err);
}

// Posted requests are framed as the transport takes them: eight 1 MiB Writes posted at once
// come out a budget's worth per call (RFC 5041 segments, in order), complete as their last
// byte is transmitted, and land whole.
#[test]
fn posted_writes_are_framed_as_the_stream_takes_them() {
    let (mut a, mut b) = pair(true, false, 1);
    let mut rng = Rng::new(9);
    pump(&mut a, &mut b, &mut rng);
    a.mr.mem.write(0, &pattern(1 << 20, 3));
    let remote = Remote { addr: b.mr.addr, rkey: b.mr.rkey };
    for id in 0..8 {
        a.qp.post_send(wr(id, SendOp::Write(remote), vec![sge(&a.mr, 0, 1 << 20)]), &a.mrs).unwrap();
    }
    const BUDGET: usize = 256 * 1024;
    let mut calls = 0;
    while a.qp.has_output() {
        let out = a.qp.poll_output(BUDGET, &a.mrs);
        assert!(out.len() <= BUDGET + 1460, "{} octets framed for a budget of {BUDGET}", out.len());
        a.qp.on_transmitted(a.qp.output_offset());
        b.qp.on_stream(&out, &mut b.mrs, None);
        calls += 1;
    }
    assert!(calls >= 32, "8 MiB in {calls} calls of at most {BUDGET} octets");
    let done: Vec<u64> = std::iter::from_fn(|| a.qp.poll_completion()).map(|w| w.wr_id).collect();
    assert_eq!(done, (0..8).collect::<Vec<_>>());
    assert_eq!(read(&b.mr, 0, 1 << 20), pattern(1 << 20, 3));
}
