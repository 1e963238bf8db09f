//! One batch's way to the OS, in six steps
//! ([`FlushPipeline::write_batch`]):
//!
//! 1. **plan**: take a write slot, coalesce the sorted pages into runs
//!    (cut into atomic pieces where writes must be untearable);
//! 2. **size**: under the drain lock, make the file's size ready for the
//!    runs: grow-ahead room, preallocation under `O_DIRECT`, the logical
//!    length;
//! 3. **turn**: wait until the batch may write. Usually the drain lock is
//!    released and the batch waits for the older generations that hold its
//!    pages (the write latch). A batch written durably, or over an
//!    unaligned length whose tail is cut after it, keeps the drain lock
//!    and waits for every older generation: it writes alone;
//! 4. **stage**: with a doublewrite area, the pages go to the area,
//!    durably, before any goes in place;
//! 5. **write**: the run writer writes the runs (a backend that panics
//!    fails them, like one that errs);
//! 6. **account**: count what reached the OS (`write_seq`), follow the
//!    lengths, cut an unaligned tail, put failed pages back in the write
//!    buffer and record it, then mark the generation written.
//!
//! The steps hand a [`BatchWrite`] on to each other (the batch and what
//! has happened to it so far) and borrow its write slot, which step 5
//! gives back once the writes completed.
//!
//! Owns: nothing (a batch on its way belongs to the flush that drained
//! it). Calls: as `flush.rs`.

use std::io;

use super::batch::{Batch, Written, panicked, unstaged};
use super::file_size::{FileSize, LengthRecord, Staging};
use super::flush::{FlushPipeline, MAX_DIRECT_WRITERS};
use super::flush_mode::{FlushMode, SlotKind};
use super::generations::DrainHeld;
use super::parts::Parts;
use super::slots::WriteSlot;
use super::stats::{add, add_elapsed};
use super::writer::WriteFailure;
use crate::coalesce::{RunLimits, coalesce, split_for_atomic};
use crate::error::Error;
use crate::sync::MutexGuard;

/// Whether a batch goes out as one durable (`RWF_DSYNC`) write that stands
/// in for an `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DurableWrite {
    /// Written as usual; an `fdatasync` makes it durable.
    No,
    /// One run, written durably, which counts as an `fdatasync` only if
    /// `write_seq` still equals `synced_at` once every older write has
    /// completed (nothing written since the last `fdatasync` but this).
    Planned { synced_at: u64 },
}

/// The first run that failed (lowest offset), before or in the write.
struct RunFailure {
    offset: u64,
    op: &'static str,
    error: io::Error,
}

/// One batch on its way to the OS: what the steps of
/// [`FlushPipeline::write_batch`] hand on to each other.
pub(super) struct BatchWrite {
    batch: Batch,
    /// Where the batch's write slot goes back to.
    kind: SlotKind,
    /// The first run that failed, by offset (its pages are in
    /// `batch.failed`).
    failed_run: Option<RunFailure>,
    /// A failure of the batch as a whole: no room past the grow-ahead
    /// window (no run went out), or the file could not be extended to its
    /// length.
    error: Option<Error>,
    durable: DurableWrite,
    /// The size step extended the file to the logical length.
    grown: bool,
    /// A doublewrite record of the batch was made durable.
    staged: bool,
    /// Some run reached the OS (a panicking backend may have written some).
    some_written: bool,
}

impl BatchWrite {
    /// Keeps the first failure by offset.
    fn fail_run(&mut self, offset: u64, op: &'static str, error: io::Error) {
        if self.failed_run.as_ref().is_none_or(|f| offset < f.offset) {
            self.failed_run = Some(RunFailure { offset, op, error });
        }
    }

    /// Takes every run of `slot` out of the write: their pages stay dirty.
    fn drop_runs(&mut self, slot: &mut WriteSlot) {
        for run in &slot.runs {
            self.batch.failed.push(run.entries());
        }
        slot.runs.clear();
    }

    /// Notes a write that failed for some runs of `slot`: their pages,
    /// the first failure by offset, and whether any run still reached the
    /// OS.
    fn record_failure(&mut self, failure: WriteFailure) {
        self.some_written |= failure.some_written;
        self.fail_run(failure.offset, failure.op, failure.error);
        self.batch.failed.extend(failure.failed);
    }
}

impl FlushPipeline {
    /// Writes `batch`, drained under the drain lock `size`, in the steps of
    /// the module docs. `len` is the logical length read before the drain.
    /// Returns the batch (to settle), the error of what failed, and the
    /// `write_seq` the batch made durable if it was written durably.
    pub(super) fn write_batch(
        &self,
        p: &Parts<'_>,
        mut size: MutexGuard<'_, FileSize>,
        batch: Batch,
        mode: FlushMode,
        len: u64,
    ) -> Written {
        let (mut w, mut slot) = match self.plan(p, batch, mode.slot, size.held()) {
            Ok(planned) => planned,
            Err(failed) => return *failed,
        };
        self.size_for(p, &mut size, &mut w, &mut slot, len, mode);
        let held = self.take_turn(p, size, &mut w, len);
        let started = std::time::Instant::now();
        self.stage(p, &mut w, &mut slot);
        self.write_runs(p, &mut w, slot, mode);
        add_elapsed(&p.counters.write_ns, started);
        self.account(p, w, held)
    }

    /// Step 1: a write slot of `kind` holding the batch's runs. A batch
    /// that cannot be coalesced (not reached: drained pages have distinct
    /// page numbers) fails whole, its generation marked written.
    fn plan(
        &self,
        p: &Parts<'_>,
        mut batch: Batch,
        kind: SlotKind,
        drain: &DrainHeld,
    ) -> Result<(BatchWrite, WriteSlot), Box<Written>> {
        let mut slot = match kind {
            SlotKind::Inline => self
                .inline
                .take_or_make(MAX_DIRECT_WRITERS, || self.inline_slot()),
            SlotKind::Shared => self.slots.take(drain),
        };
        let limits = RunLimits {
            max_pages: p.config.max_run_pages,
            max_bytes: self.max_run_bytes,
        };
        if let Err(e) = coalesce(&mut batch.entries, limits, &mut slot.runs) {
            debug_assert!(false, "coalesce failed on drained pages: {e}");
            batch.failed.push(0..batch.entries.len());
            batch.requeue(p);
            self.gens.log_requeue(batch.drain_no);
            self.gens.mark_written(batch.id, None);
            self.slots_of(kind).put(slot);
            return Err(Box::new(Written {
                batch,
                error: Some(e),
                durable_seq: None,
                step: None,
            }));
        }
        if let (Some(max), Some((_, spare))) = (p.torn.atomic_max(), slot.atomic.as_mut()) {
            split_for_atomic(&mut slot.runs, p.config.page_size, max, spare);
        }
        let w = BatchWrite {
            batch,
            kind,
            failed_run: None,
            error: None,
            durable: DurableWrite::No,
            grown: false,
            staged: false,
            some_written: false,
        };
        Ok((w, slot))
    }

    /// Step 2, under the drain lock: grow-ahead room up to the runs' end
    /// (its filler writes no zero below them from here on), blocks for the
    /// runs past the end under `O_DIRECT`, and the file extended to the
    /// logical length `len`. Decides whether the batch is written durably
    /// (one run, an engine that can, and no change of length, which only
    /// an `fdatasync` covers).
    fn size_for(
        &self,
        p: &Parts<'_>,
        size: &mut FileSize,
        w: &mut BatchWrite,
        slot: &mut WriteSlot,
        len: u64,
        mode: FlushMode,
    ) {
        let end = slot.runs.last().map_or(0, |r| r.offset + r.len as u64);
        if let Some(filler) = &self.filler
            && end > 0
        {
            filler.drained(end);
        }
        if let Err(e) = self.make_room(p, size, end, len, LengthRecord::Write) {
            // No room past the window: no run may go out (they would reach
            // the trailer); they stay dirty for the next flush, and the
            // error is the flush's (a failed fdatasync poisoned the file).
            w.drop_runs(slot);
            w.error = Some(e);
            return;
        }
        let mut first = None;
        size.preallocate(p, slot, &mut w.batch, &mut first, mode.company);
        if let Some((offset, op, error)) = first {
            w.fail_run(offset, op, error);
        }
        if let Some(run) = slot.runs.last() {
            size.expect_end(run.offset + run.len as u64);
        }
        if let Some(synced_at) = mode.durable_write_at
            && slot.runs.len() == 1
            && slot.writer.can_dsync()
        {
            w.durable = DurableWrite::Planned { synced_at };
        }
        let staging = if p.torn.area().is_some() && !slot.runs.is_empty() {
            Staging::Yes
        } else {
            Staging::No
        };
        match size.extend_to(p, len, staging) {
            Ok(grown) => w.grown = grown,
            Err(e) => w.error = Some(e),
        }
        if w.grown {
            // The new length needs the fdatasync a durable write skips.
            w.durable = DurableWrite::No;
        }
    }

    /// Step 3: waits for the batch's turn. Returns the drain lock if the
    /// batch writes alone (a durable write, or a page straddling an
    /// unaligned length whose tail step 6 cuts): it waited for every older
    /// generation, and no other write starts while it holds the lock.
    /// Otherwise the lock is released and the batch waits for the older
    /// generations that hold its pages (the write latch).
    fn take_turn<'g>(
        &self,
        p: &Parts<'_>,
        size: MutexGuard<'g, FileSize>,
        w: &mut BatchWrite,
        len: u64,
    ) -> Option<MutexGuard<'g, FileSize>> {
        let alone = matches!(w.durable, DurableWrite::Planned { .. })
            || !len.is_multiple_of(p.config.page_size as u64);
        if !alone {
            drop(size);
            if let Some(after) = w.batch.after {
                self.gens.wait_written(after + 1);
            }
            return None;
        }
        self.gens.wait_written(w.batch.id);
        // Only now is every older write complete: a durable write stands
        // in for the fdatasync only if all of them were synced (found by
        // the shuttle model check: a flush's write that completed during
        // the wait was counted as made durable).
        if let DurableWrite::Planned { synced_at } = w.durable
            && p.durability.write_seq() != synced_at
        {
            w.durable = DurableWrite::No;
        }
        Some(size)
    }

    /// Step 4: with a doublewrite area (and runs to write), a checkpoint
    /// if one is due, then the batch's record, made durable, before any of
    /// its pages goes in place. After the waits of step 3, so a batch that
    /// rewrites a page an older one still writes stages after it and the
    /// area holds each page's versions in order. A record that cannot be
    /// staged fails every run (none is written in place).
    fn stage(&self, p: &Parts<'_>, w: &mut BatchWrite, slot: &mut WriteSlot) {
        let Some(area) = p.torn.area() else { return };
        if slot.runs.is_empty() {
            return;
        }
        // The length now, not at the drain: pages written after that read
        // and drained with the batch reach past it.
        let staged = self.checkpoint_if_due(p, area).and_then(|()| {
            area.stage(
                &w.batch.entries,
                p.length.get(),
                p.durability.fsynced(),
                p.counters,
            )
            .map_err(|e| Error::io("doublewrite area", None, e))
        });
        match staged {
            Ok(()) => {
                w.staged = true;
                if w.grown {
                    // The length `extend_to` set counts once its record is
                    // durable.
                    p.durability.step();
                }
            }
            Err(e) => {
                if w.grown {
                    // No durable record carries it: only an fdatasync does.
                    p.durability.step_unstaged();
                }
                w.record_failure(unstaged(&slot.runs, &e));
                slot.runs.clear();
            }
        }
    }

    /// Step 5: writes the runs of `slot` (unless staging failed them) and
    /// gives the slot back. A backend that panics fails the write, like
    /// one that errs: the generation must still be marked written and the
    /// slot given back, or every later flush would wait for them.
    fn write_runs(&self, p: &Parts<'_>, w: &mut BatchWrite, mut slot: WriteSlot, mode: FlushMode) {
        if !slot.runs.is_empty() {
            for run in &slot.runs {
                p.length.overwriting(run.offset, run.len as u64);
            }
            let dsync = matches!(w.durable, DurableWrite::Planned { .. });
            let slot = &mut slot;
            let entries = &w.batch.entries;
            let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                slot.writer.write(
                    p.backend,
                    &slot.runs,
                    entries,
                    p.counters,
                    super::writer::WriteMode {
                        dsync,
                        company: mode.company,
                    },
                    slot.atomic.as_mut().map(|(a, _)| a),
                )
            }))
            .unwrap_or_else(|_| Err(panicked(&slot.runs)));
            match written {
                Ok(()) => w.some_written = true,
                Err(failure) => w.record_failure(failure),
            }
        }
        self.slots_of(w.kind).put(slot);
    }

    /// Step 6: what reached the OS is counted (`write_seq` steps: a later
    /// sync must cover it) and the lengths follow; a batch that wrote
    /// alone past an unaligned length cuts the tail; the doublewrite area
    /// learns what went in place; failed pages go back to the write buffer
    /// and that is recorded before the generation counts as written (a
    /// flush waiting for it must find them, and one that drained without
    /// them must learn it); after a failure the file is cut back to its
    /// written length once no write is in flight.
    fn account(
        &self,
        p: &Parts<'_>,
        mut w: BatchWrite,
        mut held: Option<MutexGuard<'_, FileSize>>,
    ) -> Written {
        let mut durable = matches!(w.durable, DurableWrite::Planned { .. })
            && w.failed_run.is_none()
            && w.error.is_none()
            && w.some_written;
        let mut seq_after = None;
        if w.some_written {
            let step = p.durability.step();
            seq_after = Some(step);
            // Counted right after the last `fdatasync`, or not durable by
            // itself: a scoped commit writing from the write buffer or a
            // write through takes no drain lock and may have counted a
            // write of its own during this one, which `RWF_DSYNC` here
            // does not cover (found by the model: such a commit took the
            // watermark for its own and skipped its `fdatasync`).
            if let DurableWrite::Planned { synced_at } = w.durable
                && step != synced_at + 1
            {
                durable = false;
            }
            add(&p.counters.flushes, 1);
            if let Some(end) = w.batch.written_end() {
                p.length.grow_written(end);
            }
            if let Some(size) = held.as_mut() {
                match size.cut_tail(p, &mut w.batch, &self.gens) {
                    // The file's length changed after the durable write:
                    // only an fdatasync covers that.
                    Ok(true) => durable = false,
                    Ok(false) => {}
                    Err(e) => {
                        durable = false;
                        w.error.get_or_insert(e);
                    }
                }
            }
        }
        if let (Some(area), true) = (p.torn.area(), w.staged) {
            area.written(seq_after, &w.batch.entries, &w.batch.failed);
        }
        let mut error = w.error.take();
        if let Some(f) = w.failed_run.take() {
            if let Some(filler) = &self.filler
                && super::grow::is_full(&f.error)
            {
                filler.full(p.backend);
            }
            w.batch.failed.sort_by_key(|r| r.start);
            error = Some(Error::PagesFailed {
                failed: w.batch.failed_ranges(),
                op: f.op,
                source: f.error.into(),
            });
        }
        let mut batch = w.batch;
        let failed = !batch.failed.is_empty();
        batch.requeue(p);
        if failed {
            self.gens.log_requeue(batch.drain_no);
        }
        let durable_seq = if durable { seq_after } else { None };
        self.gens.mark_written(batch.id, seq_after);
        if failed {
            self.cut_pending
                .store(true, std::sync::atomic::Ordering::Release);
            match held.as_mut() {
                Some(size) => self.cut_back_if_idle(p, size),
                None => {
                    if let Some(mut size) = self.drain.try_lock() {
                        self.cut_back_if_idle(p, &mut size);
                    }
                }
            }
        }
        drop(held);
        Written {
            batch,
            error,
            durable_seq,
            step: seq_after,
        }
    }

    /// The slots a slot of `kind` goes back to.
    fn slots_of(&self, kind: SlotKind) -> &super::slots::WriteSlots {
        match kind {
            SlotKind::Shared => &self.slots,
            SlotKind::Inline => &self.inline,
        }
    }
}
