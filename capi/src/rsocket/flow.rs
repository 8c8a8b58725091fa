//! A stream rsocket's flow, sans-I/O: which bytes may go where, and what the peer's
//! messages mean. The caller posts what it returns and reports completions; buffers live in
//! the caller's registered memory and are named here by offset.
//!
//! The scheme is librdmacm's (rsocket.c, rdma-core 44), which softrdma must speak on the
//! wire: each side's receive buffer is granted to the peer in halves through its target
//! list; data goes by RDMA WRITE into the granted half with its length in the immediate
//! data; a message costs the receiver one posted receive, which it gives back as a credit
//! (a sequence limit) when the application has read the message.

use super::wire::{self, Op, Sge, SGL_SIZE};
use std::collections::VecDeque;

/// Bytes below which a sender waits for room rather than sending (`RS_SNDLOWAT`).
pub const SNDLOWAT: u32 = 2048;
/// The first transfer of a large send; each next one doubles, up to [`MAX_TRANSFER`].
pub const OLAP_START: u32 = 2048;
/// The largest single transfer.
pub const MAX_TRANSFER: u32 = 65536;
/// The next transfer of a large send may be twice as long, up to [`MAX_TRANSFER`].
pub fn ramp_up(olen: &mut u32) {
    if *olen < MAX_TRANSFER {
        *olen <<= 1;
    }
}

/// Control messages in flight at once (`RS_QP_CTRL_SIZE`).
pub const CTRL_SLOTS: u32 = 4;

/// The target list, which the peer writes into (RDMA WRITE) and this side reads and
/// advances: the caller's registered memory, read afresh each time.
pub trait Targets {
    /// Entry `i` as it is now.
    fn get(&self, i: usize) -> Sge;
    /// Overwrites entry `i`.
    fn set(&mut self, i: usize, s: Sge);
}

/// What the peer did wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerError {
    /// More messages than receives it was granted (its credits ignored).
    TooManyMessages,
    /// A data message longer than half the receive buffer, which no grant allows.
    DataTooLong,
    /// An operation rsockets does not define.
    UnknownOp,
}

/// One data transfer: the caller copies the application's bytes into `local` (offsets and
/// lengths in its send buffer, a second one when the ring wraps) and writes them to
/// `remote`, with `imm` as the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataWrite {
    /// Ranges of the send buffer, in order; the second has length 0 if unused.
    pub local: [(u32, u32); 2],
    /// Where in the peer's receive buffer.
    pub remote_addr: u64,
    /// Its key.
    pub rkey: u32,
    /// The message (Data and the length).
    pub imm: u32,
}

impl DataWrite {
    /// Bytes in the transfer.
    pub fn bytes(&self) -> u32 {
        self.local[0].1 + self.local[1].1
    }
}

/// Credits to give back: with new receive space (the half of the buffer at `rbuf_offset`,
/// written as an SGE into the peer's target list entry `slot`) or without.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credit {
    /// Write the SGE of `rbuf_offset..+len` to the peer's target entry `slot`, then `imm`.
    Grant {
        /// Offset of the half in this side's receive buffer.
        rbuf_offset: u32,
        /// Its length.
        len: u32,
        /// The peer's target list entry.
        slot: usize,
        /// The message.
        imm: u32,
    },
    /// Only `imm` (a zero-length write with immediate, or a SEND on iWARP).
    Msg(u32),
}

/// A stream's state after connection.
#[derive(Debug)]
pub struct Flow {
    /// iWARP: messages go as SENDs beside the WRITEs, each WRITE costing two send WRs.
    pub msg_send: bool,
    sq_size: u32,
    rq_size: u16,
    rbuf_size: u32,
    sbuf_size: u32,
    // Send side.
    sseq_no: u16,
    sseq_comp: u16,
    sqe_avail: i64,
    sbuf_bytes_avail: u32,
    sbuf_head: u32,
    target_sge: usize,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    /// The peer's target list: entries and where.
    remote_sgl: Sge,
    remote_sge: usize,
    // Receive side.
    rseq_no: u16,
    rseq_comp: u16,
    rmsg: VecDeque<u32>,
    rbuf_offset: u32,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    /// The peer can still send.
    pub readable: bool,
    /// This side can still send.
    pub writable: bool,
    /// The connection is up (neither side disconnected, no error).
    pub connected: bool,
}

/// Sizes one side chose.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Send queue depth.
    pub sq_size: u16,
    /// Receive queue depth (= initial credits given).
    pub rq_size: u16,
    /// Send buffer bytes.
    pub sbuf_size: u32,
    /// Receive buffer bytes (granted in halves).
    pub rbuf_size: u32,
}

impl Flow {
    /// A connected flow with `sizes`, after the peer's connection data `peer`. The target
    /// list's other entry (zeroed when it was made) is left alone: the peer's first grant
    /// may already be in it.
    pub fn new(sizes: Sizes, msg_send: bool, peer: &ConnPeer, targets: &mut impl Targets) -> Flow {
        targets.set(0, peer.data_buf);
        Flow {
            msg_send,
            sq_size: u32::from(sizes.sq_size),
            rq_size: sizes.rq_size,
            rbuf_size: sizes.rbuf_size,
            sbuf_size: sizes.sbuf_size,
            sseq_no: 0,
            sseq_comp: peer.credits,
            sqe_avail: i64::from(sizes.sq_size) - i64::from(CTRL_SLOTS),
            sbuf_bytes_avail: sizes.sbuf_size,
            sbuf_head: 0,
            target_sge: 0,
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SLOTS,
            remote_sgl: peer.target_sgl,
            remote_sge: 1,
            rseq_no: 0,
            rseq_comp: sizes.rq_size >> 1,
            rmsg: VecDeque::with_capacity(usize::from(sizes.rq_size) + 1),
            rbuf_offset: 0,
            rbuf_bytes_avail: sizes.rbuf_size >> 1,
            rbuf_free_offset: sizes.rbuf_size >> 1,
            readable: true,
            writable: true,
            connected: true,
        }
    }

    /// Room to send a message now (rs_can_send).
    pub fn can_send(&self, t: &impl Targets) -> bool {
        let wrs = if self.msg_send { 2 } else { 1 };
        self.sqe_avail >= wrs
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && t.get(self.target_sge).length != 0
    }

    /// The next transfer of at most `want` bytes (`olen`: the transfer-size ramp), or
    /// `None` when there is no room ([`Flow::can_send`]).
    pub fn next_write(&mut self, want: u32, t: &mut impl Targets) -> Option<DataWrite> {
        if !self.can_send(t) || want == 0 {
            return None;
        }
        let mut target = t.get(self.target_sge);
        let len = want.min(self.sbuf_bytes_avail).min(target.length);
        let local = self.take_sbuf(len);
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= if self.msg_send { 2 } else { 1 };
        let (remote_addr, rkey) = (target.addr, target.key);
        target.addr = target.addr.wrapping_add(u64::from(len));
        target.length -= len;
        t.set(self.target_sge, target);
        if target.length == 0 {
            self.target_sge = (self.target_sge + 1) % SGL_SIZE;
        }
        Some(DataWrite { local, remote_addr, rkey, imm: wire::msg(Op::Data, len) })
    }

    /// `len` bytes (at most what is free) of the send ring, as one or two ranges.
    fn take_sbuf(&mut self, len: u32) -> [(u32, u32); 2] {
        let to_end = self.sbuf_size - self.sbuf_head;
        let first = (self.sbuf_head, len.min(to_end));
        self.sbuf_head = (self.sbuf_head + len) % self.sbuf_size;
        self.sbuf_bytes_avail -= len;
        [first, (0, len - first.1)]
    }

    /// Room for an iomap entry to the peer (`rs_send_iomaps`): the send-ring ranges its
    /// 24 bytes go in; it costs a message like data.
    pub fn next_iomap_write(&mut self, t: &impl Targets) -> Option<[(u32, u32); 2]> {
        if !self.can_send(t) {
            return None;
        }
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= if self.msg_send { 2 } else { 1 };
        Some(self.take_sbuf(wire::IOMAP_LEN as u32))
    }

    /// Room for a direct write (`riowrite`) of at most `want` bytes into a mapping with
    /// `room` bytes left: the send-ring ranges. It costs a send slot and ring space but
    /// no message (the peer is not told).
    pub fn next_direct_write(&mut self, want: u32, room: u64, t: &impl Targets) -> Option<[(u32, u32); 2]> {
        if !self.can_send(t) || want == 0 || room == 0 {
            return None;
        }
        let len = u64::from(want.min(self.sbuf_bytes_avail)).min(room) as u32;
        self.sqe_avail -= 1;
        Some(self.take_sbuf(len))
    }

    /// A send work request completed: `wr_id` as [`Flow::send_wr_id`] made it.
    pub fn send_done(&mut self, wr_id: u64, ok: bool) {
        let (op, data) = wire::parse_msg(wr_id as u32);
        let trailing_send = wr_id & MSG_SEND_FLAG != 0;
        match op {
            Op::Sgl => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
            Op::Ctrl => {
                self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                if data == wire::CTRL_DISCONNECT {
                    self.end();
                }
            }
            Op::IomapSgl => {
                self.sqe_avail += 1;
                if !trailing_send {
                    self.sbuf_bytes_avail = (self.sbuf_bytes_avail + wire::IOMAP_LEN as u32).min(self.sbuf_size);
                }
            }
            _ => {
                self.sqe_avail += 1;
                if !trailing_send {
                    self.sbuf_bytes_avail = (self.sbuf_bytes_avail + data).min(self.sbuf_size);
                }
            }
        }
        if !ok {
            self.end();
        }
    }

    /// The connection is over: nothing more goes either way.
    pub fn end(&mut self) {
        self.connected = false;
        self.readable = false;
        self.writable = false;
    }

    /// A message from the peer (a receive completed). `Err` is the peer's fault: the
    /// caller ends the connection.
    pub fn received(&mut self, m: u32) -> Result<(), PeerError> {
        let (op, data) = wire::parse_msg(m);
        match op {
            Op::Sgl => self.sseq_comp = data as u16,
            // An iomap entry was written: only a notice (librdmacm's too), as is a direct
            // write's operation, which a peer never sends.
            Op::IomapSgl | Op::Write => {}
            Op::Ctrl if data == wire::CTRL_DISCONNECT => self.end(),
            Op::Ctrl if data == wire::CTRL_SHUTDOWN => {
                if self.writable {
                    self.readable = false;
                } else {
                    self.end();
                }
            }
            Op::Ctrl => {}
            Op::Data => {
                // Granted space is half the buffer at a time; the sender's credits are
                // the receives posted, which this queue holds one more than.
                if data > self.rbuf_size >> 1 {
                    return Err(PeerError::DataTooLong);
                }
                if self.rmsg.len() > usize::from(self.rq_size) {
                    return Err(PeerError::TooManyMessages);
                }
                self.rmsg.push_back(data);
            }
            Op::Reserved(_) => return Err(PeerError::UnknownOp),
        }
        Ok(())
    }

    /// Bytes received and not yet read.
    pub fn has_data(&self) -> bool {
        !self.rmsg.is_empty()
    }

    /// Takes up to `want` bytes: the ranges of the receive buffer to copy out, in order
    /// (at most two per message, when a message wraps). `peek` leaves them unread.
    pub fn take(&mut self, want: usize, peek: bool) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let (mut left, mut offset) = (want, self.rbuf_offset);
        let mut i = 0;
        while left > 0 && i < self.rmsg.len() {
            let msg = self.rmsg[i];
            let n = (msg as usize).min(left) as u32;
            let to_end = self.rbuf_size - offset;
            out.push((offset, n.min(to_end)));
            if n > to_end {
                out.push((0, n - to_end));
            }
            offset = (offset + n) % self.rbuf_size;
            left -= n as usize;
            if peek {
                i += 1;
                continue;
            }
            self.rbuf_bytes_avail += n;
            if n == msg {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            } else {
                self.rmsg[0] = msg - n;
            }
        }
        if !peek {
            self.rbuf_offset = offset;
        }
        out
    }

    fn ctrl_avail(&self, n: u32) -> bool {
        (self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) as i32) >= n as i32
    }

    /// Credits (and space) to give the peer now, if it is time (rs_give_credits).
    pub fn credits_due(&mut self) -> Option<Credit> {
        let half = self.rbuf_size >> 1;
        let space = self.rbuf_bytes_avail >= half;
        let seq = (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0;
        let slots = if self.msg_send { 2 } else { 1 };
        if !(space || seq) || !self.ctrl_avail(slots) || !self.connected {
            return None;
        }
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let imm = wire::msg(Op::Sgl, u32::from(self.rseq_no.wrapping_add(self.rq_size)));
        if !space {
            return Some(Credit::Msg(imm));
        }
        if self.msg_send {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        }
        let grant = Credit::Grant { rbuf_offset: self.rbuf_free_offset, len: half, slot: self.remote_sge, imm };
        self.rbuf_bytes_avail -= half;
        self.rbuf_free_offset = (self.rbuf_free_offset + half) % self.rbuf_size;
        self.remote_sge = (self.remote_sge + 1) % (self.remote_sgl.length.clamp(1, SGL_SIZE as u32) as usize);
        Some(grant)
    }

    /// Where the peer's target entry `slot` is, and its key.
    pub fn remote_slot(&self, slot: usize) -> (u64, u32) {
        (self.remote_sgl.addr.wrapping_add((slot * wire::SGE_LEN) as u64), self.remote_sgl.key)
    }

    /// A control message to send now (shutdown, disconnect), if a slot is free.
    pub fn ctrl(&mut self, what: u32) -> Option<u32> {
        if !self.ctrl_avail(1) || !self.connected {
            return None;
        }
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        Some(wire::msg(Op::Ctrl, what))
    }

    /// Whether a control slot is free (or the connection is gone, when none is needed).
    pub fn can_send_ctrl(&self) -> bool {
        self.ctrl_avail(1) || !self.connected
    }

    /// Every send posted has completed (or the connection is gone).
    pub fn all_sends_done(&self) -> bool {
        let ctrl_idle = i64::from(self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) as i32);
        ctrl_idle + self.sqe_avail == i64::from(self.sq_size) || !self.connected
    }

    /// The send work request id of message `m`; `trailing` for the SEND that follows a
    /// WRITE on iWARP (its completion returns a send slot, not buffer space).
    pub fn send_wr_id(m: u32, trailing: bool) -> u64 {
        u64::from(m) | if trailing { MSG_SEND_FLAG } else { 0 }
    }
}

/// Marks a receive work request (`RS_WR_ID_FLAG_RECV`).
pub const RECV_FLAG: u64 = 1 << 63;
/// Marks the SEND of an iWARP message pair (`RS_WR_ID_FLAG_MSG_SEND`).
pub const MSG_SEND_FLAG: u64 = 1 << 62;

/// What a flow keeps of the peer's connection data.
#[derive(Debug, Clone, Copy)]
pub struct ConnPeer {
    /// Its credits: receives posted.
    pub credits: u16,
    /// Its target list.
    pub target_sgl: Sge,
    /// The first half of its receive buffer.
    pub data_buf: Sge,
    /// It is big-endian: SGL updates to it are written in network order.
    pub big_endian: bool,
}

impl From<&wire::ConnData> for ConnPeer {
    fn from(c: &wire::ConnData) -> ConnPeer {
        ConnPeer {
            credits: c.credits,
            target_sgl: c.target_sgl,
            data_buf: c.data_buf,
            big_endian: c.flags & wire::FLAG_NET != 0,
        }
    }
}
