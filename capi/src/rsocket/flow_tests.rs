//! Two flows joined by an in-order, lossless link (what an RC QP gives them), driven by
//! random sends, reads and deliveries: every byte read is the byte sent, in order, and
//! nothing is left stuck once both sides keep reading.

use super::flow::{ConnPeer, Credit, Flow, Sizes, Targets, MSG_SEND_FLAG};
use super::wire::{self, Op, Sge};
use proptest::prelude::*;
use std::collections::VecDeque;

const RBUF_BASE: u64 = 0x1000_0000;
const TARGETS_BASE: u64 = 0x2000_0000;

struct Mem([Sge; 2]);

impl Targets for Mem {
    fn get(&self, i: usize) -> Sge {
        self.0[i]
    }
    fn set(&mut self, i: usize, s: Sge) {
        self.0[i] = s;
    }
}

/// What travels from one side to the other, in order.
enum Op2 {
    /// A WRITE (with the message as immediate data unless `msg_send`), and its wr_id.
    Write { addr: u64, bytes: Vec<u8>, imm: Option<u32>, wr_id: u64 },
    /// A SEND of a message (iWARP), and its wr_id.
    Send { msg: u32, wr_id: u64 },
}

struct Side {
    flow: Flow,
    targets: Mem,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    out: VecDeque<Op2>,
    sent: Vec<u8>,
    read: Vec<u8>,
}

fn sizes() -> Sizes {
    Sizes { sq_size: 16, rq_size: 16, sbuf_size: 8192, rbuf_size: 8192 }
}

fn conn(s: Sizes) -> ConnPeer {
    let half = s.rbuf_size >> 1;
    ConnPeer {
        credits: s.rq_size,
        target_sgl: Sge { addr: TARGETS_BASE, key: 2, length: 2 },
        data_buf: Sge { addr: RBUF_BASE, key: 1, length: half },
        big_endian: false,
    }
}

impl Side {
    fn new(msg_send: bool) -> Side {
        let s = sizes();
        let mut targets = Mem([Sge::default(); 2]);
        let flow = Flow::new(s, msg_send, &conn(s), &mut targets);
        Side {
            flow,
            targets,
            sbuf: vec![0; s.sbuf_size as usize],
            rbuf: vec![0; s.rbuf_size as usize],
            out: VecDeque::new(),
            sent: Vec::new(),
            read: Vec::new(),
        }
    }

    fn post(&mut self, addr: u64, bytes: Vec<u8>, msg: u32) {
        let wr_id = Flow::send_wr_id(msg, false);
        if self.flow.msg_send {
            self.out.push_back(Op2::Write { addr, bytes, imm: None, wr_id });
            let (op, _) = wire::parse_msg(msg);
            self.out.push_back(Op2::Send { msg, wr_id: Flow::send_wr_id(wire::msg(op, 0), true) });
        } else {
            self.out.push_back(Op2::Write { addr, bytes, imm: Some(msg), wr_id });
        }
    }

    /// Sends as much of `data` as the flow allows now; returns how much.
    fn send(&mut self, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() {
            let Some(w) = self.flow.next_write((data.len() - done) as u32, &mut self.targets) else { break };
            let mut bytes = Vec::new();
            for (off, len) in w.local {
                let (off, len) = (off as usize, len as usize);
                self.sbuf[off..off + len].copy_from_slice(&data[done + bytes.len()..done + bytes.len() + len]);
                bytes.extend_from_slice(&self.sbuf[off..off + len]);
            }
            done += bytes.len();
            self.post(w.remote_addr, bytes, w.imm);
        }
        self.sent.extend_from_slice(&data[..done]);
        done
    }

    fn read(&mut self, want: usize) {
        for (off, len) in self.flow.take(want, false) {
            self.read.extend_from_slice(&self.rbuf[off as usize..(off + len) as usize]);
        }
    }

    fn give_credits(&mut self) {
        while let Some(c) = self.flow.credits_due() {
            match c {
                Credit::Grant { rbuf_offset, len, slot, imm } => {
                    let sge = Sge { addr: RBUF_BASE + u64::from(rbuf_offset), key: 1, length: len };
                    let (addr, _) = self.flow.remote_slot(slot);
                    self.post(addr, sge.to_bytes(false).to_vec(), imm);
                }
                Credit::Msg(imm) => self.post(0, Vec::new(), imm),
            }
        }
    }
}

/// Delivers `from`'s oldest operation to `to` and completes it at `from`.
fn deliver(from: &mut Side, to: &mut Side) -> bool {
    let Some(op) = from.out.pop_front() else { return false };
    let (msg, wr_id) = match op {
        Op2::Write { addr, bytes, imm, wr_id } => {
            if addr >= TARGETS_BASE {
                let slot = ((addr - TARGETS_BASE) / 16) as usize;
                let b: [u8; 16] = bytes.as_slice().try_into().expect("an SGE");
                to.targets.0[slot] = Sge::from_bytes(&b);
            } else if !bytes.is_empty() {
                let off = (addr - RBUF_BASE) as usize;
                to.rbuf[off..off + bytes.len()].copy_from_slice(&bytes);
            }
            (imm, wr_id)
        }
        Op2::Send { msg, wr_id } => (Some(msg), wr_id),
    };
    if let Some(m) = msg {
        to.flow.received(m).expect("a well-behaved peer");
    }
    from.flow.send_done(wr_id, true);
    true
}

#[derive(Debug, Clone)]
enum Step {
    Send(bool, usize),
    Read(bool, usize),
    Deliver(bool, usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (any::<bool>(), 1usize..20_000).prop_map(|(a, n)| Step::Send(a, n)),
        (any::<bool>(), 1usize..20_000).prop_map(|(a, n)| Step::Read(a, n)),
        (any::<bool>(), 1usize..8).prop_map(|(a, n)| Step::Deliver(a, n)),
    ]
}

fn pair<'a>(a: &'a mut Side, b: &'a mut Side, a_first: bool) -> (&'a mut Side, &'a mut Side) {
    if a_first {
        (a, b)
    } else {
        (b, a)
    }
}

fn pattern(start: usize, n: usize) -> Vec<u8> {
    (start..start + n).map(|i| (i * 7 + i / 251) as u8).collect()
}

proptest! {
    #[test]
    fn bytes_arrive_whole_and_in_order(msg_send in any::<bool>(), steps in proptest::collection::vec(step(), 1..200)) {
        let (mut a, mut b) = (Side::new(msg_send), Side::new(msg_send));
        for s in steps {
            match s {
                Step::Send(x, n) => {
                    let (me, _) = pair(&mut a, &mut b, x);
                    let data = pattern(me.sent.len(), n);
                    me.send(&data);
                }
                Step::Read(x, n) => {
                    let (me, _) = pair(&mut a, &mut b, x);
                    me.read(n);
                    me.give_credits();
                }
                Step::Deliver(x, n) => {
                    let (me, peer) = pair(&mut a, &mut b, x);
                    for _ in 0..n {
                        deliver(me, peer);
                    }
                }
            }
        }
        // Both sides keep reading until nothing moves: everything sent arrives.
        for _ in 0..10_000 {
            let mut moved = deliver(&mut a, &mut b) | deliver(&mut b, &mut a);
            for me in [&mut a, &mut b] {
                let before = me.read.len();
                me.read(usize::MAX);
                me.give_credits();
                moved |= me.read.len() != before || !me.out.is_empty();
            }
            if !moved {
                break;
            }
        }
        prop_assert_eq!(&b.read, &a.sent);
        prop_assert_eq!(&a.read, &b.sent);
        prop_assert!(a.flow.all_sends_done() && b.flow.all_sends_done());
        // Once drained, each side can send again.
        prop_assert!(a.flow.can_send(&a.targets) && b.flow.can_send(&b.targets));
    }
}

#[test]
fn a_peer_ignoring_its_credits_is_refused_at_the_limit() {
    let mut a = Side::new(false);
    let rq = usize::from(sizes().rq_size);
    for _ in 0..=rq {
        a.flow.received(wire::msg(Op::Data, 1)).expect("within the receive queue");
    }
    assert_eq!(a.flow.received(wire::msg(Op::Data, 1)), Err(super::flow::PeerError::TooManyMessages));
    assert_eq!(a.flow.received(wire::msg(Op::Data, 4097)), Err(super::flow::PeerError::DataTooLong));
    assert_eq!(a.flow.received(wire::msg(Op::Reserved(1), 0)), Err(super::flow::PeerError::UnknownOp));
}

#[test]
fn shutdown_and_disconnect_end_the_directions() {
    let mut a = Side::new(false);
    a.flow.received(wire::msg(Op::Ctrl, wire::CTRL_SHUTDOWN)).unwrap();
    assert!(!a.flow.readable && a.flow.writable && a.flow.connected);
    a.flow.received(wire::msg(Op::Ctrl, wire::CTRL_DISCONNECT)).unwrap();
    assert!(!a.flow.connected && !a.flow.writable);
    assert_eq!(MSG_SEND_FLAG, 1 << 62);
}

proptest! {
    /// Whatever a hostile peer sends (any message, any target entries), the flow never
    /// panics, hands out only ranges inside its buffers, and refuses before it queues more
    /// than its receive queue holds.
    #[test]
    fn a_hostile_peer_cannot_push_the_flow_outside_its_buffers(
        msgs in proptest::collection::vec((any::<u32>(), 0usize..100_000, any::<u64>(), any::<u32>()), 1..300),
    ) {
        let mut a = Side::new(false);
        let s = sizes();
        for (m, want, addr, len) in msgs {
            if a.flow.received(m).is_err() {
                break;
            }
            for (off, n) in a.flow.take(want, want % 3 == 0) {
                prop_assert!(u64::from(off) + u64::from(n) <= u64::from(s.rbuf_size), "{off}+{n}");
            }
            a.targets.0[(addr % 2) as usize] = Sge { addr, key: 7, length: len };
            if let Some(w) = a.flow.next_write((want % 70_000) as u32, &mut a.targets) {
                for (off, n) in w.local {
                    prop_assert!(u64::from(off) + u64::from(n) <= u64::from(s.sbuf_size), "{off}+{n}");
                }
                a.flow.send_done(Flow::send_wr_id(w.imm, false), true);
            }
            let _ = a.flow.credits_due();
        }
    }
}
