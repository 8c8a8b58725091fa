//! One connection to the target for one case: ibv_rc_pingpong's exchange as its client,
//! then packets built here in and out of a UDP socket on the RoCEv2 port.

use super::ConformArgs;
use crate::engine::verbs::Mtu;
use crate::proto::roce::ext::{AethRepr, Syndrome};
use crate::proto::roce::icrc::IpHeader;
use crate::proto::roce::{BthRepr, Psn, RocePacket, RoceRepr};
use crate::tools::pingpong::PpDest;
use crate::transport::headers::{ip_header, ip_to_gid, udp_header};
use crate::transport::pcap::FrameLog;
use crate::transport::udp::{check_datagram, DatagramCheck};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A reply from the target, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// BTH opcode.
    pub opcode: u8,
    /// BTH PSN.
    pub psn: u32,
    /// AETH, on acknowledgements and READ responses.
    pub aeth: Option<AethRepr>,
    /// A MAD to this side's QP1: its attribute ID and, for a CM REJ, the reason.
    pub mad: Option<(u16, u16)>,
}

impl Reply {
    /// An ACK (or a NAK) of `syndrome`'s kind.
    pub fn syndrome(&self) -> Option<Syndrome> {
        self.aeth.map(|a| a.syndrome)
    }
}

/// The tester's side of one connection.
pub struct Peer {
    sock: UdpSocket,
    local: IpAddr,
    /// The UDP port this side sends from and receives on.
    port: u16,
    target: SocketAddr,
    /// The target's QPN.
    pub qpn: u32,
    /// This side's and the target's addresses.
    pub addrs: (IpAddr, IpAddr),
    /// The PSN the target expects next from this side.
    pub epsn: Psn,
    /// This side's QPN as the target knows it.
    pub my_qpn: u32,
    /// The target's path MTU.
    pub mtu: Mtu,
    wait: Duration,
    gap: Duration,
    last_sent: Option<Instant>,
    log: Option<Arc<FrameLog>>,
    seen: Vec<String>,
    /// Messages of the target's this side has acknowledged.
    target_msn: u32,
    /// Datagrams from the target with a bad ICRC or that do not parse.
    pub malformed: usize,
    _stream: std::net::TcpStream,
}

impl Peer {
    /// The exchange as ibv_rc_pingpong's client: address out, the target's in, "done".
    /// `start_psn`: this side's first PSN (random when `None`).
    pub fn connect(a: &ConformArgs, log: Option<Arc<FrameLog>>, start_psn: Option<u32>) -> Result<Peer, String> {
        let mut stream = connect_within(&a.target, a.port, a.connect_wait)?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
        let local = match a.bind {
            Some(ip) => ip,
            None => stream.local_addr().map_err(|e| e.to_string())?.ip(),
        };
        let sock = UdpSocket::bind((local, a.roce_port)).map_err(|e| format!("UDP {local}:{}: {e}", a.roce_port))?;
        crate::transport::sys::set_dont_fragment(sock.as_raw_fd(), local.is_ipv6()).map_err(|e| e.to_string())?;
        let mut rng = crate::engine::rng::Rng::os();
        let mine = PpDest {
            lid: 0,
            qpn: 16 + rng.below(0xff_ff00) as u32,
            psn: start_psn.unwrap_or(rng.below(1 << 24) as u32) & 0xff_ffff,
            gid: ip_to_gid(local),
        };
        stream.write_all(&mine.to_msg()).map_err(|e| e.to_string())?;
        let mut msg = [0u8; 52];
        stream.read_exact(&mut msg).map_err(|e| format!("the target's address: {e}"))?;
        stream.write_all(b"done\0").map_err(|e| e.to_string())?;
        let theirs = PpDest::parse(&msg)?;
        let target = SocketAddr::new(crate::transport::headers::gid_to_ip(&theirs.gid), a.roce_port);
        let gap = Duration::from_secs_f64(1.0 / f64::from(a.rate_pps.max(1)));
        // The target moves its QP to RTS once it has sent its address; give it that moment.
        std::thread::sleep(Duration::from_millis(50));
        Ok(Peer {
            port: a.roce_port,
            sock,
            local,
            target,
            qpn: theirs.qpn,
            addrs: (local, target.ip()),
            epsn: Psn::new(mine.psn),
            my_qpn: mine.qpn,
            mtu: a.mtu,
            wait: a.wait,
            gap,
            last_sent: None,
            log,
            seen: Vec::new(),
            target_msn: 0,
            malformed: 0,
            _stream: stream,
        })
    }

    /// A BTH to the target's QP with AckReq set.
    pub fn bth(&self, opcode: u8, psn: Psn, payload_len: usize) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: crate::proto::roce::packet::pad_for(payload_len),
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: self.qpn,
            ack_req: true,
            psn,
        }
    }

    /// Serializes `repr` with a good ICRC; `tamper` may change the bytes after.
    pub fn build(&self, repr: &RoceRepr<'_>, tamper: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit(&mut b).expect("cases build valid headers unless they tamper after");
        let mut b = self.build_raw(&b);
        tamper(&mut b);
        b
    }

    /// `packet` (BTH to ICRC) with its ICRC filled in afresh.
    pub fn build_raw(&self, packet: &[u8]) -> Vec<u8> {
        let mut b = packet.to_vec();
        let udp = udp_header(self.port, self.target.port(), b.len());
        let (ip, n) = ip_header(self.local, self.target.ip(), 8 + b.len(), 0, true, 0);
        let ip_ref = if n == 20 { IpHeader::V4(&ip[..20]) } else { IpHeader::V6(&ip[..40]) };
        let _ = crate::proto::roce::icrc::fill(ip_ref, &udp, &mut b);
        b
    }

    /// Sends one packet (at most `rate_pps` a second).
    pub fn send(&mut self, packet: &[u8]) {
        if let Some(t) = self.last_sent {
            let next = t + self.gap;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
        }
        self.last_sent = Some(Instant::now());
        self.record(self.local, self.target.ip(), self.port, packet);
        let _ = self.sock.send_to(packet, self.target);
    }

    /// What the target sends back within the wait: its ACKs, NAKs and responses (its own
    /// requests, the ping-pong it starts, are noted and set aside).
    pub fn replies(&mut self) -> Vec<Reply> {
        let deadline = Instant::now() + self.wait;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 10_000];
        let mut cache = crate::proto::roce::icrc::RecoveryCache::default();
        while let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            // A flooding target is judged on what came first.
            if self.seen.len() >= super::iwarp::MAX_REPLIES {
                break;
            }
            let _ = self.sock.set_read_timeout(Some(left));
            let Ok((n, from)) = self.sock.recv_from(&mut buf) else { break };
            if from.ip() != self.target.ip() {
                continue;
            }
            let p = &buf[..n];
            let local = (self.local, self.port);
            let checked = check_datagram(&mut cache, from, local, 0, p, 0);
            // Recorded with the IPv4 Identification the ICRC was made over: a sender with
            // UDP segmentation offload numbers its segments 0, 1, 2…
            let ident = match checked {
                DatagramCheck::Good { ident, .. } => ident,
                _ => 0,
            };
            self.record_with(from.ip(), self.local, from.port(), p, ident);
            if !matches!(checked, DatagramCheck::Good { .. }) {
                self.seen.push("a datagram with a bad ICRC".into());
                self.malformed += 1;
                continue;
            }
            let Ok(r) = RocePacket::new_checked(p).and_then(|pk| RoceRepr::parse(&pk)) else {
                self.seen.push("a datagram that does not parse".into());
                self.malformed += 1;
                continue;
            };
            let mad = (r.bth.dest_qp == 1 && r.payload.len() >= 36).then(|| {
                let be16 = |i: usize| u16::from_be_bytes([r.payload[i], r.payload[i + 1]]);
                (be16(16), be16(34))
            });
            let reply = Reply { opcode: r.bth.opcode, psn: r.bth.psn.value(), aeth: r.aeth, mad };
            self.seen.push(describe(&reply));
            if mad.is_some() {
                out.push(reply);
                continue;
            }
            if r.bth.dest_qp != self.my_qpn {
                continue;
            }
            if is_response(r.bth.opcode) {
                out.push(reply);
            } else if r.bth.ack_req {
                // The target's own ping: acknowledged, so that its retry timer does not take
                // its QP to error while a case is still being judged.
                self.ack_target(r.bth.psn);
            }
        }
        out
    }

    /// An ACK of the target's request `psn` (IBTA 9.7.5.2.1).
    fn ack_target(&mut self, psn: Psn) {
        self.target_msn = (self.target_msn + 1) & 0xff_ffff;
        let mut r = crate::engine::qp::requester::bare(self.bth(0x11, psn, 0), None, None);
        r.bth.ack_req = false;
        r.aeth = Some(AethRepr { syndrome: Syndrome::Ack { credits: 31 }, msn: self.target_msn });
        let b = self.build(&r, |_| {});
        self.record(self.local, self.target.ip(), self.port, &b);
        let _ = self.sock.send_to(&b, self.target);
    }

    fn record(&self, src: IpAddr, dst: IpAddr, sport: u16, packet: &[u8]) {
        self.record_with(src, dst, sport, packet, 0);
    }

    fn record_with(&self, src: IpAddr, dst: IpAddr, sport: u16, packet: &[u8], ident: u16) {
        if let Some(log) = &self.log {
            let dport = if src == self.local { self.target.port() } else { self.port };
            let udp = udp_header(sport, dport, packet.len());
            let (ip, n) = ip_header(src, dst, 8 + packet.len(), ident, true, 0);
            log.record(&ip[..n], &udp, packet);
        }
    }

    /// What came back during the case, one line per packet.
    pub fn take_seen(&mut self) -> Vec<String> {
        std::mem::take(&mut self.seen)
    }
}

/// The target's exchange, retried until `wait` is over: its tool restarts after each
/// connection, which takes a while on a slow machine.
pub(super) fn connect_within(host: &str, port: u16, wait: Duration) -> Result<std::net::TcpStream, String> {
    let to = crate::tools::oob::resolve(host, port).map_err(|e| format!("{host}: {e}"))?;
    let deadline = Instant::now() + wait;
    loop {
        match std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(format!("{to}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// RC acknowledgements and READ/atomic responses (IBTA Table 38: 0x0D–0x12).
fn is_response(opcode: u8) -> bool {
    (0x0d..=0x12).contains(&opcode)
}

/// One reply, as the report prints it.
pub fn describe(r: &Reply) -> String {
    if let Some((attr, reason)) = r.mad {
        return format!("MAD attribute 0x{attr:04x} to QP1 (REJ reason {reason} if a REJ)");
    }
    let what = match r.syndrome() {
        Some(Syndrome::Ack { .. }) if r.opcode == 0x11 => "ACK".to_string(),
        Some(Syndrome::RnrNak { timer }) => format!("RNR NAK (timer {timer})"),
        Some(Syndrome::Nak(code)) => format!("NAK {code:?}"),
        _ => format!("opcode 0x{:02x}", r.opcode),
    };
    format!("{what} psn=0x{:06x}", r.psn)
}
