//! RoCEv2: the InfiniBand transport carried in UDP (IBTA vol.1 ch. 9 and Annex A17).
//!
//! A RoCEv2 packet is the UDP payload to port [`UDP_PORT`]: BTH, the extended transport
//! headers its opcode calls for (in the order of [`ext`]), the payload, 0..3 pad bytes and
//! the 4-byte ICRC.

pub mod bth;
pub mod ext;
pub mod icrc;
pub mod opcode;
pub mod packet;
pub mod psn;

pub use bth::{BthPacket, BthRepr};
pub use opcode::{Headers, OpcodeInfo, Position, Transport};
pub use packet::{RocePacket, RoceRepr};
pub use psn::Psn;

/// The IANA UDP destination port of RoCEv2 (Annex A17.2.1).
pub const UDP_PORT: u16 = 4791;
/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;
