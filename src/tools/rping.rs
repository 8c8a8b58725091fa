//! `softrdma rping`: rdma-core's rping over iWARP (MPA on kernel TCP, port 7174), so that
//! it pairs with `rping` on siw or on an iWARP NIC. Each ping: the client advertises its
//! start buffer (a 16-byte `buf:rkey:size` Send, big-endian), the server RDMA-Reads it,
//! says go ahead, the client advertises its sink buffer, the server RDMA-Writes the ping
//! back and says go ahead again; the client checks the echo.

use crate::engine::mem::{Access, Mr, MrTable, Pd};
use crate::engine::rng::Rng;
use crate::engine::verbs::{RecvWr, Remote, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus};
use crate::iwarp::qp::IwarpQp;
use crate::iwarp::setup::{CrcPolicy, Outcome, Policy, Setup};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
const INFO_LEN: usize = 16;
const PD: Pd = Pd(1);

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
    /// Ask for markers in what this side receives.
    pub markers: bool,
}

/// One side's connection: the stream, the QP and its memory.
struct Conn {
    stream: TcpStream,
    qp: IwarpQp,
    mrs: MrTable,
    recv: Mr,
    send: Mr,
    start: Mr,
    rdma: Mr,
    recvs: u64,
    pending_recvs: u32,
}

fn io(e: std::io::Error) -> String {
    format!("connection: {e}")
}

impl Conn {
    /// Sends what the QP produced, then returns its next completion, reading the stream
    /// until one comes (at most 30 s).
    fn next_wc(&mut self) -> Result<Wc, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.qp.take_output();
            if !out.is_empty() {
                self.stream.write_all(&out).map_err(io)?;
            }
            self.qp.on_transmitted(self.qp.output_offset());
            if let Some(wc) = self.qp.poll_completion() {
                if wc.status != WcStatus::Success {
                    let why = self.qp.terminated().map_or(String::new(), |t| format!(": {}", t.reason));
                    return Err(format!("{:?} completed with {:?}{why}", wc.opcode, wc.status));
                }
                return Ok(wc);
            }
            if Instant::now() > deadline {
                return Err("no completion for 30 s".into());
            }
            let mut buf = [0u8; 65536];
            let n = match self.stream.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
                other => other.map_err(io)?,
            };
            if n == 0 {
                return Err("the peer closed the connection".into());
            }
            self.qp.on_stream(&buf[..n], &mut self.mrs);
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
        let sge = Sge { addr: self.recv.addr, length: INFO_LEN as u32, lkey: self.recv.lkey };
        self.qp.post_recv(RecvWr { wr_id: 1, sgl: vec![sge] }).map_err(|e| format!("{e:?}"))
    }

    fn post(&mut self, op: SendOp, sge: Sge) -> Result<(), String> {
        let wr = SendWr { wr_id: 2, op, sgl: vec![sge], signaled: true, solicited: false, ud: None };
        self.qp.post_send(wr, &self.mrs).map_err(|e| format!("{e:?}"))
    }

    /// Sends `buf:rkey:size` of region `which` (big-endian, as rping's struct).
    fn advertise(&mut self, which: &Mr, size: usize) -> Result<(), String> {
        let mut info = [0u8; INFO_LEN];
        info[..8].copy_from_slice(&which.addr.to_be_bytes());
        info[8..12].copy_from_slice(&which.rkey.to_be_bytes());
        info[12..].copy_from_slice(&(size as u32).to_be_bytes());
        self.send.mem.write(0, &info);
        let sge = Sge { addr: self.send.addr, length: INFO_LEN as u32, lkey: self.send.lkey };
        self.post(SendOp::Send, sge)
    }

    /// The peer's last advertisement.
    fn advertised(&self) -> (Remote, usize) {
        let mut info = [0u8; INFO_LEN];
        self.recv.mem.read(0, &mut info);
        let addr = u64::from_be_bytes(info[..8].try_into().unwrap_or_default());
        let rkey = u32::from_be_bytes(info[8..12].try_into().unwrap_or_default());
        let size = u32::from_be_bytes(info[12..].try_into().unwrap_or_default());
        (Remote { addr, rkey }, size as usize)
    }
}

/// Connects (client) or accepts (server) and sets up MPA and the QP.
fn connect(a: &RpingArgs) -> Result<Conn, String> {
    let mut stream = if a.client {
        super::oob::connect_retrying(&a.addr, a.port)
            .map_err(|e| format!("cannot connect to {}:{}: {e}", a.addr, a.port))?
    } else {
        TcpListener::bind((a.addr.as_str(), a.port)).and_then(|l| l.accept()).map(|(s, _)| s).map_err(io)?
    };
    stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    // rping's rdma_cm asks for one outstanding Read each way, as siw's capture shows.
    let policy = Policy { crc: a.crc, markers: a.markers, ird: 1, ord: 1, rtr: Vec::new(), ..Policy::default() };
    let mut setup = if a.client { Setup::initiator(policy, 0) } else { Setup::responder(policy, 0) };
    let mut leftover = Vec::new();
    while setup.outcome().is_none() {
        stream.write_all(&setup.take_output()).map_err(io)?;
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Err("the peer closed the connection during MPA setup".into());
        }
        let used = setup.on_bytes(&buf[..n]);
        leftover.extend_from_slice(&buf[used..n]);
    }
    stream.write_all(&setup.take_output()).map_err(io)?;
    let neg = match setup.outcome() {
        Some(Outcome::Established(n)) => n.clone(),
        Some(other) => return Err(format!("MPA setup: {other:?}")),
        None => return Err("MPA setup did not finish".into()),
    };
    let mss = 1460;
    let qp = IwarpQp::new(1, PD, &neg, a.client, mss);
    let mut mrs = MrTable::new(8);
    let mut rng = Rng::os();
    let mut reg = |len| mrs.register(PD, len, Access::ALL, &mut rng).ok_or("cannot register memory".to_string());
    let (recv, send, start, rdma) = (reg(INFO_LEN)?, reg(INFO_LEN)?, reg(a.size)?, reg(a.size)?);
    let mut c = Conn { stream, qp, mrs, recv, send, start, rdma, recvs: 0, pending_recvs: 0 };
    c.post_recv()?;
    if !leftover.is_empty() {
        c.qp.on_stream(&leftover, &mut c.mrs);
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
        c.start.mem.write(0, &text);
        let start_mr = c.start.clone();
        c.advertise(&start_mr, a.size)?;
        c.wait_for(WcOpcode::Send)?;
        c.wait_for(WcOpcode::Recv)?; // go ahead
        let rdma_mr = c.rdma.clone();
        c.advertise(&rdma_mr, a.size)?;
        c.wait_for(WcOpcode::Send)?;
        c.wait_for(WcOpcode::Recv)?; // write complete
        let mut echo = vec![0u8; a.size];
        c.rdma.mem.read(0, &mut echo);
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
        let sink = Sge { addr: c.rdma.addr, length: len.min(a.size) as u32, lkey: c.rdma.lkey };
        c.post(SendOp::Read(remote), sink)?;
        c.wait_for(WcOpcode::RdmaRead)?;
        let mut data = vec![0u8; a.size];
        c.rdma.mem.read(0, &mut data);
        let text_len = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        if a.verbose {
            println!("server ping data: {}", String::from_utf8_lossy(&data[..text_len]));
        }
        c.post(SendOp::Send, Sge { addr: c.send.addr, length: INFO_LEN as u32, lkey: c.send.lkey })?;
        c.wait_for(WcOpcode::Send)?;
        c.wait_for(WcOpcode::Recv)?;
        let (remote, _) = c.advertised();
        let echo = Sge { addr: c.rdma.addr, length: (text_len + 1).min(a.size) as u32, lkey: c.rdma.lkey };
        c.post(SendOp::Write(remote), echo)?;
        c.wait_for(WcOpcode::RdmaWrite)?;
        c.post(SendOp::Send, Sge { addr: c.send.addr, length: INFO_LEN as u32, lkey: c.send.lkey })?;
        c.wait_for(WcOpcode::Send)?;
    }
}
