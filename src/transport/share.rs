//! Several softrdma devices on one address and UDP port, one per process, as rxe devices
//! share their host's address (ARCHITECTURE.md, "One address, several processes").
//!
//! Every device binds the RoCEv2 port with `SO_REUSEPORT`, so the kernel hands each flow to
//! one of them by a hash of its addresses, not by the QP it is for. Each device claims a
//! tag, a byte no other device on the address holds, by binding the abstract Unix socket
//! named for it; its QPNs and CM communication IDs carry the tag in their top byte. A device
//! reading a packet for another tag forwards it, with the sender's address, to that tag's
//! socket; a CM REQ goes to the device listening on its ServiceID's port, which binds that
//! port's name. Abstract names go with the process that bound them, so a device that dies
//! leaves nothing behind, and its tag and ports are free again at once.

use super::link::LinkStats;
use crate::engine::rng::Rng;
use crate::proto::cm::{CmMadRepr, CmMessage, MadPacket};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Who a received packet is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// This device (or nobody in particular: QP0, multicast, a MAD that names no one).
    Here,
    /// The device holding this tag.
    Tag(u8),
    /// The device listening on this port's ServiceID (a CM REQ).
    Service(u16),
}

/// The BTH's length, then the DETH's (IBTA 9.2, 9.3.2).
const BTH_LEN: usize = 12;
const DETH_LEN: usize = 8;
/// A MAD is 256 bytes (IBTA 13.4.2); the ICRC follows it.
const MAD_LEN: usize = 256;

/// Who `packet` (a RoCEv2 UDP payload: BTH onwards) is for: the tag in the top byte of its
/// destination QPN, or for QP1 the CM message's receiver (IBTA 12.6: a REQ names a
/// ServiceID, every later message the receiver's communication ID).
pub fn owner_of(packet: &[u8]) -> Owner {
    if packet.len() < BTH_LEN {
        return Owner::Here;
    }
    let dest_qpn = u32::from_be_bytes([0, packet[5], packet[6], packet[7]]);
    match dest_qpn {
        0 | 0xff_ffff => Owner::Here,
        1 => mad_owner(packet),
        q => Owner::Tag((q >> 16) as u8),
    }
}

fn mad_owner(packet: &[u8]) -> Owner {
    let at = BTH_LEN + DETH_LEN;
    let Some(mad) = packet.get(at..at + MAD_LEN) else { return Owner::Here };
    let Ok(p) = MadPacket::new_checked(mad) else { return Owner::Here };
    let Ok(m) = CmMadRepr::parse(&p) else { return Owner::Here };
    let receiver = match m.message {
        CmMessage::Req(r) => return r.service_id.ip_port().map_or(Owner::Here, |(_, port)| Owner::Service(port)),
        CmMessage::SidrReq(r) => return r.service_id.ip_port().map_or(Owner::Here, |(_, port)| Owner::Service(port)),
        CmMessage::SidrRep(r) => r.request_id,
        CmMessage::Rep(r) => r.remote_comm_id,
        CmMessage::Rtu(r) | CmMessage::Drep(r) => r.remote_comm_id,
        CmMessage::Rej(r) => r.remote_comm_id,
        CmMessage::Mra(r) => r.remote_comm_id,
        CmMessage::Dreq(r) => r.remote_comm_id,
        CmMessage::Other(_) => 0,
    };
    if receiver == 0 {
        Owner::Here
    } else {
        Owner::Tag((receiver >> 24) as u8)
    }
}

/// The header a forwarded packet carries: the family (4 or 6), the TOS byte it came
/// with, the sender's UDP port and address (16 bytes; IPv4 in the first 4).
const FORWARD_HEADER: usize = 20;
/// Largest forwarded datagram: the header and the largest RoCEv2 packet.
const FORWARD_MAX: usize = FORWARD_HEADER + 9216;
/// Forwarded datagrams read per look (as the UDP socket's batch).
const FORWARD_BATCH: usize = 32;
/// Devices this one keeps a connected socket to; past it, it forgets them all and
/// connects again as packets come (a bound on what a flood of tags can make it hold).
const FORWARD_PEERS_MAX: usize = 64;
/// Names found unheld are not probed again for this long, ms: a peer sending to QPNs or
/// ports nobody on the address holds costs one failed connect per name, not per packet.
const ABSENT_RECHECK_MS: u64 = 100;
/// Names remembered as unheld; past it, they are forgotten (and probed again).
const ABSENT_MAX: usize = 1024;
/// How long a forward waits for room in a device's queue (the kernel holds only
/// `net.unix.max_dgram_qlen` datagrams, 10 by default) before dropping the packet, as
/// a full link would; RC retransmits it.
const FORWARD_WAIT_MS: u64 = 5;
/// The most packets one look's batch can hand on to other devices: every GRO buffer full
/// of the smallest packets.
const LOOK_PACKETS_MAX: usize = super::udp::RX_BATCH * super::udp::GRO_SEGMENTS_MAX;
/// The most bytes one look's batch can hand on, each packet with its header.
const LOOK_BYTES_MAX: usize = super::udp::RX_BATCH * super::udp::GRO_BUFFER_BYTES + LOOK_PACKETS_MAX * FORWARD_HEADER;
/// Forwarded packets a device holds unread by its engine: while it waits for room in
/// another's queue it reads its own into here. It holds two whole looks' batches, so a
/// device that forwards its whole batch while its peer does the same (and neither engine
/// reads until its batch is done) always finishes: neither waits on the other.
const FORWARD_BACKLOG_MAX: usize = 2 * LOOK_PACKETS_MAX;
/// The backlog's bound in bytes (about 4 MiB, held only by devices that forward).
const FORWARD_BACKLOG_BYTES: usize = 2 * LOOK_BYTES_MAX + FORWARD_MAX;

/// A connected socket to a device this one forwards to; connected so that it can wait
/// for room in that device's queue.
struct Peer {
    socket: UnixDatagram,
    /// The last forward to it found its queue full for [`FORWARD_WAIT_MS`]: the next
    /// do not wait until one gets through (a stopped process costs one wait, not one
    /// per packet).
    stalled: bool,
}

/// How one forward went.
enum Sent {
    Delivered,
    /// No device holds the name.
    NoOne,
    Dropped,
}

/// A forwarded packet, as its owner reads it.
pub struct Forwarded<'a> {
    /// The peer that sent it.
    pub src: SocketAddr,
    /// Its IP TOS byte (ECN bits included).
    pub tos: u8,
    /// The UDP payload.
    pub payload: &'a [u8],
}

/// This device's place among the devices sharing its address.
pub struct Share {
    tag: u8,
    scope: String,
    own: UnixDatagram,
    services: HashMap<u16, UnixDatagram>,
    peers: HashMap<Owner, Peer>,
    /// Owners no device held when last probed, and when.
    absent: HashMap<Owner, Instant>,
    /// The datagram being forwarded, reused from packet to packet.
    out: Vec<u8>,
    /// Connects tried to other devices' names (what [`ABSENT_RECHECK_MS`] saves).
    probes: u64,
    epoll: super::sys::Epoll,
    /// The forwarded packets read and not yet taken, one after another.
    backlog: Vec<u8>,
    /// Where each of them lies in `backlog`: start and length.
    spans: Vec<(usize, usize)>,
    stats: Arc<LinkStats>,
}

fn bind_abstract(name: &str) -> io::Result<UnixDatagram> {
    let s = UnixDatagram::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes())?)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

impl Share {
    /// Claims a free tag among the devices on `addr:port` (drawn from `rng`, so QPNs stay
    /// unguessable in their other 16 bits); `rx` is the device's UDP socket, which the
    /// share's descriptor ([`Share::fd`]) waits on with its own sockets.
    pub fn claim(addr: IpAddr, port: u16, rx: RawFd, rng: &mut Rng, stats: Arc<LinkStats>) -> io::Result<Share> {
        let scope = format!("softrdma/{addr}/{port}");
        let first = rng.next_u64() as u8;
        let (tag, own) = (0..=255u8)
            .map(|i| first.wrapping_add(i))
            .find_map(|t| bind_abstract(&format!("{scope}/qp/{t}")).ok().map(|s| (t, s)))
            .ok_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "256 devices hold this address already"))?;
        let epoll = super::sys::Epoll::new()?;
        epoll.add(rx)?;
        epoll.add(own.as_raw_fd())?;
        Ok(Share {
            tag,
            scope,
            own,
            services: HashMap::new(),
            peers: HashMap::new(),
            absent: HashMap::new(),
            out: Vec::new(),
            probes: 0,
            epoll,
            backlog: Vec::new(),
            spans: Vec::new(),
            stats,
        })
    }

    /// The tag this device's QPNs and communication IDs carry.
    pub fn tag(&self) -> u8 {
        self.tag
    }

    /// One descriptor, readable when the UDP socket or a forwarding socket is.
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// The set behind [`Share::fd`], for the device's other sockets to join.
    pub fn poll_set(&self) -> &super::sys::Epoll {
        &self.epoll
    }

    /// Takes the CM requests for `port` on this address: fails with `AddrInUse` if
    /// another device listens there.
    pub fn claim_service(&mut self, port: u16) -> io::Result<()> {
        if self.services.contains_key(&port) {
            return Err(io::Error::new(io::ErrorKind::AddrInUse, "this device listens there already"));
        }
        let s = bind_abstract(&self.name_of(Owner::Service(port)))?;
        self.epoll.add(s.as_raw_fd())?;
        self.services.insert(port, s);
        Ok(())
    }

    /// Gives `port` up.
    pub fn release_service(&mut self, port: u16) {
        if let Some(s) = self.services.remove(&port) {
            self.epoll.remove(s.as_raw_fd());
        }
    }

    /// Hands `payload` on to the device `owner` names if that is another live one; false:
    /// it is this device's to handle (its own, or nobody else's).
    pub fn forward(&mut self, owner: Owner, src: SocketAddr, tos: u8, payload: &[u8]) -> bool {
        match owner {
            Owner::Here => return false,
            Owner::Tag(t) if t == self.tag => return false,
            Owner::Service(p) if self.services.contains_key(&p) => return false,
            _ => {}
        }
        let mut datagram = std::mem::take(&mut self.out);
        datagram.clear();
        datagram.extend_from_slice(&forward_header(src, tos));
        datagram.extend_from_slice(payload);
        let sent = self.send_to(owner, &datagram);
        self.out = datagram;
        let counter = match sent {
            Sent::Delivered => &self.stats.forwarded_out,
            // Nobody holds that name: the packet is nobody else's (a dead device's QPN,
            // a port nobody listens on), and this device answers it as its own.
            Sent::NoOne => return false,
            Sent::Dropped => &self.stats.forward_dropped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Sends `datagram` to the device `owner` names, connecting first if this device
    /// has no socket to it, and once more if that device has gone (another may hold the
    /// name now).
    fn send_to(&mut self, owner: Owner, datagram: &[u8]) -> Sent {
        for _ in 0..2 {
            let Some(peer) = self.peer(owner) else { return Sent::NoOne };
            match peer.socket.send(datagram) {
                Ok(_) => {
                    peer.stalled = false;
                    return Sent::Delivered;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return self.send_when_room(owner, datagram),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOENT)) => {
                    self.peers.remove(&owner);
                }
                Err(_) => return Sent::Dropped,
            }
        }
        Sent::NoOne
    }

    /// Waits up to [`FORWARD_WAIT_MS`] for room in `owner`'s queue (unless it is
    /// stalled), sending `datagram` when there is; meanwhile reads what is forwarded to
    /// this device, which may be what that device waits on.
    fn send_when_room(&mut self, owner: Owner, datagram: &[u8]) -> Sent {
        let deadline = Instant::now() + Duration::from_millis(FORWARD_WAIT_MS);
        loop {
            let Some(peer) = self.peers.get_mut(&owner) else { return Sent::Dropped };
            match peer.socket.send(datagram) {
                Ok(_) => {
                    peer.stalled = false;
                    return Sent::Delivered;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Sent::Dropped,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if peer.stalled || left.is_zero() {
                peer.stalled = true;
                return Sent::Dropped;
            }
            let mut fds = vec![pollfd(peer.socket.as_raw_fd(), libc::POLLOUT)];
            if self.backlog_has_room() {
                let own = std::iter::once(&self.own).chain(self.services.values());
                fds.extend(own.map(|s| pollfd(s.as_raw_fd(), libc::POLLIN)));
            }
            let _ = super::sys::poll_ms(&mut fds, left.as_millis().max(1) as i32);
            self.fill(FORWARD_BACKLOG_MAX);
        }
    }

    /// The abstract socket name of the device `owner` names on this address.
    fn name_of(&self, owner: Owner) -> String {
        match owner {
            Owner::Service(p) => format!("{}/svc/{p}", self.scope),
            Owner::Tag(t) => format!("{}/qp/{t}", self.scope),
            Owner::Here => format!("{}/qp/{}", self.scope, self.tag),
        }
    }

    /// The connected socket to the device `owner` names; `None` if no device holds its
    /// name (or held it when last probed, less than [`ABSENT_RECHECK_MS`] ago).
    fn peer(&mut self, owner: Owner) -> Option<&mut Peer> {
        if !self.peers.contains_key(&owner) {
            let recheck = Duration::from_millis(ABSENT_RECHECK_MS);
            if self.absent.get(&owner).is_some_and(|at| at.elapsed() < recheck) {
                return None;
            }
            if self.peers.len() >= FORWARD_PEERS_MAX {
                self.peers.clear();
            }
            self.probes += 1;
            let Some(socket) = connect_to(&self.name_of(owner)) else {
                if self.absent.len() >= ABSENT_MAX {
                    self.absent.clear();
                }
                self.absent.insert(owner, Instant::now());
                return None;
            };
            self.absent.remove(&owner);
            self.peers.insert(owner, Peer { socket, stalled: false });
        }
        self.peers.get_mut(&owner)
    }

    /// Reads what other devices handed on, up to one batch, without blocking; returns
    /// the count.
    pub fn recv(&mut self) -> usize {
        self.fill(FORWARD_BATCH.max(self.spans.len()))
    }

    /// Reads forwarded packets until `target` are pending, the backlog is full or none
    /// are queued; returns how many it read.
    fn fill(&mut self, target: usize) -> usize {
        let start = self.spans.len();
        let sockets = std::iter::once(&self.own).chain(self.services.values());
        'sockets: for s in sockets {
            while self.spans.len() < target {
                let at = self.spans.last().map_or(0, |&(from, len)| from + len);
                if at + FORWARD_MAX > FORWARD_BACKLOG_BYTES {
                    break 'sockets;
                }
                if self.backlog.len() < at + FORWARD_MAX {
                    // Doubling, as a vector grows, but never past the bound.
                    let want = (at + FORWARD_MAX).max(2 * self.backlog.capacity()).min(FORWARD_BACKLOG_BYTES);
                    self.backlog.reserve_exact(want - self.backlog.len());
                    self.backlog.resize(at + FORWARD_MAX, 0);
                }
                match s.recv(&mut self.backlog[at..at + FORWARD_MAX]) {
                    Ok(got) if got >= FORWARD_HEADER => self.spans.push((at, got)),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        let read = self.spans.len() - start;
        self.stats.forwarded_in.fetch_add(read as u64, Ordering::Relaxed);
        read
    }

    /// Whether the backlog can take another packet.
    fn backlog_has_room(&self) -> bool {
        let used = self.spans.last().map_or(0, |&(from, len)| from + len);
        self.spans.len() < FORWARD_BACKLOG_MAX && used + FORWARD_MAX <= FORWARD_BACKLOG_BYTES
    }

    /// How many packets the last [`Share::recv`] read that are not yet taken.
    pub fn pending(&self) -> usize {
        self.spans.len()
    }

    /// The `i`th packet the last [`Share::recv`] read; `None` if it is not one
    /// [`Share::forward`] wrote (another local program's datagram, dropped).
    pub fn received(&self, i: usize) -> Option<Forwarded<'_>> {
        let &(from, len) = self.spans.get(i)?;
        parse_forwarded(&self.backlog[from..from + len])
    }

    /// Marks what the last [`Share::recv`] read as taken.
    pub fn clear(&mut self) {
        self.spans.clear();
    }
}

/// A non-blocking socket connected to the abstract name `name`; `None` if nobody holds it.
fn connect_to(name: &str) -> Option<UnixDatagram> {
    let socket = UnixDatagram::unbound().ok()?;
    socket.connect_addr(&UnixAddr::from_abstract_name(name.as_bytes()).ok()?).ok()?;
    socket.set_nonblocking(true).ok()?;
    Some(socket)
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd { fd, events, revents: 0 }
}

/// The header [`Share::forward`] puts before a packet: who sent it and with what TOS.
fn forward_header(src: SocketAddr, tos: u8) -> [u8; FORWARD_HEADER] {
    let mut header = [0u8; FORWARD_HEADER];
    header[1] = tos;
    header[2..4].copy_from_slice(&src.port().to_be_bytes());
    match src.ip() {
        IpAddr::V4(v4) => {
            header[0] = 4;
            header[4..8].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            header[0] = 6;
            header[4..20].copy_from_slice(&v6.octets());
        }
    }
    header
}

/// A forwarded datagram's header and payload; `None` if the header is not one
/// [`Share::forward`] writes (another local program's datagram, dropped).
fn parse_forwarded(d: &[u8]) -> Option<Forwarded<'_>> {
    let (h, payload) = d.split_at_checked(FORWARD_HEADER)?;
    let port = u16::from_be_bytes([h[2], h[3]]);
    let ip = match h[0] {
        4 => IpAddr::V4(Ipv4Addr::new(h[4], h[5], h[6], h[7])),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&h[4..20]).ok()?)),
        _ => return None,
    };
    Some(Forwarded { src: SocketAddr::new(ip, port), tos: h[1], payload })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::CmConfig;

    fn share_on(addr: IpAddr, port: u16) -> Share {
        let udp = std::net::UdpSocket::bind((addr, 0)).unwrap();
        Share::claim(addr, port, udp.as_raw_fd(), &mut Rng::os(), Arc::default()).unwrap()
    }

    /// A RoCEv2 packet to QP1 carrying `mad` (BTH, DETH, the MAD, an ICRC's room).
    fn gsi_packet(mad: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; BTH_LEN + DETH_LEN];
        p[0] = 0x64;
        p[7] = 1;
        p.extend_from_slice(mad);
        p.extend_from_slice(&[0; 4]);
        p
    }

    #[test]
    fn a_packet_belongs_to_the_tag_of_its_qpn_or_its_cm_message_receiver() {
        let mut data = vec![0u8; 40];
        data[5..8].copy_from_slice(&[0xab, 0x12, 0x34]);
        assert_eq!(owner_of(&data), Owner::Tag(0xab));
        data[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
        assert_eq!(owner_of(&data), Owner::Here, "multicast");
        assert_eq!(owner_of(&data[..11]), Owner::Here, "a runt is for the engine to count");
        let rtu = crate::cm::test_rtu(0x1100_0001, 0x7e00_0002);
        assert_eq!(owner_of(&gsi_packet(&rtu[..])), Owner::Tag(0x7e), "by the receiver's ID");
        let dreq = crate::cm::test_dreq(0x1100_0001, 0x3300_0002, 77);
        assert_eq!(owner_of(&gsi_packet(&dreq[..])), Owner::Tag(0x33));
        let args = crate::cm::ConnectArgs {
            qpn: 0x11_0005,
            local_gid: [0; 16],
            peer_gid: [0; 16],
            src_port: 40_000,
            dst_port: 7001,
            psn: 0,
            mtu: crate::engine::verbs::Mtu::M1024,
            responder_resources: 1,
            initiator_depth: 1,
            private_data: Vec::new(),
        };
        let req = crate::cm::test_req(&CmConfig::default(), 1, 0x1100_0001, &args);
        assert_eq!(owner_of(&gsi_packet(&req[..])), Owner::Service(7001), "a REQ by its ServiceID");
        assert_eq!(owner_of(&gsi_packet(&req[..100])), Owner::Here, "a truncated MAD");
    }

    #[test]
    fn a_packet_for_another_tag_reaches_that_device_with_its_sender() {
        let addr = IpAddr::from([127, 44, 0, 1]);
        let (mut a, mut b) = (share_on(addr, 4791), share_on(addr, 4791));
        assert_ne!(a.tag(), b.tag(), "each device holds a tag of its own");
        let from = SocketAddr::from(([127, 44, 0, 9], 50_123));
        assert!(!a.forward(Owner::Tag(a.tag()), from, 0, b"mine"), "its own packets stay");
        assert!(!a.forward(Owner::Here, from, 0, b"mine"));
        assert!(a.forward(Owner::Tag(b.tag()), from, 2, b"for b"));
        assert_eq!(b.recv(), 1);
        let got = b.received(0).expect("a forwarded packet");
        assert_eq!((got.src, got.tos, got.payload), (from, 2, &b"for b"[..]));
        b.clear();
        assert!(b.received(0).is_none(), "taken once");
        let free = (0..=255u8).find(|t| *t != a.tag() && *t != b.tag()).unwrap();
        assert!(!a.forward(Owner::Tag(free), from, 0, b"x"), "nobody holds that tag: answered here");
        drop(b);
        assert_eq!(a.recv(), 0);
    }

    #[test]
    fn a_request_goes_to_the_one_device_listening_on_its_port() {
        let addr = IpAddr::from([127, 44, 0, 2]);
        let (mut a, mut b) = (share_on(addr, 4791), share_on(addr, 4791));
        let from = SocketAddr::from(([127, 44, 0, 9], 50_124));
        assert!(!a.forward(Owner::Service(7001), from, 0, b"req"), "nobody listens: answered here");
        a.claim_service(7001).unwrap();
        let taken = b.claim_service(7001).expect_err("one listener per port on the address");
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse);
        assert!(!a.forward(Owner::Service(7001), from, 0, b"req"), "its own listener");
        assert!(b.forward(Owner::Service(7001), from, 0, b"req"));
        assert_eq!(a.recv(), 1);
        assert_eq!(a.received(0).unwrap().payload, b"req");
        a.clear();
        a.release_service(7001);
        b.claim_service(7001).expect("free again");
    }

    /// Reads what is handed on to `me` until `want` packets (counting the `got` already
    /// taken) or 5 s; returns how many and how many `me` dropped forwarding.
    fn read_until(me: &mut Share, mut got: usize, want: usize) -> (usize, u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while got < want && Instant::now() < deadline {
            got += me.recv();
            me.clear();
        }
        (got, me.stats.forward_dropped.load(Ordering::Relaxed))
    }

    /// Two devices on `addr` each run `send` (forwarding to the other's tag, returning
    /// how many it read meanwhile) and then read until `want`; returns what each read
    /// and dropped.
    fn flood_each_other<F>(addr: IpAddr, want: usize, send: F) -> [(usize, u64); 2]
    where
        F: Fn(&mut Share, u8) -> usize + Clone + Send + 'static,
    {
        let (a, b) = (share_on(addr, 4791), share_on(addr, 4791));
        let flood = |mut me: Share, to: u8| {
            let send = send.clone();
            std::thread::spawn(move || {
                let got = send(&mut me, to);
                read_until(&mut me, got, want)
            })
        };
        let (ta, tb) = (a.tag(), b.tag());
        let (from_a, from_b) = (flood(a, tb), flood(b, ta));
        [from_a.join().unwrap(), from_b.join().unwrap()]
    }

    /// Runs `flood` up to three times until nothing is lost. A device kept off the CPU
    /// for longer than [`FORWARD_WAIT_MS`] (as the suite's other tests on two cores can
    /// do) has its peer drop, by design; two devices waiting on each other would lose
    /// in every run.
    fn loses_nothing_in_one_of_three(want: usize, flood: impl Fn() -> [(usize, u64); 2]) {
        let mut runs = Vec::new();
        for _ in 0..3 {
            let run = flood();
            if run == [(want, 0); 2] {
                return;
            }
            runs.push(run);
        }
        panic!("(read, dropped) by each device, want ({want}, 0): {runs:?}");
    }

    #[test]
    fn two_devices_flooding_each_other_lose_nothing() {
        // Each forwards more than the kernel queues (`max_dgram_qlen`, 10 by default)
        // while the other does the same and reads only while it waits.
        const PACKETS: usize = 2000;
        let from = SocketAddr::from(([127, 44, 0, 9], 50_125));
        let send = move |me: &mut Share, to: u8| {
            let mut got = 0;
            for i in 0..PACKETS {
                assert!(me.forward(Owner::Tag(to), from, 0, &(i as u32).to_be_bytes()));
                got += me.pending();
                me.clear();
            }
            got
        };
        loses_nothing_in_one_of_three(PACKETS, || flood_each_other(IpAddr::from([127, 44, 0, 3]), PACKETS, send));
    }

    #[test]
    fn two_devices_each_handing_on_a_whole_batch_at_once_lose_nothing() {
        // As `UdpRx::deliver` does: each forwards a whole look's batch (every GRO buffer
        // full) before its engine takes what it read meanwhile.
        let segment = vec![7u8; super::super::udp::GRO_BUFFER_BYTES / super::super::udp::GRO_SEGMENTS_MAX];
        let from = SocketAddr::from(([127, 44, 0, 9], 50_125));
        let send = move |me: &mut Share, to: u8| {
            for _ in 0..LOOK_PACKETS_MAX {
                assert!(me.forward(Owner::Tag(to), from, 0, &segment));
            }
            let got = me.pending();
            me.clear();
            got
        };
        let addr = IpAddr::from([127, 44, 0, 5]);
        loses_nothing_in_one_of_three(LOOK_PACKETS_MAX, || flood_each_other(addr, LOOK_PACKETS_MAX, send.clone()));
    }

    #[test]
    fn a_backlog_nobody_takes_stops_at_its_bound_in_bytes() {
        const SENT: usize = FORWARD_BACKLOG_BYTES / FORWARD_MAX + 40;
        let addr = IpAddr::from([127, 44, 0, 6]);
        let (mut a, b) = (share_on(addr, 4791), share_on(addr, 4791));
        let from = SocketAddr::from(([127, 44, 0, 9], 50_125));
        let ta = a.tag();
        let sender = std::thread::spawn(move || {
            let mut b = b;
            let largest = vec![1u8; FORWARD_MAX - FORWARD_HEADER];
            for _ in 0..SENT {
                assert!(b.forward(Owner::Tag(ta), from, 0, &largest));
            }
            b.stats.forward_dropped.load(Ordering::Relaxed)
        });
        while !sender.is_finished() {
            a.fill(FORWARD_BACKLOG_MAX);
        }
        let dropped = sender.join().unwrap() as usize;
        let held = FORWARD_BACKLOG_BYTES / FORWARD_MAX;
        assert_eq!(a.pending(), held, "the backlog holds as many as its bytes allow");
        assert!(!a.backlog_has_room());
        assert!(a.backlog.capacity() <= FORWARD_BACKLOG_BYTES, "{} bytes held", a.backlog.capacity());
        assert!(dropped > 0 && dropped <= SENT - held, "{dropped} dropped: the rest waits in a's queue");
        a.clear();
        assert!(a.recv() > 0, "taken, the backlog reads again");
    }

    #[test]
    fn a_flood_for_tags_nobody_holds_probes_each_name_once() {
        let addr = IpAddr::from([127, 44, 0, 4]);
        let mut a = share_on(addr, 4791);
        let from = SocketAddr::from(([127, 44, 0, 9], 50_126));
        let free: Vec<u8> = (0..=255u8).filter(|t| *t != a.tag()).take(8).collect();
        for _ in 0..1000 {
            for t in &free {
                assert!(!a.forward(Owner::Tag(*t), from, 0, b"x"), "nobody holds it: answered here");
            }
        }
        assert_eq!(a.probes, free.len() as u64, "one probe per name, not per packet");
        let b = share_on(addr, 4791);
        let held = b.tag();
        a.absent.insert(Owner::Tag(held), Instant::now() - Duration::from_millis(ABSENT_RECHECK_MS));
        assert!(a.forward(Owner::Tag(held), from, 0, b"y"), "a name taken since is probed again");
    }

    #[test]
    fn a_datagram_that_is_not_a_forwarded_packet_is_refused() {
        assert!(parse_forwarded(&[4; 19]).is_none());
        assert!(parse_forwarded(&[9; 40]).is_none(), "no such family");
        let f = parse_forwarded(&[6; 24]).unwrap();
        assert_eq!((f.src.port(), f.payload.len()), (0x0606, 4));
    }
}
