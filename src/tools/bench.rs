//! The measuring loops of the perftest-style tools, over the verbs API. They follow
//! perftest's data path so that a softrdma tool can face `ib_write_bw` & co.: each side's
//! buffer holds a send area and a receive area per QP of `max(size, 4096)` bytes, the key
//! message names the receive area, and the latency ping-pongs write an iteration counter
//! into the last byte of each message.

use super::oob::Dest;
use crate::verbs::*;
use std::time::{Duration, Instant};

/// The seven tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA WRITE bandwidth.
    WriteBw,
    /// RDMA READ bandwidth.
    ReadBw,
    /// SEND bandwidth.
    SendBw,
    /// Atomic fetch-and-add rate.
    AtomicBw,
    /// RDMA WRITE ping-pong latency.
    WriteLat,
    /// RDMA READ latency.
    ReadLat,
    /// SEND ping-pong latency.
    SendLat,
}

impl Test {
    /// True for the latency tests.
    pub fn is_latency(self) -> bool {
        matches!(self, Test::WriteLat | Test::ReadLat | Test::SendLat)
    }
    /// perftest's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW",
            Test::ReadBw => "RDMA_Read BW",
            Test::SendBw => "Send BW",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW",
            Test::WriteLat => "RDMA_Write Latency",
            Test::ReadLat => "RDMA_Read Latency",
            Test::SendLat => "Send Latency",
        }
    }
}

/// perftest's `-A`: which atomic `atomic-bw` posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtomicKind {
    /// `FETCH_AND_ADD` (perftest's default): add 1.
    #[default]
    FetchAdd,
    /// `CMP_AND_SWAP`: compare with 0, swap in 1.
    CmpSwap,
}

impl std::str::FromStr for AtomicKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "FETCH_AND_ADD" => Ok(AtomicKind::FetchAdd),
            "CMP_AND_SWAP" => Ok(AtomicKind::CmpSwap),
            other => Err(format!("atomic type {other:?}: CMP_AND_SWAP or FETCH_AND_ADD")),
        }
    }
}

/// What a run measures.
#[derive(Debug, Clone)]
pub struct Params {
    /// The test.
    pub test: Test,
    /// Message size, bytes.
    pub size: usize,
    /// Iterations per QP (ignored with `duration`).
    pub iters: u64,
    /// Run for this long instead of a number of iterations.
    pub duration: Option<Duration>,
    /// QPs.
    pub qps: usize,
    /// Path MTU.
    pub mtu: Mtu,
    /// Outstanding requests per QP (bandwidth tests).
    pub tx_depth: usize,
    /// Receives posted per QP (SEND tests).
    pub rx_depth: usize,
    /// A signaled request every this many (bandwidth tests).
    pub cq_mod: usize,
    /// Largest size the buffer must hold (for `-a`).
    pub max_size: usize,
    /// Print a progress line on long runs.
    pub progress: bool,
    /// The atomic `atomic-bw` posts.
    pub atomic: AtomicKind,
    /// Bandwidth tests: every QP sends from the first QP's area, so that the run touches
    /// the memory one QP does whatever the QP count (with [`into_first_area`], every QP
    /// writes into one remote area too). Off: an area per QP, as perftest.
    pub one_area: bool,
}

impl Params {
    /// perftest's defaults for `test`.
    pub fn defaults(test: Test) -> Params {
        let lat = test.is_latency();
        Params {
            test,
            size: match test {
                Test::AtomicBw => 8,
                _ if lat => 2,
                _ => 65536,
            },
            iters: if lat { 1000 } else { 5000 },
            duration: None,
            qps: 1,
            mtu: Mtu::M4096,
            tx_depth: if lat { 1 } else { 128 },
            rx_depth: 512,
            cq_mod: 100,
            max_size: 0,
            progress: false,
            atomic: AtomicKind::FetchAdd,
            one_area: false,
        }
    }

    /// The title perftest prints for the run (`Atomic CMP_AND_SWAP BW`, ...).
    pub fn title(&self) -> &'static str {
        match (self.test, self.atomic) {
            (Test::AtomicBw, AtomicKind::CmpSwap) => "Atomic CMP_AND_SWAP BW",
            (test, _) => test.name(),
        }
    }

    /// perftest's `BUFF_SIZE`: each area holds a message and at least a page.
    pub fn area_bytes(&self) -> usize {
        self.max_size.max(self.size).max(4096)
    }
}

/// One side's resources: a PD, CQs, one buffer and the QPs.
pub struct Endpoint<'a> {
    /// The device.
    pub ctx: &'a Context,
    _pd: ProtectionDomain,
    /// Send completions.
    pub cq: CompletionQueue,
    /// Receive completions.
    pub rcq: CompletionQueue,
    /// The buffer: a send area then a receive area per QP.
    pub mr: MemoryRegion,
    /// The QPs.
    pub qps: Vec<QueuePair>,
    area: usize,
    psns: Vec<u32>,
    /// SEND bandwidth over iWARP: perftest's receive credits (below).
    credits: bool,
}

/// perftest's SEND bandwidth over iWARP, where a Send without a posted receive ends the
/// connection: the receiver RDMA-Writes its count of receives (a native-endian u32) into
/// the sender's credit word every `rx_depth / 3` messages, and the sender keeps fewer than
/// `rx_depth` messages beyond the last credit. The key messages carry the credit word's
/// rkey and address instead of the buffer's. The words follow the QP areas: one control
/// word per QP (what is written), then one credit word per QP (what is written into).
impl Endpoint<'_> {
    fn credit_base(&self) -> usize {
        2 * self.qps.len() * self.area
    }

    fn credit(&self, q: usize) -> u64 {
        let mut w = [0u8; 4];
        self.mr.read(self.credit_base() + (self.qps.len() + q) * 4, &mut w);
        u64::from(u32::from_le_bytes(w))
    }

    /// Tells the sender on QP `q` that `count` messages have been received.
    fn post_credit(&self, q: usize, rem: &Dest, count: u64) -> Result<(), String> {
        let at = self.credit_base() + q * 4;
        self.mr.write(at, &(count as u32).to_le_bytes());
        let remote = Remote { addr: rem.vaddr, rkey: rem.rkey };
        let wr = SendWr::new(CREDIT_WR | q as u64, SendOp::Write(remote), vec![self.mr.sge(at, 4)]);
        self.qps[q].post_send(wr).map_err(|e| format!("credit write: {e:?}"))
    }
}

/// The wr_id bit of credit writes.
const CREDIT_WR: u64 = 1 << 63;

impl<'a> Endpoint<'a> {
    /// Creates everything `p` needs on `ctx`.
    pub fn new(ctx: &'a Context, p: &Params) -> Result<Endpoint<'a>, VerbsError> {
        let pd = ctx.alloc_pd();
        let depth = p.tx_depth.max(p.rx_depth) * p.qps + 16;
        let cq = ctx.create_cq(depth);
        let rcq = ctx.create_cq(depth);
        let area = p.area_bytes();
        let mr = ctx.reg_mr(&pd, 2 * p.qps * area + 8 * p.qps, Access::ALL)?;
        let caps = QpCaps { max_send_wr: p.tx_depth.max(1) + 1, max_recv_wr: p.rx_depth.max(1), max_sge: 1 };
        let mut qps = Vec::new();
        let mut psns = Vec::new();
        for _ in 0..p.qps {
            qps.push(ctx.create_qp(&pd, &cq, &rcq, QpType::Rc, caps, None)?);
            psns.push(ctx.random_psn());
        }
        let credits = p.test == Test::SendBw && ctx.transport() == crate::verbs::Transport::Iwarp;
        Ok(Endpoint { ctx, _pd: pd, cq, rcq, mr, qps, area, psns, credits })
    }

    /// This side's key messages, one per QP.
    pub fn dests(&self, gid_index: u8) -> Vec<Dest> {
        let gid = self.ctx.gid(gid_index).unwrap_or_default();
        let n = self.qps.len();
        (0..n)
            .map(|i| Dest {
                lid: 0,
                out_reads: 128,
                qpn: self.qps[i].qp_num(),
                psn: self.psns[i],
                rkey: self.mr.rkey(),
                vaddr: self.mr.addr()
                    + if self.credits { self.credit_base() + (n + i) * 4 } else { (n + i) * self.area } as u64,
                gid,
                srqn: 0,
            })
            .collect()
    }

    /// Connects each QP to the peer's.
    pub fn connect(&self, theirs: &[Dest], mtu: Mtu) -> Result<(), VerbsError> {
        for (i, (qp, d)) in self.qps.iter().zip(theirs).enumerate() {
            qp.connect_rc(d.gid, d.qpn, d.psn, self.psns[i], mtu)?;
            // As perftest: as many READs outstanding as the peer serves at once (4 KiB
            // READs moved 0.38x plain UDP at 16 on loopback, 0.81-1.01x at 128).
            let ord = d.out_reads.clamp(1, 128) as u8;
            qp.modify(&QpAttr { max_rd_atomic: Some(ord), ..QpAttr::default() })?;
        }
        Ok(())
    }

    fn send_sge(&self, q: usize, size: usize) -> Sge {
        self.mr.sge(q * self.area, size as u32)
    }

    fn recv_offset(&self, q: usize) -> usize {
        (self.qps.len() + q) * self.area
    }
}

/// A bandwidth result.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BwResult {
    /// Message size.
    pub size: usize,
    /// Messages completed (all QPs).
    pub iters: u64,
    /// Bytes per second over the whole run.
    pub avg_bytes_per_s: f64,
    /// Bytes per second over the best tenth of the run.
    pub peak_bytes_per_s: f64,
    /// Messages per second.
    pub msg_per_s: f64,
}

/// Turns (time, messages done) samples into a result.
fn bw_result(size: usize, samples: &[(Instant, u64)]) -> BwResult {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else { return BwResult::default() };
    let secs = last.0.duration_since(first.0).as_secs_f64().max(1e-9);
    let done = last.1;
    let avg = done as f64 * size as f64 / secs;
    let window = secs / 10.0;
    let mut peak = avg;
    let mut j = 0;
    for i in 0..samples.len() {
        while j < samples.len() && samples[j].0.duration_since(samples[i].0).as_secs_f64() < window {
            j += 1;
        }
        if j == samples.len() {
            break;
        }
        let dt = samples[j].0.duration_since(samples[i].0).as_secs_f64();
        peak = peak.max((samples[j].1 - samples[i].1) as f64 * size as f64 / dt);
    }
    BwResult { size, iters: done, avg_bytes_per_s: avg, peak_bytes_per_s: peak, msg_per_s: done as f64 / secs }
}

fn work_request(p: &Params, ep: &Endpoint<'_>, q: usize, rem: &Dest, size: usize, id: u64) -> SendWr {
    let test = p.test;
    let remote = Remote { addr: rem.vaddr, rkey: rem.rkey };
    let op = match test {
        Test::WriteBw | Test::WriteLat => SendOp::Write(remote),
        Test::ReadBw | Test::ReadLat => SendOp::Read(remote),
        Test::AtomicBw if p.atomic == AtomicKind::CmpSwap => SendOp::CompareSwap(remote, 0, 1),
        Test::AtomicBw => SendOp::FetchAdd(remote, 1),
        Test::SendBw | Test::SendLat => SendOp::Send,
    };
    let len = if test == Test::AtomicBw { 8 } else { size };
    SendWr::new(id, op, vec![ep.send_sge(if p.one_area { 0 } else { q }, len)])
}

/// The peer's key messages `dests` with every QP's address the first QP's: the remote
/// side of [`Params::one_area`].
pub fn into_first_area(mut dests: Vec<Dest>) -> Vec<Dest> {
    if let Some(first) = dests.first().map(|d| d.vaddr) {
        dests.iter_mut().for_each(|d| d.vaddr = first);
    }
    dests
}

/// Prints a progress line on stderr about once a second.
struct Progress {
    on: bool,
    start: Instant,
    next: Instant,
}

impl Progress {
    fn new(on: bool) -> Self {
        let now = Instant::now();
        Progress { on, start: now, next: now + Duration::from_secs(2) }
    }
    fn tick(&mut self, bytes: u64) {
        if !self.on || Instant::now() < self.next {
            return;
        }
        self.next += Duration::from_secs(1);
        let secs = self.start.elapsed().as_secs_f64();
        eprint!("\r {secs:6.1} s  {:10.2} MB/sec ", bytes as f64 / secs / f64::from(1 << 20));
    }
    fn done(&self) {
        if self.on && Instant::now() >= self.start + Duration::from_secs(2) {
            eprintln!();
        }
    }
}

/// The requester side of WRITE, READ, SEND and atomic bandwidth.
pub fn run_bw_client(ep: &Endpoint<'_>, rem: &[Dest], p: &Params) -> Result<BwResult, String> {
    let nq = ep.qps.len();
    let mut st = BwClient::new(nq, p);
    let mut samples = vec![(Instant::now(), 0u64)];
    let mut progress = Progress::new(p.progress);
    let mut stalled_since: Option<Instant> = None;
    // The QPs to post on: all at first, then those whose requests completed (or all
    // again while waiting for credits, which arrive without completions).
    let mut to_post: Vec<usize> = (0..nq).collect();
    let mut wcs = Vec::new();
    let mut busy = ep.ctx.busy_poll();
    loop {
        for q in to_post.drain(..) {
            st.post_more(ep, rem, p, q)?;
        }
        if st.finished() {
            break;
        }
        // Waiting for credit, nothing may complete: the credit words are looked at with
        // the CQ, so that a credit is used as soon as its WRITE lands.
        let mut found = None;
        busy.until(
            || {
                found = ep.cq.poll_one();
                found.is_some() || (ep.credits && st.credit_came(ep, p))
            },
            Duration::from_secs(1),
        );
        let Some(first) = found else {
            if stalled_since.get_or_insert_with(Instant::now).elapsed() < Duration::from_secs(30) {
                to_post.extend(0..nq);
                continue;
            }
            return Err(format!("no completion for 30 s ({} of {} done)", st.total_done, st.total_posted));
        };
        stalled_since = None;
        wcs.clear();
        wcs.push(first);
        wcs.extend(ep.cq.poll(nq.clamp(16, 256)));
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!("completion with error: {:?} (wr {:#x})", wc.status, wc.wr_id));
            }
            let q = (wc.wr_id >> 48) as usize;
            st.completed(q, wc.wr_id & ((1 << 48) - 1));
            to_post.push(q);
        }
        if ep.credits {
            to_post.clear();
            to_post.extend(0..nq);
        }
        samples.push((Instant::now(), st.total_done));
        progress.tick(st.total_done * p.size as u64);
    }
    progress.done();
    Ok(bw_result(p.size, &samples))
}

/// The bandwidth client's count of each QP's requests, and totals kept as they change,
/// so that a completion costs the same with a thousand QPs as with one.
struct BwClient {
    posted: Vec<u64>,
    done: Vec<u64>,
    signaled: Vec<u64>,
    total_posted: u64,
    total_done: u64,
    /// QPs with a signaled request not yet completed.
    awaiting: usize,
    /// QPs with requests left to post (a run of `iters`), or none once the time is up.
    open: usize,
    end: Option<Instant>,
    cq_mod: u64,
}

impl BwClient {
    fn new(nq: usize, p: &Params) -> BwClient {
        let end = p.duration.map(|d| Instant::now() + d);
        let open = if end.is_none() && p.iters == 0 { 0 } else { nq };
        BwClient {
            posted: vec![0; nq],
            done: vec![0; nq],
            signaled: vec![0; nq],
            total_posted: 0,
            total_done: 0,
            awaiting: 0,
            open,
            end,
            cq_mod: p.cq_mod.clamp(1, p.tx_depth.max(1)) as u64,
        }
    }

    /// Whether QP `q` may post request number `posted + 1`.
    fn wants_more(&self, p: &Params, q: usize) -> bool {
        self.wants_more_at(p, q, Instant::now())
    }

    /// As [`BwClient::wants_more`], at time `now`.
    fn wants_more_at(&self, p: &Params, q: usize, now: Instant) -> bool {
        self.end.map_or(self.posted[q] < p.iters, |e| now < e)
    }

    /// Whether QP `q`'s receiver has room for one more message, by the credit it wrote.
    fn has_credit(&self, ep: &Endpoint<'_>, p: &Params, q: usize) -> bool {
        self.posted[q] + 1 - ep.credit(q).min(self.posted[q]) < p.rx_depth as u64
    }

    /// Whether a QP held back by its credit alone may post again (looked at between two
    /// looks for input, so the clock is read once for all the QPs).
    fn credit_came(&self, ep: &Endpoint<'_>, p: &Params) -> bool {
        let now = Instant::now();
        (0..self.posted.len()).any(|q| {
            self.posted[q] - self.done[q] < p.tx_depth as u64
                && self.wants_more_at(p, q, now)
                && self.has_credit(ep, p, q)
        })
    }

    /// Posts on QP `q` as many requests as its depth (and credits) allow.
    fn post_more(&mut self, ep: &Endpoint<'_>, rem: &[Dest], p: &Params, q: usize) -> Result<(), String> {
        let mut batch = Vec::new();
        let was_awaiting = self.done[q] < self.signaled[q];
        while self.posted[q] - self.done[q] < p.tx_depth as u64 && self.wants_more(p, q) {
            if ep.credits && !self.has_credit(ep, p, q) {
                break;
            }
            let n = self.posted[q] + 1;
            let mut wr = work_request(p, ep, q, &rem[q], p.size, ((q as u64) << 48) | n);
            wr.signaled = n.is_multiple_of(self.cq_mod) || (self.end.is_none() && n == p.iters);
            if wr.signaled {
                self.signaled[q] = n;
            }
            batch.push(wr);
            self.posted[q] = n;
            self.total_posted += 1;
            if self.end.is_none() && n == p.iters {
                self.open -= 1;
            }
        }
        if self.end.is_some_and(|e| Instant::now() >= e) {
            self.open = 0;
        }
        if !was_awaiting && self.done[q] < self.signaled[q] {
            self.awaiting += 1;
        }
        if !batch.is_empty() {
            ep.qps[q].post_send_batch(batch).map_err(|e| format!("post_send: {e:?}"))?;
        }
        Ok(())
    }

    /// QP `q` completed its requests up to number `n`.
    fn completed(&mut self, q: usize, n: u64) {
        let was_awaiting = self.done[q] < self.signaled[q];
        self.total_done += n.saturating_sub(self.done[q]);
        self.done[q] = self.done[q].max(n);
        if was_awaiting && self.done[q] >= self.signaled[q] {
            self.awaiting -= 1;
        }
    }

    /// Nothing more to post and every signaled request completed (a timed run's
    /// unsignaled tail completes without being waited for).
    fn finished(&self) -> bool {
        self.open == 0 && self.awaiting == 0
    }
}

/// The responder side of SEND bandwidth: keeps receives posted and counts messages.
/// Receives are posted ([`SendServer::post`]) before the handshake that lets the client go.
pub struct SendServer(());

impl SendServer {
    /// Posts `rx_depth` receives on every QP.
    pub fn post(ep: &Endpoint<'_>, p: &Params) -> Result<SendServer, String> {
        for (q, qp) in ep.qps.iter().enumerate() {
            for i in 0..p.rx_depth {
                let sge = ep.mr.sge(ep.recv_offset(q), p.size as u32);
                qp.post_recv(RecvWr { wr_id: ((q as u64) << 48) | i as u64, sgl: vec![sge] })
                    .map_err(|e| format!("post_recv: {e:?}"))?;
            }
        }
        Ok(SendServer(()))
    }

    /// Counts the client's messages, reposting each receive (and, over iWARP, giving
    /// credit to the client's keys `rem`).
    pub fn run(self, ep: &Endpoint<'_>, rem: &[Dest], p: &Params) -> Result<BwResult, String> {
        run_bw_send_server(ep, rem, p)
    }
}

fn run_bw_send_server(ep: &Endpoint<'_>, rem: &[Dest], p: &Params) -> Result<BwResult, String> {
    let nq = ep.qps.len();
    let want = p.iters * nq as u64;
    let mut got = 0u64;
    let mut per_qp = vec![0u64; nq];
    let every = (p.rx_depth / 3).max(1) as u64;
    let mut samples = Vec::new();
    let idle = if p.duration.is_some() { Duration::from_secs(1) } else { Duration::from_secs(30) };
    let mut busy = ep.ctx.busy_poll();
    while p.duration.is_some() || got < want {
        let Some(wc) = busy.next_completion(&ep.rcq, idle) else {
            if p.duration.is_some() && got > 0 {
                break;
            }
            return Err(format!("no message for {} s ({got} of {want} received)", idle.as_secs()));
        };
        if wc.status != WcStatus::Success {
            return Err(format!("receive completion with error: {:?}", wc.status));
        }
        got += 1;
        samples.push((Instant::now(), got));
        let q = (wc.wr_id >> 48) as usize;
        let sge = ep.mr.sge(ep.recv_offset(q), p.size as u32);
        ep.qps[q].post_recv(RecvWr { wr_id: wc.wr_id, sgl: vec![sge] }).map_err(|e| format!("post_recv: {e:?}"))?;
        per_qp[q] += 1;
        if ep.credits && per_qp[q].is_multiple_of(every) {
            if let Some(r) = rem.get(q) {
                ep.post_credit(q, r, per_qp[q])?;
            }
        }
        for wc in ep.cq.poll(64) {
            if wc.status != WcStatus::Success {
                return Err(format!("credit write completed with {:?}", wc.status));
            }
        }
    }
    // Rates count from the first message, which started the clock.
    if let Some(first) = samples.first_mut() {
        first.1 = 0;
        for s in samples.iter_mut().skip(1) {
            s.1 -= 1;
        }
    }
    let mut r = bw_result(p.size, &samples);
    r.iters = got;
    Ok(r)
}

/// A latency result: one-way times (half round trips for the ping-pongs), µs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatResult {
    /// Message size.
    pub size: usize,
    /// Samples, µs, sorted.
    pub usec: Vec<f64>,
}

impl LatResult {
    fn pct(&self, q: f64) -> f64 {
        if self.usec.is_empty() {
            return 0.0;
        }
        let i = ((self.usec.len() as f64 - 1.0) * q).round() as usize;
        self.usec[i.min(self.usec.len() - 1)]
    }
    /// Minimum.
    pub fn min(&self) -> f64 {
        self.pct(0.0)
    }
    /// Maximum.
    pub fn max(&self) -> f64 {
        self.pct(1.0)
    }
    /// Median (perftest's "typical").
    pub fn typical(&self) -> f64 {
        self.pct(0.5)
    }
    /// Percentile `q` in 0..=1.
    pub fn percentile(&self, q: f64) -> f64 {
        self.pct(q)
    }
    /// Mean.
    pub fn avg(&self) -> f64 {
        self.usec.iter().sum::<f64>() / self.usec.len().max(1) as f64
    }
    /// Standard deviation.
    pub fn stdev(&self) -> f64 {
        let m = self.avg();
        (self.usec.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / self.usec.len().max(1) as f64).sqrt()
    }
    /// Takes in the samples of another run of the same test, keeping them sorted.
    pub fn merge(&mut self, other: LatResult) {
        self.size = other.size;
        self.usec.extend(other.usec);
        self.usec.sort_by(f64::total_cmp);
    }
}

/// The sorted times between successive `posted` instants (halved for a ping-pong's
/// one-way time), µs.
pub(super) fn lat_result(size: usize, posted: &[Instant], halve: bool) -> LatResult {
    let div = if halve { 2.0 } else { 1.0 };
    let mut usec: Vec<f64> = posted.windows(2).map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e6 / div).collect();
    usec.sort_by(f64::total_cmp);
    LatResult { size, usec }
}

/// The WRITE ping-pong (both sides run it; the server writes first, perftest's order):
/// each side writes the iteration number into the last byte of its message and waits
/// for the peer's.
pub fn run_lat_write(ep: &Endpoint<'_>, rem: &Dest, p: &Params, server: bool) -> Result<LatResult, String> {
    let mut busy = ep.ctx.busy_poll();
    let size = p.size.max(1);
    let poll_at = ep.recv_offset(0) + size - 1;
    let mut posted = Vec::with_capacity(p.iters as usize);
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut byte = [0u8; 1];
    while scnt < p.iters || rcnt < p.iters {
        if rcnt < p.iters && !(scnt == 0 && server) {
            rcnt += 1;
            let want = rcnt as u8;
            let seen = busy.until(|| ep.mr.read(poll_at, &mut byte) && byte[0] == want, Duration::from_secs(10));
            if !seen {
                return Err(format!("the peer's write {rcnt} did not arrive within 10 s"));
            }
        }
        if scnt < p.iters {
            posted.push(Instant::now());
            scnt += 1;
            ep.mr.write(size - 1, &[scnt as u8]);
            ep.qps[0].post_send(work_request(p, ep, 0, rem, size, scnt)).map_err(|e| format!("{e:?}"))?;
            let wc = spin_poll(&mut busy, &ep.cq).ok_or("no WRITE completion within 10 s")?;
            if wc.status != WcStatus::Success {
                return Err(format!("WRITE completed with {:?}", wc.status));
            }
        }
    }
    Ok(lat_result(size, &posted, true))
}

fn post_lat_recv(ep: &Endpoint<'_>, size: usize, id: u64) -> Result<(), String> {
    let sge = ep.mr.sge(ep.recv_offset(0), size as u32);
    ep.qps[0].post_recv(RecvWr { wr_id: id, sgl: vec![sge] }).map_err(|e| format!("post_recv: {e:?}"))
}

/// The SEND ping-pong: the client sends first; each side answers every receive. Receives
/// are posted ([`SendLat::post`]) before the handshake that starts the run.
pub struct SendLat(());

impl SendLat {
    /// Posts the receives.
    pub fn post(ep: &Endpoint<'_>, p: &Params) -> Result<SendLat, String> {
        for i in 0..p.rx_depth.min(p.iters as usize + 1).max(1) {
            post_lat_recv(ep, p.size, i as u64)?;
        }
        Ok(SendLat(()))
    }

    /// Runs the ping-pong.
    pub fn run(self, ep: &Endpoint<'_>, rem: &Dest, p: &Params, server: bool) -> Result<LatResult, String> {
        run_lat_send(ep, rem, p, server)
    }
}

fn run_lat_send(ep: &Endpoint<'_>, rem: &Dest, p: &Params, server: bool) -> Result<LatResult, String> {
    let mut busy = ep.ctx.busy_poll();
    let size = p.size;
    let mut posted = Vec::with_capacity(p.iters as usize);
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    while scnt < p.iters || rcnt < p.iters {
        if rcnt < p.iters && (server || scnt != 0) {
            let wc = spin_poll(&mut busy, &ep.rcq).ok_or("no SEND from the peer within 10 s")?;
            if wc.status != WcStatus::Success {
                return Err(format!("receive completed with {:?}", wc.status));
            }
            rcnt += 1;
            post_lat_recv(ep, size, wc.wr_id)?;
        }
        if scnt < p.iters {
            posted.push(Instant::now());
            scnt += 1;
            ep.qps[0].post_send(work_request(p, ep, 0, rem, size, scnt)).map_err(|e| format!("{e:?}"))?;
            let wc = spin_poll(&mut busy, &ep.cq).ok_or("no SEND completion within 10 s")?;
            if wc.status != WcStatus::Success {
                return Err(format!("SEND completed with {:?}", wc.status));
            }
        }
    }
    Ok(lat_result(size, &posted, true))
}

/// READ latency: one READ at a time, each timed whole.
pub fn run_lat_read(ep: &Endpoint<'_>, rem: &Dest, p: &Params) -> Result<LatResult, String> {
    let mut busy = ep.ctx.busy_poll();
    let mut posted = Vec::with_capacity(p.iters as usize + 1);
    for i in 0..p.iters {
        posted.push(Instant::now());
        ep.qps[0].post_send(work_request(p, ep, 0, rem, p.size, i)).map_err(|e| format!("{e:?}"))?;
        let wc = spin_poll(&mut busy, &ep.cq).ok_or("no READ completion within 10 s")?;
        if wc.status != WcStatus::Success {
            return Err(format!("READ completed with {:?}", wc.status));
        }
    }
    posted.push(Instant::now());
    Ok(lat_result(p.size, &posted, false))
}

/// One completion, spinning (with yields) for at most 10 s.
fn spin_poll(busy: &mut BusyPoll<'_>, cq: &CompletionQueue) -> Option<Wc> {
    busy.next_completion(cq, Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::{work_request, Endpoint, LatResult, Params, Test};
    use crate::verbs::{Context, OpenConfig};

    #[test]
    fn one_area_sends_every_qp_from_the_first_qps_area() {
        let mut cfg = OpenConfig::new(std::net::Ipv4Addr::LOCALHOST.into());
        cfg.port = 0;
        let ctx = Context::open(cfg).expect("a device on loopback");
        let mut p = Params::defaults(Test::WriteBw);
        p.qps = 3;
        let ep = Endpoint::new(&ctx, &p).expect("three QPs");
        let dests = ep.dests(0);
        let from = |p: &Params, q: usize| work_request(p, &ep, q, &dests[q], 4096, 1).sgl[0].addr;
        let base = ep.mr.addr();
        assert_eq!(from(&p, 2), base + 2 * 65536, "an area per QP, as perftest");
        let shared = Params { one_area: true, ..p.clone() };
        assert_eq!(from(&shared, 2), base, "every QP from the first area");
        assert_eq!(from(&shared, 0), from(&p, 0));
        let into_one = super::into_first_area(dests.clone());
        assert!(into_one.iter().all(|d| d.vaddr == dests[0].vaddr), "every QP into the first remote area");
        assert_ne!(dests[2].vaddr, dests[0].vaddr, "the peer's own key messages keep an area per QP");
    }

    #[test]
    fn merged_runs_take_the_median_of_all_their_samples() {
        let mut a = LatResult { size: 8, usec: vec![1.0, 2.0, 9.0] };
        a.merge(LatResult { size: 8, usec: vec![3.0, 4.0] });
        assert_eq!(a.usec, vec![1.0, 2.0, 3.0, 4.0, 9.0], "one sorted list");
        assert_eq!(a.typical(), 3.0);
        let mut empty = LatResult::default();
        empty.merge(a.clone());
        assert_eq!(empty, a, "merging into nothing is the run itself");
    }
}
