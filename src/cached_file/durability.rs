//! What reached the OS and what an `fdatasync` made durable: the write
//! sequence, the durable watermark, and the sync lanes `fdatasync`s run on.
//!
//! Owns: `write_seq` (bumped after every batch that reached the OS, once
//! its writes completed, and after every change of the file's length),
//! `fsynced` (the `write_seq` the latest successful `fdatasync` of the
//! file covered), `unstaged_at` (its own lock) and the free sync lanes (a
//! lock and a condvar). Calls: the backend's `sync_data_on`; poisons the
//! file ([`Lifecycle::poison`]) when an `fdatasync` fails.
//!
//! Invariants:
//! - an `fdatasync` covers the `write_seq` read before it began: every
//!   write counted by then has completed (the flush pipeline bumps it only
//!   after a batch's writes returned), so the kernel has those bytes;
//! - `fsynced` moves only on a real `fdatasync` (or a durable write with
//!   everything before it synced), never on a commit the doublewrite area
//!   made durable;
//! - a change no durable doublewrite record holds sets `unstaged_at` with
//!   its `write_seq` step under `unstaged_at`'s lock, and
//!   [`snapshot`](Durability::snapshot) reads both under it, so a reader
//!   sees the step only together with the mark;
//! - a lane's `fdatasync`s never overlap: a lane is taken before and given
//!   back after each. Each lane is its own open file description, so each
//!   sees every writeback error that happened after its previous sync
//!   (Linux reports such an error once per description).
//!
//! Lock order: `unstaged_at` and the lanes' lock are leaves; a lane may be
//! waited for with the drain lock held (a doublewrite checkpoint), and a lane
//! holder never waits for the drain lock.

use std::sync::atomic::Ordering;

use super::lifecycle::Lifecycle;
use super::stats::{Counters, add, add_elapsed};
use crate::backend::StorageBackend;
use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Condvar, Mutex};

/// The write sequence, the durable watermark and the sync lanes of one
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
    /// Sync lanes not in use.
    lanes: Mutex<Vec<usize>>,
    /// Notified when a lane comes back.
    lane_free: Condvar,
}

impl Durability {
    /// Nothing written yet, `lanes` sync lanes (at least one).
    pub(crate) fn new(lanes: usize) -> Self {
        Self {
            write_seq: AtomicU64::new(0),
            fsynced: AtomicU64::new(0),
            unstaged_at: Mutex::new(0),
            lanes: Mutex::new((0..lanes.max(1)).rev().collect()),
            lane_free: Condvar::new(),
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

    /// Records a successful `fdatasync` (or a durable write with
    /// everything before it synced) that covered `write_seq` up to
    /// `covers`.
    #[inline]
    pub(crate) fn note_fsynced(&self, covers: u64) {
        self.fsynced.fetch_max(covers, Ordering::AcqRel);
    }

    /// Takes a free sync lane, waiting while every lane is syncing.
    pub(crate) fn take_lane(&self) -> usize {
        let mut lanes = self.lanes.lock();
        loop {
            if let Some(lane) = lanes.pop() {
                return lane;
            }
            self.lane_free.wait(&mut lanes);
        }
    }

    /// Takes a free lane, unless (or until, while waiting for one) a
    /// completed `fdatasync` covered `write_seq` up to `covers`: `None`.
    pub(crate) fn take_lane_unless_covered(&self, covers: u64) -> Option<usize> {
        let mut lanes = self.lanes.lock();
        loop {
            if self.fsynced() >= covers {
                return None;
            }
            if let Some(lane) = lanes.pop() {
                return Some(lane);
            }
            self.lane_free.wait(&mut lanes);
        }
    }

    /// Gives a lane back.
    pub(crate) fn put_lane(&self, lane: usize) {
        self.lanes.lock().push(lane);
        self.lane_free.notify_all();
    }

    /// `fdatasync` of the file on `lane` (taken with
    /// [`take_lane`](Self::take_lane)). Every write counted in `write_seq`
    /// when it starts has completed, so it covers that much, which it
    /// returns and records. Counted in `syncs` and `sync_ns`.
    ///
    /// Errors: the `fdatasync`'s (`Error::Io`, op "fdatasync"); the file
    /// is poisoned (the caller wakes who must see it).
    pub(crate) fn fdatasync_on(
        &self,
        lane: usize,
        backend: &dyn StorageBackend,
        counters: &Counters,
        life: &Lifecycle,
    ) -> Result<u64> {
        let covers = self.write_seq();
        add(&counters.syncs, 1);
        let started = std::time::Instant::now();
        let synced = backend.sync_data_on(lane);
        add_elapsed(&counters.sync_ns, started);
        match synced {
            Ok(()) => {
                self.note_fsynced(covers);
                Ok(covers)
            }
            Err(e) => {
                life.poison();
                Err(Error::io("fdatasync", None, e))
            }
        }
    }

    /// `fdatasync` of the file on a free lane, outside a commit round
    /// (a doublewrite checkpoint, a cut, a close). Returns the
    /// `write_seq` it covered.
    ///
    /// Errors: as [`fdatasync_on`](Self::fdatasync_on).
    pub(crate) fn sync_file(
        &self,
        backend: &dyn StorageBackend,
        counters: &Counters,
        life: &Lifecycle,
    ) -> Result<u64> {
        let lane = self.take_lane();
        let synced = self.fdatasync_on(lane, backend, counters, life);
        self.put_lane(lane);
        synced
    }
}
