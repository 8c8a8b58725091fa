//! rdma_cm's connection calls on RoCEv2 (IB CM through QP1, IBTA vol. 1 ch. 12) between two
//! devices on loopback, through the public verbs API: the same calls as on iWARP.

mod rc_pair;

use rc_pair::{every_operation, side, Side, WAIT};
use softrdma::verbs::*;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

fn open(ip: [u8; 4]) -> Context {
    let mut cfg = OpenConfig::new(IpAddr::from(ip));
    cfg.port = 0;
    Context::open(cfg).unwrap()
}

fn pair(a: [u8; 4], b: [u8; 4]) -> (Side, Side) {
    let (ca, cb) = (open(a), open(b));
    ca.set_peer_port(cb.ip(), cb.port());
    cb.set_peer_port(ca.ip(), ca.port());
    (side(ca, 4 << 20), side(cb, 4 << 20))
}

fn param(pd: &[u8]) -> ConnParam {
    ConnParam { private_data: pd.to_vec(), responder_resources: 16, initiator_depth: 16 }
}

/// Connects `a` to a listener on `b`, accepting with `accept_pd`; returns what each side
/// received as private data.
fn connect_through_cm(a: &Side, b: &Side, port: u16) -> (Vec<u8>, Vec<u8>) {
    let listener = b.ctx.listen(SocketAddr::new(b.ctx.ip(), port)).unwrap();
    let to = listener.local_addr();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let req = listener.get_request(WAIT).expect("a connection request");
            let got = req.private_data.clone();
            assert_eq!(req.peer.map(|p| p.ip()), Some(a.ctx.ip()));
            assert_eq!((req.responder_resources, req.initiator_depth), (16, 16));
            req.accept(&b.qp, &param(b"from the responder")).expect("accept");
            got
        });
        let reply = a.qp.connect(to, &param(b"from the initiator"), WAIT).expect("connect");
        (reply, server.join().unwrap())
    })
}

#[test]
fn connect_and_accept_bring_both_qps_to_rts_and_carry_private_data() {
    let (a, b) = pair([127, 41, 0, 1], [127, 41, 0, 2]);
    let (reply, request) = connect_through_cm(&a, &b, 7174);
    // Private data has a fixed size on the wire: the bytes given, then zeros.
    assert_eq!(&request[..18], b"from the initiator");
    assert_eq!(request.len(), 56);
    assert!(request[18..].iter().all(|&x| x == 0));
    assert_eq!(&reply[..18], b"from the responder");
    assert_eq!((a.qp.state(), b.qp.state()), (Some(QpState::Rts), Some(QpState::Rts)));
    every_operation(&a, &b);
    let stats = a.ctx.stats();
    assert!(stats.engine.tx_packets > 0);
}

#[test]
fn a_port_nobody_listens_on_is_rejected_with_invalid_service_id() {
    let (a, b) = pair([127, 41, 1, 1], [127, 41, 1, 2]);
    let to = SocketAddr::new(b.ctx.ip(), 4000);
    match a.qp.connect(to, &param(b""), WAIT) {
        Err(ConnectError::NoListener(why)) => assert!(why.contains("reason 8"), "{why}"),
        other => panic!("expected a REJ, got {other:?}"),
    }
    // The QP is left in INIT, its receives posted, for another attempt.
    assert_eq!(a.qp.state(), Some(QpState::Init));
}

#[test]
fn the_application_rejects_with_consumer_reject() {
    let (a, b) = pair([127, 41, 2, 1], [127, 41, 2, 2]);
    let listener = b.ctx.listen(SocketAddr::new(b.ctx.ip(), 0)).unwrap();
    let to = listener.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| listener.get_request(WAIT).expect("a request").reject(b"go away"));
        match a.qp.connect(to, &param(b""), WAIT) {
            Err(ConnectError::Rejected { why, private_data }) => {
                assert!(why.contains("reason 28"), "{why}");
                // IBTA 12.6.7: the REJ carries the rejecting side's private data.
                assert_eq!(&private_data[..7], b"go away", "the REJ's private data");
            }
            other => panic!("expected a REJ, got {other:?}"),
        }
    });
}

#[test]
fn a_silent_peer_times_the_connect_out() {
    let a = side(open([127, 41, 3, 1]), 4096);
    // A UDP socket that reads nothing stands where the peer's port 4791 would be.
    let sink = std::net::UdpSocket::bind("127.41.3.2:0").unwrap();
    a.ctx.set_peer_port(IpAddr::from([127, 41, 3, 2]), sink.local_addr().unwrap().port());
    let to = SocketAddr::new(IpAddr::from([127, 41, 3, 2]), 7174);
    let r = a.qp.connect(to, &param(b""), Duration::from_millis(300));
    assert_eq!(r, Err(ConnectError::Timeout));
    let mut buf = [0u8; 512];
    sink.set_read_timeout(Some(WAIT)).unwrap();
    let (n, _) = sink.recv_from(&mut buf).expect("the REQ reached the peer's port");
    // BTH: UD SEND Only to QP1, then the DETH with the GSI Q_Key, then a 256-byte MAD.
    assert_eq!((buf[0], &buf[5..8]), (0x64, &[0u8, 0, 1][..]));
    assert_eq!(&buf[12..16], &0x8001_0000u32.to_be_bytes());
    assert_eq!(n, 12 + 8 + 256 + 4);
}

#[test]
fn destroying_a_connected_qp_sends_a_dreq_that_takes_the_peer_qp_to_error() {
    let (a, b) = pair([127, 41, 4, 1], [127, 41, 4, 2]);
    connect_through_cm(&a, &b, 7174);
    let Side { qp, ctx: _keep, .. } = a;
    drop(qp);
    let deadline = std::time::Instant::now() + WAIT;
    while b.qp.state() != Some(QpState::Err) {
        assert!(std::time::Instant::now() < deadline, "the peer's QP is still {:?}", b.qp.state());
        std::thread::sleep(Duration::from_millis(1));
    }
}
