//! FPDU framing against deframing: any sequence of ULPDUs, framed with every combination
//! of CRC and markers, split at arbitrary points of the stream, comes back whole with good
//! CRCs (RFC 5044 §4-5).

use proptest::prelude::*;
use softrdma::iwarp::deframer::{CrcCheck, Deframer};
use softrdma::iwarp::framer::Framer;

fn round_trip(ulpdus: &[Vec<u8>], markers: bool, crc: bool, cuts: &[usize]) {
    let mut f = Framer::new(markers, crc);
    let mut stream = Vec::new();
    for u in ulpdus {
        f.frame(u, &mut stream).unwrap();
    }
    assert_eq!(f.offset(), stream.len() as u64);
    let mut d = Deframer::new(markers, crc);
    let mut got = Vec::new();
    let mut at = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    points.sort_unstable();
    points.push(stream.len());
    for p in points {
        d.push(&stream[at..p.max(at)]);
        at = p.max(at);
        while let Some(fp) = d.next_fpdu().unwrap() {
            let want = if crc { CrcCheck::Ok } else { CrcCheck::NotNegotiated };
            assert_eq!(fp.crc, want);
            got.push(fp.ulpdu);
        }
    }
    assert_eq!(got, ulpdus);
    assert_eq!(d.buffered(), 0);
}

proptest! {
    #[test]
    fn framed_ulpdus_come_back_whole_at_any_split(
        ulpdus in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..1500), 1..8),
        markers in any::<bool>(),
        crc in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        round_trip(&ulpdus, markers, crc, &cuts);
    }
}

#[test]
fn every_single_split_point_of_a_marked_crc_stream() {
    let ulpdus: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 300 + 97 * i]).collect();
    let mut f = Framer::new(true, true);
    let mut s = Vec::new();
    for u in &ulpdus {
        f.frame(u, &mut s).unwrap();
    }
    for cut in 0..=s.len() {
        round_trip(&ulpdus, true, true, &[cut]);
    }
}
