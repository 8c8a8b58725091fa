//! The perftest-style tools and rc-pingpong as a user runs them: a server process and a
//! client process on loopback addresses, their JSON, their captures (checked by
//! `softrdma pcap check` and tshark), and clear errors for bad out-of-band input.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn softrdma() -> Command {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
}

/// Waits for a child at most `limit`, killing it after; returns its output.
fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().ok().flatten().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("child output")
}

fn spawn(args: &[String]) -> Child {
    softrdma().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run softrdma")
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// Runs `tool` as server on `net`.1 and client on `net`.2 with `extra` flags on both;
/// the client captures to a pcap. Returns (server output, client output, capture).
fn pair_run(tool: &str, net: &str, port: u16, extra: &[&str]) -> (Output, Output, PathBuf) {
    let pcap = tmp(&format!("{tool}-{port}.pcap"));
    let mut server = strings(&[tool, "-p", &port.to_string(), "--bind", &format!("{net}.1")]);
    server.extend(strings(extra));
    let s = spawn(&server);
    let mut client = strings(&[tool, &format!("{net}.1"), "-p", &port.to_string(), "--bind", &format!("{net}.2")]);
    client.extend(strings(&["--pcap", pcap.to_str().unwrap()]));
    client.extend(strings(extra));
    let c = finish(spawn(&client), Duration::from_secs(60));
    let s = finish(s, Duration::from_secs(10));
    (s, c, pcap)
}

fn json_of(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// `softrdma pcap check` passes on a capture and finds RoCEv2 packets in it.
fn capture_checks(pcap: &PathBuf) -> u64 {
    let out = softrdma().args(["pcap", "check", "--json"]).arg(pcap).output().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{doc}");
    let t = &doc["tally"];
    assert_eq!((t["checksum_bad"].as_u64(), t["malformed"].as_u64()), (Some(0), Some(0)), "{doc}");
    assert_eq!(t["checksum_ok"], t["roce_packets"], "{doc}");
    let packets = t["roce_packets"].as_u64().unwrap();
    // Wireshark decodes every frame as InfiniBand, with no malformed or expert marks.
    // (Short Sends, such as perftest's exchange, are not RPC-over-RDMA, whose heuristic
    // would misread them.)
    let out = Command::new("tshark")
        .args(["-r"])
        .arg(pcap)
        .args(["--disable-protocol", "rpcordma", "-Y", "udp.dstport == 4791", "-T", "fields", "-E", "separator=,"])
        .args(["-e", "infiniband.bth.opcode", "-e", "_ws.malformed", "-e", "_ws.expert.severity"])
        .output()
        .expect("tshark is needed for this test: apt-get install tshark (see README)");
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len() as u64, packets, "{}", String::from_utf8_lossy(&out.stderr));
    // Wireshark's expert levels: chat (0x200000) marks protocol events such as a NAK after
    // a datagram the loaded loopback dropped; warnings (0x600000) and errors mean a frame
    // it could not read as the protocol says.
    const PI_WARN: u64 = 0x0060_0000;
    for row in rows {
        let f: Vec<&str> = row.split(',').collect();
        let severity = f[2..].iter().filter_map(|x| x.parse::<u64>().ok()).max().unwrap_or(0);
        assert!(!f[0].is_empty() && f[1].is_empty() && severity < PI_WARN, "tshark says {row}");
    }
    packets
}

#[test]
fn every_bandwidth_tool_runs_between_two_processes_and_captures_clean_frames() {
    let cases = [("write-bw", 19201, 200), ("read-bw", 19202, 200), ("send-bw", 19203, 200), ("atomic-bw", 19204, 500)];
    for (tool, port, iters) in cases {
        let n = iters.to_string();
        let (s, c, pcap) = pair_run(tool, "127.31.0", port, &["-n", &n, "--json", "-s", "8192", "-m", "1024"]);
        let doc = json_of(&c);
        let r = &doc["results"][0];
        let size = if tool == "atomic-bw" { 8 } else { 8192 };
        assert_eq!((r["bytes"].as_u64(), r["iterations"].as_u64()), (Some(size), Some(iters)), "{tool}: {doc}");
        assert!(r["bw_avg_bytes_per_s"].as_f64().unwrap() > 0.0);
        assert!(s.status.success(), "{tool} server: {}", String::from_utf8_lossy(&s.stderr));
        if tool == "send-bw" {
            assert_eq!(json_of(&s)["results"][0]["iterations"].as_u64(), Some(iters), "the server received every SEND");
        }
        let packets = capture_checks(&pcap);
        assert!(packets >= iters, "{tool}: {packets} packets captured");
    }
}

#[test]
fn every_latency_tool_and_rc_pingpong_run_between_two_processes() {
    for (tool, port) in [("write-lat", 19211), ("read-lat", 19212), ("send-lat", 19213)] {
        let (s, c, pcap) = pair_run(tool, "127.32.0", port, &["-n", "300", "--json", "-s", "64"]);
        let doc = json_of(&c);
        let r = &doc["results"][0];
        assert_eq!(
            (r["bytes"].as_u64(), r["iterations"].as_u64()),
            (Some(64), Some(if tool == "read-lat" { 300 } else { 299 }))
        );
        assert!(r["t_typical_us"].as_f64().unwrap() > 0.0, "{doc}");
        assert!(s.status.success(), "{tool} server: {}", String::from_utf8_lossy(&s.stderr));
        capture_checks(&pcap);
    }
    let (s, c, pcap) = pair_run("rc-pingpong", "127.32.0", 19214, &["-n", "200", "-s", "1000"]);
    for o in [&s, &c] {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{text} {}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains("400000 bytes in"), "{text}");
        assert!(text.contains("200 iters in"), "{text}");
    }
    assert!(capture_checks(&pcap) >= 400, "200 SENDs each way, with ACKs");
}

/// A fake peer on `port` that accepts one connection and does `act` with it.
fn fake_server(port: u16, act: impl FnOnce(TcpStream) + Send + 'static) -> std::thread::JoinHandle<()> {
    let l = TcpListener::bind(("127.33.0.1", port)).unwrap();
    std::thread::spawn(move || {
        if let Ok((s, _)) = l.accept() {
            act(s);
        }
    })
}

fn client_error(port: u16) -> String {
    let c = finish(
        spawn(&strings(&["write-bw", "127.33.0.1", "-p", &port.to_string(), "--bind", "127.33.0.2"])),
        Duration::from_secs(20),
    );
    assert_eq!(c.status.code(), Some(1), "a clear failure, not a hang or a crash");
    String::from_utf8_lossy(&c.stderr).into_owned()
}

#[test]
fn bad_out_of_band_input_is_a_clear_error_not_a_hang() {
    let t = fake_server(19221, |mut s| {
        let _ = s.write_all(b"HTTP/1.1 400 Bad");
        let mut b = [0u8; 64];
        let _ = s.read(&mut b);
    });
    let e = client_error(19221);
    assert!(e.contains("not a perftest peer"), "{e}");
    t.join().unwrap();

    let t = fake_server(19222, |mut s| {
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"4.50");
        let _ = s.write_all(&v);
        let mut b = [0u8; 64];
        let _ = s.read(&mut b);
    });
    let e = client_error(19222);
    assert!(e.contains("older than 5.70"), "{e}");
    t.join().unwrap();

    let t = fake_server(19223, drop);
    let e = client_error(19223);
    assert!(e.contains("closed"), "{e}");
    t.join().unwrap();

    // A server whose client sends garbage where the keys belong.
    let server = spawn(&strings(&["write-bw", "-p", "19224", "--bind", "127.33.0.1"]));
    std::thread::sleep(Duration::from_millis(300));
    let mut s = TcpStream::connect(("127.33.0.1", 19224)).unwrap();
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"6.06");
    s.write_all(&v).unwrap();
    let mut theirs = [0u8; 16 + 4 + 4 + 2];
    s.write_all(&[0, 0, 16, 0, 0, 0, 0, 64, b'5', 0]).unwrap();
    s.read_exact(&mut theirs).unwrap();
    s.write_all(&[b'z'; 108]).unwrap();
    let out = finish(server, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("not a perftest key message"), "{e}");
}

/// Every tool over iWARP (perftest's -R flow on kernel TCP) between two processes, with
/// MPA CRC asked for by the client; atomics, not spoken over iWARP yet, are a clear error.
#[test]
fn every_tool_runs_over_iwarp_between_two_processes() {
    let cases = [
        ("write-bw", 19231, 200, 200),
        ("read-bw", 19232, 200, 200),
        ("send-bw", 19233, 600, 600),
        ("write-lat", 19234, 300, 299),
        ("read-lat", 19235, 300, 300),
        ("send-lat", 19236, 300, 299),
    ];
    for (tool, port, iters, want) in cases {
        let (n, p) = (iters.to_string(), port.to_string());
        let common = ["-p", &p, "-n", &n, "-s", "4096", "--json", "--transport", "iwarp"];
        let s = spawn(&strings(&[&[tool][..], &common[..], &["--bind", "127.33.0.1"]].concat()));
        let client = [&[tool, "127.33.0.1"][..], &common[..], &["--mpa-crc", "required"]].concat();
        let c = finish(spawn(&strings(&client)), Duration::from_secs(60));
        let s = finish(s, Duration::from_secs(10));
        let doc = json_of(&c);
        let r = &doc["results"][0];
        assert_eq!((r["bytes"].as_u64(), r["iterations"].as_u64()), (Some(4096), Some(want)), "{tool}: {doc}");
        assert!(s.status.success(), "{tool} server: {}", String::from_utf8_lossy(&s.stderr));
        if tool == "send-bw" {
            // 600 Sends through a receive window of 512: the credit writes keep it going.
            assert_eq!(json_of(&s)["results"][0]["iterations"].as_u64(), Some(iters), "every SEND received");
        }
    }
    let o = softrdma().args(["atomic-bw", "127.33.0.1", "--transport", "iwarp", "-p", "19237"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("RFC 7306"));
}

/// `atomic-bw -A CMP_AND_SWAP` posts compare-and-swaps (RC opcode 0x13, which tshark
/// prints as 19), as perftest's `ib_atomic_bw -A CMP_AND_SWAP`; FETCH_AND_ADD (0x14) is
/// the default.
#[test]
fn atomic_bw_takes_perftests_atomic_type() {
    for (kind, port, opcode, title) in [
        ("CMP_AND_SWAP", 19240, "19", "Atomic CMP_AND_SWAP BW"),
        ("FETCH_AND_ADD", 19241, "20", "Atomic FETCH_AND_ADD BW"),
    ] {
        let (s, c, pcap) = pair_run("atomic-bw", "127.34.0", port, &["-n", "100", "--json", "-A", kind]);
        assert!(s.status.success(), "server: {}", String::from_utf8_lossy(&s.stderr));
        assert_eq!(json_of(&c)["test"].as_str(), Some(title));
        capture_checks(&pcap);
        let out = Command::new("tshark")
            .args(["-r"])
            .arg(&pcap)
            .args(["-Y", "udp.dstport == 4791 && ip.src == 127.34.0.2", "-T", "fields", "-e", "infiniband.bth.opcode"])
            .output()
            .expect("tshark");
        let text = String::from_utf8_lossy(&out.stdout);
        let requests: Vec<&str> = text.lines().collect();
        assert!(requests.len() >= 100, "{kind}: {} requests", requests.len());
        assert!(requests.iter().all(|o| *o == opcode), "{kind}: {requests:?}");
    }
    let bad = softrdma().args(["atomic-bw", "-A", "SWAP_ALL"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("CMP_AND_SWAP"));
}

/// `rc-pingpong -c` checks the buffer as `ibv_rc_pingpong -c` does: the client zeroes the
/// first byte of every page, the server finds those zeros after the exchanges; a client
/// without `-c` leaves the 0x7b fill there and the server says which page.
#[test]
fn rc_pingpong_checks_the_buffer_with_c() {
    for (client_checks, port) in [(true, 19250u16), (false, 19251)] {
        let p = port.to_string();
        let server =
            spawn(&strings(&["rc-pingpong", "-c", "-s", "10000", "-n", "20", "-p", &p, "--bind", "127.35.0.1"]));
        let mut client =
            strings(&["rc-pingpong", "127.35.0.1", "-s", "10000", "-n", "20", "-p", &p, "--bind", "127.35.0.2"]);
        if client_checks {
            client.push("-c".into());
        }
        let c = finish(spawn(&client), Duration::from_secs(30));
        let s = finish(server, Duration::from_secs(30));
        assert!(c.status.success(), "client: {}", String::from_utf8_lossy(&c.stderr));
        let stderr = String::from_utf8_lossy(&s.stderr);
        if client_checks {
            assert!(s.status.success(), "server: {stderr}");
        } else {
            assert!(!s.status.success() && stderr.contains("invalid data in page 0"), "server: {stderr}");
        }
    }
}

/// Counts the CM MADs `softrdma pcap check` found in a capture.
fn cm_mads(pcap: &PathBuf) -> u64 {
    let out = softrdma().args(["pcap", "check", "--json"]).arg(pcap).output().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["tally"]["cm_mads"].as_u64().unwrap()
}

/// perftest's `-R` on RoCEv2: the exchange's QP and each test QP connect through the IB
/// CM on QP1 (REQ, REP, RTU each), the exchange runs as Sends, and the capture decodes.
#[test]
fn every_tool_runs_with_rdma_cm_on_rocev2() {
    let cases = [
        ("write-bw", 19241, 200, 200),
        ("read-bw", 19242, 200, 200),
        ("send-bw", 19243, 200, 200),
        ("atomic-bw", 19244, 200, 200),
        ("write-lat", 19245, 300, 299),
        ("read-lat", 19246, 300, 300),
        ("send-lat", 19247, 300, 299),
    ];
    for (tool, port, iters, want) in cases {
        let n = iters.to_string();
        let (s, c, pcap) = pair_run(tool, "127.36.0", port, &["-R", "-n", &n, "--json", "-s", "4096"]);
        let doc = json_of(&c);
        let r = &doc["results"][0];
        let size = if tool == "atomic-bw" { 8 } else { 4096 };
        assert_eq!((r["bytes"].as_u64(), r["iterations"].as_u64()), (Some(size), Some(want)), "{tool}: {doc}");
        assert!(s.status.success(), "{tool} server: {}", String::from_utf8_lossy(&s.stderr));
        capture_checks(&pcap);
        // Two connections (the exchange's and the test's): REQ, REP, RTU each, and the
        // DREQ/DREP of at least one of them as the client closes.
        assert!(cm_mads(&pcap) >= 6, "{tool}: {} CM MADs", cm_mads(&pcap));
    }
}

/// `softrdma rping --transport rocev2`: rping's exchange over an RC QP that rdma_cm
/// connected through the IB CM, every echo checked (-V).
#[test]
fn rping_runs_on_rocev2_through_the_cm() {
    let s = spawn(&strings(&[
        "rping",
        "--transport",
        "rocev2",
        "-s",
        "-a",
        "127.37.0.1",
        "-p",
        "19251",
        "-C",
        "20",
        "-V",
        "-S",
        "1000",
    ]));
    let client = ["rping", "--transport", "rocev2", "-c", "-a", "127.37.0.1", "-I", "127.37.0.2", "-p", "19251"];
    let c = finish(
        spawn(&strings(&[&client[..], &["-C", "20", "-V", "-v", "-S", "1000"]].concat())),
        Duration::from_secs(30),
    );
    let s = finish(s, Duration::from_secs(10));
    let text = String::from_utf8_lossy(&c.stdout);
    assert!(c.status.success(), "client: {}", String::from_utf8_lossy(&c.stderr));
    assert_eq!(text.lines().filter(|l| l.starts_with("ping data: rdma-ping-")).count(), 20, "{text}");
    assert!(s.status.success(), "server: {}", String::from_utf8_lossy(&s.stderr));
}

/// Runs a server and a client of `args` (the client adds `net`.1 and its own --bind);
/// panics with both outputs unless both succeed.
fn both_succeed(net: &str, port: u16, args: &[&str]) -> Output {
    let (p, one, two) = (port.to_string(), format!("{net}.1"), format!("{net}.2"));
    let s = spawn(&strings(&[args, &["-p", &p, "--bind", &one]].concat()));
    let client = [args, &[&one, "-p", &p, "--bind", &two]].concat();
    let c = finish(spawn(&strings(&client)), Duration::from_secs(60));
    let s = finish(s, Duration::from_secs(10));
    let both = format!(
        "{args:?}\nclient: {}{}\nserver: {}{}",
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&c.stderr),
        String::from_utf8_lossy(&s.stdout),
        String::from_utf8_lossy(&s.stderr)
    );
    assert!(c.status.success() && s.status.success(), "{both}");
    c
}

/// Every tool with the sizes that catch segmentation bugs: 1 byte, one less than the
/// MTU, more than it and not a multiple, more than 64 KiB, 1 MiB; at MTU 4096 (loopback is
/// a jumbo link).
#[test]
fn every_tool_takes_odd_sizes_at_mtu_4096() {
    let sizes = ["1", "4095", "5000", "70000", "1048576"];
    let mut port = 19300;
    for tool in ["write-bw", "read-bw", "send-bw"] {
        for size in sizes {
            port += 1;
            let c = both_succeed("127.38.0", port, &[tool, "-s", size, "-n", "20", "-m", "4096", "--json"]);
            let doc = json_of(&c);
            assert_eq!(doc["results"][0]["bytes"].as_u64(), Some(size.parse().unwrap()), "{tool} {size}: {doc}");
        }
    }
    // Through rdma_cm as well.
    for (tool, size) in [("write-bw", "70000"), ("read-bw", "1"), ("send-bw", "5000"), ("read-lat", "4095")] {
        port += 1;
        let c = both_succeed("127.38.0", port, &[tool, "-R", "-s", size, "-n", "20", "-m", "4096", "--json"]);
        assert_eq!(json_of(&c)["results"][0]["bytes"].as_u64(), Some(size.parse().unwrap()), "{tool} -R {size}");
    }
    for tool in ["write-lat", "read-lat", "send-lat"] {
        for size in ["1", "4095", "70000"] {
            port += 1;
            let c = both_succeed("127.38.0", port, &[tool, "-s", size, "-n", "20", "-m", "4096", "--json"]);
            assert_eq!(json_of(&c)["results"][0]["bytes"].as_u64(), Some(size.parse().unwrap()), "{tool} {size}");
        }
    }
    for size in ["1", "4095", "70000"] {
        port += 1;
        let c = both_succeed("127.38.0", port, &["rc-pingpong", "-s", size, "-n", "20", "-m", "4096"]);
        let text = String::from_utf8_lossy(&c.stdout);
        assert!(text.contains(&format!("{} bytes in", size.parse::<u64>().unwrap() * 40)), "{text}");
    }
    for size in ["23", "4095", "70000", "1048576"] {
        port += 1;
        let p = port.to_string();
        let rping = ["rping", "--transport", "rocev2", "-a", "127.38.0.1", "-p", &p, "-C", "5", "-S", size, "-V"];
        let s = spawn(&strings(&[&rping[..], &["-s"]].concat()));
        let c = finish(spawn(&strings(&[&rping[..], &["-c", "-I", "127.38.0.2"]].concat())), Duration::from_secs(60));
        let s = finish(s, Duration::from_secs(10));
        assert!(c.status.success() && s.status.success(), "rping -S {size}: {}", String::from_utf8_lossy(&c.stderr));
    }
    for size in ["1", "4095", "4096"] {
        port += 1;
        let c = both_succeed("127.38.0", port, &["ud-pingpong", "-s", size, "-n", "20", "-m", "4096"]);
        let text = String::from_utf8_lossy(&c.stdout);
        assert!(text.contains(&format!("{} bytes in", size.parse::<u64>().unwrap() * 40)), "{text}");
    }
}

/// `ud-pingpong` as ibv_ud_pingpong: UD Sends with Q_Key 0x11111111 each way, and a
/// message larger than the path MTU refused as ibv_ud_pingpong refuses it.
#[test]
fn ud_pingpong_runs_between_two_processes() {
    let (s, c, pcap) = pair_run("ud-pingpong", "127.39.0", 19401, &["-n", "100", "-s", "1000"]);
    for o in [&s, &c] {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{text} {}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains("200000 bytes in") && text.contains("100 iters in"), "{text}");
    }
    assert!(capture_checks(&pcap) >= 200);
    let out = Command::new("tshark")
        .args(["-r"])
        .arg(&pcap)
        .args(["-Y", "infiniband.bth.opcode == 100", "-T", "fields", "-e", "infiniband.deth.q_key"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().count() >= 200 && text.lines().all(|l| l == "0x0000000011111111"), "{text}");
    // 2000 bytes over the default path MTU of 1024: both sides refuse, as ibv_ud_pingpong.
    let s = spawn(&strings(&["ud-pingpong", "-p", "19402", "-s", "2000", "--bind", "127.39.0.1"]));
    let c =
        softrdma().args(["ud-pingpong", "127.39.0.1", "-p", "19402", "-s", "2000", "--bind", "127.39.0.2"]).output();
    let s = finish(s, Duration::from_secs(10));
    for o in [&s, &c.unwrap()] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("larger than port MTU (1024)"), "{err}");
    }
}

/// `--stats` reports the device's counters: in the JSON document, and on stderr after
/// the table.
#[test]
fn stats_report_what_went_over_the_wire() {
    let (s, c, _) =
        pair_run("read-bw", "127.40.0", 19260, &["-n", "100", "-s", "8192", "-m", "1024", "--json", "--stats"]);
    let (client, server) = (json_of(&c)["device_stats"].clone(), json_of(&s)["device_stats"].clone());
    // 100 READ requests of one packet each; 8 KiB responses of 8 packets at MTU 1024.
    assert_eq!((client["tx_packets"].as_u64(), client["rx_packets"].as_u64()), (Some(100), Some(800)), "{client}");
    assert_eq!((server["tx_packets"].as_u64(), server["rx_packets"].as_u64()), (Some(800), Some(100)), "{server}");
    assert_eq!(client["retransmit_timeouts"].as_u64(), Some(0), "a lossless path: {client}");
    let (s, c, _) = pair_run("write-lat", "127.40.0", 19261, &["-n", "50", "--stats"]);
    for o in [&s, &c] {
        assert!(o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("device counters: {") && err.contains("\"retransmit_timeouts\":0"), "{err}");
    }
}

#[test]
fn udp_offload_turned_off_is_said_in_the_header_and_a_bad_value_refused() {
    for (i, (flag, link)) in [
        (None, "(softrdma over kernel UDP sockets with GSO and GRO)"),
        (Some("off"), "(softrdma over kernel UDP sockets)"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut extra = vec!["-n", "20"];
        extra.extend(flag.map(|f| ["--udp-offload", f]).into_iter().flatten());
        let (s, c, _) = pair_run("write-bw", "127.42.0", 19270 + i as u16, &extra);
        for o in [&s, &c] {
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success() && out.contains(link), "{link}: {out}");
        }
    }
    let bad = softrdma().args(["write-bw", "--udp-offload", "maybe"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("on or off"));
    // The environment turns them off for every device a process opens.
    let run = |args: &[&str]| {
        let mut c = softrdma();
        c.args(args).env("SOFTRDMA_UDP_OFFLOAD", "off").stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().expect("run softrdma")
    };
    let s = run(&["write-bw", "-p", "19272", "--bind", "127.42.0.1", "-n", "20"]);
    let c = finish(
        run(&["write-bw", "127.42.0.1", "-p", "19272", "--bind", "127.42.0.2", "-n", "20"]),
        Duration::from_secs(60),
    );
    let s = finish(s, Duration::from_secs(10));
    for o in [&s, &c] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && out.contains("(softrdma over kernel UDP sockets)"), "{out}");
    }
}

/// `udp-bw` between two processes: the client prints, as JSON, what the server counted.
#[test]
fn udp_bw_reports_what_the_server_received() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let server = spawn(&strings(&["udp-bw", "-p", &port, "-s", "1040"]));
    let client = finish(
        spawn(&strings(&["udp-bw", "127.0.0.1", "-p", &port, "-s", "1040", "-D", "0.3", "--json"])),
        Duration::from_secs(60),
    );
    let doc = json_of(&client);
    let server = finish(server, Duration::from_secs(20));
    assert!(server.status.success(), "server: {}", String::from_utf8_lossy(&server.stderr));
    assert_eq!(doc["test"], "udp_bw");
    let (sent, got) = (doc["datagrams_sent"].as_u64().unwrap(), doc["datagrams_received"].as_u64().unwrap());
    assert!(got > 0 && got < sent, "the first datagram only starts the clock: {doc}");
    let bw = doc["bw_avg_bytes_per_s"].as_f64().unwrap();
    let expected = got as f64 * 1040.0 * 1e9 / doc["elapsed_ns"].as_f64().unwrap();
    assert!((bw - expected).abs() < 1.0, "{doc}");
}
