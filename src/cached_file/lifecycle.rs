//! The file's life: which calls it takes (open, read-only, closed,
//! poisoned), the write calls in progress, and the close that waits for
//! them.
//!
//! Owns: the flags, the count of write calls in progress (live guards
//! included), and the close handshake (`closer`, taken first of all locks
//! and held through a `close`; `close_wait`, a leaf, with `close_done`).
//!
//! The handshake: a write call counts itself, then looks at `closing`; a
//! close sets `closing`, then waits for the count to drain (both
//! `SeqCst`, so one sees the other). Write calls that start while a close
//! runs wait for its outcome: a refused or failed close leaves the file
//! open, and no thread may have been told otherwise.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, MutexGuard};

/// Whether a file takes writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Access {
    #[default]
    ReadWrite,
    /// Every write, `set_len`, `discard` is refused ([`Error::ReadOnly`](crate::Error::ReadOnly)).
    ReadOnly,
}

/// Whether the open took the file's advisory lock (released at `close`
/// and drop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LockHeld {
    #[default]
    No,
    Yes,
}

/// Flags and the close handshake of one open file (see the module docs).
pub(crate) struct Lifecycle {
    /// An `fdatasync` failed (set by the durability component): every later
    /// write and commit is refused (`Error::Poisoned`).
    poisoned: Arc<AtomicBool>,
    closed: AtomicBool,
    read_only: bool,
    /// This file took the advisory lock at open, and releases it at
    /// `close` or drop.
    locked: bool,
    /// Write calls in progress plus live guards; `close` refuses while a
    /// guard lives and waits for the calls.
    writers: AtomicUsize,
    /// A `close` is between refusing new write calls and its outcome (set
    /// and cleared under `close_wait`; `close_done` notified then).
    closing: AtomicBool,
    close_wait: Mutex<()>,
    close_done: Condvar,
    /// One `close` at a time.
    closer: Mutex<()>,
}

impl Lifecycle {
    /// An open file, `read_only` or not, holding its advisory lock if
    /// `locked`.
    pub(crate) fn new(access: Access, lock: LockHeld) -> Self {
        Self {
            poisoned: Arc::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            read_only: access == Access::ReadOnly,
            locked: lock == LockHeld::Yes,
            writers: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            close_wait: Mutex::new(()),
            close_done: Condvar::new(),
            closer: Mutex::new(()),
        }
    }

    #[inline]
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether the open took the advisory lock.
    pub(crate) fn is_locked(&self) -> bool {
        self.locked
    }

    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// [`Error::Closed`] once the file is closed (reads take this check).
    #[inline]
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// The poison flag, for the component that sets it (a failed
    /// `fdatasync` is durability's to see).
    pub(crate) fn poison_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.poisoned)
    }

    #[inline]
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// [`Error::Closed`], [`Error::Poisoned`] or [`Error::ReadOnly`] for a
    /// file that takes no writes.
    #[inline]
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Counts a write call in progress (see `close`), then checks that the
    /// file takes writes. The count is dropped with the token. While a
    /// close runs, waits for its outcome uncounted.
    #[inline]
    pub(crate) fn begin_write(&self) -> Result<WriterToken<'_>> {
        loop {
            // SeqCst pairs with `close`: it sets `closing` then reads
            // `writers`, a writer adds to `writers` then reads `closing`;
            // one sees the other.
            self.writers.fetch_add(1, Ordering::SeqCst);
            let token = WriterToken(&self.writers);
            if !self.closing.load(Ordering::SeqCst) {
                self.check_writable()?;
                return Ok(token);
            }
            drop(token);
            let mut g = self.close_wait.lock();
            while self.closing.load(Ordering::SeqCst) {
                self.close_done.wait(&mut g);
            }
        }
    }

    /// Ends a write call whose token was kept past its call (a guard's,
    /// with [`WriterToken::keep`]).
    #[inline]
    pub(crate) fn end_kept_write(&self) {
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Starts a close: one at a time, refused on a closed or poisoned
    /// file. From here new write calls wait for the outcome; the close
    /// waits for [`Closing::writers`] to reach 0. Dropping the returned
    /// value without [`Closing::finish`] leaves the file open.
    ///
    /// Errors: [`Error::Closed`], [`Error::Poisoned`].
    pub(crate) fn begin_close(&self) -> Result<Closing<'_>> {
        let one = self.closer.lock();
        if self.is_closed() {
            return Err(Error::Closed);
        }
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        self.set_closing(true);
        Ok(Closing {
            life: self,
            _one: one,
        })
    }

    /// Sets `closing`; clearing it wakes the write calls waiting for the
    /// close's outcome.
    fn set_closing(&self, on: bool) {
        let _g = self.close_wait.lock();
        self.closing.store(on, Ordering::SeqCst);
        if !on {
            self.close_done.notify_all();
        }
    }
}

/// A close in progress ([`Lifecycle::begin_close`]).
pub(crate) struct Closing<'a> {
    life: &'a Lifecycle,
    _one: MutexGuard<'a, ()>,
}

impl Closing<'_> {
    /// Write calls in progress plus live guards.
    pub(crate) fn writers(&self) -> usize {
        self.life.writers.load(Ordering::SeqCst)
    }

    /// The close succeeded: every call but `stats` returns `Closed` from
    /// now on; the write calls that waited learn it.
    pub(crate) fn finish(self) {
        self.life.closed.store(true, Ordering::SeqCst);
    }
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.life.set_closing(false);
    }
}

/// A write call in progress, counted in `Lifecycle::writers`.
pub(crate) struct WriterToken<'a>(&'a AtomicUsize);

impl WriterToken<'_> {
    /// Keeps the count past the call (a guard holds it until it drops,
    /// then calls [`Lifecycle::end_kept_write`]).
    #[inline]
    pub(crate) fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for WriterToken<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
