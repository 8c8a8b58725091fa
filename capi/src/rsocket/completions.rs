//! A CQ and its completion channel as an rsocket uses them: polled on the caller's
//! thread, armed before a sleep, its events taken without ever blocking. Stream sockets
//! have one; a datagram socket one per QP.

use crate::ffi;
use libc::c_int;
use std::ptr::null_mut;

pub(crate) struct Completions {
    pub(crate) cq: *mut ffi::ibv_cq,
    channel: *mut ffi::ibv_comp_channel,
    ctx: *mut ffi::ibv_context,
    /// The CQ is armed for one event.
    pub(crate) armed: bool,
}

// SAFETY: the raw pointers name this library's objects, which are used from any thread
// (the C API's rule); a CQ is only reached under its socket's lock.
unsafe impl Send for Completions {}

/// The calling thread's errno (EIO if none is set).
pub(crate) fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// `Ok` for a C call's 0, else the thread's errno.
pub(crate) fn check(ret: c_int) -> Result<(), c_int> {
    if ret == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Destroys the QP of `id` (if it has one), then deregisters `mrs` (those made): what an
/// rsocket's QP uses goes after it.
///
/// # Safety
/// `id` is a live id of this library; `mrs` are its regions or null, each deregistered once.
pub(crate) unsafe fn destroy_qp_and_regions(id: *mut ffi::rdma_cm_id, mrs: &[*mut ffi::ibv_mr]) {
    // SAFETY: the caller's contract.
    unsafe {
        if !(*id).qp.is_null() {
            crate::cm::rdma_destroy_qp(id);
        }
        for &mr in mrs {
            if !mr.is_null() {
                crate::objects::ibv_dereg_mr(mr);
            }
        }
    }
}

impl Completions {
    /// A CQ of `cqe` entries on `ctx` with a non-blocking channel.
    ///
    /// # Safety
    /// `ctx` is an open context of this library.
    pub(crate) unsafe fn create(ctx: *mut ffi::ibv_context, cqe: c_int) -> Result<Completions, c_int> {
        // SAFETY: the caller's contract.
        let channel = unsafe { crate::cq::ibv_create_comp_channel(ctx) };
        if channel.is_null() {
            return Err(errno());
        }
        // Waits happen in poll(2) on the fd; reads of it must never block.
        // SAFETY: the channel's own fd.
        unsafe { set_nonblocking((*channel).fd, true) };
        let mut c = Completions { cq: null_mut(), channel, ctx, armed: false };
        // SAFETY: an open context and its channel.
        c.cq = unsafe { crate::cq::ibv_create_cq(ctx, cqe, null_mut(), channel, 0) };
        if c.cq.is_null() {
            return Err(errno());
        }
        Ok(c)
    }

    /// Every completion waiting, after the channel's events are taken. With `claim`, a
    /// caller that looks in a tight loop has the device's socket to itself for a while, as
    /// one spinning on `ibv_poll_cq` has (`Context::progress_now`).
    pub(crate) fn take(&mut self, claim: bool) -> Vec<ffi::ibv_wc> {
        self.take_events();
        // The engine's queue, not `ibv_poll_cq`: that one receives on the caller's thread
        // and, called in a loop, keeps the poll thread off the socket for a while, which
        // suits an application spinning on its CQ but not one that returns from an
        // rsocket call to spin on its own memory (riostream waits so for direct writes):
        // stream sockets do not claim.
        // SAFETY: a live CQ made by this library.
        let Some(cq) = (unsafe { crate::cq::soft_cq(self.cq) }) else { return Vec::new() };
        // SAFETY: an open context.
        let engine = unsafe { crate::device::soft_context(self.ctx) }.and_then(|s| s.engine().ok());
        let mut all = Vec::new();
        let mut looked = false;
        loop {
            let mut got = cq.cq.poll(16);
            if got.is_empty() && !looked {
                // Receive once here rather than wait for the poll thread's wake-up.
                looked = true;
                let progress = |e: &softrdma::verbs::Context| if claim { e.progress_now() } else { e.progress_once() };
                if engine.is_some_and(|e| progress(e) > 0) {
                    got = cq.cq.poll(16);
                }
            }
            if got.is_empty() {
                return all;
            }
            all.extend(got.iter().map(crate::cq::to_ibv_wc));
        }
    }

    /// Arms the CQ for one completion event, if it is not armed.
    pub(crate) fn arm(&mut self) {
        if !self.armed {
            // SAFETY: a live CQ.
            unsafe { crate::cq::req_notify_cq(self.cq, 0) };
            self.armed = true;
        }
    }

    /// Reads the channel's events (never blocking: its fd is non-blocking).
    fn take_events(&mut self) {
        // Only an armed CQ raises an event; and `ibv_get_cq_event` tells the poll thread
        // the caller is about to sleep, which a look that finds nothing must not do.
        if !self.armed || !readable_now(self.fd()) {
            return;
        }
        let mut cq = null_mut();
        let mut ctx = null_mut();
        // SAFETY: our channel; pointers to locals.
        while unsafe { crate::cq::ibv_get_cq_event(self.channel, &mut cq, &mut ctx) } == 0 {
            // SAFETY: our CQ, the one the event named.
            unsafe { crate::cq::ibv_ack_cq_events(self.cq, 1) };
            self.armed = false;
        }
    }

    /// The channel's fd.
    pub(crate) fn fd(&self) -> c_int {
        // SAFETY: our live channel.
        unsafe { (*self.channel).fd }
    }

    /// The fd to wait on for the next completion, after arming.
    pub(crate) fn wait_fd(&mut self) -> c_int {
        self.arm();
        self.fd()
    }

    /// Lets the device's poll thread receive for a caller about to sleep.
    pub(crate) fn before_sleep(&self) {
        // SAFETY: an open context.
        if let Some(engine) = unsafe { crate::device::soft_context(self.ctx) }.and_then(|s| s.engine().ok()) {
            engine.stop_polling();
        }
    }
}

impl Drop for Completions {
    /// Runs after the QPs on the CQ are destroyed (their owners destroy them first).
    fn drop(&mut self) {
        // SAFETY: our own objects, each destroyed once.
        unsafe {
            if !self.cq.is_null() {
                self.take_events();
                crate::cq::ibv_destroy_cq(self.cq);
            }
            crate::cq::ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// Whether `fd` is readable at once.
pub(crate) fn readable_now(fd: c_int) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// Sets or clears O_NONBLOCK on `fd`.
///
/// # Safety
/// `fd` is an open file descriptor.
pub(crate) unsafe fn set_nonblocking(fd: c_int, on: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        libc::fcntl(fd, libc::F_SETFL, flags);
    }
}
