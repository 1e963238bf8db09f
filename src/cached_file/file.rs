//! [`PagedCachedFile`]: the file an engine holds. Its methods check their
//! arguments and the file's state, then call the components; the durable
//! calls are in `commit.rs`. Opening composes the components from what
//! each decides at open ([`PagedCachedFile::build`]).

use std::path::Path;
use std::sync::Arc;

use super::config::{Config, Counters, IoMode, Stats, TornWrites};
use super::durability::{Committer, Durability, Requests, SYNC_LANES};
use super::flush::FlushPipeline;
use super::grow;
use super::length::Length;
use super::lifecycle::{Access, Lifecycle, LockHeld};
use super::read::{self, Parts, ReadCache};
use super::torn::{self, TornProtection};
use super::write::Writers;
use super::write_buffer::{GuardParts, PageRef, PartialPage, WritablePage, WriteBuffer};
use crate::backend::{DirectIo, FileBackend, OpenOptions, StorageBackend, open_with_options};
use crate::buffer::{AlignedBuf, UniqueBuf};
use crate::error::{Error, Result};
use crate::format::doublewrite::Recovery;

/// A file of fixed-size pages with a bounded, striped write buffer.
///
/// Many threads write pages ([`write_page`](Self::write_page),
/// [`write_all_at`](Self::write_all_at), guards from [`write`](Self::write)
/// and [`overwrite`](Self::overwrite)) and read them back concurrently.
/// [`flush`](Self::flush) hands the buffered pages to the OS, sorted and
/// coalesced, one write call per run; [`sync`](Self::sync) makes every
/// page written before it durable, a [`Writer`](crate::Writer)'s commit
/// only its own; concurrent commits share writes and `fdatasync`s.
///
/// `Send + Sync`: share it with `Arc` or scoped threads.
///
/// # Drop
///
/// Dropping the file without [`close`](Self::close) makes a best-effort
/// flush (no `fdatasync`); only what a commit or `close` covered is
/// promised durable.
pub struct PagedCachedFile {
    /// The components, shared with the committer thread.
    pub(super) core: Arc<Core>,
    /// The thread that makes asynchronous commits durable, started by the
    /// first.
    pub(super) committer: Committer,
}

/// The components of a file: everything but its committer thread, which
/// holds them too (an `Arc`), so it can commit while the file is borrowed
/// elsewhere.
pub(crate) struct Core {
    pub(super) backend: Arc<dyn StorageBackend>,
    pub(super) config: Config,
    /// The engine, `O_DIRECT`, torn-page protection and grow-ahead in force.
    pub(super) io_mode: IoMode,
    pub(super) counters: Arc<Counters>,
    /// Dirty and in-flight pages, the page pool, room, guard latches.
    pub(super) buffer: WriteBuffer,
    /// Clean pages read or written, under their own budget.
    pub(super) cache: ReadCache,
    /// The logical, disk and written lengths.
    pub(super) length: Length,
    /// The write sequence, the durable watermark, the `fdatasync`s.
    pub(super) durability: Durability,
    /// Open, read-only, closing, closed or poisoned; write calls in
    /// progress.
    pub(super) life: Lifecycle,
    /// Atomic pieces, or the doublewrite area and its recovery.
    pub(super) torn: TornProtection,
    /// Drain, run writers, generations, the file's size on the OS.
    pub(super) flush: FlushPipeline,
    /// The commit queue: every commit asked for and how each ended
    /// (shared with the tickets and the committer thread).
    pub(super) requests: Arc<Requests>,
    /// Scratch vectors of scoped drains, one per flush at once (a leaf
    /// lock).
    pub(super) scratch: crate::sync::Mutex<Vec<Vec<u64>>>,
}

impl Core {
    /// The components below the flush pipeline, borrowed together.
    #[inline]
    pub(super) fn parts(&self) -> Parts<'_> {
        Parts {
            backend: &*self.backend,
            config: &self.config,
            counters: &self.counters,
            buffer: &self.buffer,
            cache: &self.cache,
            length: &self.length,
            durability: &self.durability,
            torn: &self.torn,
            direct: self.io_mode.direct.is_some(),
        }
    }
}

impl std::fmt::Debug for PagedCachedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedCachedFile")
            .field("backend", &self.core.backend)
            .field("config", &self.core.config)
            .field("logical_len", &self.core.length.get())
            .field("poisoned", &self.core.life.is_poisoned())
            .finish_non_exhaustive()
    }
}

/// How the file under a cached file was opened.
#[derive(Debug, Clone, Default)]
struct Opening {
    access: Access,
    lock: LockHeld,
    /// Why [`DirectIo::Auto`] fell back to buffered I/O, if it did.
    direct_fallback: Option<String>,
}

impl PagedCachedFile {
    /// Opens (creating if missing, never truncating) the file at `path` with
    /// a [`FileBackend`](crate::FileBackend), `O_DIRECT` as `config.direct`
    /// says.
    ///
    /// Errors: a bad `config` (see [`Config::validate`]); [`Error::Open`],
    /// naming the path, with op "open" if the file cannot be opened
    /// read-write (a directory, a read-only file, a missing parent
    /// directory), "open O_DIRECT" with [`DirectIo::On`](crate::DirectIo::On)
    /// where the file system refuses `O_DIRECT`, "open doublewrite area"
    /// for the area beside the file; `Error::InvalidConfig` with
    /// `DirectIo::On` where the page
    /// size or alignment does not fit the device's; `Error::Io` with op
    /// "io_uring setup" for [`FlushEngine::IoUring`](crate::FlushEngine::IoUring)
    /// where no ring can be set up, "grow-ahead recovery" if the end of the
    /// file cannot be read, or a grow-ahead window a crash left there
    /// cannot be cut off (see [`new`](Self::new)).
    ///
    /// The file is locked (an exclusive advisory lock; a second open of it
    /// fails with [`Error::Locked`]). For read-only, must-exist or unlocked
    /// opens, use [`open_with`](Self::open_with).
    pub fn open(path: impl AsRef<Path>, config: Config) -> Result<Self> {
        Self::open_with(path, &OpenOptions::new(), config)
    }

    /// Opens the file at `path` as `options` say (read-only, must-exist,
    /// unlocked), otherwise as [`open`](Self::open).
    ///
    /// Errors: as [`open`](Self::open); [`Error::Locked`] when `options`
    /// lock and another open holds the lock; [`Error::Open`] with op "open"
    /// and `NotFound` for a missing file that may not be created.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: &OpenOptions,
        config: Config,
    ) -> Result<Self> {
        config.validate()?;
        let (backend, direct_fallback) = open_file(path.as_ref(), options, &config)?;
        let area = torn::open_area(path.as_ref(), &backend, options, &config)?;
        let opening = Opening {
            access: if options.is_read_only() {
                Access::ReadOnly
            } else {
                Access::ReadWrite
            },
            lock: if options.is_locking() {
                LockHeld::Yes
            } else {
                LockHeld::No
            },
            direct_fallback,
        };
        Self::build(backend, area, config, opening)
    }

    /// Puts a write buffer over `backend` with `area` as its doublewrite
    /// area ([`TornWrites::DoubleWrite`](crate::TornWrites::DoubleWrite), or `Auto` where the backend has
    /// no atomic writes): the recovery pass runs first, repairing pages of
    /// `backend` from `area` ([`recovery`](Self::recovery) reports it).
    /// `area` is a byte file of its own that this file owns from now on
    /// (it is rewritten from offset 0 and truncated); it is not used with
    /// `Allow` or `Atomic`.
    ///
    /// Errors: as [`new`](Self::new); the recovery's I/O errors
    /// (`Error::Io`, op "doublewrite recovery: ...").
    pub fn with_doublewrite(
        backend: impl StorageBackend + 'static,
        area: Arc<dyn StorageBackend>,
        config: Config,
    ) -> Result<Self> {
        config.validate()?;
        Self::build(backend, Some(area), config, Opening::default())
    }

    /// Puts a write buffer over `backend`. The file does `O_DIRECT` if the
    /// backend does ([`StorageBackend::dio_align`]).
    ///
    /// Errors: a bad `config`; `Error::InvalidConfig` if `config.direct` is
    /// [`DirectIo::On`](crate::DirectIo::On) and the backend is buffered, or the backend is
    /// `O_DIRECT` and pages do not fit its alignment; as
    /// [`open`](Self::open) for io_uring; `Error::Io` with op "fstat" if
    /// the backend's length cannot be read.
    ///
    /// Every open first reads the file's tail: a file a crash left with a
    /// grow-ahead window ([`GrowAhead`](crate::GrowAhead)) is cut to the
    /// length its trailer holds (a read-only open only takes the length),
    /// whatever this open's configuration (`Error::Io` with op
    /// "grow-ahead recovery").
    pub fn new(backend: impl StorageBackend + 'static, config: Config) -> Result<Self> {
        config.validate()?;
        Self::build(backend, None, config, Opening::default())
    }

    /// The composition, in this order: the `O_DIRECT` fit and the torn-page
    /// protection are checked (before anything is written or a ring set
    /// up: a ring dropped on a refusal keeps the file's lock until the
    /// kernel's deferred teardown); a grow-ahead window a crash left is cut
    /// off and the doublewrite area recovers; then the run writers and
    /// grow-ahead's filler are set up. `config` is validated already.
    fn build(
        backend: impl StorageBackend + 'static,
        area: Option<Arc<dyn StorageBackend>>,
        config: Config,
        opening: Opening,
    ) -> Result<Self> {
        let read_only = opening.access == Access::ReadOnly;
        let (window, max_len) = grow::limits(&backend, &config, read_only)?;
        check_direct(&backend, &config)?;
        let (torn_writes, torn_writes_why) = torn::resolve_torn(&backend, &config, area.is_some())?;
        // Whatever this open's configuration, a window a crash left (or a
        // drop without close) is cut off now.
        let grown = crate::format::trailer::recover(&backend, read_only, config.page_align())
            .map_err(|e| Error::io("grow-ahead recovery", None, e))?;
        let (area, recovery) = torn::recover_area(&backend, area, torn_writes, &config, read_only)?;
        let atomic = torn_writes == TornWrites::Atomic;
        let (engine, engine_fallback, writers) = Writers::open(&backend, &config, atomic)?;
        let io_mode = IoMode {
            engine,
            engine_fallback,
            direct: backend.dio_align(),
            direct_fallback: opening.direct_fallback,
            torn_writes,
            torn_writes_why,
            grow_ahead: window,
        };
        let backend: Arc<dyn StorageBackend> = Arc::new(backend);
        let atomic_max = atomic.then(|| {
            let unit = backend
                .atomic_write_unit()
                .expect("checked by resolve_torn");
            (unit.max as usize).min(config.run_bytes())
        });
        // Recovery may have grown the file (a page staged past the end, or
        // the length a record carries).
        let len = match grown {
            Some(found) if recovery.repaired.is_empty() && !recovery.resized => found.len,
            _ => backend.len().map_err(|e| Error::io("fstat", None, e))?,
        };
        let dense = backend.data_len().unwrap_or(0);
        let grow = match window {
            Some(bytes) => Some(grow::open_window(&backend, bytes, &config, len)?),
            None => None,
        };
        let counters = Arc::new(Counters::default());
        let life = Lifecycle::new(opening.access, opening.lock);
        let durability = Durability::new(
            SYNC_LANES,
            Arc::clone(&backend),
            Arc::clone(&counters),
            life.poison_flag(),
        );
        let stripes = config.stripe_count();
        let core = Core {
            buffer: WriteBuffer::new(
                stripes,
                config.max_write_buffer_bytes,
                config.page_size,
                config.page_align(),
            ),
            cache: ReadCache::new(stripes, config.read_cache_bytes),
            length: Length::new(len, dense, max_len, config.page_size),
            durability,
            life,
            torn: TornProtection::new(atomic_max, area, recovery),
            flush: FlushPipeline::new(len, writers, grow),
            backend,
            io_mode,
            counters,
            requests: Arc::new(Requests::new()),
            scratch: crate::sync::Mutex::new(Vec::new()),
            config,
        };
        Ok(Self {
            core: Arc::new(core),
            committer: Committer::new(),
        })
    }

    /// The components below the flush pipeline, borrowed together.
    #[inline]
    pub(super) fn parts(&self) -> Parts<'_> {
        self.core.parts()
    }

    /// What the doublewrite recovery pass did at open: records read, pages
    /// repaired, warnings (see [`TornWrites::DoubleWrite`](crate::TornWrites::DoubleWrite)). Empty when no
    /// doublewrite area is in use or the area was empty.
    pub fn recovery(&self) -> &Recovery {
        self.core.torn.recovery()
    }

    /// The I/O actually done: engine and `O_DIRECT`, with the reason for any
    /// fallback.
    pub fn io_mode(&self) -> &IoMode {
        &self.core.io_mode
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> usize {
        self.core.config.page_size
    }

    /// The backend (for its own counters, say).
    pub fn backend(&self) -> &dyn StorageBackend {
        &*self.core.backend
    }

    /// The open file behind the backend, for engines that lock byte ranges
    /// or query the file themselves; `None` for a backend without one.
    /// Writing through it bypasses the write buffer (and its ordering).
    pub fn file(&self) -> Option<&std::fs::File> {
        self.core.backend.file()
    }

    /// Whether the file was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.core.life.is_read_only()
    }

    /// Logical length in bytes: the backend's length at open, grown by every
    /// write past it and set by [`set_len`](Self::set_len) both ways.
    pub fn len(&self) -> u64 {
        self.core.length.get()
    }

    /// Whether [`len`](Self::len) is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an earlier `fdatasync` failed (see [`Error::Poisoned`]).
    pub fn is_poisoned(&self) -> bool {
        self.core.life.is_poisoned()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let mut s = self.core.counters.snapshot();
        s.buffered_bytes = self.core.buffer.buffered() as u64;
        (s.grow_zero_bytes, s.grow_errors, _) = self.core.flush.grow_stats();
        s
    }

    /// Why grow-ahead's filler stopped, if it did (the first error of its
    /// writes: `ENOSPC`, `EFBIG`, `EOPNOTSUPP`, ...; too little space left
    /// on the file system; a commit's write that found it full; counted in
    /// [`Stats::grow_errors`]). Commits go on without it. `None` while it
    /// runs or without a window.
    pub fn grow_ahead_stopped(&self) -> Option<String> {
        self.core.flush.grow_stats().2
    }

    /// Writes `data` at byte `offset`, both multiples of the page size. The
    /// bytes are copied into the write buffer; they reach the OS at the
    /// next flush and are durable after the next commit. A buffer at its
    /// bound is flushed first.
    ///
    /// Errors: [`Error::ZeroLength`], [`Error::Unaligned`],
    /// [`Error::Overflow`], [`Error::FileTooLarge`] past the file system's
    /// largest file, [`Error::Closed`], [`Error::Poisoned`],
    /// [`Error::ReadOnly`], [`Error::Busy`] over a page under a guard this
    /// thread holds, or the error of the flush that backpressure ran (then
    /// nothing was written); [`Error::NoMemory`] for page memory the
    /// process cannot get (the pages of the 64-page batches before it are
    /// buffered).
    ///
    /// A page under a live guard of another thread is written after that
    /// guard is dropped (the call waits, as on a page latch).
    pub fn write_page(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_page_recorded(offset, data, &mut |_| {})
    }

    /// [`write_page`](Self::write_page), calling `record` with the number
    /// of each page it buffers (a [`Writer`](crate::Writer)'s scope).
    pub(crate) fn write_page_recorded(
        &self,
        offset: u64,
        data: &[u8],
        record: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let _writer = self.core.life.begin_write()?;
        self.check_range(offset, data.len())?;
        self.core.length.check_max(offset, data.len() as u64)?;
        self.core
            .buffer
            .check_not_own_guard(offset, data.len() as u64)?;
        self.wait_for_room()?;
        let ps = self.core.config.page_size;
        let mut page_no = self.core.buffer.page_no(offset);
        if data.len() == ps {
            // One page, a B-tree's usual write: no batch to set up.
            let page = self.core.buffer.page_copy(data)?;
            self.insert(page_no, page.share())?;
            record(page_no);
            return Ok(());
        }
        // Up to 64 pages at a time from the pool, adjacent in memory where
        // it can; on the stack, so a steady load allocates nothing.
        const BATCH: usize = 64;
        let mut pages: [Option<UniqueBuf>; BATCH] = [const { None }; BATCH];
        for chunk in data.chunks(BATCH * ps) {
            self.core.buffer.page_copies(chunk, &mut pages)?;
            for page in pages.iter_mut().take(chunk.len() / ps) {
                let page = page.take().expect("filled by page_copies");
                self.insert(page_no, page.share())?;
                record(page_no);
                page_no += 1;
            }
        }
        Ok(())
    }

    /// A guard over `len` bytes at `offset` holding the newest contents of
    /// those pages (zeros past the end of the file). Change them through
    /// `&mut [u8]`; dropping the guard puts them in the write buffer.
    ///
    /// Errors: as [`write_page`](Self::write_page), plus an `Error::Io` from
    /// reading the current contents.
    ///
    /// A guard is a latch on its pages: another thread's guard or write
    /// over them waits until it is dropped (one guard latches its pages in
    /// page order; guards taken one after another in different orders can
    /// deadlock, as any latches). The taking thread (a guard sent away
    /// still counts as its taker's) gets [`Error::Busy`] instead of
    /// waiting on itself; `discard` and `set_len` over guarded pages, and
    /// `close` while any guard lives, fail with [`Error::Busy`].
    pub fn write(&self, offset: u64, len: usize) -> Result<WritablePage<'_>> {
        self.write_guard(offset, len, None)
    }

    /// [`write`](Self::write), the guard recording its pages in `scope`
    /// when dropped (a [`Writer`](crate::Writer)'s).
    pub(crate) fn write_guard<'a>(
        &'a self,
        offset: u64,
        len: usize,
        scope: Option<&'a mut Vec<u64>>,
    ) -> Result<WritablePage<'a>> {
        let mut guard = self.guard(offset, len, scope)?;
        let buf: &mut [u8] = &mut guard;
        let ps = self.core.config.page_size;
        let readable = self.core.length.readable();
        for (i, chunk) in buf.chunks_mut(ps).enumerate() {
            let at = offset + (i * ps) as u64;
            if at < readable {
                match read::read_page(&self.parts(), self.core.buffer.page_no(at)) {
                    Ok(page) => chunk.copy_from_slice(&page),
                    Err(e) => {
                        // Nothing was written: drop the guard unapplied.
                        guard.abandon();
                        return Err(e);
                    }
                }
            }
        }
        Ok(guard)
    }

    /// Like [`write`](Self::write) for pages the caller will fill entirely:
    /// the guard starts zeroed and nothing is read.
    pub fn overwrite(&self, offset: u64, len: usize) -> Result<WritablePage<'_>> {
        self.guard(offset, len, None)
    }

    /// A zeroed guard over `len` bytes at `offset`, its pages marked; it
    /// records them in `scope` when dropped, if given.
    pub(crate) fn guard<'a>(
        &'a self,
        offset: u64,
        len: usize,
        scope: Option<&'a mut Vec<u64>>,
    ) -> Result<WritablePage<'a>> {
        let writer = self.core.life.begin_write()?;
        self.check_range(offset, len)?;
        self.core.length.check_max(offset, len as u64)?;
        if len > self.core.config.max_write_buffer_bytes {
            // One guard's pages must fit in the write buffer.
            return Err(Error::InvalidConfig(format!(
                "a guard of {len} bytes exceeds max_write_buffer_bytes {}",
                self.core.config.max_write_buffer_bytes
            )));
        }
        self.core.buffer.check_not_own_guard(offset, len as u64)?;
        self.wait_for_room()?;
        // The memory first: a guard that cannot be had latches nothing.
        let buf = self.core.buffer.alloc(len)?;
        let ps = self.core.config.page_size;
        // A guard over several pages is split into pages when dropped,
        // where nothing can fail: their memory is taken now.
        let pages_mem = if len > ps {
            (0..len / ps)
                .map(|_| self.core.buffer.page_buf())
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let first = self.core.buffer.page_no(offset);
        // Only this thread's own guard refuses (checked above, so not
        // reached); nothing stays latched then.
        self.core.buffer.latch(first..first + (len / ps) as u64)?;
        // The guard holds the writer count until it is dropped.
        writer.keep();
        let parts = GuardParts {
            buffer: &self.core.buffer,
            length: &self.core.length,
            counters: &self.core.counters,
            life: &self.core.life,
            scope,
        };
        Ok(WritablePage::new(parts, offset, buf, pages_mem))
    }

    /// The newest bytes of `len` bytes at `offset`: from the write buffer,
    /// the in-flight set, the read cache or the backend (zeros where never
    /// written; a one-page read of a buffered page is that page, no copy).
    /// Works on a poisoned file.
    ///
    /// Errors: [`Error::ZeroLength`], [`Error::Unaligned`],
    /// [`Error::Overflow`], [`Error::OutOfBounds`] past the logical length
    /// (rounded up to a page), [`Error::Closed`], `Error::Io` from `pread`
    /// (`UnexpectedEof` if the file was truncated by someone else).
    pub fn read(&self, offset: u64, len: usize) -> Result<PageRef> {
        self.core.life.check_open()?;
        let end = self.check_range(offset, len)?;
        let file_len = self.core.length.readable();
        if end > file_len {
            return Err(Error::OutOfBounds {
                offset,
                len,
                file_len,
            });
        }
        let ps = self.core.config.page_size;
        if len == ps {
            return read::read_page(&self.parts(), self.core.buffer.page_no(offset));
        }
        // A read of many pages is one buffer: memory the process cannot
        // get is a typed error, not an abort.
        let mut out = match AlignedBuf::try_zeroed(len, self.core.config.page_align()) {
            Ok(Some(b)) => b,
            Ok(None) | Err(_) => return Err(Error::NoMemory { bytes: len as u64 }),
        };
        let p = self.parts();
        let first = self.core.buffer.page_no(offset);
        for (i, chunk) in out.chunks_mut(ps).enumerate() {
            chunk.copy_from_slice(&read::read_page(&p, first + i as u64)?);
        }
        Ok(Arc::new(out))
    }

    /// Hands every buffered page to the OS: drain, sort, coalesce, one write
    /// call per run. Not durable; see [`sync`](Self::sync).
    ///
    /// Errors: [`Error::Closed`], [`Error::Poisoned`];
    /// [`Error::PagesFailed`] when some pages could not be written (it
    /// names their byte ranges and the call that failed; every other page
    /// was written; the failed ones stay dirty, unless a newer version was
    /// written meanwhile, and a later flush retries them); `Error::Io`
    /// when the file could not be extended to its length (op "ftruncate")
    /// or, with grow-ahead, its window could not (op "grow-ahead trailer",
    /// or "fdatasync", which poisons the file).
    pub fn flush(&self) -> Result<()> {
        if self.core.life.is_read_only() && !self.core.life.is_closed() {
            return Ok(());
        }
        self.core.life.check_writable()?;
        self.core.flush.flush_now(&self.parts()).map(|_| ())
    }

    /// Syncs and closes. Afterwards every call but [`stats`](Self::stats)
    /// returns [`Error::Closed`]. A write call running when `close` starts
    /// is waited for and made durable with the rest; one started after it
    /// fails with [`Error::Closed`].
    ///
    /// Errors: [`Error::Busy`] while a [`WritablePage`] guard lives (its
    /// pages would otherwise be lost when it drops); as
    /// [`sync`](Self::sync). On error the file stays open so the caller can
    /// retry or read its pages back.
    ///
    /// While it runs, other threads' new write calls wait for its outcome
    /// (then fail with [`Error::Closed`] or go ahead) and reads go on; a
    /// refused or failed close changes nothing for them.
    pub fn close(&self) -> Result<()> {
        // New write calls wait for the outcome from here; wait for those
        // counted, but not for a guard (it may never drop): refuse.
        let closing = self.core.life.begin_close()?;
        while closing.writers() > 0 {
            if let Some(offset) = self.core.buffer.a_guarded_page() {
                return Err(Error::Busy { offset });
            }
            crate::sync::yield_now();
        }
        if !self.core.life.is_read_only() {
            self.commit_at_close()?;
            // At rest the file's size is its length.
            self.core.flush.drop_window(&self.parts())?;
            if let Some(area) = self.core.torn.area() {
                // The commit may be durable on the area alone: make it
                // durable in place, then empty the area (best effort).
                self.core.flush.sync_file(&self.parts())?;
                let _ = area.clear();
            }
        }
        closing.finish();
        self.unlock();
        Ok(())
    }

    /// Writes all of `buf` at byte `offset`: any offset, any length. Whole
    /// pages are copied into the write buffer; a partial page is merged
    /// with its newest version (read once from disk if it is in no
    /// buffer). The logical length grows to `offset + buf.len()` (rounded
    /// up to a page under `O_DIRECT`). The bytes are durable after the next
    /// commit. An empty `buf` does nothing.
    ///
    /// Backpressure applies per page, so `buf` may exceed the write buffer
    /// (if a flush it runs fails, the pages before are buffered). A page
    /// under another thread's guard is written after the guard is dropped.
    /// A partial page that a racing [`set_len`](Self::set_len) cuts merges
    /// with the bytes before or after the cut, never an error.
    ///
    /// Errors: [`Error::Overflow`], [`Error::FileTooLarge`],
    /// [`Error::Closed`], [`Error::Poisoned`], [`Error::ReadOnly`],
    /// [`Error::Busy`] over a page under a guard this thread holds (all
    /// before anything is buffered); `Error::Io` from reading a partial
    /// page, [`Error::NoMemory`], or the error of a backpressure flush.
    pub fn write_all_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.write_all_at_recorded(offset, buf, &mut |_| {})
    }

    /// [`write_all_at`](Self::write_all_at), calling `record` with the
    /// number of each page it buffers (a [`Writer`](crate::Writer)'s
    /// scope).
    pub(crate) fn write_all_at_recorded(
        &self,
        offset: u64,
        buf: &[u8],
        record: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let _writer = self.core.life.begin_write()?;
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len() as u64;
        offset.checked_add(len).ok_or(Error::Overflow {
            offset,
            len: buf.len(),
        })?;
        self.core.length.check_max(offset, len)?;
        self.core.buffer.check_not_own_guard(offset, len)?;
        let ps = self.core.config.page_size;
        let mask = ps as u64 - 1;
        let direct = self.core.io_mode.direct.is_some();
        let (mut at, mut rest) = (offset, buf);
        while !rest.is_empty() {
            self.wait_for_room()?;
            let page_no = self.core.buffer.page_no(at);
            let within = (at & mask) as usize;
            let n = (ps - within).min(rest.len());
            let (chunk, tail) = rest.split_at(n);
            if n == ps {
                self.insert(page_no, self.core.buffer.page_copy(chunk)?.share())?;
            } else {
                let end = at + n as u64;
                let end = if direct { (end + mask) & !mask } else { end };
                self.merge_into(page_no, within, chunk, end)?;
            }
            record(page_no);
            at += n as u64;
            rest = tail;
        }
        Ok(())
    }

    /// Fills `buf` with the newest bytes from byte `offset`: buffered and
    /// in-flight pages are copied in, and every stretch of pages in neither
    /// is read with one call (into `buf`, or into pool pages under
    /// `O_DIRECT` or with the read cache). Bytes never written inside the
    /// file read as zeros. Works on a poisoned file; `buf` may be empty.
    ///
    /// Errors: [`Error::Overflow`], [`Error::OutOfBounds`] past
    /// [`len`](Self::len), [`Error::Closed`], `Error::Io` from the read
    /// (`UnexpectedEof` if the file was truncated by someone else).
    pub fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.core.life.check_open()?;
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
        read::read_into(&self.parts(), offset, buf)
    }

    /// Drops the buffered pages in `len` bytes at `offset` (both multiples
    /// of the page size) and their read-cache copies: an engine freeing
    /// pages, or dropping pages that failed to write for good
    /// ([`Error::PagesFailed`]). A version in flight is not called back
    /// (nor retried if its write fails). Until a page is written again its
    /// bytes are unspecified.
    ///
    /// The length is not changed (pages discarded at the end are zeros
    /// after the next `sync`); [`set_len`](Self::set_len) drops them.
    ///
    /// Errors: [`Error::ZeroLength`], [`Error::Unaligned`],
    /// [`Error::Overflow`], [`Error::Busy`] over a guarded page,
    /// [`Error::Closed`], [`Error::Poisoned`], [`Error::ReadOnly`]; a refused
    /// call changes nothing.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let _writer = self.core.life.begin_write()?;
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        let ps = self.core.config.page_size as u64;
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
        self.core.buffer.check_unguarded(offset, len)?;
        let pages = self.core.buffer.page_no(offset)..self.core.buffer.page_no(end);
        self.core.buffer.discard(pages.clone());
        self.core
            .cache
            .remove_where(|p| pages.contains(&p), self.core.buffer.pool());
        self.core.torn.forget_failed(offset, end);
        Ok(())
    }

    /// Follows a change another writer made to the file (another process
    /// or handle, taking turns under a lock of their own, as redb's
    /// multi-process modes do): drops every read-cache page and takes the
    /// file's length from the OS. Only between writes: with pages buffered
    /// or in flight it changes nothing and returns [`Error::Buffered`]
    /// ([`flush`](Self::flush) first); a racing write makes it fail.
    ///
    /// Errors: [`Error::Buffered`]; [`Error::Closed`];
    /// [`Error::InvalidConfig`] with a doublewrite area (whose records
    /// another writer does not follow); `Error::Io` with op "fstat".
    pub fn refresh(&self) -> Result<()> {
        self.core.life.check_open()?;
        if self.core.torn.area().is_some() {
            return Err(Error::InvalidConfig(
                "refresh: a doublewrite area cannot follow another writer".into(),
            ));
        }
        self.core.flush.refresh(&self.parts())
    }

    /// Sets the logical length to `len` bytes, ordered with everything
    /// buffered: growing extends the file with zeros now; shrinking waits
    /// for the in-flight writes, cuts the file, then drops every buffered
    /// and cached page past `len` and zeroes the tail of the page `len`
    /// falls in. [`len`](Self::len) follows at once; the next commit makes
    /// the new length durable.
    ///
    /// Writes racing with a shrink over the pages it cuts land before or
    /// after it, page by page. With
    /// [`TornWrites::DoubleWrite`](crate::TornWrites::DoubleWrite) a shrink
    /// empties the doublewrite area, after flushing any page whose earlier
    /// write failed and an `fdatasync`.
    ///
    /// Errors: [`Error::Unaligned`] for a length that is not a whole number
    /// of pages under `O_DIRECT`; [`Error::FileTooLarge`]; with a
    /// doublewrite area, the flush's errors (nothing changed) and
    /// `Error::Io` with op "fdatasync" before the cut (the file is
    /// poisoned, nothing cut); with a grow-ahead window, `Error::Io` with
    /// op "fdatasync" after the cut (the file is poisoned; [`len`](Self::len)
    /// shows the cut, which a crash may or may not keep);
    /// [`Error::Busy`] if a guarded page would be cut; [`Error::Closed`],
    /// [`Error::Poisoned`], [`Error::ReadOnly`]; `Error::Io` with op
    /// "ftruncate" (then nothing changed).
    pub fn set_len(&self, len: u64) -> Result<()> {
        let _writer = self.core.life.begin_write()?;
        let ps = self.core.config.page_size as u64;
        if self.core.io_mode.direct.is_some() && !len.is_multiple_of(ps) {
            return Err(Error::Unaligned {
                offset: len,
                len: 0,
                page_size: ps as usize,
            });
        }
        if len > self.core.length.max() {
            return Err(Error::FileTooLarge {
                offset: 0,
                len,
                max: self.core.length.max(),
            });
        }
        self.core.flush.set_len(&self.parts(), len)
    }

    /// Releases the open's advisory lock, if it took one, explicitly: a
    /// ring with the file registered keeps the description (and the lock)
    /// alive until the kernel's deferred teardown.
    fn unlock(&self) {
        if self.core.life.is_locked()
            && let Some(file) = self.core.backend.file()
        {
            let _ = file.unlock();
        }
    }

    // ---- internals ----

    /// Validates a page range; returns its end offset.
    fn check_range(&self, offset: u64, len: usize) -> Result<u64> {
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        let ps = self.core.config.page_size;
        if !offset.is_multiple_of(ps as u64) || !len.is_multiple_of(ps) {
            return Err(Error::Unaligned {
                offset,
                len,
                page_size: ps,
            });
        }
        offset
            .checked_add(len as u64)
            .ok_or(Error::Overflow { offset, len })
    }

    /// Backpressure before a write (see `WriteBuffer::wait_for_room`): a
    /// full buffer is flushed here, or the call waits for a pass to
    /// settle.
    fn wait_for_room(&self) -> Result<()> {
        self.core.buffer.wait_for_room(
            &self.core.counters,
            || self.core.life.check_writable(),
            || self.core.flush.flush_now(&self.parts()),
        )
    }

    /// Puts one whole page into the write buffer; the logical length grows
    /// to its end.
    fn insert(&self, page_no: u64, page: PageRef) -> Result<()> {
        self.core
            .buffer
            .insert(page_no, page, &self.core.length, &self.core.counters)
    }

    /// Merges `bytes` at `within` into page `page_no` and buffers the result;
    /// the logical length grows to `end`.
    fn merge_into(&self, page_no: u64, within: usize, bytes: &[u8], end: u64) -> Result<()> {
        let p = self.parts();
        let write = PartialPage {
            page_no,
            within,
            bytes,
            end,
        };
        self.core.buffer.merge(
            write,
            &self.core.length,
            |n| self.core.cache.get(n),
            &self.core.counters,
            |page| read::read_disk_page(&p, page_no, page),
        )
    }
}

impl Drop for PagedCachedFile {
    fn drop(&mut self) {
        self.committer.stop(&self.core.requests);
        if !self.core.life.is_closed() && !self.is_poisoned() && !self.core.life.is_read_only() {
            let _ = self.core.flush.flush_now(&self.parts());
        }
        // Tickets no commit covered will not be: they resolve Closed.
        self.core.requests.abandon();
        self.unlock();
    }
}

/// Opens `path` for a [`PagedCachedFile`](crate::PagedCachedFile) with
/// `O_DIRECT` as `config.direct` asks, write caps and sync lanes set.
fn open_file(
    path: &std::path::Path,
    options: &OpenOptions,
    config: &Config,
) -> Result<(FileBackend, Option<String>)> {
    let (backend, why) =
        open_with_options(path, options, config.direct, &|b| direct_misfit(b, config))?;
    // A read-only open syncs nothing: no more descriptions.
    let lanes = if options.is_read_only() {
        1
    } else {
        SYNC_LANES
    };
    let backend = backend
        .with_max_write_bytes(config.max_write())
        .with_sync_lanes(lanes);
    Ok((backend, why))
}

/// Why `O_DIRECT` cannot serve this configuration on this backend, if so:
/// pages must be whole multiples of the offset alignment, page memory
/// aligned for the memory alignment, and the file a whole number of pages.
fn direct_misfit(backend: &dyn StorageBackend, config: &Config) -> Option<String> {
    let a = backend.dio_align()?;
    if !config.page_size.is_multiple_of(a.offset as usize) {
        return Some(format!(
            "page size {} is not a multiple of the O_DIRECT alignment {}",
            config.page_size, a.offset
        ));
    }
    if !config.page_align().is_multiple_of(a.memory as usize) {
        return Some(format!(
            "page memory alignment {} (the page size, at most 4096) is not a multiple of the \
             O_DIRECT memory alignment {}",
            config.page_align(),
            a.memory
        ));
    }
    match backend.len() {
        Ok(len) if len % config.page_size as u64 != 0 => Some(format!(
            "file length {len} is not a whole number of {} B pages",
            config.page_size
        )),
        _ => None,
    }
}

/// Refuses `DirectIo::On` over a buffered backend, and an `O_DIRECT`
/// backend whose alignment the pages do not fit.
///
/// Errors: [`Error::InvalidConfig`].
fn check_direct(backend: &dyn StorageBackend, config: &Config) -> Result<()> {
    if config.direct == DirectIo::On && backend.dio_align().is_none() {
        return Err(Error::InvalidConfig(
            "DirectIo::On needs a backend opened with O_DIRECT (FileBackend::open_direct)".into(),
        ));
    }
    if let Some(why) = direct_misfit(backend, config) {
        return Err(Error::InvalidConfig(format!("O_DIRECT: {why}")));
    }
    Ok(())
}
