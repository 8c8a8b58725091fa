//! The CM messages this side sends, as Linux's CM and rdma_cm lay them out on RoCE (IBTA
//! 12.6; rdma_cm's IP header in the REQ, Annex A11.2.4.1).

use super::{AcceptArgs, CmConfig, Conn, ConnectArgs};
use crate::engine::verbs::Gid;
use crate::proto::cm::msg::{DreqRepr, IdsRepr, MraRepr, PathRepr, RejRepr, RepRepr, ReqRepr};
use crate::proto::cm::{mad, CmMadRepr, CmMessage, CmaHeader, MadHeaderRepr, ServiceId};
use crate::transport::headers::gid_to_ip;

pub use crate::proto::cm::mad::MAD_LEN;

/// User private data in a REQ after rdma_cm's 36-byte header (92 - 36).
pub const REQ_USER_PRIVATE: usize = 56;
/// REP private data.
pub const REP_PRIVATE: usize = 196;
/// REJ private data.
pub const REJ_PRIVATE: usize = 148;
/// REJ "message rejected": the REQ.
pub const REJ_MSG_REQ: u8 = 0;
/// REJ "message rejected": the REP.
pub const REJ_MSG_REP: u8 = 1;
/// MRA "message MRAed": the REQ.
pub const MRA_MSG_REQ: u8 = 0;

/// REJ reason codes (IBTA 12.6.7.2, Table 103).
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Insufficient resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout.
    pub const TIMEOUT: u16 = 4;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid ServiceID (nobody listens).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT: u16 = 9;
    /// Stale connection.
    pub const STALE_CONNECTION: u16 = 10;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// Invalid path MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Consumer reject.
    pub const CONSUMER: u16 = 28;
    /// Unsupported class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// CM class version 2 (IBTA 12.11.1), method Send.
pub const CLASS_VERSION: u8 = 2;
const METHOD_SEND: u8 = 0x03;

fn emit(id: u32, attribute_id: u16, message: CmMessage<'_>) -> Box<[u8; MAD_LEN]> {
    let header = MadHeaderRepr {
        base_version: 1,
        mgmt_class: mad::MGMT_CLASS_CM,
        class_version: CLASS_VERSION,
        method: METHOD_SEND,
        status: 0,
        class_specific: 0,
        // Linux forms its TIDs from the sender's comm ID; any unique value does.
        transaction_id: 1 << 32 | u64::from(id),
        attribute_id,
        reserved: 0,
        attribute_modifier: 0,
    };
    let mut b = Box::new([0u8; MAD_LEN]);
    CmMadRepr { header, message }.emit(&mut b[..]).expect("every field this side builds is in range");
    b
}

/// A MAD of this CM's class and method, for the SIDR module.
pub(super) fn emit_mad(id: u32, attribute_id: u16, message: CmMessage<'_>) -> Box<[u8; MAD_LEN]> {
    emit(id, attribute_id, message)
}

fn padded<const N: usize>(pd: &[u8]) -> [u8; N] {
    let mut b = [0u8; N];
    let n = pd.len().min(N);
    b[..n].copy_from_slice(&pd[..n]);
    b
}

/// RoCE paths carry the permissive LID (0xFFFF) and IPv4-mapped or IPv6 GIDs.
fn path(local: Gid, remote: Gid, local_ack_timeout: u8) -> PathRepr {
    PathRepr {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: local,
        remote_gid: remote,
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 64,
        sl: 0,
        subnet_local: false,
        local_ack_timeout,
    }
}

const EMPTY_PATH: PathRepr = PathRepr {
    local_lid: 0,
    remote_lid: 0,
    local_gid: [0; 16],
    remote_gid: [0; 16],
    flow_label: 0,
    packet_rate: 0,
    traffic_class: 0,
    hop_limit: 0,
    sl: 0,
    subnet_local: false,
    local_ack_timeout: 0,
};

/// ConnectRequest (12.6.5) with rdma_cm's IP header first in the private data.
pub fn req(cfg: &CmConfig, guid: u64, id: u32, a: &ConnectArgs) -> Box<[u8; MAD_LEN]> {
    let mut pd = [0u8; 92];
    let hdr = CmaHeader { version: 0, src_port: a.src_port, src: gid_to_ip(&a.local_gid), dst: gid_to_ip(&a.peer_gid) };
    // Both GIDs come from one family here (one device address, one peer).
    let _ = hdr.emit(&mut pd[..36]);
    let n = a.private_data.len().min(REQ_USER_PRIVATE);
    pd[36..36 + n].copy_from_slice(&a.private_data[..n]);
    let m = ReqRepr {
        local_comm_id: id,
        service_id: ServiceId::for_tcp_port(a.dst_port),
        local_ca_guid: guid,
        local_qkey: 0,
        local_qpn: a.qpn,
        responder_resources: a.responder_resources,
        local_eecn: 0,
        initiator_depth: a.initiator_depth,
        remote_eecn: 0,
        remote_cm_response_timeout: cfg.response_timeout,
        transport_service_type: 0,
        end_to_end_flow_control: false,
        starting_psn: a.psn,
        local_cm_response_timeout: cfg.response_timeout,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: a.mtu.code(),
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: cfg.max_retries,
        srq: false,
        extended_transport_type: 0,
        primary_path: path(a.local_gid, a.peer_gid, cfg.local_ack_timeout),
        alternate_path: EMPTY_PATH,
        private_data: &pd,
    };
    emit(id, mad::attr::REQ, CmMessage::Req(m))
}

/// ConnectReply (12.6.8).
pub fn rep(guid: u64, id: u32, c: &Conn, a: &AcceptArgs, initiator_depth: u8) -> Box<[u8; MAD_LEN]> {
    let pd: [u8; REP_PRIVATE] = padded(&a.private_data);
    let m = RepRepr {
        local_comm_id: id,
        remote_comm_id: c.remote_id,
        local_qkey: 0,
        local_qpn: a.qpn,
        local_eecn: 0,
        starting_psn: a.psn,
        responder_resources: a.responder_resources,
        initiator_depth,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: guid,
        private_data: &pd,
    };
    emit(id, mad::attr::REP, CmMessage::Rep(m))
}

/// ReadyToUse (12.6.9).
pub fn rtu(id: u32, remote: u32) -> Box<[u8; MAD_LEN]> {
    let pd = [0u8; 224];
    emit(id, mad::attr::RTU, CmMessage::Rtu(IdsRepr { local_comm_id: id, remote_comm_id: remote, private_data: &pd }))
}

/// ConnectReject (12.6.7).
pub fn rej(id: u32, remote: u32, which: u8, why: u16, pd: &[u8]) -> Box<[u8; MAD_LEN]> {
    let pd: [u8; REJ_PRIVATE] = padded(pd);
    let m = RejRepr {
        local_comm_id: id,
        remote_comm_id: remote,
        message_rejected: which,
        reject_info_len: 0,
        reason: why,
        ari: &[0u8; 72],
        private_data: &pd,
    };
    emit(id, mad::attr::REJ, CmMessage::Rej(m))
}

/// MessageReceiptAcknowledgement (12.6.6) for a REQ: wait `service_timeout` more.
pub fn mra(id: u32, remote: u32, service_timeout: u8) -> Box<[u8; MAD_LEN]> {
    let pd = [0u8; 222];
    let m = MraRepr {
        local_comm_id: id,
        remote_comm_id: remote,
        message_mraed: MRA_MSG_REQ,
        service_timeout,
        private_data: &pd,
    };
    emit(id, mad::attr::MRA, CmMessage::Mra(m))
}

/// DisconnectRequest (12.6.10).
pub fn dreq(id: u32, remote: u32, remote_qpn: u32) -> Box<[u8; MAD_LEN]> {
    let pd = [0u8; 220];
    emit(
        id,
        mad::attr::DREQ,
        CmMessage::Dreq(DreqRepr { local_comm_id: id, remote_comm_id: remote, remote_qpn, private_data: &pd }),
    )
}

/// DisconnectReply (12.6.11).
pub fn drep(id: u32, remote: u32) -> Box<[u8; MAD_LEN]> {
    let pd = [0u8; 224];
    emit(id, mad::attr::DREP, CmMessage::Drep(IdsRepr { local_comm_id: id, remote_comm_id: remote, private_data: &pd }))
}
