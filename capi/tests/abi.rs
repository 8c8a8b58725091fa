//! The library against the real thing: its symbols carry the versions Debian's rdma-core
//! gives them, and Debian's unmodified `ibv_devinfo` runs on it. (The structures need no
//! test here: they are generated from the installed headers, and bindgen's layout checks
//! fail the build if Rust lays one out differently from the C compiler.)

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// target/<profile>/, where the build put libibverbs.so and its two names.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>/deps/<test>").to_path_buf();
    assert!(dir.join("libibverbs.so.1").exists(), "no libibverbs.so.1 in {}", dir.display());
    dir
}

/// Dynamic symbols of `path` starting with `prefixes`: name -> version.
fn versions(path: &std::path::Path, prefixes: &[&str]) -> BTreeMap<String, String> {
    let out = Command::new("objdump").arg("-T").arg(path).output().expect("objdump (binutils) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut map = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(name), Some(ver)) = (f.last(), f.len().checked_sub(2).and_then(|i| f.get(i))) else { continue };
        // Only defined symbols, at their default version (`(VER)` marks a hidden one),
        // not the version nodes themselves or the C library's.
        let ours = ver.starts_with("IBVERBS_") || ver.starts_with("RDMACM_");
        if line.contains("*UND*") || !ours || name == ver || !prefixes.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        map.insert(name.to_string(), ver.to_string());
    }
    map
}

#[test]
fn every_export_has_the_version_rdma_core_gives_it() {
    let ours = versions(&lib_dir().join("libibverbs.so.1"), &[""]);
    let sys = std::path::Path::new("/usr/lib/x86_64-linux-gnu");
    let mut real = versions(&sys.join("libibverbs.so.1"), &[""]);
    real.extend(versions(&sys.join("librdmacm.so.1"), &[""]));
    assert!(ours.len() >= 100, "exports: {ours:?}");
    for (name, ver) in &ours {
        let real = real.get(name);
        assert_eq!(real, Some(ver), "{name}: ours {ver}, rdma-core's {real:?}");
    }
}

fn devinfo(devices: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new("ibv_devinfo");
    cmd.args(args).env("LD_LIBRARY_PATH", lib_dir()).env_remove("SOFTRDMA_CONFIG");
    cmd.env("SOFTRDMA_CONFIG", "/nonexistent/softrdma-devices");
    match devices {
        Some(d) => cmd.env("SOFTRDMA_DEVICES", d),
        None => cmd.env_remove("SOFTRDMA_DEVICES"),
    };
    let out = cmd.output().expect("ibv_devinfo (Debian's ibverbs-utils) runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Every public function of rdma-core's libraries (each symbol at its default version:
/// what an application built today binds to) is there, at that version. The old
/// `IBVERBS_1.0` bindings rdma-core keeps beside them serve binaries built before 2007.
#[test]
fn every_public_symbol_of_rdma_core_is_exported() {
    let ours = versions(&lib_dir().join("libibverbs.so.1"), &[""]);
    let sys = std::path::Path::new("/usr/lib/x86_64-linux-gnu");
    let mut missing = Vec::new();
    for lib in ["libibverbs.so.1", "librdmacm.so.1"] {
        for (name, ver) in versions(&sys.join(lib), &[""]) {
            if ours.get(&name) != Some(&ver) {
                missing.push(format!("{lib}: {name}@@{ver}"));
            }
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// The programs of Debian's ibverbs-utils, rdmacm-utils and perftest: every symbol they
/// reference in either library is exported at that version.
#[test]
fn every_symbol_debians_rdma_tools_need_is_exported() {
    let ours = versions(&lib_dir().join("libibverbs.so.1"), &[""]);
    let mut tools = Vec::new();
    for package in ["ibverbs-utils", "rdmacm-utils", "perftest"] {
        let out = Command::new("dpkg").args(["-L", package]).output().expect("dpkg runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        tools.extend(text.lines().filter(|l| l.starts_with("/usr/bin/")).map(str::to_string));
    }
    assert!(tools.len() >= 30, "ibverbs-utils, rdmacm-utils and perftest installed: {tools:?}");
    let mut missing = Vec::new();
    for tool in &tools {
        let out = Command::new("objdump").arg("-T").arg(tool).output().expect("objdump runs");
        for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("*UND*")) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (name, ver) = (f[f.len() - 1], f[f.len() - 2].trim_matches(['(', ')']));
            if (ver.starts_with("IBVERBS_") || ver.starts_with("RDMACM_"))
                && ours.get(name).map(String::as_str) != Some(ver)
            {
                missing.push(format!("{tool}: {name}@{ver}"));
            }
        }
    }
    assert!(missing.is_empty(), "not exported at the version the tools reference: {missing:?}");
}

#[test]
fn debians_ibv_devinfo_lists_the_configured_devices() {
    let (ok, text) = devinfo(Some("softrdma0 rocev2 127.0.0.1; softiwarp0 iwarp 127.0.0.1"), &["-v"]);
    assert!(ok, "{text}");
    for want in [
        "hca_id:\tsoftrdma0",
        "transport:\t\t\tInfiniBand (0)",
        "hca_id:\tsoftiwarp0",
        "transport:\t\t\tiWARP (1)",
        "node_guid:\t\t\t025e:7fff:fe00:0001",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "max_qp_rd_atom:\t\t\t128",
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn no_configuration_is_no_devices_and_a_bad_one_is_named() {
    let (ok, text) = devinfo(None, &[]);
    assert!(!ok && text.contains("No IB devices found"), "{text}");
    let (ok, text) = devinfo(Some("x rocev2 not-an-address"), &[]);
    assert!(!ok, "{text}");
    assert!(text.contains("\"x rocev2 not-an-address\": not an IP address"), "{text}");
}
