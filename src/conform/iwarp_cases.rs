//! The iWARP catalogue (RFC 5040 RDMAP, RFC 5041 DDP, RFC 5044 MPA): each case's bytes,
//! the answer its section requires, and the judgement. The target runs rping's server
//! (restarted after each connection), which waits for the client's buffer description in a
//! Send and then reads that buffer with an RDMA Read Request: a Send that works is answered
//! by a Read Request, which is how the tester knows the target's QP is alive.

use super::iwarp::{untagged, write, IwPeer, IwReply};
use super::{ConformArgs, Verdict};
use crate::proto::iwarp::rdmap::{Layer, Opcode, ReadRequestRepr};

/// How a case connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// Through MPA setup (CRC as the tester was told).
    Mpa,
    /// Through MPA setup with CRC asked for.
    MpaWithCrc,
    /// TCP only: the case sends its own MPA frames.
    Tcp,
}

/// One iWARP case.
pub struct IwCase {
    /// Its name (`--case` matches on it).
    pub name: &'static str,
    /// The RFC and section it checks.
    pub section: &'static str,
    /// What the section requires.
    pub expect: &'static str,
    /// How it connects.
    pub setup: Setup,
    /// Sends its bytes and judges what comes back.
    pub run: fn(&mut IwPeer, &ConformArgs) -> Verdict,
}

/// The STag rping is told its source buffer has (any value: the tester answers no Read).
const CLIENT_STAG: u32 = 0x5eed_0001;
/// An STag the target never advertised.
const BAD_STAG: u32 = 0xdead_be00;

/// rping's buffer description (`struct rping_rdma_info`): address, rkey, size, big-endian.
fn rping_info(size: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&0x1000u64.to_be_bytes());
    b.extend_from_slice(&CLIENT_STAG.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b
}

/// Every iWARP case, in the order they run (the ones that may take the target's listener
/// down last).
pub fn catalogue() -> Vec<IwCase> {
    use Setup::*;
    let c = |name, section, expect, setup, run| IwCase { name, section, expect, setup, run };
    vec![
        c("send_is_delivered", "RFC 5040 §5.3", "the Send delivered: rping's Read Request follows", Mpa, send_ok),
        c("ddp_invalid_qn", "RFC 5041 §7.2", "Terminate DDP/untagged/invalid QN (1/2/0x01)", Mpa, invalid_qn),
        c("ddp_msn_range", "RFC 5041 §7.2", "Terminate DDP/untagged/invalid MSN range (1/2/0x03)", Mpa, msn_range),
        c("ddp_message_too_long", "RFC 5041 §7.2", "Terminate DDP/untagged/message too long (1/2/0x05)", Mpa, too_long),
        c("ddp_invalid_mo", "RFC 5041 §7.2", "Terminate DDP/untagged/invalid MO or too long (1/2/0x04-5)", Mpa, bad_mo),
        c(
            "ddp_invalid_version",
            "RFC 5041 §7.2",
            "Terminate DDP/untagged/invalid DDP version (1/2/0x06)",
            Mpa,
            ddp_version,
        ),
        c(
            "write_invalid_stag",
            "RFC 5041 §7.2",
            "Terminate DDP/tagged/invalid STag (1/1/0x00) or RDMAP's",
            Mpa,
            write_stag,
        ),
        c(
            "read_invalid_stag",
            "RFC 5040 §7.1",
            "Terminate RDMAP/remote protection/invalid STag (0/1/0x00)",
            Mpa,
            read_stag,
        ),
        c(
            "read_response_never_asked",
            "RFC 5040 §7.1",
            "a Terminate (unexpected opcode or invalid STag)",
            Mpa,
            ghost_resp,
        ),
        c(
            "rdmap_reserved_opcode",
            "RFC 5040 §7.1",
            "Terminate RDMAP/remote operation/unexpected opcode (0/2/0x06)",
            Mpa,
            bad_op,
        ),
        c(
            "rdmap_invalid_version",
            "RFC 5040 §7.1",
            "Terminate RDMAP/remote operation/invalid version (0/2/0x05)",
            Mpa,
            rdmap_ver,
        ),
        c("terminate_is_not_answered", "RFC 5040 §6.1", "no Terminate in return; the stream closed", Mpa, term_quiet),
        c(
            "ddp_error_right_after_reply",
            "RFC 5044 §7.1",
            "5 times, a bad-QN Send at once after the MPA Reply: a Terminate each time",
            Mpa,
            at_once,
        ),
        c(
            "mpa_crc_error",
            "RFC 5044 §8",
            "the stream closed; a Terminate, if any, names MPA CRC error (2/0/0x02)",
            MpaWithCrc,
            crc_err,
        ),
        c("mpa_bad_key", "RFC 5044 §7.1", "no accepting MPA Reply; the connection closed", Tcp, bad_key),
        c("mpa_unknown_revision", "RFC 5044 §7.1", "no accepting MPA Reply; the connection closed", Tcp, bad_rev),
        c("mpa_private_data_too_long", "RFC 5044 §7.1", "no accepting MPA Reply; the connection closed", Tcp, long_pd),
        c("mpa_peer_closes_silently", "RFC 5044 §7.1", "the listener still serves the next initiator", Tcp, silent),
    ]
}

fn seen(r: &[IwReply]) -> String {
    if r.is_empty() {
        return "silence".into();
    }
    r.iter().map(super::iwarp::describe).collect::<Vec<_>>().join(", ")
}

/// The first reply is a Terminate with one of `codes`.
fn terminated(r: &[IwReply], codes: &[(Layer, u8, u8)]) -> Verdict {
    match r.first() {
        Some(IwReply::Terminate(l, t, c)) if codes.contains(&(*l, *t, *c)) => Verdict::Conforms,
        Some(IwReply::Terminate(l, t, c)) => {
            // RFC 5040 §4.8 puts the layer in the high nibble of the first byte and the
            // error type in the low one; a sender that swaps them is named as such.
            let swapped = (Layer::from_bits(*t), l.bits(), *c);
            if codes.contains(&swapped) {
                let (sl, st, sc) = swapped;
                let what = crate::proto::iwarp::rdmap::describe(sl, st, sc);
                let byte = l.bits() << 4 | *t;
                Verdict::Deviates(format!(
                    "layer and error type swapped: first byte 0x{byte:02x}, read as {l:?}/{t}; the code meant is {sl:?}/{st}/0x{sc:02x} ({what})"
                ))
            } else {
                Verdict::Deviates(format!("got {}", seen(r)))
            }
        }
        _ => Verdict::Deviates(format!("got {}", seen(r))),
    }
}

fn send_ok(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    let m = p.send_msg(Opcode::Send, 0, &rping_info(64));
    p.send_fpdu(&m, false);
    let r = p.replies(false);
    match r.first() {
        Some(IwReply::ReadRequest { src_stag: CLIENT_STAG, size: 64 }) => Verdict::Conforms,
        None => Verdict::Hung("no Read Request after a valid Send".into()),
        _ => Verdict::Deviates(format!("got {}", seen(&r))),
    }
}

fn invalid_qn(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    p.send_fpdu(&untagged(Opcode::Send, 5, 1, 0, &rping_info(64)), false);
    terminated(&p.replies(false), &[(Layer::Ddp, 2, 0x01)])
}

fn msn_range(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    p.send_fpdu(&untagged(Opcode::Send, 0, 1000, 0, &rping_info(64)), false);
    terminated(&p.replies(false), &[(Layer::Ddp, 2, 0x03)])
}

fn too_long(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    // rping posts a receive of 16 bytes (its buffer description).
    let m = p.send_msg(Opcode::Send, 0, &[0x11; 1000]);
    p.send_fpdu(&m, false);
    terminated(&p.replies(false), &[(Layer::Ddp, 2, 0x05)])
}

fn bad_mo(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    p.send_fpdu(&untagged(Opcode::Send, 0, 1, 8192, &[0x22; 8]), false);
    terminated(&p.replies(false), &[(Layer::Ddp, 2, 0x04), (Layer::Ddp, 2, 0x05)])
}

fn ddp_version(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    let mut m = p.send_msg(Opcode::Send, 0, &rping_info(64));
    m[0] &= !0x03;
    p.send_fpdu(&m, false);
    terminated(&p.replies(false), &[(Layer::Ddp, 2, 0x06)])
}

fn write_stag(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    p.send_fpdu(&write(BAD_STAG, 0, &[0x33; 64]), false);
    terminated(&p.replies(false), &[(Layer::Ddp, 1, 0x00), (Layer::Rdmap, 1, 0x00)])
}

fn read_stag(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    let req = ReadRequestRepr { sink_stag: CLIENT_STAG, sink_to: 0, size: 64, src_stag: BAD_STAG, src_to: 0 };
    let mut body = [0u8; ReadRequestRepr::LEN];
    let _ = req.emit(&mut body);
    let m = p.send_msg(Opcode::ReadRequest, 1, &body);
    p.send_fpdu(&m, false);
    terminated(&p.replies(false), &[(Layer::Rdmap, 1, 0x00)])
}

fn ghost_resp(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    let mut m = write(BAD_STAG, 0, &[0x44; 64]);
    m[1] = (m[1] & 0xf0) | Opcode::ReadResponse as u8;
    p.send_fpdu(&m, false);
    let ok = [(Layer::Rdmap, 2, 0x06), (Layer::Ddp, 1, 0x00), (Layer::Rdmap, 1, 0x00)];
    terminated(&p.replies(false), &ok)
}

fn bad_op(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    let mut m = p.send_msg(Opcode::Send, 0, &rping_info(64));
    m[1] = (m[1] & 0xf0) | 0x0e;
    p.send_fpdu(&m, false);
    terminated(&p.replies(false), &[(Layer::Rdmap, 2, 0x06)])
}

fn rdmap_ver(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    let mut m = p.send_msg(Opcode::Send, 0, &rping_info(64));
    m[1] &= 0x3f;
    p.send_fpdu(&m, false);
    terminated(&p.replies(false), &[(Layer::Rdmap, 2, 0x05)])
}

fn term_quiet(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    // RDMAP / remote operation / unexpected opcode, with no headers copied.
    let body = [0x02, 0x06, 0x00, 0x00];
    p.send_fpdu(&untagged(Opcode::Terminate, 2, 1, 0, &body), false);
    let r = p.replies(false);
    if r.iter().any(|x| matches!(x, IwReply::Terminate(..))) {
        return Verdict::Deviates(format!("answered the Terminate with {}", seen(&r)));
    }
    if r.last() == Some(&IwReply::Closed) {
        Verdict::Conforms
    } else {
        Verdict::Deviates(format!("the stream stayed open: {}", seen(&r)))
    }
}

fn crc_err(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    if !p.crc {
        return Verdict::Deviates("the target did not agree to CRC when asked".into());
    }
    let m = p.send_msg(Opcode::Send, 0, &rping_info(64));
    p.send_fpdu(&m, true);
    let r = p.replies(false);
    if let Some(term) = r.iter().find(|x| matches!(x, IwReply::Terminate(..))) {
        // A Terminate is optional here; if one comes it must name the CRC error.
        let v = terminated(std::slice::from_ref(term), &[(Layer::Llp, 0, 0x02)]);
        if v != Verdict::Conforms {
            return v;
        }
    }
    if r.iter().any(|x| matches!(x, IwReply::ReadRequest { .. })) {
        return Verdict::Deviates(format!("the Send was delivered: {}", seen(&r)));
    }
    if r.last() == Some(&IwReply::Closed) {
        Verdict::Conforms
    } else {
        Verdict::Deviates(format!("the stream stayed open: {}", seen(&r)))
    }
}

/// Five connections, each sending an erroneous Send the moment the MPA Reply is in (the
/// initiator may send then: the responder is ready once it has replied).
fn at_once(p: &mut IwPeer, a: &ConformArgs) -> Verdict {
    p.shutdown();
    let eager = ConformArgs { settle: std::time::Duration::ZERO, ..a.clone() };
    let mut silent = 0;
    for _ in 0..5 {
        let mut c = match p.another(&eager) {
            Ok(c) => c,
            Err(e) => return Verdict::Hung(format!("no fresh connection: {e}")),
        };
        c.send_fpdu(&untagged(Opcode::Send, 5, 1, 0, &rping_info(64)), false);
        let r = c.replies(false);
        if !matches!(r.first(), Some(IwReply::Terminate(..))) {
            silent += 1;
        }
        c.close();
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    match silent {
        0 => Verdict::Conforms,
        n => Verdict::Deviates(format!("{n} of 5 got no Terminate (with a settle time they all do)")),
    }
}

/// An MPA Request built by hand: `key`, revision, and `pd_len` bytes of private data.
fn mpa_request(key: &[u8; 16], revision: u8, pd_len: usize) -> Vec<u8> {
    let mut b = key.to_vec();
    b.push(0x00);
    b.push(revision);
    b.extend_from_slice(&(pd_len as u16).to_be_bytes());
    b.resize(20 + pd_len, 0x77);
    b
}

/// No accepting Reply came, and the connection ended.
fn refused(p: &mut IwPeer) -> Verdict {
    let r = p.replies(true);
    if r.iter().any(|x| matches!(x, IwReply::MpaReply { reject: false })) {
        return Verdict::Deviates(format!("accepted: {}", seen(&r)));
    }
    if r.last() == Some(&IwReply::Closed) {
        Verdict::Conforms
    } else {
        Verdict::Deviates(format!("the connection stayed open: {}", seen(&r)))
    }
}

fn bad_key(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    p.write_raw(&mpa_request(b"MPA ID Req Frime", 1, 0));
    refused(p)
}

fn bad_rev(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    p.write_raw(&mpa_request(crate::proto::iwarp::mpa::KEY_REQUEST, 7, 0));
    refused(p)
}

fn long_pd(p: &mut IwPeer, _: &ConformArgs) -> Verdict {
    p.write_raw(&mpa_request(crate::proto::iwarp::mpa::KEY_REQUEST, 1, 1000));
    refused(p)
}

/// A TCP connection that sends nothing and closes; then a new initiator must get through.
fn silent(p: &mut IwPeer, a: &ConformArgs) -> Verdict {
    let _ = p.replies(false);
    p.shutdown();
    std::thread::sleep(std::time::Duration::from_millis(500));
    match p.another(a) {
        Ok(mut fresh) => {
            let v = send_ok(&mut fresh, a);
            fresh.close();
            v
        }
        Err(e) => Verdict::Hung(format!("the next initiator: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminate_is_judged_by_its_codes_and_swapped_nibbles_are_named() {
        let want = [(Layer::Ddp, 2, 0x01)];
        assert_eq!(terminated(&[IwReply::Terminate(Layer::Ddp, 2, 0x01)], &want), Verdict::Conforms);
        // DDP (1) / untagged (2) sent as 0x21: read as LLP / 1.
        match terminated(&[IwReply::Terminate(Layer::Llp, 1, 0x01), IwReply::Closed], &want) {
            Verdict::Deviates(why) => assert!(why.contains("swapped: first byte 0x21"), "{why}"),
            v => panic!("{v:?}"),
        }
        assert!(matches!(terminated(&[IwReply::Closed], &want), Verdict::Deviates(_)));
        assert!(matches!(terminated(&[IwReply::Terminate(Layer::Ddp, 2, 0x02)], &want), Verdict::Deviates(_)));
    }
}
