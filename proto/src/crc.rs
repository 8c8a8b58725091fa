//! The two CRCs of the wire: CRC-32 (IEEE 802.3) for the RoCEv2 ICRC and CRC-32C
//! (Castagnoli) for the MPA FPDU CRC.

/// CRC-32C as MPA uses it (RFC 5044 §4.2.2, the iSCSI polynomial of RFC 3385).
const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// Computes the CRC-32C of `data` in one call.
pub fn crc32c(data: &[u8]) -> u32 {
    CASTAGNOLI.checksum(data)
}

/// An incremental CRC-32C, for data that arrives in pieces (FPDUs with markers).
pub struct Crc32c(crc::Digest<'static, u32>);

impl Crc32c {
    /// Starts a new CRC-32C.
    pub fn new() -> Self {
        Crc32c(CASTAGNOLI.digest())
    }
    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    /// Returns the CRC of everything fed.
    pub fn finalize(self) -> u32 {
        self.0.finalize()
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

/// Computes the CRC-32 (IEEE, reflected, inverted: zlib's `crc32`) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(data);
    h.finalize()
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

    #[test]
    fn crc32_known_answers() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }
}
