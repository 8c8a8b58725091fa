//! Memory windows (IBTA 10.6.7): a remote key for a part of a registered region, with
//! access rights of its own, bound and invalidated through a QP's send queue. Type 1
//! windows belong to their PD and may be rebound at any time; type 2 windows are bound to
//! one QP, and only that QP's peer may use them (type 2B, IBTA 10.6.7.2.3).

use super::{Access, MemError, MrTable, Need, Pd, SharedMem};
use crate::engine::rng::Rng;
use std::sync::Arc;

/// The two kinds of window (IBTA 10.6.7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Bound with `ibv_bind_mw`, rebound freely.
    One,
    /// Bound by a work request, to the QP that posted it; must be invalidated before it
    /// is bound again.
    Two,
}

/// What a bind asks (the `ibv_mw_bind_info` and keys of a bind work request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window's key before the bind (its index names it).
    pub mw_key: u32,
    /// The key it has after: the same index, the application's choice of low 8 bits.
    pub new_key: u32,
    /// The region the window opens onto (0 for an unbinding of length 0).
    pub mr_lkey: u32,
    /// First byte, as a virtual address in the region.
    pub addr: u64,
    /// Bytes; 0 leaves a type 1 window bound to nothing (how it is invalidated).
    pub len: u64,
    /// Remote rights the window grants.
    pub access: Access,
}

#[derive(Debug)]
pub(super) struct Window {
    pd: Pd,
    kind: MwType,
    key: u32,
    binding: Option<Binding>,
}

#[derive(Debug)]
struct Binding {
    region_index: u32,
    region_key: u32,
    addr: u64,
    len: u64,
    access: Access,
    /// Type 2: the QP it was bound through.
    qpn: Option<u32>,
}

impl MrTable {
    /// A window in `pd`, bound to nothing; its key (`ibv_alloc_mw`). `None` when the table
    /// is full (regions and windows share [`MrTable::new`]'s limit).
    pub fn alloc_window(&mut self, pd: Pd, kind: MwType, rng: &mut Rng) -> Option<u32> {
        if self.regions.len() + self.windows.len() >= self.max_regions {
            return None;
        }
        let key = self.fresh_key(rng);
        self.windows.insert(key >> 8, Window { pd, kind, key, binding: None });
        Some(key)
    }

    /// Frees the window `key` names (by its index: a bind may have changed the low bits).
    pub fn dealloc_window(&mut self, key: u32) -> bool {
        self.windows.remove(&(key >> 8)).is_some()
    }

    /// Binds a window for QP `qpn` in `pd` (IBTA 10.6.7.2.2): the window and the region in
    /// the QP's PD, the region allowing binds, and local write if the window grants
    /// remote write or atomics (C10-68), the range inside the region; a type 2 window must
    /// be free. Nothing changes on an error.
    pub fn bind_window(&mut self, b: &MwBind, pd: Pd, qpn: u32) -> Result<(), MemError> {
        let index = b.mw_key >> 8;
        let w = self.windows.get(&index).ok_or(MemError::BadKey)?;
        if w.pd != pd {
            return Err(MemError::WrongPd);
        }
        if b.new_key >> 8 != index || (w.kind == MwType::Two && w.binding.is_some()) {
            return Err(MemError::BadKey);
        }
        let binding = if b.len == 0 && w.kind == MwType::One {
            None
        } else {
            Some(self.check_binding(b, pd, (w.kind == MwType::Two).then_some(qpn))?)
        };
        let w = self.windows.get_mut(&index).ok_or(MemError::BadKey)?;
        w.key = b.new_key;
        w.binding = binding;
        Ok(())
    }

    fn check_binding(&self, b: &MwBind, pd: Pd, qpn: Option<u32>) -> Result<Binding, MemError> {
        let r =
            self.regions.get(&(b.mr_lkey >> 8)).filter(|r| r.key == b.mr_lkey && r.valid).ok_or(MemError::BadKey)?;
        if r.pd != pd {
            return Err(MemError::WrongPd);
        }
        let grants_writes = b.access.remote_write || b.access.remote_atomic;
        if !r.access.mw_bind || (grants_writes && !r.access.local_write) {
            return Err(MemError::Access);
        }
        let end = b.addr.checked_add(b.len).ok_or(MemError::Bounds)?;
        if b.addr < r.addr || end > r.addr + r.len as u64 {
            return Err(MemError::Bounds);
        }
        Ok(Binding {
            region_index: b.mr_lkey >> 8,
            region_key: b.mr_lkey,
            addr: b.addr,
            len: b.len,
            access: b.access,
            qpn,
        })
    }

    /// Invalidates a bound type 2 window (local invalidate, or the peer's Send with
    /// Invalidate on QP `qpn`, IBTA 10.6.7.2.4): its PD and, for type 2, its QP.
    pub fn invalidate_window(&mut self, key: u32, pd: Pd, qpn: u32) -> Result<(), MemError> {
        let w = self.windows.get_mut(&(key >> 8)).filter(|w| w.key == key).ok_or(MemError::BadKey)?;
        if w.pd != pd {
            return Err(MemError::WrongPd);
        }
        match &w.binding {
            Some(b) if w.kind == MwType::Two && b.qpn == Some(qpn) => {
                w.binding = None;
                Ok(())
            }
            _ => Err(MemError::BadKey),
        }
    }

    /// True if `key` names a window (of any key bits).
    pub fn is_window(&self, key: u32) -> bool {
        self.windows.contains_key(&(key >> 8))
    }

    /// The bytes behind window `w` for an access by the peer of QP `qpn`: the window's
    /// key, PD, QP (type 2), rights and range, then its region's (which may have gone).
    pub(super) fn resolve_window(
        &self,
        w: &Window,
        key: u32,
        (pd, qpn): (Pd, u32),
        va: u64,
        len: usize,
        need: Need,
    ) -> Result<(Arc<SharedMem>, usize), MemError> {
        let b = w.binding.as_ref().filter(|_| w.key == key).ok_or(MemError::BadKey)?;
        if w.pd != pd {
            return Err(MemError::WrongPd);
        }
        if b.qpn.is_some_and(|q| q != qpn) {
            return Err(MemError::BadKey);
        }
        let ok = match need {
            Need::RemoteRead => b.access.remote_read,
            Need::RemoteWrite => b.access.remote_write,
            Need::RemoteAtomic => b.access.remote_atomic,
            Need::LocalRead | Need::LocalWrite => false,
        };
        if !ok {
            return Err(MemError::Access);
        }
        let end = va.checked_add(len as u64).ok_or(MemError::Bounds)?;
        if va < b.addr || end > b.addr + b.len {
            return Err(MemError::Bounds);
        }
        let r =
            self.regions.get(&b.region_index).filter(|r| r.key == b.region_key && r.valid).ok_or(MemError::BadKey)?;
        let off = va.checked_sub(r.addr).ok_or(MemError::Bounds)?;
        if off + len as u64 > r.len as u64 {
            return Err(MemError::Bounds);
        }
        if need == Need::RemoteAtomic && !va.is_multiple_of(8) {
            return Err(MemError::Alignment);
        }
        Ok((r.mem.clone(), r.start + off as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QP: u32 = 0x11;

    fn table() -> (MrTable, u32, u64, Rng) {
        let mut rng = Rng::new(3);
        let mut t = MrTable::new(8);
        let access = Access { local_write: true, mw_bind: true, ..Access::default() };
        let mr = t.register(Pd(1), 4096, access, &mut rng).unwrap();
        (t, mr.lkey, mr.addr, rng)
    }

    fn bind(mw_key: u32, mr_lkey: u32, addr: u64, len: u64) -> MwBind {
        let new_key = (mw_key & !0xff) | ((mw_key + 1) & 0xff);
        let access = Access { remote_write: true, remote_read: true, ..Access::default() };
        MwBind { mw_key, new_key, mr_lkey, addr, len, access }
    }

    #[test]
    fn a_bound_type_1_window_opens_its_range_and_no_more() {
        let (mut t, lkey, addr, mut rng) = table();
        let mw = t.alloc_window(Pd(1), MwType::One, &mut rng).unwrap();
        assert_eq!(t.resolve_remote(mw, (Pd(1), QP), addr, 8, Need::RemoteWrite).err(), Some(MemError::BadKey));
        let b = bind(mw, lkey, addr + 64, 128);
        t.bind_window(&b, Pd(1), QP).unwrap();
        let (_, off) = t.resolve_remote(b.new_key, (Pd(1), 99), addr + 64, 128, Need::RemoteWrite).unwrap();
        assert_eq!(off, 64);
        assert_eq!(
            t.resolve_remote(b.new_key, (Pd(1), QP), addr + 63, 8, Need::RemoteWrite).err(),
            Some(MemError::Bounds)
        );
        assert_eq!(
            t.resolve_remote(b.new_key, (Pd(1), QP), addr + 190, 4, Need::RemoteWrite).err(),
            Some(MemError::Bounds)
        );
        assert_eq!(
            t.resolve_remote(b.new_key, (Pd(1), QP), addr + 64, 8, Need::RemoteAtomic).err(),
            Some(MemError::Access)
        );
        assert_eq!(t.resolve_remote(mw, (Pd(1), QP), addr + 64, 8, Need::RemoteWrite).err(), Some(MemError::BadKey));
        assert_eq!(
            t.resolve_remote(b.new_key, (Pd(2), QP), addr + 64, 8, Need::RemoteWrite).err(),
            Some(MemError::WrongPd)
        );
        assert!(t.resolve(b.new_key, Pd(1), addr + 64, 8, Need::LocalWrite).is_err(), "a window is no local key");
        // Rebinding with length 0 closes it (how type 1 windows are invalidated).
        let again = bind(b.new_key, lkey, addr, 0);
        t.bind_window(&again, Pd(1), QP).unwrap();
        assert!(t.resolve_remote(again.new_key, (Pd(1), QP), addr, 1, Need::RemoteWrite).is_err());
    }

    #[test]
    fn a_type_2_window_serves_only_its_qp_and_binds_again_only_once_invalidated() {
        let (mut t, lkey, addr, mut rng) = table();
        let mw = t.alloc_window(Pd(1), MwType::Two, &mut rng).unwrap();
        let b = bind(mw, lkey, addr, 4096);
        t.bind_window(&b, Pd(1), QP).unwrap();
        assert!(t.resolve_remote(b.new_key, (Pd(1), QP), addr, 4096, Need::RemoteRead).is_ok());
        assert_eq!(
            t.resolve_remote(b.new_key, (Pd(1), QP + 1), addr, 8, Need::RemoteRead).err(),
            Some(MemError::BadKey)
        );
        assert_eq!(t.bind_window(&bind(b.new_key, lkey, addr, 8), Pd(1), QP).err(), Some(MemError::BadKey));
        assert_eq!(t.invalidate_window(b.new_key, Pd(1), QP + 1).err(), Some(MemError::BadKey));
        t.remote_invalidate(b.new_key, Pd(1), QP).unwrap();
        assert!(t.resolve_remote(b.new_key, (Pd(1), QP), addr, 8, Need::RemoteRead).is_err());
        assert!(t.bind_window(&bind(b.new_key, lkey, addr, 8), Pd(1), QP).is_ok());
    }

    #[test]
    fn a_bind_the_region_does_not_allow_changes_nothing() {
        let (mut t, lkey, addr, mut rng) = table();
        let ro = t.register(Pd(1), 64, Access { mw_bind: true, ..Access::default() }, &mut rng).unwrap();
        let mw = t.alloc_window(Pd(1), MwType::One, &mut rng).unwrap();
        // Remote write through a region without local write (C10-68), past the region's
        // end, in another PD, with a key of another index.
        assert_eq!(t.bind_window(&bind(mw, ro.lkey, ro.addr, 8), Pd(1), QP).err(), Some(MemError::Access));
        assert_eq!(t.bind_window(&bind(mw, lkey, addr + 4000, 100), Pd(1), QP).err(), Some(MemError::Bounds));
        assert_eq!(t.bind_window(&bind(mw, lkey, addr, 8), Pd(2), QP).err(), Some(MemError::WrongPd));
        let stray = MwBind { new_key: mw ^ 0x100, ..bind(mw, lkey, addr, 8) };
        assert_eq!(t.bind_window(&stray, Pd(1), QP).err(), Some(MemError::BadKey));
        assert!(t.resolve_remote(mw, (Pd(1), QP), addr, 8, Need::RemoteWrite).is_err());
        // A region without the bind right refuses any window.
        let plain = t.register(Pd(1), 64, Access { local_write: true, ..Access::default() }, &mut rng).unwrap();
        assert_eq!(t.bind_window(&bind(mw, plain.lkey, plain.addr, 8), Pd(1), QP).err(), Some(MemError::Access));
    }

    #[test]
    fn a_window_over_a_deregistered_region_opens_nothing() {
        let (mut t, lkey, addr, mut rng) = table();
        let mw = t.alloc_window(Pd(1), MwType::One, &mut rng).unwrap();
        let b = bind(mw, lkey, addr, 64);
        t.bind_window(&b, Pd(1), QP).unwrap();
        assert!(t.deregister(lkey));
        assert_eq!(t.resolve_remote(b.new_key, (Pd(1), QP), addr, 8, Need::RemoteWrite).err(), Some(MemError::BadKey));
        assert!(t.dealloc_window(b.new_key));
        assert!(!t.is_window(b.new_key));
    }
}
