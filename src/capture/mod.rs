//! `softrdma pcap check`: find RoCEv2 and iWARP traffic in a capture, dissect every RDMA
//! packet with the `proto` crate, verify every ICRC and every negotiated MPA CRC.
//!
//! Frames go through [`reader`] (pcap or pcapng) and [`frame`] (link, IP, UDP/TCP); UDP
//! datagrams to port 4791 go to [`roce`], TCP segments to [`tcp`] which reassembles each
//! direction and follows MPA. Every RDMA packet becomes a [`report::Record`].

pub mod frame;
pub mod plot;
pub mod reader;
pub mod report;
pub mod roce;
pub mod tcp;

use report::FileReport;

/// Checks one capture file held in memory; `name` labels it in the report.
pub fn check_bytes(name: &str, bytes: &[u8]) -> FileReport {
    let mut rep = FileReport::new(name);
    let frames = match reader::read_frames(bytes) {
        Ok(r) => r,
        Err(e) => {
            rep.error = Some(e.to_string());
            return rep;
        }
    };
    if let Some(w) = &frames.warning {
        rep.notes.push(w.clone());
    }
    let mut streams = tcp::Streams::default();
    for f in &frames.frames {
        match frame::dissect(f) {
            frame::Dissected::Udp(d) if d.dst_port == crate::proto::roce::UDP_PORT => {
                rep.push(roce::check(f.number, &d));
            }
            frame::Dissected::Tcp(seg) => {
                for r in streams.segment(f.number, &seg) {
                    rep.push(r);
                }
            }
            frame::Dissected::Unsupported(link) => rep.note_once(format!("link type {link} is not decoded")),
            _ => rep.tally.other_frames += 1,
        }
    }
    rep.notes.extend(streams.finish());
    rep.tally.other_frames += streams.non_rdma_frames();
    if rep.tally.rdma_packets() == 0 {
        rep.notes.push("no RDMA traffic found (RoCEv2 on UDP 4791, or MPA over TCP)".into());
    }
    rep
}

/// Checks one file from disk.
pub fn check_file(path: &std::path::Path) -> FileReport {
    let name = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => check_bytes(&name, &bytes),
        Err(e) => {
            let mut rep = FileReport::new(&name);
            rep.error = Some(format!("cannot read: {e}"));
            rep
        }
    }
}
