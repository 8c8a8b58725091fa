use super::*;

fn region(bytes: &[u8]) -> Arc<SharedMem> {
    let mem = SharedMem::new(bytes.len());
    assert!(mem.write(0, bytes));
    Arc::new(mem)
}

/// What the iovecs point at, read back (they point at this test's own memory).
#[allow(unsafe_code)]
fn gathered(iovs: &[libc::iovec]) -> Vec<u8> {
    let mut v = Vec::new();
    for iov in iovs {
        // SAFETY: each iovec names live bytes of a queue or region this test holds.
        v.extend_from_slice(unsafe { std::slice::from_raw_parts(iov.iov_base as *const u8, iov.iov_len) });
    }
    v
}

/// Up to `max` of the queue's iovecs, as the driver gathers them into its array.
fn iovecs(q: &TxQueue, max: usize) -> Option<Vec<libc::iovec>> {
    let mut out = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; max];
    let n = q.iovecs(&mut out)?;
    out.truncate(n);
    Some(out)
}

/// "hd" + span "0123456789"[2..7] + "mid" + span "0123456789"[0..3] + "end".
fn mixed(mem: &Arc<SharedMem>) -> Output {
    let mut out = Output::from(b"hd".to_vec());
    out.splice(MemSpan { mem: mem.clone(), offset: 2, len: 5 });
    out.bytes_mut().extend_from_slice(b"mid");
    out.splice(MemSpan { mem: mem.clone(), offset: 0, len: 3 });
    out.splice(MemSpan { mem: mem.clone(), offset: 0, len: 0 });
    out.bytes_mut().extend_from_slice(b"end");
    out
}

#[test]
fn an_output_is_its_bytes_with_the_spans_in_place() {
    let mem = region(b"0123456789");
    let out = mixed(&mem);
    assert_eq!(out.len(), 16);
    assert_eq!(out.to_vec(), b"hd23456mid012end");
    let mark = out.mark();
    let mut longer = mixed(&mem);
    longer.splice(MemSpan { mem: mem.clone(), offset: 9, len: 1 });
    longer.bytes_mut().push(b'!');
    longer.truncate(mark);
    assert_eq!(longer.to_vec(), b"hd23456mid012end", "truncated back to the mark");
}

#[test]
fn every_cut_of_a_queue_reads_the_same_octets_by_copy_and_by_iovec() {
    let mem = region(b"0123456789");
    let whole: Vec<u8> = [&b"hd23456mid012end"[..], b"xy", b"hd23456mid012end"].concat();
    for cut in 0..=whole.len() {
        let mut q = TxQueue::default();
        q.push(mixed(&mem));
        q.push(Output::from(b"xy".to_vec()));
        q.push(Output::default());
        q.push(mixed(&mem));
        assert_eq!(q.len(), whole.len());
        q.consume(cut);
        assert_eq!(q.len(), whole.len() - cut);
        let mut copy = vec![0u8; whole.len() + 5];
        let n = q.copy_front(&mut copy).unwrap();
        assert_eq!(&copy[..n], &whole[cut..], "copied after {cut}");
        assert_eq!(gathered(&iovecs(&q, 64).unwrap()), &whole[cut..], "gathered after {cut}");
        let few = iovecs(&q, 2).unwrap();
        assert!(few.len() <= 2 && whole[cut..].starts_with(&gathered(&few)));
        let mut short = [0u8; 3];
        let n = q.copy_front(&mut short).unwrap();
        assert_eq!(&short[..n], &whole[cut..(cut + 3).min(whole.len())]);
    }
}

#[test]
#[allow(unsafe_code)]
fn a_revoked_regions_span_is_refused_not_read() {
    let mut app = *b"abcdefgh";
    let ptr = std::ptr::NonNull::new(app.as_mut_ptr()).unwrap();
    // SAFETY: `app` outlives the region, which is revoked before the test ends.
    let mem = Arc::new(unsafe { SharedMem::foreign(ptr, app.len()) });
    let mut out = Output::from(b"<".to_vec());
    out.splice(MemSpan { mem: mem.clone(), offset: 1, len: 6 });
    out.bytes_mut().push(b'>');
    let mut q = TxQueue::default();
    q.push(out);
    assert_eq!(gathered(&iovecs(&q, 8).unwrap()), b"<bcdefg>");
    mem.revoke();
    assert!(iovecs(&q, 8).is_none(), "no iovec into the application's buffer");
    assert_eq!(q.copy_front(&mut [1u8; 8]), None);
    q.consume(1);
    assert!(iovecs(&q, 8).is_none() && q.copy_front(&mut [0u8; 3]).is_none(), "nor from inside the queue");
}

#[test]
fn written_chunks_are_reused_within_their_limits() {
    let mut q = TxQueue::default();
    let chunk = |cap: usize| {
        let mut v = Vec::with_capacity(cap);
        v.push(1u8);
        Output::from(v)
    };
    // Busy: every written chunk is kept, up to the byte limit; an oversized one never.
    let n = SPARE_BYTES_MAX / (1 << 20) + 8;
    for _ in 0..n {
        q.push(chunk(1 << 20));
    }
    q.push(chunk(SPARE_CHUNK_BYTES + 1));
    q.push(Output::from(b"tail".to_vec()));
    q.consume(n + 1);
    assert_eq!(q.spare.len(), SPARE_BYTES_MAX / (1 << 20));
    assert!(q.spare_bytes <= SPARE_BYTES_MAX);
    let reused = q.spare();
    assert!(reused.is_empty() && reused.capacity() >= 1 << 20, "a written chunk, emptied");
    // Idle: all but a few are freed.
    q.consume(4);
    assert!(q.is_empty());
    assert_eq!(q.spare.len(), SPARE_IDLE);
    assert_eq!(q.spare_bytes, q.spare.iter().map(Vec::capacity).sum::<usize>());
}
