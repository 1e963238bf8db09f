//! Flush: drain the stripes, sort, coalesce, write, settle.
//!
//! A flush produces a [`Batch`]: the pages it drained, now one in-flight
//! generation in every stripe it touched. A plain flush settles its batch
//! as soon as the writes complete; a commit round holds it until its
//! `fdatasync` returned (see `commit.rs`), so that a failed `fdatasync` can
//! put the pages back in the write buffer before the file is poisoned.
//!
//! The drain happens under the flusher lock, the writes after it is
//! released, from a write slot of their own, so several flushes write at
//! once (see "Writes in flight" in the module docs of `cached_file`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::PagedCachedFile;
use super::gather::GatherBuf;
use super::pages::{PageMap, PageRef};
use super::stats::{add, add_elapsed};
use super::write_buffer::{Requeued, SPARE_MAP_MAX};
use super::writer::RunWriter;
use crate::coalesce::{Run, RunLimits, coalesce, split_for_atomic};
use crate::error::{Error, Result};
use crate::sync::MutexGuard;

/// Largest hole between two runs past the end of an `O_DIRECT` file that
/// one `fallocate` covers (bytes): 64 KiB. Writers filling fresh pages side
/// by side leave such holes for a moment; a page further out gets its own
/// call, so sparse files stay sparse.
pub(crate) const PREALLOC_MAX_GAP: u64 = 64 << 10;

/// Most emptied batch vectors kept (`PagedCachedFile::spare_batches`).
const SPARE_BATCHES: usize = 4;

/// The vectors of a retired [`Batch`], emptied, kept with their capacity
/// for the next drain.
#[derive(Default)]
pub(crate) struct BatchVecs {
    entries: Vec<(u64, PageRef)>,
    drained: Vec<(usize, Arc<PageMap>)>,
}

/// State owned by whoever holds the flusher lock (the drain side).
pub(crate) struct Flusher {
    /// The file's length as the OS will hold it once every write drained so
    /// far completed (grown at each drain by its pages, and by every
    /// `fallocate` and `ftruncate`, all made under the flusher lock): what a
    /// flush compares the logical length with.
    pub(super) os_len: u64,
}

impl Flusher {
    /// A flusher over a file of `os_len` bytes.
    pub(crate) fn new(os_len: u64) -> Self {
        Self { os_len }
    }
}

/// What one flush writes with: its runs and the writer that writes them.
/// A flush takes a free slot under the flusher lock and gives it back when
/// its writes completed, so the slots bound the flushes writing at once.
pub(crate) struct WriteSlot {
    runs: Vec<Run>,
    /// Per run: its preallocation failed (reused between flushes).
    alloc_failed: Vec<bool>,
    /// How runs reach the file, resolved at open.
    writer: RunWriter,
    /// With [`TornWrites::Atomic`](super::TornWrites::Atomic): the copy
    /// buffer of atomic writes, and the runs before they were cut into
    /// atomic pieces (reused).
    atomic: Option<(GatherBuf, Vec<Run>)>,
}

impl WriteSlot {
    /// A slot that writes with `writer`; `atomic_align` (the page
    /// alignment) if it writes atomic pieces.
    pub(crate) fn new(writer: RunWriter, atomic_align: Option<usize>) -> Self {
        Self {
            runs: Vec::new(),
            alloc_failed: Vec::new(),
            writer,
            atomic: atomic_align.map(|a| (GatherBuf::new(a), Vec::new())),
        }
    }
}

/// The pages one flush drained: one in-flight generation.
pub(crate) struct Batch {
    /// Drain order (see `Generation`).
    id: u64,
    /// The drain's number (`Generations::drains`).
    drain_no: u64,
    /// The youngest older generation, still in flight at the drain, that
    /// holds a page this one drained: this batch writes only after every
    /// generation up to it has written (newest wins).
    after: Option<u64>,
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

/// What a flush did ([`PagedCachedFile::flush_pass`]).
pub(crate) struct Pass {
    /// The last batch written, to settle (its failed pages are already back
    /// in the write buffer); `None` if the flush found nothing dirty.
    pub(super) batch: Option<Batch>,
    /// The first error: pages that failed to write (`PagesFailed`, naming
    /// them), or the file could not be extended or cut to its length.
    pub(super) error: Option<Error>,
    /// The batch was one run written with `RWF_DSYNC` without error, with
    /// the file's length unchanged, while no other write was in flight:
    /// everything up to this `write_seq` is durable without an
    /// `fdatasync`.
    pub(super) durable_seq: Option<u64>,
    /// `write_seq` once every write drained up to this flush completed.
    pub(super) seq: u64,
    /// `unstaged_at`, read together with `seq`.
    pub(super) unstaged_at: u64,
    /// Something reached the OS or the file's length changed.
    pub(super) wrote: bool,
}

/// One batch's write: the batch (to settle; its failed entries are back
/// in the write buffer), the error of what failed, and the `write_seq` up
/// to which it made the file durable, if it was written with `RWF_DSYNC`.
pub(crate) struct Written {
    pub(super) batch: Batch,
    pub(super) error: Option<Error>,
    pub(super) durable_seq: Option<u64>,
}

impl PagedCachedFile {
    /// Flush without `fdatasync`. Returns whether anything was written.
    /// Returns once every page buffered when it was called reached the OS,
    /// whichever flush drained it.
    pub(super) fn flush_to_os(&self) -> Result<bool> {
        let pass = self.flush_pass(false, 0, false);
        if let Some(batch) = pass.batch {
            self.settle(batch);
        }
        pass.error.map_or(Ok(pass.wrote), Err)
    }

    /// Extends the file to `len` bytes (the logical length read before the
    /// flush drained) where its writes will leave it shorter: the pages at
    /// the end were discarded, or `write_all_at` reached past the last page
    /// written. Length is data: what [`len`](PagedCachedFile::len) reports
    /// when a `sync` returns is what is durable. Bumps `write_seq`, so the
    /// next `fdatasync` covers the new length. Returns whether it extended.
    ///
    /// Called under the flusher lock before the flush's writes: every write
    /// in flight ends at or below `f.os_len`, so this only ever grows the
    /// file.
    ///
    /// Errors: `Error::Io` with op "ftruncate".
    ///
    /// `staging`: the caller stages a doublewrite record carrying `len`
    /// and makes the `write_seq` step itself once it knows whether the
    /// record is durable (a plain step if it is, else
    /// `Durability::step_unstaged`). Otherwise the step is
    /// marked unstaged here.
    pub(super) fn extend_to(&self, f: &mut Flusher, len: u64, staging: bool) -> Result<bool> {
        if len <= f.os_len {
            return Ok(false);
        }
        self.backend
            .set_len(len)
            .map_err(|e| Error::io("ftruncate", Some(len), e))?;
        f.os_len = len;
        self.length.grow_written(len);
        self.length.grow_disk(len);
        if !staging {
            self.durability.step_unstaged();
        }
        Ok(true)
    }

    /// One flush: drains every stripe and writes what it found, then waits
    /// until every generation drained before or with it has written, so
    /// that what was buffered when it started is with the OS when it
    /// returns. If a write of an older generation failed meanwhile (its
    /// pages went back to the write buffer after this drain), it drains and
    /// writes again; the batches of the passes before the last are settled
    /// at once.
    ///
    /// Every run is tried, whatever failed before it (one bad page must not
    /// hold the others hostage); the pages of the runs that failed are back
    /// in the write buffer when it returns, and their error, naming their
    /// byte ranges, is in `error`. The caller settles the batch.
    ///
    /// With `dsync`, a batch that is one run is written durably when the
    /// engine can, `write_seq` still equals `synced_before` and no other
    /// write is in flight (`Pass::durable_seq`). `alone`: no commit round
    /// is syncing meanwhile, so a one-run batch goes out inline whatever
    /// the engine ([`RunWriter::writes_inline`]).
    pub(super) fn flush_pass(&self, dsync: bool, synced_before: u64, alone: bool) -> Pass {
        let mut pass = Pass {
            batch: None,
            error: None,
            durable_seq: None,
            seq: 0,
            unstaged_at: 0,
            wrote: false,
        };
        let mut first_pass = true;
        loop {
            let mut f = self.flusher.lock();
            if self.cut_pending.load(Ordering::Acquire) {
                self.cut_back_if_idle(&mut f);
            }
            // Read before the drain: covers every write of the callers.
            let len = self.length.get();
            let drain_no = self.begin_drain();
            let drained = self.drain(drain_no);
            // Every generation below this one was drained by now.
            let mark = self.next_generation.load(Ordering::Acquire);
            match drained {
                None => {
                    match self.extend_to(&mut f, len, false) {
                        Ok(grown) => pass.wrote |= grown,
                        Err(e) => {
                            pass.error.get_or_insert(e);
                        }
                    }
                    drop(f);
                }
                Some(batch) => {
                    let dsync = (dsync && first_pass).then_some(synced_before);
                    let w = self.write_batch(f, batch, dsync, alone, len);
                    pass.wrote = true;
                    pass.durable_seq = w.durable_seq;
                    if let Some(e) = w.error {
                        pass.error.get_or_insert(e);
                    }
                    pass.batch = Some(w.batch);
                }
            }
            let missed = self.wait_written_then_check(mark, drain_no);
            (pass.seq, pass.unstaged_at) = self.durability.snapshot();
            if !missed {
                return pass;
            }
            // Pages an older generation failed to write are back in the
            // write buffer, after this drain: write them too.
            first_pass = false;
            pass.durable_seq = None;
            if let Some(batch) = pass.batch.take() {
                self.settle(batch);
            }
        }
    }

    /// Numbers a drain (under the flusher lock) and registers its flush as
    /// one that will check the requeue records (`wait_written_then_check`).
    fn begin_drain(&self) -> u64 {
        let mut g = self.generations.lock();
        g.drains += 1;
        let no = g.drains;
        g.checking.push(no);
        no
    }

    /// Records that the failed pages of the batch drained as `drain_no` went
    /// back to the write buffer now.
    fn log_requeue(&self, drain_no: u64) {
        let mut g = self.generations.lock();
        let now = g.drains;
        if now > drain_no {
            g.requeues.push((drain_no, now));
        }
    }

    /// Waits until every generation numbered below `mark` has written
    /// (`wait_written`), then tells whether an older generation's failed
    /// pages went back to the write buffer after the drain numbered
    /// `drain_no` (so it did without them), and ends that flush's check.
    /// Every such requeue was recorded before its generation counted as
    /// written, so none is missed.
    fn wait_written_then_check(&self, mark: u64, drain_no: u64) -> bool {
        let mut g = self.generations.lock();
        while g.iter().any(|x| x.id < mark && !x.written) {
            self.gens_written.wait(&mut g);
        }
        let missed = g
            .requeues
            .iter()
            .any(|&(drained, requeued)| drained < drain_no && drain_no <= requeued);
        if let Some(i) = g.checking.iter().position(|&d| d == drain_no) {
            g.checking.swap_remove(i);
        }
        // A record no flush still checking can fall under is dropped (a
        // later drain is numbered above every record).
        let oldest = g.checking.iter().copied().min();
        g.requeues
            .retain(|&(_, requeued)| oldest.is_some_and(|d| d <= requeued));
        missed
    }

    /// Waits until every generation numbered below `mark` has written (its
    /// writes completed, successfully or not).
    fn wait_written(&self, mark: u64) {
        let mut g = self.generations.lock();
        while g.iter().any(|x| x.id < mark && !x.written) {
            self.gens_written.wait(&mut g);
        }
    }

    /// Marks generation `id` written and wakes whoever waits for it.
    fn mark_written(&self, id: u64) {
        let mut g = self.generations.lock();
        if let Some(x) = g.iter_mut().find(|x| x.id == id) {
            x.written = true;
        }
        self.gens_written.notify_all();
    }

    /// Takes a free write slot, waiting for one while all are writing.
    /// Called under the flusher lock (slots come back without it).
    fn take_slot(&self) -> WriteSlot {
        let mut slots = self.slots.lock();
        loop {
            if let Some(slot) = slots.pop() {
                return slot;
            }
            self.slot_free.wait(&mut slots);
        }
    }

    fn put_slot(&self, slot: WriteSlot) {
        self.slots.lock().push(slot);
        self.slot_free.notify_one();
    }

    /// Coalesces and writes `batch`, drained under `f`. Under `f`: the
    /// runs, their preallocation and the file's new length; then `f` is
    /// released and, once the older generations holding its pages have
    /// written (`Batch::after`), the runs are written from a write slot.
    /// `dsync`: the `write_seq` the last `fdatasync` covered, if a one-run
    /// batch may be written durably; it is, if no write completed since.
    /// A batch written durably (`dsync`) or over an unaligned logical
    /// length (whose tail is cut after the write) is written under `f`
    /// once every older generation has written: no other write is in flight
    /// beside it.
    fn write_batch(
        &self,
        mut f: MutexGuard<'_, Flusher>,
        mut batch: Batch,
        dsync: Option<u64>,
        alone: bool,
        len: u64,
    ) -> Written {
        let mut slot = self.take_slot();
        let limits = RunLimits {
            max_pages: self.config.max_run_pages,
            max_bytes: self.max_run_bytes,
        };
        if let Err(e) = coalesce(&mut batch.entries, limits, &mut slot.runs) {
            // Cannot happen: drained pages have distinct page numbers.
            debug_assert!(false, "coalesce failed on drained pages: {e}");
            batch.failed.push(0..batch.entries.len());
            self.requeue(&mut batch);
            self.log_requeue(batch.drain_no);
            self.mark_written(batch.id);
            self.put_slot(slot);
            return Written {
                batch,
                error: Some(e),
                durable_seq: None,
            };
        }
        if let (Some(max), Some((_, spare))) = (self.torn.atomic_max(), slot.atomic.as_mut()) {
            split_for_atomic(&mut slot.runs, self.config.page_size, max, spare);
        }
        let mut first: Option<(u64, &'static str, std::io::Error)> = None;
        self.preallocate(&mut f, &mut slot, &mut batch, &mut first, alone);
        if let Some(run) = slot.runs.last() {
            f.os_len = f.os_len.max(run.offset + run.len as u64);
        }
        let mut error = None;
        let dsync_clean = dsync;
        let mut dsync = dsync.is_some() && slot.runs.len() == 1 && slot.writer.can_dsync();
        let mut grown = false;
        let staging = self.torn.area().is_some() && !slot.runs.is_empty();
        match self.extend_to(&mut f, len, staging) {
            // The new length needs the fdatasync a durable write skips.
            Ok(g) => {
                grown = g;
                dsync &= !g;
            }
            Err(e) => error = Some(e),
        }
        let serial = dsync || !len.is_multiple_of(self.config.page_size as u64);
        let mut held = if serial {
            self.wait_written(batch.id);
            // Only now is every older write complete: a durable write
            // stands in for the fdatasync only if all of them were synced
            // (found by the shuttle model check: a flush's write that
            // completed during the wait was counted as made durable).
            dsync &= dsync_clean.is_some_and(|s| self.durability.write_seq() == s);
            Some(f)
        } else {
            drop(f);
            if let Some(after) = batch.after {
                self.wait_written(after + 1);
            }
            None
        };
        let started = std::time::Instant::now();
        // Doublewrite: the pages go to the area, durably, before any goes
        // in place. After the waits above: a batch that rewrites a page an
        // older one still writes stages after it, so the area's records
        // hold each page's versions in order.
        let staged = match self.torn.area() {
            Some(area) if !slot.runs.is_empty() => self.checkpoint_if_due(area).and_then(|()| {
                // The length now, not at the drain: pages written after
                // that read and drained with the batch reach past it.
                let len = self.length.get();
                area.stage(&batch.entries, len, &self.counters)
                    .map(|()| true)
            }),
            _ => Ok(false),
        };
        if grown && staging {
            // The length `extend_to` set counts once its record is durable
            // (or, with none, as a change only an fdatasync covers).
            if matches!(staged, Ok(true)) {
                self.durability.step();
            } else {
                self.durability.step_unstaged();
            }
        }
        // A backend that panics fails the write, like one that errs: the
        // generation must still be marked written and the slot given back,
        // or every later flush would wait for them.
        let written = match &staged {
            Err(e) => Err(unstaged(&slot.runs, e)),
            Ok(_) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                slot.writer.write(
                    &*self.backend,
                    &slot.runs,
                    &batch.entries,
                    &self.counters,
                    dsync,
                    alone,
                    slot.atomic.as_mut().map(|(a, _)| a),
                )
            }))
            .unwrap_or_else(|_| Err(panicked(&slot.runs))),
        };
        add_elapsed(&self.counters.write_ns, started);
        let mut durable = dsync && written.is_ok() && first.is_none() && error.is_none();
        let some_written = match written {
            Ok(()) => !slot.runs.is_empty(),
            Err(w) => {
                batch.failed.extend(w.failed);
                if first.as_ref().is_none_or(|(at, ..)| w.offset < *at) {
                    first = Some((w.offset, w.op, w.error));
                }
                w.some_written
            }
        };
        self.put_slot(slot);
        let mut seq_after = None;
        if some_written {
            // Those runs reached the OS: a later sync must cover them.
            seq_after = Some(self.durability.step());
            add(&self.counters.flushes, 1);
            if let Some(end) = written_end(&batch) {
                self.length.grow_written(end);
            }
            if let Some(f) = held.as_mut() {
                match self.cut_tail(f, &mut batch) {
                    // The file's length changed after the durable write:
                    // only an fdatasync covers that.
                    Ok(true) => durable = false,
                    Ok(false) => {}
                    Err(e) => {
                        durable = false;
                        error.get_or_insert(e);
                    }
                }
            }
        }
        if let (Some(area), Ok(true)) = (self.torn.area(), &staged) {
            area.written(seq_after, &batch.entries, &batch.failed);
        }
        if let Some((_, op, source)) = first {
            batch.failed.sort_by_key(|r| r.start);
            error = Some(Error::PagesFailed {
                failed: byte_ranges(&batch.entries, &batch.failed),
                op,
                source,
            });
        }
        let failed = !batch.failed.is_empty();
        // Before the generation counts as written: a flush waiting for it
        // must find the pages that failed back in the write buffer, and
        // one that drained without them must learn it.
        self.requeue(&mut batch);
        if failed {
            self.log_requeue(batch.drain_no);
        }
        let durable_seq = durable.then(|| self.durability.write_seq());
        self.mark_written(batch.id);
        if failed {
            self.cut_pending.store(true, Ordering::Release);
            match held.as_mut() {
                Some(f) => self.cut_back_if_idle(f),
                None => {
                    if let Some(mut f) = self.flusher.try_lock() {
                        self.cut_back_if_idle(&mut f);
                    }
                }
            }
        }
        drop(held);
        Written {
            batch,
            error,
            durable_seq,
        }
    }

    /// A page straddling an unaligned logical length was written whole, so
    /// the file grew past the length: cut it back (the bytes past it are
    /// zeros in the page, but nothing past the end may be left on disk).
    /// Returns whether it cut. Under the flusher lock, with no other write
    /// in flight.
    fn cut_tail(&self, f: &mut Flusher, batch: &mut Batch) -> Result<bool> {
        let len = self.length.get();
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
        self.length.set_written(len);
        Ok(true)
    }

    /// After a failed write: a write that failed partway may have extended
    /// the file (a short write into a full disk ends mid-page where blocks
    /// are smaller than pages), and nothing past what completed is data.
    /// Once no write is in flight (the caller holds the flusher lock, so
    /// none starts), cuts the file back to `written_len`, so it stays a
    /// whole number of pages and an `O_DIRECT` open with the same options
    /// takes it again; while writes are in flight, leaves it to the next
    /// holder of the flusher lock (`cut_pending`). The failed pages are
    /// back in the write buffer and are written again whole. Best effort:
    /// the write's error is what the caller reports.
    fn cut_back_if_idle(&self, f: &mut Flusher) {
        let idle = self.generations.lock().iter().all(|g| g.written);
        if !idle {
            return;
        }
        self.cut_pending.store(false, Ordering::Release);
        let to = self.length.written();
        if let Ok(len) = self.backend.len()
            && len > to
        {
            let _ = self.backend.set_len(to);
        }
        f.os_len = to;
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
        slot: &mut WriteSlot,
        batch: &mut Batch,
        first: &mut Option<(u64, &'static str, std::io::Error)>,
        alone: bool,
    ) {
        if self.io_mode.direct.is_none() || slot.writer.writes_inline(slot.runs.len(), alone) {
            return;
        }
        let disk = self.length.disk();
        let Some(start) = slot
            .runs
            .iter()
            .position(|r| r.offset + r.len as u64 > disk)
        else {
            return;
        };
        slot.alloc_failed.clear();
        slot.alloc_failed.resize(slot.runs.len(), false);
        let mut i = start;
        while i < slot.runs.len() {
            // One group: runs i..j, each within PREALLOC_MAX_GAP of the last.
            let from = slot.runs[i].offset;
            let mut to = from + slot.runs[i].len as u64;
            let mut j = i + 1;
            while j < slot.runs.len() && slot.runs[j].offset - to <= PREALLOC_MAX_GAP {
                to = slot.runs[j].offset + slot.runs[j].len as u64;
                j += 1;
            }
            match self.backend.allocate(from, to - from) {
                Ok(()) => {
                    self.length.grow_disk(to);
                    self.length.grow_written(to);
                    f.os_len = f.os_len.max(to);
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::Unsupported
                        || e.raw_os_error() == Some(libc::EOPNOTSUPP) =>
                {
                    return;
                }
                Err(e) => {
                    slot.alloc_failed[i..j].fill(true);
                    for run in &slot.runs[i..j] {
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
        let failed = &slot.alloc_failed;
        slot.runs.retain(|_| {
            k += 1;
            !failed[k - 1]
        });
    }

    /// Moves every stripe's dirty pages to a new in-flight generation (one
    /// swap per stripe under its lock) and collects them. Caller holds the
    /// flusher lock.
    fn drain(&self, drain_no: u64) -> Option<Batch> {
        let BatchVecs {
            mut entries,
            mut drained,
        } = self.spare_batches.lock().pop().unwrap_or_default();
        // Called under the flusher lock: ids follow drain order.
        let id = self.next_generation.load(Ordering::Acquire);
        let after = self.buffer.drain(id, &mut drained);
        if drained.is_empty() {
            self.keep_batch_vecs(BatchVecs { entries, drained });
            return None;
        }
        self.next_generation.store(id + 1, Ordering::Release);
        self.generations.lock().push_back(Generation {
            id,
            written: false,
            done: None,
        });
        let n = drained.iter().map(|(_, m)| m.len()).sum();
        entries.reserve(n);
        for (_, map) in &drained {
            entries.extend(
                map.iter()
                    .map(|(&p, page)| (self.buffer.offset_of(p), Arc::clone(page))),
            );
        }
        Some(Batch {
            id,
            drain_no,
            after,
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
    /// `write_batch` calls it, and records it (`log_requeue`), before the
    /// generation counts as written: a flush that drained after this batch,
    /// without these pages, finds the record once it waited for this
    /// generation and drains again, so it never tells a caller who wrote
    /// them Ok (a round that trusted its first drain could: found by the
    /// shuttle model check,
    /// `an_ok_sync_covers_pages_an_earlier_round_failed_to_write`).
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
        let mut gone = Vec::new();
        for (i, (off, page)) in batch.entries.iter().enumerate() {
            // Each page goes back once: one already back (an earlier
            // requeue of this batch) is skipped.
            if !newly[i] || is_failed[i] {
                continue;
            }
            is_failed[i] = true;
            match self
                .buffer
                .requeue(self.buffer.page_no(*off), page, &batch.drained)
            {
                Requeued::Kept => batch.kept += page.len(),
                Requeued::Discarded => gone.push(*off),
                Requeued::Newer => {}
            }
        }
        batch.is_failed = is_failed;
        // Discarded: unspecified until written again, so the doublewrite
        // area need not keep a record for their failed write.
        for off in gone {
            self.torn.forget_failed(off, off + 1);
        }
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
            self.length.grow_disk(end);
        }
        if self.cache.is_enabled() {
            for (off, page) in written() {
                self.cache.update(
                    self.buffer.page_no(*off),
                    Arc::clone(page),
                    self.buffer.pool(),
                );
            }
        }
        let Batch {
            mut entries,
            mut drained,
            ..
        } = batch;
        let mut total = 0usize;
        for (i, map) in drained.drain(..) {
            total += self.buffer.retire(i, map);
        }
        debug_assert!(total >= kept, "kept {kept} of {total} bytes");
        self.buffer.uncount(total - kept);
        // Recycle the pages nobody else holds (a reader, the read cache, or
        // the write buffer after a failure).
        self.buffer
            .pool()
            .put_all(entries.drain(..).map(|(_, page)| page));
        self.keep_batch_vecs(BatchVecs { entries, drained });
        if total > 0 {
            // Wake writers waiting for room (see `wait_for_room`): room was
            // freed, or the pages went back to the write buffer, where a
            // waiter can flush them itself.
            self.buffer.notify_room();
        }
    }

    /// Keeps a retired batch's emptied vectors for the next drain (up to
    /// [`SPARE_BATCHES`]; one a bulk flush grew past `SPARE_MAP_MAX`
    /// pages is dropped).
    fn keep_batch_vecs(&self, vecs: BatchVecs) {
        debug_assert!(vecs.entries.is_empty() && vecs.drained.is_empty());
        if vecs.entries.capacity() > SPARE_MAP_MAX * self.buffer.stripe_count() {
            return;
        }
        let mut spare = self.spare_batches.lock();
        if spare.len() < SPARE_BATCHES {
            spare.push(vecs);
        }
    }
}

/// The in-flight generations (in drain order; derefs to them) and what a
/// flush needs to learn that an older generation's failed pages went back
/// to the write buffer after its drain (see `flush_pass`).
#[derive(Default)]
pub(crate) struct Generations {
    queue: std::collections::VecDeque<Generation>,
    /// Drains made so far (empty ones included): a flush's drain number
    /// orders it against the generations' drains and requeues.
    drains: u64,
    /// Drain numbers of the flushes that drained and have not yet checked
    /// `requeues` (`flush_pass`).
    checking: Vec<u64>,
    /// Per failed write whose pages went back to the write buffer: the
    /// generation's drain number and the drain count when they went back.
    /// A flush whose drain number lies in `(drained, requeued]` drained
    /// without them. Kept until no flush that could be in that range is
    /// still checking.
    requeues: Vec<(u64, u64)>,
}

impl std::ops::Deref for Generations {
    type Target = std::collections::VecDeque<Generation>;
    fn deref(&self) -> &Self::Target {
        &self.queue
    }
}

impl std::ops::DerefMut for Generations {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.queue
    }
}

/// An in-flight generation, in drain order; `written` once its writes
/// completed (successfully or not), `done` once its batch settled.
pub(crate) struct Generation {
    id: u64,
    written: bool,
    /// The batch, which of its entries failed, and the bytes kept dirty.
    done: Option<(Batch, Vec<bool>, usize)>,
}

impl PagedCachedFile {
    /// With the doublewrite area past its checkpoint size: `fdatasync` the
    /// file on a free sync lane, so every page written in place so far is
    /// durable and the area can start over at the next record.
    ///
    /// Errors: the `fdatasync`'s; the file is poisoned.
    fn checkpoint_if_due(&self, area: &super::doublewrite::Area) -> std::io::Result<()> {
        if !area.wants_checkpoint(super::doublewrite::CHECKPOINT_BYTES) {
            return Ok(());
        }
        self.sync_file_on_free_lane().map_err(|e| match e {
            Error::Io { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        })
    }
}

/// The failure of a batch whose doublewrite record could not be staged:
/// no run was written.
fn unstaged(runs: &[Run], e: &std::io::Error) -> super::writer::WriteFailure {
    super::writer::WriteFailure {
        failed: runs.iter().map(Run::entries).collect(),
        some_written: false,
        offset: runs.first().map_or(0, |r| r.offset),
        op: "doublewrite area",
        error: match e.raw_os_error() {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::new(e.kind(), e.to_string()),
        },
    }
}

/// Every run failed: the backend panicked while writing them (some may
/// have reached the OS, so `some_written`: the next sync must not be
/// skipped).
fn panicked(runs: &[Run]) -> super::writer::WriteFailure {
    super::writer::WriteFailure {
        failed: runs.iter().map(Run::entries).collect(),
        some_written: true,
        offset: runs.first().map_or(0, |r| r.offset),
        op: "write",
        error: std::io::Error::other("the backend panicked while writing"),
    }
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
