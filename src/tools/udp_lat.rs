//! `softrdma udp-lat`: a plain UDP ping-pong between two hosts, each side spinning on a
//! non-blocking socket as the RDMA latency tools spin on their CQ. It is the floor that
//! RoCEv2 over kernel sockets stands on, measured on the same path and in the same run as
//! the RDMA figures it is set against (`interop/compare`'s baseline).

use super::bench::LatResult;
use super::perf::lat_json;
use crate::transport::udp_floor::{self, FloorEndpoint};
use std::io::ErrorKind;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

/// Round trips before the measured ones (caches, ARP, the peer's first wake-up).
const WARMUP_ITERS: usize = 50;
/// How long the client retries its first ping while the server may still be starting.
const FIRST_PING_WAIT: Duration = Duration::from_secs(20);
/// How long either side waits for one datagram once the exchange runs.
const REPLY_WAIT: Duration = Duration::from_secs(2);

/// What `softrdma udp-lat` was asked to do.
#[derive(Debug, Clone)]
pub struct UdpLatArgs {
    /// The server to ping; `None`: be the server.
    pub server: Option<String>,
    /// UDP port of the server.
    pub port: u16,
    /// Datagram payload bytes.
    pub size: usize,
    /// Measured round trips (both sides must agree, as with perftest's -n).
    pub iters: usize,
    /// One JSON document instead of a line of text.
    pub json: bool,
    /// Make a RoCEv2 device's socket calls in each turn instead of plain UDP's.
    pub calls: Option<RoceCalls>,
}

/// The socket calls of one turn of a RoCEv2 ping-pong, as a device makes them on sockets
/// opened as it opens them ([`udp_floor`]), with none of its work: the kernel's share of
/// the RDMA latency tools' figures on the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoceCalls {
    /// A WRITE ping-pong's turn: an 8-byte WRITE and the ACK it held (40 and 20 bytes) in
    /// one GSO send, received with GRO.
    Write,
    /// A READ's leg: one 32-byte datagram.
    Read,
}

impl RoceCalls {
    fn sizes(self) -> &'static [usize] {
        match self {
            RoceCalls::Write => udp_floor::WRITE_TURN,
            RoceCalls::Read => udp_floor::READ_LEG,
        }
    }

    fn name(self) -> &'static str {
        match self {
            RoceCalls::Write => "udp_lat_write_calls",
            RoceCalls::Read => "udp_lat_read_calls",
        }
    }
}

impl std::str::FromStr for RoceCalls {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write" => Ok(RoceCalls::Write),
            "read" => Ok(RoceCalls::Read),
            _ => Err(format!("{s}: write or read")),
        }
    }
}

/// Runs the server or the client side; the client prints the result.
pub fn run(a: &UdpLatArgs) -> Result<(), String> {
    let total = WARMUP_ITERS + a.iters.max(1);
    let Some(server) = &a.server else {
        let served = match a.calls {
            Some(calls) => serve_calls(a.port, calls, total),
            None => serve(a.port, a.size, total),
        };
        return served.map_err(|e| format!("serving on port {}: {e}", a.port));
    };
    let to = (server.as_str(), a.port)
        .to_socket_addrs()
        .map_err(|e| format!("{server}: {e}"))?
        .next()
        .ok_or_else(|| format!("{server}: no address"))?;
    let r = match a.calls {
        Some(calls) => ping_calls(to, calls, total),
        None => ping(to, a.size, total),
    }
    .map_err(|e| format!("pinging {to}: {e}"))?;
    let test = a.calls.map_or("udp_lat", RoceCalls::name);
    if a.json {
        let doc = serde_json::json!({"test": test, "results": [lat_json(&r)],
            "rtt_typical_us": r.typical() * 2.0});
        println!("{doc}");
    } else {
        println!(
            " {test} {} bytes, {} round trips: one-way typical {:.2} µs (round trip {:.2} µs), min {:.2}, 99% {:.2}",
            r.size,
            r.usec.len(),
            r.typical(),
            r.typical() * 2.0,
            r.min(),
            r.percentile(0.99)
        );
    }
    Ok(())
}

/// Echoes `total` datagrams back to whoever sent them.
fn serve(port: u16, size: usize, total: usize) -> std::io::Result<()> {
    let s = UdpSocket::bind(("0.0.0.0", port))?;
    s.set_nonblocking(true)?;
    let mut buf = vec![0u8; size.max(1) + 1];
    // The first ping may be a long time coming: the client starts when it will.
    let (n, from) = recv_spin(&s, &mut buf, Duration::from_secs(300))?;
    s.send_to(&buf[..n], from)?;
    for _ in 1..total {
        let (n, from) = recv_spin(&s, &mut buf, REPLY_WAIT)?;
        s.send_to(&buf[..n], from)?;
    }
    Ok(())
}

/// As [`serve`], each turn answered with `calls`' datagrams in one message.
fn serve_calls(port: u16, calls: RoceCalls, total: usize) -> std::io::Result<()> {
    let mut ep = calls_endpoint(port, calls)?;
    for turn in 0..total {
        ep.recv_spinning(if turn == 0 { Duration::from_secs(300) } else { REPLY_WAIT })?;
        let from = ep.last_source().ok_or_else(|| std::io::Error::other("a message with no source"))?;
        ep.send_turn(from)?;
    }
    Ok(())
}

/// As [`ping`], each turn `calls`' datagrams in one message; the first sent again every
/// 100 ms until the server answers.
fn ping_calls(to: SocketAddr, calls: RoceCalls, total: usize) -> std::io::Result<LatResult> {
    let mut ep = calls_endpoint(0, calls)?;
    let start = Instant::now();
    loop {
        ep.send_turn(to)?;
        match ep.recv_spinning(Duration::from_millis(100)) {
            Ok(()) => break,
            Err(e) if start.elapsed() < FIRST_PING_WAIT && is_retryable(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    let stamps = (1..total).map(|_| {
        let t0 = Instant::now();
        ep.send_turn(to).and_then(|()| ep.recv_spinning(REPLY_WAIT)).map(|()| t0.elapsed().as_secs_f64() * 1e6 / 2.0)
    });
    let usec = stamps.collect::<std::io::Result<Vec<f64>>>()?;
    Ok(measured(8, usec))
}

/// One socket, made as a device makes its receive socket, that sends the turns too: the
/// peer answers to where a turn came from.
fn calls_endpoint(port: u16, calls: RoceCalls) -> std::io::Result<FloorEndpoint> {
    let s = udp_floor::open_receive_socket(SocketAddr::from(([0, 0, 0, 0], port)))?;
    Ok(FloorEndpoint::on((s.try_clone()?, s), calls.sizes()))
}

/// The round trips after the warm-up ones, sorted.
fn measured(size: usize, mut usec: Vec<f64>) -> LatResult {
    let n = usec.len().saturating_sub(WARMUP_ITERS - 1);
    let mut usec = usec.split_off(usec.len() - n);
    usec.sort_by(f64::total_cmp);
    LatResult { size, usec }
}

/// Pings `to` `total` times; the last `total - WARMUP_ITERS` round trips, halved (one-way,
/// as perftest reports a ping-pong), sorted.
fn ping(to: SocketAddr, size: usize, total: usize) -> std::io::Result<LatResult> {
    let s = UdpSocket::bind(("0.0.0.0", 0))?;
    s.connect(to)?;
    s.set_nonblocking(true)?;
    let payload = vec![0x5au8; size];
    let mut buf = vec![0u8; size.max(1) + 1];
    first_ping(&s, &payload, &mut buf)?;
    let mut usec = Vec::with_capacity(total);
    for _ in 1..total {
        let t0 = Instant::now();
        s.send(&payload)?;
        recv_spin(&s, &mut buf, REPLY_WAIT)?;
        usec.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    Ok(measured(size, usec))
}

/// The first ping, sent again every 100 ms until the server answers.
fn first_ping(s: &UdpSocket, payload: &[u8], buf: &mut [u8]) -> std::io::Result<()> {
    let start = Instant::now();
    loop {
        s.send(payload).or_else(|e| if e.kind() == ErrorKind::ConnectionRefused { Ok(0) } else { Err(e) })?;
        match recv_spin(s, buf, Duration::from_millis(100)) {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() < FIRST_PING_WAIT && is_retryable(&e) => continue,
            Err(e) => return Err(e),
        }
    }
}

fn is_retryable(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::ConnectionRefused)
}

/// One datagram, spinning on the non-blocking socket (yielding every 64 looks), at most
/// `wait`.
fn recv_spin(s: &UdpSocket, buf: &mut [u8], wait: Duration) -> std::io::Result<(usize, SocketAddr)> {
    let start = Instant::now();
    for looks in 1u64.. {
        match s.recv_from(buf) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => return other,
        }
        if looks.is_multiple_of(64) {
            if start.elapsed() > wait {
                return Err(std::io::Error::new(ErrorKind::TimedOut, "no datagram in time"));
            }
            std::thread::yield_now();
        }
    }
    unreachable!("the loop returns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_and_a_server_on_loopback_measure_every_round_trip() {
        let port = {
            let probe = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
            probe.local_addr().unwrap().port()
        };
        let total = WARMUP_ITERS + 200;
        let server = std::thread::spawn(move || serve(port, 64, total));
        let r = ping(SocketAddr::from(([127, 0, 0, 1], port)), 64, total).unwrap();
        server.join().unwrap().unwrap();
        assert_eq!(r.usec.len(), 200, "the warm-up is not measured");
        assert!(r.min() > 0.0 && r.usec.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_devices_socket_calls_ping_pong_between_a_client_and_a_server() {
        for calls in [RoceCalls::Write, RoceCalls::Read] {
            let port = {
                let probe = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
                probe.local_addr().unwrap().port()
            };
            let total = WARMUP_ITERS + 200;
            let server = std::thread::spawn(move || serve_calls(port, calls, total));
            let r = ping_calls(SocketAddr::from(([127, 0, 0, 1], port)), calls, total).unwrap();
            server.join().unwrap().unwrap();
            assert_eq!(r.usec.len(), 200, "{calls:?}: the warm-up is not measured");
            assert!(r.min() > 0.0 && r.usec.windows(2).all(|w| w[0] <= w[1]));
        }
        assert_eq!("write".parse(), Ok(RoceCalls::Write));
        assert!("ack".parse::<RoceCalls>().is_err());
    }
}
