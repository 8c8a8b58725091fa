//! rsockets' wire formats, as librdmacm's `rsocket.c` (rdma-core 44) puts them on the
//! wire, so that a stream rsocket here talks to one on rxe, siw or a NIC: the connection
//! data in the CM's private data, the 32-bit message carried in an RDMA WRITE's immediate
//! data (or, on iWARP, which has no immediate data, in a 4-byte SEND after the WRITE), and
//! the 16-byte SGE a receiver writes into the sender's target list to grant buffer space.

/// The protocol version both sides must speak.
pub const VERSION: u8 = 1;
/// `RS_CONN_FLAG_NET`: the sender of the connection data is big-endian (its SGL updates
/// arrive in network order).
pub const FLAG_NET: u8 = 1 << 0;
/// `RS_CONN_FLAG_IOMAP`: the sender's target list is followed by an iomap list.
pub const FLAG_IOMAP: u8 = 1 << 1;
/// Bytes of [`ConnData`] on the wire.
pub const CONN_DATA_LEN: usize = 40;
/// Entries in a target list: a receiver's buffer is granted in halves, one per entry.
pub const SGL_SIZE: usize = 2;
/// Bytes of one [`Sge`] in a target list.
pub const SGE_LEN: usize = 16;

/// Bytes of one [`Iomap`] entry.
pub const IOMAP_LEN: usize = 24;

/// The operation in a message's top three bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Data written into the receiver's buffer; the low bits are its length.
    Data,
    /// A direct write into a buffer the receiver mapped (`riowrite`): never on the wire,
    /// only in the sender's work request ids.
    Write,
    /// An SGL update (new receive space) or, without one, only credits: the low bits are
    /// the sender's new sequence limit.
    Sgl,
    /// An iomap entry was written (riomap, not supported here: noted and ignored).
    IomapSgl,
    /// Control: disconnect, keepalive or shutdown in the low bits.
    Ctrl,
    /// A reserved operation: a peer speaking something else.
    Reserved(u8),
}

/// Control messages (`RS_CTRL_*`).
pub const CTRL_DISCONNECT: u32 = 0;
/// A keepalive: nothing to do on receipt.
pub const CTRL_KEEPALIVE: u32 = 1;
/// The peer will send no more (SHUT_WR).
pub const CTRL_SHUTDOWN: u32 = 2;

const DATA_MASK: u32 = 0x1FFF_FFFF;

/// The message for `op` with `data` in its low 29 bits.
pub fn msg(op: Op, data: u32) -> u32 {
    let code = match op {
        Op::Data => 0,
        Op::Write => 2,
        Op::Sgl => 4,
        Op::IomapSgl => 6,
        Op::Ctrl => 7,
        Op::Reserved(c) => u32::from(c & 7),
    };
    (code << 29) | (data & DATA_MASK)
}

/// A message's operation and data.
pub fn parse_msg(m: u32) -> (Op, u32) {
    let op = match m >> 29 {
        0 => Op::Data,
        2 => Op::Write,
        4 => Op::Sgl,
        6 => Op::IomapSgl,
        7 => Op::Ctrl,
        c => Op::Reserved(c as u8),
    };
    (op, m & DATA_MASK)
}

/// A remote buffer: address, key and length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address in the owner's memory.
    pub addr: u64,
    /// Its rkey.
    pub key: u32,
    /// Bytes.
    pub length: u32,
}

impl Sge {
    /// As a target-list entry: the writer's byte order (`big` for a big-endian writer).
    pub fn to_bytes(self, big: bool) -> [u8; SGE_LEN] {
        let mut b = [0u8; SGE_LEN];
        if big {
            b[..8].copy_from_slice(&self.addr.to_be_bytes());
            b[8..12].copy_from_slice(&self.key.to_be_bytes());
            b[12..].copy_from_slice(&self.length.to_be_bytes());
        } else {
            b[..8].copy_from_slice(&self.addr.to_le_bytes());
            b[8..12].copy_from_slice(&self.key.to_le_bytes());
            b[12..].copy_from_slice(&self.length.to_le_bytes());
        }
        b
    }

    /// A target-list entry written in host (little-endian) order.
    pub fn from_bytes(b: &[u8; SGE_LEN]) -> Sge {
        let u64_at = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().unwrap_or_default());
        let u32_at = |r: std::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().unwrap_or_default());
        Sge { addr: u64_at(0..8), key: u32_at(8..12), length: u32_at(12..16) }
    }

    fn emit_be(self, b: &mut [u8]) {
        b[..SGE_LEN].copy_from_slice(&self.to_bytes(true));
    }

    fn parse_be(b: &[u8]) -> Sge {
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        Sge { addr: u64::from_be_bytes(a), key: u32_at(8), length: u32_at(12) }
    }
}

/// `struct rs_iomap`: a buffer one side mapped for the other's direct writes, written into
/// the other's iomap list: writes at `offset` .. `offset + sge.length` land in `sge`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Iomap {
    /// The offset the mapping answers to.
    pub offset: u64,
    /// The mapped buffer.
    pub sge: Sge,
}

impl Iomap {
    /// As an iomap-list entry in the writer's byte order (`big` for a big-endian peer).
    pub fn to_bytes(self, big: bool) -> [u8; IOMAP_LEN] {
        let mut b = [0u8; IOMAP_LEN];
        let off = if big { self.offset.to_be_bytes() } else { self.offset.to_le_bytes() };
        b[..8].copy_from_slice(&off);
        b[8..].copy_from_slice(&self.sge.to_bytes(big));
        b
    }

    /// An entry written in host (little-endian) order.
    pub fn from_bytes(b: &[u8; IOMAP_LEN]) -> Iomap {
        let mut off = [0u8; 8];
        off.copy_from_slice(&b[..8]);
        let mut sge = [0u8; SGE_LEN];
        sge.copy_from_slice(&b[8..]);
        Iomap { offset: u64::from_le_bytes(off), sge: Sge::from_bytes(&sge) }
    }
}

/// librdmacm's compact size (`rs_value_to_scale`): sizes up to 128 as they are, larger
/// ones as 0x80 | size / 256.
pub fn value_to_scale(value: u32) -> u8 {
    if value <= 128 {
        value as u8
    } else {
        (0x80 | (value >> 8).min(0x7F)) as u8
    }
}

/// The inverse (`rs_scale_to_value`).
pub fn scale_to_value(scale: u8) -> u32 {
    if scale <= 128 {
        u32::from(scale)
    } else {
        u32::from(scale & 0x7F) << 8
    }
}

/// `struct rs_conn_data`: what each side tells the other in the CM's private data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnData {
    /// [`VERSION`].
    pub version: u8,
    /// [`FLAG_NET`], [`FLAG_IOMAP`].
    pub flags: u8,
    /// Receives posted: the peer may send this many messages at first.
    pub credits: u16,
    /// The iomap list's size as a power-of-two scale (0: none).
    pub target_iomap_size: u8,
    /// Where the peer writes SGL updates: the sender's target list (length: entries).
    pub target_sgl: Sge,
    /// The first half of the sender's receive buffer, granted at once.
    pub data_buf: Sge,
}

impl ConnData {
    /// The 40 bytes on the wire (every multi-byte field big-endian).
    pub fn emit(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.target_iomap_size;
        self.target_sgl.emit_be(&mut b[8..24]);
        self.data_buf.emit_be(&mut b[24..40]);
        b
    }

    /// The connection data at the start of `b`; `None` if shorter than 40 bytes.
    pub fn parse(b: &[u8]) -> Option<ConnData> {
        let b = b.get(..CONN_DATA_LEN)?;
        Some(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: Sge::parse_be(&b[8..24]),
            data_buf: Sge::parse_be(&b[24..40]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_their_operation_and_data() {
        assert_eq!(msg(Op::Data, 4096), 4096);
        assert_eq!(msg(Op::Sgl, 7), 0x8000_0007);
        assert_eq!(msg(Op::Ctrl, CTRL_SHUTDOWN), 0xE000_0002);
        for op in [Op::Data, Op::Write, Op::Sgl, Op::IomapSgl, Op::Ctrl, Op::Reserved(1), Op::Reserved(5)] {
            assert_eq!(parse_msg(msg(op, 0x1234_5678)), (op, 0x1234_5678 & DATA_MASK));
        }
    }

    #[test]
    fn connection_data_is_laid_out_as_librdmacm_lays_it_out() {
        let c = ConnData {
            version: VERSION,
            flags: FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: Sge { addr: 0x0102_0304_0506_0708, key: 0x1111_2222, length: 2 },
            data_buf: Sge { addr: 0x5555_0000_1000, key: 0xABCD_EF01, length: 65536 },
        };
        let b = c.emit();
        assert_eq!(&b[..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8], "addr first, big-endian");
        assert_eq!(&b[16..24], &[0x11, 0x11, 0x22, 0x22, 0, 0, 0, 2], "then key, then length");
        assert_eq!(ConnData::parse(&b), Some(c));
        assert_eq!(ConnData::parse(&b[..39]), None);
    }

    #[test]
    fn iomap_entries_and_sizes_are_librdmacms() {
        let m = Iomap { offset: 4096, sge: Sge { addr: 0x1000, key: 3, length: 512 } };
        assert_eq!(Iomap::from_bytes(&m.to_bytes(false)), m);
        assert_eq!(&m.to_bytes(false)[..8], &4096u64.to_le_bytes());
        for (v, s) in [(0, 0), (64, 64), (128, 128), (256, 0x81), (4096, 0x90)] {
            assert_eq!((value_to_scale(v), scale_to_value(s)), (s, v));
        }
    }

    #[test]
    fn target_entries_round_trip_in_host_order() {
        let s = Sge { addr: 0xFEED_0000_BEEF, key: 9, length: 65536 };
        assert_eq!(Sge::from_bytes(&s.to_bytes(false)), s);
        let big = s.to_bytes(true);
        assert_eq!(&big[..8], &0xFEED_0000_BEEFu64.to_be_bytes());
    }
}
