//! What the CM does with each message a peer sends (IBTA 12.9). Every message is matched
//! to a connection by the communication ID this side chose and by the GID it came from: a
//! stranger cannot complete, refuse or tear down another's connection.

use super::msg::{self, reason};
use super::{timeout_ns, Cm, CmFailure, Conn, ConnStatus, OutMad, QpControl, Request, State};
use super::{Offer, MAX_CONNECTIONS, MAX_PENDING_PER_LISTENER, MAX_REQUEST_WAIT_NS};
use crate::engine::verbs::{Gid, Mtu, QpAttr, QpState};
use crate::proto::cm::msg::{DreqRepr, IdsRepr, MraRepr, RejRepr, RepRepr, ReqRepr};
use crate::proto::cm::{cma, mad, CmMadRepr, CmMessage, CmaHeader, MadPacket};
use crate::transport::headers::gid_to_ip;

impl Cm {
    /// A MAD that arrived on QP1 from `src` for `local` (one of this device's GIDs).
    pub fn handle_mad(&mut self, now: u64, src: Gid, local: Gid, bytes: &[u8], qps: &mut dyn QpControl) {
        self.stats.mads_in += 1;
        let parsed = MadPacket::new_checked(bytes).and_then(|p| CmMadRepr::parse(&p));
        let Ok(m) = parsed else {
            self.stats.mads_dropped += 1;
            return;
        };
        let h = m.header;
        // 12.11: CM class, version 2, method Send; anything else is not for this CM.
        if h.base_version != 1
            || h.mgmt_class != mad::MGMT_CLASS_CM
            || h.class_version != msg::CLASS_VERSION
            || h.method != 3
        {
            self.stats.mads_dropped += 1;
            return;
        }
        let handled = match m.message {
            CmMessage::Req(r) => {
                self.on_req(now, src, local, &r);
                true
            }
            CmMessage::Rep(r) => self.on_rep(now, src, &r, qps),
            CmMessage::Rtu(r) => self.on_rtu(src, &r, qps),
            CmMessage::Rej(r) => self.on_rej(now, src, &r, qps),
            CmMessage::Mra(r) => self.on_mra(now, src, &r),
            CmMessage::Dreq(r) => {
                self.on_dreq(now, src, local, &r, qps);
                true
            }
            CmMessage::Drep(r) => self.on_drep(now, src, &r),
            CmMessage::SidrReq(r) => {
                self.on_sidr_req(now, src, local, &r);
                true
            }
            CmMessage::SidrRep(r) => self.on_sidr_rep(src, &r),
            CmMessage::Other(_) => false,
        };
        if !handled {
            self.stats.mads_dropped += 1;
        }
    }

    fn reply(&mut self, dst: Gid, src: Gid, mad: Box<[u8; msg::MAD_LEN]>) {
        self.push(OutMad { dst, src, mad });
    }

    /// 12.9.7 (passive, Listen → REQ Rcvd), with duplicates (12.9.8.1) and stale
    /// connections (12.9.8.3.1) first.
    fn on_req(&mut self, now: u64, src: Gid, local: Gid, r: &ReqRepr<'_>) {
        let same = |c: &Conn| c.peer_gid == src && c.remote_guid == r.local_ca_guid;
        let dup = self.conns.iter().find(|(_, c)| !c.active && same(c) && c.remote_id == r.local_comm_id);
        if let Some((id, state, remote_id, last)) = dup.map(|(&id, c)| (id, c.state, c.remote_id, c.last.clone())) {
            self.stats.duplicates += 1;
            match state {
                State::ReqRcvd => {
                    // The application is slow: ask the initiator for more time (12.6.6).
                    let mad = msg::mra(id, remote_id, self.cfg.response_timeout + 1);
                    let c = self.conns.get_mut(&id).expect("found above");
                    c.state = State::MraSent;
                    c.last = Some(mad.clone());
                    self.reply(src, local, mad);
                }
                State::MraSent | State::RepSent | State::TimeWait => {
                    if let Some(m) = last {
                        self.reply(src, local, m);
                    }
                }
                _ => {}
            }
            return;
        }
        let refuse = |why| msg::rej(0, r.local_comm_id, msg::REJ_MSG_REQ, why, &[]);
        if self.conns.values().any(|c| same(c) && c.remote_qpn == r.local_qpn && c.state != State::TimeWait) {
            // A new REQ from a QP this side still has a connection with (12.9.8.3.1).
            return self.reply(src, local, refuse(reason::STALE_CONNECTION));
        }
        match self.check_req(src, local, r) {
            Ok((port, hdr)) => self.hold_request(now, src, local, r, port, hdr),
            Err(why) => self.reply(src, local, refuse(why)),
        }
    }

    /// What a REQ must be for rdma_cm on this device; the listener's port and the
    /// initiator's IP header, or the REJ reason.
    fn check_req(&self, src: Gid, local: Gid, r: &ReqRepr<'_>) -> Result<(u16, CmaHeader), u16> {
        if r.transport_service_type != 0 {
            return Err(reason::INVALID_TRANSPORT);
        }
        if Mtu::from_code(r.path_mtu).is_none() {
            return Err(reason::INVALID_MTU);
        }
        // The data path goes where the REQ came from, nowhere else.
        if r.primary_path.local_gid != src || r.primary_path.remote_gid != local {
            return Err(reason::INVALID_GID);
        }
        let hdr = CmaHeader::parse(&r.private_data[..cma::HEADER_LEN]).map_err(|_| reason::CONSUMER)?;
        if hdr.dst != gid_to_ip(&local) {
            return Err(reason::INVALID_GID);
        }
        match r.service_id.ip_port() {
            Some((cma::PORT_SPACE_TCP, port)) if self.listeners.contains_key(&port) => {
                if self.conns.len() >= MAX_CONNECTIONS {
                    return Err(reason::NO_RESOURCES);
                }
                Ok((port, hdr))
            }
            _ => Err(reason::INVALID_SERVICE_ID),
        }
    }

    fn hold_request(&mut self, now: u64, src: Gid, local: Gid, r: &ReqRepr<'_>, port: u16, hdr: CmaHeader) {
        if self.listeners[&port].len() >= MAX_PENDING_PER_LISTENER {
            let oldest = self.listeners[&port][0].id;
            let _ = self.reject_with(now, oldest, reason::NO_RESOURCES, &[]);
        }
        let id = self.new_id();
        let offer = Offer {
            mtu: Mtu::from_code(r.path_mtu).expect("checked"),
            responder_resources: r.responder_resources,
            local_ack_timeout: r.primary_path.local_ack_timeout,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
        };
        let conn = Conn {
            state: State::ReqRcvd,
            active: false,
            remote_id: r.local_comm_id,
            remote_guid: r.local_ca_guid,
            qpn: u32::MAX,
            remote_qpn: r.local_qpn,
            remote_psn: r.starting_psn,
            local_gid: local,
            peer_gid: src,
            port,
            last: None,
            retries_left: r.max_cm_retries,
            max_retries: r.max_cm_retries,
            timer: Some(now + MAX_REQUEST_WAIT_NS),
            // 12.7.x: the REP is repeated after the initiator's response time and a round
            // trip.
            interval_ns: 2 * timeout_ns(self.cfg.packet_life) + timeout_ns(r.local_cm_response_timeout),
            offer: Some(offer),
            rts: None,
            asked: None,
            status: ConnStatus::Pending,
            peer_private: Vec::new(),
        };
        self.conns.insert(id, conn);
        let request = Request {
            id,
            private_data: r.private_data[cma::HEADER_LEN..].to_vec(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            peer: Some((hdr.src, hdr.src_port)),
        };
        self.listeners.get_mut(&port).expect("checked").push_back(request);
    }

    /// 12.9.6 (active, REQ Sent → Established): the QP to RTR and RTS with the REP's
    /// answer, then RTU. A repeated REP means the RTU was lost: it goes again.
    fn on_rep(&mut self, now: u64, src: Gid, r: &RepRepr<'_>, qps: &mut dyn QpControl) -> bool {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id).filter(|c| c.peer_gid == src).filter(|c| c.active) else {
            return false;
        };
        match c.state {
            State::ReqSent => {}
            State::Established => {
                let (dst, local, last) = (c.peer_gid, c.local_gid, c.last.clone());
                self.stats.duplicates += 1;
                if let Some(m) = last {
                    self.reply(dst, local, m);
                }
                return true;
            }
            _ => return true,
        }
        let asked = c.asked.clone().expect("an active connection keeps what it asked");
        c.remote_id = r.local_comm_id;
        c.remote_guid = r.local_ca_guid;
        c.remote_qpn = r.local_qpn;
        c.remote_psn = r.starting_psn;
        c.peer_private = r.private_data.to_vec();
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            dest_gid: Some(c.peer_gid),
            dest_qpn: Some(r.local_qpn),
            rq_psn: Some(asked.psn),
            path_mtu: Some(asked.mtu),
            max_dest_rd_atomic: Some(asked.responder_resources),
            min_rnr_timer: Some(12),
            ..QpAttr::default()
        };
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(r.starting_psn),
            timeout: Some(self.cfg.local_ack_timeout),
            retry_cnt: Some(7),
            rnr_retry: Some(r.rnr_retry_count),
            max_rd_atomic: Some(asked.initiator_depth.min(r.responder_resources)),
            ..QpAttr::default()
        };
        let id = r.remote_comm_id;
        let (dst, local) = (c.peer_gid, c.local_gid);
        if let Err(e) = qps.modify_qp(asked.qpn, &rtr).and_then(|_| qps.modify_qp(asked.qpn, &rts)) {
            let _ = super::to_error(qps, asked.qpn);
            c.status = ConnStatus::Failed(CmFailure::Qp(e));
            let mad = msg::rej(id, r.local_comm_id, msg::REJ_MSG_REP, reason::NO_QP, &[]);
            self.enter_time_wait(now, id);
            self.reply(dst, local, mad);
            return true;
        }
        let mad = msg::rtu(id, r.local_comm_id);
        c.last = Some(mad.clone());
        c.timer = None;
        c.state = State::Established;
        c.status = ConnStatus::Established;
        self.reply(dst, local, mad);
        true
    }

    /// 12.9.7 (passive, REP Sent → Established): the QP to RTS.
    fn on_rtu(&mut self, src: Gid, r: &IdsRepr<'_>, qps: &mut dyn QpControl) -> bool {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id).filter(|c| c.peer_gid == src).filter(|c| !c.active) else {
            return false;
        };
        if c.state == State::RepSent {
            c.establish(qps);
        }
        true
    }

    /// 12.9.6/12.9.7: a REJ ends a connection still being set up; the QP to ERR.
    fn on_rej(&mut self, now: u64, src: Gid, r: &RejRepr<'_>, qps: &mut dyn QpControl) -> bool {
        let id = r.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id).filter(|c| c.peer_gid == src) else { return false };
        if !matches!(c.state, State::ReqSent | State::ReqRcvd | State::MraSent | State::RepSent) {
            return true;
        }
        // An initiator's QP is still in INIT and stays so, for another try; a QP that
        // reached RTR goes to ERR (12.9.6, 12.9.7).
        if c.qpn != u32::MAX && c.state != State::ReqSent {
            let _ = super::to_error(qps, c.qpn);
        }
        let private_data = r.private_data.to_vec();
        c.status = ConnStatus::Failed(CmFailure::Rejected { reason: r.reason, private_data });
        for q in self.listeners.values_mut() {
            q.retain(|req| req.id != id);
        }
        self.enter_time_wait(now, id);
        true
    }

    /// 12.6.6: an MRA stretches the wait for the answer to the REQ (or REP) it names.
    fn on_mra(&mut self, now: u64, src: Gid, r: &MraRepr<'_>) -> bool {
        let life = 2 * timeout_ns(self.cfg.packet_life);
        let Some(c) = self.conns.get_mut(&r.remote_comm_id).filter(|c| c.peer_gid == src) else { return false };
        let waiting = match r.message_mraed {
            msg::MRA_MSG_REQ => c.state == State::ReqSent,
            1 => c.state == State::RepSent,
            _ => false,
        };
        if waiting {
            c.timer = Some(now + life + timeout_ns(r.service_timeout));
        }
        true
    }

    /// 12.9.8.2: a DREQ takes the QP to ERR and is answered with a DREP, also when
    /// repeated; a DREQ for no connection this side knows is answered too, as it may
    /// have forgotten it already.
    fn on_dreq(&mut self, now: u64, src: Gid, local: Gid, r: &DreqRepr<'_>, qps: &mut dyn QpControl) {
        let id = r.remote_comm_id;
        let Some(c) = self
            .conns
            .get_mut(&id)
            .filter(|c| c.peer_gid == src)
            .filter(|c| c.qpn == r.remote_qpn || c.qpn == u32::MAX)
        else {
            return self.reply(src, local, msg::drep(id, r.local_comm_id));
        };
        match c.state {
            State::Established | State::RepSent | State::DreqSent => {
                if c.qpn != u32::MAX {
                    let _ = super::to_error(qps, c.qpn);
                }
                c.status = ConnStatus::Disconnected;
                let mad = msg::drep(id, c.remote_id);
                c.last = Some(mad.clone());
                self.enter_time_wait(now, id);
                self.reply(src, local, mad);
            }
            State::TimeWait => {
                self.stats.duplicates += 1;
                let mad = msg::drep(id, c.remote_id);
                self.reply(src, local, mad);
            }
            _ => {}
        }
    }

    /// 12.9.8.2: the DREP ends DREQ Sent.
    fn on_drep(&mut self, now: u64, src: Gid, r: &IdsRepr<'_>) -> bool {
        let id = r.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id).filter(|c| c.peer_gid == src) else { return false };
        if c.state == State::DreqSent {
            self.enter_time_wait(now, id);
        }
        true
    }

    /// 12.9.7: on the passive side the first packet on the QP, before the RTU, also
    /// means the initiator is in RTS ("communication established").
    pub fn qp_received(&mut self, qpn: u32, qps: &mut dyn QpControl) {
        if let Some(c) = self.conns.values_mut().find(|c| c.qpn == qpn && !c.active && c.state == State::RepSent) {
            c.establish(qps);
        }
    }
}

impl Conn {
    /// RTU (or the first packet) on the passive side: the QP to RTS.
    fn establish(&mut self, qps: &mut dyn QpControl) {
        let rts = self.rts.take().expect("REP Sent keeps the RTS attributes");
        self.timer = None;
        match qps.modify_qp(self.qpn, &rts) {
            Ok(()) => {
                self.state = State::Established;
                self.status = ConnStatus::Established;
            }
            Err(e) => {
                let _ = super::to_error(qps, self.qpn);
                // The initiator believes it is connected: it hears of this by its QP's
                // retries, as it would from a peer whose QP failed later.
                self.state = State::Established;
                self.status = ConnStatus::Failed(CmFailure::Qp(e));
            }
        }
    }
}
