//! `softrdma inject` live: two softrdma endpoints in their own namespaces, the injector
//! bridging the veths between them in a third, events on chosen packets, and the
//! micro-behaviours it reads back (needs root; skipped without, failing where
//! `SOFTRDMA_REQUIRE_NETNS` is set).

use serde_json::Value;
use softrdma::tools::netns::InPath;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

fn stage(test: &str) -> Option<InPath> {
    match InPath::new("sri") {
        Ok(s) => Some(s),
        Err(e) if std::env::var_os("SOFTRDMA_REQUIRE_NETNS").is_some() => panic!("{test}: {e}"),
        Err(e) => {
            eprintln!("{test}: skipped: {e}");
            None
        }
    }
}

fn in_ns(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, BIN]).args(args);
    c
}

fn injector(s: &InPath, events: &[&str], pcap: &std::path::Path) -> Child {
    let mut args = vec!["inject", "--a", &s.ifaces[1], "--b", &s.ifaces[2], "--json", "--seconds", "120"];
    for e in events {
        args.extend(["-e", e]);
    }
    let pcap = pcap.to_str().unwrap();
    args.extend(["--pcap", pcap]);
    let child = in_ns(&s.ns[1], &args).stdout(Stdio::piped()).spawn().expect("inject");
    std::thread::sleep(Duration::from_millis(500));
    child
}

/// Runs `tool` (server in b, client in a) through the injector; returns its report.
fn through(s: &InPath, events: &[&str], tool: &[&str], name: &str) -> Value {
    let pcap = std::env::temp_dir().join(format!("softrdma-inject-{name}-{}.pcap", std::process::id()));
    let inj = injector(s, events, &pcap);
    let mut server = in_ns(&s.ns[2], tool).args(["--bind", "10.81.0.2"]).stdout(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client = in_ns(&s.ns[0], tool).arg("10.81.0.2").output().unwrap();
    let served = server.wait().unwrap();
    // SIGINT: the injector finishes its capture and prints its report.
    let _ = Command::new("kill").args(["-INT", &inj.id().to_string()]).status();
    let out = inj.wait_with_output().unwrap();
    assert!(client.status.success(), "client: {}", String::from_utf8_lossy(&client.stderr));
    assert!(served.success(), "server");
    let rep: Value = serde_json::from_slice(&out.stdout).expect("the injector's JSON");
    // The capture it wrote is clean: every ICRC good except the corrupted packet's.
    let check = Command::new(BIN).args(["pcap", "check", "--json", pcap.to_str().unwrap()]).output().unwrap();
    let tally: Value = serde_json::from_slice(&check.stdout).unwrap();
    let bad = tally["tally"]["checksum_bad"].as_u64().unwrap_or(0);
    let corrupted = events.iter().filter(|e| e.starts_with("corrupt")).count() as u64;
    assert_eq!(bad, corrupted, "{}", tally["tally"]);
    let _ = std::fs::remove_file(&pcap);
    rep
}

fn finding<'a>(rep: &'a Value, event: &str) -> &'a Value {
    let all = rep["findings"].as_array().unwrap();
    &all.iter().find(|f| f["event"].as_str().unwrap().starts_with(event)).unwrap_or_else(|| panic!("{event}: {rep}"))
        ["metrics"]
}

#[test]
fn events_on_a_write_stream_show_go_back_n_cnps_and_drops() {
    let Some(s) = stage("events_on_a_write_stream") else { return };
    s.end_addr(0, "10.81.0.1/24").unwrap();
    s.end_addr(1, "10.81.0.2/24").unwrap();
    let events = ["drop@1000", "ecn@3000,count=200", "corrupt@5000", "dup@7000", "delay@9000,us=2000"];
    let tool = ["write-bw", "-s", "65536", "-n", "200", "-m", "1024", "--cc"];
    let rep = through(&s, &events, &tool, "bw");
    assert_eq!(rep["applied"].as_array().unwrap().len(), 5, "{rep}");
    assert!(rep["unmet"].as_array().unwrap().is_empty());
    let drop = finding(&rep, "drop");
    assert!(drop["retransmission after the event"].as_str().unwrap().ends_with("(NAK)"), "{drop}");
    assert_eq!(drop["went back to"], "the lost PSN");
    let corrupt = finding(&rep, "corrupt");
    assert_eq!(corrupt["corrupted packet dropped"], "yes", "{corrupt}");
    assert!(corrupt["retransmission after the event"].is_string(), "{corrupt}");
    let ecn = finding(&rep, "ECN");
    let cnps: u64 = ecn["CNPs within 20 ms"].as_str().unwrap().parse().unwrap();
    assert!(cnps >= 2, "{ecn}");
    // The notification point sends at most one CNP per QP per 50 µs (A17.9.3); the
    // bridge's kernel timestamps see that, less the jitter of two sends (tens of µs on a
    // busy host). Without the limit, 200 marks in a row come back as CNPs µs apart.
    let spacing: u64 = ecn["closest CNP spacing"].as_str().unwrap().trim_end_matches(" µs").parse().unwrap();
    assert!(spacing >= 10, "{ecn}");
    assert_eq!(finding(&rep, "duplicate")["retransmissions at or below it within 5 ms"], "0");
    let delay = finding(&rep, "delay");
    // Later packets passed the held one: the gap is NAKed and repaired at once. (If the
    // sender had nothing more in flight, nothing passed it and nothing is resent.)
    assert!(delay["retransmission after the event"].as_str().is_none_or(|r| r.ends_with("(NAK)")), "{delay}");
}

#[test]
fn a_lost_ping_is_repaired_by_the_retransmission_timer() {
    let Some(s) = stage("a_lost_ping") else { return };
    s.end_addr(0, "10.81.0.1/24").unwrap();
    s.end_addr(1, "10.81.0.2/24").unwrap();
    let rep = through(&s, &["drop@50"], &["write-lat", "-s", "8", "-n", "200", "-m", "1024"], "lat");
    let drop = finding(&rep, "drop");
    assert!(drop["retransmission after the event"].as_str().unwrap().ends_with("(timeout)"), "{drop}");
}
