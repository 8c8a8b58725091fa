//! The `softrdma` command-line tool.

use clap::{Parser, Subcommand};
use softrdma::capture::{self, report::FileReport, report::Tally};
use softrdma::tools::bench::{Params, Test};
use softrdma::tools::perf::ToolArgs;
use softrdma::verbs::Mtu;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "softrdma", version, about = "A complete RDMA engine in software: RoCEv2 and iWARP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with packet captures.
    Pcap {
        #[command(subcommand)]
        command: PcapCommand,
    },
    /// Run the deterministic simulator's swarm test: one seed, or many.
    Sim {
        /// Run this one seed and describe it.
        #[arg(long, conflicts_with = "seeds")]
        seed: Option<u64>,
        /// Run this many seeds.
        #[arg(long, default_value_t = 100)]
        seeds: u64,
        /// First seed of a `--seeds` run.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Run the iWARP swarm instead (two iWARP devices over a simulated TCP stream).
        #[arg(long)]
        iwarp: bool,
    },
    /// Two devices on this machine (127.0.0.1, 127.0.0.2) exchanging RDMA traffic: a
    /// perftest-style table next to plain UDP measured on the same path.
    Demo {
        /// Also run this many QPs on one device: memory per idle QP, aggregate bandwidth.
        #[arg(long, default_value_t = 0)]
        qps: usize,
        /// Seconds per bandwidth row (roughly).
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
        /// Only these rows, comma-separated: write_bw, read_bw, send_bw, write_lat,
        /// read_lat, send_lat, the same with an iwarp_ prefix, and scale (with --qps).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Instead: RoCEv2 across a veth pair between two namespaces the demo makes and
        /// removes (root), over kernel UDP sockets, AF_PACKET and AF_XDP, next to plain UDP.
        #[arg(long)]
        veth: bool,
    },
    /// Plain UDP ping-pong between two hosts, both sides spinning: the floor RoCEv2 over
    /// kernel sockets stands on, measured on the same path as the RDMA latency tools.
    UdpLat {
        /// The server to ping; without it, wait for pings and echo them.
        server: Option<String>,
        /// UDP port of the server.
        #[arg(short = 'p', long, default_value_t = 18600)]
        port: u16,
        /// Payload bytes.
        #[arg(short = 's', long, default_value_t = 64)]
        size: usize,
        /// Measured round trips (the same on both sides).
        #[arg(short = 'n', long, default_value_t = 1000)]
        iters: usize,
        /// Print one JSON document instead of a line.
        #[arg(long)]
        json: bool,
        /// Instead of plain datagrams, make a RoCEv2 device's socket calls in each turn (both
        /// sides): `write`, a WRITE ping-pong's turn (an 8-byte WRITE and the ACK it held, 40
        /// and 20 bytes, in one GSO send, received with GRO); `read`, a READ's leg (one
        /// 32-byte datagram). The kernel's share of the RDMA latency tools' figures.
        #[arg(long)]
        calls: Option<softrdma::tools::udp_lat::RoceCalls>,
    },
    /// Plain UDP stream between two hosts, datagrams sent 32 to a system call without GSO:
    /// the ceiling of what the path carries in datagrams of one RoCEv2 packet's size, for
    /// the RDMA bandwidth tools' figures. The server counts, the client prints.
    UdpBw {
        /// The server to stream to; without it, count what one client streams.
        server: Option<String>,
        /// UDP port of the server.
        #[arg(short = 'p', long, default_value_t = 18601)]
        port: u16,
        /// Payload bytes the client sends (1040: one RoCEv2 packet at path MTU 1024); the
        /// server counts any size.
        #[arg(short = 's', long, default_value_t = 1040)]
        size: usize,
        /// Seconds the client streams.
        #[arg(short = 'D', long, default_value_t = 4.0)]
        duration: f64,
        /// Print one JSON document instead of a line.
        #[arg(long)]
        json: bool,
    },
    /// ibv_rc_pingpong's test, compatible with it on the wire and out of band.
    RcPingpong {
        #[command(flatten)]
        common: PingPongCli,
        /// Message size.
        #[arg(short = 's', long, default_value_t = 4096)]
        size: usize,
        /// Check the received buffer as ibv_rc_pingpong -c does.
        #[arg(short = 'c', long = "chk")]
        validate: bool,
    },
    /// ibv_ud_pingpong's test (UD, Q_Key 0x11111111, GRH space in every receive),
    /// compatible with it on the wire and out of band.
    UdPingpong {
        #[command(flatten)]
        common: PingPongCli,
        /// Message size (at most the path MTU).
        #[arg(short = 's', long, default_value_t = 2048)]
        size: usize,
    },
    /// Tests a live peer's protocol conformance: on RoCEv2 (IBTA vol. 1 ch. 9) through its
    /// ibv_rc_pingpong server, on iWARP (RFC 5040/5041/5044) through its rping server, the
    /// tool restarted after each connection; runs the catalogue, or random mutations.
    Conform {
        /// The target's address.
        target: String,
        /// rocev2 or iwarp.
        #[arg(long, default_value = "rocev2")]
        transport: softrdma::verbs::Transport,
        /// TCP port of the target's tool (default 18515 for ibv_rc_pingpong, 7174 for rping).
        #[arg(short = 'p', long)]
        port: Option<u16>,
        /// iWARP: ask for MPA CRC on every connection.
        #[arg(long = "mpa-crc")]
        mpa_crc: bool,
        /// iWARP: ms between the MPA Reply and a case's first FPDU (one case always uses 0).
        #[arg(long = "settle-ms", default_value_t = 300)]
        settle_ms: u64,
        /// UDP port of RoCEv2 on both sides.
        #[arg(long = "roce-port", default_value_t = 4791)]
        roce_port: u16,
        /// Local address to test from (default: the one the TCP connection uses).
        #[arg(long)]
        bind: Option<std::net::IpAddr>,
        /// The target's path MTU in bytes (its -m).
        #[arg(short = 'm', long, default_value_t = 1024)]
        mtu: usize,
        /// How long to wait for each answer, ms.
        #[arg(long = "wait-ms", default_value_t = 300)]
        wait_ms: u64,
        /// At most this many packets a second to the target.
        #[arg(long, default_value_t = 1000)]
        rate: u32,
        /// How long the target's tool may take to listen again, s.
        #[arg(long = "connect-wait-s", default_value_t = 30)]
        connect_wait_s: u64,
        /// Only the cases whose name contains this (repeatable).
        #[arg(long = "case")]
        cases: Vec<String>,
        /// Random mode (RoCEv2): this many trials of mutated valid traffic instead of the
        /// catalogue; failures are shrunk to their fewest mutations.
        #[arg(long)]
        random: Option<u64>,
        /// The random mode's seed (default: drawn, and printed).
        #[arg(long, value_parser = parse_seed)]
        seed: Option<u64>,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
        /// Write every packet both ways to this pcap file.
        #[arg(long)]
        pcap: Option<PathBuf>,
    },
    /// Forwards every frame between two interfaces (a bridge on the path between two RoCEv2
    /// peers) and applies declared events to chosen packets, then reports the peers'
    /// micro-behaviour around each event: retransmission time and go-back-N extent, NAK
    /// reaction, CNPs, whether a corrupted packet was dropped.
    Inject {
        /// Interface A.
        #[arg(long = "a")]
        a: String,
        /// Interface B.
        #[arg(long = "b")]
        b: String,
        /// KIND@N[,qp=HEX][,op=HEX][,from=ADDR][,us=N][,byte=N]: KIND (drop, ecn, corrupt,
        /// delay, dup) on the Nth request packet that matches (repeatable).
        #[arg(short = 'e', long = "event")]
        events: Vec<String>,
        /// Every forwarded frame, to this pcap file.
        #[arg(long)]
        pcap: Option<PathBuf>,
        /// Stop after this many seconds (else at SIGINT or SIGTERM).
        #[arg(long)]
        seconds: Option<f64>,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
        /// Draw each flow's time-sequence graph with the events marked (needs --pcap).
        #[arg(long, requires = "pcap")]
        plot: Option<PathBuf>,
    },
    /// rping over iWARP (MPA on TCP, or with --iface on softrdma's own TCP over raw
    /// Ethernet), compatible with rdma-core's rping on siw.
    Rping {
        /// Server: listen.
        #[arg(short = 's', conflicts_with = "client")]
        server: bool,
        /// Client: connect.
        #[arg(short = 'c')]
        client: bool,
        /// Address to connect to, or to listen on.
        #[arg(short = 'a', default_value = "0.0.0.0")]
        addr: String,
        /// TCP port.
        #[arg(short = 'p', default_value_t = softrdma::tools::rping::DEFAULT_PORT)]
        port: u16,
        /// Pings (0: until interrupted).
        #[arg(short = 'C', default_value_t = 0)]
        count: u64,
        /// Ping buffer size.
        #[arg(short = 'S', default_value_t = 64)]
        size: usize,
        /// Print each ping.
        #[arg(short = 'v')]
        verbose: bool,
        /// Check each echo.
        #[arg(short = 'V')]
        validate: bool,
        /// MPA CRC: off, request (use it if the peer asks) or required.
        #[arg(long, default_value = "request")]
        crc: String,
        /// Ask for MPA markers in the stream this side receives.
        #[arg(long)]
        markers: bool,
        /// iwarp (MPA over TCP), or rocev2 (IB CM through QP1 over UDP).
        #[arg(long, default_value = "iwarp")]
        transport: softrdma::verbs::Transport,
        /// Client: the local address to connect from.
        #[arg(short = 'I')]
        source: Option<std::net::IpAddr>,
        #[command(flatten)]
        raw: RawArgs,
    },
    /// RDMA WRITE bandwidth (like ib_write_bw).
    WriteBw(PerfArgs),
    /// RDMA READ bandwidth (like ib_read_bw).
    ReadBw(PerfArgs),
    /// SEND bandwidth (like ib_send_bw).
    SendBw(PerfArgs),
    /// Atomic fetch-and-add rate (like ib_atomic_bw).
    AtomicBw(PerfArgs),
    /// RDMA WRITE ping-pong latency (like ib_write_lat).
    WriteLat(PerfArgs),
    /// RDMA READ latency (like ib_read_lat).
    ReadLat(PerfArgs),
    /// SEND ping-pong latency (like ib_send_lat).
    SendLat(PerfArgs),
}

/// perftest's options, with its flag names.
#[derive(clap::Args, Clone)]
struct PerfArgs {
    /// The server to connect to; without it, wait for a client.
    server: Option<String>,
    /// Message size in bytes (default: 65536 for bandwidth, 2 for latency, 8 for atomics).
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Iterations (default: 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long)]
    duration: Option<u64>,
    /// Run every size from 2 bytes to 8 MiB.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Number of QPs.
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: usize,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long = "mtu", default_value_t = 4096)]
    mtu: usize,
    /// Local GID index.
    #[arg(short = 'x', long = "gid-index", default_value_t = 0)]
    gid_index: u8,
    /// Report Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long, default_value_t = softrdma::tools::oob::DEFAULT_PORT)]
    port: u16,
    /// atomic-bw: the atomic to post, CMP_AND_SWAP or FETCH_AND_ADD (perftest's -A).
    #[arg(short = 'A', long = "atomic_type", default_value = "FETCH_AND_ADD")]
    atomic_type: softrdma::tools::bench::AtomicKind,
    /// Outstanding requests per QP (bandwidth tests).
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<usize>,
    /// Receives posted per QP (SEND tests).
    #[arg(short = 'r', long = "rx-depth")]
    rx_depth: Option<usize>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// Local address for RDMA (default: the one the TCP connection uses).
    #[arg(long)]
    bind: Option<std::net::IpAddr>,
    /// Write every frame sent and received to this pcap file (RoCEv2).
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// rocev2, or iwarp (connects as perftest's -R does, with rdma_cm over MPA/TCP).
    #[arg(long, default_value = "rocev2")]
    transport: softrdma::verbs::Transport,
    /// Connect the QPs through rdma_cm, as perftest's -R (on RoCEv2: IB CM MADs on QP1;
    /// the exchange then runs as Sends on a QP of its own).
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// iWARP: MPA CRC policy (off, request, required).
    #[arg(long = "mpa-crc", default_value = "request")]
    mpa_crc: String,
    /// iWARP: ask for MPA markers in the stream this side receives.
    #[arg(long)]
    markers: bool,
    /// RoCEv2 congestion control (IBTA A17.9): answer ECN-CE marks with CNPs and pace the
    /// sender on CNPs (DCQCN), as an RDMA NIC with ECN configured does.
    #[arg(long)]
    cc: bool,
    /// After the test, print the device's counters (retransmissions, NAKs, datagrams) to
    /// stderr, or into the JSON document.
    #[arg(long)]
    stats: bool,
    /// RoCEv2 on kernel UDP sockets: UDP segmentation and receive offload (GSO, GRO), on or
    /// off (default: SOFTRDMA_UDP_OFFLOAD if set, else on; on virtual links only from Linux
    /// 6.2). Off, a capture on a veth or a bridge holds one frame per packet.
    #[arg(long, value_parser = parse_on_off)]
    udp_offload: Option<bool>,
    #[command(flatten)]
    raw: RawArgs,
}

/// `on` or `off`.
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: on or off")),
    }
}

/// What rc-pingpong and ud-pingpong share with rdma-core's examples.
#[derive(clap::Args, Clone)]
struct PingPongCli {
    /// The server to connect to; without it, wait for a client.
    server: Option<String>,
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Path MTU in bytes.
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: usize,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: usize,
    /// Exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u64,
    /// Local GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    gid_index: u8,
    /// Local address for RDMA (default: the one the TCP connection uses).
    #[arg(long)]
    bind: Option<std::net::IpAddr>,
    /// Write every frame sent and received to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    #[command(flatten)]
    raw: RawArgs,
}

/// RoCEv2 on raw Ethernet: a device with its own address on an interface (needs
/// CAP_NET_RAW; the kernel must not hold the address).
#[derive(clap::Args, Clone)]
struct RawArgs {
    /// Run RoCEv2 on this network interface with raw Ethernet frames (AF_PACKET, or AF_XDP
    /// with --frame-io xdp).
    #[arg(long, requires = "ip")]
    iface: Option<String>,
    /// The raw device's own address and on-link prefix, e.g. 10.9.0.2/24.
    #[arg(long, requires = "iface")]
    ip: Option<String>,
    /// Next hop for addresses off the link.
    #[arg(long, requires = "iface")]
    gateway: Option<std::net::IpAddr>,
    /// The raw device's MAC (default: 02:5e and the address's last four bytes).
    #[arg(long, requires = "iface")]
    mac: Option<String>,
    /// How the raw device moves frames: packet (AF_PACKET) or xdp (AF_XDP).
    #[arg(long = "frame-io", default_value = "packet", requires = "iface")]
    frame_io: softrdma::transport::raw::FrameIo,
}

impl RawArgs {
    fn config(&self) -> Result<Option<softrdma::verbs::RawConfig>, String> {
        let (Some(iface), Some(ip)) = (&self.iface, &self.ip) else { return Ok(None) };
        let (addr, prefix) = softrdma::verbs::RawConfig::parse_cidr(ip)?;
        let mut cfg = softrdma::verbs::RawConfig::new(iface, addr, prefix);
        cfg.gateway = self.gateway;
        cfg.frame_io = self.frame_io;
        if let Some(m) = &self.mac {
            let bytes: Vec<u8> = m.split(':').filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
            cfg.mac = Some(bytes.try_into().map_err(|_| format!("{m:?} is not a MAC address"))?);
        }
        Ok(Some(cfg))
    }
}

#[derive(Subcommand)]
enum PcapCommand {
    /// Dissect every RoCEv2 and iWARP packet in pcap/pcapng files and verify every ICRC and
    /// every negotiated MPA CRC. Exit status: 0 all good, 1 a packet is malformed or fails
    /// its checksum, 2 a file could not be read as a capture.
    Check {
        /// Capture files (pcap or pcapng).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Print only failures, notes and the tally.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Draw the time-sequence graph of each RC flow in a capture (PSN over time: requests,
    /// retransmissions, ACKs, NAKs) as one SVG.
    Plot {
        /// Capture file (pcap or pcapng).
        file: PathBuf,
        /// The SVG to write.
        #[arg(short, long, default_value = "flows.svg")]
        out: PathBuf,
        /// Leave out flows with fewer packets than this.
        #[arg(long = "min-packets", default_value_t = 4)]
        min_packets: usize,
        /// Mark the events of this `softrdma inject --json` report on their flows.
        #[arg(long)]
        events: Option<PathBuf>,
    },
}

/// A seed in decimal or 0x-hex.
fn parse_seed(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).map_err(|e| e.to_string()),
        None => s.parse().map_err(|e: std::num::ParseIntError| e.to_string()),
    }
}

fn pcap_plot(file: &Path, out: &Path, min_packets: usize, events: Option<&Path>) -> Result<(), String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let marks = match events {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            softrdma::inject::bridge::marks_from_json(&v)?
        }
        None => Vec::new(),
    };
    let n = softrdma::capture::plot::plot(&bytes, out, min_packets, &marks)?;
    println!("{n} flows drawn to {}", out.display());
    Ok(())
}

fn inject(
    a: String,
    b: String,
    events: &[String],
    pcap: Option<PathBuf>,
    seconds: Option<f64>,
    json: bool,
    plot: Option<&Path>,
) -> Result<(), String> {
    use softrdma::inject::{bridge, micro};
    let events = events.iter().map(|e| e.parse()).collect::<Result<Vec<_>, String>>()?;
    let duration = seconds.map(std::time::Duration::from_secs_f64);
    let args = bridge::BridgeArgs { a, b, events, pcap: pcap.clone(), duration };
    let rep = bridge::run(&args)?;
    if json {
        println!("{}", bridge::report_json(&rep));
    } else {
        println!("forwarded {} frames A to B, {} B to A", rep.forwarded.0, rep.forwarded.1);
        print!("{}", micro::table(&bridge::findings(&rep)));
        for u in &rep.unmet {
            println!("never applied: {} of request {} (too few matching packets)", u.action, u.nth);
        }
    }
    if let (Some(svg), Some(cap)) = (plot, pcap) {
        let bytes = std::fs::read(&cap).map_err(|e| format!("{}: {e}", cap.display()))?;
        softrdma::capture::plot::plot(&bytes, svg, 4, &bridge::marks(&rep))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Pcap { command: PcapCommand::Check { files, json, quiet } } => pcap_check(&files, json, quiet),
        Command::Pcap { command: PcapCommand::Plot { file, out, min_packets, events } } => {
            exit_status("pcap plot", pcap_plot(&file, &out, min_packets, events.as_deref()))
        }
        Command::Inject { a, b, events, pcap, seconds, json, plot } => {
            exit_status("inject", inject(a, b, &events, pcap, seconds, json, plot.as_deref()))
        }
        Command::Conform {
            target,
            transport,
            port,
            mpa_crc,
            settle_ms,
            roce_port,
            bind,
            mtu,
            wait_ms,
            rate,
            connect_wait_s,
            cases,
            random,
            seed,
            json,
            pcap,
        } => {
            let Some(mtu) = mtu_of(mtu) else { return ExitCode::FAILURE };
            let seed = seed.unwrap_or_else(|| softrdma::engine::rng::Rng::os().next_u64());
            let iwarp = transport == softrdma::verbs::Transport::Iwarp;
            let a = softrdma::conform::ConformArgs {
                target,
                transport,
                port: port.unwrap_or(if iwarp { 7174 } else { 18515 }),
                mpa_crc,
                settle: std::time::Duration::from_millis(settle_ms),
                roce_port,
                bind,
                mtu,
                wait: std::time::Duration::from_millis(wait_ms),
                rate_pps: rate,
                connect_wait: std::time::Duration::from_secs(connect_wait_s),
                only: cases,
                pcap,
                random: random.map(|n| (n, seed)),
            };
            let outcomes = softrdma::conform::run(&a);
            if json {
                println!("{}", softrdma::conform::json(&outcomes));
            } else {
                print!("{}", softrdma::conform::table(&outcomes));
            }
            let all = outcomes.iter().all(|o| o.verdict == softrdma::conform::Verdict::Conforms);
            if all && !outcomes.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Sim { iwarp: true, seed, seeds, from } => {
            sim_iwarp(seed.map_or(from, |s| s), seed.map_or(seeds, |_| 1))
        }
        Command::Sim { seed: Some(seed), .. } => sim_one(seed),
        Command::Sim { seed: None, seeds, from, .. } => sim_many(from, seeds),
        Command::Demo { qps, seconds, json, only, veth } => {
            let out = if veth {
                softrdma::tools::demo_veth::run(seconds, json)
            } else {
                softrdma::tools::demo::run(&softrdma::tools::demo::DemoArgs { qps, seconds, json, only })
            };
            match out {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("softrdma demo: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::RcPingpong { common, size, validate } => pingpong("rc-pingpong", common, size, validate, false),
        Command::UdPingpong { common, size } => pingpong("ud-pingpong", common, size, false, true),
        Command::Rping {
            server,
            client,
            addr,
            port,
            count,
            size,
            verbose,
            validate,
            crc,
            markers,
            transport,
            source,
            raw,
        } => {
            let Some(crc) = crc_policy(&crc) else { return ExitCode::FAILURE };
            if server == client {
                eprintln!("softrdma rping: say -s (server) or -c (client)");
                return ExitCode::FAILURE;
            }
            let raw = match raw.config() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("softrdma rping: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let size = size.max(20);
            let a = softrdma::tools::rping::RpingArgs {
                client,
                addr,
                port,
                count,
                size,
                verbose,
                validate,
                crc,
                markers,
                transport,
                source,
                raw,
            };
            exit_status("rping", softrdma::tools::rping::run(&a))
        }
        Command::WriteBw(a) => perf(Test::WriteBw, a),
        Command::ReadBw(a) => perf(Test::ReadBw, a),
        Command::SendBw(a) => perf(Test::SendBw, a),
        Command::AtomicBw(a) => perf(Test::AtomicBw, a),
        Command::WriteLat(a) => perf(Test::WriteLat, a),
        Command::ReadLat(a) => perf(Test::ReadLat, a),
        Command::UdpLat { server, port, size, iters, json, calls } => exit_status(
            "udp-lat",
            softrdma::tools::udp_lat::run(&softrdma::tools::udp_lat::UdpLatArgs {
                server,
                port,
                size,
                iters,
                json,
                calls,
            }),
        ),
        Command::UdpBw { server, port, size, duration, json } => exit_status(
            "udp-bw",
            softrdma::tools::udp_bw::run(&softrdma::tools::udp_bw::UdpBwArgs {
                server,
                port,
                size,
                seconds: duration,
                json,
            }),
        ),
        Command::SendLat(a) => perf(Test::SendLat, a),
    }
}

/// Success, or the tool's error on stderr and exit status 1.
fn exit_status(tool: &str, r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma {tool}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn pingpong(name: &str, c: PingPongCli, size: usize, validate: bool, ud: bool) -> ExitCode {
    let Some(mtu) = mtu_of(c.mtu) else { return ExitCode::FAILURE };
    let raw = match c.raw.config() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("softrdma {name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args = softrdma::tools::pingpong::PingPongArgs {
        server: c.server,
        port: c.port,
        size,
        rx_depth: c.rx_depth.max(2),
        iters: c.iters.max(1),
        mtu,
        gid_index: c.gid_index,
        bind: c.bind,
        pcap: c.pcap,
        raw,
        validate,
        ud,
    };
    exit_status(name, softrdma::tools::pingpong::run(&args))
}

fn crc_policy(crc: &str) -> Option<softrdma::iwarp::setup::CrcPolicy> {
    use softrdma::iwarp::setup::CrcPolicy;
    match crc {
        "off" => Some(CrcPolicy::Off),
        "request" => Some(CrcPolicy::OnRequest),
        "required" => Some(CrcPolicy::Required),
        other => {
            eprintln!("MPA CRC {other:?}: one of off, request, required");
            None
        }
    }
}

fn mtu_of(bytes: usize) -> Option<Mtu> {
    let m = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096].into_iter().find(|m| m.bytes() == bytes);
    if m.is_none() {
        eprintln!("-m {bytes}: the MTU is one of 256, 512, 1024, 2048, 4096");
    }
    m
}

fn perf(test: Test, a: PerfArgs) -> ExitCode {
    let Some(mtu) = mtu_of(a.mtu) else { return ExitCode::FAILURE };
    let mut params = Params::defaults(test);
    // Atomics are 8 bytes whatever -s says (as ib_atomic_bw).
    params.size = if test == Test::AtomicBw { 8 } else { a.size.unwrap_or(params.size) };
    params.iters = a.iters.unwrap_or(params.iters).max(1);
    params.duration = a.duration.map(std::time::Duration::from_secs);
    params.qps = if test.is_latency() { 1 } else { a.qps.max(1) };
    params.mtu = mtu;
    params.tx_depth = a.tx_depth.unwrap_or(params.tx_depth).max(1);
    params.rx_depth = a.rx_depth.unwrap_or(params.rx_depth).max(1);
    if test == Test::SendBw && a.duration.is_none() {
        // As perftest: no more receives than messages, and an even number of them (both
        // sides size perftest's iWARP credit window from it).
        params.rx_depth = params.rx_depth.min(params.iters as usize);
        params.rx_depth += params.rx_depth % 2;
    }
    params.progress = !a.json;
    params.atomic = a.atomic_type;
    let Some(crc) = crc_policy(&a.mpa_crc) else { return ExitCode::FAILURE };
    let iwarp = softrdma::verbs::IwarpConfig { crc, markers: a.markers, ..Default::default() };
    let raw = match a.raw.config() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("softrdma: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args = ToolArgs {
        raw,
        transport: a.transport,
        rdma_cm: a.rdma_cm,
        iwarp,
        params,
        server: a.server,
        port: a.port,
        gid_index: a.gid_index,
        all_sizes: a.all,
        report_gbits: a.report_gbits,
        json: a.json,
        bind: a.bind,
        pcap: a.pcap,
        cc: a.cc,
        stats: a.stats,
        udp_offload: a.udp_offload,
    };
    match softrdma::tools::perf::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma: {e}");
            ExitCode::FAILURE
        }
    }
}

fn sim_one(seed: u64) -> ExitCode {
    match softrdma::sim::swarm::run(seed) {
        Ok(r) => {
            let secs = r.virtual_ns as f64 / 1e9;
            println!(
                "seed {seed}: ok: {} QPs, {} work requests, {} bytes, {secs:.3} s virtual",
                r.qps, r.work_requests, r.bytes
            );
            println!("UC and UD messages delivered: {}", r.unreliable_delivered);
            println!("faults: {:?}", r.faults);
            println!("link: {:?}", r.link);
            for (i, d) in r.devices.iter().enumerate() {
                println!("device {i}: {d:?}");
            }
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("{f}");
            ExitCode::FAILURE
        }
    }
}

/// The iWARP swarm over seeds `from..from + count`; stops at the first failure.
fn sim_iwarp(from: u64, count: u64) -> ExitCode {
    let mut total = softrdma::sim::iwarp::IwarpReport::default();
    for seed in from..from.saturating_add(count) {
        match softrdma::sim::iwarp::run(seed) {
            Ok(r) => {
                total.completions += r.completions;
                total.bytes += r.bytes;
                total.turns += r.turns;
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "iwarp swarm: {count} seeds from {from} passed: {} completions, {} bytes checked, {} stream turns",
        total.completions, total.bytes, total.turns
    );
    ExitCode::SUCCESS
}

fn sim_many(from: u64, count: u64) -> ExitCode {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let next = AtomicU64::new(from);
    let end = from.saturating_add(count);
    let failed = AtomicBool::new(false);
    let totals = std::sync::Mutex::new((0u64, 0u64, 0u64, 0u64));
    let done = AtomicU64::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end || failed.load(Ordering::Relaxed) {
                    break;
                }
                match softrdma::sim::swarm::run(seed) {
                    Ok(r) => {
                        if let Ok(mut t) = totals.lock() {
                            t.0 += r.work_requests;
                            t.1 += r.link.sent;
                            t.2 += r.link.corrupted;
                            t.3 += r.cm_mads;
                        }
                    }
                    Err(f) => {
                        if !failed.swap(true, Ordering::Relaxed) {
                            eprintln!("{f}");
                        }
                    }
                }
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(1000) {
                    eprintln!("{n} seeds ok");
                }
            });
        }
    });
    if failed.load(Ordering::Relaxed) {
        return ExitCode::FAILURE;
    }
    let (wrs, packets, corrupted, cm_mads) = totals.lock().map(|t| *t).unwrap_or_default();
    println!(
        "{count} seeds ok ({from}..{end}): {wrs} work requests, {packets} packets, {corrupted} corrupted and caught, \
         {cm_mads} CM MADs"
    );
    ExitCode::SUCCESS
}

fn pcap_check(files: &[PathBuf], json: bool, quiet: bool) -> ExitCode {
    let reports: Vec<FileReport> = files.iter().map(|f| capture::check_file(f)).collect();
    let mut total = Tally::default();
    for r in &reports {
        total.add(&r.tally);
    }
    let unreadable = reports.iter().any(|r| r.error.is_some());
    let status = if unreadable {
        2
    } else if total.passed() {
        0
    } else {
        1
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if json {
        let doc = serde_json::json!({ "files": reports, "tally": total, "exit_status": status });
        serde_json::to_writer_pretty(&mut out, &doc).map_err(std::io::Error::from).and_then(|_| writeln!(out))
    } else {
        print_text(&mut out, &reports, &total, quiet)
    };
    // A closed pipe (`| head`) is not an error of the check; the status still stands.
    let _ = written.and_then(|_| out.flush());
    ExitCode::from(status)
}

fn print_text(out: &mut impl Write, reports: &[FileReport], total: &Tally, quiet: bool) -> std::io::Result<()> {
    for r in reports {
        writeln!(out, "== {}", r.file)?;
        if let Some(e) = &r.error {
            writeln!(out, "error: {e}")?;
            continue;
        }
        for rec in &r.records {
            if !quiet || rec.check.is_failure() {
                writeln!(out, "{rec}")?;
            }
        }
        for n in &r.notes {
            writeln!(out, "note: {n}")?;
        }
        writeln!(out, "tally: {}", r.tally)?;
    }
    if reports.len() > 1 {
        writeln!(out, "== total: {total}")?;
    }
    Ok(())
}
