//! The flush pipeline: drain, coalesce, write, settle, and the changes of
//! the file's size ordered with them.
//!
//! Owns: `flusher` (the drain lock, over [`Flusher`]: the file's size as
//! the OS will hold it), the write slots, the in-flight generations, the
//! spare batch vectors, `cut_pending` and the run cap. Calls: the
//! components in [`Parts`] (the write buffer drains and takes back pages,
//! the read cache and lengths follow retired writes, the watermark counts
//! writes, the doublewrite area stages records), and the run writers.
//!
//! A flush produces a [`Batch`]: the pages it drained, now one in-flight
//! generation in every stripe it touched. A plain flush settles its batch
//! as soon as the writes complete; a commit round holds it until its
//! `fdatasync` returned (see `commit.rs`), so that a failed `fdatasync` can
//! put the pages back in the write buffer before the file is poisoned.
//!
//! The drain happens under `flusher`, the writes after it is released,
//! from a write slot of their own, so several flushes write at once. Three
//! rules keep that safe:
//!
//! 1. **Newest wins (write latch).** A generation that drained a page some
//!    older generation still in flight also holds waits, before it writes,
//!    until every generation up to that one has written. Two versions of a
//!    page are never in flight at once, and the younger reaches the OS
//!    last.
//! 2. **A sync covers what was drained before it.** A commit round (and a
//!    flush) returns only after every generation drained before or with
//!    its own has written (`Generations::wait_written`), so its
//!    `fdatasync` starts after those writes completed. `write_seq` is
//!    bumped after each write completes; an `fdatasync` covers the value
//!    read before it began.
//! 3. **Failed pages are not skipped.** A failed write puts its pages back
//!    in the write buffer, and records that it did, before its generation
//!    counts as written; a flush that drained after that generation and
//!    before the pages went back finds the record once it waited, and
//!    drains and writes again, so it never reports a page durable that an
//!    older generation failed to write.
//!
//! With a doublewrite area two more hold (see `doublewrite.rs`):
//!
//! 4. **Staged before written.** A batch's record is durable in the area
//!    before any of its pages is written in place, and batches stage after
//!    their write-latch wait, so the area holds each page's versions in
//!    write order. The area starts over only when no staged batch is still
//!    writing, an `fdatasync` of the file covered the last in-place write,
//!    and no page whose in-place write failed (perhaps torn) is waiting to
//!    be written again (a `set_len` cut, which empties the area, flushes
//!    such pages first).
//! 5. **Durable on the area.** A commit round skips the file's
//!    `fdatasync` only if no change since the last one is outside a
//!    durable record (`Durability::step_unstaged`).
//!
//! The file's size changes (`ftruncate`, `fallocate`) happen under
//! `flusher`, before the writes they precede; one that must see no write
//! in flight (cutting back after a failed write, or an unaligned tail)
//! waits for every older generation under `flusher`, and the writes never
//! take `flusher` after they left it except with `try_lock`.
//!
//! Lock order: `flusher` -> `slots` -> generations -> stripe -> cache
//! stripe; a sync lane may be waited for under `flusher` (a checkpoint).

use std::sync::atomic::Ordering;

use super::batch::{Batch, Pass, Settled, SpareBatches, Written, panicked, unstaged};
use super::doublewrite::{Area, CHECKPOINT_BYTES};
use super::flusher::Flusher;
use super::gather::GatherBuf;
use super::generations::Generations;
use super::grow::{Filler, Window};
use super::parts::Parts;
use super::slots::{WriteSlot, WriteSlots};
use super::stats::{add, add_elapsed};
use super::writer::RunWriter;
use crate::coalesce::{RunLimits, coalesce, split_for_atomic};
use crate::error::{Error, Result};
use crate::sync::{AtomicBool, Mutex, MutexGuard};

/// Most direct commits writing at once (each from an inline write slot of
/// its own); more wait for a slot.
pub const MAX_DIRECT_WRITERS: usize = 64;

/// The flush pipeline of one file (see the module docs).
pub(crate) struct FlushPipeline {
    /// The drain lock: drains are serialized by it and number the
    /// generations in drain order; the file's size changes under it.
    flusher: Mutex<Flusher>,
    /// Free write slots ([`Config::rounds_in_flight`](crate::Config::rounds_in_flight)).
    slots: WriteSlots,
    /// Inline write slots of direct commits (`pwritev` from the committing
    /// thread), made on demand up to [`MAX_DIRECT_WRITERS`].
    inline: WriteSlots,
    /// How an inline slot copies: under `O_DIRECT` the page alignment
    /// (scattered runs are gathered), and with atomic pieces the page
    /// alignment for their copy buffer.
    inline_copy_align: Option<usize>,
    inline_atomic_align: Option<usize>,
    /// In-flight generations, in drain order.
    gens: Generations<Settled>,
    /// Emptied vectors of retired batches, reused by the next drain.
    spare: SpareBatches,
    /// A failed write left the file to be cut back to the written length;
    /// done by the next holder of `flusher` that finds no write in flight.
    cut_pending: AtomicBool,
    /// Most bytes of one run: `max_write_bytes`, but never more than the
    /// write buffer holds.
    max_run_bytes: usize,
    /// Grow-ahead's filler thread, with a window configured (not on a
    /// read-only file).
    filler: Option<Filler>,
}

impl FlushPipeline {
    /// A pipeline over a file of `os_len` bytes writing from `slots`, runs
    /// of at most `max_run_bytes`; inline slots copy runs aligned to
    /// `inline_copy_align` (under `O_DIRECT`) and atomic pieces aligned to
    /// `inline_atomic_align`.
    pub(crate) fn new(
        os_len: u64,
        slots: Vec<WriteSlot>,
        max_run_bytes: usize,
        inline_copy_align: Option<usize>,
        inline_atomic_align: Option<usize>,
        grow: Option<(Window, Filler)>,
    ) -> Self {
        let (window, filler) = grow.unzip();
        Self {
            filler,
            flusher: Mutex::new(Flusher::new(os_len, window)),
            slots: WriteSlots::new(slots),
            inline: WriteSlots::new(Vec::new()),
            inline_copy_align,
            inline_atomic_align,
            gens: Generations::new(),
            spare: SpareBatches::new(),
            cut_pending: AtomicBool::new(false),
            max_run_bytes,
        }
    }

    /// Flush without `fdatasync`. Returns whether anything was written.
    /// Returns once every page buffered when it was called reached the OS,
    /// whichever flush drained it.
    ///
    /// Errors: pages that failed to write (`PagesFailed`; they stay dirty),
    /// or the file could not be extended to its length.
    pub(crate) fn flush_to_os(&self, p: &Parts<'_>) -> Result<bool> {
        let pass = self.flush_pass(p, false, 0, false, false);
        if let Some(batch) = pass.batch {
            self.settle(p, batch);
        }
        pass.error.map_or(Ok(pass.wrote), Err)
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
    /// the engine (`RunWriter::writes_inline`). `inline`: a direct commit,
    /// whose batch is written from this thread with `pwritev` from an
    /// inline slot of its own, beside other direct commits' writes.
    pub(crate) fn flush_pass(
        &self,
        p: &Parts<'_>,
        dsync: bool,
        synced_before: u64,
        alone: bool,
        inline: bool,
    ) -> Pass {
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
                self.cut_back_if_idle(p, &mut f);
            }
            // Read before the drain: covers every write of the callers.
            let len = p.length.get();
            let drain_no = self.gens.begin_drain();
            let drained = Batch::drain(p, &self.gens, &self.spare, drain_no);
            // Every generation below this one was drained by now.
            let mark = self.gens.next_id();
            match drained {
                None => {
                    let extended = match self.make_room(p, &mut f, len, len, true) {
                        Ok(()) => f.extend_to(p, len, false),
                        Err(e) => Err(e),
                    };
                    match extended {
                        Ok(grown) => pass.wrote |= grown,
                        Err(e) => {
                            pass.error.get_or_insert(e);
                        }
                    }
                    drop(f);
                }
                Some(batch) => {
                    let dsync = (dsync && first_pass).then_some(synced_before);
                    let w = self.write_batch(p, f, batch, dsync, alone, len, inline);
                    pass.wrote = true;
                    pass.durable_seq = w.durable_seq;
                    if let Some(e) = w.error {
                        pass.error.get_or_insert(e);
                    }
                    pass.batch = Some(w.batch);
                }
            }
            let missed = self.gens.wait_written_then_check(mark, drain_no);
            (pass.seq, pass.unstaged_at) = p.durability.snapshot();
            if !missed {
                return pass;
            }
            // Pages an older generation failed to write are back in the
            // write buffer, after this drain: write them too.
            first_pass = false;
            pass.durable_seq = None;
            if let Some(batch) = pass.batch.take() {
                self.settle(p, batch);
            }
        }
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
    #[allow(clippy::too_many_arguments)]
    fn write_batch(
        &self,
        p: &Parts<'_>,
        mut f: MutexGuard<'_, Flusher>,
        mut batch: Batch,
        dsync: Option<u64>,
        alone: bool,
        len: u64,
        inline: bool,
    ) -> Written {
        let slots = if inline { &self.inline } else { &self.slots };
        let mut slot = if inline {
            self.inline
                .take_or_make(MAX_DIRECT_WRITERS, || self.inline_slot())
        } else {
            self.slots.take()
        };
        let limits = RunLimits {
            max_pages: p.config.max_run_pages,
            max_bytes: self.max_run_bytes,
        };
        if let Err(e) = coalesce(&mut batch.entries, limits, &mut slot.runs) {
            // Cannot happen: drained pages have distinct page numbers.
            debug_assert!(false, "coalesce failed on drained pages: {e}");
            batch.failed.push(0..batch.entries.len());
            batch.requeue(p);
            self.gens.log_requeue(batch.drain_no);
            self.gens.mark_written(batch.id);
            slots.put(slot);
            return Written {
                batch,
                error: Some(e),
                durable_seq: None,
            };
        }
        if let (Some(max), Some((_, spare))) = (p.torn.atomic_max(), slot.atomic.as_mut()) {
            split_for_atomic(&mut slot.runs, p.config.page_size, max, spare);
        }
        let mut first: Option<(u64, &'static str, std::io::Error)> = None;
        let end = slot.runs.last().map_or(0, |r| r.offset + r.len as u64);
        let mut error: Option<Error> = None;
        let mut room_failed = false;
        // Grow-ahead's filler writes no zero below these pages from here
        // on: before an extension starts it on the new window.
        if let Some(filler) = &self.filler
            && end > 0
        {
            filler.drained(end);
        }
        if let Err(e) = self.make_room(p, &mut f, end, len, true) {
            // No room past the window: none of the runs may go out (they
            // would reach the trailer); they stay dirty for the next flush,
            // and the error is the flush's (a failed fdatasync poisoned
            // the file).
            for run in &slot.runs {
                batch.failed.push(run.entries());
            }
            slot.runs.clear();
            error = Some(e);
            room_failed = true;
        }
        f.preallocate(p, &mut slot, &mut batch, &mut first, alone);
        if let Some(run) = slot.runs.last() {
            f.expect_end(run.offset + run.len as u64);
        }
        let dsync_clean = dsync;
        let mut dsync = dsync.is_some() && slot.runs.len() == 1 && slot.writer.can_dsync();
        let mut grown = false;
        let staging = p.torn.area().is_some() && !slot.runs.is_empty();
        match if room_failed {
            Ok(false)
        } else {
            f.extend_to(p, len, staging)
        } {
            // The new length needs the fdatasync a durable write skips.
            Ok(g) => {
                grown = g;
                dsync &= !g;
            }
            Err(e) => error = Some(e),
        }
        let serial = dsync || !len.is_multiple_of(p.config.page_size as u64);
        let mut held = if serial {
            self.gens.wait_written(batch.id);
            // Only now is every older write complete: a durable write
            // stands in for the fdatasync only if all of them were synced
            // (found by the shuttle model check: a flush's write that
            // completed during the wait was counted as made durable).
            dsync &= dsync_clean.is_some_and(|s| p.durability.write_seq() == s);
            Some(f)
        } else {
            drop(f);
            if let Some(after) = batch.after {
                self.gens.wait_written(after + 1);
            }
            None
        };
        let started = std::time::Instant::now();
        // Doublewrite: the pages go to the area, durably, before any goes
        // in place. After the waits above: a batch that rewrites a page an
        // older one still writes stages after it, so the area's records
        // hold each page's versions in order.
        let staged = match p.torn.area() {
            Some(area) if !slot.runs.is_empty() => self.checkpoint_if_due(p, area).and_then(|()| {
                // The length now, not at the drain: pages written after
                // that read and drained with the batch reach past it.
                let len = p.length.get();
                area.stage(&batch.entries, len, p.counters).map(|()| true)
            }),
            _ => Ok(false),
        };
        if grown && staging {
            // The length `extend_to` set counts once its record is durable
            // (or, with none, as a change only an fdatasync covers).
            if matches!(staged, Ok(true)) {
                p.durability.step();
            } else {
                p.durability.step_unstaged();
            }
        }
        // A backend that panics fails the write, like one that errs: the
        // generation must still be marked written and the slot given back,
        // or every later flush would wait for them.
        let written = match &staged {
            Err(e) => Err(unstaged(&slot.runs, e)),
            Ok(_) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                slot.writer.write(
                    p.backend,
                    &slot.runs,
                    &batch.entries,
                    p.counters,
                    dsync,
                    alone,
                    slot.atomic.as_mut().map(|(a, _)| a),
                )
            }))
            .unwrap_or_else(|_| Err(panicked(&slot.runs))),
        };
        add_elapsed(&p.counters.write_ns, started);
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
        slots.put(slot);
        let mut seq_after = None;
        if some_written {
            // Those runs reached the OS: a later sync must cover them.
            seq_after = Some(p.durability.step());
            add(&p.counters.flushes, 1);
            if let Some(end) = batch.written_end() {
                p.length.grow_written(end);
            }
            if let Some(f) = held.as_mut() {
                match f.cut_tail(p, &mut batch) {
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
        if let (Some(area), Ok(true)) = (p.torn.area(), &staged) {
            area.written(seq_after, &batch.entries, &batch.failed);
        }
        if let Some((_, op, source)) = first {
            if let Some(filler) = &self.filler
                && super::grow::is_full(&source)
            {
                filler.full(p.backend);
            }
            batch.failed.sort_by_key(|r| r.start);
            error = Some(Error::PagesFailed {
                failed: batch.failed_ranges(),
                op,
                source,
            });
        }
        let failed = !batch.failed.is_empty();
        // Before the generation counts as written: a flush waiting for it
        // must find the pages that failed back in the write buffer, and
        // one that drained without them must learn it.
        batch.requeue(p);
        if failed {
            self.gens.log_requeue(batch.drain_no);
        }
        let durable_seq = durable.then(|| p.durability.write_seq());
        self.gens.mark_written(batch.id);
        if failed {
            self.cut_pending.store(true, Ordering::Release);
            match held.as_mut() {
                Some(f) => self.cut_back_if_idle(p, f),
                None => {
                    if let Some(mut f) = self.flusher.try_lock() {
                        self.cut_back_if_idle(p, &mut f);
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

    /// Grow-ahead, under `flusher`, before a flush's writes (a no-op
    /// without a window): if data up to `need` bytes or the length `len`
    /// would reach the trailer's page, extends the window ([`Window::extend`]:
    /// the trailer moves to the new end, an `fdatasync` makes it durable,
    /// then the old slots are zeroed); then, with `record`, writes `len`
    /// into the next trailer slot if the newest record holds another
    /// length, a write the next `fdatasync` must cover (`write_seq`
    /// steps).
    ///
    /// Errors: `Error::Io` with op "grow-ahead trailer" (the extension or
    /// the record could not be written: an extending write is cut back)
    /// or "fdatasync" (the file is poisoned).
    fn make_room(
        &self,
        p: &Parts<'_>,
        f: &mut Flusher,
        need: u64,
        len: u64,
        record: bool,
    ) -> Result<()> {
        let os_len = f.os_len();
        let Some(w) = f.window() else {
            return Ok(());
        };
        let trailer = |e| Error::io("grow-ahead trailer", None, e);
        let grows = if w.active() {
            !w.covers(need.max(len))
        } else {
            // A plain file gets a window once it grows.
            need.max(len) > os_len
        };
        if grows {
            let old_end = w.end();
            let extended = match w.extend(p.backend, need, len) {
                Ok(x) => x,
                Err(e) => {
                    // The write may have moved the size, and left part of
                    // a trailer past the old end: cut back to it (the old
                    // trailer's, or the plain file's end) and make that
                    // durable, or a later trailer further out could bring
                    // this one back inside the data after a crash.
                    let _ = p
                        .backend
                        .set_len(if old_end > 0 { old_end } else { os_len });
                    p.durability.step_unstaged();
                    self.sync_file(p)?;
                    return Err(trailer(e));
                }
            };
            let (end, usable) = (w.end(), w.usable());
            add(&p.counters.grow_extensions, 1);
            p.durability.step_unstaged();
            f.window_moved(end);
            // The new end and trailer durable before anything is written
            // below them: zeros or data written into the window before its
            // end is durable could bring a crash back with the file's size
            // at their end and no trailer there (a file system writes back
            // blocks in any order), and the old trailer must stay valid
            // until the new one is.
            self.sync_file(p)?;
            if let Some(at) = extended.old_slots
                && let Some(w) = f.window()
            {
                w.zero_old(p.backend, Some(at)).map_err(trailer)?;
                p.durability.step_unstaged();
            }
            if let Some(filler) = &self.filler {
                filler.set_limit(usable);
            }
            return Ok(());
        }
        if w.has_stale() {
            w.zero_old(p.backend, None).map_err(trailer)?;
            p.durability.step_unstaged();
        }
        if record && w.record(p.backend, len).map_err(trailer)? {
            add(&p.counters.grow_records, 1);
            p.durability.step_unstaged();
        }
        Ok(())
    }

    /// Cuts a grow-ahead window off and makes that durable (`close`): the
    /// file at rest is its length. A no-op without one.
    ///
    /// Errors: "ftruncate", "fdatasync" (`Error::Io`).
    pub(crate) fn drop_window(&self, p: &Parts<'_>) -> Result<()> {
        let mut f = self.flusher.lock();
        if !f.in_window() {
            return Ok(());
        }
        if let Some(filler) = &self.filler {
            filler.reset(p.length.get());
        }
        f.drop_window(p)?;
        drop(f);
        self.sync_file(p)
    }

    /// Zero bytes grow-ahead's filler wrote, its failed calls and why it
    /// stopped, if it did.
    pub(crate) fn grow_stats(&self) -> (u64, u64, Option<String>) {
        self.filler
            .as_ref()
            .map_or((0, 0, None), |f| (f.bytes(), f.errors(), f.failed()))
    }

    /// A write slot of a direct commit: `pwritev` from the committing
    /// thread (no writer threads, no ring), copying scattered runs under
    /// `O_DIRECT` as the pwritev engine does.
    fn inline_slot(&self) -> WriteSlot {
        let writer = RunWriter::Vectored {
            iovecs: Vec::new(),
            pool: None,
            copy: self.inline_copy_align.map(GatherBuf::new),
        };
        WriteSlot::new(writer, self.inline_atomic_align)
    }

    /// After a failed write (`cut_pending`): once no write is in flight
    /// (the caller holds `flusher`, so none starts), cuts the file back to
    /// its written length ([`Flusher::cut_back`]); while writes are in
    /// flight, leaves it to the next holder of `flusher`.
    fn cut_back_if_idle(&self, p: &Parts<'_>, f: &mut Flusher) {
        if !self.gens.all_written() {
            return;
        }
        self.cut_pending.store(false, Ordering::Release);
        f.cut_back(p);
    }

    /// Ends a batch: the entries in `batch.failed` (ranges of the sorted
    /// batch) did not reach the OS (for a commit: or were not synced) and
    /// go back to the write buffer (`Batch::requeue`); the rest did.
    ///
    /// The generation then retires, but only after every older generation
    /// did: a younger generation shadows an older one for readers, so
    /// removing it first would let a reader find the older version of a
    /// page.
    pub(crate) fn settle(&self, p: &Parts<'_>, batch: Batch) {
        let id = batch.id;
        let settled = batch.into_settled(p);
        self.gens
            .settle(id, settled, |s| Batch::retire(s, p, &self.spare));
    }

    /// Settles a batch all of whose pages failed.
    pub(crate) fn settle_failed(&self, p: &Parts<'_>, mut batch: Batch) {
        batch.fail_all();
        self.settle(p, batch);
    }

    /// `fdatasync` of the file on a free sync lane, outside a commit round
    /// (a doublewrite checkpoint, a cut, a close); tells the doublewrite
    /// area its records up to here are durable in place.
    ///
    /// Errors: the `fdatasync`'s (`Error::Io`, op "fdatasync"); the file
    /// is poisoned, and writers waiting for room are woken to see it.
    pub(crate) fn sync_file(&self, p: &Parts<'_>) -> Result<()> {
        match p.durability.sync_file(p.backend, p.counters, p.life) {
            Ok(covers) => {
                p.torn.data_synced(covers);
                Ok(())
            }
            Err(e) => {
                p.buffer.notify_room();
                Err(e)
            }
        }
    }

    /// With the doublewrite area past its checkpoint size: `fdatasync` the
    /// file on a free sync lane, so every page written in place so far is
    /// durable and the area can start over at the next record.
    ///
    /// Errors: the `fdatasync`'s; the file is poisoned.
    fn checkpoint_if_due(&self, p: &Parts<'_>, area: &Area) -> std::io::Result<()> {
        if !area.wants_checkpoint(CHECKPOINT_BYTES) {
            return Ok(());
        }
        self.sync_file(p).map_err(|e| match e {
            Error::Io { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        })
    }

    /// `set_len` to `len` bytes (validated by the caller), ordered with
    /// everything buffered: growing extends the file with zeros now;
    /// shrinking first waits for the in-flight writes (a round waiting for
    /// its `fdatasync` included), cuts the file, then drops every buffered
    /// and cached page past `len` and zeroes the buffered tail of the page
    /// `len` falls in, so nothing past the new end is written afterwards.
    /// With a doublewrite area a shrink first writes whole any page whose
    /// earlier write failed, then makes the pages written in place durable
    /// and empties the area.
    ///
    /// Errors: as `PagedCachedFile::set_len`.
    pub(crate) fn set_len(&self, p: &Parts<'_>, len: u64) -> Result<()> {
        let mut flusher = self.flusher.lock();
        if len >= p.length.get() {
            self.make_room(p, &mut flusher, len, len, true)?;
            return flusher.grow(p, len);
        }
        // A guard at or past the cut (even past the old end) would write
        // there when dropped.
        p.buffer.check_unguarded(len, u64::MAX - len)?;
        // Memory for the zeroed tail first: past the ftruncate nothing
        // may fail.
        let tail_buf = if len.is_multiple_of(p.config.page_size as u64) {
            None
        } else {
            Some(p.buffer.page_buf()?)
        };
        self.gens.wait_all_settled();
        if let Some(area) = p.torn.area()
            && area.has_failed()
        {
            // The cut empties the area, so a page a failed write may have
            // torn must first be written whole: a flush retries it (its
            // error is this call's, and nothing changed), then the cut
            // starts again (no write is in flight and none can start while
            // `flusher` is held, so the check above is final).
            drop(flusher);
            self.flush_to_os(p)?;
            return self.set_len(p, len);
        }
        if let Some(area) = p.torn.area() {
            // A record may hold pages past the cut, which recovery would
            // write back after a later sync made the cut durable: make
            // every page written in place durable, then empty the area.
            self.sync_file(p)?;
            area.clear()
                .map_err(|e| Error::io("doublewrite area: empty", None, e))?;
        }
        // A length buffered past the window (no flush since) may put the cut
        // inside the trailer: move the trailer past it first, so the cut
        // takes all of it. No record of the shorter length: the cut
        // removes the trailer, and a record that failed partway must not
        // make a refused cut come back after a crash.
        self.make_room(p, &mut flusher, 0, len, false)?;
        if let Some(filler) = &self.filler {
            // No zero may be in flight past the cut (it would grow the
            // file again).
            filler.reset(len);
        }
        flusher.shrink(p, len)?;
        // Pages wholly past `len` go; the one it falls in keeps its head.
        // The read cache loses the cut pages before any stripe opens again:
        // a write that merges into a page past the cut must not find its
        // old bytes there and bring them back (stripe locks before cache
        // locks, as in `WriteBuffer::merge`). Aligned or not, the first
        // page touched is the one `len` falls in.
        let first_gone = p.buffer.page_no(len);
        p.buffer.cut(len, tail_buf, || {
            p.cache.remove_where(|n| n >= first_gone, p.buffer.pool());
            p.length.cut_to(len);
        });
        p.durability.step_unstaged();
        if self.filler.is_some() {
            // With grow-ahead the next extension may put a trailer below
            // the old end: the cut must be durable first (`flusher` still
            // held), or a crash could bring the old end back with trailer
            // bytes inside the data.
            self.sync_file(p)?;
        }
        Ok(())
    }

    /// Takes the file's length from the OS and drops the read cache (a
    /// refresh), with nothing buffered or in flight.
    ///
    /// Errors: [`Error::Buffered`] (nothing changed); `Error::Io` with op
    /// "fstat".
    pub(crate) fn refresh(&self, p: &Parts<'_>) -> Result<()> {
        let mut flusher = self.flusher.lock();
        if flusher.in_window() {
            return Err(Error::InvalidConfig(
                "refresh: a grow-ahead window is in place (the file's size is not its length); \
                 open without one to follow another writer"
                    .into(),
            ));
        }
        if !self.gens.is_empty() {
            return Err(Error::Buffered {
                bytes: p.buffer.buffered(),
            });
        }
        p.buffer.with_nothing_buffered(|| {
            let len = p.backend.len().map_err(|e| Error::io("fstat", None, e))?;
            p.length.begin_cut();
            p.cache.remove_where(|_| true, p.buffer.pool());
            flusher.reset(len);
            p.length.reset(len);
            p.length.end_cut();
            Ok(())
        })
    }
}
