//! Flush: drain the stripes, sort, coalesce, write, settle.
//!
//! A flush produces a [`Batch`]: the pages it drained, now one in-flight
//! generation in every stripe it touched. A plain flush settles its batch
//! as soon as the writes complete; a commit round holds it until its
//! `fdatasync` returned (see `commit.rs`), so that a failed `fdatasync` can
//! put the pages back in the write buffer before the file is poisoned.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::stats::{add, add_elapsed};
use super::writer::RunWriter;
use super::{PageMap, PageRef, PagedCachedFile};
use crate::coalesce::{Run, RunLimits, coalesce};
use crate::error::{Error, Result};

/// Largest hole between two runs past the end of an `O_DIRECT` file that
/// one `fallocate` covers (bytes): 64 KiB. Writers filling fresh pages side
/// by side leave such holes for a moment; a page further out gets its own
/// call, so sparse files stay sparse.
pub(crate) const PREALLOC_MAX_GAP: u64 = 64 << 10;

/// Emptied maps a stripe keeps for its next drains (`Stripe::spare`): a
/// commit pipeline has a generation being written, one or two syncing and
/// one settling, each holding a map.
pub(crate) const SPARE_MAPS: usize = 4;

/// Largest capacity (pages) of a map kept as a spare: one grown by a bulk
/// flush is dropped, so the maps that go round stay small to iterate.
const SPARE_MAP_MAX: usize = 1024;

/// Most emptied batch vectors kept (`PagedCachedFile::spare_batches`).
const SPARE_BATCHES: usize = 4;

/// The vectors of a retired [`Batch`], emptied, kept with their capacity
/// for the next drain.
#[derive(Default)]
pub(crate) struct BatchVecs {
    entries: Vec<(u64, PageRef)>,
    drained: Vec<(usize, Arc<PageMap>)>,
}

/// State owned by whoever holds the flusher lock, kept between flushes so
/// that a steady-state flush does not reallocate it.
pub(crate) struct Flusher {
    runs: Vec<Run>,
    /// Per run: its preallocation failed (reused between flushes).
    alloc_failed: Vec<bool>,
    /// How runs reach the file, resolved at open.
    writer: RunWriter,
    /// The file's length as the OS holds it after every completed write,
    /// `fallocate` and `ftruncate` (all made under the flusher lock): what
    /// a failed write that extended the file partway is cut back to, and
    /// what a flush compares the logical length with.
    pub(super) os_len: u64,
}

impl Flusher {
    /// A flusher that writes with `writer` to a file of `os_len` bytes.
    pub(crate) fn new(writer: RunWriter, os_len: u64) -> Self {
        Self {
            runs: Vec::new(),
            alloc_failed: Vec::new(),
            writer,
            os_len,
        }
    }
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
    /// Entry ranges (of the sorted batch) that did not reach the OS, not
    /// yet put back in the write buffer (see `requeue`).
    pub(super) failed: Vec<std::ops::Range<usize>>,
    /// Per entry, whether it failed and was put back (empty, no allocation,
    /// until something fails).
    is_failed: Vec<bool>,
    /// Bytes of the pages put back in the write buffer.
    kept: usize,
    /// What the file holds after this batch's writes at most: the logical
    /// length when the last page straddled it and the file was cut back.
    disk_cap: u64,
}

/// A flush's outcome: the batch (to settle; its `failed` entries go back to
/// the write buffer) and the error of the pages that failed, if any did.
pub(crate) struct Written {
    pub(super) batch: Batch,
    pub(super) error: Option<Error>,
    /// The batch was one run, written with `RWF_DSYNC` without error and
    /// with nothing cut back after it: it is durable without an `fdatasync`.
    pub(super) durable: bool,
}

impl PagedCachedFile {
    /// Flush without `fdatasync`. Returns whether anything was written.
    pub(super) fn flush_to_os(&self) -> Result<bool> {
        let mut f = self.flusher.lock();
        let len = self.logical_len.load(Ordering::Acquire);
        match self.write_batch(&mut f, false, false) {
            Some(Written { batch, error, .. }) => {
                let grown = match error {
                    None => self.extend_to(&mut f, len),
                    Some(_) => Ok(false),
                };
                self.settle(batch);
                error.map_or(grown.map(|_| true), Err)
            }
            None => self.extend_to(&mut f, len),
        }
    }

    /// Extends the file to `len` bytes (the logical length read before the
    /// flush drained) where its writes left it shorter: the pages at the
    /// end were discarded, or `write_all_at` reached past the last page
    /// written. Length is data: what [`len`](PagedCachedFile::len) reports
    /// when a `sync` returns is what is durable. Bumps `write_seq`, so the
    /// next `fdatasync` covers the new length. Returns whether it extended.
    ///
    /// Errors: `Error::Io` with op "ftruncate".
    pub(super) fn extend_to(&self, f: &mut Flusher, len: u64) -> Result<bool> {
        if len <= f.os_len {
            return Ok(false);
        }
        self.backend
            .set_len(len)
            .map_err(|e| Error::io("ftruncate", Some(len), e))?;
        f.os_len = len;
        self.disk_len.fetch_max(len, Ordering::AcqRel);
        self.write_seq.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// Drains every stripe and writes what it found: `None` if nothing was
    /// dirty. Every run is tried, whatever failed before it (one bad page
    /// must not hold the others hostage); the pages of the runs that failed
    /// are back in the write buffer when it returns, and their error,
    /// naming their byte ranges, is in `error`. The caller settles the
    /// batch.
    ///
    /// With `dsync`, a batch that is one run is written durably when the
    /// engine can (`Written::durable`). `alone`: no commit round is syncing
    /// meanwhile, so a one-run batch goes out inline whatever the engine
    /// ([`RunWriter::writes_inline`]).
    ///
    /// Must be called with the flusher lock held (`f`): writes of two
    /// flushes never interleave, so a newer version of a page is always
    /// written after an older one (newest wins).
    pub(super) fn write_batch(&self, f: &mut Flusher, dsync: bool, alone: bool) -> Option<Written> {
        let mut batch = self.drain()?;
        let limits = RunLimits {
            max_pages: self.config.max_run_pages,
            max_bytes: self.max_run_bytes,
        };
        if let Err(e) = coalesce(&mut batch.entries, limits, &mut f.runs) {
            // Cannot happen: drained pages have distinct page numbers.
            debug_assert!(false, "coalesce failed on drained pages: {e}");
            batch.failed.push(0..batch.entries.len());
            self.requeue(&mut batch);
            return Some(Written {
                batch,
                error: Some(e),
                durable: false,
            });
        }
        let mut first: Option<(u64, &'static str, std::io::Error)> = None;
        self.preallocate(f, &mut batch, &mut first, alone);
        let dsync = dsync && f.runs.len() == 1 && f.writer.can_dsync();
        let started = std::time::Instant::now();
        let written = f.writer.write(
            &*self.backend,
            &f.runs,
            &batch.entries,
            &self.counters,
            dsync,
            alone,
        );
        add_elapsed(&self.counters.write_ns, started);
        let mut durable = dsync && written.is_ok() && first.is_none();
        let some_written = match written {
            Ok(()) => !f.runs.is_empty(),
            Err(w) => {
                batch.failed.extend(w.failed);
                if first.as_ref().is_none_or(|(at, ..)| w.offset < *at) {
                    first = Some((w.offset, w.op, w.error));
                }
                w.some_written
            }
        };
        let mut error = None;
        if some_written {
            // Those runs reached the OS: a later sync must cover them.
            self.write_seq.fetch_add(1, Ordering::AcqRel);
            add(&self.counters.flushes, 1);
            if let Some(end) = written_end(&batch) {
                f.os_len = f.os_len.max(end);
            }
            match self.cut_tail(f, &mut batch) {
                // The file's length changed after the durable write: only
                // an fdatasync covers that.
                Ok(true) => durable = false,
                Ok(false) => {}
                Err(e) => {
                    durable = false;
                    error = Some(e);
                }
            }
        }
        if let Some((_, op, source)) = first {
            self.cut_back(f);
            batch.failed.sort_by_key(|r| r.start);
            error = Some(Error::PagesFailed {
                failed: byte_ranges(&batch.entries, &batch.failed),
                op,
                source,
            });
        }
        // Before the flusher lock is released: the next drain must find
        // the pages that failed.
        self.requeue(&mut batch);
        Some(Written {
            batch,
            error,
            durable,
        })
    }

    /// A page straddling an unaligned logical length was written whole, so
    /// the file grew past the length: cut it back (the bytes past it are
    /// zeros in the page, but nothing past the end may be left on disk).
    /// Returns whether it cut.
    fn cut_tail(&self, f: &mut Flusher, batch: &mut Batch) -> Result<bool> {
        let len = self.logical_len.load(Ordering::Acquire);
        let Some(end) = written_end(batch) else {
            return Ok(false);
        };
        if end <= len {
            return Ok(false);
        }
        batch.disk_cap = len;
        self.backend
            .set_len(len)
            .map_err(|e| Error::io("ftruncate", Some(len), e))?;
        f.os_len = len;
        Ok(true)
    }

    /// After a failed write: a write that failed partway may have extended
    /// the file (a short write into a full disk ends mid-page where blocks
    /// are smaller than pages), and nothing past what completed is data.
    /// Cuts the file back to `f.os_len`, so it stays a whole number of
    /// pages and an `O_DIRECT` open with the same options takes it again.
    /// The failed pages are back in the write buffer and are written again
    /// whole. Best effort: the write's error is what the caller reports.
    fn cut_back(&self, f: &Flusher) {
        if let Ok(len) = self.backend.len()
            && len > f.os_len
        {
            let _ = self.backend.set_len(f.os_len);
        }
    }

    /// With `O_DIRECT`, reserves blocks for the runs that write past the
    /// file's end before writing them: `fallocate` mode 0 over each group of
    /// such runs whose gaps are at most [`PREALLOC_MAX_GAP`] bytes, so a far
    /// page allocates its own page, never the gap before it, while pages
    /// that concurrent writers left a few pages apart cost one call.
    /// ext4 serializes `O_DIRECT` writes that extend the file under the
    /// exclusive inode lock, and io_uring then queues them in worker
    /// threads; inside the file, over allocated blocks, they run under the
    /// shared lock, in parallel. So only a flush whose writes are in flight
    /// beside others (`!`[`RunWriter::writes_inline`]) preallocates. One
    /// that writes one call at a time gains nothing from it and pays for it:
    /// the blocks `fallocate` reserves are unwritten extents, which each
    /// write then converts, while an extending write allocates written
    /// blocks at once. Measured without it (`scripts/ab-scale.sh`, one
    /// committer, vectored): 1.09x commits/s in two runs of `--rewrite 0
    /// --direct on` (CPU per GB 0.86-0.91x), 1.19x with `scale`'s
    /// defaults; level at 8 committers (`.project/commit-suite.md`). A
    /// backend that cannot preallocate is written as is. Runs whose
    /// `fallocate` fails (`ENOSPC`) are not written: they leave `f.runs`,
    /// their entries go to `batch.failed` and the error into `first`
    /// (lowest offset wins).
    fn preallocate(
        &self,
        f: &mut Flusher,
        batch: &mut Batch,
        first: &mut Option<(u64, &'static str, std::io::Error)>,
        alone: bool,
    ) {
        if self.io_mode.direct.is_none() || f.writer.writes_inline(f.runs.len(), alone) {
            return;
        }
        let disk = self.disk_len.load(Ordering::Acquire);
        let Some(start) = f.runs.iter().position(|r| r.offset + r.len as u64 > disk) else {
            return;
        };
        f.alloc_failed.clear();
        f.alloc_failed.resize(f.runs.len(), false);
        let mut i = start;
        while i < f.runs.len() {
            // One group: runs i..j, each within PREALLOC_MAX_GAP of the last.
            let from = f.runs[i].offset;
            let mut to = from + f.runs[i].len as u64;
            let mut j = i + 1;
            while j < f.runs.len() && f.runs[j].offset - to <= PREALLOC_MAX_GAP {
                to = f.runs[j].offset + f.runs[j].len as u64;
                j += 1;
            }
            match self.backend.allocate(from, to - from) {
                Ok(()) => {
                    self.disk_len.fetch_max(to, Ordering::AcqRel);
                    f.os_len = f.os_len.max(to);
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::Unsupported
                        || e.raw_os_error() == Some(libc::EOPNOTSUPP) =>
                {
                    return;
                }
                Err(e) => {
                    f.alloc_failed[i..j].fill(true);
                    for run in &f.runs[i..j] {
                        batch.failed.push(run.entries());
                    }
                    if first.as_ref().is_none_or(|(at, ..)| from < *at) {
                        *first = Some((from, "fallocate", e));
                    }
                }
            }
            i = j;
        }
        let mut k = 0;
        let failed = &f.alloc_failed;
        f.runs.retain(|_| {
            k += 1;
            !failed[k - 1]
        });
    }

    /// Moves every stripe's dirty pages to a new in-flight generation (one
    /// swap per stripe under its lock) and collects them. Caller holds the
    /// flusher lock.
    fn drain(&self) -> Option<Batch> {
        let BatchVecs {
            mut entries,
            mut drained,
        } = self.spare_batches.lock().pop().unwrap_or_default();
        for (i, stripe) in self.stripes.iter().enumerate() {
            let mut s = stripe.lock();
            if s.dirty.is_empty() {
                continue;
            }
            let mut map = s.spare.pop().unwrap_or_default();
            let Some(empty) = Arc::get_mut(&mut map) else {
                unreachable!("spare maps are unique: kept only after Arc::get_mut, never cloned")
            };
            std::mem::swap(empty, &mut s.dirty);
            s.flushing.push(Arc::clone(&map));
            drop(s);
            drained.push((i, map));
        }
        if drained.is_empty() {
            self.keep_batch_vecs(BatchVecs { entries, drained });
            return None;
        }
        // Called under the flusher lock: ids follow drain order.
        let id = self.next_generation.fetch_add(1, Ordering::Relaxed);
        self.generations
            .lock()
            .push_back(Generation { id, done: None });
        let shift = self.page_shift;
        let n = drained.iter().map(|(_, m)| m.len()).sum();
        entries.reserve(n);
        for (_, map) in &drained {
            entries.extend(map.iter().map(|(&p, page)| (p << shift, Arc::clone(page))));
        }
        Some(Batch {
            id,
            entries,
            drained,
            failed: Vec::new(),
            is_failed: Vec::new(),
            kept: 0,
            disk_cap: u64::MAX,
        })
    }

    /// Puts the pages of `batch.failed` back in the write buffer, unless a
    /// newer version exists (dirty, or in a younger in-flight generation),
    /// and empties `batch.failed`.
    ///
    /// `write_batch` calls it before the flusher lock is released, so the
    /// next drain finds them: a commit round settles only after its
    /// `fdatasync`, and a round that drained in between without them
    /// could tell a caller who wrote them Ok (found by the shuttle model
    /// check, `an_ok_sync_covers_pages_an_earlier_round_failed_to_write`).
    fn requeue(&self, batch: &mut Batch) {
        if batch.failed.is_empty() {
            return;
        }
        let mut newly = vec![false; batch.entries.len()];
        for r in std::mem::take(&mut batch.failed) {
            newly[r].fill(true);
        }
        let mut is_failed = std::mem::take(&mut batch.is_failed);
        is_failed.resize(batch.entries.len(), false);
        for (i, (off, page)) in batch.entries.iter().enumerate() {
            // Each page goes back once: one already back (an earlier
            // requeue of this batch) is skipped.
            if !newly[i] || is_failed[i] {
                continue;
            }
            is_failed[i] = true;
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
            // A page the engine discarded while it was in flight stays gone.
            if !newer && !s.discarded.contains(&n) {
                s.dirty.insert(n, Arc::clone(page));
                s.seq = s.seq.wrapping_add(1);
                batch.kept += page.len();
            }
        }
        batch.is_failed = is_failed;
    }

    /// Ends a batch: the entries in `batch.failed` (ranges of the sorted
    /// batch) did not reach the OS (for a commit: or were not synced) and
    /// go back to the write buffer (`requeue`); the rest did.
    ///
    /// The generation then retires, but only after every older generation
    /// did: a younger generation shadows an older one for readers, so
    /// removing it first would let a reader find the older version of a
    /// page.
    pub(super) fn settle(&self, mut batch: Batch) {
        self.requeue(&mut batch);
        let is_failed = std::mem::take(&mut batch.is_failed);
        let kept = batch.kept;
        let mut queue = self.generations.lock();
        let slot = queue
            .iter_mut()
            .find(|g| g.id == batch.id)
            .expect("generation registered at drain");
        slot.done = Some((batch, is_failed, kept));
        let mut retired = false;
        while queue.front().is_some_and(|g| g.done.is_some()) {
            let (batch, is_failed, kept) = queue.pop_front().and_then(|g| g.done).expect("checked");
            self.retire(batch, &is_failed, kept);
            retired = true;
        }
        if retired && queue.is_empty() {
            // `set_len` waits for nothing to be in flight.
            self.all_settled.notify_all();
        }
    }

    /// Settles a batch all of whose pages failed.
    pub(super) fn settle_failed(&self, mut batch: Batch) {
        batch.failed = std::iter::once(0..batch.entries.len()).collect();
        self.settle(batch);
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
                .enumerate()
                .filter(|(i, _)| !is_failed.get(*i).copied().unwrap_or(false))
                .map(|(_, e)| e)
        };
        if let Some((off, page)) = written().next_back() {
            // Sorted: the last written page ends highest (but the file was
            // cut back to an unaligned logical length, if it ended past it).
            let end = (off + page.len() as u64).min(batch.disk_cap);
            self.disk_len.fetch_max(end, Ordering::AcqRel);
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
        let Batch {
            mut entries,
            mut drained,
            ..
        } = batch;
        let mut total = 0usize;
        for (i, mut map) in drained.drain(..) {
            total += map.values().map(|p| p.len()).sum::<usize>();
            let mut s = self.stripes[i].lock();
            s.flushing.retain(|g| !Arc::ptr_eq(g, &map));
            if s.flushing.is_empty() {
                s.discarded.clear();
            }
            // Out of `flushing`, the batch held the map's last reference.
            // Emptying it drops its page references, so each page's last
            // reference is the batch's and the pool can take it back.
            let room = s.spare.len() < SPARE_MAPS;
            match Arc::get_mut(&mut map) {
                Some(m) if room && m.capacity() <= SPARE_MAP_MAX => {
                    m.clear();
                    s.spare.push(map);
                }
                // A bulk flush's large map is freed outside the lock.
                _ => {
                    drop(s);
                    drop(map);
                }
            }
        }
        debug_assert!(total >= kept, "kept {kept} of {total} bytes");
        debug_assert!(
            self.buffered.load(Ordering::Acquire) >= total - kept,
            "buffered bytes would wrap"
        );
        self.buffered.fetch_sub(total - kept, Ordering::AcqRel);
        // Recycle the pages nobody else holds (a reader, the read cache, or
        // the write buffer after a failure).
        self.pool.put_all(entries.drain(..).map(|(_, page)| page));
        self.keep_batch_vecs(BatchVecs { entries, drained });
        if total > 0 {
            // Wake writers waiting for room (see `wait_for_room`): room was
            // freed, or the pages went back to the write buffer, where a
            // waiter can flush them itself.
            self.notify_room();
        }
    }

    /// Keeps a retired batch's emptied vectors for the next drain (up to
    /// [`SPARE_BATCHES`]; one a bulk flush grew past `SPARE_MAP_MAX`
    /// pages is dropped).
    fn keep_batch_vecs(&self, vecs: BatchVecs) {
        debug_assert!(vecs.entries.is_empty() && vecs.drained.is_empty());
        if vecs.entries.capacity() > SPARE_MAP_MAX * self.stripes.len() {
            return;
        }
        let mut spare = self.spare_batches.lock();
        if spare.len() < SPARE_BATCHES {
            spare.push(vecs);
        }
    }
}

/// An in-flight generation, in drain order; `done` once its batch settled.
pub(crate) struct Generation {
    id: u64,
    /// The batch, which of its entries failed, and the bytes kept dirty.
    done: Option<(Batch, Vec<bool>, usize)>,
}

/// The highest byte offset a batch wrote, if it wrote anything.
fn written_end(batch: &Batch) -> Option<u64> {
    // Entries are sorted: the last one not failed ends highest.
    (0..batch.entries.len())
        .rev()
        .find(|i| !batch.failed.iter().any(|r| r.contains(i)))
        .map(|i| batch.entries[i].0 + batch.entries[i].1.len() as u64)
}

/// The byte ranges of the entries in `failed` (sorted entry ranges),
/// adjacent ones merged.
fn byte_ranges(
    entries: &[(u64, PageRef)],
    failed: &[std::ops::Range<usize>],
) -> Vec<std::ops::Range<u64>> {
    let mut out: Vec<std::ops::Range<u64>> = Vec::new();
    for r in failed {
        for (off, page) in &entries[r.clone()] {
            let end = off + page.len() as u64;
            match out.last_mut() {
                Some(last) if last.end == *off => last.end = end,
                _ => out.push(*off..end),
            }
        }
    }
    out
}
