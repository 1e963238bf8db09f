//! The file's lengths: what the engine sees ([`Length::get`], the logical
//! length), what the backend holds (the disk length, which reads trust),
//! what completed writes left (the written length, which a failed write is
//! cut back to), and the largest length the file system takes.
//!
//! Owns: three atomics, the shrink sequence and where an old grow-ahead
//! trailer was kept on disk (reads see zeros there); no lock. Calls:
//! nothing.
//! Invariants:
//! - the logical length only grows under a stripe lock of the write buffer
//!   (an insert) or with the drain lock held (`set_len`); it is lowered only
//!   with the drain lock and every stripe lock held, so no page can be left
//!   buffered past it;
//! - the disk length grows as writes complete, `fallocate`s and
//!   `ftruncate`s are made; a cut lowers it inside an odd shrink sequence,
//!   so a read that meets the file's end early can tell a racing cut from
//!   someone else truncating the file ([`read_disk`](Length::read_disk)).
//!
//! The length the OS will hold once every drained write completes
//! (`os_len`) is the flush pipeline's, under its drain lock.

use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::sync::AtomicU64;

/// The lengths of one open file (see the module docs). All in bytes.
pub(crate) struct Length {
    /// Logical length: the larger of the backend's length at open and the
    /// end of every page written since, or what `set_len` set.
    logical: AtomicU64,
    /// What the backend holds (its length at open, grown by every completed
    /// write). Pages past it that are in no buffer read as zeros.
    disk: AtomicU64,
    /// The file's length as completed writes, `fallocate`s and `ftruncate`s
    /// left it (the highest end of each): what a failed write that grew the
    /// file partway is cut back to, once no write is in flight.
    written: AtomicU64,
    /// Odd while `set_len` is cutting the file (from just before its
    /// `ftruncate` until the disk length is lowered); bumped twice per cut.
    shrink_seq: AtomicU64,
    /// Where an old grow-ahead trailer kept on disk inside the file's
    /// range starts (`NONE`: there is none) and ends: its window
    /// extension's `fdatasync` failed, so it stays (it holds the length the
    /// last successful commit made durable), and reads see zeros over it
    /// ([`hide_kept`](Self::hide_kept)) until a write covers it.
    kept_at: AtomicU64,
    kept_end: AtomicU64,
    /// Largest file length the backend holds (its file system's maximum
    /// file size), `u64::MAX` where unknown.
    max: u64,
    /// Page size in bytes (a power of two).
    page_size: u64,
}

/// No kept trailer (`Length::kept_at`).
const NONE: u64 = u64::MAX;

impl Length {
    /// An old grow-ahead trailer at `at` stays on disk inside the file's
    /// range (see `kept_at`): reads see zeros over it from now on.
    pub(crate) fn keep_trailer(&self, at: std::ops::Range<u64>) {
        self.kept_end.store(at.end, Ordering::Release);
        self.kept_at.store(at.start, Ordering::Release);
    }

    /// A write of `len` bytes at `offset` is about to go out: if it covers
    /// part of a kept trailer, reads see what it wrote from now on (the
    /// pages are in flight until it completes, so reads find them there).
    #[inline]
    pub(crate) fn overwriting(&self, offset: u64, len: u64) {
        let at = self.kept_at.load(Ordering::Acquire);
        if at != NONE && offset < self.kept_end.load(Ordering::Acquire) && at < offset + len {
            self.kept_at.store(NONE, Ordering::Release);
        }
    }

    /// Zeros the bytes of `buf`, read from disk at byte `offset`, that lie
    /// over a kept trailer (never-written space, as far as the engine
    /// knows).
    #[inline]
    pub(crate) fn hide_kept(&self, offset: u64, buf: &mut [u8]) {
        let at = self.kept_at.load(Ordering::Acquire);
        if at == NONE {
            return;
        }
        let end = self.kept_end.load(Ordering::Acquire);
        let lo = at.max(offset);
        let hi = end.min(offset + buf.len() as u64);
        if lo < hi {
            buf[(lo - offset) as usize..(hi - offset) as usize].fill(0);
        }
    }

    /// A file of `len` bytes on a backend that holds at most `max`, in pages
    /// of `page_size` bytes.
    pub(crate) fn new(len: u64, max: u64, page_size: usize) -> Self {
        Self {
            logical: AtomicU64::new(len),
            disk: AtomicU64::new(len),
            written: AtomicU64::new(len),
            shrink_seq: AtomicU64::new(0),
            kept_at: AtomicU64::new(NONE),
            kept_end: AtomicU64::new(0),
            max,
            page_size: page_size as u64,
        }
    }

    /// The logical length.
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.logical.load(Ordering::Acquire)
    }

    /// The length reads may reach: the logical length rounded up to a page.
    #[inline]
    pub(crate) fn readable(&self) -> u64 {
        let mask = self.page_size - 1;
        self.get().checked_add(mask).map_or(!mask, |n| n & !mask)
    }

    /// Grows the logical length to `end` (never shrinks it).
    #[inline]
    pub(crate) fn grow(&self, end: u64) {
        self.logical.fetch_max(end, Ordering::AcqRel);
    }

    /// Sets the logical length (a cut, or a refresh from the OS).
    pub(crate) fn set(&self, len: u64) {
        self.logical.store(len, Ordering::Release);
    }

    /// The largest length the file system takes.
    #[inline]
    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// [`Error::FileTooLarge`] for `len` bytes at `offset` ending past
    /// [`max`](Self::max).
    #[inline]
    pub(crate) fn check_max(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.max => Ok(()),
            _ => Err(Error::FileTooLarge {
                offset,
                len,
                max: self.max,
            }),
        }
    }

    /// The disk length.
    #[inline]
    pub(crate) fn disk(&self) -> u64 {
        self.disk.load(Ordering::Acquire)
    }

    /// A write, `fallocate` or `ftruncate` made the backend hold `end`
    /// bytes at least.
    #[inline]
    pub(crate) fn grow_disk(&self, end: u64) {
        self.disk.fetch_max(end, Ordering::AcqRel);
    }

    /// The written length.
    #[inline]
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// A completed write, `fallocate` or `ftruncate` left the file `end`
    /// bytes long at least.
    #[inline]
    pub(crate) fn grow_written(&self, end: u64) {
        self.written.fetch_max(end, Ordering::AcqRel);
    }

    /// The file was cut (or found) at `len` bytes with no write in flight.
    pub(crate) fn set_written(&self, len: u64) {
        self.written.store(len, Ordering::Release);
    }

    /// Grows every length to `len` (a `set_len` that grows the file, made
    /// with the drain lock held).
    pub(crate) fn grow_all(&self, len: u64) {
        self.grow_written(len);
        self.grow(len);
        self.grow_disk(len);
    }

    /// Marks a cut of the file as begun: a read that meets the end early
    /// from now on reads again ([`read_disk`](Self::read_disk)). Every
    /// `begin_cut` is followed by one [`end_cut`](Self::end_cut).
    pub(crate) fn begin_cut(&self) {
        let was = self.shrink_seq.fetch_add(1, Ordering::SeqCst);
        debug_assert!(was & 1 == 0, "cuts do not nest");
    }

    /// Ends the cut [`begin_cut`](Self::begin_cut) began.
    pub(crate) fn end_cut(&self) {
        let was = self.shrink_seq.fetch_add(1, Ordering::SeqCst);
        debug_assert!(was & 1 == 1, "a cut ends once");
    }

    /// Lowers the logical and disk lengths to `len` at the end of a cut
    /// (with every stripe lock held), then ends the cut.
    pub(crate) fn cut_to(&self, len: u64) {
        self.set(len);
        self.disk.fetch_min(len, Ordering::AcqRel);
        self.end_cut();
    }

    /// Sets every length to `len`, as found on the OS (a refresh, inside
    /// a cut so readers read again).
    pub(crate) fn reset(&self, len: u64) {
        self.set_written(len);
        self.disk.store(len, Ordering::Release);
        self.set(len);
    }

    /// Runs `read(disk_len)`, a read of what the backend holds (bytes past
    /// `disk_len` are zeros and not read). A read that meets the end of
    /// the file early while a cut of this file is under way or just ended
    /// (see `shrink_seq`) is run again with the new length, so it reads the
    /// file as it is after the cut: a racing shrink is never an error. Any
    /// other early end (someone else truncated the file) is
    /// `UnexpectedEof`, as `Error::Io` with `op` at `offset`.
    pub(crate) fn read_disk(
        &self,
        op: &'static str,
        offset: u64,
        mut read: impl FnMut(u64) -> std::io::Result<()>,
    ) -> Result<()> {
        loop {
            let seq = self.shrink_seq.load(Ordering::SeqCst);
            let disk_len = self.disk.load(Ordering::SeqCst);
            match read(disk_len) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::UnexpectedEof
                        && (seq & 1 == 1 || self.shrink_seq.load(Ordering::SeqCst) != seq) =>
                {
                    // The cut is under way or just done: read again once
                    // the disk length says where the file ends now.
                    std::thread::yield_now();
                }
                r => return r.map_err(|e| Error::io(op, Some(offset), e)),
            }
        }
    }
}
