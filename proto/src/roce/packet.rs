//! A whole RoCEv2 packet (the UDP payload): BTH, extended headers, payload, pad, ICRC.

use super::bth::{self, BthPacket, BthRepr};
use super::ext::*;
use super::opcode::{Headers, OpcodeInfo, Payload, ORDER};
use super::ICRC_LEN;
use crate::{Error, Result};
use core::fmt;

/// A checked view of a RoCEv2 packet whose opcode is in the table and whose lengths add up.
#[derive(Debug, Clone, Copy)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buf: T,
    info: &'static OpcodeInfo,
}

/// Pad bytes that bring `payload_len` to a multiple of 4 (IBTA 9.2.3).
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Validates the BTH, the opcode, the header lengths, PadCnt and the fixed payloads.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        Error::check_len(bth::LEN + ICRC_LEN, b.len())?;
        let bthp = BthPacket::new_checked(b)?;
        let info = OpcodeInfo::lookup(bthp.opcode()).ok_or(Error::UnknownOpcode(bthp.opcode()))?;
        let fixed = bth::LEN + info.headers_len() + ICRC_LEN;
        Error::check_len(fixed, b.len())?;
        let data_len = b.len() - fixed; // payload + pad
        let pad = usize::from(bthp.pad_count());
        if pad > data_len {
            return Err(Error::BadLength("PadCnt exceeds the payload"));
        }
        let payload_len = data_len - pad;
        match info.payload {
            Payload::None if data_len != 0 => return Err(Error::BadLength("payload on an opcode that carries none")),
            Payload::Fixed(n) if payload_len != n => {
                return Err(Error::BadLength("payload length fixed by the opcode"))
            }
            _ => {}
        }
        Ok(RocePacket { buf, info })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// The opcode's row in the table.
    pub fn info(&self) -> &'static OpcodeInfo {
        self.info
    }
    /// The BTH.
    pub fn bth(&self) -> BthPacket<&[u8]> {
        BthPacket::new_unchecked(&self.b()[..bth::LEN])
    }
    fn header_range(&self, which: Headers) -> Option<core::ops::Range<usize>> {
        let mut at = bth::LEN;
        for (h, len) in ORDER {
            if self.info.headers.contains(h) {
                if h == which {
                    return Some(at..at + len);
                }
                at += len;
            }
        }
        None
    }
    /// The bytes of extended header `which`, if the opcode carries it.
    pub fn header(&self, which: Headers) -> Option<&[u8]> {
        self.header_range(which).map(|r| &self.b()[r])
    }
    fn data_range(&self) -> (usize, usize) {
        let start = bth::LEN + self.info.headers_len();
        let pad = usize::from(self.b()[1] >> 4 & 0x3);
        (start, self.b().len() - ICRC_LEN - pad)
    }
    /// The payload, without pad.
    pub fn payload(&self) -> &[u8] {
        let (s, e) = self.data_range();
        &self.b()[s..e]
    }
    /// The pad bytes.
    pub fn pad(&self) -> &[u8] {
        let (_, e) = self.data_range();
        &self.b()[e..self.b().len() - ICRC_LEN]
    }
    /// The ICRC as carried (little-endian on the wire).
    pub fn icrc(&self) -> u32 {
        let t = &self.b()[self.b().len() - ICRC_LEN..];
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    }
}

/// The fields of a RoCEv2 packet. Each extended header is present exactly when the opcode
/// calls for it; pad bytes are zero; the ICRC is filled by [`super::icrc::fill`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr<'a> {
    /// Base transport header.
    pub bth: BthRepr,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// XRCETH (XRC requests).
    pub xrceth: Option<XrcEthRepr>,
    /// FETH (FLUSH).
    pub feth: Option<FethRepr>,
    /// RETH (WRITE first/only, READ request, FLUSH, ATOMIC WRITE).
    pub reth: Option<RethRepr>,
    /// AtomicETH (compare-swap, fetch-add).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, READ response first/last/only, atomic ACK).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data.
    pub immdt: Option<ImmDtRepr>,
    /// Invalidate ETH.
    pub ieth: Option<IethRepr>,
    /// Payload bytes (without pad).
    pub payload: &'a [u8],
}

impl<'a> RoceRepr<'a> {
    /// Reads every header of a checked packet, in one pass over the opcode's layout
    /// (looking each header's place up on its own walked the layout nine times a packet,
    /// the most instructions of any step of a ping-pong's receive).
    #[inline]
    pub fn parse(p: &RocePacket<&'a [u8]>) -> Result<RoceRepr<'a>> {
        let buf: &'a [u8] = p.buf;
        let (start, end) = p.data_range();
        let mut r = RoceRepr::bare(BthRepr::parse(&p.bth())?, &buf[start..end]);
        let mut at = bth::LEN;
        for (h, len) in ORDER {
            if p.info.headers.contains(h) {
                r.parse_header(h, &buf[at..at + len])?;
                at += len;
            }
        }
        Ok(r)
    }

    /// A packet of `bth` and `payload` with no extended header (add them with struct
    /// update syntax: `RoceRepr { reth: Some(r), ..RoceRepr::bare(bth, payload) }`).
    pub fn bare(bth: BthRepr, payload: &'a [u8]) -> RoceRepr<'a> {
        RoceRepr {
            bth,
            deth: None,
            xrceth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload,
        }
    }

    /// Reads extended header `h` from its bytes `b`.
    fn parse_header(&mut self, h: Headers, b: &[u8]) -> Result<()> {
        match h {
            Headers::DETH => self.deth = Some(DethRepr::parse(&DethPacket::new_checked(b)?)?),
            Headers::XRCETH => self.xrceth = Some(XrcEthRepr::parse(&XrcEthPacket::new_checked(b)?)?),
            Headers::FETH => self.feth = Some(FethRepr::parse(&FethPacket::new_checked(b)?)?),
            Headers::RETH => self.reth = Some(RethRepr::parse(&RethPacket::new_checked(b)?)?),
            Headers::ATOMIC_ETH => self.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEthPacket::new_checked(b)?)?),
            Headers::AETH => self.aeth = Some(AethRepr::parse(&AethPacket::new_checked(b)?)?),
            Headers::ATOMIC_ACK_ETH => {
                self.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&AtomicAckEthPacket::new_checked(b)?)?)
            }
            Headers::IMMDT => self.immdt = Some(ImmDtRepr::parse(&ImmDtPacket::new_checked(b)?)?),
            Headers::IETH => self.ieth = Some(IethRepr::parse(&IethPacket::new_checked(b)?)?),
            _ => {}
        }
        Ok(())
    }

    /// The opcode's row, if the opcode is known.
    pub fn info(&self) -> Option<&'static OpcodeInfo> {
        OpcodeInfo::lookup(self.bth.opcode)
    }

    fn present(&self) -> Headers {
        let mut h = Headers::NONE;
        for (set, bit) in [
            (self.deth.is_some(), Headers::DETH),
            (self.xrceth.is_some(), Headers::XRCETH),
            (self.feth.is_some(), Headers::FETH),
            (self.reth.is_some(), Headers::RETH),
            (self.atomic_eth.is_some(), Headers::ATOMIC_ETH),
            (self.aeth.is_some(), Headers::AETH),
            (self.atomic_ack_eth.is_some(), Headers::ATOMIC_ACK_ETH),
            (self.immdt.is_some(), Headers::IMMDT),
            (self.ieth.is_some(), Headers::IETH),
        ] {
            if set {
                h = h.with(bit);
            }
        }
        h
    }

    /// Bytes the packet takes on the wire, ICRC included.
    pub fn buffer_len(&self) -> usize {
        bth::LEN + self.present().len() + self.payload.len() + usize::from(self.bth.pad_count) + ICRC_LEN
    }

    fn check_consistent(&self) -> Result<()> {
        let info = self.info().ok_or(Error::UnknownOpcode(self.bth.opcode))?;
        if info.headers != self.present() {
            return Err(Error::BadValue("extended headers do not match the opcode"));
        }
        match info.payload {
            Payload::None if !self.payload.is_empty() || self.bth.pad_count != 0 => {
                Err(Error::BadLength("payload on an opcode that carries none"))
            }
            Payload::Fixed(n) if self.payload.len() != n => Err(Error::BadLength("payload length fixed by the opcode")),
            _ => Ok(()),
        }
    }

    /// Writes the packet into `buf[..self.buffer_len()]` with a zero ICRC.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let at = self.emit_around_payload(buf)?;
        buf[at..at + self.payload.len()].copy_from_slice(self.payload);
        Ok(())
    }

    /// As [`RoceRepr::emit`], leaving the payload's bytes as they were: for a payload the
    /// caller writes in place itself (from registered memory), of which `self.payload`
    /// gives only the length. Every other byte is written (pad and ICRC zero), so `buf`
    /// need not be cleared first. Returns where the payload starts.
    pub fn emit_around_payload(&self, buf: &mut [u8]) -> Result<usize> {
        self.check_consistent()?;
        let total = self.buffer_len();
        Error::check_len(total, buf.len())?;
        let buf = &mut buf[..total];
        self.bth.emit(buf)?;
        let mut at = bth::LEN;
        macro_rules! put {
            ($opt:expr, $len:expr) => {
                if let Some(h) = &$opt {
                    h.emit(&mut buf[at..at + $len])?;
                    at += $len;
                }
            };
        }
        put!(self.deth, 8);
        put!(self.xrceth, 4);
        put!(self.feth, 4);
        put!(self.reth, 16);
        put!(self.atomic_eth, 28);
        put!(self.aeth, 4);
        put!(self.atomic_ack_eth, 8);
        put!(self.immdt, 4);
        put!(self.ieth, 4);
        buf[at + self.payload.len()..].fill(0);
        Ok(at)
    }
}

impl fmt::Display for RoceRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(info) => write!(f, "{info}")?,
            None => write!(f, "opcode 0x{:02x}", self.bth.opcode)?,
        }
        write!(f, " qp=0x{:x} psn={}", self.bth.dest_qp, self.bth.psn)?;
        if let Some(h) = &self.deth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.xrceth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.feth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.reth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.atomic_eth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.aeth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.atomic_ack_eth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.immdt {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.ieth {
            write!(f, " {h}")?;
        }
        write!(f, " len={}", self.payload.len())
    }
}
