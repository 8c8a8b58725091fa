//! UDP segmentation offload for RoCEv2 datagrams: which queued datagrams may leave as one
//! GSO send (Linux `UDP_SEGMENT`), so that the kernel's IP and UDP path runs once per
//! run of equal-sized packets rather than once per packet.
//!
//! Linux numbers the IPv4 Identification of a GSO send's segments from the first one's
//! (`inet_gso_segment`), which is 0 from an unconnected socket with DF set: segment `k`
//! carries Identification `k`. The ICRC covers it (IBTA Annex A17.3.3 masks only TOS, TTL
//! and the checksum), so each segment's ICRC is computed with it ([`segment_ident`]).

use crate::transport::sys::{GSO_MAX_BYTES, GSO_MAX_SEGMENTS};

/// True for what a responder or a notification point sends: RDMA READ RESPONSE FIRST to
/// ONLY, ACKNOWLEDGE, ATOMIC ACKNOWLEDGE (IBTA vol. 1 §9.2, Table 38: 0x0D..=0x12) and
/// the CNP (Annex A17.9.2: 0x81).
pub fn is_response(packet: &[u8]) -> bool {
    packet.first().is_some_and(|&op| matches!(op, 0x0d..=0x12 | 0x81))
}

/// Puts the responses of a run of datagrams after its requests, keeping the order within
/// each. A QP's requests and its responses are sequences of their own (IBTA vol. 1 §9.7),
/// each with its own PSNs, so neither side sees anything reordered; what it buys is a
/// request and the ACK that waited for it leaving as one GSO send (the ACK, shorter, last).
pub fn responses_last<T>(run: &mut [T], is_response: impl Fn(&T) -> bool) {
    run.sort_by_key(|t| is_response(t));
}

/// How many of the datagrams of lengths `lens` (for one destination, in order) can leave
/// as the first GSO send: a run of equal lengths, then at most one shorter datagram to
/// end it, within the kernel's limits on segments and bytes. At least 1 if `lens` is not
/// empty.
pub fn chunk_len(lens: impl IntoIterator<Item = usize>) -> usize {
    let mut lens = lens.into_iter();
    let Some(segment) = lens.next() else { return 0 };
    let (mut count, mut bytes) = (1, segment);
    for len in lens {
        if count == GSO_MAX_SEGMENTS || bytes + len > GSO_MAX_BYTES || len > segment {
            break;
        }
        count += 1;
        bytes += len;
        if len < segment {
            break;
        }
    }
    count
}

/// The IPv4 Identification segment `k` of a GSO send carries on the wire.
pub fn segment_ident(k: usize) -> u16 {
    k as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_equal_lengths_ends_at_the_first_shorter_one() {
        assert_eq!(chunk_len([4124, 4124, 4124, 100, 4124]), 4);
        assert_eq!(chunk_len([40, 20]), 2);
        assert_eq!(chunk_len([20, 40]), 1);
        assert_eq!(chunk_len([20]), 1);
        assert_eq!(chunk_len(std::iter::empty()), 0);
    }

    #[test]
    fn a_chunk_stays_within_the_kernels_limits() {
        assert_eq!(chunk_len(std::iter::repeat_n(4124, 100)), GSO_MAX_BYTES / 4124);
        assert_eq!(chunk_len(std::iter::repeat_n(20, 100)), GSO_MAX_SEGMENTS);
    }

    #[test]
    fn responses_go_last_in_their_own_order() {
        // (opcode, id): a WRITE ONLY, an ACK, a SEND, a READ RESPONSE ONLY.
        let mut run = [(0x0a, 1), (0x11, 2), (0x04, 3), (0x10, 4)];
        responses_last(&mut run, |&(op, _)| is_response(&[op]));
        assert_eq!(run.map(|r| r.1), [1, 3, 2, 4]);
        assert!(is_response(&[0x81]) && !is_response(&[0x0c]) && !is_response(&[]));
    }
}
