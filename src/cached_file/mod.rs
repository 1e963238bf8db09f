//! [`PagedCachedFile`]: a write buffer of dirty pages over a
//! [`StorageBackend`], with coalesced flushes and group commit.
//!
//! # Where a page lives
//!
//! The newest version of a page is in exactly one of these places, searched
//! in this order by [`PagedCachedFile::read`]:
//!
//! 1. the write buffer: `Stripe::dirty`, written by writers;
//! 2. the in-flight generations: `Stripe::flushing`, what each running flush
//!    or commit round drained and is writing or syncing, youngest last;
//! 3. the read cache of clean pages (optional);
//! 4. the backend.
//!
//! A page moves 1 -> 2 under its stripe lock (one map swap, no I/O), so a
//! reader holding that lock sees it in one of the two. It leaves 2 only
//! after its write completed (and, for a commit round, after the round's
//! `fdatasync`), and after the read cache was updated, so a reader that
//! misses 1 and 2 finds it in 3 or 4. Generations retire in drain order, so
//! a younger version of a page in flight always shadows an older one.
//!
//! # Writes in flight
//!
//! Drains are serialized by `flusher` and number the generations in drain
//! order; the writes are not: up to [`Config::rounds_in_flight`]
//! generations write at once, each from its own write slot (runs and
//! writer), so a round writes while earlier rounds' writes are still in
//! flight. Three rules keep that safe:
//!
//! 1. **Newest wins (write latch).** A generation that drained a page some
//!    older generation still in flight also holds waits, before it writes,
//!    until every generation up to that one has written. Two versions of a
//!    page are never in flight at once, and the younger reaches the OS
//!    last.
//! 2. **A sync covers what was drained before it.** A commit round (and a
//!    flush) returns only after every generation drained before or with
//!    its own has written (`wait_written`), so its `fdatasync` starts after
//!    those writes completed. `write_seq` is bumped after each write
//!    completes; an `fdatasync` covers the value read before it began.
//! 3. **Failed pages are not skipped.** A failed write puts its pages back
//!    in the write buffer, and records that it did, before its generation
//!    counts as written; a flush that drained after that generation and
//!    before the pages went back finds the record once it waited, and
//!    drains and writes again, so it never reports a page durable that an
//!    older generation failed to write.
//!
//! With a doublewrite area ([`TornWrites::DoubleWrite`]) two more hold:
//!
//! 4. **Staged before written.** A batch's record is durable in the area
//!    before any of its pages is written in place, and batches stage after
//!    their write-latch wait, so the area holds each page's versions in
//!    write order. The area starts over only when no staged batch is still
//!    writing, an `fdatasync` of the file covered the last in-place write,
//!    and no page whose in-place write failed (perhaps torn) is waiting to
//!    be written again (a `set_len` cut, which empties the area, flushes
//!    such pages first).
//! 5. **Durable on the area.** A commit round skips the file's
//!    `fdatasync` only if no change since the last one is outside a
//!    durable record: every such change (`set_len`, an extension whose
//!    record failed) sets `unstaged_at` together with its `write_seq`
//!    step, under one lock, and the round reads both under it
//!    (`unstaged_at <= fsynced`). `fsynced` moves only on a real
//!    `fdatasync` (or a durable write with everything before it synced).
//!
//! The file's length changes (`ftruncate`, `fallocate`) happen under
//! `flusher`, before the writes they precede; one that must see no write in
//! flight (cutting back after a failed write, or an unaligned tail) waits
//! for every older generation under `flusher`, and the writes never take
//! `flusher` after they left it except with `try_lock`.
//!
//! # Lock order
//!
//! `flusher` -> `slots` -> `generations` -> stripe -> cache stripe;
//! `commit` and `room` are never held with another lock taken under them
//! (`commit` is taken with `flusher` held only to borrow a sync lane,
//! `sync_file_on_free_lane`), and nothing is taken
//! under `spare_batches`, `unstaged_at` or the doublewrite area's lock
//! (the area's lock is taken with `flusher` held or not, never the other
//! way round). No I/O happens under a stripe or cache lock.

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::Arc;

use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex};

use crate::backend::{OpenOptions, StorageBackend};
use crate::buffer::{AlignedBuf, UniqueBuf};
use crate::error::{Error, Result};

mod bytes;
mod cache;
mod commit;
mod config;
mod doublewrite;
mod durability;
mod flush;
mod gather;
mod length;
mod lifecycle;
mod open;
mod pages;
mod stats;
mod torn;
mod write_buffer;
mod writer;
mod writer_pool;

pub use crate::backend::{DirectIo, FlushEngine, IoMode};
pub use config::{
    Config, DEFAULT_WRITE_THREADS, MAX_PAGE_SIZE, MAX_ROUNDS_IN_FLIGHT, MAX_STRIPES,
    MAX_SYNC_LANES, MAX_WRITE_BYTES, MAX_WRITE_THREADS,
};
pub use doublewrite::Recovery;
pub use pages::PageRef;
pub use stats::Stats;
pub use torn::TornWrites;

use cache::ReadCache;
use commit::CommitState;
use durability::Durability;
use flush::Flusher;
use length::Length;
use lifecycle::Lifecycle;
use stats::{Counters, add};
use write_buffer::WriteBuffer;

/// A file of fixed-size pages with a bounded, striped write buffer.
///
/// Many threads write pages ([`write_page`](Self::write_page),
/// [`write`](Self::write), [`overwrite`](Self::overwrite)) and read them
/// back ([`read`](Self::read)) concurrently. [`flush`](Self::flush) hands
/// the buffered pages to the OS, sorted and coalesced into runs, one write
/// call per run; [`sync`](Self::sync) makes them durable with group commit.
///
/// `Send + Sync`: share it with `Arc` or scoped threads.
///
/// # Drop
///
/// Dropping the file without [`close`](Self::close) makes a best-effort
/// flush (pages reach the OS, no `fdatasync`, errors ignored); only what a
/// successful `sync` or `close` covered is promised durable.
pub struct PagedCachedFile {
    backend: Arc<dyn StorageBackend>,
    config: Config,
    io_mode: IoMode,
    /// Dirty and in-flight pages, the page pool, room, guards.
    buffer: WriteBuffer,
    /// Clean pages read or written, under their own budget.
    cache: ReadCache,
    /// The logical, disk and written lengths, and the largest one.
    length: Length,
    flusher: Mutex<Flusher>,
    /// Write slots not in use: a flush takes one under `flusher` (waiting
    /// on `slot_free` while all are writing) and gives it back when its
    /// writes completed. [`Config::rounds_in_flight`] of them.
    slots: Mutex<Vec<flush::WriteSlot>>,
    slot_free: Condvar,
    /// Write sequence, durable watermark, sync lanes.
    durability: Durability,
    /// A failed write left the file to be cut back to `written_len`; done
    /// by the next holder of `flusher` that finds no write in flight.
    cut_pending: AtomicBool,
    /// In-flight generations in drain order; they retire in this order.
    /// `gens_written` is notified when one has written.
    generations: Mutex<flush::Generations>,
    gens_written: Condvar,
    /// Emptied vectors of retired batches, reused by the next drain.
    spare_batches: Mutex<Vec<flush::BatchVecs>>,
    next_generation: AtomicU64,
    /// Notified (under `generations`) when the last in-flight generation
    /// retires; `set_len` waits for it.
    all_settled: Condvar,
    commit: Mutex<CommitState>,
    /// `sync()` callers wait on the condvar of the round that covers them,
    /// round number modulo [`commit::ROUND_SLOTS`]: its publish wakes them,
    /// and the callers of the next round to start are also woken when the
    /// write stage frees (one of them leads it). Callers of other rounds
    /// sleep on (see `commit.rs`).
    commit_rounds: Box<[Condvar]>,
    /// Open, read-only, closing, closed or poisoned; write calls in
    /// progress.
    life: Lifecycle,
    /// Most bytes of one run: `max_write_bytes`, but never more than the
    /// write buffer holds (see [`max_run_bytes`]).
    max_run_bytes: usize,
    counters: Counters,
    /// Torn-page protection: atomic pieces, or the doublewrite area.
    torn: torn::TornProtection,
}

impl std::fmt::Debug for PagedCachedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedCachedFile")
            .field("backend", &self.backend)
            .field("config", &self.config)
            .field("logical_len", &self.length.get())
            .field("poisoned", &self.life.is_poisoned())
            .finish_non_exhaustive()
    }
}

impl PagedCachedFile {
    /// Opens (creating if missing, never truncating) the file at `path` with
    /// a [`FileBackend`](crate::FileBackend): `O_DIRECT` per `config.direct`, write cap
    /// `config.max_write_bytes`, `config.sync_lanes` sync lanes.
    ///
    /// Errors: a bad `config` (see [`Config::validate`]); `Error::Io` with op
    /// "open" if the file cannot be opened read-write (a directory, a
    /// read-only file, a missing parent directory); "open O_DIRECT" with
    /// [`DirectIo::On`] where the file system refuses `O_DIRECT`;
    /// `Error::InvalidConfig` with `DirectIo::On` where the page size or
    /// alignment does not fit the device's; "io_uring setup" for
    /// [`FlushEngine::IoUring`] where no ring can be set up; "reopen for
    /// sync lanes" if the extra descriptions cannot be opened (use
    /// `sync_lanes(1)` where `/proc` is missing).
    ///
    /// The file is locked (an exclusive advisory lock; a second open of it
    /// fails with [`Error::Locked`]). For read-only, must-exist or unlocked
    /// opens, use [`open_with`](Self::open_with).
    pub fn open(path: impl AsRef<Path>, config: Config) -> Result<Self> {
        Self::open_with(path, &OpenOptions::new(), config)
    }

    /// Opens the file at `path` as `options` say (read-only or read-write,
    /// create or must-exist, locked or not), otherwise as
    /// [`open`](Self::open).
    ///
    /// Errors: as [`open`](Self::open); [`Error::Locked`] when `options`
    /// lock and another open holds the lock; `Error::Io` with op "open" and
    /// `NotFound` for a missing file that may not be created.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: &OpenOptions,
        config: Config,
    ) -> Result<Self> {
        config.validate()?;
        let (backend, direct_fallback) = open::open_file(path.as_ref(), options, &config)?;
        let area = open::open_area(path.as_ref(), &backend, options, &config)?;
        let mut file = Self::build(
            backend,
            area,
            config,
            options.is_read_only(),
            options.is_locking(),
        )?;
        file.io_mode.direct_fallback = direct_fallback;
        Ok(file)
    }

    /// Puts a write buffer over `backend` with `area` as its doublewrite
    /// area ([`TornWrites::DoubleWrite`], or `Auto` where the backend has
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
        Self::build(backend, Some(area), config, false, false)
    }

    /// Puts a write buffer over `backend`. The file does `O_DIRECT` if the
    /// backend does ([`StorageBackend::dio_align`]).
    ///
    /// Errors: a bad `config`; `Error::InvalidConfig` if `config.direct` is
    /// [`DirectIo::On`] and the backend is buffered, or the backend is
    /// `O_DIRECT` and pages do not fit its alignment; as
    /// [`open`](Self::open) for io_uring; `Error::Io` with op "fstat" if
    /// the backend's length cannot be read.
    pub fn new(backend: impl StorageBackend + 'static, config: Config) -> Result<Self> {
        Self::build(backend, None, config, false, false)
    }

    fn build(
        backend: impl StorageBackend + 'static,
        area: Option<Arc<dyn StorageBackend>>,
        config: Config,
        read_only: bool,
        locked: bool,
    ) -> Result<Self> {
        config.validate()?;
        let len = backend.len().map_err(|e| Error::io("fstat", None, e))?;
        let max_len = backend.max_file_size().unwrap_or(u64::MAX);
        if config.direct == DirectIo::On && backend.dio_align().is_none() {
            return Err(Error::InvalidConfig(
                "DirectIo::On needs a backend opened with O_DIRECT (FileBackend::open_direct)"
                    .into(),
            ));
        }
        if let Some(why) = open::direct_misfit(&backend, &config) {
            return Err(Error::InvalidConfig(format!("O_DIRECT: {why}")));
        }
        // Before the ring is set up: a ring dropped on a refusal would keep
        // the file (and its lock) until the kernel's deferred teardown.
        let (torn_writes, torn_writes_why) = open::resolve_torn(&backend, &config, area.is_some())?;
        // Recovery too: a failed one (a full disk) must not leave a ring
        // holding the file.
        let (doublewrite, recovery) = match (torn_writes, area) {
            (TornWrites::DoubleWrite, Some(area)) => {
                let (report, next_seq) = doublewrite::recover(
                    &backend,
                    &*area,
                    config.page_size,
                    config.page_align,
                    read_only,
                )?;
                let ident = doublewrite::file_identity(&backend);
                let a = doublewrite::Area::new(area, config.page_size, ident, next_seq);
                (Some(a), report)
            }
            _ => (None, Recovery::default()),
        };
        // A run is at most `max_write_bytes` and never more than what the
        // write buffer holds, and the runs in flight together hold at most
        // the buffer: the io_uring writer's buffers are sized by both, so a
        // 1 GiB write cap at queue depth 32 does not ask for 32 GiB.
        let (engine, engine_fallback, writer) = open::resolve_writer(
            &backend,
            &config,
            max_run_bytes(&config),
            config.rounds_in_flight,
        )?;
        let io_mode = IoMode {
            engine,
            engine_fallback,
            direct: backend.dio_align(),
            direct_fallback: None,
            torn_writes,
            torn_writes_why,
        };
        let backend: Arc<dyn StorageBackend> = Arc::new(backend);
        let atomic_max = (torn_writes == TornWrites::Atomic).then(|| {
            let unit = backend
                .atomic_write_unit()
                .expect("checked by resolve_torn");
            (unit.max as usize).min(max_run_bytes(&config))
        });
        // Recovery may have grown the file (a page staged past the end, or
        // the length a record carries).
        let len = if recovery.repaired.is_empty() && !recovery.resized {
            len
        } else {
            backend.len().map_err(|e| Error::io("fstat", None, e))?
        };
        let mut writers = vec![writer];
        for _ in 1..config.rounds_in_flight {
            // Every slot writes with the engine the first resolved to (a
            // ring refused now is an error, not a silent mix of engines).
            let fixed = config.clone().engine(engine);
            let (_, _, w) = open::resolve_writer(
                &*backend,
                &fixed,
                max_run_bytes(&config),
                config.rounds_in_flight,
            )?;
            writers.push(w);
        }
        let mut slots = Vec::with_capacity(writers.len());
        for mut w in writers {
            if let writer::RunWriter::Vectored { pool, .. } = &mut w
                && config.write_threads > 1
            {
                let copy_align = backend.dio_align().map(|_| config.page_align);
                let helpers = writer_pool::WriterPool::new(
                    Arc::clone(&backend),
                    config.write_threads - 1,
                    copy_align,
                )
                .map_err(|e| Error::io("spawn writer thread", None, e))?;
                *pool = Some(Box::new(helpers));
            }
            let atomic_align = atomic_max.map(|_| config.page_align);
            slots.push(flush::WriteSlot::new(w, atomic_align));
        }
        let flusher = Flusher::new(len);
        let lanes = config.sync_lanes.min(backend.sync_lanes());
        let stripes = config.stripes;
        Ok(Self {
            backend,
            io_mode,
            buffer: WriteBuffer::new(
                stripes,
                config.max_write_buffer_bytes,
                config.page_size,
                config.page_align,
            ),
            cache: ReadCache::new(stripes, config.read_cache_bytes),
            length: Length::new(len, max_len, config.page_size),
            flusher: Mutex::new(flusher),
            slots: Mutex::new(slots),
            slot_free: Condvar::new(),
            durability: Durability::new(lanes),
            cut_pending: AtomicBool::new(false),
            generations: Mutex::new(flush::Generations::default()),
            gens_written: Condvar::new(),
            spare_batches: Mutex::new(Vec::new()),
            next_generation: AtomicU64::new(0),
            all_settled: Condvar::new(),
            commit: Mutex::new(CommitState::default()),
            commit_rounds: (0..commit::ROUND_SLOTS).map(|_| Condvar::new()).collect(),
            life: Lifecycle::new(read_only, locked),
            max_run_bytes: max_run_bytes(&config),
            counters: Counters::default(),
            torn: torn::TornProtection::new(atomic_max, doublewrite, recovery),
            config,
        })
    }

    /// What the doublewrite recovery pass did at open: records read, pages
    /// repaired, warnings (see [`TornWrites::DoubleWrite`]). Empty when no
    /// doublewrite area is in use or the area was empty.
    pub fn recovery(&self) -> &Recovery {
        self.torn.recovery()
    }

    /// The I/O actually done: engine and `O_DIRECT`, with the reason for any
    /// fallback.
    pub fn io_mode(&self) -> &IoMode {
        &self.io_mode
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> usize {
        self.config.page_size
    }

    /// The backend (for its own counters, say).
    pub fn backend(&self) -> &dyn StorageBackend {
        &*self.backend
    }

    /// The open file behind the backend, for engines that lock byte ranges
    /// or query the file themselves; `None` for a backend without one.
    /// Writing through it bypasses the write buffer (and its ordering).
    pub fn file(&self) -> Option<&std::fs::File> {
        self.backend.file()
    }

    /// Whether the file was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.life.is_read_only()
    }

    /// Logical length in bytes: the backend's length at open, grown by every
    /// write past it and set by [`set_len`](Self::set_len) both ways.
    pub fn len(&self) -> u64 {
        self.length.get()
    }

    /// Whether [`len`](Self::len) is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an earlier `fdatasync` failed (see [`Error::Poisoned`]).
    pub fn is_poisoned(&self) -> bool {
        self.life.is_poisoned()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot(self.buffer.buffered() as u64)
    }

    /// Writes `data` at byte `offset`. Both must be multiples of the page
    /// size; `data` may span several pages. The bytes are copied into the
    /// write buffer; they reach the OS at the next flush and are durable
    /// after the next successful [`sync`](Self::sync).
    ///
    /// If the buffer holds `max_write_buffer_bytes` or more, this call first
    /// flushes (or waits for the flush in progress).
    ///
    /// Errors: [`Error::ZeroLength`], [`Error::Unaligned`],
    /// [`Error::Overflow`], [`Error::FileTooLarge`] past the file system's
    /// largest file, [`Error::Closed`], [`Error::Poisoned`],
    /// [`Error::ReadOnly`], [`Error::Busy`] over a page under a guard this
    /// thread holds, or the error of the flush that backpressure ran (then
    /// nothing was written); [`Error::NoMemory`] for page memory the
    /// process cannot get (the pages before it are buffered).
    ///
    /// A page under a live guard of another thread is written after that
    /// guard is dropped (the call waits, as on a page latch).
    pub fn write_page(&self, offset: u64, data: &[u8]) -> Result<()> {
        let _writer = self.life.begin_write()?;
        self.check_range(offset, data.len())?;
        self.length.check_max(offset, data.len() as u64)?;
        self.buffer.check_not_own_guard(offset, data.len() as u64)?;
        self.wait_for_room()?;
        let first = self.buffer.page_no(offset);
        for (i, chunk) in data.chunks(self.config.page_size).enumerate() {
            let page = self.buffer.page_copy(chunk)?;
            self.insert(first + i as u64, page.share())?;
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
    /// A guard is a latch on its pages. While it lives, another thread's
    /// guard or write over any of them waits until it is dropped (guards
    /// over several pages latch them in page order, so two such guards
    /// never wait on each other in a cycle; guards taken one after another
    /// in different orders by two threads can, as with any latches). The
    /// thread that took the guard gets [`Error::Busy`] for a guard or write
    /// over its pages instead of waiting on itself forever (the guard
    /// records the thread that took it; a guard sent to another thread
    /// still counts as its taker's). `discard` and `set_len` over guarded
    /// pages, and `close` while any guard lives, never wait: they fail with
    /// [`Error::Busy`] from any thread.
    pub fn write(&self, offset: u64, len: usize) -> Result<WritablePage<'_>> {
        let mut guard = self.guard(offset, len)?;
        let buf = guard.buf.as_mut().expect("a new guard holds its pages");
        let ps = self.config.page_size;
        let readable = self.length.readable();
        for (i, chunk) in buf.chunks_mut(ps).enumerate() {
            let at = offset + (i * ps) as u64;
            if at < readable {
                match self.read_page(self.buffer.page_no(at)) {
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
        self.guard(offset, len)
    }

    /// A zeroed guard over `len` bytes at `offset`, its pages marked.
    fn guard(&self, offset: u64, len: usize) -> Result<WritablePage<'_>> {
        let writer = self.life.begin_write()?;
        self.check_range(offset, len)?;
        self.length.check_max(offset, len as u64)?;
        if len > self.config.max_write_buffer_bytes {
            // One guard's pages must fit in the write buffer.
            return Err(Error::InvalidConfig(format!(
                "a guard of {len} bytes exceeds max_write_buffer_bytes {}",
                self.config.max_write_buffer_bytes
            )));
        }
        self.buffer.check_not_own_guard(offset, len as u64)?;
        self.wait_for_room()?;
        // The memory first: a guard that cannot be had latches nothing.
        let buf = self.buffer.alloc(len)?;
        let ps = self.config.page_size;
        // A guard over several pages is split into pages when dropped,
        // where nothing can fail: their memory is taken now.
        let pages_mem = if len > ps {
            (0..len / ps)
                .map(|_| self.buffer.page_buf())
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let first = self.buffer.page_no(offset);
        // Only this thread's own guard refuses (checked above, so not
        // reached); nothing stays latched then.
        self.buffer.latch(first..first + (len / ps) as u64)?;
        // The guard holds the writer count until it is dropped.
        writer.keep();
        Ok(WritablePage {
            file: self,
            offset,
            buf: Some(buf),
            pages: pages_mem,
        })
    }

    /// The newest bytes of `len` bytes at `offset`: from the write buffer,
    /// the in-flight set, the read cache or the backend. Bytes never written
    /// inside the file read as zeros. A one-page read of a buffered page
    /// returns the buffered page itself (no copy).
    ///
    /// Works on a poisoned file (buffered pages stay readable).
    ///
    /// Errors: [`Error::ZeroLength`], [`Error::Unaligned`],
    /// [`Error::Overflow`], [`Error::OutOfBounds`] past the logical length
    /// (rounded up to a page), [`Error::Closed`], `Error::Io` from `pread`
    /// (`UnexpectedEof` if the file was truncated by someone else).
    pub fn read(&self, offset: u64, len: usize) -> Result<PageRef> {
        self.life.check_open()?;
        let end = self.check_range(offset, len)?;
        let file_len = self.length.readable();
        if end > file_len {
            return Err(Error::OutOfBounds {
                offset,
                len,
                file_len,
            });
        }
        let ps = self.config.page_size;
        if len == ps {
            return self.read_page(self.buffer.page_no(offset));
        }
        // A read of many pages is one buffer: memory the process cannot
        // get is a typed error, not an abort.
        let mut out = match AlignedBuf::try_zeroed(len, self.config.page_align) {
            Ok(Some(b)) => b,
            Ok(None) | Err(_) => return Err(Error::NoMemory { bytes: len as u64 }),
        };
        for (i, chunk) in out.chunks_mut(ps).enumerate() {
            chunk.copy_from_slice(&self.read_page(self.buffer.page_no(offset) + i as u64)?);
        }
        Ok(Arc::new(out))
    }

    /// Hands every buffered page to the OS: drain, sort, coalesce, one write
    /// call per run. Not durable; see [`sync`](Self::sync).
    ///
    /// Errors: [`Error::Closed`], [`Error::Poisoned`], `Error::Io` from a
    /// write. On a write error the pages that were not written stay dirty
    /// (unless a newer version was written meanwhile) and a later flush
    /// retries them.
    pub fn flush(&self) -> Result<()> {
        if self.life.is_read_only() && !self.life.is_closed() {
            return Ok(());
        }
        self.life.check_writable()?;
        self.flush_to_os().map(|_| ())
    }

    /// Durable commit: flush, then `fdatasync`. When it returns `Ok`, every
    /// page written before the call (by any thread) survives a crash, and
    /// so does the length [`len`](Self::len) reported before the call (a
    /// file whose last pages were discarded is extended to it with zeros).
    ///
    /// Group commit: concurrent callers share one flush and one
    /// `fdatasync`. One caller leads a round; the others wait for it and
    /// return with its result. If nothing was written since the last
    /// `fdatasync`, none is issued.
    ///
    /// Errors: [`Error::Closed`]; [`Error::Poisoned`] if an earlier
    /// `fdatasync` failed; `Error::Io` from a write (pages stay dirty, a later
    /// `sync` retries) or from `fdatasync` (the file is poisoned from then
    /// on; the pages of that round stay in memory and readable).
    pub fn sync(&self) -> Result<()> {
        if self.life.is_read_only() && !self.life.is_closed() {
            // Nothing can have been written.
            return Ok(());
        }
        self.life.check_writable()?;
        self.group_commit()
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
    /// A refused or failed close changes nothing for other threads: while
    /// it runs, their new write calls wait for its outcome (and then fail
    /// with [`Error::Closed`] or go ahead), and reads go on; no thread is
    /// told the file is closed unless it is.
    pub fn close(&self) -> Result<()> {
        // From here new write calls wait for the outcome (dropping
        // `closing` on an error lets them go on); wait for the ones already
        // counted. A guard is counted until it drops, which could be never
        // from this thread: refuse instead of waiting.
        let closing = self.life.begin_close()?;
        while closing.writers() > 0 {
            if let Some(offset) = self.buffer.a_guarded_page() {
                return Err(Error::Busy { offset });
            }
            std::thread::yield_now();
        }
        if !self.life.is_read_only() {
            self.group_commit()?;
            if let Some(area) = self.torn.area() {
                // The commit may have been durable on the area alone: make
                // the pages durable in place, then no page needs the area
                // (best effort: records left behind hold only synced
                // pages).
                self.sync_file_on_free_lane()?;
                let _ = area.clear();
            }
        }
        closing.finish();
        self.unlock();
        Ok(())
    }

    /// Releases the open's advisory lock, if it took one. Explicitly, not
    /// by closing the descriptor: an io_uring ring with the file registered
    /// keeps the open file description (and so the lock) alive until the
    /// kernel's deferred ring teardown, after the file was dropped.
    fn unlock(&self) {
        if self.life.is_locked()
            && let Some(file) = self.backend.file()
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
        let ps = self.config.page_size;
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
    /// full buffer is flushed here, or the call waits for a round to
    /// settle.
    fn wait_for_room(&self) -> Result<()> {
        self.buffer.wait_for_room(
            &self.counters,
            || self.life.check_writable(),
            || self.flush_to_os(),
        )
    }

    /// Puts one whole page into the write buffer; the logical length grows
    /// to its end.
    fn insert(&self, page_no: u64, page: PageRef) -> Result<()> {
        self.buffer
            .insert(page_no, page, &self.length, &self.counters)
    }

    /// Inserts a dropped guard's pages and ends its write call.
    fn insert_guarded(&self, offset: u64, buf: UniqueBuf, pages: Vec<UniqueBuf>) {
        self.buffer
            .insert_guarded(offset, buf, pages, &self.length, &self.counters);
        self.life.end_kept_write();
    }

    /// The newest version of one page (see the module docs for the order).
    fn read_page(&self, page_no: u64) -> Result<PageRef> {
        if let Some(page) = self.buffer.find(page_no) {
            add(&self.counters.buffer_hits, 1);
            return Ok(page);
        }
        let seq = match self.cache.lookup(page_no) {
            Ok(page) => {
                add(&self.counters.cache_hits, 1);
                return Ok(page);
            }
            Err(seq) => seq,
        };
        let mut buf = self.buffer.page_buf()?;
        self.read_disk_page(page_no, &mut buf)?;
        let page = buf.share();
        if let Some(seq) = seq {
            self.cache
                .offer(page_no, seq, page.clone(), self.buffer.pool());
        }
        Ok(page)
    }

    /// Reads page `page_no` from disk into `buf` (one page, zeroed by the
    /// caller): the part the backend holds; past it, zeros.
    fn read_disk_page(&self, page_no: u64, buf: &mut [u8]) -> Result<()> {
        let ps = self.config.page_size;
        let offset = self.buffer.offset_of(page_no);
        self.length.read_disk("pread", offset, |disk_len| {
            buf.fill(0);
            if offset < disk_len {
                let n = (disk_len - offset).min(ps as u64) as usize;
                self.backend.read_exact_at(offset, &mut buf[..n])?;
                add(&self.counters.disk_reads, 1);
            }
            Ok(())
        })
    }
}

impl Drop for PagedCachedFile {
    fn drop(&mut self) {
        if !self.life.is_closed() && !self.is_poisoned() && !self.life.is_read_only() {
            let _ = self.flush_to_os();
        }
        self.unlock();
    }
}

/// Write access to one or more pages, from [`PagedCachedFile::write`] or
/// [`PagedCachedFile::overwrite`]. Derefs to the page bytes; dropping it
/// puts them into the write buffer (newest wins over anything written to
/// those pages before the drop).
pub struct WritablePage<'a> {
    file: &'a PagedCachedFile,
    offset: u64,
    buf: Option<UniqueBuf>,
    /// For a guard over several pages: the pages it is split into when
    /// dropped, taken with the guard so the drop cannot fail.
    pages: Vec<UniqueBuf>,
}

impl WritablePage<'_> {
    /// Byte offset of the first page.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Drops the guard without writing its pages.
    fn abandon(mut self) {
        if let Some(buf) = self.buf.take() {
            let buffer = &self.file.buffer;
            let first = buffer.page_no(self.offset);
            let pages = (buf.len() / self.file.config.page_size) as u64;
            buffer.unlatch(first..first + pages, buf, std::mem::take(&mut self.pages));
            self.file.life.end_kept_write();
        }
    }
}

impl Deref for WritablePage<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => b,
            None => &[],
        }
    }
}

impl DerefMut for WritablePage<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Some(b) => b,
            None => &mut [],
        }
    }
}

impl Drop for WritablePage<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let pages = std::mem::take(&mut self.pages);
            self.file.insert_guarded(self.offset, buf, pages);
        }
    }
}

/// The longest run a flush writes: `max_write_bytes`, capped at the write
/// buffer's bound (a run of buffered pages cannot be longer, and the
/// io_uring bounce buffers are sized by it).
fn max_run_bytes(config: &Config) -> usize {
    let ps = config.page_size;
    let buffer_pages = (config.max_write_buffer_bytes / ps).max(1);
    config.max_write_bytes.min(buffer_pages * ps).max(ps)
}
