//! A batch: the pages one flush drained (one in-flight generation), from
//! the drain ([`Batch::drain`]) to the requeue of what failed
//! ([`Batch::requeue`]) and the retire ([`Batch::retire`]); and the
//! vectors retired batches leave for the next drain ([`SpareBatches`]).
//!
//! Owns: the spare vectors (a leaf lock). Calls: the write buffer, the
//! generations, the read cache and lengths, the doublewrite area.

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

/// A settled generation until it retires: the batch, which entries failed
/// (put back), and the bytes kept dirty.
pub(crate) type Settled = (Batch, Vec<bool>, usize);

/// A retired [`Batch`]'s vectors, emptied, for the next drain.
#[derive(Default)]
pub(crate) struct BatchVecs {
    entries: Vec<(u64, PageRef)>,
    drained: Vec<(usize, Arc<PageMap>)>,
}

pub(crate) struct SpareBatches(Mutex<Vec<BatchVecs>>);

impl SpareBatches {
    pub(crate) fn new() -> Self {
        Self(Mutex::new(Vec::new()))
    }

    fn take(&self) -> BatchVecs {
        self.0.lock().pop().unwrap_or_default()
    }

    /// Keeps a retired batch's vectors: up to `depth` (the most batches in
    /// flight at once so far) within [`SPARE_BATCHES`]; one a bulk flush
    /// grew past [`SPARE_MAP_MAX`] pages per stripe is dropped.
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
    /// The youngest older generation in flight at the drain holding one of
    /// its pages: this batch writes after every one up to it has.
    pub(crate) after: Option<u64>,
    /// (byte offset, page), sorted by offset after `coalesce`.
    pub(crate) entries: Vec<(u64, PageRef)>,
    /// The stripes drained and the map each gave.
    drained: Vec<(usize, Arc<PageMap>)>,
    /// Entry ranges (of the sorted batch) that did not reach the OS, not
    /// yet put back ([`requeue`](Self::requeue)).
    pub(crate) failed: Vec<std::ops::Range<usize>>,
    /// Per entry, whether it was put back (empty until something fails).
    is_failed: Vec<bool>,
    /// Bytes of the pages put back in the write buffer.
    kept: usize,
    /// The most the file holds after this batch's writes (a tail cut back).
    pub(crate) disk_cap: u64,
}

impl Batch {
    /// Drains every stripe into a new generation; `None` if nothing was
    /// dirty.
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

    /// Drains the dirty pages among `pages` (grouped by stripe) into a new
    /// generation; `None` if none was dirty. The older generations holding
    /// the others in flight go to `in_flight`.
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
    /// into `drained` (returning the generation it comes after); `None` if
    /// it took nothing.
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

    /// Every entry failed (a failed `fdatasync`, a poison): all go back.
    pub(crate) fn fail_all(&mut self) {
        self.failed = std::iter::once(0..self.entries.len()).collect();
    }

    /// Puts the pages of `failed` back in the write buffer, unless a newer
    /// version exists, and empties `failed`. The write calls it, and
    /// records it (`Generations::log_requeue`), before the generation
    /// counts as written, so a flush that drained without these pages
    /// drains again (the shuttle model check's
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

    /// Requeues what failed and hands the batch over for its retire.
    pub(crate) fn into_settled(mut self, p: &Parts<'_>) -> Settled {
        self.requeue(p);
        let is_failed = std::mem::take(&mut self.is_failed);
        let kept = self.kept;
        (self, is_failed, kept)
    }

    /// Retires a settled batch: written pages update the disk length (up to
    /// `cap`, after a cut: `Generations::cut_under`) and the read cache,
    /// then the generation leaves its stripes and the buffer bound. Every
    /// page is in the buffer, the cache or on disk before its in-flight
    /// entry goes. `depth`: the most generations in flight at once.
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
            // Room was freed, or pages went back where a waiter can flush.
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

/// Every run failed: the backend panicked (some may have reached the OS).
pub(crate) fn panicked(runs: &[Run]) -> WriteFailure {
    WriteFailure {
        failed: runs.iter().map(Run::entries).collect(),
        some_written: true,
        offset: runs.first().map_or(0, |r| r.offset),
        op: "write",
        error: std::io::Error::other("the backend panicked while writing"),
    }
}
