//! # pagewriter-redb
//!
//! A [`redb::StorageBackend`] on [`pagewriter::PagedCachedFile`]: redb's
//! page writes go into pagewriter's write buffer, and each durable commit
//! (`sync_data`) writes them sorted and coalesced, one `pwritev` per run of
//! contiguous pages, before one `fdatasync`. redb's own file backend makes
//! one `pwrite` per page instead.
//!
//! ```no_run
//! use pagewriter_redb::PagewriterBackend;
//! use redb::{Database, TableDefinition};
//!
//! const T: TableDefinition<u64, u64> = TableDefinition::new("t");
//! let backend = PagewriterBackend::open("my.redb")?;
//! let db = Database::builder().create_with_backend(backend)?;
//! let txn = db.begin_write()?;
//! txn.open_table(T)?.insert(1, 2)?;
//! txn.commit()?; // durable: coalesced writes + one fdatasync
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`ColumnFamilies`] keeps many redb databases in one file instead, each
//! a [`ColumnFamily`] whose commits are scoped to its own pages (see
//! [`cf`]).
//!
//! Locking is redb's own, every level of it: the backend hands redb's lock
//! calls to redb's own file backend (`redb::backends::FileBackend`) on a
//! second open file description of the same file (Linux; a clone of the
//! file's handle on the other platforms, where no io_uring ring holds it
//! and where Windows' mandatory locks must belong to the same file
//! object), so redb's byte-range protocol behaves exactly as on redb's
//! backend: a second `Database` in `ExclusiveWriter` mode (the default)
//! gets `DatabaseError::DatabaseAlreadyOpen` at once, and the
//! multi-process modes (`SingleWriter`, `MultiWriter`) work. The locks
//! live on a description no io_uring ring holds, so they go the moment a
//! process dies.
//!
//! In those modes another writer (another process, or another `Database`
//! on the file in this one) changes the file between this handle's
//! transactions. redb takes a lock before it reads the state another
//! writer may have changed and releases one after its writes: so after
//! every lock it takes, the backend drops pagewriter's read cache and takes
//! the file's length from the OS ([`PagedCachedFile::refresh`], flushing
//! first if pages are buffered), and before every lock it releases it
//! flushes its buffered pages to the OS, where the other writer reads them.
//! In `ExclusiveWriter` mode redb locks once at open and unlocks at close,
//! so neither costs anything there.

pub mod cf;

pub use cf::{ColumnFamilies, ColumnFamily};

use std::io;
use std::ops::Bound;
use std::path::Path;

use pagewriter::backend::range_lock;
use pagewriter::{Config, OpenOptions, PagedCachedFile};
use redb::BackendError;
use redb::backends::FileBackend as RedbFileBackend;

/// Read-cache budget of [`PagewriterBackend::default_config`]: 4 MiB. redb
/// caches pages itself; this one keeps the pages pagewriter just wrote, so
/// that redb's partial writes (its 320-byte header at offset 0, say) merge
/// into a cached page instead of reading it back from disk.
pub const DEFAULT_READ_CACHE_BYTES: usize = 4 << 20;

/// How long [`PagewriterBackend::open_after_crash`] waits for the file's
/// locks to go: 2 s.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A redb storage backend on a [`PagedCachedFile`].
#[derive(Debug)]
pub struct PagewriterBackend {
    file: PagedCachedFile,
    /// redb's own backend on a second description of the file, for redb's
    /// locks only (never read or written through). `None` for a file with
    /// no descriptor (a memory backend): locks are then `Unsupported`.
    locks: Option<RedbFileBackend>,
}

/// How many times a lock taken by redb retries [`PagedCachedFile::refresh`]
/// while another thread of this process keeps buffering pages (each retry
/// flushes them first): 100.
const REFRESH_TRIES: usize = 100;

impl PagewriterBackend {
    /// Opens (creating if missing, never truncating) `path` for reading and
    /// writing with [`default_config`](Self::default_config). The file is
    /// not locked here: redb takes its locks through the backend when the
    /// database opens, and reports a file another handle holds as
    /// `DatabaseError::DatabaseAlreadyOpen`, at once.
    ///
    /// Errors: an `Io` error from the open.
    pub fn open(path: impl AsRef<Path>) -> pagewriter::Result<Self> {
        Self::open_with(
            path,
            &OpenOptions::new().lock(false),
            Self::default_config(),
        )
    }

    /// Opens an existing `path` read-only, for
    /// `redb::Builder::open_read_only_with_backend`: nothing asks for write
    /// access, so a file the process may only read (mode 0444, a read-only
    /// mount) opens.
    ///
    /// Errors: an `Io` error from the open (`NotFound` if it is missing).
    pub fn open_read_only(path: impl AsRef<Path>) -> pagewriter::Result<Self> {
        let options = OpenOptions::new().read_only(true).create(false).lock(false);
        Self::open_with(path, &options, Self::default_config())
    }

    /// [`open`](Self::open) for a writer restarting after its previous
    /// process died (`kill -9`, a crash): waits up to [`LOCK_WAIT`] for
    /// every lock on the file to go first. This backend takes its locks on
    /// a description no io_uring ring holds, so they go when the process
    /// dies; a file last held by an engine that locked through a
    /// description its ring kept open stays locked until the kernel has
    /// torn the ring down (milliseconds, after its in-flight writes
    /// finished). A lock held by a live process is waited for in full, then
    /// redb reports it as `DatabaseAlreadyOpen`; so this is opt-in, for
    /// restarts only.
    ///
    /// Errors: as [`open`](Self::open).
    pub fn open_after_crash(path: impl AsRef<Path>) -> pagewriter::Result<Self> {
        let backend = Self::open(path)?;
        if let Some(f) = backend.file.file() {
            let deadline = std::time::Instant::now() + LOCK_WAIT;
            while range_lock::query_lock_range(f, 0, None).unwrap_or(false)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        Ok(backend)
    }

    /// Opens `path` with `options` (read-only, must-exist) and `config`.
    /// `options`' lock is not taken: redb takes its own locks through the
    /// backend, and pagewriter's whole-file lock, on another description,
    /// would refuse them.
    ///
    /// Errors: as [`PagedCachedFile::open_with`]; `Error::Open` naming the
    /// path for a column-family file ([`ColumnFamilies`]), nothing written.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: &OpenOptions,
        config: Config,
    ) -> pagewriter::Result<Self> {
        let options = options.lock(false);
        let file = PagedCachedFile::open_with(path.as_ref(), &options, config)?;
        if cf::holds_directory(&file)? {
            return Err(pagewriter::Error::open(
                "open (a column-family file: open it with ColumnFamilies)",
                path.as_ref(),
                io::Error::from(io::ErrorKind::InvalidData),
            ));
        }
        #[cfg(target_os = "linux")]
        let locks = lock_description(path.as_ref(), options.is_read_only());
        #[cfg(not(target_os = "linux"))]
        let locks = match file.file() {
            Some(f) => lock_handle(f),
            None => Err(io::ErrorKind::Unsupported.into()),
        };
        let locks = locks.map_err(|e| pagewriter::Error::io("open (lock description)", None, e))?;
        Ok(Self {
            file,
            locks: Some(locks),
        })
    }

    /// Wraps an opened file. redb's locks are taken on a second
    /// description of it: on Linux opened through `/proc/self/fd`
    /// (read-only when the file is), so no io_uring ring holds it; on the
    /// other platforms (no ring there) a clone of the file's handle. Where
    /// neither can be had (a memory backend, no `/proc`), every lock call
    /// is `BackendError::Unsupported`. Open `file` with
    /// `OpenOptions::lock(false)`: pagewriter's own lock on it would make
    /// redb report the database as already open.
    pub fn new(file: PagedCachedFile) -> Self {
        let locks = file.file().and_then(|f| {
            #[cfg(target_os = "linux")]
            {
                use std::os::fd::AsRawFd;
                let path = format!("/proc/self/fd/{}", f.as_raw_fd());
                lock_description(Path::new(&path), file.is_read_only()).ok()
            }
            #[cfg(not(target_os = "linux"))]
            lock_handle(f).ok()
        });
        Self { file, locks }
    }

    /// The configuration [`open`](Self::open) uses: pagewriter's defaults
    /// (4 KiB pages, 64 MiB write buffer) with a read cache of
    /// [`DEFAULT_READ_CACHE_BYTES`], `O_DIRECT` where the file system takes
    /// it and the io_uring flush engine (queue depth 32) where a ring can be
    /// set up, each falling back as the file's
    /// [`io_mode`](PagedCachedFile::io_mode) reports.
    ///
    /// Why: a redb commit dirties ~13 pages in ~7 runs scattered over the
    /// file. With `O_DIRECT` and io_uring those runs go to the device in
    /// parallel from one `io_uring_enter`, and `fdatasync` has no page cache
    /// to write back (figures: `docs/redb.md`).
    ///
    /// Torn pages: [`TornWrites::Allow`](pagewriter::TornWrites::Allow).
    /// redb never overwrites a live page in place (copy-on-write B-trees,
    /// two commit slots in its header) and checksums its pages, so a page
    /// torn by a power cut belongs to a commit that never completed and is
    /// found by its checksum; atomic writes or a doublewrite area would
    /// cost commits/s for nothing.
    pub fn default_config() -> Config {
        Config::default()
            .torn_writes(pagewriter::TornWrites::Allow)
            .read_cache_bytes(DEFAULT_READ_CACHE_BYTES)
            .direct(pagewriter::DirectIo::Auto)
            .engine(pagewriter::FlushEngine::Auto { queue_depth: 32 })
    }

    /// The page writer underneath (for its [`stats`](PagedCachedFile::stats)).
    pub fn file(&self) -> &PagedCachedFile {
        &self.file
    }
}

impl redb::StorageBackend for PagewriterBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.file.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file
            .read_exact_at(offset, out)
            .map_err(io::Error::from)
    }

    /// Under `O_DIRECT` the file holds whole pages: a length inside a page
    /// (redb's small page sizes: 70,144 bytes, say) is rounded up to the
    /// next page, with zeros, as pagewriter does with a write ending inside
    /// the last page; [`len`](redb::StorageBackend::len) then reports the
    /// rounded length, which redb takes (it reads its layout from its
    /// header, not from the file's length).
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let len = if self.file.io_mode().direct.is_some() {
            len.checked_next_multiple_of(self.file.page_size() as u64)
                .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?
        } else {
            len
        };
        self.file.set_len(len).map_err(io::Error::from)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file.sync().map_err(io::Error::from)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.file
            .write_all_at(offset, data)
            .map_err(io::Error::from)
    }

    fn close(&self) -> Result<(), io::Error> {
        let closed = self.file.close().map_err(io::Error::from);
        // redb's contract: close releases every lock, whatever the sync did.
        let unlocked = self.unlock_all();
        closed.and(unlocked)
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        let got = self.locks()?.try_lock_range(start, end)?;
        if got {
            self.follow_or_unlock(start, end)?;
        }
        Ok(got)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        let got = self.locks()?.try_lock_shared_range(start, end)?;
        if got {
            self.follow_or_unlock(start, end)?;
        }
        Ok(got)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks()?.lock_range(start, end)?;
        self.follow_or_unlock(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks()?.lock_shared_range(start, end)?;
        self.follow_or_unlock(start, end)
    }

    /// Flushes buffered pages to the OS first, so the next holder reads
    /// them; the lock is released even if that fails (the pages stay
    /// buffered, and the error is returned).
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        let locks = self.locks()?;
        let flushed = self.file.flush().map_err(io::Error::from);
        locks.unlock_range(start, end)?;
        Ok(flushed?)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.locks()?.query_lock_range(start, end)
    }
}

impl PagewriterBackend {
    fn locks(&self) -> Result<&RedbFileBackend, BackendError> {
        self.locks.as_ref().ok_or(BackendError::Unsupported)
    }

    /// After redb took a lock: another writer may have changed the file
    /// since this handle last held one, so drop the read cache and take
    /// the length from the OS (flushing this handle's buffered pages first,
    /// which then stay visible).
    fn follow(&self) -> Result<(), BackendError> {
        for _ in 0..REFRESH_TRIES {
            match self.file.refresh() {
                Err(pagewriter::Error::Buffered { .. }) => {
                    self.file.flush().map_err(io::Error::from)?;
                }
                r => return Ok(r.map_err(io::Error::from)?),
            }
        }
        Err(BackendError::Io(io::Error::new(
            io::ErrorKind::WouldBlock,
            "pages kept being buffered while following another writer's changes",
        )))
    }

    /// [`follow`](Self::follow) after taking `start..end`; if it fails,
    /// the lock is released again (redb takes the error as the lock not
    /// taken) and the error returned.
    fn follow_or_unlock(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.follow().inspect_err(|_| {
            if let Some(l) = &self.locks {
                let _ = redb::StorageBackend::unlock_range(l, start, end);
            }
        })
    }

    /// Releases every lock redb took through this backend.
    fn unlock_all(&self) -> Result<(), io::Error> {
        match &self.locks {
            Some(l) => redb::StorageBackend::close(l),
            None => Ok(()),
        }
    }
}

/// Opens the second description redb's locks are taken on.
/// redb's backend on a clone of `file`'s handle, for its locks: where no
/// io_uring ring holds the file (every platform but Linux). On Windows it
/// must be the same file object: redb's `LockFileEx` locks are mandatory,
/// and would refuse this backend's own reads and writes on a handle of its
/// own.
#[cfg(not(target_os = "linux"))]
fn lock_handle(file: &std::fs::File) -> io::Result<RedbFileBackend> {
    RedbFileBackend::new(file.try_clone()?).map_err(|e| io::Error::other(e.to_string()))
}

#[cfg(target_os = "linux")]
fn lock_description(path: &Path, read_only: bool) -> io::Result<RedbFileBackend> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)?;
    RedbFileBackend::new(f).map_err(|e| io::Error::other(e.to_string()))
}

impl Drop for PagewriterBackend {
    /// Releases redb's locks (their description closes with this value
    /// too).
    fn drop(&mut self) {
        let _ = self.unlock_all();
    }
}
