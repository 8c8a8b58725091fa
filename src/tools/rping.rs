//! `softrdma rping`: rdma-core's rping (rdma_cm, port 7174) through the verbs API, over
//! iWARP (MPA on kernel TCP, or with `--iface` on smoltcp over raw Ethernet) or over RoCEv2
//! (`--transport rocev2`: IB CM on QP1, on UDP sockets or raw Ethernet), so that it pairs
//! with `rping` on siw, rxe or an RDMA NIC. Each ping: the client advertises its
//! start buffer (a 16-byte `buf:rkey:size` Send, big-endian), the server RDMA-Reads it,
//! says go ahead, the client advertises its sink buffer, the server RDMA-Writes the ping
//! back and says go ahead again; the client checks the echo.

use crate::verbs::{
    Access, CompletionQueue, ConnParam, Context, CrcPolicy, IwarpConfig, MemoryRegion, OpenConfig, ProtectionDomain,
    QpCaps, QueuePair, RawConfig, RecvWr, Remote, SendOp, SendWr, Sge, Transport, WcOpcode, WcStatus,
};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
const INFO_LEN: usize = 16;
/// How long any one step may take.
const STEP: Duration = Duration::from_secs(30);

/// rping's options.
#[derive(Debug, Clone)]
pub struct RpingArgs {
    /// Client (`-c`) or server (`-s`).
    pub client: bool,
    /// Address to connect to (client) or listen on (server).
    pub addr: String,
    /// TCP port.
    pub port: u16,
    /// Pings (0: until interrupted).
    pub count: u64,
    /// Ping buffer size.
    pub size: usize,
    /// Print each ping.
    pub verbose: bool,
    /// Check each echo.
    pub validate: bool,
    /// MPA CRC policy.
    pub crc: CrcPolicy,
    /// iWARP or RoCEv2.
    pub transport: Transport,
    /// Client: the local address to connect from (rping's `-I`).
    pub source: Option<IpAddr>,
    /// Ask for markers in what this side receives.
    pub markers: bool,
    /// iWARP on smoltcp over raw Ethernet, with an address of its own (`None`: kernel TCP).
    pub raw: Option<RawConfig>,
}

/// One side's connection: the device, the QP and its memory.
struct Conn {
    cq: CompletionQueue,
    qp: QueuePair,
    recv: MemoryRegion,
    send: MemoryRegion,
    start: MemoryRegion,
    rdma: MemoryRegion,
    recvs: u64,
    pending_recvs: u32,
    _pd: ProtectionDomain,
    _ctx: Context,
}

impl Conn {
    /// The QP's next completion (at most 30 s); a flushed one means the peer left.
    fn next_wc(&mut self) -> Result<crate::verbs::Wc, String> {
        let wc = self.cq.wait(STEP).ok_or("no completion for 30 s")?;
        match wc.status {
            WcStatus::Success => Ok(wc),
            WcStatus::WrFlushErr => Err("the peer closed the connection".into()),
            other => Err(format!("{:?} completed with {other:?}", wc.opcode)),
        }
    }

    /// Waits for one completion of `opcode`; a receive that arrives first is kept for the
    /// next wait for a receive (the peer may answer before our Send completes).
    fn wait_for(&mut self, opcode: WcOpcode) -> Result<(), String> {
        if opcode == WcOpcode::Recv && self.pending_recvs > 0 {
            self.pending_recvs -= 1;
            return Ok(());
        }
        loop {
            let wc = self.next_wc()?;
            if wc.opcode == WcOpcode::Recv {
                if wc.byte_len as usize != INFO_LEN {
                    return Err(format!("Received bogus data, size {}", wc.byte_len));
                }
                self.recvs += 1;
                self.post_recv()?;
                if opcode == WcOpcode::Recv {
                    return Ok(());
                }
                self.pending_recvs += 1;
            } else if wc.opcode == opcode {
                return Ok(());
            }
        }
    }

    fn post_recv(&mut self) -> Result<(), String> {
        self.qp
            .post_recv(RecvWr { wr_id: 1, sgl: vec![self.recv.sge(0, INFO_LEN as u32)] })
            .map_err(|e| format!("{e:?}"))
    }

    fn post(&mut self, op: SendOp, sge: Sge) -> Result<(), String> {
        self.qp.post_send(SendWr::new(2, op, vec![sge])).map_err(|e| format!("{e:?}"))
    }

    /// Sends `buf:rkey:size` of region `which` (big-endian, as rping's struct).
    fn advertise(&mut self, which: Which, size: usize) -> Result<(), String> {
        let mr = match which {
            Which::Start => &self.start,
            Which::Rdma => &self.rdma,
        };
        let mut info = [0u8; INFO_LEN];
        info[..8].copy_from_slice(&mr.addr().to_be_bytes());
        info[8..12].copy_from_slice(&mr.rkey().to_be_bytes());
        info[12..].copy_from_slice(&(size as u32).to_be_bytes());
        self.send.write(0, &info);
        let sge = self.send.sge(0, INFO_LEN as u32);
        self.post(SendOp::Send, sge)
    }

    /// The peer's last advertisement.
    fn advertised(&self) -> (Remote, usize) {
        let mut info = [0u8; INFO_LEN];
        self.recv.read(0, &mut info);
        let addr = u64::from_be_bytes(info[..8].try_into().unwrap_or_default());
        let rkey = u32::from_be_bytes(info[8..12].try_into().unwrap_or_default());
        let size = u32::from_be_bytes(info[12..].try_into().unwrap_or_default());
        (Remote { addr, rkey }, size as usize)
    }
}

/// The client's two regions it advertises.
#[derive(Clone, Copy)]
enum Which {
    Start,
    Rdma,
}

/// The device to open: iWARP as rping's rdma_cm sets it up (neither offering nor
/// accepting peer-to-peer RTR), or RoCEv2; from `local` or on a raw device.
fn open_config(a: &RpingArgs, local: IpAddr) -> OpenConfig {
    let mut cfg = OpenConfig::new(a.raw.as_ref().map_or(local, |r| r.ip));
    cfg.raw = a.raw.clone();
    cfg.transport = a.transport;
    cfg.iwarp = IwarpConfig { crc: a.crc, markers: a.markers, rtr: Vec::new(), ..IwarpConfig::default() };
    cfg
}

/// Connects (client) or accepts (server) through rdma_cm, one Read outstanding each way.
fn connect(a: &RpingArgs) -> Result<Conn, String> {
    let to = super::oob::resolve(&a.addr, a.port).map_err(|e| format!("{}: {e}", a.addr))?;
    let local = if let (true, Some(ip)) = (a.client, a.source) {
        ip
    } else if a.client {
        super::perf::route_source(&a.addr, a.port).map_err(|e| format!("no route to {}: {e}", a.addr))?
    } else {
        to.ip()
    };
    let ctx = Context::open(open_config(a, local)).map_err(|e| format!("cannot open a device: {e}"))?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16);
    let reg = |len: usize| ctx.reg_mr(&pd, len.max(1), Access::ALL).map_err(|e| format!("{e:?}"));
    let (recv, send, start, rdma) = (reg(INFO_LEN)?, reg(INFO_LEN)?, reg(a.size)?, reg(a.size)?);
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_sge: 1 };
    let qp = ctx.create_cm_qp(&pd, (&cq, &cq), caps, None).map_err(|e| format!("{e:?}"))?;
    let mut c = Conn { cq, qp, recv, send, start, rdma, recvs: 0, pending_recvs: 0, _pd: pd, _ctx: ctx };
    c.post_recv()?;
    let param = ConnParam { private_data: Vec::new(), responder_resources: 1, initiator_depth: 1 };
    if a.client {
        super::oob::connect_qp_retrying(&c.qp, to, &param).map_err(|e| e.to_string())?;
    } else {
        let at = SocketAddr::new(c._ctx.ip(), a.port);
        let at = if a.raw.is_some() { at } else { to };
        let listener = c._ctx.listen(at).map_err(|e| format!("cannot listen on {at}: {e}"))?;
        let req = listener.get_request(Duration::from_secs(24 * 3600)).ok_or("no connection request")?;
        req.accept(&c.qp, &param).map_err(|e| e.to_string())?;
    }
    Ok(c)
}

/// The ping rping puts in the start buffer: "rdma-ping-N: " then rotating letters.
fn ping_text(ping: u64, size: usize, start: u8) -> Vec<u8> {
    let mut b = format!("rdma-ping-{ping}: ").into_bytes();
    b.truncate(size);
    let mut c = start;
    while b.len() < size {
        b.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// Runs rping; `Ok` when every ping went through (or the peer closed after the count).
pub fn run(a: &RpingArgs) -> Result<(), String> {
    let mut c = connect(a)?;
    if a.client {
        // siw (Linux 6.1) as responder moves its QP to RTS a moment after sending the MPA
        // Reply and does not look again at data that arrived before: a Send sent at once
        // sits unread in its socket (seen live). Give the responder that moment.
        std::thread::sleep(Duration::from_millis(100));
        client(a, &mut c)
    } else {
        server(a, &mut c)
    }
}

fn client(a: &RpingArgs, c: &mut Conn) -> Result<(), String> {
    let mut start = 65u8;
    let mut ping = 0u64;
    while a.count == 0 || ping < a.count {
        let text = ping_text(ping, a.size, start);
        start = if start >= 122 { 65 } else { start + 1 };
        c.start.write(0, &text);
        c.advertise(Which::Start, a.size)?;
        c.wait_for(WcOpcode::Send)?;
        c.wait_for(WcOpcode::Recv)?; // go ahead
        c.advertise(Which::Rdma, a.size)?;
        c.wait_for(WcOpcode::Send)?;
        c.wait_for(WcOpcode::Recv)?; // write complete
        let mut echo = vec![0u8; a.size];
        c.rdma.read(0, &mut echo);
        if a.validate && echo != text {
            return Err("data mismatch!".into());
        }
        if a.verbose {
            println!(
                "ping data: {}",
                String::from_utf8_lossy(&echo[..echo.iter().position(|&b| b == 0).unwrap_or(echo.len())])
            );
        }
        ping += 1;
    }
    Ok(())
}

fn server(a: &RpingArgs, c: &mut Conn) -> Result<(), String> {
    loop {
        match c.wait_for(WcOpcode::Recv) {
            Ok(()) => {}
            // The client leaves after its last ping.
            Err(e) if e.contains("closed") && c.recvs > 0 => return Ok(()),
            Err(e) => return Err(e),
        }
        let (remote, len) = c.advertised();
        let sink = c.rdma.sge(0, len.min(a.size) as u32);
        c.post(SendOp::Read(remote), sink)?;
        c.wait_for(WcOpcode::RdmaRead)?;
        let mut data = vec![0u8; a.size];
        c.rdma.read(0, &mut data);
        let text_len = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        if a.verbose {
            println!("server ping data: {}", String::from_utf8_lossy(&data[..text_len]));
        }
        let go_ahead = c.send.sge(0, INFO_LEN as u32);
        c.post(SendOp::Send, go_ahead)?;
        c.wait_for(WcOpcode::Send)?;
        c.wait_for(WcOpcode::Recv)?;
        let (remote, _) = c.advertised();
        let echo = c.rdma.sge(0, (text_len + 1).min(a.size) as u32);
        c.post(SendOp::Write(remote), echo)?;
        c.wait_for(WcOpcode::RdmaWrite)?;
        let done = c.send.sge(0, INFO_LEN as u32);
        c.post(SendOp::Send, done)?;
        c.wait_for(WcOpcode::Send)?;
    }
}
