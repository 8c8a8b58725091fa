//! The two CRCs of the wire: CRC-32 (IEEE 802.3) for the RoCEv2 ICRC and CRC-32C
//! (Castagnoli) for the MPA FPDU CRC.

use core::sync::atomic::{AtomicUsize, Ordering};

/// Computes the CRC-32C of `data` in one call: MPA's FPDU CRC (RFC 5044 §4.2.2, the
/// iSCSI polynomial of RFC 3385), with the CPU's CRC32 instruction where it has one (the
/// `crc32c` crate; SSE4.2 is detected at run time), 19 GB/s against 0.35 for a byte-wise
/// table on this project's machine.
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

/// An incremental CRC-32C, for data that arrives in pieces (FPDUs with markers).
#[derive(Debug, Default, Clone, Copy)]
pub struct Crc32c(u32);

impl Crc32c {
    /// Starts a new CRC-32C.
    pub fn new() -> Self {
        Crc32c(0)
    }
    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0 = ::crc32c::crc32c_append(self.0, data);
    }
    /// Returns the CRC of everything fed.
    pub fn finalize(self) -> u32 {
        self.0
    }
}

/// Computes the CRC-32 (IEEE, reflected, inverted: zlib's `crc32`) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut h = Crc32::for_len(data.len());
    h.update(data);
    h.finalize()
}

/// CRC-32 by a 16-way table (the `crc` crate), for the CPUs where it beats crc32fast's
/// carry-less multiply ([`set_crc32_table_below`]).
static CRC32_TABLE: crc::Crc<u32, crc::Table<16>> = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);

/// Inputs shorter than this take [`CRC32_TABLE`], longer ones crc32fast; 0: crc32fast always.
static TABLE_BELOW_BYTES: AtomicUsize = AtomicUsize::new(0);

/// CRC-32 inputs shorter than `bytes` are computed with a 16-way table rather than with
/// crc32fast (0, the default: never). Both give the same CRC; which is faster depends on
/// the CPU, and on an emulated one by more than a factor of three: in a QEMU 7.2/TCG guest,
/// where each carry-less multiply runs as a helper call, 1060 bytes took 3.4 µs with
/// crc32fast and 2.3 µs with the table, 72 bytes 950 and 260 ns; on the host crc32fast
/// was faster at every length (53 ns against 226 for 1060 bytes). The driver measures both
/// once per process and sets this.
pub fn set_crc32_table_below(bytes: usize) {
    TABLE_BELOW_BYTES.store(bytes, Ordering::Relaxed);
}

/// What [`set_crc32_table_below`] set.
pub fn crc32_table_below() -> usize {
    TABLE_BELOW_BYTES.load(Ordering::Relaxed)
}

/// An incremental CRC-32 (as [`crc32`]) with its routine chosen once for the input's
/// whole length, so that a message fed in pieces takes one routine.
#[derive(Clone)]
pub enum Crc32 {
    /// crc32fast: the CPU's carry-less multiply where it has one.
    Fast(crc32fast::Hasher),
    /// The 16-way table.
    Table(crc::Digest<'static, u32, crc::Table<16>>),
}

impl Crc32 {
    /// The routine [`set_crc32_table_below`] picks for `total_len` bytes.
    pub fn for_len(total_len: usize) -> Self {
        if total_len < crc32_table_below() {
            Crc32::table()
        } else {
            Crc32::fast()
        }
    }

    /// crc32fast, whatever the length.
    pub fn fast() -> Self {
        Crc32::Fast(crc32fast::Hasher::new())
    }

    /// The 16-way table, whatever the length.
    pub fn table() -> Self {
        Crc32::Table(CRC32_TABLE.digest())
    }

    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Crc32::Fast(h) => h.update(data),
            Crc32::Table(d) => d.update(data),
        }
    }

    /// The CRC of everything fed.
    pub fn finalize(self) -> u32 {
        match self {
            Crc32::Fast(h) => h.finalize(),
            Crc32::Table(d) => d.finalize(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_answers() {
        // RFC 3720 B.4 test vectors (iSCSI CRC32C).
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let inc: [u8; 32] = core::array::from_fn(|i| i as u8);
        assert_eq!(crc32c(&inc), 0x46dd_794e);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn crc32c_incremental_matches_one_shot() {
        let data = b"MPA ID Req Frame and some more bytes";
        let mut c = Crc32c::new();
        c.update(&data[..7]);
        c.update(&data[7..]);
        assert_eq!(c.finalize(), crc32c(data));
    }

    /// A reflected, inverted 32-bit CRC by its definition, one bit at a time: CRC-32C with
    /// polynomial 0x82F63B78, CRC-32 with 0xEDB88320.
    fn crc_bitwise(poly_reflected: u32, data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ poly_reflected } else { crc >> 1 };
            }
        }
        !crc
    }

    #[test]
    fn crc32c_agrees_with_its_definition_at_every_length_alignment_and_split() {
        let data: [u8; 300] = core::array::from_fn(|i| (i as u8).wrapping_mul(167).wrapping_add(13));
        for start in 0..9 {
            for end in (start..data.len()).step_by(7) {
                let d = &data[start..end];
                let want = crc_bitwise(0x82f6_3b78, d);
                assert_eq!(crc32c(d), want, "{start}..{end}");
                let mut c = Crc32c::new();
                let (a, b) = d.split_at(d.len() / 3);
                c.update(a);
                c.update(b);
                assert_eq!(c.finalize(), want, "{start}..{end} in two pieces");
            }
        }
    }

    #[test]
    fn crc32_known_answers() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn both_crc32_routines_agree_with_the_definition_whole_and_in_pieces() {
        let data: [u8; 600] = core::array::from_fn(|i| (i as u8).wrapping_mul(151).wrapping_add(7));
        for start in 0..5 {
            for end in (start..data.len()).step_by(11) {
                let d = &data[start..end];
                let want = crc_bitwise(0xedb8_8320, d);
                for make in [Crc32::fast, Crc32::table] {
                    let mut c = make();
                    let (a, b) = d.split_at(d.len() / 3);
                    c.update(a);
                    c.update(b);
                    assert_eq!(c.finalize(), want, "{start}..{end}");
                }
            }
        }
    }

    /// The only test that moves the process-wide choice.
    #[test]
    fn the_table_takes_inputs_below_the_limit_set() {
        assert!(matches!(Crc32::for_len(40), Crc32::Fast(_)), "crc32fast unless told otherwise");
        set_crc32_table_below(100);
        assert!(matches!(Crc32::for_len(99), Crc32::Table(_)));
        assert!(matches!(Crc32::for_len(100), Crc32::Fast(_)));
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        set_crc32_table_below(0);
    }
}
