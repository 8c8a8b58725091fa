//! The perftest-compatible tools: `softrdma write-bw | read-bw | send-bw | atomic-bw |
//! write-lat | read-lat | send-lat`. A server (no address) waits for a client on TCP port
//! 18515, both open a device on the address of that TCP connection, exchange keys the way
//! perftest 6.06 does (same number of handshakes at the same points) and run the test.
//! Over iWARP (`--transport iwarp`) everything is as perftest's `-R` (rdma_cm): the
//! exchange runs on an iWARP QP of its own, and the test QPs connect through MPA to the
//! same port between two extra handshakes.

use super::bench::{self, BwResult, Endpoint, LatResult, Params, Test};
use super::oob::{BwReport, Dest, Oob};
use crate::verbs::{ConnParam, Context, IwarpConfig, OpenConfig, RawConfig, Transport};
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// What the command line chose.
#[derive(Debug, Clone)]
pub struct ToolArgs {
    /// The test and its sizes.
    pub params: Params,
    /// Server address (client mode); `None`: server mode.
    pub server: Option<String>,
    /// TCP port of the out-of-band exchange.
    pub port: u16,
    /// Local GID index.
    pub gid_index: u8,
    /// Run every size from 2 to 8 MiB.
    pub all_sizes: bool,
    /// Report Gb/s instead of MB/s.
    pub report_gbits: bool,
    /// JSON on stdout instead of the table.
    pub json: bool,
    /// Local address (default: the one the TCP connection uses).
    pub bind: Option<IpAddr>,
    /// Capture file.
    pub pcap: Option<PathBuf>,
    /// RoCEv2 or iWARP.
    pub transport: Transport,
    /// Connect through rdma_cm (perftest's `-R`; always so on iWARP).
    pub rdma_cm: bool,
    /// iWARP settings (MPA CRC, markers).
    pub iwarp: IwarpConfig,
    /// RoCEv2 on raw Ethernet with an address of its own (`None`: kernel UDP sockets).
    pub raw: Option<RawConfig>,
    /// RoCEv2 congestion control on (CNPs on ECN-CE, DCQCN pacing).
    pub cc: bool,
    /// Report the device's counters after the test.
    pub stats: bool,
    /// UDP offloads on or off (`None`: [`crate::transport::udp::offload_by_default`]).
    pub udp_offload: Option<bool>,
}

/// Sizes of a run: 2^1..=2^23 with `-a` (perftest's range), else the one size.
fn sizes(a: &ToolArgs) -> Vec<usize> {
    if a.all_sizes {
        let top = if a.params.test == Test::AtomicBw { 3 } else { 23 };
        (if a.params.test == Test::AtomicBw { 3 } else { 1 }..=top).map(|i| 1usize << i).collect()
    } else {
        vec![a.params.size]
    }
}

/// Runs a tool; the error is what to print before exiting 1.
pub fn run(a: &ToolArgs) -> Result<(), String> {
    let client = a.server.is_some();
    if !client && !a.json {
        println!("\n************************************\n* Waiting for client to connect... *\n************************************");
    }
    let (mut oob, cfg) = open_oob(a)?;
    // As perftest on a NIC, never more than the port's active MTU (the link's).
    let mut mtu = a.params.mtu;
    if let Some(link) = cfg.active_mtu().filter(|l| l.bytes() < mtu.bytes()) {
        mtu = link;
    }
    let mtu = oob.preamble(mtu).map_err(|e| e.to_string())?;
    let local = cfg.addr;
    let ctx = match oob.device() {
        Some(ctx) => ctx,
        None => std::sync::Arc::new(Context::open(cfg).map_err(|e| format!("cannot open a device on {local}: {e}"))?),
    };
    let mut p = a.params.clone();
    p.mtu = mtu;
    p.max_size = sizes(a).into_iter().max().unwrap_or(p.size);
    let ep = Endpoint::new(&ctx, &p).map_err(|e| format!("{e:?}"))?;
    if a.gid_index != 0 && ctx.gid(a.gid_index).is_none() {
        return Err(format!("GID index {} does not exist (this device has GID 0 only)", a.gid_index));
    }
    if oob.is_cm() {
        connect_cm_qps(a, &mut oob, &ctx, &ep).map_err(|e| e.to_string())?;
    }
    let mine = ep.dests(a.gid_index);
    let theirs = connect(&mut oob, &ep, &mine, &p).map_err(|e| e.to_string())?;
    if !a.json {
        print_header(&p, &mine, &theirs, client, &ctx);
    }
    let out = match p.test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => rdma_bw(a, &p, &mut oob, &ep, &mine, &theirs),
        Test::SendBw => send_bw(a, &p, &mut oob, &ep, &mine, &theirs),
        Test::WriteLat | Test::SendLat | Test::ReadLat => latency(a, &p, &mut oob, &ep, &mine, &theirs),
    };
    let results = out?;
    let counters = a.stats.then(|| device_counters(&ctx.stats()));
    if a.json {
        let mut doc = json!({ "test": p.title(), "mtu": mtu.bytes(), "results": results });
        if let Some(c) = counters {
            doc["device_stats"] = c;
        }
        println!("{doc}");
    } else if let Some(c) = counters {
        eprintln!("device counters: {c}");
    }
    Ok(())
}

/// The counters that tell how a run went on the wire: what was sent and received, what
/// was lost and repaired, what the peer refused.
fn device_counters(s: &crate::verbs::DeviceStats) -> serde_json::Value {
    let e = &s.engine;
    json!({
        "tx_packets": e.tx_packets, "rx_packets": e.rx_packets,
        "tx_datagrams": s.tx_datagrams, "rx_datagrams": s.rx_datagrams, "tx_errors": s.tx_errors,
        "rx_icrc_bad": s.rx_icrc_bad, "rx_malformed": e.rx_malformed, "rx_unknown_qp": e.rx_unknown_qp,
        "retransmit_timeouts": e.retransmit_timeouts,
        "seq_naks_sent": e.seq_naks_sent, "seq_naks_received": e.seq_naks_received,
        "rnr_naks_sent": e.rnr_naks_sent, "rnr_naks_received": e.rnr_naks_received,
        "naks_sent": e.naks_sent, "duplicates_received": e.duplicates_received,
        "out_of_order_responses": e.out_of_order_responses,
        "cnps_sent": e.cnps_sent, "cnps_received": e.cnps_received,
        "poll_thread_wakeups": s.poll_thread_wakeups, "poll_thread_packets": s.poll_thread_packets,
        "iwarp_connections": s.iwarp_connections,
        // The ICRC's CRC-32 routine this CPU measured fastest (transport::icrc_routine): a
        // 16-way table below this many bytes, crc32fast above; null: the table throughout.
        "icrc_table_below_bytes": Some(softrdma_proto::crc::crc32_table_below()).filter(|&n| n != usize::MAX),
    })
}

/// The out-of-band connection and the configuration of the device to open: over TCP
/// (RoCEv2) or over rdma_cm on iWARP.
fn open_oob(a: &ToolArgs) -> Result<(Oob, OpenConfig), String> {
    let e = |e: super::oob::OobError| e.to_string();
    if a.transport == Transport::Iwarp || a.rdma_cm {
        if a.transport == Transport::Iwarp && a.params.test == Test::AtomicBw {
            return Err("atomics over iWARP are RFC 7306, which softrdma does not speak yet".into());
        }
        if a.transport == Transport::Iwarp && a.pcap.is_some() {
            return Err("--pcap captures RoCEv2 frames; capture iWARP's TCP with tcpdump".into());
        }
        let local = match (&a.raw, a.bind, &a.server) {
            (Some(raw), _, _) => raw.ip,
            (None, Some(ip), _) => ip,
            (None, None, Some(s)) => route_source(s, a.port).map_err(|e| format!("no route to {s}: {e}"))?,
            (None, None, None) => IpAddr::from([0, 0, 0, 0]),
        };
        if a.transport == Transport::RoceV2 && local.is_unspecified() {
            return Err("a RoCEv2 server with -R needs its address: --bind ADDR (or --iface/--ip)".into());
        }
        let mut cfg = OpenConfig::new(local);
        cfg.raw = a.raw.clone();
        cfg.transport = a.transport;
        cfg.iwarp = a.iwarp.clone();
        cfg.pcap = a.pcap.clone();
        cfg.cc.enabled = a.cc;
        cfg.udp_offload = a.udp_offload;
        let oob = match &a.server {
            Some(s) => Oob::connect_cm(&cfg, s, a.port),
            None => Oob::accept_cm(&cfg, a.port),
        };
        return Ok((oob.map_err(e)?, cfg));
    }
    let oob = match &a.server {
        Some(s) => Oob::connect(s, a.port),
        None => Oob::accept(a.port),
    }
    .map_err(e)?;
    let mut cfg = match &a.raw {
        Some(raw) => {
            let mut cfg = OpenConfig::new(raw.ip);
            cfg.raw = Some(raw.clone());
            cfg
        }
        None => match a.bind {
            Some(ip) => OpenConfig::new(ip),
            None => OpenConfig::new(oob.local_ip().map_err(|e| e.to_string())?),
        },
    };
    cfg.pcap = a.pcap.clone();
    cfg.cc.enabled = a.cc;
    cfg.udp_offload = a.udp_offload;
    Ok((oob, cfg))
}

/// The local address the kernel routes to `host` from (a connected UDP socket sends
/// nothing).
pub(crate) fn route_source(host: &str, port: u16) -> std::io::Result<IpAddr> {
    let to = super::oob::resolve(host, port)?;
    let any: SocketAddr = if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let s = std::net::UdpSocket::bind(any)?;
    s.connect(to)?;
    Ok(s.local_addr()?.ip())
}

/// perftest's `create_rdma_cm_connection`: a handshake, the test QPs connected through
/// rdma_cm (MPA on iWARP, the CM on RoCEv2) to the exchange's port (the client connects, the server accepts in order), and
/// another handshake.
fn connect_cm_qps(a: &ToolArgs, oob: &mut Oob, ctx: &Context, ep: &Endpoint<'_>) -> Result<(), String> {
    let e = |e: super::oob::OobError| e.to_string();
    oob.handshake(&Dest::default()).map_err(e)?;
    // rdma_cm's conn_param asks for read depth only for READ and atomic tests (as
    // perftest); librdmacm's accept grants at most what the REQ's initiator depth asks.
    let depth = if matches!(a.params.test, Test::ReadBw | Test::ReadLat | Test::AtomicBw) { 16 } else { 0 };
    let param = ConnParam { private_data: Vec::new(), responder_resources: depth, initiator_depth: depth };
    match &a.server {
        Some(s) => {
            let to = super::oob::resolve(s, a.port).map_err(|e| format!("{s}: {e}"))?;
            for qp in &ep.qps {
                super::oob::connect_qp_retrying(qp, to, &param).map_err(e)?;
            }
        }
        None => {
            let l = match oob.take_listener() {
                Some(l) => l,
                None => ctx.listen(SocketAddr::new(ctx.ip(), a.port)).map_err(|e| format!("listen: {e}"))?,
            };
            for qp in &ep.qps {
                let req = l.get_request(std::time::Duration::from_secs(60)).ok_or("no test connection came")?;
                req.accept(qp, &param).map_err(|e| e.to_string())?;
            }
        }
    }
    oob.handshake(&Dest::default()).map_err(e)?;
    Ok(())
}

/// The handshakes up to the data phase; returns the peer's keys.
fn connect(
    oob: &mut Oob,
    ep: &Endpoint<'_>,
    mine: &[Dest],
    p: &Params,
) -> Result<Vec<Dest>, Box<dyn std::error::Error>> {
    // write_lat and read_lat shake hands once more before the per-QP keys.
    if matches!(p.test, Test::WriteLat | Test::ReadLat) {
        oob.handshake(&mine[0])?;
    }
    let mut theirs = Vec::new();
    for d in mine {
        theirs.push(oob.handshake(d)?);
    }
    if !oob.is_cm() {
        ep.connect(&theirs, p.mtu).map_err(|e| format!("connecting the QPs: {e:?}"))?;
    }
    for d in mine {
        oob.handshake(d)?;
    }
    oob.handshake(&mine[0])?;
    Ok(theirs)
}

fn print_header(p: &Params, mine: &[Dest], theirs: &[Dest], client: bool, ctx: &Context) {
    let line = "-".repeat(87);
    let (kind, link) =
        if ctx.transport() == Transport::Iwarp { ("IW", "TCP, rdma_cm".into()) } else { ("IB", ctx.link()) };
    println!("{line}\n                    {} Test", p.title());
    println!(" Number of qps   : {}\t\tTransport type : {kind}", p.qps);
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" Mtu             : {}[B]", p.mtu.bytes());
    println!(" Link type       : Ethernet (softrdma over {link})");
    println!(" Role            : {}", if client { "client" } else { "server" });
    println!("{line}");
    for (side, ds) in [("local", mine), ("remote", theirs)] {
        for d in ds {
            let gid: Vec<String> = d.gid.iter().map(|b| format!("{b:02x}")).collect();
            println!(
                " {side} address: LID {:#06x} QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}\n GID: {}",
                d.lid,
                d.qpn,
                d.psn,
                d.rkey,
                d.vaddr,
                gid.join(":")
            );
        }
    }
}

fn bw_table_header(gbits: bool) {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    println!("{}", "-".repeat(87));
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

fn bw_units(bytes_per_s: f64, gbits: bool) -> f64 {
    if gbits {
        bytes_per_s * 8.0 / 1e9
    } else {
        bytes_per_s / f64::from(1 << 20)
    }
}

fn bw_row(r: &BwResult, gbits: bool) {
    println!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.size,
        r.iters,
        bw_units(r.peak_bytes_per_s, gbits),
        bw_units(r.avg_bytes_per_s, gbits),
        r.msg_per_s / 1e6
    );
}

fn bw_json(r: &BwResult) -> serde_json::Value {
    json!({
        "bytes": r.size, "iterations": r.iters,
        "bw_peak_bytes_per_s": r.peak_bytes_per_s, "bw_avg_bytes_per_s": r.avg_bytes_per_s,
        "msg_rate_per_s": r.msg_per_s,
    })
}

fn report_of(r: &BwResult, gbits: bool) -> BwReport {
    BwReport {
        size: r.size as u64,
        iters: r.iters,
        bw_peak: bw_units(r.peak_bytes_per_s, gbits),
        bw_avg: bw_units(r.avg_bytes_per_s, gbits),
        msg_rate: r.msg_per_s / 1e6,
    }
}

type Results = Result<Vec<serde_json::Value>, String>;

/// WRITE, READ and atomic bandwidth: the client works, the server waits for its report.
fn rdma_bw(a: &ToolArgs, p: &Params, oob: &mut Oob, ep: &Endpoint<'_>, mine: &[Dest], theirs: &[Dest]) -> Results {
    let e = |e: super::oob::OobError| e.to_string();
    let mut out = Vec::new();
    if !a.json {
        bw_table_header(a.report_gbits);
    }
    if a.server.is_none() {
        oob.handshake(&mine[0]).map_err(e)?;
        let r = oob.exchange_reports(&BwReport::default()).map_err(e)?;
        if !a.json {
            println!(
                " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
                r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
            );
            println!("{}", "-".repeat(87));
        }
        return oob.close(&mine[0]).map(|_| out).map_err(e);
    }
    let mut last = BwResult::default();
    for size in sizes(a) {
        let run = Params { size, ..p.clone() };
        last = bench::run_bw_client(ep, theirs, &run)?;
        if a.json {
            out.push(bw_json(&last));
        } else {
            bw_row(&last, a.report_gbits);
        }
    }
    if !a.json {
        println!("{}", "-".repeat(87));
    }
    oob.handshake(&mine[0]).map_err(e)?;
    oob.exchange_reports(&report_of(&last, a.report_gbits)).map_err(e)?;
    oob.close(&mine[0]).map_err(e)?;
    Ok(out)
}

/// SEND bandwidth: the server posts receives and counts; both print their own figures.
fn send_bw(a: &ToolArgs, p: &Params, oob: &mut Oob, ep: &Endpoint<'_>, mine: &[Dest], theirs: &[Dest]) -> Results {
    let e = |e: super::oob::OobError| e.to_string();
    let mut out = Vec::new();
    if !a.json {
        bw_table_header(a.report_gbits);
    }
    let all = sizes(a);
    for (i, &size) in all.iter().enumerate() {
        let run = Params { size, ..p.clone() };
        let r = if a.server.is_some() {
            oob.handshake(&mine[0]).map_err(e)?;
            bench::run_bw_client(ep, theirs, &run)?
        } else {
            let server = bench::SendServer::post(ep, &run)?;
            oob.handshake(&mine[0]).map_err(e)?;
            server.run(ep, theirs, &run)?
        };
        if a.json {
            out.push(bw_json(&r));
        } else {
            bw_row(&r, a.report_gbits);
        }
        if a.all_sizes && i + 1 < all.len() {
            oob.handshake(&mine[0]).map_err(e)?;
        }
    }
    if !a.json {
        println!("{}", "-".repeat(87));
    }
    oob.close(&mine[0]).map_err(e)?;
    Ok(out)
}

fn lat_row(r: &LatResult) {
    println!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        r.size,
        r.usec.len(),
        r.min(),
        r.max(),
        r.typical(),
        r.avg(),
        r.stdev(),
        r.percentile(0.99),
        r.percentile(0.999)
    );
}

/// The latency figures of a run as JSON.
pub fn lat_json(r: &LatResult) -> serde_json::Value {
    json!({
        "bytes": r.size, "iterations": r.usec.len(),
        "t_min_us": r.min(), "t_max_us": r.max(), "t_typical_us": r.typical(), "t_avg_us": r.avg(),
        "t_stdev_us": r.stdev(), "t_p99_us": r.percentile(0.99), "t_p999_us": r.percentile(0.999),
    })
}

/// The three latency tests.
fn latency(a: &ToolArgs, p: &Params, oob: &mut Oob, ep: &Endpoint<'_>, mine: &[Dest], theirs: &[Dest]) -> Results {
    let e = |e: super::oob::OobError| e.to_string();
    let server = a.server.is_none();
    if p.test == Test::ReadLat && server {
        // The READ target stays registered until the client says it is done; meanwhile
        // this thread answers the READs itself, with no wake-up of the poll thread for
        // each (the exchange that ends the test runs beside it).
        let done = std::sync::atomic::AtomicBool::new(false);
        let closed = std::thread::scope(|s| {
            let closer = s.spawn(|| {
                let r = oob.close(&mine[0]);
                done.store(true, std::sync::atomic::Ordering::Release);
                r
            });
            ep.ctx.serve_while(|| !done.load(std::sync::atomic::Ordering::Acquire));
            closer.join()
        });
        closed.map_err(|_| "the closing exchange panicked".to_string())?.map_err(e)?;
        return Ok(Vec::new());
    }
    if !a.json {
        println!("{}", "-".repeat(87));
        println!(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ");
    }
    let mut out = Vec::new();
    for size in sizes(a) {
        let run = Params { size, ..p.clone() };
        let r = match p.test {
            Test::WriteLat => bench::run_lat_write(ep, &theirs[0], &run, server)?,
            Test::ReadLat => bench::run_lat_read(ep, &theirs[0], &run)?,
            _ => {
                let posted = bench::SendLat::post(ep, &run)?;
                oob.handshake(&mine[0]).map_err(e)?;
                posted.run(ep, &theirs[0], &run, server)?
            }
        };
        if a.json {
            out.push(lat_json(&r));
        } else {
            lat_row(&r);
        }
    }
    if !a.json {
        println!("{}", "-".repeat(87));
    }
    if p.test != Test::WriteLat {
        oob.close(&mine[0]).map_err(e)?;
    }
    Ok(out)
}
