//! Puts ULPDUs on an MPA stream as FPDUs (RFC 5044 §4-5): length, ULPDU, zero pad, CRC32c
//! when negotiated, and markers every 512 stream octets when the peer asked for them. The
//! inverse of [`super::deframer::Deframer`]; stream offset 0 is the first octet after the
//! MPA Request/Reply, where markers are counted from.

use super::txqueue::Output;
use crate::proto::iwarp::fpdu::{self, crc_with_markers, fpdu_len, insert_markers, wire_len_with_markers, FpduRepr};
use crate::proto::Error;

/// The transmit side of one connection's MPA stream.
#[derive(Debug, Clone)]
pub struct Framer {
    offset: u64,
    markers: bool,
    crc: bool,
}

impl Framer {
    /// A framer with the negotiated settings for the direction it sends.
    pub fn new(markers: bool, crc: bool) -> Self {
        Framer { offset: 0, markers, crc }
    }

    /// Stream offset of the next FPDU.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Appends one FPDU whose `ulpdu_len`-octet ULPDU `fill` writes in place, so that a
    /// payload is copied once from its source into the stream (RFC 5044 §4: length, ULPDU,
    /// zero pad, CRC). With markers the FPDU is laid out whole first, then marked.
    pub fn frame_with(
        &mut self,
        ulpdu_len: usize,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if self.markers {
            let mut ulpdu = vec![0u8; ulpdu_len];
            fill(&mut ulpdu)?;
            return self.frame(&ulpdu, out);
        }
        let len = u16::try_from(ulpdu_len).map_err(|_| Error::BadLength("ULPDU over 65535"))?;
        let total = fpdu_len(ulpdu_len);
        let start = out.len();
        out.resize(start + total, 0);
        let buf = &mut out[start..];
        buf[..fpdu::HEADER_LEN].copy_from_slice(&len.to_be_bytes());
        if let Err(e) = fill(&mut buf[fpdu::HEADER_LEN..fpdu::HEADER_LEN + ulpdu_len]) {
            out.truncate(start);
            return Err(e);
        }
        if self.crc {
            let crc = crate::proto::crc::crc32c(&buf[..total - fpdu::CRC_LEN]);
            buf[total - fpdu::CRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        }
        self.offset += total as u64;
        Ok(())
    }

    /// True when an FPDU may carry its payload as spans of registered memory
    /// ([`Framer::frame_spliced`]): without markers or a CRC, which would read and copy it.
    pub fn splices(&self) -> bool {
        !self.markers && !self.crc
    }

    /// Appends one FPDU whose ULPDU is a `head_len`-octet header `emit` writes, then
    /// `payload_len` octets `splice` appends to `out` (spans of memory, sent where they
    /// lie), then the zero pad and the CRC field, zero as no CRC was negotiated: the FPDU
    /// of RFC 5044 §4, laid out as [`Framer::frame_with`] lays it. Only where
    /// [`Framer::splices`].
    pub fn frame_spliced(
        &mut self,
        (head_len, payload_len): (usize, usize),
        out: &mut Output,
        emit: impl FnOnce(&mut [u8]) -> Result<(), Error>,
        splice: impl FnOnce(&mut Output) -> Result<(), Error>,
    ) -> Result<(), Error> {
        debug_assert!(self.splices());
        let ulpdu_len = head_len + payload_len;
        let len = u16::try_from(ulpdu_len).map_err(|_| Error::BadLength("ULPDU over 65535"))?;
        let mark = out.mark();
        let before = out.len();
        let bytes = out.bytes_mut();
        let start = bytes.len();
        bytes.resize(start + fpdu::HEADER_LEN + head_len, 0);
        bytes[start..start + fpdu::HEADER_LEN].copy_from_slice(&len.to_be_bytes());
        let mut framed = emit(&mut bytes[start + fpdu::HEADER_LEN..]).and_then(|()| splice(out));
        if framed.is_ok() && out.len() - before != fpdu::HEADER_LEN + ulpdu_len {
            framed = Err(Error::BadLength("the payload is not the length announced"));
        }
        if let Err(e) = framed {
            out.truncate(mark);
            return Err(e);
        }
        let total = fpdu_len(ulpdu_len);
        let bytes = out.bytes_mut();
        bytes.resize(bytes.len() + total - fpdu::HEADER_LEN - ulpdu_len, 0);
        self.offset += total as u64;
        Ok(())
    }

    /// Appends one FPDU carrying `ulpdu` to `out`.
    pub fn frame(&mut self, ulpdu: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        let repr = FpduRepr { ulpdu, pad: [0; 3], with_crc: self.crc && !self.markers };
        let mut plain = vec![0u8; repr.buffer_len()];
        repr.emit(&mut plain)?;
        if !self.markers {
            out.extend_from_slice(&plain);
            self.offset += plain.len() as u64;
            return Ok(());
        }
        let wire_len = wire_len_with_markers(self.offset, plain.len());
        let start = out.len();
        out.resize(start + wire_len, 0);
        insert_markers(self.offset, &plain, &mut out[start..])?;
        if self.crc {
            // The CRC covers the wire octets before it, markers included: compute it over
            // the marked stream, put it in the FPDU, and mark again.
            let crc = crc_with_markers(self.offset, &out[start..], plain.len())?;
            let n = plain.len();
            plain[n - fpdu::CRC_LEN..].copy_from_slice(&crc.to_le_bytes());
            insert_markers(self.offset, &plain, &mut out[start..])?;
        }
        self.offset += wire_len as u64;
        Ok(())
    }
}
