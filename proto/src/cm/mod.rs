//! InfiniBand Communication Management MADs as rdma_cm sends them over RoCEv2 (IBTA vol.1
//! ch. 12 and 13.4): 256-byte MADs in UD SEND_ONLY packets to QP1 with Q_Key 0x80010000.

pub mod cma;
pub mod mad;
pub mod msg;

pub use cma::{CmaHeader, ServiceId};
pub use mad::{CmMadRepr, MadHeaderRepr, MadPacket};
pub use msg::CmMessage;

/// The QP number of the General Services Interface (IBTA 13.4.2).
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of QP1 (IBTA 13.4.6.2).
pub const GSI_QKEY: u32 = 0x8001_0000;
