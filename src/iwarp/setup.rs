//! MPA connection setup (RFC 5044 §7.1, RFC 6581), sans-I/O: which side sends first and
//! what each may do when is the table in [`Setup::step`]. Bytes from the TCP stream go in,
//! bytes for it and one outcome come out; `now` is passed in for the timeouts.
//!
//! Negotiation: CRC is used when either frame sets C (RFC 5044 §7.1.2); markers are per
//! direction (a frame's M asks for markers in the stream its sender receives); revision 2
//! with the enhanced bit carries IRD/ORD and the peer-to-peer ready-to-receive (RTR) choice
//! (RFC 6581 §5-6): the initiator offers RTR kinds, the responder picks one, and the
//! initiator's first FPDU is that zero-length message.

use crate::proto::iwarp::mpa::{self, FrameKind, IrdOrd, MpaFramePacket, MpaFrameRepr};

/// What this side does about CRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrcPolicy {
    /// Never ask; refuse a peer that asks (siw's `mpa_crc_strict` without CRC).
    Off,
    /// Do not ask; use it when the peer asks.
    OnRequest,
    /// Ask for it.
    Required,
}

/// The zero-length message that tells the responder the initiator is ready (RFC 6581 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtrKind {
    /// A zero-length Send.
    Send,
    /// A zero-length RDMA Write.
    Write,
    /// A zero-length RDMA Read.
    Read,
}

/// This side's wishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// CRC.
    pub crc: CrcPolicy,
    /// Ask for markers in the stream this side receives.
    pub markers: bool,
    /// Revision to offer (initiator) or the highest accepted (responder): 1 or 2.
    pub revision: u8,
    /// Inbound RDMA Read depth offered.
    pub ird: u16,
    /// Outbound RDMA Read depth wanted.
    pub ord: u16,
    /// Peer-to-peer RTR kinds this side can send (initiator) or accept (responder), in
    /// order of preference; empty: no peer-to-peer mode.
    pub rtr: Vec<RtrKind>,
    /// Private data for the peer's ULP (at most 512 bytes with the IRD/ORD word).
    pub private_data: Vec<u8>,
    /// How long to wait for the peer's frame, ns.
    pub timeout_ns: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            crc: CrcPolicy::OnRequest,
            markers: false,
            revision: 2,
            ird: 16,
            ord: 16,
            rtr: vec![RtrKind::Write, RtrKind::Send, RtrKind::Read],
            private_data: Vec::new(),
            timeout_ns: 10_000_000_000,
        }
    }
}

/// What both sides agreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC32c on every FPDU, both ways.
    pub crc: bool,
    /// The peer puts markers in the stream this side receives.
    pub markers_rx: bool,
    /// This side puts markers in the stream it sends.
    pub markers_tx: bool,
    /// Revision in use.
    pub revision: u8,
    /// Inbound RDMA Reads this side accepts.
    pub ird: u16,
    /// Outbound RDMA Reads this side may have outstanding.
    pub ord: u16,
    /// Peer-to-peer: the RTR this side must send first (initiator) or wait for (responder).
    pub rtr: Option<RtrKind>,
    /// The peer's private data.
    pub peer_private_data: Vec<u8>,
}

/// How setup ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Connected: FPDUs follow.
    Established(Negotiated),
    /// The peer rejected (its private data), or this side rejected the peer (why).
    Rejected(String),
    /// The peer broke the protocol or said nothing in time.
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Initiator: the Request is queued; waiting for the Reply.
    AwaitReply,
    /// Responder: waiting for the Request.
    AwaitRequest,
    /// Responder (deferred): the Request is in; the application accepts or rejects it.
    AwaitAccept,
    /// Done (see `outcome`).
    Done,
}

/// One side of MPA setup on one TCP connection.
#[derive(Debug)]
pub struct Setup {
    policy: Policy,
    state: State,
    deadline_ns: u64,
    inbox: Vec<u8>,
    out: Vec<u8>,
    outcome: Option<Outcome>,
    /// Responder: hold a valid Request for [`Setup::accept`] rather than answer at once.
    defer: bool,
    /// The held Request frame.
    request: Vec<u8>,
    /// Initiator: the private data of the responder's reject Reply.
    reject_data: Vec<u8>,
}

impl Setup {
    /// Initiator: the private data the responder's reject Reply carried (empty if none).
    pub fn peer_reject_data(&self) -> &[u8] {
        &self.reject_data
    }
}

/// A held MPA Request, as the application sees it (rdma_cm's connect request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRequest {
    /// The initiator's private data.
    pub private_data: Vec<u8>,
    /// The initiator's IRD (revision 2 with the enhanced word; else this side's own).
    pub ird: u16,
    /// The initiator's ORD.
    pub ord: u16,
    /// MPA revision of the Request.
    pub revision: u8,
}

impl Setup {
    /// The active side: queues the MPA Request.
    pub fn initiator(policy: Policy, now_ns: u64) -> Setup {
        let mut s = Setup::new(policy, State::AwaitReply, now_ns);
        let p = &s.policy;
        let rtr = |k| p.rtr.contains(&k);
        let io = (p.revision == 2).then(|| IrdOrd {
            ird: p.ird,
            ord: p.ord,
            peer_to_peer: !p.rtr.is_empty(),
            send_rtr: rtr(RtrKind::Send),
            write_rtr: rtr(RtrKind::Write),
            read_rtr: rtr(RtrKind::Read),
        });
        let crc = p.crc == CrcPolicy::Required;
        let frame = frame(FrameKind::Request, p.markers, crc, false, p.revision, io, &p.private_data);
        s.out = frame;
        s
    }

    /// The passive side: waits for the Request.
    pub fn responder(policy: Policy, now_ns: u64) -> Setup {
        Setup::new(policy, State::AwaitRequest, now_ns)
    }

    /// The passive side that lets the application decide: a valid Request is held
    /// ([`Setup::pending_request`]) until [`Setup::accept`] or [`Setup::reject`].
    pub fn responder_deferred(policy: Policy, now_ns: u64) -> Setup {
        let mut s = Setup::new(policy, State::AwaitRequest, now_ns);
        s.defer = true;
        s
    }

    fn new(policy: Policy, state: State, now_ns: u64) -> Setup {
        let deadline_ns = now_ns.saturating_add(policy.timeout_ns);
        Setup {
            policy,
            state,
            deadline_ns,
            inbox: Vec::new(),
            out: Vec::new(),
            outcome: None,
            defer: false,
            request: Vec::new(),
            reject_data: Vec::new(),
        }
    }

    /// The held Request, while the application has not answered it.
    pub fn pending_request(&self) -> Option<PeerRequest> {
        if self.state != State::AwaitAccept {
            return None;
        }
        let f = MpaFramePacket::new_checked(&self.request[..]).and_then(|p| MpaFrameRepr::parse(&p)).ok()?;
        let (ird, ord) = f.ird_ord.map_or((self.policy.ord, self.policy.ird), |io| (io.ird, io.ord));
        Some(PeerRequest { private_data: f.private_data.to_vec(), ird, ord, revision: f.revision })
    }

    /// Accepts the held Request with this side's private data and read depths.
    pub fn accept(&mut self, private_data: Vec<u8>, ird: u16, ord: u16) {
        if self.state != State::AwaitAccept {
            return;
        }
        self.policy.private_data = private_data;
        self.policy.ird = ird;
        self.policy.ord = ord;
        let request = std::mem::take(&mut self.request);
        match MpaFramePacket::new_checked(&request[..]).and_then(|p| MpaFrameRepr::parse(&p)) {
            Ok(f) => self.answer_request(&f),
            Err(e) => self.fail_rejecting(format!("not an MPA frame ({e})")),
        }
    }

    /// Rejects the held Request: a Reply with R set carrying `private_data`.
    pub fn reject(&mut self, private_data: &[u8]) {
        if self.state != State::AwaitAccept {
            return;
        }
        let rev = self.policy.revision.clamp(1, 2);
        self.out = frame(FrameKind::Reply, false, false, true, rev, None, private_data);
        self.finish(Outcome::Rejected("the application rejected the connection".into()));
    }

    /// Bytes for the stream.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// The outcome, once there is one.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// The deadline of the whole handshake: the peer's frame, and on a deferred responder
    /// the application's answer, all within the timeout of the connection's start.
    pub fn poll_timeout(&self) -> Option<u64> {
        (self.state != State::Done).then_some(self.deadline_ns)
    }

    /// Ends setup when the handshake did not finish in time: a held Request is rejected
    /// (the peer hears so), a silent peer fails.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        if self.poll_timeout().is_none_or(|d| now_ns < d) {
            return;
        }
        let ms = self.policy.timeout_ns / 1_000_000;
        match self.state {
            State::AwaitAccept => self.fail_rejecting(format!("not accepted within {ms} ms")),
            State::AwaitRequest => self.finish(Outcome::Failed(format!("no MPA Request within {ms} ms"))),
            _ => self.finish(Outcome::Failed(format!("no MPA Reply within {ms} ms"))),
        }
    }

    /// True while a valid Request waits for the application.
    pub fn is_held(&self) -> bool {
        self.state == State::AwaitAccept
    }

    /// Bytes from the stream. Returns how many were consumed: bytes after the peer's frame
    /// are FPDUs and belong to the data phase.
    pub fn on_bytes(&mut self, data: &[u8]) -> usize {
        let mut used = 0;
        while matches!(self.state, State::AwaitRequest | State::AwaitReply) && used < data.len() {
            let need = self.frame_len() - self.inbox.len();
            let take = need.min(data.len() - used);
            self.inbox.extend_from_slice(&data[used..used + take]);
            used += take;
            let is_key = |k: &[u8; 16]| self.inbox.starts_with(k);
            if self.inbox.len() == mpa::HEADER_LEN && !is_key(mpa::KEY_REQUEST) && !is_key(mpa::KEY_REPLY) {
                let first = String::from_utf8_lossy(&self.inbox[..16]).into_owned();
                self.fail_rejecting(format!("not an MPA frame: {first:?}"));
            } else if self.inbox.len() == mpa::HEADER_LEN && self.frame_len() > mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA
            {
                let n = self.frame_len() - mpa::HEADER_LEN;
                self.fail_rejecting(format!("MPA private data of {n} bytes (512 at most)"));
            } else if self.inbox.len() == self.frame_len() && self.inbox.len() >= mpa::HEADER_LEN {
                self.step();
            }
        }
        used
    }

    /// Bytes of the frame being received, as far as known: the header, then the header
    /// and its private data.
    fn frame_len(&self) -> usize {
        if self.inbox.len() < mpa::HEADER_LEN {
            return mpa::HEADER_LEN;
        }
        mpa::HEADER_LEN + usize::from(u16::from_be_bytes([self.inbox[18], self.inbox[19]]))
    }

    /// The setup table: the peer's whole frame against this side's state.
    fn step(&mut self) {
        let inbox = std::mem::take(&mut self.inbox);
        let parsed = MpaFramePacket::new_checked(&inbox[..]).and_then(|p| MpaFrameRepr::parse(&p));
        let f = match parsed {
            Ok(f) => f,
            Err(e) => {
                let first = String::from_utf8_lossy(&inbox[..inbox.len().min(16)]).into_owned();
                return self.fail_rejecting(format!("not an MPA frame ({e}): {first:?}"));
            }
        };
        match (self.state, f.kind) {
            (State::AwaitRequest, FrameKind::Request) if self.defer => match self.check_request(&f) {
                Err(why) => self.fail_rejecting(why),
                Ok(()) => {
                    self.request = inbox;
                    self.state = State::AwaitAccept;
                }
            },
            (State::AwaitRequest, FrameKind::Request) => self.answer_request(&f),
            (State::AwaitReply, FrameKind::Reply) => self.take_reply(&f),
            (State::AwaitRequest, FrameKind::Reply) => {
                self.fail_rejecting("an MPA Reply where a Request belongs".into())
            }
            (State::AwaitReply, FrameKind::Request) => {
                self.finish(Outcome::Failed("an MPA Request from the responder".into()))
            }
            (State::Done | State::AwaitAccept, _) => {}
        }
    }

    /// Responder: check the Request, answer with a Reply (or a reject).
    fn answer_request(&mut self, f: &MpaFrameRepr<'_>) {
        let p = self.policy.clone();
        if let Err(why) = self.check_request(f) {
            return self.fail_rejecting(why);
        }
        let revision = f.revision.min(p.revision);
        let crc = f.crc || p.crc == CrcPolicy::Required;
        // RFC 6581 §5-6: answer IRD/ORD, and pick one RTR kind the initiator offered.
        let (io, rtr) = match f.ird_ord.filter(|_| revision == 2) {
            Some(peer) => {
                let offered = |k: RtrKind| match k {
                    RtrKind::Send => peer.send_rtr,
                    RtrKind::Write => peer.write_rtr,
                    RtrKind::Read => peer.read_rtr,
                };
                let rtr = if peer.peer_to_peer { p.rtr.iter().copied().find(|k| offered(*k)) } else { None };
                if peer.peer_to_peer && rtr.is_none() {
                    return self.fail_rejecting("no ready-to-receive kind in common".into());
                }
                let mine = IrdOrd {
                    ird: p.ird.min(peer.ord),
                    ord: p.ord.min(peer.ird),
                    peer_to_peer: rtr.is_some(),
                    send_rtr: rtr == Some(RtrKind::Send),
                    write_rtr: rtr == Some(RtrKind::Write),
                    read_rtr: rtr == Some(RtrKind::Read),
                };
                (Some(mine), rtr)
            }
            None => (None, None),
        };
        self.out = frame(FrameKind::Reply, p.markers, crc, false, revision, io, &p.private_data);
        self.finish(Outcome::Established(Negotiated {
            crc,
            markers_rx: p.markers,
            markers_tx: f.markers,
            revision,
            ird: io.map_or(p.ird, |i| i.ird),
            ord: io.map_or(p.ord, |i| i.ord),
            rtr,
            peer_private_data: f.private_data.to_vec(),
        }));
    }

    /// What makes a Request unanswerable whatever the application says.
    fn check_request(&self, f: &MpaFrameRepr<'_>) -> Result<(), String> {
        if !(1..=2).contains(&f.revision) {
            return Err(format!("MPA revision {} (1 and 2 are known)", f.revision));
        }
        if f.crc && self.policy.crc == CrcPolicy::Off {
            return Err("the initiator asks for CRC and this side's policy is off".into());
        }
        Ok(())
    }

    /// Initiator: the Reply settles it.
    fn take_reply(&mut self, f: &MpaFrameRepr<'_>) {
        let p = &self.policy;
        if f.reject {
            self.reject_data = f.private_data.to_vec();
            let pd = String::from_utf8_lossy(f.private_data).into_owned();
            return self.finish(Outcome::Rejected(format!("the responder rejected the connection ({pd:?})")));
        }
        if f.revision > p.revision || f.revision == 0 {
            return self.finish(Outcome::Failed(format!("MPA Reply with revision {}", f.revision)));
        }
        let crc = f.crc || p.crc == CrcPolicy::Required;
        if crc && p.crc == CrcPolicy::Off {
            return self.finish(Outcome::Failed("the responder turned CRC on against this side's policy".into()));
        }
        let rtr = match f.ird_ord {
            Some(io) if io.peer_to_peer => {
                let picked =
                    [(io.send_rtr, RtrKind::Send), (io.write_rtr, RtrKind::Write), (io.read_rtr, RtrKind::Read)];
                let mut chosen = picked.iter().filter(|(on, _)| *on).map(|(_, k)| *k);
                match (chosen.next(), chosen.next()) {
                    (Some(k), None) if p.rtr.contains(&k) => Some(k),
                    _ => return self.finish(Outcome::Failed("the Reply must pick one offered RTR kind".into())),
                }
            }
            _ => None,
        };
        let io = f.ird_ord;
        self.finish(Outcome::Established(Negotiated {
            crc,
            markers_rx: p.markers,
            markers_tx: f.markers,
            revision: f.revision,
            ird: io.map_or(p.ird, |i| p.ird.min(i.ord)),
            ord: io.map_or(p.ord, |i| p.ord.min(i.ird)),
            rtr,
            peer_private_data: f.private_data.to_vec(),
        }));
    }

    /// Refuses the peer: a Reply with R set (RFC 5044 §7.1.5), then setup ends.
    fn fail_rejecting(&mut self, why: String) {
        let p = &self.policy;
        if matches!(self.state, State::AwaitRequest | State::AwaitAccept) {
            self.out = frame(FrameKind::Reply, false, false, true, p.revision.clamp(1, 2), None, why.as_bytes());
        }
        self.finish(Outcome::Rejected(why));
    }

    fn finish(&mut self, o: Outcome) {
        self.state = State::Done;
        self.outcome = Some(o);
    }
}

fn frame(kind: FrameKind, markers: bool, crc: bool, reject: bool, rev: u8, io: Option<IrdOrd>, pd: &[u8]) -> Vec<u8> {
    let room = mpa::MAX_PRIVATE_DATA - if io.is_some() { mpa::IRD_ORD_LEN } else { 0 };
    let private_data = &pd[..pd.len().min(room)];
    let repr = MpaFrameRepr { kind, markers, crc, reject, reserved: 0, revision: rev, ird_ord: io, private_data };
    let mut buf = vec![0u8; repr.buffer_len()];
    // The private data was cut to the limit above, so emitting cannot fail.
    let _ = repr.emit(&mut buf);
    buf
}
