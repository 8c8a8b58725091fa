//! The peer is hostile, iWARP side: a plain TCP socket speaks MPA, DDP and RDMAP by hand
//! against a real device over loopback, and each test checks the Terminate the RFCs ask
//! for (layer, type, code), the completions, that no byte outside a permitted range
//! changed, and that memory and connections stay bounded.

mod hostile;

use hostile::{peak_rss_kib, rss_kib, serial};
use softrdma::iwarp::deframer::Deframer;
use softrdma::iwarp::framer::Framer;
use softrdma::iwarp::setup::{Negotiated, Outcome, Policy, RtrKind, Setup};
use softrdma::proto::iwarp::ddp::{DdpBuffer, DdpRepr, VERSION as DDP_VERSION};
use softrdma::proto::iwarp::mpa::{MpaFramePacket, MpaFrameRepr};
use softrdma::proto::iwarp::rdmap::{
    Body, Control, Layer, MessageRepr, Opcode, ReadRequestRepr, QN_READ_REQUEST, QN_SEND, VERSION as RDMAP_VERSION,
};
use softrdma::verbs::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn open(tweak: impl FnOnce(&mut OpenConfig)) -> Context {
    let mut cfg = OpenConfig::new(std::net::Ipv4Addr::LOCALHOST.into());
    cfg.transport = Transport::Iwarp;
    tweak(&mut cfg);
    Context::open(cfg).expect("an iWARP device")
}

fn param(pd: &[u8], depth: u16) -> ConnParam {
    ConnParam { private_data: pd.to_vec(), responder_resources: depth, initiator_depth: depth }
}

/// The attacker's end of one MPA connection: it frames and deframes by hand.
struct Wire {
    s: TcpStream,
    framer: Framer,
    deframer: Deframer,
    read_msn: u32,
}

/// An attacker's MPA policy: no CRC asked, the given read depths, no peer-to-peer.
fn attacker_policy(ird: u16, ord: u16, rtr: Vec<RtrKind>) -> Policy {
    Policy { ird, ord, rtr, private_data: b"attacker".to_vec(), ..Policy::default() }
}

impl Wire {
    /// Runs MPA setup on `s` with `setup`, keeping what follows the peer's frame.
    fn handshake(mut s: TcpStream, mut setup: Setup) -> (Wire, Negotiated) {
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(&setup.take_output()).unwrap();
        let mut buf = vec![0u8; 4096];
        let mut rest = Vec::new();
        while setup.outcome().is_none() {
            let n = s.read(&mut buf).expect("the MPA frame");
            assert!(n > 0, "closed during MPA setup");
            let used = setup.on_bytes(&buf[..n]);
            rest.extend_from_slice(&buf[used..n]);
        }
        s.write_all(&setup.take_output()).unwrap();
        let Some(Outcome::Established(neg)) = setup.outcome().cloned() else {
            panic!("setup: {:?}", setup.outcome());
        };
        let mut deframer = Deframer::new(neg.markers_rx, neg.crc);
        deframer.push(&rest);
        let w = Wire { s, framer: Framer::new(neg.markers_tx, neg.crc), deframer, read_msn: 1 };
        (w, neg)
    }

    fn send(&mut self, m: &MessageRepr<'_>) {
        let mut out = Vec::new();
        self.frame(m, &mut out);
        self.s.write_all(&out).unwrap();
    }

    fn frame(&mut self, m: &MessageRepr<'_>, out: &mut Vec<u8>) {
        let mut ulpdu = vec![0u8; m.buffer_len()];
        m.emit(&mut ulpdu).unwrap();
        self.framer.frame(&ulpdu, out).unwrap();
    }

    /// `n` Read Requests in one write, so that the device reads them together.
    fn read_requests(&mut self, rr: ReadRequestRepr, n: usize) {
        let mut out = Vec::new();
        for _ in 0..n {
            let msn = self.read_msn;
            self.read_msn += 1;
            let buffer = DdpBuffer::Untagged { rsvd_ulp: 0, qn: QN_READ_REQUEST, msn, mo: 0 };
            self.frame(&message(Opcode::ReadRequest, buffer, true, Body::ReadRequest(rr)), &mut out);
        }
        self.s.write_all(&out).unwrap();
    }

    fn read_request(&mut self, rr: ReadRequestRepr) {
        self.read_requests(rr, 1);
    }

    /// The next ULPDU from the device, or None when the stream ended or went silent.
    fn next_ulpdu(&mut self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            if let Some(f) = self.deframer.next_fpdu().expect("a well-framed stream") {
                return Some(f.ulpdu);
            }
            match self.s.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.deframer.push(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    }

    /// Reads (past Read Responses) until the device's Terminate: its layer, type, code.
    fn terminate(&mut self) -> (Layer, u8, u8) {
        while let Some(u) = self.next_ulpdu() {
            let m = MessageRepr::parse(&u).expect("the device sends well-formed messages");
            if let Body::Terminate(t) = m.body {
                return (t.layer, t.etype, t.ecode);
            }
        }
        panic!("the stream ended without a Terminate");
    }
}

fn message<'a>(opcode: Opcode, buffer: DdpBuffer, last: bool, body: Body<'a>) -> MessageRepr<'a> {
    let ddp = DdpRepr { last, version: DDP_VERSION, rsvd_ulp: 0, buffer };
    MessageRepr { ddp, control: Control { version: RDMAP_VERSION, opcode }, body }
}

fn tagged<'a>(opcode: Opcode, stag: u32, to: u64, last: bool, data: &'a [u8]) -> MessageRepr<'a> {
    message(opcode, DdpBuffer::Tagged { stag, to }, last, Body::Data(data))
}

fn send_segment<'a>(opcode: Opcode, msn: u32, mo: u32, inv: u32, last: bool, data: &'a [u8]) -> MessageRepr<'a> {
    message(opcode, DdpBuffer::Untagged { rsvd_ulp: inv, qn: QN_SEND, msn, mo }, last, Body::Data(data))
}

/// A device's QP with its own PD, CQ and one region.
struct Victim {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qp: QueuePair,
}

fn victim(ctx: Context, mr_len: usize) -> Victim {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256);
    let mr = ctx.reg_mr(&pd, mr_len, Access::ALL).unwrap();
    let qp = ctx.create_qp(&pd, &cq, &cq, QpType::Rc, QpCaps::default(), None).unwrap();
    Victim { ctx, pd, cq, mr, qp }
}

/// The attacker connects to `listener` and the device accepts onto `qp` with IRD `ird`.
fn attack(listener: &Listener, qp: &QueuePair, ird: u16) -> Wire {
    attack_from(listener, qp, ird, TcpStream::connect)
}

/// A TCP connection whose receive buffer is a few KiB from the start, so that a peer
/// that does not read closes its window at once, whatever the system's autotuning does.
fn connect_small_window(to: SocketAddr) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = to else { panic!("IPv4") };
    // SAFETY: a fresh socket, owned by the TcpStream it becomes; every pointer passed
    // points at a live local of the size given.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let size: libc::c_int = 4096;
        let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, (&size as *const libc::c_int).cast(), len);
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = v4.port().to_be();
        sa.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
        let sa_len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let s = TcpStream::from_raw_fd(fd);
        if libc::connect(fd, (&sa as *const libc::sockaddr_in).cast(), sa_len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

fn attack_from(
    listener: &Listener,
    qp: &QueuePair,
    ird: u16,
    connect: fn(SocketAddr) -> std::io::Result<TcpStream>,
) -> Wire {
    let to = listener.local_addr();
    std::thread::scope(|scope| {
        let h = scope.spawn(move || {
            let s = connect(to).unwrap();
            Wire::handshake(s, Setup::initiator(attacker_policy(ird, ird, Vec::new()), 0)).0
        });
        let req = listener.get_request(T).expect("the attacker's request");
        req.accept(qp, &param(b"", ird)).expect("accepted");
        h.join().unwrap()
    })
}

/// A peer that streams zeros for two seconds (after a valid Request, or from the first
/// byte); returns what it got to write.
fn stream_zeros(to: SocketAddr, request: Vec<u8>, after_request: bool) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let Ok(mut s) = TcpStream::connect(to) else { return 0 };
        // The device stops reading a peer it has turned down: a write then blocks.
        s.set_write_timeout(Some(Duration::from_millis(500))).unwrap();
        if after_request && s.write_all(&request).is_err() {
            return 0;
        }
        let (chunk, mut sent, start) = (vec![0u8; 64 * 1024], 0, Instant::now());
        while start.elapsed() < Duration::from_secs(2) {
            match s.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        sent
    })
}

/// 2,000 handshakes held open, from four threads: half a valid Request and silence, half
/// ten bytes of one and silence.
fn hold_handshakes(to: SocketAddr, request: &[u8]) -> Vec<TcpStream> {
    std::thread::scope(|scope| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                scope.spawn(move || {
                    let held = (0..500).filter_map(|i| {
                        let mut s = TcpStream::connect(to).ok()?;
                        let n = if (t + i) % 2 == 0 { request.len() } else { 10 };
                        let _ = s.write_all(&request[..n]);
                        Some(s)
                    });
                    held.collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// The client connects with private data "legit" while the application turns down every
/// other request it is handed.
fn connect_among_attackers(listener: &Listener, server: &Victim, client: &Victim) -> Vec<u8> {
    std::thread::scope(|scope| {
        let h = scope.spawn(|| client.qp.connect(listener.local_addr(), &param(b"legit", 4), T));
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            let Some(req) = listener.get_request(Duration::from_millis(200)) else { continue };
            if req.private_data == b"legit" {
                req.accept(&server.qp, &param(b"welcome", 4)).expect("accepted");
                break;
            }
            req.reject(b"no");
        }
        h.join().unwrap().expect("the legitimate connection")
    })
}

/// A 256 KiB Write from `client` into `server`'s region and a Read of it back.
fn write_and_read_back(client: &Victim, server: &Victim) {
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i * 13) as u8).collect();
    client.mr.write(0, &data);
    let at = Remote { addr: server.mr.addr(), rkey: server.mr.rkey() };
    client.qp.post_send(SendWr::new(1, SendOp::Write(at), vec![client.mr.sge(0, data.len() as u32)])).unwrap();
    client.qp.post_send(SendWr::new(2, SendOp::Read(at), vec![client.mr.sge(512 * 1024, data.len() as u32)])).unwrap();
    for id in [1, 2] {
        let wc = client.cq.wait(T).expect("a completion");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    let mut back = vec![0u8; data.len()];
    client.mr.read(512 * 1024, &mut back);
    assert!(back == data, "the Read brought back what the Write put");
}

#[test]
fn held_handshakes_and_zero_streams_leave_a_real_connection_working() {
    let _serial = serial();
    let server = victim(open(|c| c.iwarp.mpa_timeout_ms = 3_000), 1 << 20);
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = listener.local_addr();
    let rss_before = rss_kib();
    let request = Setup::initiator(attacker_policy(1, 1, Vec::new()), 0).take_output();
    let streamers = [stream_zeros(to, request.clone(), true), stream_zeros(to, request.clone(), false)];
    let held = hold_handshakes(to, &request);
    assert!(held.len() >= 1_900, "{} attacker connections made", held.len());
    let streamed: Vec<usize> = streamers.into_iter().map(|h| h.join().unwrap()).collect();

    // A legitimate client, while the attackers still hold their sockets.
    let client = victim(open(|_| {}), 1 << 20);
    assert_eq!(connect_among_attackers(&listener, &server, &client), b"welcome");
    write_and_read_back(&client, &server);

    let grown = peak_rss_kib().saturating_sub(rss_before);
    let conns = server.ctx.stats().iwarp_connections;
    eprintln!(
        "2,000 held handshakes, zero streams of {streamed:?} bytes: peak RSS +{grown} KiB, {conns} server connections"
    );
    assert!(grown < 48 * 1024, "peak RSS grew by {grown} KiB");
    let bound = MAX_HALF_OPEN_PER_LISTENER + MAX_HELD_REQUESTS_PER_LISTENER + 2;
    assert!(conns as usize <= bound, "{conns} connections held by the server");
    drop(held);
}

#[test]
fn ird_bounds_reads_and_the_output_they_make() {
    let _serial = serial();
    let server = victim(open(|_| {}), 16 << 20);
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut w = attack(&listener, &server.qp, 2);
    let rr = ReadRequestRepr {
        sink_stag: 0x99,
        sink_to: 0,
        size: 16 << 20,
        src_stag: server.mr.rkey(),
        src_to: server.mr.addr(),
    };
    let before = rss_kib();
    // Two 16 MiB Reads, as IRD 2 allows, from a peer that never reads back.
    w.read_requests(rr, 2);
    std::thread::sleep(Duration::from_millis(500));
    let grown = peak_rss_kib().saturating_sub(before);
    eprintln!("two unread 16 MiB Read Requests: peak RSS +{grown} KiB");
    assert!(grown < 12 * 1024, "peak RSS grew by {grown} KiB for 32 MiB of unread Read Responses");
    assert_eq!(server.qp.state(), Some(QpState::Rts));
    drop(w);
    // Three at once are one beyond IRD: Terminate, RDMAP remote operation error,
    // catastrophic to the stream (RFC 5040 §5.3; siw's answer to an IRQ overflow).
    let server = victim(open(|_| {}), 16 << 20);
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut w = attack(&listener, &server.qp, 2);
    w.read_requests(ReadRequestRepr { src_stag: server.mr.rkey(), src_to: server.mr.addr(), ..rr }, 3);
    assert_eq!(w.terminate(), (Layer::Rdmap, 2, 7));
    assert_eq!(server.qp.state(), Some(QpState::Err));

    // A server that negotiated IRD 0 serves no Read at all.
    let zero = victim(open(|_| {}), 4096);
    let listener = zero.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut w = attack(&listener, &zero.qp, 0);
    w.read_request(ReadRequestRepr { size: 64, src_stag: zero.mr.rkey(), src_to: zero.mr.addr(), ..rr });
    let first = w.next_ulpdu().expect("an answer");
    let m = MessageRepr::parse(&first).unwrap();
    let Body::Terminate(t) = m.body else { panic!("a Read Response from an IRD 0 server: {m:?}") };
    assert_eq!((t.layer, t.etype, t.ecode), (Layer::Rdmap, 2, 7));
}

/// The device connects to the attacker, which answers MPA as responder (in peer-to-peer
/// mode, which the device offers here).
fn attacked_initiator() -> (Victim, MemoryRegion, Wire) {
    let client = victim(open(|c| c.iwarp.offer_rtr = true), 64 * 1024);
    let other = client.ctx.reg_mr(&client.pd, 4096, Access::ALL).unwrap();
    other.write(0, &[0xee; 4096]);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let to: SocketAddr = l.local_addr().unwrap();
    let wire = std::thread::scope(|scope| {
        let h = scope.spawn(|| client.qp.connect(to, &param(b"", 4), T));
        let (s, _) = l.accept().unwrap();
        let (mut wire, neg) = Wire::handshake(s, Setup::responder(attacker_policy(4, 4, vec![RtrKind::Write]), 0));
        h.join().unwrap().expect("connected");
        assert_eq!(neg.rtr, Some(RtrKind::Write));
        let rtr = wire.next_ulpdu().expect("the initiator's RTR");
        assert!(matches!(MessageRepr::parse(&rtr).unwrap().body, Body::Data(d) if d.is_empty()));
        wire
    });
    (client, other, wire)
}

/// The device's Read Request, as the attacker reads it.
fn next_read_request(w: &mut Wire) -> ReadRequestRepr {
    let u = w.next_ulpdu().expect("a Read Request");
    match MessageRepr::parse(&u).unwrap().body {
        Body::ReadRequest(rr) => rr,
        other => panic!("not a Read Request: {other:?}"),
    }
}

#[test]
fn a_read_response_must_belong_to_its_read() {
    let _serial = serial();
    // Aimed at another region of the PD that allows local writes: nothing lands there.
    let (client, other, mut w) = attacked_initiator();
    let src = Remote { addr: 0x1000, rkey: 0x5555 };
    client.qp.post_send(SendWr::new(1, SendOp::Read(src), vec![client.mr.sge(0, 8192)])).unwrap();
    let rr = next_read_request(&mut w);
    assert_eq!((rr.sink_stag, rr.size), (client.mr.lkey(), 8192));
    w.send(&tagged(Opcode::ReadResponse, other.lkey(), other.addr(), true, &[0x11; 64]));
    assert_eq!(w.terminate(), (Layer::Ddp, 1, 0), "invalid STag");
    let wc = client.cq.wait(T).expect("the Read completes");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemOpErr));
    assert_eq!(other.mem().to_vec(), vec![0xee; 4096], "the other region is untouched");

    // The right STag, but the response ends early: the Read fails, it does not succeed
    // with bytes never written.
    let (client, _other, mut w) = attacked_initiator();
    client.qp.post_send(SendWr::new(2, SendOp::Read(src), vec![client.mr.sge(0, 8192)])).unwrap();
    let rr = next_read_request(&mut w);
    w.send(&tagged(Opcode::ReadResponse, rr.sink_stag, rr.sink_to, true, &[0x22; 100]));
    assert_eq!(w.terminate(), (Layer::Ddp, 1, 1), "base or bounds");
    let wc = client.cq.wait(T).expect("the Read completes");
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RemOpErr));
}

#[test]
fn send_with_invalidate_needs_the_pd_and_the_right() {
    let _serial = serial();
    let server = victim(open(|_| {}), 4096);
    let pd2 = server.ctx.alloc_pd();
    let foreign = server.ctx.reg_mr(&pd2, 4096, Access::ALL).unwrap();
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    server.qp.post_recv(RecvWr { wr_id: 5, sgl: vec![server.mr.sge(0, 64)] }).unwrap();
    let mut w = attack(&listener, &server.qp, 1);
    w.send(&send_segment(Opcode::SendInvalidate, 1, 0, foreign.rkey(), true, b"bye key"));
    assert_eq!(w.terminate(), (Layer::Rdmap, 2, 9), "STag cannot be invalidated");
    let wc = server.cq.wait(T).expect("the receive completes");
    assert_eq!((wc.wr_id, wc.status, wc.invalidated_rkey), (5, WcStatus::RemInvReqErr, None));

    // The key still works for a QP of its own PD.
    let cq2 = server.ctx.create_cq(16);
    let qp2 = server.ctx.create_qp(&pd2, &cq2, &cq2, QpType::Rc, QpCaps::default(), None).unwrap();
    let mut w2 = attack(&listener, &qp2, 1);
    w2.send(&tagged(Opcode::Write, foreign.rkey(), foreign.addr(), true, b"still valid"));
    let deadline = Instant::now() + T;
    while foreign.mem().to_vec()[..11] != b"still valid"[..] {
        assert!(Instant::now() < deadline, "the Write never landed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn zero_length_and_out_of_order_segments_are_checked() {
    let _serial = serial();
    // A zero-length Write names a buffer like any other: a bad STag terminates.
    let server = victim(open(|_| {}), 4096);
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut w = attack(&listener, &server.qp, 1);
    w.send(&tagged(Opcode::Write, server.mr.rkey() ^ 0x5a5a_0000, 0, true, &[]));
    assert_eq!(w.terminate(), (Layer::Ddp, 1, 0));

    // A Send whose first segment starts at MO 100 would leave 100 bytes unwritten.
    let server = victim(open(|_| {}), 4096);
    server.mr.write(0, &[0x77; 4096]);
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    server.qp.post_recv(RecvWr { wr_id: 6, sgl: vec![server.mr.sge(0, 4096)] }).unwrap();
    let mut w = attack(&listener, &server.qp, 1);
    w.send(&send_segment(Opcode::Send, 1, 100, 0, true, &[0x33; 100]));
    assert_eq!(w.terminate(), (Layer::Ddp, 2, 4), "invalid MO");
    let wc = server.cq.wait(T).expect("the receive completes");
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::WrFlushErr), "not a success with a hole in it");
    assert_eq!(server.mr.mem().to_vec(), vec![0x77; 4096], "nothing was placed");
}

/// Reads the device's MPA Reply after `bytes`; true when it is a reject.
fn reply_after(to: SocketAddr, bytes: &[u8]) -> bool {
    let mut s = TcpStream::connect(to).unwrap();
    let _ = s.write_all(bytes);
    reply_on(&mut s)
}

/// Reads the device's MPA Reply on `s`; true when it is a reject.
fn reply_on(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(T)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if let Ok(f) = MpaFramePacket::new_checked(&got[..]).and_then(|p| MpaFrameRepr::parse(&p)) {
            return f.reject;
        }
    }
    panic!("no MPA Reply: {got:?}");
}

#[test]
fn held_requests_time_out_and_early_bytes_are_capped() {
    let _serial = serial();
    let server = victim(open(|c| c.iwarp.mpa_timeout_ms = 400), 4096);
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = listener.local_addr();
    let request = Setup::initiator(attacker_policy(1, 1, Vec::new()), 0).take_output();
    // The application never answers: the device rejects at the handshake's deadline.
    let start = Instant::now();
    assert!(reply_after(to, &request), "a reject Reply");
    assert!(start.elapsed() >= Duration::from_millis(300), "not before the deadline");
    // FPDUs before the Reply, beyond the early-bytes cap: rejected at once.
    let mut flood = request.clone();
    flood.extend(std::iter::repeat_n(0u8, MAX_EARLY_BYTES + 1));
    let start = Instant::now();
    assert!(reply_after(to, &flood), "a reject Reply");
    assert!(start.elapsed() < Duration::from_millis(300), "at once, not at the deadline");
    drop(listener);
}

#[test]
fn a_terminated_connection_to_a_peer_that_never_reads_is_dropped_after_the_linger() {
    let _serial = serial();
    // A 16 MiB Read from a peer whose receive window is a few KiB and that never reads.
    let server = victim(open(|_| {}), 16 << 20);
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut w = attack_from(&listener, &server.qp, 1, connect_small_window);
    w.read_request(ReadRequestRepr {
        sink_stag: 0x99,
        sink_to: 0,
        size: 16 << 20,
        src_stag: server.mr.rkey(),
        src_to: server.mr.addr(),
    });
    std::thread::sleep(Duration::from_millis(1_000));
    // A bad STag: the device terminates, but its Terminate sits behind Read Responses the
    // peer does not read.
    w.send(&tagged(Opcode::Write, 0xdead_beef, 0, true, b"x"));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(CLOSE_LINGER_MS + 3_000);
    while server.ctx.stats().iwarp_connections > 0 {
        assert!(Instant::now() < deadline, "the connection lingers");
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(CLOSE_LINGER_MS / 2), "closed after {took:?}: the linger was not needed");
    assert_eq!(server.qp.state(), Some(QpState::Err));
    drop(listener);
}

/// Waits until the device holds `n` connections.
fn wait_connections(ctx: &Context, n: u64) {
    let deadline = Instant::now() + T;
    while ctx.stats().iwarp_connections != n {
        assert!(Instant::now() < deadline, "{} connections, not {n}", ctx.stats().iwarp_connections);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// True when the device closed `s` (end of stream or reset) within a second.
fn closed_by_device(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == ErrorKind::ConnectionReset,
    }
}

/// True when the device says nothing on `s` for 300 ms and keeps it open.
fn silent(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

#[test]
fn a_listener_evicts_its_oldest_half_open_handshake_and_rejects_beyond_its_backlog() {
    let _serial = serial();
    let server = victim(open(|_| {}), 4096);
    let listener = server.ctx.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = listener.local_addr();
    let request = Setup::initiator(attacker_policy(1, 1, Vec::new()), 0).take_output();
    // At the limit of half-open handshakes, each ten bytes into its Request.
    let mut half_open: Vec<TcpStream> = Vec::new();
    for i in 0..MAX_HALF_OPEN_PER_LISTENER {
        let mut s = TcpStream::connect(to).unwrap();
        s.write_all(&request[..10]).unwrap();
        half_open.push(s);
        wait_connections(&server.ctx, i as u64 + 1);
    }
    // One more: the oldest goes, the others stay.
    let mut newest = TcpStream::connect(to).unwrap();
    newest.write_all(&request[..10]).unwrap();
    assert!(closed_by_device(&mut half_open[0]), "the oldest half-open handshake is closed");
    assert!(silent(&mut half_open[1]), "the next oldest stays");
    wait_connections(&server.ctx, MAX_HALF_OPEN_PER_LISTENER as u64);
    drop((half_open, newest));
    wait_connections(&server.ctx, 0);

    // At the limit of held Requests (the application answers none), one more rejects the
    // oldest, and is itself held for the application.
    let mut held: Vec<TcpStream> = Vec::new();
    for i in 0..MAX_HELD_REQUESTS_PER_LISTENER {
        let mut s = TcpStream::connect(to).unwrap();
        s.write_all(&request).unwrap();
        held.push(s);
        wait_connections(&server.ctx, i as u64 + 1);
    }
    let mut newest = TcpStream::connect(to).unwrap();
    newest.write_all(&request).unwrap();
    assert!(reply_on(&mut held[0]), "the oldest held Request gets a reject Reply");
    assert!(silent(&mut held[1]), "the next oldest is still held");
    assert!(silent(&mut newest), "the newest is held");
    let req = listener.get_request(T).expect("a held request");
    req.reject(b"");
    drop((held, newest));
}
