//! Datagram rsockets (SOCK_DGRAM) on the library: messages over UD after a first one
//! over UDP, librdmacm's udpong, and strangers playing the peer: many of them, and junk
//! over UD.

mod tools;
use std::time::Duration;
use tools::{finish, text, tool_on, CProgram, Reaped};

/// Datagram rsockets over RoCEv2: a ping-pong of messages of every size up to 1,500 bytes
/// with contents and sender checked, then MSG_PEEK, rsendto without rconnect, the names,
/// EMSGSIZE and EWOULDBLOCK (`tests/c/rsocket_dgram.c`); and librdmacm's udpong sending
/// 1,000-byte messages one way, the server counting them.
#[test]
fn datagram_rsockets_carry_messages_over_ud() {
    let program = CProgram::build("rsocket_dgram");
    let (net, port) = ("127.0.101", "7621");
    let server_addr = format!("{net}.1");
    let server = Reaped::spawn(&mut tool_on(&program.exe, "rocev2", &server_addr, &["server", &server_addr, port]));
    std::thread::sleep(Duration::from_millis(300));
    let mut client = tool_on(&program.exe, "rocev2", &format!("{net}.2"), &["client", &server_addr, port, "3000"]);
    let c =
        finish(client.env("SOFTRDMA_RSOCKET_STATS", "1").spawn().expect("the client runs"), Duration::from_secs(60));
    let s = server.finish(Duration::from_secs(5));
    assert!(c.status.success() && text(&c).contains("client done"), "client:\n{}\nserver:\n{}", text(&c), text(&s));
    assert!(s.status.success() && text(&s).contains("server done"), "server:\n{}", text(&s));
    // The first message goes over UDP (the client does not know the server's QP yet), the
    // other 3,000 (2,999 pings and the last one) over UD; the server, which learns the
    // client's QP from that first message, answers all 3,001 over UD.
    let stats: Vec<Vec<u64>> = text(&c)
        .lines()
        .filter(|l| l.starts_with("softrdma rsocket"))
        .map(|l| l.split(' ').filter_map(|w| w.parse().ok()).collect())
        .collect();
    let connected = stats.last().expect("the connected socket's counts");
    assert_eq!(connected[..4], [3000, 1, 3001, 0], "sent UD, UDP; received UD, UDP: {stats:?}");
    let server = Reaped::spawn(&mut tool_on("udpong", "rocev2", &server_addr, &["-b", &server_addr, "-p", "7622"]));
    std::thread::sleep(Duration::from_millis(300));
    let args = ["-s", &server_addr, "-p", "7622", "-C", "2000", "-S", "1000"];
    let client = tool_on("udpong", "rocev2", &format!("{net}.3"), &args).spawn();
    let c = finish(client.expect("udpong runs"), Duration::from_secs(30));
    let s = server.finish(Duration::ZERO);
    assert!(c.status.success() && text(&c).contains("custom"), "udpong client:\n{}\nserver:\n{}", text(&c), text(&s));
}

/// iWARP has no UD: a datagram rsocket on an iWARP device refuses to send, as on siw.
#[test]
fn a_datagram_rsocket_on_iwarp_says_it_is_not_supported() {
    let program = CProgram::build("rsocket_dgram");
    let client = tool_on(&program.exe, "iwarp", "127.0.101.5", &["client", "127.0.101.4", "7631", "1"]).spawn();
    let c = finish(client.expect("the client runs"), Duration::from_secs(20));
    assert!(!c.status.success() && text(&c).contains("Operation not supported"), "{}", text(&c));
}

/// A peer a datagram rsocket learns from any UDP message: past `DESTS_MAX` (4,096) of them
/// the oldest are forgotten. 4,196 strangers (one port each), each answered with the
/// socket's QP, then a real client is served; the server remembers at most 4,096 peers.
#[test]
fn a_datagram_rsocket_remembers_at_most_4096_peers() {
    use std::net::UdpSocket;
    let program = CProgram::build("rsocket_dgram");
    let (net, port) = ("127.0.102", 7641u16);
    let server_addr = format!("{net}.1");
    let mut server = tool_on(&program.exe, "rocev2", &server_addr, &["server", &server_addr, &port.to_string()]);
    let server = Reaped::spawn(server.env("SOFTRDMA_RSOCKET_STATS", "1"));
    std::thread::sleep(Duration::from_millis(300));
    // librdmacm's UDP header: tag, version 4, op DATA, length 16, QPN, the QP's address
    // (nobody's: the server's answers over UD go nowhere).
    let mut msg = vec![0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0, 0, 0, 0x12, 0x34, 127, 0, 102, 9];
    msg.extend_from_slice(b"hi");
    let mut answered = 0;
    for i in 0..4196u16 {
        let s = UdpSocket::bind((format!("{net}.3").as_str(), 20000 + i)).expect("a port for the stranger");
        s.set_read_timeout(Some(Duration::from_secs(2))).expect("a timeout");
        s.send_to(&msg, (server_addr.as_str(), port)).expect("sent");
        let mut b = [0u8; 64];
        // The answer: a header alone, op CTRL (7), naming the server's QP.
        if s.recv(&mut b).is_ok_and(|n| n == 16 && b[..6] == [0x55, 0x55, 0x55, 0x55, 4, 7]) {
            answered += 1;
        }
    }
    assert_eq!(answered, 4196, "every stranger is answered");
    let mut client =
        tool_on(&program.exe, "rocev2", &format!("{net}.2"), &["client", &server_addr, &port.to_string(), "20"]);
    let c = finish(client.spawn().expect("the client runs"), Duration::from_secs(30));
    let s = server.finish(Duration::from_secs(5));
    assert!(c.status.success() && text(&c).contains("client done"), "client:\n{}\nserver:\n{}", text(&c), text(&s));
    let peers: usize = text(&s)
        .lines()
        .find_map(|l| l.strip_suffix(" peers")?.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no counts from the server:\n{}", text(&s)));
    assert!(peers <= 4096 && peers > 4000, "the server remembers {peers} peers");
}

/// A stranger that learnt a datagram rsocket's QP (from the UDP answer to its first
/// message) sends it 500 UD messages with no rsockets header, more than its receive queue
/// holds: none reaches the application (none is echoed) and none keeps a receive, since a
/// proper message after them is echoed. The stranger plays its QP on 127.0.104.3:4791.
#[test]
fn junk_over_ud_neither_reaches_a_datagram_rsocket_nor_uses_up_its_receives() {
    use softrdma::proto::roce::{RocePacket, RoceRepr};
    use std::net::UdpSocket;
    let program = CProgram::build("rsocket_dgram");
    let (server_ip, port) = ("127.0.104.1", 7661u16);
    let mut server = tool_on(&program.exe, "rocev2", server_ip, &["server", server_ip, &port.to_string()]);
    let server = Reaped::spawn(&mut server);
    std::thread::sleep(Duration::from_millis(300));
    let qp_end = UdpSocket::bind("127.0.104.3:4791").expect("the stranger's QP address");
    let sock = UdpSocket::bind("127.0.104.3:0").expect("the stranger's socket");
    for s in [&qp_end, &sock] {
        s.set_read_timeout(Some(Duration::from_millis(500))).expect("a timeout");
    }
    // UDP: tag, version 4, op DATA, length 16, QPN 0x99, the QP's address; then "hi".
    let mut hello = vec![0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0, 0, 0, 0, 0x99, 127, 0, 104, 3];
    hello.extend_from_slice(b"hi");
    sock.send_to(&hello, (server_ip, port)).expect("sent");
    let mut b = [0u8; 2048];
    let n = sock.recv(&mut b).expect("the socket's answer");
    assert!(n == 16 && b[5] == 7, "a header naming the socket's QP: {:?}", &b[..n]);
    let qpn = u32::from_be_bytes([0, b[9], b[10], b[11]]);
    let echoes = |want: usize| {
        let (mut got, mut b) = (Vec::new(), [0u8; 2048]);
        while let Ok(n) = qp_end.recv(&mut b) {
            let p = RocePacket::new_checked(&b[..n]).and_then(|p| RoceRepr::parse(&p).map(|r| r.payload.to_vec()));
            got.push(p.expect("a RoCEv2 packet"));
            if got.len() == want {
                break;
            }
        }
        got
    };
    assert!(echoes(1)[0].ends_with(b"hi"), "the first message echoed over UD");
    let local = sock.local_addr().expect("bound").port();
    for i in 0..500 {
        qp_end.send_to(&ud_send(qpn, i, &[0xee; 64]), (server_ip, 4791)).expect("sent");
    }
    // A proper message: the header naming the stranger's socket, then "ok".
    let mut ok = vec![4, 8];
    ok.extend_from_slice(&local.to_be_bytes());
    ok.extend_from_slice(&[127, 0, 104, 3]);
    ok.extend_from_slice(b"ok");
    // UD drops what comes while every receive is taken (the junk may still hold them), so
    // the proper message is sent until its echo comes; a receive the junk kept for good
    // would leave none after 500.
    let mut after = Vec::new();
    for psn in 500..520 {
        qp_end.send_to(&ud_send(qpn, psn, &ok), (server_ip, 4791)).expect("sent");
        after = echoes(1);
        if !after.is_empty() {
            break;
        }
    }
    after.extend(echoes(usize::MAX));
    assert!(
        !after.is_empty() && after.iter().all(|e| e.ends_with(b"ok")),
        "only the proper message is echoed: {after:?}"
    );
    // A 1-byte message ends the server.
    ok.truncate(8);
    ok.push(b'x');
    qp_end.send_to(&ud_send(qpn, 520, &ok), (server_ip, 4791)).expect("sent");
    let s = server.finish(Duration::from_secs(5));
    assert!(s.status.success() && text(&s).contains("server done"), "server:\n{}", text(&s));
}

/// A RoCEv2 UD SEND-only from QP 0x99 on 127.0.104.3 to QP `qpn` on 127.0.104.1, with
/// librdmacm's Q_Key and an ICRC over the headers the kernel will build.
fn ud_send(qpn: u32, psn: u32, payload: &[u8]) -> Vec<u8> {
    use softrdma::engine::qp::requester::bare;
    use softrdma::proto::roce::bth::BthRepr;
    use softrdma::proto::roce::ext::DethRepr;
    use softrdma::proto::roce::icrc::{self, IpHeader};
    use softrdma::proto::roce::packet::pad_for;
    use softrdma::proto::roce::{Psn, RoceRepr};
    use softrdma::transport::headers::{ip_header, udp_header};
    let bth = BthRepr {
        opcode: 0x64,
        solicited: false,
        mig_req: true,
        pad_count: pad_for(payload.len()),
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: qpn,
        ack_req: false,
        psn: Psn::new(psn),
    };
    let deth = DethRepr { qkey: softrdma::verbs::RDMA_UDP_QKEY, src_qp: 0x99 };
    let r = RoceRepr { payload, deth: Some(deth), ..bare(bth, None, None) };
    let mut buf = vec![0u8; r.buffer_len()];
    r.emit(&mut buf).expect("a packet");
    let (from, to) = ("127.0.104.3".parse().expect("an address"), "127.0.104.1".parse().expect("an address"));
    let udp = udp_header(4791, 4791, buf.len());
    let (ip, _) = ip_header(from, to, 8 + buf.len(), 0, true, 0);
    icrc::fill(IpHeader::V4(&ip[..20]), &udp, &mut buf).expect("an ICRC");
    buf
}
