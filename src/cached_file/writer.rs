//! The flush writer: how runs reach the file, resolved once at open from
//! the flush engine and the `O_DIRECT` choice (`open::resolve_writer`).
//! Every flush calls its one [`RunWriter::write`].

use std::io::IoSlice;

use super::flush_mode::Company;
use super::gather::{GatherBuf, write_run};
use super::gather::{MAX_ZERO_COPY_SEGMENTS, gather, reuse, segments};
use super::pages::PageRef;
use super::stats::{Counters, add};
use crate::backend::StorageBackend;
use crate::buffer::AlignedBuf;
use crate::coalesce::Run;

/// What a failed write left behind: the entry ranges (of the sorted batch)
/// that did not reach the OS, whether any run did, and the first error in
/// offset order.
pub(crate) struct WriteFailure {
    pub(crate) failed: Vec<std::ops::Range<usize>>,
    pub(crate) some_written: bool,
    /// Byte offset, call and error of the first failed run in offset order.
    pub(crate) offset: u64,
    pub(crate) op: &'static str,
    pub(crate) error: std::io::Error,
}

/// How one [`RunWriter::write`] goes out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteMode {
    /// Each run written durably (`RWF_DSYNC`; only where
    /// [`RunWriter::can_dsync`]).
    pub(crate) dsync: bool,
    /// What runs beside the write ([`RunWriter::writes_inline`]).
    pub(crate) company: Company,
}

/// How a flush writes its runs.
pub(crate) enum RunWriter {
    /// One `pwrite` per page.
    PerPage,
    /// One `pwrite` per run from a copy buffer aligned for `O_DIRECT`,
    /// grown to the largest run.
    Concat { scratch: GatherBuf },
    /// One `pwritev` per run (split at `IOV_MAX` by the backend); the
    /// iovec vector is kept between flushes. With a `pool`
    /// ([`Config::write_threads`](crate::Config::write_threads) > 1), the
    /// runs of a flush that has several go out from several threads at
    /// once. With `copy` (under `O_DIRECT`), a run whose pages lie in more
    /// than [`MAX_ZERO_COPY_SEGMENTS`] pieces of memory is copied into it
    /// and written with one `pwrite` instead (see there); the pool's
    /// threads each copy into their own.
    Vectored {
        iovecs: Vec<IoSlice<'static>>,
        pool: Option<Box<super::writer_pool::WriterPool>>,
        copy: Option<GatherBuf>,
    },
    /// io_uring, up to the queue depth of runs in flight: `WRITEV` SQEs
    /// from page memory, or with `copy` (under `O_DIRECT`) one segment per
    /// run copied into the ring's own buffers (the kernel's per-segment
    /// cost there exceeds the copy).
    /// A flush of one run while no commit round syncs is written on the
    /// flushing thread instead ([`writes_inline`](Self::writes_inline)),
    /// with `pwritev`, or under `O_DIRECT` from a copy as the pwritev
    /// engine does (`UringScratch::inline_copy`).
    Uring {
        ring: Box<crate::backend::ring::SlotRing>,
        copy: bool,
        scratch: Box<UringScratch>,
    },
}

impl RunWriter {
    /// Whether [`write`](Self::write) issues a flush of `runs` runs one
    /// write call at a time on the flushing thread (`pwrite`, `pwritev`),
    /// rather than with writes in flight beside each other (several runs on
    /// the ring or the writer threads) or beside other commit rounds'
    /// syncs (the ring).
    ///
    /// The ring writes a lone one-run flush inline: it has one write to
    /// make and nothing to overlap it with, and the hand-off through the
    /// ring (and, under `O_DIRECT`, the preallocation it needs, see
    /// `preallocate` in `file_size.rs`) cost more than they give; beside
    /// other rounds' `fdatasync`s the ring's overlap wins.
    ///
    /// The writer threads take a flush of at least as many runs as there
    /// are threads; fewer runs go out one after another from the flushing
    /// thread (handing a few runs over costs more CPU than it saves).
    // Measured with scripts/ab-scale.sh (.project/commit-suite.md): the
    // lone one-run flush inline 1.06-1.15x commits/s at one committer,
    // every one-run flush inline 0.85-0.97x at 8; the writer-thread rule
    // 1.085x at 2 committers (0.68x CPU per GB), 1.02x at 4, 1.06x at 8.
    pub(crate) fn writes_inline(&self, runs: usize, company: Company) -> bool {
        match self {
            RunWriter::PerPage | RunWriter::Concat { .. } => true,
            RunWriter::Vectored { pool, .. } => match pool {
                None => true,
                Some(pool) => runs < pool.threads(),
            },
            RunWriter::Uring { .. } => runs <= 1 && company == Company::Alone,
        }
    }

    /// Whether [`write`](Self::write) can write a run durably itself
    /// (`dsync`): the engines that write from page memory.
    pub(crate) fn can_dsync(&self) -> bool {
        match self {
            RunWriter::Vectored { .. } => true,
            RunWriter::Uring { .. } => true,
            RunWriter::PerPage | RunWriter::Concat { .. } => false,
        }
    }

    /// Writes `runs` of the sorted `entries`: every run is tried whatever
    /// failed before it. On error, names the runs that did not reach the
    /// OS (a run is retried whole at the next flush, even if part of it was
    /// written: rewriting the same bytes is harmless).
    ///
    /// With `mode.dsync` (only when [`can_dsync`](Self::can_dsync)), each
    /// run is written with [`StorageBackend::write_vectored_all_at_dsync`],
    /// so a run that did not fail is durable; `mode.company` says what
    /// runs beside it ([`writes_inline`](Self::writes_inline)).
    ///
    /// With `atomic` ([`TornWrites::Atomic`](crate::TornWrites::Atomic)),
    /// `runs` are pieces an atomic write takes
    /// ([`split_for_atomic`](crate::coalesce::split_for_atomic)) and each
    /// goes out as one `RWF_ATOMIC` write from one memory segment: an SQE
    /// on the ring (copied into its buffers) where the ring would write,
    /// else `pwritev2` on this thread, from the page itself or from a copy
    /// of a piece's pages in `atomic`'s buffer.
    pub(crate) fn write(
        &mut self,
        backend: &dyn StorageBackend,
        runs: &[Run],
        entries: &[(u64, PageRef)],
        counters: &Counters,
        mode: WriteMode,
        atomic: Option<&mut GatherBuf>,
    ) -> Result<(), WriteFailure> {
        let dsync = mode.dsync;
        let mut results = Results::new(runs.len());
        debug_assert!(!dsync || self.can_dsync());
        let from_pages = dsync || self.writes_inline(runs.len(), mode.company);
        if let Some(scratch) = atomic {
            add(&counters.atomic_writes, runs.len() as u64);
            match self {
                RunWriter::Uring {
                    ring,
                    copy: true,
                    scratch: uring,
                } if !from_pages => {
                    ring.set_atomic(true);
                    write_uring(ring, true, uring, backend, runs, entries, &mut results);
                    ring.set_atomic(false);
                    add(&counters.write_calls, results.enter_calls);
                }
                _ => write_atomic_runs(
                    backend,
                    runs,
                    entries,
                    scratch,
                    counters,
                    dsync,
                    &mut results,
                ),
            }
            return results.finish(runs, counters);
        }
        if let Some(kept) = self.page_iovecs(from_pages) {
            pwritev_runs(kept, backend, runs, entries, counters, dsync, &mut results);
        } else {
            debug_assert!(!dsync, "checked by can_dsync");
            self.write_own(backend, runs, entries, counters, &mut results);
        }
        results.finish(runs, counters)
    }

    /// The kept iovec vector and copy buffer (under `O_DIRECT`) of an
    /// engine that writes from page memory with `pwritev`, if `from_pages`
    /// and the engine is one.
    fn page_iovecs(&mut self, from_pages: bool) -> Option<PageWrite<'_>> {
        match self {
            _ if !from_pages => None,
            RunWriter::Vectored { iovecs, copy, .. } => Some((iovecs, copy.as_mut())),
            RunWriter::Uring { scratch, .. } => {
                let UringScratch {
                    iovecs,
                    inline_copy,
                    ..
                } = &mut **scratch;
                Some((iovecs, inline_copy.as_mut()))
            }
            RunWriter::PerPage | RunWriter::Concat { .. } => None,
        }
    }

    /// Each engine's own way to write `runs` (not durably): one `pwrite`
    /// per page or per copied run, the writer threads, the ring.
    fn write_own(
        &mut self,
        backend: &dyn StorageBackend,
        runs: &[Run],
        entries: &[(u64, PageRef)],
        counters: &Counters,
        results: &mut Results,
    ) {
        match self {
            RunWriter::PerPage => {
                for (i, run) in runs.iter().enumerate() {
                    let r = entries[run.entries()].iter().try_for_each(|(off, page)| {
                        add(&counters.write_calls, 1);
                        backend.write_all_at(*off, page)
                    });
                    results.set(i, run.offset, "pwrite", r.err());
                }
            }
            RunWriter::Concat { scratch } => {
                for (i, run) in runs.iter().enumerate() {
                    add(&counters.write_calls, 1);
                    let r = match scratch.gather(&entries[run.entries()], run.len) {
                        Some(buf) => backend.write_all_at(run.offset, buf),
                        None => Err(std::io::ErrorKind::OutOfMemory.into()),
                    };
                    results.set(i, run.offset, "pwrite", r.err());
                }
            }
            RunWriter::Vectored {
                iovecs,
                pool: Some(pool),
                copy,
            } => {
                // Empty (no allocation) unless a run fails.
                let mut failed = Vec::new();
                pool.write(runs, entries, iovecs, copy.as_mut(), &mut failed);
                add(&counters.write_calls, runs.len() as u64);
                for (i, op, e) in failed {
                    results.set(i, runs[i].offset, op, Some(e));
                }
            }
            RunWriter::Vectored {
                iovecs,
                pool: None,
                copy,
            } => {
                let kept = (iovecs, copy.as_mut());
                pwritev_runs(kept, backend, runs, entries, counters, false, results);
            }
            RunWriter::Uring {
                ring,
                copy,
                scratch,
            } => {
                let copy = *copy && !mostly_contiguous(runs, entries);
                write_uring(ring, copy, scratch, backend, runs, entries, results);
                add(&counters.write_calls, results.enter_calls);
            }
        }
    }
}

/// One `pwritev2(RWF_ATOMIC)` per piece, on this thread, durable with
/// `dsync`: a one-page piece from the page's own memory, a larger one
/// from a copy in `scratch`.
fn write_atomic_runs(
    backend: &dyn StorageBackend,
    runs: &[Run],
    entries: &[(u64, PageRef)],
    scratch: &mut GatherBuf,
    counters: &Counters,
    dsync: bool,
    results: &mut Results,
) {
    let op = if dsync {
        "pwritev2 (RWF_ATOMIC | RWF_DSYNC)"
    } else {
        "pwritev2 (RWF_ATOMIC)"
    };
    for (i, run) in runs.iter().enumerate() {
        add(&counters.write_calls, 1);
        if dsync {
            add(&counters.dsync_writes, 1);
        }
        let pages = &entries[run.entries()];
        let r = if let [(_, page)] = pages {
            backend.write_atomic_at(run.offset, page, dsync)
        } else {
            match scratch.gather(pages, run.len) {
                Some(buf) => backend.write_atomic_at(run.offset, buf, dsync),
                None => Err(std::io::ErrorKind::OutOfMemory.into()),
            }
        };
        results.set(i, run.offset, op, r.err());
    }
}

/// What an engine that writes from page memory keeps for it: the iovec
/// vector, and under `O_DIRECT` the copy buffer of scattered runs.
type PageWrite<'a> = (&'a mut Vec<IoSlice<'static>>, Option<&'a mut GatherBuf>);

/// One write per run, durable with `dsync`: a `pwritev` from page memory
/// (split at `IOV_MAX` by the backend), or with a copy buffer (under
/// `O_DIRECT`), for a run in more than [`MAX_ZERO_COPY_SEGMENTS`] pieces,
/// one `pwrite` of the run gathered into it. `kept`: the iovec vector kept
/// between flushes and the copy buffer.
fn pwritev_runs(
    kept: PageWrite<'_>,
    backend: &dyn StorageBackend,
    runs: &[Run],
    entries: &[(u64, PageRef)],
    counters: &Counters,
    dsync: bool,
    results: &mut Results,
) {
    let (iovecs, mut copy) = kept;
    for (i, run) in runs.iter().enumerate() {
        add(&counters.write_calls, 1);
        if dsync {
            add(&counters.dsync_writes, 1);
        }
        let pages = &entries[run.entries()];
        let (r, op) = write_run(backend, run, pages, iovecs, copy.as_deref_mut(), dsync);
        results.set(i, run.offset, op, r.err());
    }
}

/// Whether the runs' pages are adjacent in memory often enough that the
/// runs make at most two iovec segments each on average (pages carved from
/// one slab in file order; `BufferPool::zeroed`).
fn mostly_contiguous(runs: &[Run], entries: &[(u64, PageRef)]) -> bool {
    let pieces: usize = runs.iter().map(|r| segments(&entries[r.entries()])).sum();
    pieces <= MAX_ZERO_COPY_SEGMENTS * runs.len()
}

/// What the io_uring writer keeps between flushes so that a flush
/// allocates nothing: the copy jobs, the iovecs and runs of a zero-copy
/// write (emptied; see [`reuse`]) and the per-run errors.
#[derive(Default)]
pub(crate) struct UringScratch {
    /// Under `O_DIRECT`: the copy buffer of scattered runs written inline
    /// ([`RunWriter::writes_inline`]), as the pwritev engine's.
    inline_copy: Option<GatherBuf>,
    jobs: Vec<crate::backend::ring::CopyJob>,
    iovecs: Vec<IoSlice<'static>>,
    vruns: Vec<crate::backend::ring::VectoredRun<'static, 'static>>,
    errors: Vec<Option<std::io::Error>>,
}

impl UringScratch {
    /// Empty vectors; with `align` (under `O_DIRECT`), a copy buffer for
    /// scattered runs written inline, aligned to it.
    pub(crate) fn new(align: Option<usize>) -> Self {
        Self {
            inline_copy: align.map(GatherBuf::new),
            ..Self::default()
        }
    }
}

/// Per run: its error, if it failed; the first in offset order.
struct Results {
    runs: usize,
    /// Empty (no allocation) until a run fails.
    errors: Vec<Option<std::io::Error>>,
    first: Option<(u64, &'static str)>,
    enter_calls: u64,
}

impl Results {
    fn new(runs: usize) -> Self {
        Self {
            runs,
            errors: Vec::new(),
            first: None,
            enter_calls: 0,
        }
    }

    fn set(&mut self, run: usize, offset: u64, op: &'static str, e: Option<std::io::Error>) {
        let Some(e) = e else { return };
        if self.first.is_none_or(|(at, _)| offset < at) {
            self.first = Some((offset, op));
        }
        if self.errors.is_empty() {
            self.errors.resize_with(self.runs, || None);
        }
        self.errors[run] = Some(e);
    }

    /// Counts the runs that reached the OS, then names those that did not.
    fn finish(self, runs: &[Run], counters: &Counters) -> Result<(), WriteFailure> {
        for (i, run) in runs.iter().enumerate() {
            if !self.failed(i) {
                add(&counters.runs, 1);
                add(&counters.pages_written, run.count as u64);
                add(&counters.bytes_written, run.len as u64);
            }
        }
        self.into_failure(runs)
    }

    fn failed(&self, run: usize) -> bool {
        self.errors.get(run).is_some_and(Option::is_some)
    }

    fn into_failure(self, runs: &[Run]) -> Result<(), WriteFailure> {
        let Some((offset, op)) = self.first else {
            return Ok(());
        };
        let mut failed = Vec::new();
        let mut error = None;
        for (run, e) in runs.iter().zip(self.errors) {
            if let Some(e) = e {
                failed.push(run.entries());
                if run.offset == offset && error.is_none() {
                    error = Some(e);
                }
            }
        }
        Err(WriteFailure {
            some_written: failed.len() < runs.len(),
            failed,
            offset,
            op,
            error: error.expect("the first failed run has an error"),
        })
    }
}

/// The io_uring engine: runs complete out of order, so failures can be any
/// subset. An `io_uring_enter` failure fails every run (each is written
/// again at the next flush). `copy`: through the ring's own buffers (one
/// segment per run), else `WRITEV` from page memory; the caller picks
/// (runs whose pages are adjacent in memory go out zero-copy: one segment
/// per run costs less than the copy).
fn write_uring(
    ring: &mut crate::backend::ring::SlotRing,
    copy: bool,
    scratch: &mut UringScratch,
    backend: &dyn StorageBackend,
    runs: &[Run],
    entries: &[(u64, PageRef)],
    results: &mut Results,
) {
    use crate::backend::ring::{CopyJob, VectoredRun};
    // The io_uring fail point: compiled out of normal builds.
    #[cfg(feature = "testing")]
    let hook = |off, len| backend.uring_fault(off, len);
    #[cfg(feature = "testing")]
    let fault: crate::backend::ring::FaultHook<'_> = Some(&hook);
    #[cfg(not(feature = "testing"))]
    let fault: crate::backend::ring::FaultHook<'_> = {
        let _ = backend;
        None
    };
    let before = ring.enter_calls();
    let errors = &mut scratch.errors;
    let outcome = if copy {
        let jobs = &mut scratch.jobs;
        jobs.clear();
        jobs.extend(runs.iter().map(|r| CopyJob {
            offset: r.offset,
            len: r.len,
        }));
        let mut fill = |j: usize, buf: &mut [u8]| gather(&entries[runs[j].entries()], buf);
        ring.write_copied(jobs, &mut fill, errors, fault)
    } else {
        let mut vectors: Vec<IoSlice<'_>> = reuse(std::mem::take(&mut scratch.iovecs));
        vectors.extend(entries.iter().map(|(_, p)| IoSlice::new(p)));
        let mut vruns: Vec<VectoredRun<'_, '_>> = reuse(std::mem::take(&mut scratch.vruns));
        vruns.extend(runs.iter().map(|r| VectoredRun {
            offset: r.offset,
            bufs: &vectors[r.entries()],
        }));
        let outcome = ring.write_vectored(&vruns, errors, fault);
        scratch.vruns = reuse(vruns);
        scratch.iovecs = reuse(vectors);
        outcome
    };
    results.enter_calls = ring.enter_calls() - before;
    let op = if copy {
        "io_uring write"
    } else {
        "io_uring writev"
    };
    match outcome {
        Ok(()) => {
            for (i, (run, e)) in runs.iter().zip(scratch.errors.drain(..)).enumerate() {
                results.set(i, run.offset, op, e);
            }
        }
        Err(e) => {
            for (i, run) in runs.iter().enumerate() {
                let e = std::io::Error::new(e.kind(), format!("io_uring_enter: {e}"));
                results.set(i, run.offset, "io_uring_enter", Some(e));
            }
        }
    }
}

/// Buffers for the io_uring engine under `O_DIRECT`: `count` of `len`
/// bytes aligned to `align`, one THP-advised mapping where the alignment
/// allows (physically contiguous buffers split into fewer device
/// segments), pre-faulted so no flush pays for it.
///
/// Errors: [`Error::NoMemory`](crate::Error::NoMemory).
pub(crate) fn bounce_buffers(
    count: usize,
    len: usize,
    align: usize,
) -> crate::Result<Vec<AlignedBuf>> {
    let slab = (count > 0 && align <= crate::buffer::DEFAULT_ALIGN)
        .then(|| crate::buffer::thp_slab(len, count).ok())
        .flatten();
    let mut bufs: Vec<AlignedBuf> = match slab {
        Some(s) => s,
        None => (0..count)
            .map(|_| match AlignedBuf::try_zeroed(len, align) {
                Ok(Some(b)) => Ok(b),
                _ => Err(crate::Error::NoMemory {
                    bytes: (len as u64).saturating_mul(count as u64),
                }),
            })
            .collect::<crate::Result<_>>()?,
    };
    for b in &mut bufs {
        b.fill(0);
    }
    Ok(bufs)
}
