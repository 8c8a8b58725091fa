//! `softrdma demo --veth`: RoCEv2 across a veth pair between two network namespaces that
//! the demo makes and removes (root), over every way softrdma moves packets: kernel UDP
//! sockets, raw frames through a packet socket (AF_PACKET) and through AF_XDP; next to
//! plain UDP on the same veth in the same run, so every figure is also a ratio.

use super::bench::{self, LatResult, Test};
use super::demo::{
    in_rounds, rdma_bw_mtu, rdma_lat_mtu, udp_bandwidth_on, udp_latency_on, LAT_BASE_ITERS_PER_ROUND,
    LAT_ITERS_PER_ROUND, LAT_ROUNDS,
};
use super::netns::VethPair;
use crate::transport::raw::FrameIo;
use crate::transport::udp_floor::{self, FloorEndpoint};
use crate::verbs::{Context, Mtu, OpenConfig};
use serde_json::json;
use std::net::{IpAddr, UdpSocket};

/// The kernel's addresses on the two veth ends (plain UDP and the UDP-socket devices).
const KERNEL: [&str; 2] = ["10.99.0.1", "10.99.0.2"];
/// The raw devices' own addresses, which the kernel does not hold.
const RAW: [&str; 2] = ["10.99.0.11", "10.99.0.12"];
/// veth's MTU is 1500: path MTU 1024, as rxe would choose.
const MTU: Mtu = Mtu::M1024;
/// A middle WRITE packet at that MTU: BTH, payload, ICRC (the baseline's datagram size).
const DATAGRAM: usize = 12 + 1024 + 4;

/// The ways to move packets the demo compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    UdpSocket,
    Packet,
    Xdp,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::UdpSocket => "udp-socket",
            Path::Packet => "af_packet",
            Path::Xdp => "af_xdp",
        }
    }
}

/// One path's figures: bandwidth (bytes/s) of 64 KiB WRITE, READ, SEND; latency (µs) of
/// 8-byte WRITE, READ, SEND, and of the plain UDP ping-pong measured in rounds with them.
struct PathRow {
    path: Path,
    bw: [f64; 3],
    lat: [f64; 3],
    udp_lat: f64,
}

fn open_on(pair: &VethPair, path: Path, i: usize) -> Result<Context, String> {
    let cfg = match path {
        Path::UdpSocket => OpenConfig::new(KERNEL[i].parse().map_err(|_| "address")?),
        Path::Packet | Path::Xdp => {
            let mut cfg = OpenConfig::raw(&pair.ifaces[i], RAW[i].parse().map_err(|_| "address")?, 24);
            if let Some(raw) = cfg.raw.as_mut() {
                raw.frame_io = if path == Path::Xdp { FrameIo::Xdp } else { FrameIo::PacketSocket };
            }
            cfg
        }
    };
    pair.run_in(i, move || Context::open(cfg)).map_err(|e| format!("{}: {e}", path.name()))
}

/// The 8-byte latency rows, measured in rounds with the plain UDP ping-pong as the
/// loopback demo measures its own ([`in_rounds`]).
const LAT_TESTS: [(Test, &str, usize); 3] =
    [(Test::WriteLat, "write_lat", 8), (Test::ReadLat, "read_lat", 8), (Test::SendLat, "send_lat", 8)];

fn measure(pair: &VethPair, path: Path, secs: f64) -> Result<PathRow, String> {
    let (a, b) = (open_on(pair, path, 0)?, open_on(pair, path, 1)?);
    let mut bw = [0.0; 3];
    for (slot, test) in bw.iter_mut().zip([Test::WriteBw, Test::ReadBw, Test::SendBw]) {
        *slot = rdma_bw_mtu(&a, &b, test, 65536, 1, (secs, 3e8), MTU)?.avg_bytes_per_s;
    }
    let baseline = || {
        let (x, y) = (kernel_socket(pair, 0)?, kernel_socket(pair, 1)?);
        udp_latency_on(x, y, 8, LAT_BASE_ITERS_PER_ROUND, true).map_err(|e| format!("UDP baseline: {e}"))
    };
    let run = |test, size| rdma_lat_mtu(&a, &b, test, size, LAT_ITERS_PER_ROUND, MTU);
    let (udp, rows) = in_rounds(&LAT_TESTS, baseline, run)?;
    let lat = [0, 1, 2].map(|i| rows[i].1.typical());
    Ok(PathRow { path, bw, lat, udp_lat: udp.typical() })
}

/// A UDP socket on the kernel's address of veth end `i`, in its namespace.
fn kernel_socket(pair: &VethPair, i: usize) -> Result<UdpSocket, String> {
    let ip = KERNEL[i].to_string();
    pair.run_in(i, move || UdpSocket::bind((ip.as_str(), 0))).map_err(|e| format!("UDP baseline: {e}"))
}

/// The baselines measured across the veth in the run.
struct Baseline {
    /// Plain UDP datagrams one way, bytes/s.
    udp_bw: f64,
    /// Plain UDP, a spinning 8-byte ping-pong.
    udp_lat: LatResult,
    /// The kernel's share of a RoCEv2 WRITE's turn and of a READ's leg over UDP sockets
    /// ([`udp_floor`]).
    write_turn: LatResult,
    read_leg: LatResult,
}

/// Plain UDP across the veth: datagrams one way, and a spinning 8-byte ping-pong; and the
/// same ping-pong with a RoCEv2 device's socket calls.
fn baseline(pair: &VethPair, secs: f64) -> Result<Baseline, String> {
    let e = |e: std::io::Error| format!("UDP baseline: {e}");
    let socket = |i: usize| kernel_socket(pair, i);
    let floor = |sizes: &[usize]| -> Result<LatResult, String> {
        let sockets = |i: usize| {
            let ip: IpAddr = KERNEL[i].parse().map_err(|_| "address".to_string())?;
            pair.run_in(i, move || udp_floor::open_sockets(ip)).map_err(e)
        };
        let (x, y) = (FloorEndpoint::on(sockets(0)?, sizes), FloorEndpoint::on(sockets(1)?, sizes));
        Ok(bench::lat_result(8, &udp_floor::ping_pong_between(x, y, 20_000).map_err(e)?, true))
    };
    Ok(Baseline {
        udp_bw: udp_bandwidth_on(socket(0)?, socket(1)?, DATAGRAM, secs).map_err(e)?,
        udp_lat: udp_latency_on(socket(0)?, socket(1)?, 8, 20_000, true).map_err(e)?,
        write_turn: floor(udp_floor::WRITE_TURN)?,
        read_leg: floor(udp_floor::READ_LEG)?,
    })
}

/// Makes the namespaces, measures every path, prints the table (or JSON), and removes them.
pub fn run(secs: f64, json_out: bool) -> Result<(), String> {
    let pair = VethPair::named("srdemo").map_err(|e| format!("demo --veth: {e}"))?;
    for (i, ip) in KERNEL.iter().enumerate() {
        pair.kernel_addr(i, &format!("{ip}/24"))?;
    }
    let base = baseline(&pair, secs)?;
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    for path in [Path::UdpSocket, Path::Packet, Path::Xdp] {
        match measure(&pair, path, secs) {
            Ok(r) => rows.push(r),
            Err(e) => missing.push((path, e)),
        }
    }
    if json_out {
        print_json(&base, &rows, &missing);
    } else {
        print_table(&base, &rows, &missing);
    }
    Ok(())
}

fn print_json(base: &Baseline, rows: &[PathRow], missing: &[(Path, String)]) {
    let paths: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({"path": r.path.name(), "write_bw_65536_bytes_per_s": r.bw[0], "read_bw_65536_bytes_per_s": r.bw[1],
            "send_bw_65536_bytes_per_s": r.bw[2], "write_lat_8_us": r.lat[0], "read_lat_8_us": r.lat[1],
            "send_lat_8_us": r.lat[2], "udp_t_typical_us": r.udp_lat})
        })
        .collect();
    let missing: Vec<_> = missing.iter().map(|(p, e)| json!({"path": p.name(), "error": e})).collect();
    let doc = json!({"link": "veth, MTU 1500, path MTU 1024", "udp_bytes_per_s": base.udp_bw,
        "udp_datagram_bytes": DATAGRAM, "udp_t_typical_us": base.udp_lat.typical(),
        "udp_roce_calls_t_typical_us": base.write_turn.typical(),
        "udp_roce_calls_single_t_typical_us": base.read_leg.typical(), "paths": paths, "unavailable": missing});
    println!("{doc}");
}

fn print_table(base: &Baseline, rows: &[PathRow], missing: &[(Path, String)]) {
    let (udp_bw, udp_lat) = (base.udp_bw, &base.udp_lat);
    let mb = |x: f64| x / f64::from(1 << 20);
    let line = "-".repeat(100);
    println!("{line}");
    println!(" softrdma demo --veth: RoCEv2 across a veth pair between two namespaces, MTU 1500, path MTU 1024");
    println!(
        " baseline, plain UDP on the same veth, this run: {DATAGRAM}-byte datagrams, one stream: {:.2} MB/sec;",
        mb(udp_bw)
    );
    println!("   8-byte ping-pong, spinning: {:.2} usec one-way (typical)", udp_lat.typical());
    let x = |r: &LatResult| r.typical() / udp_lat.typical();
    println!(
        " the kernel's share of the UDP-socket path's: a WRITE's turn {:.2} usec one-way ({:.2}x), a READ's leg {:.2} ({:.2}x)",
        base.write_turn.typical(),
        x(&base.write_turn),
        base.read_leg.typical(),
        x(&base.read_leg)
    );
    println!("{line}");
    println!(
        " {:<11} {:>14} {:>14} {:>14} {:>10} {:>10} {:>10} {:>10}",
        "path", "write_bw 64K", "read_bw 64K", "send_bw 64K", "of UDP", "write_lat", "read_lat", "send_lat"
    );
    println!(
        " {:<11} {:>14} {:>14} {:>14} {:>10} {:>10} {:>10} {:>10}",
        "", "MB/sec", "MB/sec", "MB/sec", "(write)", "usec", "usec", "usec"
    );
    for r in rows {
        println!(
            " {:<11} {:>14.2} {:>14.2} {:>14.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            r.path.name(),
            mb(r.bw[0]),
            mb(r.bw[1]),
            mb(r.bw[2]),
            r.bw[0] / udp_bw,
            r.lat[0],
            r.lat[1],
            r.lat[2]
        );
    }
    for r in rows {
        println!(
            " {}: 8-byte latency in {LAT_ROUNDS} rounds with a plain UDP ping-pong ({:.2} usec one-way): WRITE {:.2}x, READ {:.2}x, SEND {:.2}x",
            r.path.name(),
            r.udp_lat,
            r.lat[0] / r.udp_lat,
            r.lat[1] / r.udp_lat,
            r.lat[2] / r.udp_lat
        );
    }
    let udp_path = rows.iter().find(|r| r.path == Path::UdpSocket);
    for r in rows.iter().filter(|r| r.path != Path::UdpSocket) {
        if let Some(u) = udp_path {
            println!(
                " {} against the UDP-socket path: 64 KiB WRITE {:.2}x, 8-byte WRITE latency {:.2}x",
                r.path.name(),
                r.bw[0] / u.bw[0],
                r.lat[0] / u.lat[0]
            );
        }
    }
    for (p, e) in missing {
        println!(" {}: not measured: {e}", p.name());
    }
    println!("{line}");
}
