//! What `pcap check` found: one record per RDMA packet, notes, and a tally.

use serde::Serialize;
use std::fmt;

/// The verdict on one RDMA packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Check {
    /// The ICRC or MPA CRC matches.
    Ok,
    /// MPA CRC was not negotiated on this connection; nothing to check.
    NotNegotiated,
    /// Nothing to check (an MPA Request/Reply frame).
    NoChecksum,
    /// The checksum does not match.
    BadChecksum {
        /// Carried on the wire.
        carried: u32,
        /// Computed.
        computed: u32,
    },
    /// The packet does not parse.
    Malformed {
        /// Why.
        error: String,
    },
    /// The capture holds only part of the packet (snaplen), so it was not checked.
    Truncated,
}

impl Check {
    /// True for verdicts that make `pcap check` fail.
    pub fn is_failure(&self) -> bool {
        matches!(self, Check::BadChecksum { .. } | Check::Malformed { .. })
    }
}

/// One RDMA packet.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Frame number (for an FPDU: the frame that completed it).
    pub frame: u64,
    /// Source address (and port for iWARP).
    pub src: String,
    /// Destination address (and port for iWARP).
    pub dst: String,
    /// Dissection, e.g. `RC RDMA_WRITE_ONLY qp=0x11 psn=0x3a2b1c len=64`.
    pub summary: String,
    /// The verdict.
    pub check: Check,
}

impl Record {
    /// `icrc` for RoCEv2, `crc` for MPA.
    fn check_label(&self) -> &'static str {
        if self.summary.starts_with("MPA") || self.summary.starts_with("RDMAP") || self.summary.starts_with("FPDU") {
            "crc"
        } else {
            "icrc"
        }
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} -> {} {}", self.frame, self.src, self.dst, self.summary)?;
        let label = self.check_label();
        match &self.check {
            Check::Ok => write!(f, " {label}=ok"),
            Check::NotNegotiated => write!(f, " {label}=none"),
            Check::NoChecksum => Ok(()),
            Check::BadChecksum { carried, computed } => {
                write!(f, " {label}=BAD(carried 0x{carried:08x}, computed 0x{computed:08x})")
            }
            Check::Malformed { error } => write!(f, " MALFORMED({error})"),
            Check::Truncated => write!(f, " {label}=unchecked(truncated by snaplen)"),
        }
    }
}

/// Counts over a file or a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tally {
    /// RoCEv2 packets.
    pub roce_packets: u64,
    /// RoCEv2 packets carrying CM MADs.
    pub cm_mads: u64,
    /// MPA Request/Reply frames.
    pub mpa_frames: u64,
    /// FPDUs.
    pub fpdus: u64,
    /// Checksums verified good.
    pub checksum_ok: u64,
    /// Checksums that failed.
    pub checksum_bad: u64,
    /// FPDUs on connections without MPA CRC.
    pub crc_not_negotiated: u64,
    /// Packets that do not parse.
    pub malformed: u64,
    /// Packets cut by the snaplen.
    pub truncated: u64,
    /// Frames that carry no RDMA (ARP, ICMP, other UDP, TCP connections without MPA).
    pub other_frames: u64,
}

impl Tally {
    /// RDMA packets seen.
    pub fn rdma_packets(&self) -> u64 {
        self.roce_packets + self.mpa_frames + self.fpdus
    }
    /// Adds another tally.
    pub fn add(&mut self, o: &Tally) {
        self.roce_packets += o.roce_packets;
        self.cm_mads += o.cm_mads;
        self.mpa_frames += o.mpa_frames;
        self.fpdus += o.fpdus;
        self.checksum_ok += o.checksum_ok;
        self.checksum_bad += o.checksum_bad;
        self.crc_not_negotiated += o.crc_not_negotiated;
        self.malformed += o.malformed;
        self.truncated += o.truncated;
        self.other_frames += o.other_frames;
    }
    /// True when nothing failed.
    pub fn passed(&self) -> bool {
        self.checksum_bad == 0 && self.malformed == 0
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} RDMA packets ({} RoCEv2 incl. {} CM MADs, {} MPA frames, {} FPDUs): \
             checksums ok={} bad={} not-negotiated={}, malformed={}, truncated={}; {} other frames",
            self.rdma_packets(),
            self.roce_packets,
            self.cm_mads,
            self.mpa_frames,
            self.fpdus,
            self.checksum_ok,
            self.checksum_bad,
            self.crc_not_negotiated,
            self.malformed,
            self.truncated,
            self.other_frames
        )
    }
}

/// Everything found in one file.
#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    /// File name.
    pub file: String,
    /// RDMA packets in capture order.
    pub records: Vec<Record>,
    /// Remarks (truncated file, streams not followed, no RDMA found).
    pub notes: Vec<String>,
    /// Counts.
    pub tally: Tally,
    /// Set when the file could not be read as a capture.
    pub error: Option<String>,
}

impl FileReport {
    /// An empty report for `file`.
    pub fn new(file: &str) -> Self {
        FileReport { file: file.into(), records: Vec::new(), notes: Vec::new(), tally: Tally::default(), error: None }
    }

    /// Adds a record and counts it; `kind` comes from its summary.
    pub fn push(&mut self, r: Record) {
        let t = &mut self.tally;
        if r.summary.starts_with("MPA") {
            t.mpa_frames += 1;
        } else if r.summary.starts_with("RDMAP") || r.summary.starts_with("FPDU") {
            t.fpdus += 1;
        } else {
            t.roce_packets += 1;
            if r.summary.contains(" CM ") {
                t.cm_mads += 1;
            }
        }
        match &r.check {
            Check::Ok => t.checksum_ok += 1,
            Check::NotNegotiated => t.crc_not_negotiated += 1,
            Check::NoChecksum => {}
            Check::BadChecksum { .. } => t.checksum_bad += 1,
            Check::Malformed { .. } => t.malformed += 1,
            Check::Truncated => t.truncated += 1,
        }
        self.records.push(r);
    }

    /// Adds a note unless it is already there.
    pub fn note_once(&mut self, n: String) {
        if !self.notes.contains(&n) {
            self.notes.push(n);
        }
    }
}
