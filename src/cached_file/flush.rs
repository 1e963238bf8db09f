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
use crate::coalesce::{Run, RunLimits, coalesce};
use crate::error::{Error, Result};

/// State owned by whoever holds the flusher lock, kept between flushes so
/// that a steady-state flush does not reallocate it.
#[derive(Default)]
pub(crate) struct Flusher {
    runs: Vec<Run>,
    /// Copy buffer of the `Concat` engine.
    scratch: Vec<u8>,
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
                self.settle(batch, None);
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
            self.settle(batch, Some(0));
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
            Err((failed_run, e)) => {
                if failed_run > 0 {
                    // Some runs did reach the OS: a later sync must cover them.
                    self.write_seq.fetch_add(1, Ordering::AcqRel);
                }
                let first_failed = f.runs[failed_run].start;
                self.settle(batch, Some(first_failed));
                Err(e)
            }
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

    /// Writes the runs in order with the configured engine. On error,
    /// returns the index of the run that failed; runs before it are on the
    /// OS, it and the runs after it are not.
    fn write_runs(
        &self,
        f: &mut Flusher,
        entries: &[(u64, PageRef)],
    ) -> Result<(), (usize, Error)> {
        let Flusher { runs, scratch } = f;
        let be = &*self.backend;
        let c = &self.counters;
        let mut vectors: Vec<IoSlice<'_>> = Vec::new();
        if self.config.engine == FlushEngine::Vectored {
            vectors.extend(entries.iter().map(|(_, p)| IoSlice::new(p)));
        }
        for (ri, run) in runs.iter().enumerate() {
            let result = match self.config.engine {
                FlushEngine::PerPage => {
                    entries[run.entries()].iter().try_for_each(|(off, page)| {
                        add(&c.write_calls, 1);
                        be.write_all_at(*off, page)
                            .map_err(|e| Error::io("pwrite", Some(*off), e))
                    })
                }
                FlushEngine::Concat => {
                    scratch.clear();
                    for (_, page) in &entries[run.entries()] {
                        scratch.extend_from_slice(page);
                    }
                    add(&c.write_calls, 1);
                    be.write_all_at(run.offset, scratch)
                        .map_err(|e| Error::io("pwrite", Some(run.offset), e))
                }
                FlushEngine::Vectored => {
                    add(&c.write_calls, 1);
                    be.write_vectored_all_at(run.offset, &mut vectors[run.entries()])
                        .map_err(|e| Error::io("pwritev", Some(run.offset), e))
                }
            };
            result.map_err(|e| (ri, e))?;
            add(&c.runs, 1);
            add(&c.pages_written, run.count as u64);
            add(&c.bytes_written, run.len as u64);
        }
        Ok(())
    }

    /// Ends a batch: `entries[..failed_from]` reached the OS (and, for a
    /// commit, were synced), the rest did not (`None`: all did).
    ///
    /// Failed pages go back to the write buffer at once, unless a newer
    /// version exists (dirty, or in a younger in-flight generation). The
    /// generation then retires, but only after every older generation did:
    /// a younger generation shadows an older one for readers, so removing
    /// it first would let a reader find the older version of a page.
    pub(super) fn settle(&self, batch: Batch, failed_from: Option<usize>) {
        let split = failed_from.unwrap_or(batch.entries.len());
        let mut kept = 0usize;
        for (off, page) in &batch.entries[split..] {
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
        slot.done = Some((batch, split, kept));
        while queue.front().is_some_and(|g| g.done.is_some()) {
            let (batch, split, kept) = queue.pop_front().and_then(|g| g.done).expect("checked");
            self.retire(batch, split, kept);
        }
    }

    /// Removes a finished generation (the oldest): written pages update the
    /// known disk length and the read cache, then the generation leaves its
    /// stripes and the memory of released pages leaves the buffer bound.
    /// Every page is thus in `dirty`, or in the cache / on disk, before its
    /// in-flight entry goes.
    fn retire(&self, batch: Batch, split: usize, kept: usize) {
        let written = &batch.entries[..split];
        if let Some((off, page)) = written.last() {
            // Sorted: the last written page ends highest.
            self.disk_len
                .fetch_max(off + page.len() as u64, Ordering::AcqRel);
        }
        if !self.cache.is_empty() {
            for (off, page) in written {
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
    done: Option<(Batch, usize, usize)>,
}
