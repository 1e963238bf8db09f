//! The flush pipeline: drain, write, settle, and the changes of the file's
//! size ordered with them.
//!
//! Owns: the **drain lock** (over [`FileSize`], the file's size as the OS
//! will hold it; its methods are in `size.rs`), the run writers
//! ([`Writers`]), the in-flight generations, the spare batches,
//! `cut_pending` and grow-ahead's filler. Calls: the components in
//! [`Parts`].
//!
//! A flush ([`FlushPipeline::flush`]) drains every stripe, or the pages of
//! a commit's scope ([`Drain`]), into a [`Batch`] (one in-flight
//! generation in each stripe it touched), writes it from the caller's
//! thread in six steps ([`FlushPipeline::write_batch`]) and returns the
//! `write_seq` step a commit must see covered. A commit settles the batch
//! after its `fdatasync` (a failed one puts the pages back before the file
//! is poisoned); `flush()` settles at once. Drains are serialized by the
//! drain lock; writes run after it is released, several at once, safe by
//! three rules:
//!
//! 1. **Newest wins (the write latch).** A generation writes only after
//!    every older one in flight holding one of its pages has written, so
//!    the younger version reaches the OS last.
//! 2. **A sync covers what was drained before it.** A flush of the whole
//!    file returns after every generation drained before or with it has
//!    written (a scoped one, after those holding its pages); `write_seq`
//!    steps after each batch's writes complete.
//! 3. **Failed pages are not skipped.** A failed write puts its pages back,
//!    and records that it did, before its generation counts as written; a
//!    flush that drained in between finds the record once it has waited,
//!    and drains and writes again.
//!
//! With a doublewrite area, a batch's record is durable before any of its
//! pages is written in place (staged after its write-latch wait, so the
//! area holds each page's versions in order), and a commit skips the
//! file's `fdatasync` only if no change since the last one is outside a
//! durable record. Size changes happen under the drain lock, before the
//! writes they precede; one that must see no write in flight (a cut back
//! after a failed write, an unaligned tail) waits for every older
//! generation under it.
//!
//! Lock order: drain lock -> ring -> generations -> stripe -> cache stripe;
//! the write slots' lock is a leaf; an `fdatasync` may be waited for under
//! the drain lock, and a thread in `fdatasync` never takes it.

use std::io;
use std::sync::atomic::Ordering;

use super::batch::{Batch, Settled, SpareBatches, panicked, unstaged};
use super::config::{add, add_elapsed};
use super::generations::{DrainHeld, Generations};
use super::grow::{Filler, Window};
use super::read::Parts;
use super::torn::CHECKPOINT_BYTES;
use super::write::{WriteFailure, WriteSlot, Writers};
use crate::coalesce::{RunLimits, coalesce, split_for_atomic};
use crate::error::{Error, Result};
use crate::sync::{AtomicBool, Mutex, MutexGuard};

/// The state under the drain lock: the file's size as the OS will hold it
/// once every drained write completed, and grow-ahead's trailer (methods
/// in `size.rs`).
pub(crate) struct FileSize {
    /// The proof that the drain lock is held, lent to the calls needing it.
    pub(super) held: DrainHeld,
    /// Grown at each drain by its pages, and by `fallocate`s and
    /// `ftruncate`s.
    pub(super) os_len: u64,
    pub(super) window: Option<Window>,
}

/// Whether a change of length is carried by a doublewrite record the
/// caller stages ([`FileSize::extend_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Staging {
    /// The caller stages a record carrying the new length.
    Yes,
    /// No record: only an `fdatasync` makes the change durable.
    No,
}

/// Whether grow-ahead's room writes the length into the trailer's next
/// slot (`FlushPipeline::make_room`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LengthRecord {
    /// Record the length if the newest record holds another (a flush, a
    /// `set_len` that grows).
    Write,
    /// No record (a cut: a record that failed partway must not make a
    /// refused cut come back after a crash).
    Skip,
}

/// Which pages a flush drains.
pub(crate) enum Drain<'a> {
    /// Every dirty page (`sync`, `flush`, backpressure).
    All,
    /// The dirty ones among these pages (grouped by stripe), with scratch
    /// for the generations holding the others in flight.
    Pages(&'a [u64], &'a mut Vec<u64>),
}

/// What a flush did.
#[derive(Default)]
pub(crate) struct Flushed {
    /// The last batch written, to settle; `None` if nothing was drained.
    pub(crate) batch: Option<Batch>,
    /// The first error (`PagesFailed`, or the length could not be set).
    pub(crate) error: Option<Error>,
    /// A `write_seq` step counting every write the flush covers.
    pub(crate) target: u64,
    /// `unstaged_at`, read together with the write sequence at the end.
    pub(crate) unstaged_at: u64,
    /// Something reached the OS or the file's length changed.
    pub(crate) wrote: bool,
}

/// The flush pipeline of one file (see the module docs).
pub(crate) struct FlushPipeline {
    /// The drain lock: drains, and size changes, are serialized by it.
    pub(super) drain: Mutex<FileSize>,
    pub(super) writers: Writers,
    pub(super) gens: Generations<Settled>,
    spare: SpareBatches,
    /// A failed write left the file to be cut back to the written length
    /// (by the next holder of the drain lock that finds no write in flight).
    pub(super) cut_pending: AtomicBool,
    /// Grow-ahead's filler thread, with a window (not on a read-only file).
    pub(super) filler: Option<Filler>,
}

/// One batch on its way to the OS: what the steps of
/// [`FlushPipeline::write_batch`] hand on to each other.
struct BatchWrite {
    batch: Batch,
    /// The first run that failed, by offset.
    failed_run: Option<(u64, &'static str, io::Error)>,
    /// A failure of the batch as a whole (no room past the window, or the
    /// file could not be extended).
    error: Option<Error>,
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
        if self.failed_run.as_ref().is_none_or(|f| offset < f.0) {
            self.failed_run = Some((offset, op, error));
        }
    }

    /// Notes a write that failed for some runs.
    fn record_failure(&mut self, failure: WriteFailure) {
        self.some_written |= failure.some_written;
        self.fail_run(failure.offset, failure.op, failure.error);
        self.batch.failed.extend(failure.failed);
    }
}

/// One batch written: the batch, the error, the `write_seq` step made.
struct Written {
    batch: Batch,
    error: Option<Error>,
    step: Option<u64>,
}

impl FlushPipeline {
    /// A pipeline over a file of `os_len` bytes writing with `writers`.
    pub(crate) fn new(os_len: u64, writers: Writers, grow: Option<(Window, Filler)>) -> Self {
        let (window, filler) = grow.unzip();
        Self {
            drain: Mutex::new(FileSize {
                held: DrainHeld::for_drain_lock(),
                os_len,
                window,
            }),
            writers,
            gens: Generations::new(),
            spare: SpareBatches::new(),
            cut_pending: AtomicBool::new(false),
            filler,
        }
    }

    /// A plain flush (`flush()`, backpressure): every page buffered when
    /// called reaches the OS before it returns; its batch is settled.
    /// Whether anything was written or the length changed.
    ///
    /// Errors: pages that failed to write (`PagesFailed`; they stay dirty),
    /// or the file could not be extended to its length.
    pub(crate) fn flush_now(&self, p: &Parts<'_>) -> Result<bool> {
        let f = self.flush(p, Drain::All);
        if let Some(batch) = f.batch {
            self.settle(p, batch, true);
        }
        f.error.map_or(Ok(f.wrote), Err)
    }

    /// One flush whose batch the caller settles (a commit, after its
    /// `fdatasync`): drains what `drain` names, writes it from this
    /// thread, and waits for the older writes it depends on (for
    /// [`Drain::All`] every generation drained before it; for
    /// [`Drain::Pages`] those holding the scope's pages). If an older
    /// generation's failed pages went back after this drain, it drains and
    /// writes again (earlier batches settled at once). Every run is tried;
    /// failed pages are back in the write buffer, named in
    /// [`Flushed::error`].
    pub(crate) fn flush(&self, p: &Parts<'_>, mut drain: Drain<'_>) -> Flushed {
        let mut f = Flushed::default();
        loop {
            let mut size = self.drain.lock();
            if self.cut_pending.load(Ordering::Acquire) {
                self.cut_back_if_idle(p, &mut size);
            }
            // Read before the drain: covers every write of the callers.
            let len = p.length.get();
            let drain_no = self.gens.begin_drain(&size.held);
            let drained = match &mut drain {
                Drain::All => Batch::drain(p, &self.gens, &self.spare, (drain_no, &size.held)),
                Drain::Pages(pages, in_flight) => {
                    in_flight.clear();
                    let at = (drain_no, &size.held);
                    Batch::drain_pages(p, &self.gens, &self.spare, at, pages, in_flight)
                }
            };
            // Every generation below this one was drained by now; every
            // page of the scope neither drained nor in flight was written,
            // and counted, before this.
            let mark = self.gens.next_id();
            let mut target = p.durability.write_seq();
            match drained {
                None => {
                    // The length may still be past the file's size (pages
                    // discarded at the end, a partial write past the last
                    // page, a length no trailer records yet): this flush
                    // records it.
                    match self.extend_without_pages(p, &mut size, len) {
                        Ok(grown) => f.wrote |= grown,
                        Err(e) => {
                            f.error.get_or_insert(e);
                        }
                    }
                    drop(size);
                    target = p.durability.write_seq();
                }
                Some(batch) => {
                    let w = self.write_batch(p, size, batch, len);
                    f.wrote = true;
                    target = target.max(w.step.unwrap_or(0));
                    if let Some(e) = w.error {
                        f.error.get_or_insert(e);
                    }
                    f.batch = Some(w.batch);
                }
            }
            let missed = match &drain {
                Drain::All => {
                    let missed = self.gens.wait_written_then_check(mark, drain_no);
                    target = p.durability.write_seq();
                    missed
                }
                Drain::Pages(_, in_flight) => {
                    let (step, missed) = self.gens.wait_ids_then_check(in_flight, drain_no);
                    target = match step {
                        Some(s) => target.max(s),
                        // One retired meanwhile: its step is below what is
                        // counted now.
                        None => p.durability.write_seq(),
                    };
                    missed
                }
            };
            (_, f.unstaged_at) = p.durability.snapshot();
            f.target = target;
            if !missed {
                return f;
            }
            // Pages an older generation failed to write are back in the
            // write buffer, after this drain: write them too.
            if let Some(batch) = f.batch.take() {
                self.settle(p, batch, true);
            }
        }
    }

    /// Ends a batch: with `ok`, the entries of `batch.failed` go back to
    /// the write buffer; without (its `fdatasync` failed), every entry
    /// does. The generation then retires (see `Generations::settle`).
    pub(crate) fn settle(&self, p: &Parts<'_>, mut batch: Batch, ok: bool) {
        if !ok {
            batch.fail_all();
        }
        let id = batch.id;
        let settled = batch.into_settled(p);
        self.gens.settle(id, settled, |s, cap| {
            Batch::retire(s, cap, p, &self.spare, self.gens.peak())
        });
        if !ok {
            // Writers waiting for room would wait for a settle that frees
            // nothing (the pages went back): wake them to see the poison.
            p.buffer.notify_room();
        }
    }

    /// After a failed write (`cut_pending`): cuts the file back to its
    /// written length once no write is in flight (else leaves it).
    pub(super) fn cut_back_if_idle(&self, p: &Parts<'_>, size: &mut FileSize) {
        if !self.gens.all_written() {
            return;
        }
        self.cut_pending.store(false, Ordering::Release);
        size.cut_back(p);
    }

    /// Grow-ahead's zero bytes, failed calls, and why it stopped.
    pub(crate) fn grow_stats(&self) -> (u64, u64, Option<String>) {
        self.filler
            .as_ref()
            .map_or((0, 0, None), |f| (f.bytes(), f.errors(), f.failed()))
    }

    /// Writes `batch`, drained under the drain lock `size`, in six steps
    /// handing a [`BatchWrite`] on: **plan** (a write slot, the runs, the
    /// ring if free), **size** (under the drain lock: grow-ahead room,
    /// preallocation, the logical length `len`), **turn** (the write
    /// latch), **stage** (the doublewrite record), **write**, **account**
    /// (the write sequence, lengths, failed pages back in the buffer).
    fn write_batch(
        &self,
        p: &Parts<'_>,
        mut size: MutexGuard<'_, FileSize>,
        batch: Batch,
        len: u64,
    ) -> Written {
        let (mut w, mut slot) = self.plan(p, batch);
        let mut ring = self.writers.ring_for(slot.runs.len());
        self.size_for(p, &mut size, &mut w, &mut slot, len, ring.is_some());
        let held = self.take_turn(p, size, &w, len);
        let started = std::time::Instant::now();
        self.stage(p, &mut w, &mut slot);
        if !slot.runs.is_empty() {
            for run in &slot.runs {
                p.length.overwriting(run.offset, run.len as u64);
            }
            let entries = &w.batch.entries;
            let ring = ring.as_deref_mut();
            // A backend that panics fails the write like one that errs:
            // the generation must still be marked written and the slot
            // given back, or every later flush would wait for them.
            let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.writers
                    .write(p.backend, &mut slot, ring, entries, p.counters)
            }))
            .unwrap_or_else(|_| Err(panicked(&slot.runs)));
            match written {
                Ok(()) => w.some_written = true,
                Err(failure) => w.record_failure(failure),
            }
        }
        drop(ring);
        self.writers.put_slot(slot);
        add_elapsed(&p.counters.write_us, started);
        self.account(p, w, held)
    }

    /// Plan: a write slot holding the batch's runs (cut into atomic pieces
    /// where writes must be untearable).
    fn plan(&self, p: &Parts<'_>, mut batch: Batch) -> (BatchWrite, WriteSlot) {
        let mut slot = self.writers.take_slot();
        let limits = RunLimits {
            max_pages: p.config.run_pages(),
            max_bytes: p.config.run_bytes(),
        };
        if coalesce(&mut batch.entries, limits, &mut slot.runs).is_err() {
            // Not reached: drained pages have distinct page numbers. The
            // batch goes back whole and writes nothing.
            debug_assert!(false, "coalesce failed on drained pages");
            batch.failed.push(0..batch.entries.len());
            slot.runs.clear();
        }
        if let (Some(max), Some((_, spare))) = (p.torn.atomic_max(), slot.atomic.as_mut()) {
            split_for_atomic(&mut slot.runs, p.config.page_size, max, spare);
        }
        let w = BatchWrite {
            batch,
            failed_run: None,
            error: None,
            grown: false,
            staged: false,
            some_written: false,
        };
        (w, slot)
    }

    /// Size, under the drain lock: grow-ahead room up to the runs' end
    /// (its filler writes no zero below them from here on), blocks for the
    /// runs past the end where they go out through the ring
    /// (`FileSize::preallocate`), and the file extended to `len`.
    fn size_for(
        &self,
        p: &Parts<'_>,
        size: &mut FileSize,
        w: &mut BatchWrite,
        slot: &mut WriteSlot,
        len: u64,
        ring: bool,
    ) {
        let end = slot.runs.last().map_or(0, |r| r.offset + r.len as u64);
        if let Some(filler) = &self.filler
            && end > 0
        {
            filler.drained(end);
        }
        if let Err(e) = self.make_room(p, size, end, len, LengthRecord::Write) {
            // No room past the window: no run may go out (they would reach
            // the trailer); they stay dirty for the next flush.
            for run in &slot.runs {
                w.batch.failed.push(run.entries());
            }
            slot.runs.clear();
            w.error = Some(e);
            return;
        }
        if ring && p.direct {
            let mut first = None;
            size.preallocate(p, slot, &mut w.batch, &mut first);
            if let Some((offset, op, error)) = first {
                w.fail_run(offset, op, error);
            }
        }
        if let Some(run) = slot.runs.last() {
            size.expect_end(run.offset + run.len as u64);
        }
        let staged = p.torn.area().is_some() && !slot.runs.is_empty();
        match size.extend_to(p, len, if staged { Staging::Yes } else { Staging::No }) {
            Ok(grown) => w.grown = grown,
            Err(e) => w.error = Some(e),
        }
    }

    /// Turn: the batch's wait for the older generations. Usually the drain
    /// lock is released and the batch waits for those holding its pages
    /// (the write latch). A batch over an unaligned length, whose tail the
    /// account step cuts, keeps the lock (returned) and waits for every
    /// older generation: it writes alone.
    fn take_turn<'g>(
        &self,
        p: &Parts<'_>,
        size: MutexGuard<'g, FileSize>,
        w: &BatchWrite,
        len: u64,
    ) -> Option<MutexGuard<'g, FileSize>> {
        if len.is_multiple_of(p.config.page_size as u64) {
            drop(size);
            if let Some(after) = w.batch.after {
                self.gens.wait_written(after + 1);
            }
            return None;
        }
        self.gens.wait_written(w.batch.id);
        Some(size)
    }

    /// Stage: with a doublewrite area (and runs to write), a checkpoint if
    /// one is due, then the batch's record, made durable, before any of its
    /// pages goes in place. After the turn, so the area holds each page's
    /// versions in order. A record that cannot be staged fails every run.
    fn stage(&self, p: &Parts<'_>, w: &mut BatchWrite, slot: &mut WriteSlot) {
        let Some(area) = p.torn.area() else { return };
        if slot.runs.is_empty() {
            return;
        }
        let checkpoint = if area.wants_checkpoint(CHECKPOINT_BYTES, p.durability.fsynced()) {
            p.durability
                .sync_all()
                .inspect_err(|_| p.buffer.notify_room())
        } else {
            Ok(())
        };
        // The length now, not at the drain: pages written after that read
        // and drained with the batch reach past it.
        let staged = checkpoint.and_then(|()| {
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

    /// Account: what reached the OS is counted (`write_seq` steps: a later
    /// sync must cover it) and the lengths follow; a batch that wrote alone
    /// past an unaligned length cuts the tail; the doublewrite area learns
    /// what went in place; failed pages go back to the write buffer and
    /// that is recorded before the generation counts as written; after a
    /// failure the file is cut back to its written length once no write is
    /// in flight.
    fn account(
        &self,
        p: &Parts<'_>,
        mut w: BatchWrite,
        mut held: Option<MutexGuard<'_, FileSize>>,
    ) -> Written {
        let mut step = None;
        if w.some_written {
            step = Some(p.durability.step());
            add(&p.counters.flushes, 1);
            if let Some(end) = w.batch.written_end() {
                p.length.grow_written(end);
            }
            if let Some(size) = held.as_mut()
                && let Err(e) = size.cut_tail(p, &mut w.batch, &self.gens)
            {
                w.error.get_or_insert(e);
            }
        }
        if let (Some(area), true) = (p.torn.area(), w.staged) {
            area.written(step, &w.batch.entries, &w.batch.failed);
        }
        let mut error = w.error.take();
        if let Some((_, op, e)) = w.failed_run.take() {
            if let Some(filler) = &self.filler
                && super::grow::is_full(&e)
            {
                filler.full(p.backend);
            }
            w.batch.failed.sort_by_key(|r| r.start);
            error = Some(Error::PagesFailed {
                failed: w.batch.failed_ranges(),
                op,
                source: e.into(),
            });
        }
        let mut batch = w.batch;
        let failed = !batch.failed.is_empty();
        batch.requeue(p);
        if failed {
            self.gens.log_requeue(batch.drain_no);
        }
        self.gens.mark_written(batch.id, step);
        if failed {
            self.cut_pending.store(true, Ordering::Release);
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
        Written { batch, error, step }
    }
}
