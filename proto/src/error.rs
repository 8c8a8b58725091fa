use core::fmt;

/// Why bytes could not be read as, or written as, a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before the header does.
    Truncated {
        /// Bytes the header needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// A length field disagrees with the buffer or exceeds its protocol limit.
    BadLength(&'static str),
    /// A field holds a value its protocol does not allow.
    BadValue(&'static str),
    /// A RoCEv2 BTH opcode that is not in the opcode table.
    UnknownOpcode(u8),
    /// A checksum (ICRC or MPA CRC32c) that does not match the bytes it covers.
    BadChecksum {
        /// The value carried on the wire.
        carried: u32,
        /// The value computed over the packet.
        computed: u32,
    },
}

/// Result of a wire-format operation.
pub type Result<T> = core::result::Result<T, Error>;

impl Error {
    /// Checks that `buf_len` covers `needed` bytes.
    pub(crate) fn check_len(needed: usize, buf_len: usize) -> Result<()> {
        if buf_len < needed {
            Err(Error::Truncated { needed, available: buf_len })
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated { needed, available } => {
                write!(f, "truncated: needs {needed} bytes, has {available}")
            }
            Error::BadLength(what) => write!(f, "bad length: {what}"),
            Error::BadValue(what) => write!(f, "bad value: {what}"),
            Error::UnknownOpcode(op) => write!(f, "unknown opcode 0x{op:02x}"),
            Error::BadChecksum { carried, computed } => {
                write!(f, "bad checksum: carried 0x{carried:08x}, computed 0x{computed:08x}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}
