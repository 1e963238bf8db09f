//! The file's size changes that are not part of a flush: `set_len` (grow
//! and cut, ordered with every buffered page), grow-ahead's room (the
//! window extended, the trailer's length record), the window dropped at
//! `close`, and `refresh` (the size taken from the OS).
//!
//! Owns: nothing (methods of [`FlushPipeline`], made with its drain lock
//! held: a method that needs it takes `&mut FileSize`, which only the
//! lock's guard hands out). Calls: [`FileSize`] for each change of size,
//! grow-ahead's `Window` and `Filler`, the write buffer (a cut), the read
//! cache and lengths, the doublewrite area (emptied by a cut), the sync
//! lanes (a cut made durable).

use super::file_size::{FileSize, LengthRecord};
use super::flush::FlushPipeline;
use super::grow::Window;
use super::parts::Parts;
use super::stats::add;
use crate::error::{Error, Result};

impl FlushPipeline {
    /// Grow-ahead, under the drain lock, before a flush's writes (a no-op
    /// without a window): if data up to `need` bytes or the length `len`
    /// would reach the trailer's page, extends the window ([`Window::extend`]:
    /// the trailer moves to the new end, an `fdatasync` makes it durable,
    /// then the old slots are zeroed); then, with `record`, writes `len`
    /// into the next trailer slot if the newest record holds another
    /// length, a write the next `fdatasync` must cover (`write_seq`
    /// steps).
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
            // The last extension's `fdatasync` failed (the mark is set only
            // across that sync, under this lock), so the file is poisoned
            // and its new end and trailer may not be durable: a round
            // already on its way writes nothing more. Data past the old
            // space could leave a crash a file longer than the old window
            // with the old trailer inside its data and none at its end; a
            // length record in the new trailer could be the one a crash
            // keeps, and it points back one window only, past an older
            // trailer whose zeroing the failed sync lost.
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
            // below them: zeros or data written into the window before its
            // end is durable could bring a crash back with the file's size
            // at their end and no trailer there (a file system writes back
            // blocks in any order), and the old trailer must stay valid
            // until the new one is. If that sync fails (the file is
            // poisoned), the old trailer stays: it holds the length the
            // last successful sync made durable, which a crash must keep
            // (the new end may not be durable), until a write covers it.
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
    /// any, before anything else is written: no data is written over it
    /// until then, and reads see zeros over it meanwhile.
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

    /// Cuts a grow-ahead window off and makes that durable (`close`): the
    /// file at rest is its length. A no-op without one.
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
    /// everything buffered: growing extends the file with zeros now;
    /// shrinking first waits for the in-flight writes (a round waiting for
    /// its `fdatasync` included), cuts the file, then drops every buffered
    /// and cached page past `len` and zeroes the buffered tail of the page
    /// `len` falls in, so nothing past the new end is written afterwards.
    /// With a doublewrite area a shrink first writes whole any page whose
    /// earlier write failed, then makes the pages written in place durable
    /// and empties the area.
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
            self.flush(p)?;
            return self.set_len(p, len);
        }
        // No write through may land after the `ftruncate` (it would grow
        // the file again): none enters from here, and those in flight end.
        let _no_through = self.through.hold_for_cut();
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

    /// Takes the file's length from the OS and drops the read cache (a
    /// refresh), with nothing buffered or in flight.
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
