//! rsockets on the library: librdmacm's own rstream and rcopy, unmodified, on both
//! transports, in its blocking, non-blocking and rpoll-driven modes, with data verified.

mod tools;
use std::time::Duration;
use tools::{finish, text, tool_on, CProgram, Reaped};

/// rstream server on `net`.1, client on `net`.2, both with `args`; both must print their
/// result line for every size and exit 0. Returns the client's output.
fn rstream(transport: &str, net: &str, port: &str, args: &[&str]) -> String {
    let server_addr = format!("{net}.1");
    let mut server_args = vec!["-b", &server_addr, "-p", port];
    server_args.extend_from_slice(args);
    let server = tool_on("rstream", transport, &server_addr, &server_args).spawn().expect("rstream runs");
    std::thread::sleep(Duration::from_millis(300));
    let mut client_args = vec!["-s", &server_addr, "-p", port];
    client_args.extend_from_slice(args);
    let client = tool_on("rstream", transport, &format!("{net}.2"), &client_args).spawn().expect("rstream runs");
    let (c, s) = (finish(client, Duration::from_secs(60)), finish(server, Duration::from_secs(10)));
    for (who, out) in [("client", &c), ("server", &s)] {
        assert!(out.status.success(), "rstream {transport} {args:?} {who}:\n{}", text(out));
        let rows =
            text(out).lines().filter(|l| l.contains("custom") || l.contains("_lat") || l.contains("_bw")).count();
        assert!(rows >= 1, "rstream {transport} {args:?} {who}: no result row in\n{}", text(out));
    }
    text(&c)
}

#[test]
fn rstream_runs_every_mode_over_rocev2() {
    // Blocking, with every byte checked against rstream's pattern.
    rstream("rocev2", "127.0.94", "7561", &["-S", "65536", "-C", "200", "-T", "v"]);
    // Small messages past 65,536 of them: sequence numbers wrap, credits keep coming.
    rstream("rocev2", "127.0.94", "7562", &["-S", "64", "-C", "70000"]);
    // rpoll before every call, and non-blocking calls.
    rstream("rocev2", "127.0.94", "7563", &["-S", "100000", "-C", "50", "-T", "a"]);
    rstream("rocev2", "127.0.94", "7564", &["-S", "4096", "-C", "1000", "-T", "n"]);
}

#[test]
fn rstream_runs_every_size_over_iwarp() {
    // rstream's own table (64 B to 1 MiB, latency and bandwidth), messages as SENDs.
    let out = rstream("iwarp", "127.0.95", "7571", &[]);
    for row in ["64_lat", "4k_lat", "64k_lat", "1m_lat", "64_bw", "4k_bw", "64k_bw", "1m_bw"] {
        assert!(out.contains(row), "rstream iwarp: no {row} row in\n{out}");
    }
    rstream("iwarp", "127.0.95", "7572", &["-S", "65536", "-C", "100", "-T", "v"]);
}

/// rcopy sends a file over an rsocket; the copy must equal the original.
#[test]
fn rcopy_copies_a_file() {
    let dir = std::env::temp_dir().join(format!("softrdma-rcopy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    // nobody (the tools' user when the tests run as root) must read and write here.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
    let (src, dst) = (dir.join("source"), dir.join("copy"));
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(&src, &data).expect("the source file");
    std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
    let server = tool_on("rcopy", "rocev2", "127.0.96.1", &["-p", "7581"]).spawn().expect("rcopy runs");
    std::thread::sleep(Duration::from_millis(300));
    let (s, d) = (src.to_str().unwrap_or_default(), format!("127.0.96.1:{}", dst.display()));
    let client = tool_on("rcopy", "rocev2", "127.0.96.2", &[s, &d, "-p", "7581"]).spawn().expect("rcopy runs");
    let c = finish(client, Duration::from_secs(30));
    let srv = finish(server, Duration::from_millis(500));
    assert!(c.status.success(), "rcopy client:\n{}\nserver:\n{}", text(&c), text(&srv));
    let copy = std::fs::read(&dst).expect("the copy exists");
    assert!(copy == data, "the copy differs ({} bytes of {})", copy.len(), data.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether the kernel has a TCP socket listening on `port` (any address).
fn kernel_listens_on(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    // Columns: sl local_address rem_address st ...; LISTEN is state 0A.
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&format!(":{port:04X}")) && f[3] == "0A"
    })
}

/// A plain socket program (no RDMA in it) under librdmacm's `librspreload.so`: its socket
/// calls become rsockets on softrdma. 4 MiB go one way, their sum comes back; no kernel
/// TCP socket listens meanwhile, so nothing fell back to TCP.
#[test]
fn a_plain_socket_program_runs_over_rsockets_through_librspreload() {
    let preload = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";
    assert!(std::path::Path::new(preload).exists(), "librdmacm1 ships {preload}");
    let program = CProgram::build("plain_sockets");
    let run = |addr: &str, args: &[&str]| {
        let mut c = tool_on(&program.exe, "rocev2", addr, args);
        c.env("LD_PRELOAD", preload);
        c.spawn().expect("the program runs")
    };
    let server = run("127.0.97.1", &["server", "127.0.97.1", "7591"]);
    std::thread::sleep(Duration::from_millis(400));
    let tcp_listener = kernel_listens_on(7591);
    let client = run("127.0.97.2", &["client", "127.0.97.1", "7591"]);
    let (c, s) = (finish(client, Duration::from_secs(30)), finish(server, Duration::from_secs(10)));
    for (who, out) in [("client", &c), ("server", &s)] {
        assert!(out.status.success() && text(out).contains("plain sockets: ok"), "{who}:\n{}", text(out));
    }
    assert!(!tcp_listener, "the server listened on kernel TCP: librspreload fell back");
}

/// riostream: each side maps its buffer (riomap, RDMA_IOMAPSIZE) and the other writes
/// into it directly (riowrite), then spins on the buffer's last byte; data verified.
#[test]
fn riostream_writes_into_mapped_buffers_on_both_transports() {
    for (transport, net, port) in [("rocev2", "127.0.98", "7601"), ("iwarp", "127.0.99", "7602")] {
        for args in [
            &["-S", "65536", "-C", "100", "-T", "v"][..],
            &["-S", "64", "-C", "1000"],
            &["-S", "4096", "-C", "1", "-I", "50"],
        ] {
            let server_addr = format!("{net}.1");
            let mut sargs = vec!["-b", &server_addr, "-p", port];
            sargs.extend_from_slice(args);
            let server = tool_on("riostream", transport, &server_addr, &sargs).spawn().expect("riostream runs");
            std::thread::sleep(Duration::from_millis(300));
            let mut cargs = vec!["-s", &server_addr, "-p", port];
            cargs.extend_from_slice(args);
            let client = tool_on("riostream", transport, &format!("{net}.2"), &cargs).spawn().expect("riostream runs");
            let (c, s) = (finish(client, Duration::from_secs(60)), finish(server, Duration::from_secs(10)));
            for (who, out) in [("client", &c), ("server", &s)] {
                let ok = out.status.success() && text(out).contains("custom");
                assert!(ok, "riostream {transport} {args:?} {who}:\n{}", text(out));
            }
        }
    }
}

/// A client speaking another protocol over rdma_cm is refused by an rsocket listener,
/// which goes on to accept an rsockets client.
#[test]
fn a_listener_refuses_a_stranger_and_accepts_the_next_client() {
    let stranger_c = CProgram::build("rsocket_stranger");
    let (net, port) = ("127.0.100", "7611");
    let server_addr = format!("{net}.1");
    let sargs = ["-b", &server_addr, "-p", port, "-S", "4096", "-C", "10"];
    let server = tool_on("rstream", "rocev2", &server_addr, &sargs).spawn().expect("rstream runs");
    std::thread::sleep(Duration::from_millis(300));
    let mut stranger = tool_on(&stranger_c.exe, "rocev2", &format!("{net}.3"), &[&server_addr, port]);
    let s = finish(stranger.spawn().expect("the stranger runs"), Duration::from_secs(20));
    assert!(s.status.success() && text(&s).contains("stranger refused"), "stranger:\n{}", text(&s));
    let cargs = ["-s", &server_addr, "-p", port, "-S", "4096", "-C", "10"];
    let client = tool_on("rstream", "rocev2", &format!("{net}.2"), &cargs).spawn().expect("rstream runs");
    let (c, srv) = (finish(client, Duration::from_secs(30)), finish(server, Duration::from_secs(10)));
    for (who, out) in [("client", &c), ("server", &srv)] {
        assert!(out.status.success() && text(out).contains("custom"), "rstream {who}:\n{}", text(out));
    }
}

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
