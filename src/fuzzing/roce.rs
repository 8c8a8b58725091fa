//! Stateful fuzzing of a RoCEv2 device: an RC, a UC and a UD QP (a member of a multicast
//! group), an XRC target with an SRQ of its domain and one of another, and an RC QP on a
//! tag-matching SRQ (tagged buffers, ordinary receives, rendezvous READs it issues), fed a
//! fuzzer-chosen sequence of packets, as if from their peer (or a stranger),
//! with time passing and timers firing. Oracles: no panic; replies, packets out and completions bounded; no
//! completion lost twice or made up; no byte changed outside what a peer may write.

use crate::engine::mem::{Access, Mr};
use crate::engine::qp::responder::MAX_REPLIES;
use crate::engine::tm::{OpsWr, TagOp};
use crate::engine::verbs::WcStatus;
use crate::engine::verbs::{Gid, QpInit};
use crate::engine::verbs::{Mtu, QpAttr, QpCaps, QpState, QpType, RecvWr, Remote, SendOp, SendWr, Sge, WcOpcode};
use crate::engine::{Device, DeviceConfig};
use crate::transport::headers::ip_to_gid;
use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

/// What the guard regions hold, and must still hold after every packet.
const PATTERN: u8 = 0xa5;
/// The QPN the fuzzer's side claims.
const PEER_QPN: u32 = 0x99;
/// Receives each QP keeps posted.
const RECVS: u64 = 16;
/// Packets one input packet may make the device send (replies, READ responses,
/// retransmissions): far above any rule, far below a runaway.
const MAX_OUT_PER_STEP: usize = 4096;
/// Tagged buffers the TM-SRQ keeps posted (tags 0..TM_TAGS under the mask 0xff).
const TM_TAGS: u64 = 8;
/// The first wr_id of the TM-SRQ's buffers.
const TM_IDS: u64 = 100_000;

struct Harness {
    dev: Device,
    cq: u32,
    qps: [u32; 3],
    up: [bool; 3],
    /// The XRC target, and the SRQ of its domain whose receives it completes.
    xrc: (u32, u32),
    xrc_up: bool,
    /// The QP on a tag-matching SRQ, that SRQ and its CQ.
    tm: (u32, u32, u32),
    tm_up: bool,
    /// Buffers given to the TM-SRQ so far (tagged or ordinary), the tagged ones, the
    /// receive completions seen per buffer, and the unexpected messages seen.
    tm_posted: u64,
    tm_tags: HashSet<u64>,
    tm_seen: HashMap<u64, u8>,
    tm_unexpected: u32,
    peer: Gid,
    stranger: Gid,
    rw: Mr,
    recv: Mr,
    guards: Vec<Mr>,
    posted_recvs: u64,
    recv_done: u64,
    sends: HashSet<u64>,
    now: u64,
}

impl Harness {
    fn new() -> Harness {
        let cc = crate::verbs::OpenConfig::new(Ipv4Addr::new(10, 0, 0, 1).into()).cc;
        let gid = ip_to_gid(Ipv4Addr::new(10, 0, 0, 1).into());
        let mut dev = Device::new(DeviceConfig { gid, seed: Some(7), max_qps: 8, max_mrs: 16, cc });
        let (pd, other) = (dev.alloc_pd(), dev.alloc_pd());
        let local_write = Access { local_write: true, ..Access::default() };
        let remote_read = Access { remote_read: true, ..Access::default() };
        let mut reg = |pd, len, access| dev.reg_mr(pd, len, access).expect("room for the regions");
        let (rw, recv) = (reg(pd, 64 << 10, Access::ALL), reg(pd, 64 << 10, local_write));
        let guards = vec![reg(pd, 4096, remote_read), reg(other, 4096, Access::ALL), reg(pd, 4096, local_write)];
        for g in &guards {
            g.mem.fill(0, g.mem.len(), PATTERN);
        }
        let cq = dev.create_cq(4096);
        let mut qps = [0; 3];
        for (i, qp_type) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
            let init = QpInit { xrc: None, qp_type, pd, send_cq: cq, recv_cq: cq, caps: QpCaps::default(), srq: None };
            qps[i] = dev.create_qp(init).expect("room for the QPs");
        }
        let xrc = xrc_target(&mut dev, pd, cq);
        let tm = tm_qp(&mut dev, pd);
        let peer = ip_to_gid(Ipv4Addr::new(10, 0, 0, 2).into());
        let stranger = ip_to_gid(Ipv4Addr::new(10, 0, 0, 3).into());
        let (posted_recvs, recv_done, sends) = (0, 0, HashSet::new());
        Harness {
            dev,
            cq,
            qps,
            up: [false; 3],
            xrc,
            xrc_up: false,
            tm,
            tm_up: false,
            tm_posted: 0,
            tm_tags: HashSet::new(),
            tm_seen: HashMap::new(),
            tm_unexpected: 0,
            peer,
            stranger,
            rw,
            recv,
            guards,
            posted_recvs,
            recv_done,
            sends,
            now: 0,
        }
    }

    /// Brings QP `i` to RTS expecting PSN `psn` first, with receives and (RC) one of each
    /// request outstanding.
    fn bring_up(&mut self, i: usize, psn: u32) {
        let st = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        let qpn = self.qps[i];
        let init = if i == 2 {
            QpAttr { qkey: Some(0x7777), ..st(QpState::Init) }
        } else {
            QpAttr { access: Some(Access::ALL), ..st(QpState::Init) }
        };
        let rtr = QpAttr {
            dest_gid: Some(self.peer),
            dest_qpn: Some(PEER_QPN),
            rq_psn: Some(psn),
            path_mtu: Some(Mtu::M1024),
            ..st(QpState::Rtr)
        };
        let rtr = match i {
            0 => QpAttr { max_dest_rd_atomic: Some(4), min_rnr_timer: Some(12), ..rtr },
            1 => rtr,
            _ => st(QpState::Rtr),
        };
        let rts = QpAttr { sq_psn: Some(0), ..st(QpState::Rts) };
        let rts = if i == 0 {
            QpAttr { timeout: Some(14), max_rd_atomic: Some(4), retry_cnt: Some(7), rnr_retry: Some(7), ..rts }
        } else {
            rts
        };
        for attr in [init, rtr, rts] {
            self.dev.modify_qp(qpn, &attr).expect("a valid transition");
        }
        if i == 2 {
            self.dev.attach_mcast(qpn, group()).expect("a UD QP joins the group");
        }
        self.up[i] = true;
        for _ in 0..RECVS {
            self.post_recv(qpn);
        }
        if i == 0 {
            self.post_requests(qpn);
        }
    }

    fn post_recv(&mut self, qpn: u32) {
        let slot = self.posted_recvs % 64;
        let sge = Sge { addr: self.recv.addr + slot * 1024, length: 1024, lkey: self.recv.lkey };
        let wr = RecvWr { wr_id: 1_000 + self.posted_recvs, sgl: vec![sge] };
        let posted =
            if qpn == self.xrc.0 { self.dev.post_srq_recv(self.xrc.1, wr) } else { self.dev.post_recv(qpn, wr) };
        if posted.is_ok() {
            self.posted_recvs += 1;
        }
    }

    /// An RC QP's RTR attributes towards the fuzzer's side, expecting PSN `psn` first.
    fn rc_rtr(&self, psn: u32) -> QpAttr {
        QpAttr {
            state: Some(QpState::Rtr),
            dest_gid: Some(self.peer),
            dest_qpn: Some(PEER_QPN),
            rq_psn: Some(psn),
            path_mtu: Some(Mtu::M1024),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(12),
            ..QpAttr::default()
        }
    }

    /// Brings the XRC target to RTR expecting PSN `psn` first, its SRQ stocked.
    fn bring_up_xrc(&mut self, psn: u32) {
        let st = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        let rtr = self.rc_rtr(psn);
        for attr in [QpAttr { access: Some(Access::ALL), ..st(QpState::Init) }, rtr] {
            self.dev.modify_qp(self.xrc.0, &attr).expect("a valid transition");
        }
        self.xrc_up = true;
        for _ in 0..RECVS {
            self.post_recv(self.xrc.0);
        }
    }

    fn post_requests(&mut self, qpn: u32) {
        let at = |off: u64, len| Sge { addr: self.rw.addr + off, length: len, lkey: self.rw.lkey };
        let remote = Remote { addr: 0x1000, rkey: 0x1234 };
        let wrs = [
            SendWr::new(1, SendOp::Send, vec![at(0, 3000)]),
            SendWr::new(2, SendOp::Write(remote), vec![at(0, 100)]),
            SendWr::new(3, SendOp::Read(remote), vec![at(4096, 4096)]),
            SendWr::new(4, SendOp::FetchAdd(remote, 1), vec![at(8192, 8)]),
        ];
        for wr in wrs {
            let id = wr.wr_id;
            if self.dev.post_send(qpn, wr).is_ok() {
                self.sends.insert(id);
            }
        }
    }

    /// One packet: `sel` picks the QP (or a stranger's source), a CE mark and whether
    /// time passes and timers fire.
    /// For the UD QP, a packet whose DestQP is 0xFFFFFF arrives as a multicast datagram
    /// to the group that QP joined.
    /// An XRC opcode (0xA0 and up) aimed at the UC QP goes to the XRC target instead.
    fn step(&mut self, sel: u8, bytes: &[u8]) {
        let i = usize::from(sel & 3);
        let mut pkt = bytes.to_vec();
        if i == 1 && pkt.len() >= 12 && pkt[0] >= 0xa0 {
            pkt[5..8].copy_from_slice(&self.xrc.0.to_be_bytes()[1..]);
            if !self.xrc_up {
                self.bring_up_xrc(u32::from_be_bytes([0, pkt[9], pkt[10], pkt[11]]));
            }
            return self.deliver(sel, &pkt, false);
        }
        // An RC opcode aimed at the UD QP goes to the QP on the tag-matching SRQ instead.
        if i == 2 && pkt.len() >= 12 && pkt[0] < 0x20 {
            pkt[5..8].copy_from_slice(&self.tm.0.to_be_bytes()[1..]);
            if !self.tm_up {
                self.bring_up_tm(u32::from_be_bytes([0, pkt[9], pkt[10], pkt[11]]));
            }
            return self.deliver(sel, &pkt, false);
        }
        let multicast = i == 2 && pkt.get(5..8) == Some(&[0xff; 3][..]);
        if i < 3 && pkt.len() >= 12 {
            if !multicast {
                pkt[5..8].copy_from_slice(&self.qps[i].to_be_bytes()[1..]);
            }
            if !self.up[i] {
                self.bring_up(i, u32::from_be_bytes([0, pkt[9], pkt[10], pkt[11]]));
            }
        }
        self.deliver(sel, &pkt, multicast);
    }

    fn deliver(&mut self, sel: u8, pkt: &[u8], multicast: bool) {
        let src = if sel & 3 == 3 { self.stranger } else { self.peer };
        self.now += u64::from(sel >> 4) * 1_000_000;
        if multicast {
            self.dev.handle_multicast(self.now, src, group(), sel & 4 != 0, pkt);
        } else {
            self.dev.handle_packet_ecn(self.now, src, sel & 4 != 0, pkt);
        }
        if sel & 8 != 0 {
            self.dev.handle_timeout(self.now);
        }
        self.check();
    }

    fn check(&mut self) {
        let mut out = 0;
        while self.dev.poll_transmit(self.now).is_some() {
            out += 1;
            assert!(out <= MAX_OUT_PER_STEP, "one packet made the device send more than {MAX_OUT_PER_STEP}");
        }
        for q in self.qps.into_iter().chain([self.xrc.0, self.tm.0]) {
            assert!(self.dev.qp_pending_replies(q) <= MAX_REPLIES, "reply queue beyond its limit");
        }
        for wc in self.dev.poll_cq(self.cq, usize::MAX) {
            if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                self.recv_done += 1;
                assert!(self.recv_done <= self.posted_recvs, "more receive completions than receives");
                let qpn = wc.qpn;
                self.post_recv(qpn);
            } else {
                assert!(self.sends.remove(&wc.wr_id), "send {} completed twice or never posted", wc.wr_id);
            }
        }
        self.check_tm();
        for g in &self.guards {
            assert!(g.mem.to_vec().iter().all(|b| *b == PATTERN), "a guard region changed");
        }
    }

    /// The TM-SRQ's completions: each for a buffer posted, a tagged one at most twice (its
    /// match, then its data), an ordinary one once; every finished buffer is replaced, and
    /// an unexpected message is reported back (SYNC), as an MPI library would.
    fn check_tm(&mut self) {
        for wc in self.dev.poll_cq(self.tm.2, usize::MAX) {
            let id = wc.wr_id;
            assert!((TM_IDS..TM_IDS + self.tm_posted).contains(&id), "TM completion {id} for nothing posted");
            let tagged = self.tm_tags.contains(&id);
            let seen = self.tm_seen.entry(id).or_insert(0);
            *seen += 1;
            assert!(*seen <= if tagged { 2 } else { 1 }, "TM buffer {id} completed {seen} times");
            let flags = wc.tm.map_or(0, |t| t.flags);
            let only_matched = flags == crate::engine::tm::WC_TM_MATCH && wc.status == WcStatus::Success;
            if tagged && !only_matched {
                self.add_tag(id % TM_TAGS);
            } else if !tagged {
                if wc.opcode == WcOpcode::TmRecv {
                    self.tm_unexpected = self.tm_unexpected.wrapping_add(1);
                    let sync = OpsWr { wr_id: 0, op: TagOp::Sync, unexpected_cnt: self.tm_unexpected, signaled: false };
                    let _ = self.dev.post_srq_op(self.tm.1, &sync);
                }
                self.post_tm_recv();
            }
        }
    }

    /// Brings the QP on the TM-SRQ to RTS expecting PSN `psn` first (its rendezvous READs
    /// go to the fuzzer's side), with tagged buffers and ordinary receives posted.
    fn bring_up_tm(&mut self, psn: u32) {
        let st = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        let rtr = self.rc_rtr(psn);
        let rts = QpAttr {
            sq_psn: Some(0),
            timeout: Some(14),
            max_rd_atomic: Some(4),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            ..st(QpState::Rts)
        };
        for attr in [QpAttr { access: Some(Access::ALL), ..st(QpState::Init) }, rtr, rts] {
            self.dev.modify_qp(self.tm.0, &attr).expect("a valid transition");
        }
        self.tm_up = true;
        for tag in 0..TM_TAGS {
            self.add_tag(tag);
        }
        for _ in 0..RECVS {
            self.post_tm_recv();
        }
    }

    /// The next TM buffer: 1 KiB of the receive region.
    fn tm_buffer(&mut self) -> RecvWr {
        let slot = self.tm_posted % 64;
        let sge = Sge { addr: self.recv.addr + slot * 1024, length: 1024, lkey: self.recv.lkey };
        RecvWr { wr_id: TM_IDS + self.tm_posted, sgl: vec![sge] }
    }

    fn add_tag(&mut self, tag: u64) {
        let recv = self.tm_buffer();
        let id = recv.wr_id;
        let op = OpsWr {
            wr_id: id,
            op: TagOp::Add { recv, tag, mask: 0xff },
            unexpected_cnt: self.tm_unexpected,
            signaled: false,
        };
        if self.dev.post_srq_op(self.tm.1, &op).is_ok() {
            self.tm_posted += 1;
            self.tm_tags.insert(id);
        }
    }

    fn post_tm_recv(&mut self) {
        let recv = self.tm_buffer();
        if self.dev.post_srq_recv(self.tm.1, recv).is_ok() {
            self.tm_posted += 1;
        }
    }
}

/// An RC QP on a tag-matching SRQ of `pd` that completes on a CQ of its own: (QP, SRQ, CQ).
fn tm_qp(dev: &mut Device, pd: crate::engine::mem::Pd) -> (u32, u32, u32) {
    let cq = dev.create_cq(4096);
    let srq = dev.create_tm_srq(RECVS as usize * 2, 1, cq, TM_TAGS as usize).expect("a TM-SRQ");
    let init = QpInit {
        xrc: None,
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        srq: Some(srq),
    };
    (dev.create_qp(init).expect("room for the TM QP"), srq, cq)
}

/// An XRC target in a domain of its own, with an SRQ of that domain in `pd` completing on
/// `cq` (numbered 1: the fuzzer may name it) and one of another domain (2), which
/// requests through the target must not reach.
fn xrc_target(dev: &mut Device, pd: crate::engine::mem::Pd, cq: u32) -> (u32, u32) {
    use crate::engine::srq::XrcSrq;
    let (domain, other) = (dev.alloc_xrcd(), dev.alloc_xrcd());
    let srq = dev.create_xrc_srq(XrcSrq { xrcd: domain, pd, cq }, RECVS as usize * 2, 1).expect("an XRC SRQ");
    dev.create_xrc_srq(XrcSrq { xrcd: other, pd, cq }, 4, 1).expect("another domain's SRQ");
    let xrc = Some(crate::engine::verbs::Xrc::Target { xrcd: domain });
    let init = QpInit { xrc, qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps: QpCaps::default(), srq: None };
    (dev.create_qp(init).expect("room for the XRC target"), srq)
}

/// The multicast group the UD QP joins.
fn group() -> Gid {
    ip_to_gid(Ipv4Addr::new(239, 0, 0, 7).into())
}

/// Input: records of [selector][length: u16 BE][packet: BTH .. ICRC].
pub fn roce_device(data: &[u8]) {
    run(data);
}

/// Runs the records of `data` through a fresh harness; the harness after them.
fn run(data: &[u8]) -> Harness {
    let mut h = Harness::new();
    let mut rest = data;
    while rest.len() >= 3 {
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        h.step(rest[0], &rest[3..3 + len]);
        rest = &rest[3 + len..];
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The corpus's XRC seed reaches the target: a SEND to the domain's SRQ completes
    /// there; a WRITE under an unknown key is refused and ends the target, so a SEND to
    /// another domain's SRQ after it is not taken either.
    #[test]
    fn the_xrc_seed_reaches_the_target_and_its_srq() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/roce_device/xrc-target-send-write-other-domain");
        let h = run(&std::fs::read(path).expect("the corpus seed"));
        assert_eq!(h.recv_done, 1, "the SEND completed from the XRC SRQ");
        assert_eq!(h.dev.qp_state(h.xrc.0), Some(QpState::Err), "the bad key ended the target");
    }

    /// The corpus's tag-matching seed reaches the QP on the TM-SRQ: the eager message lands
    /// in tag 3's buffer without its header, the unmatched and the no-tag messages in
    /// ordinary receives, and the rendezvous request is matched and its READ sent.
    #[test]
    fn the_tag_matching_seed_reaches_the_tm_srq() {
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/roce_device/tag-matching-eager-unexpected-rndv-notag");
        let h = run(&std::fs::read(path).expect("the corpus seed"));
        assert!(h.tm_up, "RC opcodes aimed at the UD QP go to the TM QP");
        let tag3 = TM_IDS + 3;
        assert_eq!(h.tm_seen.get(&tag3), Some(&1), "tag 3 matched once");
        let slot = 3 * 1024; // tag 3 was the fourth buffer posted: slot 3
        assert_eq!(h.recv.mem.to_vec()[slot..slot + 12], b"eager data!!"[..]);
        assert_eq!(h.tm_unexpected, 1, "tag 0xf0 found no buffer");
        let rndv = TM_IDS + 5;
        assert_eq!(h.tm_seen.get(&rndv), Some(&1), "the rendezvous matched; its data awaits the READ");
        assert_eq!(h.tm_seen.len(), 4, "eager, unexpected, rendezvous match, no-tag: {:?}", h.tm_seen);
    }
}
