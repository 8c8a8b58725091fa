//! Extended transport headers (IBTA vol.1 9.3), each a checked view and a `Repr`.
//! They follow the BTH in the order of [`super::opcode::ORDER`].

use crate::wire::{be24, be32, be64, put24, put32, put64};
use crate::{Error, Result};
use core::fmt;

/// Declares a checked view type for an extended header of fixed length.
macro_rules! view {
    ($(#[$m:meta])* $name:ident, $len:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name<T: AsRef<[u8]>> {
            buf: T,
        }
        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of the header on the wire.
            pub const LEN: usize = $len;
            /// Wraps `buf` after checking it holds the whole header.
            pub fn new_checked(buf: T) -> Result<Self> {
                Error::check_len($len, buf.as_ref().len())?;
                Ok($name { buf })
            }
            #[allow(dead_code)]
            fn b(&self) -> &[u8] {
                self.buf.as_ref()
            }
        }
    };
}

view!(
    /// RDMA Extended Transport Header (IBTA 9.3.3): VA, R_Key, DMA length.
    RethPacket,
    16
);
impl<T: AsRef<[u8]>> RethPacket<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        be64(self.b(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be32(self.b(), 8)
    }
    /// DMA length of the whole message.
    pub fn dma_len(&self) -> u32 {
        be32(self.b(), 12)
    }
}

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a checked RETH.
    pub fn parse<T: AsRef<[u8]>>(p: &RethPacket<T>) -> Result<Self> {
        Ok(RethRepr { va: p.va(), rkey: p.rkey(), dma_len: p.dma_len() })
    }
    /// Writes the RETH into the first 16 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(16, buf.len())?;
        put64(buf, 0, self.va);
        put32(buf, 8, self.rkey);
        put32(buf, 12, self.dma_len);
        Ok(())
    }
}

impl fmt::Display for RethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RETH va=0x{:x} rkey=0x{:08x} len={}", self.va, self.rkey, self.dma_len)
    }
}

/// NAK codes of the AETH syndrome (IBTA 9.7.5.2.8, Table 47).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error (0).
    PsnSequenceError,
    /// Invalid request (1).
    InvalidRequest,
    /// Remote access error (2).
    RemoteAccessError,
    /// Remote operational error (3).
    RemoteOperationalError,
    /// Invalid RD request (4).
    InvalidRdRequest,
    /// A reserved code (5..=31), kept so that a packet round-trips.
    Reserved(u8),
}

impl NakCode {
    fn from_bits(v: u8) -> NakCode {
        match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            v => NakCode::Reserved(v),
        }
    }
    fn bits(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(v) => v & 0x1f,
        }
    }
}

/// The decoded AETH syndrome (IBTA 9.3.5, Table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK with its 5-bit credit count (31 = invalid / no credits advertised).
    Ack {
        /// Credit count code.
        credits: u8,
    },
    /// RNR NAK with its 5-bit timer code (IBTA Table 45).
    RnrNak {
        /// Minimum RNR NAK timer code.
        timer: u8,
    },
    /// NAK with its code.
    Nak(NakCode),
}

impl Syndrome {
    /// Decodes the 8-bit syndrome; bit 7 and type `0b10` are reserved.
    pub fn from_byte(s: u8) -> Result<Syndrome> {
        let value = s & 0x1f;
        match s >> 5 {
            0b000 => Ok(Syndrome::Ack { credits: value }),
            0b001 => Ok(Syndrome::RnrNak { timer: value }),
            0b011 => Ok(Syndrome::Nak(NakCode::from_bits(value))),
            _ => Err(Error::BadValue("AETH syndrome type is reserved")),
        }
    }
    /// Encodes the syndrome byte.
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | code.bits(),
        }
    }
}

view!(
    /// ACK Extended Transport Header (IBTA 9.3.5): syndrome and MSN.
    AethPacket,
    4
);
impl<T: AsRef<[u8]>> AethPacket<T> {
    /// The raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        self.b()[0]
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be24(self.b(), 1)
    }
}

/// AETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Decoded syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads a checked AETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AethPacket<T>) -> Result<Self> {
        Ok(AethRepr { syndrome: Syndrome::from_byte(p.syndrome_byte())?, msn: p.msn() })
    }
    /// Writes the AETH into the first 4 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(4, buf.len())?;
        buf[0] = self.syndrome.to_byte();
        put24(buf, 1, self.msn);
        Ok(())
    }
}

impl fmt::Display for AethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.syndrome {
            Syndrome::Ack { credits } => write!(f, "AETH ACK credits={credits}")?,
            Syndrome::RnrNak { timer } => write!(f, "AETH RNR-NAK timer={timer}")?,
            Syndrome::Nak(code) => write!(f, "AETH NAK {code:?}")?,
        }
        write!(f, " msn={}", self.msn)
    }
}

view!(
    /// Atomic Extended Transport Header (IBTA 9.3.4): VA, R_Key, swap/add, compare.
    AtomicEthPacket,
    28
);
impl<T: AsRef<[u8]>> AtomicEthPacket<T> {
    /// Virtual address (8-byte aligned).
    pub fn va(&self) -> u64 {
        be64(self.b(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be32(self.b(), 8)
    }
    /// Swap (compare-and-swap) or add (fetch-and-add) operand.
    pub fn swap_add(&self) -> u64 {
        be64(self.b(), 12)
    }
    /// Compare operand.
    pub fn compare(&self) -> u64 {
        be64(self.b(), 20)
    }
}

/// AtomicETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap or add operand.
    pub swap_add: u64,
    /// Compare operand.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads a checked AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AtomicEthPacket<T>) -> Result<Self> {
        Ok(AtomicEthRepr { va: p.va(), rkey: p.rkey(), swap_add: p.swap_add(), compare: p.compare() })
    }
    /// Writes the AtomicETH into the first 28 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(28, buf.len())?;
        put64(buf, 0, self.va);
        put32(buf, 8, self.rkey);
        put64(buf, 12, self.swap_add);
        put64(buf, 20, self.compare);
        Ok(())
    }
}

impl fmt::Display for AtomicEthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AtomicETH va=0x{:x} rkey=0x{:08x} swap_add=0x{:x} compare=0x{:x}",
            self.va, self.rkey, self.swap_add, self.compare
        )
    }
}

/// Declares a 4- or 8-byte header that is one big-endian number.
macro_rules! scalar_header {
    ($(#[$m:meta])* $view:ident, $repr:ident, $field:ident, $ty:ty, $len:expr, $get:ident, $put:ident, $label:expr) => {
        view!($(#[$m])* $view, $len);
        impl<T: AsRef<[u8]>> $view<T> {
            /// The header's value.
            pub fn $field(&self) -> $ty {
                $get(self.b(), 0)
            }
        }
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $repr {
            /// The header's value.
            pub $field: $ty,
        }
        impl $repr {
            /// Reads a checked header.
            pub fn parse<T: AsRef<[u8]>>(p: &$view<T>) -> Result<Self> {
                Ok($repr { $field: p.$field() })
            }
            /// Writes the header into the start of `buf`.
            pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
                Error::check_len($len, buf.len())?;
                $put(buf, 0, self.$field);
                Ok(())
            }
        }
        impl fmt::Display for $repr {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($label, "=0x{:x}"), self.$field)
            }
        }
    };
}

scalar_header!(
    /// Atomic ACK Extended Transport Header (IBTA 9.3.6): the original remote data.
    AtomicAckEthPacket, AtomicAckEthRepr, original_data, u64, 8, be64, put64, "AtomicAckETH orig"
);
scalar_header!(
    /// Immediate Data Extended Transport Header (IBTA 9.3.7).
    ImmDtPacket, ImmDtRepr, imm, u32, 4, be32, put32, "ImmDt"
);
scalar_header!(
    /// Invalidate Extended Transport Header (IBTA 9.3.8): the R_Key to invalidate.
    IethPacket, IethRepr, rkey, u32, 4, be32, put32, "IETH rkey"
);

view!(
    /// XRC Extended Transport Header (IBTA vol.1 9.3.6 / 14.2, XRC): the XRC SRQ a request
    /// is for, 24 bits after a reserved byte.
    XrcEthPacket,
    4
);
impl<T: AsRef<[u8]>> XrcEthPacket<T> {
    /// The XRC SRQ number.
    pub fn srqn(&self) -> u32 {
        be24(self.b(), 1)
    }
}

/// XRCETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct XrcEthRepr {
    /// The XRC SRQ number (24 bits).
    pub srqn: u32,
}

impl XrcEthRepr {
    /// Reads a checked XRCETH.
    pub fn parse<T: AsRef<[u8]>>(p: &XrcEthPacket<T>) -> Result<Self> {
        Ok(XrcEthRepr { srqn: p.srqn() })
    }
    /// Writes the XRCETH into the first 4 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(4, buf.len())?;
        buf[0] = 0;
        put24(buf, 1, self.srqn);
        Ok(())
    }
}

impl fmt::Display for XrcEthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "XRCETH srq=0x{:x}", self.srqn)
    }
}

view!(
    /// Datagram Extended Transport Header (IBTA 9.3.2): Q_Key and source QP.
    DethPacket,
    8
);
impl<T: AsRef<[u8]>> DethPacket<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        be32(self.b(), 0)
    }
    /// Source QP (24 bits after a reserved byte).
    pub fn src_qp(&self) -> u32 {
        be24(self.b(), 5)
    }
}

/// DETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Reads a checked DETH.
    pub fn parse<T: AsRef<[u8]>>(p: &DethPacket<T>) -> Result<Self> {
        Ok(DethRepr { qkey: p.qkey(), src_qp: p.src_qp() })
    }
    /// Writes the DETH into the first 8 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(8, buf.len())?;
        put32(buf, 0, self.qkey);
        buf[4] = 0;
        put24(buf, 5, self.src_qp);
        Ok(())
    }
}

impl fmt::Display for DethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DETH qkey=0x{:08x} src_qp=0x{:x}", self.qkey, self.src_qp)
    }
}

view!(
    /// Flush Extended Transport Header (IBTA 1.5 MPE, 9.3.9): selectivity and placement type.
    FethPacket,
    4
);
impl<T: AsRef<[u8]>> FethPacket<T> {
    /// Selectivity level (bits 5:4).
    pub fn selectivity(&self) -> u8 {
        (self.b()[3] >> 4) & 0x3
    }
    /// Placement type bitmask (bits 3:0).
    pub fn placement_type(&self) -> u8 {
        self.b()[3] & 0xf
    }
}

/// FETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FethRepr {
    /// Selectivity level (0..=3).
    pub selectivity: u8,
    /// Placement type bitmask (0..=15).
    pub placement_type: u8,
}

impl FethRepr {
    /// Reads a checked FETH.
    pub fn parse<T: AsRef<[u8]>>(p: &FethPacket<T>) -> Result<Self> {
        Ok(FethRepr { selectivity: p.selectivity(), placement_type: p.placement_type() })
    }
    /// Writes the FETH into the first 4 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(4, buf.len())?;
        buf[..3].fill(0);
        buf[3] = (self.selectivity & 0x3) << 4 | (self.placement_type & 0xf);
        Ok(())
    }
}

impl fmt::Display for FethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FETH sel={} plt=0x{:x}", self.selectivity, self.placement_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aeth_syndromes_decode_per_table_43() {
        assert_eq!(Syndrome::from_byte(0x1f).unwrap(), Syndrome::Ack { credits: 31 });
        assert_eq!(Syndrome::from_byte(0x2e).unwrap(), Syndrome::RnrNak { timer: 14 });
        assert_eq!(Syndrome::from_byte(0x60).unwrap(), Syndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(Syndrome::from_byte(0x61).unwrap(), Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(Syndrome::from_byte(0x62).unwrap(), Syndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(Syndrome::from_byte(0x63).unwrap(), Syndrome::Nak(NakCode::RemoteOperationalError));
        assert_eq!(Syndrome::from_byte(0x64).unwrap(), Syndrome::Nak(NakCode::InvalidRdRequest));
        assert!(Syndrome::from_byte(0x40).is_err());
        assert!(Syndrome::from_byte(0x80).is_err());
        for b in (0u8..0x40).chain(0x60..0x80) {
            assert_eq!(Syndrome::from_byte(b).unwrap().to_byte(), b);
        }
    }

    #[test]
    fn deth_of_a_cm_mad() {
        // rxe-head.pcap frame 1: the DETH of a CM REQ sent to QP1 with the GSI Q_Key.
        let raw = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
        let repr = DethRepr::parse(&DethPacket::new_checked(&raw[..]).unwrap()).unwrap();
        assert_eq!(repr, DethRepr { qkey: 0x8001_0000, src_qp: 1 });
        let mut out = [0xaa; 8];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, raw);
    }

    #[test]
    fn truncated_headers_are_typed_errors() {
        assert!(RethPacket::new_checked(&[0u8; 15][..]).is_err());
        assert!(AtomicEthPacket::new_checked(&[0u8; 27][..]).is_err());
        assert!(AethPacket::new_checked(&[0u8; 3][..]).is_err());
        assert!(RethRepr { va: 0, rkey: 0, dma_len: 0 }.emit(&mut [0u8; 4]).is_err());
    }
}
