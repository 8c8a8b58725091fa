//! The CM's rules, each against its section, and two CMs connecting over a seeded network
//! that loses, repeats, delays and reorders MADs.

use super::msg::{self, reason, MAD_LEN};
use super::*;
use crate::engine::verbs::gid_from_ipv4;
use crate::proto::cm::{CmMadRepr, CmMessage, MadPacket};

#[derive(Default)]
struct FakeQps {
    log: HashMap<u32, Vec<QpAttr>>,
}

impl QpControl for FakeQps {
    fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<(), VerbsError> {
        if qpn == u32::MAX {
            return Err(VerbsError::NotFound);
        }
        self.log.entry(qpn).or_default().push(attr.clone());
        Ok(())
    }
}

impl FakeQps {
    fn state(&self, qpn: u32) -> Option<QpState> {
        self.log.get(&qpn)?.iter().rev().find_map(|a| a.state)
    }
    fn last(&self, qpn: u32, s: QpState) -> QpAttr {
        self.log[&qpn].iter().rev().find(|a| a.state == Some(s)).cloned().expect("that transition")
    }
}

const A: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
const B: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];

fn cm(seed: u64) -> Cm {
    Cm::new(CmConfig::default(), 0x1000 + seed, Rng::new(seed))
}

fn args(qpn: u32) -> ConnectArgs {
    ConnectArgs {
        qpn,
        local_gid: A,
        peer_gid: B,
        src_port: 0xc123,
        dst_port: 7174,
        psn: 0x1234,
        mtu: Mtu::M4096,
        responder_resources: 4,
        initiator_depth: 2,
        private_data: b"hello".to_vec(),
    }
}

fn accept_args(qpn: u32) -> AcceptArgs {
    AcceptArgs {
        qpn,
        psn: 0x5678,
        mtu: Mtu::M1024,
        responder_resources: 3,
        initiator_depth: 8,
        private_data: vec![7; 10],
    }
}

fn parse(m: &OutMad) -> CmMadRepr<'_> {
    CmMadRepr::parse(&MadPacket::new_checked(&m.mad[..]).unwrap()).unwrap()
}

fn drain(c: &mut Cm) -> Vec<OutMad> {
    std::iter::from_fn(|| c.poll_transmit()).collect()
}

/// The REQ rdma-core's rping sent from Linux rxe (pcaps/linux/both-rping.pcap, frame 1).
fn rxe_req() -> Vec<u8> {
    let pcap = include_bytes!("../../pcaps/linux/both-rping.pcap");
    // pcap header (24) + record header (16) + Ethernet, IPv4, UDP, BTH, DETH (62).
    pcap[102..102 + MAD_LEN].to_vec()
}

#[test]
fn a_req_from_rxe_becomes_a_request_and_the_accept_answers_it_as_the_req_asked() {
    let (rxe, me) = (gid_from_ipv4([10, 77, 0, 3]), gid_from_ipv4([10, 77, 0, 2]));
    let mut c = cm(1);
    let mut qps = FakeQps::default();
    c.listen(0x1c06).unwrap();
    c.handle_mad(0, rxe, me, &rxe_req(), &mut qps);
    let r = c.take_request(0x1c06).expect("the REQ is a request on the listener");
    assert_eq!(r.peer, Some(("10.77.0.3".parse().unwrap(), 0x8a4d)));
    assert_eq!((r.responder_resources, r.initiator_depth, r.private_data.len()), (1, 1, 56));
    c.accept(10, r.id, accept_args(77), &mut qps).unwrap();
    // 12.9.7: RTR with the REQ's QPN, PSN and MTU; RTS waits for the RTU.
    let rtr = qps.last(77, QpState::Rtr);
    // Linux's CM reads each message's Starting PSN as the PSN its peer expects: rxe sends
    // from 0x085f3d and expects this side's REP's PSN.
    assert_eq!((rtr.dest_qpn, rtr.rq_psn, rtr.path_mtu), (Some(0x11), Some(0x5678), Some(Mtu::M1024)));
    assert_eq!(rtr.dest_gid, Some(rxe));
    let out = drain(&mut c);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].dst, out[0].src), (rxe, me));
    let CmMessage::Rep(rep) = parse(&out[0]).message else { panic!("a REP") };
    assert_eq!((rep.remote_comm_id, rep.local_qpn, rep.starting_psn), (0xc429e77a, 77, 0x5678));
    // The initiator serves one READ: this side may not issue more (12.7.29).
    assert_eq!((rep.responder_resources, rep.initiator_depth), (3, 1));
    assert_eq!(&rep.private_data[..10], &[7; 10]);
    let rtu = msg::rtu(0xc429e77a, rep.local_comm_id);
    c.handle_mad(20, rxe, me, &rtu[..], &mut qps);
    let rts = qps.last(77, QpState::Rts);
    assert_eq!((rts.sq_psn, rts.timeout, rts.retry_cnt, rts.rnr_retry), (Some(0x085f3d), Some(0x13), Some(7), Some(7)));
    assert_eq!(rts.max_rd_atomic, Some(1));
    assert_eq!(c.status(r.id), Some(&ConnStatus::Established));
}

#[test]
fn the_req_this_side_sends_is_laid_out_as_rdma_cm_lays_out_rxes() {
    let mut c = cm(2);
    let mut qps = FakeQps::default();
    c.connect(0, args(99), &mut qps).unwrap();
    assert_eq!(qps.state(99), Some(QpState::Init));
    let out = drain(&mut c);
    let ours = parse(&out[0]);
    let rxe = rxe_req();
    let theirs = CmMadRepr::parse(&MadPacket::new_checked(&rxe[..]).unwrap()).unwrap();
    assert_eq!(ours.header.mgmt_class, theirs.header.mgmt_class);
    assert_eq!((ours.header.class_version, ours.header.method), (theirs.header.class_version, theirs.header.method));
    let (CmMessage::Req(o), CmMessage::Req(t)) = (ours.message, theirs.message) else { panic!("two REQs") };
    assert_eq!(o.service_id, ServiceIdOf::tcp(7174));
    assert_eq!(t.service_id, ServiceIdOf::tcp(0x1c06));
    assert_eq!((o.transport_service_type, o.pkey), (t.transport_service_type, t.pkey));
    assert_eq!((o.primary_path.local_lid, o.primary_path.remote_lid), (0xffff, 0xffff));
    assert_eq!((o.primary_path.local_gid, o.primary_path.remote_gid), (A, B));
    assert_eq!((o.path_mtu, o.starting_psn, o.local_qpn), (5, 0x1234, 99));
    let hdr = crate::proto::cm::CmaHeader::parse(&o.private_data[..36]).unwrap();
    assert_eq!((hdr.src_port, hdr.dst), (0xc123, "10.0.0.2".parse().unwrap()));
    assert_eq!(&o.private_data[36..41], b"hello");
}

struct ServiceIdOf;
impl ServiceIdOf {
    fn tcp(port: u16) -> crate::proto::cm::ServiceId {
        crate::proto::cm::ServiceId::for_tcp_port(port)
    }
}

/// Two CMs and a network between them.
struct Net {
    rng: Rng,
    now: u64,
    cms: [Cm; 2],
    qps: [FakeQps; 2],
    /// (arrival ns, to, MAD).
    wire: Vec<(u64, usize, OutMad)>,
    loss: f64,
    dup: f64,
}

const GIDS: [Gid; 2] = [A, B];

impl Net {
    fn new(seed: u64, loss: f64, dup: f64) -> Net {
        Net {
            rng: Rng::new(seed),
            now: 0,
            cms: [cm(seed * 2 + 1), cm(seed * 2 + 2)],
            qps: [FakeQps::default(), FakeQps::default()],
            wire: Vec::new(),
            loss,
            dup,
        }
    }

    /// Moves what each CM sent onto the wire, lost, repeated and delayed at random.
    fn carry(&mut self) {
        for from in 0..2 {
            while let Some(m) = self.cms[from].poll_transmit() {
                assert_eq!((m.src, m.dst), (GIDS[from], GIDS[1 - from]));
                let copies = if self.rng.chance(self.dup) { 2 } else { 1 };
                for _ in 0..copies {
                    if !self.rng.chance(self.loss) {
                        let delay = 10_000 + self.rng.below(3_000_000);
                        self.wire.push((self.now + delay, 1 - from, m.clone()));
                    }
                }
            }
        }
    }

    /// Runs to the next event (a MAD arriving or a timer); false when there is none.
    fn step(&mut self) -> bool {
        self.carry();
        let next_mad = self.wire.iter().map(|w| w.0).min();
        let next_timer = self.cms.iter().filter_map(|c| c.poll_timeout()).min();
        let Some(t) = [next_mad, next_timer].into_iter().flatten().min() else { return false };
        self.now = self.now.max(t);
        if let Some(i) = self.wire.iter().position(|w| w.0 <= self.now) {
            let (_, to, m) = self.wire.swap_remove(i);
            self.cms[to].handle_mad(self.now, GIDS[1 - to], GIDS[to], &m.mad[..], &mut self.qps[to]);
        } else {
            for i in 0..2 {
                self.cms[i].handle_timeout(self.now, &mut self.qps[i]);
            }
        }
        self.carry();
        true
    }
}

/// One connection and its teardown over a bad network; returns whether it came up and the
/// retransmissions and duplicates both CMs saw.
fn connect_over(seed: u64, loss: f64, dup: f64) -> (bool, u64, u64) {
    let mut net = Net::new(seed, loss, dup);
    net.cms[1].listen(7174).unwrap();
    let id = net.cms[0].connect(0, args(10), &mut net.qps[0]).unwrap();
    // The application answers after up to 10 s: long enough to need an MRA sometimes.
    let answer_at = net.rng.below(10_000_000_000);
    let mut request = None;
    let mut accepted = None;
    while net.step() {
        if request.is_none() {
            request = net.cms[1].take_request(7174);
        }
        if let (Some(r), None) = (&request, accepted) {
            if net.now >= answer_at {
                let r: &Request = r;
                net.cms[1].accept(net.now, r.id, accept_args(20), &mut net.qps[1]).unwrap();
                accepted = Some(r.id);
            }
        }
        if net.cms[0].status(id) != Some(&ConnStatus::Pending) {
            break;
        }
        assert!(net.now < 600_000_000_000, "seed {seed}: still pending after 10 minutes");
    }
    let Some(ConnStatus::Established) = net.cms[0].status(id).cloned() else {
        assert_eq!(net.cms[0].status(id), Some(&ConnStatus::Failed(CmFailure::Timeout)), "seed {seed}");
        assert_eq!(net.qps[0].state(10), Some(QpState::Init), "seed {seed}");
        return (false, 0, 0);
    };
    // Both QPs point at each other, each sending from the PSN the other expects.
    let (rtr_a, rtr_b) = (net.qps[0].last(10, QpState::Rtr), net.qps[1].last(20, QpState::Rtr));
    assert_eq!((rtr_a.dest_qpn, rtr_a.rq_psn), (Some(20), Some(0x1234)), "seed {seed}");
    assert_eq!((rtr_b.dest_qpn, rtr_b.rq_psn), (Some(10), Some(0x5678)), "seed {seed}");
    assert_eq!(net.qps[0].last(10, QpState::Rts).sq_psn, Some(0x5678), "seed {seed}");
    assert_eq!(net.qps[0].state(10), Some(QpState::Rts));
    // The passive side gets there too: by the RTU, or by the REP repeated until one does.
    let passive = accepted.expect("accepted");
    while net.cms[1].status(passive) == Some(&ConnStatus::Pending) && net.step() {}
    assert_eq!(net.cms[1].status(passive), Some(&ConnStatus::Established), "seed {seed}");
    assert_eq!(net.qps[1].state(20), Some(QpState::Rts), "seed {seed}");
    net.cms[0].disconnect(net.now, id, &mut net.qps[0]).unwrap();
    while net.step() {}
    // 12.9.8: both QPs in ERR, both connections through time-wait and gone.
    assert_eq!(net.cms[1].status(passive), None, "seed {seed}");
    assert_eq!((net.cms[0].connections(), net.cms[1].connections()), (0, 0), "seed {seed}");
    assert_eq!((net.qps[0].state(10), net.qps[1].state(20)), (Some(QpState::Err), Some(QpState::Err)));
    let [a, b] = &net.cms;
    (true, a.stats.retransmissions + b.stats.retransmissions, a.stats.duplicates + b.stats.duplicates)
}

#[test]
fn connections_come_up_and_go_down_over_a_network_that_loses_and_repeats_mads() {
    let (mut up, mut repeats, mut duplicates) = (0, 0, 0);
    for seed in 0..300 {
        let (ok, r, d) = connect_over(seed, 0.2, 0.1);
        up += ok as u32;
        repeats += r;
        duplicates += d;
    }
    // With 20% loss and 15 retries a connection failing is a one-in-billions event.
    assert_eq!(up, 300);
    // The network did its part: timers fired and duplicates were answered.
    assert!(repeats > 300 && duplicates > 100, "{repeats} retransmissions, {duplicates} duplicates");
}

#[test]
fn a_perfect_network_connects_with_three_mads_and_disconnects_with_two() {
    let mut net = Net::new(7, 0.0, 0.0);
    net.cms[1].listen(7174).unwrap();
    let id = net.cms[0].connect(0, args(10), &mut net.qps[0]).unwrap();
    net.step();
    let r = net.cms[1].take_request(7174).unwrap();
    net.cms[1].accept(net.now, r.id, accept_args(20), &mut net.qps[1]).unwrap();
    while net.cms[1].status(r.id) == Some(&ConnStatus::Pending) && net.step() {}
    assert_eq!(net.cms[0].status(id), Some(&ConnStatus::Established));
    net.cms[1].disconnect(net.now, r.id, &mut net.qps[1]).unwrap();
    while net.step() {}
    let sent = net.cms[0].stats.mads_out + net.cms[1].stats.mads_out;
    assert_eq!((sent, net.cms[0].stats.retransmissions + net.cms[1].stats.retransmissions), (5, 0));
}

/// An established passive connection from A's QP 10, and the CM holding it.
fn established_passive() -> (Cm, FakeQps, ConnId, u32) {
    let (mut a, mut b) = (cm(3), cm(4));
    let (mut qa, mut qb) = (FakeQps::default(), FakeQps::default());
    b.listen(7174).unwrap();
    let id = a.connect(0, args(10), &mut qa).unwrap();
    let req = drain(&mut a).remove(0);
    b.handle_mad(0, A, B, &req.mad[..], &mut qb);
    let r = b.take_request(7174).unwrap();
    b.accept(0, r.id, accept_args(20), &mut qb).unwrap();
    let rep = drain(&mut b).remove(0);
    a.handle_mad(0, B, A, &rep.mad[..], &mut qa);
    assert_eq!(a.status(id), Some(&ConnStatus::Established));
    let rtu = drain(&mut a).remove(0);
    b.handle_mad(0, A, B, &rtu.mad[..], &mut qb);
    assert_eq!(b.status(r.id), Some(&ConnStatus::Established));
    let CmMessage::Req(q) = parse(&req).message else { unreachable!() };
    (b, qb, r.id, q.local_comm_id)
}

fn req_from(qpn: u32, comm_id: u32) -> Box<[u8; MAD_LEN]> {
    let mut a = args(qpn);
    a.qpn = qpn;
    msg::req(&CmConfig::default(), 0x1000 + 3, comm_id, &a)
}

fn rej_reason(m: &OutMad) -> u16 {
    match parse(m).message {
        CmMessage::Rej(r) => r.reason,
        other => panic!("expected a REJ, got {other}"),
    }
}

#[test]
fn a_new_req_from_a_qp_still_connected_is_refused_as_stale() {
    // 12.9.8.3.1: same remote QPN and CA GUID, another communication ID.
    let (mut b, mut qb, id, _) = established_passive();
    b.handle_mad(1, A, B, &req_from(10, 0xdead)[..], &mut qb);
    let out = drain(&mut b);
    assert_eq!(rej_reason(&out[0]), reason::STALE_CONNECTION);
    assert_eq!(b.status(id), Some(&ConnStatus::Established));
}

#[test]
fn a_repeated_req_gets_an_mra_while_the_application_thinks_and_the_rep_after() {
    let (mut b, mut qb) = (cm(5), FakeQps::default());
    b.listen(7174).unwrap();
    let req = req_from(10, 0x77);
    b.handle_mad(0, A, B, &req[..], &mut qb);
    assert!(drain(&mut b).is_empty());
    b.handle_mad(1, A, B, &req[..], &mut qb);
    let out = drain(&mut b);
    let CmMessage::Mra(m) = parse(&out[0]).message else { panic!("an MRA") };
    assert_eq!((m.remote_comm_id, m.message_mraed), (0x77, msg::MRA_MSG_REQ));
    let r = b.take_request(7174).expect("one request, not two");
    assert!(b.take_request(7174).is_none());
    b.accept(2, r.id, accept_args(20), &mut qb).unwrap();
    let rep = drain(&mut b);
    b.handle_mad(3, A, B, &req[..], &mut qb);
    assert_eq!(drain(&mut b), rep, "12.9.8.1: a duplicate REQ in REP Sent gets the REP again");
    assert_eq!(b.stats.duplicates, 2);
}

#[test]
fn a_stranger_cannot_tear_down_or_refuse_a_connection() {
    let (mut b, mut qb, id, remote) = established_passive();
    let stranger = gid_from_ipv4([10, 0, 0, 66]);
    let dreq = msg::dreq(remote, id, 20);
    b.handle_mad(1, stranger, B, &dreq[..], &mut qb);
    assert_eq!(b.status(id), Some(&ConnStatus::Established));
    assert_eq!(qb.state(20), Some(QpState::Rts));
    // The peer itself can, and a repeat of its DREQ is answered again (12.9.8.2).
    b.handle_mad(2, A, B, &dreq[..], &mut qb);
    b.handle_mad(3, A, B, &dreq[..], &mut qb);
    assert_eq!(b.status(id), Some(&ConnStatus::Disconnected));
    assert_eq!(qb.state(20), Some(QpState::Err));
    let out = drain(&mut b);
    let kinds: Vec<u16> = out.iter().map(|m| parse(m).header.attribute_id).collect();
    assert_eq!(kinds, [crate::proto::cm::mad::attr::DREP; 3], "the stranger's DREQ names no connection of its own");
    assert_eq!(out[0].dst, stranger);
}

#[test]
fn a_full_listener_rejects_its_oldest_request_for_a_fresh_one() {
    let (mut b, mut qb) = (cm(6), FakeQps::default());
    b.listen(7174).unwrap();
    for i in 0..MAX_PENDING_PER_LISTENER as u32 {
        b.handle_mad(0, A, B, &req_from(100 + i, 1000 + i)[..], &mut qb);
    }
    assert!(drain(&mut b).is_empty());
    b.handle_mad(0, A, B, &req_from(99, 99)[..], &mut qb);
    let out = drain(&mut b);
    let CmMessage::Rej(r) = parse(&out[0]).message else { panic!("a REJ") };
    assert_eq!((r.reason, r.remote_comm_id), (reason::NO_RESOURCES, 1000), "the oldest goes");
    let taken: Vec<Request> = std::iter::from_fn(|| b.take_request(7174)).collect();
    assert_eq!(taken.len(), MAX_PENDING_PER_LISTENER);
    assert_eq!(taken.last().map(|r| r.peer.is_some()), Some(true));
}

#[test]
fn a_request_the_application_never_answers_is_rejected_after_a_minute() {
    let (mut b, mut qb) = (cm(12), FakeQps::default());
    b.listen(7174).unwrap();
    b.handle_mad(0, A, B, &req_from(10, 5)[..], &mut qb);
    let r = b.take_request(7174).unwrap();
    assert_eq!(b.poll_timeout(), Some(MAX_REQUEST_WAIT_NS));
    b.handle_timeout(MAX_REQUEST_WAIT_NS, &mut qb);
    assert_eq!(rej_reason(&drain(&mut b)[0]), reason::TIMEOUT);
    assert!(matches!(b.status(r.id), Some(ConnStatus::Failed(CmFailure::Rejected { .. }))));
    assert_eq!(b.accept(1, r.id, accept_args(20), &mut qb), Err(CmError::NoConnection));
}

#[test]
fn a_req_for_no_listener_or_another_address_or_a_spoofed_path_is_refused() {
    let (mut b, mut qb) = (cm(7), FakeQps::default());
    b.handle_mad(0, A, B, &req_from(10, 1)[..], &mut qb);
    assert_eq!(rej_reason(&drain(&mut b)[0]), reason::INVALID_SERVICE_ID);
    b.listen(7174).unwrap();
    // The path says A, the packet came from elsewhere: the data would go to A.
    b.handle_mad(0, gid_from_ipv4([10, 0, 0, 9]), B, &req_from(10, 2)[..], &mut qb);
    assert_eq!(rej_reason(&drain(&mut b)[0]), reason::INVALID_GID);
    assert_eq!(b.connections(), 0);
}

#[test]
fn an_unanswered_req_is_sent_max_retries_more_times_then_the_connect_fails() {
    let (mut a, mut qa) = (cm(8), FakeQps::default());
    let id = a.connect(0, args(10), &mut qa).unwrap();
    let mut sent = drain(&mut a).len();
    while let Some(t) = a.poll_timeout() {
        a.handle_timeout(t, &mut qa);
        sent += drain(&mut a).len();
        if a.status(id) != Some(&ConnStatus::Pending) {
            break;
        }
    }
    // The REQ, 15 repeats, then a REJ "timeout" (12.9.6).
    assert_eq!(sent, 1 + 15 + 1);
    assert_eq!(a.status(id), Some(&ConnStatus::Failed(CmFailure::Timeout)));
    // The QP never left INIT: it can try again.
    assert_eq!(qa.state(10), Some(QpState::Init));
}

#[test]
fn garbage_on_qp1_is_counted_and_dropped() {
    let (mut b, mut qb) = (cm(9), FakeQps::default());
    b.listen(7174).unwrap();
    let mut bad = req_from(10, 5);
    bad[2] = 1; // class version 1
    b.handle_mad(0, A, B, &bad[..], &mut qb);
    b.handle_mad(0, A, B, &[0u8; 10], &mut qb);
    b.handle_mad(0, A, B, &[0xffu8; MAD_LEN], &mut qb);
    assert_eq!(b.stats.mads_dropped, 3);
    assert!(drain(&mut b).is_empty() && b.connections() == 0);
}

#[test]
fn requests_beyond_the_device_limit_are_refused_for_resources() {
    let (mut b, mut qb) = (cm(10), FakeQps::default());
    let listeners = MAX_CONNECTIONS / MAX_PENDING_PER_LISTENER + 1;
    // Every listener's queue just fills; the device's limit is what refuses.
    let mut refused = 0;
    for l in 0..listeners as u32 {
        let mut a = args(0);
        a.dst_port = 8000 + l as u16;
        b.listen(a.dst_port).unwrap();
        for i in 0..MAX_PENDING_PER_LISTENER as u32 {
            let n = l * 1000 + i;
            a.qpn = 100 + n;
            b.handle_mad(0, A, B, &msg::req(&CmConfig::default(), 7, 1 + n, &a)[..], &mut qb);
            refused += drain(&mut b).iter().filter(|m| rej_reason(m) == reason::NO_RESOURCES).count();
        }
    }
    assert_eq!(b.connections(), MAX_CONNECTIONS);
    assert_eq!(refused, listeners * MAX_PENDING_PER_LISTENER - MAX_CONNECTIONS);
}

#[test]
fn mads_queued_for_the_wire_are_bounded() {
    // REQs for a port nobody listens on each earn a REJ; nothing polls them out.
    let (mut b, mut qb) = (cm(11), FakeQps::default());
    for i in 0..MAX_QUEUED_MADS as u32 + 100 {
        b.handle_mad(0, A, B, &req_from(100 + i, 1 + i)[..], &mut qb);
    }
    assert_eq!(drain(&mut b).len(), MAX_QUEUED_MADS);
}

fn ud_args() -> SidrArgs {
    SidrArgs { local_gid: A, peer_gid: B, src_port: 0xc321, dst_port: 7174, private_data: b"ud hello".to_vec() }
}

// IBTA 12.11: a SIDR_REQ for a UD listener's port becomes a request with the
// requester's private data and address; the answer carries the UD QP's number and Q_Key,
// and the requester reads them; a duplicate request gets the same answer again.
#[test]
fn a_ud_resolution_carries_the_qp_number_and_q_key() {
    let (mut a, mut b, mut qps) = (cm(1), cm(2), FakeQps::default());
    b.listen_ud(7174).unwrap();
    let id = a.resolve_ud(0, ud_args()).unwrap();
    let req = drain(&mut a);
    assert_eq!(req.len(), 1);
    assert!(matches!(parse(&req[0]).message, CmMessage::SidrReq(r) if r.service_id.0 == 0x0111_1c06));
    b.handle_mad(0, A, B, &req[0].mad[..], &mut qps);
    let r = b.take_ud_request(7174).expect("a request");
    assert_eq!(&r.private_data[..8], b"ud hello");
    assert_eq!(r.peer, Some(("10.0.0.1".parse().unwrap(), 0xc321)));
    b.accept_ud(r.id, 0x4242, 0x0123_4567, b"ud reply").unwrap();
    let rep = drain(&mut b);
    assert_eq!(a.ud_status(id), Some(&SidrStatus::Pending));
    a.handle_mad(0, B, A, &rep[0].mad[..], &mut qps);
    match a.ud_status(id) {
        Some(SidrStatus::Resolved { qpn, qkey, private_data }) => {
            assert_eq!((*qpn, *qkey, &private_data[..8]), (0x4242, 0x0123_4567, &b"ud reply"[..]));
        }
        other => panic!("{other:?}"),
    }
    // The request again (its answer was lost): the same answer, no new request.
    b.handle_mad(1, A, B, &req[0].mad[..], &mut qps);
    assert_eq!(drain(&mut b).iter().map(|m| m.mad.clone()).collect::<Vec<_>>(), vec![rep[0].mad.clone()]);
    assert!(b.take_ud_request(7174).is_none());
}

// 12.11.2: nobody listening answers "unsupported service"; an unanswered request is sent
// again on its timer and fails after the last retry.
#[test]
fn a_ud_resolution_is_refused_without_a_listener_and_times_out_unanswered() {
    let (mut a, mut b, mut qps) = (cm(3), cm(4), FakeQps::default());
    let id = a.resolve_ud(0, ud_args()).unwrap();
    let req = drain(&mut a);
    b.handle_mad(0, A, B, &req[0].mad[..], &mut qps);
    let rep = drain(&mut b);
    a.handle_mad(0, B, A, &rep[0].mad[..], &mut qps);
    assert_eq!(a.ud_status(id), Some(&SidrStatus::Refused(1)));

    let id = a.resolve_ud(0, ud_args()).unwrap();
    drain(&mut a);
    let mut sent = 0;
    while let Some(t) = a.poll_timeout() {
        a.handle_timeout(t, &mut qps);
        sent += drain(&mut a).len();
        assert!(sent <= 20, "retries are bounded");
    }
    assert_eq!(sent, usize::from(CmConfig::default().max_retries));
    assert_eq!(a.ud_status(id), Some(&SidrStatus::Timeout));
}

/// One UD resolution over a bad network, answered after up to 10 s; whether it resolved.
fn resolve_over(seed: u64, loss: f64, dup: f64) -> bool {
    let mut net = Net::new(seed, loss, dup);
    net.cms[1].listen_ud(7174).unwrap();
    let id = net.cms[0].resolve_ud(0, ud_args()).unwrap();
    let answer_at = net.rng.below(10_000_000_000);
    let (mut request, mut requests) = (None, 0);
    while net.cms[0].ud_status(id) == Some(&SidrStatus::Pending) && net.step() {
        if let Some(r) = net.cms[1].take_ud_request(7174) {
            requests += 1;
            request = Some(r);
        }
        if let Some(r) = request.take_if(|_| net.now >= answer_at) {
            net.cms[1].accept_ud(r.id, 0x4242, 0x0123_4567, b"").unwrap();
        }
    }
    // However often the request came, the application saw it once.
    assert!(requests <= 1, "seed {seed}: {requests} requests");
    let resolved = match net.cms[0].ud_status(id).cloned() {
        Some(SidrStatus::Resolved { qpn, qkey, .. }) => {
            assert_eq!((qpn, qkey), (0x4242, 0x0123_4567), "seed {seed}");
            true
        }
        other => {
            assert_eq!(other, Some(SidrStatus::Timeout), "seed {seed}");
            false
        }
    };
    net.cms[0].forget_ud(id);
    // Late duplicates are answered from what was kept, which then expires.
    while net.step() {}
    assert!(net.cms[1].sidrs.is_empty() && net.cms[0].sidrs.is_empty(), "seed {seed}");
    resolved
}

#[test]
fn ud_resolutions_come_through_a_network_that_loses_and_repeats_mads() {
    let resolved = (0..300).filter(|&seed| resolve_over(seed, 0.2, 0.1)).count();
    // 20% loss each way and 15 retries: a resolution failing is a one-in-billions event.
    assert_eq!(resolved, 300);
}

// What a peer's SIDR_REQs can make the CM keep: MAX_PENDING_PER_LISTENER requests waiting
// on a listener (the oldest refused as newer come), MAX_CONNECTIONS in all (every request
// past it refused at once, keeping nothing), each for MAX_REQUEST_WAIT_NS at most.
#[test]
fn a_flood_of_ud_requests_holds_every_limit() {
    use crate::proto::cm::msg::sidr_status;
    let (mut a, mut b, mut qps) = (cm(5), cm(6), FakeQps::default());
    b.listen_ud(7174).unwrap();
    let sent = MAX_CONNECTIONS + 10;
    let mut refused = 0;
    for _ in 0..sent {
        let id = a.resolve_ud(0, ud_args()).unwrap();
        a.forget_ud(id);
        for m in drain(&mut a) {
            b.handle_mad(0, A, B, &m.mad[..], &mut qps);
        }
        for m in drain(&mut b) {
            let CmMessage::SidrRep(r) = parse(&m).message else { panic!("only SIDR_REPs") };
            assert_eq!(r.status, sidr_status::REJECTED);
            refused += 1;
        }
    }
    let pending = std::iter::from_fn(|| b.take_ud_request(7174)).count();
    assert_eq!(pending, MAX_PENDING_PER_LISTENER);
    assert_eq!(refused, sent - MAX_PENDING_PER_LISTENER);
    assert_eq!(b.sidrs.len(), MAX_CONNECTIONS);
    b.handle_timeout(MAX_REQUEST_WAIT_NS, &mut qps);
    assert!(b.sidrs.is_empty() && b.poll_timeout().is_none());
}
