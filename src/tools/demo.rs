//! `softrdma demo`: two devices on this machine (127.0.0.1 and 127.0.0.2, no set-up, no
//! privileges) run the perftest loops, next to plain UDP measured on the same path in the
//! same run, so that every figure is also a ratio. Then the same over iWARP between two
//! iWARP devices on the same addresses, next to plain TCP on the same path.

use super::bench::{self, BwResult, Endpoint, LatResult, Params, Test};
use crate::transport::udp::ROCE_PORT;
use crate::transport::udp_floor;
use crate::verbs::{Context, Mtu, OpenConfig};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct DemoArgs {
    /// Also run this many QPs on one device (0: skip).
    pub qps: usize,
    /// Seconds per bandwidth row (roughly).
    pub seconds: f64,
    /// JSON instead of the table.
    pub json: bool,
    /// Only these rows (e.g. `write_lat`, `iwarp_send_bw`, `scale`); empty: every row.
    pub only: Vec<String>,
}

impl DemoArgs {
    /// Whether the rows named `key` are to run.
    pub fn wants(&self, key: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == key)
    }
}

pub(super) const A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
pub(super) const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Opens the two devices: on port 4791 when it is free, else on free ports.
fn open_pair() -> std::io::Result<(Context, Context)> {
    let open = |ip: Ipv4Addr, port: u16| {
        let mut c = OpenConfig::new(IpAddr::V4(ip));
        c.port = port;
        Context::open(c)
    };
    match (open(A, ROCE_PORT), open(B, ROCE_PORT)) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        _ => {
            let (a, b) = (open(A, 0)?, open(B, 0)?);
            a.set_peer_port(b.ip(), b.port());
            b.set_peer_port(a.ip(), a.port());
            Ok((a, b))
        }
    }
}

/// Plain UDP on the same path: one thread sends `size`-byte datagrams in batches, another
/// receives; bytes per second at the receiver.
pub fn udp_bandwidth(size: usize, secs: f64) -> std::io::Result<f64> {
    udp_bandwidth_on(UdpSocket::bind((A, 0))?, UdpSocket::bind((B, 0))?, size, secs)
}

/// As [`udp_bandwidth`], from socket `tx` to socket `rx` (made wherever the path is).
pub fn udp_bandwidth_on(tx: UdpSocket, rx: UdpSocket, size: usize, secs: f64) -> std::io::Result<f64> {
    let to = rx.local_addr()?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let buf = vec![0x5au8; size];
            let batch: Vec<(SocketAddr, &[u8])> = (0..32).map(|_| (to, &buf[..])).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = crate::transport::send_batch(&tx, &batch);
            }
        });
        let mut got = 0u64;
        let mut batch = crate::transport::RecvBatch::new(32, size + 64);
        let start = Instant::now();
        let mut first: Option<Instant> = None;
        while start.elapsed().as_secs_f64() < secs {
            let _ = crate::transport::wait_readable(
                &[std::os::fd::AsRawFd::as_raw_fd(&rx)],
                Some(Duration::from_millis(50)),
            );
            let n = batch.recv(std::os::fd::AsRawFd::as_raw_fd(&rx)).unwrap_or(0);
            if n > 0 && first.is_none() {
                first = Some(Instant::now());
                continue;
            }
            got += (0..batch.len()).filter_map(|i| batch.get(i)).map(|d| d.0.len() as u64).sum::<u64>();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = sender.join();
        let secs = first.map_or(1.0, |f| f.elapsed().as_secs_f64());
        Ok(got as f64 / secs)
    })
}

/// Receives one datagram, blocking, or spinning on a non-blocking socket (yielding now and
/// then, as the latency tools do).
fn recv_one(s: &UdpSocket, buf: &mut [u8], spin: bool) -> std::io::Result<usize> {
    if !spin {
        return s.recv(buf);
    }
    let start = Instant::now();
    for n in 0u64.. {
        match s.recv(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if n % 64 == 63 {
                    if start.elapsed() > Duration::from_secs(2) {
                        return Err(e);
                    }
                    std::thread::yield_now();
                }
            }
            other => return other,
        }
    }
    unreachable!("the loop returns")
}

/// Plain UDP ping-pong of `size` bytes between two threads, blocking in `recv` or spinning
/// (`spin`): one-way time (half the round trip), µs, as perftest reports latency.
pub fn udp_latency(size: usize, iters: usize, spin: bool) -> std::io::Result<LatResult> {
    udp_latency_on(UdpSocket::bind((A, 0))?, UdpSocket::bind((B, 0))?, size, iters, spin)
}

/// A ping-pong of turns of `sizes` with a RoCEv2 device's socket calls and none of its
/// work ([`udp_floor`]): one-way times, µs.
pub fn roce_calls_latency(sizes: &[usize], iters: usize) -> std::io::Result<LatResult> {
    Ok(bench::lat_result(8, &udp_floor::ping_pong(IpAddr::V4(A), IpAddr::V4(B), sizes, iters)?, true))
}

/// The latency baselines, measured in the run: plain UDP ping-pongs, and the kernel's
/// share of RoCEv2's ([`udp_floor`]).
#[derive(Default)]
struct LatBaselines {
    /// Plain UDP, both sides spinning: what the latency rows are a ratio to.
    spinning: LatResult,
    /// Plain UDP, blocking in recv.
    blocking: LatResult,
    /// A WRITE's turn with a device's socket calls.
    write_turn: LatResult,
    /// A READ's leg with a device's socket calls.
    read_leg: LatResult,
}

impl LatBaselines {
    /// The baselines measured once; the spinning ping-pong, which the latency rows are set
    /// against, is left to [`roce_rows`], which measures it in rounds with them.
    fn measure() -> Result<LatBaselines, String> {
        let e = |e: std::io::Error| format!("UDP baseline: {e}");
        Ok(LatBaselines {
            blocking: udp_latency(8, 20_000, false).map_err(e)?,
            spinning: LatResult::default(),
            write_turn: roce_calls_latency(udp_floor::WRITE_TURN, 20_000).map_err(e)?,
            read_leg: roce_calls_latency(udp_floor::READ_LEG, 20_000).map_err(e)?,
        })
    }
}

/// As [`udp_latency`], between sockets `a` and `b` (made wherever the path is).
pub fn udp_latency_on(a: UdpSocket, b: UdpSocket, size: usize, iters: usize, spin: bool) -> std::io::Result<LatResult> {
    let (to_a, to_b) = (a.local_addr()?, b.local_addr()?);
    for s in [&a, &b] {
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.set_nonblocking(spin)?;
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = vec![0u8; size.max(1)];
            for _ in 0..iters {
                if recv_one(&b, &mut buf, spin).is_err() {
                    return;
                }
                let _ = b.send_to(&buf[..size], to_a);
            }
        });
        let mut buf = vec![0u8; size.max(1)];
        let mut posted = Vec::with_capacity(iters + 1);
        for _ in 0..iters {
            posted.push(Instant::now());
            a.send_to(&buf[..size], to_b)?;
            recv_one(&a, &mut buf, spin)?;
        }
        posted.push(Instant::now());
        Ok(bench::lat_result(size, &posted, true))
    })
}

/// Connects `qps` QPs of endpoint `x` to those of `y`, in both directions.
fn connect(x: &Endpoint<'_>, y: &Endpoint<'_>, mtu: Mtu) -> Result<(), String> {
    let (dx, dy) = (x.dests(0), y.dests(0));
    x.connect(&dy, mtu).map_err(|e| format!("{e:?}"))?;
    y.connect(&dx, mtu).map_err(|e| format!("{e:?}"))
}

/// Iterations that take about `secs` at `bytes_per_s`.
pub(super) fn iters_for(size: usize, secs: f64, guess_bytes_per_s: f64) -> u64 {
    ((guess_bytes_per_s * secs / size as f64) as u64).clamp(200, 2_000_000)
}

/// One bandwidth row between the two devices at path MTU `mtu`, of about `secs` seconds at
/// `guess_bytes_per_s`.
pub fn rdma_bw_mtu(
    a: &Context,
    b: &Context,
    test: Test,
    size: usize,
    qps: usize,
    (secs, guess_bytes_per_s): (f64, f64),
    mtu: Mtu,
) -> Result<BwResult, String> {
    let mut p = Params::defaults(test);
    p.mtu = mtu;
    p.size = size;
    p.qps = qps;
    p.iters = iters_for(size, secs / qps as f64, guess_bytes_per_s);
    let (x, y) =
        (Endpoint::new(a, &p).map_err(|e| format!("{e:?}"))?, Endpoint::new(b, &p).map_err(|e| format!("{e:?}"))?);
    connect(&x, &y, p.mtu)?;
    bw_between(&x, &y, &p)
}

/// Runs one bandwidth test from connected endpoint `x` to `y` (SEND: `y` receives).
pub(super) fn bw_between(x: &Endpoint<'_>, y: &Endpoint<'_>, p: &Params) -> Result<BwResult, String> {
    if p.test == Test::SendBw {
        let server = bench::SendServer::post(y, p)?;
        // Timed from the client's first post to the server's last receive: the server's
        // own clock starts at its first completion, which may come in a burst with the rest.
        let start = Instant::now();
        return std::thread::scope(|s| {
            let h = s.spawn(|| server.run(y, &x.dests(0), p).map(|r| (r, Instant::now())));
            let c = bench::run_bw_client(x, &y.dests(0), p);
            let (mut srv, end) = h.join().map_err(|_| "server thread panicked".to_string())??;
            let secs = end.duration_since(start).as_secs_f64().max(1e-9);
            srv.avg_bytes_per_s = srv.iters as f64 * p.size as f64 / secs;
            srv.msg_per_s = srv.iters as f64 / secs;
            c.map(|_| srv)
        });
    }
    bench::run_bw_client(x, &y.dests(0), p)
}

/// One latency row between the two devices.
fn rdma_lat(a: &Context, b: &Context, test: Test, size: usize, iters: u64) -> Result<LatResult, String> {
    rdma_lat_mtu(a, b, test, size, iters, Mtu::M4096)
}

/// One latency row between the two devices at path MTU `mtu`.
pub fn rdma_lat_mtu(
    a: &Context,
    b: &Context,
    test: Test,
    size: usize,
    iters: u64,
    mtu: Mtu,
) -> Result<LatResult, String> {
    let mut p = Params::defaults(test);
    p.mtu = mtu;
    p.size = size;
    p.iters = iters;
    let (x, y) =
        (Endpoint::new(a, &p).map_err(|e| format!("{e:?}"))?, Endpoint::new(b, &p).map_err(|e| format!("{e:?}"))?);
    connect(&x, &y, p.mtu)?;
    lat_between(&x, &y, &p)
}

/// Runs one latency test between connected endpoints `x` (the client) and `y`.
pub(super) fn lat_between(x: &Endpoint<'_>, y: &Endpoint<'_>, p: &Params) -> Result<LatResult, String> {
    let (dx, dy) = (x.dests(0), y.dests(0));
    match p.test {
        Test::ReadLat => bench::run_lat_read(x, &dy[0], p),
        Test::WriteLat => std::thread::scope(|s| {
            let h = s.spawn(|| bench::run_lat_write(y, &dx[0], p, true));
            let c = bench::run_lat_write(x, &dy[0], p, false);
            h.join().map_err(|_| "peer thread panicked".to_string())?.and(c)
        }),
        _ => {
            let (px, py) = (bench::SendLat::post(x, p)?, bench::SendLat::post(y, p)?);
            std::thread::scope(|s| {
                let h = s.spawn(|| py.run(y, &dx[0], p, true));
                let c = px.run(x, &dy[0], p, false);
                h.join().map_err(|_| "peer thread panicked".to_string())?.and(c)
            })
        }
    }
}

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// [`idle_qp_bytes`] on two devices of their own (127.0.0.3 and 127.0.0.4, free ports), so
/// that the QPs made and destroyed leave nothing behind in the devices the rows use.
fn idle_qp_bytes_apart(n: usize) -> Result<f64, String> {
    let open = |ip: Ipv4Addr| {
        let mut c = OpenConfig::new(IpAddr::V4(ip));
        c.port = 0;
        Context::open(c).map_err(|e| format!("cannot open a device on {ip}: {e}"))
    };
    let (a, b) = (open(Ipv4Addr::new(127, 0, 0, 3))?, open(Ipv4Addr::new(127, 0, 0, 4))?);
    idle_qp_bytes(&a, &b, n)
}

/// Memory per idle connected QP: RSS growth over `n` QPs on each device, connected to each
/// other, with no registered memory.
fn idle_qp_bytes(a: &Context, b: &Context, n: usize) -> Result<f64, String> {
    let before = rss_bytes().ok_or("cannot read /proc/self/statm")?;
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(16), b.create_cq(16));
    let caps = crate::verbs::QpCaps::default();
    let mut keep = Vec::with_capacity(2 * n);
    for _ in 0..n {
        let qa = a.create_qp(&pa, &ca, &ca, crate::verbs::QpType::Rc, caps, None).map_err(|e| format!("{e:?}"))?;
        let qb = b.create_qp(&pb, &cb, &cb, crate::verbs::QpType::Rc, caps, None).map_err(|e| format!("{e:?}"))?;
        let (ga, gb) = (a.gid(0).unwrap_or_default(), b.gid(0).unwrap_or_default());
        qa.connect_rc(gb, qb.qp_num(), 1, 2, Mtu::M4096).map_err(|e| format!("{e:?}"))?;
        qb.connect_rc(ga, qa.qp_num(), 2, 1, Mtu::M4096).map_err(|e| format!("{e:?}"))?;
        keep.push(qa);
        keep.push(qb);
    }
    let after = rss_bytes().ok_or("cannot read /proc/self/statm")?;
    Ok(after.saturating_sub(before) as f64 / (2 * n) as f64)
}

pub(super) struct Row {
    pub(super) test: &'static str,
    pub(super) size: usize,
    pub(super) iters: u64,
    pub(super) value: f64,
    pub(super) baseline: f64,
}

/// The names of the RoCEv2 rows.
const ROCE_ROWS: [&str; 6] = ["write_bw", "read_bw", "send_bw", "write_lat", "read_lat", "send_lat"];

/// How many rounds the latency rows run in: each round runs the spinning UDP ping-pong
/// and then every latency row once, and a row and its baseline each take the samples of
/// all rounds. This host's speed drifts between seconds (in five consecutive demos the
/// UDP one-way time read 3.02-3.48 µs and a WRITE's 5.12-6.31 µs, each measured once), so
/// a ratio of two single runs made seconds apart says more about the drift than the path.
pub const LAT_ROUNDS: usize = 3;
/// Iterations of one latency row in one round.
pub(super) const LAT_ITERS_PER_ROUND: u64 = 2_000;
/// Iterations of the spinning UDP ping-pong in one round.
pub(super) const LAT_BASE_ITERS_PER_ROUND: usize = 10_000;

/// The RoCEv2 rows `args` asks for: bandwidth next to plain UDP, latency next to the
/// spinning UDP ping-pong (measured in rounds with them, into `base.spinning`).
fn roce_rows(
    a: &Context,
    b: &Context,
    args: &DemoArgs,
    udp_bw: f64,
    base: &mut LatBaselines,
) -> Result<RoceRows, String> {
    let mut bw = Vec::new();
    for (test, name) in [(Test::WriteBw, "write_bw"), (Test::ReadBw, "read_bw"), (Test::SendBw, "send_bw")] {
        for size in [4096, 65536, 1 << 20].into_iter().filter(|_| args.wants(name)) {
            // Sized by the UDP baseline, so a row lasts about `seconds`.
            let r = rdma_bw_mtu(a, b, test, size, 1, (args.seconds, udp_bw), Mtu::M4096)?;
            bw.push(Row { test: name, size, iters: r.iters, value: r.avg_bytes_per_s, baseline: udp_bw });
        }
    }
    // The latency rows (none, if none is asked for) in rounds with the ping-pong.
    let baseline = || udp_latency(8, LAT_BASE_ITERS_PER_ROUND, true).map_err(|e| format!("UDP baseline: {e}"));
    let run = |test, size| rdma_lat(a, b, test, size, LAT_ITERS_PER_ROUND);
    let (spinning, lat) = in_rounds(&lat_tests(args, &LAT_TESTS), baseline, run)?;
    base.spinning = spinning;
    Ok(RoceRows { bw, lat })
}

const LAT_TESTS: [(Test, &str); 3] =
    [(Test::WriteLat, "write_lat"), (Test::ReadLat, "read_lat"), (Test::SendLat, "send_lat")];

/// The latency rows `args` asks for among `tests`, each at 8 and 4096 bytes.
pub(super) fn lat_tests(args: &DemoArgs, tests: &[(Test, &'static str)]) -> Vec<(Test, &'static str, usize)> {
    tests
        .iter()
        .filter(|t| args.wants(t.1))
        .flat_map(|&(test, name)| [8, 4096].map(|size| (test, name, size)))
        .collect()
}

/// Runs `tests` in [`LAT_ROUNDS`] rounds, each round `baseline` once and then every test
/// once (`run`); returns the baseline's samples of all rounds and each test's row, its
/// samples of all rounds set against that baseline.
pub(super) fn in_rounds(
    tests: &[(Test, &'static str, usize)],
    mut baseline: impl FnMut() -> Result<LatResult, String>,
    mut run: impl FnMut(Test, usize) -> Result<LatResult, String>,
) -> Result<(LatResult, Vec<(Row, LatResult)>), String> {
    let mut base = LatResult::default();
    let mut runs = vec![LatResult::default(); tests.len()];
    for _ in 0..LAT_ROUNDS {
        base.merge(baseline()?);
        for (r, &(test, _, size)) in runs.iter_mut().zip(tests) {
            r.merge(run(test, size)?);
        }
    }
    let typical = base.typical();
    let rows = tests
        .iter()
        .zip(runs)
        .map(|(&(_, name, size), r)| {
            (Row { test: name, size, iters: r.usec.len() as u64, value: r.typical(), baseline: typical }, r)
        })
        .collect();
    Ok((base, rows))
}

struct RoceRows {
    bw: Vec<Row>,
    lat: Vec<(Row, LatResult)>,
}

/// Runs the demo and prints its table.
pub fn run(args: &DemoArgs) -> Result<(), String> {
    let (a, b) = open_pair().map_err(|e| format!("cannot open the two devices on 127.0.0.1/127.0.0.2: {e}"))?;
    // Memory per idle QP is RSS growth: measured before any other row frees memory that
    // the QPs would then reuse unseen.
    let scaled = args.qps > 0 && args.wants("scale");
    let idle = if scaled { Some(idle_qp_bytes_apart(args.qps)?) } else { None };
    let datagram = 4096 + 16; // a middle WRITE packet at MTU 4096: BTH, payload, ICRC
    let roce_rows_wanted = ROCE_ROWS.iter().any(|r| args.wants(r));
    let udp_bw = if roce_rows_wanted {
        udp_bandwidth(datagram, args.seconds).map_err(|e| format!("UDP baseline: {e}"))?
    } else {
        f64::NAN
    };
    let mut lat_base = if roce_rows_wanted { LatBaselines::measure()? } else { LatBaselines::default() };
    let roce = roce_rows(&a, &b, args, udp_bw, &mut lat_base)?;
    let scale = match idle {
        Some(idle) => {
            Some(scale_rows(&a, &b, args, idle).map_err(|e| format!("{e}\n{:?}\n{:?}", a.stats(), b.stats()))?)
        }
        None => None,
    };
    let stats = [a.stats(), b.stats()];
    let iw = if args.only.is_empty() || args.only.iter().any(|o| o.starts_with("iwarp_")) {
        Some(super::demo_iwarp::rows(args)?)
    } else {
        None
    };
    if args.json {
        let doc = json_doc(args, &roce, &lat_base, udp_bw, scale, &stats, &iw);
        println!("{doc}");
        return Ok(());
    }
    if roce_rows_wanted {
        print_table(&a, udp_bw, &lat_base, datagram, &roce.bw, &roce.lat);
    }
    if let Some(iw) = &iw {
        super::demo_iwarp::print(iw);
    }
    if let Some(Scale { idle, one, all, all_one_area }) = scale {
        let mb = |x: f64| x / f64::from(1 << 20);
        println!(
            " {} QPs on one device: {:.2} KiB per idle connected QP (registered memory excluded)",
            args.qps,
            idle / 1024.0
        );
        println!(
            " write_bw 65536 over {} QPs, an area each: {:.2} MB/sec, {:.2}x one QP ({:.2} MB/sec)",
            args.qps,
            mb(all),
            all / one,
            mb(one)
        );
        println!(
            " the same QPs all in one area (the memory one QP touches): {:.2} MB/sec, {:.2}x one QP",
            mb(all_one_area),
            all_one_area / one
        );
        println!("{}", "-".repeat(87));
    }
    let (s0, s1) = (&stats[0], &stats[1]);
    println!(
        " datagrams: {} sent, {} received, {} bad ICRC; retransmission timeouts {}, sequence NAKs {}, RNR NAKs {}",
        s0.tx_datagrams + s1.tx_datagrams,
        s0.rx_datagrams + s1.rx_datagrams,
        s0.rx_icrc_bad + s1.rx_icrc_bad,
        s0.engine.retransmit_timeouts + s1.engine.retransmit_timeouts,
        s0.engine.seq_naks_sent + s1.engine.seq_naks_sent,
        s0.engine.rnr_naks_sent + s1.engine.rnr_naks_sent
    );
    Ok(())
}

/// A latency baseline's typical time, or nothing when it was not measured.
fn baseline_us(r: &LatResult) -> Option<f64> {
    (!r.usec.is_empty()).then(|| r.typical())
}

/// The whole run as one JSON document.
fn json_doc(
    args: &DemoArgs,
    roce: &RoceRows,
    base: &LatBaselines,
    udp_bw: f64,
    scale: Option<Scale>,
    stats: &[crate::verbs::DeviceStats; 2],
    iw: &Option<super::demo_iwarp::IwarpRows>,
) -> serde_json::Value {
    let bw: Vec<_> = roce
        .bw
        .iter()
        .map(|r| {
            json!({"test": r.test, "bytes": r.size, "iterations": r.iters,
            "bw_avg_bytes_per_s": r.value, "udp_bytes_per_s": r.baseline, "ratio": r.value / r.baseline})
        })
        .collect();
    let lat: Vec<_> = roce
        .lat
        .iter()
        .map(|(r, l)| {
            json!({"test": r.test, "result": super::perf::lat_json(l),
            "udp_t_typical_us": r.baseline, "ratio": r.value / r.baseline})
        })
        .collect();
    let scale = scale.map(|s| {
        json!({"qps": args.qps, "idle_qp_bytes": s.idle, "one_qp_bytes_per_s": s.one, "all_qps_bytes_per_s": s.all,
            "ratio": s.all / s.one, "all_qps_one_area_bytes_per_s": s.all_one_area,
            "one_area_ratio": s.all_one_area / s.one})
    });
    json!({"iwarp": iw.as_ref().map(super::demo_iwarp::json), "udp_bytes_per_s": udp_bw, "udp_t_typical_us": baseline_us(&base.spinning),
        "udp_blocking_t_typical_us": baseline_us(&base.blocking),
        "udp_roce_calls_t_typical_us": baseline_us(&base.write_turn),
        "udp_roce_calls_single_t_typical_us": baseline_us(&base.read_leg), "bandwidth": bw, "latency": lat,
        "scale": scale, "retransmit_timeouts": stats[0].engine.retransmit_timeouts + stats[1].engine.retransmit_timeouts,
        "icrc_bad": stats[0].rx_icrc_bad + stats[1].rx_icrc_bad})
}

/// How many times the scale row measures one QP and all of them, alternating: this
/// machine's bandwidth drifts by a third between seconds, so each side's median over
/// interleaved rounds is compared rather than two single measurements.
const SCALE_ROUNDS: usize = 3;

/// The scale row's figures (bytes, bytes per second).
#[derive(Debug, Clone, Copy)]
struct Scale {
    /// Memory per idle connected QP.
    idle: f64,
    /// WRITE bandwidth over one QP.
    one: f64,
    /// Over every QP, each with an area of its own at both ends, as perftest's `-q`.
    all: f64,
    /// Over every QP, all in one area at both ends: the memory one QP touches, so the QPs'
    /// own cost apart from the caches a thousand areas overrun (a thousand 64 KiB areas
    /// are 64 MiB a side, written to and read from in turn).
    all_one_area: f64,
}

/// Memory per idle QP (measured first), then WRITE bandwidth over one QP, over
/// `args.qps` with an area each, and over them in one area, each the median of
/// [`SCALE_ROUNDS`] interleaved measurements.
fn scale_rows(a: &Context, b: &Context, args: &DemoArgs, idle: f64) -> Result<Scale, String> {
    let secs = args.seconds / SCALE_ROUNDS as f64;
    let mut p1 = Params::defaults(Test::WriteBw);
    let (x1, y1) =
        (Endpoint::new(a, &p1).map_err(|e| format!("{e:?}"))?, Endpoint::new(b, &p1).map_err(|e| format!("{e:?}"))?);
    connect(&x1, &y1, p1.mtu)?;
    // A short first run sizes the others.
    p1.iters = iters_for(65536, secs / 4.0, 3e8);
    let guess = bench::run_bw_client(&x1, &y1.dests(0), &p1)?.avg_bytes_per_s;
    p1.iters = iters_for(65536, secs, guess);
    let mut p = Params::defaults(Test::WriteBw);
    p.qps = args.qps;
    p.tx_depth = 2;
    p.cq_mod = 1;
    p.iters = p1.iters.div_ceil(args.qps as u64).max(4);
    let (x, y) =
        (Endpoint::new(a, &p).map_err(|e| format!("{e:?}"))?, Endpoint::new(b, &p).map_err(|e| format!("{e:?}"))?);
    connect(&x, &y, p.mtu)?;
    let shared = Params { one_area: true, ..p.clone() };
    let into_one = bench::into_first_area(y.dests(0));
    let (mut one, mut all, mut all_one_area) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..SCALE_ROUNDS {
        one.push(bench::run_bw_client(&x1, &y1.dests(0), &p1)?.avg_bytes_per_s);
        all.push(bench::run_bw_client(&x, &y.dests(0), &p)?.avg_bytes_per_s);
        all_one_area.push(bench::run_bw_client(&x, &into_one, &shared)?.avg_bytes_per_s);
    }
    Ok(Scale { idle, one: median(&mut one), all: median(&mut all), all_one_area: median(&mut all_one_area) })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn print_table(a: &Context, udp_bw: f64, base: &LatBaselines, datagram: usize, bw: &[Row], lat: &[(Row, LatResult)]) {
    let line = "-".repeat(87);
    let mb = |x: f64| x / f64::from(1 << 20);
    println!("{line}");
    println!(" softrdma demo: RoCEv2 between two devices on 127.0.0.1 and 127.0.0.2, UDP port {}, MTU 4096", a.port());
    println!(" baseline, plain UDP on the same path, measured in this run:");
    println!("   {datagram}-byte datagrams, one stream: {:.2} MB/sec", mb(udp_bw));
    println!(
        "   8-byte ping-pong, spinning on the socket (in {LAT_ROUNDS} rounds between the latency rows'): {:.2} usec one-way",
        base.spinning.typical()
    );
    println!("     (half the round trip, typical);");
    println!("   blocking in recv: {:.2} usec one-way", base.blocking.typical());
    let x = |r: &LatResult| r.typical() / base.spinning.typical();
    println!(" the kernel's share of RoCEv2's, spinning, with a device's socket calls and none of its work:");
    println!(
        "   a WRITE's turn, 40 and 20 bytes in one GSO send, received with GRO: {:.2} usec one-way ({:.2}x)",
        base.write_turn.typical(),
        x(&base.write_turn)
    );
    println!(
        "   a READ's leg, one 32-byte datagram: {:.2} usec one-way ({:.2}x)",
        base.read_leg.typical(),
        x(&base.read_leg)
    );
    println!("{line}");
    println!(" test        #bytes     #iterations    BW average[MB/sec]    of UDP");
    for r in bw {
        println!(
            " {:<10}  {:<9}  {:<13}  {:<20.2}  {:>5.2}",
            r.test,
            r.size,
            r.iters,
            mb(r.value),
            r.value / r.baseline
        );
    }
    println!("{line}");
    println!(" test        #bytes     #iterations    t_typical[usec]   t_avg[usec]   99% [usec]   x UDP (spinning)");
    for (r, l) in lat {
        println!(
            " {:<10}  {:<9}  {:<13}  {:<16.2}  {:<12.2}  {:<11.2}  {:>5.2}",
            r.test,
            r.size,
            r.iters,
            l.typical(),
            l.avg(),
            l.percentile(0.99),
            r.value / r.baseline
        );
    }
    println!("{line}");
}
