//! rdma_cm's UD port space (`RDMA_PS_UDP`) on RoCEv2: a peer's UD QP is found by Service
//! ID Resolution (IBTA 12.11, [`crate::cm`]) rather than connected. iWARP has no UD.

use super::{Backend, Context, QueuePair};
use crate::driver::roce::RoceDriver;
use crate::driver::roce_cm;
use crate::engine::verbs::Gid;
use crate::iwarp::config::ConnectError;
use crate::transport::headers::ip_to_gid;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The Q_Key rdma_cm gives UD QPs of its UDP port space (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// A UD QP a resolution found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdPeer {
    /// Its GID (the address handle's destination).
    pub gid: Gid,
    /// Its QPN.
    pub qpn: u32,
    /// The Q_Key it takes.
    pub qkey: u32,
    /// The private data of its answer.
    pub private_data: Vec<u8>,
}

/// A listener in the UD port space (`rdma_listen` on an `RDMA_PS_UDP` id).
pub struct UdListener {
    local: SocketAddr,
    port: u16,
    driver: Arc<RoceDriver>,
}

/// A peer's resolution request. Dropping it unanswered refuses it.
pub struct UdRequest {
    /// The requester's private data (after rdma_cm's IP header).
    pub private_data: Vec<u8>,
    /// The requester's address.
    pub peer: Option<SocketAddr>,
    id: crate::cm::ConnId,
    driver: Arc<RoceDriver>,
    answered: bool,
}

fn roce(ctx: &Context) -> Result<&Arc<RoceDriver>, ConnectError> {
    match &ctx.backend {
        Backend::Roce(d) => Ok(d),
        Backend::Iwarp(_) => Err(ConnectError::Invalid("iWARP has no UD QPs")),
    }
}

impl Context {
    /// Listens for UD resolutions on `addr`'s port (0: a free one).
    pub fn listen_ud(&self, addr: SocketAddr) -> io::Result<UdListener> {
        let unsupported = |e: ConnectError| io::Error::new(io::ErrorKind::Unsupported, e.to_string());
        let driver = roce(self).map_err(unsupported)?.clone();
        let port = roce_cm::listen_ud(&driver, addr.port())
            .map_err(|e| io::Error::new(io::ErrorKind::AddrInUse, e.to_string()))?;
        Ok(UdListener { local: SocketAddr::new(self.ip(), port), port, driver })
    }

    /// Finds the UD QP listening at `to` (`rdma_connect` on a UD id), waiting at most
    /// `timeout` for its answer.
    pub fn resolve_ud(&self, to: SocketAddr, private_data: &[u8], timeout: Duration) -> Result<UdPeer, ConnectError> {
        let (qpn, qkey, private_data) = roce_cm::resolve_ud(roce(self)?, to, private_data, timeout)?;
        Ok(UdPeer { gid: ip_to_gid(to.ip()), qpn, qkey, private_data })
    }
}

impl UdListener {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next resolution request, waiting at most `timeout`.
    pub fn get_request(&self, timeout: Duration) -> Option<UdRequest> {
        let r = roce_cm::get_ud_request(&self.driver, self.port, timeout)?;
        Some(UdRequest {
            private_data: r.private_data,
            peer: r.peer.map(|(ip, port)| SocketAddr::new(ip, port)),
            id: r.id,
            driver: self.driver.clone(),
            answered: false,
        })
    }
}

impl Drop for UdListener {
    fn drop(&mut self) {
        roce_cm::close_ud_listener(&self.driver, self.port);
    }
}

impl UdRequest {
    /// Answers with UD QP `qp`, which takes `qkey` (`rdma_accept`).
    pub fn accept(mut self, qp: &QueuePair, qkey: u32, private_data: &[u8]) -> Result<(), ConnectError> {
        self.answered = true;
        roce_cm::answer_ud(&self.driver, self.id, Some((qp.qp_num(), qkey)), private_data)
    }

    /// Refuses (`rdma_reject`).
    pub fn reject(mut self, private_data: &[u8]) {
        self.answered = true;
        let _ = roce_cm::answer_ud(&self.driver, self.id, None, private_data);
    }
}

impl Drop for UdRequest {
    fn drop(&mut self) {
        if !self.answered {
            let _ = roce_cm::answer_ud(&self.driver, self.id, None, &[]);
        }
    }
}
