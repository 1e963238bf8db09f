//! How a batch's runs become write calls ([`Writers`]): a flush takes a
//! write slot and writes from its own thread, one `pwritev` per run; with
//! the io_uring engine a flush of several runs takes the ring, if free,
//! and has them all in flight. The engine is resolved at open.
//!
//! Owns: the free write slots (a leaf lock) and the ring (taken with
//! `try_lock` only). Calls: the backend. Under `O_DIRECT` a run whose
//! pages lie in more than [`MAX_ZERO_COPY_SEGMENTS`] pieces of memory is
//! copied into one aligned buffer first (the ring copies into its own
//! buffers): the kernel pins and maps each iovec segment of a direct
//! write on its own, which costs more than the copy.

use std::io::IoSlice;

use super::config::{Config, Counters, add};
use super::write_buffer::PageRef;
use crate::backend::{FlushEngine, StorageBackend};
use crate::buffer::AlignedBuf;
use crate::coalesce::Run;
use crate::error::{Error, Result, short_error};
use crate::sync::{Mutex, MutexGuard};

/// Most write slots kept.
const MAX_SLOTS: usize = 64;

/// Above this many pieces of memory, a run under `O_DIRECT` is copied
/// into one buffer first (page slabs lay a run out in one or two).
pub(crate) const MAX_ZERO_COPY_SEGMENTS: usize = 2;

/// What a failed write left: the entry ranges that did not reach the OS,
/// whether any run did, and the first error by offset.
pub(crate) struct WriteFailure {
    pub(crate) failed: Vec<std::ops::Range<usize>>,
    pub(crate) some_written: bool,
    /// Byte offset, call and error of the first failed run.
    pub(crate) offset: u64,
    pub(crate) op: &'static str,
    pub(crate) error: std::io::Error,
}

/// What one flush writes with: its runs and their scratch.
pub(crate) struct WriteSlot {
    pub(crate) runs: Vec<Run>,
    /// Per run: its preallocation failed (reused between flushes).
    pub(crate) alloc_failed: Vec<bool>,
    iovecs: Vec<IoSlice<'static>>,
    /// Under `O_DIRECT`: the copy buffer of scattered runs.
    copy: Option<GatherBuf>,
    /// With [`TornWrites::Atomic`](crate::TornWrites::Atomic): the copy
    /// buffer of atomic pieces, and the runs before they were cut (reused).
    pub(crate) atomic: Option<(GatherBuf, Vec<Run>)>,
}

/// The io_uring writer: the ring and what a flush through it reuses.
pub(crate) struct Ring {
    ring: crate::backend::ring::SlotRing,
    /// Under `O_DIRECT`: runs are copied into the ring's buffers.
    copy: bool,
    jobs: Vec<crate::backend::ring::CopyJob>,
    iovecs: Vec<IoSlice<'static>>,
    vruns: Vec<crate::backend::ring::VectoredRun<'static, 'static>>,
    errors: Vec<Option<std::io::Error>>,
}

/// The run writers of one file (see the module docs).
pub(crate) struct Writers {
    slots: Mutex<Vec<WriteSlot>>,
    ring: Option<Mutex<Ring>>,
    /// Copy buffers' alignment under `O_DIRECT`.
    copy_align: Option<usize>,
    /// With atomic pieces: their copy buffer's alignment.
    atomic_align: Option<usize>,
    #[cfg(feature = "testing")]
    baseline: FlushEngine,
}

impl Writers {
    /// The writers for `config.engine` on `backend`: the engine in force
    /// (never `Auto`), why it differs from the one asked for, and the
    /// writers. `atomic`: atomic pieces are written. Errors: `IoUring` refused (`Error::Io`, op "io_uring setup"), or
    /// where there is none ([`Error::Unsupported`]) or the backend has no
    /// file (`InvalidConfig`); [`Error::NoMemory`] for the buffers.
    pub(crate) fn open(
        backend: &dyn StorageBackend,
        config: &Config,
        atomic: bool,
    ) -> Result<(FlushEngine, Option<String>, Writers)> {
        let direct = backend.dio_align().is_some();
        let writers = |ring| Writers {
            slots: Mutex::new(Vec::new()),
            ring,
            copy_align: direct.then(|| config.page_align()),
            atomic_align: atomic.then(|| config.page_align()),
            #[cfg(feature = "testing")]
            baseline: config.engine,
        };
        let queue_depth = match config.engine {
            FlushEngine::IoUring { queue_depth } | FlushEngine::Auto { queue_depth } => queue_depth,
            other => return Ok((other, None, writers(None))),
        };
        let run = config.run_bytes();
        let bounce = if direct {
            (queue_depth as usize)
                .min(config.max_write_buffer_bytes.div_ceil(run))
                .max(1)
        } else {
            0
        };
        let ring = match backend.file() {
            Some(file) => ring(file, queue_depth, bounce, run, config.page_align()),
            None => Err(Error::InvalidConfig(
                "the io_uring engine needs a backend with a file".into(),
            )),
        };
        match (config.engine, ring) {
            (_, Ok(r)) => Ok((
                FlushEngine::IoUring { queue_depth },
                None,
                writers(Some(Mutex::new(r))),
            )),
            (FlushEngine::Auto { .. }, Err(e @ Error::NoMemory { .. })) => Err(e),
            (FlushEngine::Auto { .. }, Err(e)) => {
                let why = match &e {
                    Error::Io { source, .. } => {
                        format!("io_uring refused: {}", short_error(source))
                    }
                    Error::Unsupported { why, .. } => format!("no io_uring: {why}"),
                    _ => "io_uring not used: the backend has no file".into(),
                };
                Ok((FlushEngine::Vectored, Some(why), writers(None)))
            }
            (_, Err(e)) => Err(e),
        }
    }

    /// A free write slot, or a new one.
    pub(crate) fn take_slot(&self) -> WriteSlot {
        self.slots.lock().pop().unwrap_or_else(|| WriteSlot {
            runs: Vec::new(),
            alloc_failed: Vec::new(),
            iovecs: Vec::new(),
            copy: self.copy_align.map(GatherBuf::new),
            atomic: self.atomic_align.map(|a| (GatherBuf::new(a), Vec::new())),
        })
    }

    /// Gives a slot back once its writes completed.
    pub(crate) fn put_slot(&self, slot: WriteSlot) {
        let mut slots = self.slots.lock();
        if slots.len() < MAX_SLOTS {
            slots.push(slot);
        }
    }

    /// The ring for a flush of `runs` runs: only for several, and only if no
    /// other flush holds it.
    pub(crate) fn ring_for(&self, runs: usize) -> Option<MutexGuard<'_, Ring>> {
        if runs < 2 {
            return None;
        }
        self.ring.as_ref()?.try_lock()
    }

    /// Writes `slot.runs` of the sorted `entries`, through `ring` if given,
    /// else one call per run on this thread (atomic pieces: one
    /// `RWF_ATOMIC` write each); every run is tried. On error, names the
    /// runs that did not reach the OS (retried whole at the next flush).
    pub(crate) fn write(
        &self,
        backend: &dyn StorageBackend,
        slot: &mut WriteSlot,
        ring: Option<&mut Ring>,
        entries: &[(u64, PageRef)],
        counters: &Counters,
    ) -> std::result::Result<(), WriteFailure> {
        let mut results = Results::new(slot.runs.len());
        #[cfg(feature = "testing")]
        if ring.is_none()
            && slot.atomic.is_none()
            && self.baseline_write(backend, slot, entries, counters, &mut results)
        {
            return results.finish(&slot.runs, counters);
        }
        let runs = &slot.runs;
        let atomic = slot.atomic.as_mut().map(|(buf, _)| buf);
        if atomic.is_some() {
            add(&counters.atomic_writes, runs.len() as u64);
        }
        match (ring, atomic) {
            (Some(ring), atomic) => {
                // Atomic pieces take one memory segment each: copied into
                // the ring's buffers (atomic writes are direct I/O, where
                // the ring has them).
                let on = atomic.is_some();
                ring.ring.set_atomic(on);
                ring.write(backend, runs, entries, on, &mut results);
                ring.ring.set_atomic(false);
                add(&counters.write_calls, results.enter_calls);
            }
            (None, Some(buf)) => {
                write_atomic(backend, runs, entries, buf, &mut results);
                add(&counters.write_calls, runs.len() as u64);
            }
            (None, None) => {
                for (i, run) in runs.iter().enumerate() {
                    let pages = &entries[run.entries()];
                    let (iovecs, copy) = (&mut slot.iovecs, slot.copy.as_mut());
                    // A backend that panics fails this run only, as one
                    // that errs does.
                    let (r, op) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        write_run(backend, run, pages, iovecs, copy)
                    }))
                    .unwrap_or_else(|_| {
                        (
                            Err(std::io::Error::other("the backend panicked")),
                            "pwritev",
                        )
                    });
                    results.set(i, run.offset, op, r.err());
                }
                add(&counters.write_calls, runs.len() as u64);
            }
        }
        results.finish(&slot.runs, counters)
    }

    /// The tools' baselines (`testing` only): a `pwrite` per page, or per
    /// run copied into one buffer; `false` for the real engines.
    #[cfg(feature = "testing")]
    fn baseline_write(
        &self,
        backend: &dyn StorageBackend,
        slot: &mut WriteSlot,
        entries: &[(u64, PageRef)],
        counters: &Counters,
        results: &mut Results,
    ) -> bool {
        match self.baseline {
            FlushEngine::PerPage => {
                for (i, run) in slot.runs.iter().enumerate() {
                    let r = entries[run.entries()].iter().try_for_each(|(off, page)| {
                        add(&counters.write_calls, 1);
                        backend.write_all_at(*off, page)
                    });
                    results.set(i, run.offset, "pwrite", r.err());
                }
                true
            }
            FlushEngine::Concat => {
                let buf = slot
                    .copy
                    .get_or_insert_with(|| GatherBuf::new(crate::buffer::DEFAULT_ALIGN));
                for (i, run) in slot.runs.iter().enumerate() {
                    add(&counters.write_calls, 1);
                    let r = match buf.gather(&entries[run.entries()], run.len) {
                        Some(b) => backend.write_all_at(run.offset, b),
                        None => Err(std::io::ErrorKind::OutOfMemory.into()),
                    };
                    results.set(i, run.offset, "pwrite", r.err());
                }
                true
            }
            _ => false,
        }
    }
}

impl Ring {
    /// Every run in flight at once: `WRITEV` SQEs from page memory, or one
    /// segment per run copied into the ring's buffers (scattered pages
    /// under `O_DIRECT`, or `force_copy`). An `io_uring_enter` failure
    /// fails every run.
    fn write(
        &mut self,
        backend: &dyn StorageBackend,
        runs: &[Run],
        entries: &[(u64, PageRef)],
        force_copy: bool,
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
        let copy = self.copy && (force_copy || !mostly_contiguous(runs, entries));
        let before = self.ring.enter_calls();
        let outcome = if copy {
            self.jobs.clear();
            self.jobs.extend(runs.iter().map(|r| CopyJob {
                offset: r.offset,
                len: r.len,
            }));
            let mut fill = |j: usize, buf: &mut [u8]| gather(&entries[runs[j].entries()], buf);
            self.ring
                .write_copied(&self.jobs, &mut fill, &mut self.errors, fault)
        } else {
            let mut vectors: Vec<IoSlice<'_>> = reuse(std::mem::take(&mut self.iovecs));
            vectors.extend(entries.iter().map(|(_, p)| IoSlice::new(p)));
            let mut vruns: Vec<VectoredRun<'_, '_>> = reuse(std::mem::take(&mut self.vruns));
            vruns.extend(runs.iter().map(|r| VectoredRun {
                offset: r.offset,
                bufs: &vectors[r.entries()],
            }));
            let outcome = self.ring.write_vectored(&vruns, &mut self.errors, fault);
            self.vruns = reuse(vruns);
            self.iovecs = reuse(vectors);
            outcome
        };
        results.enter_calls = self.ring.enter_calls() - before;
        let op = if copy {
            "io_uring write"
        } else {
            "io_uring writev"
        };
        match outcome {
            Ok(()) => {
                for (i, (run, e)) in runs.iter().zip(self.errors.drain(..)).enumerate() {
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
}

/// One `pwritev2(RWF_ATOMIC)` per piece on this thread: a one-page piece
/// from the page's own memory, a larger one from a copy in `scratch`.
fn write_atomic(
    backend: &dyn StorageBackend,
    runs: &[Run],
    entries: &[(u64, PageRef)],
    scratch: &mut GatherBuf,
    results: &mut Results,
) {
    for (i, run) in runs.iter().enumerate() {
        let pages = &entries[run.entries()];
        let r = match pages {
            [(_, page)] => backend.write_atomic_at(run.offset, page),
            _ => match scratch.gather(pages, run.len) {
                Some(b) => backend.write_atomic_at(run.offset, b),
                None => Err(std::io::ErrorKind::OutOfMemory.into()),
            },
        };
        results.set(i, run.offset, "pwritev2 (RWF_ATOMIC)", r.err());
    }
}

/// Whether the runs average at most [`MAX_ZERO_COPY_SEGMENTS`] pieces of
/// memory each.
fn mostly_contiguous(runs: &[Run], entries: &[(u64, PageRef)]) -> bool {
    let pieces: usize = runs.iter().map(|r| segments(&entries[r.entries()])).sum();
    pieces <= MAX_ZERO_COPY_SEGMENTS * runs.len()
}

/// The ring on `file`: `queue_depth` SQEs, the file registered, and
/// `bounce` buffers of `len` bytes (registered where `RLIMIT_MEMLOCK`
/// allows) to copy runs into under `O_DIRECT`.
fn ring(
    file: &std::fs::File,
    queue_depth: u32,
    bounce: usize,
    len: usize,
    align: usize,
) -> Result<Ring> {
    use crate::backend::ring::{RingOptions, SlotRing};
    let mut opts = RingOptions::new(queue_depth);
    // Used from whichever thread flushes.
    opts.single_issuer = false;
    let setup = |e: crate::backend::ring::RingSetupError| {
        if e.source.kind() == std::io::ErrorKind::Unsupported {
            Error::Unsupported {
                setting: "FlushEngine::IoUring",
                platform: std::env::consts::OS,
                why: e.source.to_string(),
            }
        } else {
            Error::io("io_uring setup", None, e.into())
        }
    };
    // The ring holds a description of its own, not the locked one: a
    // killed process's ring keeps what it registered until the kernel's
    // deferred teardown, which the lock must not outlive.
    let own = crate::backend::reopen_description(file).ok().flatten();
    let file = own.as_ref().unwrap_or(file);
    let ring = match SlotRing::new(file, opts, bounce_buffers(bounce, len, align)?) {
        Err(e) if e.stage == "register buffers" => {
            opts.fixed_buffers = false;
            SlotRing::new(file, opts, bounce_buffers(bounce, len, align)?).map_err(setup)?
        }
        r => r.map_err(setup)?,
    };
    Ok(Ring {
        ring,
        copy: bounce > 0,
        jobs: Vec::new(),
        iovecs: Vec::new(),
        vruns: Vec::new(),
        errors: Vec::new(),
    })
}

/// `count` buffers of `len` bytes aligned to `align` (one THP-advised
/// mapping where it can), pre-faulted.
///
/// Errors: [`Error::NoMemory`].
fn bounce_buffers(count: usize, len: usize, align: usize) -> Result<Vec<AlignedBuf>> {
    let slab = (count > 0 && align <= crate::buffer::DEFAULT_ALIGN)
        .then(|| crate::buffer::thp_slab(len, count).ok())
        .flatten();
    let mut bufs: Vec<AlignedBuf> = match slab {
        Some(s) => s,
        None => (0..count)
            .map(|_| match AlignedBuf::try_zeroed(len, align) {
                Ok(Some(b)) => Ok(b),
                _ => Err(Error::NoMemory {
                    bytes: (len as u64).saturating_mul(count as u64),
                }),
            })
            .collect::<Result<_>>()?,
    };
    for b in &mut bufs {
        b.fill(0);
    }
    Ok(bufs)
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
    fn finish(self, runs: &[Run], counters: &Counters) -> std::result::Result<(), WriteFailure> {
        for (i, run) in runs.iter().enumerate() {
            if !self.errors.get(i).is_some_and(Option::is_some) {
                add(&counters.runs, 1);
                add(&counters.pages_written, run.count as u64);
                add(&counters.bytes_written, run.len as u64);
            }
        }
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

/// A buffer a run's pages are gathered into (one memory segment), aligned
/// for `O_DIRECT`, grown to the largest run, kept between flushes.
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

/// How many pieces of memory `pages` (in file order) lie in.
fn segments(pages: &[(u64, PageRef)]) -> usize {
    1 + pages
        .windows(2)
        .filter(|w| w[0].1.as_ptr() as usize + w[0].1.len() != w[1].1.as_ptr() as usize)
        .count()
}

/// Writes `run` from this thread: one `pwrite` of its pages gathered into
/// `copy` (given under `O_DIRECT`) where they are scattered, else one
/// `pwritev` from page memory. The outcome and the call's name.
fn write_run(
    backend: &dyn StorageBackend,
    run: &Run,
    pages: &[(u64, PageRef)],
    iovecs: &mut Vec<IoSlice<'static>>,
    copy: Option<&mut GatherBuf>,
) -> (std::io::Result<()>, &'static str) {
    match copy {
        Some(buf) if segments(pages) > MAX_ZERO_COPY_SEGMENTS => match buf.gather(pages, run.len) {
            None => (Err(std::io::ErrorKind::OutOfMemory.into()), "pwrite"),
            Some(buf) => (backend.write_all_at(run.offset, buf), "pwrite"),
        },
        _ => {
            let mut v: Vec<IoSlice<'_>> = reuse(std::mem::take(iovecs));
            v.extend(pages.iter().map(|(_, p)| IoSlice::new(p)));
            let out = backend.write_vectored_all_at(run.offset, &mut v);
            *iovecs = reuse(v);
            (out, "pwritev")
        }
    }
}

/// An empty vector with `v`'s allocation for elements of the same layout
/// (`IoSlice`s of another lifetime): std collects in place, so nothing is
/// allocated (`tests/alloc_free.rs` checks it).
fn reuse<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("cleared")).collect()
}

/// Copies a run's pages into `buf`, back to back.
fn gather(pages: &[(u64, PageRef)], buf: &mut [u8]) {
    let mut at = 0;
    for (_, page) in pages {
        buf[at..at + page.len()].copy_from_slice(page);
        at += page.len();
    }
}
