//! Two devices over kernel UDP on loopback addresses, through the public verbs API: every
//! operation with its data checked, a peer that dies mid-transfer, and packets injected
//! from a plain UDP socket.

use softrdma::proto::roce::bth::BthRepr;
use softrdma::proto::roce::ext::RethRepr;
use softrdma::proto::roce::icrc::{self, IpHeader};
use softrdma::proto::roce::packet::pad_for;
use softrdma::proto::roce::{Psn, RoceRepr};
use softrdma::transport::udp::ip_header;
use softrdma::verbs::*;

mod rc_pair;
use rc_pair::{connect, every_operation, pattern, side, ud_qp, wait_ok, Side, WAIT};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

fn open(ip: [u8; 4]) -> Context {
    let mut cfg = OpenConfig::new(IpAddr::V4(Ipv4Addr::from(ip)));
    cfg.port = 0;
    cfg.seed = Some(u64::from(ip[3]));
    Context::open(cfg).expect("open a device on a loopback address")
}

/// Two connected RC QPs on `net`.1 and `net`.2; A sends with PSN 0x100, B with 0x200.
fn pair(net: [u8; 3], len: usize) -> (Side, Side) {
    let a = side(open([net[0], net[1], net[2], 1]), len);
    let b = side(open([net[0], net[1], net[2], 2]), len);
    a.ctx.set_peer_port(b.ctx.ip(), b.ctx.port());
    b.ctx.set_peer_port(a.ctx.ip(), a.ctx.port());
    connect(&a, &b);
    (a, b)
}

#[test]
fn every_operation_over_loopback_udp_with_data_checked() {
    let (a, b) = pair([127, 10, 1], 4 << 20);
    // SEND, SEND with immediate, a 1 MiB WRITE, WRITE with immediate, READ, atomics.
    every_operation(&a, &b);

    // SEND with invalidate of B's own rkey: B's region stops taking remote access.
    let extra = b.ctx.reg_mr(&b._pd, 4096, Access::ALL).unwrap();
    b.qp.post_recv(RecvWr { wr_id: 13, sgl: vec![b.mr.sge(0, 64)] }).unwrap();
    a.qp.post_send(SendWr::new(8, SendOp::SendInv(extra.rkey()), vec![a.mr.sge(0, 16)])).unwrap();
    assert_eq!(wait_ok(&b.cq, 13).invalidated_rkey, Some(extra.rkey()));
    wait_ok(&a.cq, 8);
    let dead = Remote { addr: extra.addr(), rkey: extra.rkey() };
    a.qp.post_send(SendWr::new(9, SendOp::Write(dead), vec![a.mr.sge(0, 16)])).unwrap();
    let wc = a.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RemAccessErr));

    let (qa, qb) = (a.qp.query().unwrap(), b.qp.query().unwrap());
    // A remote access error ends the connection on both sides.
    assert_eq!((qa.state, qb.state), (QpState::Err, QpState::Err));
    assert_eq!((qb.rq_psn + 1) & 0xff_ffff, qa.sq_psn, "B still expects the refused WRITE's PSN");
    let sa = a.ctx.stats();
    assert_eq!((sa.rx_icrc_bad, sa.tx_errors), (0, 0), "{sa:?}");
    // On loopback the devices send runs of equal-sized packets as one GSO send, whose
    // segments Linux numbers 0, 1, 2…: B's ACKs came in such runs.
    assert!(sa.rx_ipv4_ident_nonzero > 0, "{sa:?}");
    assert!(b.ctx.stats().rx_datagrams >= 1024, "a 1 MiB WRITE is 1024 packets at MTU 1024");
}

#[test]
fn a_peer_that_dies_mid_transfer_ends_every_request_with_retry_exceeded_then_flush() {
    let (a, b) = pair([127, 10, 2], 1 << 20);
    // Short timer: 4.096 µs × 2^12 = 16.8 ms, 2 retries.
    let fast = QpAttr { timeout: Some(12), retry_cnt: Some(2), ..QpAttr::default() };
    a.qp.modify(&QpAttr { state: Some(QpState::Sqd), ..QpAttr::default() }).ok();
    a.qp.modify(&QpAttr { state: Some(QpState::Rts), ..fast }).unwrap();
    let at = Remote { addr: b.mr.addr(), rkey: b.mr.rkey() };
    // 200 MiB: far more than goes by before the peer dies (12.5 MiB once all went by, on a
    // fast run, before the peer's device had finished closing).
    const N: u64 = 200;
    for i in 0..N {
        a.qp.post_send(SendWr::new(i, SendOp::Write(at), vec![a.mr.sge(0, 1 << 20)])).unwrap();
    }
    let mut seen = vec![wait_ok(&a.cq, 0)];
    drop(b); // the peer's device goes away mid-transfer: its socket closes, nothing answers
    let start = Instant::now();
    while let Some(wc) = a.cq.wait(Duration::from_secs(5)) {
        seen.push(wc);
        if seen.len() as u64 == N {
            break;
        }
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    let ids: Vec<u64> = seen.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..N).collect::<Vec<_>>(), "one completion per request, in order");
    // Whatever completed before the peer died succeeded; the first to fail ran out of
    // retries; everything after it was flushed.
    let first_bad = seen.iter().position(|w| w.status != WcStatus::Success).expect("a failure");
    assert_eq!(seen[first_bad].status, WcStatus::RetryExcErr, "{seen:?}");
    assert!(seen[first_bad + 1..].iter().all(|w| w.status == WcStatus::WrFlushErr), "{seen:?}");
    assert_eq!(a.qp.state(), Some(QpState::Err));
    assert!(a.cq.wait(Duration::from_millis(200)).is_none(), "no completion twice");
}

/// A device whose context has gone hears nothing more, even when a call on what outlives
/// the context (its MR, deregistered as the peer's application exits) comes after
/// packets queued: the requester sees the peer silent (retries exceeded), never a NAK
/// from a peer that has already gone.
#[test]
fn a_device_whose_context_went_answers_nothing_after() {
    let (a, b) = pair([127, 10, 8], 4096);
    let fast = QpAttr { timeout: Some(12), retry_cnt: Some(2), ..QpAttr::default() };
    a.qp.modify(&QpAttr { state: Some(QpState::Sqd), ..QpAttr::default() }).ok();
    a.qp.modify(&QpAttr { state: Some(QpState::Rts), ..fast }).unwrap();
    let at = Remote { addr: b.mr.addr(), rkey: b.mr.rkey() };
    let Side { ctx, mr, qp, cq, _pd } = b;
    drop(ctx);
    a.qp.post_send(SendWr::new(7, SendOp::Write(at), vec![a.mr.sge(0, 64)])).unwrap();
    // Past the stale-socket threshold (1 ms): a call on the device would read the socket.
    std::thread::sleep(Duration::from_millis(5));
    drop(mr);
    drop((qp, cq, _pd));
    let wc = a.cq.wait(Duration::from_secs(5)).expect("a completion");
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RetryExcErr));
}

/// A hand-made packet to `qpn`, with its ICRC as a sender at `src:sport` computes it.
fn forge(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, r: &RoceRepr<'_>) -> Vec<u8> {
    forge_with_ident(src, sport, dst, dport, 0, r)
}

/// As [`forge`], for a datagram with IPv4 Identification `ident`.
fn forge_with_ident(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, ident: u16, r: &RoceRepr<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; r.buffer_len()];
    r.emit(&mut buf).unwrap();
    let mut udp = [0u8; 8];
    udp[0..2].copy_from_slice(&sport.to_be_bytes());
    udp[2..4].copy_from_slice(&dport.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + buf.len()) as u16).to_be_bytes());
    let (ip, _) = ip_header(src.into(), dst.into(), 8 + buf.len(), ident, true, 0);
    icrc::fill(IpHeader::V4(&ip[..20]), &udp, &mut buf).unwrap();
    buf
}

fn write_only(qpn: u32, psn: u32, reth: RethRepr, payload: &[u8]) -> RoceRepr<'_> {
    let bth = BthRepr {
        opcode: 0x0a, // RC RDMA WRITE Only
        solicited: false,
        mig_req: true,
        pad_count: pad_for(payload.len()),
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: qpn,
        ack_req: true,
        psn: Psn::new(psn),
    };
    RoceRepr { reth: Some(reth), ..RoceRepr::bare(bth, payload) }
}

#[test]
fn injected_packets_are_dropped_or_naked_and_counted_while_real_traffic_carries_on() {
    let (a, b) = pair([127, 10, 3], 1 << 20);
    // A second connection whose responder the injector will upset.
    let b2 = b.ctx.create_qp(&b._pd, &b.cq, &b.cq, QpType::Rc, QpCaps::default(), None).unwrap();
    let a_ip = Ipv4Addr::new(127, 10, 3, 1);
    let b_ip = Ipv4Addr::new(127, 10, 3, 2);
    b2.connect_rc(a.ctx.gid(0).unwrap(), 0x77, 0x500, 0x600, Mtu::M1024).unwrap();
    let inj = UdpSocket::bind((a_ip, 0)).unwrap();
    let sport = inj.local_addr().unwrap().port();
    let to = (b_ip, b.ctx.port());
    let reth = |rkey| RethRepr { va: b.mr.addr(), rkey, dma_len: 8 };

    // Real traffic runs while the injector sends.
    let at = Remote { addr: b.mr.addr() + 4096, rkey: b.mr.rkey() };
    let data = pattern(256 << 10, 3);
    a.mr.write(0, &data);
    for i in 0..8 {
        a.qp.post_send(SendWr::new(i, SendOp::Write(at), vec![a.mr.sge(0, 256 << 10)])).unwrap();
    }
    let before = b.ctx.stats();
    inj.send_to(b"garbage, not a RoCEv2 packet at all", to).unwrap();
    inj.send_to(&[0u8; 5], to).unwrap();
    let mut bad_icrc =
        forge(a_ip, sport, b_ip, to.1, &write_only(b.qp.qp_num(), 0x100, reth(b.mr.rkey()), b"XXXXXXXX"));
    let n = bad_icrc.len();
    bad_icrc[n - 1] ^= 0xff;
    inj.send_to(&bad_icrc, to).unwrap();
    inj.send_to(&forge(a_ip, sport, b_ip, to.1, &write_only(0xabcdef, 0, reth(b.mr.rkey()), b"XXXXXXXX")), to).unwrap();
    // A stale PSN (before A's first) is a duplicate: re-ACKed, never executed.
    let stale =
        write_only(b.qp.qp_num(), 0x100 - 10, RethRepr { va: b.mr.addr(), rkey: b.mr.rkey(), dma_len: 8 }, b"STALE!!!");
    inj.send_to(&forge(a_ip, sport, b_ip, to.1, &stale), to).unwrap();
    // A wrong rkey on the second connection: remote access NAK, that QP to ERR.
    inj.send_to(&forge(a_ip, sport, b_ip, to.1, &write_only(b2.qp_num(), 0x500, reth(0x0bad_0bad), b"XXXXXXXX")), to)
        .unwrap();

    for i in 0..8 {
        wait_ok(&a.cq, i);
    }
    let mut got = vec![0u8; 256 << 10];
    b.mr.read(4096, &mut got);
    assert!(got == data, "the real WRITEs arrived intact");
    let mut first = [0u8; 8];
    b.mr.read(0, &mut first);
    assert_eq!(first, [0u8; 8], "no injected payload was written");

    let deadline = Instant::now() + WAIT;
    let after = loop {
        let s = b.ctx.stats();
        if s.engine.naks_sent > before.engine.naks_sent || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(after.rx_runt - before.rx_runt, 1, "{after:?}");
    assert_eq!(after.rx_icrc_bad - before.rx_icrc_bad, 2, "garbage and the flipped ICRC: {after:?}");
    assert_eq!(after.engine.rx_unknown_qp - before.engine.rx_unknown_qp, 1, "{after:?}");
    assert_eq!(after.engine.duplicates_received - before.engine.duplicates_received, 1, "{after:?}");
    assert_eq!(after.engine.naks_sent - before.engine.naks_sent, 1, "{after:?}");
    assert_eq!(b2.state(), Some(QpState::Err));
    assert_eq!(b.qp.state(), Some(QpState::Rts));
}

#[test]
fn ipv6_devices_exchange_sends_writes_and_reads_with_full_icrc_checks() {
    if UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback on this machine: the IPv6 test cannot run here");
        return;
    }
    let open6 = || {
        let mut cfg = OpenConfig::new(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST));
        cfg.port = 0;
        Context::open(cfg).expect("open a device on ::1")
    };
    let (a, b) = (side(open6(), 1 << 20), side(open6(), 1 << 20));
    a.ctx.set_peer_port(b.ctx.ip(), b.ctx.port());
    b.ctx.set_peer_port(a.ctx.ip(), a.ctx.port());
    let g = a.ctx.gid(0).unwrap();
    assert_eq!(g, std::net::Ipv6Addr::LOCALHOST.octets(), "an IPv6 GID, not IPv4-mapped");
    a.qp.connect_rc(g, b.qp.qp_num(), 7, 9, Mtu::M4096).unwrap();
    b.qp.connect_rc(g, a.qp.qp_num(), 9, 7, Mtu::M4096).unwrap();
    let data = pattern(100_000, 9);
    a.mr.write(0, &data);
    b.qp.post_recv(RecvWr { wr_id: 1, sgl: vec![b.mr.sge(0, 100_000)] }).unwrap();
    a.qp.post_send(SendWr::new(1, SendOp::Send, vec![a.mr.sge(0, 100_000)])).unwrap();
    assert_eq!(wait_ok(&b.cq, 1).byte_len, 100_000);
    wait_ok(&a.cq, 1);
    let at = Remote { addr: b.mr.addr() + 200_000, rkey: b.mr.rkey() };
    a.qp.post_send(SendWr::new(2, SendOp::Write(at), vec![a.mr.sge(0, 100_000)])).unwrap();
    wait_ok(&a.cq, 2);
    a.qp.post_send(SendWr::new(3, SendOp::Read(at), vec![a.mr.sge(500_000, 100_000)])).unwrap();
    wait_ok(&a.cq, 3);
    let mut got = vec![0u8; 100_000];
    for (mr, off) in [(&b.mr, 0), (&b.mr, 200_000), (&a.mr, 500_000)] {
        mr.read(off, &mut got);
        assert!(got == data, "data at {off}");
    }
    assert_eq!(a.ctx.stats().rx_icrc_bad + b.ctx.stats().rx_icrc_bad, 0);
}

/// CPU time the calling thread has used.
#[allow(unsafe_code)]
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which outlives the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn a_busy_poller_with_nothing_arriving_sleeps_and_wakes_for_a_write() {
    let (a, b) = pair([127, 10, 5], 4096);
    let mut busy = b.ctx.busy_poll();
    let (started, cpu_before) = (Instant::now(), thread_cpu_time());
    assert!(!busy.until(|| false, Duration::from_millis(200)), "nothing can make it true");
    let (wall, cpu) = (started.elapsed(), thread_cpu_time() - cpu_before);
    assert!(wall >= Duration::from_millis(200), "{wall:?}");
    assert!(cpu < wall / 4, "an idle busy-poller waits in poll(2): {cpu:?} of CPU in {wall:?}");

    // A's WRITE arrives while B waits, and B's wait takes it in (the poll thread leaves
    // B's socket to the busy-poller).
    a.mr.write(0, &pattern(8, 7));
    let at = Remote { addr: b.mr.addr(), rkey: b.mr.rkey() };
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            a.qp.post_send(SendWr::new(1, SendOp::Write(at), vec![a.mr.sge(0, 8)])).unwrap();
        });
        let mut got = [0u8; 8];
        let landed = busy.until(|| b.mr.read(0, &mut got) && got[..] == pattern(8, 7)[..], WAIT);
        assert!(landed, "the WRITE landed in B's region within {WAIT:?}");
    });
    drop(busy);
    wait_ok(&a.cq, 1);
}

/// Both sides of a WRITE ping-pong busy-poll: the poll threads leave the sockets to them
/// and sleep towards their timers. (A sleep's deadline that had passed while the busy
/// poller held the socket once woke a poll thread again and again, every few
/// microseconds, on a CPU the spinning threads wanted.)
#[test]
fn the_poll_threads_sleep_while_both_sides_of_a_ping_pong_busy_poll() {
    const ROUNDS: u32 = 2000;
    let (a, b) = pair([127, 10, 6], 4096);
    // A Local ACK Timeout of about 4 ms (4.096 µs × 2^10): the requesters' timers come due
    // in a run, each a moment the poll thread wakes for.
    for s in [&a, &b] {
        s.qp.modify(&QpAttr { timeout: Some(10), ..QpAttr::default() }).unwrap();
    }
    let wakeups = |s: &Side| s.ctx.stats().poll_thread_wakeups;
    let before = (wakeups(&a), wakeups(&b));
    let started = Instant::now();
    std::thread::scope(|s| {
        for (me, peer, first) in [(&a, &b, true), (&b, &a, false)] {
            s.spawn(move || ping_pong(me, peer, first, ROUNDS));
        }
    });
    let woke = (wakeups(&a) - before.0, wakeups(&b) - before.1);
    // A wake-up or two each time a timer comes due (every 4 ms at the soonest, as the
    // timer is set again from the next post), and the sections' starts and ends.
    let ms = started.elapsed().as_millis() as u64;
    assert!(woke.0 + woke.1 <= 2 * ms + 20, "the poll threads woke {woke:?} times in {ms} ms");
}

/// A busy poller holds the ACK of a request that came alone for its own next request (a
/// ping-pong's ACK and WRITE leave together), but a look that finds a stream sends its
/// ACKs at once: a caller that only receives would otherwise hold them until a look found
/// the socket empty, while its sender waited.
#[test]
fn a_busy_poller_holds_a_lone_requests_ack_and_sends_a_streams_at_once() {
    let (a, b) = pair([127, 10, 8], 64 << 10);
    // B's second QP, whose peer is a plain UDP socket: what reaches B is exactly what it sends.
    let b2 = b.ctx.create_qp(&b._pd, &b.cq, &b.cq, QpType::Rc, QpCaps::default(), None).unwrap();
    b2.connect_rc(a.ctx.gid(0).unwrap(), 0x77, 0x500, 0x600, Mtu::M1024).unwrap();
    let (a_ip, b_ip) = (Ipv4Addr::new(127, 10, 8, 1), Ipv4Addr::new(127, 10, 8, 2));
    let inj = UdpSocket::bind((a_ip, 0)).unwrap();
    let (sport, to) = (inj.local_addr().unwrap().port(), (b_ip, b.ctx.port()));
    let reth = RethRepr { va: b.mr.addr(), rkey: b.mr.rkey(), dma_len: 8 };
    let packet = |psn: u32, ident: u16| {
        forge_with_ident(a_ip, sport, b_ip, to.1, ident, &write_only(b2.qp_num(), psn, reth, b"12345678"))
    };
    let sent = || b.ctx.stats().tx_datagrams;
    let woken = b.ctx.stats().poll_thread_wakeups;
    let busy = b.ctx.busy_poll();
    // Entering the section wakes B's poll thread once, which reads the socket if it is
    // free; from then on it sleeps, with no timer to wake it, and the looks are B's own.
    let deadline = Instant::now() + WAIT;
    while b.ctx.stats().poll_thread_wakeups == woken && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    // Looks on B's thread until one finds something; the datagrams it found.
    let look = || {
        let deadline = Instant::now() + WAIT;
        loop {
            match b.ctx.progress() {
                0 if Instant::now() < deadline => std::thread::yield_now(),
                n => return n,
            }
        }
    };
    let before = sent();
    inj.send_to(&packet(0x500, 0), to).unwrap();
    assert_eq!(look(), 1);
    assert_eq!(sent(), before, "the lone WRITE's ACK waits for B's next post or empty look");
    assert_eq!(b.ctx.progress(), 0);
    assert_eq!(sent(), before + 1, "a look that found nothing sent it");
    // Eight more in one GSO send (UDP_SEGMENT), which B's GRO socket reads as one buffer.
    let eight: Vec<u8> = (0..8u16).flat_map(|k| packet(0x501 + u32::from(k), k)).collect();
    let segment = packet(0x500, 0).len() as libc::c_int;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&inj);
    // SAFETY: setsockopt on a live socket with a pointer to an int and its size.
    let rc = unsafe {
        libc::setsockopt(fd, libc::SOL_UDP, 103 /* UDP_SEGMENT */, (&raw const segment).cast(), 4)
    };
    assert_eq!(rc, 0, "UDP_SEGMENT on the injector");
    inj.send_to(&eight, to).unwrap();
    assert_eq!(look(), 8);
    assert_eq!(sent(), before + 2, "the look that found eight sent their ACK with it");
    drop(busy);
    assert_eq!(b2.query().unwrap().rq_psn, 0x509, "every WRITE was taken in order");
}

/// A READ target serving on its own thread (`Context::serve_while`) receives and answers
/// the READs there, not on its poll thread. When the serving thread is kept off the CPU
/// (the other tests of this file, on two cores), the poll thread answers meanwhile, as it
/// should; so of up to three runs of 2,000 READs, one must see the poll thread take fewer
/// than 1 % of them (it took 45-361 in the runs where the serving thread was starved).
#[test]
fn a_read_target_serving_on_its_thread_answers_without_its_poll_thread() {
    const READS: u64 = 2000;
    let (a, b) = pair([127, 10, 7], 4096);
    for s in [&a, &b] {
        s.qp.modify(&QpAttr { timeout: Some(10), ..QpAttr::default() }).unwrap();
    }
    b.mr.write(0, &pattern(64, 3));
    let mut taken = Vec::new();
    while taken.len() < 3 && taken.iter().all(|&n| n >= READS / 100) {
        let done = std::sync::atomic::AtomicBool::new(false);
        let before = b.ctx.stats().poll_thread_packets;
        std::thread::scope(|s| {
            s.spawn(|| b.ctx.serve_while(|| !done.load(std::sync::atomic::Ordering::Acquire)));
            let from = Remote { addr: b.mr.addr(), rkey: b.mr.rkey() };
            let mut busy = a.ctx.busy_poll();
            for n in 1..=READS {
                a.qp.post_send(SendWr::new(n, SendOp::Read(from), vec![a.mr.sge(0, 64)])).unwrap();
                assert_eq!(busy.next_completion(&a.cq, WAIT).map(|w| w.status), Some(WcStatus::Success), "READ {n}");
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut got = [0u8; 64];
        assert!(a.mr.read(0, &mut got) && got[..] == pattern(64, 3)[..]);
        taken.push(b.ctx.stats().poll_thread_packets - before);
    }
    assert!(
        taken.iter().any(|&n| n < READS / 100),
        "B's poll thread received {taken:?} of {READS} READs in each run ({:?})",
        b.ctx.stats()
    );
}

/// `rounds` WRITEs of a 4-byte count each way (one word of the region, so it lands whole),
/// `me` writing first if `first`, each side busy-polling for the peer's count and for its
/// own completion.
fn ping_pong(me: &Side, peer: &Side, first: bool, rounds: u32) {
    let at = Remote { addr: peer.mr.addr() + 8, rkey: peer.mr.rkey() };
    let mut busy = me.ctx.busy_poll();
    let mut got = [0u8; 4];
    let mut arrived = |want: u32| me.mr.read(8, &mut got) && u32::from_le_bytes(got) == want;
    for n in 1..=rounds {
        let want = if first { n - 1 } else { n };
        assert!(want == 0 || busy.until(|| arrived(want), WAIT), "round {n}");
        me.mr.write(0, &n.to_le_bytes());
        me.qp.post_send(SendWr::new(u64::from(n), SendOp::Write(at), vec![me.mr.sge(0, 4)])).unwrap();
        let status = busy.next_completion(&me.cq, WAIT).map(|w| w.status);
        assert_eq!(status, Some(WcStatus::Success), "completion {n}");
    }
    assert!(!first || busy.until(|| arrived(rounds), WAIT), "last round");
}

/// Binds window `mw` (whose key is `key` now) over `len` bytes of `b`'s region at
/// `offset` for remote WRITE and READ, with a work request on `b`'s QP; the new key.
fn bind_window(b: &Side, key: u32, offset: usize, len: u64, wr_id: u64) -> u32 {
    let new_key = (key & !0xff) | (key.wrapping_add(1) & 0xff);
    let access = Access { remote_write: true, remote_read: true, ..Access::default() };
    let addr = b.mr.addr() + offset as u64;
    let bind = MwBind { mw_key: key, new_key, mr_lkey: b.mr.lkey(), addr, len, access };
    b.qp.post_send(SendWr::new(wr_id, SendOp::BindMw(bind), vec![])).unwrap();
    assert_eq!(wait_ok(&b.cq, wr_id).opcode, WcOpcode::BindMw);
    new_key
}

/// WRITE `data` from `a` at `addr` under `rkey`; the completion's status.
fn write_through(a: &Side, rkey: u32, addr: u64, data: &[u8], wr_id: u64) -> WcStatus {
    a.mr.write(0, data);
    let at = Remote { addr, rkey };
    a.qp.post_send(SendWr::new(wr_id, SendOp::Write(at), vec![a.mr.sge(0, data.len() as u32)])).unwrap();
    let wc = a.cq.wait(WAIT).expect("a WRITE completion");
    assert_eq!(wc.wr_id, wr_id);
    wc.status
}

// IBTA 10.6.7: a window opens part of a region under a key of its own; WRITEs and READs
// through it land in the region, outside it they are refused; a type 1 window rebound
// with length 0 opens nothing.
#[test]
fn a_type_1_memory_window_opens_its_range_and_closes_on_a_zero_length_bind() {
    let (a, b) = pair([127, 10, 7], 1 << 16);
    let mw = b.ctx.alloc_mw(&b._pd, MwType::One).unwrap();
    let key = bind_window(&b, mw.key(), 4096, 256, 1);
    let base = b.mr.addr() + 4096;
    let msg = pattern(256, 5);
    assert_eq!(write_through(&a, key, base, &msg, 2), WcStatus::Success);
    let mut got = vec![0u8; 256];
    b.mr.read(4096, &mut got);
    assert_eq!(got, msg);
    a.qp.post_send(SendWr::new(3, SendOp::Read(Remote { addr: base + 128, rkey: key }), vec![a.mr.sge(1024, 128)]))
        .unwrap();
    wait_ok(&a.cq, 3);
    a.mr.read(1024, &mut got[..128]);
    assert_eq!(got[..128], msg[128..]);
    // The region's bytes before the window are not the window's.
    assert_eq!(write_through(&a, key, base - 8, &msg[..16], 4), WcStatus::RemAccessErr);
    let _ = b.cq.wait(Duration::from_millis(100));
    drop(mw);
    let (a, b) = pair([127, 10, 8], 1 << 16);
    let mw = b.ctx.alloc_mw(&b._pd, MwType::One).unwrap();
    let key = bind_window(&b, mw.key(), 0, 64, 1);
    let closed = bind_window(&b, key, 0, 0, 2);
    assert_eq!(write_through(&a, closed, b.mr.addr(), &msg[..8], 3), WcStatus::RemAccessErr);
}

// IBTA 10.6.7.2.3-4: a type 2 window serves the peer of the QP that bound it, until that
// QP invalidates it locally or the peer invalidates it with SEND_WITH_INVALIDATE.
#[test]
fn a_type_2_memory_window_is_invalidated_locally_or_by_the_peer() {
    let (a, b) = pair([127, 10, 9], 1 << 16);
    let mw = b.ctx.alloc_mw(&b._pd, MwType::Two).unwrap();
    let key = bind_window(&b, mw.key(), 0, 4096, 1);
    assert_eq!(write_through(&a, key, b.mr.addr(), &pattern(64, 1), 2), WcStatus::Success);
    // The peer invalidates it with the SEND that tells of the end of its use.
    b.qp.post_recv(RecvWr { wr_id: 3, sgl: vec![b.mr.sge(8192, 64)] }).unwrap();
    a.qp.post_send(SendWr::new(4, SendOp::SendInv(key), vec![a.mr.sge(0, 8)])).unwrap();
    assert_eq!(wait_ok(&b.cq, 3).invalidated_rkey, Some(key));
    wait_ok(&a.cq, 4);
    // Bound again (allowed only once invalidated), then invalidated locally.
    let again = bind_window(&b, key, 0, 4096, 5);
    assert_eq!(write_through(&a, again, b.mr.addr(), &pattern(64, 2), 6), WcStatus::Success);
    b.qp.post_send(SendWr::new(7, SendOp::LocalInv(again), vec![])).unwrap();
    assert_eq!(wait_ok(&b.cq, 7).opcode, WcOpcode::LocalInv);
    assert_eq!(write_through(&a, again, b.mr.addr(), &pattern(64, 3), 8), WcStatus::RemAccessErr);
}

// A bind the region does not allow completes with a bind error (and, as any failed work
// request, takes the QP to ERR).
#[test]
fn a_bind_over_a_region_without_the_bind_right_fails() {
    let (_a, b) = pair([127, 10, 11], 1 << 16);
    let plain = b.ctx.reg_mr(&b._pd, 4096, Access { local_write: true, ..Access::default() }).unwrap();
    let mw = b.ctx.alloc_mw(&b._pd, MwType::One).unwrap();
    let bind = MwBind {
        mw_key: mw.key(),
        new_key: mw.key() ^ 1,
        mr_lkey: plain.lkey(),
        addr: plain.addr(),
        len: 64,
        access: Access { remote_read: true, ..Access::default() },
    };
    b.qp.post_send(SendWr::new(1, SendOp::BindMw(bind), vec![])).unwrap();
    let wc = b.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::MwBindErr, WcOpcode::BindMw));
}

// The QP error handler hears of a QP that a refused request took to ERR, once, on each
// side (the requester's on the NAK, the responder's on its refusal).
#[test]
fn the_qp_error_handler_hears_of_each_qp_entering_err_once() {
    use std::sync::{Arc, Mutex};
    let (a, b) = pair([127, 10, 12], 1 << 16);
    let heard: [Arc<Mutex<Vec<u32>>>; 2] = Default::default();
    for (s, h) in [(&a, &heard[0]), (&b, &heard[1])] {
        let h = h.clone();
        assert!(s.ctx.set_qp_error_handler(Box::new(move |q| h.lock().unwrap().push(q))));
    }
    let bad = Remote { addr: b.mr.addr(), rkey: b.mr.rkey() ^ 0x80 };
    assert_eq!(write_through(&a, bad.rkey, bad.addr, &[1; 8], 1), WcStatus::RemAccessErr);
    let start = Instant::now();
    while heard[1].lock().unwrap().is_empty() && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Moving an errored QP to ERR again is no new error.
    a.qp.modify(&QpAttr { state: Some(QpState::Err), ..QpAttr::default() }).unwrap();
    assert_eq!(*heard[0].lock().unwrap(), vec![a.qp.qp_num()]);
    assert_eq!(*heard[1].lock().unwrap(), vec![b.qp.qp_num()]);
}

// rdma_cm's UD port space (IBTA 12.11 SIDR): the requester learns the listener's UD QP
// and Q_Key, and a datagram sent with them arrives; a port nobody listens on is refused.
#[test]
fn a_ud_resolution_finds_the_listeners_qp_and_a_datagram_follows() {
    let (a, b) = pair([127, 10, 13], 1 << 16);
    let (qa, _ca) = ud_qp(&a, RDMA_UDP_QKEY);
    let (qb, cb) = ud_qp(&b, RDMA_UDP_QKEY);
    let listener = b.ctx.listen_ud("0.0.0.0:7471".parse().unwrap()).unwrap();
    let to = SocketAddr::new(b.ctx.ip(), 7471);
    let peer = std::thread::scope(|s| {
        let h = s.spawn(|| a.ctx.resolve_ud(to, b"who is there", WAIT));
        let r = listener.get_request(WAIT).expect("a request");
        assert_eq!(&r.private_data[..12], b"who is there");
        assert_eq!(r.peer.map(|p| p.ip()), Some(a.ctx.ip()));
        r.accept(&qb, RDMA_UDP_QKEY, b"here").unwrap();
        h.join().unwrap().expect("resolved")
    });
    assert_eq!((peer.qpn, peer.qkey, &peer.private_data[..4]), (qb.qp_num(), RDMA_UDP_QKEY, &b"here"[..]));
    // 40 bytes of room for the GRH a UD receive starts with (IBTA 11.4.1.2).
    qb.post_recv(RecvWr { wr_id: 1, sgl: vec![b.mr.sge(0, 40 + 64)] }).unwrap();
    a.mr.write(0, b"datagram");
    let mut wr = SendWr::new(2, SendOp::Send, vec![a.mr.sge(0, 8)]);
    wr.ud = Some(UdDest { gid: peer.gid, qpn: peer.qpn, qkey: peer.qkey });
    qa.post_send(wr).unwrap();
    assert_eq!(wait_ok(&cb, 1).byte_len, 40 + 8);
    let mut got = [0u8; 8];
    b.mr.read(40, &mut got);
    assert_eq!(&got, b"datagram");
    let nobody = SocketAddr::new(b.ctx.ip(), 7472);
    assert!(matches!(a.ctx.resolve_ud(nobody, b"", WAIT), Err(ConnectError::NoListener(_))));
}

/// IBTA 10.5, 9.8.1: a UD datagram to DestQP 0xFFFFFF at a multicast group's address
/// reaches every QP attached to the group, each its own copy; a detached QP gets none,
/// nor does one whose Q_Key differs (C10-15); a unicast datagram to DestQP 0xFFFFFF
/// reaches no QP.
#[test]
fn a_multicast_datagram_reaches_each_attached_qp_once() {
    let (a, b) = pair([127, 10, 14], 1 << 16);
    let group = IpAddr::V4(Ipv4Addr::new(239, 10, 14, 1));
    let mgid = softrdma::transport::headers::ip_to_gid(group);
    // The group's datagrams go to B's port (each test device has its own).
    a.ctx.set_peer_port(group, b.ctx.port());
    let (qa, _ca) = ud_qp(&a, RDMA_UDP_QKEY);
    let members: Vec<_> = (0..2).map(|_| ud_qp(&b, RDMA_UDP_QKEY)).collect();
    let (other, other_cq) = ud_qp(&b, 0x1111);
    for (i, (qp, _)) in members.iter().enumerate() {
        qp.attach_mcast(mgid).unwrap();
        qp.post_recv(RecvWr { wr_id: 10 + i as u64, sgl: vec![b.mr.sge(i * 256, 40 + 64)] }).unwrap();
    }
    other.attach_mcast(mgid).unwrap();
    other.post_recv(RecvWr { wr_id: 20, sgl: vec![b.mr.sge(1024, 40 + 64)] }).unwrap();
    let send = |wr_id: u64, text: &[u8], gid| {
        a.mr.write(0, text);
        let mut wr = SendWr::new(wr_id, SendOp::Send, vec![a.mr.sge(0, text.len() as u32)]);
        wr.ud = Some(UdDest { gid, qpn: 0xff_ffff, qkey: RDMA_UDP_QKEY });
        qa.post_send(wr).unwrap();
    };
    send(1, b"to the group", mgid);
    for (i, (_, cq)) in members.iter().enumerate() {
        assert_eq!(wait_ok(cq, 10 + i as u64).byte_len, 40 + 12);
        let mut got = [0u8; 12];
        assert!(b.mr.read(i * 256 + 40, &mut got) && &got == b"to the group");
    }
    // Detached, the first member gets nothing more; the second gets the next datagram.
    members[0].0.detach_mcast(mgid).unwrap();
    assert_eq!(members[0].0.detach_mcast(mgid), Err(VerbsError::NotFound));
    for (i, (qp, _)) in members.iter().enumerate() {
        qp.post_recv(RecvWr { wr_id: 30 + i as u64, sgl: vec![b.mr.sge(i * 256, 40 + 64)] }).unwrap();
    }
    send(2, b"second", mgid);
    send(3, b"unicast", b.ctx.gid(0).unwrap());
    assert_eq!(wait_ok(&members[1].1, 31).byte_len, 40 + 6);
    std::thread::sleep(Duration::from_millis(100));
    assert!(members[0].1.poll(1).is_empty(), "detached");
    assert!(members[1].1.poll(1).is_empty(), "the unicast datagram to 0xFFFFFF reached no QP");
    assert!(other_cq.poll(1).is_empty(), "another Q_Key");
    assert!(b.ctx.stats().engine.qkey_violations >= 2);
    // A UD QP only (IBTA 10.5), and a multicast group only.
    let unicast = b.ctx.gid(0).unwrap();
    assert_eq!(members[1].0.attach_mcast(unicast), Err(VerbsError::InvalidAttribute("gid")));
    assert_eq!(b.qp.attach_mcast(mgid), Err(VerbsError::InvalidRequest));
}

/// An anonymous mapping of `pages` pages. Taking pages away makes them inaccessible
/// (PROT_NONE) rather than unmapping them: tests run on several threads, and an address
/// given back could be mapped again by another at once.
struct Pages {
    addr: usize,
    len: usize,
}

impl Pages {
    #[allow(unsafe_code)]
    fn map(pages: usize) -> Pages {
        let len = pages * 4096;
        // SAFETY: a fresh private anonymous mapping, owned here.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Pages { addr: p as usize, len }
    }
    /// Takes away `n` pages from byte `at`: nothing readable or writable is there after.
    #[allow(unsafe_code)]
    fn take_away(&self, at: usize, n: usize) {
        // SAFETY: pages of this mapping; nothing here keeps a reference into them.
        let r = unsafe { libc::mprotect((self.addr + at) as *mut libc::c_void, n * 4096, libc::PROT_NONE) };
        assert_eq!(r, 0);
    }
}

impl Drop for Pages {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: this mapping, unmapped once; nothing here keeps a reference into it.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

// On-demand paging (rdma-core's IBV_ACCESS_ON_DEMAND): an implicit region names the whole
// address space; a peer's WRITE or atomic where nothing is mapped is refused with a remote
// access NAK, never a fault in the engine; one where memory is mapped lands. An explicit
// region whose pages the application takes away fails its local reads with a protection
// error.
#[test]
fn on_demand_regions_place_where_memory_is_and_refuse_where_it_is_not() {
    let (a, b) = pair([127, 10, 11], 1 << 16);
    let all = b.ctx.reg_on_demand_mr(&b._pd, 0, usize::MAX, 0, Access::ALL).unwrap();
    let pages = Pages::map(2);
    let msg = pattern(6000, 3);
    assert_eq!(write_through(&a, all.rkey(), pages.addr as u64 + 100, &msg, 1), WcStatus::Success);
    let mut got = vec![0u8; 6000];
    assert!(all.read(pages.addr + 100, &mut got));
    assert_eq!(got, msg, "the WRITE crossed a page boundary into the application's memory");
    let word = Remote { addr: pages.addr as u64 + 8192 - 8, rkey: all.rkey() };
    a.qp.post_send(SendWr::new(2, SendOp::FetchAdd(word, 5), vec![a.mr.sge(0, 8)])).unwrap();
    wait_ok(&a.cq, 2);
    a.qp.post_send(SendWr::new(3, SendOp::CompareSwap(word, 5, 7), vec![a.mr.sge(8, 8)])).unwrap();
    wait_ok(&a.cq, 3);
    let mut old = [0u8; 16];
    a.mr.read(0, &mut old);
    assert_eq!(
        (u64::from_le_bytes(old[..8].try_into().unwrap()), u64::from_le_bytes(old[8..].try_into().unwrap())),
        (0, 5)
    );
    assert!(all.read(pages.addr + 8192 - 8, &mut old[..8]) && u64::from_ne_bytes(old[..8].try_into().unwrap()) == 7);
    // Page zero is never mapped: refused, and the engine is still standing.
    assert_eq!(write_through(&a, all.rkey(), 4096, &msg[..64], 4), WcStatus::RemAccessErr);
    assert!(b.ctx.stats().rx_datagrams > 0);

    let (a, b) = pair([127, 10, 12], 1 << 16);
    let pages = Pages::map(1);
    let mr = b.ctx.reg_on_demand_mr(&b._pd, pages.addr, pages.len, pages.addr as u64, Access::ALL).unwrap();
    let sge = Sge { addr: pages.addr as u64, length: 4096, lkey: mr.lkey() };
    b.ctx.prefetch(&b._pd, sge, true).expect("mapped pages prefetch");
    pages.take_away(0, 1);
    assert_eq!(b.ctx.prefetch(&b._pd, sge, false), Err(PrefetchError::NotMapped));
    b.qp.post_send(SendWr::new(5, SendOp::Write(Remote { addr: a.mr.addr(), rkey: a.mr.rkey() }), vec![sge])).unwrap();
    let wc = b.cq.wait(WAIT).expect("a completion");
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocProtErr), "the region's memory is gone");

    // A READ whose second response packet's page is gone: the first is answered, then a
    // Remote Access Error NAK at the second's PSN ends the READ.
    let (a, b) = pair([127, 10, 13], 1 << 16);
    let all = b.ctx.reg_on_demand_mr(&b._pd, 0, usize::MAX, 0, Access::ALL).unwrap();
    let pages = Pages::map(2);
    assert!(all.write(pages.addr, &msg[..4096]));
    pages.take_away(4096, 1);
    let at = Remote { addr: pages.addr as u64, rkey: all.rkey() };
    a.qp.post_send(SendWr::new(6, SendOp::Read(at), vec![a.mr.sge(0, 8192)])).unwrap();
    let wc = a.cq.wait(WAIT).expect("a READ completion");
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::RemAccessErr));
    a.mr.read(0, &mut got[..4096]);
    assert_eq!(got[..4096], msg[..4096], "the first response was placed");
    assert_eq!(b.ctx.stats().engine.naks_sent, 1, "{:?}", b.ctx.stats());
}

// C9-88: a zero-length WRITE names no memory, so its R_Key and VA go unchecked; with
// immediate data it still consumes a receive (rsockets' credit messages are such WRITEs,
// with key 0). A non-zero length under the same key is refused.
#[test]
fn a_zero_length_write_with_immediate_needs_no_key() {
    let (a, b) = pair([127, 10, 9], 4096);
    b.qp.post_recv(RecvWr { wr_id: 21, sgl: vec![] }).unwrap();
    let nowhere = Remote { addr: 0, rkey: 0 };
    a.qp.post_send(SendWr::new(5, SendOp::WriteImm(nowhere, 0xA000_0180), vec![])).unwrap();
    assert_eq!(wait_ok(&a.cq, 5).status, WcStatus::Success);
    let wc = wait_ok(&b.cq, 21);
    assert_eq!((wc.opcode, wc.imm, wc.byte_len), (WcOpcode::RecvRdmaWithImm, Some(0xA000_0180), 0));
    assert_eq!(write_through(&a, 0, 0, b"x", 6), WcStatus::RemAccessErr, "one byte does need a key");
}
