//! `softrdma udp-bw`: a plain UDP stream between two hosts, datagrams of one size sent
//! 32 to a system call and no GSO, as `softrdma demo`'s loopback baseline sends them. It
//! is the ceiling of what the path carries in datagrams the size of one RoCEv2 packet,
//! measured on the same path and in the same run as the RDMA bandwidth figures it is set
//! against (`interop/compare`'s baseline). The receiver counts; the client prints.
//!
//! The exchange: the client says hello until the server answers ready (it may start
//! later), streams for the time asked, then says end until the server answers with what
//! it received. The server answers every end it hears with the same tally, so a lost
//! tally costs a repeat, and leaves once the client has been quiet for a while.

use crate::transport::{send_batch, wait_readable, RecvBatch};
use std::io::ErrorKind;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The first byte of every datagram says what it is.
const MARK_DATA: u8 = 0;
const MARK_END: u8 = 1;
const MARK_TALLY: u8 = 2;
const MARK_HELLO: u8 = 3;
const MARK_READY: u8 = 4;
/// A tally: its mark, then the datagrams, bytes and nanoseconds it counted (big-endian).
const TALLY_LEN: usize = 25;
/// Datagrams per `sendmmsg` and per `recvmmsg`.
const BATCH: usize = 32;
/// The server's room per datagram: the largest a UDP datagram can be, so that it counts
/// whatever size the client sends, whole.
const DATAGRAM_MAX: usize = 65_535;
/// How long the server waits for a client to say hello.
const HELLO_WAIT: Duration = Duration::from_secs(300);
/// How long the client says hello (every [`RESEND_EVERY`]) before it gives up.
const READY_WAIT: Duration = Duration::from_secs(20);
/// How long the client says end before it gives up on the tally.
const TALLY_WAIT: Duration = Duration::from_secs(5);
/// How often the client repeats a hello or an end that was not answered.
const RESEND_EVERY: Duration = Duration::from_millis(100);
/// The server leaves once it has heard nothing for this long after a tally (or, mid-stream,
/// treats the stream as over: a client that died).
const QUIET_WAIT: Duration = Duration::from_secs(2);

/// What `softrdma udp-bw` was asked to do.
#[derive(Debug, Clone)]
pub struct UdpBwArgs {
    /// The server to stream to; `None`: be the server.
    pub server: Option<String>,
    /// UDP port of the server.
    pub port: u16,
    /// Payload bytes of the client's datagrams (the server takes any size).
    pub size: usize,
    /// How long the client streams, seconds.
    pub seconds: f64,
    /// One JSON document instead of a line of text.
    pub json: bool,
}

/// What the receiver counted: the data datagrams after the first, and the time from the
/// first to the last (the first only starts the clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    /// Datagrams counted.
    pub datagrams: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// From the first data datagram to the last, ns.
    pub elapsed_ns: u64,
}

impl Tally {
    /// The tally as the server sends it.
    pub fn encode(&self) -> [u8; TALLY_LEN] {
        let mut b = [0u8; TALLY_LEN];
        b[0] = MARK_TALLY;
        b[1..9].copy_from_slice(&self.datagrams.to_be_bytes());
        b[9..17].copy_from_slice(&self.bytes.to_be_bytes());
        b[17..25].copy_from_slice(&self.elapsed_ns.to_be_bytes());
        b
    }

    /// A tally from a datagram; `None` if it is not one.
    pub fn decode(b: &[u8]) -> Option<Tally> {
        if b.len() != TALLY_LEN || b[0] != MARK_TALLY {
            return None;
        }
        let word = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("eight bytes"));
        Some(Tally { datagrams: word(1), bytes: word(9), elapsed_ns: word(17) })
    }

    /// Received payload bytes per second; 0 when nothing was timed.
    pub fn bytes_per_s(&self) -> f64 {
        self.per_s(self.bytes)
    }

    /// Received datagrams per second; 0 when nothing was timed.
    pub fn datagrams_per_s(&self) -> f64 {
        self.per_s(self.datagrams)
    }

    fn per_s(&self, count: u64) -> f64 {
        if self.elapsed_ns == 0 {
            return 0.0;
        }
        count as f64 * 1e9 / self.elapsed_ns as f64
    }
}

/// Runs the server or the client side; the client prints the result.
pub fn run(a: &UdpBwArgs) -> Result<(), String> {
    let size = a.size.max(1);
    let Some(server) = &a.server else {
        let socket = UdpSocket::bind(("0.0.0.0", a.port)).map_err(|e| format!("port {}: {e}", a.port))?;
        return serve(&socket).map(|_| ()).map_err(|e| format!("serving on port {}: {e}", a.port));
    };
    let to = (server.as_str(), a.port)
        .to_socket_addrs()
        .map_err(|e| format!("{server}: {e}"))?
        .next()
        .ok_or_else(|| format!("{server}: no address"))?;
    let secs = Duration::from_secs_f64(a.seconds.max(0.01));
    let (sent, tally) = stream(to, size, secs).map_err(|e| format!("streaming to {to}: {e}"))?;
    print_result(size, sent, &tally, a.json);
    Ok(())
}

fn print_result(size: usize, sent: u64, t: &Tally, json: bool) {
    let mb = t.bytes_per_s() / f64::from(1u32 << 20);
    let per_s = t.datagrams_per_s();
    if json {
        let doc = serde_json::json!({"test": "udp_bw", "size": size, "datagrams_sent": sent,
            "datagrams_received": t.datagrams, "elapsed_ns": t.elapsed_ns,
            "bw_avg_bytes_per_s": t.bytes_per_s(), "datagrams_per_s": per_s});
        println!("{doc}");
    } else {
        println!(
            " udp_bw {size} bytes: {} of {sent} datagrams received, {mb:.2} MB/sec (2^20 bytes), {per_s:.0} datagrams/s",
            t.datagrams
        );
    }
}

/// Serves one client: answers its hellos, counts its stream, answers its ends with the
/// tally until it has been quiet for [`QUIET_WAIT`]; returns the tally.
fn serve(s: &UdpSocket) -> std::io::Result<Tally> {
    let mut batch = RecvBatch::new(BATCH, DATAGRAM_MAX);
    let mut tally = Tally::default();
    let mut first: Option<Instant> = None;
    let mut ended = false;
    let mut heard = Instant::now();
    loop {
        let quiet = if first.is_none() && !ended { HELLO_WAIT } else { QUIET_WAIT };
        if heard.elapsed() > quiet {
            return if ended {
                Ok(tally)
            } else {
                Err(std::io::Error::new(ErrorKind::TimedOut, "the client went quiet"))
            };
        }
        wait_readable(&[s.as_raw_fd()], Some(Duration::from_millis(100)))?;
        let n = batch.recv(s.as_raw_fd())?;
        if n > 0 {
            // One clock read per batch, not per datagram: the batch arrived together.
            heard = Instant::now();
        }
        for i in 0..n {
            let Some((d, from, _)) = batch.get(i) else { continue };
            match d.first() {
                Some(&MARK_DATA) if !ended => count(&mut tally, &mut first, d.len(), heard),
                Some(&MARK_HELLO) => {
                    s.send_to(&[MARK_READY], from)?;
                }
                Some(&MARK_END) => {
                    ended = true;
                    s.send_to(&tally.encode(), from)?;
                }
                _ => {}
            }
        }
    }
}

/// One data datagram of `len` bytes read at `now`: the first starts the clock, the others
/// count.
fn count(tally: &mut Tally, first: &mut Option<Instant>, len: usize, now: Instant) {
    match first {
        None => *first = Some(now),
        Some(at) => {
            tally.datagrams += 1;
            tally.bytes += len as u64;
            tally.elapsed_ns = now.duration_since(*at).as_nanos() as u64;
        }
    }
}

/// Streams `size`-byte datagrams to `to` for `secs` once the server is ready; returns how
/// many were sent and the server's tally.
fn stream(to: SocketAddr, size: usize, secs: Duration) -> std::io::Result<(u64, Tally)> {
    let bind: SocketAddr =
        if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let s = UdpSocket::bind(bind)?;
    s.connect(to)?;
    let mut buf = vec![0u8; TALLY_LEN + 64];
    ask(&s, &[MARK_HELLO], &mut buf, READY_WAIT, |d| d == [MARK_READY])?;
    let mut payload = vec![0x5au8; size];
    payload[0] = MARK_DATA;
    let msgs: Vec<(SocketAddr, &[u8])> = (0..BATCH).map(|_| (to, &payload[..])).collect();
    let (start, mut sent) = (Instant::now(), 0u64);
    while start.elapsed() < secs {
        match send_batch(&s, &msgs) {
            Ok(n) => sent += n as u64,
            // A full socket buffer or an ICMP error for an earlier datagram: the stream goes on.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::ConnectionRefused) => {}
            Err(e) => return Err(e),
        }
    }
    let got = ask(&s, &[MARK_END], &mut buf, TALLY_WAIT, |d| Tally::decode(d).is_some())?;
    Ok((sent, Tally::decode(&buf[..got]).expect("checked by ask")))
}

/// Sends `msg` every [`RESEND_EVERY`] until a datagram that `wanted` accepts comes back
/// (into `buf`; its length), for at most `wait`.
fn ask(
    s: &UdpSocket,
    msg: &[u8],
    buf: &mut [u8],
    wait: Duration,
    wanted: impl Fn(&[u8]) -> bool,
) -> std::io::Result<usize> {
    s.set_read_timeout(Some(RESEND_EVERY))?;
    let start = Instant::now();
    while start.elapsed() < wait {
        match s.send(msg) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(e),
        }
        let answer_by = Instant::now() + RESEND_EVERY;
        while Instant::now() < answer_by {
            match s.recv(buf) {
                Ok(n) if wanted(&buf[..n]) => return Ok(n),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::ConnectionRefused
                    ) =>
                {
                    break
                }
                Err(e) => return Err(e),
            }
        }
    }
    Err(std::io::Error::new(ErrorKind::TimedOut, "the server did not answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_on_loopback() -> (SocketAddr, std::thread::JoinHandle<std::io::Result<Tally>>) {
        let s = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
        let addr = s.local_addr().unwrap();
        (addr, std::thread::spawn(move || serve(&s)))
    }

    #[test]
    fn a_tally_survives_the_wire_and_nothing_else_passes_for_one() {
        let t = Tally { datagrams: 123_456, bytes: 128_394_240, elapsed_ns: 4_000_000_123 };
        assert_eq!(Tally::decode(&t.encode()), Some(t));
        assert_eq!(Tally::decode(&t.encode()[..TALLY_LEN - 1]), None, "short");
        let mut data = t.encode();
        data[0] = MARK_DATA;
        assert_eq!(Tally::decode(&data), None, "a data datagram of the same length");
        assert!((t.bytes_per_s() - 32_098_559.0).abs() < 1.0);
        assert!((t.datagrams_per_s() - 30_863.99).abs() < 0.01);
        assert_eq!(Tally::default().bytes_per_s(), 0.0, "nothing timed");
    }

    #[test]
    fn a_stream_on_loopback_is_counted_by_the_receiver() {
        let (addr, server) = server_on_loopback();
        let (sent, tally) = stream(addr, 1040, Duration::from_millis(200)).unwrap();
        assert_eq!(server.join().unwrap().unwrap(), tally, "the tally the client got is the server's");
        assert!(tally.datagrams > 100, "{tally:?}");
        assert!(tally.datagrams < sent, "the first datagram only starts the clock");
        assert_eq!(tally.bytes, tally.datagrams * 1040);
        assert!(tally.elapsed_ns > 0 && tally.elapsed_ns < 2_000_000_000, "{tally:?}");
    }

    #[test]
    fn an_end_heard_again_is_answered_again_with_the_same_tally() {
        let (addr, server) = server_on_loopback();
        let c = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
        c.connect(addr).unwrap();
        let mut buf = [0u8; 128];
        ask(&c, &[MARK_HELLO], &mut buf, READY_WAIT, |d| d == [MARK_READY]).unwrap();
        let mut data = [0x5au8; 64];
        data[0] = MARK_DATA;
        for _ in 0..11 {
            c.send(&data).unwrap();
        }
        let n = ask(&c, &[MARK_END], &mut buf, TALLY_WAIT, |d| Tally::decode(d).is_some()).unwrap();
        let first = Tally::decode(&buf[..n]).unwrap();
        assert_eq!((first.datagrams, first.bytes), (10, 640), "ten counted after the first");
        c.send(&data).unwrap();
        let n = ask(&c, &[MARK_END], &mut buf, TALLY_WAIT, |d| Tally::decode(d).is_some()).unwrap();
        assert_eq!(Tally::decode(&buf[..n]), Some(first), "data after the end is not counted");
        assert_eq!(server.join().unwrap().unwrap(), first);
    }
}
