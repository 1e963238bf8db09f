//! The flush pipeline: drain, write, settle, and the changes of the file's
//! size ordered with them.
//!
//! Owns: the **drain lock** (over [`FileSize`]: the file's size as the OS
//! will hold it), the write slots, the in-flight generations, the spare
//! batch vectors, `cut_pending`, the run cap and grow-ahead's filler.
//! Calls: the components in [`Parts`] (the write buffer drains and takes
//! back pages, the read cache and lengths follow retired writes, the
//! watermark counts writes, the doublewrite area stages records), and the
//! run writers. This file holds the pipeline and its drain loop;
//! `batch_write.rs` writes one batch, step by step; `resize.rs` holds the
//! size changes that are not part of a flush (`set_len`, grow-ahead's
//! room, `refresh`).
//!
//! A flush drains every stripe into a [`Batch`]: one in-flight generation
//! in every stripe it touched. A plain flush settles its batch as soon as
//! the writes complete; a commit holds it until its `fdatasync` returned
//! (see `commit.rs`), so that a failed `fdatasync` can put the pages back
//! in the write buffer before the file is poisoned.
//!
//! The drain happens under the drain lock; the writes after it is
//! released, from a write slot of their own, so several flushes write at
//! once. Three rules keep that safe:
//!
//! 1. **Newest wins (the write latch).** Before a generation writes, it
//!    waits until every older generation still in flight that holds one
//!    of its pages has written. So two versions of a page are never in
//!    flight at once, and the younger reaches the OS last.
//! 2. **A sync covers what was drained before it.** A flush returns only
//!    after every generation drained before or with its own has written
//!    (`Generations::wait_written_then_check`), so an `fdatasync` that
//!    starts then covers those writes. `write_seq` steps after each
//!    batch's writes complete; an `fdatasync` covers the value read
//!    before it began.
//! 3. **Failed pages are not skipped.** A failed write puts its pages back
//!    in the write buffer, and records that it did, before its generation
//!    counts as written. A flush that drained after that generation, and
//!    before the pages went back, finds the record once it has waited, and
//!    drains and writes again: it never reports a page durable that an
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
//! The file's size changes (`ftruncate`, `fallocate`, grow-ahead's
//! trailer) happen under the drain lock, before the writes they precede;
//! one that must see no write in flight (cutting back after a failed
//! write, or an unaligned tail) waits for every older generation under the
//! drain lock, and a write never takes the drain lock after it left it,
//! except with `try_lock`.
//!
//! Lock order: drain lock -> `slots` -> generations -> stripe -> cache
//! stripe; a sync lane may be waited for under the drain lock (a
//! doublewrite checkpoint).

use std::sync::atomic::Ordering;

use super::batch::{Batch, Pass, ScopedPass, Settled, SpareBatches};
use super::doublewrite::{Area, CHECKPOINT_BYTES};
use super::file_size::{FileSize, LengthRecord, Staging};
use super::flush_mode::FlushMode;
use super::gather::GatherBuf;
use super::generations::Generations;
use super::grow::{Filler, Window};
use super::parts::Parts;
use super::slots::{WriteSlot, WriteSlots};
use super::through::ThroughGate;
use super::writer::RunWriter;
use crate::error::Result;
use crate::sync::{AtomicBool, Mutex};

/// Most direct commits writing at once (each from an inline write slot of
/// its own); more wait for a slot.
pub const MAX_DIRECT_WRITERS: usize = 64;

/// The flush pipeline of one file (see the module docs).
pub(crate) struct FlushPipeline {
    /// The drain lock: drains are serialized by it and number the
    /// generations in drain order; the file's size changes under it.
    pub(super) drain: Mutex<FileSize>,
    /// Free write slots ([`Config::rounds_in_flight`](crate::Config::rounds_in_flight)).
    pub(super) slots: WriteSlots,
    /// Inline write slots of direct commits (`pwritev` from the committing
    /// thread), made on demand up to [`MAX_DIRECT_WRITERS`].
    pub(super) inline: WriteSlots,
    /// How an inline slot copies: under `O_DIRECT` the page alignment
    /// (scattered runs are gathered), and with atomic pieces the page
    /// alignment for their copy buffer.
    pub(super) inline_copy_align: Option<usize>,
    inline_atomic_align: Option<usize>,
    /// In-flight generations, in drain order.
    pub(super) gens: Generations<Settled>,
    /// Emptied vectors of retired batches, reused by the next drain.
    spare: SpareBatches,
    /// A failed write left the file to be cut back to the written length;
    /// done by the next holder of the drain lock that finds no write in
    /// flight.
    pub(super) cut_pending: AtomicBool,
    /// Most bytes of one run: `max_write_bytes`, but never more than the
    /// write buffer holds.
    pub(super) max_run_bytes: usize,
    /// Grow-ahead's filler thread, with a window configured (not on a
    /// read-only file).
    pub(super) filler: Option<Filler>,
    /// Writes through in flight, held off by a cut (`through.rs`).
    pub(crate) through: ThroughGate,
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
            drain: Mutex::new(FileSize::new(os_len, window)),
            slots: WriteSlots::new(slots),
            inline: WriteSlots::new(Vec::new()),
            inline_copy_align,
            inline_atomic_align,
            gens: Generations::new(),
            spare: SpareBatches::new(),
            cut_pending: AtomicBool::new(false),
            max_run_bytes,
            through: ThroughGate::new(),
        }
    }

    /// A plain flush (no `fdatasync`): every page buffered when it was
    /// called reaches the OS, whichever flush drains it, before it
    /// returns; its batch is settled. Returns whether anything was written
    /// or the file's length changed.
    ///
    /// Errors: pages that failed to write (`PagesFailed`; they stay dirty),
    /// or the file could not be extended to its length.
    pub(crate) fn flush(&self, p: &Parts<'_>) -> Result<bool> {
        let pass = self.flush_for_commit(p, FlushMode::PLAIN);
        if let Some(batch) = pass.batch {
            self.settle(p, batch);
        }
        pass.error.map_or(Ok(pass.wrote), Err)
    }

    /// One flush whose batch the caller settles (a commit, after its
    /// `fdatasync`): drains every stripe and writes what it found as
    /// `mode` says, then waits until every generation drained before or
    /// with it has written, and every scoped commit's claim the drain met
    /// (pages written from the buffer outside any generation), so that
    /// what was buffered when it started is with the OS when it returns. If a write of an older generation
    /// failed meanwhile (its pages went back to the write buffer after this
    /// drain), it drains and writes again; the batches of the passes
    /// before the last are settled at once.
    ///
    /// Every run is tried, whatever failed before it (one bad page must not
    /// hold the others hostage); the pages of the runs that failed are back
    /// in the write buffer when it returns, and their error, naming their
    /// byte ranges, is in [`Pass::error`].
    pub(crate) fn flush_for_commit(&self, p: &Parts<'_>, mode: FlushMode) -> Pass {
        let mut pass = Pass::default();
        let mut mode = mode;
        let mut claims = Vec::new();
        loop {
            claims.clear();
            let mut size = self.drain.lock();
            if self.cut_pending.load(Ordering::Acquire) {
                self.cut_back_if_idle(p, &mut size);
            }
            // Read before the drain: covers every write of the callers.
            let len = p.length.get();
            let drain_no = self.gens.begin_drain(size.held());
            let drained = Batch::drain(
                p,
                &self.gens,
                &self.spare,
                drain_no,
                size.held(),
                &mut claims,
            );
            // Every generation below this one was drained by now.
            let mark = self.gens.next_id();
            match drained {
                None => {
                    match self.extend_without_pages(p, &mut size, len) {
                        Ok(grown) => pass.wrote |= grown,
                        Err(e) => {
                            pass.error.get_or_insert(e);
                        }
                    }
                    drop(size);
                }
                Some(batch) => {
                    let w = self.write_batch(p, size, batch, mode, len);
                    pass.wrote = true;
                    pass.durable_seq = w.durable_seq;
                    if let Some(e) = w.error {
                        pass.error.get_or_insert(e);
                    }
                    pass.batch = Some(w.batch);
                }
            }
            let missed = self.gens.wait_written_then_check(mark, drain_no);
            // Pages claimed from the buffer before the drain met them are
            // being written by scoped commits outside any generation: wait
            // for those writes too (counted before the claims go).
            let requeued = !claims.is_empty() && p.buffer.wait_claims(&claims);
            (pass.seq, pass.unstaged_at) = p.durability.snapshot();
            if !missed && !requeued {
                return pass;
            }
            // Pages an older generation failed to write are back in the
            // write buffer, after this drain: write them too. A durable
            // write stood in for an fdatasync of the first pass only.
            mode.durable_write_at = None;
            pass.durable_seq = None;
            if let Some(batch) = pass.batch.take() {
                self.settle(p, batch);
            }
        }
    }

    /// A scoped flush ([`Writer::commit`](crate::Writer::commit)): drains
    /// only `pages` (page numbers grouped by stripe,
    /// `WriteBuffer::by_stripe`), those of them that are dirty, into a
    /// generation of its own and writes it from an inline slot on this
    /// thread; waits for no write but its own, those of the generations
    /// that hold its other pages in flight, and those of other commits'
    /// claims on them (`through::commit_buffered`). Returns the batch (to settle
    /// after the commit's `fdatasync`), the error of what failed (its
    /// pages back in the write buffer), and the target: a `write_seq` that
    /// counts every write of those pages, so an `fdatasync` covering it
    /// makes them durable. Pages neither dirty nor in flight were written
    /// before the drain, and the `write_seq` read right after it counts
    /// them. `in_flight` is scratch space the caller keeps.
    ///
    /// If a write of an older generation failed meanwhile and its pages
    /// went back to the write buffer after this drain, it drains again (the
    /// pages of this writer among them are dirty again); the batches of the
    /// passes before the last are settled at once.
    pub(crate) fn flush_scoped(
        &self,
        p: &Parts<'_>,
        pages: &[u64],
        in_flight: &mut Vec<u64>,
    ) -> ScopedPass {
        let mut pass = ScopedPass::default();
        let mut claims = Vec::new();
        loop {
            claims.clear();
            let mut size = self.drain.lock();
            if self.cut_pending.load(Ordering::Acquire) {
                self.cut_back_if_idle(p, &mut size);
            }
            let len = p.length.get();
            let drain_no = self.gens.begin_drain(size.held());
            in_flight.clear();
            let drain = (drain_no, size.held());
            let drained = Batch::drain_pages(
                p,
                &self.gens,
                &self.spare,
                drain,
                pages,
                in_flight,
                &mut claims,
            );
            // Every page of the scope not drained nor in flight was
            // written, and counted, before this.
            let mut target = p.durability.write_seq();
            match drained {
                None => {
                    // Every page of the scope went out with other flushes,
                    // which may have read a length from before this
                    // writer's writes: the length is this commit's to
                    // record (grow-ahead's trailer, or the file's size).
                    if let Err(e) = self.extend_without_pages(p, &mut size, len) {
                        pass.error.get_or_insert(e);
                    }
                    drop(size);
                    target = p.durability.write_seq();
                }
                Some(batch) => {
                    let w = self.write_batch(p, size, batch, FlushMode::DIRECT, len);
                    target = target.max(w.step.unwrap_or(0));
                    if let Some(e) = w.error {
                        pass.error.get_or_insert(e);
                    }
                    pass.batch = Some(w.batch);
                }
            }
            let (step, missed) = self.gens.wait_ids_then_check(in_flight, drain_no);
            // Pages of the scope another commit claimed from the buffer:
            // their writes are counted before the claims go.
            let requeued = !claims.is_empty() && p.buffer.wait_claims(&claims);
            pass.target = match step {
                Some(s) if claims.is_empty() => target.max(s),
                // One retired meanwhile, or a claim was released: its step
                // is below what is counted now.
                _ => p.durability.write_seq(),
            };
            if !missed && !requeued {
                return pass;
            }
            if let Some(batch) = pass.batch.take() {
                self.settle(p, batch);
            }
        }
    }

    /// A flush that drained nothing: the logical length `len` may still be
    /// past the file's size (pages discarded at the end, a `write_all_at`
    /// that reached past the last page written, a length no trailer
    /// records yet). Returns whether the file changed.
    ///
    /// Errors: grow-ahead's (see `make_room`); "ftruncate".
    fn extend_without_pages(&self, p: &Parts<'_>, size: &mut FileSize, len: u64) -> Result<bool> {
        self.make_room(p, size, len, len, LengthRecord::Write)?;
        size.extend_to(p, len, Staging::No)
    }

    /// A write slot of a direct commit: `pwritev` from the committing
    /// thread (no writer threads, no ring), copying scattered runs under
    /// `O_DIRECT` as the pwritev engine does.
    pub(super) fn inline_slot(&self) -> WriteSlot {
        let writer = RunWriter::Vectored {
            iovecs: Vec::new(),
            pool: None,
            copy: self.inline_copy_align.map(GatherBuf::new),
        };
        WriteSlot::new(writer, self.inline_atomic_align)
    }

    /// After a failed write (`cut_pending`): once no write is in flight
    /// (the caller holds the drain lock, so none starts), cuts the file back
    /// to its written length ([`FileSize::cut_back`]); while writes are in
    /// flight, leaves it to the next holder of the drain lock.
    pub(super) fn cut_back_if_idle(&self, p: &Parts<'_>, size: &mut FileSize) {
        if !self.gens.all_written() {
            return;
        }
        self.cut_pending.store(false, Ordering::Release);
        size.cut_back(p);
    }

    /// Ends a batch: the entries in `batch.failed` (ranges of the sorted
    /// batch) did not reach the OS (for a commit: or were not synced) and
    /// go back to the write buffer (`Batch::requeue`); the rest did.
    ///
    /// The generation then retires: at once if it shares no page with an
    /// older generation in flight, else only after every older generation
    /// did (a younger generation shadows an older one for readers, so
    /// removing it first would let a reader find the older version of a
    /// page).
    pub(crate) fn settle(&self, p: &Parts<'_>, batch: Batch) {
        let id = batch.id;
        let settled = batch.into_settled(p);
        self.gens.settle(id, settled, |s, cap| {
            Batch::retire(s, cap, p, &self.spare, self.gens.peak())
        });
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
        match p.durability.sync_file() {
            Ok(_) => Ok(()),
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
    pub(super) fn checkpoint_if_due(&self, p: &Parts<'_>, area: &Area) -> Result<()> {
        if !area.wants_checkpoint(CHECKPOINT_BYTES, p.durability.fsynced()) {
            return Ok(());
        }
        self.sync_file(p)
    }

    /// Zero bytes grow-ahead's filler wrote, its failed calls and why it
    /// stopped, if it did.
    pub(crate) fn grow_stats(&self) -> (u64, u64, Option<String>) {
        self.filler
            .as_ref()
            .map_or((0, 0, None), |f| (f.bytes(), f.errors(), f.failed()))
    }
}
