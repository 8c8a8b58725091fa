//! MPA framing (RFC 5044 §4): FPDUs and markers.
//!
//! An FPDU is `ULPDU_Length (2) | ULPDU | PAD (0..3) | CRC (4)`; the pad brings
//! `2 + ULPDU_Length` to a multiple of 4. The CRC field is always present; it is zero when
//! CRC was not negotiated. The CRC32c is carried least-significant byte first, as siw
//! sends it (the byte order of RFC 3385's CRC32c).
//!
//! With markers, a 4-byte marker sits at every 512th octet of the stream counted from the
//! first FPDU (RFC 5044 §5): two reserved bytes and FPDUPTR, the distance in octets back
//! to the start of the FPDU the marker falls in. A marker that falls exactly where an FPDU
//! starts is sent before the FPDU's header and counts as part of it, with FPDUPTR 0.

use crate::crc::Crc32c;
use crate::wire::{be16, put16};
use crate::{Error, Result};
use core::fmt;

/// Length of the ULPDU_Length field.
pub const HEADER_LEN: usize = 2;
/// Length of the CRC field.
pub const CRC_LEN: usize = 4;
/// Marker spacing in stream octets (RFC 5044 §5).
pub const MARKER_INTERVAL: u64 = 512;
/// Length of a marker.
pub const MARKER_LEN: usize = 4;

/// Pad octets after a ULPDU of `ulpdu_len` bytes.
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (HEADER_LEN + ulpdu_len) % 4) % 4
}

/// Length of an FPDU without markers.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    HEADER_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// A checked view of a marker-free FPDU at the start of a buffer.
#[derive(Debug, Clone, Copy)]
pub struct FpduPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> FpduPacket<T> {
    /// Checks that `buf` holds the whole FPDU its header announces (`buf` may continue).
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        Error::check_len(HEADER_LEN, b.len())?;
        Error::check_len(fpdu_len(usize::from(be16(b, 0))), b.len())?;
        Ok(FpduPacket { buf })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// ULPDU_Length.
    pub fn ulpdu_len(&self) -> usize {
        usize::from(be16(self.b(), 0))
    }
    /// The ULPDU (a DDP segment).
    pub fn ulpdu(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + self.ulpdu_len()]
    }
    /// The pad octets.
    pub fn pad(&self) -> &[u8] {
        let s = HEADER_LEN + self.ulpdu_len();
        &self.b()[s..s + pad_len(self.ulpdu_len())]
    }
    /// Bytes of the FPDU, CRC included.
    pub fn total_len(&self) -> usize {
        fpdu_len(self.ulpdu_len())
    }
    /// The CRC field as carried.
    pub fn crc(&self) -> u32 {
        let s = self.total_len() - CRC_LEN;
        let c = &self.b()[s..s + CRC_LEN];
        u32::from_le_bytes([c[0], c[1], c[2], c[3]])
    }
    /// The CRC32c computed over length, ULPDU and pad.
    pub fn computed_crc(&self) -> u32 {
        crate::crc::crc32c(&self.b()[..self.total_len() - CRC_LEN])
    }
    /// Verifies the CRC field (always passes under `cfg(fuzzing)`).
    pub fn verify_crc(&self) -> Result<()> {
        let (carried, computed) = (self.crc(), self.computed_crc());
        if carried == computed || cfg!(fuzzing) {
            Ok(())
        } else {
            Err(Error::BadChecksum { carried, computed })
        }
    }
}

/// An FPDU to send: its ULPDU, its pad octets and whether a CRC is filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpduRepr<'a> {
    /// The ULPDU (DDP header and payload).
    pub ulpdu: &'a [u8],
    /// The pad octets (only the first [`pad_len`] are sent). RFC 5044 §4.1 asks for zeros
    /// and receivers ignore them; siw sends whatever its buffer held, so they are kept
    /// for byte-exact re-emission.
    pub pad: [u8; 3],
    /// Fill the CRC field (negotiated) or leave it zero.
    pub with_crc: bool,
}

impl<'a> FpduRepr<'a> {
    /// Reads a checked FPDU; `with_crc` is taken from the connection, not from the bytes.
    pub fn parse(p: &FpduPacket<&'a [u8]>, with_crc: bool) -> Result<FpduRepr<'a>> {
        let ulpdu: &'a [u8] = &p.buf[HEADER_LEN..HEADER_LEN + p.ulpdu_len()];
        let mut pad = [0u8; 3];
        pad[..p.pad().len()].copy_from_slice(p.pad());
        Ok(FpduRepr { ulpdu, pad, with_crc })
    }
    /// Bytes on the wire without markers.
    pub fn buffer_len(&self) -> usize {
        fpdu_len(self.ulpdu.len())
    }
    /// Writes the FPDU (zero pad, CRC filled or zero) into `buf[..self.buffer_len()]`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let len = u16::try_from(self.ulpdu.len()).map_err(|_| Error::BadLength("ULPDU over 65535"))?;
        let total = self.buffer_len();
        Error::check_len(total, buf.len())?;
        put16(buf, 0, len);
        buf[HEADER_LEN..HEADER_LEN + self.ulpdu.len()].copy_from_slice(self.ulpdu);
        let pad_at = HEADER_LEN + self.ulpdu.len();
        let pad = pad_len(self.ulpdu.len());
        buf[pad_at..pad_at + pad].copy_from_slice(&self.pad[..pad]);
        buf[pad_at + pad..total].fill(0);
        if self.with_crc {
            let crc = crate::crc::crc32c(&buf[..total - CRC_LEN]);
            buf[total - CRC_LEN..total].copy_from_slice(&crc.to_le_bytes());
        }
        Ok(())
    }
}

impl fmt::Display for FpduRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FPDU ulpdu_len={} crc={}", self.ulpdu.len(), self.with_crc as u8)
    }
}

/// A marker (RFC 5044 §5): two reserved octets and FPDUPTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MarkerRepr {
    /// Octets from the start of the enclosing FPDU to this marker.
    pub fpdu_ptr: u16,
}

impl MarkerRepr {
    /// Reads a marker.
    pub fn parse(b: &[u8]) -> Result<MarkerRepr> {
        Error::check_len(MARKER_LEN, b.len())?;
        if be16(b, 0) != 0 {
            return Err(Error::BadValue("marker reserved field"));
        }
        Ok(MarkerRepr { fpdu_ptr: be16(b, 2) })
    }
    /// Writes a marker.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        Error::check_len(MARKER_LEN, b.len())?;
        put16(b, 0, 0);
        put16(b, 2, self.fpdu_ptr);
        Ok(())
    }
}

impl fmt::Display for MarkerRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "marker fpduptr={}", self.fpdu_ptr)
    }
}

/// Octets to the next marker position at or after `stream_offset`.
pub const fn to_next_marker(stream_offset: u64) -> u64 {
    (MARKER_INTERVAL - stream_offset % MARKER_INTERVAL) % MARKER_INTERVAL
}

/// Wire length of an FPDU of `len` marker-free octets that starts at `stream_offset`.
pub fn wire_len_with_markers(stream_offset: u64, len: usize) -> usize {
    let (mut i, mut o) = (0usize, 0usize);
    while i < len {
        let off = stream_offset + o as u64;
        if off.is_multiple_of(MARKER_INTERVAL) {
            o += MARKER_LEN;
            continue;
        }
        let run = (to_next_marker(off) as usize).min(len - i);
        i += run;
        o += run;
    }
    o
}

/// Copies a marker-free FPDU into `out`, inserting markers; returns the wire length.
pub fn insert_markers(stream_offset: u64, fpdu: &[u8], out: &mut [u8]) -> Result<usize> {
    let need = wire_len_with_markers(stream_offset, fpdu.len());
    Error::check_len(need, out.len())?;
    let (mut i, mut o) = (0usize, 0usize);
    while i < fpdu.len() {
        let off = stream_offset + o as u64;
        if off.is_multiple_of(MARKER_INTERVAL) {
            let ptr = u16::try_from(o).map_err(|_| Error::BadLength("FPDU over 65535"))?;
            MarkerRepr { fpdu_ptr: ptr }.emit(&mut out[o..])?;
            o += MARKER_LEN;
            continue;
        }
        let run = (to_next_marker(off) as usize).min(fpdu.len() - i);
        out[o..o + run].copy_from_slice(&fpdu[i..i + run]);
        i += run;
        o += run;
    }
    Ok(o)
}

/// Removes markers from the wire bytes of one FPDU that starts at `stream_offset`,
/// checking each FPDUPTR. Returns the marker-free length written to `out`.
pub fn strip_markers(stream_offset: u64, wire: &[u8], out: &mut [u8]) -> Result<usize> {
    let (mut i, mut o) = (0usize, 0usize);
    while i < wire.len() {
        let off = stream_offset + i as u64;
        if off.is_multiple_of(MARKER_INTERVAL) {
            Error::check_len(i + MARKER_LEN, wire.len())?;
            let m = MarkerRepr::parse(&wire[i..])?;
            if usize::from(m.fpdu_ptr) != i {
                return Err(Error::BadValue("marker FPDUPTR does not point at the FPDU"));
            }
            i += MARKER_LEN;
            continue;
        }
        let run = (to_next_marker(off) as usize).min(wire.len() - i);
        Error::check_len(o + run, out.len())?;
        out[o..o + run].copy_from_slice(&wire[i..i + run]);
        i += run;
        o += run;
    }
    Ok(o)
}

/// The CRC32c of an FPDU of `fpdu_len` marker-free octets as sent with markers from
/// `stream_offset`: it covers every wire octet, markers included, before the CRC field
/// (RFC 5044 §4.1).
pub fn crc_with_markers(stream_offset: u64, wire: &[u8], fpdu_len: usize) -> Result<u32> {
    let covered = wire_len_with_markers(stream_offset, fpdu_len.saturating_sub(CRC_LEN));
    Error::check_len(covered, wire.len())?;
    let mut crc = Crc32c::new();
    crc.update(&wire[..covered]);
    Ok(crc.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    // siw-crc-rping.pcap frame 8: a 34-byte Send ULPDU with CRC 0xa8cc1c6f.
    #[test]
    fn pad_and_lengths() {
        assert_eq!((pad_len(34), fpdu_len(34)), (0, 40));
        assert_eq!((pad_len(35), fpdu_len(35)), (3, 44));
        assert_eq!(pad_len(0), 2);
    }

    #[test]
    fn emit_then_verify_crc() {
        let ulpdu = [0x41u8, 0x43, 1, 2, 3];
        let r = FpduRepr { ulpdu: &ulpdu, pad: [0; 3], with_crc: true };
        let mut buf = [0u8; 12];
        r.emit(&mut buf).unwrap();
        let p = FpduPacket::new_checked(&buf[..]).unwrap();
        assert!(p.verify_crc().is_ok());
        assert_eq!(p.ulpdu(), &ulpdu);
        buf[4] ^= 1;
        assert!(FpduPacket::new_checked(&buf[..]).unwrap().verify_crc().is_err());
    }

    #[test]
    fn markers_every_512_octets_round_trip() {
        let data: [u8; 1500] = core::array::from_fn(|i| (i * 7) as u8);
        for start in [0u64, 1, 100, 508, 511, 512, 1000, 1023] {
            let mut wire = [0u8; 1600];
            let n = insert_markers(start, &data, &mut wire).unwrap();
            assert_eq!(n, wire_len_with_markers(start, data.len()), "start {start}");
            let mut back = [0u8; 1500];
            let m = strip_markers(start, &wire[..n], &mut back).unwrap();
            assert_eq!(m, data.len());
            assert_eq!(back, data);
        }
    }

    #[test]
    fn marker_points_back_to_fpdu_start() {
        let data = [0xabu8; 600];
        let mut wire = [0u8; 700];
        let n = insert_markers(500, &data, &mut wire).unwrap();
        // Markers at stream offsets 512 and 1024: 12 and 524 wire octets into the FPDU.
        assert_eq!(n, 608);
        assert_eq!(MarkerRepr::parse(&wire[12..16]).unwrap().fpdu_ptr, 12);
        assert_eq!(MarkerRepr::parse(&wire[524..528]).unwrap().fpdu_ptr, 524);
        let mut at_start = [0u8; 700];
        insert_markers(1024, &data, &mut at_start).unwrap();
        assert_eq!(&at_start[..4], &[0, 0, 0, 0]);
        assert_eq!(at_start[4], 0xab);
    }
}
