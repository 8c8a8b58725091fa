//! `--pcap FILE`: every datagram an endpoint sends or receives, written as a full
//! Ethernet/IP/UDP frame with its real ICRC, so that Wireshark and `softrdma pcap check`
//! read it. Received IPv4 frames carry the Identification recovered from their ICRC.

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;
use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A capture file shared by an endpoint's send and receive paths.
pub struct FrameLog {
    writer: Mutex<Option<PcapWriter<BufWriter<File>>>>,
}

impl FrameLog {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> io::Result<FrameLog> {
        let file = BufWriter::new(File::create(path)?);
        let header = PcapHeader { datalink: DataLink::ETHERNET, snaplen: 65535, ..PcapHeader::default() };
        let writer = PcapWriter::with_header(file, header).map_err(io::Error::other)?;
        Ok(FrameLog { writer: Mutex::new(Some(writer)) })
    }

    /// Records one datagram: `ip` and `udp` headers as on the wire, then the RoCEv2 packet.
    pub fn record(&self, ip: &[u8], udp: &[u8], payload: &[u8]) {
        let mut frame = Vec::with_capacity(14 + ip.len() + udp.len() + payload.len());
        let v4 = ip.len() == 20;
        // Locally administered MACs derived from the IP addresses: the transport has no MACs.
        let (src, dst) = if v4 { (&ip[12..16], &ip[16..20]) } else { (&ip[20..24], &ip[36..40]) };
        frame.extend_from_slice(&[0x02, 0x00]);
        frame.extend_from_slice(dst);
        frame.extend_from_slice(&[0x02, 0x00]);
        frame.extend_from_slice(src);
        frame.extend_from_slice(if v4 { &[0x08, 0x00] } else { &[0x86, 0xdd] });
        frame.extend_from_slice(ip);
        frame.extend_from_slice(udp);
        frame.extend_from_slice(payload);
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        self.write(ts, &frame);
    }

    /// Records a whole Ethernet frame seen at `time_ns` (since the Unix epoch).
    pub fn record_frame(&self, frame: &[u8], time_ns: u64) {
        self.write(Duration::from_nanos(time_ns), frame);
    }

    fn write(&self, ts: Duration, frame: &[u8]) {
        let packet = PcapPacket::new(ts, frame.len() as u32, frame);
        if let Ok(mut w) = self.writer.lock() {
            if let Some(w) = w.as_mut() {
                let _ = w.write_packet(&packet);
            }
        }
    }

    /// Writes buffered frames to the file and stops recording.
    pub fn close(&self) -> io::Result<()> {
        use std::io::Write;
        let writer = self.writer.lock().map_err(|_| io::Error::other("capture writer poisoned"))?.take();
        writer.map_or(Ok(()), |w| w.into_writer().flush())
    }
}
