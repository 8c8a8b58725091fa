//! The `softrdma` command-line tool.

use clap::{Parser, Subcommand};
use softrdma::capture::{self, report::FileReport, report::Tally};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "softrdma",
    version,
    about = "A complete RDMA engine in software: RoCEv2 and iWARP"
)]
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
        Command::Pcap {
            command: PcapCommand::Check { files, json, quiet },
        } => pcap_check(&files, json, quiet),
    }
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
    if json {
        let doc = serde_json::json!({ "files": reports, "tally": total, "exit_status": status });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_text(&reports, &total, quiet);
    }
    ExitCode::from(status)
}

fn print_text(reports: &[FileReport], total: &Tally, quiet: bool) {
    for r in reports {
        println!("== {}", r.file);
        if let Some(e) = &r.error {
            println!("error: {e}");
            continue;
        }
        for rec in &r.records {
            if !quiet || rec.check.is_failure() {
                println!("{rec}");
            }
        }
        for n in &r.notes {
            println!("note: {n}");
        }
        println!("tally: {}", r.tally);
    }
    if reports.len() > 1 {
        println!("== total: {total}");
    }
}
