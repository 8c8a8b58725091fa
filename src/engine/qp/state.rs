//! The QP state machine (IBTA 10.3.1, Figure 133) for RC, as one table: which transitions
//! modify-QP may make, which attributes each requires and which it allows
//! (IBTA 11.2.5.2, Table 93; libibverbs `ibv_modify_qp` masks).

use crate::engine::verbs::{QpAttr, QpState, QpType, VerbsError, Xrc};

/// Bits naming the attributes of [`QpAttr`] (besides the state).
pub mod attr {
    /// dest_gid (address vector).
    pub const AV: u32 = 1 << 0;
    /// dest_qpn.
    pub const DEST_QPN: u32 = 1 << 1;
    /// rq_psn.
    pub const RQ_PSN: u32 = 1 << 2;
    /// sq_psn.
    pub const SQ_PSN: u32 = 1 << 3;
    /// path_mtu.
    pub const PATH_MTU: u32 = 1 << 4;
    /// timeout.
    pub const TIMEOUT: u32 = 1 << 5;
    /// retry_cnt.
    pub const RETRY_CNT: u32 = 1 << 6;
    /// rnr_retry.
    pub const RNR_RETRY: u32 = 1 << 7;
    /// min_rnr_timer.
    pub const MIN_RNR_TIMER: u32 = 1 << 8;
    /// max_rd_atomic.
    pub const MAX_RD_ATOMIC: u32 = 1 << 9;
    /// max_dest_rd_atomic.
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 10;
    /// access.
    pub const ACCESS: u32 = 1 << 11;
    /// pkey.
    pub const PKEY: u32 = 1 << 12;
    /// qkey.
    pub const QKEY: u32 = 1 << 13;
    /// Names, for errors.
    pub const NAMES: [&str; 14] = [
        "dest_gid",
        "dest_qpn",
        "rq_psn",
        "sq_psn",
        "path_mtu",
        "timeout",
        "retry_cnt",
        "rnr_retry",
        "min_rnr_timer",
        "max_rd_atomic",
        "max_dest_rd_atomic",
        "access",
        "pkey",
        "qkey",
    ];
}

use attr::*;
use QpState as S;

/// One allowed transition.
struct Transition {
    from: QpState,
    to: QpState,
    required: u32,
    optional: u32,
}

const fn t(from: QpState, to: QpState, required: u32, optional: u32) -> Transition {
    Transition { from, to, required, optional }
}

const RTS_TUNABLE: u32 = MIN_RNR_TIMER | ACCESS | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC;

/// The RC transitions. Any state may go to RESET or ERR with no attributes.
const RC: [Transition; 8] = [
    t(S::Reset, S::Init, ACCESS, PKEY),
    t(S::Init, S::Init, 0, ACCESS | PKEY),
    t(S::Init, S::Rtr, AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER, ACCESS | PKEY),
    t(S::Rtr, S::Rts, SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC, MIN_RNR_TIMER | ACCESS),
    t(S::Rts, S::Rts, 0, RTS_TUNABLE),
    t(S::Rts, S::Sqd, 0, 0),
    t(S::Sqd, S::Rts, 0, RTS_TUNABLE),
    t(S::Sqe, S::Rts, 0, MIN_RNR_TIMER | ACCESS),
];

/// The UC transitions: no acknowledgements, so no timers, retries or READ/atomic depths.
const UC: [Transition; 8] = [
    t(S::Reset, S::Init, ACCESS, PKEY),
    t(S::Init, S::Init, 0, ACCESS | PKEY),
    t(S::Init, S::Rtr, AV | PATH_MTU | DEST_QPN | RQ_PSN, ACCESS | PKEY),
    t(S::Rtr, S::Rts, SQ_PSN, ACCESS),
    t(S::Rts, S::Rts, 0, ACCESS),
    t(S::Rts, S::Sqd, 0, 0),
    t(S::Sqd, S::Rts, 0, ACCESS),
    t(S::Sqe, S::Rts, 0, ACCESS),
];

/// An XRC initiator's transitions (Linux's `ib_modify_qp_is_ok` for XRC_INI): RC's
/// without the receive side's depths and timer.
const XRC_INI: [Transition; 8] = [
    t(S::Reset, S::Init, 0, ACCESS | PKEY),
    t(S::Init, S::Init, 0, ACCESS | PKEY),
    t(S::Init, S::Rtr, AV | PATH_MTU | DEST_QPN | RQ_PSN, ACCESS | PKEY),
    t(S::Rtr, S::Rts, SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC, ACCESS),
    t(S::Rts, S::Rts, 0, ACCESS | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC),
    t(S::Rts, S::Sqd, 0, 0),
    t(S::Sqd, S::Rts, 0, ACCESS | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_RD_ATOMIC),
    t(S::Sqe, S::Rts, 0, ACCESS),
];

/// An XRC target's transitions (XRC_TGT): RC's without the send side's retries and depth.
const XRC_TGT: [Transition; 8] = [
    t(S::Reset, S::Init, ACCESS, PKEY),
    t(S::Init, S::Init, 0, ACCESS | PKEY),
    t(S::Init, S::Rtr, AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER, ACCESS | PKEY),
    t(S::Rtr, S::Rts, SQ_PSN | TIMEOUT, MIN_RNR_TIMER | ACCESS),
    t(S::Rts, S::Rts, 0, MIN_RNR_TIMER | ACCESS | TIMEOUT),
    t(S::Rts, S::Sqd, 0, 0),
    t(S::Sqd, S::Rts, 0, MIN_RNR_TIMER | ACCESS | TIMEOUT),
    t(S::Sqe, S::Rts, 0, MIN_RNR_TIMER | ACCESS),
];

/// The UD transitions: a Q_Key instead of a path.
const UD: [Transition; 8] = [
    t(S::Reset, S::Init, QKEY, PKEY),
    t(S::Init, S::Init, 0, QKEY | PKEY),
    t(S::Init, S::Rtr, 0, QKEY | PKEY),
    t(S::Rtr, S::Rts, SQ_PSN, QKEY),
    t(S::Rts, S::Rts, 0, QKEY),
    t(S::Rts, S::Sqd, 0, 0),
    t(S::Sqd, S::Rts, 0, QKEY),
    t(S::Sqe, S::Rts, 0, QKEY),
];

/// A raw packet QP's transitions: no path, no keys (Linux's uverbs takes only the port).
const RAW: [Transition; 8] = [
    t(S::Reset, S::Init, 0, 0),
    t(S::Init, S::Init, 0, 0),
    t(S::Init, S::Rtr, 0, 0),
    t(S::Rtr, S::Rts, 0, 0),
    t(S::Rts, S::Rts, 0, 0),
    t(S::Rts, S::Sqd, 0, 0),
    t(S::Sqd, S::Rts, 0, 0),
    t(S::Sqe, S::Rts, 0, 0),
];

/// `a` without the attributes of the half an XRC QP is not (an initiator's receive depth
/// and RNR timer, a target's send depth and retries): applications set them as for RC
/// (perftest does) and Linux's uverbs drops them for XRC QPs (`modify_qp_mask`).
pub fn without_other_half(xrc: Option<Xrc>, a: &QpAttr) -> QpAttr {
    let mut a = a.clone();
    match xrc {
        Some(Xrc::Initiator) => (a.max_dest_rd_atomic, a.min_rnr_timer) = (None, None),
        Some(Xrc::Target { .. }) => (a.max_rd_atomic, a.retry_cnt, a.rnr_retry) = (None, None, None),
        None => {}
    }
    a
}

/// The attribute bits present in `a`.
pub fn mask_of(a: &QpAttr) -> u32 {
    let present = [
        a.dest_gid.is_some() || a.sgid_index.is_some(),
        a.dest_qpn.is_some(),
        a.rq_psn.is_some(),
        a.sq_psn.is_some(),
        a.path_mtu.is_some(),
        a.timeout.is_some(),
        a.retry_cnt.is_some(),
        a.rnr_retry.is_some(),
        a.min_rnr_timer.is_some(),
        a.max_rd_atomic.is_some(),
        a.max_dest_rd_atomic.is_some(),
        a.access.is_some(),
        a.pkey.is_some(),
        a.qkey.is_some(),
    ];
    present.iter().enumerate().fold(0, |m, (i, &p)| m | (p as u32) << i)
}

fn first_name(bits: u32) -> &'static str {
    NAMES[bits.trailing_zeros() as usize % NAMES.len()]
}

/// Checks a modify-QP of a QP of type `ty` from `from` against its table; returns the
/// target state.
pub fn check(ty: QpType, xrc: Option<Xrc>, from: QpState, a: &QpAttr) -> Result<QpState, VerbsError> {
    let to = a.state.unwrap_or(from);
    let mask = mask_of(a);
    if matches!(to, S::Reset | S::Err) {
        return if mask == 0 { Ok(to) } else { Err(VerbsError::InvalidAttribute(first_name(mask))) };
    }
    let table: &[Transition] = match (ty, xrc) {
        (_, Some(Xrc::Initiator)) => &XRC_INI,
        (_, Some(Xrc::Target { .. })) => &XRC_TGT,
        (QpType::Rc, None) => &RC,
        (QpType::Uc, None) => &UC,
        (QpType::Ud, None) => &UD,
        (QpType::RawPacket, None) => &RAW,
    };
    let row = table.iter().find(|r| r.from == from && r.to == to).ok_or(VerbsError::IllegalTransition { from, to })?;
    let missing = row.required & !mask;
    if missing != 0 {
        return Err(VerbsError::MissingAttribute(first_name(missing)));
    }
    let extra = mask & !(row.required | row.optional);
    if extra != 0 {
        return Err(VerbsError::InvalidAttribute(first_name(extra)));
    }
    check_ranges(a)?;
    Ok(to)
}

fn check_ranges(a: &QpAttr) -> Result<(), VerbsError> {
    let bad = |name| Err(VerbsError::InvalidAttribute(name));
    if a.dest_qpn.is_some_and(|q| q > 0xff_ffff) {
        return bad("dest_qpn");
    }
    if a.rq_psn.is_some_and(|p| p > 0xff_ffff) {
        return bad("rq_psn");
    }
    if a.sq_psn.is_some_and(|p| p > 0xff_ffff) {
        return bad("sq_psn");
    }
    if a.timeout.is_some_and(|t| t > 31) {
        return bad("timeout");
    }
    if a.retry_cnt.is_some_and(|r| r > 7) {
        return bad("retry_cnt");
    }
    if a.rnr_retry.is_some_and(|r| r > 7) {
        return bad("rnr_retry");
    }
    if a.min_rnr_timer.is_some_and(|r| r > 31) {
        return bad("min_rnr_timer");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::mem::Access;
    use crate::engine::verbs::Mtu;

    fn to(s: QpState) -> QpAttr {
        QpAttr { state: Some(s), ..QpAttr::default() }
    }

    // IBTA 10.3.1: the legal paths, and what each needs.
    #[test]
    fn reset_init_rtr_rts() {
        assert_eq!(
            check(QpType::Rc, None, S::Reset, &QpAttr { access: Some(Access::ALL), ..to(S::Init) }),
            Ok(S::Init)
        );
        assert_eq!(check(QpType::Rc, None, S::Reset, &to(S::Init)), Err(VerbsError::MissingAttribute("access")));
        let rtr = QpAttr {
            dest_gid: Some([0; 16]),
            path_mtu: Some(Mtu::M1024),
            dest_qpn: Some(17),
            rq_psn: Some(5),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(12),
            ..to(S::Rtr)
        };
        assert_eq!(check(QpType::Rc, None, S::Init, &rtr), Ok(S::Rtr));
        assert_eq!(
            check(QpType::Rc, None, S::Init, &QpAttr { rq_psn: None, ..rtr.clone() }),
            Err(VerbsError::MissingAttribute("rq_psn"))
        );
        assert_eq!(
            check(QpType::Rc, None, S::Init, &QpAttr { sq_psn: Some(1), ..rtr }),
            Err(VerbsError::InvalidAttribute("sq_psn"))
        );
        let rts = QpAttr {
            sq_psn: Some(9),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..to(S::Rts)
        };
        assert_eq!(check(QpType::Rc, None, S::Rtr, &rts), Ok(S::Rts));
        assert_eq!(
            check(QpType::Rc, None, S::Rtr, &QpAttr { retry_cnt: Some(8), ..rts }),
            Err(VerbsError::InvalidAttribute("retry_cnt"))
        );
    }

    #[test]
    fn illegal_transitions_are_typed_errors() {
        for (from, dest) in [
            (S::Reset, S::Rtr),
            (S::Reset, S::Rts),
            (S::Init, S::Rts),
            (S::Rtr, S::Init),
            (S::Rts, S::Init),
            (S::Err, S::Rts),
            (S::Sqd, S::Init),
        ] {
            assert_eq!(
                check(QpType::Rc, None, from, &to(dest)),
                Err(VerbsError::IllegalTransition { from, to: dest }),
                "{from:?}->{dest:?}"
            );
        }
    }

    #[test]
    fn anything_may_reset_or_fail() {
        for from in [S::Reset, S::Init, S::Rtr, S::Rts, S::Sqd, S::Sqe, S::Err] {
            assert_eq!(check(QpType::Rc, None, from, &to(S::Err)), Ok(S::Err));
            assert_eq!(check(QpType::Rc, None, from, &to(S::Reset)), Ok(S::Reset));
        }
        assert_eq!(
            check(QpType::Rc, None, S::Rts, &QpAttr { timeout: Some(3), ..to(S::Err) }),
            Err(VerbsError::InvalidAttribute("timeout"))
        );
    }

    #[test]
    fn uc_and_ud_tables() {
        let uc_rtr = QpAttr {
            dest_gid: Some([0; 16]),
            path_mtu: Some(Mtu::M512),
            dest_qpn: Some(20),
            rq_psn: Some(1),
            ..to(S::Rtr)
        };
        assert_eq!(check(QpType::Uc, None, S::Init, &uc_rtr), Ok(S::Rtr));
        let with_ird = QpAttr { max_dest_rd_atomic: Some(1), ..uc_rtr.clone() };
        assert_eq!(
            check(QpType::Uc, None, S::Init, &with_ird),
            Err(VerbsError::InvalidAttribute("max_dest_rd_atomic"))
        );
        assert_eq!(check(QpType::Ud, None, S::Reset, &to(S::Init)), Err(VerbsError::MissingAttribute("qkey")));
        assert_eq!(check(QpType::Ud, None, S::Reset, &QpAttr { qkey: Some(0x1111), ..to(S::Init) }), Ok(S::Init));
        assert_eq!(check(QpType::Ud, None, S::Init, &to(S::Rtr)), Ok(S::Rtr));
        assert_eq!(check(QpType::Ud, None, S::Init, &uc_rtr), Err(VerbsError::InvalidAttribute("dest_gid")));
        assert_eq!(check(QpType::Ud, None, S::Rtr, &QpAttr { sq_psn: Some(0), ..to(S::Rts) }), Ok(S::Rts));
    }

    #[test]
    fn sq_drain_and_recovery() {
        assert_eq!(check(QpType::Rc, None, S::Rts, &to(S::Sqd)), Ok(S::Sqd));
        assert_eq!(check(QpType::Rc, None, S::Sqd, &QpAttr { timeout: Some(10), ..to(S::Rts) }), Ok(S::Rts));
        assert_eq!(check(QpType::Rc, None, S::Sqe, &to(S::Rts)), Ok(S::Rts));
        assert_eq!(
            check(QpType::Rc, None, S::Rts, &QpAttr { min_rnr_timer: Some(1), ..QpAttr::default() }),
            Ok(S::Rts)
        );
    }
}
