//! The BTH opcode table (IBTA vol.1 9.2.1 Table 38; CNP: Annex A17.9.3; FLUSH and
//! ATOMIC WRITE: IBTA vol.1 1.5 Memory Placement Extensions). One `const` table says,
//! for each opcode, which extended headers follow the BTH, whether payload follows, and
//! where the packet may sit in a message.

use core::fmt;

/// The transport service an opcode belongs to (its top three bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (0x00).
    Rc,
    /// Unreliable Connected (0x20).
    Uc,
    /// Unreliable Datagram (0x60).
    Ud,
    /// Extended Reliable Connected (0xA0).
    Xrc,
    /// RoCEv2 Congestion Notification Packet (0x80).
    Cnp,
}

impl Transport {
    /// The short name used in logs: `RC`, `UC`, `UD`, `CNP`.
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
            Transport::Xrc => "XRC",
            Transport::Cnp => "CNP",
        }
    }
}

/// Where a packet sits in its message (IBTA 9.7.5.1.2 sequencing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

/// What a message does, independent of its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (with or without immediate / invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACK or NAK.
    Acknowledge,
    /// Response to an atomic operation.
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// FLUSH (memory placement extension).
    Flush,
    /// ATOMIC WRITE (memory placement extension).
    AtomicWrite,
    /// Congestion notification.
    Cnp,
}

/// Set of extended transport headers, in a bitmask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Headers(u16);

impl Headers {
    /// No extended header.
    pub const NONE: Headers = Headers(0);
    /// Datagram ETH (8 bytes, UD).
    pub const DETH: Headers = Headers(1 << 0);
    /// Flush ETH (4 bytes).
    pub const FETH: Headers = Headers(1 << 1);
    /// RDMA ETH (16 bytes).
    pub const RETH: Headers = Headers(1 << 2);
    /// Atomic ETH (28 bytes).
    pub const ATOMIC_ETH: Headers = Headers(1 << 3);
    /// ACK ETH (4 bytes).
    pub const AETH: Headers = Headers(1 << 4);
    /// Atomic ACK ETH (8 bytes).
    pub const ATOMIC_ACK_ETH: Headers = Headers(1 << 5);
    /// Immediate data (4 bytes).
    pub const IMMDT: Headers = Headers(1 << 6);
    /// Invalidate ETH (4 bytes).
    pub const IETH: Headers = Headers(1 << 7);
    /// XRC ETH (4 bytes, XRC requests).
    pub const XRCETH: Headers = Headers(1 << 8);

    /// Union of two sets.
    pub const fn with(self, other: Headers) -> Headers {
        Headers(self.0 | other.0)
    }
    /// True when every header of `other` is in `self`.
    pub const fn contains(self, other: Headers) -> bool {
        self.0 & other.0 == other.0
    }
    /// Total length in bytes of the headers in the set: looked up, as every packet
    /// sent or received asks it (summing over [`ORDER`] cost a ping-pong's turn some 150
    /// instructions).
    pub const fn len(self) -> usize {
        let set = self.0 as usize;
        if set < HEADERS_LEN.len() {
            HEADERS_LEN[set] as usize
        } else {
            self.sum_len()
        }
    }
    /// [`Headers::len`] by summing over [`ORDER`].
    const fn sum_len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < ORDER.len() {
            if self.contains(ORDER[i].0) {
                n += ORDER[i].1;
            }
            i += 1;
        }
        n
    }
    /// True when the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// [`Headers::len`] of every set of the nine headers.
const HEADERS_LEN: [u8; 1 << 9] = {
    let mut t = [0u8; 1 << 9];
    let mut set = 0;
    while set < t.len() {
        t[set] = Headers(set as u16).sum_len() as u8;
        set += 1;
    }
    t
};

/// The order in which extended headers follow the BTH, with their lengths
/// (IBTA 9.2, Figure 36 "packet header layouts").
pub const ORDER: [(Headers, usize); 9] = [
    (Headers::DETH, 8),
    (Headers::XRCETH, 4),
    (Headers::FETH, 4),
    (Headers::RETH, 16),
    (Headers::ATOMIC_ETH, 28),
    (Headers::AETH, 4),
    (Headers::ATOMIC_ACK_ETH, 8),
    (Headers::IMMDT, 4),
    (Headers::IETH, 4),
];

/// What follows the headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    /// Nothing (READ request, ACK, atomics).
    None,
    /// Any number of bytes up to the path MTU.
    Any,
    /// Exactly this many bytes (CNP's reserved field, ATOMIC WRITE's 8 bytes).
    Fixed(usize),
}

/// One row of the opcode table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The 8-bit BTH opcode.
    pub code: u8,
    /// The IBTA name without the transport prefix, e.g. `RDMA_WRITE_ONLY`.
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// What the message does.
    pub operation: Operation,
    /// Position in its message.
    pub position: Position,
    /// Extended headers after the BTH.
    pub headers: Headers,
    /// Payload after the headers.
    pub payload: Payload,
}

const fn row(
    code: u8,
    name: &'static str,
    operation: Operation,
    position: Position,
    headers: Headers,
    payload: Payload,
) -> OpcodeInfo {
    let transport = match code >> 5 {
        0 => Transport::Rc,
        1 => Transport::Uc,
        3 => Transport::Ud,
        5 => Transport::Xrc,
        _ => Transport::Cnp,
    };
    OpcodeInfo { code, name, transport, operation, position, headers, payload }
}

use Headers as H;
use Operation as Op;
use Payload::{Any, Fixed, None as NoPayload};
use Position::{First, Last, Middle, Only};

/// The operations RC and UC share (IBTA Table 38), as `(low 5 bits, row)` templates.
macro_rules! connected_rows {
    ($base:expr) => {
        [
            row($base | 0x00, "SEND_FIRST", Op::Send, First, H::NONE, Any),
            row($base | 0x01, "SEND_MIDDLE", Op::Send, Middle, H::NONE, Any),
            row($base | 0x02, "SEND_LAST", Op::Send, Last, H::NONE, Any),
            row($base | 0x03, "SEND_LAST_WITH_IMMEDIATE", Op::Send, Last, H::IMMDT, Any),
            row($base | 0x04, "SEND_ONLY", Op::Send, Only, H::NONE, Any),
            row($base | 0x05, "SEND_ONLY_WITH_IMMEDIATE", Op::Send, Only, H::IMMDT, Any),
            row($base | 0x06, "RDMA_WRITE_FIRST", Op::Write, First, H::RETH, Any),
            row($base | 0x07, "RDMA_WRITE_MIDDLE", Op::Write, Middle, H::NONE, Any),
            row($base | 0x08, "RDMA_WRITE_LAST", Op::Write, Last, H::NONE, Any),
            row($base | 0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", Op::Write, Last, H::IMMDT, Any),
            row($base | 0x0a, "RDMA_WRITE_ONLY", Op::Write, Only, H::RETH, Any),
            row($base | 0x0b, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", Op::Write, Only, H::RETH.with(H::IMMDT), Any),
        ]
    };
}

const RC_ONLY: [OpcodeInfo; 14] = [
    row(0x0c, "RDMA_READ_REQUEST", Op::ReadRequest, Only, H::RETH, NoPayload),
    row(0x0d, "RDMA_READ_RESPONSE_FIRST", Op::ReadResponse, First, H::AETH, Any),
    row(0x0e, "RDMA_READ_RESPONSE_MIDDLE", Op::ReadResponse, Middle, H::NONE, Any),
    row(0x0f, "RDMA_READ_RESPONSE_LAST", Op::ReadResponse, Last, H::AETH, Any),
    row(0x10, "RDMA_READ_RESPONSE_ONLY", Op::ReadResponse, Only, H::AETH, Any),
    row(0x11, "ACKNOWLEDGE", Op::Acknowledge, Only, H::AETH, NoPayload),
    row(0x12, "ATOMIC_ACKNOWLEDGE", Op::AtomicAcknowledge, Only, H::AETH.with(H::ATOMIC_ACK_ETH), NoPayload),
    row(0x13, "COMPARE_SWAP", Op::CompareSwap, Only, H::ATOMIC_ETH, NoPayload),
    row(0x14, "FETCH_ADD", Op::FetchAdd, Only, H::ATOMIC_ETH, NoPayload),
    row(0x16, "SEND_LAST_WITH_INVALIDATE", Op::Send, Last, H::IETH, Any),
    row(0x17, "SEND_ONLY_WITH_INVALIDATE", Op::Send, Only, H::IETH, Any),
    row(0x1c, "FLUSH", Op::Flush, Only, H::FETH.with(H::RETH), NoPayload),
    row(0x1d, "ATOMIC_WRITE", Op::AtomicWrite, Only, H::RETH, Fixed(8)),
    // Annex A17.9.3: BTH, 16 reserved bytes, ICRC.
    row(0x81, "CNP", Op::Cnp, Only, H::NONE, Fixed(16)),
];

const UD_ROWS: [OpcodeInfo; 2] = [
    row(0x64, "SEND_ONLY", Op::Send, Only, H::DETH, Any),
    row(0x65, "SEND_ONLY_WITH_IMMEDIATE", Op::Send, Only, H::DETH.with(H::IMMDT), Any),
];

const RC_CONNECTED: [OpcodeInfo; 12] = connected_rows!(0x00);
const UC_CONNECTED: [OpcodeInfo; 12] = connected_rows!(0x20);

/// XRC's opcodes (IBTA Table 38, transport 101): RC's, with an XRCETH on every request
/// (responses carry none); no FLUSH or ATOMIC WRITE.
const fn xrc_row(rc: OpcodeInfo) -> OpcodeInfo {
    let request = !matches!(rc.operation, Op::ReadResponse | Op::Acknowledge | Op::AtomicAcknowledge);
    let headers = if request { H::XRCETH.with(rc.headers) } else { rc.headers };
    OpcodeInfo { code: rc.code | 0xa0, transport: Transport::Xrc, headers, ..rc }
}

/// Every opcode softrdma knows, indexed by opcode value.
pub const TABLE: [Option<OpcodeInfo>; 256] = build_table();

const fn build_table() -> [Option<OpcodeInfo>; 256] {
    let mut t: [Option<OpcodeInfo>; 256] = [None; 256];
    let mut i = 0;
    while i < 12 {
        t[RC_CONNECTED[i].code as usize] = Some(RC_CONNECTED[i]);
        t[UC_CONNECTED[i].code as usize] = Some(UC_CONNECTED[i]);
        i += 1;
    }
    let mut i = 0;
    while i < RC_ONLY.len() {
        t[RC_ONLY[i].code as usize] = Some(RC_ONLY[i]);
        i += 1;
    }
    let mut i = 0;
    while i < 12 {
        t[(RC_CONNECTED[i].code | 0xa0) as usize] = Some(xrc_row(RC_CONNECTED[i]));
        i += 1;
    }
    let mut i = 0;
    while i < RC_ONLY.len() {
        if matches!(RC_ONLY[i].transport, Transport::Rc) && !matches!(RC_ONLY[i].operation, Op::Flush | Op::AtomicWrite)
        {
            t[(RC_ONLY[i].code | 0xa0) as usize] = Some(xrc_row(RC_ONLY[i]));
        }
        i += 1;
    }
    let mut i = 0;
    while i < UD_ROWS.len() {
        t[UD_ROWS[i].code as usize] = Some(UD_ROWS[i]);
        i += 1;
    }
    t
}

impl OpcodeInfo {
    /// Looks an opcode up in [`TABLE`].
    pub const fn lookup(code: u8) -> Option<&'static OpcodeInfo> {
        match &TABLE[code as usize] {
            Some(info) => Some(info),
            None => None,
        }
    }
    /// Total length of the extended headers of this opcode.
    pub const fn headers_len(&self) -> usize {
        self.headers.len()
    }
    /// True when the opcode starts a message (FIRST or ONLY).
    pub const fn starts_message(&self) -> bool {
        matches!(self.position, Position::First | Position::Only)
    }
    /// True when the opcode ends a message (LAST or ONLY).
    pub const fn ends_message(&self) -> bool {
        matches!(self.position, Position::Last | Position::Only)
    }
}

impl fmt::Display for OpcodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.transport.name(), self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looked_up_header_lengths_are_the_sums() {
        for set in 0..1u16 << 9 {
            assert_eq!(Headers(set).len(), Headers(set).sum_len(), "set {set:#b}");
        }
        assert_eq!(Headers::RETH.with(Headers::IMMDT).len(), 20);
        assert_eq!(Headers(1 << 12).len(), 0, "bits outside the nine headers add nothing");
    }

    #[test]
    fn table_matches_ibta_table_38_samples() {
        let w = OpcodeInfo::lookup(0x0a).unwrap();
        assert_eq!((w.name, w.transport, w.headers), ("RDMA_WRITE_ONLY", Transport::Rc, H::RETH));
        let uc = OpcodeInfo::lookup(0x2b).unwrap();
        assert_eq!(uc.transport, Transport::Uc);
        assert_eq!(uc.headers_len(), 20);
        let ud = OpcodeInfo::lookup(0x64).unwrap();
        assert_eq!((ud.transport, ud.headers_len()), (Transport::Ud, 8));
        let aack = OpcodeInfo::lookup(0x12).unwrap();
        assert_eq!(aack.headers_len(), 12);
        assert_eq!(OpcodeInfo::lookup(0x13).unwrap().headers_len(), 28);
        assert_eq!(OpcodeInfo::lookup(0x1c).unwrap().headers_len(), 20);
        assert_eq!(OpcodeInfo::lookup(0x81).unwrap().payload, Payload::Fixed(16));
    }

    #[test]
    fn unknown_opcodes_are_absent() {
        // RD (0x40..) is not spoken; UC has no READ or atomics; 0x15 RESYNC is RD-only.
        for code in [0x15u8, 0x2c, 0x33, 0x40, 0x60, 0x66, 0x80, 0xb5, 0xbc, 0xbd, 0xc0, 0xff] {
            assert!(OpcodeInfo::lookup(code).is_none(), "0x{code:02x}");
        }
        // RC 12 + 13 and the CNP, UC 12, UD 2, XRC 12 + 11 (no FLUSH, ATOMIC WRITE).
        assert_eq!(TABLE.iter().flatten().count(), 12 + 14 + 12 + 2 + 12 + 11);
    }

    #[test]
    fn xrc_is_rc_with_an_xrceth_on_requests() {
        let send = OpcodeInfo::lookup(0xa4).unwrap();
        assert_eq!((send.name, send.transport, send.headers), ("SEND_ONLY", Transport::Xrc, H::XRCETH));
        let write = OpcodeInfo::lookup(0xaa).unwrap();
        assert_eq!(write.headers_len(), 4 + 16);
        assert_eq!(OpcodeInfo::lookup(0xac).unwrap().headers, H::XRCETH.with(H::RETH), "READ request");
        assert_eq!(OpcodeInfo::lookup(0xb1).unwrap().headers, H::AETH, "an ACK carries no XRCETH");
        assert_eq!(OpcodeInfo::lookup(0xb3).unwrap().headers_len(), 4 + 28);
        assert_eq!(OpcodeInfo::lookup(0xb7).unwrap().headers, H::XRCETH.with(H::IETH));
    }

    #[test]
    fn every_row_sits_at_its_code() {
        for (i, r) in TABLE.iter().enumerate() {
            if let Some(r) = r {
                assert_eq!(r.code as usize, i);
            }
        }
    }
}
