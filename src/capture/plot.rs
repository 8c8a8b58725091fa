//! `softrdma pcap plot`: the time-sequence graph of each RC connection in a capture, as
//! SVG: PSN over time for the requests one way and the acknowledgements coming back, with
//! NAKs and retransmissions marked (the view Lumina and tcptrace give of a flow).

use super::frame::{dissect, Dissected};
use super::reader::read_frames;
use crate::proto::roce::ext::Syndrome;
use crate::proto::roce::opcode::Operation;
use crate::proto::roce::{RocePacket, RoceRepr};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// What one packet of a flow was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A request, the first time its PSN went out.
    Request,
    /// A request whose PSN went out before.
    Retransmission,
    /// An ACK (or a READ/atomic response carrying one).
    Ack,
    /// A NAK (sequence error, RNR or fatal).
    Nak,
}

/// One point of a flow: time (µs from the capture's start), PSN relative to the flow's
/// first, and what it was.
pub type Point = (f64, i64, Mark);

/// Requests to one destination QP and what came back for them, in capture order.
#[derive(Debug, Default, Clone)]
pub struct Flow {
    /// The points.
    pub points: Vec<Point>,
    /// The PSN the points count from.
    pub base_psn: u32,
    /// Injected events on this flow: time (µs from the capture's start), relative PSN, label.
    pub events: Vec<(f64, i64, String)>,
}

/// An event to mark on its flow's graph (an injected drop, mark, corruption, ...).
#[derive(Debug, Clone)]
pub struct EventMark {
    /// When (ns since the Unix epoch, the capture's clock).
    pub time_ns: u64,
    /// The packet's source, destination and destination QP: its flow.
    pub flow: (IpAddr, IpAddr, u32),
    /// Its PSN.
    pub psn: u32,
    /// What happened to it.
    pub label: String,
}

/// The flows of a capture, keyed by (requester address, responder address, responder QPN).
pub fn flows(bytes: &[u8]) -> Result<BTreeMap<(IpAddr, IpAddr, u32), Flow>, String> {
    flows_with(bytes, &[])
}

/// The flows of a capture with `events` placed on theirs.
pub fn flows_with(bytes: &[u8], events: &[EventMark]) -> Result<BTreeMap<(IpAddr, IpAddr, u32), Flow>, String> {
    let frames = read_frames(bytes).map_err(|e| format!("{e:?}"))?.frames;
    let t0 = frames.first().map_or(0, |f| f.time_ns);
    let mut out = points_of(&frames, t0);
    for e in events {
        if let Some(flow) = out.get_mut(&e.flow) {
            let rel = crate::proto::roce::Psn::new(flow.base_psn).distance_to(crate::proto::roce::Psn::new(e.psn));
            let t_us = e.time_ns.saturating_sub(t0) as f64 / 1e3;
            flow.events.push((t_us, i64::from(rel), e.label.clone()));
        }
    }
    Ok(out)
}

fn points_of(frames: &[super::reader::Frame], t0: u64) -> BTreeMap<(IpAddr, IpAddr, u32), Flow> {
    let mut out: BTreeMap<(IpAddr, IpAddr, u32), Flow> = BTreeMap::new();
    // The requester QPN each responder QP answers to, learned from its requests' ACKs.
    let mut first_psn: BTreeMap<(IpAddr, IpAddr, u32), u32> = BTreeMap::new();
    let mut highest: BTreeMap<(IpAddr, IpAddr, u32), i64> = BTreeMap::new();
    let mut answers_to: BTreeMap<(IpAddr, IpAddr), u32> = BTreeMap::new();
    for f in frames {
        let Dissected::Udp(d) = dissect(f) else { continue };
        let Ok(r) = RocePacket::new_checked(d.payload).and_then(|p| RoceRepr::parse(&p)) else { continue };
        let Some(info) = r.info() else { continue };
        let t_us = f.time_ns.saturating_sub(t0) as f64 / 1e3;
        let psn = r.bth.psn.value();
        let is_reply =
            matches!(info.operation, Operation::Acknowledge | Operation::ReadResponse | Operation::AtomicAcknowledge);
        let key = if is_reply {
            // An ACK goes to the requester: its flow is the one the requester sends to.
            let Some(&qpn) = answers_to.get(&(d.dst, d.src)) else { continue };
            (d.dst, d.src, qpn)
        } else {
            if info.transport != crate::proto::roce::opcode::Transport::Rc || r.bth.dest_qp == 1 {
                continue;
            }
            answers_to.insert((d.src, d.dst), r.bth.dest_qp);
            (d.src, d.dst, r.bth.dest_qp)
        };
        let base = *first_psn.entry(key).or_insert(psn);
        let rel = i64::from(crate::proto::roce::Psn::new(base).distance_to(crate::proto::roce::Psn::new(psn)));
        let mark = match (is_reply, r.aeth.map(|a| a.syndrome)) {
            (true, Some(Syndrome::Ack { .. })) | (true, None) => Mark::Ack,
            (true, Some(_)) => Mark::Nak,
            (false, _) => {
                let top = highest.entry(key).or_insert(i64::MIN);
                let m = if rel <= *top { Mark::Retransmission } else { Mark::Request };
                *top = (*top).max(rel);
                m
            }
        };
        let flow = out.entry(key).or_default();
        flow.base_psn = base;
        flow.points.push((t_us, rel, mark));
    }
    out
}

/// Draws every flow with at least `min_points` points, one panel each, into `out` (SVG).
pub fn plot(bytes: &[u8], out: &std::path::Path, min_points: usize, events: &[EventMark]) -> Result<usize, String> {
    let all = flows_with(bytes, events)?;
    let shown: Vec<_> = all.iter().filter(|(_, f)| f.points.len() >= min_points).collect();
    if shown.is_empty() {
        return Err("no RC flow in the capture".into());
    }
    let height = 360 * shown.len() as u32;
    let root = SVGBackend::new(out, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    for (area, ((src, dst, qpn), flow)) in root.split_evenly((shown.len(), 1)).iter().zip(&shown) {
        draw_flow(area, &format!("{src} -> {dst} QP 0x{qpn:06x}"), flow).map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(shown.len())
}

fn draw_flow<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    flow: &Flow,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let t_max = flow.points.iter().map(|p| p.0).fold(1.0, f64::max);
    let (lo, hi) = flow.points.iter().fold((0i64, 1i64), |(l, h), p| (l.min(p.1), h.max(p.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..t_max * 1.02, (lo - 1)..(hi + 2))?;
    chart.configure_mesh().x_desc("time (µs)").y_desc("PSN (from the first)").draw()?;
    let series = [
        (Mark::Request, BLUE, "request"),
        (Mark::Retransmission, RGBColor(230, 120, 0), "retransmission"),
        (Mark::Ack, GREEN, "ACK"),
        (Mark::Nak, RED, "NAK"),
    ];
    for (mark, color, label) in series {
        let pts: Vec<(f64, i64)> = flow.points.iter().filter(|p| p.2 == mark).map(|p| (p.0, p.1)).collect();
        if pts.is_empty() {
            continue;
        }
        let size = if matches!(mark, Mark::Nak | Mark::Retransmission) { 4 } else { 2 };
        chart
            .draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), size, color.filled())))?
            .label(label)
            .legend(move |(x, y)| Circle::new((x, y), 4, color.filled()));
    }
    if !flow.events.is_empty() {
        let marks: Vec<(f64, i64, String)> = flow.events.clone();
        chart
            .draw_series(marks.iter().map(|(x, y, _)| Cross::new((*x, *y), 7, BLACK.stroke_width(2))))?
            .label("injected event")
            .legend(|(x, y)| Cross::new((x, y), 4, BLACK.stroke_width(2)));
        chart.draw_series(
            marks.iter().map(|(x, y, l)| Text::new(l.clone(), (*x, *y + 1), ("sans-serif", 12).into_font())),
        )?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_rxe_capture_has_a_flow_each_way_with_its_acks() {
        let bytes = include_bytes!("../../pcaps/interop/rxe-serves-write_bw.pcap");
        let all = flows(bytes).unwrap();
        let busiest = all.values().max_by_key(|f| f.points.len()).unwrap();
        let count = |m| busiest.points.iter().filter(|p| p.2 == m).count();
        assert!(count(Mark::Request) >= 50 && count(Mark::Ack) >= 1, "{busiest:?}");
        // Time only moves forward, and the first request is PSN 0 of its flow.
        assert!(busiest.points.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(busiest.points.iter().find(|p| p.2 == Mark::Request).map(|p| p.1), Some(0));
    }
}
