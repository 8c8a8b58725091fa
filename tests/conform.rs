//! `softrdma conform` against a softrdma target on loopback: the target is softrdma's
//! rc-pingpong server (RoCEv2) or rping server (iWARP), restarted after each connection as
//! a user restarts ibv_rc_pingpong or rping, and every case of the catalogue must conform.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn softrdma() -> Command {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
}

/// Keeps one server (`args`) listening until `stop`.
fn target_loop(args: Vec<String>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            let mut child: Child =
                softrdma().args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start the target");
            while child.try_wait().ok().flatten().is_none() {
                if stop.load(Ordering::Acquire) {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    })
}

#[test]
fn a_softrdma_target_conforms_in_every_case() {
    let stop = Arc::new(AtomicBool::new(false));
    let args = ["rc-pingpong", "--bind", "127.46.0.1", "-p", "19501", "-n", "5"];
    let target = target_loop(args.map(String::from).to_vec(), stop.clone());
    let pcap = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conform.pcap");
    let out = softrdma()
        .args(["conform", "127.46.0.1", "-p", "19501", "--bind", "127.46.0.2", "--json", "--wait-ms", "600"])
        .arg("--pcap")
        .arg(&pcap)
        .output()
        .unwrap();
    stop.store(true, Ordering::Release);
    target.join().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {} {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 16, "{doc}");
    for c in cases {
        assert_eq!(c["verdict"], "conforms", "{c}");
    }
    assert!(out.status.success());
    // The capture holds both sides: the cases' packets and the target's answers, every
    // ICRC good but the one the bad-ICRC case spoils on purpose.
    let check = softrdma().args(["pcap", "check", "--json"]).arg(&pcap).output().unwrap();
    let rep: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(rep["tally"]["checksum_bad"].as_u64(), Some(1), "{rep}");
    assert!(rep["tally"]["roce_packets"].as_u64().unwrap() > 50, "{rep}");
}

#[test]
fn a_softrdma_iwarp_target_conforms_in_every_case() {
    let stop = Arc::new(AtomicBool::new(false));
    let args = ["rping", "-s", "-a", "127.46.0.3", "-p", "19502", "-C", "1"];
    let target = target_loop(args.map(String::from).to_vec(), stop.clone());
    let pcap = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conform-iwarp.pcap");
    let out = softrdma()
        .args(["conform", "127.46.0.3", "--transport", "iwarp", "-p", "19502", "--json", "--wait-ms", "600"])
        .arg("--pcap")
        .arg(&pcap)
        .output()
        .unwrap();
    stop.store(true, Ordering::Release);
    target.join().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {} {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 17, "{doc}");
    for c in cases {
        assert_eq!(c["verdict"], "conforms", "{c}");
    }
    assert!(out.status.success());
    // The capture follows every connection through MPA: FPDUs both ways (Sends, Read
    // Requests, Terminates), and exactly one bad CRC, the one the CRC case spoils.
    let check = softrdma().args(["pcap", "check", "--json"]).arg(&pcap).output().unwrap();
    let rep: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert!(rep["tally"]["fpdus"].as_u64().unwrap() >= 25, "{}", rep["tally"]);
    assert!(rep["tally"]["mpa_frames"].as_u64().unwrap() >= 28, "{}", rep["tally"]);
    assert_eq!(rep["tally"]["checksum_bad"].as_u64(), Some(1), "{}", rep["tally"]);
}

#[test]
fn a_softrdma_target_keeps_the_oracle_under_random_mutation() {
    let stop = Arc::new(AtomicBool::new(false));
    let args = ["rc-pingpong", "--bind", "127.46.0.4", "-p", "19503", "-n", "5"];
    let target = target_loop(args.map(String::from).to_vec(), stop.clone());
    let out = softrdma()
        .args(["conform", "127.46.0.4", "-p", "19503", "--bind", "127.46.0.5", "--json", "--wait-ms", "300"])
        .args(["--random", "12", "--seed", "0x5eed"])
        .output()
        .unwrap();
    stop.store(true, Ordering::Release);
    target.join().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {} {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    let cases = doc["cases"].as_array().unwrap();
    // No failing trial, and the summary names the run.
    assert_eq!(cases.len(), 1, "{doc}");
    assert_eq!(cases[0]["case"], "random: 12 trials from seed 0x5eed");
    assert_eq!(cases[0]["verdict"], "conforms", "{doc}");
    assert!(out.status.success());
}
