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

/// A C program of `tests/c`, built with librdmacm and libibverbs into a directory of its
/// own that the unprivileged user can read; removed when dropped.
pub struct CProgram {
    dir: PathBuf,
    pub exe: String,
}

impl CProgram {
    pub fn build(name: &str) -> CProgram {
        use std::os::unix::fs::PermissionsExt;
        // Tests run in parallel, and two may build the same program.
        static BUILDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("softrdma-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let exe = dir.join(name);
        let source = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
        let mut cc = Command::new("cc");
        cc.args(["-O1", "-Wall", "-Werror", "-o"]).arg(&exe).arg(source).args(["-lrdmacm", "-libverbs"]);
        let out = cc.output().expect("a C compiler (cc) runs");
        assert!(out.status.success(), "{name}.c builds:\n{}", text(&out));
        CProgram { exe: exe.to_str().unwrap_or_default().to_string(), dir }
    }
}

impl Drop for CProgram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child that is killed when dropped, so that a test that fails halfway leaves no
/// server behind holding its address.
pub struct Reaped(Option<Child>);

impl Reaped {
    pub fn spawn(c: &mut Command) -> Reaped {
        Reaped(Some(c.spawn().expect("the program runs")))
    }

    /// As [`finish`].
    pub fn finish(mut self, limit: Duration) -> Output {
        finish(self.0.take().expect("not finished yet"), limit)
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (at most `limit`) until a server of `transport` on `addr` listens on `port`, so a
/// client started after it is not refused by a server still starting (on a loaded machine
/// a fixed pause was not always enough). A TCP listener (an iWARP one, or perftest's and
/// ibv_rc_pingpong's exchange) shows in /proc/net/tcp{,6} in state 0A; a RoCEv2 rdma_cm one
/// holds its port's abstract name on the shared address (/proc/net/unix,
/// src/transport/share.rs). False if it never came.
pub fn await_listener(transport: &str, addr: &str, port: u16, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        let found = match transport {
            "tcp" | "iwarp" => tcp_listens(port),
            _ => std::fs::read_to_string("/proc/net/unix")
                .is_ok_and(|t| t.lines().any(|l| l.ends_with(&format!("@softrdma/{addr}/4791/svc/{port}")))),
        };
        if found {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Whether some TCP socket listens on `port` (tests give each server a port of its own).
fn tcp_listens(port: u16) -> bool {
    let local = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|t| {
            t.lines().any(|l| {
                let mut f = l.split_whitespace();
                f.nth(1).is_some_and(|a| a.ends_with(&local)) && f.nth(1) == Some("0A")
            })
        })
    })
}
