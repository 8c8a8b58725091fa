//! `softrdma conform`: the protocol conformance of a live RoCEv2 peer, tested with
//! packets built here (IBTA vol. 1 ch. 9, Annex A17).
//!
//! The target runs nothing but its stock tool: `ibv_rc_pingpong` as a server, restarted
//! after each connection (`while :; do ibv_rc_pingpong -g 1; done`). For each case the
//! tester makes a fresh connection through that tool's out-of-band exchange, as its client
//! would (its QPN and expected PSN are all a case needs), and then, instead of ping-pong,
//! sends the case's packets from a UDP socket on port 4791 with good ICRCs unless the case
//! is about them. It collects what comes back, judges it against what the section requires,
//! and probes the QP's state afterwards; the next case's connection is the liveness check.
//! Packets go to the target's address only.

mod cases;
pub mod iwarp;
pub mod iwarp_cases;
mod peer;
pub mod random;
mod tcp_log;

pub use cases::{catalogue, Case};
pub use peer::Peer;

use crate::engine::verbs::Mtu;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// What the tester is told.
#[derive(Debug, Clone)]
pub struct ConformArgs {
    /// The target's address (its ibv_rc_pingpong server, or on iWARP its rping server).
    pub target: String,
    /// RoCEv2 (ibv_rc_pingpong's exchange) or iWARP (rping through MPA).
    pub transport: crate::verbs::Transport,
    /// The exchange's TCP port (iWARP: the rdma_cm listener's).
    pub port: u16,
    /// iWARP: ask for MPA CRC on every connection.
    pub mpa_crc: bool,
    /// iWARP: how long to wait after the MPA Reply before a case's first FPDU.
    pub settle: Duration,
    /// The UDP port RoCEv2 packets go to and come from (4791).
    pub roce_port: u16,
    /// The local address to test from (default: the one the exchange's TCP uses).
    pub bind: Option<IpAddr>,
    /// The path MTU the target runs with (ibv_rc_pingpong's `-m`, 1024 by default).
    pub mtu: Mtu,
    /// How long to listen for the answer to a case's packets.
    pub wait: Duration,
    /// At most this many packets a second go to the target.
    pub rate_pps: u32,
    /// How long a fresh connection may take (the target's tool restarting) before the
    /// target counts as hung.
    pub connect_wait: Duration,
    /// Cases whose name contains one of these (all when empty).
    pub only: Vec<String>,
    /// Every packet both ways, to this capture.
    pub pcap: Option<PathBuf>,
    /// Random mode instead of the catalogue: this many trials from this seed.
    pub random: Option<(u64, u64)>,
}

/// What a case found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The target answered as the section requires.
    Conforms,
    /// It did something else: what.
    Deviates(String),
    /// It stopped answering (no fresh connection, or no answer where one is required
    /// even to a valid packet).
    Hung(String),
}

/// One case's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The case.
    pub name: String,
    /// The section it checks.
    pub section: &'static str,
    /// What the section requires.
    pub expect: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// What came back, one line per packet.
    pub seen: Vec<String>,
}

fn chosen(a: &ConformArgs, name: &str) -> bool {
    a.only.is_empty() || a.only.iter().any(|o| name.contains(o.as_str()))
}

/// Runs the iWARP catalogue: each case on a fresh connection to the target's rping.
fn run_iwarp(a: &ConformArgs) -> Vec<Outcome> {
    let log = a.pcap.as_ref().and_then(|p| crate::transport::pcap::FrameLog::create(p).ok()).map(std::sync::Arc::new);
    let mut out = Vec::new();
    for case in iwarp_cases::catalogue().into_iter().filter(|c| chosen(a, c.name)) {
        let connected = match case.setup {
            iwarp_cases::Setup::Tcp => iwarp::IwPeer::tcp(a, log.clone()),
            iwarp_cases::Setup::Mpa => iwarp::IwPeer::connect(a, log.clone()),
            iwarp_cases::Setup::MpaWithCrc => {
                iwarp::IwPeer::connect(&ConformArgs { mpa_crc: true, ..a.clone() }, log.clone())
            }
        };
        let (verdict, seen) = match connected {
            Ok(mut peer) => {
                let v = (case.run)(&mut peer, a);
                let seen = peer.take_seen();
                peer.close();
                (v, seen)
            }
            Err(e) => (Verdict::Hung(format!("no fresh connection: {e}")), Vec::new()),
        };
        out.push(Outcome { name: case.name.to_string(), section: case.section, expect: case.expect, verdict, seen });
        // The target's tool sees the close and starts again.
        std::thread::sleep(Duration::from_millis(200));
    }
    if let Some(l) = log {
        let _ = l.close();
    }
    out
}

/// Runs the catalogue (or the cases `a.only` names) against the target.
pub fn run(a: &ConformArgs) -> Vec<Outcome> {
    if let (Some((trials, seed)), crate::verbs::Transport::RoceV2) = (a.random, a.transport) {
        return random::run(a, trials, seed);
    }
    if a.transport == crate::verbs::Transport::Iwarp {
        return run_iwarp(a);
    }
    let log = a.pcap.as_ref().and_then(|p| crate::transport::pcap::FrameLog::create(p).ok()).map(std::sync::Arc::new);
    let mut out = Vec::new();
    for case in catalogue().into_iter().filter(|c| chosen(a, c.name)) {
        let (verdict, seen) = match Peer::connect(a, log.clone(), case.start_psn) {
            Ok(mut peer) => {
                let v = (case.run)(&mut peer);
                let seen = peer.take_seen();
                cases::end_connection(&mut peer);
                (v, seen)
            }
            Err(e) => (Verdict::Hung(format!("no fresh connection: {e}")), Vec::new()),
        };
        out.push(Outcome { name: case.name.to_string(), section: case.section, expect: case.expect, verdict, seen });
    }
    if let Some(l) = log {
        let _ = l.close();
    }
    out
}

/// The human table.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = format!("{:<28} {:<14} {:<10} {}\n", "case", "section", "verdict", "required / found");
    for o in outcomes {
        let (v, why) = match &o.verdict {
            Verdict::Conforms => ("conforms", String::new()),
            Verdict::Deviates(w) => ("DEVIATES", format!(" / {w}")),
            Verdict::Hung(w) => ("HUNG", format!(" / {w}")),
        };
        s += &format!("{:<28} {:<14} {:<10} {}{}\n", o.name, o.section, v, o.expect, why);
    }
    let ok = outcomes.iter().filter(|o| o.verdict == Verdict::Conforms).count();
    s += &format!("{ok} of {} cases conform\n", outcomes.len());
    s
}

/// The outcomes as JSON.
pub fn json(outcomes: &[Outcome]) -> serde_json::Value {
    let cases: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            let (verdict, detail) = match &o.verdict {
                Verdict::Conforms => ("conforms", String::new()),
                Verdict::Deviates(w) => ("deviates", w.clone()),
                Verdict::Hung(w) => ("hung", w.clone()),
            };
            serde_json::json!({
                "case": o.name, "section": o.section, "expect": o.expect,
                "verdict": verdict, "detail": detail, "seen": o.seen,
            })
        })
        .collect();
    serde_json::json!({ "cases": cases })
}
