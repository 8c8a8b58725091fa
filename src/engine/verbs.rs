//! Verbs-level types (IBTA ch. 11): work requests, completions, QP attributes, errors.

use super::mem::Pd;

/// A 128-bit GID; IPv4 addresses are IPv4-mapped (`::ffff:a.b.c.d`, IBTA Annex A17.4).
pub type Gid = [u8; 16];

/// The GID of an IPv4 address.
pub fn gid_from_ipv4(a: [u8; 4]) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

/// A scatter/gather element (IBTA 11.4.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// Remote address of a WRITE, READ or atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// Virtual address at the responder.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendImm(u32),
    /// SEND with invalidate of a remote rkey.
    SendInv(u32),
    /// RDMA WRITE.
    Write(Remote),
    /// RDMA WRITE with immediate data.
    WriteImm(Remote, u32),
    /// RDMA READ.
    Read(Remote),
    /// Atomic compare and swap (compare, swap).
    CompareSwap(Remote, u64, u64),
    /// Atomic fetch and add.
    FetchAdd(Remote, u64),
    /// ATOMIC WRITE (IBTA vol.1 1.5, Memory Placement Extensions): the 8 bytes stored at
    /// the 8-aligned remote address at once, never torn; acknowledged as a WRITE is.
    AtomicWrite(Remote, [u8; 8]),
    /// Bind a memory window (IBTA 10.6.7.2.2); done locally, in send queue order.
    BindMw(crate::engine::mem::mw::MwBind),
    /// Invalidate a key locally (IBTA 10.6.7.2.4); in send queue order.
    LocalInv(u32),
}

impl SendOp {
    /// The opcode its completion carries.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_) => WcOpcode::Send,
            SendOp::Write(_) | SendOp::WriteImm(..) => WcOpcode::RdmaWrite,
            SendOp::Read(_) => WcOpcode::RdmaRead,
            SendOp::CompareSwap(..) => WcOpcode::CompSwap,
            SendOp::FetchAdd(..) => WcOpcode::FetchAdd,
            SendOp::AtomicWrite(..) => WcOpcode::AtomicWrite,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
        }
    }

    /// True for operations that need responder resources (READ, atomics).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(self, SendOp::Read(_) | SendOp::CompareSwap(..) | SendOp::FetchAdd(..))
    }

    /// True for operations that stay on this side (binds, local invalidations).
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv(_))
    }
}

/// Where a UD send goes (IBTA 11.4.1.1: the address handle, remote QPN and Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Destination GID (the address handle).
    pub gid: Gid,
    /// Destination QP.
    pub qpn: u32,
    /// Q_Key; one with the high bit set means "use the QP's own Q_Key" (IBTA 10.2.5).
    pub qkey: u32,
}

/// A send work request (IBTA 11.4.1.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local buffers: gathered for SEND/WRITE, scattered into for READ/atomics.
    pub sgl: Vec<Sge>,
    /// Generate a completion on success.
    pub signaled: bool,
    /// Set the solicited event bit on the last packet.
    pub solicited: bool,
    /// UD only: the destination.
    pub ud: Option<UdDest>,
    /// XRC initiators only: the XRC SRQ at the target the request is for (its XRCETH).
    pub xrc_srqn: u32,
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers the message is scattered into.
    pub sgl: Vec<Sge>,
}

/// Completion status (IBTA 11.6.2, Table 154 names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// Success.
    Success,
    /// Local length error (a message longer than the receive buffers).
    LocLenErr,
    /// Local protection error (a bad lkey or access).
    LocProtErr,
    /// Flushed because the QP entered the error state.
    WrFlushErr,
    /// Remote invalid request (NAK code 1).
    RemInvReqErr,
    /// Remote access error (NAK code 2).
    RemAccessErr,
    /// Remote operational error (NAK code 3).
    RemOpErr,
    /// Transport retry counter exceeded.
    RetryExcErr,
    /// RNR retry counter exceeded.
    RnrRetryExcErr,
    /// A memory window bind was refused (IBTA 10.6.7.2.2).
    MwBindErr,
    /// A tag-matching list operation failed (a deleted tag was already consumed).
    TmErr,
    /// A rendezvous request's data does not fit the tagged buffer it matched: its headers
    /// are there instead, for the application to finish the transfer.
    TmRndvIncomplete,
}

/// What a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND (any flavour) completed.
    Send,
    /// An RDMA WRITE completed.
    RdmaWrite,
    /// An RDMA READ completed.
    RdmaRead,
    /// A compare-and-swap completed.
    CompSwap,
    /// A fetch-and-add completed.
    FetchAdd,
    /// An ATOMIC WRITE completed.
    AtomicWrite,
    /// A message arrived in a receive buffer.
    Recv,
    /// An RDMA WRITE with immediate consumed a receive buffer.
    RecvRdmaWithImm,
    /// A memory window bind completed.
    BindMw,
    /// A local invalidation completed.
    LocalInv,
    /// A tagged buffer was added to a TM-SRQ ([`super::tm`]).
    TmAdd,
    /// A tagged buffer was removed.
    TmDel,
    /// The unexpected count was reported.
    TmSync,
    /// A tagged message arrived: matched, or unexpected in an ordinary receive.
    TmRecv,
    /// A message sent without a tag arrived in an ordinary receive of a TM-SRQ.
    TmNoTag,
}

/// A work completion (IBTA 11.4.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// From the work request.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Operation.
    pub opcode: WcOpcode,
    /// The QP it belongs to.
    pub qpn: u32,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data, if the message carried it.
    pub imm: Option<u32>,
    /// The rkey a SEND with invalidate invalidated.
    pub invalidated_rkey: Option<u32>,
    /// The solicited event bit was set on the message.
    pub solicited: bool,
    /// UD receives: the sender's QP.
    pub src_qp: Option<u32>,
    /// UD receives: the sender's GID.
    pub src_gid: Option<Gid>,
    /// Tag-matching completions: their flags, tag and application context.
    pub tm: Option<super::tm::TmWc>,
}

impl Wc {
    /// A completion with no optional fields.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qpn: u32, byte_len: u32) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            qpn,
            byte_len,
            imm: None,
            invalidated_rkey: None,
            solicited: false,
            src_qp: None,
            src_gid: None,
            tm: None,
        }
    }
}

/// Queue pair transport type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// Raw Ethernet frames (Linux verbs' `IBV_QPT_RAW_PACKET`): sent whole, received
    /// through flow rules ([`crate::engine::raw`]).
    RawPacket,
}

/// QP states (IBTA 10.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialized.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error.
    Err,
}

/// Path MTU (IBTA 9.6, 256..4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    M256,
    /// 512 bytes.
    M512,
    /// 1024 bytes.
    M1024,
    /// 2048 bytes.
    M2048,
    /// 4096 bytes.
    M4096,
}

impl Mtu {
    /// The IB path MTU code (IBTA 9.7.x, the ibv_mtu enum: 1 = 256 … 5 = 4096).
    pub fn code(self) -> u8 {
        self as u8 + 1
    }

    /// The MTU of a path MTU code, if valid.
    pub fn from_code(c: u8) -> Option<Mtu> {
        [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096].get(usize::from(c).wrapping_sub(1)).copied()
    }

    /// Bytes.
    pub fn bytes(self) -> usize {
        match self {
            Mtu::M256 => 256,
            Mtu::M512 => 512,
            Mtu::M1024 => 1024,
            Mtu::M2048 => 2048,
            Mtu::M4096 => 4096,
        }
    }
}

/// Attributes of modify-QP (IBTA 11.2.5.2); `None` leaves an attribute unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub state: Option<QpState>,
    /// Destination GID (address vector).
    pub dest_gid: Option<Gid>,
    /// Destination QP number.
    pub dest_qpn: Option<u32>,
    /// Expected PSN of the receive queue.
    pub rq_psn: Option<u32>,
    /// First PSN of the send queue.
    pub sq_psn: Option<u32>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// Local ACK timeout: 4.096 µs × 2^timeout (0 = infinite; 1..=31).
    pub timeout: Option<u8>,
    /// Transport retry count (0..=7).
    pub retry_cnt: Option<u8>,
    /// RNR retry count (0..=7, 7 = infinite).
    pub rnr_retry: Option<u8>,
    /// Minimum RNR NAK timer this QP advertises (5-bit code).
    pub min_rnr_timer: Option<u8>,
    /// Outstanding READ/atomic requests this QP may issue (ORD).
    pub max_rd_atomic: Option<u8>,
    /// Incoming READ/atomic requests this QP accepts (IRD).
    pub max_dest_rd_atomic: Option<u8>,
    /// Remote access this QP grants.
    pub access: Option<super::mem::Access>,
    /// P_Key.
    pub pkey: Option<u16>,
    /// Q_Key (UD).
    pub qkey: Option<u32>,
    /// Index of the local GID the QP sends from (part of the address vector).
    pub sgid_index: Option<u8>,
}

/// Sizes fixed when a QP is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth.
    pub max_recv_wr: usize,
    /// SGEs per work request.
    pub max_sge: usize,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps { max_send_wr: 256, max_recv_wr: 256, max_sge: 16 }
    }
}

/// What create-QP takes.
#[derive(Debug, Clone, Copy)]
pub struct QpInit {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: Pd,
    /// CQ of send completions.
    pub send_cq: u32,
    /// CQ of receive completions.
    pub recv_cq: u32,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Take receives from this shared receive queue instead of the QP's own.
    pub srq: Option<u32>,
    /// An XRC QP's half ([`Xrc`]); `None` for every other QP.
    pub xrc: Option<Xrc>,
}

/// The two halves of an XRC connection (IBTA vol.1 9.x and 14.2, eXtended Reliable
/// Connected): an RC connection whose requests each name, in an XRCETH, the XRC SRQ at
/// the target that receives them; one initiator reaches every SRQ of the target's domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xrc {
    /// XRC_SEND: sends only; each request names the target's SRQ (`SendWr::xrc_srqn`).
    Initiator,
    /// XRC_RECV: receives only, into the SRQs of XRC domain `xrcd`; memory is checked in
    /// the PD of the SRQ a request names, completions go to that SRQ's CQ.
    Target {
        /// The XRC domain.
        xrcd: u32,
    },
}

/// Errors of verbs calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerbsError {
    /// No such QP, CQ or PD.
    NotFound,
    /// The transition is not in the QP state table.
    IllegalTransition {
        /// From.
        from: QpState,
        /// To.
        to: QpState,
    },
    /// An attribute the transition requires is missing.
    MissingAttribute(&'static str),
    /// An attribute the transition does not allow, or a value out of range.
    InvalidAttribute(&'static str),
    /// The queue is full.
    QueueFull,
    /// Too many SGEs, or a work request the QP's state does not accept.
    InvalidRequest,
    /// A device limit (QPs, MRs, CQs) was reached.
    OutOfResources,
    /// The device's transport does not offer this (memory windows on iWARP).
    Unsupported,
}
