//! Property tests: for every header, `Repr -> emit -> parse == Repr`; and every buffer
//! shorter than a header, or carrying a length beyond its limit, is a typed error.

use proptest::prelude::*;
use softrdma_proto::cm::cma::CmaHeader;
use softrdma_proto::cm::mad::{attr, CmMadRepr, MadHeaderRepr, MadPacket, MGMT_CLASS_CM};
use softrdma_proto::cm::msg::*;
use softrdma_proto::cm::ServiceId;
use softrdma_proto::iwarp::ddp::{DdpBuffer, DdpPacket, DdpRepr};
use softrdma_proto::iwarp::fpdu::{FpduPacket, FpduRepr, MarkerRepr};
use softrdma_proto::iwarp::mpa::{FrameKind, IrdOrd, MpaFramePacket, MpaFrameRepr};
use softrdma_proto::iwarp::rdmap::{self, Body, Control, MessageRepr, ReadRequestRepr, TerminateRepr};
use softrdma_proto::roce::bth::{BthPacket, BthRepr};
use softrdma_proto::roce::ext::*;
use softrdma_proto::roce::opcode::{Headers, Payload, TABLE};
use softrdma_proto::roce::{Psn, RocePacket, RoceRepr};
use softrdma_proto::Error;
use std::net::IpAddr;

fn bth() -> impl Strategy<Value = BthRepr> {
    (any::<u8>(), any::<[bool; 5]>(), 0u8..4, 0u8..16, any::<u16>(), 0u32..1 << 24, 0u32..1 << 24).prop_map(
        |(opcode, f, pad_count, tver, pkey, dest_qp, psn)| BthRepr {
            opcode,
            solicited: f[0],
            mig_req: f[1],
            pad_count,
            tver,
            pkey,
            fecn: f[2],
            becn: f[3],
            dest_qp,
            ack_req: f[4],
            psn: Psn::new(psn),
        },
    )
}

fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credits| Syndrome::Ack { credits }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        (0u8..32).prop_map(|c| Syndrome::from_byte(0x60 | c).unwrap()),
    ]
}

fn reth() -> impl Strategy<Value = RethRepr> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, rkey, dma_len)| RethRepr { va, rkey, dma_len })
}

/// A whole RoCEv2 packet for any opcode in the table, with exactly its headers.
fn roce(payload: &'static [u8]) -> impl Strategy<Value = RoceRepr<'static>> {
    let codes: Vec<u8> = TABLE.iter().flatten().map(|i| i.code).collect();
    (
        prop::sample::select(codes),
        bth(),
        reth(),
        syndrome(),
        any::<(u64, u32, u64, u64, u64, u32, u32, u32)>(),
        0usize..64,
    )
        .prop_map(move |(code, mut b, reth, syn, (va, rkey, sa, cmp, orig, imm, qkey, src_qp), len)| {
            let info = TABLE[code as usize].unwrap();
            let h = info.headers;
            let payload: &'static [u8] = match info.payload {
                Payload::None => &[],
                Payload::Fixed(n) => &payload[..n],
                Payload::Any => &payload[..len],
            };
            b.opcode = code;
            b.pad_count = if info.payload == Payload::None { 0 } else { b.pad_count };
            RoceRepr {
                bth: b,
                deth: h.contains(Headers::DETH).then_some(DethRepr { qkey, src_qp: src_qp & 0xff_ffff }),
                xrceth: h.contains(Headers::XRCETH).then_some(XrcEthRepr { srqn: qkey & 0xff_ffff }),
                feth: h
                    .contains(Headers::FETH)
                    .then_some(FethRepr { selectivity: (imm & 3) as u8, placement_type: (imm >> 4 & 0xf) as u8 }),
                reth: h.contains(Headers::RETH).then_some(reth),
                atomic_eth: h.contains(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
                    va,
                    rkey,
                    swap_add: sa,
                    compare: cmp,
                }),
                aeth: h.contains(Headers::AETH).then_some(AethRepr { syndrome: syn, msn: src_qp & 0xff_ffff }),
                atomic_ack_eth: h.contains(Headers::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr { original_data: orig }),
                immdt: h.contains(Headers::IMMDT).then_some(ImmDtRepr { imm }),
                ieth: h.contains(Headers::IETH).then_some(IethRepr { rkey }),
                payload,
            }
        })
}

static PAYLOAD: [u8; 64] = {
    let mut p = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        p[i] = (i as u8).wrapping_mul(37);
        i += 1;
    }
    p
};

proptest! {
    #[test]
    fn bth_round_trips(r in bth()) {
        let mut b = [0u8; 12];
        r.emit(&mut b).unwrap();
        prop_assert_eq!(BthRepr::parse(&BthPacket::new_checked(&b[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn every_roce_opcode_round_trips(r in roce(&PAYLOAD)) {
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b).unwrap();
        let p = RocePacket::new_checked(&b[..]).unwrap();
        prop_assert_eq!(RoceRepr::parse(&p).unwrap(), r);
        // Every prefix is a typed error, never a panic.
        for n in 0..b.len() {
            if let Ok(p) = RocePacket::new_checked(&b[..n]) {
                let _ = RoceRepr::parse(&p);
            }
        }
    }

    #[test]
    fn emitting_around_the_payload_writes_every_other_byte(r in roce(&PAYLOAD), junk in any::<u8>()) {
        let mut whole = vec![0u8; r.buffer_len()];
        r.emit(&mut whole).unwrap();
        // A recycled buffer: old bytes everywhere, the payload then written in place.
        let mut around = vec![junk; r.buffer_len() + 7];
        let at = r.emit_around_payload(&mut around).unwrap();
        around[at..at + r.payload.len()].copy_from_slice(r.payload);
        prop_assert_eq!(&around[..whole.len()], &whole[..]);
    }

    #[test]
    fn eths_round_trip(
        reth in reth(),
        syn in syndrome(),
        msn in 0u32..1 << 24,
        a in any::<(u64, u32, u64, u64)>(),
        orig in any::<u64>(),
        imm in any::<u32>(),
        deth in (any::<u32>(), 0u32..1 << 24),
        feth in (0u8..4, 0u8..16),
    ) {
        let mut b = [0u8; 28];
        reth.emit(&mut b).unwrap();
        prop_assert_eq!(RethRepr::parse(&RethPacket::new_checked(&b[..16]).unwrap()).unwrap(), reth);
        let aeth = AethRepr { syndrome: syn, msn };
        aeth.emit(&mut b).unwrap();
        prop_assert_eq!(AethRepr::parse(&AethPacket::new_checked(&b[..4]).unwrap()).unwrap(), aeth);
        let at = AtomicEthRepr { va: a.0, rkey: a.1, swap_add: a.2, compare: a.3 };
        at.emit(&mut b).unwrap();
        prop_assert_eq!(AtomicEthRepr::parse(&AtomicEthPacket::new_checked(&b[..]).unwrap()).unwrap(), at);
        let ack = AtomicAckEthRepr { original_data: orig };
        ack.emit(&mut b).unwrap();
        prop_assert_eq!(AtomicAckEthRepr::parse(&AtomicAckEthPacket::new_checked(&b[..8]).unwrap()).unwrap(), ack);
        let i = ImmDtRepr { imm };
        i.emit(&mut b).unwrap();
        prop_assert_eq!(ImmDtRepr::parse(&ImmDtPacket::new_checked(&b[..4]).unwrap()).unwrap(), i);
        let ie = IethRepr { rkey: imm };
        ie.emit(&mut b).unwrap();
        prop_assert_eq!(IethRepr::parse(&IethPacket::new_checked(&b[..4]).unwrap()).unwrap(), ie);
        let d = DethRepr { qkey: deth.0, src_qp: deth.1 };
        d.emit(&mut b).unwrap();
        prop_assert_eq!(DethRepr::parse(&DethPacket::new_checked(&b[..8]).unwrap()).unwrap(), d);
        let f = FethRepr { selectivity: feth.0, placement_type: feth.1 };
        f.emit(&mut b).unwrap();
        prop_assert_eq!(FethRepr::parse(&FethPacket::new_checked(&b[..4]).unwrap()).unwrap(), f);
    }
}

fn ird_ord() -> impl Strategy<Value = IrdOrd> {
    (0u16..0x4000, 0u16..0x4000, any::<[bool; 4]>()).prop_map(|(ird, ord, f)| IrdOrd {
        ird,
        ord,
        peer_to_peer: f[0],
        send_rtr: f[1],
        write_rtr: f[2],
        read_rtr: f[3],
    })
}

proptest! {
    #[test]
    fn mpa_frames_round_trip(
        req in any::<bool>(),
        flags in any::<[bool; 3]>(),
        reserved in 0u8..16,
        enhanced in prop::option::of(ird_ord()),
        rev in 1u8..3,
        pd in prop::collection::vec(any::<u8>(), 0..508),
    ) {
        let r = MpaFrameRepr {
            kind: if req { FrameKind::Request } else { FrameKind::Reply },
            markers: flags[0],
            crc: flags[1],
            reject: flags[2],
            reserved,
            revision: if enhanced.is_some() { 2 } else { rev },
            ird_ord: enhanced,
            private_data: &pd,
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b).unwrap();
        prop_assert_eq!(MpaFrameRepr::parse(&MpaFramePacket::new_checked(&b[..]).unwrap()).unwrap(), r);
        for n in 0..b.len() {
            let truncated = matches!(MpaFramePacket::new_checked(&b[..n]), Err(Error::Truncated { .. }));
            prop_assert!(truncated, "prefix of {} bytes", n);
        }
    }

    #[test]
    fn fpdus_round_trip(ulpdu in prop::collection::vec(any::<u8>(), 0..2000), crc in any::<bool>(), pad in any::<[u8; 3]>()) {
        let pad_len = softrdma_proto::iwarp::fpdu::pad_len(ulpdu.len());
        let mut padv = [0u8; 3];
        padv[..pad_len].copy_from_slice(&pad[..pad_len]);
        let r = FpduRepr { ulpdu: &ulpdu, pad: padv, with_crc: crc };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b).unwrap();
        let p = FpduPacket::new_checked(&b[..]).unwrap();
        prop_assert_eq!(FpduRepr::parse(&p, crc).unwrap(), r);
        prop_assert_eq!(p.verify_crc().is_ok(), crc || p.computed_crc() == 0);
        prop_assert!(FpduPacket::new_checked(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn markers_round_trip(ptr in any::<u16>()) {
        let m = MarkerRepr { fpdu_ptr: ptr };
        let mut b = [0u8; 4];
        m.emit(&mut b).unwrap();
        prop_assert_eq!(MarkerRepr::parse(&b).unwrap(), m);
    }

    #[test]
    fn rdmap_messages_round_trip(
        op in 0u8..12,
        last in any::<bool>(),
        addr in any::<(u32, u64, u32, u32, u32)>(),
        rr in any::<(u32, u64, u32, u32, u64)>(),
        term in (0u8..3, 0u8..16, any::<u8>(), prop::option::of(any::<u16>()), any::<bool>(), any::<bool>()),
        data in prop::collection::vec(any::<u8>(), 0..100),
    ) {
        let control = Control { version: rdmap::VERSION, opcode: rdmap::Opcode::from_bits(op).unwrap() };
        let buffer = if control.opcode.is_tagged() {
            DdpBuffer::Tagged { stag: addr.0, to: addr.1 }
        } else {
            DdpBuffer::Untagged { rsvd_ulp: addr.2, qn: addr.3, msn: addr.4, mo: addr.0 }
        };
        let copied_ddp = [0x41u8, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        let copied_rdmap = [7u8; 28];
        let body = match control.opcode {
            rdmap::Opcode::ReadRequest => Body::ReadRequest(ReadRequestRepr { sink_stag: rr.0, sink_to: rr.1, size: rr.2, src_stag: rr.3, src_to: rr.4 }),
            rdmap::Opcode::Terminate => Body::Terminate(TerminateRepr {
                layer: match term.0 { 0 => rdmap::Layer::Rdmap, 1 => rdmap::Layer::Ddp, _ => rdmap::Layer::Llp },
                etype: term.1,
                ecode: term.2,
                ddp_segment_len: term.3,
                ddp_header: term.4.then_some(&copied_ddp[..]),
                rdmap_header: term.5.then_some(&copied_rdmap[..]),
                reserved: addr.2 as u16 & 0x1fff,
                trailing: &data[..data.len() % 5],
            }),
            _ => Body::Data(&data),
        };
        let m = MessageRepr { ddp: DdpRepr { last, version: 1, rsvd_ulp: control.to_byte(), buffer }, control, body };
        let mut b = vec![0u8; m.buffer_len()];
        m.emit(&mut b).unwrap();
        prop_assert_eq!(MessageRepr::parse(&b).unwrap(), m);
        let ddp = DdpRepr::parse(&DdpPacket::new_checked(&b[..]).unwrap()).unwrap();
        prop_assert_eq!(ddp, m.ddp);
        for n in 0..m.ddp.header_len() {
            prop_assert!(MessageRepr::parse(&b[..n]).is_err());
        }
    }
}

fn path() -> impl Strategy<Value = PathRepr> {
    (
        any::<(u16, u16, [u8; 16], [u8; 16])>(),
        0u32..1 << 20,
        0u8..64,
        any::<(u8, u8)>(),
        0u8..16,
        any::<bool>(),
        0u8..32,
    )
        .prop_map(|((ll, rl, lg, rg), fl, rate, (tc, hop), sl, subnet_local, ack)| PathRepr {
            local_lid: ll,
            remote_lid: rl,
            local_gid: lg,
            remote_gid: rg,
            flow_label: fl,
            packet_rate: rate,
            traffic_class: tc,
            hop_limit: hop,
            sl,
            subnet_local,
            local_ack_timeout: ack,
        })
}

fn mad_header(attribute_id: u16) -> impl Strategy<Value = MadHeaderRepr> {
    any::<(u8, u8, u8, u16, u16, u64, u16, u32)>().prop_map(move |(bv, cv, m, st, cs, tid, res, am)| MadHeaderRepr {
        base_version: bv,
        mgmt_class: MGMT_CLASS_CM,
        class_version: cv,
        method: m,
        status: st,
        class_specific: cs,
        transaction_id: tid,
        attribute_id,
        reserved: res,
        attribute_modifier: am,
    })
}

fn check_mad(header: MadHeaderRepr, message: CmMessage<'_>) -> Result<(), TestCaseError> {
    let m = CmMadRepr { header, message };
    let mut b = [0u8; 256];
    m.emit(&mut b).unwrap();
    prop_assert_eq!(CmMadRepr::parse(&MadPacket::new_checked(&b[..]).unwrap()).unwrap(), m);
    Ok(())
}

proptest! {
    #[test]
    fn cm_req_round_trips(
        h in mad_header(attr::REQ),
        ids in any::<(u32, u64, u64, u32)>(),
        q in (0u32..1 << 24, any::<u8>(), 0u32..1 << 24, any::<u8>(), 0u32..1 << 24, 0u32..1 << 24),
        bits in (0u8..32, 0u8..4, any::<bool>(), 0u8..32, 0u8..8, any::<u16>(), 0u8..16, any::<bool>(), 0u8..8, 0u8..16, any::<bool>(), 0u8..8),
        p1 in path(),
        p2 in path(),
        pd in any::<[u8; 92]>(),
    ) {
        let req = ReqRepr {
            local_comm_id: ids.0, service_id: ServiceId(ids.1), local_ca_guid: ids.2, local_qkey: ids.3,
            local_qpn: q.0, responder_resources: q.1, local_eecn: q.2, initiator_depth: q.3, remote_eecn: q.4,
            remote_cm_response_timeout: bits.0, transport_service_type: bits.1, end_to_end_flow_control: bits.2,
            starting_psn: q.5, local_cm_response_timeout: bits.3, retry_count: bits.4, pkey: bits.5,
            path_mtu: bits.6, rdc_exists: bits.7, rnr_retry_count: bits.8, max_cm_retries: bits.9, srq: bits.10,
            extended_transport_type: bits.11, primary_path: p1, alternate_path: p2, private_data: &pd,
        };
        check_mad(h, CmMessage::Req(req))?;
    }

    #[test]
    fn cm_rep_and_the_rest_round_trip(
        ids in any::<(u32, u32, u32, u64, u8, u8)>(),
        q in (0u32..1 << 24, 0u32..1 << 24, 0u32..1 << 24),
        bits in (0u8..32, 0u8..4, any::<bool>(), 0u8..8, any::<bool>(), 0u8..4, 0u8..128, any::<u16>(), 0u8..32),
        pd in prop::collection::vec(any::<u8>(), 232),
        h in mad_header(0),
    ) {
        let rep = RepRepr {
            local_comm_id: ids.0, remote_comm_id: ids.1, local_qkey: ids.2, local_qpn: q.0, local_eecn: q.1,
            starting_psn: q.2, responder_resources: ids.4, initiator_depth: ids.5, target_ack_delay: bits.0,
            failover_accepted: bits.1, end_to_end_flow_control: bits.2, rnr_retry_count: bits.3, srq: bits.4,
            local_ca_guid: ids.3, private_data: &pd[..196],
        };
        check_mad(MadHeaderRepr { attribute_id: attr::REP, ..h }, CmMessage::Rep(rep))?;
        let two = IdsRepr { local_comm_id: ids.0, remote_comm_id: ids.1, private_data: &pd[..224] };
        check_mad(MadHeaderRepr { attribute_id: attr::RTU, ..h }, CmMessage::Rtu(two))?;
        check_mad(MadHeaderRepr { attribute_id: attr::DREP, ..h }, CmMessage::Drep(two))?;
        let rej = RejRepr { local_comm_id: ids.0, remote_comm_id: ids.1, message_rejected: bits.5 % 3,
            reject_info_len: bits.6, reason: bits.7, ari: &pd[..72], private_data: &pd[..148] };
        check_mad(MadHeaderRepr { attribute_id: attr::REJ, ..h }, CmMessage::Rej(rej))?;
        let mra = MraRepr { local_comm_id: ids.0, remote_comm_id: ids.1, message_mraed: bits.5 % 3,
            service_timeout: bits.8, private_data: &pd[..222] };
        check_mad(MadHeaderRepr { attribute_id: attr::MRA, ..h }, CmMessage::Mra(mra))?;
        let dreq = DreqRepr { local_comm_id: ids.0, remote_comm_id: ids.1, remote_qpn: q.0, private_data: &pd[..220] };
        check_mad(MadHeaderRepr { attribute_id: attr::DREQ, ..h }, CmMessage::Dreq(dreq))?;
        check_mad(MadHeaderRepr { attribute_id: 0x0019, ..h }, CmMessage::Other(&pd))?;
        let sidr_req = SidrReqRepr { request_id: ids.0, pkey: bits.7, service_id: ServiceId(ids.3),
            private_data: &pd[..216] };
        check_mad(MadHeaderRepr { attribute_id: attr::SIDR_REQ, ..h }, CmMessage::SidrReq(sidr_req))?;
        let sidr_rep = SidrRepRepr { request_id: ids.0, status: ids.4, additional_info_len: ids.5, qpn: q.0,
            service_id: ServiceId(ids.3), qkey: ids.2, additional_info: &pd[..72], private_data: &pd[..136] };
        check_mad(MadHeaderRepr { attribute_id: attr::SIDR_REP, ..h }, CmMessage::SidrRep(sidr_rep))?;
    }

    #[test]
    fn cma_header_round_trips(v6 in any::<bool>(), a in any::<[u8; 16]>(), b in any::<[u8; 16]>(), port in any::<u16>()) {
        let (src, dst): (IpAddr, IpAddr) = if v6 {
            (a.into(), b.into())
        } else {
            ([a[0], a[1], a[2], a[3]].into(), [b[0], b[1], b[2], b[3]].into())
        };
        let h = CmaHeader { version: 0, src_port: port, src, dst };
        let mut buf = [0u8; 36];
        h.emit(&mut buf).unwrap();
        prop_assert_eq!(CmaHeader::parse(&buf).unwrap(), h);
    }
}

#[test]
fn short_and_oversized_buffers_are_typed_errors() {
    let big = [0u8; 300];
    for n in 0..12 {
        assert!(matches!(BthPacket::new_checked(&big[..n]), Err(Error::Truncated { .. })));
    }
    for n in 0..16 {
        assert!(RocePacket::new_checked(&big[..n]).is_err());
    }
    for n in 0..256 {
        assert!(MadPacket::new_checked(&big[..n]).is_err());
    }
    assert_eq!(MadPacket::new_checked(&big[..257]).unwrap_err(), Error::BadLength("a MAD is 256 bytes"));
    assert!(CmaHeader::parse(&big[..35]).is_err());
    assert!(CmaHeader::parse(&big[..36]).is_err(), "IP version 0 is not an address family");
    // An MPA frame announcing 513 bytes of private data is refused however long the buffer.
    let mut mpa = vec![0u8; 20 + 600];
    mpa[..16].copy_from_slice(b"MPA ID Req Frame");
    mpa[18..20].copy_from_slice(&513u16.to_be_bytes());
    assert!(matches!(MpaFramePacket::new_checked(&mpa[..]), Err(Error::BadLength(_))));
    // A RoCEv2 packet whose PadCnt exceeds its payload, or payload on an ACK.
    let mut ack = [0u8; 20];
    ack[0] = 0x11;
    ack[1] = 0x30;
    assert!(matches!(RocePacket::new_checked(&ack[..]), Err(Error::BadLength(_))));
    let ack_with_payload = [0x11u8, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 9, 9, 9, 9, 0, 0, 0, 0];
    assert!(matches!(RocePacket::new_checked(&ack_with_payload[..]), Err(Error::BadLength(_))));
    assert_eq!(RocePacket::new_checked(&[0x40u8; 16][..]).unwrap_err(), Error::UnknownOpcode(0x40));
}
