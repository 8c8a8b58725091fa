//! One stream rsocket's life: bound, listening, connecting (blocking or not), connected,
//! shut down. Each call here does what it can without sleeping and says what it waits for;
//! [`super::api`] sleeps between calls with the socket unlocked, so another thread can
//! send while one waits to receive (as with a kernel socket).

use super::completions::{check, errno, readable_now, set_nonblocking};
use super::endpoint::Endpoint;
use super::flow::{self, Sizes};
use super::wire::{self, ConnData, Iomap, Sge};
use crate::ffi;
use libc::c_int;
use std::ptr::null_mut;

/// Default send and receive queue depths (librdmacm's `def_sqsize`, `def_rqsize`).
pub const DEFAULT_QP_SIZE: u16 = 384;
/// Default send and receive buffer bytes (librdmacm's `def_wmem`, `def_mem`).
pub const DEFAULT_BUF_BYTES: u32 = 1 << 17;
/// Default inline bytes a QP is asked for.
pub const DEFAULT_INLINE: u32 = 64;
/// Queue depths are kept within these (`RS_QP_MIN_SIZE`, `RS_QP_MAX_SIZE`).
pub const QP_SIZE_MIN: u16 = 16;
/// See [`QP_SIZE_MIN`]; also what this library's device offers comfortably per QP.
pub const QP_SIZE_MAX: u16 = 4096;
/// The largest buffer an application may ask for (`SO_RCVBUF`/`SO_SNDBUF` are doubled, as
/// by librdmacm): a grant is half of it and a message's length has 29 bits.
pub const BUF_BYTES_MAX: u32 = 1 << 28;
/// The smallest: two grants of at least the send low-water mark.
pub const BUF_BYTES_MIN: u32 = 4 * flow::SNDLOWAT;

/// Where a socket is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Made, or bound.
    Idle,
    /// Listening: `raccept` takes requests.
    Listening,
    /// A non-blocking connect is under way.
    Connecting,
    /// Connected (the flow says which directions are open).
    Connected,
    /// A connect failed (`SO_ERROR` says why).
    ConnectError,
}

/// What a call waits for before it can go on.
pub enum Wait {
    /// This fd to become readable (a completion channel or a CM channel).
    Readable(c_int),
}

/// A call's outcome: done, or waiting.
pub enum Step<T> {
    /// Finished with this result.
    Done(Result<T, c_int>),
    /// Try again once this happens.
    Wait(Wait),
}

impl<T> Step<T> {
    /// The same outcome with a finished value mapped.
    fn map_done<U>(self, f: impl FnOnce(T) -> U) -> Step<U> {
        match self {
            Step::Done(r) => Step::Done(r.map(f)),
            Step::Wait(w) => Step::Wait(w),
        }
    }
}

/// One stream rsocket.
pub struct RSocket {
    pub(crate) id: *mut ffi::rdma_cm_id,
    pub(crate) state: State,
    pub(crate) nonblock: bool,
    /// The pending error `SO_ERROR` reports (and clears).
    pub(crate) err: c_int,
    pub(crate) sizes: Sizes,
    pub(crate) inline: u32,
    pub(crate) ep: Option<Endpoint>,
    /// Options set and read back (`SO_REUSEADDR`, `TCP_NODELAY`, ...), by level and name.
    pub(crate) flags: Vec<((c_int, c_int), c_int)>,
    /// The transfer-size ramp of the send in progress.
    olen: u32,
    /// Entries of the iomap list this side offers the peer (`RDMA_IOMAPSIZE`).
    pub(crate) iomap_entries: u16,
    /// Buffers mapped for the peer's direct writes (`riomap`).
    maps: Vec<Mapping>,
}

/// A buffer `riomap` registered: the peer writes `offset..` into it once told.
struct Mapping {
    mr: *mut ffi::ibv_mr,
    offset: u64,
    /// The peer's iomap entry it goes in.
    index: usize,
    /// The peer has been sent the entry.
    sent: bool,
}

/// The most entries an iomap list may have (librdmacm's scale reaches 32,512).
pub const IOMAP_ENTRIES_MAX: u16 = 1024;

// SAFETY: the id is this library's, usable from any thread; reached only under the lock.
unsafe impl Send for RSocket {}

impl RSocket {
    /// A socket on a new synchronous rdma_cm id (TCP port space).
    pub fn new() -> Result<RSocket, c_int> {
        let mut id = null_mut();
        // SAFETY: a synchronous id (no channel); `id` receives it.
        check(unsafe { crate::cm::rdma_create_id(null_mut(), &mut id, null_mut(), ffi::RDMA_PS_TCP) })?;
        Ok(RSocket::on(id, None))
    }

    fn on(id: *mut ffi::rdma_cm_id, like: Option<&RSocket>) -> RSocket {
        let default = Sizes {
            sq_size: DEFAULT_QP_SIZE,
            rq_size: DEFAULT_QP_SIZE,
            sbuf_size: DEFAULT_BUF_BYTES,
            rbuf_size: DEFAULT_BUF_BYTES,
        };
        RSocket {
            id,
            state: State::Idle,
            nonblock: false,
            err: 0,
            sizes: like.map_or(default, |l| l.sizes),
            inline: like.map_or(DEFAULT_INLINE, |l| l.inline),
            ep: None,
            flags: like.map_or_else(Vec::new, |l| l.flags.clone()),
            olen: flow::OLAP_START,
            iomap_entries: like.map_or(0, |l| l.iomap_entries),
            maps: Vec::new(),
        }
    }

    /// The fd that names the socket: its id's channel's (unique while the id lives), which
    /// is also what connection requests and a connect's answer make readable.
    pub fn fd(&self) -> c_int {
        // SAFETY: a live id has its (own, synchronous) channel.
        unsafe { (*(*self.id).channel).fd }
    }

    /// `rbind`.
    pub fn bind(&mut self, addr: *const ffi::sockaddr) -> Result<(), c_int> {
        // SAFETY: a live id; the caller's address.
        check(unsafe { crate::cm::rdma_bind_addr(self.id, addr.cast_mut()) })
    }

    /// `rlisten`.
    pub fn listen(&mut self, backlog: c_int) -> Result<(), c_int> {
        if self.state == State::Listening {
            return Ok(());
        }
        // SAFETY: a live, bound id.
        check(unsafe { crate::cm::rdma_listen(self.id, backlog) })?;
        // SAFETY: the id's own channel fd.
        unsafe { set_nonblocking(self.fd(), true) };
        self.state = State::Listening;
        Ok(())
    }

    /// The next connection request, accepted: a new connected socket.
    pub fn accept(&mut self) -> Step<RSocket> {
        if self.state != State::Listening {
            return Step::Done(Err(libc::EINVAL));
        }
        loop {
            let mut new = null_mut();
            // SAFETY: a live synchronous listener (its fd non-blocking); `new` receives the id.
            if unsafe { crate::cm_ep::rdma_get_request(self.id, &mut new) } != 0 {
                return match errno() {
                    libc::EAGAIN if !self.nonblock => Step::Wait(Wait::Readable(self.fd())),
                    e => Step::Done(Err(e)),
                };
            }
            let mut child = RSocket::on(new, Some(self));
            match child.answer_request() {
                Ok(()) => return Step::Done(Ok(child)),
                // A request that is not rsockets' was refused: the application waits for
                // the next one, as with librdmacm's.
                Err(libc::ECONNREFUSED) => {}
                Err(e) => return Step::Done(Err(e)),
            }
        }
    }

    /// Sets up and accepts the request this (new) socket's id holds.
    fn answer_request(&mut self) -> Result<(), c_int> {
        // SAFETY: the request's id holds its CONNECT_REQUEST event until the accept.
        let (mut param, peer) = unsafe {
            let ev = &*(*self.id).event;
            let conn = ev.param.conn;
            let data = std::slice::from_raw_parts(conn.private_data.cast::<u8>(), usize::from(conn.private_data_len));
            (conn, ConnData::parse(data))
        };
        let Some(peer) = peer.filter(|p| p.version == wire::VERSION) else {
            // SAFETY: the request's id.
            unsafe { crate::cm::rdma_reject(self.id, std::ptr::null(), 0) };
            return Err(libc::ECONNREFUSED);
        };
        self.clamp_sizes();
        // SAFETY: the request's id, bound to its device.
        let mut ep = unsafe { Endpoint::create(self.id, self.sizes, self.inline, usize::from(self.iomap_entries))? };
        let mine = ep.conn_data().emit();
        param.private_data = mine.as_ptr().cast();
        param.private_data_len = mine.len() as u8;
        // SAFETY: a request's id with a QP; `param` and `mine` live through the call
        // (the id's channel blocks: the accept returns once established).
        check(unsafe { crate::cm::rdma_accept(self.id, &mut param) })?;
        ep.connected(&peer);
        self.ep = Some(ep);
        self.state = State::Connected;
        Ok(())
    }

    fn clamp_sizes(&mut self) {
        let s = &mut self.sizes;
        s.sq_size = s.sq_size.clamp(QP_SIZE_MIN, QP_SIZE_MAX);
        s.rq_size = s.rq_size.clamp(QP_SIZE_MIN, QP_SIZE_MAX);
        s.sbuf_size = s.sbuf_size.clamp(BUF_BYTES_MIN, BUF_BYTES_MAX) & !7;
        s.rbuf_size = s.rbuf_size.clamp(BUF_BYTES_MIN, BUF_BYTES_MAX) & !7;
    }

    /// `rconnect`: resolves, sets up and sends the request; with a non-blocking socket,
    /// EINPROGRESS until [`RSocket::finish_connect`] sees the answer.
    pub fn connect(&mut self, addr: *const ffi::sockaddr) -> Result<(), c_int> {
        match self.state {
            State::Idle => {}
            State::Connecting => return Err(libc::EALREADY),
            State::Connected => return Err(libc::EISCONN),
            _ => return Err(libc::EINVAL),
        }
        let r = self.start_connect(addr);
        if let Err(e) = r {
            if e != libc::EINPROGRESS {
                self.state = State::ConnectError;
            }
        }
        r
    }

    fn start_connect(&mut self, addr: *const ffi::sockaddr) -> Result<(), c_int> {
        // SAFETY: a live id; address resolution and routing complete at once here.
        unsafe {
            check(crate::cm::rdma_resolve_addr(self.id, null_mut(), addr.cast_mut(), 2000))?;
            check(crate::cm::rdma_resolve_route(self.id, 2000))?;
        }
        self.clamp_sizes();
        // SAFETY: a resolved id.
        let ep = unsafe { Endpoint::create(self.id, self.sizes, self.inline, usize::from(self.iomap_entries))? };
        let mine = ep.conn_data().emit();
        // SAFETY: plain C data; all-zero is valid.
        let mut param: ffi::rdma_conn_param = unsafe { std::mem::zeroed() };
        param.private_data = mine.as_ptr().cast();
        param.private_data_len = mine.len() as u8;
        param.flow_control = 1;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        // As librdmacm: iWARP peers may issue a READ while connecting.
        if ep.msg_send {
            param.initiator_depth = 1;
        }
        self.ep = Some(ep);
        // SAFETY: the id's own channel fd.
        unsafe { set_nonblocking(self.fd(), self.nonblock) };
        // SAFETY: a resolved id with a QP; `param` and `mine` live through the call.
        if unsafe { crate::cm::rdma_connect(self.id, &mut param) } != 0 {
            return match errno() {
                libc::EAGAIN => {
                    self.state = State::Connecting;
                    Err(libc::EINPROGRESS)
                }
                e => Err(e),
            };
        }
        self.established()
    }

    /// A non-blocking connect's answer, if it came: `Ok(true)` connected, `Ok(false)` not
    /// yet.
    pub fn finish_connect(&mut self) -> Result<bool, c_int> {
        if self.state != State::Connecting {
            return Ok(self.state == State::Connected);
        }
        // SAFETY: a live synchronous id waiting for its connect's event.
        if unsafe { crate::cm::complete(self.id) } != 0 {
            return match errno() {
                libc::EAGAIN => Ok(false),
                e => {
                    self.state = State::ConnectError;
                    self.err = e;
                    Err(e)
                }
            };
        }
        self.established().map(|()| true)
    }

    fn established(&mut self) -> Result<(), c_int> {
        // SAFETY: a synchronous id keeps its ESTABLISHED event (with the peer's private
        // data) until its next call.
        let peer = unsafe {
            let conn = (*(*self.id).event).param.conn;
            let data = std::slice::from_raw_parts(conn.private_data.cast::<u8>(), usize::from(conn.private_data_len));
            ConnData::parse(data)
        };
        let Some(peer) = peer.filter(|p| p.version == wire::VERSION) else {
            self.state = State::ConnectError;
            return Err(libc::EOPNOTSUPP);
        };
        if let Some(ep) = self.ep.as_mut() {
            ep.connected(&peer);
        }
        self.state = State::Connected;
        Ok(())
    }

    /// Drives the CQ once (credits out, completions in) and tests `ready`: done if it
    /// holds, else what to wait for (`WouldBlock` for a non-blocking caller).
    pub(crate) fn progress(&mut self, nonblock: bool, ready: impl Fn(&Endpoint) -> bool) -> Step<()> {
        let Some(ep) = self.ep.as_mut() else { return Step::Done(Err(libc::ENOTCONN)) };
        for _ in 0..2 {
            // Credits that cannot be posted (the QP has just failed: the peer closed) are
            // not this call's failure, as with librdmacm: the poll shows what happened.
            let _ = ep.update_credits();
            let polled = ep.poll();
            let _ = ep.update_credits();
            if ep.flow.is_none() {
                return Step::Done(Err(libc::ENOTCONN));
            }
            // What the caller waits for counts before a failure to repost receives (the
            // QP failed under them): data already in is still read.
            if ready(ep) {
                return Step::Done(Ok(()));
            }
            if let Err(e) = polled {
                return Step::Done(Err(e));
            }
            if nonblock {
                return Step::Done(Err(libc::EWOULDBLOCK));
            }
            if ep.comp.armed {
                break;
            }
            // Armed now: look once more, so a completion that came before arming counts.
            ep.comp.arm();
        }
        ep.comp.before_sleep();
        Step::Wait(Wait::Readable(ep.comp.wait_fd()))
    }

    /// Sends what it can of `data` now (after waiting for room if `nonblock` is false and
    /// there is none): the bytes taken.
    pub fn send(&mut self, data: &[u8], nonblock: bool) -> Step<usize> {
        if let Some(s) = self.connect_pending() {
            return s;
        }
        let can = |e: &Endpoint| e.can_send() || !e.flow.as_ref().is_some_and(|f| f.writable);
        match self.progress(nonblock, can) {
            Step::Done(Ok(())) => {}
            Step::Done(Err(e)) => return Step::Done(Err(e)),
            Step::Wait(w) => return Step::Wait(w),
        }
        if let Err(e) = self.send_maps() {
            return Step::Done(Err(e));
        }
        let Some(ep) = self.ep.as_mut() else { return Step::Done(Err(libc::ENOTCONN)) };
        if !ep.flow.as_ref().is_some_and(|f| f.writable) {
            return Step::Done(Err(ep.fault.unwrap_or(libc::ECONNRESET)));
        }
        Step::Done(ep.send_now(data, &mut self.olen))
    }

    /// Tells the peer of the mappings it has not heard of, as room allows.
    fn send_maps(&mut self) -> Result<(), c_int> {
        let Some(ep) = self.ep.as_mut() else { return Ok(()) };
        for m in self.maps.iter_mut().filter(|m| !m.sent) {
            // SAFETY: a region this socket registered and has not deregistered.
            let (addr, length, rkey) = unsafe { ((*m.mr).addr as u64, (*m.mr).length as u32, (*m.mr).rkey) };
            let entry = Iomap { offset: m.offset, sge: Sge { addr, key: rkey, length } };
            if !ep.send_iomap(m.index, entry)? {
                break;
            }
            m.sent = true;
        }
        Ok(())
    }

    /// `riomap`: registers `len` bytes at `buf` for the peer's direct writes at `offset`
    /// (`None`: the buffer's address); the offset.
    ///
    /// # Safety
    /// `buf` holds `len` bytes that stay valid until [`RSocket::unmap`] or the close.
    pub unsafe fn map(&mut self, buf: *mut libc::c_void, len: usize, offset: Option<u64>) -> Result<u64, c_int> {
        let Some(ep) = self.ep.as_ref() else { return Err(libc::EINVAL) };
        let slots = ep.remote_iomap.2;
        let index = (0..slots).find(|i| !self.maps.iter().any(|m| m.index == *i)).ok_or(libc::ENOMEM)?;
        let access = (ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE) as c_int;
        // SAFETY: the id's PD; the caller's buffer, which stays registered until riounmap
        // or the socket's close.
        let mr = unsafe { crate::objects::ibv_reg_mr((*self.id).pd, buf, len, access) };
        if mr.is_null() {
            return Err(errno());
        }
        let offset = offset.unwrap_or(buf as u64);
        self.maps.push(Mapping { mr, offset, index, sent: false });
        Ok(offset)
    }

    /// `riounmap`.
    pub fn unmap(&mut self, buf: *mut libc::c_void, len: usize) -> Result<(), c_int> {
        // SAFETY: regions this socket registered.
        let at = self.maps.iter().position(|m| unsafe { (*m.mr).addr == buf && (*m.mr).length == len });
        let m = self.maps.remove(at.ok_or(libc::EINVAL)?);
        // SAFETY: registered in `map`, deregistered once (it has left the list).
        unsafe { crate::objects::ibv_dereg_mr(m.mr) };
        Ok(())
    }

    /// `riowrite`: what it can of `data` into the peer's mapping at `offset` (after
    /// waiting for room unless `nonblock`).
    pub fn write_direct(&mut self, data: &[u8], offset: u64, nonblock: bool) -> Step<usize> {
        let can = |e: &Endpoint| e.can_send() || !e.flow.as_ref().is_some_and(|f| f.writable);
        match self.progress(nonblock, can) {
            Step::Done(Ok(())) => {}
            other => return other.map_done(|()| 0),
        }
        if let Err(e) = self.send_maps() {
            return Step::Done(Err(e));
        }
        let Some(ep) = self.ep.as_mut() else { return Step::Done(Err(libc::ENOTCONN)) };
        if !ep.flow.as_ref().is_some_and(|f| f.writable) {
            return Step::Done(Err(ep.fault.unwrap_or(libc::ECONNRESET)));
        }
        Step::Done(ep.write_direct(data, offset, &mut self.olen))
    }

    /// Starts a new send's transfer ramp (`rsend` calls).
    pub fn new_send(&mut self) {
        self.olen = flow::OLAP_START;
    }

    /// Receives into `out` what has come (after waiting for something unless
    /// `nonblock`): 0 at the end of the stream.
    pub fn recv(&mut self, out: &mut [u8], nonblock: bool, peek: bool) -> Step<usize> {
        if let Some(s) = self.connect_pending() {
            return s;
        }
        let ready = |e: &Endpoint| e.flow.as_ref().is_none_or(|f| f.has_data() || !f.readable);
        match self.progress(nonblock, ready) {
            Step::Done(Ok(())) => {}
            Step::Done(Err(e)) => return Step::Done(Err(e)),
            Step::Wait(w) => return Step::Wait(w),
        }
        let Some(ep) = self.ep.as_mut() else { return Step::Done(Err(libc::ENOTCONN)) };
        let n = ep.read_into(out, peek);
        if n == 0 {
            if let Some(e) = ep.fault {
                return Step::Done(Err(e));
            }
        }
        if !peek {
            // Space read is space the peer may fill again.
            let _ = ep.update_credits();
        }
        Step::Done(Ok(n))
    }

    /// A non-blocking connect still under way: what a data call returns meanwhile.
    fn connect_pending<T>(&mut self) -> Option<Step<T>> {
        match self.state {
            State::Connecting => match self.finish_connect() {
                Ok(true) => None,
                Ok(false) if self.nonblock => Some(Step::Done(Err(libc::EAGAIN))),
                Ok(false) => Some(Step::Wait(Wait::Readable(self.fd()))),
                Err(e) => Some(Step::Done(Err(e))),
            },
            State::Connected => None,
            _ => Some(Step::Done(Err(libc::ENOTCONN))),
        }
    }

    /// `rshutdown`: a control message tells the peer; waits (briefly) for the sends.
    pub fn shutdown(&mut self, how: c_int) -> Step<()> {
        let Some(flow) = self.ep.as_mut().and_then(|e| e.flow.as_mut()) else { return Step::Done(Err(libc::ENOTCONN)) };
        if flow.connected {
            let ctrl = match how {
                libc::SHUT_RDWR => {
                    flow.readable = false;
                    flow.writable = false;
                    Some(wire::CTRL_DISCONNECT)
                }
                libc::SHUT_WR => {
                    flow.writable = false;
                    Some(if flow.readable { wire::CTRL_SHUTDOWN } else { wire::CTRL_DISCONNECT })
                }
                _ => {
                    flow.readable = false;
                    (!flow.writable).then_some(wire::CTRL_DISCONNECT)
                }
            };
            if let Some(c) = ctrl {
                match self.progress(false, |e| e.flow.as_ref().is_none_or(flow::Flow::can_send_ctrl)) {
                    Step::Done(Ok(())) => {}
                    other => return other,
                }
                if let Some(ep) = self.ep.as_mut() {
                    if let Err(e) = ep.send_ctrl(c) {
                        return Step::Done(Err(e));
                    }
                }
            }
        }
        match self.progress(false, |e| e.flow.as_ref().is_none_or(flow::Flow::all_sends_done)) {
            Step::Done(Err(libc::ENOTCONN)) => Step::Done(Ok(())),
            other => other,
        }
    }

    /// What `rpoll` reports for `events`, without waiting; `None` when nothing is ready
    /// yet, with the fd to wait on.
    pub fn poll_events(&mut self, events: i16) -> Result<i16, c_int> {
        match self.state {
            State::Listening => Ok(if readable_now(self.fd()) { events & libc::POLLIN } else { 0 }),
            State::Connecting => match self.finish_connect() {
                Ok(true) => self.poll_events(events),
                Ok(false) => Err(self.fd()),
                Err(_) => Ok((events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR),
            },
            State::ConnectError => Ok((events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR),
            State::Idle => Ok(0),
            State::Connected => self.poll_connected(events),
        }
    }

    fn poll_connected(&mut self, events: i16) -> Result<i16, c_int> {
        // Twice when the CQ was not armed: a completion that came between the look and
        // the arming raises no event, so the look after arming must see it.
        for _ in 0..2 {
            let _ = self.progress(true, |_| true);
            let r = self.connected_events(events);
            match self.ep.as_mut() {
                Some(ep) if r == 0 && !ep.comp.armed => ep.comp.arm(),
                Some(ep) if r == 0 => return Err(ep.comp.wait_fd()),
                _ => return Ok(r),
            }
        }
        match self.ep.as_mut() {
            Some(ep) => Err(ep.comp.wait_fd()),
            None => Ok(libc::POLLERR),
        }
    }

    /// The events of a connected socket now.
    fn connected_events(&self, events: i16) -> i16 {
        let Some(ep) = self.ep.as_ref() else { return libc::POLLERR };
        let Some(f) = ep.flow.as_ref() else { return libc::POLLERR };
        let mut r = 0;
        if events & libc::POLLIN != 0 && (f.has_data() || !f.readable) {
            r |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0 && ep.can_send() {
            r |= libc::POLLOUT;
        }
        // A hang-up is reported once what came before it is read, so an application that
        // stops at POLLHUP (rstream's do_poll does) does not lose the stream's tail.
        if !f.connected && !f.has_data() {
            r |= if ep.fault.is_some() { libc::POLLERR } else { libc::POLLHUP };
        }
        r
    }
}

impl Drop for RSocket {
    fn drop(&mut self) {
        let connected = self.ep.as_ref().and_then(|e| e.flow.as_ref()).is_some_and(|f| f.connected);
        if connected {
            // SAFETY: a live, connected id.
            unsafe { crate::cm::rdma_disconnect(self.id) };
        }
        // The endpoint (QP, buffers) and the mappings go before the id they were made on.
        self.ep = None;
        for m in self.maps.drain(..) {
            // SAFETY: registered in `map`, deregistered once.
            unsafe { crate::objects::ibv_dereg_mr(m.mr) };
        }
        // SAFETY: the socket's own id, destroyed once.
        unsafe { crate::cm::rdma_destroy_id(self.id) };
    }
}
