//! `softrdma rc-pingpong` and `ud-pingpong`: ibv_rc_pingpong's and ibv_ud_pingpong's
//! exchange and ping-pong, so either side can be rdma-core's example. Out of band (TCP port 18515): the client sends
//! `lid:qpn:psn:gid` (`%04x:%06x:%06x:` and the GID's 16 bytes as 32 hex digits, 52 bytes
//! with the NUL), the server connects its QP and answers with its own, the client says
//! "done". Then each side keeps receives posted and sends a message whenever its previous
//! send and a receive have both completed; the client starts. UD as ibv_ud_pingpong: Q_Key
//! 0x11111111, each receive buffer 40 bytes longer for the GRH, each Send from byte 40 to
//! the peer's QPN and GID, messages no larger than the path MTU.

use crate::verbs::*;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const MSG_LEN: usize = 52;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// ibv_rc_pingpong's options.
#[derive(Debug, Clone)]
pub struct PingPongArgs {
    /// Server to connect to; `None`: wait for a client.
    pub server: Option<String>,
    /// TCP port.
    pub port: u16,
    /// Message size.
    pub size: usize,
    /// Receives kept posted.
    pub rx_depth: usize,
    /// Exchanges.
    pub iters: u64,
    /// Path MTU.
    pub mtu: Mtu,
    /// Local GID index.
    pub gid_index: u8,
    /// Local address for RDMA (default: the TCP connection's).
    pub bind: Option<IpAddr>,
    /// Capture file.
    pub pcap: Option<PathBuf>,
    /// RoCEv2 on raw Ethernet with an address of its own (`None`: kernel UDP sockets).
    pub raw: Option<crate::verbs::RawConfig>,
    /// `-c`: check the received buffer as ibv_rc_pingpong does (see [`PAGE`]).
    pub validate: bool,
    /// UD (ibv_ud_pingpong) instead of RC.
    pub ud: bool,
}

/// ibv_ud_pingpong's Q_Key.
const UD_QKEY: u32 = 0x1111_1111;
/// The GRH space at the start of every UD receive buffer (IBTA 11.4.1.2).
const GRH_LEN: usize = 40;

/// ibv_rc_pingpong's `-c` works page by page: its buffers start filled with 0x7b, the
/// client writes `i / page_size % sizeof(char)` (which is 0) at the start of every page
/// before it sends, and the server checks those bytes once the exchanges are done.
const PAGE: usize = 4096;
const FILL: u8 = 0x7b;

/// A peer's address as the exchange carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PpDest {
    /// LID.
    pub lid: u16,
    /// QPN.
    pub qpn: u32,
    /// Starting PSN.
    pub psn: u32,
    /// GID.
    pub gid: Gid,
}

impl PpDest {
    /// The 52-byte message.
    pub fn to_msg(&self) -> [u8; MSG_LEN] {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let s = format!("{:04x}:{:06x}:{:06x}:{gid}", self.lid, self.qpn, self.psn);
        let mut out = [0u8; MSG_LEN];
        out[..s.len().min(MSG_LEN - 1)].copy_from_slice(&s.as_bytes()[..s.len().min(MSG_LEN - 1)]);
        out
    }

    /// Parses a message.
    pub fn parse(msg: &[u8]) -> Result<PpDest, String> {
        let bad = || format!("not an ibv_rc_pingpong address: {:?}", String::from_utf8_lossy(msg));
        let text = std::str::from_utf8(msg.split(|&b| b == 0).next().unwrap_or(&[])).map_err(|_| bad())?;
        let f: Vec<&str> = text.split(':').collect();
        if f.len() != 4 || f[3].len() != 32 {
            return Err(bad());
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(PpDest { lid: hex(f[0])? as u16, qpn: hex(f[1])? & 0xff_ffff, psn: hex(f[2])? & 0xff_ffff, gid })
    }
}

fn gid_text(g: &Gid) -> String {
    std::net::Ipv6Addr::from(*g).to_string()
}

fn io(e: std::io::Error) -> String {
    format!("out-of-band connection: {e}")
}

/// The out-of-band connection: the client connects, the server takes one.
fn oob_stream(a: &PingPongArgs) -> Result<TcpStream, String> {
    let stream = match &a.server {
        Some(s) => {
            super::oob::connect_retrying(s, a.port).map_err(|e| format!("cannot connect to {s}:{}: {e}", a.port))?
        }
        None => TcpListener::bind(("0.0.0.0", a.port)).and_then(|l| l.accept()).map(|(s, _)| s).map_err(io)?,
    };
    stream.set_read_timeout(Some(Duration::from_secs(60))).map_err(io)?;
    Ok(stream)
}

/// The device, on `--bind`, the raw device's address, or the exchange's own.
fn open_device(a: &PingPongArgs, stream: &TcpStream) -> Result<(Context, Option<Mtu>), String> {
    let local = match a.bind {
        Some(ip) => ip,
        None => stream.local_addr().map_err(io)?.ip(),
    };
    let mut cfg = OpenConfig::new(a.raw.as_ref().map_or(local, |r| r.ip));
    cfg.raw = a.raw.clone();
    cfg.pcap = a.pcap.clone();
    let (local, link_mtu) = (cfg.addr, cfg.active_mtu());
    let ctx = Context::open(cfg).map_err(|e| format!("cannot open a device on {local}: {e}"))?;
    Ok((ctx, link_mtu))
}

/// The exchange of addresses: the client writes first and says "done" last; each side
/// connects its QP once it has the other's address.
fn exchange(
    a: &PingPongArgs,
    stream: &mut TcpStream,
    mine: &PpDest,
    connect: impl Fn(&PpDest) -> Result<(), String>,
) -> Result<PpDest, String> {
    let mut msg = [0u8; MSG_LEN];
    if a.server.is_some() {
        stream.write_all(&mine.to_msg()).map_err(io)?;
        stream.read_exact(&mut msg).map_err(io)?;
        stream.write_all(b"done\0").map_err(io)?;
        let rem = PpDest::parse(&msg)?;
        connect(&rem)?;
        Ok(rem)
    } else {
        stream.read_exact(&mut msg).map_err(io)?;
        let rem = PpDest::parse(&msg)?;
        connect(&rem)?;
        stream.write_all(&mine.to_msg()).map_err(io)?;
        let mut done = [0u8; 5];
        stream.read_exact(&mut done).map_err(io)?;
        Ok(rem)
    }
}

fn print_dest(which: &str, d: &PpDest) {
    println!("  {which} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}", d.lid, d.qpn, d.psn, gid_text(&d.gid));
}

/// `-c` on the server: the first byte of every page is the client's 0.
fn check_pages(a: &PingPongArgs, mr: &MemoryRegion) -> Result<(), String> {
    for page in (0..a.size).step_by(PAGE) {
        let mut b = [FILL];
        mr.read(page, &mut b);
        if b[0] != 0 {
            return Err(format!("invalid data in page {}", page / PAGE));
        }
    }
    Ok(())
}

/// Runs ibv_rc_pingpong's (or ibv_ud_pingpong's) test and prints its two report lines.
pub fn run(a: &PingPongArgs) -> Result<(), String> {
    let mut stream = oob_stream(a)?;
    let (ctx, link_mtu) = open_device(a, &stream)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(a.rx_depth + 1);
    let grh = if a.ud { GRH_LEN } else { 0 };
    let mtu = link_mtu.filter(|l| l.bytes() < a.mtu.bytes()).unwrap_or(a.mtu);
    if a.ud && a.size > mtu.bytes() {
        return Err(format!("Requested size larger than port MTU ({})", mtu.bytes()));
    }
    let mr = ctx.reg_mr(&pd, (a.size + grh).max(1), Access::ALL).map_err(|e| format!("{e:?}"))?;
    let caps = QpCaps { max_send_wr: 1, max_recv_wr: a.rx_depth, max_sge: 1 };
    let qp_type = if a.ud { QpType::Ud } else { QpType::Rc };
    let qp = ctx.create_qp(&pd, &cq, &cq, qp_type, caps, None).map_err(|e| format!("{e:?}"))?;
    let init = match a.ud {
        true => QpAttr { state: Some(QpState::Init), qkey: Some(UD_QKEY), pkey: Some(0xffff), ..QpAttr::default() },
        false => QpAttr { state: Some(QpState::Init), access: Some(Access::ALL), ..QpAttr::default() },
    };
    qp.modify(&init).map_err(|e| format!("{e:?}"))?;
    // Filled before any receive is posted, as ibv_rc_pingpong fills it at allocation: the
    // peer's first SEND may land as soon as the QP reaches RTR.
    mr.write(0, &vec![FILL; (a.size + grh).max(1)]);
    let recv = || qp.post_recv(RecvWr { wr_id: RECV_WRID, sgl: vec![mr.sge(0, (a.size + grh) as u32)] });
    for _ in 0..a.rx_depth {
        recv().map_err(|e| format!("post_recv: {e:?}"))?;
    }
    let gid = ctx.gid(a.gid_index).ok_or(format!("GID index {} does not exist", a.gid_index))?;
    let mine = PpDest { lid: 0, qpn: qp.qp_num(), psn: ctx.random_psn(), gid };
    print_dest("local address: ", &mine);
    let rem = exchange(a, &mut stream, &mine, |rem| match a.ud {
        true => connect_ud(&qp, mine.psn),
        false => connect_qp(&qp, rem, mine.psn, mtu, a.gid_index),
    })?;
    print_dest("remote address:", &rem);
    if a.validate && a.server.is_some() {
        for page in (0..a.size).step_by(PAGE) {
            mr.write(page, &[0]);
        }
    }
    let to = a.ud.then_some(UdDest { gid: rem.gid, qpn: rem.qpn, qkey: UD_QKEY });
    let usec = pingpong(a, &qp, &cq, &mr, to, recv)?;
    if a.validate && a.server.is_none() {
        check_pages(a, &mr)?;
    }
    let bytes = a.size as u64 * a.iters * 2;
    println!("{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec", usec / 1e6, bytes as f64 * 8.0 / usec);
    println!("{} iters in {:.2} seconds = {:.2} usec/iter", a.iters, usec / 1e6, usec / a.iters as f64);
    Ok(())
}

/// ibv_ud_pingpong's transitions: RTR needs nothing for UD, RTS the send PSN.
fn connect_ud(qp: &QueuePair, my_psn: u32) -> Result<(), String> {
    let state = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    qp.modify(&state(QpState::Rtr)).map_err(|e| format!("modify QP to RTR: {e:?}"))?;
    qp.modify(&QpAttr { sq_psn: Some(my_psn), ..state(QpState::Rts) }).map_err(|e| format!("modify QP to RTS: {e:?}"))
}

fn connect_qp(qp: &QueuePair, rem: &PpDest, my_psn: u32, mtu: Mtu, sgid: u8) -> Result<(), String> {
    let state = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    qp.modify(&QpAttr {
        path_mtu: Some(mtu),
        dest_qpn: Some(rem.qpn),
        rq_psn: Some(rem.psn),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(12),
        dest_gid: Some(rem.gid),
        sgid_index: Some(sgid),
        ..state(QpState::Rtr)
    })
    .map_err(|e| format!("modify QP to RTR: {e:?}"))?;
    qp.modify(&QpAttr {
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        sq_psn: Some(my_psn),
        max_rd_atomic: Some(1),
        ..state(QpState::Rts)
    })
    .map_err(|e| format!("modify QP to RTS: {e:?}"))
}

/// The ping-pong loop of ibv_rc_pingpong (and, with `ud` the peer's address, of
/// ibv_ud_pingpong, whose Sends start after the GRH space); returns its duration in µs.
fn pingpong(
    a: &PingPongArgs,
    qp: &QueuePair,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    ud: Option<UdDest>,
    recv: impl Fn() -> Result<(), VerbsError>,
) -> Result<f64, String> {
    let at = if ud.is_some() { GRH_LEN } else { 0 };
    let send = || {
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send, vec![mr.sge(at, a.size as u32)]);
        wr.ud = ud;
        qp.post_send(wr)
    };
    let mut pending = RECV_WRID;
    if a.server.is_some() {
        send().map_err(|e| format!("post_send: {e:?}"))?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    while rcnt < a.iters || scnt < a.iters {
        let wc = cq.wait(Duration::from_secs(30)).ok_or("no completion for 30 s")?;
        if wc.status != WcStatus::Success {
            return Err(format!("Failed status {:?} for wr_id {}", wc.status, wc.wr_id));
        }
        match wc.wr_id {
            SEND_WRID => scnt += 1,
            RECV_WRID => {
                rcnt += 1;
                recv().map_err(|e| format!("post_recv: {e:?}"))?;
            }
            other => return Err(format!("Completion for unknown wr_id {other}")),
        }
        pending &= !wc.wr_id;
        if scnt < a.iters && pending == 0 {
            send().map_err(|e| format!("post_send: {e:?}"))?;
            pending = RECV_WRID | SEND_WRID;
        }
    }
    Ok(start.elapsed().as_secs_f64() * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_matches_ibv_rc_pingpong() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 77, 0, 2]);
        let d = PpDest { lid: 0, qpn: 0x11, psn: 0x0a0b0c, gid };
        let m = d.to_msg();
        assert_eq!(&m[..51], b"0000:000011:0a0b0c:00000000000000000000ffff0a4d0002");
        assert_eq!(m[51], 0);
        assert_eq!(PpDest::parse(&m).unwrap(), d);
        assert!(PpDest::parse(b"0000:11:22:short").is_err());
    }
}
