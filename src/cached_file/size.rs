//! The file's size: the methods of [`FileSize`] (the state under the
//! drain lock) for the changes a flush makes (`ftruncate` to the logical
//! length, `fallocate` of runs past the end, the cut of a tail past an
//! unaligned length, the cut back after a failed write), and those outside
//! one: `set_len`, grow-ahead's room, the window dropped at `close`,
//! `refresh`.
//!
//! Owns: nothing (a method that changes the size takes `&mut FileSize`,
//! which only the drain lock's guard hands out). Calls: the backend,
//! grow-ahead's `Window` and `Filler`, the write buffer, the read cache,
//! lengths, the doublewrite area and the watermark (a change of length is
//! a `write_seq` step the next `fdatasync` must cover). Invariant: sizes
//! change only under the drain lock, before the writes they precede; a
//! cut only once every older generation has written.

use super::batch::{Batch, Settled};
use super::config::add;
use super::flush::{FileSize, FlushPipeline, LengthRecord, Staging};
use super::generations::Generations;
use super::grow::Window;
use super::read::Parts;
use super::write::WriteSlot;
use crate::error::{Error, Result};

/// Largest hole between two runs past the end of an `O_DIRECT` file that
/// one `fallocate` covers (bytes): 64 KiB, so sparse files stay sparse.
pub(crate) const PREALLOC_MAX_GAP: u64 = 64 << 10;

impl FileSize {
    /// The file's length as the OS will hold it once every drained write
    /// completed.
    pub(crate) fn os_len(&self) -> u64 {
        self.os_len
    }

    /// Grow-ahead's trailer, if configured.
    pub(crate) fn window(&mut self) -> Option<&mut Window> {
        self.window.as_mut()
    }

    /// Whether a grow-ahead window is in place (the size is its end).
    pub(crate) fn in_window(&self) -> bool {
        self.window.as_ref().is_some_and(Window::active)
    }

    /// An extension moved the file's end to `end` (its trailer's).
    pub(crate) fn window_moved(&mut self, end: u64) {
        self.os_len = self.os_len.max(end);
    }

    /// A batch just drained ends at `end`.
    pub(crate) fn expect_end(&mut self, end: u64) {
        self.os_len = self.os_len.max(end);
    }

    /// Extends the file to `len` bytes (the length read before the drain)
    /// where its writes leave it shorter (pages discarded at the end, a
    /// partial last page): length is data. Returns whether it extended;
    /// with [`Staging::Yes`] the caller stages a record carrying `len`.
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

    /// A page straddling an unaligned logical length was written whole:
    /// cut the file back to the length (with every older generation
    /// written). Returns whether it cut. The cut is one readers see
    /// ([`Length::begin_cut`](super::length::Length::begin_cut)), and the
    /// disk length follows it down, an older generation's retire capped by
    /// [`Generations::cut_under`]: it may have written the page whole
    /// after reading an aligned length.
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

    /// After a failed write, with no write in flight: one that failed
    /// partway may have extended the file (mid-page, on a full disk), so
    /// cut it back to the written length (a whole number of pages, which an
    /// `O_DIRECT` open takes again). Best effort.
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

    /// `set_len` growing the file to `len` bytes (`ftruncate`, unless the
    /// window covers it); the step is one only an `fdatasync` covers.
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
        self.os_len = self.os_len.max(len);
        p.length.grow_all(len);
        p.durability.step_unstaged();
        Ok(())
    }

    /// `set_len` cutting the file to `len` bytes, nothing in flight: begins
    /// the cut readers see (the caller ends it) and cuts the file.
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

    /// Cuts a grow-ahead window off at `close`; whether there was one (the
    /// caller makes the size durable).
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

    /// With `O_DIRECT` and the ring, reserves blocks for the runs past the
    /// file's end before writing them (`fallocate` over groups of runs
    /// with gaps of at most [`PREALLOC_MAX_GAP`]): ext4 serializes
    /// extending `O_DIRECT` writes under the inode lock. Runs whose
    /// `fallocate` fails are not written: their entries go to
    /// `batch.failed`, the error into `first` (lowest offset wins).
    pub(crate) fn preallocate(
        &mut self,
        p: &Parts<'_>,
        slot: &mut WriteSlot,
        batch: &mut Batch,
        first: &mut Option<(u64, &'static str, std::io::Error)>,
    ) {
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

impl FlushPipeline {
    /// A flush that drained nothing: the length `len` may still be past the
    /// file's size (or no trailer records it yet). Whether it changed.
    ///
    /// Errors: grow-ahead's (see `make_room`); "ftruncate".
    pub(super) fn extend_without_pages(
        &self,
        p: &Parts<'_>,
        size: &mut FileSize,
        len: u64,
    ) -> Result<bool> {
        self.make_room(p, size, len, len, LengthRecord::Write)?;
        size.extend_to(p, len, Staging::No)
    }

    /// Makes everything written so far durable, outside a commit.
    ///
    /// Errors: the `fdatasync`'s (the file is poisoned; writers waiting
    /// for room are woken to see it).
    pub(crate) fn sync_file(&self, p: &Parts<'_>) -> Result<()> {
        p.durability
            .sync_all()
            .inspect_err(|_| p.buffer.notify_room())
    }

    /// Grow-ahead, before a flush's writes (a no-op without a window): if
    /// data up to `need` or the length `len` would reach the trailer's
    /// page, extends the window ([`Window::extend`], made durable, then the
    /// old slots zeroed); then, with `record`, writes `len` into the next
    /// trailer slot if the newest record holds another length.
    ///
    /// Errors: `Error::Io` with op "grow-ahead trailer" (the extension or
    /// the record could not be written: an extending write is cut back)
    /// or "fdatasync" (the file is poisoned); `Error::Poisoned` after an
    /// extension whose `fdatasync` failed.
    pub(super) fn make_room(
        &self,
        p: &Parts<'_>,
        size: &mut FileSize,
        need: u64,
        len: u64,
        record: LengthRecord,
    ) -> Result<()> {
        let os_len = size.os_len();
        let Some(w) = size.window() else {
            return Ok(());
        };
        let trailer = |e| Error::io("grow-ahead trailer", None, e);
        if w.unconfirmed() {
            // The last extension's `fdatasync` failed: its new end and
            // trailer may not be durable, so a pass on its way writes
            // nothing more (data past the old space, or a record in the new
            // trailer, could leave a crash an old trailer inside the data).
            return Err(Error::Poisoned);
        }
        let grows = if w.active() {
            !w.covers(need.max(len))
        } else {
            // A plain file gets a window once it grows.
            need.max(len) > os_len
        };
        if grows {
            // An old trailer whose zeroing failed goes first: the new
            // trailer's records point back to this window's only, so a
            // crash after the extension could not find it again.
            Self::zero_stale(p, w).map_err(trailer)?;
            // The old trailer zeroed since the last `fdatasync` (this
            // window's predecessor's) durable first, for the same reason:
            // a crash could keep the new trailer and lose that zeroing,
            // and recovery zeros only the trailer the new one names.
            if w.zeroing_unsynced(p.durability.fsynced()) {
                self.sync_file(p)?;
            }
            let old_end = w.end();
            let extended = match w.extend(p.backend, need, len) {
                Ok(x) => x,
                Err(e) => {
                    // The write may have moved the size, and left part of
                    // a trailer past the old end: cut back to it (the old
                    // trailer's, or the plain file's end) and make that
                    // durable, or a later trailer further out could bring
                    // this one back inside the data after a crash.
                    let _ = p
                        .backend
                        .set_len(if old_end > 0 { old_end } else { os_len });
                    p.durability.step_unstaged();
                    self.sync_file(p)?;
                    return Err(trailer(e));
                }
            };
            w.set_unconfirmed();
            let (end, usable, slots_len) = (w.end(), w.usable(), w.slots_len());
            add(&p.counters.grow_extensions, 1);
            p.durability.step_unstaged();
            // Until the old slots are zeroed they lie inside the file's
            // range: reads see zeros over them, as over any page never
            // written (`Length::keep_trailer`).
            let old = extended.old_slots.map(|at| at..at + slots_len);
            if let Some(old) = &old {
                p.length.keep_trailer(old.clone());
            }
            size.window_moved(end);
            // The new end and trailer durable before anything is written
            // below them (see the module docs of `grow.rs`). If that sync
            // fails (the file is poisoned), the old trailer stays: it holds
            // the length the last successful sync made durable.
            self.sync_file(p)?;
            if let Some(w) = size.window() {
                w.confirm();
            }
            if let Some(filler) = &self.filler {
                filler.set_limit(usable);
            }
            if let Some(old) = old
                && let Some(w) = size.window()
            {
                // A failed zeroing is tried again before the next write
                // (`zero_stale`).
                w.zero_old(p.backend, Some(old.start)).map_err(trailer)?;
                p.length.trailer_zeroed(&old);
                w.zeroed(p.durability.step_unstaged());
            }
            return Ok(());
        }
        Self::zero_stale(p, w).map_err(trailer)?;
        if record == LengthRecord::Write && w.record(p.backend, len).map_err(trailer)? {
            add(&p.counters.grow_records, 1);
            p.durability.step_unstaged();
        }
        Ok(())
    }

    /// Zeros the old trailer a failed zeroing left in the data's range, if
    /// any, before anything else is written.
    ///
    /// Errors: the write's (it stays, tried again at the next call).
    fn zero_stale(p: &Parts<'_>, w: &mut Window) -> std::io::Result<()> {
        let Some(at) = w.stale() else {
            return Ok(());
        };
        w.zero_old(p.backend, None)?;
        p.length.trailer_zeroed(&(at..at + w.slots_len()));
        w.zeroed(p.durability.step_unstaged());
        Ok(())
    }

    /// Cuts a grow-ahead window off and makes that durable (`close`).
    ///
    /// Errors: "ftruncate", "fdatasync" (`Error::Io`).
    pub(crate) fn drop_window(&self, p: &Parts<'_>) -> Result<()> {
        let mut size = self.drain.lock();
        if !size.in_window() {
            return Ok(());
        }
        // The file at rest holds no trailer inside its data: the close's
        // commit went through `make_room`, which zeroed any old one.
        debug_assert!(size.window().is_none_or(|w| w.stale().is_none()));
        if let Some(filler) = &self.filler {
            filler.reset(p.length.get());
        }
        size.drop_window(p)?;
        drop(size);
        self.sync_file(p)
    }

    /// `set_len` to `len` bytes (validated by the caller), ordered with
    /// everything buffered (see `PagedCachedFile::set_len`).
    ///
    /// Errors: as `PagedCachedFile::set_len`.
    pub(crate) fn set_len(&self, p: &Parts<'_>, len: u64) -> Result<()> {
        let mut size = self.drain.lock();
        if len >= p.length.get() {
            self.make_room(p, &mut size, len, len, LengthRecord::Write)?;
            return size.grow(p, len);
        }
        // A guard at or past the cut (even past the old end) would write
        // there when dropped.
        p.buffer.check_unguarded(len, u64::MAX - len)?;
        // Memory for the zeroed tail first: past the ftruncate nothing
        // may fail.
        let tail_buf = if len.is_multiple_of(p.config.page_size as u64) {
            None
        } else {
            Some(p.buffer.page_buf()?)
        };
        self.gens.wait_all_settled();
        if let Some(area) = p.torn.area()
            && area.has_failed()
        {
            // The cut empties the area, so a page a failed write may have
            // torn must first be written whole: a flush retries it (its
            // error is this call's, and nothing changed), then the cut
            // starts again (no write is in flight and none can start while
            // the drain lock is held, so the check above is final).
            drop(size);
            self.flush_now(p)?;
            return self.set_len(p, len);
        }
        if let Some(area) = p.torn.area() {
            // A record may hold pages past the cut, which recovery would
            // write back after a later sync made the cut durable: make
            // every page written in place durable, then empty the area.
            self.sync_file(p)?;
            area.clear()
                .map_err(|e| Error::io("doublewrite area: empty", None, e))?;
        }
        // A length buffered past the window (no flush since) may put the cut
        // inside the trailer: move the trailer past it first, so the cut
        // takes all of it. No record of the shorter length: the cut
        // removes the trailer, and a record that failed partway must not
        // make a refused cut come back after a crash.
        self.make_room(p, &mut size, 0, len, LengthRecord::Skip)?;
        if let Some(filler) = &self.filler {
            // No zero may be in flight past the cut (it would grow the
            // file again).
            filler.reset(len);
        }
        size.shrink(p, len)?;
        // Pages wholly past `len` go; the one it falls in keeps its head.
        // The read cache loses the cut pages before any stripe opens again:
        // a write that merges into a page past the cut must not find its
        // old bytes there and bring them back (stripe locks before cache
        // locks, as in `WriteBuffer::merge`). Aligned or not, the first
        // page touched is the one `len` falls in.
        let first_gone = p.buffer.page_no(len);
        p.buffer.cut(len, tail_buf, || {
            p.cache.remove_where(|n| n >= first_gone, p.buffer.pool());
            p.length.cut_to(len);
        });
        p.durability.step_unstaged();
        if self.filler.is_some() {
            // With grow-ahead the next extension may put a trailer below
            // the old end: the cut must be durable first (the drain lock
            // still held), or a crash could bring the old end back with trailer
            // bytes inside the data.
            self.sync_file(p)?;
        }
        Ok(())
    }

    /// A refresh: the length from the OS, the read cache dropped.
    ///
    /// Errors: [`Error::Buffered`] (nothing changed); `Error::Io` with op
    /// "fstat".
    pub(crate) fn refresh(&self, p: &Parts<'_>) -> Result<()> {
        let mut size = self.drain.lock();
        if size.in_window() {
            return Err(Error::InvalidConfig(
                "refresh: a grow-ahead window is in place (the file's size is not its length); \
                 open without one to follow another writer"
                    .into(),
            ));
        }
        if !self.gens.is_empty() {
            return Err(Error::Buffered {
                bytes: p.buffer.buffered(),
            });
        }
        p.buffer.with_nothing_buffered(|| {
            let len = p.backend.len().map_err(|e| Error::io("fstat", None, e))?;
            p.length.begin_cut();
            p.cache.remove_where(|_| true, p.buffer.pool());
            size.reset(len);
            p.length.reset(len);
            p.length.end_cut();
            Ok(())
        })
    }
}
