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

/// Runs `softrdma conform` with `args` (JSON out) against the server `target` started
/// again after each connection; returns its document and whether it exited 0.
fn conform_against(target: &[&str], args: &[&str]) -> (serde_json::Value, bool) {
    let stop = Arc::new(AtomicBool::new(false));
    let looping = target_loop(target.iter().map(|a| a.to_string()).collect(), stop.clone());
    let out = softrdma().arg("conform").args(args).arg("--json").output().unwrap();
    stop.store(true, Ordering::Release);
    looping.join().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {} {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (doc, out.status.success())
}

/// Every case conforms, and there are at least `min` of them.
fn all_conform(doc: &serde_json::Value, min: usize) {
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= min, "{doc}");
    for c in cases {
        assert_eq!(c["verdict"], "conforms", "{c}");
    }
}

fn tally(pcap: &std::path::Path) -> serde_json::Value {
    let check = softrdma().args(["pcap", "check", "--json"]).arg(pcap).output().unwrap();
    let rep: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    rep["tally"].clone()
}

#[test]
fn a_softrdma_target_conforms_in_every_case() {
    let pcap = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conform.pcap");
    let (doc, ok) = conform_against(
        &["rc-pingpong", "--bind", "127.46.0.1", "-p", "19501", "-n", "5"],
        &["127.46.0.1", "-p", "19501", "--bind", "127.46.0.2", "--wait-ms", "600", "--pcap", pcap.to_str().unwrap()],
    );
    all_conform(&doc, 25);
    assert!(ok);
    // The capture holds both sides: the cases' packets and the target's answers, every
    // ICRC good but the one the bad-ICRC case spoils on purpose.
    let t = tally(&pcap);
    assert_eq!(t["checksum_bad"].as_u64(), Some(1), "{t}");
    assert!(t["roce_packets"].as_u64().unwrap() > 50, "{t}");
}

#[test]
fn a_softrdma_iwarp_target_conforms_in_every_case() {
    let pcap = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conform-iwarp.pcap");
    let (doc, ok) = conform_against(
        &["rping", "-s", "-a", "127.46.0.3", "-p", "19502", "-C", "1"],
        &["127.46.0.3", "--transport", "iwarp", "-p", "19502", "--wait-ms", "600", "--pcap", pcap.to_str().unwrap()],
    );
    all_conform(&doc, 18);
    assert!(ok);
    // The capture follows every connection through MPA: FPDUs both ways (Sends, Read
    // Requests, Terminates), and exactly one bad CRC, the one the CRC case spoils.
    let t = tally(&pcap);
    assert!(t["fpdus"].as_u64().unwrap() >= 25, "{t}");
    assert!(t["mpa_frames"].as_u64().unwrap() >= 28, "{t}");
    assert_eq!(t["checksum_bad"].as_u64(), Some(1), "{t}");
}

#[test]
fn a_softrdma_target_keeps_the_oracle_under_random_mutation() {
    let (doc, ok) = conform_against(
        &["rc-pingpong", "--bind", "127.46.0.4", "-p", "19503", "-n", "5"],
        &[
            "127.46.0.4",
            "-p",
            "19503",
            "--bind",
            "127.46.0.5",
            "--wait-ms",
            "300",
            "--random",
            "12",
            "--seed",
            "0x5eed",
        ],
    );
    // No failing trial, and the summary names the run.
    let cases = doc["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 1, "{doc}");
    assert_eq!(cases[0]["case"], "random: 12 trials from seed 0x5eed");
    all_conform(&doc, 1);
    assert!(ok);
}
