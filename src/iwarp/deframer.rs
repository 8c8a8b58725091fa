//! Turns an MPA byte stream, split anywhere, back into FPDUs (RFC 5044 §4 and §5).
//!
//! The deframer starts after the MPA Request/Reply: its stream offset 0 is the first
//! octet of the first FPDU, which is also where markers are counted from. It holds at most
//! one FPDU of buffered bytes beyond what it was given, so a peer cannot make it buffer
//! without bound: a ULPDU_Length above the configured limit is an error.
//!
//! Taking FPDUs off costs time linear in the bytes pushed, however they are cut: FPDUs are
//! read at a cursor and the consumed prefix is dropped only once it is most of the buffer
//! (never one `drain` per FPDU), and the CRC is computed only when it was negotiated.

use crate::proto::iwarp::fpdu::{self, crc_with_markers, strip_markers, wire_len_with_markers};
use crate::proto::Error;

/// Outcome of the CRC check on one FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrcCheck {
    /// CRC was not negotiated; the field was not checked.
    NotNegotiated,
    /// The carried CRC matches.
    Ok,
    /// The carried CRC does not match.
    Bad {
        /// Carried on the wire.
        carried: u32,
        /// Computed over the FPDU.
        computed: u32,
    },
}

/// One FPDU taken off the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fpdu {
    /// The ULPDU (DDP segment), markers removed.
    pub ulpdu: Vec<u8>,
    /// CRC verdict.
    pub crc: CrcCheck,
    /// Stream offset of the FPDU's first wire octet.
    pub start_offset: u64,
    /// Octets it took on the wire, markers included.
    pub wire_len: usize,
}

/// Incremental MPA deframer for one direction of a connection.
#[derive(Debug, Clone)]
pub struct Deframer {
    buf: Vec<u8>,
    /// Bytes of `buf` already taken as FPDUs.
    head: usize,
    /// Bytes moved to drop a consumed prefix, in all (the cost the cursor keeps linear).
    moved: u64,
    offset: u64,
    markers: bool,
    crc: bool,
    max_ulpdu_len: usize,
}

impl Deframer {
    /// A deframer for a direction with the negotiated markers and CRC settings.
    pub fn new(markers: bool, crc: bool) -> Self {
        Deframer { buf: Vec::new(), head: 0, moved: 0, offset: 0, markers, crc, max_ulpdu_len: usize::from(u16::MAX) }
    }

    /// Refuses FPDUs whose ULPDU is longer than `len` (the connection's MULPDU limit).
    pub fn with_max_ulpdu_len(mut self, len: usize) -> Self {
        self.max_ulpdu_len = len;
        self
    }

    /// Appends stream bytes.
    pub fn push(&mut self, data: &[u8]) {
        // Amortised: the prefix moves only when it is at least half the buffer.
        if self.head > 0 && self.head * 2 >= self.buf.len() {
            self.moved += (self.buf.len() - self.head) as u64;
            self.buf.drain(..self.head);
            self.head = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes received but not yet part of a whole FPDU.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.head
    }

    /// Bytes moved within the buffer so far: at most the bytes pushed.
    pub fn bytes_moved(&self) -> u64 {
        self.moved
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.head..]
    }

    /// Stream offset of the next FPDU.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The ULPDU_Length of the next FPDU, once its header (and any marker before it)
    /// has arrived.
    fn next_ulpdu_len(&self) -> Result<Option<usize>, Error> {
        let mut hdr = [0u8; fpdu::HEADER_LEN];
        let head_wire =
            if self.markers { wire_len_with_markers(self.offset, fpdu::HEADER_LEN) } else { fpdu::HEADER_LEN };
        let pending = self.pending();
        if pending.len() < head_wire {
            return Ok(None);
        }
        if self.markers {
            let mut tmp = [0u8; fpdu::HEADER_LEN + fpdu::MARKER_LEN];
            let n = strip_markers(self.offset, &pending[..head_wire], &mut tmp)?;
            hdr.copy_from_slice(&tmp[..n.min(fpdu::HEADER_LEN)]);
        } else {
            hdr.copy_from_slice(&pending[..fpdu::HEADER_LEN]);
        }
        Ok(Some(usize::from(u16::from_be_bytes(hdr))))
    }

    /// Takes every whole FPDU off the stream with `data` appended and hands each ULPDU and
    /// its CRC verdict to `each`, which returns false once the connection has ended (the
    /// rest is then dropped). Without markers an FPDU lying whole in `data` is handed over
    /// in place, straight from the receive buffer; only one cut by either end of `data`
    /// (TCP may split FPDUs anywhere, RFC 5044 §4) passes through the deframer's buffer.
    /// Errors are those of [`Deframer::next_fpdu`].
    pub fn feed(&mut self, mut data: &[u8], mut each: impl FnMut(&[u8], CrcCheck) -> bool) -> Result<(), Error> {
        if self.markers {
            self.push(data);
            while let Some(f) = self.next_fpdu()? {
                if !each(&f.ulpdu, f.crc) {
                    return Ok(());
                }
            }
            return Ok(());
        }
        // An FPDU begun in an earlier call: complete it in the buffer, and no more.
        while self.buffered() > 0 && !data.is_empty() {
            let n = self.to_complete()?.min(data.len());
            self.push(&data[..n]);
            data = &data[n..];
            if let Some((len, wire)) = self.whole(self.pending())? {
                let crc = self.crc_check(&self.buf[self.head..self.head + wire]);
                let at = self.head + fpdu::HEADER_LEN;
                let go_on = each(&self.buf[at..at + len], crc);
                self.consumed(wire);
                if !go_on {
                    return Ok(());
                }
            }
        }
        let mut pos = 0;
        while let Some((len, wire)) = self.whole(&data[pos..])? {
            let fpdu = &data[pos..pos + wire];
            pos += wire;
            self.offset += wire as u64;
            if !each(&fpdu[fpdu::HEADER_LEN..fpdu::HEADER_LEN + len], self.crc_check(fpdu)) {
                return Ok(());
            }
        }
        self.push(&data[pos..]);
        Ok(())
    }

    /// Without markers: octets the buffered partial FPDU still needs (its header first).
    fn to_complete(&self) -> Result<usize, Error> {
        let have = self.buffered();
        match self.next_ulpdu_len()? {
            None => Ok(fpdu::HEADER_LEN - have),
            Some(len) if len > self.max_ulpdu_len => Err(Error::BadLength("ULPDU_Length above the connection's limit")),
            Some(len) => Ok(fpdu::fpdu_len(len).saturating_sub(have)),
        }
    }

    /// Without markers: the ULPDU length and wire length of the FPDU at the start of
    /// `wire`, if all of it is there.
    fn whole(&self, wire: &[u8]) -> Result<Option<(usize, usize)>, Error> {
        let Some(hdr) = wire.get(..fpdu::HEADER_LEN) else { return Ok(None) };
        let len = usize::from(u16::from_be_bytes([hdr[0], hdr[1]]));
        if len > self.max_ulpdu_len {
            return Err(Error::BadLength("ULPDU_Length above the connection's limit"));
        }
        let total = fpdu::fpdu_len(len);
        Ok((wire.len() >= total).then_some((len, total)))
    }

    /// Without markers: the CRC verdict on one whole FPDU.
    fn crc_check(&self, fpdu: &[u8]) -> CrcCheck {
        if !self.crc {
            return CrcCheck::NotNegotiated;
        }
        let carried = crc_field(fpdu);
        let computed = crate::proto::crc::crc32c(&fpdu[..fpdu.len() - fpdu::CRC_LEN]);
        if carried == computed || cfg!(fuzzing) {
            CrcCheck::Ok
        } else {
            CrcCheck::Bad { carried, computed }
        }
    }

    /// The buffered FPDU of `wire` octets was taken.
    fn consumed(&mut self, wire: usize) {
        self.head += wire;
        self.offset += wire as u64;
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        }
    }

    /// Takes the next whole FPDU off the stream, if it has arrived. An error means the
    /// stream cannot be followed any further (bad marker, oversized ULPDU).
    pub fn next_fpdu(&mut self) -> Result<Option<Fpdu>, Error> {
        let Some(ulpdu_len) = self.next_ulpdu_len()? else {
            return Ok(None);
        };
        if ulpdu_len > self.max_ulpdu_len {
            return Err(Error::BadLength("ULPDU_Length above the connection's limit"));
        }
        let plain_len = fpdu::fpdu_len(ulpdu_len);
        let wire_len = if self.markers { wire_len_with_markers(self.offset, plain_len) } else { plain_len };
        if self.pending().len() < wire_len {
            return Ok(None);
        }
        let wire = &self.buf[self.head..self.head + wire_len];
        let ulpdu_at = fpdu::HEADER_LEN..fpdu::HEADER_LEN + ulpdu_len;
        let (ulpdu, carried) = if self.markers {
            let mut plain = vec![0u8; plain_len];
            strip_markers(self.offset, wire, &mut plain)?;
            (plain[ulpdu_at].to_vec(), crc_field(&plain))
        } else {
            (wire[ulpdu_at].to_vec(), crc_field(wire))
        };
        let crc = if !self.crc {
            CrcCheck::NotNegotiated
        } else {
            let computed = if self.markers {
                crc_with_markers(self.offset, wire, plain_len)?
            } else {
                crate::proto::crc::crc32c(&wire[..plain_len - fpdu::CRC_LEN])
            };
            if carried == computed || cfg!(fuzzing) {
                CrcCheck::Ok
            } else {
                CrcCheck::Bad { carried, computed }
            }
        };
        let fpdu = Fpdu { ulpdu, crc, start_offset: self.offset, wire_len };
        self.head += wire_len;
        self.offset += wire_len as u64;
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        }
        Ok(Some(fpdu))
    }
}

/// The CRC field: the last four octets of a plain (marker-free) FPDU.
fn crc_field(plain: &[u8]) -> u32 {
    let t = &plain[plain.len() - fpdu::CRC_LEN..];
    u32::from_le_bytes([t[0], t[1], t[2], t[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::iwarp::fpdu::{insert_markers, FpduRepr};

    fn stream(ulpdus: &[&[u8]], crc: bool, markers: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for u in ulpdus {
            let r = FpduRepr { ulpdu: u, pad: [0; 3], with_crc: crc };
            let mut plain = vec![0u8; r.buffer_len()];
            r.emit(&mut plain).unwrap();
            if markers {
                let off = out.len() as u64;
                let mut wire = vec![0u8; wire_len_with_markers(off, plain.len())];
                insert_markers(off, &plain, &mut wire).unwrap();
                // With markers, the CRC covers them: recompute over the wire image.
                if crc {
                    let c = crc_with_markers(off, &wire, plain.len()).unwrap();
                    plain[r.buffer_len() - 4..].copy_from_slice(&c.to_le_bytes());
                    insert_markers(off, &plain, &mut wire).unwrap();
                }
                out.extend_from_slice(&wire);
            } else {
                out.extend_from_slice(&plain);
            }
        }
        out
    }

    #[test]
    fn byte_at_a_time_with_markers_and_crc() {
        let a = vec![0x41u8; 700];
        let b = vec![0x42u8; 3];
        let c = vec![0x43u8; 1200];
        let s = stream(&[&a, &b, &c], true, true);
        let mut d = Deframer::new(true, true);
        let mut got = Vec::new();
        for byte in &s {
            d.push(std::slice::from_ref(byte));
            while let Some(f) = d.next_fpdu().unwrap() {
                assert_eq!(f.crc, CrcCheck::Ok);
                got.push(f.ulpdu);
            }
        }
        assert_eq!(got, vec![a, b, c]);
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn flipped_bit_fails_the_crc() {
        let mut s = stream(&[&[1, 2, 3, 4, 5, 6]], true, false);
        s[5] ^= 0x20;
        let mut d = Deframer::new(false, true);
        d.push(&s);
        assert!(matches!(d.next_fpdu().unwrap().unwrap().crc, CrcCheck::Bad { .. }));
    }

    #[test]
    fn many_fpdus_in_one_push_cost_linear_work() {
        // 100,000 small FPDUs arrive in one read, the rest of the last one in a second.
        let one = stream(&[&[7u8; 2]], false, false);
        let mut s: Vec<u8> = one.iter().copied().cycle().take(one.len() * 100_000).collect();
        let tail = s.split_off(s.len() - 3);
        let mut d = Deframer::new(false, false);
        d.push(&s);
        let mut n = 0;
        while let Some(f) = d.next_fpdu().unwrap() {
            assert_eq!(f.crc, CrcCheck::NotNegotiated);
            n += 1;
        }
        d.push(&tail);
        while d.next_fpdu().unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 100_000);
        assert!(d.bytes_moved() <= (s.len() + tail.len()) as u64, "moved {} bytes", d.bytes_moved());
    }

    /// Feeds `s` cut at `cuts` and returns the ULPDUs, with their CRC verdicts.
    fn fed(s: &[u8], cuts: &[usize], crc: bool, markers: bool) -> Vec<(Vec<u8>, CrcCheck)> {
        let mut d = Deframer::new(markers, crc);
        let mut got = Vec::new();
        let mut at = 0;
        for &c in cuts.iter().chain(std::iter::once(&s.len())) {
            let c = c.clamp(at, s.len());
            d.feed(&s[at..c], |u, v| {
                got.push((u.to_vec(), v));
                true
            })
            .unwrap();
            at = c;
        }
        assert_eq!(d.buffered(), 0);
        got
    }

    #[test]
    fn feeding_cut_anywhere_gives_the_same_fpdus_as_pushing() {
        let (a, b, c) = (vec![0x41u8; 700], vec![0x42u8; 3], vec![0x43u8; 1200]);
        for (crc, markers) in [(false, false), (true, false), (true, true), (false, true)] {
            let s = stream(&[&a, &b, &c], crc, markers);
            let want = if crc { CrcCheck::Ok } else { CrcCheck::NotNegotiated };
            let expected = vec![(a.clone(), want), (b.clone(), want), (c.clone(), want)];
            for step in [1, 2, 3, 7, 512, 704, 1000, s.len()] {
                let cuts: Vec<usize> = (step..s.len()).step_by(step).collect();
                assert_eq!(fed(&s, &cuts, crc, markers), expected, "crc {crc} markers {markers} step {step}");
            }
        }
    }

    #[test]
    fn feeding_stops_when_told_and_refuses_an_oversized_ulpdu() {
        let s = stream(&[&[1u8; 8], &[2u8; 8]], false, false);
        let mut d = Deframer::new(false, false);
        let mut n = 0;
        d.feed(&s, |_, _| {
            n += 1;
            false
        })
        .unwrap();
        assert_eq!(n, 1);
        let mut d = Deframer::new(false, false).with_max_ulpdu_len(1024);
        assert!(d.feed(&[0xff, 0xff, 0, 0], |_, _| true).is_err());
        let mut d = Deframer::new(false, false).with_max_ulpdu_len(1024);
        assert!(d.feed(&[0xff], |_, _| true).is_ok());
        assert!(d.feed(&[0xff, 0, 0], |_, _| true).is_err(), "a header cut in two is still checked");
    }

    #[test]
    fn oversized_ulpdu_is_refused_before_buffering() {
        let mut d = Deframer::new(false, false).with_max_ulpdu_len(1024);
        d.push(&[0xff, 0xff, 0, 0]);
        assert!(d.next_fpdu().is_err());
    }
}
