//! rdma_cm's calls on a RoCEv2 device: the engine's CM ([`crate::cm`]) does the protocol
//! under the device lock; these wait for its outcome on the caller's thread while the poll
//! thread carries the MADs.

use super::roce::RoceDriver;
use crate::cm::{AcceptArgs, CmError, CmFailure, ConnId, ConnStatus, ConnectArgs, Request};
use crate::iwarp::config::{ConnParam, ConnectError};
use crate::transport::headers::ip_to_gid;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How often a waiting caller looks at a connection's status: connection setup is rare,
/// and a MAD round trip on a LAN is tens of microseconds to a millisecond.
const LOOK_EVERY: Duration = Duration::from_micros(200);

fn describe(e: CmError) -> ConnectError {
    match e {
        CmError::NoConnection => ConnectError::Invalid("no such connection request"),
        CmError::PortInUse => ConnectError::Invalid("the port is listened on already"),
        CmError::Limit(what) => ConnectError::Invalid(what),
        CmError::Invalid(what) => ConnectError::Invalid(what),
        CmError::Qp(e) => ConnectError::Mpa(format!("the QP refused the connection's attributes: {e:?}")),
    }
}

/// What a failed connection tells the application.
pub fn failure(f: &CmFailure) -> ConnectError {
    match f {
        CmFailure::Rejected { reason: crate::cm::reason::INVALID_SERVICE_ID, .. } => {
            ConnectError::NoListener("CM REJ, reason 8 (invalid ServiceID)".into())
        }
        CmFailure::Rejected { reason, private_data } => ConnectError::Rejected {
            why: format!("CM REJ, reason {reason} ({})", reason_text(*reason)),
            private_data: private_data.clone(),
        },
        CmFailure::Timeout => ConnectError::Timeout,
        CmFailure::Qp(e) => ConnectError::Mpa(format!("the QP refused the connection's attributes: {e:?}")),
    }
}

/// IBTA Table 103's names for the reasons a peer gives most.
fn reason_text(r: u16) -> &'static str {
    use crate::cm::reason::*;
    match r {
        NO_QP => "no QP available",
        NO_RESOURCES => "insufficient resources",
        TIMEOUT => "timeout",
        INVALID_SERVICE_ID => "nobody listens on that port",
        STALE_CONNECTION => "stale connection",
        INVALID_GID => "invalid GID",
        CONSUMER => "rejected by the application",
        _ => "see IBTA vol. 1 Table 103",
    }
}

fn status(d: &RoceDriver, id: ConnId) -> Option<ConnStatus> {
    d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.status(id).cloned()))
}

/// Waits until `id` leaves Pending, at most until `deadline`.
fn wait_settled(d: &RoceDriver, id: ConnId, deadline: Option<Instant>) -> Option<ConnStatus> {
    loop {
        match status(d, id) {
            Some(ConnStatus::Pending) => {}
            other => return other,
        }
        if deadline.is_some_and(|t| Instant::now() >= t) {
            return Some(ConnStatus::Pending);
        }
        std::thread::sleep(LOOK_EVERY);
    }
}

fn depth(v: u16) -> u8 {
    v.min(u16::from(u8::MAX)) as u8
}

/// `rdma_connect`: a REQ to `to` (ServiceID of its port), waiting at most `timeout` for the
/// REP; the QP is in RTS when this returns the peer's private data.
pub fn connect(
    d: &RoceDriver,
    qpn: u32,
    to: SocketAddr,
    p: &ConnParam,
    timeout: Duration,
    request_sent: &mut dyn FnMut(),
) -> Result<Vec<u8>, ConnectError> {
    let deadline = Instant::now() + timeout;
    let id = d.with_core_at(|dev, now| {
        let args = ConnectArgs {
            qpn,
            local_gid: dev.gid(),
            peer_gid: ip_to_gid(to.ip()),
            src_port: 0xc000 | (dev.random_psn() as u16 & 0x3fff),
            dst_port: to.port(),
            psn: dev.random_psn(),
            mtu: d.path_mtu,
            responder_resources: depth(p.responder_resources),
            initiator_depth: depth(p.initiator_depth),
            private_data: p.private_data.clone(),
        };
        dev.with_cm(now, |cm, qps| cm.connect(now, args, qps))
    });
    let id = id.map_err(describe)?;
    request_sent();
    match wait_settled(d, id, Some(deadline)) {
        Some(ConnStatus::Established) => {
            Ok(d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.peer_private_data(id).unwrap_or(&[]).to_vec())))
        }
        Some(ConnStatus::Pending) => {
            let _ = d.with_core_at(|dev, now| dev.with_cm(now, |cm, qps| cm.disconnect(now, id, qps)));
            Err(ConnectError::Timeout)
        }
        Some(ConnStatus::Failed(f)) => {
            let e = failure(&f);
            d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.forget(id)));
            Err(e)
        }
        Some(ConnStatus::Disconnected) | None => {
            Err(ConnectError::Rejected { why: "the connection was torn down".into(), private_data: Vec::new() })
        }
    }
}

/// `rdma_listen` on `port` (0: a free one, drawn at random); returns the port.
/// The port is also claimed among the devices of other processes on the same address.
pub fn listen(d: &RoceDriver, port: u16) -> Result<u16, ConnectError> {
    if port != 0 {
        return listen_on(d, port);
    }
    for _ in 0..LISTEN_DRAWS_MAX {
        let p = 0xc000 | (d.with_core(|dev| dev.random_psn()) as u16 & 0x3fff);
        if let Ok(p) = listen_on(d, p) {
            return Ok(p);
        }
    }
    Err(ConnectError::Invalid("no free port to listen on"))
}

/// Random ports tried before `listen` on port 0 gives up (16384 of them to draw from).
const LISTEN_DRAWS_MAX: usize = 1000;

fn listen_on(d: &RoceDriver, port: u16) -> Result<u16, ConnectError> {
    d.claim_service(port)
        .map_err(|_| ConnectError::Invalid("the port is listened on already, by this or another process"))?;
    let listened = d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.listen(port)));
    if let Err(e) = listened {
        d.release_service(port);
        return Err(describe(e));
    }
    Ok(port)
}

/// Stops listening on `port`, rejecting the requests nobody took.
pub fn close_listener(d: &RoceDriver, port: u16) {
    d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.close_listener(now, port)));
    d.release_service(port);
}

/// The next request on `port`, waiting at most `timeout`.
pub fn get_request(d: &RoceDriver, port: u16, timeout: Duration) -> Option<Request> {
    look_until(timeout, || d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.take_request(port))))
}

/// Looks (every [`LOOK_EVERY`]) until `look` finds something, at most `timeout`.
fn look_until<T>(timeout: Duration, mut look: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = look() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(LOOK_EVERY);
    }
}

/// `rdma_accept`: the REP goes out; returns once the RTU (or the first packet) has put
/// the QP in RTS, or the CM gave up.
pub fn accept(d: &RoceDriver, id: ConnId, qpn: u32, p: &ConnParam) -> Result<(), ConnectError> {
    d.with_core_at(|dev, now| {
        let args = AcceptArgs {
            qpn,
            psn: dev.random_psn(),
            mtu: d.path_mtu,
            responder_resources: depth(p.responder_resources),
            initiator_depth: depth(p.initiator_depth),
            private_data: p.private_data.clone(),
        };
        dev.with_cm(now, |cm, qps| cm.accept(now, id, args, qps))
    })
    .map_err(describe)?;
    match wait_settled(d, id, None) {
        Some(ConnStatus::Established) => Ok(()),
        Some(ConnStatus::Failed(f)) => Err(failure(&f)),
        _ => Err(ConnectError::Rejected { why: "the initiator went away".into(), private_data: Vec::new() }),
    }
}

/// `rdma_reject` with `private_data`.
pub fn reject(d: &RoceDriver, id: ConnId, private_data: &[u8]) {
    let _ = d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.reject(now, id, private_data)));
}

/// rdma_cm's UD port space: a UD listener on `port` (0: a free one); returns the port.
pub fn listen_ud(d: &RoceDriver, port: u16) -> Result<u16, ConnectError> {
    let claim = |p: u16| -> Result<u16, ConnectError> {
        d.claim_service(p).map_err(|_| ConnectError::Invalid("the port is listened on already"))?;
        match d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.listen_ud(p))) {
            Ok(()) => Ok(p),
            Err(e) => {
                d.release_service(p);
                Err(describe(e))
            }
        }
    };
    if port != 0 {
        return claim(port);
    }
    (0..LISTEN_DRAWS_MAX)
        .find_map(|_| claim(0xc000 | (d.with_core(|dev| dev.random_psn()) as u16 & 0x3fff)).ok())
        .ok_or(ConnectError::Invalid("no free port to listen on"))
}

/// Stops the UD listener on `port`, refusing the requests nobody took.
pub fn close_ud_listener(d: &RoceDriver, port: u16) {
    d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.close_ud_listener(port)));
    d.release_service(port);
}

/// The next UD request on `port`, waiting at most `timeout`.
pub fn get_ud_request(d: &RoceDriver, port: u16, timeout: Duration) -> Option<crate::cm::UdRequest> {
    look_until(timeout, || d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.take_ud_request(port))))
}

/// Answers UD request `id` with `qpn` and `qkey` (`rdma_accept`), or refuses it.
pub fn answer_ud(d: &RoceDriver, id: ConnId, answer: Option<(u32, u32)>, pd: &[u8]) -> Result<(), ConnectError> {
    d.with_core_at(|dev, now| {
        dev.with_cm(now, |cm, _| match answer {
            Some((qpn, qkey)) => cm.accept_ud(id, qpn, qkey, pd),
            None => cm.reject_ud(id, pd),
        })
    })
    .map_err(describe)
}

/// Resolves the UD QP listening at `to` (`rdma_connect` on a UD id): its QPN, Q_Key and
/// private data, waiting at most `timeout`.
pub fn resolve_ud(
    d: &RoceDriver,
    to: SocketAddr,
    pd: &[u8],
    timeout: Duration,
) -> Result<(u32, u32, Vec<u8>), ConnectError> {
    use crate::cm::{SidrArgs, SidrStatus};
    let deadline = Instant::now() + timeout;
    let id = d.with_core_at(|dev, now| {
        let args = SidrArgs {
            local_gid: dev.gid(),
            peer_gid: ip_to_gid(to.ip()),
            src_port: 0xc000 | (dev.random_psn() as u16 & 0x3fff),
            dst_port: to.port(),
            private_data: pd.to_vec(),
        };
        dev.with_cm(now, |cm, _| cm.resolve_ud(now, args))
    });
    let id = id.map_err(describe)?;
    let outcome = loop {
        let s = d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.ud_status(id).cloned()));
        match s {
            Some(SidrStatus::Pending) if Instant::now() < deadline => std::thread::sleep(LOOK_EVERY),
            Some(SidrStatus::Pending) | None => break Err(ConnectError::Timeout),
            Some(SidrStatus::Resolved { qpn, qkey, private_data }) => break Ok((qpn, qkey, private_data)),
            Some(SidrStatus::Refused(crate::proto::cm::msg::sidr_status::UNSUPPORTED_SERVICE)) => {
                break Err(ConnectError::NoListener("SIDR_REP: unsupported service".into()))
            }
            Some(SidrStatus::Refused(s)) => {
                break Err(ConnectError::Rejected { why: format!("SIDR_REP status {s}"), private_data: Vec::new() })
            }
            Some(SidrStatus::Timeout) => break Err(ConnectError::Timeout),
        }
    };
    d.with_core_at(|dev, now| dev.with_cm(now, |cm, _| cm.forget_ud(id)));
    outcome
}
