//! Conformance against Wireshark's dissectors (tshark): on the rxe/siw captures, tshark and
//! softrdma read the same field values; on packets softrdma emits, tshark finds nothing
//! malformed, reads back what was written, and (for iWARP) verifies the MPA CRC itself.
//!
//! Needs `tshark` (Debian package `tshark`; `.ci/run` installs it).

use etherparse::PacketBuilder;
use softrdma::capture::check_bytes;
use softrdma::capture::frame::{dissect, Dissected};
use softrdma::capture::reader::read_frames;
use softrdma::proto::iwarp::ddp::{DdpBuffer, DdpRepr};
use softrdma::proto::iwarp::fpdu::FpduRepr;
use softrdma::proto::iwarp::mpa::{FrameKind, IrdOrd, MpaFrameRepr};
use softrdma::proto::iwarp::rdmap::{self, Body, Control, MessageRepr, Opcode, ReadRequestRepr};
use softrdma::proto::roce::ext::*;
use softrdma::proto::roce::icrc::{self, IpHeader};
use softrdma::proto::roce::opcode::{Headers, Payload, TABLE};
use softrdma::proto::roce::packet::pad_for;
use softrdma::proto::roce::{BthRepr, Psn, RocePacket, RoceRepr};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs tshark and returns one row of fields per displayed frame.
fn tshark(file: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut c = Command::new("tshark");
    c.args(["--disable-protocol", "rpcordma", "-r"]).arg(file);
    c.args(["-Y", filter, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = c.output().expect("tshark is needed for this test: apt-get install tshark (see README)");
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| l.split('\t').map(str::to_string).collect()).collect()
}

/// tshark prints hex fields as `0x...` and the rest in decimal.
fn num(s: &str) -> Option<u64> {
    if s.is_empty() {
        None
    } else if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

fn capture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pcaps/linux").join(name)
}

const ROCE_FIELDS: [&str; 9] = [
    "frame.number",
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.p_key",
    "infiniband.bth.padcnt",
    "infiniband.reth.va",
    "infiniband.reth.dmalen",
    "infiniband.aeth.msn",
];

/// softrdma's reading of the same fields, by frame number.
fn our_roce_fields(file: &Path) -> HashMap<u64, [Option<u64>; 8]> {
    let frames = read_frames(&std::fs::read(file).unwrap()).unwrap();
    let mut out = HashMap::new();
    for f in &frames.frames {
        let Dissected::Udp(d) = dissect(f) else {
            continue;
        };
        if d.dst_port != 4791 {
            continue;
        }
        let r = RoceRepr::parse(&RocePacket::new_checked(d.payload).unwrap()).unwrap();
        out.insert(
            f.number,
            [
                Some(u64::from(r.bth.opcode)),
                Some(u64::from(r.bth.dest_qp)),
                Some(u64::from(r.bth.psn.value())),
                Some(u64::from(r.bth.pkey)),
                Some(u64::from(r.bth.pad_count)),
                r.reth.map(|x| x.va),
                r.reth.map(|x| u64::from(x.dma_len)),
                r.aeth.map(|x| u64::from(x.msn)),
            ],
        );
    }
    out
}

#[test]
fn tshark_and_softrdma_read_the_same_roce_fields() {
    for name in ["rxe-head.pcap", "rxe-write_bw.pcap", "both-rping.pcap", "rxe-tohost.pcap"] {
        let path = capture(name);
        let ours = our_roce_fields(&path);
        // ICMP errors quote the packets they answer; only the packets themselves count.
        let rows = tshark(&path, "infiniband && !icmp", &ROCE_FIELDS);
        assert_eq!(rows.len(), ours.len(), "{name}: packets tshark decodes as InfiniBand");
        for row in rows {
            let frame = num(&row[0]).unwrap();
            let theirs: Vec<Option<u64>> = row[1..].iter().map(|s| num(s)).collect();
            assert_eq!(theirs, ours[&frame].to_vec(), "{name} frame {frame}");
        }
    }
}

#[test]
fn tshark_and_softrdma_read_the_same_cm_fields() {
    let path = capture("rxe-head.pcap");
    let rows = tshark(
        &path,
        "infiniband.cm.req",
        &["infiniband.cm.req.localqpn", "infiniband.cm.req.startpsn", "infiniband.cm.req.ip_cm.sport"],
    );
    let report = check_bytes("rxe-head", &std::fs::read(&path).unwrap());
    let reqs: Vec<_> = report.records.iter().filter(|r| r.summary.contains("CM REQ")).collect();
    assert_eq!(rows.len(), reqs.len());
    for (row, rec) in rows.iter().zip(reqs) {
        let (qpn, psn, sport) = (num(&row[0]).unwrap(), num(&row[1]).unwrap(), num(&row[2]).unwrap());
        assert!(rec.summary.contains(&format!("qpn=0x{qpn:x} psn=0x{psn:06x}")), "{}", rec.summary);
        assert!(rec.summary.contains(&format!(":{sport} -> ")), "{}", rec.summary);
    }
}

#[test]
fn tshark_and_softrdma_read_the_same_iwarp_fields() {
    for name in ["siw-rping.pcap", "siw-crc-rping.pcap"] {
        let path = capture(name);
        let rows = tshark(
            &path,
            "iwarp_ddp",
            &["frame.number", "iwarp_rdma.opcode", "iwarp_ddp.stag", "iwarp_ddp.tagged_offset", "iwarp_ddp.msn"],
        );
        let report = check_bytes(name, &std::fs::read(&path).unwrap());
        let fpdus: HashMap<u64, &str> = report
            .records
            .iter()
            .filter(|r| r.summary.starts_with("RDMAP"))
            .map(|r| (r.frame, r.summary.as_str()))
            .collect();
        assert_eq!(rows.len(), fpdus.len(), "{name}: one FPDU per frame in these captures");
        for row in rows {
            let s = fpdus[&num(&row[0]).unwrap()];
            let op = Opcode::from_bits(num(&row[1]).unwrap() as u8).unwrap();
            assert!(s.starts_with(&format!("RDMAP {} ", op.name())), "{s}");
            if let (Some(stag), Some(to)) = (num(&row[2]), num(&row[3])) {
                assert!(s.contains(&format!("stag=0x{stag:08x} to=0x{to:x}")), "{s}");
            }
            if let Some(msn) = num(&row[4]) {
                assert!(s.contains(&format!("msn={msn} ")), "{s}");
            }
        }
    }
}

/// A minimal classic pcap writer for test output (Ethernet link type).
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&65535u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        b.extend_from_slice(&(i as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(f);
    }
    std::fs::write(path, b).unwrap();
}

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// Wraps a RoCEv2 packet in Ethernet/IPv4/UDP and fills its ICRC over the real headers.
fn roce_frame(packet: &[u8], ident: u16) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2(MAC_A, MAC_B).ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64).udp(49152, 4791);
    let mut f = Vec::new();
    builder.write(&mut f, packet).unwrap();
    f[18..20].copy_from_slice(&ident.to_be_bytes());
    let ip_sum = {
        f[24..26].fill(0);
        let mut s = 0u32;
        for c in f[14..34].chunks(2) {
            s += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    };
    f[24..26].copy_from_slice(&ip_sum.to_be_bytes());
    f[40..42].fill(0); // UDP checksum 0, as rxe sends
    let (head, pkt) = f.split_at_mut(42);
    icrc::fill(IpHeader::V4(&head[14..34]), &head[34..42], pkt).unwrap();
    f
}

/// One packet of every opcode in the table, with distinctive field values.
fn every_opcode() -> Vec<(u8, u32, u32, Vec<u8>)> {
    let payload: Vec<u8> = (0..61u8).collect();
    let mut out = Vec::new();
    for (i, info) in TABLE.iter().flatten().enumerate() {
        let h = info.headers;
        let data: &[u8] = match info.payload {
            Payload::None => &[],
            Payload::Fixed(n) => &payload[..n],
            Payload::Any => &payload,
        };
        let (qp, psn) = (0x100 + i as u32, 0xff_fff0 + i as u32);
        let r = RoceRepr {
            bth: BthRepr {
                opcode: info.code,
                solicited: false,
                mig_req: true,
                pad_count: pad_for(data.len()),
                tver: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: qp,
                ack_req: info.ends_message(),
                psn: Psn::new(psn),
            },
            deth: h.contains(Headers::DETH).then_some(DethRepr { qkey: 0x1111_1111, src_qp: 0x22 }),
            xrceth: h.contains(Headers::XRCETH).then_some(XrcEthRepr { srqn: 0x33 }),
            feth: h.contains(Headers::FETH).then_some(FethRepr { selectivity: 1, placement_type: 1 }),
            reth: h.contains(Headers::RETH).then_some(RethRepr { va: 0x7f00_1234_5678, rkey: 0xabcd, dma_len: 61 }),
            atomic_eth: h.contains(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
                va: 0x1000,
                rkey: 7,
                swap_add: 5,
                compare: 3,
            }),
            aeth: h.contains(Headers::AETH).then_some(AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn: 9 }),
            atomic_ack_eth: h.contains(Headers::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr { original_data: 42 }),
            immdt: h.contains(Headers::IMMDT).then_some(ImmDtRepr { imm: 0xdead_beef }),
            ieth: h.contains(Headers::IETH).then_some(IethRepr { rkey: 0x5555 }),
            payload: data,
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b).unwrap();
        out.push((info.code, qp, psn & 0xff_ffff, b));
    }
    out
}

fn scratch(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("softrdma-tshark-{}-{tag}.pcap", std::process::id()))
}

#[test]
fn tshark_decodes_every_opcode_softrdma_emits() {
    let packets = every_opcode();
    let frames: Vec<Vec<u8>> = packets.iter().enumerate().map(|(i, p)| roce_frame(&p.3, 0x4000 + i as u16)).collect();
    let path = scratch("roce");
    write_pcap(&path, &frames);
    let report = check_bytes("emitted", &std::fs::read(&path).unwrap());
    assert_eq!(report.tally.checksum_ok as usize, packets.len(), "{:?}", report.records);
    let rows = tshark(
        &path,
        "udp.dstport == 4791",
        &[
            "frame.number",
            "infiniband.bth.opcode",
            "infiniband.bth.destqp",
            "infiniband.bth.psn",
            "_ws.malformed",
            "_ws.expert.severity",
        ],
    );
    let _ = std::fs::remove_file(&path);
    assert_eq!(rows.len(), packets.len());
    // Wireshark 4.0 has no rows for FLUSH (0x1c), ATOMIC WRITE (0x1d) or CNP (0x81): it
    // shows their BTH only. Everything else must decode cleanly.
    for (row, (code, qp, psn, _)) in rows.iter().zip(&packets) {
        assert_eq!(num(&row[1]), Some(u64::from(*code)), "{row:?}");
        assert_eq!(num(&row[2]), Some(u64::from(*qp)), "opcode 0x{code:02x}");
        assert_eq!(num(&row[3]), Some(u64::from(*psn)), "opcode 0x{code:02x}");
        if ![0x1c, 0x1d, 0x81].contains(code) {
            assert!(row[4].is_empty() && row[5].is_empty(), "opcode 0x{code:02x}: tshark says {row:?}");
        }
    }
}

/// An MPA Request or Reply with CRC, IRD/ORD 4/4 and 8 bytes of private data.
fn mpa_frame(kind: FrameKind) -> Vec<u8> {
    let io = IrdOrd { ird: 4, ord: 4, ..Default::default() };
    let m = MpaFrameRepr {
        kind,
        markers: false,
        crc: true,
        reject: false,
        reserved: 0,
        revision: 2,
        ird_ord: Some(io),
        private_data: b"softrdma",
    };
    let mut b = vec![0u8; m.buffer_len()];
    m.emit(&mut b).unwrap();
    b
}

/// A Send, a Write and a Read Request, each framed as an FPDU with CRC.
fn fpdus() -> Vec<Vec<u8>> {
    let payload: Vec<u8> = (0..100u8).collect();
    let ctrl = |op| Control { version: rdmap::VERSION, opcode: op };
    let ddp = |buffer| DdpRepr { last: true, version: 1, rsvd_ulp: 0, buffer };
    let untagged = |qn| DdpBuffer::Untagged { rsvd_ulp: 0, qn, msn: 1, mo: 0 };
    let read = ReadRequestRepr { sink_stag: 0x77, sink_to: 0x8000, size: 100, src_stag: 0x1234_5600, src_to: 0x7000 };
    let msgs = [
        MessageRepr { ddp: ddp(untagged(0)), control: ctrl(Opcode::Send), body: Body::Data(&payload) },
        MessageRepr {
            ddp: ddp(DdpBuffer::Tagged { stag: 0x1234_5600, to: 0x7000 }),
            control: ctrl(Opcode::Write),
            body: Body::Data(&payload[..37]),
        },
        MessageRepr { ddp: ddp(untagged(1)), control: ctrl(Opcode::ReadRequest), body: Body::ReadRequest(read) },
    ];
    msgs.iter()
        .map(|m| {
            let mut ulpdu = vec![0u8; m.buffer_len()];
            m.emit(&mut ulpdu).unwrap();
            let f = FpduRepr { ulpdu: &ulpdu, pad: [0; 3], with_crc: true };
            let mut b = vec![0u8; f.buffer_len()];
            f.emit(&mut b).unwrap();
            b
        })
        .collect()
}

/// One TCP connection, 10.0.0.1:40000 to 10.0.0.2:7174, carrying `payloads` in order
/// (`true`: from the initiator), after a SYN each way.
fn tcp_frames(payloads: &[(bool, Vec<u8>)]) -> Vec<Vec<u8>> {
    let mut seq = [1000u32, 5000u32];
    let mut frames = Vec::new();
    let syns = [(true, Vec::new()), (false, Vec::new())];
    for (n, (from_a, payload)) in syns.iter().chain(payloads).enumerate() {
        let (i, j) = if *from_a { (0, 1) } else { (1, 0) };
        let eth = if *from_a { PacketBuilder::ethernet2(MAC_A, MAC_B) } else { PacketBuilder::ethernet2(MAC_B, MAC_A) };
        let ip = if *from_a {
            eth.ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        } else {
            eth.ipv4([10, 0, 0, 2], [10, 0, 0, 1], 64)
        };
        let (sp, dp) = if *from_a { (40000, 7174) } else { (7174, 40000) };
        let syn = n < 2;
        let tcp = ip.tcp(sp, dp, seq[i], 65535);
        let tcp = if syn { tcp.syn() } else { tcp.ack(seq[j]).psh() };
        let mut f = Vec::new();
        tcp.write(&mut f, payload).unwrap();
        seq[i] = seq[i].wrapping_add(payload.len() as u32 + syn as u32);
        frames.push(f);
    }
    frames
}

/// An iWARP connection softrdma writes: MPA Request/Reply with CRC, then a Send, a Write
/// and a Read Request from the initiator.
fn iwarp_frames() -> Vec<Vec<u8>> {
    let mut payloads = vec![(true, mpa_frame(FrameKind::Request)), (false, mpa_frame(FrameKind::Reply))];
    payloads.extend(fpdus().into_iter().map(|f| (true, f)));
    tcp_frames(&payloads)
}

#[test]
fn tshark_verifies_the_mpa_crc_of_fpdus_softrdma_emits() {
    let path = scratch("iwarp");
    write_pcap(&path, &iwarp_frames());
    let report = check_bytes("emitted", &std::fs::read(&path).unwrap());
    assert_eq!(
        (report.tally.mpa_frames, report.tally.fpdus, report.tally.checksum_ok),
        (2, 3, 3),
        "{:?}",
        report.records
    );
    let rows = tshark(
        &path,
        "iwarp_mpa",
        &["frame.number", "iwarp_mpa.crc_check", "iwarp_rdma.opcode", "iwarp_mpa.crc_flag", "_ws.malformed"],
    );
    // tshark states its CRC verdict only in the detail view: "CRC check: 0x... (Good CRC32)".
    let detail = Command::new("tshark").arg("-r").arg(&path).arg("-V").output().expect("tshark");
    let detail = String::from_utf8_lossy(&detail.stdout).to_string();
    let _ = std::fs::remove_file(&path);
    assert_eq!(detail.matches("(Good CRC32)").count(), 3, "{detail}");
    assert!(!detail.contains("Bad CRC"), "{detail}");
    assert_eq!(rows.len(), 5, "{rows:?}");
    let fpdus: Vec<_> = rows.iter().filter(|r| !r[2].is_empty()).collect();
    assert_eq!(fpdus.len(), 3, "{rows:?}");
    for r in &fpdus {
        assert!(num(&r[1]).is_some(), "tshark checked the CRC: {r:?}");
    }
    assert_eq!(fpdus.iter().map(|r| num(&r[2]).unwrap()).collect::<Vec<_>>(), vec![3, 0, 1]);
    for r in &rows {
        assert!(r[4].is_empty(), "malformed: {r:?}");
    }
}
