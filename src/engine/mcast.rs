//! Multicast groups of UD QPs (IBTA vol. 1 §10.5: Attach/Detach QP to Multicast Group;
//! §9.8.1: a multicast datagram carries DestQP 0xFFFFFF and is delivered to every QP
//! attached to its destination GID). On RoCEv2 the group is an IP multicast address: its
//! GID is the IPv4-mapped address (`::ffff:224.0.0.0/100`) or the IPv6 one (`ff00::/8`),
//! as Linux's rdma_cm maps them.

use super::verbs::{Gid, VerbsError};
use std::collections::HashMap;

/// The DestQP of a multicast datagram (IBTA 9.8.1).
pub const MCAST_QPN: u32 = 0xff_ffff;
/// Most groups a device has QPs attached to at once.
pub const MAX_MCAST_GROUPS: usize = 64;
/// Most QPs attached to one group on a device.
pub const MAX_MCAST_MEMBERS: usize = 64;

/// Whether `gid` names a multicast group: IPv6 `ff00::/8`, or IPv4-mapped `224.0.0.0/4`.
pub fn is_multicast(gid: &Gid) -> bool {
    let mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    gid[0] == 0xff || (mapped && gid[12] & 0xf0 == 0xe0)
}

/// The groups and the QPs attached to each, in attachment order.
#[derive(Debug, Default)]
pub struct McastTable {
    groups: HashMap<Gid, Vec<u32>>,
}

/// What an attachment or detachment did to the group as a whole: the transport joins the
/// group's address on its first member and leaves it after its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupChange {
    /// The group had no member before.
    First,
    /// The group has no member now.
    Last,
    /// Other members remain, or were there already.
    Neither,
}

impl McastTable {
    /// Attaches QP `qpn` to `mgid` (attaching twice changes nothing).
    pub fn attach(&mut self, mgid: Gid, qpn: u32) -> Result<GroupChange, VerbsError> {
        if !is_multicast(&mgid) {
            return Err(VerbsError::InvalidAttribute("gid"));
        }
        if !self.groups.contains_key(&mgid) && self.groups.len() >= MAX_MCAST_GROUPS {
            return Err(VerbsError::OutOfResources);
        }
        let members = self.groups.entry(mgid).or_default();
        if members.contains(&qpn) {
            return Ok(GroupChange::Neither);
        }
        if members.len() >= MAX_MCAST_MEMBERS {
            return Err(VerbsError::OutOfResources);
        }
        members.push(qpn);
        Ok(if members.len() == 1 { GroupChange::First } else { GroupChange::Neither })
    }

    /// Detaches QP `qpn` from `mgid`; `NotFound` if it was not attached.
    pub fn detach(&mut self, mgid: Gid, qpn: u32) -> Result<GroupChange, VerbsError> {
        let members = self.groups.get_mut(&mgid).ok_or(VerbsError::NotFound)?;
        let at = members.iter().position(|&q| q == qpn).ok_or(VerbsError::NotFound)?;
        members.remove(at);
        if members.is_empty() {
            self.groups.remove(&mgid);
            return Ok(GroupChange::Last);
        }
        Ok(GroupChange::Neither)
    }

    /// Detaches a destroyed QP from every group; returns the groups left with no member.
    pub fn forget(&mut self, qpn: u32) -> Vec<Gid> {
        let mut emptied = Vec::new();
        self.groups.retain(|g, members| {
            members.retain(|&q| q != qpn);
            if members.is_empty() {
                emptied.push(*g);
            }
            !members.is_empty()
        });
        emptied
    }

    /// The QPs attached to `mgid`.
    pub fn members(&self, mgid: &Gid) -> &[u32] {
        self.groups.get(mgid).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> Gid {
        super::super::verbs::gid_from_ipv4(a)
    }

    #[test]
    fn multicast_gids_are_ipv4_class_d_or_ipv6_ff() {
        assert!(is_multicast(&v4([224, 0, 0, 1])) && is_multicast(&v4([239, 255, 1, 2])));
        assert!(!is_multicast(&v4([10, 0, 0, 1])) && !is_multicast(&v4([240, 0, 0, 1])));
        let mut v6 = [0u8; 16];
        v6[0] = 0xff;
        v6[1] = 0x0e;
        assert!(is_multicast(&v6));
        v6[0] = 0xfe;
        assert!(!is_multicast(&v6));
    }

    #[test]
    fn the_first_member_joins_and_the_last_leaves() {
        let (mut t, g) = (McastTable::default(), v4([239, 1, 2, 3]));
        assert_eq!(t.attach(g, 7), Ok(GroupChange::First));
        assert_eq!(t.attach(g, 7), Ok(GroupChange::Neither), "twice is once");
        assert_eq!(t.attach(g, 8), Ok(GroupChange::Neither));
        assert_eq!(t.members(&g), &[7, 8]);
        assert_eq!(t.detach(g, 7), Ok(GroupChange::Neither));
        assert_eq!(t.detach(g, 7), Err(VerbsError::NotFound));
        assert_eq!(t.forget(8), vec![g]);
        assert!(t.members(&g).is_empty());
        assert_eq!(t.attach(v4([10, 0, 0, 1]), 7), Err(VerbsError::InvalidAttribute("gid")));
    }

    #[test]
    fn groups_and_members_stop_at_their_limits() {
        let mut t = McastTable::default();
        for i in 0..MAX_MCAST_GROUPS {
            assert_eq!(t.attach(v4([239, 0, 0, i as u8]), 1), Ok(GroupChange::First));
        }
        assert_eq!(t.attach(v4([239, 0, 1, 0]), 1), Err(VerbsError::OutOfResources));
        let g = v4([239, 0, 0, 0]);
        for q in 2..=MAX_MCAST_MEMBERS as u32 {
            t.attach(g, q).unwrap();
        }
        assert_eq!(t.members(&g).len(), MAX_MCAST_MEMBERS);
        assert_eq!(t.attach(g, 1000), Err(VerbsError::OutOfResources));
    }
}
