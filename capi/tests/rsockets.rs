//! rsockets on the library: librdmacm's own rstream and rcopy, unmodified, on both
//! transports, in its blocking, non-blocking and rpoll-driven modes, with data verified.

mod tools;
use std::time::Duration;
use tools::{finish, text, tool_on, CProgram};

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
