//! The common MAD header (IBTA 13.4.3) and a whole CM MAD.

use super::msg::CmMessage;
use crate::wire::{be16, be32, be64, put16, put32, put64};
use crate::{Error, Result};
use core::fmt;

/// Length of every MAD.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const HEADER_LEN: usize = 24;
/// Management class of Communication Management (IBTA Table 101).
pub const MGMT_CLASS_CM: u8 = 0x07;

/// CM attribute IDs (IBTA 12.6, Table 104).
pub mod attr {
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MessageReceiptAcknowledgement.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResolutionRequest (IBTA 12.11.1): rdma_cm's UD "connect".
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResolutionResponse (IBTA 12.11.2).
    pub const SIDR_REP: u16 = 0x0018;
}

/// A checked view of a MAD: exactly 256 bytes.
#[derive(Debug, Clone, Copy)]
pub struct MadPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> MadPacket<T> {
    /// Checks that `buf` is one whole MAD.
    pub fn new_checked(buf: T) -> Result<Self> {
        let n = buf.as_ref().len();
        Error::check_len(MAD_LEN, n)?;
        if n != MAD_LEN {
            return Err(Error::BadLength("a MAD is 256 bytes"));
        }
        Ok(MadPacket { buf })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// Management class.
    pub fn mgmt_class(&self) -> u8 {
        self.b()[1]
    }
    /// Method, with the response bit.
    pub fn method(&self) -> u8 {
        self.b()[3]
    }
    /// Transaction ID.
    pub fn transaction_id(&self) -> u64 {
        be64(self.b(), 8)
    }
    /// Attribute ID.
    pub fn attribute_id(&self) -> u16 {
        be16(self.b(), 16)
    }
    /// The 232 bytes after the header.
    pub fn data(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }
}

/// The common MAD header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeaderRepr {
    /// BaseVersion (1).
    pub base_version: u8,
    /// Management class (CM: 0x07).
    pub mgmt_class: u8,
    /// Class version (CM: 2).
    pub class_version: u8,
    /// R bit and method (CM sends 0x03, Send).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class specific.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Reserved (kept so a MAD round-trips).
    pub reserved: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// Reads the header.
    pub fn parse(b: &[u8]) -> Result<Self> {
        Error::check_len(HEADER_LEN, b.len())?;
        Ok(MadHeaderRepr {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be16(b, 4),
            class_specific: be16(b, 6),
            transaction_id: be64(b, 8),
            attribute_id: be16(b, 16),
            reserved: be16(b, 18),
            attribute_modifier: be32(b, 20),
        })
    }
    /// Writes the header.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        Error::check_len(HEADER_LEN, b.len())?;
        b[..4].copy_from_slice(&[self.base_version, self.mgmt_class, self.class_version, self.method]);
        put16(b, 4, self.status);
        put16(b, 6, self.class_specific);
        put64(b, 8, self.transaction_id);
        put16(b, 16, self.attribute_id);
        put16(b, 18, self.reserved);
        put32(b, 20, self.attribute_modifier);
        Ok(())
    }
}

impl fmt::Display for MadHeaderRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MAD class=0x{:02x} v{} method=0x{:02x} tid=0x{:x} attr=0x{:04x}",
            self.mgmt_class, self.class_version, self.method, self.transaction_id, self.attribute_id
        )
    }
}

/// A whole MAD: header and, for the CM class, the decoded message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMadRepr<'a> {
    /// Common header.
    pub header: MadHeaderRepr,
    /// The message the attribute ID names.
    pub message: CmMessage<'a>,
}

impl<'a> CmMadRepr<'a> {
    /// Reads a checked MAD.
    pub fn parse(p: &MadPacket<&'a [u8]>) -> Result<Self> {
        let header = MadHeaderRepr::parse(p.buf)?;
        let data: &'a [u8] = &p.buf[HEADER_LEN..];
        let message = if header.mgmt_class == MGMT_CLASS_CM {
            CmMessage::parse(header.attribute_id, data)?
        } else {
            CmMessage::Other(data)
        };
        Ok(CmMadRepr { header, message })
    }
    /// Writes the 256-byte MAD.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        Error::check_len(MAD_LEN, b.len())?;
        self.header.emit(b)?;
        self.message.emit(&mut b[HEADER_LEN..MAD_LEN])
    }
}

impl fmt::Display for CmMadRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.header.mgmt_class == MGMT_CLASS_CM {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}", self.header)
        }
    }
}
