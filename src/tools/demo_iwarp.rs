//! The iWARP half of `softrdma demo`: two iWARP devices on 127.0.0.1 and 127.0.0.2 over
//! kernel TCP, each row next to plain TCP on the same path measured in the same run (one
//! connection streaming for bandwidth, a spinning ping-pong for latency).

use super::bench::{Endpoint, LatResult, Params, Test};
use super::demo::{bw_between, iters_for, lat_between, DemoArgs, Row, A, B};
use crate::verbs::{ConnParam, Context, OpenConfig, Transport};
use serde_json::{json, Value};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Every iWARP figure of one run and its TCP baselines.
pub struct IwarpRows {
    /// Plain TCP, one connection, 64 KiB writes: bytes per second.
    pub tcp_bw: f64,
    /// Plain TCP 8-byte ping-pong, spinning: one-way times.
    pub tcp_lat: LatResult,
    bw: Vec<Row>,
    lat: Vec<(Row, LatResult)>,
}

/// Plain TCP on the same path: one connection, one thread writing `size`-byte buffers,
/// another reading; bytes per second at the reader.
pub fn tcp_bandwidth(size: usize, secs: f64) -> std::io::Result<f64> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind((B, 0))?;
    let to = l.local_addr()?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let sender = s.spawn(|| -> std::io::Result<()> {
            let mut tx = std::net::TcpStream::connect(to)?;
            let buf = vec![0x5au8; size];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tx.write_all(&buf)?;
            }
            Ok(())
        });
        let (mut rx, _) = l.accept()?;
        rx.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = vec![0u8; 1 << 20];
        rx.read_exact(&mut buf[..size])?;
        let start = Instant::now();
        let mut got = 0u64;
        while start.elapsed().as_secs_f64() < secs {
            got += rx.read(&mut buf)? as u64;
        }
        let elapsed = start.elapsed().as_secs_f64();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(rx);
        let _ = sender.join();
        Ok(got as f64 / elapsed)
    })
}

/// Reads exactly `buf.len()` bytes from non-blocking `s`, spinning (yielding now and then,
/// as the latency tools do) for at most 2 s.
fn read_exact_spinning(mut s: &TcpStream, buf: &mut [u8]) -> io::Result<()> {
    let (start, mut got) = (Instant::now(), 0);
    for n in 0u64.. {
        if got == buf.len() {
            break;
        }
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if n % 64 == 63 {
                    if start.elapsed() > Duration::from_secs(2) {
                        return Err(e);
                    }
                    std::thread::yield_now();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Plain TCP ping-pong of `size` bytes between two threads over one connection with
/// TCP_NODELAY, both spinning on non-blocking sockets: one-way times (half the round trip).
pub fn tcp_latency(size: usize, iters: usize) -> io::Result<LatResult> {
    let l = TcpListener::bind((B, 0))?;
    let mut a = TcpStream::connect(l.local_addr()?)?;
    let (mut b, _) = l.accept()?;
    for s in [&a, &b] {
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
    }
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut buf = vec![0u8; size];
            for _ in 0..iters {
                if read_exact_spinning(&b, &mut buf).is_err() || b.write_all(&buf).is_err() {
                    return;
                }
            }
        });
        let mut buf = vec![0u8; size];
        let mut posted = Vec::with_capacity(iters + 1);
        for _ in 0..iters {
            posted.push(Instant::now());
            a.write_all(&buf)?;
            read_exact_spinning(&a, &mut buf)?;
        }
        posted.push(Instant::now());
        let mut usec: Vec<f64> =
            posted.windows(2).map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e6 / 2.0).collect();
        usec.sort_by(f64::total_cmp);
        Ok(LatResult { size, usec })
    })
}

/// Connects the QPs of `x` (on one iWARP device) to those of `y` (on `yctx`) through a
/// listener, as rdma_cm does.
fn iwarp_connect(x: &Endpoint<'_>, y: &Endpoint<'_>, yctx: &Context, depth: u16) -> Result<(), String> {
    let l = yctx.listen(SocketAddr::new(yctx.ip(), 0)).map_err(|e| format!("listen: {e}"))?;
    let to = l.local_addr();
    let p = ConnParam { private_data: Vec::new(), responder_resources: depth, initiator_depth: depth };
    std::thread::scope(|s| {
        let h = s.spawn(|| -> Result<(), String> {
            for qp in &x.qps {
                qp.connect(to, &p, Duration::from_secs(10)).map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        for qp in &y.qps {
            let req = l.get_request(Duration::from_secs(10)).ok_or("no connection request")?;
            req.accept(qp, &p).map_err(|e| e.to_string())?;
        }
        h.join().map_err(|_| "connecting thread panicked".to_string())?
    })
}

/// Two connected endpoints for `p` on `a` and `b`, then `run` on them.
fn between<T>(
    a: &Context,
    b: &Context,
    p: &Params,
    run: impl FnOnce(&Endpoint<'_>, &Endpoint<'_>) -> Result<T, String>,
) -> Result<T, String> {
    let (x, y) =
        (Endpoint::new(a, p).map_err(|e| format!("{e:?}"))?, Endpoint::new(b, p).map_err(|e| format!("{e:?}"))?);
    let reads = matches!(p.test, Test::ReadBw | Test::ReadLat);
    iwarp_connect(&x, &y, b, if reads { 16 } else { 0 })?;
    run(&x, &y)
}

fn open(ip: Ipv4Addr) -> Result<Context, String> {
    let mut c = OpenConfig::new(IpAddr::V4(ip));
    c.transport = Transport::Iwarp;
    Context::open(c).map_err(|e| format!("cannot open an iWARP device on {ip}: {e}"))
}

const BW_TESTS: [(Test, &str); 3] =
    [(Test::WriteBw, "iwarp_write_bw"), (Test::ReadBw, "iwarp_read_bw"), (Test::SendBw, "iwarp_send_bw")];
const LAT_TESTS: [(Test, &str); 3] =
    [(Test::WriteLat, "iwarp_write_lat"), (Test::ReadLat, "iwarp_read_lat"), (Test::SendLat, "iwarp_send_lat")];

/// The iWARP rows `args` asks for: bandwidth and latency of each operation next to TCP.
pub fn rows(args: &DemoArgs) -> Result<IwarpRows, String> {
    let (a, b) = (open(A)?, open(B)?);
    let tcp_bw = tcp_bandwidth(65536, args.seconds).map_err(|e| format!("TCP baseline: {e}"))?;
    let mut bw = Vec::new();
    for (test, name) in BW_TESTS.into_iter().filter(|t| args.wants(t.1)) {
        for size in [65536, 1 << 20] {
            let mut p = Params::defaults(test);
            p.size = size;
            // Sized by the TCP baseline, so a row lasts about `seconds` and a 1 MiB row
            // is not mostly its first pass over fresh buffers.
            p.iters = iters_for(size, args.seconds, tcp_bw);
            let r = between(&a, &b, &p, |x, y| bw_between(x, y, &p))?;
            bw.push(Row { test: name, size, iters: r.iters, value: r.avg_bytes_per_s, baseline: tcp_bw });
        }
    }
    let (tcp_lat, lat) = lat_rows(&a, &b, args)?;
    Ok(IwarpRows { tcp_bw, tcp_lat, bw, lat })
}

/// The latency rows and the TCP ping-pong they are set against, in
/// [`super::demo::LAT_ROUNDS`] interleaved rounds as the RoCEv2 rows are.
fn lat_rows(a: &Context, b: &Context, args: &DemoArgs) -> Result<(LatResult, Vec<(Row, LatResult)>), String> {
    let baseline = || tcp_latency(8, super::demo::LAT_BASE_ITERS_PER_ROUND).map_err(|e| format!("TCP baseline: {e}"));
    let run = |test, size| {
        let mut p = Params::defaults(test);
        p.size = size;
        p.iters = super::demo::LAT_ITERS_PER_ROUND;
        between(a, b, &p, |x, y| lat_between(x, y, &p))
    };
    super::demo::in_rounds(&super::demo::lat_tests(args, &LAT_TESTS), baseline, run)
}

/// The iWARP table.
pub fn print(r: &IwarpRows) {
    let mb = |x: f64| x / f64::from(1 << 20);
    println!(" iWARP (RDMAP/DDP/MPA over kernel TCP) between two iWARP devices on the same addresses;");
    println!(
        " baseline, plain TCP on the same path, this run: one connection, 65536-byte writes: {:.2} MB/sec;",
        mb(r.tcp_bw)
    );
    println!(
        "   8-byte ping-pong with TCP_NODELAY, spinning on the socket (in {} rounds between the latency rows'): {:.2} usec one-way",
        super::demo::LAT_ROUNDS,
        r.tcp_lat.typical()
    );
    println!(" test             #bytes     #iterations    BW average[MB/sec]    of TCP");
    for row in &r.bw {
        println!(
            " {:<15}  {:<9}  {:<13}  {:<20.2}  {:>5.2}",
            row.test,
            row.size,
            row.iters,
            mb(row.value),
            row.value / row.baseline
        );
    }
    println!(" test             #bytes     #iterations    t_typical[usec]   t_avg[usec]   99% [usec]   x TCP");
    for (row, l) in &r.lat {
        println!(
            " {:<15}  {:<9}  {:<13}  {:<16.2}  {:<12.2}  {:<11.2}  {:>5.2}",
            row.test,
            row.size,
            row.iters,
            l.typical(),
            l.avg(),
            l.percentile(0.99),
            row.value / row.baseline
        );
    }
    println!("{}", "-".repeat(87));
}

/// The iWARP rows as JSON.
pub fn json(r: &IwarpRows) -> Value {
    let bw: Vec<_> =
        r.bw.iter()
            .map(|row| {
                json!({"test": row.test, "bytes": row.size, "iterations": row.iters,
                "bw_avg_bytes_per_s": row.value, "tcp_bytes_per_s": row.baseline, "ratio": row.value / row.baseline})
            })
            .collect();
    let lat: Vec<_> = r
        .lat
        .iter()
        .map(|(row, l)| {
            json!({"test": row.test, "result": super::perf::lat_json(l),
                "tcp_t_typical_us": row.baseline, "ratio": row.value / row.baseline})
        })
        .collect();
    json!({"tcp_bytes_per_s": r.tcp_bw, "tcp_t_typical_us": r.tcp_lat.typical(), "bandwidth": bw, "latency": lat})
}
