//! The multicast groups a device on kernel UDP sockets has joined: one socket per group,
//! bound to the group's address and the RoCEv2 port (several devices and processes may
//! bind it: each gets its copy), a member of the group on the device's interface. What
//! arrives there is a datagram to DestQP 0xFFFFFF, checked against an IP header whose
//! destination is the group and handed to `Device::handle_multicast`.

use crate::engine::mcast::MAX_MCAST_GROUPS;
use crate::engine::verbs::Gid;
use crate::transport::headers::gid_to_ip;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

/// Most datagrams one [`McastSockets::recv`] reads over all groups.
const RECV_MAX: usize = 32;
/// Largest datagram read (a 4096-byte MTU's packet with room to spare).
const DATAGRAM_MAX: usize = 9216;

struct Group {
    mgid: Gid,
    socket: UdpSocket,
}

/// The index of the interface holding `local` (IPv6 groups are joined, and sent to, on an
/// interface, not an address).
pub fn interface_index(local: IpAddr) -> io::Result<u32> {
    let iface = crate::transport::sys::interface_of_address(local)?;
    Ok(crate::transport::sys::interface_info(&iface)?.0)
}

/// The joined groups and what the last [`McastSockets::recv`] read from them.
#[derive(Default)]
pub struct McastSockets {
    groups: Vec<Group>,
    /// (group index, sender, buffer, length); buffers are kept from read to read.
    received: Vec<(usize, SocketAddr, Vec<u8>, usize)>,
    pending: usize,
}

impl McastSockets {
    /// Joins `mgid` (an IPv4 multicast group as an IPv4-mapped GID, or an IPv6 one as
    /// itself) on the interface of `local`, receiving on `port`; returns the socket's
    /// descriptor for the poll set.
    pub fn join(&mut self, mgid: &Gid, local: IpAddr, port: u16) -> io::Result<RawFd> {
        let group = gid_to_ip(mgid);
        if !group.is_multicast() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a multicast group"));
        }
        if self.groups.len() >= MAX_MCAST_GROUPS {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "too many groups"));
        }
        let s = match (group, local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => {
                let s =
                    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
                s.set_reuse_address(true)?;
                s.bind(&SocketAddr::new(group, port).into())?;
                s.join_multicast_v4(&g, &l)?;
                s
            }
            (IpAddr::V6(g), IpAddr::V6(_)) => {
                let ifindex = interface_index(local)?;
                let s =
                    socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
                s.set_only_v6(true)?;
                s.set_reuse_address(true)?;
                s.bind(&SocketAddr::new(group, port).into())?;
                s.join_multicast_v6(&g, ifindex)?;
                s
            }
            _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "the group's family is not the device's")),
        };
        s.set_nonblocking(true)?;
        let socket: UdpSocket = s.into();
        let fd = socket.as_raw_fd();
        self.groups.push(Group { mgid: *mgid, socket });
        Ok(fd)
    }

    /// Leaves `mgid` (closing its socket); the descriptor to take out of the poll set.
    pub fn leave(&mut self, mgid: &Gid) -> Option<RawFd> {
        let at = self.groups.iter().position(|g| &g.mgid == mgid)?;
        self.pending = 0;
        let g = self.groups.remove(at);
        Some(g.socket.as_raw_fd())
    }

    /// Reads what the group sockets hold, at most [`RECV_MAX`] datagrams, without
    /// blocking; returns how many.
    pub fn recv(&mut self) -> usize {
        self.pending = 0;
        for (i, g) in self.groups.iter().enumerate() {
            while self.pending < RECV_MAX {
                if self.received.len() == self.pending {
                    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
                    self.received.push((0, unspecified, vec![0u8; DATAGRAM_MAX], 0));
                }
                let slot = &mut self.received[self.pending];
                let Ok((len, src)) = g.socket.recv_from(&mut slot.2) else { break };
                (slot.0, slot.1, slot.3) = (i, src, len);
                self.pending += 1;
            }
        }
        self.pending
    }

    /// The datagrams of the last [`McastSockets::recv`]: (group, sender, bytes).
    pub fn received(&self) -> impl Iterator<Item = (Gid, SocketAddr, &[u8])> {
        self.received[..self.pending].iter().map(|(g, src, buf, len)| (self.groups[*g].mgid, *src, &buf[..*len]))
    }

    /// Whether any group is joined.
    pub fn any(&self) -> bool {
        !self.groups.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::headers::ip_to_gid;
    use std::net::Ipv4Addr;

    /// A peer flooding a joined group: one look reads at most `RECV_MAX` datagrams into
    /// at most `RECV_MAX` kept buffers, and the rest wait in the socket for later looks.
    #[test]
    fn a_flooded_group_is_read_a_bounded_batch_at_a_time() {
        let (group, local) = (Ipv4Addr::new(239, 77, 1, 9), Ipv4Addr::new(127, 0, 0, 1));
        let mut m = McastSockets::default();
        m.join(&ip_to_gid(group.into()), local.into(), 0).unwrap();
        let port = m.groups[0].socket.local_addr().unwrap().port();
        let peer = UdpSocket::bind((local, 0)).unwrap();
        socket2::SockRef::from(&peer).set_multicast_if_v4(&local).unwrap();
        let flood = 3 * RECV_MAX + 5;
        for i in 0..flood {
            peer.send_to(&[i as u8; 64], (group, port)).unwrap();
        }
        let mut total = 0;
        for _ in 0..100 {
            let n = m.recv();
            assert!(n <= RECV_MAX && m.received.len() <= RECV_MAX, "{n} read, {} kept", m.received.len());
            assert_eq!(m.received().count(), n);
            total += n;
            if total == flood {
                break;
            }
        }
        assert_eq!(total, flood, "every datagram read, a batch at a time");
        assert!(m.leave(&ip_to_gid(group.into())).is_some() && !m.any());
    }
}
