//! The kernel's share of a RoCEv2 ping-pong, measured apart from softrdma's own work: an
//! endpoint that makes the socket calls a device makes (a WRITE ping-pong's turn is a
//! request and the ACK it held, sent as one GSO message; a READ's leg is one datagram;
//! received with GRO and its control messages, on sockets opened as a device opens them)
//! and nothing else. `softrdma demo` times ping-pongs of these beside plain UDP's.

use super::sys::{self, RecvBatch, Segmented};
use super::udp::{open_socket, GRO_BUFFER_BYTES};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// An 8-byte RDMA WRITE Only with its RETH (BTH 12, RETH 16, payload 8, ICRC 4) and an
/// ACK (BTH 12, AETH 4, ICRC 4): what each side of a WRITE ping-pong sends per turn.
pub const WRITE_TURN: &[usize] = &[40, 20];

/// A READ request (BTH 12, RETH 16, ICRC 4): one leg of a READ's round trip, one datagram
/// each way as its 8-byte response (28 bytes) is.
pub const READ_LEG: &[usize] = &[32];

/// One side of the ping-pong.
pub struct FloorEndpoint {
    rx: UdpSocket,
    tx: UdpSocket,
    batch: RecvBatch,
    datagrams: Vec<Vec<u8>>,
}

impl FloorEndpoint {
    /// Opens [`open_sockets`] on `addr`; each turn sends datagrams of `sizes` bytes in one
    /// message (one GSO send when there are several).
    pub fn open(addr: IpAddr, sizes: &[usize]) -> io::Result<FloorEndpoint> {
        Ok(FloorEndpoint::on(open_sockets(addr)?, sizes))
    }

    /// As [`FloorEndpoint::open`], on sockets [`open_sockets`] made (in whichever network
    /// namespace the path needs).
    pub fn on((rx, tx): (UdpSocket, UdpSocket), sizes: &[usize]) -> FloorEndpoint {
        let datagrams = sizes.iter().map(|&n| vec![0u8; n]).collect();
        FloorEndpoint { rx, tx, batch: RecvBatch::new(1, GRO_BUFFER_BYTES), datagrams }
    }

    /// Where the peer sends to.
    pub fn local(&self) -> io::Result<SocketAddr> {
        self.rx.local_addr()
    }

    /// Sends the turn's datagrams to `to` in one message.
    pub fn send_turn(&self, to: SocketAddr) -> io::Result<()> {
        let msg = Segmented { dst: to, first: 0, count: self.datagrams.len() };
        sys::send_segmented(self.tx.as_raw_fd(), &self.datagrams, &[msg]).map(|_| ())
    }

    /// Where the last message received came from.
    pub fn last_source(&self) -> Option<SocketAddr> {
        self.batch.get(0).map(|(_, src, _)| src)
    }

    /// Spins on the socket until a turn's worth of datagrams arrived (as many as this side
    /// sends: a path that cuts a GSO send into datagrams may deliver them in two reads);
    /// the error if they did not come within `limit`.
    pub fn recv_spinning(&mut self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        let mut got = 0;
        while got < self.datagrams.len() {
            let n = self.batch.recv(self.rx.as_raw_fd())?;
            got += (0..n).map(|i| self.batch.datagrams_in(i)).sum::<usize>();
            if n == 0 && start.elapsed() > limit {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the peer's turn did not arrive"));
            }
        }
        Ok(())
    }
}

/// A device's receive socket (shared, with GRO) and a sending socket on `addr`, both on
/// ports the kernel picks.
pub fn open_sockets(addr: IpAddr) -> io::Result<(UdpSocket, UdpSocket)> {
    Ok((open_receive_socket(SocketAddr::new(addr, 0))?, open_socket(SocketAddr::new(addr, 0), false, false)?))
}

/// A socket on `addr` made as a device makes its receive socket (shared, GRO on).
pub fn open_receive_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let rx = open_socket(addr, true, false)?;
    sys::set_udp_gro(rx.as_raw_fd())?;
    Ok(rx)
}

/// When each of `iters` exchanges of turns of `sizes` began, and when the last ended,
/// between endpoints on `a` and `b`, each on a thread of its own.
pub fn ping_pong(a: IpAddr, b: IpAddr, sizes: &[usize], iters: usize) -> io::Result<Vec<Instant>> {
    ping_pong_between(FloorEndpoint::open(a, sizes)?, FloorEndpoint::open(b, sizes)?, iters)
}

/// As [`ping_pong`], between endpoints already open.
pub fn ping_pong_between(mut x: FloorEndpoint, mut y: FloorEndpoint, iters: usize) -> io::Result<Vec<Instant>> {
    let (to_x, to_y) = (x.local()?, y.local()?);
    let limit = Duration::from_secs(2);
    std::thread::scope(|s| {
        s.spawn(move || {
            for _ in 0..iters {
                if y.recv_spinning(limit).and_then(|()| y.send_turn(to_x)).is_err() {
                    return;
                }
            }
        });
        let mut stamps = Vec::with_capacity(iters + 1);
        for _ in 0..iters {
            stamps.push(Instant::now());
            x.send_turn(to_y)?;
            x.recv_spinning(limit)?;
        }
        stamps.push(Instant::now());
        Ok(stamps)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_turn_arrives_as_one_message() {
        let (a, b) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
        for (sizes, segment) in [(WRITE_TURN, Some(40)), (READ_LEG, None)] {
            let (x, mut y) = (FloorEndpoint::open(a, sizes).unwrap(), FloorEndpoint::open(b, sizes).unwrap());
            x.send_turn(y.local().unwrap()).unwrap();
            y.recv_spinning(Duration::from_secs(2)).unwrap();
            let (bytes, _, _) = y.batch.get(0).unwrap();
            assert_eq!(bytes.len(), sizes.iter().sum::<usize>(), "the turn in one buffer");
            assert_eq!(y.batch.segment_bytes(0), segment, "GRO reports the first datagram's size");
            // A turn cut into its datagrams (as a link without GSO delivers it) is one turn.
            for &n in sizes {
                let lone = UdpSocket::bind((a, 0)).unwrap();
                lone.send_to(&vec![0u8; n], y.local().unwrap()).unwrap();
            }
            y.recv_spinning(Duration::from_secs(2)).unwrap();
            assert!(y.batch.recv(y.rx.as_raw_fd()).unwrap() == 0, "every datagram of the turn was read");
            let stamps = ping_pong(a, b, sizes, 200).unwrap();
            assert_eq!(stamps.len(), 201, "every exchange began, and the last ended");
            assert!(stamps.windows(2).all(|w| w[1] > w[0]));
        }
    }
}
