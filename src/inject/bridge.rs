//! The injector's I/O: a packet socket on each of two interfaces, every frame from one
//! forwarded to the other through the [`Injector`], and every forwarded RoCEv2 packet
//! recorded (to a pcap when asked, and in memory for the micro-behaviour analysis).

use super::micro::{self, Pkt};
use super::{roce_id, Applied, EventSpec, Injector, Side};
use crate::transport::raw::frame::complete_partial_checksum;
use crate::transport::raw::io::{packet_socket, FrameRx, FrameTx, PacketSocketRx, PacketSocketTx};
use crate::transport::sys;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the bridge is told.
#[derive(Debug, Clone)]
pub struct BridgeArgs {
    /// Interface A.
    pub a: String,
    /// Interface B.
    pub b: String,
    /// The events.
    pub events: Vec<EventSpec>,
    /// Every forwarded frame, to this capture.
    pub pcap: Option<PathBuf>,
    /// Stop after this long (else at SIGINT or SIGTERM).
    pub duration: Option<Duration>,
}

/// What a bridge run produced.
pub struct BridgeReport {
    /// The events applied, in order.
    pub applied: Vec<Applied>,
    /// Delayed frames as they were released: (index into `applied`, time ns).
    pub released: Vec<(usize, u64)>,
    /// Events that never found their packet.
    pub unmet: Vec<EventSpec>,
    /// Frames forwarded each way (A to B, B to A).
    pub forwarded: (u64, u64),
    /// The RoCEv2 packets forwarded.
    pub packets: Vec<Pkt>,
}

/// Forwarded packets kept for the analysis; beyond this only the pcap has them.
pub const MAX_RECORDED_PACKETS: usize = 4_000_000;

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

struct Port {
    tx: PacketSocketTx,
    rx: PacketSocketRx,
}

fn open(iface: &str) -> Result<Port, String> {
    let (ifindex, _) = sys::interface_info(iface).map_err(|e| format!("interface {iface}: {e}"))?;
    let (tx, rx) =
        packet_socket(ifindex, false).map_err(|e| format!("packet socket on {iface} (needs CAP_NET_RAW): {e}"))?;
    // Times are the kernel's receive times, not when the bridge read a batch.
    sys::set_receive_timestamps(rx.fd()).map_err(|e| format!("timestamps on {iface}: {e}"))?;
    Ok(Port { tx, rx })
}

/// Runs the bridge until `duration` is over or a signal stops it.
pub fn run(args: &BridgeArgs) -> Result<BridgeReport, String> {
    let mut ports = [open(&args.a)?, open(&args.b)?];
    let log = match &args.pcap {
        Some(p) => Some(crate::transport::pcap::FrameLog::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    sys::catch_stop_signals();
    let mut inj = Injector::new(args.events.clone());
    let mut rep = BridgeReport { applied: vec![], released: vec![], unmet: vec![], forwarded: (0, 0), packets: vec![] };
    let deadline = args.duration.map(|d| Instant::now() + d);
    while !sys::stop_requested() && deadline.is_none_or(|d| Instant::now() < d) {
        let now = now_ns();
        for (side, frame) in inj.due(now) {
            forward(&ports, to_index(side), vec![(frame, now)], log.as_ref(), &mut rep);
        }
        for i in 0..2 {
            let side = if i == 0 { Side::AtoB } else { Side::BtoA };
            let mut out = Vec::new();
            for (frame, at) in read_batch(&mut ports[i].rx) {
                out.extend(inj.on_frame(at, side, frame).into_iter().map(|f| (f, at)));
            }
            forward(&ports, to_index(side), out, log.as_ref(), &mut rep);
        }
        let wait = inj.next_due_ns().map_or(Duration::from_millis(50), |t| Duration::from_nanos(t.saturating_sub(now)));
        let fds = [ports[0].rx.fd(), ports[1].rx.fd()];
        let _ = sys::wait_readable(&fds, Some(wait.min(Duration::from_millis(50))));
    }
    // Frames still held go out: the bridge never keeps what it was given.
    let now = now_ns();
    for (side, frame) in inj.flush(now) {
        forward(&ports, to_index(side), vec![(frame, now)], log.as_ref(), &mut rep);
    }
    if let Some(l) = log {
        l.close().map_err(|e| format!("the capture: {e}"))?;
    }
    rep.applied = inj.applied().to_vec();
    rep.released = inj.released().to_vec();
    rep.unmet = inj.unmet();
    Ok(rep)
}

/// The port a frame that came in on `side` leaves by.
fn to_index(side: Side) -> usize {
    match side {
        Side::AtoB => 1,
        Side::BtoA => 0,
    }
}

/// The frames waiting, each with the time the kernel received it.
fn read_batch(rx: &mut PacketSocketRx) -> Vec<(Vec<u8>, u64)> {
    let n = rx.recv().unwrap_or(0);
    let read_at = now_ns();
    (0..n)
        .filter_map(|i| {
            let mut f = rx.frame(i)?.to_vec();
            // A sender on this host (a veth peer) leaves its checksum to the NIC; the bridge
            // is that NIC now.
            if rx.checksum_partial(i) {
                complete_partial_checksum(&mut f);
            }
            Some((f, rx.timestamp_ns(i).unwrap_or(read_at)))
        })
        .collect()
}

/// Sends `frames` out of port `out`, each recorded and counted with the time it came in.
fn forward(
    ports: &[Port; 2],
    out: usize,
    frames: Vec<(Vec<u8>, u64)>,
    log: Option<&crate::transport::pcap::FrameLog>,
    rep: &mut BridgeReport,
) {
    if frames.is_empty() {
        return;
    }
    for (f, at) in &frames {
        record(f, *at, log, rep);
    }
    let n = frames.len() as u64;
    if out == 1 {
        rep.forwarded.0 += n;
    } else {
        rep.forwarded.1 += n;
    }
    let bytes: Vec<Vec<u8>> = frames.into_iter().map(|(f, _)| f).collect();
    ports[out].tx.send(&bytes);
}

/// Notes a forwarded frame: in the capture, and for the analysis.
fn record(f: &[u8], at: u64, log: Option<&crate::transport::pcap::FrameLog>, rep: &mut BridgeReport) {
    if let Some(l) = log {
        l.record_frame(f, at);
    }
    if rep.packets.len() < MAX_RECORDED_PACKETS {
        rep.packets.extend(packet_of(f, at));
    }
}

/// A forwarded frame as the analysis reads it.
fn packet_of(frame: &[u8], time_ns: u64) -> Option<Pkt> {
    let id = roce_id(frame)?;
    let r = crate::proto::roce::RocePacket::new_checked(&frame[id.bth_at..id.end])
        .and_then(|p| crate::proto::roce::RoceRepr::parse(&p))
        .ok()?;
    Some(Pkt {
        time_ns,
        src: id.src,
        dst: id.dst,
        opcode: id.opcode,
        dest_qp: id.dest_qp,
        psn: r.bth.psn,
        syndrome: r.aeth.map(|a| a.syndrome),
    })
}

/// The report's findings, table and JSON (events, unmet events, findings).
pub fn findings(rep: &BridgeReport) -> Vec<micro::Finding> {
    // Frames are stamped by the kernel as they arrive on either port; read both ports'
    // in time order.
    let mut packets = rep.packets.clone();
    packets.sort_by_key(|p| p.time_ns);
    micro::analyse(&packets, &rep.applied, &rep.released)
}

/// The run as JSON: frames forwarded, events applied (with the packet each hit), events
/// that found no packet, and the findings.
pub fn report_json(rep: &BridgeReport) -> serde_json::Value {
    let applied: Vec<serde_json::Value> = rep
        .applied
        .iter()
        .map(|a| {
            let p = &a.packet;
            serde_json::json!({
                "event": format!("{}", a.spec.action), "nth": a.spec.nth, "time_ns": a.time_ns,
                "src": p.src.to_string(), "dst": p.dst.to_string(), "qpn": p.dest_qp, "psn": p.psn,
                "opcode": p.opcode,
            })
        })
        .collect();
    let unmet: Vec<String> = rep.unmet.iter().map(|s| format!("{} of request {}", s.action, s.nth)).collect();
    serde_json::json!({
        "forwarded": { "a_to_b": rep.forwarded.0, "b_to_a": rep.forwarded.1 },
        "applied": applied,
        "unmet": unmet,
        "findings": micro::json(&findings(rep)),
    })
}

/// The events of a report written by [`report_json`], as marks for `pcap plot`.
pub fn marks_from_json(v: &serde_json::Value) -> Result<Vec<crate::capture::plot::EventMark>, String> {
    let list = v.get("applied").and_then(|a| a.as_array()).ok_or("no \"applied\" list in the events file")?;
    list.iter()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(|x| x.as_str()).ok_or(format!("event without {k}"));
            let n = |k: &str| e.get(k).and_then(|x| x.as_u64()).ok_or(format!("event without {k}"));
            let addr = |k: &str| s(k)?.parse::<std::net::IpAddr>().map_err(|x| format!("{k}: {x}"));
            Ok(crate::capture::plot::EventMark {
                time_ns: n("time_ns")?,
                flow: (addr("src")?, addr("dst")?, n("qpn")? as u32),
                psn: n("psn")? as u32,
                label: s("event")?.to_string(),
            })
        })
        .collect()
}

/// The events of a run as marks for its graph.
pub fn marks(rep: &BridgeReport) -> Vec<crate::capture::plot::EventMark> {
    rep.applied
        .iter()
        .map(|a| crate::capture::plot::EventMark {
            time_ns: a.time_ns,
            flow: (a.packet.src, a.packet.dst, a.packet.dest_qp),
            psn: a.packet.psn,
            label: format!("{}", a.spec.action),
        })
        .collect()
}
