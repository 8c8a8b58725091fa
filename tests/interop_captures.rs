//! The live captures of softrdma against Linux rxe and siw (`pcaps/interop/`, made by
//! `tests/interop/rxe.sh` and `siw.sh`, also with softrdma as a raw device: `raw-*`): every
//! RoCEv2 frame, from either side, carries a good ICRC and parses; every FPDU parses; both
//! directions of every pairing are there.

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
    for dir_name in ["rxe-serves", "softrdma-serves", "raw-rxe-serves", "raw-softrdma-serves"] {
        for t in tests {
            assert!(names.contains(&format!("{dir_name}-{t}.pcap")), "{dir_name}-{t}.pcap is missing");
        }
    }
    // rdma_cm on RoCEv2 (rping, perftest -R) and ibv_ud_pingpong, both ways.
    for dir_name in ["rxe-serves", "softrdma-serves"] {
        for t in CM_CASES.iter().chain(&["ud_pingpong"]) {
            assert!(names.contains(&format!("{dir_name}-{t}.pcap")), "{dir_name}-{t}.pcap is missing");
        }
    }
    for n in names.iter().filter(|n| !n.starts_with("siw-") && !n.starts_with("raw-siw-")) {
        let bytes = std::fs::read(format!("{dir}/{n}")).unwrap();
        let rep = check_bytes(n, &bytes);
        let t = &rep.tally;
        assert!(rep.error.is_none(), "{n}: {:?}", rep.error);
        // mckey's captures hold its 50 datagrams one way; every other pairing more.
        let least = if n.contains("mckey") { 50 } else { 100 };
        assert!(t.roce_packets >= least, "{n}: {} RoCEv2 packets", t.roce_packets);
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

/// The rdma_cm pairings with rxe: rping, and perftest's tools with -R.
const CM_CASES: [&str; 8] =
    ["rping", "write_bw_cm", "read_bw_cm", "send_bw_cm", "atomic_bw_cm", "write_lat_cm", "read_lat_cm", "send_lat_cm"];

/// Every rdma_cm pairing with rxe, either way, connected through the IB CM: REQ, REP and
/// RTU on QP1 as `softrdma pcap check` and Wireshark decode them, from both sides.
#[test]
fn rdma_cm_captures_hold_the_cm_exchange_both_ways() {
    let dir = format!("{}/pcaps/interop", env!("CARGO_MANIFEST_DIR"));
    for serves in ["rxe-serves", "softrdma-serves"] {
        for t in CM_CASES {
            let n = format!("{serves}-{t}.pcap");
            let rep = check_bytes(&n, &std::fs::read(format!("{dir}/{n}")).unwrap());
            assert!(rep.tally.cm_mads >= 3, "{n}: {} CM MADs", rep.tally.cm_mads);
            let out = std::process::Command::new("tshark")
                .args(["-r", &format!("{dir}/{n}"), "-Y", "infiniband.bth.destqp == 1", "-T", "fields"])
                .args(["-e", "ip.src", "-e", "infiniband.mad.attributeid"])
                .output()
                .expect("tshark is needed for this test: apt-get install tshark (see README)");
            let text = String::from_utf8_lossy(&out.stdout);
            // REQ (0x0010) from the initiator, REP (0x0013) from the responder, RTU (0x0014).
            let (client, server) =
                if serves == "rxe-serves" { ("10.77.0.1", "10.77.0.2") } else { ("10.77.0.2", "10.77.0.1") };
            for (from, attr) in [(client, "0x0010"), (server, "0x0013"), (client, "0x0014")] {
                assert!(text.lines().any(|l| l == format!("{from}\t{attr}")), "{n}: no {attr} from {from}:\n{text}");
            }
        }
    }
}

/// softrdma as a raw device (10.77.0.11) against rxe: its frames carry what an RDMA NIC
/// sends (IPv4 DF, its own changing Identification, ECT(0), a UDP source port from the
/// top quarter, UDP checksum 0), as Wireshark reads them.
#[test]
fn raw_device_frames_carry_what_a_nic_sends() {
    let dir = format!("{}/pcaps/interop", env!("CARGO_MANIFEST_DIR"));
    for n in
        ["raw-rxe-serves-write_bw.pcap", "raw-softrdma-serves-read_bw.pcap", "raw-softrdma-serves-rc_pingpong.pcap"]
    {
        let out = std::process::Command::new("tshark")
            .args(["-r", &format!("{dir}/{n}"), "-Y", "udp.dstport == 4791 && ip.src == 10.77.0.11"])
            .args(["-T", "fields", "-E", "separator=,", "-e", "ip.flags.df", "-e", "ip.dsfield.ecn", "-e", "ip.id"])
            .args(["-e", "udp.srcport", "-e", "udp.checksum"])
            .output()
            .expect("tshark is needed for this test: apt-get install tshark (see README)");
        let text = String::from_utf8_lossy(&out.stdout);
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
        assert!(rows.len() >= 50, "{n}: {} frames from the raw device", rows.len());
        let ids: std::collections::HashSet<&str> = rows.iter().map(|r| r[2]).collect();
        assert!(ids.len() > rows.len() / 2, "{n}: the Identification counts ({} distinct)", ids.len());
        for r in &rows {
            let sport = r[3].parse::<u16>().unwrap_or(0);
            assert_eq!((r[0], r[1], r[4]), ("1", "2", "0x0000"), "{n}: {r:?}");
            assert!(sport >= 0xc000, "{n}: source port {sport}");
        }
    }
}

/// softrdma against Linux siw (`tests/interop/siw.sh`): rping and ib_{write,read,send}_bw
/// and ib_{write,read,send}_lat -R, both ways, MPA CRC off and on, on kernel TCP and (`raw-`) on smoltcp. Every pairing is there; every FPDU from
/// either side parses and, with CRC, carries a good CRC32c; Wireshark decodes every iWARP
/// frame without a malformed or error mark.
#[test]
fn siw_captures_check_clean_with_and_without_crc() {
    let dir = format!("{}/pcaps/interop", env!("CARGO_MANIFEST_DIR"));
    // `raw-`: softrdma's iWARP on smoltcp over raw Ethernet.
    let runs = ["", "raw-"].into_iter().flat_map(|p| ["off", "on"].map(move |c| (p, c)));
    for (prefix, crc) in runs {
        for serves in ["siw-serves", "softrdma-serves"] {
            for tool in ["", "-write_bw", "-read_bw", "-send_bw", "-write_lat", "-read_lat", "-send_lat"] {
                let n = format!("{prefix}siw-{crc}-{serves}{tool}.pcap");
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

/// The UD port space of rdma_cm against rxe (udaddy, `interop/run --capi`), both ways:
/// each side's SIDR_REQ names the UDP port space and port 7174 with rdma_cm's IP header,
/// and each SIDR_REP answers it valid with the responder's QPN and rdma_cm's Q_Key, as
/// the Linux CM and softrdma's CM write them (IBTA 12.11).
#[test]
fn udaddy_captures_hold_a_valid_sidr_exchange_both_ways() {
    use softrdma::proto::cm::{cma, msg::sidr_status, CmMadRepr, CmMessage, MadPacket};
    let dir = format!("{}/pcaps/interop", env!("CARGO_MANIFEST_DIR"));
    for n in ["rxe-serves-udaddy.pcap", "softrdma-serves-udaddy.pcap"] {
        let file = std::fs::File::open(format!("{dir}/{n}")).unwrap();
        let mut reader = pcap_file::pcap::PcapReader::new(file).unwrap();
        let (mut req, mut rep) = (None, None);
        while let Some(Ok(p)) = reader.next_packet() {
            // Ethernet, IPv4 (no options), UDP, BTH, DETH, then the MAD.
            let Some(mad) = p.data.get(62..62 + 256) else { continue };
            let Ok(m) = MadPacket::new_checked(mad).and_then(|p| CmMadRepr::parse(&p).map(|m| m.message)) else {
                continue;
            };
            match m {
                CmMessage::SidrReq(r) => req = Some((r.request_id, r.service_id, r.private_data.to_vec())),
                CmMessage::SidrRep(r) => rep = Some((r.request_id, r.status, r.qpn, r.qkey)),
                _ => {}
            }
        }
        let (req_id, sid, pd) = req.unwrap_or_else(|| panic!("{n}: no SIDR_REQ"));
        let (rep_id, status, qpn, qkey) = rep.unwrap_or_else(|| panic!("{n}: no SIDR_REP"));
        assert_eq!(sid.ip_port(), Some((cma::PORT_SPACE_UDP, 7174)), "{n}");
        let hdr = cma::CmaHeader::parse(&pd[..cma::HEADER_LEN]).unwrap();
        assert!(hdr.src.to_string().starts_with("10.78.0."), "{n}: {hdr:?}");
        assert_eq!((rep_id, status, qkey), (req_id, sidr_status::VALID, 0x0123_4567), "{n}");
        assert!(qpn > 1, "{n}: QPN {qpn:#x}");
    }
}

/// Multicast against rxe (mckey, `interop/run --capi --case mckey`), each way: 50 UD
/// SENDs to group 239.78.0.1 with DestQP 0xFFFFFF and rdma_cm's Q_Key (IBTA 9.8.1), from
/// softrdma (rxe receiving) and from rxe. Replayed into a device whose UD QP is attached
/// to the group, rxe's datagrams reach that QP, each once.
#[test]
fn mckey_captures_hold_multicast_datagrams_an_attached_qp_receives() {
    use softrdma::engine::mem::{Access, Pd};
    use softrdma::engine::verbs::*;
    use softrdma::engine::{Device, DeviceConfig};
    use softrdma::proto::roce::{packet::RocePacket, RoceRepr};
    let dir = format!("{}/pcaps/interop", env!("CARGO_MANIFEST_DIR"));
    let group = gid_from_ipv4([239, 78, 0, 1]);
    let mut from_rxe = Vec::new();
    for (n, sender) in [("rxe-serves-mckey.pcap", [10, 78, 0, 1]), ("softrdma-serves-mckey.pcap", [10, 78, 0, 2])] {
        let file = std::fs::File::open(format!("{dir}/{n}")).unwrap();
        let mut reader = pcap_file::pcap::PcapReader::new(file).unwrap();
        let mut count = 0;
        while let Some(Ok(p)) = reader.next_packet() {
            // Ethernet, IPv4 (no options), UDP, then BTH, DETH and the payload.
            assert_eq!((&p.data[26..30], &p.data[30..34]), (&sender[..], &[239, 78, 0, 1][..]), "{n}");
            let payload = &p.data[42..];
            let r = RocePacket::new_checked(payload).and_then(|q| RoceRepr::parse(&q)).unwrap();
            assert_eq!(r.bth.dest_qp, 0xff_ffff, "{n}");
            assert_eq!(r.deth.map(|d| d.qkey), Some(0x0123_4567), "{n}");
            if n.starts_with("softrdma-serves") {
                from_rxe.push(payload.to_vec());
            }
            count += 1;
        }
        assert_eq!(count, 50, "{n}");
    }
    let mut dev = Device::new(DeviceConfig {
        gid: gid_from_ipv4([10, 78, 0, 1]),
        seed: Some(1),
        max_qps: 8,
        max_mrs: 8,
        cc: Default::default(),
    });
    let cq = dev.create_cq(64);
    let init = QpInit {
        qp_type: QpType::Ud,
        pd: Pd(1),
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        srq: None,
        xrc: None,
    };
    let qp = dev.create_qp(init).unwrap();
    let st = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    dev.modify_qp(qp, &QpAttr { qkey: Some(0x0123_4567), ..st(QpState::Init) }).unwrap();
    dev.modify_qp(qp, &st(QpState::Rtr)).unwrap();
    let mr = dev.reg_mr(Pd(1), 64 * 256, Access::ALL).unwrap();
    for i in 0..50u64 {
        let sge = Sge { addr: mr.addr + i * 256, length: 256, lkey: mr.lkey };
        dev.post_recv(qp, RecvWr { wr_id: i, sgl: vec![sge] }).unwrap();
    }
    dev.attach_mcast(qp, group).unwrap();
    for p in &from_rxe {
        dev.handle_multicast(0, gid_from_ipv4([10, 78, 0, 2]), group, false, p);
    }
    let wcs = dev.poll_cq(cq, 100);
    assert_eq!(wcs.len(), 50, "one receive per datagram");
    for wc in &wcs {
        // The 40-byte GRH, then mckey's 100-byte message.
        assert_eq!((wc.status, wc.byte_len, wc.src_qp.is_some()), (WcStatus::Success, 140, true), "{wc:?}");
    }
}
