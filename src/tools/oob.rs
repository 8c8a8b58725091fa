//! perftest's out-of-band exchange over TCP, byte for byte as perftest 6.06 (Debian 12)
//! speaks it, so that a softrdma tool and `ib_write_bw` & co. can face each other.
//!
//! Order on the socket (the client writes first in every exchange, the server reads first):
//! version string (16 bytes, NUL padded), then for peers of version 5.32 and later the page
//! and cache line sizes (4-byte big-endian each), then the path MTU as the `ibv_mtu` enum in
//! decimal (2 bytes for 5.31 and later), then "handshakes": each a 108-byte key message
//! `lid:out_reads:qpn:psn:rkey:vaddr:gid bytes…:srqn:` with a NUL. Bandwidth reports go as
//! big-endian u64 size and iterations and three big-endian doubles. "done" ends it.
//!
//! With rdma_cm (perftest's `-R`, the only way over iWARP) the same exchanges travel as
//! RDMA Sends on a QP of their own, connected through rdma_cm to the same port: each exchange is
//! one Send each way, key messages are the binary `struct pingpong_dest` (56 bytes,
//! big-endian fields), and no "done" follows the last handshake.

use crate::engine::verbs::{Gid, Mtu};
use crate::verbs::{
    Access, CompletionQueue, ConnParam, Context, Listener, MemoryRegion, OpenConfig, ProtectionDomain, QpCaps,
    QueuePair, RecvWr, SendOp, SendWr, WcStatus,
};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// perftest's default port.
pub const DEFAULT_PORT: u16 = 18515;
/// The version softrdma announces: Debian 12's perftest.
pub const VERSION: &str = "6.06";
const VERSION_LEN: usize = 16;
const KEY_MSG_LEN: usize = 108;
/// The oldest perftest that speaks this exchange (perftest refuses older ones too).
const OLDEST_VERSION: f64 = 5.70;

/// How long a silent peer is waited for before the exchange fails.
const PEER_TIMEOUT: Duration = Duration::from_secs(60);

/// An out-of-band failure, said plainly.
#[derive(Debug)]
pub enum OobError {
    /// The socket failed or the peer left.
    Io(io::Error),
    /// The peer sent something that is not perftest's exchange.
    Protocol(String),
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OobError::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                ) =>
            {
                write!(f, "the peer closed the out-of-band connection ({e})")
            }
            OobError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                write!(f, "the peer said nothing for {} s", PEER_TIMEOUT.as_secs())
            }
            OobError::Io(e) => write!(f, "out-of-band connection: {e}"),
            OobError::Protocol(s) => write!(f, "out-of-band exchange: {s}"),
        }
    }
}

impl std::error::Error for OobError {}

impl From<io::Error> for OobError {
    fn from(e: io::Error) -> Self {
        OobError::Io(e)
    }
}

/// One QP's connection data (perftest's `struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding READs/atomics the sender allows.
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// The PSN the sender starts with.
    pub psn: u32,
    /// rkey of the sender's buffer.
    pub rkey: u32,
    /// Address of the sender's receive area.
    pub vaddr: u64,
    /// The sender's GID.
    pub gid: Gid,
    /// SRQ number (XRC only; 0).
    pub srqn: u32,
}

impl Dest {
    /// The 108-byte key message.
    pub fn to_msg(&self) -> [u8; KEY_MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_MSG_LEN];
        let n = s.len().min(KEY_MSG_LEN - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }

    /// Parses a key message.
    pub fn parse(msg: &[u8]) -> Result<Dest, OobError> {
        let text = msg.split(|&b| b == 0).next().unwrap_or(&[]);
        let text = std::str::from_utf8(text).map_err(|_| bad_keys(msg))?;
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() < 23 {
            return Err(bad_keys(msg));
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad_keys(msg));
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = hex(fields[6 + i])? as u8;
        }
        Ok(Dest {
            lid: hex(fields[0])? as u16,
            out_reads: hex(fields[1])? as u16,
            qpn: hex(fields[2])? as u32 & 0xff_ffff,
            psn: hex(fields[3])? as u32 & 0xff_ffff,
            rkey: hex(fields[4])? as u32,
            vaddr: hex(fields[5])?,
            gid,
            srqn: hex(fields[22])? as u32,
        })
    }
}

impl Dest {
    /// The binary `struct pingpong_dest` rdma_cm exchanges carry: lid, out_reads, qpn,
    /// psn, rkey (4 bytes each), 4 bytes of padding, vaddr (8), the GID, srqn, gid_index.
    pub fn to_bin(&self) -> [u8; CM_KEY_LEN] {
        let mut b = [0u8; CM_KEY_LEN];
        let words = [u32::from(self.lid), u32::from(self.out_reads), self.qpn, self.psn, self.rkey];
        for (i, w) in words.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&w.to_be_bytes());
        }
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b
    }

    /// Parses the binary form.
    pub fn from_bin(b: &[u8; CM_KEY_LEN]) -> Dest {
        let word = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&b[24..32]);
        Dest {
            lid: word(0) as u16,
            out_reads: word(4) as u16,
            qpn: word(8) & 0xff_ffff,
            psn: word(12) & 0xff_ffff,
            rkey: word(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: word(48),
        }
    }
}

/// `sizeof(struct pingpong_dest)` on x86-64 and aarch64.
pub const CM_KEY_LEN: usize = 56;

fn bad_keys(msg: &[u8]) -> OobError {
    OobError::Protocol(format!("not a perftest key message: {:?}", String::from_utf8_lossy(msg)))
}

/// A bandwidth report as perftest exchanges it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size, bytes.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth (perftest's unit: MB/s or Gb/s as the run reports).
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Messages per second, millions.
    pub msg_rate: f64,
}

/// The first address of `host:port`.
pub fn resolve(host: &str, port: u16) -> io::Result<std::net::SocketAddr> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address")))
}

/// Connects an iWARP QP to `to`, retrying for a few seconds on a TCP failure (the server
/// not listening yet), as perftest's rdma_cm client retries.
pub fn connect_qp_retrying(qp: &QueuePair, to: std::net::SocketAddr, p: &ConnParam) -> Result<Vec<u8>, OobError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match qp.connect(to, p, Duration::from_secs(10)) {
            Ok(pd) => return Ok(pd),
            Err(
                crate::verbs::ConnectError::Tcp(_)
                | crate::verbs::ConnectError::Refused(_)
                | crate::verbs::ConnectError::NoListener(_),
            ) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(OobError::Protocol(format!("connecting to {to}: {e}"))),
        }
    }
}

/// Connects to `host:port`, retrying for a few seconds while nobody listens yet (a client
/// started just before its server).
pub fn connect_retrying(host: &str, port: u16) -> io::Result<TcpStream> {
    let addr = resolve(host, port)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// The exchange's own iWARP QP (perftest's `comm->rdma_ctx`). Fields drop in order: the
/// QP before its device.
pub struct CmChannel {
    qp: QueuePair,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    mr: MemoryRegion,
    /// The server's listener, open from the exchange's connection to the test QPs' (as
    /// perftest's server listens once): perftest's client connects its test QP 70-120 ms
    /// after the exchange's, and a port closed and listened on again in between refused
    /// it when the server was slow (a first run in a QEMU/TCG guest).
    listener: Option<Listener>,
    _pd: ProtectionDomain,
    ctx: std::sync::Arc<Context>,
}

const CM_RECV_AT: usize = 64;

impl CmChannel {
    fn new(cfg: &OpenConfig) -> Result<CmChannel, OobError> {
        let ctx = std::sync::Arc::new(Context::open(cfg.clone())?);
        let pd = ctx.alloc_pd();
        let (scq, rcq) = (ctx.create_cq(4), ctx.create_cq(4));
        let mr = ctx.reg_mr(&pd, 2 * CM_RECV_AT, Access::ALL).map_err(verbs_err)?;
        let caps = QpCaps { max_send_wr: 2, max_recv_wr: 2, max_sge: 1 };
        let qp = ctx.create_cm_qp(&pd, (&scq, &rcq), caps, None).map_err(verbs_err)?;
        let c = CmChannel { qp, scq, rcq, mr, listener: None, _pd: pd, ctx };
        c.post_recv()?;
        Ok(c)
    }

    fn post_recv(&self) -> Result<(), OobError> {
        let sge = self.mr.sge(CM_RECV_AT, CM_KEY_LEN as u32);
        self.qp.post_recv(RecvWr { wr_id: 0, sgl: vec![sge] }).map_err(verbs_err)
    }

    fn send(&self, data: &[u8]) -> Result<(), OobError> {
        self.mr.write(0, data);
        self.qp.post_send(SendWr::new(1, SendOp::Send, vec![self.mr.sge(0, data.len() as u32)])).map_err(verbs_err)?;
        match self.scq.wait(PEER_TIMEOUT) {
            Some(wc) if wc.status == WcStatus::Success => Ok(()),
            Some(wc) => Err(OobError::Protocol(format!("the exchange's Send completed with {:?}", wc.status))),
            None => Err(OobError::Io(io::ErrorKind::TimedOut.into())),
        }
    }

    fn recv(&self, out: &mut [u8]) -> Result<(), OobError> {
        match self.rcq.wait(PEER_TIMEOUT) {
            Some(wc) if wc.status == WcStatus::Success => {
                self.mr.read(CM_RECV_AT, out);
                self.post_recv()
            }
            Some(_) => Err(OobError::Io(io::ErrorKind::ConnectionReset.into())),
            None => Err(OobError::Io(io::ErrorKind::TimedOut.into())),
        }
    }
}

fn verbs_err(e: crate::verbs::VerbsError) -> OobError {
    OobError::Protocol(format!("the exchange's QP: {e:?}"))
}

enum Channel {
    Tcp(TcpStream),
    Cm(Box<CmChannel>),
}

/// One side of perftest's out-of-band connection.
pub struct Oob {
    chan: Channel,
    client: bool,
    /// The peer's perftest version.
    pub peer_version: f64,
}

impl Oob {
    /// The server side: waits for one client on `port` (all addresses).
    pub fn accept(port: u16) -> Result<Oob, OobError> {
        let listener = TcpListener::bind(("0.0.0.0", port))?;
        let (stream, _) = listener.accept()?;
        Oob::new(stream, false)
    }

    /// The client side.
    pub fn connect(server: &str, port: u16) -> Result<Oob, OobError> {
        Oob::new(connect_retrying(server, port)?, true)
    }

    fn new(stream: TcpStream, client: bool) -> Result<Oob, OobError> {
        stream.set_read_timeout(Some(PEER_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Oob { chan: Channel::Tcp(stream), client, peer_version: 0.0 })
    }

    /// The rdma_cm server side: accepts one connection on `port` for the exchange (MPA on
    /// iWARP, the CM on RoCEv2), on a device opened with `cfg`, and keeps listening for the
    /// test QPs' connections ([`Oob::take_listener`]).
    pub fn accept_cm(cfg: &OpenConfig, port: u16) -> Result<Oob, OobError> {
        let mut chan = CmChannel::new(cfg)?;
        let listener = chan.ctx.listen(std::net::SocketAddr::new(cfg.addr, port))?;
        let req =
            listener.get_request(Duration::from_secs(24 * 3600)).ok_or(OobError::Io(io::ErrorKind::TimedOut.into()))?;
        req.accept(&chan.qp, &ConnParam::default()).map_err(|e| OobError::Protocol(e.to_string()))?;
        chan.listener = Some(listener);
        Ok(Oob { chan: Channel::Cm(Box::new(chan)), client: false, peer_version: 0.0 })
    }

    /// The server's listener, open since the exchange's connection came in, for the test
    /// QPs' connections; `None` on a client or over TCP.
    pub fn take_listener(&mut self) -> Option<Listener> {
        match &mut self.chan {
            Channel::Cm(c) => c.listener.take(),
            Channel::Tcp(_) => None,
        }
    }

    /// The rdma_cm client side: connects the exchange's QP to `server:port`, retrying a
    /// few seconds while nobody listens yet.
    pub fn connect_cm(cfg: &OpenConfig, server: &str, port: u16) -> Result<Oob, OobError> {
        let to = resolve(server, port)?;
        let chan = CmChannel::new(cfg)?;
        connect_qp_retrying(&chan.qp, to, &ConnParam::default())?;
        // siw as responder reads the stream only once its QP is in RTS, a moment after its
        // MPA Reply (perftest's client sleeps a second here too).
        std::thread::sleep(Duration::from_millis(200));
        Ok(Oob { chan: Channel::Cm(Box::new(chan)), client: true, peer_version: 0.0 })
    }

    /// The device an rdma_cm exchange runs on: the tests run on it too, as perftest's do
    /// (one device per address: a second raw device on the same address would answer for
    /// the first one's connections).
    pub fn device(&self) -> Option<std::sync::Arc<Context>> {
        match &self.chan {
            Channel::Cm(c) => Some(c.ctx.clone()),
            Channel::Tcp(_) => None,
        }
    }

    /// The local address of the TCP connection: the one to run RDMA from.
    pub fn local_ip(&self) -> io::Result<std::net::IpAddr> {
        match &self.chan {
            Channel::Tcp(s) => Ok(s.local_addr()?.ip()),
            Channel::Cm(_) => Err(io::Error::new(io::ErrorKind::Unsupported, "an rdma_cm exchange")),
        }
    }

    /// True when the exchange runs over rdma_cm.
    pub fn is_cm(&self) -> bool {
        matches!(self.chan, Channel::Cm(_))
    }

    /// perftest's `ctx_xchg_data`: the client writes then reads, the server the reverse.
    fn exchange(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<(), OobError> {
        match &mut self.chan {
            Channel::Tcp(stream) if self.client => {
                stream.write_all(mine)?;
                stream.read_exact(theirs)?;
            }
            Channel::Tcp(stream) => {
                stream.read_exact(theirs)?;
                stream.write_all(mine)?;
            }
            Channel::Cm(c) if self.client => {
                c.send(mine)?;
                c.recv(theirs)?;
            }
            Channel::Cm(c) => {
                c.recv(theirs)?;
                c.send(mine)?;
            }
        }
        Ok(())
    }

    /// Versions, system data and MTU; returns the MTU both sides use.
    pub fn preamble(&mut self, mtu: Mtu) -> Result<Mtu, OobError> {
        let mut mine = [0u8; VERSION_LEN];
        mine[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; VERSION_LEN];
        self.exchange(&mine, &mut theirs)?;
        let text = theirs.split(|&b| b == 0).next().unwrap_or(&[]);
        let version = std::str::from_utf8(text).ok().and_then(|s| s.trim().parse::<f64>().ok());
        self.peer_version = match version {
            Some(v) if v >= OLDEST_VERSION => v,
            Some(v) => return Err(OobError::Protocol(format!("peer perftest version {v} is older than 5.70"))),
            None => {
                let got = String::from_utf8_lossy(&theirs);
                return Err(OobError::Protocol(format!("not a perftest peer (version field {got:?})")));
            }
        };
        // Page size and cache line size: both sides keep the larger.
        for mine in [4096u32, 64] {
            let mut theirs = [0u8; 4];
            self.exchange(&mine.to_be_bytes(), &mut theirs)?;
        }
        let mine = [b'0' + mtu.code(), 0];
        let mut theirs = [0u8; 2];
        self.exchange(&mine, &mut theirs)?;
        let peer = theirs[0].checked_sub(b'0').and_then(Mtu::from_code);
        Ok(match peer {
            Some(p) if p.bytes() < mtu.bytes() => p,
            _ => mtu,
        })
    }

    /// One handshake: our key message for theirs.
    pub fn handshake(&mut self, mine: &Dest) -> Result<Dest, OobError> {
        if self.is_cm() {
            let mut theirs = [0u8; CM_KEY_LEN];
            self.exchange(&mine.to_bin(), &mut theirs)?;
            return Ok(Dest::from_bin(&theirs));
        }
        let mut theirs = [0u8; KEY_MSG_LEN];
        self.exchange(&mine.to_msg(), &mut theirs)?;
        Dest::parse(&theirs)
    }

    /// perftest's `xchg_bw_reports`.
    pub fn exchange_reports(&mut self, mine: &BwReport) -> Result<BwReport, OobError> {
        let mut r = BwReport::default();
        let mut b8 = [0u8; 8];
        self.exchange(&mine.size.to_be_bytes(), &mut b8)?;
        r.size = u64::from_be_bytes(b8);
        self.exchange(&mine.iters.to_be_bytes(), &mut b8)?;
        r.iters = u64::from_be_bytes(b8);
        for (m, t) in [(mine.bw_peak, &mut r.bw_peak), (mine.bw_avg, &mut r.bw_avg), (mine.msg_rate, &mut r.msg_rate)] {
            self.exchange(&m.to_bits().to_be_bytes(), &mut b8)?;
            *t = f64::from_bits(u64::from_be_bytes(b8));
        }
        Ok(r)
    }

    /// perftest's `ctx_close_connection`: a last handshake, then "done".
    pub fn close(&mut self, mine: &Dest) -> Result<(), OobError> {
        self.handshake(mine)?;
        match &mut self.chan {
            Channel::Tcp(stream) => stream.write_all(b"done\0")?,
            // siw (Linux 6.1) completes its last Send in error when the peer's FIN comes
            // right behind it (seen live: perftest's server then fails); linger a moment,
            // as perftest's own teardown does, before the connections close.
            Channel::Cm(_) => std::thread::sleep(Duration::from_millis(300)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::Transport;

    #[test]
    fn key_message_matches_perftests_format() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 77, 0, 2]);
        let d = Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x5555_0000_1000,
            gid,
            srqn: 0,
        };
        let msg = d.to_msg();
        let text = std::str::from_utf8(&msg[..107]).unwrap();
        assert_eq!(
            text,
            "0000:0010:000011:abcdef:00001234:0000555500001000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:02:00000000:"
        );
        assert_eq!(msg[107], 0);
        assert_eq!(Dest::parse(&msg).unwrap(), d);
        assert!(Dest::parse(b"garbage").is_err());
    }

    #[test]
    fn mtu_enum_round_trips() {
        for m in [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096] {
            assert_eq!(Mtu::from_code(m.code()), Some(m));
        }
        assert_eq!(Mtu::from_code(0), None);
        assert_eq!(Mtu::from_code(6), None);
    }

    fn iwarp_on(ip: [u8; 4]) -> OpenConfig {
        let mut cfg = OpenConfig::new(std::net::IpAddr::from(ip));
        cfg.transport = Transport::Iwarp;
        cfg
    }

    /// perftest's client connects its test QP right behind the exchange's: the port must
    /// still be listening once the exchange's connection is taken (it was closed and
    /// listened on again later, and a client that came in between was refused).
    #[test]
    fn an_rdma_cm_server_keeps_listening_after_the_exchanges_connection() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let server = std::thread::spawn(move || Oob::accept_cm(&iwarp_on([127, 0, 0, 1]), port));
        let client = Oob::connect_cm(&iwarp_on([127, 0, 0, 2]), "127.0.0.1", port).expect("the exchange connects");
        let mut served = server.join().unwrap().expect("the server takes it");
        assert!(TcpStream::connect(("127.0.0.1", port)).is_ok(), "the next connection finds the port open");
        assert!(served.take_listener().is_some(), "handed on to the test QPs' connections");
        drop(client);
    }
}
