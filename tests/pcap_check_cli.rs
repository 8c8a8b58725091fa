//! `softrdma pcap check` as a user runs it: exit status, the lines it prints, `--json`,
//! and what it does with damaged, truncated and non-RDMA captures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn capture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pcaps/linux").join(name)
}

fn run(args: &[&Path]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softrdma"));
    c.args(["pcap", "check"]);
    c.args(args);
    c.output().expect("runs")
}

fn run_json(args: &[&Path]) -> (i32, serde_json::Value) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softrdma"));
    c.args(["pcap", "check", "--json"]);
    c.args(args);
    let out = c.output().expect("runs");
    let doc = serde_json::from_slice(&out.stdout).expect("valid JSON");
    (out.status.code().expect("exited"), doc)
}

/// A scratch file that is removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str, bytes: &[u8]) -> Scratch {
        let p = std::env::temp_dir().join(format!("softrdma-{}-{tag}", std::process::id()));
        std::fs::write(&p, bytes).expect("write scratch");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Offsets of each record's data in a little-endian classic pcap.
fn record_offsets(pcap: &[u8]) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let incl = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        v.push((at + 16, incl));
        at += 16 + incl;
    }
    v
}

fn flip_bit(name: &str, frame: usize, offset_from_end: usize) -> Scratch {
    let mut bytes = std::fs::read(capture(name)).unwrap();
    let (start, len) = record_offsets(&bytes)[frame - 1];
    bytes[start + len - offset_from_end] ^= 0x04;
    Scratch::new(&format!("flip-{name}"), &bytes)
}

#[test]
fn every_shared_capture_passes() {
    let names = [
        "rxe-head.pcap",
        "rxe-write_bw.pcap",
        "rxe-tohost.pcap",
        "both-rping.pcap",
        "siw-rping.pcap",
        "siw-write_bw.pcap",
        "siw-crc-rping.pcap",
        "siw-crc-write_bw.pcap",
        "siw-hostprobe.pcap",
    ];
    let paths: Vec<PathBuf> = names.iter().map(|n| capture(n)).collect();
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    let (code, doc) = run_json(&refs);
    assert_eq!(code, 0, "{doc}");
    let t = &doc["tally"];
    assert_eq!(t["checksum_bad"], 0);
    assert_eq!(t["malformed"], 0);
    // 200 + 60 + 2 + 60 RoCEv2 packets, all ICRCs good; 35 + 37 FPDUs with CRC good.
    assert_eq!(t["roce_packets"], 322);
    assert_eq!(t["checksum_ok"], 322 + 35 + 37);
    assert_eq!(t["mpa_frames"], 2 + 4 + 2 + 4);
}

#[test]
fn one_flipped_roce_payload_bit_fails_exactly_that_packet() {
    // rxe-head.pcap frame 12 is an RDMA WRITE_ONLY with 64 bytes of payload; flip a bit
    // 10 bytes before the frame's end (inside the payload, before the ICRC).
    let f = flip_bit("rxe-head.pcap", 12, 10);
    let (code, doc) = run_json(&[&f.0]);
    assert_eq!(code, 1);
    let bad: Vec<_> =
        doc["files"][0]["records"].as_array().unwrap().iter().filter(|r| r["check"]["status"] != "ok").collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0]["frame"], 12);
    assert_eq!(bad[0]["check"]["status"], "bad_checksum");
    let text = String::from_utf8(run(&[&f.0]).stdout).unwrap();
    assert!(text
        .lines()
        .any(|l| l.starts_with("12 10.77.0.2 -> 10.77.0.3 RC RDMA_WRITE_ONLY") && l.contains("icrc=BAD")));
}

#[test]
fn one_flipped_fpdu_payload_bit_fails_exactly_that_fpdu() {
    // siw-crc-rping.pcap frame 13 is a Write FPDU; flip a payload bit before its CRC.
    let f = flip_bit("siw-crc-rping.pcap", 13, 10);
    let (code, doc) = run_json(&[&f.0]);
    assert_eq!(code, 1);
    let records = doc["files"][0]["records"].as_array().unwrap();
    let bad: Vec<_> = records.iter().filter(|r| r["check"]["status"] == "bad_checksum").collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0]["frame"], 13);
    assert!(bad[0]["summary"].as_str().unwrap().starts_with("RDMAP WRITE"));
    assert_eq!(records.iter().filter(|r| r["check"]["status"] == "ok").count(), 34);
}

#[test]
fn garbage_and_empty_files_are_refused_with_status_2() {
    let garbage = Scratch::new("garbage", b"this is not a capture at all, just text\n");
    let empty = Scratch::new("empty", b"");
    for f in [&garbage, &empty] {
        let out = run(&[&f.0]);
        assert_eq!(out.status.code(), Some(2));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("error: not a pcap or pcapng file"), "{text}");
    }
    let missing = std::env::temp_dir().join("softrdma-no-such-file.pcap");
    let out = run(&[&missing]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stdout).unwrap().contains("cannot read"));
}

#[test]
fn a_capture_cut_mid_record_keeps_what_it_has() {
    let bytes = std::fs::read(capture("rxe-head.pcap")).unwrap();
    let cut = Scratch::new("cut", &bytes[..bytes.len() - 10]); // frame 200 is cut
    let (code, doc) = run_json(&[&cut.0]);
    assert_eq!(code, 0);
    assert_eq!(doc["files"][0]["tally"]["roce_packets"], 199);
    let notes = doc["files"][0]["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("cut-off record after frame 199")), "{notes:?}");
}

/// Rewrites a classic pcap as if captured with a snaplen of `snap` bytes.
fn with_snaplen(name: &str, snap: usize) -> Scratch {
    let bytes = std::fs::read(capture(name)).unwrap();
    let mut out = bytes[..24].to_vec();
    out[16..20].copy_from_slice(&(snap as u32).to_le_bytes());
    for (start, len) in record_offsets(&bytes) {
        let keep = len.min(snap);
        let mut hdr = bytes[start - 16..start].to_vec();
        hdr[8..12].copy_from_slice(&(keep as u32).to_le_bytes());
        out.extend_from_slice(&hdr);
        out.extend_from_slice(&bytes[start..start + keep]);
    }
    Scratch::new(&format!("snap{snap}-{name}"), &out)
}

#[test]
fn snaplen_truncated_packets_are_reported_unchecked_not_bad() {
    let roce = with_snaplen("rxe-write_bw.pcap", 96);
    let (code, doc) = run_json(&[&roce.0]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["tally"]["truncated"], 60);
    assert_eq!(doc["tally"]["checksum_ok"], 0);
    let tcp = with_snaplen("siw-crc-write_bw.pcap", 96);
    let (code, doc) = run_json(&[&tcp.0]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["tally"]["checksum_bad"], 0);
    assert!(doc["tally"]["truncated"].as_u64().unwrap() >= 1);
}

#[test]
fn non_rdma_capture_says_so_and_passes() {
    let out = run(&[&capture("siw-hostprobe.pcap")]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("note: no RDMA traffic found"), "{text}");
    let (_, doc) = run_json(&[&capture("siw-hostprobe.pcap")]);
    assert_eq!(doc["tally"]["other_frames"], 32, "every frame is plain TCP");
}

#[test]
fn random_garbage_after_a_valid_header_never_panics() {
    let bytes = std::fs::read(capture("rxe-tohost.pcap")).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..20 {
        let mut b = bytes[..24 + round * 7].to_vec();
        for _ in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            b.push(seed as u8);
        }
        let f = Scratch::new(&format!("noise{round}"), &b);
        let out = run(&[&f.0]);
        let code = out.status.code().expect("exited, did not crash");
        assert!(code <= 2, "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stderr.is_empty(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn pcapng_from_editcap_reads_like_the_pcap() {
    // editcap ships with tshark (Debian's wireshark-common), which the suite needs anyway.
    for name in ["siw-crc-rping.pcap", "rxe-head.pcap"] {
        let ng = std::env::temp_dir().join(format!("softrdma-{}-{name}ng", std::process::id()));
        let status = Command::new("editcap")
            .args(["-F", "pcapng"])
            .arg(capture(name))
            .arg(&ng)
            .status()
            .expect("editcap (apt-get install tshark)");
        assert!(status.success());
        let (code_ng, doc_ng) = run_json(&[&ng]);
        let _ = std::fs::remove_file(&ng);
        let (code, doc) = run_json(&[&capture(name)]);
        assert_eq!((code_ng, code), (0, 0));
        assert_eq!(doc_ng["tally"], doc["tally"], "{name}");
        assert_eq!(doc_ng["files"][0]["records"], doc["files"][0]["records"], "{name}");
    }
}
