//! Two softrdma devices on one address and UDP port, as two applications on one host share
//! it with rxe: each reaches its own QPs and its own listener, whichever socket the kernel
//! hands a flow to (src/transport/share.rs).

mod rc_pair;

use rc_pair::{every_operation, side, Side, WAIT};
use softrdma::verbs::*;
use std::net::{IpAddr, SocketAddr};

fn open_at(ip: [u8; 4], port: u16) -> Context {
    let mut cfg = OpenConfig::new(IpAddr::from(ip));
    cfg.port = port;
    Context::open(cfg).unwrap()
}

fn param() -> ConnParam {
    ConnParam { private_data: b"hello".to_vec(), responder_resources: 16, initiator_depth: 16 }
}

/// Connects `a` to `b`'s listener on `port` through the CM.
fn connect_through_cm(a: &Side, b: &Side, port: u16) {
    let listener = b.ctx.listen(SocketAddr::new(b.ctx.ip(), port)).expect("listen");
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener.get_request(WAIT).expect("the request reaches the device listening");
            assert_eq!(req.peer.map(|p| p.ip()), Some(a.ctx.ip()));
            req.accept(&b.qp, &param()).expect("accept");
        });
        a.qp.connect(listener.local_addr(), &param(), WAIT).expect("connect");
    });
}

/// The kernel hands each flow to one of the sockets by a keyed hash of its addresses, so
/// whether a round's flows reach the wrong device is chance (about two rounds in three
/// here); rounds go on, each with fresh devices and ports, until packets were handed on.
const ROUNDS_MAX: u8 = 16;

#[test]
fn two_devices_on_one_address_each_reach_their_own_qps_and_listeners() {
    let mut handed_on = 0;
    for round in 0..ROUNDS_MAX {
        handed_on += one_round(round);
        if handed_on > 0 {
            return;
        }
    }
    panic!("no packet reached the other device in {ROUNDS_MAX} rounds: the test did not test forwarding");
}

/// Two devices on one address, each with a QP connected through the CM to a peer of its
/// own, run every operation both ways; returns how many packets they handed on.
fn one_round(round: u8) -> u64 {
    let shared = [127, 45, 10 + round, 1];
    let first = open_at(shared, 0);
    let port = first.port();
    let second = open_at(shared, port);
    assert_eq!(second.port(), port, "the second device binds the same address and port");
    let (p, q) = (open_at([127, 45, 10 + round, 2], 0), open_at([127, 45, 10 + round, 3], 0));
    for peer in [&p, &q] {
        peer.set_peer_port(IpAddr::from(shared), port);
        first.set_peer_port(peer.ip(), peer.port());
        second.set_peer_port(peer.ip(), peer.port());
    }
    let (x, y) = (side(first, 4 << 20), side(second, 4 << 20));
    let (p, q) = (side(p, 4 << 20), side(q, 4 << 20));
    assert_ne!(x.qp.qp_num() >> 16, y.qp.qp_num() >> 16, "each device's QPNs carry its own tag");
    std::thread::scope(|s| {
        s.spawn(|| connect_through_cm(&p, &x, 7101));
        s.spawn(|| connect_through_cm(&q, &y, 7102));
    });
    assert_eq!((x.qp.state(), y.qp.state()), (Some(QpState::Rts), Some(QpState::Rts)));
    std::thread::scope(|s| {
        s.spawn(|| {
            every_operation(&p, &x);
            every_operation(&x, &p);
        });
        s.spawn(|| {
            every_operation(&q, &y);
            every_operation(&y, &q);
        });
    });
    let (sx, sy) = (x.ctx.stats(), y.ctx.stats());
    eprintln!(
        "round {round}: first {} out {} in, second {} out {} in",
        sx.forwarded_out, sx.forwarded_in, sy.forwarded_out, sy.forwarded_in
    );
    assert_eq!(sx.forwarded_out, sy.forwarded_in, "what one hands on, the other receives");
    assert_eq!(sy.forwarded_out, sx.forwarded_in);
    assert_eq!(sx.forward_dropped + sy.forward_dropped, 0, "the devices wait for room in each other's queues");
    sx.forwarded_out + sy.forwarded_out
}

#[test]
fn a_port_one_device_listens_on_is_refused_to_the_other() {
    const SHARED: [u8; 4] = [127, 45, 1, 1];
    let first = open_at(SHARED, 0);
    let second = open_at(SHARED, first.port());
    let at = SocketAddr::new(IpAddr::from(SHARED), 7103);
    let held = first.listen(at).expect("the first listener");
    assert!(second.listen(at).is_err(), "the port is the first device's");
    drop(held);
    second.listen(at).expect("free again once the first listener closes");
}

#[test]
fn a_device_that_does_not_share_holds_its_port_alone() {
    let mut cfg = OpenConfig::new(IpAddr::from([127, 45, 2, 1]));
    cfg.port = 0;
    cfg.share_address = false;
    let alone = Context::open(cfg.clone()).unwrap();
    cfg.port = alone.port();
    cfg.share_address = true;
    let refused = Context::open(cfg).err().expect("the port is taken");
    assert_eq!(refused.kind(), std::io::ErrorKind::AddrInUse);
}
