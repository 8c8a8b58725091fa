//! Service ID Resolution (IBTA 12.11), as rdma_cm resolves a UD peer (`RDMA_PS_UDP`): the
//! active side's SIDR_REQ names the listener's port in a ServiceID and carries rdma_cm's
//! IP header; the passive side answers with its UD QP's number and Q_Key in a SIDR_REP.
//! No connection state follows: a resolved peer is an address handle, a QPN and a Q_Key.

use super::{Cm, CmError, ConnId, OutMad, MAX_CONNECTIONS, MAX_PENDING_PER_LISTENER, MAX_REQUEST_WAIT_NS};
use crate::engine::verbs::Gid;
use crate::proto::cm::msg::{sidr_status, SidrRepRepr, SidrReqRepr};
use crate::proto::cm::{cma, mad, CmMessage, CmaHeader, ServiceId};
use crate::transport::headers::gid_to_ip;
use std::net::IpAddr;

/// Private data a SIDR_REQ carries after rdma_cm's header (216 - 36).
pub const SIDR_REQ_USER_PRIVATE: usize = 180;
/// Private data of a SIDR_REP.
pub const SIDR_REP_PRIVATE: usize = 136;

/// A UD resolution waiting on a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdRequest {
    /// What the answer names.
    pub id: ConnId,
    /// The requester's private data after rdma_cm's header.
    pub private_data: Vec<u8>,
    /// The requester's IP address and rdma_cm port, from its header.
    pub peer: Option<(IpAddr, u16)>,
}

/// How a resolution this side asked for stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SidrStatus {
    /// No answer yet.
    Pending,
    /// The peer's UD QP, its Q_Key and private data.
    Resolved {
        /// The peer's QPN.
        qpn: u32,
        /// The Q_Key its QP takes.
        qkey: u32,
        /// Its SIDR_REP private data.
        private_data: Vec<u8>,
    },
    /// The peer answered with this status ([`sidr_status`]).
    Refused(u8),
    /// No answer after every retry.
    Timeout,
}

/// What to ask (`rdma_connect` on a UD id).
#[derive(Debug, Clone)]
pub struct SidrArgs {
    /// This side's GID and address.
    pub local_gid: Gid,
    /// The peer's GID.
    pub peer_gid: Gid,
    /// rdma_cm's source port.
    pub src_port: u16,
    /// The listener's port.
    pub dst_port: u16,
    /// At most [`SIDR_REQ_USER_PRIVATE`] bytes.
    pub private_data: Vec<u8>,
}

/// One resolution, asked or answered.
#[derive(Debug)]
pub(super) struct Sidr {
    active: bool,
    peer: Gid,
    local: Gid,
    /// The request ID on the wire: ours (active) or the requester's (passive).
    request_id: u32,
    /// The ServiceID asked for (a SIDR_REP names it again).
    service_id: ServiceId,
    /// Active: the SIDR_REQ, repeated on the timer. Passive: the answer, repeated for a
    /// duplicate request.
    mad: Option<Box<[u8; mad::MAD_LEN]>>,
    retries_left: u8,
    timer: Option<u64>,
    status: SidrStatus,
}

fn emit(id: u32, attribute_id: u16, m: CmMessage<'_>) -> Box<[u8; mad::MAD_LEN]> {
    super::msg::emit_mad(id, attribute_id, m)
}

impl Cm {
    /// Starts taking SIDR_REQs for `port` in the UDP port space.
    pub fn listen_ud(&mut self, port: u16) -> Result<(), CmError> {
        if self.ud_listeners.contains_key(&port) {
            return Err(CmError::PortInUse);
        }
        self.ud_listeners.insert(port, Default::default());
        Ok(())
    }

    /// Stops; requests nobody took are refused.
    pub fn close_ud_listener(&mut self, port: u16) {
        for r in self.ud_listeners.remove(&port).unwrap_or_default() {
            let _ = self.answer_ud(r.id, sidr_status::REJECTED, (0, 0), &[]);
        }
    }

    /// The next resolution request on `port`.
    pub fn take_ud_request(&mut self, port: u16) -> Option<UdRequest> {
        self.ud_listeners.get_mut(&port)?.pop_front()
    }

    /// Sends a SIDR_REQ (IBTA 12.11.1), repeated until answered or out of retries.
    pub fn resolve_ud(&mut self, now: u64, a: SidrArgs) -> Result<ConnId, CmError> {
        if self.sidrs.len() >= MAX_CONNECTIONS {
            return Err(CmError::Limit("too many UD resolutions at once"));
        }
        let id = self.new_id();
        let mut pd = [0u8; 216];
        let hdr =
            CmaHeader { version: 0, src_port: a.src_port, src: gid_to_ip(&a.local_gid), dst: gid_to_ip(&a.peer_gid) };
        hdr.emit(&mut pd[..cma::HEADER_LEN]).map_err(|_| CmError::Invalid("address families differ"))?;
        let n = a.private_data.len().min(SIDR_REQ_USER_PRIVATE);
        pd[cma::HEADER_LEN..cma::HEADER_LEN + n].copy_from_slice(&a.private_data[..n]);
        let req = SidrReqRepr {
            request_id: id,
            pkey: 0xffff,
            service_id: ServiceId::for_udp_port(a.dst_port),
            private_data: &pd,
        };
        let m = emit(id, mad::attr::SIDR_REQ, CmMessage::SidrReq(req));
        self.push(OutMad { dst: a.peer_gid, src: a.local_gid, mad: m.clone() });
        let sidr = Sidr {
            active: true,
            peer: a.peer_gid,
            local: a.local_gid,
            request_id: id,
            service_id: ServiceId::for_udp_port(a.dst_port),
            mad: Some(m),
            retries_left: self.cfg.max_retries,
            timer: Some(now + self.sidr_interval_ns()),
            status: SidrStatus::Pending,
        };
        self.sidrs.insert(id, sidr);
        Ok(id)
    }

    /// How a resolution this side asked for stands.
    pub fn ud_status(&self, id: ConnId) -> Option<&SidrStatus> {
        self.sidrs.get(&id).filter(|s| s.active).map(|s| &s.status)
    }

    /// Forgets a resolution (the caller has its outcome, or gave up).
    pub fn forget_ud(&mut self, id: ConnId) {
        self.sidrs.remove(&id);
    }

    /// Answers request `id` with UD QP `qpn` and `qkey` (`rdma_accept`).
    pub fn accept_ud(&mut self, id: ConnId, qpn: u32, qkey: u32, private_data: &[u8]) -> Result<(), CmError> {
        self.answer_ud(id, sidr_status::VALID, (qpn, qkey), private_data)
    }

    /// Refuses request `id` (`rdma_reject`).
    pub fn reject_ud(&mut self, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        self.answer_ud(id, sidr_status::REJECTED, (0, 0), private_data)
    }

    fn answer_ud(&mut self, id: ConnId, status: u8, (qpn, qkey): (u32, u32), pd: &[u8]) -> Result<(), CmError> {
        let s = self.sidrs.get(&id).filter(|s| !s.active && s.mad.is_none()).ok_or(CmError::NoConnection)?;
        let (peer, local, request_id, sid) = (s.peer, s.local, s.request_id, s.service_id);
        let m = sidr_rep(request_id, sid, status, (qpn, qkey), pd);
        for q in self.ud_listeners.values_mut() {
            q.retain(|r| r.id != id);
        }
        if let Some(s) = self.sidrs.get_mut(&id) {
            s.mad = Some(m.clone());
        }
        self.push(OutMad { dst: peer, src: local, mad: m });
        Ok(())
    }

    /// A SIDR_REQ (12.11.1): queued on its listener, or answered at once when nobody
    /// listens, the listener is full or the request is a duplicate.
    pub(super) fn on_sidr_req(&mut self, now: u64, src: Gid, local: Gid, r: &SidrReqRepr<'_>) {
        let dup = self.sidrs.iter().find(|(_, s)| !s.active && s.peer == src && s.request_id == r.request_id);
        if let Some((_, s)) = dup {
            self.stats.duplicates += 1;
            if let Some(m) = s.mad.clone() {
                self.push(OutMad { dst: src, src: local, mad: m });
            }
            return;
        }
        let refuse = |status| sidr_rep(r.request_id, r.service_id, status, (0, 0), &[]);
        let port = match r.service_id.ip_port() {
            Some((cma::PORT_SPACE_UDP, port)) if self.ud_listeners.contains_key(&port) => port,
            _ => return self.push(OutMad { dst: src, src: local, mad: refuse(sidr_status::UNSUPPORTED_SERVICE) }),
        };
        let hdr = CmaHeader::parse(&r.private_data[..cma::HEADER_LEN]).ok().filter(|h| h.dst == gid_to_ip(&local));
        let Some(hdr) = hdr.filter(|_| self.sidrs.len() < MAX_CONNECTIONS) else {
            return self.push(OutMad { dst: src, src: local, mad: refuse(sidr_status::REJECTED) });
        };
        if self.ud_listeners[&port].len() >= MAX_PENDING_PER_LISTENER {
            let oldest = self.ud_listeners[&port][0].id;
            let _ = self.answer_ud(oldest, sidr_status::REJECTED, (0, 0), &[]);
        }
        let id = self.new_id();
        let s = Sidr {
            active: false,
            peer: src,
            local,
            request_id: r.request_id,
            service_id: r.service_id,
            mad: None,
            retries_left: 0,
            // Kept to answer duplicates, and dropped after this long (answered or not).
            timer: Some(now + MAX_REQUEST_WAIT_NS),
            status: SidrStatus::Pending,
        };
        self.sidrs.insert(id, s);
        let request = UdRequest {
            id,
            private_data: r.private_data[cma::HEADER_LEN..].to_vec(),
            peer: Some((hdr.src, hdr.src_port)),
        };
        self.ud_listeners.get_mut(&port).expect("checked").push_back(request);
    }

    /// A SIDR_REP (12.11.2) for a resolution this side asked for; false if it names none.
    pub(super) fn on_sidr_rep(&mut self, src: Gid, r: &SidrRepRepr<'_>) -> bool {
        let Some(s) = self.sidrs.get_mut(&r.request_id).filter(|s| s.active && s.peer == src) else { return false };
        if s.status != SidrStatus::Pending {
            self.stats.duplicates += 1;
            return true;
        }
        s.status = if r.status == sidr_status::VALID {
            SidrStatus::Resolved { qpn: r.qpn, qkey: r.qkey, private_data: r.private_data.to_vec() }
        } else {
            SidrStatus::Refused(r.status)
        };
        s.timer = None;
        s.mad = None;
        true
    }

    /// The earliest SIDR timer.
    pub(super) fn sidr_timeout(&self) -> Option<u64> {
        self.sidrs.values().filter_map(|s| s.timer).min()
    }

    /// Repeats unanswered SIDR_REQs, fails those out of retries, drops old answers.
    pub(super) fn sidr_timers(&mut self, now: u64) {
        let due: Vec<ConnId> =
            self.sidrs.iter().filter(|(_, s)| s.timer.is_some_and(|t| t <= now)).map(|(&i, _)| i).collect();
        let interval = self.sidr_interval_ns();
        for id in due {
            let Some(s) = self.sidrs.get_mut(&id) else { continue };
            if !s.active {
                self.sidrs.remove(&id);
                for q in self.ud_listeners.values_mut() {
                    q.retain(|r| r.id != id);
                }
                continue;
            }
            if s.retries_left == 0 {
                s.status = SidrStatus::Timeout;
                s.timer = None;
                continue;
            }
            s.retries_left -= 1;
            s.timer = Some(now + interval);
            let m = OutMad { dst: s.peer, src: s.local, mad: s.mad.clone().expect("a pending request keeps its MAD") };
            self.stats.retransmissions += 1;
            self.push(m);
        }
    }

    /// A SIDR_REQ is repeated after the peer's response time and a round trip.
    fn sidr_interval_ns(&self) -> u64 {
        2 * super::timeout_ns(self.cfg.packet_life) + super::timeout_ns(self.cfg.response_timeout)
    }
}

fn sidr_rep(
    request_id: u32,
    service_id: ServiceId,
    status: u8,
    (qpn, qkey): (u32, u32),
    pd: &[u8],
) -> Box<[u8; mad::MAD_LEN]> {
    let mut private = [0u8; SIDR_REP_PRIVATE];
    let n = pd.len().min(SIDR_REP_PRIVATE);
    private[..n].copy_from_slice(&pd[..n]);
    let info = [0u8; 72];
    let rep = SidrRepRepr {
        request_id,
        status,
        additional_info_len: 0,
        qpn,
        service_id,
        qkey,
        additional_info: &info,
        private_data: &private,
    };
    emit(request_id, mad::attr::SIDR_REP, CmMessage::SidrRep(rep))
}
