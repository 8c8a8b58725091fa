//! Micro-behaviours around each injected event, read from the record of every frame the
//! bridge forwarded (Lumina's analyses): how long the sender took to retransmit and how
//! far back it went (go-back-N, IBTA 9.7.5.1.1 and C9-200), how fast the receiver NAKed the
//! gap, whether a corrupted packet was dropped (A17.3.3), when the receiver generated CNPs
//! and how far apart (A17.9.3), and how the sender's rate moved after them.

use super::{is_request, Action, Applied};
use crate::proto::roce::ext::{NakCode, Syndrome};
use crate::proto::roce::Psn;
use std::net::IpAddr;

/// One forwarded RoCEv2 packet.
#[derive(Debug, Clone, Copy)]
pub struct Pkt {
    /// When (ns, the capture's clock).
    pub time_ns: u64,
    /// IP source and destination.
    pub src: IpAddr,
    /// IP destination.
    pub dst: IpAddr,
    /// BTH opcode, destination QP and PSN.
    pub opcode: u8,
    /// Destination QP.
    pub dest_qp: u32,
    /// PSN.
    pub psn: Psn,
    /// AETH syndrome, if any.
    pub syndrome: Option<Syndrome>,
}

/// What was read around one event: (metric, value) pairs, values with their units.
#[derive(Debug, Clone)]
pub struct Finding {
    /// The event, as declared (`drop@200`), and the packet it hit.
    pub event: String,
    /// The packet it hit.
    pub packet: String,
    /// The metrics, in a fixed order per kind of event.
    pub metrics: Vec<(&'static str, String)>,
}

/// PSNs this far from the event's count as its flow's (a 24-bit PSN space, random starts).
const FLOW_WINDOW: i32 = 1 << 16;
/// The window the rate before and after a CNP is measured over.
const RATE_WINDOW_NS: u64 = 2_000_000;
/// What follows a duplicate is read over this long (events are further apart).
const DUP_WINDOW_NS: u64 = 5_000_000;
/// CNPs are counted over this long after a mark.
const CNP_WINDOW_NS: u64 = 20_000_000;

/// The flow an event's packet belongs to, split into its requests and what came back.
struct FlowView<'a> {
    requests: Vec<&'a Pkt>,
    replies: Vec<&'a Pkt>,
    cnps: Vec<&'a Pkt>,
}

fn flow_of<'a>(all: &'a [Pkt], e: &Applied) -> FlowView<'a> {
    let p = &e.packet;
    let near = |x: &Pkt| Psn::new(p.psn).distance_to(x.psn).abs() < FLOW_WINDOW;
    let requests =
        all.iter().filter(|x| x.src == p.src && x.dst == p.dst && x.dest_qp == p.dest_qp && is_request(x.opcode));
    let replies: Vec<&Pkt> =
        all.iter().filter(|x| x.src == p.dst && x.dst == p.src && !is_request(x.opcode) && near(x)).collect();
    // CNPs go to the requester's QP, which its ACKs name.
    let requester = replies.first().map(|r| r.dest_qp);
    let cnps = all
        .iter()
        .filter(|x| x.opcode == 0x81 && x.src == p.dst && x.dst == p.src && requester.is_none_or(|q| q == x.dest_qp))
        .collect();
    FlowView { requests: requests.filter(|x| near(x)).collect(), replies, cnps }
}

/// The findings for every applied event.
pub fn analyse(all: &[Pkt], applied: &[Applied], released: &[(usize, u64)]) -> Vec<Finding> {
    applied
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let flow = flow_of(all, e);
            let late_copy = released.iter().find(|r| r.0 == i).map(|r| r.1);
            // What follows the next event is that event's.
            let next_event = applied.iter().map(|x| x.time_ns).filter(|&t| t > e.time_ns).min().unwrap_or(u64::MAX);
            let metrics = match e.spec.action {
                Action::Drop | Action::Corrupt(_) | Action::Delay { .. } => loss_metrics(&flow, e, late_copy),
                Action::Ecn => ecn_metrics(&flow, e),
                Action::Duplicate => dup_metrics(&flow, e, next_event),
            };
            Finding { event: describe_spec(e), packet: describe_packet(e), metrics }
        })
        .collect()
}

fn describe_spec(e: &Applied) -> String {
    match e.spec.run {
        1 => format!("{} of request {}", e.spec.action, e.spec.nth),
        n => format!("{} of requests {} to {}", e.spec.action, e.spec.nth, e.spec.nth + n - 1),
    }
}

fn describe_packet(e: &Applied) -> String {
    let p = &e.packet;
    format!("{} -> {} QP 0x{:06x} opcode 0x{:02x} PSN 0x{:06x}", p.src, p.dst, p.dest_qp, p.opcode, p.psn)
}

fn us(ns: u64) -> String {
    format!("{:.0} µs", ns as f64 / 1e3)
}

/// Drop, corruption and delay: how the loss was noticed and repaired.
fn loss_metrics(f: &FlowView<'_>, e: &Applied, late_copy: Option<u64>) -> Vec<(&'static str, String)> {
    let (t0, psn) = (e.time_ns, Psn::new(e.packet.psn));
    let after = |x: &&&Pkt| x.time_ns > t0;
    // A later PSN may pass in the event's own batch (the same timestamp).
    let gap_seen =
        f.requests.iter().filter(|x| x.time_ns >= t0).find(|x| psn.distance_to(x.psn) > 0).map(|x| x.time_ns);
    let nak = f
        .replies
        .iter()
        .filter(after)
        .find(|x| x.psn == psn && x.syndrome == Some(Syndrome::Nak(NakCode::PsnSequenceError)))
        .map(|x| x.time_ns);
    let retx =
        f.requests.iter().filter(after).find(|x| x.psn == psn && Some(x.time_ns) != late_copy).map(|x| x.time_ns);
    // An ACK covering the lost PSN before it was sent again: the receiver took the packet.
    let acked_unsent = f.replies.iter().filter(after).find(|x| {
        psn.distance_to(x.psn) >= 0
            && matches!(x.syndrome, Some(Syndrome::Ack { .. }))
            && retx.is_none_or(|r| x.time_ns < r)
    });
    let mut m = Vec::new();
    if let Action::Corrupt(_) = e.spec.action {
        m.push(("corrupted packet dropped", if acked_unsent.is_some() { "NO: ACKed" } else { "yes" }.to_string()));
    }
    m.push((
        "NAK (sequence error) after the gap",
        match (nak, gap_seen) {
            (Some(n), Some(g)) if n >= g => us(n - g),
            (Some(n), _) => format!("{} after the event", us(n - t0)),
            (None, _) => "none".into(),
        },
    ));
    let Some(r) = retx else {
        m.push(("retransmission", "none".into()));
        return m;
    };
    let trigger = if nak.is_some_and(|n| n <= r) { "NAK" } else { "timeout" };
    m.push(("retransmission after the event", format!("{} ({trigger})", us(r - t0))));
    // Go-back-N: how much of what was in flight past the lost PSN went out again.
    let sent_before: Vec<Psn> = f.requests.iter().filter(|x| x.time_ns < r).map(|x| x.psn).collect();
    let highest = sent_before.iter().map(|&x| psn.distance_to(x)).max().unwrap_or(0).max(0);
    let mut resent = std::collections::BTreeSet::new();
    for x in f.requests.iter().filter(|x| x.time_ns >= r) {
        let d = psn.distance_to(x.psn);
        if (0..=highest).contains(&d) {
            resent.insert(d);
        }
    }
    m.push(("went back to", if resent.contains(&0) { "the lost PSN".into() } else { "a later PSN".to_string() }));
    m.push(("resent of those in flight", format!("{} of {}", resent.len(), highest + 1)));
    m
}

/// An ECN-CE mark: the CNPs it drew and the sender's rate around them.
fn ecn_metrics(f: &FlowView<'_>, e: &Applied) -> Vec<(&'static str, String)> {
    let t0 = e.time_ns;
    let cnps: Vec<u64> = f.cnps.iter().map(|x| x.time_ns).filter(|&t| t >= t0 && t < t0 + CNP_WINDOW_NS).collect();
    let mut m = vec![("CNPs within 20 ms", cnps.len().to_string())];
    let Some(&first) = cnps.first() else {
        m.push(("first CNP after the mark", "none".into()));
        return m;
    };
    m.push(("first CNP after the mark", us(first - t0)));
    if let Some(gap) = cnps.windows(2).map(|w| w[1] - w[0]).min() {
        m.push(("closest CNP spacing", us(gap)));
    }
    let rate = |from: u64, to: u64| f.requests.iter().filter(|x| x.time_ns >= from && x.time_ns < to).count();
    let before = rate(first.saturating_sub(RATE_WINDOW_NS), first);
    let after_cnp = rate(first, first + RATE_WINDOW_NS);
    m.push(("requests 2 ms before / after the CNP", format!("{before} / {after_cnp}")));
    m
}

/// A duplicated request: what the receiver said to the copy, and whether the sender
/// was fooled into retransmitting.
fn dup_metrics(f: &FlowView<'_>, e: &Applied, next_event_ns: u64) -> Vec<(&'static str, String)> {
    let (t0, psn) = (e.time_ns, Psn::new(e.packet.psn));
    let within = |t: u64| t >= t0 && t < (t0 + DUP_WINDOW_NS).min(next_event_ns);
    let naks = f.replies.iter().filter(|x| within(x.time_ns) && matches!(x.syndrome, Some(Syndrome::Nak(_)))).count();
    // The bridge forwards both copies at t0; anything at or below the PSN after that is a
    // retransmission (the second copy carries the same timestamp).
    let again =
        f.requests.iter().filter(|x| x.time_ns > t0 && within(x.time_ns) && psn.distance_to(x.psn) <= 0).count();
    let acks_of_it = f.replies.iter().filter(|x| within(x.time_ns) && x.psn == psn).count();
    vec![
        ("ACKs naming the duplicated PSN", acks_of_it.to_string()),
        ("NAKs within 5 ms (before the next event)", naks.to_string()),
        ("retransmissions at or below it within 5 ms", again.to_string()),
    ]
}

/// The findings as a table, one row per metric.
pub fn table(findings: &[Finding]) -> String {
    let mut s = String::new();
    for f in findings {
        s += &format!("{}: {}\n", f.event, f.packet);
        for (k, v) in &f.metrics {
            s += &format!("    {k:<40} {v}\n");
        }
    }
    s
}

/// The findings as JSON.
pub fn json(findings: &[Finding]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = findings
        .iter()
        .map(|f| {
            let m: serde_json::Map<String, serde_json::Value> =
                f.metrics.iter().map(|(k, v)| ((*k).to_string(), serde_json::Value::from(v.clone()))).collect();
            serde_json::json!({ "event": f.event, "packet": f.packet, "metrics": m })
        })
        .collect();
    serde_json::Value::from(rows)
}
