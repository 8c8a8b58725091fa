//! One iWARP connection to the target for one case: a TCP connection to its rdma_cm
//! listener (rping's server), MPA setup as an initiator (RFC 5044 §7.1, RFC 6581), then
//! FPDUs built here (good CRCs when CRC was negotiated, unless a case is about them) and
//! what comes back, read as MPA, DDP and RDMAP.

use super::tcp_log::TcpLog;
use super::ConformArgs;
use crate::iwarp::setup::{CrcPolicy, Outcome, Policy, RtrKind, Setup};
use crate::proto::iwarp::ddp::{DdpBuffer, DdpRepr};
use crate::proto::iwarp::fpdu::{FpduPacket, FpduRepr};
use crate::proto::iwarp::rdmap::{Body, Control, Layer, MessageRepr, Opcode};
use crate::transport::pcap::FrameLog;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes the tester holds from a target in one case; a target that sends more is judged on
/// what came first (a hostile target cannot make the tester grow without bound).
pub const MAX_INBOX_BYTES: usize = 16 << 20;
/// Replies kept per case, for the same reason.
pub const MAX_REPLIES: usize = 4096;

/// What the target sent, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IwReply {
    /// A Terminate: layer, error type, error code (RFC 5040 §4.8).
    Terminate(Layer, u8, u8),
    /// An RDMA Read Request: the data source STag and size it asks for.
    ReadRequest { src_stag: u32, size: u32 },
    /// Another RDMAP message (its opcode).
    Other(u8),
    /// Bytes that are not a well-formed FPDU or RDMAP message.
    Garbage(String),
    /// An MPA Reply (rejecting or not) to a Request this side sent by hand.
    MpaReply { reject: bool },
    /// The target closed the TCP connection (FIN or RST).
    Closed,
}

/// The tester's side of one iWARP connection.
pub struct IwPeer {
    stream: TcpStream,
    /// CRC32c on every FPDU (negotiated).
    pub crc: bool,
    /// The MSN of this side's next untagged message on queue 0 (Sends) and 1 (Reads).
    pub msn: [u32; 2],
    inbox: Vec<u8>,
    wait: Duration,
    gap: Duration,
    last_sent: Option<Instant>,
    seen: Vec<String>,
    /// The capture (`--pcap`), and this connection's record in it.
    log_file: Option<Arc<FrameLog>>,
    log: Option<TcpLog>,
}

impl IwPeer {
    /// A TCP connection only (for the MPA cases, which send their own frames).
    pub fn tcp(a: &ConformArgs, log_file: Option<Arc<FrameLog>>) -> Result<IwPeer, String> {
        let stream = super::peer::connect_within(&a.target, a.port, a.connect_wait)?;
        let _ = stream.set_nodelay(true);
        let gap = Duration::from_secs_f64(1.0 / f64::from(a.rate_pps.max(1)));
        let log = match (&log_file, stream.local_addr(), stream.peer_addr()) {
            (Some(f), Ok(l), Ok(r)) => Some(TcpLog::new(f.clone(), l, r)),
            _ => None,
        };
        Ok(IwPeer {
            stream,
            crc: false,
            msn: [1, 1],
            inbox: Vec::new(),
            wait: a.wait,
            gap,
            last_sent: None,
            seen: vec![],
            log_file,
            log,
        })
    }

    /// A new connection like this one (same capture).
    pub fn another(&self, a: &ConformArgs) -> Result<IwPeer, String> {
        IwPeer::connect(a, self.log_file.clone())
    }

    /// A connection through MPA setup, ready for FPDUs (the RTR sent if the target asked).
    pub fn connect(a: &ConformArgs, log_file: Option<Arc<FrameLog>>) -> Result<IwPeer, String> {
        // A listener whose tool is exiting rejects; its next instance will not.
        let deadline = Instant::now() + a.connect_wait;
        loop {
            match IwPeer::connect_once(a, log_file.clone()) {
                Err(e) if e.contains("Rejected") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(300));
                }
                other => return other,
            }
        }
    }

    fn connect_once(a: &ConformArgs, log_file: Option<Arc<FrameLog>>) -> Result<IwPeer, String> {
        let mut p = IwPeer::tcp(a, log_file)?;
        let policy = Policy {
            crc: if a.mpa_crc { CrcPolicy::Required } else { CrcPolicy::OnRequest },
            // No peer-to-peer mode, as siw and rdma-core's rping offer by default.
            rtr: Vec::new(),
            ..Policy::default()
        };
        let mut setup = Setup::initiator(policy, 0);
        p.write_raw(&setup.take_output());
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 4096];
        while setup.outcome().is_none() {
            let left = deadline.checked_duration_since(Instant::now()).ok_or("no MPA Reply within 10 s")?;
            p.stream.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
            let n = p.stream.read(&mut buf).map_err(|e| format!("waiting for the MPA Reply: {e}"))?;
            if n == 0 {
                return Err("the target closed the connection during MPA setup".into());
            }
            if let Some(l) = &mut p.log {
                l.received(&buf[..n]);
            }
            let used = setup.on_bytes(&buf[..n]);
            p.inbox.extend_from_slice(&buf[used..n]);
        }
        match setup.outcome() {
            Some(Outcome::Established(neg)) => {
                if neg.markers_tx {
                    return Err("the target wants MPA markers, which the tester does not send".into());
                }
                p.crc = neg.crc;
                // Each case tests its own rule, not how soon the target is ready after its
                // Reply (one case tests that: it connects with no settle time).
                std::thread::sleep(a.settle);
                match neg.rtr {
                    Some(RtrKind::Send) => {
                        let m = p.send_msg(Opcode::Send, 0, &[]);
                        p.send_fpdu(&m, false);
                    }
                    Some(_) => {
                        let m = write(0, 0, &[]);
                        p.send_fpdu(&m, false);
                    }
                    None => {}
                }
                Ok(p)
            }
            other => Err(format!("MPA setup: {other:?}")),
        }
    }

    /// An untagged message on queue 0 (or 1 for Read Requests) with the next MSN.
    pub fn send_msg(&mut self, opcode: Opcode, qn: u32, payload: &[u8]) -> Vec<u8> {
        let q = (qn as usize).min(1);
        let msn = self.msn[q];
        self.msn[q] += 1;
        untagged(opcode, qn, msn, 0, payload)
    }

    /// Sends one FPDU around `ulpdu`; `bad_crc` breaks its CRC (or, without CRC, puts a
    /// nonzero value where the receiver must ignore it).
    pub fn send_fpdu(&mut self, ulpdu: &[u8], bad_crc: bool) {
        let f = FpduRepr { ulpdu, pad: [0; 3], with_crc: self.crc };
        let mut b = vec![0u8; f.buffer_len()];
        if f.emit(&mut b).is_err() {
            return;
        }
        if bad_crc {
            let n = b.len();
            b[n - 1] ^= 0xff;
        }
        self.write_raw(&b);
    }

    /// Writes bytes to the stream (at most `rate_pps` writes a second).
    pub fn write_raw(&mut self, bytes: &[u8]) {
        if let Some(t) = self.last_sent {
            if let Some(d) = (t + self.gap).checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
        self.last_sent = Some(Instant::now());
        if let Some(l) = &mut self.log {
            l.sent(bytes);
        }
        let _ = self.stream.write_all(bytes);
    }

    /// What the target sends within the wait (stopping at a close).
    pub fn replies(&mut self, mpa_reply_expected: bool) -> Vec<IwReply> {
        let deadline = Instant::now() + self.wait;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        let mut closed = false;
        while let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            let _ = self.stream.set_read_timeout(Some(left));
            match self.stream.read(&mut buf) {
                Ok(0) => closed = true,
                Ok(n) => {
                    if let Some(l) = &mut self.log {
                        l.received(&buf[..n]);
                    }
                    if self.inbox.len() + n > MAX_INBOX_BYTES {
                        out.push(IwReply::Garbage(format!("the target sent more than {MAX_INBOX_BYTES} bytes")));
                        break;
                    }
                    self.inbox.extend_from_slice(&buf[..n]);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(_) => closed = true,
            }
            if closed {
                break;
            }
        }
        if mpa_reply_expected {
            out.extend(self.take_mpa_reply());
        }
        out.extend(self.take_fpdus());
        self.inbox.clear();
        if closed {
            out.push(IwReply::Closed);
            if let Some(l) = &mut self.log {
                l.fin(1);
            }
        }
        self.seen.extend(out.iter().map(describe));
        out
    }

    fn take_mpa_reply(&mut self) -> Option<IwReply> {
        let b = &self.inbox;
        if b.len() < 20 || !b.starts_with(crate::proto::iwarp::mpa::KEY_REPLY) {
            return None;
        }
        let len = 20 + usize::from(u16::from_be_bytes([b[18], b[19]]));
        let reject = b[16] & 0x20 != 0;
        self.inbox.drain(..len.min(self.inbox.len()));
        Some(IwReply::MpaReply { reject })
    }

    fn take_fpdus(&mut self) -> Vec<IwReply> {
        let mut out = Vec::new();
        while self.inbox.len() >= 2 && out.len() < MAX_REPLIES {
            let ulpdu_len = usize::from(u16::from_be_bytes([self.inbox[0], self.inbox[1]]));
            let total = crate::proto::iwarp::fpdu::fpdu_len(ulpdu_len);
            if self.inbox.len() < total {
                break;
            }
            let frame: Vec<u8> = self.inbox.drain(..total).collect();
            out.push(read_fpdu(&frame, self.crc));
        }
        out
    }

    /// What came back during the case, one line per message.
    pub fn take_seen(&mut self) -> Vec<String> {
        std::mem::take(&mut self.seen)
    }

    /// Ends the connection (the target's tool exits and listens again).
    pub fn close(mut self) {
        self.shutdown();
    }

    /// Closes the TCP connection (FIN) and keeps the peer for its record.
    pub fn shutdown(&mut self) {
        if let Some(mut l) = self.log.take() {
            l.fin(0);
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

fn read_fpdu(frame: &[u8], crc: bool) -> IwReply {
    let Ok(p) = FpduPacket::new_checked(frame) else { return IwReply::Garbage("a short FPDU".into()) };
    if crc && p.verify_crc().is_err() {
        return IwReply::Garbage("an FPDU with a bad CRC".into());
    }
    match MessageRepr::parse(p.ulpdu()) {
        Ok(m) => match m.body {
            Body::Terminate(t) => IwReply::Terminate(t.layer, t.etype, t.ecode),
            Body::ReadRequest(r) => IwReply::ReadRequest { src_stag: r.src_stag, size: r.size },
            Body::Data(_) => IwReply::Other(m.control.opcode as u8),
        },
        Err(e) => IwReply::Garbage(format!("{e:?}")),
    }
}

/// An untagged RDMAP message (RFC 5040 §4, RFC 5041 §4.4), the last of its message.
pub fn untagged(opcode: Opcode, qn: u32, msn: u32, mo: u32, payload: &[u8]) -> Vec<u8> {
    message(opcode, DdpBuffer::Untagged { rsvd_ulp: 0, qn, msn, mo }, payload)
}

/// An RDMA Write segment to `stag` at `to`, the last of its message.
pub fn write(stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    message(Opcode::Write, DdpBuffer::Tagged { stag, to }, payload)
}

fn message(opcode: Opcode, buffer: DdpBuffer, payload: &[u8]) -> Vec<u8> {
    let m = MessageRepr {
        ddp: DdpRepr { last: true, version: 1, rsvd_ulp: 0, buffer },
        control: Control { version: 1, opcode },
        body: Body::Data(payload),
    };
    let mut b = vec![0u8; m.buffer_len()];
    m.emit(&mut b).expect("sized above");
    b
}

/// One reply, as the report prints it.
pub fn describe(r: &IwReply) -> String {
    match r {
        IwReply::Terminate(l, t, c) => {
            format!("Terminate {l:?}/{t}/0x{c:02x} ({})", crate::proto::iwarp::rdmap::describe(*l, *t, *c))
        }
        IwReply::ReadRequest { src_stag, size } => format!("Read Request src STag 0x{src_stag:08x} size {size}"),
        IwReply::Other(op) => format!("RDMAP opcode {op}"),
        IwReply::Garbage(what) => format!("not RDMAP: {what}"),
        IwReply::MpaReply { reject } => format!("MPA Reply{}", if *reject { " rejecting" } else { "" }),
        IwReply::Closed => "connection closed".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(port: u16) -> ConformArgs {
        ConformArgs {
            target: "127.0.0.1".into(),
            transport: crate::verbs::Transport::Iwarp,
            port,
            mpa_crc: false,
            settle: Duration::ZERO,
            roce_port: 4791,
            bind: None,
            mtu: crate::engine::verbs::Mtu::M1024,
            wait: Duration::from_millis(1500),
            rate_pps: 1000,
            connect_wait: Duration::from_secs(5),
            only: vec![],
            pcap: None,
            random: None,
        }
    }

    #[test]
    fn a_flooding_target_is_read_up_to_the_limits() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let flood = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // Zero-length FPDUs (8 bytes each), past the byte limit.
            let chunk = vec![0u8; 1 << 20];
            for _ in 0..(MAX_INBOX_BYTES >> 20) + 2 {
                if s.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let mut p = IwPeer::tcp(&args(port), None).unwrap();
        let r = p.replies(false);
        assert!(r.len() <= MAX_REPLIES + 2, "{}", r.len());
        assert!(r.iter().any(|x| matches!(x, IwReply::Garbage(w) if w.contains("more than"))));
        assert!(p.inbox.is_empty());
        p.close();
        flood.join().unwrap();
    }
}
