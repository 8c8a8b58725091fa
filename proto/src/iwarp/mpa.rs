//! MPA Request and Reply frames (RFC 5044 §7.1) with the enhanced connection setup of
//! RFC 6581 §5 (the IRD/ORD word at the start of the private data).

use crate::wire::{be16, put16};
use crate::{Error, Result};
use core::fmt;

/// Key of an MPA Request frame (RFC 5044 §7.1).
pub const KEY_REQUEST: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply frame (RFC 5044 §7.1).
pub const KEY_REPLY: &[u8; 16] = b"MPA ID Rep Frame";
/// Key, flags/revision and private-data length.
pub const HEADER_LEN: usize = 20;
/// Largest private data an MPA frame may carry (RFC 5044 §7.1, PD_Length).
pub const MAX_PRIVATE_DATA: usize = 512;
/// Length of the RFC 6581 IRD/ORD word.
pub const IRD_ORD_LEN: usize = 4;

mod flag {
    pub const MARKERS: u8 = 0x80; // M
    pub const CRC: u8 = 0x40; // C
    pub const REJECT: u8 = 0x20; // R
    pub const ENHANCED: u8 = 0x10; // RFC 6581 §5: enhanced connection setup
    pub const RESERVED: u8 = 0x0f;
}

/// Request (from the initiator) or Reply (from the responder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// "MPA ID Req Frame".
    Request,
    /// "MPA ID Rep Frame".
    Reply,
}

/// A checked view of an MPA Request or Reply at the start of a stream buffer.
#[derive(Debug, Clone, Copy)]
pub struct MpaFramePacket<T: AsRef<[u8]>> {
    buf: T,
    kind: FrameKind,
}

impl<T: AsRef<[u8]>> MpaFramePacket<T> {
    /// Checks the key, the private-data limit and that the whole frame is in `buf`
    /// (which may hold more of the stream after it).
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        Error::check_len(HEADER_LEN, b.len())?;
        let kind = match &b[..16] {
            k if k == KEY_REQUEST => FrameKind::Request,
            k if k == KEY_REPLY => FrameKind::Reply,
            _ => return Err(Error::BadValue("MPA key")),
        };
        let pd_len = usize::from(be16(b, 18));
        if pd_len > MAX_PRIVATE_DATA {
            return Err(Error::BadLength("MPA private data longer than 512 bytes"));
        }
        Error::check_len(HEADER_LEN + pd_len, b.len())?;
        Ok(MpaFramePacket { buf, kind })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// Request or Reply.
    pub fn kind(&self) -> FrameKind {
        self.kind
    }
    /// The flags byte (M, C, R, enhanced, reserved).
    pub fn flags(&self) -> u8 {
        self.b()[16]
    }
    /// MPA revision.
    pub fn revision(&self) -> u8 {
        self.b()[17]
    }
    /// Private data length.
    pub fn pd_len(&self) -> usize {
        usize::from(be16(self.b(), 18))
    }
    /// Private data (including the RFC 6581 IRD/ORD word when present).
    pub fn private_data(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + self.pd_len()]
    }
    /// Bytes the frame takes in the stream.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.pd_len()
    }
}

/// The RFC 6581 §5 IRD/ORD word with its peer-to-peer and ready-to-receive bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// Peer-to-peer mode: the initiator will send a ready-to-receive message.
    pub peer_to_peer: bool,
    /// The RTR may be a zero-length Send.
    pub send_rtr: bool,
    /// The RTR may be a zero-length RDMA Write.
    pub write_rtr: bool,
    /// The RTR may be a zero-length RDMA Read.
    pub read_rtr: bool,
}

const IRD_ORD_MASK: u16 = 0x3fff;

impl IrdOrd {
    /// Reads the 4-byte word.
    pub fn parse(b: &[u8]) -> Result<IrdOrd> {
        Error::check_len(IRD_ORD_LEN, b.len())?;
        let (ird, ord) = (be16(b, 0), be16(b, 2));
        Ok(IrdOrd {
            ird: ird & IRD_ORD_MASK,
            ord: ord & IRD_ORD_MASK,
            peer_to_peer: ird & 0x8000 != 0,
            send_rtr: ird & 0x4000 != 0,
            write_rtr: ord & 0x8000 != 0,
            read_rtr: ord & 0x4000 != 0,
        })
    }
    /// Writes the 4-byte word.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        Error::check_len(IRD_ORD_LEN, b.len())?;
        if self.ird > IRD_ORD_MASK || self.ord > IRD_ORD_MASK {
            return Err(Error::BadValue("IRD/ORD above 0x3fff"));
        }
        put16(b, 0, self.ird | (self.peer_to_peer as u16) << 15 | (self.send_rtr as u16) << 14);
        put16(b, 2, self.ord | (self.write_rtr as u16) << 15 | (self.read_rtr as u16) << 14);
        Ok(())
    }
}

impl fmt::Display for IrdOrd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ird={} ord={}", self.ird, self.ord)?;
        for (set, name) in [
            (self.peer_to_peer, " p2p"),
            (self.send_rtr, " rtr=send"),
            (self.write_rtr, " rtr=write"),
            (self.read_rtr, " rtr=read"),
        ] {
            if set {
                f.write_str(name)?;
            }
        }
        Ok(())
    }
}

/// The fields of an MPA Request or Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MpaFrameRepr<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M: the sender wants markers in the stream it receives.
    pub markers: bool,
    /// C: the sender wants (Request) or grants (Reply) CRC32c on every FPDU.
    pub crc: bool,
    /// R: the Reply rejects the connection.
    pub reject: bool,
    /// The reserved low nibble of the flags byte (siw sets 0x08 among its own peers).
    pub reserved: u8,
    /// Revision (1 or 2; anything else is for the engine to reject).
    pub revision: u8,
    /// RFC 6581 enhanced setup: present when the enhanced bit is set on revision 2.
    pub ird_ord: Option<IrdOrd>,
    /// Private data for the ULP (after the IRD/ORD word, if any).
    pub private_data: &'a [u8],
}

impl<'a> MpaFrameRepr<'a> {
    /// Reads a checked frame.
    pub fn parse(p: &MpaFramePacket<&'a [u8]>) -> Result<MpaFrameRepr<'a>> {
        let flags = p.flags();
        let pd: &'a [u8] = &p.buf[HEADER_LEN..p.frame_len()];
        let enhanced = flags & flag::ENHANCED != 0 && p.revision() == 2;
        // The enhanced bit means something on revision 2 only; elsewhere it is kept as is.
        let stray_enhanced = if enhanced { 0 } else { flags & flag::ENHANCED };
        let (ird_ord, private_data) = if enhanced {
            if pd.len() < IRD_ORD_LEN {
                return Err(Error::BadLength("enhanced MPA frame without its IRD/ORD word"));
            }
            (Some(IrdOrd::parse(pd)?), &pd[IRD_ORD_LEN..])
        } else {
            (None, pd)
        };
        Ok(MpaFrameRepr {
            kind: p.kind(),
            markers: flags & flag::MARKERS != 0,
            crc: flags & flag::CRC != 0,
            reject: flags & flag::REJECT != 0,
            reserved: (flags & flag::RESERVED) | stray_enhanced,
            revision: p.revision(),
            ird_ord,
            private_data,
        })
    }
    /// Length of the private-data field on the wire.
    pub fn pd_len(&self) -> usize {
        self.private_data.len() + if self.ird_ord.is_some() { IRD_ORD_LEN } else { 0 }
    }
    /// Bytes the frame takes in the stream.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.pd_len()
    }
    /// Writes the frame into `buf[..self.buffer_len()]`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if self.pd_len() > MAX_PRIVATE_DATA {
            return Err(Error::BadLength("MPA private data longer than 512 bytes"));
        }
        Error::check_len(self.buffer_len(), buf.len())?;
        buf[..16].copy_from_slice(match self.kind {
            FrameKind::Request => KEY_REQUEST,
            FrameKind::Reply => KEY_REPLY,
        });
        buf[16] = (self.markers as u8) << 7
            | (self.crc as u8) << 6
            | (self.reject as u8) << 5
            | (self.ird_ord.is_some() as u8) << 4
            | self.reserved & 0x1f;
        buf[17] = self.revision;
        put16(buf, 18, self.pd_len() as u16);
        let mut at = HEADER_LEN;
        if let Some(io) = &self.ird_ord {
            io.emit(&mut buf[at..at + IRD_ORD_LEN])?;
            at += IRD_ORD_LEN;
        }
        buf[at..at + self.private_data.len()].copy_from_slice(self.private_data);
        Ok(())
    }
}

impl fmt::Display for MpaFrameRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            FrameKind::Request => "REQUEST",
            FrameKind::Reply => "REPLY",
        };
        write!(f, "MPA {kind} rev={} m={} c={}", self.revision, self.markers as u8, self.crc as u8)?;
        if self.reject {
            f.write_str(" REJECT")?;
        }
        if let Some(io) = &self.ird_ord {
            write!(f, " {io}")?;
        }
        write!(f, " pd={}", self.private_data.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // siw-crc-rping.pcap frame 4: siw's MPA Request with CRC, rev 2, IRD/ORD 1/1.
    const SIW_CRC_REQUEST: [u8; 24] = *b"MPA ID Req Frame\x50\x02\x00\x04\x00\x01\x00\x01";

    #[test]
    fn deconstruct_siw_request() {
        let p = MpaFramePacket::new_checked(&SIW_CRC_REQUEST[..]).unwrap();
        let r = MpaFrameRepr::parse(&p).unwrap();
        assert_eq!(r.kind, FrameKind::Request);
        assert!(r.crc && !r.markers && !r.reject);
        assert_eq!(r.revision, 2);
        assert_eq!(r.ird_ord, Some(IrdOrd { ird: 1, ord: 1, ..Default::default() }));
        assert!(r.private_data.is_empty());
        let mut out = [0u8; 24];
        r.emit(&mut out).unwrap();
        assert_eq!(out, SIW_CRC_REQUEST);
    }

    #[test]
    fn rejects_bad_keys_and_long_private_data() {
        let mut bad = SIW_CRC_REQUEST;
        bad[4] = b'X';
        assert_eq!(MpaFramePacket::new_checked(&bad[..]).unwrap_err(), Error::BadValue("MPA key"));
        let mut long = [0u8; 20];
        long[..16].copy_from_slice(KEY_REPLY);
        long[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert!(matches!(MpaFramePacket::new_checked(&long[..]), Err(Error::BadLength(_))));
        assert!(matches!(MpaFramePacket::new_checked(&SIW_CRC_REQUEST[..23]), Err(Error::Truncated { .. })));
    }

    #[test]
    fn p2p_rtr_bits() {
        let io = IrdOrd { ird: 16, ord: 8, peer_to_peer: true, send_rtr: false, write_rtr: true, read_rtr: true };
        let mut b = [0u8; 4];
        io.emit(&mut b).unwrap();
        assert_eq!(b, [0x80, 0x10, 0xc0, 0x08]);
        assert_eq!(IrdOrd::parse(&b).unwrap(), io);
    }
}
