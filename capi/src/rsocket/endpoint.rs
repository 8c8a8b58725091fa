//! A stream rsocket's RDMA resources: the CQ and its completion channel, the QP (made
//! through rdma_cm), and the three registered buffers librdmacm's scheme needs (send ring,
//! receive ring, target list), driven through this library's own verbs as an application
//! drives them. [`super::flow::Flow`] decides; this posts and polls.

use super::completions::{destroy_qp_and_regions, errno, Completions};
use super::flow::{self, Credit, DataWrite, Flow, Sizes, Targets, CTRL_SLOTS, RECV_FLAG};
use super::wire::{self, ConnData, Iomap, Sge, IOMAP_LEN, SGE_LEN, SGL_SIZE};
use crate::ffi;
use libc::c_int;
use std::ptr::null_mut;

/// Bytes of a message carried by a SEND (iWARP).
const MSG_BYTES: usize = 4;

/// Memory the peer may write while this side runs: never seen through a Rust reference.
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
}

impl Region {
    pub(crate) fn zeroed(len: usize) -> Region {
        let b: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        Region { len, ptr: Box::into_raw(b).cast() }
    }

    /// Registers the region on `pd` with `access`.
    pub(crate) fn register(&self, pd: *mut ffi::ibv_pd, access: c_int) -> Result<*mut ffi::ibv_mr, c_int> {
        // SAFETY: the region lives as long as its owner, which deregisters first.
        let mr = unsafe { crate::objects::ibv_reg_mr(pd, self.ptr.cast(), self.len, access) };
        if mr.is_null() {
            return Err(errno());
        }
        Ok(mr)
    }

    pub(crate) fn addr(&self, offset: u32) -> u64 {
        self.ptr as u64 + u64::from(offset)
    }

    /// Copies `out.len()` bytes from `offset` (in bounds: the flow's ranges are).
    pub(crate) fn read(&self, offset: u32, out: &mut [u8]) {
        let end = (offset as usize).saturating_add(out.len());
        assert!(end <= self.len, "a range outside the region");
        // SAFETY: in bounds (checked); the region outlives the call; bytes only.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset as usize), out.as_mut_ptr(), out.len()) };
    }

    pub(crate) fn write(&self, offset: u32, data: &[u8]) {
        let end = (offset as usize).saturating_add(data.len());
        assert!(end <= self.len, "a range outside the region");
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset as usize), data.len()) };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw of a boxed slice of `len` bytes in `zeroed`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// The target list in registered memory, written by the peer's RDMA WRITEs: read fresh.
struct TargetMem<'a>(&'a Region);

impl Targets for TargetMem<'_> {
    fn get(&self, i: usize) -> Sge {
        let mut b = [0u8; SGE_LEN];
        let at = (i * SGE_LEN) as u32;
        // SAFETY: entry i < SGL_SIZE of a region of SGL_SIZE entries; a volatile read,
        // since the peer's WRITE changes it behind the compiler's back.
        for (k, byte) in b.iter_mut().enumerate() {
            *byte = unsafe { std::ptr::read_volatile(self.0.ptr.add(at as usize + k)) };
        }
        Sge::from_bytes(&b)
    }

    fn set(&mut self, i: usize, s: Sge) {
        self.0.write((i * SGE_LEN) as u32, &s.to_bytes(false));
    }
}

/// The resources of one connection, and its flow once connected.
pub(crate) struct Endpoint {
    pub(crate) id: *mut ffi::rdma_cm_id,
    pub(crate) comp: Completions,
    pub(crate) sizes: Sizes,
    pub(crate) msg_send: bool,
    sbuf: Region,
    rbuf: Region,
    targets: Region,
    mrs: [*mut ffi::ibv_mr; 3],
    pub(crate) flow: Option<Flow>,
    peer_big_endian: bool,
    /// Entries of this side's iomap list (after the target list), which the peer fills.
    iomap_entries: usize,
    /// The peer's iomap list: where, its key, how many entries.
    pub(crate) remote_iomap: (u64, u32, usize),
    rbuf_msg_index: u32,
    msg_slot: u32,
    ctrl_slot: u32,
    /// Why the connection ended on a peer's or a transport's fault (errno).
    pub(crate) fault: Option<c_int>,
}

// SAFETY: the raw pointers name this library's objects, which are used from any thread
// (the C API's rule); an endpoint is only reached under its socket's lock.
unsafe impl Send for Endpoint {}

impl Endpoint {
    /// Makes the CQ, QP and buffers of `id` (address and route resolved, or a request's
    /// id) and posts the receives.
    ///
    /// # Safety
    /// `id` is a live rdma_cm id bound to a device.
    pub(crate) unsafe fn create(
        id: *mut ffi::rdma_cm_id,
        sizes: Sizes,
        inline: u32,
        iomap_entries: usize,
    ) -> Result<Endpoint, c_int> {
        // SAFETY: the caller's contract: a bound id has its context.
        let ctx = unsafe { (*id).verbs };
        // SAFETY: an open context's device.
        let msg_send = unsafe { (*(*ctx).device).transport_type } == ffi::IBV_TRANSPORT_IWARP;
        let cqe = c_int::from(sizes.sq_size) + c_int::from(sizes.rq_size);
        // SAFETY: an open context.
        let comp = unsafe { Completions::create(ctx, cqe)? };
        let mut ep = Endpoint {
            id,
            comp,
            sizes,
            msg_send,
            sbuf: Region::zeroed(
                sizes.sbuf_size as usize + CTRL_SLOTS as usize * SGE_LEN + usize::from(sizes.sq_size) * MSG_BYTES,
            ),
            rbuf: Region::zeroed(sizes.rbuf_size as usize + usize::from(sizes.rq_size) * MSG_BYTES),
            targets: Region::zeroed(SGL_SIZE * SGE_LEN + iomap_entries * IOMAP_LEN),
            mrs: [null_mut(); 3],
            flow: None,
            peer_big_endian: false,
            iomap_entries,
            remote_iomap: (0, 0, 0),
            rbuf_msg_index: 0,
            msg_slot: 0,
            ctrl_slot: 0,
            fault: None,
        };
        // SAFETY: the endpoint's own live objects.
        unsafe { ep.create_qp(inline)? };
        ep.register()?;
        for _ in 0..sizes.rq_size {
            ep.post_recv()?;
        }
        ep.comp.arm();
        Ok(ep)
    }

    /// # Safety
    /// `self.id` is live.
    unsafe fn create_qp(&mut self, inline: u32) -> Result<(), c_int> {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = self.comp.cq;
        attr.recv_cq = self.comp.cq;
        attr.qp_type = ffi::IBV_QPT_RC;
        attr.sq_sig_all = 1;
        attr.cap.max_send_wr = u32::from(self.sizes.sq_size);
        attr.cap.max_recv_wr = u32::from(self.sizes.rq_size);
        attr.cap.max_send_sge = 2;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = inline;
        // SAFETY: a live id; the id's own PD is used (NULL).
        if unsafe { crate::cm::rdma_create_qp(self.id, null_mut(), &mut attr) } != 0 {
            return Err(errno());
        }
        Ok(())
    }

    fn register(&mut self) -> Result<(), c_int> {
        // SAFETY: a live id with a QP has its PD.
        let pd = unsafe { (*self.id).pd };
        let local = ffi::IBV_ACCESS_LOCAL_WRITE as c_int;
        let remote = local | ffi::IBV_ACCESS_REMOTE_WRITE as c_int;
        for (i, (r, access)) in
            [(&self.sbuf, local), (&self.rbuf, remote), (&self.targets, remote)].into_iter().enumerate()
        {
            self.mrs[i] = r.register(pd, access)?;
        }
        Ok(())
    }

    fn lkey(&self, i: usize) -> u32 {
        // SAFETY: registered in `register`, deregistered only in drop.
        unsafe { (*self.mrs[i]).lkey }
    }

    fn rkey(&self, i: usize) -> u32 {
        // SAFETY: as in `lkey`.
        unsafe { (*self.mrs[i]).rkey }
    }

    /// This side's connection data.
    pub(crate) fn conn_data(&self) -> ConnData {
        ConnData {
            version: wire::VERSION,
            flags: wire::FLAG_IOMAP,
            credits: self.sizes.rq_size,
            target_iomap_size: wire::value_to_scale(self.iomap_entries as u32),
            target_sgl: Sge { addr: self.targets.addr(0), key: self.rkey(2), length: SGL_SIZE as u32 },
            data_buf: Sge { addr: self.rbuf.addr(0), key: self.rkey(1), length: self.sizes.rbuf_size >> 1 },
        }
    }

    /// Connected: the flow starts from the peer's connection data.
    pub(crate) fn connected(&mut self, peer: &ConnData) {
        if peer.flags & wire::FLAG_IOMAP != 0 {
            // Its iomap list follows its target list, under the same key.
            let t = peer.target_sgl;
            let at = t.addr.wrapping_add(u64::from(t.length) * SGE_LEN as u64);
            self.remote_iomap = (at, t.key, wire::scale_to_value(peer.target_iomap_size) as usize);
        }
        let peer = flow::ConnPeer::from(peer);
        self.peer_big_endian = peer.big_endian;
        let mut t = TargetMem(&self.targets);
        self.flow = Some(Flow::new(self.sizes, self.msg_send, &peer, &mut t));
    }

    /// Room to send a message now.
    pub(crate) fn can_send(&self) -> bool {
        self.flow.as_ref().is_some_and(|f| f.can_send(&TargetMem(&self.targets)))
    }

    fn qp(&self) -> *mut ffi::ibv_qp {
        // SAFETY: a live id.
        unsafe { (*self.id).qp }
    }

    fn post_recv(&mut self) -> Result<(), c_int> {
        // SAFETY: plain C data; all-zero is valid.
        let mut wr: ffi::ibv_recv_wr = unsafe { std::mem::zeroed() };
        let i = self.rbuf_msg_index;
        let mut sge = ffi::ibv_sge {
            addr: self.rbuf.addr(self.sizes.rbuf_size + i * MSG_BYTES as u32),
            length: MSG_BYTES as u32,
            lkey: self.lkey(1),
        };
        wr.wr_id = RECV_FLAG;
        if self.msg_send {
            wr.wr_id |= u64::from(i);
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            self.rbuf_msg_index = (i + 1) % u32::from(self.sizes.rq_size);
        }
        let mut bad = null_mut();
        // SAFETY: a live QP; `wr` and `sge` live through the call.
        match unsafe { crate::post::post_recv(self.qp(), &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Posts one send WR: `sges` of the send buffer (or none), as `opcode`.
    fn post(
        &self,
        opcode: ffi::ibv_wr_opcode,
        sges: &mut [ffi::ibv_sge],
        remote: (u64, u32),
        imm: u32,
        wr_id: u64,
    ) -> Result<(), c_int> {
        // SAFETY: plain C data; all-zero is valid.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = opcode;
        wr.sg_list = if sges.is_empty() { null_mut() } else { sges.as_mut_ptr() };
        wr.num_sge = sges.len() as c_int;
        wr.__bindgen_anon_1.imm_data = imm.to_be();
        wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: remote.0, rkey: remote.1 };
        let mut bad = null_mut();
        // SAFETY: a live QP; `wr` and the SGEs live through the call (posting copies).
        match unsafe { crate::post::post_send(self.qp(), &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// A message alone: an immediate-only zero-length WRITE, or a SEND of its 4 bytes.
    fn post_msg(&mut self, m: u32, wr_id: u64) -> Result<(), c_int> {
        if !self.msg_send {
            return self.post(ffi::IBV_WR_RDMA_WRITE_WITH_IMM, &mut [], (0, 0), m, wr_id);
        }
        // Slots cycle through as many as send WRs, so one in flight is never reused.
        let at = self.sizes.sbuf_size + CTRL_SLOTS * SGE_LEN as u32 + self.msg_slot * MSG_BYTES as u32;
        self.msg_slot = (self.msg_slot + 1) % u32::from(self.sizes.sq_size);
        // rsockets sends the message in host order (it is not converted).
        self.sbuf.write(at, &m.to_ne_bytes());
        let mut sge = [ffi::ibv_sge { addr: self.sbuf.addr(at), length: MSG_BYTES as u32, lkey: self.lkey(0) }];
        self.post(ffi::IBV_WR_SEND, &mut sge, (0, 0), 0, wr_id)
    }

    /// Data or an SGE written to `remote` with message `m` (two WRs on iWARP).
    fn post_write_msg(&mut self, sges: &mut [ffi::ibv_sge], remote: (u64, u32), m: u32) -> Result<(), c_int> {
        let wr_id = Flow::send_wr_id(m, false);
        if !self.msg_send {
            return self.post(ffi::IBV_WR_RDMA_WRITE_WITH_IMM, sges, remote, m, wr_id);
        }
        self.post(ffi::IBV_WR_RDMA_WRITE, sges, remote, 0, wr_id)?;
        let (op, _) = wire::parse_msg(m);
        self.post_msg(m, Flow::send_wr_id(wire::msg(op, 0), true))
    }

    /// Sends what it can of `data` now; the bytes taken (0 when there is no room).
    pub(crate) fn send_now(&mut self, data: &[u8], olen: &mut u32) -> Result<usize, c_int> {
        let mut done = 0;
        while done < data.len() {
            let Some(flow) = self.flow.as_mut() else { return Err(libc::ENOTCONN) };
            let want = ((data.len() - done) as u32).min(*olen);
            let mut t = TargetMem(&self.targets);
            let Some(w) = flow.next_write(want, &mut t) else { break };
            flow::ramp_up(olen);
            self.write_data(&w, &data[done..])?;
            done += w.bytes() as usize;
        }
        Ok(done)
    }

    fn write_data(&mut self, w: &DataWrite, data: &[u8]) -> Result<(), c_int> {
        let mut sges = self.fill_sbuf(&w.local, &data[..w.bytes() as usize]);
        let n = w.local.iter().filter(|r| r.1 > 0).count();
        self.post_write_msg(&mut sges[..n], (w.remote_addr, w.rkey), w.imm)
    }

    /// Writes mapping `m` into the peer's iomap entry `index`; false if there is no room
    /// now.
    pub(crate) fn send_iomap(&mut self, index: usize, m: Iomap) -> Result<bool, c_int> {
        let t = TargetMem(&self.targets);
        let Some(local) = self.flow.as_mut().and_then(|f| f.next_iomap_write(&t)) else { return Ok(false) };
        let bytes = m.to_bytes(self.peer_big_endian);
        let mut sges = self.fill_sbuf(&local, &bytes);
        let (base, key, _) = self.remote_iomap;
        let remote = (base.wrapping_add((index * IOMAP_LEN) as u64), key);
        let n = local.iter().filter(|r| r.1 > 0).count();
        self.post_write_msg(&mut sges[..n], remote, wire::msg(wire::Op::IomapSgl, index as u32))?;
        Ok(true)
    }

    /// The peer's mapping (in this side's iomap list) that covers `offset`.
    fn iomap_covering(&self, offset: u64) -> Option<Iomap> {
        (0..self.iomap_entries)
            .map(|i| self.iomap_entry(i))
            .find(|m| m.sge.length > 0 && offset >= m.offset && offset - m.offset < u64::from(m.sge.length))
    }

    fn iomap_entry(&self, i: usize) -> Iomap {
        let at = SGL_SIZE * SGE_LEN + i * IOMAP_LEN;
        let mut b = [0u8; IOMAP_LEN];
        // SAFETY: entry i < iomap_entries lies inside the target region; volatile, as the
        // peer's WRITE changes it.
        for (k, byte) in b.iter_mut().enumerate() {
            *byte = unsafe { std::ptr::read_volatile(self.targets.ptr.add(at + k)) };
        }
        Iomap::from_bytes(&b)
    }

    /// Writes what it can of `data` straight into the peer's mapping at `offset`
    /// (`riowrite`): the bytes taken, 0 when there is no room now, EINVAL... none when no
    /// mapping covers `offset`.
    pub(crate) fn write_direct(&mut self, data: &[u8], offset: u64, olen: &mut u32) -> Result<usize, c_int> {
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let Some(m) = self.iomap_covering(at) else { break };
            let room = u64::from(m.sge.length) - (at - m.offset);
            let want = ((data.len() - done) as u32).min(*olen);
            let t = TargetMem(&self.targets);
            let Some(local) = self.flow.as_mut().and_then(|f| f.next_direct_write(want, room, &t)) else { break };
            flow::ramp_up(olen);
            let len = (local[0].1 + local[1].1) as usize;
            let mut sges = self.fill_sbuf(&local, &data[done..done + len]);
            let n = local.iter().filter(|r| r.1 > 0).count();
            let remote = (m.sge.addr.wrapping_add(at - m.offset), m.sge.key);
            let wr_id = Flow::send_wr_id(wire::msg(wire::Op::Write, len as u32), false);
            self.post(ffi::IBV_WR_RDMA_WRITE, &mut sges[..n], remote, 0, wr_id)?;
            done += len;
        }
        Ok(done)
    }

    /// Copies `data` into the send-ring ranges `local`: their SGEs.
    fn fill_sbuf(&self, local: &[(u32, u32); 2], data: &[u8]) -> [ffi::ibv_sge; 2] {
        let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; 2];
        let mut from = 0usize;
        for (i, &(off, len)) in local.iter().enumerate().filter(|(_, r)| r.1 > 0) {
            self.sbuf.write(off, &data[from..from + len as usize]);
            sges[i] = ffi::ibv_sge { addr: self.sbuf.addr(off), length: len, lkey: self.lkey(0) };
            from += len as usize;
        }
        sges
    }

    /// Gives the peer credits (and space) if due.
    pub(crate) fn update_credits(&mut self) -> Result<(), c_int> {
        let Some(due) = self.flow.as_mut().and_then(Flow::credits_due) else { return Ok(()) };
        match due {
            Credit::Msg(m) => self.post_msg(m, Flow::send_wr_id(m, false)),
            Credit::Grant { rbuf_offset, len, slot, imm } => {
                let sge = Sge { addr: self.rbuf.addr(rbuf_offset), key: self.rkey(1), length: len };
                let at = self.sizes.sbuf_size + self.ctrl_slot * SGE_LEN as u32;
                self.ctrl_slot = (self.ctrl_slot + 1) % CTRL_SLOTS;
                self.sbuf.write(at, &sge.to_bytes(self.peer_big_endian));
                let mut sges = [ffi::ibv_sge { addr: self.sbuf.addr(at), length: SGE_LEN as u32, lkey: self.lkey(0) }];
                let remote = self.flow.as_ref().map_or((0, 0), |f| f.remote_slot(slot));
                self.post_write_msg(&mut sges, remote, imm)
            }
        }
    }

    /// Posts a control message if a slot is free; whether it went.
    pub(crate) fn send_ctrl(&mut self, what: u32) -> Result<bool, c_int> {
        let Some(m) = self.flow.as_mut().and_then(|f| f.ctrl(what)) else { return Ok(false) };
        self.post_msg(m, Flow::send_wr_id(m, false))?;
        Ok(true)
    }

    /// Copies up to `out.len()` received bytes out; `peek` leaves them unread.
    pub(crate) fn read_into(&mut self, out: &mut [u8], peek: bool) -> usize {
        let Some(flow) = self.flow.as_mut() else { return 0 };
        let mut n = 0;
        for (off, len) in flow.take(out.len(), peek) {
            self.rbuf.read(off, &mut out[n..n + len as usize]);
            n += len as usize;
        }
        n
    }

    /// Takes every completion and event waiting; reposts the receives consumed.
    pub(crate) fn poll(&mut self) -> Result<(), c_int> {
        let mut received = 0;
        for wc in self.comp.take(false) {
            received += self.completed(&wc);
        }
        if self.flow.as_ref().is_some_and(|f| f.connected) {
            for _ in 0..received {
                self.post_recv()?;
            }
        }
        Ok(())
    }

    /// One completion; 1 for a receive consumed.
    fn completed(&mut self, wc: &ffi::ibv_wc) -> u32 {
        let ok = wc.status == ffi::IBV_WC_SUCCESS;
        let Some(flow) = self.flow.as_mut() else { return 0 };
        if wc.wr_id & RECV_FLAG == 0 {
            flow.send_done(wc.wr_id, ok);
            if !ok && self.fault.is_none() {
                self.fault = Some(libc::EIO);
            }
            return 0;
        }
        if !ok {
            // Receives are flushed when the QP fails: a connection that ended without the
            // peer's disconnect message (a reset, a transport error) ends reads with
            // ECONNRESET once what came before is read.
            if flow.connected {
                flow.end();
                self.fault.get_or_insert(libc::ECONNRESET);
            }
            return 0;
        }
        let m = if wc.wc_flags & ffi::IBV_WC_WITH_IMM != 0 {
            // SAFETY: completions with immediate data carry it in this member.
            u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })
        } else {
            let slot = (wc.wr_id as u32) % u32::from(self.sizes.rq_size);
            let mut b = [0u8; MSG_BYTES];
            self.rbuf.read(self.sizes.rbuf_size + slot * MSG_BYTES as u32, &mut b);
            u32::from_ne_bytes(b)
        };
        if flow.received(m).is_err() {
            // The peer broke the protocol: the connection ends here, as on a transport error.
            flow.end();
            self.fault = Some(libc::EPROTO);
        }
        1
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: the endpoint's own objects, each destroyed once, the QP before what it
        // uses (the CQ goes with `comp`, after this).
        unsafe { destroy_qp_and_regions(self.id, &self.mrs) };
    }
}
