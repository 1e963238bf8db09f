//! What reached the OS and what an `fdatasync` made durable: the write
//! sequence, the durable watermark, the sync lanes `fdatasync`s run on,
//! and the leaderless commit that waits for an `fdatasync` covering its
//! writes or issues one ([`Durability::sync_to`]).
//!
//! Owns: `write_seq` (bumped after every batch that reached the OS, once
//! its writes completed, and after every change of the file's length),
//! `fsynced` (the `write_seq` the latest successful `fdatasync` of the
//! file covered), `unstaged_at` (its own lock), `syncing` (how many
//! `fdatasync`s are in flight: a hint that picks how a large write is
//! made, never part of a promise), and under one more lock
//! the state of the `fdatasync`s: the free sync lanes, the `write_seq`
//! each one in flight covers, the threads waiting for one,
//! and the first failure. Shared (`Arc`) by the file's components. Calls:
//! the backend's `sync_data_on`; sets the file's poison flag when an
//! `fdatasync` fails.
//!
//! Invariants:
//! - an `fdatasync` covers the `write_seq` read before it began: every
//!   write counted by then has completed (the flush pipeline bumps it only
//!   after a batch's writes returned), so the kernel has those bytes;
//! - `fsynced` moves only on a real `fdatasync` (or a durable write with
//!   everything before it synced), never on a commit the doublewrite area
//!   made durable;
//! - a commit whose writes were counted by `write_seq` up to `target` is
//!   durable once `fsynced >= target`: an `fdatasync` that began after
//!   they completed has returned. After the first failed `fdatasync`,
//!   only targets the watermark covered before it count as durable
//!   ([`Failure::good_upto`]); the ones it covered get its error, later
//!   ones `Poisoned`;
//! - a change no durable doublewrite record holds sets `unstaged_at` with
//!   its `write_seq` step under `unstaged_at`'s lock, and
//!   [`snapshot`](Durability::snapshot) reads both under it, so a reader
//!   sees the step only together with the mark;
//! - a lane's `fdatasync`s never overlap: a lane is taken before and given
//!   back after each. Each lane is its own open file description, so each
//!   sees every writeback error that happened after its previous sync
//!   (Linux reports such an error once per description);
//! - `sync()`'s commits (rounds, direct commits, cuts, checkpoints) use
//!   the round lanes `0..rounds` only (`Config::sync_lanes`); a scoped
//!   commit ([`sync_to_own`](Durability::sync_to_own)) takes a spare lane
//!   (`rounds..`), else a round lane, else opens one more
//!   (`StorageBackend::open_sync_lane`), so the lanes follow the number of
//!   threads committing at once without changing `sync()`'s. A lane
//!   opened late vouches for nothing until every `fdatasync` in flight
//!   when it opened has returned: Linux samples the file's error state at
//!   open, so a new description never reports an error another one saw
//!   before, and the one that saw it may not have recorded it yet;
//! - a waiter is woken when an `fdatasync` that covers it returned (or
//!   failed), or, if none in flight covers it, when a lane comes back for
//!   it to issue its own; no other event wakes it.
//!
//! Lock order: `unstaged_at` and the sync state are leaves; a lane may be waited for with the drain lock held (a
//! doublewrite checkpoint), and a lane holder never waits for the drain
//! lock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Waker;

use super::stats::{Counters, add, add_elapsed};
use crate::backend::StorageBackend;
use crate::error::{Error, Result};
use crate::sync::{AtomicBool, AtomicU64, Mutex, park, thread_waker};

/// The write sequence, the durable watermark and the `fdatasync`s of one
/// file (see the module docs).
pub(crate) struct Durability {
    write_seq: AtomicU64,
    fsynced: AtomicU64,
    /// `fdatasync`s in flight (a hint for choosing a way of writing, read
    /// without the sync state's lock; [`syncing`](Durability::syncing)).
    syncing: AtomicU64,
    /// The `write_seq` of the latest change to the file that no durable
    /// doublewrite record holds (a `set_len`, an extension no staged record
    /// carries). A staged batch's step does not touch it. A commit round
    /// needs no `fdatasync` when this is at or below `fsynced`: every step
    /// since is in the area.
    unstaged_at: Mutex<u64>,
    syncs: Mutex<Syncs>,
    backend: Arc<dyn StorageBackend>,
    counters: Arc<Counters>,
    /// The file's poison flag (the lifecycle's), set when an `fdatasync`
    /// fails.
    poisoned: Arc<AtomicBool>,
}

/// The `fdatasync`s: lanes, the ones in flight, who waits, what failed.
struct Syncs {
    /// Round lanes (`0..rounds`) not in use.
    free: Vec<usize>,
    /// Spare lanes (`rounds..`, scoped commits' only) not in use.
    spare: Vec<usize>,
    /// How many lanes `sync()`'s commits use.
    rounds: usize,
    /// Whether the backend may give one more lane (false once it gave
    /// none, or failed to).
    may_open: bool,
    /// The `fdatasync`s in flight.
    in_flight: Vec<InFlight>,
    /// Numbers the `fdatasync`s.
    next_sync: u64,
    /// Threads that opened a lane, woken when an `fdatasync` returns.
    openers: Vec<Waker>,
    /// Threads waiting, in arrival order.
    waiters: VecDeque<Waiter>,
    /// Numbers the waiters.
    next_waiter: u64,
    /// The first failed `fdatasync`.
    failure: Option<Failure>,
}

/// Which lanes a caller may take; for a lane given back, which kind it is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lanes {
    /// The round lanes (`0..rounds`): `sync()`'s commits. A round lane
    /// given back may go to any waiter.
    Rounds,
    /// Any lane, a spare one first, and one more opened where every lane
    /// is syncing: scoped commits. A spare lane given back may go only to
    /// a waiter that takes any lane.
    Any,
}

impl Lanes {
    /// Whether a waiter that takes `self` may take a lane of kind `lane`.
    fn may_take(self, lane: Lanes) -> bool {
        self == Lanes::Any || lane == Lanes::Rounds
    }
}

/// An `fdatasync` in flight: its number and the `write_seq` it covers.
struct InFlight {
    id: u64,
    covers: u64,
}

/// One waiter: durable once `fsynced >= target` (a target of `u64::MAX`
/// waits for a lane only).
struct Waiter {
    id: u64,
    target: u64,
    /// The lanes it may take.
    takes: Lanes,
    waker: Waker,
}

/// The first failed `fdatasync` of the file.
struct Failure {
    /// `fsynced` when it failed: targets at or below were durable before.
    good_upto: u64,
    /// The `write_seq` the failed `fdatasync` covered: targets up to here
    /// get its error, later ones [`Error::Poisoned`].
    covers: u64,
    error: Error,
}

impl Durability {
    /// Nothing written yet; `lanes` round lanes (at least one) of
    /// `backend`, whose other lanes are spare; `fdatasync`s counted in
    /// `counters`; `poisoned` set when one fails.
    pub(crate) fn new(
        lanes: usize,
        backend: Arc<dyn StorageBackend>,
        counters: Arc<Counters>,
        poisoned: Arc<AtomicBool>,
    ) -> Self {
        let rounds = lanes.max(1);
        let opened = backend.sync_lanes().max(rounds);
        Self {
            write_seq: AtomicU64::new(0),
            fsynced: AtomicU64::new(0),
            syncing: AtomicU64::new(0),
            unstaged_at: Mutex::new(0),
            syncs: Mutex::new(Syncs {
                free: (0..rounds).rev().collect(),
                spare: (rounds..opened).rev().collect(),
                rounds,
                may_open: true,
                in_flight: Vec::with_capacity(opened),
                next_sync: 0,
                openers: Vec::new(),
                waiters: VecDeque::new(),
                next_waiter: 0,
                failure: None,
            }),
            backend,
            counters,
            poisoned,
        }
    }

    /// The write sequence now.
    #[inline]
    pub(crate) fn write_seq(&self) -> u64 {
        self.write_seq.load(Ordering::Acquire)
    }

    /// Whether an `fdatasync` of the file is in flight now: other threads
    /// are committing. A hint only (it may change at once after).
    #[inline]
    pub(crate) fn syncing(&self) -> bool {
        self.syncing.load(Ordering::Relaxed) > 0
    }

    /// Counts a batch that reached the OS (its writes completed), or a
    /// change of length a durable doublewrite record carries. Returns the
    /// new `write_seq`.
    #[inline]
    pub(crate) fn step(&self) -> u64 {
        self.write_seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Counts a change no durable doublewrite record holds (a `set_len`,
    /// an extension without a record): the next commit round must
    /// `fdatasync` the file. The step and the mark are made under one
    /// lock (see the module docs). Returns the step: an `fdatasync` that
    /// covers it ([`fsynced`](Self::fsynced) at or past it) made the
    /// change durable.
    pub(crate) fn step_unstaged(&self) -> u64 {
        let mut u = self.unstaged_at.lock();
        *u = self.write_seq.fetch_add(1, Ordering::AcqRel) + 1;
        *u
    }

    /// `write_seq` and `unstaged_at`, read together.
    pub(crate) fn snapshot(&self) -> (u64, u64) {
        let u = self.unstaged_at.lock();
        (self.write_seq.load(Ordering::Acquire), *u)
    }

    /// The `write_seq` the latest successful `fdatasync` covered.
    #[inline]
    pub(crate) fn fsynced(&self) -> u64 {
        self.fsynced.load(Ordering::Acquire)
    }

    /// Records a durable write with everything before it synced (a group
    /// commit round's `RWF_DSYNC` write), which covered `write_seq` up to
    /// `covers`, and wakes the waiters it covers.
    pub(crate) fn note_fsynced(&self, covers: u64) {
        let mut st = self.syncs.lock();
        self.fsynced.fetch_max(covers, Ordering::AcqRel);
        self.wake_covered(&mut st);
    }

    /// Takes a free round lane, waiting while every one is syncing.
    pub(crate) fn take_lane(&self) -> usize {
        let mut id = None;
        loop {
            let mut st = self.syncs.lock();
            if let Some(i) = id.take() {
                st.forget(i);
            }
            if let Some(lane) = st.free.pop() {
                st.pass_on();
                return lane;
            }
            id = Some(st.wait_for(u64::MAX, Lanes::Rounds));
            drop(st);
            park();
        }
    }

    /// Gives a lane back and wakes a waiter that needs one and may take
    /// it (no `fdatasync` in flight covers it).
    pub(crate) fn put_lane(&self, lane: usize) {
        let mut st = self.syncs.lock();
        let kind = if lane >= st.rounds {
            st.spare.push(lane);
            Lanes::Any
        } else {
            st.free.push(lane);
            Lanes::Rounds
        };
        st.wake_one_for_a_lane(kind);
    }

    /// `fdatasync` of the file on `lane` (taken with
    /// [`take_lane`](Self::take_lane)). Every write counted in `write_seq`
    /// when it starts has completed, so it covers that much, which it
    /// returns and records; the waiters it covers are woken. Counted in
    /// `syncs` and `sync_ns`.
    ///
    /// Errors: the `fdatasync`'s (`Error::Io`, op "fdatasync"); the file
    /// is poisoned, the failure recorded (see the module docs) and every
    /// waiter woken to see it. `Error::Poisoned` if it succeeded after
    /// another failed.
    pub(crate) fn fdatasync_on(&self, lane: usize) -> Result<u64> {
        let (id, covers) = {
            let mut st = self.syncs.lock();
            let covers = self.write_seq();
            st.next_sync += 1;
            let id = st.next_sync;
            st.in_flight.push(InFlight { id, covers });
            self.syncing.fetch_add(1, Ordering::Relaxed);
            (id, covers)
        };
        add(&self.counters.syncs, 1);
        let started = std::time::Instant::now();
        let synced = self.backend.sync_data_on(lane);
        add_elapsed(&self.counters.sync_ns, started);
        let mut st = self.syncs.lock();
        if let Some(i) = st.in_flight.iter().position(|s| s.id == id) {
            st.in_flight.swap_remove(i);
        }
        self.syncing.fetch_sub(1, Ordering::Relaxed);
        for opener in st.openers.drain(..) {
            opener.wake();
        }
        match synced {
            // An `fdatasync` failed before this one returned: the kernel
            // reports a write-back error once per open file description,
            // so this success does not vouch for the pages that one lost.
            Ok(()) if st.failure.is_some() => Err(Error::Poisoned),
            Ok(()) => {
                self.fsynced.fetch_max(covers, Ordering::AcqRel);
                self.wake_covered(&mut st);
                Ok(covers)
            }
            Err(e) => {
                let error = Error::io("fdatasync", None, e);
                self.poisoned.store(true, Ordering::Release);
                if st.failure.is_none() {
                    st.failure = Some(Failure {
                        good_upto: self.fsynced(),
                        covers,
                        error: error.clone(),
                    });
                }
                st.wake_all();
                drop(st);
                Err(error)
            }
        }
    }

    /// `fdatasync` of the file on a free lane, outside a commit round
    /// (a doublewrite checkpoint, a cut, a close). Returns the
    /// `write_seq` it covered.
    ///
    /// Errors: as [`fdatasync_on`](Self::fdatasync_on); `Error::Poisoned`
    /// without a call if an `fdatasync` failed already (a later one would
    /// make sizes set since durable over the writes that one lost).
    pub(crate) fn sync_file(&self) -> Result<u64> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        let lane = self.take_lane();
        let synced = self.fdatasync_on(lane);
        self.put_lane(lane);
        synced
    }

    /// The leaderless commit: returns once writes counted by `write_seq`
    /// up to `target` are durable. If an `fdatasync` that covers `target`
    /// is in flight, waits for it (woken when it returns); else, with a
    /// free lane, issues one from this thread; else waits for a lane (or
    /// for an `fdatasync` issued meanwhile that covers it). No leader, no
    /// hand-off: concurrent committers issue their own `fdatasync`s, which
    /// the kernel merges into its cache flushes.
    ///
    /// On the round lanes only: `sync()`'s commits.
    ///
    /// Errors: as [`resolution`](Self::resolution) says.
    pub(crate) fn sync_to(&self, target: u64) -> Result<()> {
        self.wait_or_sync(target, Lanes::Rounds)
    }

    /// [`sync_to`](Self::sync_to) for a scoped commit: on a spare lane,
    /// else a round lane, else one more lane the backend opens, so a
    /// thread committing its own writes waits for a lane only where the
    /// backend has no more to give.
    ///
    /// Errors: as [`resolution`](Self::resolution) says.
    pub(crate) fn sync_to_own(&self, target: u64) -> Result<()> {
        self.wait_or_sync(target, Lanes::Any)
    }

    fn wait_or_sync(&self, target: u64, takes: Lanes) -> Result<()> {
        let mut id = None;
        loop {
            let mut st = self.syncs.lock();
            if let Some(i) = id.take() {
                st.forget(i);
            }
            if let Some(done) = self.resolution(&st, target) {
                return done;
            }
            let covered = st.in_flight.iter().any(|s| s.covers >= target);
            if !covered {
                let lane = match takes {
                    Lanes::Any => st.spare.pop().or_else(|| st.free.pop()),
                    Lanes::Rounds => st.free.pop(),
                };
                if let Some(lane) = lane {
                    st.pass_on();
                    drop(st);
                    self.sync_on(lane);
                    continue;
                }
                if takes == Lanes::Any && st.may_open {
                    drop(st);
                    // Every lane is syncing: one more, if the backend
                    // gives it (if not, none is asked for again and this
                    // waits for a lane).
                    if let Some(lane) = self.open_lane() {
                        self.sync_on(lane);
                    }
                    continue;
                }
            }
            id = Some(st.wait_for(target, takes));
            drop(st);
            park();
        }
    }

    /// One more lane from the backend, counted in `sync_lanes_opened`;
    /// `None`, and none asked for again, where it gives none.
    ///
    /// The new description reports no writeback error another description
    /// saw before it opened (Linux samples the file's error state at open),
    /// so its `fdatasync`s vouch for nothing until every `fdatasync` in
    /// flight when it opened has returned: one of them may have seen an
    /// error not yet recorded here. This waits for them (once per lane).
    fn open_lane(&self) -> Option<usize> {
        match self.backend.open_sync_lane() {
            Ok(Some(lane)) => {
                add(&self.counters.sync_lanes_opened, 1);
                let mut st = self.syncs.lock();
                let before: Vec<u64> = st.in_flight.iter().map(|s| s.id).collect();
                while st.in_flight.iter().any(|s| before.contains(&s.id)) {
                    st.openers.push(thread_waker());
                    drop(st);
                    park();
                    st = self.syncs.lock();
                }
                Some(lane)
            }
            Ok(None) | Err(_) => {
                self.syncs.lock().may_open = false;
                None
            }
        }
    }

    /// `fdatasync` on `lane`, given back after. Ok or not, the caller's
    /// next look resolves its commit (a failure as the failure says: its
    /// error, or an earlier success).
    fn sync_on(&self, lane: usize) {
        let _ = self.fdatasync_on(lane);
        self.put_lane(lane);
    }

    /// What a commit waiting for `target` gets now: `Ok` once the
    /// watermark covers it; after the first failed `fdatasync`, `Ok` for
    /// targets durable before it, its error for those it covered and
    /// [`Error::Poisoned`] for later ones (also once the file is poisoned
    /// otherwise); `None` while it must still wait.
    fn resolution(&self, st: &Syncs, target: u64) -> Option<Result<()>> {
        if let Some(f) = &st.failure {
            return Some(if target <= f.good_upto {
                Ok(())
            } else if target <= f.covers {
                Err(f.error.clone())
            } else {
                Err(Error::Poisoned)
            });
        }
        if self.fsynced() >= target {
            return Some(Ok(()));
        }
        if self.poisoned.load(Ordering::Acquire) {
            return Some(Err(Error::Poisoned));
        }
        None
    }

    /// Wakes the waiters the watermark now covers.
    fn wake_covered(&self, st: &mut Syncs) {
        let fsynced = self.fsynced();
        st.waiters.retain(|w| {
            let covered = w.target <= fsynced;
            if covered {
                w.waker.wake_by_ref();
            }
            !covered
        });
    }
}

impl Syncs {
    /// Registers the calling thread as a waiter for `target` (it takes a
    /// lane of a kind it `takes` that comes back, if it still needs one).
    fn wait_for(&mut self, target: u64, takes: Lanes) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.waiters.push_back(Waiter {
            id,
            target,
            takes,
            waker: thread_waker(),
        });
        id
    }

    fn forget(&mut self, id: u64) {
        if let Some(i) = self.waiters.iter().position(|w| w.id == id) {
            self.waiters.remove(i);
        }
    }

    /// Wakes the first waiter that no `fdatasync` in flight covers and
    /// that may take the lane of kind `lane` that came back (a spare one,
    /// `Lanes::Any`, is a scoped commit's only).
    fn wake_one_for_a_lane(&mut self, lane: Lanes) {
        let in_flight = &self.in_flight;
        if let Some(i) = self
            .waiters
            .iter()
            .position(|w| w.takes.may_take(lane) && !in_flight.iter().any(|s| s.covers >= w.target))
        {
            let w = self.waiters.remove(i).expect("found");
            w.waker.wake();
        }
    }

    /// After a lane was taken: wakes a waiter for each kind of lane still
    /// free. A waiter woken for one lane may have taken another (a scoped
    /// commit prefers a spare one), and the lane it was woken for must not
    /// stay free while a waiter that may take it sleeps.
    fn pass_on(&mut self) {
        if self.waiters.is_empty() {
            return;
        }
        if !self.free.is_empty() {
            self.wake_one_for_a_lane(Lanes::Rounds);
        }
        if !self.spare.is_empty() {
            self.wake_one_for_a_lane(Lanes::Any);
        }
    }

    fn wake_all(&mut self) {
        for w in self.waiters.drain(..) {
            w.waker.wake();
        }
    }
}

#[cfg(all(test, feature = "testing", not(feature = "shuttle")))]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;
    use crate::testing::FaultyBackend;

    fn durability(be: &Arc<FaultyBackend<MemoryBackend>>) -> Durability {
        Durability::new(
            2,
            Arc::clone(be) as Arc<dyn StorageBackend>,
            Arc::new(Counters::default()),
            Arc::new(AtomicBool::new(false)),
        )
    }

    /// One description reports a write-back error once: an `fdatasync`
    /// that succeeds after another failed proves nothing about the pages
    /// that one lost, so it is not a success.
    #[test]
    fn an_fdatasync_after_a_failed_one_is_not_a_success() {
        let be = Arc::new(FaultyBackend::new(MemoryBackend::new()));
        let d = durability(&be);
        d.step(); // A write the first fdatasync covers.
        be.schedule_syncs([Some(libc::EIO)]);
        assert!(matches!(
            d.fdatasync_on(0),
            Err(Error::Io {
                op: "fdatasync",
                ..
            })
        ));
        assert!(matches!(d.fdatasync_on(1), Err(Error::Poisoned)));
        assert_eq!(d.fsynced(), 0, "no write is durable past the failure");
        assert!(matches!(d.sync_to(1), Err(Error::Io { .. })));
        // A sync outside a commit does not reach the file at all.
        let calls = be.sync_calls();
        assert!(matches!(d.sync_file(), Err(Error::Poisoned)));
        assert_eq!(be.sync_calls(), calls);
    }
}
