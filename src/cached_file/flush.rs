//! Flush: drain the stripes, sort, coalesce, write, settle.

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::stats::{add, add_elapsed};
use super::{FlushEngine, PageMap, PageRef, PagedCachedFile};
use crate::coalesce::{Run, RunLimits, coalesce};
use crate::error::{Error, Result};

/// State owned by whoever holds the flusher lock. The vectors are kept
/// between flushes so a steady-state flush does not allocate for them.
#[derive(Default)]
pub(crate) struct Flusher {
    /// Drained pages as (byte offset, page), sorted by `coalesce`.
    entries: Vec<(u64, PageRef)>,
    runs: Vec<Run>,
    /// The stripes drained by the current flush and what each gave.
    drained: Vec<(usize, Arc<PageMap>)>,
    /// Copy buffer of the `Concat` engine.
    scratch: Vec<u8>,
    /// Writes reached the OS since the last successful `fdatasync`.
    pub(crate) unsynced: bool,
}

impl PagedCachedFile {
    /// Flush without `fdatasync`; the in-flight set is released as soon as
    /// the writes complete.
    pub(super) fn flush_to_os(&self) -> Result<()> {
        let mut f = self.flusher.lock();
        self.flush_locked(&mut f, false).map(|_| ())
    }

    /// Flush, then `fdatasync` if anything reached the OS since the last
    /// one. The in-flight set is held until the `fdatasync` returned, so a
    /// failed `fdatasync` puts every page of this flush back in the write
    /// buffer (readable) before the file is poisoned.
    pub(super) fn flush_and_sync(&self) -> Result<()> {
        let mut f = self.flusher.lock();
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        self.flush_locked(&mut f, true)?;
        if !f.unsynced {
            debug_assert!(f.entries.is_empty());
            return Ok(());
        }
        add(&self.counters.syncs, 1);
        let started = std::time::Instant::now();
        let synced = self.backend.sync_data();
        add_elapsed(&self.counters.sync_ns, started);
        match synced {
            Ok(()) => {
                f.unsynced = false;
                self.settle(&mut f, None);
                Ok(())
            }
            Err(e) => {
                self.poisoned.store(true, Ordering::Release);
                self.settle(&mut f, Some(0));
                Err(Error::io("fdatasync", None, e))
            }
        }
    }

    /// Drains and writes. Returns whether anything was written. With `hold`,
    /// a successful flush leaves the in-flight set in place for the caller
    /// to [`settle`](Self::settle); on error it is always settled here.
    fn flush_locked(&self, f: &mut Flusher, hold: bool) -> Result<bool> {
        self.drain(f);
        if f.entries.is_empty() {
            return Ok(false);
        }
        let limits = RunLimits {
            max_pages: self.config.max_run_pages,
            max_bytes: self.config.max_write_bytes,
        };
        if let Err(e) = coalesce(&mut f.entries, limits, &mut f.runs) {
            // Cannot happen: drained pages have distinct page numbers.
            debug_assert!(false, "coalesce failed on drained pages: {e}");
            self.settle(f, Some(0));
            return Err(e);
        }
        let started = std::time::Instant::now();
        let written = self.write_runs(f);
        add_elapsed(&self.counters.write_ns, started);
        match written {
            Ok(()) => {
                f.unsynced = true;
                add(&self.counters.flushes, 1);
                if !hold {
                    self.settle(f, None);
                }
                Ok(true)
            }
            Err((failed_run, e)) => {
                f.unsynced |= failed_run > 0;
                let first_failed = f.runs[failed_run].start;
                self.settle(f, Some(first_failed));
                Err(e)
            }
        }
    }

    /// Moves every stripe's dirty pages to its in-flight slot (one swap per
    /// stripe under its lock) and collects them into `f.entries`.
    fn drain(&self, f: &mut Flusher) {
        debug_assert!(f.entries.is_empty() && f.drained.is_empty());
        for (i, stripe) in self.stripes.iter().enumerate() {
            let mut s = stripe.lock();
            if s.dirty.is_empty() {
                continue;
            }
            debug_assert!(s.flushing.is_none(), "one flush at a time");
            let map = Arc::new(std::mem::take(&mut s.dirty));
            s.flushing = Some(Arc::clone(&map));
            drop(s);
            f.drained.push((i, map));
        }
        let shift = self.page_shift;
        for (_, map) in &f.drained {
            f.entries
                .extend(map.iter().map(|(&n, page)| (n << shift, Arc::clone(page))));
        }
    }

    /// Writes the runs in order with the configured engine. On error,
    /// returns the index of the run that failed; runs before it are on the
    /// OS, it and the runs after it are not.
    fn write_runs(&self, f: &mut Flusher) -> Result<(), (usize, Error)> {
        let Flusher {
            entries,
            runs,
            scratch,
            ..
        } = f;
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

    /// Ends a flush: `entries[..failed_from]` reached the OS, the rest did
    /// not (`None`: all did). Written pages update the read cache and the
    /// known disk length; failed pages go back to the write buffer unless a
    /// newer version is there; then the in-flight slots are cleared and the
    /// memory of released pages leaves the buffer bound.
    ///
    /// The order matters for readers: every page is back in `dirty` or in
    /// the cache / on disk before its in-flight slot is cleared.
    pub(super) fn settle(&self, f: &mut Flusher, failed_from: Option<usize>) {
        let split = failed_from.unwrap_or(f.entries.len());
        let (written, failed) = f.entries.split_at(split);
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
        let mut kept = 0usize;
        for (off, page) in failed {
            let n = off >> self.page_shift;
            let mut s = self.stripe(n).lock();
            if let std::collections::hash_map::Entry::Vacant(slot) = s.dirty.entry(n) {
                slot.insert(Arc::clone(page));
                kept += page.len();
            }
        }
        for (i, map) in f.drained.drain(..) {
            total += map.values().map(|p| p.len()).sum::<usize>();
            self.stripes[i].lock().flushing = None;
        }
        self.buffered.fetch_sub(total - kept, Ordering::AcqRel);
        f.entries.clear();
        f.runs.clear();
    }
}
