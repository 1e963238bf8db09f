//! What an engine calls beside whole pages: writes and reads at any offset
//! and length, `discard` of buffered pages, and `set_len`.
//!
//! A partial page is merged under its stripe lock: from the buffered or
//! in-flight version, or the read cache, without I/O; only a page found in
//! none of them is read from disk, outside the lock, and the merge is put in
//! only if the stripe did not change meanwhile (`Stripe::seq`), else it is
//! redone. Two partial writes to one page therefore never lose each other's
//! bytes.

use std::io::IoSliceMut;

use super::PagedCachedFile;
use super::stats::add;
use crate::backend::IOV_MAX;
use crate::buffer::UniqueBuf;
use crate::error::{Error, Result};

impl PagedCachedFile {
    /// Writes all of `buf` at byte `offset`: any offset, any length. Whole
    /// pages are copied into the write buffer; a partial page is merged
    /// with its newest version (buffered, in flight or cached, with no
    /// read; else read once from disk). The logical length grows to
    /// `offset + buf.len()` (rounded up to a page under `O_DIRECT`, where
    /// the file is always a whole number of pages). The bytes reach the OS
    /// at the next flush and are durable after the next successful
    /// [`sync`](Self::sync). An empty `buf` is accepted and does nothing.
    ///
    /// Backpressure applies per page, so a `buf` larger than the write
    /// buffer is fine; if a flush it runs fails, the pages before that point
    /// are buffered and the error returned.
    ///
    /// A page under another thread's live guard is written after the guard
    /// is dropped (the call waits); see [`write`](Self::write).
    ///
    /// A partial page of a file that a racing [`set_len`](Self::set_len)
    /// cuts merges with the bytes before the cut or after it (zeros past
    /// it), never an error.
    ///
    /// Errors: [`Error::Overflow`], [`Error::FileTooLarge`],
    /// [`Error::Closed`], [`Error::Poisoned`], [`Error::ReadOnly`],
    /// [`Error::Busy`] over a page under a guard this thread holds (all
    /// before anything is buffered); `Error::Io` from reading a partial
    /// page, [`Error::NoMemory`], or the error of a backpressure flush.
    pub fn write_all_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let _writer = self.life.begin_write()?;
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len() as u64;
        offset.checked_add(len).ok_or(Error::Overflow {
            offset,
            len: buf.len(),
        })?;
        self.length.check_max(offset, len)?;
        self.buffer.check_not_own_guard(offset, len)?;
        let ps = self.config.page_size;
        let mask = ps as u64 - 1;
        let direct = self.io_mode.direct.is_some();
        let (mut at, mut rest) = (offset, buf);
        while !rest.is_empty() {
            self.wait_for_room()?;
            let page_no = self.buffer.page_no(at);
            let within = (at & mask) as usize;
            let n = (ps - within).min(rest.len());
            let (chunk, tail) = rest.split_at(n);
            if n == ps {
                self.insert(page_no, self.buffer.page_copy(chunk)?.share())?;
            } else {
                let end = at + n as u64;
                let end = if direct { (end + mask) & !mask } else { end };
                self.merge_into(page_no, within, chunk, end)?;
            }
            at += n as u64;
            rest = tail;
        }
        Ok(())
    }

    /// Fills `buf` with the newest bytes from byte `offset`: buffered and
    /// in-flight pages are copied in, and every stretch of pages in neither
    /// is read with one call (`pread` straight into `buf` for a buffered
    /// file without a read cache; `preadv` into pool pages under `O_DIRECT`
    /// or when the read cache keeps them). Bytes never written inside the
    /// file read as zeros. Works on a poisoned file. An empty `buf` is
    /// accepted.
    ///
    /// Errors: [`Error::Overflow`], [`Error::OutOfBounds`] past
    /// [`len`](Self::len), [`Error::Closed`], `Error::Io` from the read
    /// (`UnexpectedEof` if the file was truncated by someone else).
    pub fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.life.check_open()?;
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len();
        let end = offset
            .checked_add(len as u64)
            .ok_or(Error::Overflow { offset, len })?;
        let file_len = self.len();
        if end > file_len {
            return Err(Error::OutOfBounds {
                offset,
                len,
                file_len,
            });
        }
        let first = self.buffer.page_no(offset);
        let last = self.buffer.page_no(end - 1);
        let mut stretch: Option<u64> = None;
        for p in first..=last {
            let (lo, hi) = self.clip(p, offset, end);
            let page_start = self.buffer.offset_of(p);
            let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
            if self.copy_newest(p, (lo - page_start) as usize, dst) {
                if let Some(a) = stretch.take() {
                    self.read_stretch(a..p, offset, buf)?;
                }
            } else if stretch.is_none() {
                stretch = Some(p);
            }
        }
        if let Some(a) = stretch {
            self.read_stretch(a..last + 1, offset, buf)?;
        }
        Ok(())
    }

    /// Drops the buffered pages in `len` bytes at `offset` (both multiples
    /// of the page size) and their read-cache copies: an engine freeing
    /// pages, cancelling a write, or dropping pages that failed to write
    /// for good ([`Error::PagesFailed`]). A version already in flight is not
    /// called back; if its write fails it is not retried. Until a page is
    /// written again its bytes are unspecified: whatever the file held, or
    /// the version in flight (zeros for a page never written).
    ///
    /// The length is not changed: pages discarded at the end of the file
    /// are zeros there after the next `sync`, which makes
    /// [`len`](Self::len) durable whatever was discarded. To drop them from
    /// the file, [`set_len`](Self::set_len).
    ///
    /// Errors: [`Error::ZeroLength`], [`Error::Unaligned`],
    /// [`Error::Overflow`], [`Error::Busy`] over a guarded page,
    /// [`Error::Closed`], [`Error::Poisoned`], [`Error::ReadOnly`]; a refused
    /// call changes nothing.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let _writer = self.life.begin_write()?;
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        let ps = self.config.page_size as u64;
        let as_usize = usize::try_from(len).unwrap_or(usize::MAX);
        if !offset.is_multiple_of(ps) || !len.is_multiple_of(ps) {
            return Err(Error::Unaligned {
                offset,
                len: as_usize,
                page_size: ps as usize,
            });
        }
        let end = offset.checked_add(len).ok_or(Error::Overflow {
            offset,
            len: as_usize,
        })?;
        self.buffer.check_unguarded(offset, len)?;
        let pages = self.buffer.page_no(offset)..self.buffer.page_no(end);
        self.buffer.discard(pages.clone());
        self.uncache(|p| pages.contains(&p));
        self.torn.forget_failed(offset, end);
        Ok(())
    }

    /// Follows a change another writer made to the file (another process,
    /// or another handle on the same file in this one, taking turns under
    /// a lock of their own, as redb's multi-process modes do): drops every
    /// read-cache page and takes the file's length from the OS. Reads
    /// after it see what the OS holds.
    ///
    /// Only between writes: with pages in the write buffer or in flight
    /// it changes nothing and returns [`Error::Buffered`]
    /// ([`flush`](Self::flush) first; what was buffered is then with the
    /// OS). A write racing with it is not lost: it makes the call fail.
    ///
    /// Errors: [`Error::Buffered`]; [`Error::Closed`];
    /// [`Error::InvalidConfig`] with a doublewrite area (whose records
    /// another writer does not follow); `Error::Io` with op "fstat".
    pub fn refresh(&self) -> Result<()> {
        self.life.check_open()?;
        if self.torn.area().is_some() {
            return Err(Error::InvalidConfig(
                "refresh: a doublewrite area cannot follow another writer".into(),
            ));
        }
        let mut flusher = self.flusher.lock();
        {
            let g = self.generations.lock();
            if !g.is_empty() {
                return Err(Error::Buffered {
                    bytes: self.buffer.buffered(),
                });
            }
        }
        self.buffer.with_nothing_buffered(|| {
            let len = self
                .backend
                .len()
                .map_err(|e| Error::io("fstat", None, e))?;
            self.length.begin_cut();
            self.uncache(|_| true);
            flusher.os_len = len;
            self.length.reset(len);
            self.length.end_cut();
            Ok(())
        })
    }

    /// Sets the logical length to `len` bytes, ordered with everything
    /// buffered: growing extends the file with zeros now; shrinking first
    /// waits for the in-flight writes (a round waiting for its `fdatasync`
    /// included), cuts the file, then drops every buffered and cached page
    /// past `len` and zeroes the buffered tail of the page `len` falls in,
    /// so nothing past the new end is written afterwards. [`len`](Self::len)
    /// follows at once, both ways; the next [`sync`](Self::sync) makes the
    /// new length durable even if no page was written.
    ///
    /// Writes racing with a shrink over the pages it cuts land before or
    /// after it, page by page; an engine orders them itself.
    ///
    /// With [`TornWrites::DoubleWrite`](crate::TornWrites::DoubleWrite) a
    /// shrink empties the doublewrite area: it first makes the pages
    /// written in place durable (`fdatasync`), after flushing any page
    /// whose earlier write failed (and may be torn on disk).
    ///
    /// Errors: [`Error::Unaligned`] for a length that is not a whole number
    /// of pages under `O_DIRECT`; [`Error::FileTooLarge`]; with a
    /// doublewrite area, the flush's errors (nothing changed) and
    /// `Error::Io` with op "fdatasync" (the file is poisoned);
    /// [`Error::Busy`] if a guarded page would be cut; [`Error::Closed`],
    /// [`Error::Poisoned`], [`Error::ReadOnly`]; `Error::Io` with op
    /// "ftruncate" (then nothing changed).
    pub fn set_len(&self, len: u64) -> Result<()> {
        let _writer = self.life.begin_write()?;
        let ps = self.config.page_size as u64;
        if self.io_mode.direct.is_some() && !len.is_multiple_of(ps) {
            return Err(Error::Unaligned {
                offset: len,
                len: 0,
                page_size: ps as usize,
            });
        }
        if len > self.length.max() {
            return Err(Error::FileTooLarge {
                offset: 0,
                len,
                max: self.length.max(),
            });
        }
        let mut flusher = self.flusher.lock();
        let cur = self.len();
        let truncate = |len| {
            self.backend
                .set_len(len)
                .map_err(|e| Error::io("ftruncate", Some(len), e))
        };
        if len >= cur {
            truncate(len)?;
            flusher.os_len = flusher.os_len.max(len);
            self.length.grow_all(len);
            self.durability.step_unstaged();
            return Ok(());
        }
        // A guard at or past the cut (even past the old end) would write
        // there when dropped.
        self.buffer.check_unguarded(len, u64::MAX - len)?;
        // Memory for the zeroed tail first: past the ftruncate nothing
        // may fail.
        let tail_buf = if len.is_multiple_of(ps) {
            None
        } else {
            Some(self.buffer.page_buf()?)
        };
        {
            let mut g = self.generations.lock();
            while !g.is_empty() {
                self.all_settled.wait(&mut g);
            }
        }
        if let Some(area) = self.torn.area()
            && area.has_failed()
        {
            // The cut empties the area, so a page a failed write may have
            // torn must first be written whole: a flush retries it (its
            // error is this call's, and nothing changed), then the cut
            // starts again (no write is in flight and none can start while
            // `flusher` is held, so the check above is final).
            drop(flusher);
            self.flush_to_os()?;
            return self.set_len(len);
        }
        if let Some(area) = self.torn.area() {
            // A record may hold pages past the cut, which recovery would
            // write back after a later sync made the cut durable: make
            // every page written in place durable, then empty the area.
            self.sync_file_on_free_lane()?;
            area.clear()
                .map_err(|e| Error::io("doublewrite area: empty", None, e))?;
        }
        // Readers that meet the new end early read again (`read_disk`).
        self.length.begin_cut();
        if let Err(e) = truncate(len) {
            self.length.end_cut();
            return Err(e);
        }
        flusher.os_len = len;
        self.length.set_written(len);
        // Pages wholly past `len` go; the one it falls in keeps its head.
        // The read cache loses the cut pages before any stripe opens again:
        // a write that merges into a page past the cut must not find its
        // old bytes there and bring them back (stripe locks before cache
        // locks, as in `WriteBuffer::merge`).
        // Aligned or not, the first page touched is the one `len` falls in
        // (past an aligned cut: the first page wholly cut).
        let first_gone = self.buffer.page_no(len);
        self.buffer.cut(len, tail_buf, || {
            self.uncache(|p| p >= first_gone);
            self.length.cut_to(len);
        });
        self.durability.step_unstaged();
        Ok(())
    }

    // ---- internals ----

    /// The byte range of page `p` inside `[offset, end)`.
    fn clip(&self, p: u64, offset: u64, end: u64) -> (u64, u64) {
        let start = self.buffer.offset_of(p);
        let stop = start + self.config.page_size as u64;
        (start.max(offset), stop.min(end))
    }

    /// Copies bytes `within..` of page `p` into `dst` from its newest
    /// buffered, in-flight or cached version; `false` if it is in none.
    fn copy_newest(&self, p: u64, within: usize, dst: &mut [u8]) -> bool {
        if self.buffer.copy_newest(p, within, dst) {
            add(&self.counters.buffer_hits, 1);
            return true;
        }
        if self.cache.copy_into(p, within, dst) {
            add(&self.counters.cache_hits, 1);
            return true;
        }
        false
    }

    /// Reads pages `pages` from disk into the part of `buf` (which starts
    /// at byte `offset`) they cover. Past the disk length: zeros.
    fn read_stretch(&self, pages: std::ops::Range<u64>, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset + buf.len() as u64;
        let lo = self.buffer.offset_of(pages.start).max(offset);
        let hi = self.buffer.offset_of(pages.end).min(end);
        if self.io_mode.direct.is_none() && !self.cache.is_enabled() {
            let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
            return self.length.read_disk("pread", lo, |disk_len| {
                let disk = disk_len.clamp(lo, hi);
                let (on_disk, past) = dst.split_at_mut((disk - lo) as usize);
                past.fill(0);
                if !on_disk.is_empty() {
                    self.backend.read_exact_at(lo, on_disk)?;
                    add(&self.counters.disk_reads, 1);
                }
                Ok(())
            });
        }
        // Whole pages: aligned memory for O_DIRECT, and what the cache keeps.
        let mut p = pages.start;
        while p < pages.end {
            let n = ((pages.end - p) as usize).min(IOV_MAX);
            self.read_pages(p, n, offset, buf)?;
            p += n as u64;
        }
        Ok(())
    }

    /// Reads `n` whole pages from page `first` with one `preadv` into pool
    /// pages, copies what `buf` (starting at byte `offset`) covers, and
    /// offers the pages to the read cache.
    fn read_pages(&self, first: u64, n: usize, offset: u64, buf: &mut [u8]) -> Result<()> {
        let ps = self.config.page_size;
        let end = offset + buf.len() as u64;
        // Cache sequence numbers before the read: a flush that updates a
        // page's cache stripe meanwhile makes this read's copy too old to keep.
        let seqs: Vec<Option<u64>> = (first..first + n as u64)
            .map(|p| self.cache.seq(p))
            .collect();
        let mut pages: Vec<UniqueBuf> = (0..n)
            .map(|_| self.buffer.page_buf())
            .collect::<Result<_>>()?;
        let start = self.buffer.offset_of(first);
        self.length.read_disk("preadv", start, |disk| {
            let on_disk = disk.saturating_sub(start).min((n * ps) as u64) as usize;
            let mut left = on_disk;
            let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(on_disk.div_ceil(ps));
            for page in pages.iter_mut() {
                page.fill(0);
                if left == 0 {
                    continue;
                }
                let k = left.min(ps);
                iov.push(IoSliceMut::new(&mut page[..k]));
                left -= k;
            }
            if on_disk > 0 {
                self.backend.read_vectored_exact_at(start, &mut iov)?;
                add(&self.counters.disk_reads, 1);
            }
            Ok(())
        })?;
        for (i, page) in pages.into_iter().enumerate() {
            let p = first + i as u64;
            let (lo, hi) = self.clip(p, offset, end);
            let within = (lo - self.buffer.offset_of(p)) as usize;
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&page[within..within + (hi - lo) as usize]);
            match seqs[i] {
                Some(seq) => self.cache.offer(p, seq, page.share(), self.buffer.pool()),
                None => self.buffer.pool().put_all([page.share()]),
            }
        }
        Ok(())
    }

    /// Merges `bytes` at `within` into page `page_no` and buffers the result;
    /// the logical length grows to `end`.
    fn merge_into(&self, page_no: u64, within: usize, bytes: &[u8], end: u64) -> Result<()> {
        self.buffer.merge(
            page_no,
            within,
            bytes,
            end,
            &self.length,
            &self.cache,
            &self.counters,
            |page| self.read_disk_page(page_no, page),
        )
    }

    /// Drops read-cache pages whose number `gone` selects.
    fn uncache(&self, gone: impl Fn(u64) -> bool) {
        self.cache.remove_where(gone, self.buffer.pool());
    }
}
