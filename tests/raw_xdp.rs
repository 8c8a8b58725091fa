//! RoCEv2 on raw Ethernet over AF_XDP between network namespaces joined by a veth pair:
//! AF_XDP to AF_XDP over IPv4 and IPv6, to a packet-socket device and to a kernel-UDP-socket
//! device, every operation's data checked; the kernel's own traffic on the interface
//! untouched while the program is attached; and the program gone when the device closes
//! and when its process is killed. Needs root; each test makes and removes its own
//! namespaces.

mod netns;
mod rc_pair;

use netns::pair_or_skip;
use rc_pair::*;
use softrdma::transport::raw::FrameIo;
use softrdma::verbs::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What `ip -n NS link show IFACE` says.
fn link_show(ns: &str, iface: &str) -> String {
    let out = Command::new("ip").args(["-n", ns, "link", "show", iface]).output().expect("ip link show");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether an XDP program is attached to the interface: `ip link` then shows `xdp`,
/// `xdpgeneric` or `xdpdrv` beside the MTU and a `prog/xdp` line (interface names here
/// never contain "xdp").
fn xdp_attached(ns: &str, iface: &str) -> bool {
    link_show(ns, iface).contains("xdp")
}

/// Waits up to `wait` for the program to be attached (`want`) or gone.
fn await_xdp(ns: &str, iface: &str, want: bool, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        if xdp_attached(ns, iface) == want {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ping(ns: &str, to: &str) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c", "2", "-i", "0.2", "-W", "2", to])
        .output()
        .expect("ping")
}

#[test]
fn xdp_devices_run_every_operation_over_ipv4_and_detach_on_close() {
    let Some(pair) = pair_or_skip("xdp ipv4") else { return };
    let a = side(open_in(&pair, 0, raw_cfg(&pair, 0, "10.9.0.1/24", FrameIo::Xdp)), 4 << 20);
    let b = side(open_in(&pair, 1, raw_cfg(&pair, 1, "10.9.0.2/24", FrameIo::Xdp)), 4 << 20);
    let link = a.ctx.link();
    eprintln!("xdp ipv4: {link}");
    assert!(link.contains("AF_XDP"), "{link}");
    assert!(xdp_attached(&pair.ns[0], &pair.ifaces[0]), "{}", link_show(&pair.ns[0], &pair.ifaces[0]));
    connect(&a, &b);
    every_operation(&a, &b);
    every_operation(&b, &a);
    let (sa, sb) = (a.ctx.stats(), b.ctx.stats());
    assert!(sa.neighbour_requests >= 1 && sb.neighbour_replies >= 1, "{sa:?} {sb:?}");
    for s in [&sa, &sb] {
        assert_eq!((s.rx_icrc_bad, s.tx_errors, s.tx_unresolved), (0, 0, 0), "{s:?}");
        // The program hands the device its own frames only.
        assert_eq!(s.rx_not_ours, 0, "{s:?}");
    }
    assert!(sb.rx_datagrams >= 1024, "a 1 MiB WRITE is 1024 frames at MTU 1024");
    drop((a, b));
    for i in 0..2 {
        assert!(await_xdp(&pair.ns[i], &pair.ifaces[i], false, WAIT), "the program left {}", pair.ifaces[i]);
    }
}

#[test]
fn xdp_devices_run_over_ipv6_with_neighbour_discovery() {
    let Some(pair) = pair_or_skip("xdp ipv6") else { return };
    let a = side(open_in(&pair, 0, raw_cfg(&pair, 0, "fd00:9::1/64", FrameIo::Xdp)), 4 << 20);
    let b = side(open_in(&pair, 1, raw_cfg(&pair, 1, "fd00:9::2/64", FrameIo::Xdp)), 4 << 20);
    connect(&a, &b);
    every_operation(&a, &b);
    let (sa, sb) = (a.ctx.stats(), b.ctx.stats());
    // B's Neighbour Solicitation went to A's solicited-node group, which A's program takes.
    assert!(sa.neighbour_requests >= 1 && sb.neighbour_replies >= 1, "{sa:?} {sb:?}");
    assert_eq!((sa.rx_icrc_bad, sb.rx_icrc_bad, sa.tx_errors, sb.tx_errors), (0, 0, 0, 0), "{sa:?} {sb:?}");
}

#[test]
fn an_xdp_device_and_a_packet_socket_device_interoperate() {
    let Some(pair) = pair_or_skip("xdp to packet") else { return };
    let a = side(open_in(&pair, 0, raw_cfg(&pair, 0, "10.9.0.1/24", FrameIo::Xdp)), 4 << 20);
    let b = side(open_in(&pair, 1, raw_cfg(&pair, 1, "10.9.0.2/24", FrameIo::PacketSocket)), 4 << 20);
    assert!(b.ctx.link().contains("AF_PACKET"), "{}", b.ctx.link());
    connect(&a, &b);
    every_operation(&a, &b);
    every_operation(&b, &a);
    let (sa, sb) = (a.ctx.stats(), b.ctx.stats());
    assert_eq!((sa.rx_icrc_bad, sb.rx_icrc_bad, sa.tx_errors, sb.tx_errors), (0, 0, 0, 0), "{sa:?} {sb:?}");
}

#[test]
fn an_xdp_device_and_a_udp_socket_device_interoperate_and_the_kernel_pings_it() {
    let Some(pair) = pair_or_skip("xdp to udp") else { return };
    let (a, b) = udp_and_raw(&pair, FrameIo::Xdp);
    every_operation(&a, &b);
    every_operation(&b, &a);
    // The kernel beside the UDP-socket device resolves the XDP device (ARP through the
    // program) and gets its echo replies.
    let out = ping(&pair.ns[0], "10.9.0.2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let (sa, sb) = (a.ctx.stats(), b.ctx.stats());
    assert!(sb.echo_replies >= 2 && sb.neighbour_replies >= 1, "{sb:?}");
    assert_eq!((sa.rx_icrc_bad, sb.rx_icrc_bad), (0, 0), "{sa:?} {sb:?}");
}

#[test]
fn traffic_not_for_the_xdp_device_still_reaches_the_kernel() {
    let Some(pair) = pair_or_skip("xdp passes the rest") else { return };
    pair.kernel_addr(0, "10.9.0.1/24").unwrap();
    pair.kernel_addr(1, "10.9.0.2/24").unwrap();
    let dev = open_in(&pair, 1, raw_cfg(&pair, 1, "10.9.0.12/24", FrameIo::Xdp));
    assert!(xdp_attached(&pair.ns[1], &pair.ifaces[1]));
    // The kernel of namespace 1 still answers for its own address on the same interface
    // (ARP and ICMP pass through the program), and the device answers for its own.
    let kernel = ping(&pair.ns[0], "10.9.0.2");
    assert!(kernel.status.success(), "{}", String::from_utf8_lossy(&kernel.stdout));
    let device = ping(&pair.ns[0], "10.9.0.12");
    assert!(device.status.success(), "{}", String::from_utf8_lossy(&device.stdout));
    // And TCP to the kernel, as the tools' out-of-band exchange uses.
    let listener = pair.run_in(1, || std::net::TcpListener::bind("10.9.0.2:0").expect("listen"));
    let port = listener.local_addr().unwrap().port();
    let connected = pair.run_in(0, move || std::net::TcpStream::connect(("10.9.0.2", port)).is_ok());
    assert!(connected, "TCP to the kernel's address on the XDP interface");
    let s = dev.stats();
    assert!(s.echo_replies >= 2, "{s:?}");
    assert_eq!(s.rx_not_ours, 0, "the kernel's frames never reach the device: {s:?}");
}

/// Set in the child of the test below: the netns handle and interface to open an XDP
/// device on, separated by a space.
const CHILD_ENV: &str = "SOFTRDMA_XDP_CHILD";

/// Not a test on its own: in a child process started by the test below, opens an XDP
/// device and waits to be killed.
#[test]
#[ignore = "the child process of a_killed_process_leaves_no_xdp_program_behind"]
fn xdp_child_process_holds_a_device() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let (path, iface) = spec.split_once(' ').expect("NETNS IFACE");
    softrdma::transport::enter_netns(std::path::Path::new(path)).expect("setns");
    let mut cfg = OpenConfig::raw(iface, "10.9.0.2".parse().unwrap(), 24);
    cfg.raw.as_mut().unwrap().frame_io = FrameIo::Xdp;
    let _ctx = Context::open(cfg).expect("open an XDP device");
    println!("opened");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_killed_process_leaves_no_xdp_program_behind() {
    let Some(pair) = pair_or_skip("xdp after SIGKILL") else { return };
    let (ns, iface) = (&pair.ns[1], &pair.ifaces[1]);
    let spec = format!("{} {iface}", pair.path(1).display());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["xdp_child_process_holds_a_device", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, spec)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child");
    let attached = await_xdp(ns, iface, true, Duration::from_secs(30));
    if !attached {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("the child attached no program: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(child.try_wait().unwrap().is_none(), "the child is alive, holding the device");
    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    assert!(await_xdp(ns, iface, false, WAIT), "still attached: {}", link_show(ns, iface));
}
