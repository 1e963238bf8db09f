//! A batch: the pages one flush drained, which are one in-flight
//! generation in every stripe they came from, from the drain
//! ([`Batch::drain`]) through the write (the flush pipeline's) to the
//! requeue of what failed ([`Batch::requeue`]) and the retire
//! ([`Batch::retire`]); and the vectors retired batches leave for the
//! next drain ([`SpareBatches`]).
//!
//! Owns: nothing shared but the spare vectors (a leaf lock). Calls: the
//! write buffer (drain, requeue, retire), the generations (numbering),
//! the read cache and lengths (retire), the doublewrite area (a discarded
//! page's failed write no longer holds it).

use std::sync::Arc;

use super::generations::{DrainHeld, Generations};
use super::read::Parts;
use super::write::WriteFailure;
use super::write_buffer::{PageMap, PageRef, Requeued, SPARE_MAP_MAX};
use crate::coalesce::Run;
use crate::error::Error;
use crate::sync::Mutex;

/// Fewest and most emptied batch vectors kept ([`SpareBatches`]): as many
/// as batches have been in flight at once, within these bounds.
const SPARE_BATCHES: std::ops::RangeInclusive<usize> = 4..=64;

/// What a settled generation carries until it retires: the batch, which
/// of its entries failed (put back in the write buffer), and the bytes
/// kept dirty.
pub(crate) type Settled = (Batch, Vec<bool>, usize);

/// The vectors of a retired [`Batch`], emptied, kept with their capacity
/// for the next drain.
#[derive(Default)]
pub(crate) struct BatchVecs {
    entries: Vec<(u64, PageRef)>,
    drained: Vec<(usize, Arc<PageMap>)>,
}

/// Emptied vectors of retired batches, reused by the next drain.
pub(crate) struct SpareBatches(Mutex<Vec<BatchVecs>>);

impl SpareBatches {
    pub(crate) fn new() -> Self {
        Self(Mutex::new(Vec::new()))
    }

    fn take(&self) -> BatchVecs {
        self.0.lock().pop().unwrap_or_default()
    }

    /// Keeps a retired batch's emptied vectors for the next drain: up to
    /// `depth` (the most batches in flight at once so far) within
    /// [`SPARE_BATCHES`], so a steady load of that many concurrent
    /// commits allocates none; one a bulk flush grew past
    /// [`SPARE_MAP_MAX`] pages per stripe is dropped.
    fn keep(&self, vecs: BatchVecs, stripes: usize, depth: usize) {
        debug_assert!(vecs.entries.is_empty() && vecs.drained.is_empty());
        if vecs.entries.capacity() > SPARE_MAP_MAX * stripes {
            return;
        }
        let keep = depth.clamp(*SPARE_BATCHES.start(), *SPARE_BATCHES.end());
        let mut spare = self.0.lock();
        if spare.len() < keep {
            spare.push(vecs);
        }
    }
}

/// The pages one flush drained: one in-flight generation.
pub(crate) struct Batch {
    /// Generation number (drain order).
    pub(crate) id: u64,
    /// The drain's number (`Generations::begin_drain`).
    pub(crate) drain_no: u64,
    /// The youngest older generation, still in flight at the drain, that
    /// holds a page this one drained: this batch writes only after every
    /// generation up to it has written (newest wins).
    pub(crate) after: Option<u64>,
    /// (byte offset, page), sorted by offset after `coalesce`.
    pub(crate) entries: Vec<(u64, PageRef)>,
    /// The stripes drained and the map each gave (also referenced from the
    /// stripe's in-flight list until retired).
    drained: Vec<(usize, Arc<PageMap>)>,
    /// Entry ranges (of the sorted batch) that did not reach the OS, not
    /// yet put back in the write buffer (see [`requeue`](Self::requeue)).
    pub(crate) failed: Vec<std::ops::Range<usize>>,
    /// Per entry, whether it failed and was put back (empty, no allocation,
    /// until something fails).
    is_failed: Vec<bool>,
    /// Bytes of the pages put back in the write buffer.
    kept: usize,
    /// What the file holds after this batch's writes at most: the logical
    /// length when the last page straddled it and the file was cut back.
    pub(crate) disk_cap: u64,
}

impl Batch {
    /// Moves every stripe's dirty pages to a new in-flight generation
    /// (numbered by `gens`) and collects them; `None` if nothing was dirty.
    /// Called with the drain lock held.
    pub(crate) fn drain(
        p: &Parts<'_>,
        gens: &Generations<Settled>,
        spare: &SpareBatches,
        (drain_no, drain): (u64, &DrainHeld),
    ) -> Option<Batch> {
        Self::drained_by(p, gens, spare, (drain_no, drain), |id, drained| {
            p.buffer.drain(drain, id, drained)
        })
    }

    /// A scoped drain: moves the dirty pages among `pages` (grouped by
    /// stripe, [`WriteBuffer::by_stripe`](super::write_buffer::WriteBuffer::by_stripe))
    /// to a new in-flight generation and collects them; `None` if none of
    /// them was dirty. For each of `pages` in flight in an older generation
    /// instead, that generation's number goes to `in_flight`. Called with
    /// the drain lock held.
    pub(crate) fn drain_pages(
        p: &Parts<'_>,
        gens: &Generations<Settled>,
        spare: &SpareBatches,
        (drain_no, drain): (u64, &DrainHeld),
        pages: &[u64],
        in_flight: &mut Vec<u64>,
    ) -> Option<Batch> {
        Self::drained_by(p, gens, spare, (drain_no, drain), |id, drained| {
            p.buffer.drain_pages(drain, id, pages, drained, in_flight)
        })
    }

    /// The batch of generation `gens.next_id()`, whose pages `take` moves
    /// out of the write buffer into `drained` (returning the older
    /// generation in flight this one comes after, if any); `None`, and
    /// the vectors kept for the next drain, if it took nothing. Called with
    /// the drain lock held: ids follow drain order.
    fn drained_by(
        p: &Parts<'_>,
        gens: &Generations<Settled>,
        spare: &SpareBatches,
        (drain_no, drain): (u64, &DrainHeld),
        take: impl FnOnce(u64, &mut Vec<(usize, Arc<PageMap>)>) -> Option<u64>,
    ) -> Option<Batch> {
        let BatchVecs {
            mut entries,
            mut drained,
        } = spare.take();
        let id = gens.next_id();
        let after = take(id, &mut drained);
        if drained.is_empty() {
            let vecs = BatchVecs { entries, drained };
            spare.keep(vecs, p.buffer.stripe_count(), gens.peak());
            return None;
        }
        gens.push(drain, id, after.is_none());
        let n = drained.iter().map(|(_, m)| m.len()).sum();
        entries.reserve(n);
        for (_, map) in &drained {
            entries.extend(
                map.iter()
                    .map(|(&n, page)| (p.buffer.offset_of(n), Arc::clone(page))),
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

    /// Every entry failed (a failed `fdatasync`, or the file poisoned
    /// meanwhile): all go back to the write buffer at the settle.
    pub(crate) fn fail_all(&mut self) {
        self.failed = std::iter::once(0..self.entries.len()).collect();
    }

    /// Puts the pages of `failed` back in the write buffer, unless a newer
    /// version exists (dirty, or in a younger in-flight generation), and
    /// empties `failed`.
    ///
    /// The write calls it, and records it (`Generations::log_requeue`),
    /// before the generation counts as written: a flush that drained after
    /// this batch, without these pages, finds the record once it waited
    /// for this generation and drains again, so it never tells a caller who
    /// wrote them Ok (a flush that trusted its first drain could: the
    /// shuttle model check's
    /// `an_ok_sync_covers_pages_an_earlier_round_failed_to_write`).
    pub(crate) fn requeue(&mut self, p: &Parts<'_>) {
        if self.failed.is_empty() {
            return;
        }
        let mut newly = vec![false; self.entries.len()];
        for r in std::mem::take(&mut self.failed) {
            newly[r].fill(true);
        }
        let mut is_failed = std::mem::take(&mut self.is_failed);
        is_failed.resize(self.entries.len(), false);
        let mut gone = Vec::new();
        for (i, (off, page)) in self.entries.iter().enumerate() {
            // Each page goes back once: one already back (an earlier
            // requeue of this batch) is skipped.
            if !newly[i] || is_failed[i] {
                continue;
            }
            is_failed[i] = true;
            match p
                .buffer
                .requeue(p.buffer.page_no(*off), page, &self.drained)
            {
                Requeued::Kept => self.kept += page.len(),
                Requeued::Discarded => gone.push(*off),
                Requeued::Newer => {}
            }
        }
        self.is_failed = is_failed;
        // Discarded: unspecified until written again, so the doublewrite
        // area need not keep a record for their failed write.
        for off in gone {
            p.torn.forget_failed(off, off + 1);
        }
    }

    /// Puts what failed back in the write buffer ([`requeue`](Self::requeue))
    /// and hands the batch over for its retire.
    pub(crate) fn into_settled(mut self, p: &Parts<'_>) -> Settled {
        self.requeue(p);
        let is_failed = std::mem::take(&mut self.is_failed);
        let kept = self.kept;
        (self, is_failed, kept)
    }

    /// Retires a settled batch (the oldest in flight): written pages update
    /// the disk length and the read cache, then the generation leaves its
    /// stripes and the memory of released pages leaves the buffer bound.
    /// Every page is thus in the write buffer, or in the cache / on disk,
    /// before its in-flight entry goes.
    /// `cap`: how far the disk length may grow at most (bytes), where the
    /// file was cut after the batch wrote (`Generations::cut_under`).
    /// `depth`: the most generations in flight at once so far (how many
    /// spare maps and vectors are kept).
    pub(crate) fn retire(
        (batch, is_failed, kept): Settled,
        cap: Option<u64>,
        p: &Parts<'_>,
        spare: &SpareBatches,
        depth: usize,
    ) {
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
            let end = (off + page.len() as u64)
                .min(batch.disk_cap)
                .min(cap.unwrap_or(u64::MAX));
            p.length.grow_disk(end);
        }
        if p.cache.is_enabled() {
            for (off, page) in written() {
                p.cache
                    .update(p.buffer.page_no(*off), Arc::clone(page), p.buffer.pool());
            }
        }
        let Batch {
            mut entries,
            mut drained,
            ..
        } = batch;
        let mut total = 0usize;
        for (i, map) in drained.drain(..) {
            total += p.buffer.retire(i, map, depth);
        }
        debug_assert!(total >= kept, "kept {kept} of {total} bytes");
        p.buffer.uncount(total - kept);
        // Recycle the pages nobody else holds (a reader, the read cache, or
        // the write buffer after a failure).
        p.buffer
            .pool()
            .put_all(entries.drain(..).map(|(_, page)| page));
        spare.keep(
            BatchVecs { entries, drained },
            p.buffer.stripe_count(),
            depth,
        );
        if total > 0 {
            // Wake writers waiting for room (see `wait_for_room`): room was
            // freed, or the pages went back to the write buffer, where a
            // waiter can flush them itself.
            p.buffer.notify_room();
        }
    }

    /// The highest byte offset this batch wrote, if it wrote anything.
    pub(crate) fn written_end(&self) -> Option<u64> {
        // Entries are sorted: the last one not failed ends highest.
        (0..self.entries.len())
            .rev()
            .find(|i| !self.failed.iter().any(|r| r.contains(i)))
            .map(|i| self.entries[i].0 + self.entries[i].1.len() as u64)
    }

    /// The byte ranges of the entries in `failed`, adjacent ones merged.
    pub(crate) fn failed_ranges(&self) -> Vec<std::ops::Range<u64>> {
        let mut out: Vec<std::ops::Range<u64>> = Vec::new();
        for r in &self.failed {
            for (off, page) in &self.entries[r.clone()] {
                let end = off + page.len() as u64;
                match out.last_mut() {
                    Some(last) if last.end == *off => last.end = end,
                    _ => out.push(*off..end),
                }
            }
        }
        out
    }
}

/// The failure of a batch whose doublewrite record could not be staged:
/// no run was written.
pub(crate) fn unstaged(runs: &[Run], e: &Error) -> WriteFailure {
    WriteFailure {
        failed: runs.iter().map(Run::entries).collect(),
        some_written: false,
        offset: runs.first().map_or(0, |r| r.offset),
        op: "doublewrite area",
        error: e.to_io(),
    }
}

/// Every run failed: the backend panicked while writing them (some may
/// have reached the OS, so `some_written`: the next sync must not be
/// skipped).
pub(crate) fn panicked(runs: &[Run]) -> WriteFailure {
    WriteFailure {
        failed: runs.iter().map(Run::entries).collect(),
        some_written: true,
        offset: runs.first().map_or(0, |r| r.offset),
        op: "write",
        error: std::io::Error::other("the backend panicked while writing"),
    }
}
