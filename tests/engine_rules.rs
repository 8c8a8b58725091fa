//! One test per transport rule: packets injected or lost on purpose, and the packets and
//! completions that come out checked. Each cites the IBTA vol.1 section it enforces.

mod common;

use common::*;
use softrdma::engine::event::AsyncEvent;
use softrdma::engine::qp::RNR_TIMER_NS;
use softrdma::engine::verbs::*;
use softrdma::proto::roce::ext::{AtomicEthRepr, NakCode, RethRepr, Syndrome};
use std::cell::RefCell;
use std::rc::Rc;

fn syndrome_of(out: &[softrdma::proto::roce::RoceRepr<'static>]) -> Vec<(u8, u32, Syndrome)> {
    out.iter().filter_map(|r| r.aeth.map(|a| (r.bth.opcode, r.bth.psn.value(), a.syndrome))).collect()
}

// IBTA 9.7.5.1.5 (C9-88): a bad R_Key gets a remote access error NAK and nothing is written;
// 10.3.1.7: the requester's QP goes to ERR and flushes what follows.
#[test]
fn bad_rkey_is_a_remote_access_error_and_writes_nothing() {
    let mut p = pair(Attrs::default());
    p.ma.mem.write(0, &[0xaa; 64]);
    let bad = Remote { addr: p.mb.addr, rkey: p.mb.rkey ^ 0x100 };
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Write(bad), vec![sge(&p.ma, 0, 64)])).unwrap();
    p.sim.devices[0].post_send(p.qa, wr(2, SendOp::Send, vec![sge(&p.ma, 0, 8)])).unwrap();
    p.settle();
    let wcs = p.completions(0);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.mb.mem.to_vec()[..64], [0u8; 64]);
    assert_eq!(p.sim.devices[0].qp_state(p.qa), Some(QpState::Err));
    assert_eq!(p.sim.devices[1].qp_state(p.qb), Some(QpState::Err), "responder errors too");
    // IBTA 11.6.3.1: the responder's application learns why from an asynchronous event;
    // the requester's learns it from its completion and gets no event.
    assert_eq!(p.sim.devices[1].poll_async_event(), Some(AsyncEvent::QpAccessError(p.qb)));
    assert_eq!(p.sim.devices[1].poll_async_event(), None, "once");
    assert_eq!(p.sim.devices[0].poll_async_event(), None);
}

// IBTA 9.7.5.1.5: the range must lie inside the region.
#[test]
fn out_of_bounds_write_is_refused() {
    let mut p = pair(Attrs::default());
    let end = Remote { addr: p.mb.addr + (1 << 20) - 10, rkey: p.mb.rkey };
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Write(end), vec![sge(&p.ma, 0, 11)])).unwrap();
    assert_eq!(p.wait(0).status, WcStatus::RemAccessErr);
}

// IBTA 9.7.5.1.1: a PSN ahead of the expected one gets one sequence-error NAK, then silence
// until the expected PSN arrives.
#[test]
fn out_of_sequence_naks_once_then_stays_silent() {
    let mut p = pair(Attrs::default());
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 1, sgl: vec![sge(&p.mb, 0, 64)] }).unwrap();
    let e = p.b_epsn();
    let out = p.inject_to_b(&request(&p, 0x04, e.add(2), b"late"));
    assert_eq!(syndrome_of(&out), vec![(0x11, e.value(), Syndrome::Nak(NakCode::PsnSequenceError))]);
    assert!(p.inject_to_b(&request(&p, 0x04, e.add(3), b"later")).is_empty(), "silence");
    let out = p.inject_to_b(&request(&p, 0x04, e, b"first"));
    assert_eq!(syndrome_of(&out), vec![(0x11, e.value(), Syndrome::Ack { credits: 31 })]);
    let out = p.inject_to_b(&request(&p, 0x04, e.add(5), b"gap again"));
    assert_eq!(syndrome_of(&out), vec![(0x11, e.next().value(), Syndrome::Nak(NakCode::PsnSequenceError))]);
}

// IBTA 9.7.5.2.1: a sequence NAK acknowledges the requests before it; the ones executed
// since the last reply are acknowledged by an ACK of their own first, since rxe ignores a
// second sequence NAK within one message until an ACK arrives (and waits for its
// retransmission timer: 64 KiB WRITEs from rxe with 1 % loss moved 5 MB/s).
#[test]
fn a_second_hole_is_acknowledged_up_to_it_before_the_nak() {
    let mut p = pair(Attrs::default());
    let e = p.b_epsn();
    let unasked = |p: &Pair, psn: softrdma::proto::roce::Psn| {
        let mut r = request(p, 0x06, psn, &[7; 256]);
        r.bth.ack_req = false;
        r.reth = Some(RethRepr { va: p.mb.addr, rkey: p.mb.rkey, dma_len: 256 * 8 });
        if psn != e {
            r.bth.opcode = 0x07;
            r.reth = None;
        }
        r
    };
    let out = p.inject_to_b(&unasked(&p, e.add(1)));
    assert_eq!(syndrome_of(&out), vec![(0x11, e.value(), Syndrome::Nak(NakCode::PsnSequenceError))]);
    // The requester goes back: e, e+1 and e+2 arrive, e+3 is lost, e+4 arrives.
    for k in 0..3 {
        assert!(p.inject_to_b(&unasked(&p, e.add(k))).is_empty(), "nothing asked, nothing sent");
    }
    let out = p.inject_to_b(&unasked(&p, e.add(4)));
    let nak = Syndrome::Nak(NakCode::PsnSequenceError);
    let ack = Syndrome::Ack { credits: 31 };
    assert_eq!(syndrome_of(&out), vec![(0x11, e.add(2).value(), ack), (0x11, e.add(3).value(), nak)]);
    // A hole with nothing executed since the last reply gets the NAK alone.
    assert!(p.inject_to_b(&unasked(&p, e.add(5))).is_empty(), "one NAK per hole");
}

// IBTA 9.7.5.1.2: a MIDDLE with no message in progress is an invalid request.
#[test]
fn middle_without_first_is_an_invalid_request() {
    let mut p = pair(Attrs::default());
    let e = p.b_epsn();
    let out = p.inject_to_b(&request(&p, 0x01, e, &[0; 256]));
    assert_eq!(syndrome_of(&out), vec![(0x11, e.value(), Syndrome::Nak(NakCode::InvalidRequest))]);
    assert_eq!(p.sim.devices[1].qp_state(p.qb), Some(QpState::Err));
    assert_eq!(p.sim.devices[1].poll_async_event(), Some(AsyncEvent::QpRequestError(p.qb)), "IBTA 11.6.3.1");
}

// IBTA 9.7.5.1.4: a FIRST must carry exactly one MTU.
#[test]
fn short_first_packet_is_an_invalid_request() {
    let mut p = pair(Attrs::default());
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 1, sgl: vec![sge(&p.mb, 0, 4096)] }).unwrap();
    let e = p.b_epsn();
    let out = p.inject_to_b(&request(&p, 0x00, e, &[0; 100]));
    assert_eq!(syndrome_of(&out), vec![(0x11, e.value(), Syndrome::Nak(NakCode::InvalidRequest))]);
}

// IBTA 9.7.5.1.4 before 9.7.5.1.5: a WRITE ONLY whose payload is not its DMA length is an
// invalid request even when its R_Key is bad too (found by `softrdma conform`).
#[test]
fn write_length_is_checked_before_the_rkey() {
    let mut p = pair(Attrs::default());
    let e = p.b_epsn();
    let mut w = request(&p, 0x0a, e, &[0; 16]);
    w.reth = Some(RethRepr { va: p.mb.addr, rkey: p.mb.rkey ^ 0x100, dma_len: 4096 });
    let out = p.inject_to_b(&w);
    assert_eq!(syndrome_of(&out), vec![(0x11, e.value(), Syndrome::Nak(NakCode::InvalidRequest))]);
    assert_eq!(p.sim.devices[1].qp_state(p.qb), Some(QpState::Err));
    assert_eq!(p.mb.mem.to_vec()[..16], [0u8; 16]);
}

// IBTA 9.7.5.1.1: a duplicate SEND is acknowledged again and not delivered twice.
#[test]
fn duplicate_send_is_reacked_not_redelivered() {
    let mut p = pair(Attrs::default());
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 1, sgl: vec![sge(&p.mb, 0, 64)] }).unwrap();
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 2, sgl: vec![sge(&p.mb, 64, 64)] }).unwrap();
    let e = p.b_epsn();
    let first = p.inject_to_b(&request(&p, 0x04, e, b"hello"));
    let again = p.inject_to_b(&request(&p, 0x04, e, b"hello"));
    assert_eq!(syndrome_of(&first), vec![(0x11, e.value(), Syndrome::Ack { credits: 31 })]);
    assert_eq!(syndrome_of(&again), vec![(0x11, e.value(), Syndrome::Ack { credits: 31 })]);
    let recvs = p.completions(1);
    assert_eq!(recvs.len(), 1);
    assert_eq!((recvs[0].wr_id, recvs[0].byte_len), (1, 5));
}

// IBTA 9.7.5.1.1 (C9-99): a duplicate atomic is answered from the saved result and never
// executed again.
#[test]
fn duplicate_atomic_is_answered_from_its_saved_result() {
    let mut p = pair(Attrs::default());
    p.mb.mem.write(8, &100u64.to_le_bytes());
    let e = p.b_epsn();
    let mut fadd = request(&p, 0x14, e, &[]);
    fadd.atomic_eth = Some(AtomicEthRepr { va: p.mb.addr + 8, rkey: p.mb.rkey, swap_add: 5, compare: 0 });
    for _ in 0..3 {
        let out = p.inject_to_b(&fadd);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].bth.opcode, 0x12);
        assert_eq!(out[0].atomic_ack_eth.map(|a| a.original_data), Some(100));
    }
    let mut b = [0u8; 8];
    p.mb.mem.read(8, &mut b);
    assert_eq!(u64::from_le_bytes(b), 105, "applied exactly once");
}

// IBTA vol.1 1.5 (Memory Placement Extensions): ATOMIC WRITE stores its 8 bytes at an
// 8-aligned address under remote write access and is acknowledged as a WRITE; a duplicate
// is acknowledged again and not stored again; an unaligned one is an invalid request.
#[test]
fn atomic_write_stores_eight_bytes_once() {
    let mut p = pair(Attrs::default());
    let at = Remote { addr: p.mb.addr + 16, rkey: p.mb.rkey };
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::AtomicWrite(at, *b"8 bytes!"), vec![])).unwrap();
    let wc = p.wait(0);
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::AtomicWrite));
    assert_eq!(&p.mb.mem.to_vec()[16..24], b"8 bytes!");
    let e = p.b_epsn();
    let mut aw = request(&p, 0x1d, e, b"newbytes");
    aw.reth = Some(RethRepr { va: p.mb.addr + 16, rkey: p.mb.rkey, dma_len: 8 });
    assert_eq!(syndrome_of(&p.inject_to_b(&aw)), vec![(0x11, e.value(), Syndrome::Ack { credits: 31 })]);
    p.mb.mem.write(16, b"app wrote");
    assert_eq!(syndrome_of(&p.inject_to_b(&aw)).len(), 1, "the duplicate is acknowledged");
    assert_eq!(&p.mb.mem.to_vec()[16..24], b"app wrot", "and not stored again");
    let mut unaligned = request(&p, 0x1d, e.add(1), b"12345678");
    unaligned.reth = Some(RethRepr { va: p.mb.addr + 20, rkey: p.mb.rkey, dma_len: 8 });
    let nak = Syndrome::Nak(NakCode::InvalidRequest);
    assert_eq!(syndrome_of(&p.inject_to_b(&unaligned)), vec![(0x11, e.add(1).value(), nak)]);
}

// IBTA 9.7.5.1.1 (C9-98): a duplicate READ is executed again, from the PSN and RETH of the
// duplicate, so the requester can resume mid-way.
#[test]
fn duplicate_read_is_reexecuted_from_its_resource() {
    let mut p = pair(Attrs::default());
    p.mb.mem.write(0, &[1u8; 600]);
    let e = p.b_epsn();
    let mut read = request(&p, 0x0c, e, &[]);
    read.reth = Some(RethRepr { va: p.mb.addr, rkey: p.mb.rkey, dma_len: 600 });
    let out = p.inject_to_b(&read);
    let ops: Vec<_> = out.iter().map(|r| (r.bth.opcode, r.bth.psn.value())).collect();
    assert_eq!(ops, vec![(0x0d, e.value()), (0x0e, e.add(1).value()), (0x0f, e.add(2).value())]);
    p.mb.mem.write(256, &[2u8; 344]);
    let mut resume = request(&p, 0x0c, e.add(1), &[]);
    resume.reth = Some(RethRepr { va: p.mb.addr + 256, rkey: p.mb.rkey, dma_len: 344 });
    let out = p.inject_to_b(&resume);
    let ops: Vec<_> = out.iter().map(|r| (r.bth.opcode, r.bth.psn.value(), r.payload.len())).collect();
    assert_eq!(ops, vec![(0x0d, e.add(1).value(), 256), (0x0f, e.add(2).value(), 88)]);
    assert!(out[0].payload.iter().all(|&b| b == 2), "read again from memory");
    assert_eq!(p.b_epsn(), e.add(3), "a duplicate does not move the expected PSN");
}

// IBTA 9.7.5.2.4: a missing READ response is asked for again at once, and once: the later
// responses of the first request, still arriving out of order, must not each ask again
// (each new request restarts the whole response; with reordering that was a flood).
#[test]
fn a_missing_read_response_is_asked_for_once() {
    // With the loss window the drivers shipped when a swarm seed found it.
    let cc = softrdma::engine::cc::CcConfig {
        loss_window_max_packets: 256,
        loss_window_initial_packets: 4,
        ..Default::default()
    };
    let mk = |i: u8| {
        let gid = gid_from_ipv4([10, 0, 0, i]);
        softrdma::engine::Device::new(softrdma::engine::DeviceConfig {
            gid,
            seed: Some(u64::from(i)),
            max_qps: 8,
            max_mrs: 8,
            cc,
        })
    };
    let mut sim = softrdma::sim::Sim::new(vec![mk(1), mk(2)], softrdma::sim::Faults::none(), 7);
    let cqs = [sim.devices[0].create_cq(64), sim.devices[1].create_cq(64)];
    let q = connect_qps(&mut sim, QpType::Rc, &Attrs::default(), cqs, None, None);
    let ma = sim.devices[0].reg_mr(softrdma::engine::mem::Pd(1), 1 << 16, softrdma::engine::mem::Access::ALL).unwrap();
    let mb = sim.devices[1].reg_mr(softrdma::engine::mem::Pd(1), 1 << 16, softrdma::engine::mem::Access::ALL).unwrap();
    let mut p = Pair { sim, qa: q[0], qb: q[1], cqa: cqs[0], cqb: cqs[1], ma, mb };
    let (a, b) = (p.sim.devices[0].gid(), p.sim.devices[1].gid());
    let read = wr(1, SendOp::Read(remote(&p.mb, 0)), vec![sge(&p.ma, 0, 2048)]);
    p.sim.devices[0].post_send(p.qa, read).unwrap();
    let now = p.sim.now;
    let take = |d: &mut softrdma::engine::Device| {
        std::iter::from_fn(|| d.poll_transmit(now)).map(|t| t.packet).collect::<Vec<_>>()
    };
    let request = take(&mut p.sim.devices[0]);
    assert_eq!(request.len(), 1);
    p.sim.devices[1].handle_packet(now, a, &request[0]);
    let responses = take(&mut p.sim.devices[1]);
    assert_eq!(responses.len(), 8, "2048 bytes at MTU 256");
    let mut asked = 0;
    for r in &responses[1..] {
        p.sim.devices[0].handle_packet(now, b, r);
        asked += drain(&mut p.sim.devices[0], now).iter().filter(|x| x.bth.opcode == 0x0c).count();
    }
    assert_eq!(asked, 1, "the first response is missing: one new READ for the rest");
}

// IBTA 9.7.5.2.4: a READ response lost after an earlier loss was recovered is asked for
// at once too. The rule above (one new request per missing PSN, not one per out-of-order
// response) once held for every PSN past the first go-back-N, so every later loss waited
// for the retransmission timer: against rxe with 1 % loss, 64 KiB READs moved 2-4 MB/s.
#[test]
fn a_read_response_lost_after_a_recovered_loss_is_asked_for_at_once() {
    let mut p = pair(Attrs::default());
    let armed = Rc::new(std::cell::Cell::new(true));
    let arm = armed.clone();
    // Drops the next READ response middle (opcode 0x0e) from the responder while armed.
    p.sim.tamper = Some(Box::new(move |from, pkt| {
        if from == 1 && pkt[0] == 0x0e && arm.get() {
            arm.set(false);
            return false;
        }
        true
    }));
    for k in 0..2u64 {
        armed.set(true);
        let read = wr(k, SendOp::Read(remote(&p.mb, 0)), vec![sge(&p.ma, 0, 2048)]);
        p.sim.devices[0].post_send(p.qa, read).unwrap();
        let start = p.sim.now;
        let wc = p.wait(0);
        assert_eq!((wc.wr_id, wc.status), (k, WcStatus::Success));
        assert!(!armed.get(), "READ {k}: a response was dropped");
        let took_ns = p.sim.now - start;
        assert!(took_ns < 4_096 << 10, "READ {k} took {took_ns} ns: it waited for the timer");
    }
    assert_eq!(p.sim.devices[0].stats.retransmit_timeouts, 0);
    assert_eq!(p.sim.devices[0].stats.out_of_order_responses, 2 * 6, "each loss seen, no timer");
}

// IBTA 9.7.5.2.8 and Table 45: an RNR NAK makes the requester wait the advertised time,
// then retry; a receive posted meanwhile lets it through.
#[test]
fn rnr_nak_backs_off_for_the_advertised_time() {
    let mut p = pair(Attrs { min_rnr_timer: 14, ..Attrs::default() });
    let sends = Rc::new(RefCell::new(Vec::new()));
    let log = sends.clone();
    p.sim.tamper = Some(Box::new(move |from, pkt| {
        log.borrow_mut().push((from, pkt[0]));
        true
    }));
    p.ma.mem.write(0, b"knock");
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Send, vec![sge(&p.ma, 0, 5)])).unwrap();
    // Run until the RNR NAK has come back.
    while !sends.borrow().iter().any(|&(from, op)| from == 1 && op == 0x11) {
        assert!(p.sim.step());
    }
    let nak_at = p.sim.now;
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 7, sgl: vec![sge(&p.mb, 0, 5)] }).unwrap();
    let n_before = sends.borrow().len();
    while sends.borrow().len() == n_before {
        assert!(p.sim.step());
    }
    assert!(p.sim.now - nak_at >= RNR_TIMER_NS[14], "resent after {} ns", p.sim.now - nak_at);
    assert_eq!(p.wait(0).status, WcStatus::Success);
    assert_eq!(p.sim.devices[1].stats.rnr_naks_sent, 1);
}

// IBTA 9.7.5.2.8: with rnr_retry 0 the first RNR NAK ends the request.
#[test]
fn rnr_retry_exhaustion() {
    let mut p = pair(Attrs { rnr_retry: 0, ..Attrs::default() });
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Send, vec![sge(&p.ma, 0, 5)])).unwrap();
    p.sim.devices[0].post_send(p.qa, wr(2, SendOp::Send, vec![sge(&p.ma, 0, 5)])).unwrap();
    p.settle();
    let got: Vec<_> = p.completions(0).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]);
}

// IBTA 9.7.6.1.3: with no answer, the requester retries retry_cnt times, one transport
// timeout (4.096 µs × 2^timeout) apart, then fails the request.
#[test]
fn retry_exhaustion_when_the_peer_is_gone() {
    let mut p = pair(Attrs { retry_cnt: 3, timeout: 10, ..Attrs::default() });
    p.sim.tamper = Some(Box::new(|from, _| from == 0)); // B's answers never arrive
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Write(remote(&p.mb, 0)), vec![sge(&p.ma, 0, 10)])).unwrap();
    let wc = p.wait(0);
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    let timeout_ns = 4096u64 << 10;
    assert!(p.sim.now >= 4 * timeout_ns && p.sim.now < 5 * timeout_ns + 1_000_000, "failed at {} ns", p.sim.now);
    assert_eq!(p.sim.devices[0].stats.retransmit_timeouts, 3);
}

// IBTA 9.7.6.1.3: an ACK that advances the acknowledged PSN is progress and restarts the
// transport timer, even inside a message, and even when it is the QP's first ACK: the rest
// of the message is timed from that ACK, not from the first packet's sending.
#[test]
fn the_first_ack_restarts_the_transport_timer() {
    let mut p = pair(Attrs { timeout: 10, ..Attrs::default() });
    let timeout_ns = 4096u64 << 10;
    // 20 packets of 256 bytes: AckReq on the 16th and the last.
    let len = 20 * 256;
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Write(remote(&p.mb, 0)), vec![sge(&p.ma, 0, len)])).unwrap();
    let (a_gid, b_gid) = (p.sim.devices[0].gid(), p.sim.devices[1].gid());
    let mut sent = Vec::new();
    while let Some(t) = p.sim.devices[0].poll_transmit(0) {
        sent.push(t.packet);
    }
    assert_eq!(sent.len(), 20);
    for packet in &sent[..16] {
        p.sim.devices[1].handle_packet(0, a_gid, packet); // the last four are lost
    }
    let ack = p.sim.devices[1].poll_transmit(0).expect("B acknowledges the 16th").packet;
    let acked_at = timeout_ns * 9 / 10;
    p.sim.devices[0].handle_packet(acked_at, b_gid, &ack);
    p.sim.devices[0].handle_timeout(timeout_ns * 3 / 2);
    assert_eq!(p.sim.devices[0].stats.retransmit_timeouts, 0, "timed from the first packet's sending");
    // The ACK's 0.9 T round trip stretches the timer (srtt + 4 rttvar), at most to 4 T.
    p.sim.devices[0].handle_timeout(acked_at + 4 * timeout_ns);
    assert_eq!(p.sim.devices[0].stats.retransmit_timeouts, 1, "the lost packets still time out");
}

// A message longer than GATHER_MAX_BYTES is read from its memory packet by packet, as a
// NIC reads it by DMA: memory deregistered after the post (IBTA 10.6.3.5 leaves that to
// the application) ends the request with a local protection error, never a stale copy.
#[test]
fn a_long_message_reads_its_memory_when_it_is_sent() {
    let mut p = pair(Attrs::default());
    let len = softrdma::engine::qp::requester::GATHER_MAX_BYTES + 4096;
    let dev = &mut p.sim.devices[0];
    let scratch = dev.reg_mr(softrdma::engine::mem::Pd(1), len, softrdma::engine::mem::Access::ALL).unwrap();
    dev.post_send(p.qa, wr(1, SendOp::Write(remote(&p.mb, 0)), vec![sge(&scratch, 0, len)])).unwrap();
    dev.dereg_mr(&scratch).unwrap();
    let now = p.sim.now;
    assert!(drain(&mut p.sim.devices[0], now).is_empty(), "nothing is sent");
    let got: Vec<_> = p.completions(0).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, WcStatus::LocProtErr)]);
    // A long message from memory that stays registered arrives whole.
    let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    let mut p = pair(Attrs::default());
    p.ma.mem.write(0, &data);
    p.sim.devices[0].post_send(p.qa, wr(2, SendOp::Write(remote(&p.mb, 0)), vec![sge(&p.ma, 0, len)])).unwrap();
    assert_eq!(p.wait(0).status, WcStatus::Success);
    let mut got = vec![0u8; len];
    assert!(p.mb.mem.read(0, &mut got));
    assert!(got == data);
}

// IBTA 9.7.1: PSNs wrap at 2^24.
#[test]
fn a_message_across_the_psn_wrap() {
    let mut p = pair(Attrs { psn_a: 0xff_fff0, ..Attrs::default() });
    let data: Vec<u8> = (0..256 * 40).map(|i| (i % 251) as u8).collect();
    p.ma.mem.write(0, &data);
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Write(remote(&p.mb, 0)), vec![sge(&p.ma, 0, data.len())])).unwrap();
    p.sim.devices[0]
        .post_send(p.qa, wr(2, SendOp::Read(remote(&p.mb, 0)), vec![sge(&p.ma, 1 << 19, data.len())]))
        .unwrap();
    assert_eq!(p.wait(0).status, WcStatus::Success);
    assert_eq!(p.wait(0).status, WcStatus::Success);
    assert_eq!(p.mb.mem.to_vec()[..data.len()], data[..]);
    let mut back = vec![0u8; data.len()];
    p.ma.mem.read(1 << 19, &mut back);
    assert_eq!(back, data);
    assert_eq!(p.sim.devices[0].qp_psns(p.qa).unwrap().0, (0xff_fff0 + 80) & 0xff_ffff);
}

// IBTA 9.7.2: AckReq on the last packet of a message and at least every 16 packets.
#[test]
fn ack_requests_on_last_and_every_sixteenth_packet() {
    let mut p = pair(Attrs::default());
    let acks = Rc::new(RefCell::new(Vec::new()));
    let log = acks.clone();
    p.sim.tamper = Some(Box::new(move |from, pkt| {
        if from == 0 {
            log.borrow_mut().push(pkt[8] & 0x80 != 0);
        }
        true
    }));
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Write(remote(&p.mb, 0)), vec![sge(&p.ma, 0, 256 * 40)])).unwrap();
    assert_eq!(p.wait(0).status, WcStatus::Success);
    let a = acks.borrow();
    assert_eq!(a.len(), 40);
    let with: Vec<usize> = a.iter().enumerate().filter(|(_, &x)| x).map(|(i, _)| i).collect();
    assert_eq!(with, vec![15, 31, 39]);
}

// IBTA 9.7.5.2.1: a READ response implicitly acknowledges the requests before it.
#[test]
fn read_response_implicitly_acks_earlier_requests() {
    let mut p = pair(Attrs::default());
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 1, sgl: vec![sge(&p.mb, 0, 64)] }).unwrap();
    p.sim.tamper = Some(Box::new(|from, pkt| !(from == 1 && pkt[0] == 0x11))); // every ACK lost
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Send, vec![sge(&p.ma, 0, 8)])).unwrap();
    p.sim.devices[0].post_send(p.qa, wr(2, SendOp::Read(remote(&p.mb, 100)), vec![sge(&p.ma, 64, 8)])).unwrap();
    let got: Vec<_> = [p.wait(0), p.wait(0)].iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(p.sim.devices[0].stats.retransmit_timeouts, 0, "no retry was needed");
}

// IBTA 9.4.4 / 11.4.1.1 (max_rd_atomic): no more READs in flight than ORD.
#[test]
fn outstanding_reads_stay_within_ord() {
    let mut p = pair(Attrs { ord: 1, ..Attrs::default() });
    let trace = Rc::new(RefCell::new(Vec::new()));
    let log = trace.clone();
    p.sim.tamper = Some(Box::new(move |from, pkt| {
        log.borrow_mut().push((from, pkt[0]));
        true
    }));
    for i in 0..4 {
        p.sim.devices[0].post_send(p.qa, wr(i, SendOp::Read(remote(&p.mb, 0)), vec![sge(&p.ma, 0, 100)])).unwrap();
    }
    for _ in 0..4 {
        assert_eq!(p.wait(0).status, WcStatus::Success);
    }
    let mut in_flight = 0i32;
    for &(from, op) in trace.borrow().iter() {
        match (from, op) {
            (0, 0x0c) => in_flight += 1,
            (1, 0x10) | (1, 0x0f) => in_flight -= 1,
            _ => {}
        }
        assert!(in_flight <= 1, "{:?}", trace.borrow());
    }
}

// IBTA 11.4.1.1: a bad lkey completes with a local protection error; the QP goes to ERR.
#[test]
fn bad_lkey_is_a_local_protection_error() {
    let mut p = pair(Attrs::default());
    let bad = Sge { addr: p.ma.addr, length: 8, lkey: p.ma.lkey ^ 0x300 };
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Send, vec![bad])).unwrap();
    p.settle();
    let wcs = p.completions(0);
    assert_eq!(wcs[0].status, WcStatus::LocProtErr);
    assert_eq!(p.sim.devices[0].qp_state(p.qa), Some(QpState::Err));
}

// IBTA 9.7.5.1.4: a message longer than the receive buffers: the receive completes with a
// local length error, the sender with a remote invalid request error.
#[test]
fn message_longer_than_the_receive_buffer() {
    let mut p = pair(Attrs::default());
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 5, sgl: vec![sge(&p.mb, 0, 10)] }).unwrap();
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Send, vec![sge(&p.ma, 0, 100)])).unwrap();
    p.settle();
    assert_eq!(p.completions(1)[0].status, WcStatus::LocLenErr);
    assert_eq!(p.completions(0)[0].status, WcStatus::RemInvReqErr);
}

// A receive buffer its WQE's key does not grant (here: re-registered to another PD) is the
// responder's own fault: its receive completes with a local protection error, the sender
// gets Remote Operational Error (IBTA 9.9.3.1.2), nothing lands; the region keeps its keys.
#[test]
fn a_receive_buffer_outside_the_qps_pd_is_a_remote_operational_error() {
    use softrdma::engine::mem::{Pd, Rereg};
    let mut p = pair(Attrs::default());
    let moved = p.sim.devices[1].rereg_mr(&p.mb, Rereg { pd: Some(Pd(77)), ..Rereg::default() }).unwrap();
    assert_eq!((moved.lkey, moved.rkey), (p.mb.lkey, p.mb.rkey), "re-registration keeps the keys");
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 5, sgl: vec![sge(&p.mb, 0, 64)] }).unwrap();
    p.ma.mem.write(0, &[0x5a; 64]);
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Send, vec![sge(&p.ma, 0, 64)])).unwrap();
    p.settle();
    assert_eq!(p.completions(1)[0].status, WcStatus::LocProtErr);
    assert_eq!(p.completions(0)[0].status, WcStatus::RemOpErr);
    assert_eq!(p.mb.mem.to_vec()[..64], [0u8; 64]);
    assert_eq!(p.sim.devices[1].poll_async_event(), Some(AsyncEvent::QpFatal(p.qb)));
}

// IBTA 10.6.7.2: SEND with invalidate invalidates the named rkey at the responder.
#[test]
fn send_with_invalidate_kills_the_rkey() {
    let mut p = pair(Attrs::default());
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 5, sgl: vec![sge(&p.mb, 0, 10)] }).unwrap();
    let rkey = p.mb.rkey;
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::SendInv(rkey), vec![sge(&p.ma, 0, 4)])).unwrap();
    p.settle();
    let r = p.completions(1);
    assert_eq!((r[0].status, r[0].invalidated_rkey), (WcStatus::Success, Some(rkey)));
    p.sim.devices[0].post_send(p.qa, wr(2, SendOp::Write(remote(&p.mb, 0)), vec![sge(&p.ma, 0, 4)])).unwrap();
    assert_eq!(p.wait(0).status, WcStatus::Success, "the SEND itself");
    assert_eq!(p.wait(0).status, WcStatus::RemAccessErr, "the rkey is dead");
}

// IBTA 11.4.2.2: a solicited-only notification fires on a solicited receive.
#[test]
fn solicited_event_notifies_the_receiver() {
    let mut p = pair(Attrs::default());
    let cqb = p.cqb;
    p.sim.devices[1].req_notify_cq(cqb, softrdma::engine::cq::Notify::Solicited);
    for i in 0..2 {
        p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: i, sgl: vec![sge(&p.mb, 0, 10)] }).unwrap();
    }
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Send, vec![sge(&p.ma, 0, 4)])).unwrap();
    p.settle();
    assert!(!p.sim.devices[1].take_cq_event(cqb), "unsolicited");
    let mut s = wr(2, SendOp::Send, vec![sge(&p.ma, 0, 4)]);
    s.solicited = true;
    p.sim.devices[0].post_send(p.qa, s).unwrap();
    p.settle();
    assert!(p.sim.devices[1].take_cq_event(cqb));
    assert!(p.completions(1).iter().any(|w| w.solicited));
}

// IBTA 10.3.1.7: moving a QP to ERR flushes every posted request, in order.
#[test]
fn entering_error_flushes_everything() {
    let mut p = pair(Attrs::default());
    for i in 0..3 {
        p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: i, sgl: vec![sge(&p.mb, 0, 10)] }).unwrap();
    }
    p.sim.devices[1].modify_qp(p.qb, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() }).unwrap();
    let got: Vec<_> = p.completions(1).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(0, WcStatus::WrFlushErr), (1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]);
}

// IBTA 10.3.1.7: a QP in ERR takes what is posted and flushes it at once, sends as well as
// receives (a drain posts a request there and waits for its completion); a request that
// is malformed whatever the state is still refused, and nothing goes on the wire.
#[test]
fn a_request_posted_in_error_completes_flushed() {
    let mut p = pair(Attrs::default());
    p.sim.devices[1].modify_qp(p.qb, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() }).unwrap();
    let sent_before = p.sim.devices[1].stats.tx_packets;
    p.sim.devices[1]
        .post_send(p.qb, wr(7, SendOp::Write(Remote { addr: 0, rkey: 1 }), vec![sge(&p.mb, 0, 8)]))
        .unwrap();
    p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: 8, sgl: vec![sge(&p.mb, 0, 10)] }).unwrap();
    p.sim.devices[1].post_send(p.qb, wr(9, SendOp::Send, vec![])).unwrap();
    let too_many_sges = vec![sge(&p.mb, 0, 1); 64];
    assert_eq!(p.sim.devices[1].post_send(p.qb, wr(10, SendOp::Send, too_many_sges)), Err(VerbsError::InvalidRequest));
    let got: Vec<_> = p.completions(1).iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    let flushed = |id, op| (id, WcStatus::WrFlushErr, op);
    assert_eq!(got, vec![flushed(7, WcOpcode::RdmaWrite), flushed(8, WcOpcode::Recv), flushed(9, WcOpcode::Send)]);
    p.settle();
    assert_eq!(p.sim.devices[1].stats.tx_packets, sent_before, "nothing was sent");
}

// A peer cannot make the responder hold unbounded state: 10,000 duplicate atomics, never
// drained, leave a bounded reply queue (and the atomic applied once).
#[test]
fn a_flood_of_duplicates_is_not_buffered() {
    let mut p = pair(Attrs::default());
    let e = p.b_epsn();
    let mut fadd = request(&p, 0x14, e, &[]);
    fadd.atomic_eth = Some(AtomicEthRepr { va: p.mb.addr, rkey: p.mb.rkey, swap_add: 1, compare: 0 });
    let mut buf = vec![0u8; fadd.buffer_len()];
    fadd.emit(&mut buf).unwrap();
    let src = p.sim.devices[0].gid();
    for _ in 0..10_000 {
        p.sim.devices[1].handle_packet(0, src, &buf);
    }
    let held = p.sim.devices[1].qp_pending_replies(p.qb);
    assert!(held <= softrdma::engine::qp::responder::MAX_REPLIES, "{held} replies held");
    assert_eq!(p.mb.mem.to_vec()[..8], 1u64.to_le_bytes());
    assert_eq!(p.sim.devices[1].stats.duplicates_received, 9_999);
}

// IBTA 9.7.5.2.1: ACKs coalesce: requests handled before the responder sends get one ACK,
// for the last of them.
#[test]
fn acks_coalesce() {
    let mut p = pair(Attrs::default());
    for i in 0..3 {
        p.sim.devices[1].post_recv(p.qb, RecvWr { wr_id: i, sgl: vec![sge(&p.mb, 0, 64)] }).unwrap();
    }
    let e = p.b_epsn();
    let src = p.sim.devices[0].gid();
    for k in 0..3 {
        let r = request(&p, 0x04, e.add(k), b"x");
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf).unwrap();
        p.sim.devices[1].handle_packet(0, src, &buf);
    }
    let out = drain(&mut p.sim.devices[1], 0);
    assert_eq!(syndrome_of(&out), vec![(0x11, e.add(2).value(), Syndrome::Ack { credits: 31 })]);
}

// IBTA 9.7.5.1.3: more READ requests pending than the responder's IRD is an invalid request.
#[test]
fn reads_beyond_ird_are_refused() {
    let mut p = pair(Attrs { ord: 2, ..Attrs::default() });
    let e = p.b_epsn();
    let src = p.sim.devices[0].gid();
    let mut last = Vec::new();
    for k in 0..3 {
        let mut read = request(&p, 0x0c, e.add(k), &[]);
        read.reth = Some(RethRepr { va: p.mb.addr, rkey: p.mb.rkey, dma_len: 8 });
        let mut buf = vec![0u8; read.buffer_len()];
        read.emit(&mut buf).unwrap();
        p.sim.devices[1].handle_packet(0, src, &buf); // responses not drained: still pending
        if k == 2 {
            last = drain(&mut p.sim.devices[1], 0);
        }
    }
    let naks: Vec<_> = syndrome_of(&last).into_iter().filter(|s| s.0 == 0x11).collect();
    assert_eq!(naks, vec![(0x11, e.add(2).value(), Syndrome::Nak(NakCode::InvalidRequest))]);
}

// Not a transport rule: what the device keeps of the packets it sent. Buffers come back
// to it to build later packets in, up to a bound, and a buffer larger than any packet is
// not kept.
#[test]
fn sent_packets_buffers_are_kept_up_to_the_bound() {
    use softrdma::engine::{SPARE_PACKETS_MAX, SPARE_PACKET_BYTES_MAX};
    let mut p = pair(Attrs::default());
    p.sim.devices[0].post_send(p.qa, wr(1, SendOp::Write(remote(&p.mb, 0)), vec![sge(&p.ma, 0, 64)])).unwrap();
    p.settle();
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    let kept = p.sim.devices[0].spare_packets();
    assert!(kept >= 1, "the simulator hands sent packets back, as the drivers do");
    let d = &mut p.sim.devices[0];
    for _ in 0..2 * SPARE_PACKETS_MAX {
        d.recycle(Vec::with_capacity(1024));
    }
    assert_eq!(d.spare_packets(), SPARE_PACKETS_MAX);
    let mut fresh = dev(9);
    fresh.recycle(Vec::with_capacity(SPARE_PACKET_BYTES_MAX + 1));
    assert_eq!(fresh.spare_packets(), 0, "larger than any packet");
}
