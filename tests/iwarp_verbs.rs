//! iWARP behind the verbs API, on kernel TCP over loopback: rdma_cm-style connection setup
//! (listen, connect with private data, accept, reject), every operation with its data
//! checked, and bad input from a peer ending one connection while another carries on.

use softrdma::verbs::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

fn open(ip: [u8; 4], tweak: impl FnOnce(&mut OpenConfig)) -> Context {
    let mut cfg = OpenConfig::new(std::net::Ipv4Addr::from(ip).into());
    cfg.transport = Transport::Iwarp;
    tweak(&mut cfg);
    Context::open(cfg).expect("an iWARP device")
}

struct Side {
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qp: QueuePair,
}

fn side(ctx: &Context) -> Side {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256);
    let mr = ctx.reg_mr(&pd, 1 << 20, Access::ALL).unwrap();
    let qp = ctx.create_qp(&pd, &cq, &cq, QpType::Rc, QpCaps::default(), None).unwrap();
    Side { _pd: pd, cq, mr, qp }
}

fn param(pd: &[u8], depth: u16) -> ConnParam {
    ConnParam { private_data: pd.to_vec(), responder_resources: depth, initiator_depth: depth }
}

/// Connects a client QP to a server QP through a listener; returns both sides' view of
/// the peer's private data.
fn connect(server: &Context, s: &Side, c: &Side) -> (Vec<u8>, Vec<u8>) {
    let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = listener.local_addr();
    std::thread::scope(|scope| {
        let h = scope.spawn(|| c.qp.connect(to, &param(b"client hello", 4), T).expect("connected"));
        let req = listener.get_request(T).expect("a request");
        let seen = req.private_data.clone();
        assert_eq!(req.responder_resources, 4, "the initiator's ORD");
        req.accept(&s.qp, &param(b"server hello", 4)).expect("accepted");
        (h.join().unwrap(), seen)
    })
}

fn wait(cq: &CompletionQueue) -> Wc {
    cq.wait(T).expect("a completion")
}

fn wr(id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr::new(id, op, sgl)
}

#[test]
fn every_operation_over_kernel_tcp_with_private_data() {
    let (a, b) = (open([127, 0, 0, 1], |_| {}), open([127, 0, 0, 1], |_| {}));
    let (sa, sb) = (side(&a), side(&b));
    sb.qp.post_recv(RecvWr { wr_id: 100, sgl: vec![sb.mr.sge(0, 4096)] }).unwrap();
    let (at_client, at_server) = connect(&b, &sb, &sa);
    assert_eq!(at_client, b"server hello");
    assert_eq!(at_server, b"client hello");
    assert_eq!(sa.qp.state(), Some(QpState::Rts));

    // Send (posted before the connection existed) with a message longer than one FPDU.
    let msg: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
    sa.mr.write(0, &msg);
    sa.qp.post_send(wr(1, SendOp::Send, vec![sa.mr.sge(0, 4000)])).unwrap();
    assert_eq!((wait(&sa.cq).wr_id, wait(&sb.cq).byte_len), (1, 4000));
    let mut got = vec![0u8; 4000];
    sb.mr.read(0, &mut got);
    assert_eq!(got, msg);

    // Write of 300 KiB, then Read of it back into another place.
    let big: Vec<u8> = (0..300 * 1024u32).map(|i| (i ^ (i >> 8)) as u8).collect();
    sa.mr.write(4096, &big);
    let remote = Remote { addr: sb.mr.addr() + 8192, rkey: sb.mr.rkey() };
    sa.qp.post_send(wr(2, SendOp::Write(remote), vec![sa.mr.sge(4096, big.len() as u32)])).unwrap();
    sa.qp.post_send(wr(3, SendOp::Read(remote), vec![sa.mr.sge(512 * 1024, big.len() as u32)])).unwrap();
    let (w, r) = (wait(&sa.cq), wait(&sa.cq));
    assert_eq!((w.wr_id, w.opcode, w.status), (2, WcOpcode::RdmaWrite, WcStatus::Success));
    assert_eq!((r.wr_id, r.opcode, r.status), (3, WcOpcode::RdmaRead, WcStatus::Success));
    let mut back = vec![0u8; big.len()];
    sa.mr.read(512 * 1024, &mut back);
    assert!(back == big, "the Read returns what the Write placed");

    // Send with Solicited Event, and Send with Invalidate of B's own region key.
    sb.qp.post_recv(RecvWr { wr_id: 101, sgl: vec![sb.mr.sge(0, 64)] }).unwrap();
    sb.qp.post_recv(RecvWr { wr_id: 102, sgl: vec![sb.mr.sge(0, 64)] }).unwrap();
    let mut se = wr(4, SendOp::Send, vec![sa.mr.sge(0, 8)]);
    se.solicited = true;
    sa.qp.post_send(se).unwrap();
    sa.qp.post_send(wr(5, SendOp::SendInv(sb.mr.rkey()), vec![sa.mr.sge(0, 8)])).unwrap();
    let (w1, w2) = (wait(&sb.cq), wait(&sb.cq));
    assert!(w1.solicited && w1.wr_id == 101);
    assert_eq!((w2.wr_id, w2.invalidated_rkey), (102, Some(sb.mr.rkey())));
    assert_eq!((wait(&sa.cq).wr_id, wait(&sa.cq).wr_id), (4, 5));

    // B's region key is invalid now: a Write to it is a Terminate, both QPs end in ERR and
    // flush what they still hold.
    sb.qp.post_recv(RecvWr { wr_id: 103, sgl: vec![sb.mr.sge(0, 64)] }).unwrap();
    sa.qp.post_send(wr(6, SendOp::Write(remote), vec![sa.mr.sge(0, 64)])).unwrap();
    let flushed = wait(&sb.cq);
    assert_eq!((flushed.wr_id, flushed.status), (103, WcStatus::WrFlushErr));
    let _ = wait(&sa.cq);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(sa.qp.state(), Some(QpState::Err));
    assert_eq!(sb.qp.state(), Some(QpState::Err));
}

#[test]
fn a_terminate_on_one_connection_leaves_the_others_running() {
    let (a, b) = (open([127, 0, 0, 1], |_| {}), open([127, 0, 0, 1], |_| {}));
    let (a1, b1, a2, b2) = (side(&a), side(&b), side(&a), side(&b));
    connect(&b, &b1, &a1);
    connect(&b, &b2, &a2);
    // A Send with no receive posted ends connection 1.
    a1.qp.post_send(wr(1, SendOp::Send, vec![a1.mr.sge(0, 16)])).unwrap();
    let _ = wait(&a1.cq);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(b1.qp.state(), Some(QpState::Err));
    // Both applications of connection 1 hear of it (the sender of the Terminate and its
    // receiver), as from siw: IBTA 11.6.3.1's catastrophic error.
    assert_eq!(b.poll_async_event(), Some(AsyncEvent::QpFatal(b1.qp.qp_num())));
    assert_eq!(a.poll_async_event(), Some(AsyncEvent::QpFatal(a1.qp.qp_num())));
    assert_eq!((a.poll_async_event(), b.poll_async_event()), (None, None), "once each");
    // Connection 2 still carries a Write and a Send.
    b2.qp.post_recv(RecvWr { wr_id: 9, sgl: vec![b2.mr.sge(0, 16)] }).unwrap();
    a2.mr.write(0, b"still here");
    let remote = Remote { addr: b2.mr.addr() + 100, rkey: b2.mr.rkey() };
    a2.qp.post_send(wr(2, SendOp::Write(remote), vec![a2.mr.sge(0, 10)])).unwrap();
    a2.qp.post_send(wr(3, SendOp::Send, vec![a2.mr.sge(0, 10)])).unwrap();
    assert_eq!(wait(&b2.cq).status, WcStatus::Success);
    let mut got = [0u8; 10];
    b2.mr.read(100, &mut got);
    assert_eq!(&got, b"still here");
    assert_eq!(a2.qp.state(), Some(QpState::Rts));
    assert_eq!((a.poll_async_event(), b.poll_async_event()), (None, None));
}

#[test]
fn a_rejected_request_and_a_silent_peer_fail_cleanly() {
    let b = open([127, 0, 0, 1], |c| c.iwarp.mpa_timeout_ms = 300);
    let a = open([127, 0, 0, 1], |_| {});
    let sa = side(&a);
    let listener = b.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = listener.local_addr();
    std::thread::scope(|scope| {
        let h = scope.spawn(|| sa.qp.connect(to, &param(b"let me in", 0), T));
        let req = listener.get_request(T).expect("a request");
        req.reject(b"not today");
        match h.join().unwrap() {
            Err(ConnectError::Rejected { why, private_data }) => {
                assert!(why.contains("not today"), "{why}");
                assert_eq!(private_data, b"not today", "the reject Reply's private data");
            }
            other => panic!("expected a rejection: {other:?}"),
        }
    });
    assert_eq!(sa.qp.state(), Some(QpState::Err));

    // A TCP peer that never sends its MPA Request is dropped after the MPA timeout.
    let mut silent = TcpStream::connect(to).unwrap();
    silent.set_read_timeout(Some(T)).unwrap();
    let mut buf = [0u8; 64];
    let n = silent.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without a word");
    // Garbage instead of a Request gets a reject Reply, then the close.
    let mut garbage = TcpStream::connect(to).unwrap();
    garbage.set_read_timeout(Some(T)).unwrap();
    garbage.write_all(&[0x55; 40]).unwrap();
    let mut reply = Vec::new();
    let _ = garbage.read_to_end(&mut reply);
    assert!(reply.starts_with(b"MPA ID Rep Frame"), "a Reply frame");
    assert_ne!(reply[16] & 0x20, 0, "with the reject bit");
    assert!(listener.get_request(Duration::from_millis(50)).is_none());
}

#[test]
fn a_connect_to_nobody_is_refused() {
    let a = open([127, 0, 0, 1], |_| {});
    let sa = side(&a);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    assert!(matches!(sa.qp.connect(to, &param(b"", 0), T), Err(ConnectError::Refused(_))));
}

/// Two iWARP connections whose server QPs take their receives from one shared receive
/// queue (IBTA 10.2.9): Sends on either land in its buffers in order, the armed limit raises
/// its event once, a QP with an SRQ takes no receives of its own, the SRQ cannot go while
/// a QP uses it, and a Send finding it empty ends that connection with a Terminate.
#[test]
fn server_qps_share_a_receive_queue() {
    let (a, b) = (open([127, 0, 0, 1], |_| {}), open([127, 0, 0, 1], |_| {}));
    let (pd, cq) = (b.alloc_pd(), b.create_cq(256));
    let mr = b.reg_mr(&pd, 1 << 16, Access::ALL).unwrap();
    let srq = b.create_srq(8, 1);
    let servers: Vec<Side> = (0..2)
        .map(|_| {
            let qp = b.create_qp(&pd, &cq, &cq, QpType::Rc, QpCaps::default(), Some(&srq)).unwrap();
            let mr = b.reg_mr(&pd, 4096, Access::ALL).unwrap();
            Side { _pd: b.alloc_pd(), cq: b.create_cq(4), mr, qp }
        })
        .collect();
    let clients = [side(&a), side(&a)];
    for (s, c) in servers.iter().zip(&clients) {
        connect(&b, s, c);
    }
    for i in 0..3u64 {
        srq.post_recv(RecvWr { wr_id: 10 + i, sgl: vec![mr.sge(i as usize * 1024, 1024)] }).unwrap();
    }
    srq.arm_limit(2).unwrap();
    let refused = servers[0].qp.post_recv(RecvWr { wr_id: 99, sgl: vec![mr.sge(0, 16)] });
    assert_eq!(refused, Err(VerbsError::InvalidRequest), "a QP with an SRQ has no receive queue");
    assert!(srq.destroy().is_err(), "QPs use it");

    for (k, c) in [0usize, 1].iter().map(|&k| (k, &clients[k])) {
        c.mr.write(0, &[k as u8 + 1; 100]);
        c.qp.post_send(wr(k as u64, SendOp::Send, vec![c.mr.sge(0, 100)])).unwrap();
        assert_eq!(wait(&c.cq).status, WcStatus::Success);
        let got = wait(&cq);
        assert_eq!((got.wr_id, got.qpn, got.byte_len), (10 + k as u64, servers[k].qp.qp_num(), 100));
        let mut bytes = [0u8; 100];
        mr.read(k * 1024, &mut bytes);
        assert_eq!(bytes, [k as u8 + 1; 100], "the SRQ's receives fill in order");
    }
    assert_eq!(b.poll_async_event(), Some(AsyncEvent::SrqLimitReached(srq.srq_num())), "fewer than 2 left");
    assert_eq!(b.poll_async_event(), None, "once");

    // One receive left, two Sends: the second finds the SRQ empty.
    for id in [2, 3] {
        clients[0].qp.post_send(wr(id, SendOp::Send, vec![clients[0].mr.sge(0, 100)])).unwrap();
    }
    assert_eq!(wait(&cq).wr_id, 12);
    let deadline = std::time::Instant::now() + T;
    while servers[0].qp.state() != Some(QpState::Err) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(servers[0].qp.state(), Some(QpState::Err), "no receive: the connection terminates");
    assert_eq!(servers[1].qp.state(), Some(QpState::Rts), "the other connection carries on");
}

/// Waits for `posted` completions of `c`'s Sends, each a success or a flush, and finds the
/// QP in ERR.
fn every_send_completes(c: &Side, posted: u64) {
    for seen in 0..posted {
        let Some(wc) = c.cq.wait(T) else { panic!("{seen} of {posted} Sends completed; the rest were lost") };
        assert!(matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr), "{wc:?}");
    }
    assert_eq!(c.qp.state(), Some(QpState::Err));
}

/// Posts `n` 64 KiB Sends on each of `qps` in turn. The receiver's Terminate puts a QP
/// in ERR partway (its poll thread can take that in while this thread still posts), and
/// what is posted after that is taken and flushed (IBTA vol. 1 10.3.1.7): every post
/// succeeds. Returns how many each QP posted.
fn post_sends(qps: [&Side; 2], n: u64) -> [u64; 2] {
    for i in 0..n {
        for c in qps {
            if let Err(e) = c.qp.post_send(wr(i, SendOp::Send, vec![c.mr.sge(0, 65536)])) {
                panic!("Send {i} refused with {e:?} on a QP in {:?}", c.qp.state());
            }
        }
    }
    [n; 2]
}

/// A sender far ahead of its receiver (perftest's ib_send_bw on iWARP, which has no RNR):
/// the receiver runs out of receives and terminates while the sender still has Sends
/// queued behind a full TCP window. Every Send the sender posted completes, the queued
/// ones flushed, on both connections' sides; none is lost.
#[test]
fn sends_queued_behind_a_terminated_connection_all_complete() {
    let (a, b) = (open([127, 0, 0, 1], |_| {}), open([127, 0, 0, 1], |_| {}));
    let (a1, b1, a2, b2) = (side(&a), side(&b), side(&a), side(&b));
    connect(&b, &b1, &a1);
    connect(&b, &b2, &a2);
    for s in [&b1, &b2] {
        for i in 0..4 {
            s.qp.post_recv(RecvWr { wr_id: i, sgl: vec![s.mr.sge(0, 65536)] }).unwrap();
        }
    }
    let posted = post_sends([&a1, &a2], 200);
    for (c, n) in [&a1, &a2].into_iter().zip(posted) {
        every_send_completes(c, n);
    }
}

/// As above, and the receiving application then goes away (its process exits, so its
/// sockets close with unread bytes: a reset): the sender's queued Sends still all complete.
#[test]
fn sends_queued_towards_a_vanished_peer_all_complete() {
    let a = open([127, 0, 0, 1], |_| {});
    let (a1, a2) = (side(&a), side(&a));
    let posted = {
        let b = open([127, 0, 0, 1], |_| {});
        let (b1, b2) = (side(&b), side(&b));
        connect(&b, &b1, &a1);
        connect(&b, &b2, &a2);
        for s in [&b1, &b2] {
            s.qp.post_recv(RecvWr { wr_id: 0, sgl: vec![s.mr.sge(0, 65536)] }).unwrap();
        }
        let posted = post_sends([&a1, &a2], 200);
        std::thread::sleep(Duration::from_millis(20));
        posted
    };
    for (c, n) in [&a1, &a2].into_iter().zip(posted) {
        every_send_completes(c, n);
    }
}

/// A connection leaves from its device's address (rdma_cm binds an id to its source
/// address): the listener sees 127.0.91.2, not the 127.0.0.1 the loopback route picks.
#[test]
fn a_connection_comes_from_the_device_address() {
    let (server, client) = (open([127, 0, 91, 1], |_| {}), open([127, 0, 91, 2], |_| {}));
    let (s, c) = (side(&server), side(&client));
    let listener = server.listen("127.0.91.1:0".parse().unwrap()).unwrap();
    let to = listener.local_addr();
    std::thread::scope(|scope| {
        let h = scope.spawn(|| c.qp.connect(to, &param(b"", 0), T).expect("connected"));
        let req = listener.get_request(T).expect("a request");
        assert_eq!(req.peer.map(|p| p.ip()), Some("127.0.91.2".parse().unwrap()));
        req.accept(&s.qp, &param(b"", 0)).expect("accepted");
        h.join().unwrap();
    });
}

/// iWARP has no memory windows here (siw has none either): allocating one is refused.
#[test]
fn a_memory_window_is_refused_on_iwarp() {
    let ctx = open([127, 0, 91, 3], |_| {});
    let pd = ctx.alloc_pd();
    assert!(matches!(ctx.alloc_mw(&pd, MwType::Two), Err(VerbsError::Unsupported)));
}

/// The QP error handler (what rdma_cm's DISCONNECTED comes from) hears of each side's QP
/// once when one side disconnects: the closing side at once, the other when its stream
/// ends.
#[test]
fn a_disconnect_reaches_both_sides_qp_error_handlers_once() {
    use std::sync::{Arc, Mutex};
    let (a, b) = (open([127, 0, 91, 4], |_| {}), open([127, 0, 91, 5], |_| {}));
    let (sa, sb) = (side(&a), side(&b));
    let heard: [Arc<Mutex<Vec<u32>>>; 2] = Default::default();
    for (ctx, h) in [(&a, &heard[0]), (&b, &heard[1])] {
        let h = h.clone();
        assert!(ctx.set_qp_error_handler(Box::new(move |q| h.lock().unwrap().push(q))));
    }
    assert!(!a.set_qp_error_handler(Box::new(|_| {})), "one handler per device");
    let listener = b.listen("127.0.91.5:0".parse().unwrap()).unwrap();
    let to = listener.local_addr();
    std::thread::scope(|scope| {
        let h = scope.spawn(|| sa.qp.connect(to, &param(b"", 0), T).expect("connected"));
        listener.get_request(T).expect("a request").accept(&sb.qp, &param(b"", 0)).expect("accepted");
        h.join().unwrap();
    });
    assert!(heard.iter().all(|h| h.lock().unwrap().is_empty()));
    sa.qp.disconnect().unwrap();
    let start = std::time::Instant::now();
    while heard[1].lock().unwrap().is_empty() && start.elapsed() < T {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(*heard[0].lock().unwrap(), vec![sa.qp.qp_num()]);
    assert_eq!(*heard[1].lock().unwrap(), vec![sb.qp.qp_num()]);
}

/// Payloads go out from registered memory in place when no CRC is negotiated, and copied
/// when one is: a Send gathered from two regions, cut at SGE boundaries inside FPDUs and
/// around the size below which payloads are copied anyway, arrives whole either way.
#[test]
fn gathered_sends_arrive_whole_with_and_without_a_crc() {
    for crc in [CrcPolicy::OnRequest, CrcPolicy::Required] {
        let (a, b) = (open([127, 0, 0, 1], |c| c.iwarp.crc = crc), open([127, 0, 0, 1], |c| c.iwarp.crc = crc));
        let (sa, sb) = (side(&a), side(&b));
        let other = a.reg_mr(&sa._pd, 1 << 16, Access::ALL).unwrap();
        let pieces = [(0usize, 1000u32), (2_000, 1024), (4_003, 100_001), (200_000, 1)];
        let mut sgl: Vec<Sge> = pieces.iter().map(|&(off, len)| sa.mr.sge(off, len)).collect();
        sgl.insert(2, other.sge(5, 50_000));
        let mut expect = Vec::new();
        for (i, s) in sgl.iter().enumerate() {
            let data: Vec<u8> = (0..s.length).map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8 * 17)).collect();
            let region = if i == 2 { &other } else { &sa.mr };
            assert!(region.write((s.addr - region.addr()) as usize, &data));
            expect.extend_from_slice(&data);
        }
        sb.qp.post_recv(RecvWr { wr_id: 7, sgl: vec![sb.mr.sge(0, 1 << 20)] }).unwrap();
        connect(&b, &sb, &sa);
        sa.qp.post_send(wr(1, SendOp::Send, sgl)).unwrap();
        let (sent, got) = (wait(&sa.cq), wait(&sb.cq));
        assert_eq!(
            (sent.status, got.status, got.byte_len as usize),
            (WcStatus::Success, WcStatus::Success, expect.len())
        );
        let mut back = vec![0u8; expect.len()];
        sb.mr.read(0, &mut back);
        assert!(back == expect, "the gathered Send arrives as posted ({crc:?})");
    }
}
