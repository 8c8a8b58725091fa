//! One RoCEv2 datagram: dissect with `proto::roce`, verify the ICRC over the captured IP
//! header, and decode CM MADs sent to QP1.

use super::frame::{IpHeaderBytes, UdpDatagram};
use super::report::{Check, Record};
use crate::proto::cm::{CmMadRepr, CmMessage, CmaHeader, MadPacket, GSI_QPN};
use crate::proto::roce::icrc::{self, IpHeader};
use crate::proto::roce::{BthPacket, OpcodeInfo, RocePacket, RoceRepr};
use std::fmt::Write;

/// Dissects and checks one datagram to UDP port 4791.
pub fn check(frame: u64, d: &UdpDatagram<'_>) -> Record {
    let (src, dst) = (d.src.to_string(), d.dst.to_string());
    if d.truncated {
        return Record { frame, src, dst, summary: summarize_truncated(d), check: Check::Truncated };
    }
    let (summary, parsed) = match RocePacket::new_checked(d.payload).and_then(|p| RoceRepr::parse(&p)) {
        // A packet to QP1 must hold a MAD (IBTA 13.4.2): one that does not is malformed.
        Ok(repr) if repr.bth.dest_qp == GSI_QPN => {
            let mad = MadPacket::new_checked(repr.payload).and_then(|p| CmMadRepr::parse(&p).map(|_| ()));
            (summarize(&repr, d.ecn), mad)
        }
        Ok(repr) => (summarize(&repr, d.ecn), Ok(())),
        Err(e) => (format!("RoCEv2 {} bytes", d.payload.len()), Err(e)),
    };
    let check = if let Err(e) = parsed {
        Check::Malformed { error: e.to_string() }
    } else {
        let ip = match &d.ip_header {
            IpHeaderBytes::V4(h) => IpHeader::V4(h),
            IpHeaderBytes::V6(h) => IpHeader::V6(h),
        };
        match icrc::check(ip, d.udp_header, d.payload) {
            Ok(c) if c.is_ok() => Check::Ok,
            Ok(c) => Check::BadChecksum { carried: c.carried, computed: c.computed },
            Err(e) => Check::Malformed { error: e.to_string() },
        }
    };
    Record { frame, src, dst, summary, check }
}

/// What can be said of a datagram the snaplen cut: its BTH, and how much is missing.
fn summarize_truncated(d: &UdpDatagram<'_>) -> String {
    let udp_len = usize::from(u16::from_be_bytes([d.udp_header[4], d.udp_header[5]]));
    let whole = udp_len.saturating_sub(8);
    let head = match BthPacket::new_checked(d.payload) {
        Ok(b) => match OpcodeInfo::lookup(b.opcode()) {
            Some(info) => format!("{info} qp=0x{:x} psn={}", b.dest_qp(), b.psn()),
            None => format!("opcode=0x{:02x}", b.opcode()),
        },
        Err(_) => "RoCEv2".to_string(),
    };
    format!("{head} captured={}/{whole}", d.payload.len())
}

/// One line in the spirit of tshark: `RC RDMA_WRITE_ONLY qp=0x11 psn=0x3a2b1c len=64`.
pub fn summarize(r: &RoceRepr<'_>, ecn: u8) -> String {
    let mut s = match r.info() {
        Some(info) => format!("{info} qp=0x{:x} psn={}", r.bth.dest_qp, r.bth.psn),
        None => format!("opcode=0x{:02x}", r.bth.opcode),
    };
    if let Some(reth) = &r.reth {
        let _ = write!(s, " va=0x{:x} rkey=0x{:x} dmalen={}", reth.va, reth.rkey, reth.dma_len);
    }
    if let Some(aeth) = &r.aeth {
        let _ = write!(s, " {aeth}");
    }
    if let Some(a) = &r.atomic_eth {
        let _ = write!(s, " {a}");
    }
    if let Some(imm) = &r.immdt {
        let _ = write!(s, " imm=0x{:08x}", imm.imm);
    }
    if let Some(ieth) = &r.ieth {
        let _ = write!(s, " inv_rkey=0x{:08x}", ieth.rkey);
    }
    let _ = write!(s, " len={}", r.payload.len());
    if ecn == 3 {
        s.push_str(" ecn=CE");
    }
    if r.bth.dest_qp == GSI_QPN {
        let _ = write!(s, " {}", summarize_mad(r.payload));
    }
    s
}

fn summarize_mad(payload: &[u8]) -> String {
    match MadPacket::new_checked(payload).and_then(|p| CmMadRepr::parse(&p)) {
        Ok(m) => match m.message {
            CmMessage::Req(req) => match CmaHeader::parse(req.private_data) {
                Ok(cma) => format!("{m} {cma}"),
                Err(_) => m.to_string(),
            },
            _ => m.to_string(),
        },
        Err(e) => format!("MAD undecodable: {e}"),
    }
}
