//! Network namespaces joined by a veth pair, made with `ip` and removed when dropped:
//! the stage for the raw-Ethernet tests and `softrdma demo --veth`. Needs root.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Two namespaces `a` and `b`, veth `<a>` in one and `<b>` in the other, both up; removed
/// (with the veth) when dropped, also when the test panics.
pub struct VethPair {
    /// Namespace names.
    pub ns: [String; 2],
    /// Interface names, one in each namespace.
    pub ifaces: [String; 2],
}

impl VethPair {
    /// Makes the pair, or says why not (not root, no `ip`).
    pub fn new() -> Result<VethPair, String> {
        VethPair::named("srt")
    }

    /// As [`VethPair::new`], the namespaces' names starting with `prefix`.
    pub fn named(prefix: &str) -> Result<VethPair, String> {
        if !is_root() {
            return Err("needs root for network namespaces".into());
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}x{n}", std::process::id() % 100_000);
        let ns = [format!("{prefix}{tag}a"), format!("{prefix}{tag}b")];
        let ifaces = [format!("v{tag}a"), format!("v{tag}b")];
        let pair = VethPair { ns: ns.clone(), ifaces: ifaces.clone() };
        for n in &ns {
            ip(&["netns", "add", n])?;
        }
        ip(&["link", "add", &ifaces[0], "type", "veth", "peer", "name", &ifaces[1]])?;
        for i in 0..2 {
            ip(&["link", "set", &ifaces[i], "netns", &ns[i]])?;
            ip(&["-n", &ns[i], "link", "set", &ifaces[i], "up"])?;
            ip(&["-n", &ns[i], "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    /// Gives the kernel in namespace `i` an address on its veth.
    pub fn kernel_addr(&self, i: usize, cidr: &str) -> Result<(), String> {
        ip(&["-n", &self.ns[i], "addr", "add", cidr, "dev", &self.ifaces[i]])
    }

    /// Sets both ends' MTU.
    pub fn mtu(&self, mtu: u32) -> Result<(), String> {
        for i in 0..2 {
            ip(&["-n", &self.ns[i], "link", "set", &self.ifaces[i], "mtu", &mtu.to_string()])?;
        }
        Ok(())
    }

    /// The handle of namespace `i`, for `setns`.
    pub fn path(&self, i: usize) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.ns[i]))
    }

    /// Runs `f` on a thread inside namespace `i`: sockets it opens live there.
    pub fn run_in<T: Send + 'static>(&self, i: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = self.path(i);
        std::thread::spawn(move || {
            crate::transport::enter_netns(&path).expect("setns");
            f()
        })
        .join()
        .expect("the thread in the namespace panicked")
    }
}

impl VethPair {
    /// As [`VethPair::run_in`] for a closure that borrows (the thread is scoped).
    pub fn scoped_in<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> T {
        let path = self.path(i);
        std::thread::scope(|s| {
            s.spawn(move || {
                crate::transport::enter_netns(&path).expect("setns");
                f()
            })
            .join()
            .expect("the thread in the namespace panicked")
        })
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it its peer.
        for n in &self.ns {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// Three namespaces in a row, `a`, `mid` and `b`, veths `a`-`mid` and `mid`-`b`, all up:
/// the stage for an in-path bridge (`softrdma inject`) in `mid` between two endpoints.
/// Removed when dropped, also when the test panics.
pub struct InPath {
    /// Namespace names: a, mid, b.
    pub ns: [String; 3],
    /// Interface names: a's, mid's towards a, mid's towards b, b's.
    pub ifaces: [String; 4],
}

impl InPath {
    /// Makes the stage, or says why not (not root, no `ip`).
    pub fn new(prefix: &str) -> Result<InPath, String> {
        if !is_root() {
            return Err("needs root for network namespaces".into());
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}x{n}", std::process::id() % 100_000);
        let ns = [format!("{prefix}{tag}a"), format!("{prefix}{tag}m"), format!("{prefix}{tag}b")];
        let ifaces = [format!("v{tag}a"), format!("v{tag}ma"), format!("v{tag}mb"), format!("v{tag}b")];
        let stage = InPath { ns: ns.clone(), ifaces: ifaces.clone() };
        for n in &ns {
            ip(&["netns", "add", n])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        for (pair, (ns_x, ns_y)) in [(0, (0, 1)), (2, (1, 2))] {
            let (x, y) = (&ifaces[pair], &ifaces[pair + 1]);
            ip(&["link", "add", x, "type", "veth", "peer", "name", y])?;
            for (dev, n) in [(x, &ns[ns_x]), (y, &ns[ns_y])] {
                ip(&["link", "set", dev, "netns", n])?;
                ip(&["-n", n, "link", "set", dev, "up"])?;
            }
        }
        Ok(stage)
    }

    /// Gives the kernel in end namespace `a` (0) or `b` (1) an address on its veth.
    pub fn end_addr(&self, end: usize, cidr: &str) -> Result<(), String> {
        let (n, dev) = if end == 0 { (&self.ns[0], &self.ifaces[0]) } else { (&self.ns[2], &self.ifaces[3]) };
        ip(&["-n", n, "addr", "add", cidr, "dev", dev])
    }
}

impl Drop for InPath {
    fn drop(&mut self) {
        for n in &self.ns {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).map(|u| u.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}
