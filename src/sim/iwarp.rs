//! iWARP in the simulator: two sans-I/O iWARP devices (`crate::iwarp::device`) joined by a
//! simulated TCP connection, driven by one seed. TCP delivers in order and loses nothing,
//! so what the seed varies is what a real stream varies: where it is cut, how much one
//! turn carries (a window), when each side reads (a slow reader holds the other back),
//! the clock, and the MPA settings each side asks for (CRC off, on request or required;
//! markers). The workload is random Sends, Writes and Reads both ways; the checks: every
//! work request completes exactly once and successfully, every byte lands where it
//! should, and at the end the peer's close flushes what is still posted, once.

use crate::engine::mem::{Access, Mr};
use crate::engine::rng::Rng;
use crate::engine::verbs::{QpCaps, QpState, RecvWr, Remote, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use crate::engine::{Device, DeviceConfig};
use crate::iwarp::config::{ConnParam, IwarpConfig};
use crate::iwarp::device::{ConnId, ConnState, IwarpDevice};
use crate::iwarp::setup::CrcPolicy;
use std::collections::HashMap;

/// Bytes of each side's region: source, sink and receive areas of [`AREA`] each.
const REGION: usize = 3 * AREA;
const AREA: usize = 256 * 1024;
/// Largest message of the workload.
const MAX_MESSAGE: usize = 200_000;
/// Turns of the network without progress before the run is declared stuck.
const STUCK_TURNS: u32 = 10_000;
/// A timer this close (ns) is waited for when the streams go quiet: a held first FPDU is, an MPA
/// timeout (seconds away, for a handshake still under way) is not.
const TIMER_SOON_NS: u64 = 50_000_000;

/// What one seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IwarpReport {
    /// Work requests completed.
    pub completions: usize,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Network turns taken.
    pub turns: u64,
}

struct Side {
    dev: IwarpDevice,
    cq: u32,
    mr: Mr,
    qpn: u32,
    conn: ConnId,
    /// wr_id -> what its completion must say (opcode, byte length).
    expected: HashMap<u64, (WcOpcode, u32)>,
}

fn side(seed: u64, crc: CrcPolicy, rng: &mut Rng) -> Side {
    // Peer-to-peer offered or not (the default), and the initiator's first FPDU held for
    // the shipped delay (sent on a timer) or sent at once.
    let offer_rtr = rng.below(2) == 0;
    let first_fpdu_delay_us = if rng.below(2) == 0 { 0 } else { IwarpConfig::default().first_fpdu_delay_us };
    let cfg = IwarpConfig { crc, markers: rng.below(4) == 0, offer_rtr, first_fpdu_delay_us, ..IwarpConfig::default() };
    let dcfg = DeviceConfig { gid: [0; 16], seed: Some(seed), max_qps: 4, max_mrs: 4, cc: Default::default() };
    let mut dev = IwarpDevice::new(Device::new(dcfg), cfg);
    let pd = dev.dev.alloc_pd();
    let cq = dev.dev.create_cq(1024);
    let mr = dev.dev.reg_mr(pd, REGION, Access::ALL).expect("a region");
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, max_sge: 1 };
    let qpn = dev.create_qp(pd, (cq, cq), caps, None).expect("a QP");
    Side { dev, cq, mr, qpn, conn: 0, expected: HashMap::new() }
}

fn sge(mr: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: mr.addr + off as u64, length: len as u32, lkey: mr.lkey }
}

/// The simulated TCP connection: how much a turn carries and how eager each reader is.
struct Wire {
    rng: Rng,
    window: usize,
    /// The TCP MSS both ends see: Ethernet's, a jumbo frame's or loopback's, so FPDUs
    /// come in each size the drivers meet (and payloads are spliced from memory or copied).
    mss: usize,
    now_ns: u64,
    turns: u64,
}

impl Wire {
    /// One turn: each side's stream carries a random piece (or nothing, if its reader is
    /// slow this turn) and time moves on. True if a byte moved.
    fn turn(&mut self, a: &mut Side, b: &mut Side) -> bool {
        self.turns += 1;
        self.now_ns += 1_000 + self.rng.below(50_000);
        for s in [&mut *a, &mut *b] {
            s.dev.set_now(self.now_ns);
            s.dev.handle_timeout();
        }
        let ab = self.carry(a, b);
        let ba = self.carry(b, a);
        let closed = Self::close_streams(a, b) | Self::close_streams(b, a);
        ab || ba || closed
    }

    /// A stream `from` ended reaches `to` as the peer's close (after what was in flight).
    fn close_streams(from: &mut Side, to: &mut Side) -> bool {
        let ended = from.dev.take_closed().contains(&from.conn);
        if ended {
            to.dev.on_tcp_closed(to.conn, "the peer closed the connection");
        }
        ended
    }

    fn carry(&mut self, from: &mut Side, to: &mut Side) -> bool {
        let pending = from.dev.tx_pending_len(from.conn);
        if pending == 0 || self.rng.below(8) == 0 {
            return false;
        }
        let n = 1 + self.rng.below(pending.min(self.window) as u64) as usize;
        let mut piece = vec![0u8; n];
        // Fewer only if the device ended the connection (a region deregistered under its
        // queued bytes), which then has nothing more to write.
        let n = from.dev.tx_copy_pending(from.conn, &mut piece);
        piece.truncate(n);
        from.dev.on_written(from.conn, n);
        to.dev.on_bytes(to.conn, &piece);
        true
    }

    /// Turns until neither stream has anything left nor a timer due soon (a held first FPDU,
    /// not an MPA timeout) to fire; with both streams empty, time jumps to that timer.
    fn settle(&mut self, a: &mut Side, b: &mut Side) -> Result<(), String> {
        let mut idle = 0;
        loop {
            if a.dev.tx_pending_len(a.conn) == 0 && b.dev.tx_pending_len(b.conn) == 0 {
                let next = a.dev.poll_timeout().into_iter().chain(b.dev.poll_timeout()).min();
                match next {
                    Some(at) if at <= self.now_ns + TIMER_SOON_NS => self.now_ns = self.now_ns.max(at),
                    _ => break,
                }
            }
            idle = if self.turn(a, b) { 0 } else { idle + 1 };
            if idle > STUCK_TURNS {
                return Err("the streams stopped moving".into());
            }
        }
        Ok(())
    }
}

/// MPA setup: `a` connects, `b` listens and accepts. With CRC policies that cannot agree
/// (one side refuses CRC, the other requires it; RFC 5044 §7.1.2) the setup must fail on
/// both sides instead: returns whether the connection came up.
fn connect(a: &mut Side, b: &mut Side, wire: &mut Wire, agree: bool) -> Result<bool, String> {
    let param = ConnParam { private_data: b"sim".to_vec(), responder_resources: 4, initiator_depth: 4 };
    let l = b.dev.listen();
    a.conn = a.dev.connect(a.qpn, &param).map_err(|e| e.to_string())?;
    b.conn = b.dev.on_tcp_accepted(l, wire.mss);
    a.dev.on_tcp_connected(a.conn, wire.mss);
    wire.settle(a, b)?;
    if let Some((r, _)) = b.dev.take_request(l) {
        b.dev.accept(r, b.qpn, &param).map_err(|e| format!("accept: {e}"))?;
        wire.settle(a, b)?;
    }
    let result = a.dev.take_result(a.conn);
    let up = (a.dev.conn_state(a.conn), b.dev.conn_state(b.conn));
    let established = (Some(ConnState::Established), Some(ConnState::Established));
    match (agree, result) {
        (true, Some(Ok(pd))) if pd == b"sim" && up == established => Ok(true),
        (false, Some(Err(_))) if up.0 != Some(ConnState::Established) && up.1 != Some(ConnState::Established) => {
            Ok(false)
        }
        (_, result) => Err(format!("CRC policies agree: {agree}; connect ended {result:?}, states {up:?}")),
    }
}

/// Posts one random operation from `x` to `y`; returns its size and what `y`'s region
/// must then hold (for a Send or Write) or `x`'s (for a Read), as (side is x, offset, bytes).
fn post_one(x: &mut Side, y: &mut Side, id: u64, rng: &mut Rng) -> Result<(bool, usize, Vec<u8>), String> {
    let len = match rng.below(4) {
        0 => rng.below(64) as usize,
        1 => rng.below(4096) as usize,
        _ => rng.below(MAX_MESSAGE as u64) as usize,
    };
    let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ id.wrapping_mul(0x9e37)) as u8).collect();
    let post = |s: &mut Side, wr: SendWr| s.dev.post_send(s.qpn, [wr]).map_err(|e| format!("post: {e:?}"));
    match rng.below(3) {
        0 => {
            x.mr.mem.write(0, &data);
            let recv = RecvWr { wr_id: id, sgl: vec![sge(&y.mr, 2 * AREA, AREA)] };
            y.dev.post_recv(y.qpn, recv).map_err(|e| format!("post_recv: {e:?}"))?;
            y.expected.insert(id, (WcOpcode::Recv, len as u32));
            x.expected.insert(id, (WcOpcode::Send, 0));
            post(x, SendWr::new(id, SendOp::Send, vec![sge(&x.mr, 0, len)]))?;
            Ok((false, 2 * AREA, data))
        }
        1 => {
            x.mr.mem.write(0, &data);
            let at = Remote { addr: y.mr.addr + AREA as u64, rkey: y.mr.rkey };
            x.expected.insert(id, (WcOpcode::RdmaWrite, 0));
            post(x, SendWr::new(id, SendOp::Write(at), vec![sge(&x.mr, 0, len)]))?;
            Ok((false, AREA, data))
        }
        _ => {
            y.mr.mem.write(0, &data);
            let from = Remote { addr: y.mr.addr, rkey: y.mr.rkey };
            x.expected.insert(id, (WcOpcode::RdmaRead, len as u32));
            post(x, SendWr::new(id, SendOp::Read(from), vec![sge(&x.mr, AREA, len)]))?;
            Ok((true, AREA, data))
        }
    }
}

/// Every completion since the last look matches a posted request, once.
fn check_completions(s: &mut Side, name: &str) -> Result<usize, String> {
    let mut n = 0;
    for (cq, wcs) in s.dev.take_completions() {
        if cq != s.cq {
            return Err(format!("{name}: a completion on CQ {cq}"));
        }
        for wc in wcs {
            let want = s.expected.remove(&wc.wr_id).ok_or_else(|| format!("{name}: unexpected {wc:?}"))?;
            let len_ok = matches!(want.0, WcOpcode::Send | WcOpcode::RdmaWrite) || wc.byte_len == want.1;
            if wc.status != WcStatus::Success || wc.opcode != want.0 || !len_ok {
                return Err(format!("{name}: {wc:?}, expected {want:?}"));
            }
            n += 1;
        }
    }
    Ok(n)
}

/// Runs one seed.
pub fn run(seed: u64) -> Result<IwarpReport, String> {
    let mut rng = Rng::new(seed);
    let policies = [CrcPolicy::Off, CrcPolicy::OnRequest, CrcPolicy::Required];
    let (crc_a, crc_b) = (policies[rng.below(3) as usize], policies[rng.below(3) as usize]);
    let agree =
        !matches!((crc_a, crc_b), (CrcPolicy::Off, CrcPolicy::Required) | (CrcPolicy::Required, CrcPolicy::Off));
    let mut a = side(seed.wrapping_mul(2) + 1, crc_a, &mut rng);
    let mut b = side(seed.wrapping_mul(2) + 2, crc_b, &mut rng);
    let window = [64, 1460, 16 * 1024, 256 * 1024][rng.below(4) as usize];
    let mss = [1460, 8948, 65483][rng.below(3) as usize];
    let mut wire = Wire { rng: Rng::new(seed ^ 0x5eed), window, mss, now_ns: 0, turns: 0 };
    let mut report = IwarpReport::default();
    if !connect(&mut a, &mut b, &mut wire, agree).map_err(|e| format!("seed {seed}: {e}"))? {
        report.turns = wire.turns;
        return Ok(report);
    }
    for id in 1..=(10 + rng.below(30)) {
        let forward = rng.below(2) == 0;
        let (x, y) = if forward { (&mut a, &mut b) } else { (&mut b, &mut a) };
        let (at_x, off, data) = post_one(x, y, id, &mut rng).map_err(|e| format!("seed {seed}: {e}"))?;
        wire.settle(&mut a, &mut b).map_err(|e| format!("seed {seed}, wr {id}: {e}"))?;
        report.completions += check_completions(&mut a, "a").map_err(|e| format!("seed {seed}: {e}"))?;
        report.completions += check_completions(&mut b, "b").map_err(|e| format!("seed {seed}: {e}"))?;
        let holder = match (forward, at_x) {
            (true, true) | (false, false) => &a,
            _ => &b,
        };
        let mut got = vec![0u8; data.len()];
        holder.mr.mem.read(off, &mut got);
        if got != data {
            return Err(format!("seed {seed}, wr {id}: {} bytes arrived wrong", data.len()));
        }
        report.bytes += data.len() as u64;
    }
    if !(a.expected.is_empty() && b.expected.is_empty()) {
        return Err(format!("seed {seed}: never completed: {:?} {:?}", a.expected, b.expected));
    }
    close(&mut a, &mut b).map_err(|e| format!("seed {seed}: {e}"))?;
    report.turns = wire.turns;
    Ok(report)
}

/// `b` has a receive posted when `a`'s stream closes: `b`'s QP goes to ERR and the
/// receive completes flushed, once; the driver is told to close the stream.
fn close(a: &mut Side, b: &mut Side) -> Result<(), String> {
    b.dev.post_recv(b.qpn, RecvWr { wr_id: 999, sgl: vec![sge(&b.mr, 2 * AREA, 64)] }).map_err(|e| format!("{e:?}"))?;
    b.dev.on_tcp_closed(b.conn, "the peer closed");
    let flushed: Vec<_> = b.dev.take_completions().into_iter().flat_map(|(_, w)| w).collect();
    let ok = flushed.len() == 1 && flushed[0].wr_id == 999 && flushed[0].status == WcStatus::WrFlushErr;
    if !ok || b.dev.qp_state(b.qpn) != Some(QpState::Err) || b.dev.take_closed() != vec![b.conn] {
        return Err(format!("close: {flushed:?}, state {:?}", b.dev.qp_state(b.qpn)));
    }
    let _ = a;
    Ok(())
}
