//! RDMAP (RFC 5040 §4): the control byte carried in DDP's RsvdULP octet, the RDMA Read
//! Request body, and Terminate with its layer/type/code tables and copied headers.

use super::ddp::{self, DdpBuffer, DdpPacket, DdpRepr};
use crate::wire::{be16, be32, be64, put16, put32, put64};
use crate::{Error, Result};
use core::fmt;

/// The RDMAP version RFC 5040 defines.
pub const VERSION: u8 = 1;
/// Untagged queue of Send messages (RFC 5040 §5.1).
pub const QN_SEND: u32 = 0;
/// Untagged queue of RDMA Read Requests.
pub const QN_READ_REQUEST: u32 = 1;
/// Untagged queue of Terminate messages.
pub const QN_TERMINATE: u32 = 2;

/// RDMAP opcodes (RFC 5040 §4.3; 0x8..0xb from RFC 7306 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, queue 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send.
    Send = 3,
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSolicited = 5,
    /// Send with Solicited Event and Invalidate.
    SendSolicitedInvalidate = 6,
    /// Terminate (untagged, queue 2).
    Terminate = 7,
    /// Immediate Data (RFC 7306).
    ImmediateData = 8,
    /// Immediate Data with Solicited Event (RFC 7306).
    ImmediateDataSolicited = 9,
    /// Atomic Request (RFC 7306).
    AtomicRequest = 10,
    /// Atomic Response (RFC 7306).
    AtomicResponse = 11,
}

impl Opcode {
    /// Decodes the 4-bit opcode.
    pub fn from_bits(v: u8) -> Result<Opcode> {
        use Opcode::*;
        Ok(match v {
            0 => Write,
            1 => ReadRequest,
            2 => ReadResponse,
            3 => Send,
            4 => SendInvalidate,
            5 => SendSolicited,
            6 => SendSolicitedInvalidate,
            7 => Terminate,
            8 => ImmediateData,
            9 => ImmediateDataSolicited,
            10 => AtomicRequest,
            11 => AtomicResponse,
            _ => return Err(Error::BadValue("RDMAP opcode")),
        })
    }
    /// True for opcodes that travel in tagged DDP segments.
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }
    /// Name as in RFC 5040.
    pub fn name(self) -> &'static str {
        use Opcode::*;
        match self {
            Write => "WRITE",
            ReadRequest => "READ_REQUEST",
            ReadResponse => "READ_RESPONSE",
            Send => "SEND",
            SendInvalidate => "SEND_INV",
            SendSolicited => "SEND_SE",
            SendSolicitedInvalidate => "SEND_SE_INV",
            Terminate => "TERMINATE",
            ImmediateData => "IMMEDIATE",
            ImmediateDataSolicited => "IMMEDIATE_SE",
            AtomicRequest => "ATOMIC_REQUEST",
            AtomicResponse => "ATOMIC_RESPONSE",
        }
    }
}

/// The RDMAP control octet: RV (2 bits), reserved (2), opcode (4) (RFC 5040 §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Control {
    /// RDMAP version.
    pub version: u8,
    /// Opcode.
    pub opcode: Opcode,
}

impl Control {
    /// Decodes the octet; reserved bits must be zero.
    pub fn from_byte(b: u8) -> Result<Control> {
        if b & 0x30 != 0 {
            return Err(Error::BadValue("RDMAP reserved bits"));
        }
        Ok(Control { version: b >> 6, opcode: Opcode::from_bits(b & 0x0f)? })
    }
    /// Encodes the octet.
    pub fn to_byte(self) -> u8 {
        (self.version & 0x3) << 6 | self.opcode as u8
    }
}

impl fmt::Display for Control {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RDMAP v{} {}", self.version, self.opcode.name())
    }
}

/// RDMA Read Request body (RFC 5040 §4.4), 28 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadRequestRepr {
    /// Data sink STag (where the response is placed).
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// RDMA Read message size.
    pub size: u32,
    /// Data source STag.
    pub src_stag: u32,
    /// Data source tagged offset.
    pub src_to: u64,
}

impl ReadRequestRepr {
    /// Length of the body.
    pub const LEN: usize = 28;
    /// Reads the body.
    pub fn parse(b: &[u8]) -> Result<Self> {
        Error::check_len(Self::LEN, b.len())?;
        Ok(ReadRequestRepr {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            src_stag: be32(b, 16),
            src_to: be64(b, 20),
        })
    }
    /// Writes the body.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        Error::check_len(Self::LEN, b.len())?;
        put32(b, 0, self.sink_stag);
        put64(b, 4, self.sink_to);
        put32(b, 12, self.size);
        put32(b, 16, self.src_stag);
        put64(b, 20, self.src_to);
        Ok(())
    }
}

impl fmt::Display for ReadRequestRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sink=0x{:08x}@0x{:x} src=0x{:08x}@0x{:x} size={}",
            self.sink_stag, self.sink_to, self.src_stag, self.src_to, self.size
        )
    }
}

/// The layer a Terminate blames (RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// RDMAP (0).
    Rdmap,
    /// DDP (1).
    Ddp,
    /// The lower layer protocol: MPA (2).
    Llp,
    /// A reserved value.
    Reserved(u8),
}

impl Layer {
    /// The layer a 4-bit value names.
    pub fn from_bits(v: u8) -> Layer {
        match v {
            0 => Layer::Rdmap,
            1 => Layer::Ddp,
            2 => Layer::Llp,
            v => Layer::Reserved(v),
        }
    }
    /// The 4-bit value of the layer.
    pub fn bits(self) -> u8 {
        match self {
            Layer::Rdmap => 0,
            Layer::Ddp => 1,
            Layer::Llp => 2,
            Layer::Reserved(v) => v & 0xf,
        }
    }
}

/// Text for a Terminate's layer, error type and code (RFC 5040 §7.1, RFC 5041 §7.2,
/// RFC 5044 §8, RFC 6581 §9).
pub fn describe(layer: Layer, etype: u8, ecode: u8) -> &'static str {
    match (layer, etype, ecode) {
        (Layer::Rdmap, 0, _) => "local catastrophic error",
        (Layer::Rdmap, 1, 0) | (Layer::Rdmap, 2, 0) => "invalid STag",
        (Layer::Rdmap, 1, 1) | (Layer::Rdmap, 2, 1) => "base or bounds violation",
        (Layer::Rdmap, 1, 2) | (Layer::Rdmap, 2, 2) => "access rights violation",
        (Layer::Rdmap, 1, 3) | (Layer::Rdmap, 2, 3) => "STag not associated with RDMAP stream",
        (Layer::Rdmap, 1, 4) | (Layer::Rdmap, 2, 4) => "TO wrap",
        (Layer::Rdmap, 1, 9) => "STag cannot be invalidated",
        (Layer::Rdmap, 2, 5) => "invalid RDMAP version",
        (Layer::Rdmap, 2, 6) => "unexpected opcode",
        (Layer::Rdmap, 2, 7) => "catastrophic error, localized to RDMAP stream",
        (Layer::Rdmap, 2, 8) => "catastrophic error, global",
        (Layer::Rdmap, 2, 9) => "STag cannot be invalidated",
        (Layer::Rdmap, _, _) => "unspecified RDMAP error",
        (Layer::Ddp, 0, _) => "DDP local catastrophic error",
        (Layer::Ddp, 1, 0) => "tagged buffer: invalid STag",
        (Layer::Ddp, 1, 1) => "tagged buffer: base or bounds violation",
        (Layer::Ddp, 1, 2) => "tagged buffer: STag not associated with DDP stream",
        (Layer::Ddp, 1, 3) => "tagged buffer: TO wrap",
        (Layer::Ddp, 1, 4) => "tagged buffer: invalid DDP version",
        (Layer::Ddp, 2, 1) => "untagged buffer: invalid QN",
        (Layer::Ddp, 2, 2) => "untagged buffer: invalid MSN, no buffer available",
        (Layer::Ddp, 2, 3) => "untagged buffer: invalid MSN, MSN range",
        (Layer::Ddp, 2, 4) => "untagged buffer: invalid MO",
        (Layer::Ddp, 2, 5) => "untagged buffer: message too long",
        (Layer::Ddp, 2, 6) => "untagged buffer: invalid DDP version",
        (Layer::Ddp, _, _) => "unspecified DDP error",
        (Layer::Llp, 0, 1) => "MPA: TCP connection lost",
        (Layer::Llp, 0, 2) => "MPA: received CRC error",
        (Layer::Llp, 0, 3) => "MPA: marker or FPDU start error",
        (Layer::Llp, 0, 4) => "MPA: invalid request or reply",
        (Layer::Llp, 0, 5) => "MPA: local catastrophic",
        (Layer::Llp, 0, 6) => "MPA: insufficient IRD",
        (Layer::Llp, 0, 7) => "MPA: no matching RTR",
        _ => "unspecified error",
    }
}

/// Terminate body (RFC 5040 §4.8): control word, then the copied headers of the
/// offending segment as the M, D and R bits announce them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateRepr<'a> {
    /// Layer at fault.
    pub layer: Layer,
    /// Error type (4 bits).
    pub etype: u8,
    /// Error code.
    pub ecode: u8,
    /// M: the offending segment's MPA ULPDU_Length.
    pub ddp_segment_len: Option<u16>,
    /// D: the offending DDP header (14 or 18 bytes).
    pub ddp_header: Option<&'a [u8]>,
    /// R: the offending RDMA Read Request header (28 bytes).
    pub rdmap_header: Option<&'a [u8]>,
    /// The 13 reserved bits of the control word (zero when well formed; kept).
    pub reserved: u16,
    /// Bytes after the copied headers; a well-formed Terminate has none, but they are kept
    /// so that the engine, not the parser, decides what to make of them.
    pub trailing: &'a [u8],
}

impl<'a> TerminateRepr<'a> {
    /// Reads the body.
    pub fn parse(b: &'a [u8]) -> Result<Self> {
        Error::check_len(4, b.len())?;
        let w = be32(b, 0);
        let (m, d, r) = (w & 0x8000 != 0, w & 0x4000 != 0, w & 0x2000 != 0);
        let mut at = 4;
        let ddp_segment_len = if m {
            Error::check_len(at + 2, b.len())?;
            at += 2;
            Some(be16(b, at - 2))
        } else {
            None
        };
        let ddp_header = if d {
            let n = ddp::header_len(&b[at.min(b.len())..])?;
            Error::check_len(at + n, b.len())?;
            at += n;
            Some(&b[at - n..at])
        } else {
            None
        };
        let rdmap_header = if r {
            Error::check_len(at + ReadRequestRepr::LEN, b.len())?;
            at += ReadRequestRepr::LEN;
            Some(&b[at - ReadRequestRepr::LEN..at])
        } else {
            None
        };
        Ok(TerminateRepr {
            layer: Layer::from_bits((w >> 28) as u8),
            etype: (w >> 24) as u8 & 0xf,
            ecode: (w >> 16) as u8,
            ddp_segment_len,
            ddp_header,
            rdmap_header,
            reserved: (w & 0x1fff) as u16,
            trailing: &b[at..],
        })
    }
    /// Bytes of the body.
    pub fn buffer_len(&self) -> usize {
        4 + self.ddp_segment_len.map_or(0, |_| 2)
            + self.ddp_header.map_or(0, |h| h.len())
            + self.rdmap_header.map_or(0, |h| h.len())
            + self.trailing.len()
    }
    /// Writes the body.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        Error::check_len(self.buffer_len(), b.len())?;
        let w = u32::from(self.layer.bits()) << 28
            | u32::from(self.etype & 0xf) << 24
            | u32::from(self.ecode) << 16
            | (self.ddp_segment_len.is_some() as u32) << 15
            | (self.ddp_header.is_some() as u32) << 14
            | (self.rdmap_header.is_some() as u32) << 13
            | u32::from(self.reserved & 0x1fff);
        put32(b, 0, w);
        let mut at = 4;
        if let Some(n) = self.ddp_segment_len {
            put16(b, at, n);
            at += 2;
        }
        for h in [self.ddp_header, self.rdmap_header, Some(self.trailing)].into_iter().flatten() {
            b[at..at + h.len()].copy_from_slice(h);
            at += h.len();
        }
        Ok(())
    }
}

impl fmt::Display for TerminateRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "layer={:?} etype={} ecode=0x{:02x} ({})",
            self.layer,
            self.etype,
            self.ecode,
            describe(self.layer, self.etype, self.ecode)
        )
    }
}

/// What follows the DDP header of an RDMAP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Body<'a> {
    /// RDMA Read Request.
    ReadRequest(ReadRequestRepr),
    /// Terminate.
    Terminate(TerminateRepr<'a>),
    /// Data: Write, Read Response, Send variants and the RFC 7306 opcodes.
    Data(&'a [u8]),
}

/// One DDP segment read as RDMAP: the ULPDU of one FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageRepr<'a> {
    /// DDP header.
    pub ddp: DdpRepr,
    /// RDMAP control (from the DDP RsvdULP octet).
    pub control: Control,
    /// Body.
    pub body: Body<'a>,
}

impl<'a> MessageRepr<'a> {
    /// Reads a ULPDU; the opcode must match the buffer model.
    pub fn parse(ulpdu: &'a [u8]) -> Result<MessageRepr<'a>> {
        let p = DdpPacket::new_checked(ulpdu)?;
        let ddp = DdpRepr::parse(&p)?;
        let control = Control::from_byte(ddp.rsvd_ulp)?;
        let tagged = matches!(ddp.buffer, DdpBuffer::Tagged { .. });
        if tagged != control.opcode.is_tagged() {
            return Err(Error::BadValue("RDMAP opcode in the wrong DDP buffer model"));
        }
        let rest: &'a [u8] = &ulpdu[p.header_len()..];
        let body = match control.opcode {
            Opcode::ReadRequest => Body::ReadRequest(ReadRequestRepr::parse(rest)?),
            Opcode::Terminate => Body::Terminate(TerminateRepr::parse(rest)?),
            _ => Body::Data(rest),
        };
        if let Body::ReadRequest(_) = body {
            if rest.len() != ReadRequestRepr::LEN {
                return Err(Error::BadLength("RDMA Read Request body is 28 bytes"));
            }
        }
        Ok(MessageRepr { ddp, control, body })
    }
    /// Bytes of the ULPDU.
    pub fn buffer_len(&self) -> usize {
        self.ddp.header_len()
            + match self.body {
                Body::ReadRequest(_) => ReadRequestRepr::LEN,
                Body::Terminate(t) => t.buffer_len(),
                Body::Data(d) => d.len(),
            }
    }
    /// Writes the ULPDU.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(self.buffer_len(), buf.len())?;
        let ddp = DdpRepr { rsvd_ulp: self.control.to_byte(), ..self.ddp };
        ddp.emit(buf)?;
        let rest = &mut buf[ddp.header_len()..self.buffer_len()];
        match self.body {
            Body::ReadRequest(r) => r.emit(rest),
            Body::Terminate(t) => t.emit(rest),
            Body::Data(d) => {
                rest.copy_from_slice(d);
                Ok(())
            }
        }
    }
}

impl fmt::Display for MessageRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RDMAP {} {}", self.control.opcode.name(), self.ddp)?;
        match self.body {
            Body::ReadRequest(r) => write!(f, " {r}"),
            Body::Terminate(t) => write!(f, " {t}"),
            Body::Data(d) => write!(f, " len={}", d.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminate_with_copied_headers_round_trips() {
        let ddp_hdr = [0xc1u8, 0x40, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0x10, 0];
        let t = TerminateRepr {
            layer: Layer::Ddp,
            etype: 1,
            ecode: 1,
            ddp_segment_len: Some(78),
            ddp_header: Some(&ddp_hdr),
            rdmap_header: None,
            reserved: 0,
            trailing: &[],
        };
        let mut b = [0u8; 20];
        t.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0x11, 0x01, 0xc0, 0x00]);
        assert_eq!(TerminateRepr::parse(&b).unwrap(), t);
        assert_eq!(describe(t.layer, t.etype, t.ecode), "tagged buffer: base or bounds violation");
    }

    #[test]
    fn truncated_terminate_is_an_error() {
        assert!(TerminateRepr::parse(&[0x11, 0x01, 0xc0, 0x00, 0, 78, 0xc1]).is_err());
        assert!(TerminateRepr::parse(&[0x11, 0x01, 0xc0, 0x00, 0, 78]).is_err());
        assert!(TerminateRepr::parse(&[0x11, 0x01]).is_err());
    }

    #[test]
    fn wrong_buffer_model_is_rejected() {
        // A Send (opcode 3) in a tagged segment.
        let seg = [0xc1u8, 0x43, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(MessageRepr::parse(&seg).is_err());
    }
}
