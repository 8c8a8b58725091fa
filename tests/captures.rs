//! Proof against real peers: every RDMA packet in the Linux rxe and siw captures of
//! `pcaps/linux/` parses, re-emits from its `Repr` byte for byte, and carries the ICRC or
//! MPA CRC that softrdma computes; CM MADs and MPA frames decode to the values the rest of
//! each capture shows.

use softrdma::capture::frame::{dissect, Dissected, IpHeaderBytes, UdpDatagram};
use softrdma::capture::reader::read_frames;
use softrdma::proto::cm::{CmMadRepr, CmMessage, CmaHeader, MadPacket, ServiceId};
use softrdma::proto::iwarp::fpdu::{FpduPacket, FpduRepr};
use softrdma::proto::iwarp::mpa::{FrameKind, MpaFramePacket, MpaFrameRepr};
use softrdma::proto::iwarp::rdmap::MessageRepr;
use softrdma::proto::roce::icrc::{self, IpHeader};
use softrdma::proto::roce::opcode::Operation;
use softrdma::proto::roce::{RocePacket, RoceRepr};
use std::collections::HashMap;
use std::net::IpAddr;

fn load(name: &str) -> Vec<u8> {
    let path = format!("{}/pcaps/linux/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Calls `f` with every RoCEv2 datagram of a capture and its frame number.
fn each_roce(name: &str, mut f: impl FnMut(u64, &UdpDatagram<'_>)) -> usize {
    let frames = read_frames(&load(name)).expect("a capture");
    let mut n = 0;
    for fr in &frames.frames {
        if let Dissected::Udp(d) = dissect(fr) {
            if d.dst_port == 4791 {
                assert!(!d.truncated, "{name} frame {} is truncated", fr.number);
                f(fr.number, &d);
                n += 1;
            }
        }
    }
    n
}

fn ip_of<'a>(d: &'a UdpDatagram<'_>) -> IpHeader<'a> {
    match &d.ip_header {
        IpHeaderBytes::V4(h) => IpHeader::V4(h),
        IpHeaderBytes::V6(h) => IpHeader::V6(h),
    }
}

const ROCE_CAPTURES: [&str; 4] = ["rxe-head.pcap", "rxe-write_bw.pcap", "rxe-tohost.pcap", "both-rping.pcap"];

#[test]
fn every_roce_packet_parses_reemits_and_has_its_icrc() {
    let mut total = 0;
    for name in ROCE_CAPTURES {
        total += each_roce(name, |frame, d| {
            let p = RocePacket::new_checked(d.payload).unwrap_or_else(|e| panic!("{name}#{frame}: {e}"));
            let repr = RoceRepr::parse(&p).unwrap();
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(&mut out).unwrap();
            icrc::fill(ip_of(d), d.udp_header, &mut out).unwrap();
            assert_eq!(out, d.payload, "{name}#{frame} re-emitted with its ICRC");
            assert!(icrc::verify(ip_of(d), d.udp_header, d.payload).is_ok());
        });
    }
    assert_eq!(total, 200 + 60 + 2 + 60);
}

/// A kernel UDP socket hides the IP header: every captured IPv4 packet's Identification and
/// DF flag (rxe's running counter) come back from its ICRC alone, and flipping a payload bit
/// makes recovery fail.
#[test]
fn ipv4_identification_is_recovered_from_every_captured_icrc() {
    let mut total = 0;
    // One cache over every packet, as a receiver keeps it: its answers must not differ.
    let mut cache = icrc::RecoveryCache::default();
    for name in ROCE_CAPTURES {
        total += each_roce(name, |frame, d| {
            let IpHeaderBytes::V4(h) = &d.ip_header else { return };
            let mut blank = h[..20].to_vec();
            blank[4..8].fill(0);
            let got = icrc::recover_ipv4(&blank, d.udp_header, d.payload).unwrap();
            let want = icrc::RecoveredIpv4 { ident: u16::from_be_bytes([h[4], h[5]]), dont_fragment: h[6] & 0x40 != 0 };
            assert_eq!(got, Some(want), "{name}#{frame}");
            assert_eq!(icrc::recover_ipv4_cached(&mut cache, &blank, d.udp_header, d.payload).unwrap(), got);
            let mut bad = d.payload.to_vec();
            bad[12] ^= 0x01;
            assert_eq!(icrc::recover_ipv4(&blank, d.udp_header, &bad).unwrap(), None, "{name}#{frame}");
        });
    }
    assert_eq!(total, 322);
}

/// The CM exchange and the RC traffic that follows it in one capture.
#[derive(Default)]
struct Session {
    req: Option<(IpAddr, u32, u32, u32)>, // (sender, local comm id, qpn, starting psn)
    rep: Option<(IpAddr, u32, u32, u32, u32)>, // (sender, local id, remote id, qpn, psn)
    rtu: Option<(u32, u32)>,
    dreq_qpns: Vec<u32>,
    dreps: usize,
    first_psn_to: HashMap<(IpAddr, u32), u32>, // (dest, QP) -> PSN of the first RC packet to it
}

fn cm_session(name: &str) -> Session {
    let mut s = Session::default();
    each_roce(name, |frame, d| {
        let repr = RoceRepr::parse(&RocePacket::new_checked(d.payload).unwrap()).unwrap();
        let responder_side = matches!(
            repr.info().map(|i| i.operation),
            Some(Operation::Acknowledge | Operation::ReadResponse | Operation::AtomicAcknowledge)
        );
        if repr.bth.dest_qp != 1 {
            // ACKs and responses carry the requester's PSNs: only requests count.
            if responder_side {
                return;
            }
            s.first_psn_to.entry((d.dst, repr.bth.dest_qp)).or_insert(repr.bth.psn.value());
            return;
        }
        let mad = CmMadRepr::parse(&MadPacket::new_checked(repr.payload).unwrap()).unwrap();
        let mut again = [0u8; 256];
        mad.emit(&mut again).unwrap();
        assert_eq!(&again[..], repr.payload, "{name}#{frame}: MAD re-emits byte for byte");
        let deth = repr.deth.expect("MADs travel on UD");
        assert_eq!((deth.qkey, deth.src_qp), (0x8001_0000, 1));
        match mad.message {
            CmMessage::Req(req) => {
                assert_eq!(req.service_id, ServiceId::for_tcp_port(7174), "rping's port");
                let cma = CmaHeader::parse(req.private_data).unwrap();
                assert_eq!((cma.src, cma.dst), (d.src, d.dst), "{name}#{frame}: IP CM header addresses");
                assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
                assert_eq!(req.primary_path.local_lid, 0xffff, "RoCE has no LIDs: permissive");
                s.req.get_or_insert((d.src, req.local_comm_id, req.local_qpn, req.starting_psn));
            }
            CmMessage::Rep(rep) => {
                s.rep.get_or_insert((d.src, rep.local_comm_id, rep.remote_comm_id, rep.local_qpn, rep.starting_psn));
            }
            CmMessage::Rtu(rtu) => {
                s.rtu.get_or_insert((rtu.local_comm_id, rtu.remote_comm_id));
            }
            CmMessage::Dreq(dreq) => s.dreq_qpns.push(dreq.remote_qpn),
            CmMessage::Drep(_) => s.dreps += 1,
            other => panic!("{name}#{frame}: unexpected CM message {other}"),
        }
    });
    s
}

#[test]
fn cm_mads_agree_with_the_rc_traffic_that_follows() {
    for name in ["rxe-head.pcap", "both-rping.pcap"] {
        let s = cm_session(name);
        let (client, req_id, client_qpn, client_psn) = s.req.expect("a REQ");
        let (server, rep_id, rep_remote, server_qpn, server_psn) = s.rep.expect("a REP");
        assert_ne!(client, server);
        assert_eq!(rep_remote, req_id, "REP names the REQ's communication ID");
        assert_eq!(s.rtu, Some((req_id, rep_id)), "RTU carries both IDs");
        // Each side's first RC packet goes to the QPN the other side announced. The starting
        // PSN a side announces is the one it expects to receive first: the first packet
        // sent to it carries it (as the Linux CM programs rq_psn and the peer's sq_psn).
        assert_eq!(s.first_psn_to.get(&(server, server_qpn)), Some(&server_psn), "{name}: PSN into the server");
        assert_eq!(s.first_psn_to.get(&(client, client_qpn)), Some(&client_psn), "{name}: PSN into the client");
        // A DREQ names the QP at the other end of the connection.
        for qpn in &s.dreq_qpns {
            assert!(*qpn == client_qpn || *qpn == server_qpn, "{name}: DREQ for QPN 0x{qpn:x}");
        }
    }
}

#[test]
fn cm_req_to_a_host_without_rdma_decodes() {
    let s = cm_session("rxe-tohost.pcap");
    let (client, _, qpn, _) = s.req.expect("a REQ");
    assert_eq!(client, "10.77.0.2".parse::<IpAddr>().unwrap());
    assert_eq!(qpn, 0x11);
    assert!(s.rep.is_none());
}

/// The payload of each TCP direction in capture order, retransmissions dropped, with the
/// frame each byte range came from; a connection restarts at its SYN.
type Endpoint = (IpAddr, u16);

/// One direction of a TCP connection: source, destination, bytes.
struct Direction {
    src: Endpoint,
    dst: Endpoint,
    isn: u32,
    data: Vec<u8>,
}

fn tcp_streams(name: &str) -> Vec<Direction> {
    let frames = read_frames(&load(name)).expect("a capture");
    let mut streams: Vec<Direction> = Vec::new();
    for fr in &frames.frames {
        let Dissected::Tcp(t) = dissect(fr) else {
            continue;
        };
        assert!(!t.truncated);
        if t.syn {
            let isn = t.seq.wrapping_add(1);
            streams.push(Direction { src: t.src, dst: t.dst, isn, data: Vec::new() });
            continue;
        }
        let found = streams.iter_mut().rev().find(|s| s.src == t.src && s.dst == t.dst);
        let Some(s) = found else { continue };
        let next = s.isn.wrapping_add(s.data.len() as u32);
        if t.seq == next {
            s.data.extend_from_slice(t.payload);
        } else {
            let seen = t.seq.wrapping_sub(s.isn) < s.data.len() as u32;
            assert!(t.payload.is_empty() || seen, "{name}: a gap");
        }
    }
    streams.retain(|s| !s.data.is_empty());
    streams
}

struct MpaExpect {
    file: &'static str,
    crc: bool,
    ird_ord: (u16, u16),
    connections: usize,
}

/// Walks one direction: MPA frame, then FPDUs to the end of what was captured.
fn check_direction(e: &MpaExpect, data: &[u8]) -> (FrameKind, usize) {
    let p = MpaFramePacket::new_checked(data).unwrap();
    let mpa = MpaFrameRepr::parse(&p).unwrap();
    let mut again = vec![0u8; mpa.buffer_len()];
    mpa.emit(&mut again).unwrap();
    assert_eq!(again, &data[..p.frame_len()], "{}: MPA frame re-emits", e.file);
    assert_eq!((mpa.revision, mpa.crc, mpa.markers, mpa.reject), (2, e.crc, false, false), "{}", e.file);
    let io = mpa.ird_ord.expect("siw uses the enhanced setup");
    assert_eq!((io.ird, io.ord), e.ird_ord, "{}: IRD/ORD", e.file);
    assert!(mpa.private_data.is_empty(), "{}: rdma_cm private data length", e.file);
    let mut rest = &data[p.frame_len()..];
    let mut fpdus = 0;
    while let Ok(f) = FpduPacket::new_checked(rest) {
        if e.crc {
            assert_eq!(f.crc(), f.computed_crc(), "{}: FPDU {fpdus} CRC32c", e.file);
        } else {
            assert_eq!(f.crc(), 0, "{}: CRC field is zero without CRC", e.file);
        }
        let repr = FpduRepr::parse(&f, e.crc).unwrap();
        let mut out = vec![0u8; repr.buffer_len()];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, &rest[..f.total_len()], "{}: FPDU {fpdus} re-emits", e.file);
        let m = MessageRepr::parse(f.ulpdu()).unwrap_or_else(|err| panic!("{}: FPDU {fpdus}: {err}", e.file));
        let mut ulpdu = vec![0u8; m.buffer_len()];
        m.emit(&mut ulpdu).unwrap();
        assert_eq!(ulpdu, f.ulpdu(), "{}: DDP/RDMAP re-emits", e.file);
        rest = &rest[f.total_len()..];
        fpdus += 1;
    }
    (mpa.kind, fpdus)
}

#[test]
fn every_mpa_frame_and_fpdu_reemits_with_its_crc() {
    let expect = [
        MpaExpect { file: "siw-rping.pcap", crc: false, ird_ord: (1, 1), connections: 1 },
        MpaExpect { file: "siw-crc-rping.pcap", crc: true, ird_ord: (1, 1), connections: 1 },
        MpaExpect { file: "siw-write_bw.pcap", crc: false, ird_ord: (0, 0), connections: 2 },
        MpaExpect { file: "siw-crc-write_bw.pcap", crc: true, ird_ord: (0, 0), connections: 2 },
    ];
    for e in &expect {
        let streams = tcp_streams(e.file);
        assert_eq!(streams.len(), 2 * e.connections, "{}: directions with data", e.file);
        let mut requests = 0;
        let mut fpdus = 0;
        for Direction { dst, data, .. } in &streams {
            let (kind, n) = check_direction(e, data);
            if kind == FrameKind::Request {
                requests += 1;
                assert!(dst.1 == 7174 || dst.1 == 18517, "Requests go to the listener");
            }
            fpdus += n;
        }
        assert_eq!(requests, e.connections);
        assert!(fpdus >= 30, "{}: only {fpdus} FPDUs", e.file);
    }
}

/// softrdma's MPA setup against siw's own frames: each captured Request, fed to a softrdma
/// responder, and each captured Reply, fed to a softrdma initiator, establish the
/// connection with the CRC choice siw made, and leave the FPDUs after them untouched.
#[test]
fn mpa_setup_accepts_siws_requests_and_replies() {
    use softrdma::iwarp::setup::{Outcome, Policy, Setup};
    for (name, crc) in [
        ("siw-rping.pcap", false),
        ("siw-crc-rping.pcap", true),
        ("siw-write_bw.pcap", false),
        ("siw-crc-write_bw.pcap", true),
    ] {
        let streams = tcp_streams(name);
        let req = streams.iter().find(|s| s.data.starts_with(b"MPA ID Req Frame")).expect("a Request");
        let rep = streams.iter().find(|s| s.data.starts_with(b"MPA ID Rep Frame")).expect("a Reply");
        let frame_len = |d: &[u8]| 20 + usize::from(u16::from_be_bytes([d[18], d[19]]));
        let mut res = Setup::responder(Policy::default(), 0);
        assert_eq!(res.on_bytes(&req.data), frame_len(&req.data), "{name}");
        let mut ini = Setup::initiator(Policy::default(), 0);
        assert_eq!(ini.on_bytes(&rep.data), frame_len(&rep.data), "{name}");
        for (side, o) in [("responder", res.outcome()), ("initiator", ini.outcome())] {
            match o {
                Some(Outcome::Established(n)) => {
                    assert_eq!(n.crc, crc, "{name} {side}");
                    assert!(!n.markers_rx && !n.markers_tx, "siw refuses markers");
                }
                other => panic!("{name} {side}: {other:?}"),
            }
        }
    }
}
