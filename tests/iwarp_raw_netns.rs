//! iWARP on smoltcp's TCP over raw Ethernet, between network namespaces joined by a veth
//! pair: against iWARP on the kernel's TCP both ways, and smoltcp to smoltcp, every
//! operation with its data checked. Needs root; each test makes and removes its own
//! namespaces.

mod netns;

use netns::{pair_or_skip, VethPair};
use softrdma::verbs::*;
use std::net::SocketAddr;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

struct Side {
    ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qp: QueuePair,
}

fn side(ctx: Context) -> Side {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256);
    let mr = ctx.reg_mr(&pd, 4 << 20, Access::ALL).unwrap();
    let qp = ctx.create_qp(&pd, &cq, &cq, QpType::Rc, QpCaps::default(), None).unwrap();
    Side { ctx, _pd: pd, cq, mr, qp }
}

/// A raw (smoltcp) iWARP device at `cidr` in namespace `i`.
fn raw(pair: &VethPair, i: usize, cidr: &str) -> Side {
    let (ip, len) = RawConfig::parse_cidr(cidr).unwrap();
    let mut cfg = OpenConfig::raw(&pair.ifaces[i], ip, len);
    cfg.transport = Transport::Iwarp;
    side(pair.run_in(i, move || Context::open(cfg).expect("a raw iWARP device")))
}

/// A kernel-TCP iWARP device on `ip`, which the kernel in namespace `i` holds.
fn kernel(pair: &VethPair, i: usize, ip: &str) -> Side {
    let mut cfg = OpenConfig::new(ip.parse().unwrap());
    cfg.transport = Transport::Iwarp;
    side(pair.run_in(i, move || Context::open(cfg).expect("a kernel iWARP device")))
}

fn param(pd: &[u8]) -> ConnParam {
    ConnParam { private_data: pd.to_vec(), responder_resources: 4, initiator_depth: 4 }
}

/// `client` (in namespace `ci`) connects to a listener of `server` (in namespace `si`)
/// at `at` (port 0: any). Kernel sockets live in the namespace of the thread that opens
/// them, so listening and connecting happen there.
fn connect(pair: &VethPair, server: (&Side, usize), client: (&Side, usize), at: SocketAddr) {
    let (server, si) = server;
    let (client, ci) = client;
    let listener = pair.scoped_in(si, || server.ctx.listen(at).expect("listen"));
    let to = SocketAddr::new(server.ctx.ip(), listener.local_addr().port());
    std::thread::scope(|scope| {
        let h = scope.spawn(|| pair.scoped_in(ci, || client.qp.connect(to, &param(b"client hello"), T)));
        let req = listener.get_request(T).expect("a request");
        assert_eq!(req.private_data, b"client hello");
        req.accept(&server.qp, &param(b"server hello")).expect("accepted");
        assert_eq!(h.join().unwrap().expect("connected"), b"server hello");
    });
}

fn wait(cq: &CompletionQueue) -> Wc {
    let wc = cq.wait(T).expect("a completion");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    wc
}

/// Send, a 1 MiB Write and a Read of it back, from `a` to `b`, data checked.
fn every_operation(a: &Side, b: &Side) {
    let msg: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
    a.mr.write(0, &msg);
    b.qp.post_recv(RecvWr { wr_id: 100, sgl: vec![b.mr.sge(0, 4096)] }).unwrap();
    a.qp.post_send(SendWr::new(1, SendOp::Send, vec![a.mr.sge(0, 4000)])).unwrap();
    assert_eq!((wait(&a.cq).wr_id, wait(&b.cq).byte_len), (1, 4000));
    let mut got = vec![0u8; 4000];
    b.mr.read(0, &mut got);
    assert_eq!(got, msg);

    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i ^ (i >> 8)) as u8).collect();
    a.mr.write(1 << 20, &big);
    let remote = Remote { addr: b.mr.addr() + (2 << 20), rkey: b.mr.rkey() };
    a.qp.post_send(SendWr::new(2, SendOp::Write(remote), vec![a.mr.sge(1 << 20, 1 << 20)])).unwrap();
    a.qp.post_send(SendWr::new(3, SendOp::Read(remote), vec![a.mr.sge(3 << 20, 1 << 20)])).unwrap();
    assert_eq!((wait(&a.cq).wr_id, wait(&a.cq).wr_id), (2, 3));
    let mut back = vec![0u8; 1 << 20];
    a.mr.read(3 << 20, &mut back);
    assert!(back == big, "the Read returns what the Write placed");
}

#[test]
fn smoltcp_iwarp_connects_to_kernel_tcp_iwarp_and_runs_every_operation() {
    let Some(pair) = pair_or_skip("iwarp smoltcp to kernel") else { return };
    pair.kernel_addr(0, "10.9.0.1/24").unwrap();
    let k = kernel(&pair, 0, "10.9.0.1");
    let r = raw(&pair, 1, "10.9.0.2/24");
    connect(&pair, (&k, 0), (&r, 1), "10.9.0.1:0".parse().unwrap());
    every_operation(&r, &k);
    every_operation(&k, &r);
}

#[test]
fn kernel_tcp_iwarp_connects_to_smoltcp_iwarp_and_runs_every_operation() {
    let Some(pair) = pair_or_skip("iwarp kernel to smoltcp") else { return };
    pair.kernel_addr(0, "10.9.0.1/24").unwrap();
    let k = kernel(&pair, 0, "10.9.0.1");
    let r = raw(&pair, 1, "10.9.0.2/24");
    connect(&pair, (&r, 1), (&k, 0), "0.0.0.0:0".parse().unwrap());
    every_operation(&k, &r);
    every_operation(&r, &k);
}

#[test]
fn smoltcp_iwarp_to_smoltcp_iwarp() {
    let Some(pair) = pair_or_skip("iwarp smoltcp to smoltcp") else { return };
    let a = raw(&pair, 0, "10.9.0.1/24");
    let b = raw(&pair, 1, "10.9.0.2/24");
    connect(&pair, (&a, 0), (&b, 1), "10.9.0.1:4000".parse().unwrap());
    every_operation(&b, &a);
    every_operation(&a, &b);
}

#[test]
fn a_refused_connection_leaves_the_qp_free_to_connect_again() {
    let Some(pair) = pair_or_skip("iwarp refused then connected") else { return };
    pair.kernel_addr(0, "10.9.0.1/24").unwrap();
    let k = kernel(&pair, 0, "10.9.0.1");
    let r = raw(&pair, 1, "10.9.0.2/24");
    // Nobody listens yet: the kernel answers the SYN with a RST.
    let refused = r.qp.connect("10.9.0.1:4999".parse().unwrap(), &param(b"early"), T);
    assert!(matches!(refused, Err(ConnectError::Refused(_))), "{refused:?}");
    assert_eq!(r.qp.state(), Some(QpState::Init), "the QP never had a stream");
    connect(&pair, (&k, 0), (&r, 1), "10.9.0.1:4999".parse().unwrap());
    every_operation(&r, &k);
}

/// SYNs from sources that never finish the handshake use the smoltcp listener's backlog
/// up for a while only: half-open sockets are dropped after a few seconds, and a real
/// connection gets through.
#[test]
fn half_open_handshakes_do_not_lock_a_smoltcp_listener_out() {
    let Some(pair) = pair_or_skip("smoltcp backlog") else { return };
    pair.kernel_addr(0, "10.9.0.1/24").unwrap();
    let k = kernel(&pair, 0, "10.9.0.1");
    let r = raw(&pair, 1, "10.9.0.2/24");
    let listener = r.ctx.listen("10.9.0.2:4100".parse().unwrap()).expect("listen");
    let iface = pair.ifaces[0].clone();
    let sock = pair.run_in(0, move || softrdma::transport::raw::FrameSocket::open(&iface).expect("packet socket"));
    let raw_mac = RawConfig::new("", "10.9.0.2".parse().unwrap(), 24).mac();
    for i in 0..32u8 {
        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 9, i], raw_mac)
            .ipv4([10, 9, 0, 100 + i], [10, 9, 0, 2], 64)
            .tcp(40000 + u16::from(i), 4100, 1000, 65535)
            .syn();
        let mut frame = Vec::new();
        b.write(&mut frame, &[]).unwrap();
        sock.send(&frame).unwrap();
    }
    let to: SocketAddr = "10.9.0.2:4100".parse().unwrap();
    std::thread::scope(|scope| {
        let h = scope.spawn(|| {
            pair.scoped_in(0, || {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                loop {
                    match k.qp.connect(to, &param(b"late"), T) {
                        Err(ConnectError::Tcp(_) | ConnectError::Refused(_))
                            if std::time::Instant::now() < deadline =>
                        {
                            std::thread::sleep(Duration::from_millis(200))
                        }
                        other => return other,
                    }
                }
            })
        });
        let req = listener.get_request(Duration::from_secs(25)).expect("the real request gets through");
        req.accept(&r.qp, &param(b"ok")).expect("accepted");
        assert_eq!(h.join().unwrap().expect("connected"), b"ok");
    });
}
