//! Two connected RC QPs on two devices, through the public verbs API, and every operation
//! between them with its data checked: what the loopback, raw-Ethernet and AF_XDP suites
//! share.

#![allow(dead_code)]

use softrdma::transport::raw::FrameIo;
use softrdma::verbs::*;
use std::time::Duration;

pub use softrdma::tools::netns::VethPair;

pub const WAIT: Duration = Duration::from_secs(10);

pub struct Side {
    pub ctx: Context,
    pub cq: CompletionQueue,
    pub mr: MemoryRegion,
    pub qp: QueuePair,
    pub _pd: ProtectionDomain,
}

pub fn side(ctx: Context, len: usize) -> Side {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4096);
    let mr = ctx.reg_mr(&pd, len, Access::ALL).unwrap();
    let qp = ctx.create_qp(&pd, &cq, &cq, QpType::Rc, QpCaps::default(), None).unwrap();
    Side { ctx, cq, mr, qp, _pd: pd }
}

pub fn open_in(pair: &VethPair, i: usize, cfg: OpenConfig) -> Context {
    pair.run_in(i, move || Context::open(cfg).expect("open a device"))
}

/// A raw device at `cidr` on end `i` of the pair, moving frames by `io`.
pub fn raw_cfg(pair: &VethPair, i: usize, cidr: &str, io: FrameIo) -> OpenConfig {
    let (ip, len) = RawConfig::parse_cidr(cidr).unwrap();
    let mut cfg = OpenConfig::raw(&pair.ifaces[i], ip, len);
    cfg.raw.as_mut().unwrap().frame_io = io;
    cfg.seed = Some(i as u64 + 1);
    cfg
}

pub fn connect(a: &Side, b: &Side) {
    let (ga, gb) = (a.ctx.gid(0).unwrap(), b.ctx.gid(0).unwrap());
    a.qp.connect_rc(gb, b.qp.qp_num(), 0x200, 0x100, Mtu::M1024).unwrap();
    b.qp.connect_rc(ga, a.qp.qp_num(), 0x100, 0x200, Mtu::M1024).unwrap();
}

pub fn wait_ok(cq: &CompletionQueue, wr_id: u64) -> Wc {
    let wc = cq.wait(WAIT).unwrap_or_else(|| panic!("no completion for wr {wr_id}"));
    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success), "{wc:?}");
    wc
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// SEND, SEND with immediate, a 1 MiB WRITE, WRITE with immediate, READ, fetch-and-add and
/// compare-and-swap from `a` to `b`, every byte checked (as tests/raw_netns.rs does).
pub fn every_operation(a: &Side, b: &Side) {
    let msg = pattern(3000, 1);
    a.mr.write(0, &msg);
    b.qp.post_recv(RecvWr { wr_id: 10, sgl: vec![b.mr.sge(0, 4096)] }).unwrap();
    a.qp.post_send(SendWr::new(1, SendOp::Send, vec![a.mr.sge(0, 3000)])).unwrap();
    assert_eq!(wait_ok(&b.cq, 10).byte_len, 3000);
    wait_ok(&a.cq, 1);
    let mut got = vec![0u8; 3000];
    b.mr.read(0, &mut got);
    assert_eq!(got, msg);

    b.qp.post_recv(RecvWr { wr_id: 11, sgl: vec![b.mr.sge(8192, 64)] }).unwrap();
    a.qp.post_send(SendWr::new(2, SendOp::SendImm(0xfeed_f00d), vec![a.mr.sge(0, 10)])).unwrap();
    assert_eq!(wait_ok(&b.cq, 11).imm, Some(0xfeed_f00d));
    wait_ok(&a.cq, 2);

    let big = pattern(1 << 20, 7);
    a.mr.write(1 << 20, &big);
    let at = Remote { addr: b.mr.addr() + (2 << 20), rkey: b.mr.rkey() };
    a.qp.post_send(SendWr::new(3, SendOp::Write(at), vec![a.mr.sge(1 << 20, 1 << 20)])).unwrap();
    wait_ok(&a.cq, 3);
    let mut got = vec![0u8; 1 << 20];
    b.mr.read(2 << 20, &mut got);
    assert!(got == big, "1 MiB WRITE arrived intact");

    b.qp.post_recv(RecvWr { wr_id: 12, sgl: vec![] }).unwrap();
    let at = Remote { addr: b.mr.addr() + 100, rkey: b.mr.rkey() };
    a.qp.post_send(SendWr::new(4, SendOp::WriteImm(at, 42), vec![a.mr.sge(0, 200)])).unwrap();
    assert_eq!(wait_ok(&b.cq, 12).imm, Some(42));
    wait_ok(&a.cq, 4);

    let from = Remote { addr: b.mr.addr() + (2 << 20), rkey: b.mr.rkey() };
    a.qp.post_send(SendWr::new(5, SendOp::Read(from), vec![a.mr.sge(3 << 20, 100_000)])).unwrap();
    wait_ok(&a.cq, 5);
    let mut got = vec![0u8; 100_000];
    a.mr.read(3 << 20, &mut got);
    assert_eq!(got, big[..100_000]);

    b.mr.write(64, &5u64.to_ne_bytes());
    let word = Remote { addr: b.mr.addr() + 64, rkey: b.mr.rkey() };
    a.qp.post_send(SendWr::new(6, SendOp::FetchAdd(word, 10), vec![a.mr.sge(0, 8)])).unwrap();
    wait_ok(&a.cq, 6);
    a.qp.post_send(SendWr::new(7, SendOp::CompareSwap(word, 15, 99), vec![a.mr.sge(8, 8)])).unwrap();
    wait_ok(&a.cq, 7);
    let (mut w0, mut w1, mut wb) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    a.mr.read(0, &mut w0);
    a.mr.read(8, &mut w1);
    b.mr.read(64, &mut wb);
    assert_eq!((u64::from_ne_bytes(w0), u64::from_ne_bytes(w1), u64::from_ne_bytes(wb)), (5, 15, 99));
}

/// A kernel-UDP-socket device on 10.9.0.1 (which the kernel in namespace 0 then holds) and
/// a raw device on 10.9.0.2 in namespace 1 moving frames by `io`, their QPs connected.
pub fn udp_and_raw(pair: &VethPair, io: FrameIo) -> (Side, Side) {
    pair.kernel_addr(0, "10.9.0.1/24").unwrap();
    let mut udp_cfg = OpenConfig::new("10.9.0.1".parse().unwrap());
    udp_cfg.seed = Some(9);
    let a = side(open_in(pair, 0, udp_cfg), 4 << 20);
    let b = side(open_in(pair, 1, raw_cfg(pair, 1, "10.9.0.2/24", io)), 4 << 20);
    connect(&a, &b);
    (a, b)
}

/// A UD QP on `s` in RTS with Q_Key `qkey`, and its CQ.
pub fn ud_qp(s: &Side, qkey: u32) -> (QueuePair, CompletionQueue) {
    let cq = s.ctx.create_cq(64);
    let qp = s.ctx.create_qp(&s._pd, &cq, &cq, QpType::Ud, QpCaps::default(), None).unwrap();
    let st = |state| QpAttr { state: Some(state), ..QpAttr::default() };
    qp.modify(&QpAttr { pkey: Some(0xffff), qkey: Some(qkey), ..st(QpState::Init) }).unwrap();
    qp.modify(&st(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr { sq_psn: Some(0), ..st(QpState::Rts) }).unwrap();
    (qp, cq)
}

/// Sends `text` from UD QP `qa` on `a` to multicast group `mgid`; QP `qb` on `b`, attached
/// to it (by the caller), receives it whole after its 40-byte GRH.
pub fn multicast_arrives(a: &Side, qa: &QueuePair, b: &Side, cb: &CompletionQueue, mgid: Gid, text: &[u8]) -> Wc {
    a.mr.write(0, text);
    let mut wr = SendWr::new(1, SendOp::Send, vec![a.mr.sge(0, text.len() as u32)]);
    wr.ud = Some(UdDest { gid: mgid, qpn: 0xff_ffff, qkey: RDMA_UDP_QKEY });
    qa.post_send(wr).unwrap();
    let wc = wait_ok(cb, 7);
    assert_eq!(wc.byte_len as usize, 40 + text.len());
    let mut got = vec![0u8; text.len()];
    assert!(b.mr.read(40, &mut got) && got == text);
    wc
}
