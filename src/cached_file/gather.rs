//! One run from one thread: its pages written from page memory with one
//! `pwritev`, or gathered into an aligned copy buffer first
//! ([`GatherBuf`]) and written with one `pwrite`. Shared by the flushing
//! thread ([`RunWriter`](super::writer::RunWriter)) and the writer threads
//! ([`WriterPool`](super::writer_pool::WriterPool)), below both.

use std::io::IoSlice;

use super::pages::PageRef;
use crate::backend::StorageBackend;
use crate::buffer::AlignedBuf;
use crate::coalesce::Run;

/// A copy buffer that a run's pages are gathered into, so the run goes
/// out as one memory segment: the pieces of atomic writes (an atomic write
/// takes one segment) and, under `O_DIRECT`, the pwritev engine's scattered
/// runs (`RunWriter::Vectored`). Aligned for `O_DIRECT`, grown to the
/// largest run (at most `Config::max_write_bytes`), kept between flushes.
pub(crate) struct GatherBuf {
    buf: Option<AlignedBuf>,
    align: usize,
}

impl GatherBuf {
    /// An empty buffer, to be aligned to `align` bytes.
    pub(crate) fn new(align: usize) -> Self {
        Self { buf: None, align }
    }

    /// The `pages` copied back to back: the first `len` bytes of the
    /// buffer. `None` if the buffer could not grow to `len` (no memory).
    pub(crate) fn gather(&mut self, pages: &[(u64, PageRef)], len: usize) -> Option<&[u8]> {
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = AlignedBuf::zeroed(len, self.align);
        }
        let buf = self.buf.as_mut()?;
        gather(pages, buf);
        Some(&buf[..len])
    }
}

/// Above this many pieces of memory per run, a run written under
/// `O_DIRECT` from this thread is copied into one buffer first. The
/// kernel pins and maps each iovec segment of a direct write on its own
/// (and a virtual disk passes each on), which costs more than the copy.
/// The ring copies for the same reason. Two pieces, as the ring allows
/// for zero-copy: page slabs (`BufferPool`) lay a run written in file
/// order out in one or two.
// Measured: 64 KiB commits at 8 threads (scale --rewrite 0 --direct on)
// 1.09-1.24x commits/s copied; bulk flushes of 256-page runs 1.76-1.90
// against 1.30-1.62 GB/s (.project/io-uring-and-direct.md).
pub(crate) const MAX_ZERO_COPY_SEGMENTS: usize = 2;

/// How many pieces of memory `pages` (in file order) lie in.
pub(crate) fn segments(pages: &[(u64, PageRef)]) -> usize {
    1 + pages
        .windows(2)
        .filter(|w| w[0].1.as_ptr() as usize + w[0].1.len() != w[1].1.as_ptr() as usize)
        .count()
}

/// Writes `run` (its `pages`) from this thread, durable with `dsync`: one
/// `pwrite` of the pages gathered into `copy` where they lie in more than
/// [`MAX_ZERO_COPY_SEGMENTS`] pieces of memory (`copy` is given under
/// `O_DIRECT`), else one `pwritev` from page memory (split at `IOV_MAX` by
/// the backend; `iovecs` is kept between calls). Returns the outcome and
/// the call's name for the error.
pub(crate) fn write_run(
    backend: &dyn StorageBackend,
    run: &Run,
    pages: &[(u64, PageRef)],
    iovecs: &mut Vec<IoSlice<'static>>,
    copy: Option<&mut GatherBuf>,
    dsync: bool,
) -> (std::io::Result<()>, &'static str) {
    const DSYNC: &str = "pwritev2 (RWF_DSYNC)";
    match copy {
        Some(buf) if segments(pages) > MAX_ZERO_COPY_SEGMENTS => match buf.gather(pages, run.len) {
            None => (Err(std::io::ErrorKind::OutOfMemory.into()), "pwrite"),
            Some(buf) if dsync => {
                let one = &mut [IoSlice::new(buf)];
                (backend.write_vectored_all_at_dsync(run.offset, one), DSYNC)
            }
            Some(buf) => (backend.write_all_at(run.offset, buf), "pwrite"),
        },
        _ => {
            let mut v: Vec<IoSlice<'_>> = reuse(std::mem::take(iovecs));
            v.extend(pages.iter().map(|(_, p)| IoSlice::new(p)));
            let out = if dsync {
                (
                    backend.write_vectored_all_at_dsync(run.offset, &mut v),
                    DSYNC,
                )
            } else {
                (backend.write_vectored_all_at(run.offset, &mut v), "pwritev")
            };
            *iovecs = reuse(v);
            out
        }
    }
}

/// An empty vector with `v`'s allocation, for elements of the same layout
/// (here: `IoSlice`s of another lifetime, so a vector borrowed from one
/// flush's pages serves the next). std collects a `vec::IntoIter` into a
/// `Vec` in place when the layouts match, so nothing is allocated; the
/// steady-state allocation test (`tests/alloc_free.rs`) checks it.
pub(crate) fn reuse<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("cleared")).collect()
}

/// Copies a run's pages into `buf`, back to back.
pub(crate) fn gather(pages: &[(u64, PageRef)], buf: &mut [u8]) {
    let mut at = 0;
    for (_, page) in pages {
        buf[at..at + page.len()].copy_from_slice(page);
        at += page.len();
    }
}
