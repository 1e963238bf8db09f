//! Group commit: many `sync()` callers, one flush and one `fdatasync` per
//! round, rounds pipelined.
//!
//! Owns: the commit state (tickets, rounds in flight and their outcomes,
//! failed rounds) under one lock, and the round condvars. Calls: the flush
//! pipeline (a round's leader runs `FlushPipeline::flush_for_commit` and settles
//! its batch), the sync lanes and watermark (`Durability`), the doublewrite
//! area (a published round tells it what was synced), the lifecycle (a
//! failed `fdatasync` poisons). Lock order: the commit lock is taken
//! before any other of the file's locks and released around every call
//! that takes one or does I/O (`MutexGuard::unlocked`); under it only the
//! doublewrite area's leaf lock is taken (at publish).
//!
//! Each caller takes a ticket under the commit lock; whatever it wrote
//! before that moment is in the write buffer, in flight, or on the OS. A
//! round covers every ticket taken before it started: its drain begins
//! after those tickets, so it writes their pages, and its `fdatasync` starts
//! after every write drained before its own completed (`flush_for_commit`), so it
//! covers those too.
//!
//! Stages (as in a binlog group commit):
//!
//! 1. **write**: drain, coalesce, write, and wait for every older write.
//!    Up to `Config::rounds_in_flight` rounds at once (each writes from its
//!    own write slot; a page whose older version is in flight waits for it,
//!    see the module docs of `cached_file`); a round starts beside a
//!    writing one only once as many callers wait as that one covered. A
//!    round leaves this stage only when it has a sync lane.
//! 2. **sync**: `fdatasync` on the round's own lane. Up to `sync_lanes`
//!    rounds at once, which lets the file system batch their journal
//!    commits; each lane is its own open file description, so every round
//!    sees every writeback error that happened after its lane's previous
//!    sync (Linux reports such an error once per description).
//! 3. **publish**: in round order. `durable` moves to a round's last ticket
//!    only when every earlier round succeeded; a failed `fdatasync` poisons
//!    the file, and every round published after it fails too. A round that
//!    failed to write some pages gives exactly its own tickets the error
//!    (once each); a later round's success never reads as theirs.
//!
//! While round N waits in `fdatasync`, round N+1 drains and writes what
//! arrived meanwhile.
//!
//! Wakeups: a caller sleeps on the condvar of the round that covers it
//! (rounds are numbered; `ROUND_SLOTS` condvars, by number modulo their
//! count). A caller whose ticket no started round covers sleeps on the next
//! round's, since whichever round starts next covers it. Publishing round N
//! wakes N's callers; freeing the write stage after round N wakes N+1's,
//! one of which leads it. So a caller is woken for its own round, not for
//! every round published (one condvar for all rounds woke every waiter of
//! every round in flight at each publish). Two rounds in flight with the
//! same number modulo `ROUND_SLOTS` share a condvar: their callers may wake
//! for the other's, and sleep again; every wait rechecks its condition and
//! every notify wakes all, so sharing costs wakeups, never a lost one.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::batch::Batch;
use super::flush::FlushPipeline;
use super::flush_mode::{Company, FlushMode, SlotKind};
use super::parts::Parts;
use super::stats::add;
use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex, MutexGuard};

/// Condvars for the rounds' callers (round number modulo this). Above the
/// rounds usually in flight: one or a few writing, up to `sync_lanes` (4
/// by default) syncing, a few synced but waiting to publish in order.
#[cfg(not(feature = "shuttle"))]
pub(crate) const ROUND_SLOTS: usize = 16;
/// Two in the model check, so its few threads do share condvars between
/// rounds in flight.
#[cfg(feature = "shuttle")]
pub(crate) const ROUND_SLOTS: usize = 2;

#[derive(Debug, Default)]
struct CommitState {
    /// Last ticket handed out.
    next_ticket: u64,
    /// Every ticket at or below this one is durable.
    durable: u64,
    /// Last ticket covered by a round that has started.
    started: u64,
    /// Rounds started; the latest is number `rounds` (the first is 1).
    rounds: u64,
    /// Rounds in the write stage (at most `Config::rounds_in_flight`).
    writing: usize,
    /// Tickets the latest round started covers.
    last_group: u64,
    /// Rounds started and not yet published, in round order (writing,
    /// syncing, or done and waiting for an earlier one), with their outcome
    /// once their `fdatasync` returned.
    syncing: VecDeque<SyncingRound>,
    /// `write_seq` covered by the last published `fdatasync`.
    synced_seq: u64,
    /// The latest failed round: tickets in `(lo, hi]` get its error.
    failures: VecDeque<FailedRound>,
}

/// A published round that failed: tickets in `(lo, hi]` get its error,
/// each exactly once; it is dropped when the last of them has (so a slow
/// waiter never misses its round's error behind a later one).
#[derive(Debug)]
struct FailedRound {
    lo: u64,
    hi: u64,
    error: Error,
    unread: u64,
}

#[derive(Debug)]
struct SyncingRound {
    /// Round number.
    no: u64,
    lo: u64,
    hi: u64,
    outcome: Option<RoundOutcome>,
}

/// What a round did: the `write_seq` its `fdatasync` covered (`None` if it
/// issued none, or it failed), and the error its callers get, if any: a
/// write error (the other pages were still synced) or the `fdatasync`'s.
#[derive(Debug)]
struct RoundOutcome {
    covered: Option<u64>,
    /// Covered by durable doublewrite records, not by an `fdatasync` of
    /// the file (which the area still needs before it starts over).
    by_area: bool,
    error: Option<Error>,
}

impl CommitState {
    /// Number of the unpublished round that covers `ticket` (which a
    /// started round covers).
    fn covering_round(&self, ticket: u64) -> u64 {
        debug_assert!(self.durable < ticket && ticket <= self.started);
        self.syncing
            .iter()
            .find(|r| r.lo < ticket && ticket <= r.hi)
            .map_or(self.rounds, |r| r.no)
    }
}

/// The group commit of one file (see the module docs).
pub(crate) struct GroupCommit {
    state: Mutex<CommitState>,
    /// `sync()` callers wait on the condvar of the round that covers them,
    /// round number modulo [`ROUND_SLOTS`]: its publish wakes them, and
    /// the callers of the next round to start are also woken when the
    /// write stage frees (one of them leads it). Callers of other rounds
    /// sleep on.
    rounds: Box<[Condvar]>,
    /// Most rounds in the write stage at once
    /// ([`Config::rounds_in_flight`](crate::Config::rounds_in_flight)).
    rounds_in_flight: usize,
    /// A round of one commit may be written with `RWF_DSYNC`
    /// ([`Config::commit_dsync`](crate::Config::commit_dsync)).
    commit_dsync: bool,
}

impl GroupCommit {
    pub(crate) fn new(rounds_in_flight: usize, commit_dsync: bool) -> Self {
        Self {
            state: Mutex::new(CommitState::default()),
            rounds: (0..ROUND_SLOTS).map(|_| Condvar::new()).collect(),
            rounds_in_flight,
            commit_dsync,
        }
    }

    /// A durable commit: returns once everything written before the call
    /// (by any thread) is durable, sharing a round (one flush, one
    /// `fdatasync`) with every caller it can.
    ///
    /// Errors: the error of the round that covered this caller (a write
    /// error for its pages, or the `fdatasync`'s), or [`Error::Poisoned`].
    pub(crate) fn join_round(&self, p: &Parts<'_>, flush: &FlushPipeline) -> Result<()> {
        let mut st = self.state.lock();
        st.next_ticket += 1;
        let ticket = st.next_ticket;
        loop {
            // Before `durable`: a later round's success must not hide that
            // this ticket's round failed (every ticket of a failed round
            // reads its error once, so the entry goes).
            if let Some(i) = st
                .failures
                .iter()
                .position(|f| f.lo < ticket && ticket <= f.hi)
            {
                let f = &mut st.failures[i];
                f.unread -= 1;
                let error = f.error.clone();
                if f.unread == 0 {
                    st.failures.remove(i);
                }
                return Err(error);
            }
            if st.durable >= ticket {
                add(&p.counters.commits, 1);
                return Ok(());
            }
            if p.life.is_poisoned() {
                return Err(Error::Poisoned);
            }
            if st.started >= ticket {
                // A round that covers us is under way: wait for it to be
                // published.
                let no = st.covering_round(ticket);
                self.round_slot(no).wait(&mut st);
                continue;
            }
            let waiting = st.next_ticket - st.started;
            if st.writing >= self.rounds_in_flight || (st.writing > 0 && waiting < st.last_group) {
                // Not covered yet, and the write stage is full, or a round
                // is writing and fewer callers wait than it covers: the
                // next round covers us. A round started beside a writing
                // one only once as many callers wait as that one covered,
                // so overlapping never splits the load into more, smaller
                // rounds (each with its own fdatasync) than one round at a
                // time would form. Its callers are woken when a place in
                // the stage frees (one leads) and when it is published;
                // the caller that makes the count leads at once.
                let no = st.rounds + 1;
                self.round_slot(no).wait(&mut st);
                continue;
            }
            self.lead_round(p, flush, &mut st);
        }
    }

    /// Runs one round, as its leader, for every ticket not yet covered.
    /// Returns once the round's outcome is recorded (published or queued
    /// behind an earlier round); the leader reads it like every waiter.
    fn lead_round(
        &self,
        p: &Parts<'_>,
        flush: &FlushPipeline,
        st: &mut MutexGuard<'_, CommitState>,
    ) {
        st.writing += 1;
        st.rounds += 1;
        let no = st.rounds;
        let (lo, hi) = (st.started, st.next_ticket);
        st.started = hi;
        st.last_group = hi - lo;
        // Queued from the start, so a caller finds the round that covers
        // it whichever stage the round is in; published in this order.
        st.syncing.push_back(SyncingRound {
            no,
            lo,
            hi,
            outcome: None,
        });
        add(&p.counters.rounds_in_flight_sum, st.syncing.len() as u64);
        // A durable write (`commit_dsync`) stands in for the fdatasync only
        // if no other round is in flight and every write before it is
        // synced (the flush checks that under the drain lock, where
        // it also finds no other write in flight). Only for a round of one
        // commit: the durable write holds the drain lock through its
        // sync, which a busier pipeline would spend writing the next round.
        //
        // With no other round in flight (`Company::Alone`), a one-run batch has
        // nothing to overlap its write with either: every engine writes it
        // inline.
        let company = if st.syncing.len() == 1 {
            Company::Alone
        } else {
            Company::Rounds
        };
        let dsync_allowed = self.commit_dsync && hi - lo == 1 && company == Company::Alone;
        // What an fdatasync (or a durable write standing in for one)
        // covered: not a round made durable by the doublewrite area, whose
        // pages are not durable in place.
        let synced_before = st.synced_seq.min(p.durability.fsynced());
        // Returns once every write drained before or with this round's
        // completed; the length is made durable with the pages.
        //
        // Pages that failed to write are back in the write buffer; the ones
        // that reached the OS are synced all the same, so one bad page does
        // not keep the others from being durable. The round leaves the
        // write stage only with a sync lane (one comes back when a round's
        // sync ends, before it is published).
        let (pass, lane) = MutexGuard::unlocked(st, || {
            let mode = FlushMode {
                slot: SlotKind::Shared,
                company,
                durable_write_at: dsync_allowed.then_some(synced_before),
            };
            let pass = flush.flush_for_commit(p, mode);
            (pass, p.durability.take_lane())
        });
        st.writing -= 1;
        // The next round may start writing now: one of its waiters (the
        // callers no round covers yet) leads it and covers every other.
        let next = st.rounds + 1;
        self.round_slot(next).notify_all();
        // What is durable already: the last published round's sync, or any
        // `fdatasync` that began after the round's writes completed (a
        // direct commit's, a checkpoint's): the durable watermark.
        let covered = st.synced_seq.max(p.durability.fsynced());
        // Doublewrite: every change since the last fdatasync is in a
        // durable record, so the area makes the round durable.
        let by_area = pass.seq > covered
            && pass.durable_seq.is_none()
            && p.torn.area().is_some()
            && pass.unstaged_at <= p.durability.fsynced();
        let needed = pass.seq > covered && pass.durable_seq.is_none() && !by_area;
        let durable_seq = pass.durable_seq.or(by_area.then_some(pass.seq));
        let write_error = pass.error;
        let batch = pass.batch;
        let synced = MutexGuard::unlocked(st, || {
            let synced = self.sync_batch(p, flush, batch, needed, lane);
            p.durability.put_lane(lane);
            // The round's one durable write covered everything up to it.
            synced.map(|covered| durable_seq.or(covered))
        });
        let outcome = match synced {
            Ok(covered) => RoundOutcome {
                covered,
                by_area,
                error: write_error,
            },
            Err(e) => RoundOutcome {
                covered: None,
                by_area,
                error: Some(e),
            },
        };
        let me = st
            .syncing
            .iter_mut()
            .find(|r| r.no == no)
            .expect("round queued above");
        me.outcome = Some(outcome);
        // Wakes the callers of every round it publishes.
        self.publish(p, st);
    }

    fn round_slot(&self, no: u64) -> &Condvar {
        &self.rounds[(no % ROUND_SLOTS as u64) as usize]
    }

    /// Publishes finished rounds in round order.
    fn publish(&self, p: &Parts<'_>, st: &mut CommitState) {
        while st.syncing.front().is_some_and(|r| r.outcome.is_some()) {
            let round = st.syncing.pop_front().expect("checked");
            self.round_slot(round.no).notify_all();
            add(&p.counters.commit_rounds, 1);
            p.counters
                .max_commit_group
                .fetch_max(round.hi - round.lo, Ordering::Relaxed);
            let outcome = round.outcome.expect("checked");
            if let Some(c) = outcome.covered {
                st.synced_seq = st.synced_seq.max(c);
                if !outcome.by_area {
                    // An fdatasync, or a durable write with everything
                    // before it synced: durable in place up to `c`.
                    p.durability.note_fsynced(c);
                }
            }
            match outcome.error {
                Some(error) => st.failures.push_back(FailedRound {
                    lo: round.lo,
                    hi: round.hi,
                    error,
                    unread: round.hi - round.lo,
                }),
                // A success after a failed fdatasync proves nothing about
                // the pages that one lost.
                None if p.life.is_poisoned() => st.failures.push_back(FailedRound {
                    lo: round.lo,
                    hi: round.hi,
                    error: Error::Poisoned,
                    unread: round.hi - round.lo,
                }),
                None => {
                    debug_assert!(round.hi <= st.next_ticket, "durable past the last ticket");
                    st.durable = st.durable.max(round.hi);
                }
            }
            debug_assert!(st.durable <= st.started && st.started <= st.next_ticket);
        }
    }

    /// The sync stage: `fdatasync` on `lane` if `needed`, then settle the
    /// round's batch. Returns the `write_seq` the `fdatasync` covered
    /// (`None` if none was issued). On failure the file is poisoned and the
    /// batch's pages go back to the write buffer, where they stay readable.
    fn sync_batch(
        &self,
        p: &Parts<'_>,
        flush: &FlushPipeline,
        batch: Option<Batch>,
        needed: bool,
        lane: usize,
    ) -> Result<Option<u64>> {
        if p.life.is_poisoned() {
            // An earlier round's fdatasync failed while this one was writing.
            if let Some(b) = batch {
                flush.settle_failed(p, b);
            }
            return Err(Error::Poisoned);
        }
        if !needed {
            if let Some(b) = batch {
                flush.settle(p, b);
            }
            return Ok(None);
        }
        match p.durability.fdatasync_on(lane) {
            Ok(covers) => {
                if let Some(b) = batch {
                    flush.settle(p, b);
                }
                Ok(Some(covers))
            }
            Err(e) => {
                if let Some(b) = batch {
                    flush.settle_failed(p, b);
                }
                // Writers waiting for room would wait for a settle that
                // frees nothing (the pages went back to the buffer): wake
                // them to see the poison. Found by the shuttle model check.
                p.buffer.notify_room();
                Err(e)
            }
        }
    }
}
