//! One UD QP of a datagram rsocket: made through rdma_cm (`RDMA_PS_UDP`, so it takes
//! librdmacm's Q_Key) on the device of one local address, with a ring of send slots and
//! one of receive slots, each a whole message ([`SLOT_BYTES`]) after a receive's GRH.

use super::completions::{check, destroy_qp_and_regions, Completions};
use super::dgram_wire::{DsHeader, GRH_BYTES, SLOT_BYTES};
use super::endpoint::Region;
use crate::ffi;
use libc::c_int;
use softrdma::verbs::RDMA_UDP_QKEY;
use std::net::SocketAddr;
use std::ptr::null_mut;

/// Set in a receive's work request id.
const RECV_FLAG: u64 = 1 << 63;
const RECV_STRIDE: usize = GRH_BYTES + SLOT_BYTES;

/// What a completion was for.
pub(crate) enum Done {
    /// A send's slot is free again.
    Sent,
    /// A message arrived in receive slot `slot`: `len` bytes after the GRH.
    Received { slot: u32, len: u32 },
    /// A receive came back with no message (a flush or an error): it is posted again.
    Dropped,
}

pub(crate) struct DsQp {
    id: *mut ffi::rdma_cm_id,
    comp: Option<Completions>,
    send: Region,
    recv: Region,
    mrs: [*mut ffi::ibv_mr; 2],
    free_slots: Vec<u32>,
    /// The header this QP's messages carry: the socket's address on this QP's device.
    pub(crate) hdr: DsHeader,
    pub(crate) qpn: u32,
    inline: u32,
}

// SAFETY: the raw pointers name this library's objects, used from any thread (the C
// API's rule); a QP is only reached under its socket's lock.
unsafe impl Send for DsQp {}

impl DsQp {
    /// A QP on the device of `local` (the socket's address there), its receives posted.
    pub(crate) fn create(local: SocketAddr, sq_size: u16, rq_size: u16, inline: u32) -> Result<DsQp, c_int> {
        let mut id = null_mut();
        // SAFETY: a synchronous id (no channel); `id` receives it.
        check(unsafe { crate::cm::rdma_create_id(null_mut(), &mut id, null_mut(), ffi::RDMA_PS_UDP) })?;
        let mut qp = DsQp {
            id,
            comp: None,
            send: Region::zeroed(usize::from(sq_size) * SLOT_BYTES),
            recv: Region::zeroed(usize::from(rq_size) * RECV_STRIDE),
            mrs: [null_mut(); 2],
            free_slots: (0..u32::from(sq_size)).rev().collect(),
            hdr: DsHeader { addr: local },
            qpn: 0,
            inline,
        };
        // SAFETY: plain C data; all-zero is valid.
        let mut storage: ffi::sockaddr_storage = unsafe { std::mem::zeroed() };
        crate::cm_addr::to_storage(local, &mut storage);
        // SAFETY: a live id and a socket address.
        check(unsafe { crate::cm::rdma_bind_addr(id, (&raw mut storage).cast()) })?;
        // SAFETY: a bound id has its context.
        let ctx = unsafe { (*id).verbs };
        let cqe = c_int::from(sq_size) + c_int::from(rq_size);
        // SAFETY: an open context.
        qp.comp = Some(unsafe { Completions::create(ctx, cqe)? });
        qp.create_qp(sq_size, rq_size)?;
        // SAFETY: a live id with a QP has its PD.
        let pd = unsafe { (*id).pd };
        let access = ffi::IBV_ACCESS_LOCAL_WRITE as c_int;
        qp.mrs = [qp.send.register(pd, access)?, qp.recv.register(pd, access)?];
        for slot in 0..u32::from(rq_size) {
            qp.post_recv(slot)?;
        }
        qp.comp_mut().arm();
        Ok(qp)
    }

    fn create_qp(&mut self, sq_size: u16, rq_size: u16) -> Result<(), c_int> {
        let cq = self.comp_mut().cq;
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq;
        attr.recv_cq = cq;
        attr.qp_type = ffi::IBV_QPT_UD;
        attr.sq_sig_all = 1;
        attr.cap.max_send_wr = u32::from(sq_size);
        attr.cap.max_recv_wr = u32::from(rq_size);
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = self.inline;
        // SAFETY: a bound id; its own PD (NULL).
        check(unsafe { crate::cm::rdma_create_qp(self.id, null_mut(), &mut attr) })?;
        self.inline = attr.cap.max_inline_data;
        // SAFETY: the QP just made.
        self.qpn = unsafe { (*(*self.id).qp).qp_num };
        Ok(())
    }

    pub(crate) fn comp_mut(&mut self) -> &mut Completions {
        self.comp.as_mut().expect("made in create")
    }

    pub(crate) fn comp(&self) -> &Completions {
        self.comp.as_ref().expect("made in create")
    }

    /// The PD address handles for this QP's peers are made on.
    pub(crate) fn pd(&self) -> *mut ffi::ibv_pd {
        // SAFETY: a live id with a QP.
        unsafe { (*self.id).pd }
    }

    fn post_recv(&mut self, slot: u32) -> Result<(), c_int> {
        let mut sge = ffi::ibv_sge {
            addr: self.recv.addr(slot * RECV_STRIDE as u32),
            length: RECV_STRIDE as u32,
            // SAFETY: registered in `create`.
            lkey: unsafe { (*self.mrs[1]).lkey },
        };
        // SAFETY: plain C data; all-zero is valid.
        let mut wr: ffi::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = RECV_FLAG | u64::from(slot);
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad = null_mut();
        // SAFETY: a live QP; `wr` and `sge` live through the call.
        check_posted(unsafe { crate::post::post_recv((*self.id).qp, &mut wr, &mut bad) })
    }

    /// Gives receive slot `slot` back to the QP.
    pub(crate) fn release(&mut self, slot: u32) -> Result<(), c_int> {
        self.post_recv(slot)
    }

    /// Bytes `at..at + out.len()` of the message in receive slot `slot` (the caller keeps
    /// within the message's length).
    pub(crate) fn read(&self, slot: u32, at: usize, out: &mut [u8]) {
        self.recv.read(slot * RECV_STRIDE as u32 + (GRH_BYTES + at) as u32, out);
    }

    /// Room for a send now.
    pub(crate) fn can_send(&self) -> bool {
        !self.free_slots.is_empty()
    }

    /// No send outstanding.
    pub(crate) fn sends_done(&self, sq_size: u16) -> bool {
        self.free_slots.len() == usize::from(sq_size)
    }

    /// Sends this QP's header and `data` to QP `qpn` through `ah` (the caller checked
    /// that a slot is free and that it fits one).
    pub(crate) fn send(&mut self, ah: *mut ffi::ibv_ah, qpn: u32, data: &[u8]) -> Result<(), c_int> {
        let slot = self.free_slots.pop().ok_or(libc::EWOULDBLOCK)?;
        let hdr = self.hdr.emit();
        let at = slot * SLOT_BYTES as u32;
        self.send.write(at, &hdr);
        self.send.write(at + hdr.len() as u32, data);
        let len = (hdr.len() + data.len()) as u32;
        // SAFETY: registered in `create`.
        let mut sge = ffi::ibv_sge { addr: self.send.addr(at), length: len, lkey: unsafe { (*self.mrs[0]).lkey } };
        // SAFETY: plain C data; all-zero is valid.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(slot);
        wr.opcode = ffi::IBV_WR_SEND;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = if len <= self.inline { ffi::IBV_SEND_INLINE } else { 0 };
        wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah, remote_qpn: qpn, remote_qkey: RDMA_UDP_QKEY };
        let mut bad = null_mut();
        // SAFETY: a live QP; `wr` and `sge` live through the call.
        let posted = check_posted(unsafe { crate::post::post_send((*self.id).qp, &mut wr, &mut bad) });
        if posted.is_err() {
            self.free_slots.push(slot);
        }
        posted
    }

    /// What the completions waiting say; receives that carry no message are posted again.
    /// `polling`: the caller looks in a loop (see [`Completions::take`]).
    pub(crate) fn completions(&mut self, polling: bool) -> Vec<Done> {
        let wcs = self.comp_mut().take(polling);
        let mut done = Vec::with_capacity(wcs.len());
        for wc in wcs {
            let slot = wc.wr_id as u32;
            if wc.wr_id & RECV_FLAG == 0 {
                self.free_slots.push(slot);
                done.push(Done::Sent);
            } else if wc.status == ffi::IBV_WC_SUCCESS && wc.byte_len as usize >= GRH_BYTES {
                done.push(Done::Received { slot, len: wc.byte_len - GRH_BYTES as u32 });
            } else {
                // A flushed receive (the QP is going away) is not posted again.
                if wc.status == ffi::IBV_WC_SUCCESS {
                    let _ = self.post_recv(slot);
                }
                done.push(Done::Dropped);
            }
        }
        done
    }
}

fn check_posted(ret: c_int) -> Result<(), c_int> {
    match ret {
        0 => Ok(()),
        e => Err(e),
    }
}

impl Drop for DsQp {
    fn drop(&mut self) {
        // SAFETY: the QP's own objects, each destroyed once: the QP before the memory and
        // CQ it uses, the id last.
        unsafe {
            destroy_qp_and_regions(self.id, &self.mrs);
            self.comp = None;
            crate::cm::rdma_destroy_id(self.id);
        }
    }
}
