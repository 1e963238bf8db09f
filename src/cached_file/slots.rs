//! Write slots: what one flush writes with (its runs, their scratch and
//! the run writer), one per flush writing at once
//! ([`Config::rounds_in_flight`](crate::Config::rounds_in_flight) of them
//! for flushes and group commit rounds; the inline slots of direct
//! commits are made as committers need them, up to
//! [`MAX_DIRECT_WRITERS`](crate::MAX_DIRECT_WRITERS)).
//!
//! Owns: the free slots under one lock and a condvar. Calls: nothing.
//! A flush takes a free slot with the drain lock held (waiting while all are
//! writing) and gives it back when its writes completed, without
//! the drain lock; so the slots bound the flushes writing at once. Lock order:
//! drain lock -> `slots`; nothing is taken under `slots`.

use super::gather::GatherBuf;
use super::generations::DrainHeld;
use super::writer::RunWriter;
use crate::coalesce::Run;
use crate::sync::{Condvar, Mutex};

/// What one flush writes with: its runs and the writer that writes them.
pub(crate) struct WriteSlot {
    pub(crate) runs: Vec<Run>,
    /// Per run: its preallocation failed (reused between flushes).
    pub(crate) alloc_failed: Vec<bool>,
    /// How runs reach the file, resolved at open.
    pub(crate) writer: RunWriter,
    /// With [`TornWrites::Atomic`](crate::TornWrites::Atomic): the copy
    /// buffer of atomic writes, and the runs before they were cut into
    /// atomic pieces (reused).
    pub(crate) atomic: Option<(GatherBuf, Vec<Run>)>,
}

impl WriteSlot {
    /// A slot that writes with `writer`; `atomic_align` (the page
    /// alignment) if it writes atomic pieces.
    pub(crate) fn new(writer: RunWriter, atomic_align: Option<usize>) -> Self {
        Self {
            runs: Vec::new(),
            alloc_failed: Vec::new(),
            writer,
            atomic: atomic_align.map(|a| (GatherBuf::new(a), Vec::new())),
        }
    }
}

/// The free write slots (see the module docs).
pub(crate) struct WriteSlots {
    free: Mutex<Free>,
    slot_free: Condvar,
}

struct Free {
    slots: Vec<WriteSlot>,
    /// Slots made so far (free or in use).
    made: usize,
}

impl WriteSlots {
    pub(crate) fn new(slots: Vec<WriteSlot>) -> Self {
        Self {
            free: Mutex::new(Free {
                made: slots.len(),
                slots,
            }),
            slot_free: Condvar::new(),
        }
    }

    /// Takes a free slot, or makes one with `make` while fewer than `max`
    /// exist (slots of direct commits, one per committer writing at
    /// once), else waits for one.
    pub(crate) fn take_or_make(&self, max: usize, make: impl FnOnce() -> WriteSlot) -> WriteSlot {
        let mut free = self.free.lock();
        loop {
            if let Some(slot) = free.slots.pop() {
                return slot;
            }
            if free.made < max {
                free.made += 1;
                drop(free);
                return make();
            }
            self.slot_free.wait(&mut free);
        }
    }

    /// Takes a free write slot, waiting for one while all are writing.
    /// Called with the drain lock held (slots come back without it).
    pub(crate) fn take(&self, _drain: &DrainHeld) -> WriteSlot {
        let mut free = self.free.lock();
        loop {
            if let Some(slot) = free.slots.pop() {
                return slot;
            }
            self.slot_free.wait(&mut free);
        }
    }

    /// Gives a slot back once its writes completed.
    pub(crate) fn put(&self, slot: WriteSlot) {
        self.free.lock().slots.push(slot);
        self.slot_free.notify_one();
    }
}
