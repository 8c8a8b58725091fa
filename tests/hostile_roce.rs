//! The peer is hostile, RoCEv2 side: a plain UDP socket plays an attacker against a real
//! device over loopback, sending forged packets with valid ICRCs, and each test checks the
//! answer the specification asks for, that nothing outside a permitted range changed, and
//! that memory stays bounded.

mod hostile;

use hostile::{peak_rss_kib, rss_kib, serial};
use softrdma::engine::qp::requester::bare;
use softrdma::proto::roce::bth::BthRepr;
use softrdma::proto::roce::ext::{AethRepr, IethRepr, NakCode, RethRepr, Syndrome};
use softrdma::proto::roce::icrc::{self, IpHeader};
use softrdma::proto::roce::packet::pad_for;
use softrdma::proto::roce::{Psn, RocePacket, RoceRepr};
use softrdma::transport::headers::{ip_header, ip_to_gid, udp_header};
use softrdma::verbs::*;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(5);

fn open(ip: [u8; 4], tweak: impl FnOnce(&mut OpenConfig)) -> Context {
    let mut cfg = OpenConfig::new(IpAddr::V4(Ipv4Addr::from(ip)));
    cfg.port = 0;
    tweak(&mut cfg);
    Context::open(cfg).expect("open a device on a loopback address")
}

/// A UDP socket that forges RoCEv2 packets to one device and reads what comes back.
struct Attacker {
    sock: UdpSocket,
    ip: Ipv4Addr,
    port: u16,
    dev: (Ipv4Addr, u16),
}

impl Attacker {
    /// An attacker on `ip`; the device sends its replies here.
    fn new(ctx: &Context, ip: [u8; 4]) -> Attacker {
        let ip = Ipv4Addr::from(ip);
        let sock = UdpSocket::bind((ip, 0)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let port = sock.local_addr().unwrap().port();
        ctx.set_peer_port(ip.into(), port);
        let IpAddr::V4(dev_ip) = ctx.ip() else { panic!("IPv4") };
        Attacker { sock, ip, port, dev: (dev_ip, ctx.port()) }
    }

    fn gid(&self) -> Gid {
        ip_to_gid(self.ip.into())
    }

    /// Sends `r` with an ICRC computed over the IP and UDP headers the kernel will build.
    fn send(&self, r: &RoceRepr<'_>) {
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf).unwrap();
        let udp = udp_header(self.port, self.dev.1, buf.len());
        let (ip, _) = ip_header(self.ip.into(), self.dev.0.into(), 8 + buf.len(), 0, true, 0);
        icrc::fill(IpHeader::V4(&ip[..20]), &udp, &mut buf).unwrap();
        self.sock.send_to(&buf, self.dev).unwrap();
    }

    /// Every datagram that arrives until the device has been silent for 300 ms.
    fn replies(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut quiet_since = Instant::now();
        let mut buf = vec![0u8; 9000];
        while quiet_since.elapsed() < Duration::from_millis(300) {
            if let Ok(n) = self.sock.recv(&mut buf) {
                out.push(buf[..n].to_vec());
                quiet_since = Instant::now();
            }
        }
        out
    }
}

fn bth(opcode: u8, qpn: u32, psn: u32, payload_len: usize) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: true,
        pad_count: pad_for(payload_len),
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: qpn,
        ack_req: true,
        psn: Psn::new(psn),
    }
}

fn repr(bth: BthRepr, payload: &[u8]) -> RoceRepr<'_> {
    RoceRepr { payload, ..bare(bth, None, None) }
}

/// The AETH syndromes of the ACK/NAK packets among `replies`, with their PSNs.
fn acks(replies: &[Vec<u8>]) -> Vec<(u32, Syndrome)> {
    replies
        .iter()
        .filter_map(|d| RocePacket::new_checked(&d[..]).and_then(|p| RoceRepr::parse(&p)).ok().map(|r| (r.bth, r.aeth)))
        .filter(|(b, _)| b.opcode == 0x11)
        .filter_map(|(b, a): (BthRepr, Option<AethRepr>)| a.map(|a| (b.psn.value(), a.syndrome)))
        .collect()
}

/// An RC QP in `pd` whose peer is the attacker's QP `peer_qpn`, expecting PSN `rq_psn`.
fn victim_qp(
    ctx: &Context,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    a: &Attacker,
    peer_qpn: u32,
    rq_psn: u32,
) -> QueuePair {
    let qp = ctx.create_qp(pd, cq, cq, QpType::Rc, QpCaps::default(), None).unwrap();
    qp.connect_rc(a.gid(), peer_qpn, rq_psn, 0x10, Mtu::M1024).unwrap();
    qp
}

#[test]
fn keys_qpns_and_psns_are_unpredictable() {
    let _serial = serial();
    let ctx = open([127, 20, 1, 1], |_| {});
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16);
    let mrs: Vec<MemoryRegion> = (0..64).map(|_| ctx.reg_mr(&pd, 64, Access::ALL).unwrap()).collect();
    let qpns: Vec<u32> = (0..64)
        .map(|_| ctx.create_qp(&pd, &cq, &cq, QpType::Rc, QpCaps::default(), None).unwrap())
        .map(|qp| {
            let n = qp.qp_num();
            std::mem::forget(qp);
            n
        })
        .collect();
    // No two consecutive QPNs or key indices differ by the same step (a counter, or a
    // counter times a constant, would), and every key bit varies.
    for (what, seq) in [("QPN", qpns.clone()), ("key index", mrs.iter().map(|m| m.rkey() >> 8).collect())] {
        let steps: HashSet<u32> = seq.windows(2).map(|w| w[1].wrapping_sub(w[0]) & 0xff_ffff).collect();
        assert!(steps.len() > 60, "{what}s step predictably: {seq:x?}");
    }
    let (or, and) = mrs.iter().fold((0u32, u32::MAX), |(o, a), m| (o | m.rkey(), a & m.rkey()));
    assert_eq!((or, and), (u32::MAX, 0), "every one of the 32 key bits takes both values");
    assert!(qpns.iter().all(|q| (16..0xff_ffff).contains(q)));
    let psns: HashSet<u32> = (0..64).map(|_| ctx.random_psn()).collect();
    assert!(psns.len() > 60);
    // A second device draws other keys: nothing is derived from a shared clock or counter.
    let other = open([127, 20, 1, 2], |_| {});
    let opd = other.alloc_pd();
    let theirs: HashSet<u32> = (0..64).map(|_| other.reg_mr(&opd, 64, Access::ALL).unwrap().rkey()).collect();
    assert!(mrs.iter().all(|m| !theirs.contains(&m.rkey())));
}

#[test]
fn a_cnp_from_a_stranger_changes_nothing() {
    let _serial = serial();
    let a = open([127, 20, 2, 1], |c| c.cc.enabled = true);
    let b = open([127, 20, 2, 2], |_| {});
    a.set_peer_port(b.ip(), b.port());
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(16), b.create_cq(16));
    let qa = a.create_qp(&pda, &cqa, &cqa, QpType::Rc, QpCaps::default(), None).unwrap();
    let qb = b.create_qp(&pdb, &cqb, &cqb, QpType::Rc, QpCaps::default(), None).unwrap();
    qa.connect_rc(b.gid(0).unwrap(), qb.qp_num(), 1, 1, Mtu::M1024).unwrap();
    let cnp = |from: &Attacker| {
        let mut h = bth(0x81, qa.qp_num(), 0, 16);
        h.becn = true;
        from.send(&repr(h, &[0u8; 16]));
    };
    let stranger = Attacker::new(&a, [127, 20, 2, 9]);
    let before = a.stats().engine;
    cnp(&stranger);
    let _ = stranger.replies();
    let after = a.stats().engine;
    assert_eq!(after.cnps_received, before.cnps_received, "a stranger's CNP is not acted on");
    assert_eq!(after.rx_unknown_qp, before.rx_unknown_qp + 1);
    // The same CNP from the peer's own address is taken (the check is the peer's address).
    let peer = Attacker::new(&a, [127, 20, 2, 2]);
    cnp(&peer);
    let _ = peer.replies();
    assert_eq!(a.stats().engine.cnps_received, before.cnps_received + 1);
}

#[test]
fn remote_invalidation_needs_the_qps_pd_and_the_right() {
    let _serial = serial();
    let ctx = open([127, 20, 3, 1], |_| {});
    let a = Attacker::new(&ctx, [127, 20, 3, 9]);
    let (pd1, pd2) = (ctx.alloc_pd(), ctx.alloc_pd());
    let cq = ctx.create_cq(64);
    let recv_buf = ctx.reg_mr(&pd1, 4096, Access::ALL).unwrap();
    let no_right = Access { remote_invalidate: false, ..Access::ALL };
    let own_no_right = ctx.reg_mr(&pd1, 4096, no_right).unwrap();
    let own = ctx.reg_mr(&pd1, 4096, Access::ALL).unwrap();
    let foreign = ctx.reg_mr(&pd2, 4096, Access::ALL).unwrap();
    let send_inv = |qp: &QueuePair, psn: u32, rkey: u32| {
        qp.post_recv(RecvWr { wr_id: u64::from(psn), sgl: vec![recv_buf.sge(0, 64)] }).unwrap();
        let mut r = repr(bth(0x17, qp.qp_num(), psn, 8), b"invalid!");
        r.ieth = Some(IethRepr { rkey });
        a.send(&r);
        let wc = cq.wait(WAIT).expect("a receive completion");
        (wc, acks(&a.replies()))
    };
    // Another PD's key, then this PD's key without the right: the receive completes in
    // error, the requester gets NAK Invalid Request, the QP is in ERR (rxe's class J).
    for (i, key) in [foreign.rkey(), own_no_right.rkey()].into_iter().enumerate() {
        let qp = victim_qp(&ctx, &pd1, &cq, &a, 0x4200 + i as u32, 100);
        let (wc, replies) = send_inv(&qp, 100, key);
        assert_eq!((wc.status, wc.invalidated_rkey), (WcStatus::RemInvReqErr, None), "{wc:?}");
        assert_eq!(replies, vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);
        assert_eq!(qp.state(), Some(QpState::Err));
    }
    // Both keys still work: a WRITE through a QP of their own PD lands.
    for (i, (pd, mr)) in [(&pd2, &foreign), (&pd1, &own_no_right)].into_iter().enumerate() {
        let qp = victim_qp(&ctx, pd, &cq, &a, 0x4300 + i as u32, 200);
        let mut w = repr(bth(0x0a, qp.qp_num(), 200, 4), b"kept");
        w.reth = Some(RethRepr { va: mr.addr(), rkey: mr.rkey(), dma_len: 4 });
        a.send(&w);
        assert_eq!(acks(&a.replies()), vec![(200, Syndrome::Ack { credits: 31 })]);
        let mut got = [0u8; 4];
        mr.read(0, &mut got);
        assert_eq!(&got, b"kept");
    }
    // This PD's key with the right is invalidated, and says so.
    let qp = victim_qp(&ctx, &pd1, &cq, &a, 0x4400, 300);
    let (wc, replies) = send_inv(&qp, 300, own.rkey());
    assert_eq!((wc.status, wc.invalidated_rkey, wc.byte_len), (WcStatus::Success, Some(own.rkey()), 8));
    assert_eq!(replies, vec![(300, Syndrome::Ack { credits: 31 })]);
}

#[test]
fn a_duplicate_read_never_reads_beyond_its_original() {
    let _serial = serial();
    let ctx = open([127, 20, 4, 1], |_| {});
    let a = Attacker::new(&ctx, [127, 20, 4, 9]);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16);
    let mr = ctx.reg_mr(&pd, 1 << 20, Access::ALL).unwrap();
    let qp = victim_qp(&ctx, &pd, &cq, &a, 0x4500, 500);
    let read = |psn: u32, len: u32| {
        let mut r = repr(bth(0x0c, qp.qp_num(), psn, 0), &[]);
        r.reth = Some(RethRepr { va: mr.addr(), rkey: mr.rkey(), dma_len: len });
        a.send(&r);
        a.replies().len()
    };
    assert_eq!(read(500, 100), 1, "one READ RESPONSE Only");
    // The same PSN again, now asking for 64 KiB: its responses would run past the one
    // packet the original took, into PSNs the requester never used. Dropped.
    assert_eq!(read(500, 64 << 10), 0);
    // A true duplicate is answered again, and the QP still serves new READs.
    assert_eq!(read(500, 100), 1);
    assert_eq!(read(501, 3000), 3);
    assert_eq!(qp.state(), Some(QpState::Rts));
}

#[test]
fn a_cq_holds_its_depth_and_reports_overrun() {
    let _serial = serial();
    let ctx = open([127, 20, 5, 1], |_| {});
    let a = Attacker::new(&ctx, [127, 20, 5, 9]);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4);
    let buf = ctx.reg_mr(&pd, 4096, Access::ALL).unwrap();
    let qp = victim_qp(&ctx, &pd, &cq, &a, 0x4600, 600);
    for i in 0..8u32 {
        qp.post_recv(RecvWr { wr_id: u64::from(i), sgl: vec![buf.sge(0, 64)] }).unwrap();
    }
    for i in 0..8u32 {
        a.send(&repr(bth(0x04, qp.qp_num(), 600 + i, 4), b"ping"));
    }
    let _ = a.replies();
    assert_eq!(cq.capacity(), 4);
    let got = cq.poll(100);
    assert_eq!(got.len(), 4, "a CQ of depth 4 holds four completions");
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
    assert!(cq.overrun(), "the other four overran it, and it says so");
}

#[test]
fn a_flood_of_junk_leaves_memory_bounded_and_the_device_working() {
    let _serial = serial();
    let ctx = open([127, 20, 6, 1], |_| {});
    let a = Attacker::new(&ctx, [127, 20, 6, 9]);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16);
    let mr = ctx.reg_mr(&pd, 4096, Access::ALL).unwrap();
    let qp = victim_qp(&ctx, &pd, &cq, &a, 0x4700, 700);
    let before = rss_kib();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut junk = vec![0u8; 1100];
    for i in 0..100_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for (j, b) in junk.iter_mut().enumerate() {
            *b = (x >> (j % 8 * 8)) as u8 ^ j as u8;
        }
        match i % 3 {
            // Random bytes, a valid-looking WRITE with a random key to the QP, and a SEND
            // to a random QPN: each with a valid ICRC but for the first.
            0 => drop(a.sock.send_to(&junk[..(x % 1100) as usize], a.dev)),
            1 => {
                let mut w = repr(bth(0x0a, qp.qp_num(), 700 + 1 + (x % 1000) as u32, 64), &junk[..64]);
                w.reth = Some(RethRepr { va: x, rkey: x as u32, dma_len: 64 });
                a.send(&w);
            }
            _ => a.send(&repr(bth(0x04, x as u32 & 0xff_ffff, x as u32 >> 8, 256), &junk[..256])),
        }
    }
    let _ = a.replies();
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(grown < 16 * 1024, "peak RSS grew by {grown} KiB under a junk flood");
    // The QP ignored what was ahead of its PSN (one NAK at most) and still takes a SEND.
    assert_eq!(mr.to_vec_prefix(4), vec![0u8; 4]);
    qp.post_recv(RecvWr { wr_id: 7, sgl: vec![mr.sge(0, 64)] }).unwrap();
    a.send(&repr(bth(0x04, qp.qp_num(), 700, 4), b"live"));
    let wc = cq.wait(WAIT).expect("the real SEND completes");
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (7, WcStatus::Success, 4));
}

trait Prefix {
    fn to_vec_prefix(&self, n: usize) -> Vec<u8>;
}

impl Prefix for MemoryRegion {
    fn to_vec_prefix(&self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.read(0, &mut v);
        v
    }
}
