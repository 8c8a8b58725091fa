//! DDP segment headers (RFC 5041 §4): tagged (14 bytes) and untagged (18 bytes).

use crate::wire::{be32, be64, put32, put64};
use crate::{Error, Result};
use core::fmt;

/// Length of a tagged DDP header.
pub const TAGGED_LEN: usize = 14;
/// Length of an untagged DDP header.
pub const UNTAGGED_LEN: usize = 18;
/// The DDP version RFC 5041 defines.
pub const VERSION: u8 = 1;

/// A checked view of a DDP segment (header and payload).
#[derive(Debug, Clone, Copy)]
pub struct DdpPacket<T: AsRef<[u8]>> {
    buf: T,
}

/// Length of the DDP header that starts `b`, from its T bit.
pub fn header_len(b: &[u8]) -> Result<usize> {
    Error::check_len(1, b.len())?;
    Ok(if b[0] & 0x80 != 0 { TAGGED_LEN } else { UNTAGGED_LEN })
}

impl<T: AsRef<[u8]>> DdpPacket<T> {
    /// Checks that the whole header is present.
    pub fn new_checked(buf: T) -> Result<Self> {
        let n = header_len(buf.as_ref())?;
        Error::check_len(n, buf.as_ref().len())?;
        Ok(DdpPacket { buf })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// T: tagged buffer model.
    pub fn tagged(&self) -> bool {
        self.b()[0] & 0x80 != 0
    }
    /// L: last segment of the message.
    pub fn last(&self) -> bool {
        self.b()[0] & 0x40 != 0
    }
    /// The four reserved bits after L.
    pub fn reserved(&self) -> u8 {
        (self.b()[0] >> 2) & 0x0f
    }
    /// DV: DDP version.
    pub fn version(&self) -> u8 {
        self.b()[0] & 0x03
    }
    /// RsvdULP octet (the RDMAP control byte).
    pub fn rsvd_ulp(&self) -> u8 {
        self.b()[1]
    }
    /// Header length.
    pub fn header_len(&self) -> usize {
        if self.tagged() {
            TAGGED_LEN
        } else {
            UNTAGGED_LEN
        }
    }
    /// Tagged: STag.
    pub fn stag(&self) -> u32 {
        be32(self.b(), 2)
    }
    /// Tagged: tagged offset.
    pub fn tagged_offset(&self) -> u64 {
        be64(self.b(), 6)
    }
    /// Untagged: the 32 RsvdULP bits (RDMAP puts the invalidate STag here).
    pub fn rsvd_ulp32(&self) -> u32 {
        be32(self.b(), 2)
    }
    /// Untagged: queue number.
    pub fn qn(&self) -> u32 {
        be32(self.b(), 6)
    }
    /// Untagged: message sequence number.
    pub fn msn(&self) -> u32 {
        be32(self.b(), 10)
    }
    /// Untagged: message offset.
    pub fn mo(&self) -> u32 {
        be32(self.b(), 14)
    }
    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
}

/// Tagged or untagged buffer addressing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DdpBuffer {
    /// Tagged buffer model: placement by STag and offset (RFC 5041 §4.3).
    Tagged {
        /// Data sink STag.
        stag: u32,
        /// Data sink tagged offset.
        to: u64,
    },
    /// Untagged buffer model: queue, message and offset (RFC 5041 §4.4).
    Untagged {
        /// RsvdULP, 32 bits (RDMAP: invalidate STag, else 0).
        rsvd_ulp: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number.
        msn: u32,
        /// Message offset.
        mo: u32,
    },
}

/// DDP header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DdpRepr {
    /// L: last segment of the message.
    pub last: bool,
    /// DV (RFC 5041 sends 1).
    pub version: u8,
    /// RsvdULP octet (the RDMAP control byte).
    pub rsvd_ulp: u8,
    /// Addressing.
    pub buffer: DdpBuffer,
}

impl DdpRepr {
    /// Reads a checked header; the reserved bits must be zero (RFC 5041 §4.2).
    pub fn parse<T: AsRef<[u8]>>(p: &DdpPacket<T>) -> Result<DdpRepr> {
        if p.reserved() != 0 {
            return Err(Error::BadValue("DDP reserved bits"));
        }
        let buffer = if p.tagged() {
            DdpBuffer::Tagged { stag: p.stag(), to: p.tagged_offset() }
        } else {
            DdpBuffer::Untagged { rsvd_ulp: p.rsvd_ulp32(), qn: p.qn(), msn: p.msn(), mo: p.mo() }
        };
        Ok(DdpRepr { last: p.last(), version: p.version(), rsvd_ulp: p.rsvd_ulp(), buffer })
    }
    /// Header length.
    pub fn header_len(&self) -> usize {
        match self.buffer {
            DdpBuffer::Tagged { .. } => TAGGED_LEN,
            DdpBuffer::Untagged { .. } => UNTAGGED_LEN,
        }
    }
    /// Writes the header into `buf[..self.header_len()]`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(self.header_len(), buf.len())?;
        let tagged = matches!(self.buffer, DdpBuffer::Tagged { .. });
        buf[0] = (tagged as u8) << 7 | (self.last as u8) << 6 | (self.version & 0x3);
        buf[1] = self.rsvd_ulp;
        match self.buffer {
            DdpBuffer::Tagged { stag, to } => {
                put32(buf, 2, stag);
                put64(buf, 6, to);
            }
            DdpBuffer::Untagged { rsvd_ulp, qn, msn, mo } => {
                put32(buf, 2, rsvd_ulp);
                put32(buf, 6, qn);
                put32(buf, 10, msn);
                put32(buf, 14, mo);
            }
        }
        Ok(())
    }
}

impl fmt::Display for DdpRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.buffer {
            DdpBuffer::Tagged { stag, to } => write!(f, "DDP tagged stag=0x{stag:08x} to=0x{to:x}")?,
            DdpBuffer::Untagged { qn, msn, mo, .. } => write!(f, "DDP untagged qn={qn} msn={msn} mo={mo}")?,
        }
        if self.last {
            f.write_str(" last")?;
        }
        Ok(())
    }
}
