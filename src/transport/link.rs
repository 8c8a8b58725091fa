//! The one interface between a RoCEv2 device's driver loop and the ways of moving its
//! packets: kernel UDP sockets, or whole Ethernet frames on a raw socket.
//!
//! A transport comes in two halves so that receiving (the poll thread, or a busy-polling
//! caller) never waits for a sender and the other way round. The driver holds the device
//! lock while it calls either half's engine-facing method.

use crate::engine::Device;
use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU64;

/// The sending half: takes the engine's packets, gives each its headers and ICRC, and
/// sends them in batches.
pub trait PacketTx: Send {
    /// Sends every packet the engine has ready.
    fn flush(&mut self, dev: &mut Device, now_ns: u64);
    /// The UDP port the device receives on.
    fn port(&self) -> u16;
    /// How packets move, for people (e.g. "kernel UDP sockets").
    fn describe(&self) -> String;
    /// Sends to `peer` on `port` rather than the device's own port (several devices on
    /// one address, in tests). Transports with a fixed port ignore it.
    fn set_peer_port(&mut self, _peer: IpAddr, _port: u16) {}
}

/// The receiving half: reads a batch, then checks it and hands what is good to the engine.
pub trait PacketRx: Send {
    /// The descriptor that becomes readable when a batch may be waiting.
    fn fd(&self) -> RawFd;
    /// Reads what is queued (up to one batch) without blocking; returns the count.
    fn recv(&mut self) -> io::Result<usize>;
    /// Checks every packet of the last [`PacketRx::recv`] and hands the good ones to `dev`.
    fn deliver(&mut self, dev: &mut Device, now_ns: u64);
    /// The tag the device's QPNs and CM IDs carry when it shares its address with other
    /// processes ([`super::share`]); `None`: it does not.
    fn id_tag(&self) -> Option<u8> {
        None
    }
    /// Takes the CM requests for `port` among the devices sharing the address; fails if
    /// another of them listens there.
    fn claim_service(&mut self, _port: u16) -> io::Result<()> {
        Ok(())
    }
    /// Gives up `port`'s CM requests.
    fn release_service(&mut self, _port: u16) {}
    /// Starts receiving multicast group `mgid`'s datagrams (for the engine's
    /// `handle_multicast`).
    fn join(&mut self, _mgid: &crate::engine::verbs::Gid) -> io::Result<()> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "multicast is not offered on this link"))
    }
    /// Stops receiving group `mgid`.
    fn leave(&mut self, _mgid: &crate::engine::verbs::Gid) {}
}

/// Transport counters, shared by both halves (the engine counts the rest).
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Datagrams (or frames) received.
    pub rx_datagrams: AtomicU64,
    /// Packets whose ICRC did not check (dropped before the engine).
    pub rx_icrc_bad: AtomicU64,
    /// Packets too short to be RoCEv2, or from an address family the device cannot use.
    pub rx_runt: AtomicU64,
    /// IPv4 packets that came with a non-zero Identification.
    pub rx_ipv4_ident_nonzero: AtomicU64,
    /// Datagrams (or frames) sent.
    pub tx_datagrams: AtomicU64,
    /// Packets the kernel refused.
    pub tx_errors: AtomicU64,
    /// Raw: IP fragments, dropped (RoCEv2 is never fragmented).
    pub rx_fragments: AtomicU64,
    /// Raw: frames for another host or protocol, ignored.
    pub rx_not_ours: AtomicU64,
    /// Raw: ARP requests and IPv6 Neighbour Solicitations answered.
    pub neighbour_replies: AtomicU64,
    /// Raw: ARP requests and Neighbour Solicitations sent to resolve a peer.
    pub neighbour_requests: AtomicU64,
    /// Raw: ICMP echo requests answered.
    pub echo_replies: AtomicU64,
    /// Raw: packets dropped because their next hop did not resolve in time.
    pub tx_unresolved: AtomicU64,
    /// UDP, address shared: packets read for another device on the address and handed on.
    pub forwarded_out: AtomicU64,
    /// UDP, address shared: packets another device on the address handed to this one.
    pub forwarded_in: AtomicU64,
    /// UDP, address shared: packets for another device whose queue was full (lost, as on
    /// a wire).
    pub forward_dropped: AtomicU64,
}
