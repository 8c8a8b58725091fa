//! The CM messages (IBTA vol.1 12.6): REQ, REP, RTU, REJ, MRA, DREQ, DREP. Each is the
//! 232 bytes after the MAD header; private data is borrowed from the packet.

use super::cma::ServiceId;
use super::mad::attr;
use crate::wire::{be16, be24, be32, be64, put16, put24, put32, put64};
use crate::{Error, Result};
use core::fmt;

/// Length of the CM message after the MAD header.
pub const DATA_LEN: usize = 232;

/// A path description inside a REQ (IBTA 12.6.5, 44 bytes; primary and alternate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    /// Local port LID (0xffff over RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

const PATH_LEN: usize = 44;

impl PathRepr {
    fn parse(b: &[u8]) -> PathRepr {
        let w = be32(b, 36);
        PathRepr {
            local_lid: be16(b, 0),
            remote_lid: be16(b, 2),
            local_gid: gid(&b[4..20]),
            remote_gid: gid(&b[20..36]),
            flow_label: w >> 12,
            packet_rate: (w & 0x3f) as u8,
            traffic_class: b[40],
            hop_limit: b[41],
            sl: b[42] >> 4,
            subnet_local: b[42] & 0x08 != 0,
            local_ack_timeout: b[43] >> 3,
        }
    }
    fn emit(&self, b: &mut [u8]) {
        put16(b, 0, self.local_lid);
        put16(b, 2, self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        put32(b, 36, (self.flow_label & 0xf_ffff) << 12 | u32::from(self.packet_rate & 0x3f));
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = (self.sl & 0xf) << 4 | (self.subnet_local as u8) << 3;
        b[43] = (self.local_ack_timeout & 0x1f) << 3;
    }
}

impl fmt::Display for PathRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (l, r) = (core::net::Ipv6Addr::from(self.local_gid), core::net::Ipv6Addr::from(self.remote_gid));
        write!(f, "path {l} -> {r} tc={} hop={} sl={}", self.traffic_class, self.hop_limit, self.sl)
    }
}

fn gid(b: &[u8]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[..16]);
    g
}

/// ConnectRequest (IBTA 12.6.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct ReqRepr<'a> {
    pub local_comm_id: u32,
    pub service_id: ServiceId,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub local_eecn: u32,
    pub initiator_depth: u8,
    pub remote_eecn: u32,
    pub remote_cm_response_timeout: u8,
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    /// The PSN the sender expects to receive first (Linux: its QP's rq_psn).
    pub starting_psn: u32,
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub pkey: u16,
    pub path_mtu: u8,
    pub rdc_exists: bool,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: bool,
    pub extended_transport_type: u8,
    pub primary_path: PathRepr,
    pub alternate_path: PathRepr,
    /// 92 bytes; rdma_cm puts its [`super::CmaHeader`] first.
    pub private_data: &'a [u8],
}

impl<'a> ReqRepr<'a> {
    fn parse(b: &'a [u8]) -> Self {
        ReqRepr {
            local_comm_id: be32(b, 0),
            service_id: ServiceId(be64(b, 8)),
            local_ca_guid: be64(b, 16),
            local_qkey: be32(b, 28),
            local_qpn: be24(b, 32),
            responder_resources: b[35],
            local_eecn: be24(b, 36),
            initiator_depth: b[39],
            remote_eecn: be24(b, 40),
            remote_cm_response_timeout: b[43] >> 3,
            transport_service_type: (b[43] >> 1) & 0x3,
            end_to_end_flow_control: b[43] & 1 != 0,
            starting_psn: be24(b, 44),
            local_cm_response_timeout: b[47] >> 3,
            retry_count: b[47] & 0x7,
            pkey: be16(b, 48),
            path_mtu: b[50] >> 4,
            rdc_exists: b[50] & 0x08 != 0,
            rnr_retry_count: b[50] & 0x7,
            max_cm_retries: b[51] >> 4,
            srq: b[51] & 0x08 != 0,
            extended_transport_type: b[51] & 0x7,
            primary_path: PathRepr::parse(&b[52..52 + PATH_LEN]),
            alternate_path: PathRepr::parse(&b[96..96 + PATH_LEN]),
            private_data: &b[140..DATA_LEN],
        }
    }
    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.local_comm_id);
        put64(b, 8, self.service_id.0);
        put64(b, 16, self.local_ca_guid);
        put32(b, 28, self.local_qkey);
        put24(b, 32, self.local_qpn);
        b[35] = self.responder_resources;
        put24(b, 36, self.local_eecn);
        b[39] = self.initiator_depth;
        put24(b, 40, self.remote_eecn);
        b[43] = (self.remote_cm_response_timeout & 0x1f) << 3
            | (self.transport_service_type & 0x3) << 1
            | self.end_to_end_flow_control as u8;
        put24(b, 44, self.starting_psn);
        b[47] = (self.local_cm_response_timeout & 0x1f) << 3 | self.retry_count & 0x7;
        put16(b, 48, self.pkey);
        b[50] = (self.path_mtu & 0xf) << 4 | (self.rdc_exists as u8) << 3 | self.rnr_retry_count & 0x7;
        b[51] = (self.max_cm_retries & 0xf) << 4 | (self.srq as u8) << 3 | self.extended_transport_type & 0x7;
        self.primary_path.emit(&mut b[52..96]);
        self.alternate_path.emit(&mut b[96..140]);
        b[140..DATA_LEN].copy_from_slice(self.private_data);
    }
}

/// ConnectReply (IBTA 12.6.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct RepRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub local_eecn: u32,
    /// The PSN the sender expects to receive first (Linux: its QP's rq_psn).
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    /// 196 bytes.
    pub private_data: &'a [u8],
}

impl<'a> RepRepr<'a> {
    fn parse(b: &'a [u8]) -> Self {
        RepRepr {
            local_comm_id: be32(b, 0),
            remote_comm_id: be32(b, 4),
            local_qkey: be32(b, 8),
            local_qpn: be24(b, 12),
            local_eecn: be24(b, 16),
            starting_psn: be24(b, 20),
            responder_resources: b[24],
            initiator_depth: b[25],
            target_ack_delay: b[26] >> 3,
            failover_accepted: (b[26] >> 1) & 0x3,
            end_to_end_flow_control: b[26] & 1 != 0,
            rnr_retry_count: b[27] >> 5,
            srq: b[27] & 0x10 != 0,
            local_ca_guid: be64(b, 28),
            private_data: &b[36..DATA_LEN],
        }
    }
    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.local_comm_id);
        put32(b, 4, self.remote_comm_id);
        put32(b, 8, self.local_qkey);
        put24(b, 12, self.local_qpn);
        put24(b, 16, self.local_eecn);
        put24(b, 20, self.starting_psn);
        b[24] = self.responder_resources;
        b[25] = self.initiator_depth;
        b[26] = (self.target_ack_delay & 0x1f) << 3
            | (self.failover_accepted & 0x3) << 1
            | self.end_to_end_flow_control as u8;
        b[27] = (self.rnr_retry_count & 0x7) << 5 | (self.srq as u8) << 4;
        put64(b, 28, self.local_ca_guid);
        b[36..DATA_LEN].copy_from_slice(self.private_data);
    }
}

/// ConnectReject (IBTA 12.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct RejRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 0 REQ, 1 REP, 2 other.
    pub message_rejected: u8,
    pub reject_info_len: u8,
    /// IBTA Table 112 (28 = consumer reject).
    pub reason: u16,
    /// Additional reject information, 72 bytes.
    pub ari: &'a [u8],
    /// 148 bytes.
    pub private_data: &'a [u8],
}

/// MessageReceiptAcknowledgement (IBTA 12.6.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct MraRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 0 REQ, 1 REP, 2 LAP.
    pub message_mraed: u8,
    pub service_timeout: u8,
    /// 222 bytes.
    pub private_data: &'a [u8],
}

/// DisconnectRequest (IBTA 12.6.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct DreqRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub remote_qpn: u32,
    /// 220 bytes.
    pub private_data: &'a [u8],
}

/// ReadyToUse (IBTA 12.6.9) and DisconnectReply (12.6.11): two IDs and private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct IdsRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 224 bytes.
    pub private_data: &'a [u8],
}

/// ServiceIDResolutionRequest (IBTA 12.11.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct SidrReqRepr<'a> {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: ServiceId,
    /// 216 bytes; rdma_cm puts its [`super::CmaHeader`] first.
    pub private_data: &'a [u8],
}

/// ServiceIDResolutionResponse (IBTA 12.11.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct SidrRepRepr<'a> {
    pub request_id: u32,
    /// [`sidr_status`].
    pub status: u8,
    pub additional_info_len: u8,
    pub qpn: u32,
    pub service_id: ServiceId,
    pub qkey: u32,
    /// 72 bytes (a ClassPortInfo when redirecting).
    pub additional_info: &'a [u8],
    /// 136 bytes.
    pub private_data: &'a [u8],
}

/// SIDR_REP status values (IBTA Table 119).
pub mod sidr_status {
    /// The QP is valid.
    pub const VALID: u8 = 0;
    /// No service with that ID.
    pub const UNSUPPORTED_SERVICE: u8 = 1;
    /// The service refused.
    pub const REJECTED: u8 = 2;
    /// No QP for the service.
    pub const NO_QP: u8 = 3;
}

/// A decoded CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage<'a> {
    /// ConnectRequest.
    Req(ReqRepr<'a>),
    /// ConnectReply.
    Rep(RepRepr<'a>),
    /// ReadyToUse.
    Rtu(IdsRepr<'a>),
    /// ConnectReject.
    Rej(RejRepr<'a>),
    /// MessageReceiptAcknowledgement.
    Mra(MraRepr<'a>),
    /// DisconnectRequest.
    Dreq(DreqRepr<'a>),
    /// DisconnectReply.
    Drep(IdsRepr<'a>),
    /// ServiceIDResolutionRequest.
    SidrReq(SidrReqRepr<'a>),
    /// ServiceIDResolutionResponse.
    SidrRep(SidrRepRepr<'a>),
    /// Any other attribute (LAP, APR, ClassPortInfo) or class, kept raw.
    Other(&'a [u8]),
}

impl<'a> CmMessage<'a> {
    /// Decodes the 232 bytes after the MAD header by attribute ID.
    pub fn parse(attribute_id: u16, b: &'a [u8]) -> Result<Self> {
        if b.len() != DATA_LEN {
            return Err(Error::BadLength("a CM message is 232 bytes"));
        }
        let ids =
            |b: &'a [u8]| IdsRepr { local_comm_id: be32(b, 0), remote_comm_id: be32(b, 4), private_data: &b[8..] };
        Ok(match attribute_id {
            attr::REQ => CmMessage::Req(ReqRepr::parse(b)),
            attr::REP => CmMessage::Rep(RepRepr::parse(b)),
            attr::RTU => CmMessage::Rtu(ids(b)),
            attr::DREP => CmMessage::Drep(ids(b)),
            attr::REJ => CmMessage::Rej(RejRepr {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                message_rejected: b[8] >> 6,
                reject_info_len: b[9] >> 1,
                reason: be16(b, 10),
                ari: &b[12..84],
                private_data: &b[84..],
            }),
            attr::MRA => CmMessage::Mra(MraRepr {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                message_mraed: b[8] >> 6,
                service_timeout: b[9] >> 3,
                private_data: &b[10..],
            }),
            attr::DREQ => CmMessage::Dreq(DreqRepr {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                remote_qpn: be24(b, 8),
                private_data: &b[12..],
            }),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr {
                request_id: be32(b, 0),
                pkey: be16(b, 4),
                service_id: ServiceId(be64(b, 8)),
                private_data: &b[16..],
            }),
            attr::SIDR_REP => CmMessage::SidrRep(SidrRepRepr {
                request_id: be32(b, 0),
                status: b[4],
                additional_info_len: b[5],
                qpn: be24(b, 8),
                service_id: ServiceId(be64(b, 12)),
                qkey: be32(b, 20),
                additional_info: &b[24..96],
                private_data: &b[96..],
            }),
            _ => CmMessage::Other(b),
        })
    }

    fn check_pd(pd: &[u8], len: usize) -> Result<()> {
        if pd.len() != len {
            return Err(Error::BadLength("CM private data has a fixed size"));
        }
        Ok(())
    }

    /// Writes the 232 bytes (reserved fields zero).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        Error::check_len(DATA_LEN, b.len())?;
        let b = &mut b[..DATA_LEN];
        b.fill(0);
        match self {
            CmMessage::Req(m) => {
                Self::check_pd(m.private_data, 92)?;
                m.emit(b)
            }
            CmMessage::Rep(m) => {
                Self::check_pd(m.private_data, 196)?;
                m.emit(b)
            }
            CmMessage::Rtu(m) | CmMessage::Drep(m) => {
                Self::check_pd(m.private_data, 224)?;
                put32(b, 0, m.local_comm_id);
                put32(b, 4, m.remote_comm_id);
                b[8..].copy_from_slice(m.private_data);
            }
            CmMessage::Rej(m) => {
                Self::check_pd(m.ari, 72)?;
                Self::check_pd(m.private_data, 148)?;
                put32(b, 0, m.local_comm_id);
                put32(b, 4, m.remote_comm_id);
                b[8] = (m.message_rejected & 0x3) << 6;
                b[9] = (m.reject_info_len & 0x7f) << 1;
                put16(b, 10, m.reason);
                b[12..84].copy_from_slice(m.ari);
                b[84..].copy_from_slice(m.private_data);
            }
            CmMessage::Mra(m) => {
                Self::check_pd(m.private_data, 222)?;
                put32(b, 0, m.local_comm_id);
                put32(b, 4, m.remote_comm_id);
                b[8] = (m.message_mraed & 0x3) << 6;
                b[9] = (m.service_timeout & 0x1f) << 3;
                b[10..].copy_from_slice(m.private_data);
            }
            CmMessage::Dreq(m) => {
                Self::check_pd(m.private_data, 220)?;
                put32(b, 0, m.local_comm_id);
                put32(b, 4, m.remote_comm_id);
                put24(b, 8, m.remote_qpn);
                b[12..].copy_from_slice(m.private_data);
            }
            CmMessage::SidrReq(m) => {
                Self::check_pd(m.private_data, 216)?;
                put32(b, 0, m.request_id);
                put16(b, 4, m.pkey);
                put64(b, 8, m.service_id.0);
                b[16..].copy_from_slice(m.private_data);
            }
            CmMessage::SidrRep(m) => {
                Self::check_pd(m.additional_info, 72)?;
                Self::check_pd(m.private_data, 136)?;
                put32(b, 0, m.request_id);
                b[4] = m.status;
                b[5] = m.additional_info_len;
                put24(b, 8, m.qpn);
                put64(b, 12, m.service_id.0);
                put32(b, 20, m.qkey);
                b[24..96].copy_from_slice(m.additional_info);
                b[96..].copy_from_slice(m.private_data);
            }
            CmMessage::Other(d) => {
                Self::check_pd(d, DATA_LEN)?;
                b.copy_from_slice(d);
            }
        }
        Ok(())
    }
}

impl fmt::Display for CmMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmMessage::Req(m) => write!(
                f,
                "CM REQ lcid=0x{:08x} {} qpn=0x{:x} psn=0x{:06x} rr={} id={} mtu={}",
                m.local_comm_id,
                m.service_id,
                m.local_qpn,
                m.starting_psn,
                m.responder_resources,
                m.initiator_depth,
                m.path_mtu
            ),
            CmMessage::Rep(m) => write!(
                f,
                "CM REP lcid=0x{:08x} rcid=0x{:08x} qpn=0x{:x} psn=0x{:06x} rr={} id={}",
                m.local_comm_id,
                m.remote_comm_id,
                m.local_qpn,
                m.starting_psn,
                m.responder_resources,
                m.initiator_depth
            ),
            CmMessage::Rtu(m) => write!(f, "CM RTU lcid=0x{:08x} rcid=0x{:08x}", m.local_comm_id, m.remote_comm_id),
            CmMessage::Drep(m) => write!(f, "CM DREP lcid=0x{:08x} rcid=0x{:08x}", m.local_comm_id, m.remote_comm_id),
            CmMessage::Rej(m) => write!(f, "CM REJ lcid=0x{:08x} reason={}", m.local_comm_id, m.reason),
            CmMessage::Mra(m) => write!(f, "CM MRA lcid=0x{:08x} timeout={}", m.local_comm_id, m.service_timeout),
            CmMessage::Dreq(m) => write!(f, "CM DREQ lcid=0x{:08x} qpn=0x{:x}", m.local_comm_id, m.remote_qpn),
            CmMessage::SidrReq(m) => write!(f, "CM SIDR_REQ rid=0x{:08x} {}", m.request_id, m.service_id),
            CmMessage::SidrRep(m) => write!(
                f,
                "CM SIDR_REP rid=0x{:08x} status={} qpn=0x{:x} qkey=0x{:08x}",
                m.request_id, m.status, m.qpn, m.qkey
            ),
            CmMessage::Other(_) => f.write_str("CM (other attribute)"),
        }
    }
}
