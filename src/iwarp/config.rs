//! What an iWARP device is configured with and what its connections report: settings,
//! connection parameters, errors, and the limits on what a peer can make it hold.

use super::setup::{CrcPolicy, RtrKind};

/// Connections on one listener whose MPA Request has not fully arrived. One more evicts
/// the oldest of them: a peer holding handshakes open cannot lock a legitimate one out,
/// which sends its Request at once.
pub const MAX_HALF_OPEN_PER_LISTENER: usize = 64;
/// Valid MPA Requests on one listener waiting for the application. One more rejects the
/// oldest the application has not yet taken (or, if it has taken them all, the newcomer)
/// with an MPA reject: a peer filling the backlog cannot keep a fresh Request out.
pub const MAX_HELD_REQUESTS_PER_LISTENER: usize = 128;
/// Bytes a peer may send after its MPA Request while the application has not accepted it
/// (a conforming initiator sends none before the Reply, RFC 5044 §7.1.2); more: rejected.
pub const MAX_EARLY_BYTES: usize = 64 * 1024;
/// Bytes queued for one connection's stream beyond which Read Responses wait for the
/// peer to read: what a peer's Reads can make this side buffer.
pub const MAX_TX_BUFFERED: usize = 1 << 20;
/// Most the initiator's first FPDU waits after the MPA Reply
/// ([`IwarpConfig::first_fpdu_delay_us`]), ms.
pub const FIRST_FPDU_DELAY_MAX_MS: u64 = 50;
/// How long a closing connection may take to write its last bytes (a Terminate, say) to a
/// peer that does not read before it is dropped, ms.
pub const CLOSE_LINGER_MS: u64 = 2_000;

/// The iWARP settings of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IwarpConfig {
    /// MPA CRC: off, used when the peer asks, or asked for.
    pub crc: CrcPolicy,
    /// Ask for markers in the stream this side receives.
    pub markers: bool,
    /// Peer-to-peer ready-to-receive kinds offered (initiator, if [`Self::offer_rtr`]) or
    /// accepted (responder), in order of preference; empty: no peer-to-peer mode.
    pub rtr: Vec<RtrKind>,
    /// The initiator offers peer-to-peer mode (RFC 6581 §6). Off by default, as in Linux
    /// siw (its `peer_to_peer` parameter). A responder accepts it either way.
    pub offer_rtr: bool,
    /// How long a peer may stay silent during MPA setup, ms.
    pub mpa_timeout_ms: u64,
    /// Largest FPDU sent (default: the connection's TCP MSS).
    pub max_fpdu: Option<usize>,
    /// The least time either side waits after the MPA Reply before its first FPDU (the
    /// initiator's RTR, or what the application posted), µs; it waits as long as the
    /// connection took to set up if that was longer, up to [`FIRST_FPDU_DELAY_MAX_MS`].
    /// Linux siw (6.1) as responder sends its Reply before it hooks the socket to the QP,
    /// and bytes that land in between are not read until more arrive: an initiator that
    /// sends once and waits for an answer stalls (one connection in three in the interop
    /// VM, with the RTR 2 ms late one in ten); as initiator it fails the connection when a
    /// Send lands right behind the Reply. 0: at once.
    pub first_fpdu_delay_us: u64,
}

impl Default for IwarpConfig {
    fn default() -> Self {
        IwarpConfig {
            crc: CrcPolicy::OnRequest,
            markers: false,
            rtr: vec![RtrKind::Write, RtrKind::Send, RtrKind::Read],
            offer_rtr: false,
            mpa_timeout_ms: 10_000,
            max_fpdu: None,
            first_fpdu_delay_us: 1_000,
        }
    }
}

/// What a connecting or accepting side offers (`struct rdma_conn_param`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer (MPA carries at most 512 bytes, 508 with the IRD/ORD word).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads this side serves at once (IRD).
    pub responder_resources: u16,
    /// Outbound RDMA Reads this side keeps outstanding (ORD).
    pub initiator_depth: u16,
}

/// Why a connection did not come up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// TCP failed (unreachable, reset after it came up).
    Tcp(String),
    /// The peer's host refused the TCP connection (a reset answering the SYN: nobody
    /// listens on that port).
    Refused(String),
    /// The peer rejected the connection in MPA or the CM: why, and the private data its
    /// rejection carried (what librdmacm's REJECTED event hands the application).
    Rejected {
        /// Why, for people.
        why: String,
        /// The peer's private data (the CM's REJ or MPA's reject Reply).
        private_data: Vec<u8>,
    },
    /// Nobody listens on that port (RoCEv2: the CM's REJ "invalid ServiceID").
    NoListener(String),
    /// MPA setup failed (a protocol error, or the peer's silence).
    Mpa(String),
    /// Not in time.
    Timeout,
    /// The QP cannot connect (already connected, wrong transport, bad parameters).
    Invalid(&'static str),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Tcp(e) => write!(f, "TCP: {e}"),
            ConnectError::Refused(e) => write!(f, "TCP connection refused: {e}"),
            ConnectError::Rejected { why, .. } => write!(f, "rejected: {why}"),
            ConnectError::NoListener(e) => write!(f, "nobody listens there: {e}"),
            ConnectError::Mpa(e) => write!(f, "MPA setup: {e}"),
            ConnectError::Timeout => write!(f, "no connection in time"),
            ConnectError::Invalid(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ConnectError {}
