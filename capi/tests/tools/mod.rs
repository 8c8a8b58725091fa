//! Running Debian's unmodified RDMA programs on the library: each with a device of its own
//! on a loopback address, as an unprivileged user when the tests run as root.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.parent().and_then(|d| d.parent()).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// `tool args` with the library and one RoCEv2 device `softrdma0` on `addr`; as an unprivileged
/// user (nobody) when the tests run as root, since needing no privilege is the point.
pub fn tool(tool: &str, addr: &str, args: &[&str]) -> Command {
    tool_on(tool, "rocev2", addr, args)
}

/// As [`tool`], with the device's transport named (`rocev2` or `iwarp`).
pub fn tool_on(tool: &str, transport: &str, addr: &str, args: &[&str]) -> Command {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut c = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", tool]);
        c
    } else {
        Command::new(tool)
    };
    c.args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("SOFTRDMA_DEVICES", format!("softrdma0 {transport} {addr}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for `child` at most `limit`, killing it past that.
pub fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("the child was started")
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}
