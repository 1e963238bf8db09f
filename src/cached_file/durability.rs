//! What reached the OS and what an `fdatasync` made durable: the write
//! sequence, the durable watermark, the sync lanes `fdatasync`s run on,
//! and the leaderless commit that waits for an `fdatasync` covering its
//! writes or issues one ([`Durability::sync_to`]).
//!
//! Owns: `write_seq` (bumped after every batch that reached the OS, once
//! its writes completed, and after every change of the file's length),
//! `fsynced` (the `write_seq` the latest successful `fdatasync` of the
//! file covered), `unstaged_at` (its own lock), and under one more lock
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
    /// Sync lanes not in use.
    free: Vec<usize>,
    /// The `write_seq` each `fdatasync` in flight covers.
    in_flight: Vec<u64>,
    /// Threads waiting, in arrival order.
    waiters: VecDeque<Waiter>,
    /// Numbers the waiters.
    next_waiter: u64,
    /// The first failed `fdatasync`.
    failure: Option<Failure>,
}

/// One waiter: durable once `fsynced >= target` (a target of `u64::MAX`
/// waits for a lane only).
struct Waiter {
    id: u64,
    target: u64,
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
    /// Nothing written yet; `lanes` sync lanes (at least one) of
    /// `backend`; `fdatasync`s counted in `counters`; `poisoned` set when
    /// one fails.
    pub(crate) fn new(
        lanes: usize,
        backend: Arc<dyn StorageBackend>,
        counters: Arc<Counters>,
        poisoned: Arc<AtomicBool>,
    ) -> Self {
        Self {
            write_seq: AtomicU64::new(0),
            fsynced: AtomicU64::new(0),
            unstaged_at: Mutex::new(0),
            syncs: Mutex::new(Syncs {
                free: (0..lanes.max(1)).rev().collect(),
                in_flight: Vec::with_capacity(lanes.max(1)),
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
    /// lock (see the module docs).
    pub(crate) fn step_unstaged(&self) {
        let mut u = self.unstaged_at.lock();
        *u = self.write_seq.fetch_add(1, Ordering::AcqRel) + 1;
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

    /// Takes a free sync lane, waiting while every lane is syncing.
    pub(crate) fn take_lane(&self) -> usize {
        let mut id = None;
        loop {
            let mut st = self.syncs.lock();
            if let Some(i) = id.take() {
                st.forget(i);
            }
            if let Some(lane) = st.free.pop() {
                return lane;
            }
            id = Some(st.wait_for(u64::MAX));
            drop(st);
            park();
        }
    }

    /// Gives a lane back and wakes a waiter that needs one (no `fdatasync`
    /// in flight covers it).
    pub(crate) fn put_lane(&self, lane: usize) {
        let mut st = self.syncs.lock();
        st.free.push(lane);
        st.wake_one_for_a_lane();
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
        let covers = {
            let mut st = self.syncs.lock();
            let covers = self.write_seq();
            st.in_flight.push(covers);
            covers
        };
        add(&self.counters.syncs, 1);
        let started = std::time::Instant::now();
        let synced = self.backend.sync_data_on(lane);
        add_elapsed(&self.counters.sync_ns, started);
        let mut st = self.syncs.lock();
        if let Some(i) = st.in_flight.iter().position(|&c| c == covers) {
            st.in_flight.swap_remove(i);
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
    /// Errors: as [`resolved`](Self::resolved).
    pub(crate) fn sync_to(&self, target: u64) -> Result<()> {
        let mut id = None;
        loop {
            let mut st = self.syncs.lock();
            if let Some(i) = id.take() {
                st.forget(i);
            }
            if let Some(done) = self.resolution(&st, target) {
                return done;
            }
            let covered = st.in_flight.iter().any(|&c| c >= target);
            if !covered && let Some(lane) = st.free.pop() {
                drop(st);
                // Ok or not, the next look resolves it (a failure as the
                // failure says: its error, or an earlier success).
                let _ = self.fdatasync_on(lane);
                self.put_lane(lane);
                continue;
            }
            id = Some(st.wait_for(target));
            drop(st);
            park();
        }
    }

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
    /// lane that comes back if it still needs one).
    fn wait_for(&mut self, target: u64) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.waiters.push_back(Waiter {
            id,
            target,
            waker: thread_waker(),
        });
        id
    }

    fn forget(&mut self, id: u64) {
        if let Some(i) = self.waiters.iter().position(|w| w.id == id) {
            self.waiters.remove(i);
        }
    }

    /// Wakes the first waiter that no `fdatasync` in flight covers: it
    /// takes the lane that came back.
    fn wake_one_for_a_lane(&mut self) {
        let in_flight = &self.in_flight;
        if let Some(i) = self
            .waiters
            .iter()
            .position(|w| !in_flight.iter().any(|&c| c >= w.target))
        {
            let w = self.waiters.remove(i).expect("found");
            w.waker.wake();
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
