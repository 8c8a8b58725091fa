//! The `softrdma` command-line tool.

use clap::{Parser, Subcommand};
use softrdma::capture::{self, report::FileReport, report::Tally};
use std::io::Write;
use std::path::PathBuf;
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
    },
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Pcap { command: PcapCommand::Check { files, json, quiet } } => pcap_check(&files, json, quiet),
        Command::Sim { seed: Some(seed), .. } => sim_one(seed),
        Command::Sim { seed: None, seeds, from } => sim_many(from, seeds),
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

fn sim_many(from: u64, count: u64) -> ExitCode {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let next = AtomicU64::new(from);
    let end = from.saturating_add(count);
    let failed = AtomicBool::new(false);
    let totals = std::sync::Mutex::new((0u64, 0u64, 0u64));
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
    let (wrs, packets, corrupted) = totals.lock().map(|t| *t).unwrap_or_default();
    println!(
        "{count} seeds ok ({from}..{end}): {wrs} work requests, {packets} packets, {corrupted} corrupted and caught"
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
