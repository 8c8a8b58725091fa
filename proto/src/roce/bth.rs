//! Base Transport Header (IBTA vol.1 9.2, Figure 37): 12 bytes on every RoCEv2 packet.

use super::psn::Psn;
use crate::wire::{be16, be24, put16, put24};
use crate::{Error, Result};
use core::fmt;

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1; // SE | M | PadCnt(2) | TVer(4)
    pub const PKEY: usize = 2;
    pub const FECN_BECN: usize = 4; // F | B | resv6 (masked by the ICRC)
    pub const DEST_QP: usize = 5;
    pub const ACK_REQ: usize = 8; // A | resv7
    pub const PSN: usize = 9;
}

/// Length of the BTH.
pub const LEN: usize = 12;
/// Byte offset of the reserved byte the ICRC masks (holds FECN/BECN, Annex A17.3.3).
pub const RESV8A_OFFSET: usize = field::FECN_BECN;

/// A checked view of a BTH at the start of a buffer.
#[derive(Debug, Clone, Copy)]
pub struct BthPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// Wraps `buf` after checking it holds a whole BTH.
    pub fn new_checked(buf: T) -> Result<Self> {
        Error::check_len(LEN, buf.as_ref().len())?;
        Ok(BthPacket { buf })
    }
    /// Wraps a buffer whose length the caller has already checked.
    pub(crate) fn new_unchecked(buf: T) -> Self {
        BthPacket { buf }
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// OpCode.
    pub fn opcode(&self) -> u8 {
        self.b()[field::OPCODE]
    }
    /// Solicited Event.
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    /// MigReq.
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    /// PadCnt: bytes of pad after the payload.
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }
    /// Transport header version (0).
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be16(self.b(), field::PKEY)
    }
    /// Forward ECN.
    pub fn fecn(&self) -> bool {
        self.b()[field::FECN_BECN] & 0x80 != 0
    }
    /// Backward ECN.
    pub fn becn(&self) -> bool {
        self.b()[field::FECN_BECN] & 0x40 != 0
    }
    /// Destination QP number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        be24(self.b(), field::DEST_QP)
    }
    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_REQ] & 0x80 != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be24(self.b(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }
    /// Sets the PSN in place (a retransmission rewrites nothing else).
    pub fn set_psn(&mut self, psn: Psn) {
        put24(self.bm(), field::PSN, psn.value());
    }
    /// Sets or clears AckReq in place.
    pub fn set_ack_req(&mut self, on: bool) {
        let b = &mut self.bm()[field::ACK_REQ];
        *b = (*b & 0x7f) | (on as u8) << 7;
    }
    /// Sets the destination QP in place.
    pub fn set_dest_qp(&mut self, qpn: u32) {
        put24(self.bm(), field::DEST_QP, qpn);
    }
    /// Sets FECN and BECN in place (they are outside the ICRC).
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        let b = &mut self.bm()[field::FECN_BECN];
        *b = (*b & 0x3f) | (fecn as u8) << 7 | (becn as u8) << 6;
    }
}

/// The fields of a BTH. Reserved bits are sent as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// OpCode (see [`super::opcode::TABLE`]).
    pub opcode: u8,
    /// Solicited Event.
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// PadCnt (0..=3).
    pub pad_count: u8,
    /// Transport header version (0..=15; IBTA 1.x sends 0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Reads the fields of a checked BTH.
    pub fn parse<T: AsRef<[u8]>>(p: &BthPacket<T>) -> Result<BthRepr> {
        Ok(BthRepr {
            opcode: p.opcode(),
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            tver: p.tver(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }
    /// Writes the BTH into the first [`LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len(LEN, buf.len())?;
        if self.pad_count > 3 || self.tver > 15 || self.dest_qp > 0xff_ffff {
            return Err(Error::BadValue("BTH field out of range"));
        }
        buf[field::OPCODE] = self.opcode;
        buf[field::FLAGS] = (self.solicited as u8) << 7 | (self.mig_req as u8) << 6 | self.pad_count << 4 | self.tver;
        put16(buf, field::PKEY, self.pkey);
        buf[field::FECN_BECN] = (self.fecn as u8) << 7 | (self.becn as u8) << 6;
        put24(buf, field::DEST_QP, self.dest_qp);
        buf[field::ACK_REQ] = (self.ack_req as u8) << 7;
        put24(buf, field::PSN, self.psn.value());
        Ok(())
    }
}

impl fmt::Display for BthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BTH op=0x{:02x} qp=0x{:x} psn={}", self.opcode, self.dest_qp, self.psn)?;
        write!(f, " pkey=0x{:04x} pad={}", self.pkey, self.pad_count)?;
        for (set, name) in [
            (self.solicited, " SE"),
            (self.mig_req, " M"),
            (self.fecn, " FECN"),
            (self.becn, " BECN"),
            (self.ack_req, " A"),
        ] {
            if set {
                f.write_str(name)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // rxe-head.pcap frame 4 (RC SEND_ONLY, QP 0x11): the BTH as captured.
    const SEND_ONLY_BTH: [u8; 12] = [0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x31, 0xa9, 0xf1];

    #[test]
    fn deconstruct() {
        let p = BthPacket::new_checked(&SEND_ONLY_BTH[..]).unwrap();
        assert_eq!(p.opcode(), 0x04);
        assert!(!p.mig_req() && !p.solicited());
        assert_eq!((p.pad_count(), p.tver(), p.pkey()), (0, 0, 0xffff));
        assert_eq!((p.dest_qp(), p.ack_req()), (0x11, true));
        assert_eq!(p.psn(), Psn::new(0x31a9f1));
    }

    #[test]
    fn construct_round_trip() {
        let p = BthPacket::new_checked(&SEND_ONLY_BTH[..]).unwrap();
        let repr = BthRepr::parse(&p).unwrap();
        let mut out = [0u8; LEN];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, SEND_ONLY_BTH);
    }

    #[test]
    fn setters_rewrite_in_place() {
        let mut raw = SEND_ONLY_BTH;
        let mut p = BthPacket::new_checked(&mut raw[..]).unwrap();
        p.set_psn(Psn::new(0xff_ffff));
        p.set_ack_req(false);
        p.set_dest_qp(0x12_3456);
        p.set_ecn(true, false);
        assert_eq!((p.psn(), p.ack_req(), p.dest_qp()), (Psn::new(0xff_ffff), false, 0x12_3456));
        assert!(p.fecn() && !p.becn());
        assert_eq!((p.opcode(), p.pkey()), (0x04, 0xffff), "other fields untouched");
    }

    #[test]
    fn short_buffer_is_a_typed_error() {
        let e = BthPacket::new_checked(&SEND_ONLY_BTH[..11]).unwrap_err();
        assert_eq!(e, Error::Truncated { needed: 12, available: 11 });
    }
}
