//! Group commit: many `sync()` callers, one flush and one `fdatasync` per
//! round, rounds pipelined.
//!
//! Each caller takes a ticket under the commit lock; whatever it wrote
//! before that moment is in the write buffer, in flight, or on the OS. A
//! round covers every ticket taken before it started: its drain begins
//! after those tickets, so it writes their pages, and its `fdatasync` starts
//! after every earlier flush's writes completed, so it covers those too.
//!
//! Stages (as in a binlog group commit):
//!
//! 1. **write**: drain, coalesce, write. One round at a time; a round
//!    leaves this stage only when it has a sync lane.
//! 2. **sync**: `fdatasync` on the round's own lane. Up to `sync_lanes`
//!    rounds at once, which lets the file system batch their journal
//!    commits; each lane is its own open file description, so every round
//!    sees every writeback error that happened after its lane's previous
//!    sync (Linux reports such an error once per description).
//! 3. **publish**: in round order. `durable` moves to a round's last ticket
//!    only when every earlier round succeeded; a failed `fdatasync` poisons
//!    the file, and every round published after it fails too.
//!
//! While round N waits in `fdatasync`, round N+1 drains and writes what
//! arrived meanwhile.

use std::collections::VecDeque;
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
    /// Sync lanes not in use.
    free_lanes: Vec<usize>,
    /// Rounds past the write stage, in round order, with their outcome once
    /// their `fdatasync` returned: `Ok(covered write_seq)` or the error.
    syncing: VecDeque<SyncingRound>,
    /// `write_seq` covered by the last published `fdatasync`.
    synced_seq: u64,
    /// The latest failed round: tickets in `(lo, hi]` get its error.
    failure: Option<(u64, u64, Error)>,
}

#[derive(Debug)]
struct SyncingRound {
    lo: u64,
    hi: u64,
    outcome: Option<Result<Option<u64>>>,
}

impl CommitState {
    pub(crate) fn new(lanes: usize) -> Self {
        Self {
            free_lanes: (0..lanes.max(1)).rev().collect(),
            ..Self::default()
        }
    }
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
            self.lead_round(&mut st)?;
        }
    }

    /// Runs one round, as its leader, for every ticket not yet covered.
    /// Returns once the round's outcome is recorded (published or queued
    /// behind an earlier round); a write-stage error is returned directly.
    fn lead_round(&self, st: &mut MutexGuard<'_, CommitState>) -> Result<()> {
        st.writing = true;
        let (lo, hi) = (st.started, st.next_ticket);
        st.started = hi;
        let written = MutexGuard::unlocked(st, || -> Result<(Option<Batch>, u64)> {
            let mut f = self.flusher.lock();
            let batch = self.write_batch(&mut f)?;
            Ok((batch, self.write_seq.load(Ordering::Acquire)))
        });
        let (batch, seq) = match written {
            Ok(w) => w,
            Err(e) => {
                // The unwritten pages are dirty again; a later round retries.
                st.writing = false;
                add(&self.counters.commit_rounds, 1);
                st.failure = Some((lo, hi, e.duplicate()));
                self.commit_done.notify_all();
                return Err(e);
            }
        };
        while st.free_lanes.is_empty() {
            self.commit_done.wait(st);
        }
        let lane = st.free_lanes.pop().expect("checked");
        st.writing = false;
        st.syncing.push_back(SyncingRound {
            lo,
            hi,
            outcome: None,
        });
        // The next round may start writing now.
        self.commit_done.notify_all();
        let needed = seq > st.synced_seq;
        let outcome = MutexGuard::unlocked(st, || self.sync_batch(batch, needed, lane));
        st.free_lanes.push(lane);
        let me = st
            .syncing
            .iter_mut()
            .find(|r| r.hi == hi)
            .expect("round queued above");
        me.outcome = Some(outcome);
        self.publish(st);
        self.commit_done.notify_all();
        Ok(())
    }

    /// Publishes finished rounds in round order.
    fn publish(&self, st: &mut CommitState) {
        while st.syncing.front().is_some_and(|r| r.outcome.is_some()) {
            let round = st.syncing.pop_front().expect("checked");
            add(&self.counters.commit_rounds, 1);
            self.counters
                .max_commit_group
                .fetch_max(round.hi - round.lo, Ordering::Relaxed);
            match round.outcome.expect("checked") {
                // A success after a failed fdatasync proves nothing about
                // the pages that one lost.
                Ok(_) if self.is_poisoned() => {
                    st.failure = Some((round.lo, round.hi, Error::Poisoned))
                }
                Ok(covered) => {
                    st.durable = st.durable.max(round.hi);
                    if let Some(c) = covered {
                        st.synced_seq = st.synced_seq.max(c);
                    }
                }
                Err(e) => st.failure = Some((round.lo, round.hi, e)),
            }
        }
    }

    /// The sync stage: `fdatasync` on `lane` if `needed`, then settle the
    /// round's batch. Returns the `write_seq` the `fdatasync` covered
    /// (`None` if none was issued). On failure the file is poisoned and the
    /// batch's pages go back to the write buffer, where they stay readable.
    fn sync_batch(&self, batch: Option<Batch>, needed: bool, lane: usize) -> Result<Option<u64>> {
        if self.is_poisoned() {
            // An earlier round's fdatasync failed while this one was writing.
            if let Some(b) = batch {
                self.settle_failed(b);
            }
            return Err(Error::Poisoned);
        }
        if !needed {
            if let Some(b) = batch {
                self.settle(b, &[]);
            }
            return Ok(None);
        }
        // Every write counted in `write_seq` by now has completed, so this
        // fdatasync covers it.
        let covers = self.write_seq.load(Ordering::Acquire);
        add(&self.counters.syncs, 1);
        let started = std::time::Instant::now();
        let synced = self.backend.sync_data_on(lane);
        add_elapsed(&self.counters.sync_ns, started);
        match synced {
            Ok(()) => {
                if let Some(b) = batch {
                    self.settle(b, &[]);
                }
                Ok(Some(covers))
            }
            Err(e) => {
                self.poisoned.store(true, Ordering::Release);
                if let Some(b) = batch {
                    self.settle_failed(b);
                }
                Err(Error::io("fdatasync", None, e))
            }
        }
    }
}
