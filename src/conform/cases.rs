//! The catalogue: each case's packets, the answer its section requires, and the judgement.
//! (First part: RC responder checks in the spec's order, header validation and packets the
//! target never asked for.)

use super::peer::{describe, Peer, Reply};
use super::Verdict;
use crate::proto::roce::ext::{NakCode, RethRepr, Syndrome};
use crate::proto::roce::{Psn, RoceRepr};

/// Ends a case's connection: a SEND MIDDLE at the expected PSN is an invalid request
/// (9.7.5.1.2) that takes the target's QP to error, so its tool exits and listens again.
pub fn end_connection(p: &mut Peer) {
    let (e, mtu) = (p.epsn, p.mtu.bytes());
    send(p, SEND_MIDDLE, e, mtu);
    let _ = p.replies();
}

/// One case.
pub struct Case {
    /// Its name (`--case` matches on it).
    pub name: &'static str,
    /// The section of IBTA vol. 1 it checks.
    pub section: &'static str,
    /// What the section requires.
    pub expect: &'static str,
    /// Sends its packets on a fresh connection and judges what comes back.
    pub run: fn(&mut Peer) -> Verdict,
    /// This side's first PSN on the case's connection (random when `None`).
    pub start_psn: Option<u32>,
}

const SEND_FIRST: u8 = 0x00;
const SEND_MIDDLE: u8 = 0x01;
const SEND_LAST: u8 = 0x02;
const SEND_ONLY: u8 = 0x04;
const WRITE_ONLY: u8 = 0x0a;
const READ_REQUEST: u8 = 0x0c;
const ACK: u8 = 0x11;
const CNP: u8 = 0x81;

/// A WRITE or READ the target's QP cannot take. ibv_rc_pingpong's QP grants no remote
/// access at all; rxe answers that with Invalid Request, softrdma with Remote Access Error
/// (as for a bad R_Key). Either ends the QP; which one the QP-level refusal calls for is
/// left open here.
const FATAL_ACCESS: &str = "NAK remote access error (or invalid request: the QP grants no remote access), QP to error";

/// Every case, in the order they run.
pub fn catalogue() -> Vec<Case> {
    vec![
        Case {
            name: "send_only_is_acked",
            section: "9.7.5.2.1",
            expect: "ACK of its PSN",
            run: send_only_is_acked,
            start_psn: None,
        },
        Case {
            name: "psn_ahead_naks_once",
            section: "9.7.5.1.1",
            expect: "one NAK PSN sequence error at the expected PSN",
            run: psn_ahead_naks_once,
            start_psn: None,
        },
        Case {
            name: "duplicate_send_is_reacked",
            section: "9.7.5.1.1",
            expect: "ACK again, nothing executed twice",
            run: duplicate_send_is_reacked,
            start_psn: None,
        },
        Case {
            name: "middle_without_first",
            section: "9.7.5.1.2",
            expect: "NAK invalid request, QP to error",
            run: middle_without_first,
            start_psn: None,
        },
        Case {
            name: "last_without_first",
            section: "9.7.5.1.2",
            expect: "NAK invalid request, QP to error",
            run: last_without_first,
            start_psn: None,
        },
        Case {
            name: "first_after_first",
            section: "9.7.5.1.2",
            expect: "NAK invalid request, QP to error",
            run: first_after_first,
            start_psn: None,
        },
        Case {
            name: "payload_beyond_mtu",
            section: "9.7.5.1.4",
            expect: "NAK invalid request, QP to error",
            run: payload_beyond_mtu,
            start_psn: None,
        },
        Case {
            name: "short_first",
            section: "9.7.5.1.4",
            expect: "NAK invalid request, QP to error",
            run: short_first,
            start_psn: None,
        },
        Case {
            name: "write_with_a_bad_rkey",
            section: "9.7.5.1.5",
            expect: FATAL_ACCESS,
            run: write_with_a_bad_rkey,
            start_psn: None,
        },
        Case {
            name: "read_with_a_bad_rkey",
            section: "9.7.5.1.5",
            expect: FATAL_ACCESS,
            run: read_with_a_bad_rkey,
            start_psn: None,
        },
        Case {
            name: "tver_not_zero",
            section: "9.6.1",
            expect: "dropped silently, QP unharmed",
            run: tver_not_zero,
            start_psn: None,
        },
        Case {
            name: "wrong_pkey",
            section: "10.9.3",
            expect: "dropped silently, QP unharmed",
            run: wrong_pkey,
            start_psn: None,
        },
        Case {
            name: "unknown_qp",
            section: "9.6.1",
            expect: "dropped silently, QP unharmed",
            run: unknown_qp,
            start_psn: None,
        },
        Case {
            name: "bad_icrc",
            section: "A17.3.3",
            expect: "dropped silently, QP unharmed",
            run: bad_icrc,
            start_psn: None,
        },
        Case {
            name: "ack_for_psn_never_sent",
            section: "9.7.5.2.8",
            expect: "ignored (a ghost ACK), QP unharmed",
            run: ghost_ack,
            start_psn: None,
        },
        Case {
            name: "qp1_req_for_no_listener",
            section: "12.6.7",
            expect: "a CM REJ, reason 8 (invalid ServiceID), from QP1",
            run: qp1_req_for_no_listener,
            start_psn: None,
        },
        Case {
            name: "qp1_wrong_qkey",
            section: "13.5.3",
            expect: "the same REQ with a Q_Key other than 0x80010000: dropped silently",
            run: qp1_wrong_qkey,
            start_psn: None,
        },
        Case {
            name: "cnp_to_a_responder",
            section: "A17.9.3",
            expect: "no reply, QP unharmed",
            run: cnp,
            start_psn: None,
        },
        Case {
            name: "psn_wraps",
            section: "9.7.1",
            expect: "SENDs at PSN 0xfffffe, 0xffffff and 0 each ACKed (modulo 2^24)",
            run: psn_wraps,
            start_psn: Some(0xff_fffe),
        },
        Case {
            name: "duplicate_two_packet_send",
            section: "9.7.5.1.1",
            expect: "a FIRST+LAST SEND sent again: ACKed again, nothing executed twice",
            run: duplicate_two_packet_send,
            start_psn: None,
        },
        Case {
            name: "stale_psn",
            section: "9.7.5.1.1",
            expect: "a SEND 100000 PSNs behind: a duplicate, ACKed or ignored, nothing executed, QP unharmed",
            run: stale_psn,
            start_psn: None,
        },
        Case {
            name: "write_length_mismatch",
            section: "9.7.5.1.4",
            expect: "WRITE ONLY with DMA length 4096 and 16 bytes: NAK invalid request, QP to error",
            run: write_length_mismatch,
            start_psn: None,
        },
        Case {
            name: "read_response_never_asked",
            section: "9.7.5.2.8",
            expect: "a READ RESPONSE ONLY the target never asked for: ignored, QP unharmed",
            run: ghost_read_response,
            start_psn: None,
        },
        Case {
            name: "nak_for_psn_never_sent",
            section: "9.7.5.2.8",
            expect: "a sequence-error NAK for a PSN the target never sent: ignored, QP unharmed",
            run: ghost_nak,
            start_psn: None,
        },
        Case {
            name: "qp1_junk_mad",
            section: "13.4.7",
            expect: "a CM-class MAD with an unknown attribute: no crash; QP1 still answers a REQ with REJ 8",
            run: qp1_junk_mad,
            start_psn: None,
        },
    ]
}

fn send(p: &mut Peer, opcode: u8, psn: Psn, len: usize) {
    let payload = vec![0x5a; len];
    let mut r = crate::engine::qp::requester::bare(p.bth(opcode, psn, len), None, None);
    r.payload = &payload;
    let b = p.build(&r, |_| {});
    p.send(&b);
}

fn seen(replies: &[Reply]) -> String {
    if replies.is_empty() {
        return "silence".into();
    }
    replies.iter().map(describe).collect::<Vec<_>>().join(", ")
}

/// Exactly one reply, an ACK of `psn`.
fn acked(replies: &[Reply], psn: Psn) -> bool {
    matches!(replies, [r] if r.opcode == ACK && r.psn == psn.value() && matches!(r.syndrome(), Some(Syndrome::Ack { .. })))
}

/// A valid SEND at the expected PSN still gets its ACK: the QP was left as it was.
fn still_works(p: &mut Peer) -> Verdict {
    let psn = p.epsn;
    send(p, SEND_ONLY, psn, 16);
    let r = p.replies();
    if acked(&r, psn) {
        p.epsn = psn.next();
        return Verdict::Conforms;
    }
    if r.is_empty() {
        return Verdict::Hung("a valid SEND afterwards got no ACK".into());
    }
    Verdict::Deviates(format!("a valid SEND afterwards got {}", seen(&r)))
}

/// The replies are one NAK of `code` at `psn`, and the QP then answers nothing (error).
fn nak_then_dead(p: &mut Peer, r: &[Reply], code: NakCode, psn: Psn) -> Verdict {
    let nak = matches!(r, [x] if x.opcode == ACK && x.psn == psn.value() && x.syndrome() == Some(Syndrome::Nak(code)));
    if !nak {
        return Verdict::Deviates(format!("got {}", seen(r)));
    }
    send(p, SEND_ONLY, psn, 16);
    let after = p.replies();
    if after.is_empty() {
        Verdict::Conforms
    } else {
        Verdict::Deviates(format!("after the NAK the QP still answered: {}", seen(&after)))
    }
}

/// Nothing came back, and the QP still works.
fn silent_then_alive(p: &mut Peer, r: &[Reply]) -> Verdict {
    if !r.is_empty() {
        return Verdict::Deviates(format!("answered: {}", seen(r)));
    }
    still_works(p)
}

fn send_only_is_acked(p: &mut Peer) -> Verdict {
    let psn = p.epsn;
    send(p, SEND_ONLY, psn, 64);
    let r = p.replies();
    if acked(&r, psn) {
        p.epsn = psn.next();
        Verdict::Conforms
    } else if r.is_empty() {
        Verdict::Hung("no ACK to a valid SEND".into())
    } else {
        Verdict::Deviates(format!("got {}", seen(&r)))
    }
}

fn psn_ahead_naks_once(p: &mut Peer) -> Verdict {
    let e = p.epsn;
    send(p, SEND_ONLY, e.add(5), 16);
    send(p, SEND_ONLY, e.add(6), 16);
    let r = p.replies();
    let nak =
        matches!(&r[..], [x] if x.psn == e.value() && x.syndrome() == Some(Syndrome::Nak(NakCode::PsnSequenceError)));
    if !nak {
        return Verdict::Deviates(format!("got {}", seen(&r)));
    }
    still_works(p)
}

fn duplicate_send_is_reacked(p: &mut Peer) -> Verdict {
    let e = p.epsn;
    send(p, SEND_ONLY, e, 16);
    let first = p.replies();
    if !acked(&first, e) {
        return Verdict::Deviates(format!("the first SEND got {}", seen(&first)));
    }
    send(p, SEND_ONLY, e, 16);
    let again = p.replies();
    // The ACK of a duplicate carries its PSN or a later one (coalesced, 9.7.5.2.1).
    match &again[..] {
        [x] if x.opcode == ACK
            && matches!(x.syndrome(), Some(Syndrome::Ack { .. }))
            && e.distance_to(Psn::new(x.psn)) >= 0 =>
        {
            p.epsn = e.next();
            still_works(p)
        }
        _ => Verdict::Deviates(format!("the duplicate got {}", seen(&again))),
    }
}

fn middle_without_first(p: &mut Peer) -> Verdict {
    let (e, mtu) = (p.epsn, p.mtu.bytes());
    send(p, SEND_MIDDLE, e, mtu);
    let r = p.replies();
    nak_then_dead(p, &r, NakCode::InvalidRequest, e)
}

fn last_without_first(p: &mut Peer) -> Verdict {
    let e = p.epsn;
    send(p, SEND_LAST, e, 16);
    let r = p.replies();
    nak_then_dead(p, &r, NakCode::InvalidRequest, e)
}

fn first_after_first(p: &mut Peer) -> Verdict {
    let (e, mtu) = (p.epsn, p.mtu.bytes());
    send(p, SEND_FIRST, e, mtu);
    send(p, SEND_FIRST, e.next(), mtu);
    let mut r = p.replies();
    // The first FIRST is valid and asked for an ACK, which may come before the NAK.
    if r.len() == 2 && r[0].psn == e.value() && matches!(r[0].syndrome(), Some(Syndrome::Ack { .. })) {
        r.remove(0);
    }
    nak_then_dead(p, &r, NakCode::InvalidRequest, e.next())
}

fn payload_beyond_mtu(p: &mut Peer) -> Verdict {
    let (e, mtu) = (p.epsn, p.mtu.bytes());
    send(p, SEND_ONLY, e, mtu + 64);
    let r = p.replies();
    nak_then_dead(p, &r, NakCode::InvalidRequest, e)
}

fn short_first(p: &mut Peer) -> Verdict {
    let (e, mtu) = (p.epsn, p.mtu.bytes());
    send(p, SEND_FIRST, e, mtu / 2);
    let r = p.replies();
    nak_then_dead(p, &r, NakCode::InvalidRequest, e)
}

fn with_reth(p: &mut Peer, opcode: u8, len: usize) -> Vec<Reply> {
    let e = p.epsn;
    let payload = vec![0xa5; len];
    let reth = RethRepr { va: 0x1000, rkey: 0xdead_beef, dma_len: 64 };
    let mut r: RoceRepr<'_> = crate::engine::qp::requester::bare(p.bth(opcode, e, len), Some(reth), None);
    r.payload = &payload;
    let b = p.build(&r, |_| {});
    p.send(&b);
    p.replies()
}

/// Remote Access Error, or Invalid Request (see [`FATAL_ACCESS`]).
fn access_refused(p: &mut Peer, r: &[Reply], e: Psn) -> Verdict {
    let code = match r {
        [x] if x.syndrome() == Some(Syndrome::Nak(NakCode::InvalidRequest)) => NakCode::InvalidRequest,
        _ => NakCode::RemoteAccessError,
    };
    nak_then_dead(p, r, code, e)
}

fn write_with_a_bad_rkey(p: &mut Peer) -> Verdict {
    let e = p.epsn;
    let r = with_reth(p, WRITE_ONLY, 64);
    access_refused(p, &r, e)
}

fn read_with_a_bad_rkey(p: &mut Peer) -> Verdict {
    let e = p.epsn;
    let r = with_reth(p, READ_REQUEST, 0);
    access_refused(p, &r, e)
}

/// A valid SEND with bytes changed after the ICRC (or, with `refill`, before it).
fn tampered(p: &mut Peer, refill: bool, f: fn(&mut [u8])) -> Vec<Reply> {
    let e = p.epsn;
    let payload = [0x33u8; 16];
    let mut r = crate::engine::qp::requester::bare(p.bth(SEND_ONLY, e, 16), None, None);
    r.payload = &payload;
    let mut b = p.build(&r, |_| {});
    f(&mut b);
    if refill {
        // Re-sign the changed packet so only the change itself is on trial.
        let mut parsed = b.clone();
        let n = parsed.len();
        parsed[n - 4..].fill(0);
        let again = p.build_raw(&parsed);
        b = again;
    }
    p.send(&b);
    p.replies()
}

fn tver_not_zero(p: &mut Peer) -> Verdict {
    let r = tampered(p, true, |b| b[1] |= 0x01);
    silent_then_alive(p, &r)
}

fn wrong_pkey(p: &mut Peer) -> Verdict {
    let r = tampered(p, true, |b| {
        b[2] = 0x12;
        b[3] = 0x34;
    });
    silent_then_alive(p, &r)
}

fn unknown_qp(p: &mut Peer) -> Verdict {
    let r = tampered(p, true, |b| b[7] ^= 0x55);
    silent_then_alive(p, &r)
}

fn bad_icrc(p: &mut Peer) -> Verdict {
    let r = tampered(p, false, |b| {
        let n = b.len();
        b[n - 1] ^= 0xff;
    });
    silent_then_alive(p, &r)
}

fn ghost_ack(p: &mut Peer) -> Verdict {
    let psn = Psn::new(p.epsn.value() ^ 0x40_0000);
    let mut r = crate::engine::qp::requester::bare(p.bth(ACK, psn, 0), None, None);
    r.bth.ack_req = false;
    r.aeth = Some(crate::proto::roce::ext::AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn: 7 });
    let b = p.build(&r, |_| {});
    p.send(&b);
    let replies = p.replies();
    silent_then_alive(p, &replies)
}

fn cnp(p: &mut Peer) -> Verdict {
    let mut r = crate::engine::qp::requester::bare(p.bth(CNP, Psn::new(0), 16), None, None);
    r.bth.becn = true;
    r.bth.ack_req = false;
    r.payload = &[0u8; 16];
    let b = p.build(&r, |_| {});
    p.send(&b);
    let replies = p.replies();
    silent_then_alive(p, &replies)
}

/// A CM REQ for ServiceID port 1 (nobody listens there) to the target's QP1, with `qkey`.
fn req_to_qp1(p: &mut Peer, qkey: u32) -> Vec<Reply> {
    use crate::transport::headers::ip_to_gid;
    let args = crate::cm::ConnectArgs {
        qpn: p.my_qpn,
        local_gid: ip_to_gid(p.addrs.0),
        peer_gid: ip_to_gid(p.addrs.1),
        src_port: 0xc001,
        dst_port: 1,
        psn: 0x1234,
        mtu: p.mtu,
        responder_resources: 1,
        initiator_depth: 1,
        private_data: Vec::new(),
    };
    let mad = crate::cm::req_mad(&crate::cm::CmConfig::default(), 0x1111, 0x5eed_0001, &args);
    let mut bth = p.bth(0x64, Psn::new(0), mad.len());
    bth.dest_qp = crate::proto::cm::GSI_QPN;
    let mut r = crate::engine::qp::requester::bare(bth, None, None);
    r.deth = Some(crate::proto::roce::ext::DethRepr { qkey, src_qp: crate::proto::cm::GSI_QPN });
    r.payload = &mad[..];
    let b = p.build(&r, |_| {});
    p.send(&b);
    p.replies().into_iter().filter(|x| x.mad.is_some()).collect()
}

fn qp1_req_for_no_listener(p: &mut Peer) -> Verdict {
    let r = req_to_qp1(p, crate::proto::cm::GSI_QKEY);
    match &r[..] {
        [x] if x.mad == Some((0x0012, 8)) => Verdict::Conforms,
        _ => Verdict::Deviates(format!("got {}", seen(&r))),
    }
}

fn qp1_wrong_qkey(p: &mut Peer) -> Verdict {
    let r = req_to_qp1(p, 0x1234_5678);
    if r.is_empty() {
        Verdict::Conforms
    } else {
        Verdict::Deviates(format!("answered: {}", seen(&r)))
    }
}

fn psn_wraps(p: &mut Peer) -> Verdict {
    for _ in 0..3 {
        let psn = p.epsn;
        send(p, SEND_ONLY, psn, 16);
        let r = p.replies();
        if !acked(&r, psn) {
            return Verdict::Deviates(format!("the SEND at PSN 0x{:06x} got {}", psn.value(), seen(&r)));
        }
        p.epsn = psn.next();
    }
    Verdict::Conforms
}

fn duplicate_two_packet_send(p: &mut Peer) -> Verdict {
    let (e, mtu) = (p.epsn, p.mtu.bytes());
    let twice = |p: &mut Peer| {
        send(p, SEND_FIRST, e, mtu);
        send(p, SEND_LAST, e.next(), 8);
        p.replies()
    };
    let first = twice(p);
    if !first.iter().any(|x| x.psn == e.next().value() && matches!(x.syndrome(), Some(Syndrome::Ack { .. }))) {
        return Verdict::Deviates(format!("the message got {}", seen(&first)));
    }
    let again = twice(p);
    let nak = again.iter().any(|x| matches!(x.syndrome(), Some(Syndrome::Nak(_))));
    let acked_again = again.iter().any(|x| matches!(x.syndrome(), Some(Syndrome::Ack { .. })));
    if nak || !acked_again {
        return Verdict::Deviates(format!("the duplicate message got {}", seen(&again)));
    }
    p.epsn = e.add(2);
    still_works(p)
}

fn stale_psn(p: &mut Peer) -> Verdict {
    let old = Psn::new(p.epsn.value().wrapping_sub(100_000) & 0xff_ffff);
    send(p, SEND_ONLY, old, 16);
    let r = p.replies();
    if r.iter().any(|x| !matches!(x.syndrome(), Some(Syndrome::Ack { .. }))) {
        return Verdict::Deviates(format!("got {}", seen(&r)));
    }
    still_works(p)
}

fn write_length_mismatch(p: &mut Peer) -> Verdict {
    let e = p.epsn;
    let payload = [0xa5u8; 16];
    let reth = RethRepr { va: 0x1000, rkey: 0xdead_beef, dma_len: 4096 };
    let mut r: RoceRepr<'_> = crate::engine::qp::requester::bare(p.bth(WRITE_ONLY, e, 16), Some(reth), None);
    r.payload = &payload;
    let b = p.build(&r, |_| {});
    p.send(&b);
    let replies = p.replies();
    nak_then_dead(p, &replies, NakCode::InvalidRequest, e)
}

/// An acknowledgement-class packet to the target's QP at a PSN it never sent.
fn ghost_reply(p: &mut Peer, opcode: u8, syndrome: Syndrome, payload: &'static [u8]) -> Vec<Reply> {
    let psn = Psn::new(p.epsn.value() ^ 0x40_0000);
    let mut r = crate::engine::qp::requester::bare(p.bth(opcode, psn, payload.len()), None, None);
    r.bth.ack_req = false;
    r.aeth = Some(crate::proto::roce::ext::AethRepr { syndrome, msn: 3 });
    r.payload = payload;
    let b = p.build(&r, |_| {});
    p.send(&b);
    p.replies()
}

fn ghost_read_response(p: &mut Peer) -> Verdict {
    let r = ghost_reply(p, 0x10, Syndrome::Ack { credits: 31 }, &[0x66; 64]);
    silent_then_alive(p, &r)
}

fn ghost_nak(p: &mut Peer) -> Verdict {
    let r = ghost_reply(p, ACK, Syndrome::Nak(NakCode::PsnSequenceError), &[]);
    silent_then_alive(p, &r)
}

fn qp1_junk_mad(p: &mut Peer) -> Verdict {
    let mut mad = [0u8; 256];
    // Base version 1, CM class (0x07), class version 2, method Get (0x01), attribute 0xffff.
    mad[..4].copy_from_slice(&[1, 0x07, 2, 0x01]);
    mad[8..16].copy_from_slice(&0x5eed_0000_0000_0001u64.to_be_bytes());
    mad[16..18].copy_from_slice(&0xffffu16.to_be_bytes());
    let mut bth = p.bth(0x64, Psn::new(0), mad.len());
    bth.dest_qp = crate::proto::cm::GSI_QPN;
    let mut r = crate::engine::qp::requester::bare(bth, None, None);
    r.deth =
        Some(crate::proto::roce::ext::DethRepr { qkey: crate::proto::cm::GSI_QKEY, src_qp: crate::proto::cm::GSI_QPN });
    r.payload = &mad[..];
    let b = p.build(&r, |_| {});
    p.send(&b);
    let _ = p.replies();
    let r = req_to_qp1(p, crate::proto::cm::GSI_QKEY);
    match &r[..] {
        [x] if x.mad == Some((0x0012, 8)) => Verdict::Conforms,
        _ => Verdict::Deviates(format!("after the junk MAD, a REQ got {}", seen(&r))),
    }
}
