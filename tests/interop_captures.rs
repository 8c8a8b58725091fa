//! The live captures of softrdma against Linux rxe (`pcaps/interop/`, made by
//! `tests/interop/rxe.sh`): every RoCEv2 frame, from either side, carries a good ICRC and
//! parses; both directions of every pairing are there.

use softrdma::capture::check_bytes;

#[test]
fn every_interop_capture_checks_clean_in_both_directions() {
    let dir = format!("{}/pcaps/interop", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("pcaps/interop")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    names.sort();
    let tests = ["rc_pingpong", "write_bw", "read_bw", "send_bw", "atomic_bw", "write_lat", "read_lat", "send_lat"];
    for dir_name in ["rxe-serves", "softrdma-serves"] {
        for t in tests {
            assert!(names.contains(&format!("{dir_name}-{t}.pcap")), "{dir_name}-{t}.pcap is missing");
        }
    }
    for n in names.iter().filter(|n| !n.starts_with("siw-")) {
        let bytes = std::fs::read(format!("{dir}/{n}")).unwrap();
        let rep = check_bytes(n, &bytes);
        let t = &rep.tally;
        assert!(rep.error.is_none(), "{n}: {:?}", rep.error);
        assert!(t.roce_packets >= 100, "{n}: {} RoCEv2 packets", t.roce_packets);
        assert_eq!((t.checksum_bad, t.malformed), (0, 0), "{n}");
        assert_eq!(t.checksum_ok, t.roce_packets, "{n}");
        // Wireshark decodes every RoCEv2 frame as InfiniBand without malformed or expert marks.
        let out = std::process::Command::new("tshark")
            .args(["-r", &format!("{dir}/{n}"), "--disable-protocol", "rpcordma", "-Y", "udp.dstport == 4791"])
            .args(["-T", "fields", "-E", "separator=,", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed"])
            .args(["-e", "_ws.expert.severity"])
            .output()
            .expect("tshark is needed for this test: apt-get install tshark (see README)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().count() as u64, t.roce_packets, "{n}");
        for row in text.lines() {
            let f: Vec<&str> = row.split(',').collect();
            assert!(!f[0].is_empty() && f[1..].iter().all(|x| x.is_empty()), "{n}: tshark says {row}");
        }
    }
}

/// softrdma against Linux siw (`tests/interop/siw.sh`): rping and ib_write_bw / ib_read_bw /
/// ib_send_bw -R, both ways, MPA CRC off and on. Every pairing is there; every FPDU from
/// either side parses and, with CRC, carries a good CRC32c; Wireshark decodes every iWARP
/// frame without a malformed or error mark.
#[test]
fn siw_captures_check_clean_with_and_without_crc() {
    let dir = format!("{}/pcaps/interop", env!("CARGO_MANIFEST_DIR"));
    for crc in ["off", "on"] {
        for serves in ["siw-serves", "softrdma-serves"] {
            for tool in ["", "-write_bw", "-read_bw", "-send_bw"] {
                let n = format!("siw-{crc}-{serves}{tool}.pcap");
                let path = format!("{dir}/{n}");
                let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{n}: {e}"));
                let rep = check_bytes(&n, &bytes);
                let t = &rep.tally;
                assert!(rep.error.is_none(), "{n}: {:?}", rep.error);
                // rping: one connection; perftest -R: the exchange's and the test's.
                assert_eq!(t.mpa_frames, if tool.is_empty() { 2 } else { 4 }, "{n}: MPA Requests and Replies");
                if tool.is_empty() {
                    // rping -C 5: per ping two advertisements, a Read Request, a Read
                    // Response, two go-aheads and a Write: 35 FPDUs.
                    assert_eq!(t.fpdus, 35, "{n}");
                } else {
                    assert!(t.fpdus >= 100, "{n}: {} FPDUs", t.fpdus);
                }
                assert_eq!((t.checksum_bad, t.malformed), (0, 0), "{n}");
                let (ok, none) = if crc == "on" { (t.fpdus, 0) } else { (0, t.fpdus) };
                assert_eq!((t.checksum_ok, t.crc_not_negotiated), (ok, none), "{n}");
                tshark_clean(&path, &n);
            }
        }
    }
}

/// tshark's iWARP dissectors find nothing malformed and raise no error. (Send payloads
/// are test data, not RPC-over-RDMA, whose heuristic would misread them.)
fn tshark_clean(path: &str, n: &str) {
    let out = std::process::Command::new("tshark")
        .args(["-r", path, "--disable-protocol", "rpcordma", "-Y", "_ws.malformed || _ws.expert.severity == error"])
        .output()
        .expect("tshark is needed for this test: apt-get install tshark (see README)");
    assert!(out.status.success(), "{n}: tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.trim().is_empty(), "{n}: tshark marks frames:\n{text}");
    let all = std::process::Command::new("tshark")
        .args(["-r", path, "--disable-protocol", "rpcordma", "-Y", "iwarp_ddp_rdmap"])
        .output()
        .expect("tshark");
    assert!(String::from_utf8_lossy(&all.stdout).lines().count() > 0, "{n}: tshark sees no DDP/RDMAP");
}
