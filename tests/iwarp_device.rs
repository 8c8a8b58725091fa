//! The iWARP device driven with no I/O at all, as a simulator drives it: two devices whose
//! "TCP streams" are byte queues this test moves, cut at random places, with a clock it
//! sets. Connection setup through every `ConnState`, every operation with its data checked,
//! and the peer's close.

use softrdma::engine::mem::{Access, Mr};
use softrdma::engine::verbs::{QpCaps, QpState, RecvWr, Remote, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus};
use softrdma::engine::{Device, DeviceConfig};
use softrdma::iwarp::config::{ConnParam, IwarpConfig};
use softrdma::iwarp::device::{ConnId, ConnState, IwarpDevice};

struct Side {
    dev: IwarpDevice,
    pd: softrdma::engine::mem::Pd,
    cq: u32,
    mr: Mr,
    qpn: u32,
}

fn side(seed: u64) -> Side {
    let cfg = DeviceConfig { gid: [0; 16], seed: Some(seed), max_qps: 16, max_mrs: 16, cc: Default::default() };
    // Peer-to-peer offered, so its held RTR is on the path under test.
    let mut dev = IwarpDevice::new(Device::new(cfg), IwarpConfig { offer_rtr: true, ..IwarpConfig::default() });
    let pd = dev.dev.alloc_pd();
    let cq = dev.dev.create_cq(256);
    let mr = dev.dev.reg_mr(pd, 1 << 20, Access::ALL).unwrap();
    let qpn = dev.create_qp(pd, (cq, cq), QpCaps::default(), None).unwrap();
    Side { dev, pd, cq, mr, qpn }
}

/// A tiny deterministic generator for where streams are cut.
struct Cuts(u64);
impl Cuts {
    fn next(&mut self, max: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        1 + (self.0 >> 33) as usize % max.max(1)
    }
}

/// Moves one random piece of what `from` has for `to`; false if it had nothing.
fn move_piece(from: &mut Side, tf: ConnId, to: &mut Side, tt: ConnId, cuts: &mut Cuts) -> bool {
    let pending = from.dev.tx_pending_len(tf);
    if pending == 0 {
        return false;
    }
    let n = cuts.next(pending.min(3000));
    let mut piece = vec![0u8; n];
    assert_eq!(from.dev.tx_copy_pending(tf, &mut piece), n);
    from.dev.on_written(tf, n);
    to.dev.on_bytes(tt, &piece);
    true
}

/// Moves every byte each side has for the other, in random pieces, until both are quiet.
fn shuttle(a: &mut Side, ta: ConnId, b: &mut Side, tb: ConnId, cuts: &mut Cuts) {
    for _ in 0..100_000 {
        let ab = move_piece(a, ta, b, tb, cuts);
        let ba = move_piece(b, tb, a, ta, cuts);
        if !ab && !ba {
            return;
        }
    }
    panic!("the streams never went quiet");
}

fn sge(m: &Mr, off: usize, len: usize) -> Sge {
    Sge { addr: m.addr + off as u64, length: len as u32, lkey: m.lkey }
}

fn completions(s: &mut Side) -> Vec<Wc> {
    s.dev
        .take_completions()
        .into_iter()
        .flat_map(|(cq, wcs)| {
            assert_eq!(cq, s.cq);
            wcs
        })
        .collect()
}

#[test]
fn two_devices_with_no_io_connect_and_run_every_operation() {
    let (mut a, mut b) = (side(1), side(2));
    let mut cuts = Cuts(7);
    let param = |pd: &[u8]| ConnParam { private_data: pd.to_vec(), responder_resources: 4, initiator_depth: 4 };
    // The passive side listens; the active side connects; "TCP" comes up on both.
    let l = b.dev.listen();
    let ta = a.dev.connect(a.qpn, &param(b"hello")).unwrap();
    assert_eq!(a.dev.conn_state(ta), Some(ConnState::TcpConnecting));
    let tb = b.dev.on_tcp_accepted(l, 1460);
    assert_eq!(b.dev.conn_state(tb), Some(ConnState::Mpa));
    a.dev.on_tcp_connected(ta, 1460);
    assert_eq!(a.dev.conn_state(ta), Some(ConnState::Mpa));
    shuttle(&mut a, ta, &mut b, tb, &mut cuts);
    assert_eq!(b.dev.conn_state(tb), Some(ConnState::AwaitAccept));
    let (r, req) = b.dev.take_request(l).expect("the MPA Request, held for the application");
    assert_eq!((r, req.private_data.as_slice()), (tb, &b"hello"[..]));
    b.dev.post_recv(b.qpn, RecvWr { wr_id: 9, sgl: vec![sge(&b.mr, 0, 4096)] }).unwrap();
    b.dev.accept(tb, b.qpn, &param(b"welcome")).unwrap();
    shuttle(&mut a, ta, &mut b, tb, &mut cuts);
    assert_eq!(a.dev.take_result(ta), Some(Ok(b"welcome".to_vec())));
    assert_eq!(
        (a.dev.conn_state(ta), b.dev.conn_state(tb)),
        (Some(ConnState::Established), Some(ConnState::Established))
    );

    // A Send, a 300 KiB Write and a Read of it back, each piece of each stream cut at random.
    let msg: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    a.mr.mem.write(0, &msg);
    a.dev.post_send(a.qpn, [SendWr::new(1, SendOp::Send, vec![sge(&a.mr, 0, 3000)])]).unwrap();
    let big: Vec<u8> = (0..300 * 1024u32).map(|i| (i ^ (i >> 7)) as u8).collect();
    a.mr.mem.write(4096, &big);
    let remote = Remote { addr: b.mr.addr + 8192, rkey: b.mr.rkey };
    a.dev.post_send(a.qpn, [SendWr::new(2, SendOp::Write(remote), vec![sge(&a.mr, 4096, big.len())])]).unwrap();
    a.dev.post_send(a.qpn, [SendWr::new(3, SendOp::Read(remote), vec![sge(&a.mr, 512 * 1024, big.len())])]).unwrap();
    // The initiator's RTR, and all behind it, waits out `IwarpConfig::first_fpdu_delay_us`.
    assert_eq!(a.dev.tx_pending_len(ta), 0, "nothing before the RTR");
    let rtr_at = a.dev.poll_timeout().expect("the held RTR's deadline");
    a.dev.set_now(rtr_at);
    a.dev.handle_timeout();
    assert!(a.dev.tx_pending_len(ta) > 0);
    shuttle(&mut a, ta, &mut b, tb, &mut cuts);
    let got_a: Vec<(u64, WcStatus)> = completions(&mut a).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got_a, vec![(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
    let got_b = completions(&mut b);
    assert_eq!((got_b.len(), got_b[0].wr_id, got_b[0].opcode, got_b[0].byte_len), (1, 9, WcOpcode::Recv, 3000));
    let (mut at_b, mut back) = (vec![0u8; 3000], vec![0u8; big.len()]);
    b.mr.mem.read(0, &mut at_b);
    a.mr.mem.read(512 * 1024, &mut back);
    assert_eq!(at_b, msg);
    assert!(back == big, "the Read returns what the Write placed");

    // The peer's stream closes: the QP goes to ERR, the connection ends, and the driver is
    // told to close its stream.
    b.dev.on_tcp_closed(tb, "the peer closed");
    assert_eq!(b.dev.qp_state(b.qpn), Some(QpState::Err));
    assert_eq!(b.dev.take_closed(), vec![tb]);
    assert_eq!(b.dev.connections(), 0);
}

/// A region deregistered while its bytes wait, spliced, in a connection's queue (the
/// application broke the rule that a buffer stays registered while its request is
/// outstanding): the stream cannot carry what it promised, so the connection ends before
/// another byte is written, the QP goes to ERR with the request flushed, and the driver is
/// told to close the stream; nothing of the buffer is read after it was given back.
#[test]
#[allow(unsafe_code)]
fn a_region_deregistered_with_its_bytes_queued_ends_the_connection() {
    let (mut a, mut b) = (side(3), side(4));
    let mut cuts = Cuts(11);
    let param = ConnParam { private_data: Vec::new(), responder_resources: 4, initiator_depth: 4 };
    let l = b.dev.listen();
    let ta = a.dev.connect(a.qpn, &param).unwrap();
    let tb = b.dev.on_tcp_accepted(l, 65483);
    a.dev.on_tcp_connected(ta, 65483);
    shuttle(&mut a, ta, &mut b, tb, &mut cuts);
    let (r, _) = b.dev.take_request(l).expect("the request");
    b.dev.accept(r, b.qpn, &param).unwrap();
    shuttle(&mut a, ta, &mut b, tb, &mut cuts);
    let rtr_at = a.dev.poll_timeout().expect("the held RTR's deadline");
    a.dev.set_now(rtr_at);
    a.dev.handle_timeout();
    shuttle(&mut a, ta, &mut b, tb, &mut cuts);
    assert_eq!(a.dev.conn_state(ta), Some(ConnState::Established));

    let mut app = vec![5u8; 200_000];
    let ptr = std::ptr::NonNull::new(app.as_mut_ptr()).unwrap();
    // SAFETY: `app` outlives the region, which is deregistered (revoked) below.
    let mem = std::sync::Arc::new(unsafe { softrdma::engine::mem::SharedMem::foreign(ptr, app.len()) });
    let theirs = a.dev.dev.reg_mem(a.pd, mem, Access::ALL).unwrap();
    let remote = Remote { addr: b.mr.addr, rkey: b.mr.rkey };
    a.dev.post_send(a.qpn, [SendWr::new(1, SendOp::Write(remote), vec![sge(&theirs, 0, 150_000)])]).unwrap();
    assert!(a.dev.tx_pending_len(ta) > 150_000, "framed, its payload spliced in");
    let mut iovs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 64];
    assert!(a.dev.tx_pending_iovecs(ta, &mut iovs) > 0, "nothing wrong yet");
    a.dev.dev.dereg_mr(&theirs).unwrap();
    assert_eq!(a.dev.tx_pending_iovecs(ta, &mut iovs), 0, "the stream cannot carry the deregistered bytes");
    assert_eq!(a.dev.conn_state(ta), None);
    assert!(a.dev.take_closed().contains(&ta), "the driver is told to close the stream");
    let wcs: Vec<(u64, WcStatus)> = completions(&mut a).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(wcs, [(1, WcStatus::WrFlushErr)]);
    assert_eq!(a.dev.qp_state(a.qpn), Some(QpState::Err));
    drop(app);
}
