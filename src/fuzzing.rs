//! Entry points of the fuzz targets in `fuzz/`, kept in the library so that a stable test
//! (`tests/fuzz_corpus.rs`) replays every corpus file without nightly. Each takes arbitrary
//! bytes and must never panic. The parser targets are here; the stateful ones (a RoCEv2
//! device, an iWARP QP, MPA setup, the UDP receive check) check more than the absence of a
//! panic: bounded state and output, completions at most once, and no write outside what a
//! peer may write.

mod iwarp;
mod raw;
mod roce;

pub use iwarp::{iwarp_qp, mpa_setup};
pub use raw::raw_frame;
pub use roce::roce_device;

use crate::iwarp::deframer::Deframer;
use crate::proto::cm::{CmMadRepr, CmaHeader, MadPacket};
use crate::proto::iwarp::mpa::{MpaFramePacket, MpaFrameRepr};
use crate::proto::iwarp::rdmap::MessageRepr;
use crate::proto::roce::icrc::{self, IpHeader};
use crate::proto::roce::{RocePacket, RoceRepr};

/// Fixed IPv4 and UDP headers the RoCE target puts in front of its input for the ICRC.
const IPV4: [u8; 20] = [0x45, 0, 0, 0, 0, 1, 0x40, 0, 0x40, 0x11, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
const UDP: [u8; 8] = [0xc0, 0, 0x12, 0xb7, 0, 0, 0, 0];

/// RoCEv2 packet: check the ICRC, parse, re-emit and parse again to the same `Repr`.
pub fn roce_packet(data: &[u8]) {
    let _ = icrc::check(IpHeader::V4(&IPV4), &UDP, data);
    let Ok(p) = RocePacket::new_checked(data) else {
        return;
    };
    let Ok(repr) = RoceRepr::parse(&p) else {
        return;
    };
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut out).expect("a parsed packet re-emits");
    let again = RocePacket::new_checked(&out[..]).and_then(|p| RoceRepr::parse(&p));
    assert_eq!(again, Ok(repr), "RoCEv2 packet round-trips");
    let _ = format!("{repr}");
}

/// MPA stream: the first byte picks markers (bit 0), CRC (bit 1) and the size of the
/// pieces the stream arrives in (bits 2..8); the rest is one direction of a connection,
/// starting with its MPA Request or Reply.
pub fn mpa_stream(data: &[u8]) {
    let Some((&mode, stream)) = data.split_first() else {
        return;
    };
    let fpdus_from = match MpaFramePacket::new_checked(stream) {
        Ok(p) => match MpaFrameRepr::parse(&p) {
            Ok(r) => {
                let _ = format!("{r}");
                p.frame_len()
            }
            Err(_) => 0,
        },
        Err(_) => 0,
    };
    let mut d = Deframer::new(mode & 1 != 0, mode & 2 != 0).with_max_ulpdu_len(16 * 1024);
    let chunk = usize::from(mode >> 2).max(1);
    for piece in stream[fpdus_from..].chunks(chunk) {
        d.push(piece);
        loop {
            match d.next_fpdu() {
                Ok(Some(f)) => ddp_rdmap(&f.ulpdu),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// One DDP segment read as RDMAP.
pub fn ddp_rdmap(data: &[u8]) {
    if let Ok(m) = MessageRepr::parse(data) {
        let mut out = vec![0u8; m.buffer_len()];
        m.emit(&mut out).expect("a parsed message re-emits");
        assert_eq!(out, data, "RDMAP message re-emits byte for byte");
        let _ = format!("{m}");
    }
}

/// One CM MAD (256 bytes; shorter or longer input is an error to report, not a panic).
pub fn cm_mad(data: &[u8]) {
    let Ok(p) = MadPacket::new_checked(data) else {
        return;
    };
    let Ok(m) = CmMadRepr::parse(&p) else { return };
    let _ = format!("{m}");
    if let crate::proto::cm::CmMessage::Req(req) = m.message {
        let _ = CmaHeader::parse(req.private_data);
    }
    let mut out = [0u8; 256];
    if m.emit(&mut out).is_ok() {
        let again = CmMadRepr::parse(&MadPacket::new_checked(&out[..]).expect("256 bytes"));
        assert_eq!(again.ok(), Some(m), "CM MAD round-trips");
    }
}

/// The UDP receive check, then the device: [source IPv4][destination IPv4][TOS]
/// [source port: u16 BE][UDP payload]. Oracle: a datagram found good carries an ICRC that
/// verifies over the header rebuilt with the recovered Identification and DF, and the
/// verdict is the same whatever the receiver guessed.
pub fn udp_receive(data: &[u8]) {
    use crate::transport::headers::{ip_header, udp_header};
    use crate::transport::udp::{check_datagram, DatagramCheck};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    if data.len() < 11 {
        return;
    }
    let ip = |b: &[u8]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
    let (src, dst, tos) = (ip(&data[0..4]), ip(&data[4..8]), data[8]);
    let sport = u16::from_be_bytes([data[9], data[10]]);
    let payload = &data[11..];
    let mut cache = icrc::RecoveryCache::default();
    let checked = check_datagram(&mut cache, SocketAddr::new(src, sport), (dst, 4791), tos, payload, 0);
    assert_eq!(checked, check_datagram(&mut cache, SocketAddr::new(src, sport), (dst, 4791), tos, payload, 0));
    assert_eq!(
        checked,
        check_datagram(&mut cache, SocketAddr::new(src, sport), (dst, 4791), tos, payload, 1),
        "the guess of the Identification changes the cost of the check, never its verdict"
    );
    if let DatagramCheck::Good { src: gid, ce, ident, dont_fragment } = checked {
        let (h, _) = ip_header(src, dst, 8 + payload.len(), ident, dont_fragment, tos);
        let udp = udp_header(sport, 4791, payload.len());
        assert!(icrc::verify(IpHeader::V4(&h[..20]), &udp, payload).is_ok(), "recovered fields verify");
        let cfg = crate::engine::DeviceConfig {
            gid: crate::transport::headers::ip_to_gid(dst),
            seed: Some(1),
            max_qps: 4,
            max_mrs: 4,
            cc: crate::verbs::OpenConfig::new(dst).cc,
        };
        crate::engine::Device::new(cfg).handle_packet_ecn(0, gid, ce, payload);
    }
}
