//! MPA connection setup (RFC 5044 §7.1, RFC 6581): both sides of the table, every
//! negotiated choice, and the peers that must be refused.

use softrdma::iwarp::setup::*;
use softrdma::proto::iwarp::mpa::{FrameKind, MpaFramePacket, MpaFrameRepr};

const S: u64 = 1_000_000_000;

/// Runs initiator and responder against each other, feeding bytes `chunk` at a time.
fn negotiate(i: Policy, r: Policy, chunk: usize) -> (Outcome, Outcome, Vec<u8>) {
    let mut ini = Setup::initiator(i, 0);
    let mut res = Setup::responder(r, 0);
    let request = ini.take_output();
    for piece in request.chunks(chunk) {
        assert_eq!(res.on_bytes(piece), piece.len());
    }
    let reply = res.take_output();
    for piece in reply.chunks(chunk) {
        ini.on_bytes(piece);
    }
    (ini.outcome().cloned().expect("initiator done"), res.outcome().cloned().expect("responder done"), reply)
}

fn established(o: &Outcome) -> &Negotiated {
    match o {
        Outcome::Established(n) => n,
        other => panic!("not established: {other:?}"),
    }
}

fn reply_of(bytes: &[u8]) -> MpaFrameRepr<'_> {
    let p = MpaFramePacket::new_checked(bytes).unwrap();
    let r = MpaFrameRepr::parse(&p).unwrap();
    assert_eq!(r.kind, FrameKind::Reply);
    r
}

#[test]
fn enhanced_setup_negotiates_ird_ord_rtr_and_private_data() {
    let i = Policy { ird: 8, ord: 4, private_data: b"from the initiator".to_vec(), ..Policy::default() };
    let r = Policy {
        ird: 2,
        ord: 16,
        rtr: vec![RtrKind::Read, RtrKind::Write],
        private_data: b"hi".to_vec(),
        ..Policy::default()
    };
    let (a, b, _) = negotiate(i, r, usize::MAX);
    let (a, b) = (established(&a), established(&b));
    assert_eq!((a.revision, a.crc, a.markers_rx, a.markers_tx), (2, false, false, false));
    assert_eq!(a.rtr, Some(RtrKind::Read), "the responder's first choice among those offered");
    assert_eq!(b.rtr, Some(RtrKind::Read));
    assert_eq!((b.ird, b.ord), (2, 8), "responder: IRD at most the initiator's ORD, ORD at most its IRD");
    assert_eq!((a.ird, a.ord), (8, 2), "initiator: ORD cut to the responder's IRD");
    assert_eq!(a.peer_private_data, b"hi");
    assert_eq!(b.peer_private_data, b"from the initiator");
}

#[test]
fn crc_is_on_when_either_side_asks_and_off_policy_refuses_it() {
    let on = |c| Policy { crc: c, ..Policy::default() };
    for (i, r, want) in [
        (CrcPolicy::Required, CrcPolicy::OnRequest, true),
        (CrcPolicy::OnRequest, CrcPolicy::Required, true),
        (CrcPolicy::OnRequest, CrcPolicy::OnRequest, false),
        (CrcPolicy::Off, CrcPolicy::OnRequest, false),
    ] {
        let (a, b, _) = negotiate(on(i), on(r), 7);
        assert_eq!((established(&a).crc, established(&b).crc), (want, want), "{i:?}/{r:?}");
    }
    let (a, b, reply) = negotiate(on(CrcPolicy::Required), on(CrcPolicy::Off), 3);
    assert!(matches!(b, Outcome::Rejected(_)), "{b:?}");
    assert!(matches!(a, Outcome::Rejected(_)), "{a:?}");
    assert!(reply_of(&reply).reject);
    let (a, _, _) = negotiate(on(CrcPolicy::Off), on(CrcPolicy::Required), 3);
    assert!(matches!(a, Outcome::Failed(_)), "an initiator with CRC off refuses a Reply that turns it on: {a:?}");
}

#[test]
fn markers_are_chosen_per_direction() {
    let m = |on| Policy { markers: on, ..Policy::default() };
    let (a, b, _) = negotiate(m(true), m(false), 1);
    let (a, b) = (established(&a), established(&b));
    assert_eq!((a.markers_rx, a.markers_tx), (true, false));
    assert_eq!((b.markers_rx, b.markers_tx), (false, true), "the responder marks what it sends");
}

#[test]
fn revision_one_has_no_ird_ord_and_unknown_revisions_are_rejected() {
    let (a, b, reply) = negotiate(Policy { revision: 1, ..Policy::default() }, Policy::default(), 5);
    assert_eq!((established(&a).revision, established(&b).rtr), (1, None));
    assert!(reply_of(&reply).ird_ord.is_none());

    let mut res = Setup::responder(Policy::default(), 0);
    let mut req = Setup::initiator(Policy { revision: 1, ..Policy::default() }, 0).take_output();
    req[17] = 3;
    res.on_bytes(&req);
    assert!(matches!(res.outcome(), Some(Outcome::Rejected(w)) if w.contains("revision 3")), "{:?}", res.outcome());
    assert!(reply_of(&res.take_output()).reject);
}

#[test]
fn oversized_private_data_and_garbage_are_refused_at_once() {
    let mut res = Setup::responder(Policy::default(), 0);
    let mut hdr = Setup::initiator(Policy::default(), 0).take_output()[..20].to_vec();
    hdr[18..20].copy_from_slice(&600u16.to_be_bytes());
    assert_eq!(res.on_bytes(&hdr), 20, "the header alone decides");
    assert!(matches!(res.outcome(), Some(Outcome::Rejected(w)) if w.contains("600")));

    let mut res = Setup::responder(Policy::default(), 0);
    res.on_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        matches!(res.outcome(), Some(Outcome::Rejected(w)) if w.contains("not an MPA frame")),
        "{:?}",
        res.outcome()
    );
}

#[test]
fn a_silent_peer_fails_setup_at_the_deadline() {
    let mut res = Setup::responder(Policy { timeout_ns: 2 * S, ..Policy::default() }, 10 * S);
    assert_eq!(res.poll_timeout(), Some(12 * S));
    res.handle_timeout(11 * S);
    assert!(res.outcome().is_none());
    res.handle_timeout(12 * S);
    assert!(matches!(res.outcome(), Some(Outcome::Failed(w)) if w.contains("no MPA Request")));
    assert_eq!(res.poll_timeout(), None);
}

#[test]
fn bytes_after_the_frame_are_left_for_the_data_phase_at_every_split() {
    let req = Setup::initiator(Policy { private_data: vec![7; 40], ..Policy::default() }, 0).take_output();
    let mut stream = req.clone();
    stream.extend_from_slice(b"FPDU bytes");
    for split in 0..stream.len() {
        let mut res = Setup::responder(Policy::default(), 0);
        let used = res.on_bytes(&stream[..split]) + res.on_bytes(&stream[split..]);
        assert_eq!(used, req.len(), "split at {split}");
        assert_eq!(established(res.outcome().unwrap()).peer_private_data, vec![7; 40]);
    }
}

#[test]
fn a_held_request_the_application_leaves_unanswered_is_rejected_at_the_deadline() {
    let mut res = Setup::responder_deferred(Policy { timeout_ns: 1_000, ..Policy::default() }, 0);
    res.on_bytes(&Setup::initiator(Policy::default(), 0).take_output());
    assert!(res.pending_request().is_some());
    res.handle_timeout(999);
    assert_eq!(res.outcome(), None, "not before the deadline");
    res.handle_timeout(1_000);
    assert!(matches!(res.outcome(), Some(Outcome::Rejected(_))), "{:?}", res.outcome());
    assert!(reply_of(&res.take_output()).reject, "the initiator hears a reject");
    assert!(res.pending_request().is_none());
}

#[test]
fn a_deferred_responder_holds_the_request_until_the_application_answers() {
    let i = Policy { ird: 8, ord: 4, private_data: b"hello".to_vec(), ..Policy::default() };
    let mut ini = Setup::initiator(i.clone(), 0);
    let mut res = Setup::responder_deferred(Policy::default(), 0);
    res.on_bytes(&ini.take_output());
    assert!(res.take_output().is_empty(), "nothing is said before the application answers");
    assert_eq!(res.outcome(), None);
    let deadline = Policy::default().timeout_ns;
    assert_eq!(res.poll_timeout(), Some(deadline), "the handshake's deadline covers the application's answer");
    let req = res.pending_request().expect("a held request");
    assert_eq!((req.private_data.as_slice(), req.ird, req.ord, req.revision), (&b"hello"[..], 8, 4, 2));
    res.accept(b"welcome".to_vec(), 2, 3);
    ini.on_bytes(&res.take_output());
    let (n_i, n_r) = (established(ini.outcome().unwrap()), established(res.outcome().unwrap()));
    assert_eq!(n_i.peer_private_data, b"welcome");
    assert_eq!(n_r.peer_private_data, b"hello");
    // The responder offered IRD 2 / ORD 3; the initiator (IRD 8, ORD 4) keeps IRD 3 and ORD 2.
    assert_eq!((n_r.ird, n_r.ord, n_i.ird, n_i.ord), (2, 3, 3, 2));

    // A rejection carries the application's private data in a Reply with R set.
    let mut ini = Setup::initiator(i, 0);
    let mut res = Setup::responder_deferred(Policy::default(), 0);
    res.on_bytes(&ini.take_output());
    res.reject(b"go away");
    let reply = res.take_output();
    let r = reply_of(&reply);
    assert!(r.reject);
    assert_eq!(r.private_data, b"go away");
    ini.on_bytes(&reply);
    assert!(matches!(ini.outcome(), Some(Outcome::Rejected(_))));

    // A Request that cannot be answered is refused before the application sees it.
    let mut res = Setup::responder_deferred(Policy { crc: CrcPolicy::Off, ..Policy::default() }, 0);
    res.on_bytes(&Setup::initiator(Policy { crc: CrcPolicy::Required, ..Policy::default() }, 0).take_output());
    assert_eq!(res.pending_request(), None);
    assert!(reply_of(&res.take_output()).reject);
}
