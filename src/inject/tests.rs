use super::micro::{analyse, Pkt};
use super::*;
use crate::proto::roce::ext::{AethRepr, NakCode, Syndrome};
use crate::proto::roce::icrc::{self, IpHeader};
use crate::proto::roce::{BthRepr, Psn};
use crate::transport::headers::{ip_header, udp_header};

const A: &str = "10.9.0.1";
const B: &str = "10.9.0.2";

fn bth(opcode: u8, qpn: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: true,
        pad_count: 0,
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: qpn,
        ack_req: false,
        psn: Psn::new(psn),
    }
}

/// An Ethernet frame carrying a RoCEv2 packet from `src` to `dst` with a good ICRC.
fn frame(src: &str, dst: &str, opcode: u8, qpn: u32, psn: u32, aeth: Option<AethRepr>) -> Vec<u8> {
    let payload = if aeth.is_some() { vec![] } else { vec![0x42u8; 64] };
    let mut r = crate::engine::qp::requester::bare(bth(opcode, qpn, psn), None, aeth);
    r.payload = &payload;
    let mut pkt = vec![0u8; r.buffer_len()];
    r.emit(&mut pkt).unwrap();
    let (s, d): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
    let udp = udp_header(0xc000, 4791, pkt.len());
    let (ip, n) = ip_header(s, d, 8 + pkt.len(), 7, true, 0x02);
    icrc::fill(IpHeader::V4(&ip[..n]), &udp, &mut pkt).unwrap();
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&ip[..n]);
    f.extend_from_slice(&udp);
    f.extend_from_slice(&pkt);
    f
}

fn write_middle(psn: u32) -> Vec<u8> {
    frame(A, B, 0x07, 0x123, psn, None)
}

fn ack(psn: u32) -> Vec<u8> {
    frame(B, A, 0x11, 0x456, psn, Some(AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn: 1 }))
}

fn icrc_holds(f: &[u8]) -> bool {
    icrc::verify(IpHeader::V4(&f[14..34]), &f[34..42], &f[42..]).is_ok()
}

#[test]
fn specs_parse_and_refuse() {
    let s: EventSpec = "delay@50,us=2000,qp=0x12,op=0x07,from=10.0.0.1".parse().unwrap();
    assert_eq!(s.action, Action::Delay { us: 2000 });
    assert_eq!((s.nth, s.qpn, s.opcode), (50, Some(0x12), Some(0x07)));
    assert_eq!("corrupt@3,byte=20".parse::<EventSpec>().unwrap().action, Action::Corrupt(Some(20)));
    for bad in ["drop", "drop@0", "drop@x", "explode@3", "drop@3,qp", "drop@3,colour=red"] {
        assert!(bad.parse::<EventSpec>().is_err(), "{bad}");
    }
}

#[test]
fn drop_takes_the_nth_request_and_nothing_else() {
    let mut inj = Injector::new(vec!["drop@3".parse().unwrap()]);
    let mut through = 0;
    for psn in 0..6 {
        through += inj.on_frame(psn, Side::AtoB, write_middle(psn as u32)).len();
        // ACKs, ARP and QP1 traffic are not requests to count.
        assert_eq!(inj.on_frame(psn, Side::BtoA, ack(psn as u32)).len(), 1);
    }
    assert_eq!(inj.on_frame(9, Side::AtoB, vec![0xff; 60]).len(), 1);
    assert_eq!(through, 5);
    assert_eq!(inj.applied().len(), 1);
    assert_eq!(inj.applied()[0].packet.psn, 2);
    assert!(inj.unmet().is_empty());
}

#[test]
fn a_run_marks_its_packets_and_counts_as_one_event() {
    let mut inj = Injector::new(vec!["ecn@2,count=3".parse().unwrap()]);
    let marked: Vec<bool> =
        (0..6).map(|psn| inj.on_frame(0, Side::AtoB, write_middle(psn)).pop().unwrap()[15] & 3 == 3).collect();
    assert_eq!(marked, [false, true, true, true, false, false]);
    assert_eq!(inj.applied().len(), 1);
    assert_eq!(inj.applied()[0].packet.psn, 1);
    assert!(inj.unmet().is_empty());
    assert!("ecn@2,count=0".parse::<EventSpec>().is_err());
}

#[test]
fn qp_and_opcode_filters_pick_their_packets() {
    let mut inj = Injector::new(vec!["drop@1,qp=0x999".parse().unwrap(), "dup@2,op=0x08".parse().unwrap()]);
    for psn in 0..4 {
        assert_eq!(inj.on_frame(0, Side::AtoB, write_middle(psn)).len(), 1);
    }
    assert_eq!(inj.on_frame(0, Side::AtoB, frame(A, B, 0x08, 0x123, 9, None)).len(), 1);
    assert_eq!(inj.on_frame(0, Side::AtoB, frame(A, B, 0x08, 0x123, 10, None)).len(), 2);
    assert_eq!(inj.unmet().len(), 1);
}

#[test]
fn an_ecn_mark_keeps_the_icrc_and_the_ip_checksum() {
    let mut inj = Injector::new(vec!["ecn@1".parse().unwrap()]);
    let out = inj.on_frame(0, Side::AtoB, write_middle(1)).pop().unwrap();
    assert_eq!(out[15] & 0x03, 0x03, "CE");
    assert_eq!(crate::transport::headers::ipv4_checksum(&out[14..34]), 0);
    assert!(icrc_holds(&out));
}

#[test]
fn a_corrupted_byte_breaks_the_icrc() {
    let mut inj = Injector::new(vec!["corrupt@1".parse().unwrap()]);
    let before = write_middle(1);
    assert!(icrc_holds(&before));
    let out = inj.on_frame(0, Side::AtoB, before.clone()).pop().unwrap();
    assert_eq!(out.iter().zip(&before).filter(|(a, b)| a != b).count(), 1);
    assert!(!icrc_holds(&out));
}

#[test]
fn a_delayed_frame_comes_out_when_due_and_others_pass_it() {
    let mut inj = Injector::new(vec!["delay@1,us=500".parse().unwrap()]);
    assert!(inj.on_frame(1_000, Side::AtoB, write_middle(1)).is_empty());
    assert_eq!(inj.on_frame(1_100, Side::AtoB, write_middle(2)).len(), 1);
    assert_eq!(inj.next_due_ns(), Some(501_000));
    assert!(inj.due(500_999).is_empty());
    let out = inj.due(501_000);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, Side::AtoB);
    assert_eq!(inj.released(), &[(0, 501_000)]);
}

#[test]
fn held_frames_stop_at_their_limit() {
    let specs = (1..=MAX_HELD_FRAMES as u64 + 1).map(|n| EventSpec {
        action: Action::Delay { us: 1_000_000 },
        nth: n,
        qpn: None,
        opcode: None,
        from: None,
        run: 1,
    });
    let mut inj = Injector::new(specs.collect());
    let mut passed = 0;
    for psn in 0..=MAX_HELD_FRAMES as u32 {
        passed += inj.on_frame(0, Side::AtoB, write_middle(psn)).len();
    }
    assert_eq!(passed, 1, "the frame beyond the limit goes straight through");
    assert_eq!(inj.flush(5).len(), MAX_HELD_FRAMES);
}

fn pkt(t_us: u64, from_a: bool, opcode: u8, psn: u32, syndrome: Option<Syndrome>) -> Pkt {
    let (a, b): (IpAddr, IpAddr) = (A.parse().unwrap(), B.parse().unwrap());
    let (src, dst, dest_qp) = if from_a { (a, b, 0x123) } else { (b, a, 0x456) };
    Pkt { time_ns: t_us * 1000, src, dst, opcode, dest_qp, psn: Psn::new(psn), syndrome }
}

fn applied(kind: &str, t_us: u64, psn: u32) -> Applied {
    let f = write_middle(psn);
    Applied { spec: kind.parse().unwrap(), time_ns: t_us * 1000, packet: roce_id(&f).unwrap() }
}

fn metric(f: &micro::Finding, name: &str) -> String {
    f.metrics.iter().find(|m| m.0 == name).map(|m| m.1.clone()).unwrap_or_else(|| panic!("{name}: {f:?}"))
}

#[test]
fn a_drop_repaired_by_nak_shows_its_times_and_go_back_n() {
    // PSN 10 dropped at 100 µs; 11 and 12 pass; the NAK comes 20 µs after 11; 10-12 resent.
    let nak = Some(Syndrome::Nak(NakCode::PsnSequenceError));
    let all = [
        pkt(90, true, 0x07, 9, None),
        pkt(110, true, 0x07, 11, None),
        pkt(120, true, 0x07, 12, None),
        pkt(130, false, 0x11, 10, nak),
        pkt(180, true, 0x07, 10, None),
        pkt(181, true, 0x07, 11, None),
        pkt(182, true, 0x07, 12, None),
    ];
    let f = &analyse(&all, &[applied("drop@5", 100, 10)], &[])[0];
    assert_eq!(metric(f, "NAK (sequence error) after the gap"), "20 µs");
    assert_eq!(metric(f, "retransmission after the event"), "80 µs (NAK)");
    assert_eq!(metric(f, "went back to"), "the lost PSN");
    assert_eq!(metric(f, "resent of those in flight"), "3 of 3");
}

#[test]
fn a_tail_drop_is_repaired_by_timeout_and_a_corruption_accepted_is_flagged() {
    let all = [pkt(100_000, true, 0x0a, 10, None), pkt(50_000, true, 0x0a, 10, None)];
    let mut sorted = all.to_vec();
    sorted.sort_by_key(|p| p.time_ns);
    let f = &analyse(&sorted, &[applied("drop@1", 10, 10)], &[])[0];
    assert_eq!(metric(f, "NAK (sequence error) after the gap"), "none");
    assert_eq!(metric(f, "retransmission after the event"), "49990 µs (timeout)");
    let acked = [pkt(20, false, 0x11, 10, Some(Syndrome::Ack { credits: 31 }))];
    let f = &analyse(&acked, &[applied("corrupt@1", 10, 10)], &[])[0];
    assert_eq!(metric(f, "corrupted packet dropped"), "NO: ACKed");
    assert_eq!(metric(f, "retransmission"), "none");
}

#[test]
fn a_delayed_original_is_not_its_own_retransmission() {
    let all = [pkt(100, true, 0x07, 11, None), pkt(600, true, 0x07, 10, None)];
    let f = &analyse(&all, &[applied("delay@1,us=500", 100, 10)], &[(0, 600_000)])[0];
    assert_eq!(metric(f, "retransmission"), "none");
}

#[test]
fn an_ecn_mark_shows_its_cnps_and_the_rate_around_them() {
    let mut all: Vec<Pkt> = (0..40).map(|i| pkt(i * 100, true, 0x07, i as u32, None)).collect();
    all.push(pkt(10, false, 0x11, 0, Some(Syndrome::Ack { credits: 31 })));
    all.push(pkt(1_050, false, 0x81, 0, None));
    all.push(pkt(1_600, false, 0x81, 0, None));
    all.sort_by_key(|p| p.time_ns);
    let f = &analyse(&all, &[applied("ecn@10", 1_000, 10)], &[])[0];
    assert_eq!(metric(f, "CNPs within 20 ms"), "2");
    assert_eq!(metric(f, "first CNP after the mark"), "50 µs");
    assert_eq!(metric(f, "closest CNP spacing"), "550 µs");
    assert_eq!(metric(f, "requests 2 ms before / after the CNP"), "11 / 20");
}

#[test]
fn what_follows_the_next_event_is_not_the_duplicates() {
    let nak = Some(Syndrome::Nak(NakCode::PsnSequenceError));
    let all = [pkt(100, true, 0x07, 10, None), pkt(100, true, 0x07, 10, None), pkt(900, false, 0x11, 20, nak)];
    let events = [applied("dup@1", 100, 10), applied("drop@9", 800, 20)];
    let f = &analyse(&all, &events, &[])[0];
    assert_eq!(metric(f, "NAKs within 5 ms (before the next event)"), "0");
    let alone = &analyse(&all, &events[..1], &[])[0];
    assert_eq!(metric(alone, "NAKs within 5 ms (before the next event)"), "1");
}
