//! Group commit: many `sync()` callers, one flush and one `fdatasync` per
//! round, with rounds pipelined in two stages.
//!
//! Each caller takes a ticket under the commit lock; whatever it wrote
//! before that moment is in the write buffer, in flight, or on the OS. A
//! round covers every ticket taken before it started: its drain begins
//! after those tickets, so it writes their pages, and its `fdatasync`
//! covers what earlier flushes put on the OS.
//!
//! Stages (as in a binlog group commit):
//!
//! 1. **write**: drain, coalesce, write (one round at a time);
//! 2. **sync**: `fdatasync` (one round at a time, in round order).
//!
//! A round leaves the write stage only when it enters the sync stage, so
//! while round N waits in `fdatasync`, round N+1 drains and writes what
//! arrived meanwhile, and its group is larger for it. Because syncs run one
//! at a time on one file description, an error `fdatasync` reports can only
//! be reported to the round that made the call, never lost to a concurrent
//! one (Linux reports a writeback error once per open file description).
//! Rounds publish in order: `durable` only moves forward, and a round after
//! a failed `fdatasync` fails too (the file is poisoned).

use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use super::PagedCachedFile;
use super::flush::Batch;
use super::stats::{add, add_elapsed};
use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub(crate) struct CommitState {
    /// Last ticket handed out.
    next_ticket: u64,
    /// Every ticket at or below this one is durable.
    durable: u64,
    /// Last ticket covered by a round that has started.
    started: u64,
    /// A round holds the write stage.
    writing: bool,
    /// A round holds the sync stage.
    syncing: bool,
    /// `write_seq` covered by the last successful `fdatasync`.
    synced_seq: u64,
    /// The latest failed round: tickets in `(lo, hi]` get its error.
    failure: Option<(u64, u64, Error)>,
}

impl PagedCachedFile {
    pub(super) fn group_commit(&self) -> Result<()> {
        let mut st = self.commit.lock();
        st.next_ticket += 1;
        let ticket = st.next_ticket;
        loop {
            if st.durable >= ticket {
                add(&self.counters.commits, 1);
                return Ok(());
            }
            if let Some((lo, hi, e)) = &st.failure {
                if *lo < ticket && ticket <= *hi {
                    return Err(e.duplicate());
                }
            }
            if self.is_poisoned() {
                return Err(Error::Poisoned);
            }
            if st.writing || st.started >= ticket {
                // A round is writing, or one that covers us is under way.
                self.commit_done.wait(&mut st);
                continue;
            }
            return self.lead_round(st);
        }
    }

    /// Runs one round for every ticket not yet covered, as its leader.
    fn lead_round(&self, mut st: MutexGuard<'_, CommitState>) -> Result<()> {
        st.writing = true;
        let (lo, hi) = (st.started, st.next_ticket);
        st.started = hi;
        let written = MutexGuard::unlocked(&mut st, || -> Result<(Option<Batch>, u64)> {
            let mut f = self.flusher.lock();
            let batch = self.write_batch(&mut f)?;
            Ok((batch, self.write_seq.load(Ordering::Acquire)))
        });
        let result = match written {
            Err(e) => {
                st.writing = false;
                Err(e)
            }
            Ok((batch, seq)) => {
                while st.syncing {
                    self.commit_done.wait(&mut st);
                }
                st.syncing = true;
                st.writing = false;
                // The next round may start writing now.
                self.commit_done.notify_all();
                let needed = seq > st.synced_seq;
                let synced = MutexGuard::unlocked(&mut st, || self.sync_batch(batch, needed));
                st.syncing = false;
                if let Ok(Some(covered)) = synced {
                    st.synced_seq = st.synced_seq.max(covered);
                }
                synced.map(|_| ())
            }
        };
        add(&self.counters.commit_rounds, 1);
        self.counters
            .max_commit_group
            .fetch_max(hi - lo, Ordering::Relaxed);
        match &result {
            Ok(()) => {
                st.durable = st.durable.max(hi);
                add(&self.counters.commits, 1);
            }
            Err(e) => st.failure = Some((lo, hi, e.duplicate())),
        }
        self.commit_done.notify_all();
        result
    }

    /// The sync stage: `fdatasync` if `needed`, then settle the round's
    /// batch. Returns the `write_seq` the `fdatasync` covered (`None` if
    /// none was issued). On failure the file is poisoned and the batch's
    /// pages go back to the write buffer, where they stay readable.
    fn sync_batch(&self, batch: Option<Batch>, needed: bool) -> Result<Option<u64>> {
        if self.is_poisoned() {
            // An earlier round's fdatasync failed while this one was writing.
            if let Some(b) = batch {
                self.settle(b, Some(0));
            }
            return Err(Error::Poisoned);
        }
        if !needed {
            if let Some(b) = batch {
                self.settle(b, None);
            }
            return Ok(None);
        }
        // Every write counted in `write_seq` by now has completed, so this
        // fdatasync covers it.
        let covers = self.write_seq.load(Ordering::Acquire);
        add(&self.counters.syncs, 1);
        let started = std::time::Instant::now();
        let synced = self.backend.sync_data();
        add_elapsed(&self.counters.sync_ns, started);
        match synced {
            Ok(()) => {
                if let Some(b) = batch {
                    self.settle(b, None);
                }
                Ok(Some(covers))
            }
            Err(e) => {
                self.poisoned.store(true, Ordering::Release);
                if let Some(b) = batch {
                    self.settle(b, Some(0));
                }
                Err(Error::io("fdatasync", None, e))
            }
        }
    }
}
