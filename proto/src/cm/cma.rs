//! What rdma_cm adds to IB CM over RoCE: the ServiceID of its port spaces and the IP
//! address header at the start of the REQ private data (rdma-core `librdmacm`, IBTA
//! Annex A11 "RDMA IP CM Service").

use crate::wire::{be16, put16};
use crate::{Error, Result};
use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A CM ServiceID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServiceId(pub u64);

/// The rdma_cm port space of TCP-like connections (RDMA_PS_TCP).
pub const PORT_SPACE_TCP: u16 = 0x0106;
/// The rdma_cm port space of UD QPs (RDMA_PS_UDP), resolved by SIDR.
pub const PORT_SPACE_UDP: u16 = 0x0111;

impl ServiceId {
    /// The ServiceID rdma_cm uses for `port` in the TCP port space (Annex A11.2.1).
    pub const fn for_tcp_port(port: u16) -> ServiceId {
        ServiceId((PORT_SPACE_TCP as u64) << 16 | port as u64)
    }
    /// The ServiceID rdma_cm uses for `port` in the UDP port space.
    pub const fn for_udp_port(port: u16) -> ServiceId {
        ServiceId((PORT_SPACE_UDP as u64) << 16 | port as u64)
    }
    /// The (port space, port) of an IP CM ServiceID, if it is one.
    pub const fn ip_port(self) -> Option<(u16, u16)> {
        if self.0 >> 32 == 0 {
            Some(((self.0 >> 16) as u16, self.0 as u16))
        } else {
            None
        }
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip_port() {
            Some((PORT_SPACE_TCP, port)) => write!(f, "sid=tcp:{port}"),
            Some((PORT_SPACE_UDP, port)) => write!(f, "sid=udp:{port}"),
            _ => write!(f, "sid=0x{:016x}", self.0),
        }
    }
}

/// Length of the IP CM header at the start of REQ private data.
pub const HEADER_LEN: usize = 36;

/// The rdma_cm IP address header (Annex A11.2.4.1): version, IP version, source port,
/// source and destination addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// Header version (0).
    pub version: u8,
    /// Source port of the active side.
    pub src_port: u16,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
}

fn addr(b: &[u8], v6: bool) -> IpAddr {
    if v6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[..16]);
        IpAddr::V6(Ipv6Addr::from(a))
    } else {
        IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
    }
}

fn put_addr(b: &mut [u8], a: IpAddr) {
    match a {
        IpAddr::V4(v4) => {
            b[..12].fill(0);
            b[12..16].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => b[..16].copy_from_slice(&v6.octets()),
    }
}

impl CmaHeader {
    /// Reads the header from REQ private data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        Error::check_len(HEADER_LEN, b.len())?;
        let v6 = match b[1] >> 4 {
            4 => false,
            6 => true,
            _ => return Err(Error::BadValue("IP CM header IP version")),
        };
        if b[1] & 0x0f != 0 {
            return Err(Error::BadValue("IP CM header reserved bits"));
        }
        if !v6 && (b[4..16].iter().any(|&x| x != 0) || b[20..32].iter().any(|&x| x != 0)) {
            return Err(Error::BadValue("IP CM header IPv4 padding"));
        }
        Ok(CmaHeader { version: b[0], src_port: be16(b, 2), src: addr(&b[4..20], v6), dst: addr(&b[20..36], v6) })
    }
    /// Writes the header; both addresses must be of one family.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        Error::check_len(HEADER_LEN, b.len())?;
        let v = match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            _ => return Err(Error::BadValue("IP CM header mixes address families")),
        };
        b[0] = self.version;
        b[1] = v << 4;
        put16(b, 2, self.src_port);
        put_addr(&mut b[4..20], self.src);
        put_addr(&mut b[20..36], self.dst);
        Ok(())
    }
}

impl fmt::Display for CmaHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cma {}:{} -> {}", self.src, self.src_port, self.dst)
    }
}
