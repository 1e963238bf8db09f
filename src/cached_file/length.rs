//! The file's lengths: logical ([`Length::get`], what the engine sees),
//! disk (what the backend holds, which reads trust), written (what a failed
//! write is cut back to), dense (data held at open) and the largest one.
//!
//! Owns: four atomics, the shrink sequence, and old grow-ahead trailers
//! kept inside the file's range (reads see zeros there). Invariants:
//! - the logical length only grows under a stripe lock of the write buffer
//!   (an insert) or with the drain lock held (`set_len`); it is lowered only
//!   with the drain lock and every stripe lock held, so no page can be left
//!   buffered past it;
//! - the disk length grows as writes complete, `fallocate`s and
//!   `ftruncate`s are made; a cut lowers it inside an odd shrink sequence,
//!   so a read that meets the file's end early can tell a racing cut from
//!   someone else truncating the file ([`read_disk`](Length::read_disk)).

use std::ops::Range;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::sync::{AtomicBool, AtomicU64, Mutex};

/// The lengths of one open file (see the module docs). All in bytes.
pub(crate) struct Length {
    /// Logical length: the larger of the backend's length at open and the
    /// end of every page written since, or what `set_len` set.
    logical: AtomicU64,
    /// What the backend holds (its length at open, grown by every completed
    /// write). Pages past it that are in no buffer read as zeros.
    disk: AtomicU64,
    /// The file's length as completed writes, `fallocate`s and `ftruncate`s
    /// left it: what a failed write that grew the file is cut back to.
    written: AtomicU64,
    /// Odd while `set_len` is cutting the file (from just before its
    /// `ftruncate` until the disk length is lowered); bumped twice per cut.
    shrink_seq: AtomicU64,
    /// Old grow-ahead trailers kept on disk inside the file's range (one
    /// whose extension's `fdatasync` failed, one whose zeroing failed):
    /// reads see zeros over them ([`hide_kept`](Self::hide_kept)) until a
    /// write covers them or they are zeroed.
    kept: Mutex<Vec<Range<u64>>>,
    /// Whether `kept` holds any range: reads look at it only then.
    any_kept: AtomicBool,
    /// Bytes from the start that held written data at open
    /// (`StorageBackend::data_len`; 0 where unknown), lowered by cuts: a
    /// write below it overwrites and allocates nothing.
    dense: AtomicU64,
    /// Largest file length the backend holds (its file system's maximum
    /// file size), `u64::MAX` where unknown.
    max: u64,
    /// Page size in bytes (a power of two).
    page_size: u64,
}

impl Length {
    /// An old grow-ahead trailer's slots at `at` stay on disk inside the
    /// file's range (see `kept`): reads see zeros over them from now on.
    pub(crate) fn keep_trailer(&self, at: Range<u64>) {
        let mut kept = self.kept.lock();
        if !kept.contains(&at) {
            kept.push(at);
        }
        self.any_kept.store(true, Ordering::Release);
    }

    /// The kept trailer at `at` was zeroed on disk: reads need not hide it.
    pub(crate) fn trailer_zeroed(&self, at: &Range<u64>) {
        let mut kept = self.kept.lock();
        kept.retain(|r| r != at);
        self.any_kept.store(!kept.is_empty(), Ordering::Release);
    }

    /// A write of `len` bytes at `offset` is about to go out: the part of
    /// a kept trailer it covers reads as what it wrote from now on (the
    /// pages are in flight until it completes, so reads find them there);
    /// the rest stays hidden.
    #[inline]
    pub(crate) fn overwriting(&self, offset: u64, len: u64) {
        if !self.any_kept.load(Ordering::Acquire) {
            return;
        }
        let end = offset + len;
        let mut kept = self.kept.lock();
        let mut left = Vec::new();
        kept.retain(|r| {
            if end <= r.start || r.end <= offset {
                return true;
            }
            left.extend(
                [r.start..offset, end..r.end]
                    .into_iter()
                    .filter(|x| x.start < x.end),
            );
            false
        });
        kept.extend(left);
        self.any_kept.store(!kept.is_empty(), Ordering::Release);
    }

    /// Zeros the bytes of `buf`, read from disk at byte `offset`, that lie
    /// over a kept trailer (never-written space, as far as the engine
    /// knows).
    #[inline]
    pub(crate) fn hide_kept(&self, offset: u64, buf: &mut [u8]) {
        if !self.any_kept.load(Ordering::Acquire) {
            return;
        }
        let end = offset + buf.len() as u64;
        for r in self.kept.lock().iter() {
            let (lo, hi) = (r.start.max(offset), r.end.min(end));
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize].fill(0);
            }
        }
    }

    /// A file of `len` bytes, data up to `dense`, on a backend that holds
    /// at most `max`, in pages of `page_size` bytes.
    pub(crate) fn new(len: u64, dense: u64, max: u64, page_size: usize) -> Self {
        Self {
            dense: AtomicU64::new(dense.min(len)),
            logical: AtomicU64::new(len),
            disk: AtomicU64::new(len),
            written: AtomicU64::new(len),
            shrink_seq: AtomicU64::new(0),
            kept: Mutex::new(Vec::new()),
            any_kept: AtomicBool::new(false),
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

    /// Bytes from the start known to hold written data (see `dense`).
    #[inline]
    pub(crate) fn dense(&self) -> u64 {
        self.dense.load(Ordering::Acquire)
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

    /// Lowers the disk length to `len` (inside a cut: the file was cut
    /// to `len` bytes and the logical length is at least `len`).
    pub(crate) fn lower_disk(&self, len: u64) {
        debug_assert!(
            self.shrink_seq.load(Ordering::SeqCst) & 1 == 1,
            "inside a cut"
        );
        self.disk.fetch_min(len, Ordering::AcqRel);
    }

    /// Lowers the logical and disk lengths to `len` at the end of a cut
    /// (with every stripe lock held) and forgets kept trailers past it,
    /// then ends the cut.
    pub(crate) fn cut_to(&self, len: u64) {
        self.set(len);
        self.disk.fetch_min(len, Ordering::AcqRel);
        self.dense.fetch_min(len, Ordering::AcqRel);
        if self.any_kept.load(Ordering::Acquire) {
            // Nothing is left on disk past the cut.
            let mut kept = self.kept.lock();
            kept.retain_mut(|r| {
                r.end = r.end.min(len);
                r.start < r.end
            });
            self.any_kept.store(!kept.is_empty(), Ordering::Release);
        }
        self.end_cut();
    }

    /// Sets every length to `len`, as found on the OS (a refresh, inside
    /// a cut so readers read again).
    pub(crate) fn reset(&self, len: u64) {
        self.dense.fetch_min(len, Ordering::AcqRel);
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
                    crate::sync::yield_now();
                }
                r => return r.map_err(|e| Error::io(op, Some(offset), e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(l: &Length, offset: u64, n: usize) -> Vec<u8> {
        let mut buf = vec![7u8; n];
        l.hide_kept(offset, &mut buf);
        buf
    }

    /// A kept trailer of two pages: a write over one of them shows that
    /// page's bytes and keeps the other hidden; a cut forgets what lies
    /// past it.
    #[test]
    fn a_write_over_part_of_a_kept_trailer_uncovers_that_part_only() {
        let l = Length::new(0, 0, u64::MAX, 512);
        assert_eq!(read(&l, 1024, 1024), vec![7; 1024], "nothing kept");
        l.keep_trailer(1024..2048);
        assert_eq!(
            read(&l, 512, 2048),
            [vec![7; 512], vec![0; 1024], vec![7; 512]].concat()
        );
        l.overwriting(1024, 512);
        assert_eq!(read(&l, 1024, 1024), [vec![7; 512], vec![0; 512]].concat());
        l.keep_trailer(1024..2048);
        l.overwriting(1536, 1024);
        assert_eq!(read(&l, 1024, 1024), [vec![0; 512], vec![7; 512]].concat());
        l.overwriting(0, 4096);
        assert_eq!(read(&l, 1024, 1024), vec![7; 1024], "all written");
        l.keep_trailer(1024..3072);
        l.overwriting(1536, 512);
        assert_eq!(
            read(&l, 1024, 2048),
            [vec![0; 512], vec![7; 512], vec![0; 1024]].concat()
        );
        l.begin_cut();
        l.cut_to(2560);
        l.grow_all(4096);
        assert_eq!(
            read(&l, 1024, 2048),
            [vec![0; 512], vec![7; 512], vec![0; 512], vec![7; 512]].concat()
        );
        l.trailer_zeroed(&(1024..1536));
        l.trailer_zeroed(&(2048..2560));
        assert_eq!(read(&l, 0, 4096), vec![7; 4096], "both pieces zeroed");
    }
}
