//! Reads the frames of a pcap or pcapng capture (with the `pcap-parser` crate, which,
//! unlike pcap-file 2.0, accepts records whose original length exceeds the snaplen).

use pcap_parser::pcapng::Block;
use pcap_parser::traits::PcapNGPacketBlock;
use pcap_parser::{create_reader, Linktype, PcapBlockOwned, PcapError};

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// 1-based frame number, as Wireshark counts.
    pub number: u64,
    /// Link type of the interface it was captured on.
    pub link: Linktype,
    /// The captured bytes (may be shorter than the frame: snaplen).
    pub data: Vec<u8>,
    /// Length of the frame on the wire.
    pub orig_len: u32,
    /// When it was captured, ns since the epoch (pcap's µs; pcapng's default µs units).
    pub time_ns: u64,
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
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::NotACapture => f.write_str("not a pcap or pcapng file (unknown magic number)"),
        }
    }
}

impl std::error::Error for ReadError {}

enum Step {
    Block(usize, Option<Frame>),
    End,
    Incomplete,
    Damaged(String),
}

const MIN_BUFFER_BYTES: usize = 1 << 16;

/// Reads every frame of a pcap or pcapng file held in memory.
pub fn read_frames(bytes: &[u8]) -> Result<Frames, ReadError> {
    // A buffer as large as the file: no record can be too large for it.
    let capacity = bytes.len().max(MIN_BUFFER_BYTES);
    let mut reader = create_reader(capacity, bytes).map_err(|_| ReadError::NotACapture)?;
    let mut out = Frames::default();
    let mut links: Vec<Linktype> = Vec::new();
    loop {
        // Turn the borrowed error into an owned step before touching the reader again.
        let step = match reader.next() {
            Ok((offset, block)) => Step::Block(offset, to_frame(block, &mut links, out.frames.len())),
            Err(PcapError::Eof) => Step::End,
            Err(PcapError::Incomplete(_)) | Err(PcapError::UnexpectedEof) => Step::Incomplete,
            Err(e) => Step::Damaged(format!("{e:?}")),
        };
        match step {
            Step::Block(offset, frame) => {
                reader.consume(offset);
                out.frames.extend(frame);
            }
            Step::End => break,
            Step::Incomplete if !reader.reader_exhausted() => {
                if reader.refill().is_err() {
                    out.warning = Some(format!("read error after frame {}", out.frames.len()));
                    break;
                }
            }
            Step::Incomplete => {
                out.warning = Some(format!("capture ends in a cut-off record after frame {}", out.frames.len()));
                break;
            }
            Step::Damaged(e) => {
                out.warning = Some(format!("capture ends in a damaged record after frame {} ({e})", out.frames.len()));
                break;
            }
        }
    }
    Ok(out)
}

fn to_frame(block: PcapBlockOwned<'_>, links: &mut Vec<Linktype>, count: usize) -> Option<Frame> {
    let number = count as u64 + 1;
    match block {
        PcapBlockOwned::LegacyHeader(h) => {
            links.clear();
            links.push(h.network);
            None
        }
        PcapBlockOwned::Legacy(b) => {
            let link = links.first().copied().unwrap_or(Linktype::ETHERNET);
            let time_ns = u64::from(b.ts_sec) * 1_000_000_000 + u64::from(b.ts_usec) * 1_000;
            Some(Frame { number, link, data: b.data.to_vec(), orig_len: b.origlen, time_ns })
        }
        PcapBlockOwned::NG(Block::SectionHeader(_)) => {
            links.clear();
            None
        }
        PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
            links.push(idb.linktype);
            None
        }
        PcapBlockOwned::NG(Block::EnhancedPacket(p)) => {
            let link = links.get(p.if_id as usize).copied().unwrap_or(Linktype::ETHERNET);
            let time_ns = (u64::from(p.ts_high) << 32 | u64::from(p.ts_low)) * 1_000;
            Some(Frame { number, link, data: p.packet_data().to_vec(), orig_len: p.origlen, time_ns })
        }
        PcapBlockOwned::NG(Block::SimplePacket(p)) => {
            let link = links.first().copied().unwrap_or(Linktype::ETHERNET);
            Some(Frame { number, link, data: p.packet_data().to_vec(), orig_len: p.origlen, time_ns: 0 })
        }
        PcapBlockOwned::NG(_) => None,
    }
}
