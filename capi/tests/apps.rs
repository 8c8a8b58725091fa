//! Debian's unmodified RDMA programs on the library, client and server as two processes,
//! each with a device of its own on loopback (separate addresses per test, so the tests
//! run side by side).

mod tools;
use std::time::Duration;
use tools::{await_listener, finish, text, tool, tool_on};

/// How long a server may take to start listening on a loaded machine.
const LISTEN_LIMIT: Duration = Duration::from_secs(20);

/// Runs a pingpong server on `net`.1 and its client on `net`.2; both must report the
/// iterations done.
fn pingpong(program: &str, net: &str, port: &str, extra: &[&str]) {
    let iters = "2000";
    let mut args = vec!["-d", "softrdma0", "-g", "0", "-n", iters, "-p", port];
    args.extend_from_slice(extra);
    let server = tool(program, &format!("{net}.1"), &args).spawn().expect("the tool runs");
    std::thread::sleep(Duration::from_millis(300));
    let mut client_args = args.clone();
    client_args.push("127.0.0.1");
    let client = tool(program, &format!("{net}.2"), &client_args).spawn().expect("the tool runs");
    let (c, s) = (finish(client, Duration::from_secs(30)), finish(server, Duration::from_secs(5)));
    for (who, out) in [("client", &c), ("server", &s)] {
        assert!(out.status.success(), "{program} {extra:?} {who}:\n{}", text(out));
        assert!(text(out).contains(&format!("{iters} iters in")), "{program} {who}:\n{}", text(out));
    }
}

#[test]
fn ibv_rc_pingpong_runs_polling() {
    pingpong("ibv_rc_pingpong", "127.0.20", "18611", &[]);
}

#[test]
fn ibv_rc_pingpong_runs_on_completion_events() {
    pingpong("ibv_rc_pingpong", "127.0.21", "18612", &["-e"]);
}

#[test]
fn ibv_rc_pingpong_runs_with_odd_sizes_and_mtus() {
    pingpong("ibv_rc_pingpong", "127.0.22", "18613", &["-s", "5000", "-m", "4096", "-c"]);
    pingpong("ibv_rc_pingpong", "127.0.23", "18614", &["-s", "1", "-m", "256", "-c"]);
}

#[test]
fn ibv_uc_pingpong_runs() {
    pingpong("ibv_uc_pingpong", "127.0.24", "18615", &[]);
}

#[test]
fn ibv_ud_pingpong_runs() {
    pingpong("ibv_ud_pingpong", "127.0.25", "18616", &[]);
}

/// Runs perftest's `program` as server on `net`.1 and client on `net`.2 (`-x 0`: the RoCE
/// v2 GID); the client must print its result row.
fn perftest(program: &str, net: &str, port: &str, extra: &[&str]) -> String {
    let mut args = vec!["-d", "softrdma0", "-x", "0", "-p", port];
    args.extend_from_slice(extra);
    let server = tool(program, &format!("{net}.1"), &args).spawn().expect("perftest runs");
    std::thread::sleep(Duration::from_millis(300));
    let mut client_args = args.clone();
    client_args.push("127.0.0.1");
    let client = tool(program, &format!("{net}.2"), &client_args).spawn().expect("perftest runs");
    let (c, s) = (finish(client, Duration::from_secs(60)), finish(server, Duration::from_secs(5)));
    for (who, out) in [("client", &c), ("server", &s)] {
        assert!(out.status.success(), "{program} {extra:?} {who}:\n{}", text(out));
    }
    let out = text(&c);
    let row = out.lines().skip_while(|l| !l.contains("#bytes")).nth(1).unwrap_or("").to_string();
    let first: Option<u64> = row.split_whitespace().next().and_then(|f| f.parse().ok());
    assert!(first.is_some(), "{program} {extra:?}: no result row in:\n{out}");
    row
}

#[test]
fn perftest_bandwidth_tools_run() {
    for (i, program) in ["ib_write_bw", "ib_read_bw", "ib_send_bw"].iter().enumerate() {
        let net = format!("127.0.{}", 40 + i);
        let port = format!("{}", 18700 + i);
        perftest(program, &net, &port, &["-n", "500"]);
        perftest(program, &format!("127.1.{}", 40 + i), &port, &["-n", "200", "-s", "1000000", "-m", "4096"]);
    }
    perftest("ib_atomic_bw", "127.0.43", "18703", &["-n", "500"]);
    perftest("ib_atomic_bw", "127.1.43", "18703", &["-n", "500", "-A", "CMP_AND_SWAP"]);
}

#[test]
fn perftest_latency_tools_run() {
    for (i, program) in ["ib_write_lat", "ib_read_lat", "ib_send_lat", "ib_atomic_lat"].iter().enumerate() {
        let net = format!("127.0.{}", 50 + i);
        let port = format!("{}", 18750 + i);
        perftest(program, &net, &port, &["-n", "200"]);
    }
}

/// rping (librdmacm) server on `net`.1 and client on `net`.2 over `transport`: both end
/// well, and the client saw every ping's data come back.
fn rping(transport: &str, net: &str, port: &str) {
    let count = "20";
    let server_addr = format!("{net}.1");
    let server = tool_on("rping", transport, &server_addr, &["-s", "-a", &server_addr, "-p", port, "-C", count])
        .spawn()
        .expect("rping runs");
    assert!(
        await_listener(transport, &server_addr, port.parse().expect("a port"), LISTEN_LIMIT),
        "rping {transport} listens"
    );
    let client =
        tool_on("rping", transport, &format!("{net}.2"), &["-c", "-v", "-a", &server_addr, "-p", port, "-C", count])
            .spawn()
            .expect("rping runs");
    let (c, s) = (finish(client, Duration::from_secs(30)), finish(server, Duration::from_secs(10)));
    assert!(c.status.success() && s.status.success(), "rping {transport}:\n{}\n{}", text(&c), text(&s));
    let pings = text(&c).lines().filter(|l| l.starts_with("ping data: rdma-ping-")).count();
    assert_eq!(pings, 20, "rping {transport} client:\n{}", text(&c));
}

#[test]
fn rping_runs_over_rocev2_through_the_ib_cm() {
    rping("rocev2", "127.0.70", "7171");
}

/// A connect nobody listens for: on iWARP the peer's TCP refuses it, reported as the
/// kernel's rdma_cm reports it (REJECTED, -ECONNREFUSED); on RoCEv2 the CM's REJ for an
/// invalid ServiceID (REJECTED with the REJ's reason, 8).
#[test]
fn a_connect_to_nobody_is_rejected() {
    for (transport, addr, want) in [
        ("iwarp", "127.0.72.1", "RDMA_CM_EVENT_REJECTED, error -111"),
        ("rocev2", "127.0.72.2", "RDMA_CM_EVENT_REJECTED, error 8"),
    ] {
        let args = ["-c", "-a", addr, "-p", "7999", "-C", "1"];
        let out =
            finish(tool_on("rping", transport, addr, &args).spawn().expect("rping runs"), Duration::from_secs(20));
        assert!(text(&out).contains(want), "rping {transport} to nobody:\n{}", text(&out));
    }
}

#[test]
fn rping_runs_over_iwarp_through_mpa() {
    rping("iwarp", "127.0.71", "7172");
}

/// librdmacm's example programs, server on `net`.1, client on `net`.2, over
/// `transport`: rdma_server/rdma_client (the synchronous endpoint calls: rdma_create_ep,
/// rdma_get_request, CQs rdma_create_qp makes, rdma_get_recv_comp) and ucmatose (two
/// connections, ten messages each way, with event channels); both sides end with 0.
fn rdmacm_examples(transport: &str, net: &str, port: &str) {
    let (server_addr, client_addr) = (format!("{net}.1"), format!("{net}.2"));
    let pairs: [(&str, Vec<&str>, Vec<&str>); 2] = [
        ("rdma_server", vec!["-s", &server_addr, "-p", port], vec!["-s", &server_addr, "-p", port]),
        ("ucmatose", vec!["-b", &server_addr, "-c", "2", "-C", "10", "-p", port], {
            vec!["-s", &server_addr, "-b", &client_addr, "-c", "2", "-C", "10", "-p", port]
        }),
    ];
    for (program, server_args, client_args) in pairs {
        let server = tool_on(program, transport, &server_addr, &server_args).spawn().expect("the server runs");
        std::thread::sleep(Duration::from_millis(300));
        let client_program = if program == "rdma_server" { "rdma_client" } else { program };
        let client = tool_on(client_program, transport, &client_addr, &client_args).spawn().expect("the client runs");
        let (c, s) = (finish(client, Duration::from_secs(30)), finish(server, Duration::from_secs(10)));
        let both = format!("{}\n{}", text(&c), text(&s));
        assert!(c.status.success() && s.status.success(), "{program} on {transport}:\n{both}");
        let done = if program == "rdma_server" { "end 0" } else { "return status 0" };
        assert_eq!(both.matches(done).count(), 2, "{program} on {transport}:\n{both}");
    }
}

#[test]
fn librdmacm_examples_run_over_rocev2() {
    rdmacm_examples("rocev2", "127.0.80", "7181");
}

#[test]
fn librdmacm_examples_run_over_iwarp() {
    rdmacm_examples("iwarp", "127.0.81", "7182");
}

/// cmtime sets up and tears down many connections at once through one event channel;
/// every step completes for each (a step that never completes shows as a minimum of
/// 1e9 us).
#[test]
fn cmtime_connects_and_disconnects_many_ids() {
    let server = tool("cmtime", "127.0.82.1", &["-b", "127.0.82.1", "-p", "7183"]).spawn().expect("cmtime runs");
    std::thread::sleep(Duration::from_millis(300));
    let args = ["-s", "127.0.82.1", "-b", "127.0.82.2", "-c", "20", "-p", "7183"];
    let c = finish(tool("cmtime", "127.0.82.2", &args).spawn().expect("cmtime runs"), Duration::from_secs(60));
    let mut server = server;
    let _ = server.kill();
    let _ = server.wait();
    let out = text(&c);
    assert!(c.status.success() && !out.contains("fail") && !out.contains("error"), "cmtime:\n{out}");
    for step in ["resolve addr", "resolve route", "create qp", "connect", "disconnect"] {
        let row = out
            .lines()
            .find(|l| l.starts_with(step) && l.contains(":"))
            .unwrap_or_else(|| panic!("no {step} row:\n{out}"));
        let min_us: f64 = row.split_whitespace().rev().nth(1).and_then(|f| f.parse().ok()).unwrap_or(f64::MAX);
        assert!(min_us < 1e8, "{step} never completed for some id:\n{out}");
    }
}

/// perftest with `-R` (connected by rdma_cm) on `transport`. perftest's client connects
/// its test QPs right after the exchange that precedes them, and may get there before the
/// server listens for them (REJECTED, as from the kernel); perftest's own retry reuses the
/// ids it destroyed, which the library refuses (EINVAL). A pair that fails that way runs
/// again, at most three times in all; any other failure fails the test.
fn perftest_cm(program: &str, transport: &str, net: &str, port: &str) {
    perftest_cm_with(program, transport, net, port, &["-n", "200"]);
}

/// As [`perftest_cm`], with `extra` arguments on both sides.
fn perftest_cm_with(program: &str, transport: &str, net: &str, port: &str, extra: &[&str]) {
    let server_addr = format!("{net}.1");
    let mut args = vec!["-R", "-d", "softrdma0", "-p", port];
    args.extend_from_slice(extra);
    let mut client_args = args.clone();
    client_args.push(&server_addr);
    for attempt in 1..=3 {
        let server = tool_on(program, transport, &server_addr, &args).spawn().expect("perftest runs");
        std::thread::sleep(Duration::from_millis(300));
        let client = tool_on(program, transport, &format!("{net}.2"), &client_args).spawn().expect("perftest runs");
        let c = finish(client, Duration::from_secs(60));
        let early = !c.status.success() && text(&c).contains("RDMA_CM_EVENT_REJECTED");
        let s = finish(server, Duration::from_secs(if early { 1 } else { 10 }));
        if early && attempt < 3 {
            continue;
        }
        assert!(c.status.success() && s.status.success(), "{program} -R {transport}:\n{}\n{}", text(&c), text(&s));
        let out = text(&c);
        let row = out.lines().skip_while(|l| !l.contains("#bytes")).nth(1).unwrap_or("");
        assert!(
            row.split_whitespace().next().is_some_and(|f| f.parse::<u64>().is_ok()),
            "{program} -R {transport}:\n{out}"
        );
        return;
    }
}

#[test]
fn perftest_runs_connected_by_rdma_cm_on_both_transports() {
    let tools = ["ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ib_read_lat", "ib_send_lat"];
    for (i, program) in tools.iter().enumerate() {
        for (j, transport) in ["rocev2", "iwarp"].iter().enumerate() {
            let net = format!("127.{}.{}", 80 + j, 80 + i);
            perftest_cm(program, transport, &net, &format!("{}", 18800 + 10 * j + i));
        }
    }
}

/// rdmacm-utils' udaddy: UD QPs found through rdma_cm's UDP port space (SIDR, IBTA 12.11),
/// four of them each way, fifty datagrams on each, the server answering each client QP
/// with an address handle made from the GRH of what it received.
#[test]
fn udaddy_finds_ud_peers_through_rdma_cm() {
    let args = ["-b", "127.0.30.1", "-c", "4", "-C", "50"];
    let server = tool("udaddy", "127.0.30.1", &args).spawn().expect("udaddy runs");
    std::thread::sleep(Duration::from_millis(300));
    let args = ["-s", "127.0.30.1", "-b", "127.0.30.2", "-c", "4", "-C", "50"];
    let c = finish(tool("udaddy", "127.0.30.2", &args).spawn().expect("udaddy runs"), Duration::from_secs(30));
    let s = finish(server, Duration::from_secs(10));
    for (who, o) in [("client", &c), ("server", &s)] {
        assert!(o.status.success() && text(o).contains("data transfers complete"), "udaddy {who}:\n{}", text(o));
    }
}

/// mckey, librdmacm's multicast example: a receiver with two UD ids joins a group and
/// counts the sender's datagrams on each, so every datagram reaches both QPs (IBTA 10.5,
/// 9.8.1; rdma_join_multicast on RoCEv2 with no subnet administrator).
#[test]
fn mckey_sends_to_a_group_and_each_member_qp_receives() {
    let group = "239.30.3.1";
    let server = tool("mckey", "127.0.30.3", &["-m", group, "-b", "127.0.30.3", "-c", "2", "-C", "40"])
        .spawn()
        .expect("mckey runs");
    std::thread::sleep(Duration::from_millis(500));
    let args = ["-m", group, "-b", "127.0.30.4", "-s", "-C", "40"];
    let c = finish(tool("mckey", "127.0.30.4", &args).spawn().expect("mckey runs"), Duration::from_secs(30));
    let s = finish(server, Duration::from_secs(15));
    for (who, o) in [("sender", &c), ("receiver", &s)] {
        let out = text(o);
        assert!(o.status.success() && out.contains("data transfers complete"), "mckey {who}:\n{out}");
        assert!(out.contains("joined dgid: ::ffff:239.30.3.1"), "mckey {who}:\n{out}");
    }
}

/// perftest numbers its QPs by the order of its rdma_connect calls on the client and of
/// the CONNECT_REQUESTs on the server, then sends each QP's addresses by that number: the
/// requests must reach the server in the order they were made (capi/src/cm_order.rs). With
/// two QPs, iWARP Sends (whose server writes credits into the client's slot for that QP)
/// stalled in about half the runs when the order flipped, and RoCEv2 WRITEs would go to
/// the other QP's buffer with its key.
#[test]
fn perftest_pairs_two_rdma_cm_qps_in_the_order_they_connect() {
    for run in 0..3 {
        let net = format!("127.82.{}", 80 + run);
        perftest_cm_with("ib_send_bw", "iwarp", &net, &format!("{}", 18850 + run), &["-q", "2", "-n", "1000"]);
    }
    perftest_cm_with("ib_write_bw", "rocev2", "127.82.90", "18860", &["-q", "2", "-n", "1000"]);
}

/// Two ibv_rc_pingpong pairs and two rping pairs on each transport run at once, the servers
/// of each kind sharing one address and their clients another, as applications share their
/// host's address with rxe and siw: every pair runs to the end and checks its data, whichever
/// process the kernel hands a packet to (src/transport/share.rs). The pingpongs wait on
/// completion events: four processes busy-polling two CPUs measure the scheduler.
#[test]
fn several_processes_share_one_address() {
    let iters = "500";
    let mut runs = Vec::new();
    for port in ["18631", "18632"] {
        let args = ["-d", "softrdma0", "-g", "0", "-n", iters, "-p", port, "-s", "4096", "-e"];
        let server = tool("ibv_rc_pingpong", "127.0.26.1", &args).spawn().expect("the tool runs");
        runs.push((format!("ibv_rc_pingpong server {port}"), server));
    }
    let rpings = [
        ("rocev2", "127.0.27", 18641),
        ("rocev2", "127.0.27", 18642),
        ("iwarp", "127.0.28", 18641),
        ("iwarp", "127.0.28", 18642),
    ];
    for (transport, net, port) in rpings {
        let (server_addr, port) = (format!("{net}.1"), port.to_string());
        let args = ["-s", "-a", &server_addr, "-p", &port, "-C", "20"];
        let server = tool_on("rping", transport, &server_addr, &args).spawn().expect("rping runs");
        runs.push((format!("rping server {transport} {port}"), server));
    }
    // Neither tool's client retries a refused connection.
    for (transport, net, port) in rpings {
        assert!(await_listener(transport, &format!("{net}.1"), port, LISTEN_LIMIT), "rping {transport} {port} listens");
    }
    for port in [18631, 18632] {
        assert!(await_listener("tcp", "", port, LISTEN_LIMIT), "ibv_rc_pingpong {port} listens");
    }
    for port in ["18631", "18632"] {
        let args = ["-d", "softrdma0", "-g", "0", "-n", iters, "-p", port, "-s", "4096", "-e", "127.0.0.1"];
        let client = tool("ibv_rc_pingpong", "127.0.26.2", &args).spawn().expect("the tool runs");
        runs.push((format!("ibv_rc_pingpong client {port}"), client));
    }
    for (transport, net, port) in rpings {
        let (server_addr, port) = (format!("{net}.1"), port.to_string());
        let args = ["-c", "-v", "-a", &server_addr, "-p", &port, "-C", "20"];
        let client = tool_on("rping", transport, &format!("{net}.2"), &args).spawn().expect("rping runs");
        runs.push((format!("rping client {transport} {port}"), client));
    }
    let failed: Vec<String> = runs
        .into_iter()
        .filter_map(|(who, child)| {
            let out = finish(child, Duration::from_secs(60));
            let all = text(&out);
            let ok = out.status.success()
                && if who.starts_with("rping client") {
                    all.lines().filter(|l| l.starts_with("ping data: rdma-ping-")).count() == 20
                } else {
                    who.starts_with("rping server") || all.contains(&format!("{iters} iters in"))
                };
            (!ok).then(|| format!("{who} ({}):\n{all}", out.status))
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A C program using the extended post-send API (`ibv_create_qp_ex`, `ibv_wr_*`) and the
/// extended CQ (`ibv_create_cq_ex`, `ibv_start_poll`), built against rdma-core's headers and
/// run on the library: a batched WRITE, inline SEND and FETCH_AND_ADD, a READ, an aborted
/// batch, an ATOMIC WRITE and a refused operation, every byte and length checked
/// (capi/tests/c/wr_api.c).
#[test]
fn the_ibv_wr_post_send_api_runs() {
    c_program("wr_api", "127.0.29.1", "wr api ok");
}

/// A C program meeting asynchronous events through `async_fd` and poll: an SRQ's limit,
/// a receiver's access error and "last WQE reached", the acks counted on the objects, no
/// event for the sender (capi/tests/c/async_events.c).
#[test]
fn asynchronous_events_reach_the_application() {
    c_program("async_events", "127.0.29.2", "async events ok");
}

/// A C program binding memory windows of type 1 (`ibv_bind_mw`) and type 2
/// (`IBV_WR_BIND_MW`) over a region with no remote rights of its own, a WRITE and a READ
/// through them, and a READ refused after `IBV_WR_LOCAL_INV` (capi/tests/c/memory_windows.c).
#[test]
fn memory_windows_open_and_close_remote_access() {
    c_program("memory_windows", "127.0.29.3", "memory windows ok");
}

/// On-demand paging: ODP caps in `ibv_query_device_ex`, an explicit ODP region prefetched
/// with `ibv_advise_mr`, an implicit one (NULL, SIZE_MAX) reaching memory mapped after it,
/// and a WRITE to a page made inaccessible meanwhile refused with a remote access error
/// (capi/tests/c/odp.c).
#[test]
fn on_demand_paging_regions_follow_the_address_space() {
    c_program("odp", "127.0.29.5", "odp ok");
}

/// Thread and parent domains: an extended CQ, a region and QPs made in a parent domain
/// carry a SEND; a nested parent domain and a CQ in a plain PD are refused
/// (capi/tests/c/parent_domain.c).
#[test]
fn parent_domains_hold_the_objects_of_their_pd() {
    c_program("parent_domain", "127.0.29.6", "parent domain ok");
}

/// Device memory: `max_dm_size`, word-granular copies in and out, a zero-based region
/// from an offset into it taking a WRITE and serving a READ (capi/tests/c/device_memory.c).
#[test]
fn device_memory_is_reached_by_copies_and_zero_based_regions() {
    c_program("device_memory", "127.0.29.7", "device memory ok");
}

/// Importing a context, PD, region and device memory into a second context of the
/// process, and a QP there writing through them (capi/tests/c/import.c).
#[test]
fn objects_import_into_a_second_context() {
    c_program("import", "127.0.29.13", "import ok");
}

/// Tag matching: a TM-SRQ's tagged buffers added and deleted through `ibv_post_srq_ops`,
/// an eager message matched (tag and context through `ibv_wc_read_tm_info`), a full list
/// refused, a rendezvous read and answered with a FIN (capi/tests/c/tag_matching.c).
#[test]
fn tag_matching_srqs_match_eager_and_rendezvous_messages() {
    c_program("tag_matching", "127.0.29.12", "tag matching ok");
}

/// Raw packet QPs and flow steering: a rule on Ethernet, IPv4 and UDP fields takes the
/// frames another raw QP of the device sends that match it, whole; none once destroyed;
/// tunnel specs refused (capi/tests/c/raw_flow.c).
#[test]
fn raw_packet_qps_receive_the_frames_their_flow_rules_take() {
    c_program("raw_flow", "127.0.29.8", "raw flow ok");
}

/// librdmacm's details: id->pd before any QP, private data on REJECTED, the ACK timeout
/// option on both sides, and a forked child connecting on its own
/// (capi/tests/c/rdma_cm_details.c; each found by rdma-core's Python suite).
#[test]
fn rdma_cm_details_hold_as_librdmacm_has_them() {
    c_program("rdma_cm_details", "127.0.29.4", "rdma_cm details ok");
}

/// Builds capi/tests/c/`name`.c against rdma-core's headers, runs it on the library with
/// a device on `addr`, and checks it printed `ok`.
fn c_program(name: &str, addr: &str, ok: &str) {
    let program = tools::CProgram::build(name);
    let run = tool(&program.exe, addr, &[]).spawn().expect("the program runs");
    let out = finish(run, Duration::from_secs(30));
    // The status tells a program killed at the limit (its buffered output lost) from one
    // that failed.
    assert!(out.status.success() && text(&out).contains(ok), "{name} ({}):\n{}", out.status, text(&out));
}

/// perftest's SEND tools with the receiver's requests in a shared receive queue
/// (`--use-srq`: ibv_create_srq, ibv_post_srq_recv, a QP made on the SRQ), in bandwidth
/// and in latency, on UD as well as RC.
#[test]
fn perftest_runs_on_a_shared_receive_queue() {
    perftest("ib_send_bw", "127.0.32", "18911", &["-n", "500", "--use-srq"]);
    perftest("ib_send_lat", "127.0.33", "18912", &["-n", "200", "--use-srq"]);
    perftest("ib_send_bw", "127.0.34", "18913", &["-n", "500", "--use-srq", "-c", "UD", "-s", "1024"]);
}

/// perftest over XRC (`-c XRC`: ibv_open_xrcd on a file, XRC SRQs, ibv_get_srq_num, XRC
/// initiator and target QPs, the SRQ number in each request): SEND and WRITE bandwidth
/// and SEND latency.
#[test]
fn perftest_runs_over_xrc() {
    // perftest opens its domain's file readable by owner and group only: one left by a
    // run as another user (root's, by hand) would refuse the unprivileged tools.
    for side in ["client", "server"] {
        let _ = std::fs::remove_file(format!("/tmp/xrc_domain_{side}"));
    }
    perftest("ib_send_bw", "127.0.35", "18914", &["-n", "500", "-c", "XRC"]);
    perftest("ib_write_bw", "127.0.36", "18915", &["-n", "500", "-c", "XRC"]);
    perftest("ib_send_lat", "127.0.37", "18916", &["-n", "200", "-c", "XRC"]);
}
