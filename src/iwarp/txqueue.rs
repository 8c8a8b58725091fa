//! What an iWARP connection has for its stream: framed bytes with spans of registered
//! memory spliced in, so that the payload of a Send, Write or Read Response reaches the
//! socket in one vectored write, read in place by the kernel as a NIC's DMA reads it, with
//! no copy into a stream buffer first. The octets are RFC 5044 §4's FPDUs either way.

use crate::engine::mem::SharedMem;
use std::collections::VecDeque;
use std::sync::Arc;

/// Octets of registered memory sent from where they lie.
#[derive(Debug, Clone)]
pub struct MemSpan {
    /// The region's bytes (kept alive while the span is queued).
    pub mem: Arc<SharedMem>,
    /// Where the span starts in `mem`.
    pub offset: usize,
    /// Octets.
    pub len: usize,
}

/// A stretch of output: the framed bytes (headers, pads, CRCs, copied payloads), and
/// memory spans spliced in between them.
#[derive(Debug, Default)]
pub struct Output {
    bytes: Vec<u8>,
    /// Each span with the position in `bytes` it comes before, positions non-decreasing.
    spans: Vec<(usize, MemSpan)>,
    spans_len: usize,
}

/// Where [`Output::truncate`] goes back to.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    bytes: usize,
    spans: usize,
    spans_len: usize,
}

/// One contiguous piece of an [`Output`].
enum Piece<'a> {
    Bytes(&'a [u8]),
    Mem(&'a MemSpan),
}

impl Piece<'_> {
    fn len(&self) -> usize {
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::Mem(s) => s.len,
        }
    }
}

impl From<Vec<u8>> for Output {
    fn from(bytes: Vec<u8>) -> Self {
        Output { bytes, spans: Vec::new(), spans_len: 0 }
    }
}

impl Output {
    /// Octets in all.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.spans_len
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The framed bytes, to append to.
    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Appends `span` after everything so far.
    pub fn splice(&mut self, span: MemSpan) {
        if span.len > 0 {
            self.spans_len += span.len;
            self.spans.push((self.bytes.len(), span));
        }
    }

    /// Where the output ends now, for [`Output::truncate`].
    pub fn mark(&self) -> Mark {
        Mark { bytes: self.bytes.len(), spans: self.spans.len(), spans_len: self.spans_len }
    }

    /// Drops everything appended since `mark`.
    pub fn truncate(&mut self, mark: Mark) {
        self.bytes.truncate(mark.bytes);
        self.spans.truncate(mark.spans);
        self.spans_len = mark.spans_len;
    }

    /// Every octet in order, the spans copied out of their memory (zeros from a region
    /// that refused): for tests and fuzzers, which look at the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        let _ = self.copy_out(0, &mut v);
        v
    }

    /// Splits into the framed bytes (to be reused) and drops the spans.
    fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The pieces in order, starting `skip` octets in: `f(piece, octets of it to skip)`
    /// until it returns false.
    fn pieces(&self, mut skip: usize, mut f: impl FnMut(Piece<'_>, usize) -> bool) {
        let mut at = 0;
        let spans = self.spans.iter().map(|(pos, s)| (*pos, Some(s)));
        for (pos, span) in spans.chain(std::iter::once((self.bytes.len(), None))) {
            let pieces = [Some(Piece::Bytes(&self.bytes[at..pos])), span.map(Piece::Mem)];
            at = pos;
            for p in pieces.into_iter().flatten() {
                let n = p.len();
                if n <= skip {
                    skip -= n;
                    continue;
                }
                if !f(p, std::mem::take(&mut skip)) {
                    return;
                }
            }
        }
    }

    /// Copies octets from `skip` into `dst`; returns how many, or `None` if a span's
    /// region refused (revoked since it was queued).
    fn copy_out(&self, skip: usize, dst: &mut [u8]) -> Option<usize> {
        let (mut done, mut refused) = (0, false);
        self.pieces(skip, |p, cut| {
            let n = (p.len() - cut).min(dst.len() - done);
            let to = &mut dst[done..done + n];
            match p {
                Piece::Bytes(b) => to.copy_from_slice(&b[cut..cut + n]),
                Piece::Mem(s) => refused = !s.mem.read(s.offset + cut, to),
            }
            done += n;
            !refused && done < dst.len()
        });
        (!refused).then_some(done)
    }
}

/// The bytes queued for a connection's stream, as the outputs they were produced in (each
/// moved in, never copied), the first partly written. One contiguous buffer would move
/// everything behind the written part forward, megabytes per write under a deep queue.
#[derive(Debug, Default)]
pub(crate) struct TxQueue {
    chunks: VecDeque<Output>,
    /// Octets of the first chunk already written.
    head: usize,
    /// Octets not yet written.
    len: usize,
    /// Written chunks' byte buffers kept for framing into again, while the queue is busy,
    /// up to [`SPARE_BYTES_MAX`] and each of at most [`SPARE_CHUNK_BYTES`]: allocating
    /// fresh buffers per message spent a fifth of the sender's time in page faults and
    /// zeroing; with 4 spares 1 MiB WRITEs moved 0.55-0.72x plain TCP, with these
    /// 0.65-1.06x (and 64 KiB ones halved when every spare was freed as the queue emptied).
    spare: Vec<Vec<u8>>,
    /// Capacity of the spares, octets.
    spare_bytes: usize,
}

/// Most capacity a connection keeps in spare chunks while its queue is busy (a full send
/// queue of 1 MiB messages is 128 MiB, already queued once); all but [`SPARE_IDLE`] are
/// freed when the queue empties.
pub(crate) const SPARE_BYTES_MAX: usize = 64 << 20;
/// Spare chunks kept when the queue empties.
pub(crate) const SPARE_IDLE: usize = 4;
/// Largest chunk kept for reuse, octets.
pub(crate) const SPARE_CHUNK_BYTES: usize = 4 << 20;

impl TxQueue {
    pub(crate) fn push(&mut self, out: Output) {
        if out.is_empty() {
            self.recycle(out.into_bytes());
        } else {
            self.len += out.len();
            self.chunks.push_back(out);
        }
    }

    /// An empty buffer to frame into: a written chunk's if one is kept.
    pub(crate) fn spare(&mut self) -> Vec<u8> {
        let chunk = self.spare.pop().unwrap_or_default();
        self.spare_bytes -= chunk.capacity();
        chunk
    }

    fn recycle(&mut self, mut chunk: Vec<u8>) {
        let cap = chunk.capacity();
        if cap > 0 && cap <= SPARE_CHUNK_BYTES && self.spare_bytes + cap <= SPARE_BYTES_MAX {
            chunk.clear();
            self.spare_bytes += cap;
            self.spare.push(chunk);
        }
    }

    /// Unwritten octets.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies unwritten octets from the front into `dst` (none are consumed); returns how
    /// many, or `None` if a span among them lies in a region revoked since it was queued:
    /// for a stream that takes a copy anyway (a userspace TCP's send buffer).
    pub(crate) fn copy_front(&self, dst: &mut [u8]) -> Option<usize> {
        let mut done = 0;
        for (i, c) in self.chunks.iter().enumerate() {
            if done == dst.len() {
                break;
            }
            done += c.copy_out(if i == 0 { self.head } else { 0 }, &mut dst[done..])?;
        }
        Some(done)
    }

    /// Fills `out` with up to its length of pieces of unwritten octets, in order, for one
    /// `writev`; returns how many, or `None` if a span among them lies in a region revoked
    /// since it was queued. The pointers stay valid until the queue is next changed, and a
    /// span's while its region is not revoked: the caller writes under the lock that
    /// revoking a region takes. Into the caller's array rather than a new Vec: a
    /// ping-pong's turn allocated two (the second to find the queue empty).
    pub(crate) fn iovecs(&self, out: &mut [libc::iovec]) -> Option<usize> {
        let mut n = 0;
        let mut refused = false;
        for (i, c) in self.chunks.iter().enumerate() {
            if n >= out.len() {
                break;
            }
            c.pieces(if i == 0 { self.head } else { 0 }, |p, cut| match piece_iovec(p, cut) {
                Some(iov) => {
                    out[n] = iov;
                    n += 1;
                    n < out.len()
                }
                None => {
                    refused = true;
                    false
                }
            });
            if refused {
                return None;
            }
        }
        Some(n)
    }

    /// `n` octets were written (at most [`TxQueue::len`]).
    pub(crate) fn consume(&mut self, mut n: usize) {
        n = n.min(self.len);
        self.len -= n;
        while n > 0 {
            let Some(front) = self.chunks.front() else { break };
            let left = front.len() - self.head;
            if n < left {
                self.head += n;
                return;
            }
            n -= left;
            if let Some(chunk) = self.chunks.pop_front() {
                self.recycle(chunk.into_bytes());
            }
            self.head = 0;
        }
        if self.len == 0 {
            // Idle for now: a few spares for the next burst, the rest freed.
            for chunk in self.spare.drain(SPARE_IDLE.min(self.spare.len())..) {
                self.spare_bytes -= chunk.capacity();
            }
        }
    }
}

/// The iovec of piece `p` from `cut` octets in; `None` if it is a span whose region was
/// revoked.
fn piece_iovec(p: Piece<'_>, cut: usize) -> Option<libc::iovec> {
    let (ptr, len) = match p {
        Piece::Bytes(b) => (b[cut..].as_ptr(), b.len() - cut),
        Piece::Mem(s) => (s.mem.raw_span(s.offset + cut, s.len - cut)?, s.len - cut),
    };
    Some(libc::iovec { iov_base: ptr as *mut libc::c_void, iov_len: len })
}

#[cfg(test)]
mod tests;
