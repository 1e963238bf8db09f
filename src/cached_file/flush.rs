//! Flush: drain the stripes, sort, coalesce, write, settle.
//!
//! A flush produces a [`Batch`]: the pages it drained, now one in-flight
//! generation in every stripe it touched. A plain flush settles its batch
//! as soon as the writes complete; a commit round holds it until its
//! `fdatasync` returned (see `commit.rs`), so that a failed `fdatasync` can
//! put the pages back in the write buffer before the file is poisoned.

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::stats::{add, add_elapsed};
use super::{FlushEngine, PageMap, PageRef, PagedCachedFile};
use crate::buffer::AlignedBuf;
use crate::coalesce::{Run, RunLimits, coalesce};
use crate::error::{Error, Result};

/// State owned by whoever holds the flusher lock, kept between flushes so
/// that a steady-state flush does not reallocate it.
#[derive(Default)]
pub(crate) struct Flusher {
    runs: Vec<Run>,
    /// Copy buffer of the `Concat` engine, aligned like the pages (so it
    /// also works with O_DIRECT); grown to the largest run.
    scratch: Option<AlignedBuf>,
    /// The ring of the `IoUring` engine.
    #[cfg(all(target_os = "linux", feature = "io-uring"))]
    pub(crate) uring: Option<crate::backend::uring::UringWriter>,
    /// Bounce buffers of the `IoUring` engine under `O_DIRECT`: one per
    /// SQE in flight, allocated and touched once at open.
    #[cfg_attr(not(all(target_os = "linux", feature = "io-uring")), allow(dead_code))]
    bounce: Vec<AlignedBuf>,
}

impl Flusher {
    /// A flusher that writes through `ring` when the engine is io_uring;
    /// `bounce` buffers of `bounce_len` bytes when it also does `O_DIRECT`
    /// (one per SQE in flight), pre-faulted so no flush pays for it.
    pub(crate) fn new(
        ring: Option<super::io_mode::Ring>,
        bounce: usize,
        bounce_len: usize,
        align: usize,
    ) -> Self {
        // One THP-advised mapping where the alignment allows: physically
        // contiguous bounce buffers split into fewer device segments.
        let slab = (bounce > 0 && align <= crate::buffer::DEFAULT_ALIGN)
            .then(|| crate::buffer::thp_slab(bounce_len, bounce).ok())
            .flatten();
        let mut bounce: Vec<AlignedBuf> = slab.unwrap_or_else(|| {
            (0..bounce)
                .map(|_| AlignedBuf::zeroed(bounce_len, align).expect("alignment validated"))
                .collect()
        });
        for b in &mut bounce {
            b.fill(0);
        }
        #[cfg(all(target_os = "linux", feature = "io-uring"))]
        return Self {
            uring: ring,
            bounce,
            ..Self::default()
        };
        #[cfg(not(all(target_os = "linux", feature = "io-uring")))]
        {
            let _ = ring;
            Self {
                bounce,
                ..Self::default()
            }
        }
    }
}

/// What a failed write left behind: the entry ranges (of the sorted batch)
/// that did not reach the OS, whether any run did, and the first error in
/// offset order.
struct WriteFailure {
    failed: Vec<std::ops::Range<usize>>,
    some_written: bool,
    error: Error,
}

/// The pages one flush drained: one in-flight generation.
pub(crate) struct Batch {
    /// Drain order (see `Generation`).
    id: u64,
    /// (byte offset, page), sorted by offset after `coalesce`.
    entries: Vec<(u64, PageRef)>,
    /// The stripes drained and the map each gave (also referenced from the
    /// stripe's `flushing` list until settled).
    drained: Vec<(usize, Arc<PageMap>)>,
}

impl PagedCachedFile {
    /// Flush without `fdatasync`. Returns whether anything was written.
    pub(super) fn flush_to_os(&self) -> Result<bool> {
        let mut f = self.flusher.lock();
        match self.write_batch(&mut f)? {
            Some(batch) => {
                self.settle(batch, &[]);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Drains every stripe and writes what it found. `Ok(None)` if nothing
    /// was dirty; `Ok(Some(batch))` when every run reached the OS (the
    /// caller settles it); on a write error the batch is settled here (the
    /// unwritten pages go back to the write buffer) and the error returned.
    ///
    /// Must be called with the flusher lock held (`f`): writes of two
    /// flushes never interleave, so a newer version of a page is always
    /// written after an older one (newest wins).
    pub(super) fn write_batch(&self, f: &mut Flusher) -> Result<Option<Batch>> {
        let Some(mut batch) = self.drain() else {
            return Ok(None);
        };
        let limits = RunLimits {
            max_pages: self.config.max_run_pages,
            max_bytes: self.config.max_write_bytes,
        };
        if let Err(e) = coalesce(&mut batch.entries, limits, &mut f.runs) {
            // Cannot happen: drained pages have distinct page numbers.
            debug_assert!(false, "coalesce failed on drained pages: {e}");
            let all = 0..batch.entries.len();
            self.settle(batch, &[all]);
            return Err(e);
        }
        if let Err(e) = self.preallocate(&batch) {
            self.settle_failed(batch);
            return Err(e);
        }
        let started = std::time::Instant::now();
        let written = self.write_runs(f, &batch.entries);
        add_elapsed(&self.counters.write_ns, started);
        match written {
            Ok(()) => {
                self.write_seq.fetch_add(1, Ordering::AcqRel);
                add(&self.counters.flushes, 1);
                Ok(Some(batch))
            }
            Err(w) => {
                if w.some_written {
                    // Those runs reached the OS: a later sync must cover them.
                    self.write_seq.fetch_add(1, Ordering::AcqRel);
                }
                self.settle(batch, &w.failed);
                Err(w.error)
            }
        }
    }

    /// With `O_DIRECT`, extends the file over a batch that writes past its
    /// end before writing (`fallocate` mode 0, exactly to the batch's end,
    /// so the file length stays what was written). ext4 serializes
    /// `O_DIRECT` writes that extend the file under the exclusive inode
    /// lock, and io_uring then queues them in worker threads; inside the
    /// file, over allocated blocks, they run under the shared lock, in
    /// parallel. A backend that cannot preallocate is written as is.
    ///
    /// Errors: `ENOSPC` and other `fallocate` errors, before any write.
    fn preallocate(&self, batch: &Batch) -> Result<()> {
        if self.io_mode.direct.is_none() {
            return Ok(());
        }
        let Some((off, page)) = batch.entries.last() else {
            return Ok(());
        };
        let end = off + page.len() as u64;
        let disk = self.disk_len.load(Ordering::Acquire);
        if end <= disk {
            return Ok(());
        }
        match self.backend.allocate(disk, end - disk) {
            Ok(()) => {
                self.disk_len.fetch_max(end, Ordering::AcqRel);
                Ok(())
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::Unsupported
                    || e.raw_os_error() == Some(libc::EOPNOTSUPP) =>
            {
                Ok(())
            }
            Err(e) => Err(Error::io("fallocate", Some(disk), e)),
        }
    }

    /// Moves every stripe's dirty pages to a new in-flight generation (one
    /// swap per stripe under its lock) and collects them. Caller holds the
    /// flusher lock.
    fn drain(&self) -> Option<Batch> {
        let mut drained = Vec::new();
        for (i, stripe) in self.stripes.iter().enumerate() {
            let mut s = stripe.lock();
            if s.dirty.is_empty() {
                continue;
            }
            let map = Arc::new(std::mem::take(&mut s.dirty));
            s.flushing.push(Arc::clone(&map));
            drop(s);
            drained.push((i, map));
        }
        if drained.is_empty() {
            return None;
        }
        // Called under the flusher lock: ids follow drain order.
        let id = self.next_generation.fetch_add(1, Ordering::Relaxed);
        self.generations
            .lock()
            .push_back(Generation { id, done: None });
        let shift = self.page_shift;
        let n = drained.iter().map(|(_, m)| m.len()).sum();
        let mut entries = Vec::with_capacity(n);
        for (_, map) in &drained {
            entries.extend(map.iter().map(|(&p, page)| (p << shift, Arc::clone(page))));
        }
        Some(Batch {
            id,
            entries,
            drained,
        })
    }

    /// Writes the runs with the configured engine: in offset order, one at
    /// a time, or for io_uring up to the queue depth at once. On error,
    /// reports which entries did not reach the OS.
    fn write_runs(&self, f: &mut Flusher, entries: &[(u64, PageRef)]) -> Result<(), WriteFailure> {
        let be = &*self.backend;
        let c = &self.counters;
        let count = |run: &Run| {
            add(&c.runs, 1);
            add(&c.pages_written, run.count as u64);
            add(&c.bytes_written, run.len as u64);
        };
        let engine = self.io_mode.engine;
        #[cfg(all(target_os = "linux", feature = "io-uring"))]
        if let (FlushEngine::IoUring { .. }, Some(ring)) = (engine, f.uring.as_mut()) {
            return write_runs_uring(self, ring, &mut f.bounce, &f.runs, entries);
        }
        let mut vectors: Vec<IoSlice<'_>> = Vec::new();
        if engine == FlushEngine::Vectored {
            vectors.extend(entries.iter().map(|(_, p)| IoSlice::new(p)));
        }
        for (ri, run) in f.runs.iter().enumerate() {
            let result = match engine {
                FlushEngine::PerPage => {
                    entries[run.entries()].iter().try_for_each(|(off, page)| {
                        add(&c.write_calls, 1);
                        be.write_all_at(*off, page)
                            .map_err(|e| Error::io("pwrite", Some(*off), e))
                    })
                }
                FlushEngine::Concat => {
                    let align = self.config.page_align;
                    if f.scratch.as_ref().is_none_or(|b| b.len() < run.len) {
                        f.scratch = AlignedBuf::zeroed(run.len, align);
                    }
                    let scratch = f.scratch.as_mut().expect("alignment validated");
                    let mut at = 0;
                    for (_, page) in &entries[run.entries()] {
                        scratch[at..at + page.len()].copy_from_slice(page);
                        at += page.len();
                    }
                    add(&c.write_calls, 1);
                    be.write_all_at(run.offset, &scratch[..run.len])
                        .map_err(|e| Error::io("pwrite", Some(run.offset), e))
                }
                _ => {
                    add(&c.write_calls, 1);
                    be.write_vectored_all_at(run.offset, &mut vectors[run.entries()])
                        .map_err(|e| Error::io("pwritev", Some(run.offset), e))
                }
            };
            if let Err(error) = result {
                return Err(WriteFailure {
                    failed: std::iter::once(run.start..entries.len()).collect(),
                    some_written: ri > 0,
                    error,
                });
            }
            count(run);
        }
        Ok(())
    }

    /// Ends a batch: the entries in `failed` (ranges of the sorted batch)
    /// did not reach the OS (for a commit: or were not synced); the rest did.
    ///
    /// Failed pages go back to the write buffer at once, unless a newer
    /// version exists (dirty, or in a younger in-flight generation). The
    /// generation then retires, but only after every older generation did:
    /// a younger generation shadows an older one for readers, so removing
    /// it first would let a reader find the older version of a page.
    pub(super) fn settle(&self, batch: Batch, failed: &[std::ops::Range<usize>]) {
        let mut is_failed = vec![false; batch.entries.len()];
        for r in failed {
            is_failed[r.clone()].fill(true);
        }
        let mut kept = 0usize;
        for (i, (off, page)) in batch.entries.iter().enumerate() {
            if !is_failed[i] {
                continue;
            }
            let n = off >> self.page_shift;
            let stripe_no = (n & self.stripe_mask) as usize;
            let map = &batch
                .drained
                .iter()
                .find(|(i, _)| *i == stripe_no)
                .expect("a drained page's stripe was drained")
                .1;
            let mut s = self.stripes[stripe_no].lock();
            let pos = s
                .flushing
                .iter()
                .position(|g| Arc::ptr_eq(g, map))
                .expect("generation still in flight");
            let newer = s.dirty.contains_key(&n)
                || s.flushing[pos + 1..].iter().any(|g| g.contains_key(&n));
            if !newer {
                s.dirty.insert(n, Arc::clone(page));
                kept += page.len();
            }
        }
        let mut queue = self.generations.lock();
        let slot = queue
            .iter_mut()
            .find(|g| g.id == batch.id)
            .expect("generation registered at drain");
        slot.done = Some((batch, is_failed, kept));
        while queue.front().is_some_and(|g| g.done.is_some()) {
            let (batch, is_failed, kept) = queue.pop_front().and_then(|g| g.done).expect("checked");
            self.retire(batch, &is_failed, kept);
        }
    }

    /// Settles a batch all of whose pages failed.
    pub(super) fn settle_failed(&self, batch: Batch) {
        let all = 0..batch.entries.len();
        self.settle(batch, &[all]);
    }

    /// Removes a finished generation (the oldest): written pages update the
    /// known disk length and the read cache, then the generation leaves its
    /// stripes and the memory of released pages leaves the buffer bound.
    /// Every page is thus in `dirty`, or in the cache / on disk, before its
    /// in-flight entry goes.
    fn retire(&self, batch: Batch, is_failed: &[bool], kept: usize) {
        let written = || {
            batch
                .entries
                .iter()
                .zip(is_failed)
                .filter(|(_, f)| !**f)
                .map(|(e, _)| e)
        };
        if let Some((off, page)) = written().next_back() {
            // Sorted: the last written page ends highest.
            self.disk_len
                .fetch_max(off + page.len() as u64, Ordering::AcqRel);
        }
        if !self.cache.is_empty() {
            for (off, page) in written() {
                let n = off >> self.page_shift;
                if let Some(c) = self.cache_stripe(n) {
                    let mut c = c.lock();
                    c.seq += 1;
                    self.cache_insert(&mut c, n, Arc::clone(page));
                }
            }
        }
        let mut total = 0usize;
        for (i, map) in &batch.drained {
            total += map.values().map(|p| p.len()).sum::<usize>();
            self.stripes[*i]
                .lock()
                .flushing
                .retain(|g| !Arc::ptr_eq(g, map));
        }
        self.buffered.fetch_sub(total - kept, Ordering::AcqRel);
        // Recycle the pages nobody else holds (a reader, the read cache, or
        // the write buffer after a failure): drop the maps' references
        // first, so each page's last reference is the batch's.
        let Batch {
            entries, drained, ..
        } = batch;
        drop(drained);
        self.pool.put_all(
            entries
                .into_iter()
                .filter_map(|(_, page)| Arc::try_unwrap(page).ok()),
        );
        if total > kept {
            // Wake writers waiting for room (see `wait_for_room`).
            let _room = self.room.lock();
            self.room_freed.notify_all();
        }
    }
}

/// An in-flight generation, in drain order; `done` once its batch settled.
pub(crate) struct Generation {
    id: u64,
    /// The batch, which of its entries failed, and the bytes kept dirty.
    done: Option<(Batch, Vec<bool>, usize)>,
}

/// The `IoUring` engine: every run one SQE, up to the queue depth in
/// flight. Runs complete out of order, so failures can be any subset.
#[cfg(all(target_os = "linux", feature = "io-uring"))]
fn write_runs_uring(
    file: &PagedCachedFile,
    ring: &mut crate::backend::uring::UringWriter,
    bounce: &mut [AlignedBuf],
    runs: &[Run],
    entries: &[(u64, PageRef)],
) -> Result<(), WriteFailure> {
    use crate::backend::uring::{CopyJob, UringRun};
    let mut vectors: Vec<IoSlice<'_>> = entries.iter().map(|(_, p)| IoSlice::new(p)).collect();
    let mut uruns: Vec<UringRun<'_, '_>> = Vec::with_capacity(runs.len());
    let mut rest: &mut [IoSlice<'_>] = &mut vectors;
    for run in runs {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(run.count);
        uruns.push(UringRun::new(run.offset, head));
        rest = tail;
    }
    let before = ring.submit_calls();
    let be = &*file.backend;
    let fault = |off, len| be.uring_fault(off, len);
    let outcome = if file.io_mode.direct.is_some() {
        // O_DIRECT: one contiguous segment per SQE, copied into a bounce
        // buffer (the kernel's per-segment cost there exceeds the copy).
        let jobs: Vec<CopyJob> = runs
            .iter()
            .map(|r| CopyJob {
                offset: r.offset,
                len: r.len,
            })
            .collect();
        let mut fill = |j: usize, buf: &mut [u8]| {
            let mut at = 0;
            for (_, page) in &entries[runs[j].entries()] {
                buf[at..at + page.len()].copy_from_slice(page);
                at += page.len();
            }
        };
        let r = ring.write_copied(&jobs, bounce, &mut fill, &fault);
        let (errors, outcome) = match r {
            Ok(errors) => (errors, Ok(0)),
            Err(e) => (
                runs.iter()
                    .map(|_| Some(std::io::Error::other("io_uring_enter failed")))
                    .collect(),
                Err(e),
            ),
        };
        for (u, e) in uruns.iter_mut().zip(errors) {
            u.error = e;
            if u.error.is_none() {
                u.iov = &mut [];
            }
        }
        outcome
    } else {
        ring.write_runs(&mut uruns, &fault)
    };
    add(&file.counters.write_calls, ring.submit_calls() - before);
    let mut failed = Vec::new();
    let mut first: Option<Error> = None;
    for (run, u) in runs.iter().zip(uruns.iter_mut()) {
        if u.error.is_none() && !u.iov.is_empty() {
            // Never report a run with bytes left as written.
            debug_assert!(false, "io_uring run at {} left incomplete", run.offset);
            u.error = Some(std::io::Error::other("run left incomplete"));
        }
        match u.error.take() {
            None => {
                add(&file.counters.runs, 1);
                add(&file.counters.pages_written, run.count as u64);
                add(&file.counters.bytes_written, run.len as u64);
            }
            Some(e) => {
                failed.push(run.entries());
                first.get_or_insert_with(|| Error::io("io_uring writev", Some(run.offset), e));
            }
        }
    }
    if let Err(e) = outcome {
        first.get_or_insert_with(|| Error::io("io_uring_enter", None, e));
    }
    match first {
        None => Ok(()),
        Some(error) => Err(WriteFailure {
            some_written: failed.len() < runs.len(),
            failed,
            error,
        }),
    }
}
