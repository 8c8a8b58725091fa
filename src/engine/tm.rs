//! Tag matching on a shared receive queue (rdma-core's TM-SRQ, `Documentation/tag_matching.md`;
//! headers in `infiniband/tm_types.h`). Messages are ordinary RC SENDs whose payload starts
//! with a 16-byte tag-matching header (TMH); a rendezvous request adds a 16-byte RVH naming
//! the sender's buffer, which the receiver reads with an RDMA READ and then answers with a
//! FIN SEND. An expected message (its tag matches a tagged buffer) lands in that buffer
//! without its headers; anything else is unexpected and lands whole in an ordinary receive
//! of the SRQ, and tags added after it stay out of matching until the application reports
//! (SYNC) how many unexpected messages it has handled.

use super::verbs::{RecvWr, Sge, VerbsError, Wc, WcOpcode, WcStatus};

/// Bytes of the tag-matching header: opcode, 3 reserved, app context (BE32), tag (BE64).
pub const TMH_BYTES: usize = 16;
/// Bytes of the rendezvous header: VA (BE64), rkey (BE32), length (BE32).
pub const RVH_BYTES: usize = 16;
/// The largest rendezvous request (`tm_caps.max_rndv_hdr_size`): TMH, RVH and what the
/// sender adds for a receiver that finds it unexpected.
pub const MAX_RNDV_HDR_BYTES: usize = 64;
/// Most tagged buffers one TM-SRQ holds (`tm_caps.max_num_tags`).
pub const MAX_TAGS: usize = 1024;
/// Most outstanding list operations (`tm_caps.max_ops`); every operation completes when
/// posted, so this bounds one `ibv_post_srq_ops` list only.
pub const MAX_OPS: usize = 1024;
/// Most SGEs in a tagged buffer (`tm_caps.max_sge`).
pub const MAX_TAG_SGE: usize = 16;

/// `enum ibv_tmh_op`.
pub const TMH_NO_TAG: u8 = 0;
/// A rendezvous request.
pub const TMH_RNDV: u8 = 1;
/// A rendezvous completion indication.
pub const TMH_FIN: u8 = 2;
/// An eager message.
pub const TMH_EAGER: u8 = 3;

/// `IBV_WC_TM_SYNC_REQ`: the application must report its unexpected count.
pub const WC_TM_SYNC_REQ: u8 = 1 << 0;
/// `IBV_WC_TM_MATCH`: the message matched a tagged buffer.
pub const WC_TM_MATCH: u8 = 1 << 1;
/// `IBV_WC_TM_DATA_VALID`: all of the matched message's data is in memory.
pub const WC_TM_DATA_VALID: u8 = 1 << 2;

/// What a tag-matching completion adds to a [`Wc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmWc {
    /// `WC_TM_*` flags.
    pub flags: u8,
    /// The tag from the TMH (matched messages only).
    pub tag: u64,
    /// The TMH's opaque application context (`ibv_wc_tm_info.priv`).
    pub app_ctx: u32,
}

/// A parsed TMH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tmh {
    /// `TMH_*`.
    pub op: u8,
    /// Opaque to the receiver.
    pub app_ctx: u32,
    /// The tag.
    pub tag: u64,
}

impl Tmh {
    /// The header at the start of `payload`, if it is long enough to hold one.
    pub fn parse(payload: &[u8]) -> Option<Tmh> {
        let h = payload.get(..TMH_BYTES)?;
        Some(Tmh { op: h[0], app_ctx: be32(&h[4..8]), tag: be64(&h[8..16]) })
    }
}

/// A parsed RVH: the sender's buffer a rendezvous READ reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rvh {
    /// Its address.
    pub va: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length.
    pub len: u32,
}

impl Rvh {
    /// The header following the TMH in `payload`, if there is one.
    pub fn parse(payload: &[u8]) -> Option<Rvh> {
        let h = payload.get(TMH_BYTES..TMH_BYTES + RVH_BYTES)?;
        Some(Rvh { va: be64(&h[..8]), rkey: be32(&h[8..12]), len: be32(&h[12..16]) })
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// One `ibv_ops_wr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsWr {
    /// Returned in the operation's completion.
    pub wr_id: u64,
    /// What to do.
    pub op: TagOp,
    /// The unexpected messages the application has handled.
    pub unexpected_cnt: u32,
    /// `IBV_OPS_SIGNALED`: complete a successful operation too.
    pub signaled: bool,
}

/// `enum ibv_ops_wr_opcode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagOp {
    /// Adds a tagged buffer; `recv.wr_id` identifies it in receive completions.
    Add { recv: RecvWr, tag: u64, mask: u64 },
    /// Removes the tagged buffer with this handle.
    Del { handle: u32 },
    /// Reports the unexpected count only.
    Sync,
}

/// A tagged buffer.
#[derive(Debug, Clone)]
struct TagEntry {
    handle: u32,
    tag: u64,
    mask: u64,
    recv: RecvWr,
    /// Added while the application was in step with the unexpected count: it takes part
    /// in matching (a tag added after an unexpected message the application has not
    /// seen would otherwise match a later message out of MPI order).
    enabled: bool,
}

/// A tagged buffer a message matched.
#[derive(Debug, Clone)]
pub struct Matched {
    /// Its receive request (`recv_wr_id` and buffers).
    pub recv: RecvWr,
}

/// The matching list of one TM-SRQ and its count of unexpected messages.
#[derive(Debug)]
pub struct TagList {
    entries: Vec<TagEntry>,
    max_tags: usize,
    next_handle: u32,
    unexpected: u32,
    /// The receive completions go to this CQ (a TM-SRQ has its own, as an XRC SRQ does).
    pub cq: u32,
}

impl TagList {
    /// An empty list of at most `max_tags` buffers (at most [`MAX_TAGS`]).
    pub fn new(max_tags: usize, cq: u32) -> Self {
        TagList { entries: Vec::new(), max_tags: max_tags.clamp(1, MAX_TAGS), next_handle: 1, unexpected: 0, cq }
    }

    /// Runs one list operation; the completion to report, if any (failures always).
    pub fn apply(&mut self, w: &OpsWr) -> Result<(Option<Wc>, Option<u32>), VerbsError> {
        let in_step = w.unexpected_cnt == self.unexpected;
        let (opcode, status, handle) = match &w.op {
            TagOp::Add { recv, tag, mask } => {
                if recv.sgl.len() > MAX_TAG_SGE {
                    return Err(VerbsError::InvalidRequest);
                }
                if self.entries.len() >= self.max_tags {
                    return Err(VerbsError::QueueFull);
                }
                let handle = self.next_handle;
                self.next_handle = self.next_handle.wrapping_add(1).max(1);
                let e = TagEntry { handle, tag: *tag, mask: *mask, recv: recv.clone(), enabled: in_step };
                self.entries.push(e);
                (WcOpcode::TmAdd, WcStatus::Success, Some(handle))
            }
            TagOp::Del { handle } => match self.entries.iter().position(|e| e.handle == *handle) {
                Some(i) => {
                    self.entries.remove(i);
                    (WcOpcode::TmDel, WcStatus::Success, None)
                }
                // Consumed by a message already, or never added.
                None => (WcOpcode::TmDel, WcStatus::TmErr, None),
            },
            TagOp::Sync => (WcOpcode::TmSync, WcStatus::Success, None),
        };
        if in_step {
            self.entries.iter_mut().for_each(|e| e.enabled = true);
        }
        let report = w.signaled || status != WcStatus::Success;
        let wc = report.then(|| {
            let mut wc = Wc::new(w.wr_id, status, opcode, 0, 0);
            wc.tm = Some(TmWc { flags: if in_step { 0 } else { WC_TM_SYNC_REQ }, ..TmWc::default() });
            wc
        });
        Ok((wc, handle))
    }

    /// The first enabled tagged buffer whose tag matches `tag` under both masks, taken
    /// out of the list (posting order decides, as MPI's matching rules ask).
    pub fn take_match(&mut self, tag: u64) -> Option<Matched> {
        let i = self.entries.iter().position(|e| e.enabled && (e.tag & e.mask) == (tag & e.mask))?;
        let e = self.entries.remove(i);
        Some(Matched { recv: e.recv })
    }

    /// A tagged message found no buffer: it is unexpected.
    pub fn count_unexpected(&mut self) {
        self.unexpected = self.unexpected.wrapping_add(1);
    }

    /// Tagged buffers held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none are held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every tagged buffer, for flushing when the SRQ goes.
    pub fn drain(&mut self) -> Vec<RecvWr> {
        self.entries.drain(..).map(|e| e.recv).collect()
    }
}

/// The bytes of a FIN answering the rendezvous request whose first bytes are `request`:
/// its TMH and RVH with the opcode changed.
pub fn fin_payload(request: &[u8]) -> [u8; TMH_BYTES + RVH_BYTES] {
    let mut fin = [0u8; TMH_BYTES + RVH_BYTES];
    let n = request.len().min(fin.len());
    fin[..n].copy_from_slice(&request[..n]);
    fin[0] = TMH_FIN;
    fin
}

/// The capacity of a tagged buffer's SGEs.
pub fn capacity(sgl: &[Sge]) -> usize {
    sgl.iter().map(|s| s.length as usize).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(tag: u64, mask: u64, cnt: u32, id: u64) -> OpsWr {
        let recv = RecvWr { wr_id: id, sgl: vec![] };
        OpsWr { wr_id: 100 + id, op: TagOp::Add { recv, tag, mask }, unexpected_cnt: cnt, signaled: true }
    }

    #[test]
    fn headers_parse_big_endian_and_short_payloads_have_none() {
        let mut p = [0u8; 32];
        p[0] = TMH_RNDV;
        p[4..8].copy_from_slice(&7u32.to_be_bytes());
        p[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
        p[16..24].copy_from_slice(&0xdead_beefu64.to_be_bytes());
        p[24..28].copy_from_slice(&0x55u32.to_be_bytes());
        p[28..32].copy_from_slice(&4096u32.to_be_bytes());
        assert_eq!(Tmh::parse(&p), Some(Tmh { op: TMH_RNDV, app_ctx: 7, tag: 0x1122_3344_5566_7788 }));
        assert_eq!(Rvh::parse(&p), Some(Rvh { va: 0xdead_beef, rkey: 0x55, len: 4096 }));
        assert_eq!(Tmh::parse(&p[..15]), None);
        assert_eq!(Rvh::parse(&p[..31]), None);
        assert_eq!(fin_payload(&p)[0], TMH_FIN);
        assert_eq!(fin_payload(&p)[1..], p[1..]);
    }

    #[test]
    fn matching_takes_the_first_posted_buffer_under_the_mask() {
        let mut l = TagList::new(8, 1);
        l.apply(&add(0x1_0005, 0xffff, 0, 1)).unwrap();
        l.apply(&add(0x2_0005, 0xffff, 0, 2)).unwrap();
        assert_eq!(l.take_match(0x9_0005).map(|m| m.recv.wr_id), Some(1));
        assert_eq!(l.take_match(0x5).map(|m| m.recv.wr_id), Some(2));
        assert!(l.take_match(0x5).is_none());
    }

    #[test]
    fn tags_added_out_of_step_wait_for_the_sync() {
        let mut l = TagList::new(8, 1);
        l.count_unexpected();
        let (wc, _) = l.apply(&add(5, !0, 0, 1)).unwrap();
        assert_eq!(wc.unwrap().tm.unwrap().flags, WC_TM_SYNC_REQ);
        assert!(l.take_match(5).is_none(), "a tag added before the application saw the unexpected message");
        let sync = OpsWr { wr_id: 9, op: TagOp::Sync, unexpected_cnt: 1, signaled: true };
        let (wc, _) = l.apply(&sync).unwrap();
        assert_eq!(wc.map(|w| (w.opcode, w.tm.unwrap().flags)), Some((WcOpcode::TmSync, 0)));
        assert_eq!(l.take_match(5).map(|m| m.recv.wr_id), Some(1));
    }

    #[test]
    fn the_list_is_bounded_and_a_consumed_tag_cannot_be_deleted() {
        let mut l = TagList::new(2, 1);
        let (_, h) = l.apply(&add(1, !0, 0, 1)).unwrap();
        l.apply(&add(2, !0, 0, 2)).unwrap();
        assert_eq!(l.apply(&add(3, !0, 0, 3)).unwrap_err(), VerbsError::QueueFull);
        assert!(l.take_match(1).is_some());
        let del = OpsWr { wr_id: 7, op: TagOp::Del { handle: h.unwrap() }, unexpected_cnt: 0, signaled: false };
        let (wc, _) = l.apply(&del).unwrap();
        assert_eq!(wc.map(|w| w.status), Some(WcStatus::TmErr), "failures complete even unsignaled");
        assert_eq!(l.len(), 1);
    }
}
