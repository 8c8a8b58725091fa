//! Reads the frames of a pcap or pcapng capture (with the `pcap-file` crate).

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// 1-based frame number, as Wireshark counts.
    pub number: u64,
    /// Link type of the interface it was captured on.
    pub link: DataLink,
    /// The captured bytes (may be shorter than the frame: snaplen).
    pub data: Vec<u8>,
    /// Length of the frame on the wire.
    pub orig_len: u32,
}

impl Frame {
    /// True when the capture holds only part of the frame.
    pub fn truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.orig_len)
    }
}

/// The frames of a file, and a warning when reading stopped early.
#[derive(Debug, Default)]
pub struct Frames {
    /// Frames read.
    pub frames: Vec<Frame>,
    /// Why reading stopped before the end of the file, if it did.
    pub warning: Option<String>,
}

/// Why a file is not a capture at all.
#[derive(Debug)]
pub enum ReadError {
    /// Neither magic number.
    NotACapture,
    /// The header is damaged.
    BadHeader(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::NotACapture => {
                f.write_str("not a pcap or pcapng file (unknown magic number)")
            }
            ReadError::BadHeader(e) => write!(f, "damaged capture header: {e}"),
        }
    }
}

impl std::error::Error for ReadError {}

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
const PCAP_MAGICS: [[u8; 4]; 4] = [
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
];

/// Reads every frame of a pcap or pcapng file held in memory.
pub fn read_frames(bytes: &[u8]) -> Result<Frames, ReadError> {
    let magic: [u8; 4] = bytes
        .get(..4)
        .and_then(|m| m.try_into().ok())
        .ok_or(ReadError::NotACapture)?;
    if magic == PCAPNG_MAGIC {
        read_pcapng(bytes)
    } else if PCAP_MAGICS.contains(&magic) {
        read_pcap(bytes)
    } else {
        Err(ReadError::NotACapture)
    }
}

fn read_pcap(bytes: &[u8]) -> Result<Frames, ReadError> {
    let mut r = PcapReader::new(bytes).map_err(|e| ReadError::BadHeader(e.to_string()))?;
    let link = r.header().datalink;
    let mut out = Frames::default();
    while let Some(p) = r.next_packet() {
        match p {
            Ok(p) => {
                let number = out.frames.len() as u64 + 1;
                out.frames.push(Frame {
                    number,
                    link,
                    data: p.data.into_owned(),
                    orig_len: p.orig_len,
                });
            }
            Err(e) => {
                out.warning = Some(format!(
                    "capture ends in a damaged record after frame {}: {e}",
                    out.frames.len()
                ));
                break;
            }
        }
    }
    Ok(out)
}

fn read_pcapng(bytes: &[u8]) -> Result<Frames, ReadError> {
    let mut r = PcapNgReader::new(bytes).map_err(|e| ReadError::BadHeader(e.to_string()))?;
    let mut links: Vec<DataLink> = Vec::new();
    let mut out = Frames::default();
    while let Some(b) = r.next_block() {
        let (iface, data, orig_len) = match b {
            Ok(Block::InterfaceDescription(idb)) => {
                links.push(idb.linktype);
                continue;
            }
            Ok(Block::SectionHeader(_)) => {
                links.clear();
                continue;
            }
            Ok(Block::EnhancedPacket(p)) => {
                (p.interface_id as usize, p.data.into_owned(), p.original_len)
            }
            Ok(Block::SimplePacket(p)) => (0, p.data.into_owned(), p.original_len),
            Ok(_) => continue,
            Err(e) => {
                out.warning = Some(format!(
                    "capture ends in a damaged block after frame {}: {e}",
                    out.frames.len()
                ));
                break;
            }
        };
        let link = links.get(iface).copied().unwrap_or(DataLink::ETHERNET);
        let number = out.frames.len() as u64 + 1;
        out.frames.push(Frame {
            number,
            link,
            data,
            orig_len,
        });
    }
    Ok(out)
}
