//! RoCEv2 on raw Ethernet (AF_PACKET) between network namespaces joined by a veth pair:
//! raw to raw over IPv4 and IPv6, raw to a kernel-UDP-socket device, ARP and echo, a
//! wrong ICRC dropped and an ECN-CE mark answered with a CNP. Needs root; each test makes
//! and removes its own namespaces.

mod netns;
mod rc_pair;

use netns::pair_or_skip;
use rc_pair::*;
use softrdma::transport::raw::frame::{self, Local, RoceFields};
use softrdma::transport::raw::gso::packet_sockets_carry_udp_gso;
use softrdma::transport::raw::FrameIo;
use softrdma::transport::raw::FrameSocket;
use softrdma::verbs::*;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A packet socket watching the frames that arrive on side `i`'s end of the veth.
fn onlooker(pair: &netns::VethPair, i: usize) -> FrameSocket {
    let iface = pair.ifaces[i].clone();
    pair.run_in(i, move || FrameSocket::open(&iface).expect("packet socket"))
}

/// Runs every operation both ways while an onlooker watches B's end: every frame it sees
/// must fit the link's MTU, and A's sends must have reached it as GSO sends it split
/// exactly where packet sockets carry them (Linux 6.2).
fn every_operation_watched(pair: &netns::VethPair, a: &Side, b: &Side, what: &str) {
    let mut onlooker = onlooker(pair, 1);
    every_operation(a, b);
    every_operation(b, a);
    let mut longest = 0;
    while let Ok(Some(f)) = onlooker.recv(Duration::from_millis(200)) {
        longest = longest.max(f.len());
    }
    assert!(longest <= 1514, "every frame fits the link's MTU: {longest} bytes");
    assert_eq!(onlooker.gso_sends_split() > 0, packet_sockets_carry_udp_gso(), "{what}");
}

#[test]
fn raw_devices_run_every_operation_over_ipv4_with_data_checked() {
    let Some(pair) = pair_or_skip("raw ipv4") else { return };
    let a = side(open_in(&pair, 0, raw_cfg(&pair, 0, "10.9.0.1/24", FrameIo::PacketSocket)), 4 << 20);
    let b = side(open_in(&pair, 1, raw_cfg(&pair, 1, "10.9.0.2/24", FrameIo::PacketSocket)), 4 << 20);
    connect(&a, &b);
    // A sends a run of its frames as one GSO send where packet sockets can split it again
    // (Linux 6.2): B's, and an onlooker's, read them as the frames a wire carries.
    every_operation_watched(&pair, &a, &b, "A's runs of frames left as GSO sends");
    let (sa, sb) = (a.ctx.stats(), b.ctx.stats());
    // A spoke first: it asked for B's MAC, B answered and learned A's from the request.
    assert!(sa.neighbour_requests >= 1 && sb.neighbour_replies >= 1, "{sa:?} {sb:?}");
    for s in [&sa, &sb] {
        assert_eq!((s.rx_icrc_bad, s.tx_errors, s.tx_unresolved), (0, 0, 0), "{s:?}");
    }
    assert!(sb.rx_datagrams >= 1024, "a 1 MiB WRITE is 1024 frames at MTU 1024");
}

#[test]
fn raw_devices_run_over_ipv6_with_neighbour_discovery() {
    let Some(pair) = pair_or_skip("raw ipv6") else { return };
    let a = side(open_in(&pair, 0, raw_cfg(&pair, 0, "fd00:9::1/64", FrameIo::PacketSocket)), 4 << 20);
    let b = side(open_in(&pair, 1, raw_cfg(&pair, 1, "fd00:9::2/64", FrameIo::PacketSocket)), 4 << 20);
    connect(&a, &b);
    every_operation(&a, &b);
    let (sa, sb) = (a.ctx.stats(), b.ctx.stats());
    assert!(sa.neighbour_requests >= 1 && sb.neighbour_replies >= 1, "{sa:?} {sb:?}");
    assert_eq!((sa.rx_icrc_bad, sb.rx_icrc_bad), (0, 0));
}

#[test]
fn a_raw_device_and_a_udp_socket_device_interoperate_and_the_kernel_resolves_and_pings_it() {
    let Some(pair) = pair_or_skip("raw to udp") else { return };
    let (a, b) = udp_and_raw(&pair, FrameIo::PacketSocket);
    // On a veth the UDP device sends GSO where packet sockets can split it (Linux 6.2):
    // the raw device's, and an onlooker's, read each send as the frames a wire carries.
    let offload = pair.run_in(0, || softrdma::transport::udp::offload_by_default(IpAddr::from([10, 9, 0, 1])));
    assert_eq!(
        offload,
        packet_sockets_carry_udp_gso(),
        "offloads on a veth exactly where packet sockets split GSO sends"
    );
    every_operation_watched(&pair, &a, &b, "the UDP device's GSO sends were split");
    // The kernel beside the UDP-socket device resolves the raw device's address and gets
    // an answer to its ping.
    let ping = std::process::Command::new("ip")
        .args(["netns", "exec", &pair.ns[0], "ping", "-c", "2", "-W", "2", "10.9.0.2"])
        .output()
        .expect("ping");
    assert!(ping.status.success(), "{}", String::from_utf8_lossy(&ping.stdout));
    let (sa, sb) = (a.ctx.stats(), b.ctx.stats());
    assert!(sb.echo_replies >= 2 && sb.neighbour_replies >= 1, "{sb:?}");
    // The UDP socket solved the raw device's own Identification from the ICRC.
    assert!(sa.rx_ipv4_ident_nonzero > 0, "{sa:?}");
    assert_eq!((sa.rx_icrc_bad, sb.rx_icrc_bad), (0, 0), "{sa:?} {sb:?}");
}

#[test]
fn a_udp_socket_device_sends_gso_over_ipv6_to_a_raw_device_which_splits_it() {
    let Some(pair) = pair_or_skip("udp to raw, ipv6") else { return };
    let added = std::process::Command::new("ip")
        .args(["-n", &pair.ns[0], "addr", "add", "fd00:9::1/64", "dev", &pair.ifaces[0], "nodad"])
        .status()
        .expect("ip");
    assert!(added.success());
    let a = side(open_in(&pair, 0, OpenConfig::new("fd00:9::1".parse().unwrap())), 4 << 20);
    let b = side(open_in(&pair, 1, raw_cfg(&pair, 1, "fd00:9::2/64", FrameIo::PacketSocket)), 4 << 20);
    connect(&a, &b);
    every_operation_watched(&pair, &a, &b, "the UDP device's GSO sends were split");
    let (sa, sb) = (a.ctx.stats(), b.ctx.stats());
    assert_eq!((sa.rx_icrc_bad, sb.rx_icrc_bad, sb.rx_runt), (0, 0, 0), "{sa:?} {sb:?}");
}

/// A SEND Only with AckReq and an 8-byte payload to `qpn` at `psn`, room for the ICRC.
fn send_only(qpn: u32, psn: u32) -> Vec<u8> {
    let q = qpn.to_be_bytes();
    let p = psn.to_be_bytes();
    let mut b = vec![0x04, 0, 0xff, 0xff, 0, q[1], q[2], q[3], 0x80, p[1], p[2], p[3]];
    b.extend_from_slice(b"forged!!");
    b.extend_from_slice(&[0; 4]);
    b
}

/// The BTH opcodes and destination QPs of the RoCEv2 frames `sock` receives for `wait`.
fn roce_seen(sock: &mut FrameSocket, wait: Duration) -> Vec<(u8, u32)> {
    let deadline = Instant::now() + wait;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(Some(f)) = sock.recv(left) else { break };
        // Ethernet, IPv4 without options, UDP to 4791, then the BTH.
        if f.len() > 54 && f[12..14] == [8, 0] && f[23] == 17 && f[36..38] == 4791u16.to_be_bytes() {
            seen.push((f[42], u32::from_be_bytes([0, f[47], f[48], f[49]])));
        }
    }
    seen
}

#[test]
fn a_wrong_icrc_is_dropped_and_an_ecn_ce_mark_brings_a_cnp() {
    let Some(pair) = pair_or_skip("icrc and ce") else { return };
    let mut cfg = raw_cfg(&pair, 1, "10.9.0.2/24", FrameIo::PacketSocket);
    cfg.cc.enabled = true;
    let b = side(open_in(&pair, 1, cfg), 4096);
    let iface = pair.ifaces[0].clone();
    let mut sock = pair.run_in(0, move || FrameSocket::open(&iface).expect("packet socket"));
    // The forger is 10.9.0.1 at a MAC of its own, QP 0x123, sending from PSN 0x100.
    let forger = Local { mac: [2, 0, 0, 0, 1, 1], ip: "10.9.0.1".parse().unwrap() };
    let gid = softrdma::transport::udp::ip_to_gid(forger.ip);
    b.qp.connect_rc(gid, 0x123, 0x100, 0x500, Mtu::M1024).unwrap();
    b.qp.post_recv(RecvWr { wr_id: 1, sgl: vec![b.mr.sge(0, 64)] }).unwrap();
    let (IpAddr::V4(f4), IpAddr::V4(b4)) = (forger.ip, b.ctx.ip()) else { unreachable!() };
    // Make B learn the forger's MAC the way a peer would: it asks for B's.
    sock.send(&frame::arp_request(&forger, f4, b4)).unwrap();
    let b_mac = RawConfig::new("", b.ctx.ip(), 24).mac();
    let forged = |tos: u8, corrupt: bool| {
        let fields = RoceFields { sport: 0xc0de, ident: 1, tos };
        let mut f = frame::roce_frame(&forger, b.ctx.ip(), fields, &send_only(b.qp.qp_num(), 0x100)).unwrap();
        frame::set_dst_mac(&mut f, b_mac);
        if corrupt {
            let n = 14 + 20 + 8 + 12 + 8 + 3;
            f[n] ^= 0x01; // the ICRC's last byte
        }
        f
    };
    sock.send(&forged(0b10, true)).unwrap();
    assert!(b.cq.wait(Duration::from_millis(300)).is_none(), "a wrong ICRC completes nothing");
    assert_eq!(b.ctx.stats().rx_icrc_bad, 1);
    sock.send(&forged(0b11, false)).unwrap();
    let wc = wait_ok(&b.cq, 1);
    assert_eq!(wc.byte_len, 8);
    let mut got = [0u8; 8];
    b.mr.read(0, &mut got);
    assert_eq!(&got, b"forged!!");
    let seen = roce_seen(&mut sock, Duration::from_millis(500));
    const CNP: u8 = 0x81;
    const ACK: u8 = 0x11;
    assert!(seen.contains(&(CNP, 0x123)), "a CNP to the marked packet's sender: {seen:x?}");
    assert!(seen.contains(&(ACK, 0x123)), "the SEND acknowledged: {seen:x?}");
    let s = b.ctx.stats();
    assert_eq!((s.engine.rx_ecn_ce, s.rx_icrc_bad), (1, 1), "{s:?}");
}

#[test]
fn the_active_mtu_follows_the_link_on_both_paths() {
    let Some(pair) = pair_or_skip("active mtu") else { return };
    pair.kernel_addr(0, "10.9.0.1/24").unwrap();
    let udp = OpenConfig::new("10.9.0.1".parse().unwrap());
    let raw = raw_cfg(&pair, 0, "10.9.0.11/24", FrameIo::PacketSocket);
    let (u, r) = (udp.clone(), raw.clone());
    assert_eq!(pair.run_in(0, move || (u.active_mtu(), r.active_mtu())), (Some(Mtu::M1024), Some(Mtu::M1024)));
    pair.mtu(9000).unwrap();
    assert_eq!(pair.run_in(0, move || (udp.active_mtu(), raw.active_mtu())), (Some(Mtu::M4096), Some(Mtu::M4096)));
    // An address no interface holds has no known link.
    let nowhere = OpenConfig::new("10.9.0.99".parse().unwrap());
    assert_eq!(pair.run_in(0, move || nowhere.active_mtu()), None);
}

/// rdma_cm on raw devices: the IB CM's MADs go through QP1 on the raw path (GSI, IBTA
/// 13.5.3), connect two QPs, and every operation runs over them; destroying one QP sends
/// a DREQ that takes the other to ERR. Over IPv4 and IPv6 (rdma_cm's header then carries
/// IPv6 addresses).
#[test]
fn raw_devices_connect_through_the_cm() {
    let Some(pair) = pair_or_skip("raw cm") else { return };
    for (one, two) in [("10.9.0.1/24", "10.9.0.2/24"), ("fd00:9::1/64", "fd00:9::2/64")] {
        let a = side(open_in(&pair, 0, raw_cfg(&pair, 0, one, FrameIo::PacketSocket)), 4 << 20);
        let b = side(open_in(&pair, 1, raw_cfg(&pair, 1, two, FrameIo::PacketSocket)), 4 << 20);
        let listener = b.ctx.listen(std::net::SocketAddr::new(b.ctx.ip(), 7174)).unwrap();
        let param = ConnParam { private_data: b"raw".to_vec(), responder_resources: 16, initiator_depth: 16 };
        std::thread::scope(|s| {
            s.spawn(|| {
                let req = listener.get_request(WAIT).expect("a request");
                assert_eq!(req.peer.map(|p| p.ip()), Some(a.ctx.ip()));
                req.accept(&b.qp, &param).expect("accept");
            });
            a.qp.connect(listener.local_addr(), &param, WAIT).expect("connect");
        });
        every_operation(&a, &b);
        let Side { qp, ctx: _keep, .. } = a;
        drop(qp);
        let deadline = Instant::now() + WAIT;
        while b.qp.state() != Some(QpState::Err) {
            assert!(Instant::now() < deadline, "{one}: the DREQ did not arrive: {:?}", b.qp.state());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A raw packet QP on a raw device, in RTS, with a region to send from and receive into.
fn raw_qp_side(pair: &VethPair, cidr: &str) -> (Context, CompletionQueue, MemoryRegion, QueuePair) {
    let ctx = open_in(pair, 1, raw_cfg(pair, 1, cidr, FrameIo::PacketSocket));
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64);
    let mr = ctx.reg_mr(&pd, 8192, Access::ALL).unwrap();
    let qp = ctx.create_qp(&pd, &cq, &cq, QpType::RawPacket, QpCaps::default(), None).unwrap();
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        qp.modify(&QpAttr { state: Some(s), ..QpAttr::default() }).unwrap();
    }
    (ctx, cq, mr, qp)
}

/// An Ethernet frame of EtherType 0x88b5 (IEEE 802 local experimental) to `dst`.
fn experimental_frame(dst: [u8; 6], fill: u8) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&[0x02, 0x42, 0, 0, 0, 7, 0x88, 0xb5]);
    f.extend(std::iter::repeat_n(fill, 50));
    f
}

#[test]
fn a_raw_packet_qp_on_a_raw_device_sends_and_receives_frames_on_the_wire() {
    use softrdma::engine::raw::{FlowKind, FlowRule, FlowSpec, Layer};
    let Some(pair) = pair_or_skip("raw packet qp") else { return };
    let (_ctx, cq, mr, qp) = raw_qp_side(&pair, "10.9.0.2/24");
    let iface = pair.ifaces[0].clone();
    let mut sock = pair.run_in(0, move || FrameSocket::open(&iface).expect("packet socket"));
    // Out: no rule of the device takes it, so it goes on the wire, whole.
    let out = experimental_frame([0x02, 0x99, 0, 0, 0, 1], 0xa5);
    mr.write(0, &out);
    qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sgl: vec![mr.sge(0, out.len() as u32)],
        signaled: true,
        solicited: false,
        ud: None,
        xrc_srqn: 0,
    })
    .unwrap();
    wait_ok(&cq, 1);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut seen = false;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match sock.recv(left) {
            Ok(Some(f)) if f == out => {
                seen = true;
                break;
            }
            Ok(Some(_)) => continue,
            _ => break,
        }
    }
    assert!(seen, "the frame reaches the other end of the link");
    // In: a rule on the EtherType takes the peer's frame.
    let mut value = vec![0u8; 16];
    value[12..14].copy_from_slice(&[0x88, 0xb5]);
    let mut mask = vec![0u8; 16];
    mask[12..14].copy_from_slice(&[0xff, 0xff]);
    let rule =
        FlowRule { kind: FlowKind::Normal, priority: 0, specs: vec![FlowSpec { layer: Layer::Eth, value, mask }] };
    qp.create_flow(rule).unwrap();
    qp.post_recv(RecvWr { wr_id: 2, sgl: vec![mr.sge(4096, 2048)] }).unwrap();
    let inbound = experimental_frame([0x02, 0x5e, 0x0a, 0x09, 0, 2], 0x3c);
    sock.send(&inbound).unwrap();
    let wc = wait_ok(&cq, 2);
    assert_eq!(wc.byte_len as usize, inbound.len());
    let mut got = vec![0u8; inbound.len()];
    mr.read(4096, &mut got);
    assert_eq!(got, inbound, "whole, as it came off the wire");
}

/// A packet-socket device sends to the group; the receiver takes its frames through a packet
/// socket, or through AF_XDP, whose program hands it RoCEv2 to any group.
#[test]
fn raw_devices_carry_multicast_to_the_group_mac_over_ipv4_and_ipv6() {
    use softrdma::transport::headers::ip_to_gid;
    let nets = [(["10.9.0.1/24", "10.9.0.2/24"], "239.9.0.1"), (["fd00:9::1/64", "fd00:9::2/64"], "ff0e::9:2")];
    for ((net, group), io) in nets.into_iter().flat_map(|n| [(n, FrameIo::PacketSocket), (n, FrameIo::Xdp)]) {
        let Some(pair) = pair_or_skip("raw multicast") else { return };
        let a = side(open_in(&pair, 0, raw_cfg(&pair, 0, net[0], FrameIo::PacketSocket)), 1 << 16);
        let b = side(open_in(&pair, 1, raw_cfg(&pair, 1, net[1], io)), 1 << 16);
        let mgid = ip_to_gid(group.parse().unwrap());
        let (qa, _ca) = ud_qp(&a, RDMA_UDP_QKEY);
        let (qb, cb) = ud_qp(&b, RDMA_UDP_QKEY);
        qb.attach_mcast(mgid).unwrap();
        qb.post_recv(RecvWr { wr_id: 7, sgl: vec![b.mr.sge(0, 40 + 64)] }).unwrap();
        let wc = multicast_arrives(&a, &qa, &b, &cb, mgid, b"to the group's MAC");
        assert_eq!(wc.src_gid, Some(a.ctx.gid(0).unwrap()), "{group} {io:?}");
        // Detached, B takes no more of the group's frames.
        qb.detach_mcast(mgid).unwrap();
        qb.post_recv(RecvWr { wr_id: 8, sgl: vec![b.mr.sge(0, 40 + 64)] }).unwrap();
        let mut wr = SendWr::new(2, SendOp::Send, vec![a.mr.sge(0, 8)]);
        wr.ud = Some(UdDest { gid: mgid, qpn: 0xff_ffff, qkey: RDMA_UDP_QKEY });
        qa.post_send(wr).unwrap();
        assert!(cb.wait(Duration::from_millis(300)).is_none(), "{group} {io:?}: detached");
        assert_eq!(b.ctx.stats().rx_icrc_bad, 0);
    }
}
