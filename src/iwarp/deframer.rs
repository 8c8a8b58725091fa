//! Turns an MPA byte stream, split anywhere, back into FPDUs (RFC 5044 §4 and §5).
//!
//! The deframer starts after the MPA Request/Reply: its stream offset 0 is the first
//! octet of the first FPDU, which is also where markers are counted from. It holds at most
//! one FPDU of buffered bytes beyond what it was given, so a peer cannot make it buffer
//! without bound: a ULPDU_Length above the configured limit is an error.

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
    offset: u64,
    markers: bool,
    crc: bool,
    max_ulpdu_len: usize,
}

impl Deframer {
    /// A deframer for a direction with the negotiated markers and CRC settings.
    pub fn new(markers: bool, crc: bool) -> Self {
        Deframer { buf: Vec::new(), offset: 0, markers, crc, max_ulpdu_len: usize::from(u16::MAX) }
    }

    /// Refuses FPDUs whose ULPDU is longer than `len` (the connection's MULPDU limit).
    pub fn with_max_ulpdu_len(mut self, len: usize) -> Self {
        self.max_ulpdu_len = len;
        self
    }

    /// Appends stream bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes received but not yet part of a whole FPDU.
    pub fn buffered(&self) -> usize {
        self.buf.len()
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
        if self.buf.len() < head_wire {
            return Ok(None);
        }
        if self.markers {
            let mut tmp = [0u8; fpdu::HEADER_LEN + fpdu::MARKER_LEN];
            let n = strip_markers(self.offset, &self.buf[..head_wire], &mut tmp)?;
            hdr.copy_from_slice(&tmp[..n.min(fpdu::HEADER_LEN)]);
        } else {
            hdr.copy_from_slice(&self.buf[..fpdu::HEADER_LEN]);
        }
        Ok(Some(usize::from(u16::from_be_bytes(hdr))))
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
        if self.buf.len() < wire_len {
            return Ok(None);
        }
        let wire = &self.buf[..wire_len];
        let mut plain = vec![0u8; plain_len];
        let crc_computed = if self.markers {
            strip_markers(self.offset, wire, &mut plain)?;
            crc_with_markers(self.offset, wire, plain_len)?
        } else {
            plain.copy_from_slice(wire);
            crate::proto::crc::crc32c(&wire[..plain_len - fpdu::CRC_LEN])
        };
        let t = &plain[plain_len - fpdu::CRC_LEN..];
        let carried = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
        let crc = match (self.crc, carried == crc_computed || cfg!(fuzzing)) {
            (false, _) => CrcCheck::NotNegotiated,
            (true, true) => CrcCheck::Ok,
            (true, false) => CrcCheck::Bad { carried, computed: crc_computed },
        };
        let fpdu = Fpdu {
            ulpdu: plain[fpdu::HEADER_LEN..fpdu::HEADER_LEN + ulpdu_len].to_vec(),
            crc,
            start_offset: self.offset,
            wire_len,
        };
        self.buf.drain(..wire_len);
        self.offset += wire_len as u64;
        Ok(Some(fpdu))
    }
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
    fn oversized_ulpdu_is_refused_before_buffering() {
        let mut d = Deframer::new(false, false).with_max_ulpdu_len(1024);
        d.push(&[0xff, 0xff, 0, 0]);
        assert!(d.next_fpdu().is_err());
    }
}
