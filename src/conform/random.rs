//! `softrdma conform --random N`: structure-aware mutation of valid RoCEv2 traffic. Each
//! trial is drawn from its own seed: a valid request (SEND, WRITE or READ, at the PSN the
//! target expects) and one to three mutations of its fields (opcode, PSN, PadCnt, TVer,
//! P_Key, destination QP, AckReq, RETH, payload length, a cut, a byte, the ICRC). The
//! oracle holds whatever the mutation: every reply is a well-formed packet with a good ICRC
//! (IBTA A17.3.3), no acknowledgement names a PSN this side never sent (9.7.5.2.1), and the
//! target still takes a fresh connection afterwards. A failing trial is shrunk to the
//! fewest mutations that still fail, and printed with the seed that replays it.

use super::peer::Peer;
use super::{ConformArgs, Outcome, Verdict};
use crate::engine::rng::Rng;
use crate::proto::roce::ext::RethRepr;
use crate::proto::roce::Psn;

/// The valid request a trial starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// SEND Only of this many bytes.
    Send(u16),
    /// RDMA WRITE Only of this many bytes (the target grants nothing, so it is refused).
    Write(u16),
    /// RDMA READ Request for this many bytes.
    Read(u32),
}

/// One change to the valid request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// Another BTH opcode.
    Opcode(u8),
    /// The PSN moved by this much.
    PsnDelta(i32),
    /// Another PadCnt.
    PadCount(u8),
    /// Another transport header version.
    TVer(u8),
    /// Another P_Key.
    PKey(u16),
    /// Destination QP XORed with this.
    DestQpXor(u32),
    /// AckReq flipped.
    AckReqFlip,
    /// RETH virtual address, R_Key or DMA length (when there is a RETH).
    Reth(u64, u32, u32),
    /// The packet cut to this many bytes (before the ICRC).
    Truncate(u16),
    /// The byte at this offset XORed with this value.
    Flip(u16, u8),
    /// The ICRC left wrong.
    BadIcrc,
}

/// One trial: its seed, its base and its mutations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    /// The seed it was drawn from (`--random 1 --seed SEED` replays it).
    pub seed: u64,
    /// The valid request.
    pub base: Base,
    /// What was changed.
    pub mutations: Vec<Mutation>,
}

const OPCODES: [u8; 12] = [0x00, 0x01, 0x02, 0x04, 0x06, 0x0a, 0x0c, 0x11, 0x13, 0x14, 0x1f, 0x64];

impl Trial {
    /// Draws a trial from `seed`.
    pub fn draw(seed: u64, mtu: usize) -> Trial {
        let mut r = Rng::new(seed);
        let len = |r: &mut Rng| [0u16, 1, 16, (mtu - 1) as u16, mtu as u16][r.below(5) as usize];
        let base = match r.below(3) {
            0 => Base::Send(len(&mut r)),
            1 => Base::Write(len(&mut r)),
            _ => Base::Read([0u32, 1, 4096, u32::MAX][r.below(4) as usize]),
        };
        let n = 1 + r.below(3) as usize;
        let mutations = (0..n).map(|_| Mutation::draw(&mut r)).collect();
        Trial { seed, base, mutations }
    }
}

impl Mutation {
    fn draw(r: &mut Rng) -> Mutation {
        match r.below(11) {
            0 => Mutation::Opcode(if r.chance(0.5) { OPCODES[r.below(12) as usize] } else { r.below(256) as u8 }),
            1 => Mutation::PsnDelta([-1, 1, 2, -(1 << 22), 1 << 23, (1 << 23) - 1][r.below(6) as usize]),
            2 => Mutation::PadCount(r.below(4) as u8),
            3 => Mutation::TVer(1 + r.below(15) as u8),
            4 => Mutation::PKey([0x0000, 0x7fff, 0x8001, 0x1234][r.below(4) as usize]),
            5 => Mutation::DestQpXor(1 << r.below(24)),
            6 => Mutation::AckReqFlip,
            7 => Mutation::Reth(r.next_u64(), r.next_u64() as u32, [0, 1, 1 << 31, u32::MAX][r.below(4) as usize]),
            8 => Mutation::Truncate(r.below(40) as u16),
            9 => Mutation::Flip(r.below(64) as u16, 1 << r.below(8)),
            _ => Mutation::BadIcrc,
        }
    }
}

/// The trial's packet: the base built valid, then each mutation applied to its bytes, then
/// re-signed unless a mutation is about the ICRC. Returns it with the PSN it carries.
fn packet(p: &Peer, t: &Trial) -> (Vec<u8>, Psn) {
    let psn = p.epsn;
    let (opcode, len, reth) = match t.base {
        Base::Send(n) => (0x04, n as usize, None),
        Base::Write(n) => (0x0a, n as usize, Some(RethRepr { va: 0x1000, rkey: 0x5eed, dma_len: u32::from(n) })),
        Base::Read(n) => (0x0c, 0, Some(RethRepr { va: 0x1000, rkey: 0x5eed, dma_len: n })),
    };
    let payload = vec![0x5a; len];
    let mut r = crate::engine::qp::requester::bare(p.bth(opcode, psn, len), reth, None);
    r.payload = &payload;
    let mut b = p.build(&r, |_| {});
    let mut sent_psn = psn;
    let mut bad_icrc = false;
    // A cut comes last, so that every other mutation finds the bytes it changes.
    let (cuts, edits): (Vec<&Mutation>, Vec<&Mutation>) =
        t.mutations.iter().partition(|m| matches!(m, Mutation::Truncate(_)));
    for m in edits.into_iter().chain(cuts) {
        match *m {
            Mutation::Opcode(op) => b[0] = op,
            Mutation::PsnDelta(d) => {
                sent_psn = Psn::new(psn.value().wrapping_add(d as u32));
                b[9..12].copy_from_slice(&sent_psn.value().to_be_bytes()[1..]);
            }
            Mutation::PadCount(c) => b[1] = (b[1] & !0x30) | (c << 4),
            Mutation::TVer(v) => b[1] = (b[1] & 0xf0) | v,
            Mutation::PKey(k) => b[2..4].copy_from_slice(&k.to_be_bytes()),
            Mutation::DestQpXor(x) => {
                for (i, byte) in x.to_be_bytes()[1..].iter().enumerate() {
                    b[5 + i] ^= byte;
                }
            }
            Mutation::AckReqFlip => b[8] ^= 0x80,
            Mutation::Reth(va, rkey, len) if reth.is_some() && b.len() >= 32 => {
                b[12..20].copy_from_slice(&va.to_be_bytes());
                b[20..24].copy_from_slice(&rkey.to_be_bytes());
                b[24..28].copy_from_slice(&len.to_be_bytes());
            }
            Mutation::Reth(..) => {}
            Mutation::Truncate(n) => b.truncate(usize::from(n).max(4) + 4),
            Mutation::Flip(at, x) => {
                let i = usize::from(at) % b.len().saturating_sub(4).max(1);
                b[i] ^= x;
            }
            Mutation::BadIcrc => bad_icrc = true,
        }
    }
    let n = b.len();
    b[n - 4..].fill(0);
    let mut b = p.build_raw(&b);
    if bad_icrc {
        let n = b.len();
        b[n - 1] ^= 0x5a;
    }
    (b, sent_psn)
}

/// Runs one trial on a fresh connection; `Err` says which part of the oracle broke.
fn run_trial(a: &ConformArgs, t: &Trial) -> Result<(), String> {
    let mut p = Peer::connect(a, None, None).map_err(|e| format!("HUNG: no fresh connection: {e}"))?;
    let (bytes, sent) = packet(&p, t);
    p.send(&bytes);
    let replies = p.replies();
    if p.malformed > 0 {
        let n = p.malformed;
        return Err(format!("{n} malformed replies: {:?}", p.take_seen()));
    }
    let e = p.epsn;
    let top = e.distance_to(sent).max(0);
    for r in replies.iter().filter(|r| r.aeth.is_some()) {
        let d = e.distance_to(Psn::new(r.psn));
        // The acknowledged PSN is one sent (the mutated one too), or one before the
        // expected PSN (a coalesced or duplicate ACK), or the expected PSN (a NAK).
        if r.psn != sent.value() && !(-(1 << 22)..=top).contains(&d) {
            return Err(format!("{} names a PSN never sent", super::peer::describe(r)));
        }
    }
    super::cases::end_connection(&mut p);
    Ok(())
}

/// Whether a trial fails the oracle (the target restarting in between).
fn fails(a: &ConformArgs, t: &Trial) -> Option<String> {
    run_trial(a, t).err()
}

/// The fewest mutations of `t` that still fail, removing one at a time.
fn shrink(a: &ConformArgs, mut t: Trial) -> Trial {
    let mut i = 0;
    while i < t.mutations.len() && t.mutations.len() > 1 {
        let mut smaller = t.clone();
        smaller.mutations.remove(i);
        if fails(a, &smaller).is_some_and(|w| !w.starts_with("HUNG")) {
            t = smaller;
        } else {
            i += 1;
        }
    }
    t
}

/// `trials` trials from `seed`; one outcome per failure, and one for the whole run.
pub fn run(a: &ConformArgs, trials: u64, seed: u64) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut master = Rng::new(seed);
    for i in 0..trials {
        let t =
            if trials == 1 { Trial::draw(seed, a.mtu.bytes()) } else { Trial::draw(master.next_u64(), a.mtu.bytes()) };
        let Some(why) = fails(a, &t) else { continue };
        let small = if why.starts_with("HUNG") { t.clone() } else { shrink(a, t.clone()) };
        let verdict = if why.starts_with("HUNG") { Verdict::Hung(why) } else { Verdict::Deviates(why) };
        out.push(Outcome {
            name: format!("random trial {i} (seed {:#x})", t.seed),
            section: "A17.3.3, 9.7.5.2.1",
            expect: "well-formed replies, no ACK of an unsent PSN, alive after",
            verdict,
            seen: vec![format!(
                "minimal: {:?} with {:?}; replay: --random 1 --seed {:#x}",
                small.base, small.mutations, t.seed
            )],
        });
    }
    let failures = out.len();
    out.push(Outcome {
        name: format!("random: {trials} trials from seed {seed:#x}"),
        section: "A17.3.3, 9.7.5.2.1",
        expect: "every trial keeps the oracle",
        verdict: if failures == 0 { Verdict::Conforms } else { Verdict::Deviates(format!("{failures} trials failed")) },
        seen: vec![],
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_trial_every_time() {
        for seed in 0..200 {
            let t = Trial::draw(seed, 1024);
            assert_eq!(t, Trial::draw(seed, 1024));
            assert!((1..=3).contains(&t.mutations.len()));
        }
        let kinds: std::collections::BTreeSet<String> = (0..500)
            .flat_map(|s| Trial::draw(s, 1024).mutations)
            .map(|m| format!("{m:?}").split('(').next().unwrap().to_string())
            .collect();
        assert_eq!(kinds.len(), 11, "every kind of mutation is drawn: {kinds:?}");
    }
}
