//! Counters of a [`PagedCachedFile`](crate::PagedCachedFile).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of a file's counters, all since it was opened.
///
/// Counters are read one by one without a lock, so a snapshot taken while
/// other threads work can be off by the operations in progress.
///
/// Counted by every component; read with [`PagedCachedFile::stats`](crate::PagedCachedFile::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Stats {
    /// Pages handed to the file by writers (`write_page`, `WritablePage`).
    pub pages_dirtied: u64,
    /// Pages written to the backend by flushes (a page rewritten before a
    /// flush is written once).
    pub pages_written: u64,
    /// Runs (contiguous ranges) written.
    pub runs: u64,
    /// Write calls made to the backend (`pwrite` / `pwritev`); a backend may
    /// split one call on a short write.
    pub write_calls: u64,
    /// Bytes written to the backend.
    pub bytes_written: u64,
    /// Flushes that wrote at least one page.
    pub flushes: u64,
    /// `fdatasync` calls.
    pub syncs: u64,
    /// Commit rounds whose one run was written with `RWF_DSYNC` instead of
    /// a write and an `fdatasync` ([`Config::commit_dsync`](crate::Config::commit_dsync)).
    pub dsync_writes: u64,
    /// Writes made with `RWF_ATOMIC` ([`TornWrites::Atomic`](crate::TornWrites::Atomic)):
    /// each a power-of-two piece of a run (`write_calls` counts them too).
    pub atomic_writes: u64,
    /// Records written to the doublewrite area
    /// ([`TornWrites::DoubleWrite`](crate::TornWrites::DoubleWrite)): one
    /// per flush, one sequential write each.
    pub doublewrite_records: u64,
    /// Bytes written to the doublewrite area (headers and page images; not
    /// in `bytes_written`).
    pub doublewrite_bytes: u64,
    /// `fdatasync`s of the doublewrite area (not in `syncs`).
    pub doublewrite_syncs: u64,
    /// Time spent in backend write calls by flushes, µs.
    pub write_us: u64,
    /// Time spent in `fdatasync`, µs.
    pub sync_us: u64,
    /// `sync()` calls that returned `Ok`.
    pub commits: u64,
    /// Group-commit rounds: one flush and one `fdatasync` each (or, with
    /// [`Config::commit_dsync`](crate::Config::commit_dsync), one durable
    /// write instead of both).
    pub commit_rounds: u64,
    /// Largest number of `sync()` callers served by one round.
    pub max_commit_group: u64,
    /// Of `commits`, those made as direct commits (each caller its own
    /// leader, [`CommitStrategy::Direct`](crate::CommitStrategy::Direct),
    /// or where `Auto` found it faster); the rest went through rounds.
    pub direct_commits: u64,
    /// Times [`CommitStrategy::Auto`](crate::CommitStrategy::Auto)
    /// switched between group and direct commits.
    pub strategy_switches: u64,
    /// Of `commits`, [`Writer::commit`](crate::Writer::commit)s that
    /// allocate (their pages reach past the file's length on disk, or lie
    /// in space unwritten on disk when the file was opened or that
    /// `set_len` added since), made as
    /// [`PagedCachedFile::sync`](crate::PagedCachedFile::sync) makes its
    /// commits (grouped).
    pub allocating_scoped_commits: u64,
    /// Of `commits`, [`Writer::write_and_commit`](crate::Writer::write_and_commit)s
    /// written through: one `pwrite` straight from the caller's bytes, no
    /// copy into the write buffer.
    pub through_commits: u64,
    /// [`Writer::write_page`](crate::Writer::write_page)s and
    /// `write_all_at`s of at least
    /// [`Config::write_through_min_bytes`](crate::Config::write_through_min_bytes) written
    /// straight to disk at once (one `pwrite` from the caller's bytes, no
    /// copy into the write buffer), their commit left to the writer's
    /// next `commit`.
    pub through_writes: u64,
    /// Of `commits`, [`Writer::commit`](crate::Writer::commit)s (and
    /// `write_and_commit`s that could not write through) whose pages were
    /// written straight from the write buffer, without a drain: their
    /// pages were claimed, written with one call per run, and released.
    pub claimed_commits: u64,
    /// Sync lanes opened while the file was open: a scoped commit that
    /// found every lane syncing opened one more (one open file description
    /// each, kept until close), so there are about as many lanes as
    /// threads committing at once.
    pub sync_lanes_opened: u64,
    /// Sum over the rounds started of the rounds in flight (writing or
    /// syncing, not yet published) at each start, that one included: see
    /// [`mean_rounds_in_flight`](Self::mean_rounds_in_flight).
    pub rounds_in_flight_sum: u64,
    /// Writers that found the write buffer full and flushed or waited.
    pub backpressure_waits: u64,
    /// Reads served from the write buffer or the in-flight set.
    pub buffer_hits: u64,
    /// Reads served from the read cache.
    pub cache_hits: u64,
    /// Pages read from the backend.
    pub disk_reads: u64,
    /// Dirty and in-flight bytes held now.
    pub buffered_bytes: u64,
    /// Highest `buffered_bytes` seen.
    pub peak_buffered_bytes: u64,
    /// Grow-ahead ([`GrowAhead::Window`](crate::GrowAhead::Window)): times
    /// the window moved (its trailer rewritten at a new end, one size
    /// change and one `fdatasync` each).
    pub grow_extensions: u64,
    /// Grow-ahead: trailer records written by flushes that changed the
    /// length (one small write each, covered by the commit's `fdatasync`).
    pub grow_records: u64,
    /// Grow-ahead: zero bytes the filler wrote ahead of the data.
    pub grow_zero_bytes: u64,
    /// Grow-ahead: failed fill calls (the filler stops at the first:
    /// `ENOSPC`, `EFBIG`, ...; commits go on without it;
    /// [`PagedCachedFile::grow_ahead_stopped`](crate::PagedCachedFile::grow_ahead_stopped)
    /// says why).
    pub grow_errors: u64,
}

impl Stats {
    /// Average number of `sync()` callers per group-commit round (direct
    /// commits left out).
    pub fn avg_commit_group(&self) -> f64 {
        if self.commit_rounds == 0 {
            0.0
        } else {
            self.commits.saturating_sub(self.direct_commits) as f64 / self.commit_rounds as f64
        }
    }

    /// Mean number of commit rounds in flight (writing or syncing) when a
    /// round started, that round included; 1.0 means no overlap.
    pub fn mean_rounds_in_flight(&self) -> f64 {
        if self.commit_rounds == 0 {
            0.0
        } else {
            self.rounds_in_flight_sum as f64 / self.commit_rounds as f64
        }
    }
    /// The counters of two files together (a run over several files):
    /// each count summed, `max_commit_group` and `peak_buffered_bytes`
    /// the larger of the two.
    pub fn combined(&self, o: &Stats) -> Stats {
        Stats {
            pages_dirtied: self.pages_dirtied + o.pages_dirtied,
            pages_written: self.pages_written + o.pages_written,
            runs: self.runs + o.runs,
            write_calls: self.write_calls + o.write_calls,
            bytes_written: self.bytes_written + o.bytes_written,
            flushes: self.flushes + o.flushes,
            syncs: self.syncs + o.syncs,
            dsync_writes: self.dsync_writes + o.dsync_writes,
            atomic_writes: self.atomic_writes + o.atomic_writes,
            doublewrite_records: self.doublewrite_records + o.doublewrite_records,
            doublewrite_bytes: self.doublewrite_bytes + o.doublewrite_bytes,
            doublewrite_syncs: self.doublewrite_syncs + o.doublewrite_syncs,
            write_us: self.write_us + o.write_us,
            sync_us: self.sync_us + o.sync_us,
            commits: self.commits + o.commits,
            commit_rounds: self.commit_rounds + o.commit_rounds,
            max_commit_group: self.max_commit_group.max(o.max_commit_group),
            direct_commits: self.direct_commits + o.direct_commits,
            strategy_switches: self.strategy_switches + o.strategy_switches,
            allocating_scoped_commits: self.allocating_scoped_commits + o.allocating_scoped_commits,
            through_commits: self.through_commits + o.through_commits,
            through_writes: self.through_writes + o.through_writes,
            claimed_commits: self.claimed_commits + o.claimed_commits,
            sync_lanes_opened: self.sync_lanes_opened + o.sync_lanes_opened,
            rounds_in_flight_sum: self.rounds_in_flight_sum + o.rounds_in_flight_sum,
            backpressure_waits: self.backpressure_waits + o.backpressure_waits,
            buffer_hits: self.buffer_hits + o.buffer_hits,
            cache_hits: self.cache_hits + o.cache_hits,
            disk_reads: self.disk_reads + o.disk_reads,
            buffered_bytes: self.buffered_bytes + o.buffered_bytes,
            peak_buffered_bytes: self.peak_buffered_bytes.max(o.peak_buffered_bytes),
            grow_extensions: self.grow_extensions + o.grow_extensions,
            grow_records: self.grow_records + o.grow_records,
            grow_zero_bytes: self.grow_zero_bytes + o.grow_zero_bytes,
            grow_errors: self.grow_errors + o.grow_errors,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub pages_dirtied: AtomicU64,
    pub pages_written: AtomicU64,
    pub runs: AtomicU64,
    pub write_calls: AtomicU64,
    pub bytes_written: AtomicU64,
    pub flushes: AtomicU64,
    pub syncs: AtomicU64,
    pub dsync_writes: AtomicU64,
    pub atomic_writes: AtomicU64,
    pub doublewrite_records: AtomicU64,
    pub doublewrite_bytes: AtomicU64,
    pub doublewrite_syncs: AtomicU64,
    pub write_ns: AtomicU64,
    pub sync_ns: AtomicU64,
    pub commits: AtomicU64,
    pub allocating_scoped_commits: AtomicU64,
    pub through_commits: AtomicU64,
    pub through_writes: AtomicU64,
    pub claimed_commits: AtomicU64,
    pub sync_lanes_opened: AtomicU64,
    pub commit_rounds: AtomicU64,
    pub max_commit_group: AtomicU64,
    pub rounds_in_flight_sum: AtomicU64,
    pub backpressure_waits: AtomicU64,
    pub buffer_hits: AtomicU64,
    pub cache_hits: AtomicU64,
    pub disk_reads: AtomicU64,
    pub peak_buffered_bytes: AtomicU64,
    pub grow_extensions: AtomicU64,
    pub grow_records: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self, buffered_bytes: u64) -> Stats {
        Stats {
            pages_dirtied: self.pages_dirtied.load(Relaxed),
            pages_written: self.pages_written.load(Relaxed),
            runs: self.runs.load(Relaxed),
            write_calls: self.write_calls.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            syncs: self.syncs.load(Relaxed),
            dsync_writes: self.dsync_writes.load(Relaxed),
            atomic_writes: self.atomic_writes.load(Relaxed),
            doublewrite_records: self.doublewrite_records.load(Relaxed),
            doublewrite_bytes: self.doublewrite_bytes.load(Relaxed),
            doublewrite_syncs: self.doublewrite_syncs.load(Relaxed),
            write_us: self.write_ns.load(Relaxed) / 1000,
            sync_us: self.sync_ns.load(Relaxed) / 1000,
            commits: self.commits.load(Relaxed),
            commit_rounds: self.commit_rounds.load(Relaxed),
            max_commit_group: self.max_commit_group.load(Relaxed),
            direct_commits: 0,
            strategy_switches: 0,
            allocating_scoped_commits: self.allocating_scoped_commits.load(Relaxed),
            through_commits: self.through_commits.load(Relaxed),
            through_writes: self.through_writes.load(Relaxed),
            claimed_commits: self.claimed_commits.load(Relaxed),
            sync_lanes_opened: self.sync_lanes_opened.load(Relaxed),
            rounds_in_flight_sum: self.rounds_in_flight_sum.load(Relaxed),
            backpressure_waits: self.backpressure_waits.load(Relaxed),
            buffer_hits: self.buffer_hits.load(Relaxed),
            cache_hits: self.cache_hits.load(Relaxed),
            disk_reads: self.disk_reads.load(Relaxed),
            buffered_bytes,
            peak_buffered_bytes: self.peak_buffered_bytes.load(Relaxed),
            grow_extensions: self.grow_extensions.load(Relaxed),
            grow_records: self.grow_records.load(Relaxed),
            grow_zero_bytes: 0,
            grow_errors: 0,
        }
    }
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

/// Adds the time since `start` to a nanosecond counter.
pub(crate) fn add_elapsed(counter: &AtomicU64, start: std::time::Instant) {
    counter.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_sums_counts_and_keeps_the_larger_peaks() {
        let a = Stats {
            commits: 3,
            grow_zero_bytes: 10,
            max_commit_group: 4,
            peak_buffered_bytes: 100,
            ..Stats::default()
        };
        let b = Stats {
            commits: 5,
            grow_zero_bytes: 1,
            max_commit_group: 2,
            peak_buffered_bytes: 300,
            ..Stats::default()
        };
        let c = a.combined(&b);
        assert_eq!(c.commits, 8);
        assert_eq!(c.grow_zero_bytes, 11);
        assert_eq!(c.max_commit_group, 4);
        assert_eq!(c.peak_buffered_bytes, 300);
        assert_eq!(Stats::default().combined(&a), a);
    }
}
