//! Configuration of a [`PagedCachedFile`](crate::PagedCachedFile).

use super::chooser::CommitStrategy;
use super::grow::{GrowAhead, MAX_GROW_WINDOW};
use super::torn::TornWrites;
use crate::backend::{DEFAULT_MAX_WRITE_BYTES, IOV_MAX};
use crate::backend::{DEFAULT_QUEUE_DEPTH, DirectIo, FlushEngine, MAX_QUEUE_DEPTH};
use crate::buffer::DEFAULT_ALIGN;
use crate::error::{Error, Result};

/// Largest `max_write_bytes`: 1 GiB (a write call the kernel would cut at
/// 2 GiB anyway, and the size of each io_uring bounce buffer).
pub const MAX_WRITE_BYTES: usize = 1 << 30;

/// Largest page size: 256 MiB. Pages are the unit of every allocation,
/// copy and write in the cached file; a larger one is a configuration
/// mistake, refused by [`Config::validate`] instead of failing at the first
/// write.
pub const MAX_PAGE_SIZE: usize = 256 << 20;

/// Most lock stripes of the write buffer and the read cache.
pub const MAX_STRIPES: usize = 4096;

/// Most sync lanes of a file: [`Config::sync_lanes`] for its commit
/// rounds, and the lanes scoped commits open on demand.
pub const MAX_SYNC_LANES: usize = crate::backend::MAX_LANES;

/// Most writer threads ([`Config::write_threads`]).
pub const MAX_WRITE_THREADS: usize = 64;

/// Default writer threads of the vectored engine ([`Config::write_threads`]).
pub const DEFAULT_WRITE_THREADS: usize = 4;

/// Most flushes and commit rounds writing at once
/// ([`Config::rounds_in_flight`]).
pub const MAX_ROUNDS_IN_FLIGHT: usize = 16;

/// Default of [`Config::write_through_min_bytes`]: 64 KiB.
pub const DEFAULT_WRITE_THROUGH_MIN_BYTES: usize = 64 * 1024;

/// Settings of a [`PagedCachedFile`](crate::PagedCachedFile). Start from
/// `Config::default()` and change what you need with the setters.
///
/// Read by every component at open.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Page size in bytes; a power of two in 1..=[`MAX_PAGE_SIZE`].
    /// Default 4096.
    pub page_size: usize,
    /// Bound on buffered dirty and in-flight bytes. A writer that finds the
    /// buffer at or over it flushes (or waits for the running flush) first.
    /// At least one page. Default 64 MiB.
    pub max_write_buffer_bytes: usize,
    /// Byte budget of the read cache of clean pages; 0 turns it off.
    /// Default 0.
    pub read_cache_bytes: usize,
    /// How runs are written. Default [`FlushEngine::Auto`] at queue depth
    /// 32: io_uring where a ring can be set up on the file, else `pwritev`
    /// ([`PagedCachedFile::io_mode`](crate::PagedCachedFile::io_mode) says
    /// which, and why). The ring keeps many committers' runs in flight at
    /// once; a flush of one run with nothing beside it is written inline
    /// with `pwritev` either way.
    pub engine: FlushEngine,
    /// Most bytes one write call carries (a run is cut there),
    /// 1..=[`MAX_WRITE_BYTES`]. Default 1 MiB.
    pub max_write_bytes: usize,
    /// Most pages (iovecs) in one write call; 1..=1024 (`IOV_MAX`).
    /// Default 1024.
    pub max_run_pages: usize,
    /// Number of lock stripes of the write buffer and read cache; a power of
    /// two in 1..=[`MAX_STRIPES`]. Default 64.
    pub stripes: usize,
    /// Alignment of page memory in bytes; a power of two. Default 4096
    /// (enough for `O_DIRECT` on any common device).
    pub page_align: usize,
    /// `O_DIRECT` or buffered. Default [`DirectIo::Off`]: buffered I/O
    /// works on every file system (tmpfs refuses `O_DIRECT`) and with any
    /// page size. An engine that keeps its own cache and wants to bypass
    /// the page cache sets [`DirectIo::On`] (refused where the file cannot
    /// have it) or [`DirectIo::Auto`] (falls back to buffered, and
    /// [`PagedCachedFile::io_mode`](crate::PagedCachedFile::io_mode) says
    /// why).
    pub direct: DirectIo,
    /// Most commit rounds in `fdatasync` at once, 1..=[`MAX_SYNC_LANES`] (capped by the
    /// backend's [`sync_lanes`](crate::StorageBackend::sync_lanes)).
    /// Each lane is an open file description of its own, so overlapping
    /// `fdatasync`s never share one (each sees every writeback error since
    /// its lane's previous sync), and the file system can batch their
    /// journal commits. [`sync`](crate::PagedCachedFile::sync)'s commits
    /// (rounds and direct commits) use these lanes only. Scoped commits
    /// ([`Writer::commit`](crate::Writer::commit),
    /// [`Writer::write_and_commit`](crate::Writer::write_and_commit)) use
    /// them too, and where every lane is syncing open one more (up to
    /// [`MAX_SYNC_LANES`] in all, kept until close, counted in
    /// [`Stats::sync_lanes_opened`](crate::Stats::sync_lanes_opened)), so a
    /// thread committing its own writes waits for an `fdatasync` only if
    /// one begun after its writes is in flight. Default 4. A file on
    /// btrfs keeps one lane whatever this says
    /// ([`FileBackend::with_sync_lanes`](crate::FileBackend::with_sync_lanes)).
    pub sync_lanes: usize,
    /// A commit round that writes one run, with every earlier write already
    /// synced, writes it with `RWF_DSYNC`
    /// ([`write_vectored_all_at_dsync`](crate::StorageBackend::write_vectored_all_at_dsync))
    /// instead of a write and then an `fdatasync`: one system call per
    /// commit instead of two, where the commit load is one thread (a round
    /// of several runs, or after an unsynced flush, still ends in
    /// `fdatasync`). Applies to the vectored and io_uring engines. Default
    /// off: a durable write holds the drain lock through its device round
    /// trip, which costs more than it saves wherever commits overlap.
    pub commit_dsync: bool,
    /// A [`Writer`](crate::Writer)'s `write_page` or `write_all_at` of
    /// whole pages this many bytes long or longer goes straight to disk
    /// where it can (one `pwrite` from the caller's bytes at once, no copy
    /// into the write buffer; its commit then needs only an `fdatasync`,
    /// see [`Writer::write_page`](crate::Writer::write_page)). `None`:
    /// never; every write goes into the buffer. Default
    /// `Some(`[`DEFAULT_WRITE_THROUGH_MIN_BYTES`]`)` (64 KiB): at that
    /// size the copy into the buffer costs more CPU than writing at once.
    /// A write of the same pages again before the commit writes them again,
    /// so an engine that rewrites large ranges several times before
    /// committing them sets `None` (or writes them through guards, which
    /// stay in the buffer).
    pub write_through_min_bytes: Option<usize>,
    /// Threads that write a flush's runs with the vectored engine (also
    /// where `Auto` falls back to it), 1..=[`MAX_WRITE_THREADS`], the
    /// flushing thread included: above 1, `write_threads - 1` helper
    /// threads are started at open (and joined at drop), and a flush of at
    /// least this many runs has up to this many `pwritev` calls in flight
    /// at once, as the io_uring engine has its SQEs (a flush of fewer runs
    /// writes them one after another itself: handing them over cost more
    /// than it gave). File systems such as ext4 run `O_DIRECT` writes into
    /// one file's allocated blocks in parallel, which is what the helpers
    /// use. Other engines ignore it, and so does a buffered file (a backend
    /// with a file and no `O_DIRECT`): its writes copy into the page cache,
    /// where more threads cost CPU for no more bytes per second.
    /// Default [`DEFAULT_WRITE_THREADS`] (4). 1 starts no threads. Each
    /// write slot has its own helpers ([`rounds_in_flight`](Self::rounds_in_flight)
    /// × (`write_threads` - 1) threads in all).
    pub write_threads: usize,
    /// Most flushes and commit rounds whose writes are in flight at once,
    /// 1..=[`MAX_ROUNDS_IN_FLIGHT`]. A round drains and writes while
    /// earlier rounds' writes are still in flight, each from its own write
    /// slot (with the io_uring engine, its own ring, the bounce buffers
    /// shared out over the rings); a page whose older version is in flight
    /// waits for that write before its own goes out. A round starts beside
    /// a writing one only once as many callers wait as that one covered.
    /// 1 writes one round at a time (the round after waits for the write
    /// stage).
    ///
    /// Default 1: more rounds in flight form smaller rounds, each with its
    /// own `fdatasync`, which costs more than the overlap gains on a device
    /// whose cache flush dominates a commit. Measure on your device before
    /// raising it.
    pub rounds_in_flight: usize,
    /// How `sync` commits: group commit rounds, direct commits (each
    /// caller writes what it drained and `fdatasync`s itself unless a
    /// completed `fdatasync` covers it), or `Auto`, which measures both
    /// while the file is used and keeps the faster ([`CommitStrategy`]).
    /// Default `Auto`: group commit tends to win on a growing file (each
    /// write allocates and each `fdatasync` commits the file system's
    /// journal, so fewer of both pay) and direct commits where pages are
    /// rewritten in place (grouping then only adds hand-offs). Pinning
    /// `Direct` refuses [`commit_dsync`](Self::commit_dsync).
    pub commit_strategy: CommitStrategy,
    /// Torn-page protection: none, `RWF_ATOMIC` writes, or a doublewrite
    /// area ([`TornWrites`]). Default
    /// [`TornWrites::Allow`]: the others cost a copy of every page (the
    /// doublewrite area) or need a device with an atomic unit, and engines
    /// that checksum copy-on-write pages do not need them.
    pub torn_writes: TornWrites,
    /// Grow-ahead: the file's size runs a window ahead of its data, that
    /// space written ahead of the writes, the length kept in a trailer
    /// ([`GrowAhead`]). Default [`GrowAhead::Off`]: with a window the
    /// file's size on the OS is not its length while it is open, which an
    /// engine that reads the size itself would not expect.
    pub grow_ahead: GrowAhead,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            page_size: 4096,
            max_write_buffer_bytes: 64 << 20,
            read_cache_bytes: 0,
            engine: FlushEngine::Auto {
                queue_depth: DEFAULT_QUEUE_DEPTH,
            },
            max_write_bytes: DEFAULT_MAX_WRITE_BYTES,
            max_run_pages: IOV_MAX,
            stripes: 64,
            page_align: DEFAULT_ALIGN,
            sync_lanes: 4,
            direct: DirectIo::Off,
            commit_dsync: false,
            write_through_min_bytes: Some(DEFAULT_WRITE_THROUGH_MIN_BYTES),
            write_threads: DEFAULT_WRITE_THREADS,
            rounds_in_flight: 1,
            torn_writes: TornWrites::Allow,
            commit_strategy: CommitStrategy::Auto,
            grow_ahead: GrowAhead::Off,
        }
    }
}

impl Config {
    /// Sets [`page_size`](Self::page_size).
    pub fn page_size(mut self, bytes: usize) -> Self {
        self.page_size = bytes;
        self
    }
    /// Sets [`max_write_buffer_bytes`](Self::max_write_buffer_bytes).
    pub fn max_write_buffer_bytes(mut self, bytes: usize) -> Self {
        self.max_write_buffer_bytes = bytes;
        self
    }
    /// Sets [`read_cache_bytes`](Self::read_cache_bytes).
    pub fn read_cache_bytes(mut self, bytes: usize) -> Self {
        self.read_cache_bytes = bytes;
        self
    }
    /// Sets [`engine`](Self::engine).
    pub fn engine(mut self, engine: FlushEngine) -> Self {
        self.engine = engine;
        self
    }
    /// Sets [`max_write_bytes`](Self::max_write_bytes).
    pub fn max_write_bytes(mut self, bytes: usize) -> Self {
        self.max_write_bytes = bytes;
        self
    }
    /// Sets [`max_run_pages`](Self::max_run_pages).
    pub fn max_run_pages(mut self, pages: usize) -> Self {
        self.max_run_pages = pages;
        self
    }
    /// Sets [`stripes`](Self::stripes).
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = stripes;
        self
    }
    /// Sets [`page_align`](Self::page_align).
    pub fn page_align(mut self, bytes: usize) -> Self {
        self.page_align = bytes;
        self
    }

    /// Sets [`direct`](Self::direct).
    pub fn direct(mut self, direct: DirectIo) -> Self {
        self.direct = direct;
        self
    }

    /// Sets [`sync_lanes`](Self::sync_lanes).
    pub fn sync_lanes(mut self, lanes: usize) -> Self {
        self.sync_lanes = lanes;
        self
    }

    /// Sets [`commit_dsync`](Self::commit_dsync).
    pub fn commit_dsync(mut self, on: bool) -> Self {
        self.commit_dsync = on;
        self
    }

    /// Sets [`write_through_min_bytes`](Self::write_through_min_bytes).
    pub fn write_through_min_bytes(mut self, bytes: Option<usize>) -> Self {
        self.write_through_min_bytes = bytes;
        self
    }

    /// Sets [`write_threads`](Self::write_threads).
    pub fn write_threads(mut self, threads: usize) -> Self {
        self.write_threads = threads;
        self
    }

    /// Sets [`commit_strategy`](Self::commit_strategy).
    pub fn commit_strategy(mut self, strategy: CommitStrategy) -> Self {
        self.commit_strategy = strategy;
        self
    }

    /// Sets [`rounds_in_flight`](Self::rounds_in_flight).
    pub fn rounds_in_flight(mut self, rounds: usize) -> Self {
        self.rounds_in_flight = rounds;
        self
    }

    /// Sets [`torn_writes`](Self::torn_writes).
    pub fn torn_writes(mut self, mode: TornWrites) -> Self {
        self.torn_writes = mode;
        self
    }

    /// Sets [`grow_ahead`](Self::grow_ahead).
    pub fn grow_ahead(mut self, grow: GrowAhead) -> Self {
        self.grow_ahead = grow;
        self
    }

    /// Checks every field. Errors: [`Error::InvalidPageSize`] for the page
    /// size (0, not a power of two, or over [`MAX_PAGE_SIZE`]),
    /// [`Error::InvalidConfig`] naming the first bad field otherwise.
    pub fn validate(&self) -> Result<()> {
        if self.page_size == 0
            || !self.page_size.is_power_of_two()
            || self.page_size > MAX_PAGE_SIZE
        {
            return Err(Error::InvalidPageSize(self.page_size));
        }
        let bad = |msg: String| Err(Error::InvalidConfig(msg));
        if self.max_write_buffer_bytes < self.page_size {
            return bad(format!(
                "max_write_buffer_bytes {} is less than one page ({})",
                self.max_write_buffer_bytes, self.page_size
            ));
        }
        if !(1..=MAX_WRITE_BYTES).contains(&self.max_write_bytes) {
            return bad(format!(
                "max_write_bytes {} is not in 1..={MAX_WRITE_BYTES}",
                self.max_write_bytes
            ));
        }
        if !(1..=IOV_MAX).contains(&self.max_run_pages) {
            return bad(format!(
                "max_run_pages {} is not in 1..={IOV_MAX}",
                self.max_run_pages
            ));
        }
        if !(1..=MAX_STRIPES).contains(&self.stripes) || !self.stripes.is_power_of_two() {
            return bad(format!(
                "stripes {} is not a power of two in 1..={MAX_STRIPES}",
                self.stripes
            ));
        }
        if self.page_align == 0 || !self.page_align.is_power_of_two() {
            return bad(format!(
                "page_align {} is not a power of two",
                self.page_align
            ));
        }
        if let FlushEngine::IoUring { queue_depth } | FlushEngine::Auto { queue_depth } =
            self.engine
            && !(1..=MAX_QUEUE_DEPTH).contains(&queue_depth)
        {
            return bad(format!(
                "queue depth {queue_depth} is not in 1..={MAX_QUEUE_DEPTH}"
            ));
        }
        if !(1..=MAX_SYNC_LANES).contains(&self.sync_lanes) {
            return bad(format!(
                "sync_lanes {} is not in 1..={MAX_SYNC_LANES}",
                self.sync_lanes
            ));
        }
        if !(1..=MAX_WRITE_THREADS).contains(&self.write_threads) {
            return bad(format!(
                "write_threads {} is not in 1..={MAX_WRITE_THREADS}",
                self.write_threads
            ));
        }
        if !(1..=MAX_ROUNDS_IN_FLIGHT).contains(&self.rounds_in_flight) {
            return bad(format!(
                "rounds_in_flight {} is not in 1..={MAX_ROUNDS_IN_FLIGHT}",
                self.rounds_in_flight
            ));
        }
        if self.commit_strategy == CommitStrategy::Direct && self.commit_dsync {
            return bad(
                "commit_strategy Direct with commit_dsync: a durable write stands in for \
                 the fdatasync of a group commit round only (use Group or Auto)"
                    .into(),
            );
        }
        if let GrowAhead::Window { bytes } = self.grow_ahead {
            if bytes == 0 || bytes > MAX_GROW_WINDOW || !bytes.is_multiple_of(self.page_size as u64)
            {
                return bad(format!(
                    "grow_ahead window {bytes} is not a whole number of pages ({}) in 1..={MAX_GROW_WINDOW} bytes",
                    self.page_size
                ));
            }
            if self.torn_writes != TornWrites::Allow {
                return bad(format!(
                    "grow_ahead Window with torn_writes {}: the window keeps the length in a \
                     trailer, torn-page protection in its own records (use TornWrites::Allow)",
                    self.torn_writes.name()
                ));
            }
        }
        Ok(())
    }
}
