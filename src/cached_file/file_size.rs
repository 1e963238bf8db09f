//! What the holder of the flush pipeline's drain lock owns: the file's
//! size as the OS will hold it once every drained write completed, and
//! every change of that size: the `ftruncate` that extends the file to its
//! logical length, the `fallocate` of runs past the end under `O_DIRECT`,
//! the cut of a tail written past an unaligned length, the cut back after
//! a failed write, and `set_len`'s own.
//!
//! Owns: `os_len` and grow-ahead's trailer, under the drain lock (a method
//! that changes the size takes `&mut FileSize`: only the lock's guard
//! hands one out, so holding it is the proof the lock is held). Calls: the backend (`ftruncate`, `fallocate`), the
//! lengths and the write sequence (a change of length is a `write_seq`
//! step the next `fdatasync` must cover).
//!
//! Invariant: sizes change only with the drain lock held, before the writes
//! they precede; one that must see no write in flight (a cut) is made
//! only when every older generation has written.

use super::batch::{Batch, Settled};
use super::flush_mode::Company;
use super::generations::{DrainHeld, Generations};
use super::grow::Window;
use super::parts::Parts;
use super::slots::WriteSlot;
use crate::error::{Error, Result};

/// Whether a change of length is carried by a doublewrite record the
/// caller stages ([`FileSize::extend_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Staging {
    /// The caller stages a record carrying the new length.
    Yes,
    /// No record: only an `fdatasync` makes the change durable.
    No,
}

/// Whether grow-ahead's room writes the length into the trailer's next
/// slot (`FlushPipeline::make_room`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LengthRecord {
    /// Record the length if the newest record holds another (a flush, a
    /// `set_len` that grows).
    Write,
    /// No record: a cut removes the trailer, and a record that failed
    /// partway must not make a refused cut come back after a crash.
    Skip,
}

/// Largest hole between two runs past the end of an `O_DIRECT` file that
/// one `fallocate` covers (bytes): 64 KiB. Writers filling fresh pages side
/// by side leave such holes for a moment; a page further out gets its own
/// call, so sparse files stay sparse.
pub(crate) const PREALLOC_MAX_GAP: u64 = 64 << 10;

/// The state under the drain lock (see the module docs).
pub(crate) struct FileSize {
    /// The proof that the drain lock is held, lent to the calls that need
    /// it ([`held`](Self::held)).
    held: DrainHeld,
    /// The file's length as the OS will hold it once every write drained so
    /// far completed (grown at each drain by its pages, and by every
    /// `fallocate` and `ftruncate`, all made with the drain lock held): what a
    /// flush compares the logical length with.
    os_len: u64,
    /// Grow-ahead's trailer, with [`GrowAhead::Window`](super::grow::GrowAhead::Window).
    window: Option<Window>,
}

impl FileSize {
    /// The size of a file of `os_len` bytes, with grow-ahead's trailer
    /// state if configured.
    pub(crate) fn new(os_len: u64, window: Option<Window>) -> Self {
        Self {
            held: DrainHeld::for_drain_lock(),
            os_len,
            window,
        }
    }

    /// The proof that the drain lock is held, for as long as this borrow
    /// of the state under it lives.
    #[inline]
    pub(crate) fn held(&self) -> &DrainHeld {
        &self.held
    }

    /// The file's length as the OS will hold it once every drained write
    /// completed.
    pub(crate) fn os_len(&self) -> u64 {
        self.os_len
    }

    /// Grow-ahead's trailer, if configured.
    pub(crate) fn window(&mut self) -> Option<&mut Window> {
        self.window.as_mut()
    }

    /// Whether a grow-ahead window is in place: the file's size on the OS
    /// is its end, not the length, and nothing cuts it to the length.
    pub(crate) fn in_window(&self) -> bool {
        self.window.as_ref().is_some_and(Window::active)
    }

    /// An extension moved the file's end to `end` (its trailer's).
    pub(crate) fn window_moved(&mut self, end: u64) {
        self.os_len = self.os_len.max(end);
    }

    /// The runs of a batch just drained end at `end`: the file will be at
    /// least that long once they are written.
    pub(crate) fn expect_end(&mut self, end: u64) {
        self.os_len = self.os_len.max(end);
    }

    /// Extends the file to `len` bytes (the logical length read before the
    /// flush drained) where its writes will leave it shorter: the pages at
    /// the end were discarded, or `write_all_at` reached past the last page
    /// written. Length is data: what `len()` reports when a `sync` returns
    /// is what is durable. Bumps `write_seq`, so the next `fdatasync`
    /// covers the new length. Returns whether it extended.
    ///
    /// Called before the flush's writes: every write in flight ends at or
    /// below `os_len`, so this only ever grows the file.
    ///
    /// [`Staging::Yes`]: the caller stages a doublewrite record carrying
    /// `len` and makes the `write_seq` step itself once it knows whether
    /// the record is durable (a plain step if it is, else
    /// `Durability::step_unstaged`). Otherwise the step is marked unstaged
    /// here.
    ///
    /// Errors: `Error::Io` with op "ftruncate".
    pub(crate) fn extend_to(&mut self, p: &Parts<'_>, len: u64, staging: Staging) -> Result<bool> {
        if len <= self.os_len {
            return Ok(false);
        }
        p.backend
            .set_len(len)
            .map_err(|e| Error::io("ftruncate", Some(len), e))?;
        self.os_len = len;
        p.length.grow_written(len);
        p.length.grow_disk(len);
        if staging == Staging::No {
            p.durability.step_unstaged();
        }
        Ok(true)
    }

    /// A page straddling an unaligned logical length was written whole, so
    /// the file grew past the length: cut it back (the bytes past it are
    /// zeros in the page, but nothing past the end may be left on disk).
    /// Returns whether it cut. With no other write in flight (every older
    /// generation written).
    ///
    /// The cut is one readers see ([`Length::begin_cut`](super::length::Length::begin_cut)),
    /// and the disk length follows it down: an older generation may have
    /// written the same page whole after reading an aligned length (a
    /// writer grew the length to mid-page during its drain), and its
    /// retire grew the disk length past the cut, or will, capped by
    /// `gens` ([`Generations::cut_under`]). A read of the page from disk
    /// must not meet the file's end.
    ///
    /// Errors: `Error::Io` with op "ftruncate".
    pub(crate) fn cut_tail(
        &mut self,
        p: &Parts<'_>,
        batch: &mut Batch,
        gens: &Generations<Settled>,
    ) -> Result<bool> {
        if self.in_window() {
            // The tail lies in the window, which the trailer's length
            // already leaves out.
            return Ok(false);
        }
        let len = p.length.get();
        let Some(end) = batch.written_end() else {
            return Ok(false);
        };
        if end <= len {
            return Ok(false);
        }
        batch.disk_cap = len;
        p.length.begin_cut();
        if let Err(e) = p.backend.set_len(len) {
            p.length.end_cut();
            return Err(Error::io("ftruncate", Some(len), e));
        }
        gens.cut_under(batch.id, len, || p.length.lower_disk(len));
        p.length.end_cut();
        self.os_len = len;
        p.length.set_written(len);
        Ok(true)
    }

    /// After a failed write, with no write in flight: a write that failed
    /// partway may have extended the file (a short write into a full disk
    /// ends mid-page where blocks are smaller than pages), and nothing past
    /// what completed is data. Cuts the file back to the written length, so
    /// it stays a whole number of pages and an `O_DIRECT` open with the
    /// same options takes it again. The failed pages are back in the write
    /// buffer and are written again whole. Best effort: the write's error
    /// is what the caller reports.
    pub(crate) fn cut_back(&mut self, p: &Parts<'_>) {
        if self.in_window() {
            // Writes into the window never move the file's size.
            return;
        }
        let to = p.length.written();
        if let Ok(len) = p.backend.len()
            && len > to
        {
            let _ = p.backend.set_len(to);
        }
        self.os_len = to;
    }

    /// `set_len` growing the file to `len` bytes: extends it with zeros
    /// now (past a grow-ahead window, with `ftruncate`: a hole, whose
    /// whole pages join the unwritten pages); every length follows, and
    /// the step is one only an `fdatasync` covers.
    ///
    /// Errors: `Error::Io` with op "ftruncate" (nothing changed).
    pub(crate) fn grow(&mut self, p: &Parts<'_>, len: u64) -> Result<()> {
        if self.window.as_ref().is_some_and(|w| w.covers(len)) {
            // Inside the window: the trailer's next record carries it.
            p.length.grow_all(len);
            p.durability.step_unstaged();
            return Ok(());
        }
        p.backend
            .set_len(len)
            .map_err(|e| Error::io("ftruncate", Some(len), e))?;
        if len > self.os_len {
            // The space `ftruncate` added is a hole: a scoped commit there
            // allocates.
            p.unwritten.add(self.os_len..len, p.config.page_size);
        }
        self.os_len = self.os_len.max(len);
        p.length.grow_all(len);
        p.durability.step_unstaged();
        Ok(())
    }

    /// `set_len` cutting the file to `len` bytes, with nothing in flight:
    /// begins the cut readers see ([`Length::begin_cut`](super::length::Length::begin_cut);
    /// the caller ends it once the buffer and the lengths follow) and cuts
    /// the file.
    ///
    /// Errors: `Error::Io` with op "ftruncate" (nothing changed, the cut
    /// ended).
    pub(crate) fn shrink(&mut self, p: &Parts<'_>, len: u64) -> Result<()> {
        // Readers that meet the new end early read again (`read_disk`).
        p.length.begin_cut();
        if let Err(e) = p.backend.set_len(len) {
            p.length.end_cut();
            return Err(Error::io("ftruncate", Some(len), e));
        }
        // The cut took the window and its trailer: a plain file again.
        if let Some(w) = self.window.as_mut() {
            w.clear();
        }
        self.os_len = len;
        p.length.set_written(len);
        Ok(())
    }

    /// The file was found `len` bytes long on the OS (a refresh).
    pub(crate) fn reset(&mut self, len: u64) {
        self.os_len = len;
    }

    /// Cuts a grow-ahead window off (the file's size becomes its length,
    /// the trailer goes): `close`. Returns whether there was one; the
    /// caller makes the new size durable.
    ///
    /// Errors: `Error::Io` with op "ftruncate" (the window stays).
    pub(crate) fn drop_window(&mut self, p: &Parts<'_>) -> Result<bool> {
        if !self.in_window() {
            return Ok(false);
        }
        let len = p.length.get();
        p.backend
            .set_len(len)
            .map_err(|e| Error::io("ftruncate", Some(len), e))?;
        if let Some(w) = self.window.as_mut() {
            w.clear();
        }
        self.os_len = len;
        p.length.set_written(len);
        p.durability.step_unstaged();
        Ok(true)
    }

    /// With `O_DIRECT`, reserves blocks for the runs that write past the
    /// file's end before writing them: `fallocate` mode 0 over each group of
    /// such runs whose gaps are at most [`PREALLOC_MAX_GAP`] bytes, so a far
    /// page allocates its own page, never the gap before it, while pages
    /// that concurrent writers left a few pages apart cost one call.
    /// ext4 serializes `O_DIRECT` writes that extend the file under the
    /// exclusive inode lock, and io_uring then queues them in worker
    /// threads; inside the file, over allocated blocks, they run under the
    /// shared lock, in parallel. So only a flush whose writes are in flight
    /// beside others (`!RunWriter::writes_inline`) preallocates. One
    /// that writes one call at a time gains nothing from it and pays for it:
    /// the blocks `fallocate` reserves are unwritten extents, which each
    /// write then converts, while an extending write allocates written
    /// blocks at once. A backend that cannot preallocate is written as is.
    /// Runs whose `fallocate` fails (`ENOSPC`) are not written: they leave
    /// `slot.runs`, their entries go to `batch.failed` and the error into
    /// `first` (lowest offset wins).
    // Measured without it (scripts/ab-scale.sh, one committer, vectored):
    // 1.09x commits/s with --rewrite 0 --direct on, 1.19x with scale's
    // defaults; level at 8 committers (.project/commit-suite.md).
    pub(crate) fn preallocate(
        &mut self,
        p: &Parts<'_>,
        slot: &mut WriteSlot,
        batch: &mut Batch,
        first: &mut Option<(u64, &'static str, std::io::Error)>,
        company: Company,
    ) {
        if !p.direct || slot.writer.writes_inline(slot.runs.len(), company) {
            return;
        }
        let disk = p.length.disk();
        let Some(start) = slot
            .runs
            .iter()
            .position(|r| r.offset + r.len as u64 > disk)
        else {
            return;
        };
        slot.alloc_failed.clear();
        slot.alloc_failed.resize(slot.runs.len(), false);
        let mut i = start;
        while i < slot.runs.len() {
            // One group: runs i..j, each within PREALLOC_MAX_GAP of the last.
            let from = slot.runs[i].offset;
            let mut to = from + slot.runs[i].len as u64;
            let mut j = i + 1;
            while j < slot.runs.len() && slot.runs[j].offset - to <= PREALLOC_MAX_GAP {
                to = slot.runs[j].offset + slot.runs[j].len as u64;
                j += 1;
            }
            match p.backend.allocate(from, to - from) {
                Ok(()) => {
                    p.length.grow_disk(to);
                    p.length.grow_written(to);
                    self.os_len = self.os_len.max(to);
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::Unsupported
                        || e.raw_os_error() == Some(libc::EOPNOTSUPP) =>
                {
                    return;
                }
                Err(e) => {
                    slot.alloc_failed[i..j].fill(true);
                    for run in &slot.runs[i..j] {
                        batch.failed.push(run.entries());
                    }
                    if first.as_ref().is_none_or(|(at, ..)| from < *at) {
                        *first = Some((from, "fallocate", e));
                    }
                }
            }
            i = j;
        }
        let mut k = 0;
        let failed = &slot.alloc_failed;
        slot.runs.retain(|_| {
            k += 1;
            !failed[k - 1]
        });
    }
}
