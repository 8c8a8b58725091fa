//! What the hostile suites share: one test at a time, and the process's memory at the
//! height of an attack.

/// The tests of a suite run one at a time: they measure the process's memory.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A line of /proc/self/status, KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The resident set size now, KiB, with the process's peak reset to it.
pub fn rss_kib() -> u64 {
    // Writing 5 to clear_refs resets VmHWM, the peak RSS (Linux 4.0 and later).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    status_kib("VmRSS:")
}

/// The peak resident set size since [`rss_kib`], KiB: what an attack cost at its height.
pub fn peak_rss_kib() -> u64 {
    status_kib("VmHWM:")
}
