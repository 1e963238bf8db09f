//! What a user sets and reads: [`Config`] (the seven settings), the modes
//! it names, [`IoMode`] (what open put in force, and why) and [`Stats`].
//! Everything else is derived from the backend at open or fixed.
//! Owns: the counters behind [`Stats`] (relaxed atomics).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::backend::{
    DEFAULT_QUEUE_DEPTH, DioAlign, DirectIo, FlushEngine, IOV_MAX, MAX_QUEUE_DEPTH,
};
use crate::error::{Error, Result};

/// Largest page size: 256 MiB. Pages are the unit of every allocation,
/// copy and write; a larger one is refused by [`Config::validate`].
pub const MAX_PAGE_SIZE: usize = 256 << 20;

/// Largest grow-ahead window ([`GrowAhead::Window`]): 1 GiB.
pub const MAX_GROW_WINDOW: u64 = 1 << 30;

/// Settings of a [`PagedCachedFile`](crate::PagedCachedFile). Start from
/// `Config::default()` and change what you need with the setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Page size in bytes; a power of two in 1..=[`MAX_PAGE_SIZE`].
    /// Default 4096. Page memory is aligned to the page size, at most
    /// 4096 bytes (enough for `O_DIRECT` on common devices).
    pub page_size: usize,
    /// Bound on buffered bytes (dirty and in flight). A writer that finds
    /// the buffer at or over it flushes (or waits for a flush) first. At
    /// least one page. Default 64 MiB.
    pub max_write_buffer_bytes: usize,
    /// Byte budget of the read cache of clean pages; 0 turns it off.
    /// Default 0.
    pub read_cache_bytes: usize,
    /// `O_DIRECT` or buffered. Default [`DirectIo::Off`]: buffered I/O
    /// works on every file system (tmpfs refuses `O_DIRECT`) and with any
    /// page size. An engine with its own cache sets [`DirectIo::On`]
    /// (refused where the file cannot have it) or [`DirectIo::Auto`]
    /// (falls back to buffered; [`IoMode`] says why).
    pub direct: DirectIo,
    /// Torn-page protection ([`TornWrites`]). Default [`TornWrites::Allow`]:
    /// the others cost a copy of every page or need a device with an
    /// atomic unit, and engines that checksum copy-on-write pages do not
    /// need them.
    pub torn_writes: TornWrites,
    /// Grow-ahead ([`GrowAhead`]). Default [`GrowAhead::Off`]: with a
    /// window the file's size on the OS is not its length while it is
    /// open, which an engine that reads the size itself would not expect.
    pub grow_ahead: GrowAhead,
    /// How runs are written. Default [`FlushEngine::Auto`] at queue depth
    /// 32: io_uring where a ring can be set up, else `pwritev` ([`IoMode`]
    /// says which). A flush of one run is one `pwritev` either way; the
    /// ring carries a flush of several runs in flight at once.
    pub engine: FlushEngine,
    #[cfg(feature = "testing")]
    pub(crate) tuning: Tuning,
}

/// Sizes the core derives, which tests set smaller to reach their edges
/// (`testing` feature only).
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub(crate) stripes: usize,
    pub(crate) max_run_pages: usize,
    pub(crate) max_write_bytes: usize,
}

/// Lock stripes of the write buffer and read cache.
pub(crate) const STRIPES: usize = 64;
/// Most bytes one write call carries: 1 MiB (a run is cut there).
pub(crate) const MAX_WRITE_BYTES: usize = crate::backend::DEFAULT_MAX_WRITE_BYTES;

impl Default for Config {
    fn default() -> Self {
        Self {
            page_size: 4096,
            max_write_buffer_bytes: 64 << 20,
            read_cache_bytes: 0,
            direct: DirectIo::Off,
            torn_writes: TornWrites::Allow,
            grow_ahead: GrowAhead::Off,
            engine: FlushEngine::Auto {
                queue_depth: DEFAULT_QUEUE_DEPTH,
            },
            #[cfg(feature = "testing")]
            tuning: Tuning {
                stripes: STRIPES,
                max_run_pages: IOV_MAX,
                max_write_bytes: MAX_WRITE_BYTES,
            },
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
    /// Sets [`direct`](Self::direct).
    pub fn direct(mut self, direct: DirectIo) -> Self {
        self.direct = direct;
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
    /// Sets [`engine`](Self::engine).
    pub fn engine(mut self, engine: FlushEngine) -> Self {
        self.engine = engine;
        self
    }

    /// Lock stripes (a power of two, 1..=4096); tests only.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.tuning.stripes = stripes;
        self
    }
    /// Most pages (iovecs) per write call, 1..=1024; tests only.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn max_run_pages(mut self, pages: usize) -> Self {
        self.tuning.max_run_pages = pages;
        self
    }
    /// Most bytes per write call, 1..=1 GiB; tests only.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn max_write_bytes(mut self, bytes: usize) -> Self {
        self.tuning.max_write_bytes = bytes;
        self
    }

    /// Lock stripes in force.
    pub(crate) fn stripe_count(&self) -> usize {
        #[cfg(feature = "testing")]
        return self.tuning.stripes;
        #[cfg(not(feature = "testing"))]
        STRIPES
    }

    /// Most pages per write call in force.
    pub(crate) fn run_pages(&self) -> usize {
        #[cfg(feature = "testing")]
        return self.tuning.max_run_pages;
        #[cfg(not(feature = "testing"))]
        IOV_MAX
    }

    /// Most bytes one write call carries (a backend cuts longer ones).
    pub(crate) fn max_write(&self) -> usize {
        #[cfg(feature = "testing")]
        return self.tuning.max_write_bytes;
        #[cfg(not(feature = "testing"))]
        MAX_WRITE_BYTES
    }

    /// The longest run a flush writes (bytes): the largest write call,
    /// capped at the write buffer's bound, at least a page.
    pub(crate) fn run_bytes(&self) -> usize {
        let ps = self.page_size;
        self.max_write()
            .min((self.max_write_buffer_bytes / ps).max(1) * ps)
            .max(ps)
    }

    /// Alignment of page memory: the page size, at most 4096 bytes.
    pub(crate) fn page_align(&self) -> usize {
        self.page_size.min(crate::buffer::DEFAULT_ALIGN)
    }

    /// Checks every field. Errors: [`Error::InvalidPageSize`] for the page
    /// size (0, not a power of two, or over [`MAX_PAGE_SIZE`]),
    /// [`Error::InvalidConfig`] naming the first bad field otherwise.
    pub fn validate(&self) -> Result<()> {
        let ps = self.page_size;
        if ps == 0 || !ps.is_power_of_two() || ps > MAX_PAGE_SIZE {
            return Err(Error::InvalidPageSize(ps));
        }
        let bad = |msg: String| Err(Error::InvalidConfig(msg));
        if self.max_write_buffer_bytes < ps {
            return bad(format!(
                "max_write_buffer_bytes {} is less than one page ({ps})",
                self.max_write_buffer_bytes
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
        #[cfg(feature = "testing")]
        {
            let t = self.tuning;
            if !(1..=4096).contains(&t.stripes) || !t.stripes.is_power_of_two() {
                return bad(format!(
                    "stripes {} is not a power of two in 1..=4096",
                    t.stripes
                ));
            }
            if !(1..=IOV_MAX).contains(&t.max_run_pages) {
                return bad(format!(
                    "max_run_pages {} is not in 1..={IOV_MAX}",
                    t.max_run_pages
                ));
            }
            if !(1..=1 << 30).contains(&t.max_write_bytes) {
                return bad(format!(
                    "max_write_bytes {} is not in 1..=1GiB",
                    t.max_write_bytes
                ));
            }
        }
        if let GrowAhead::Window { bytes } = self.grow_ahead {
            if bytes == 0 || bytes > MAX_GROW_WINDOW || !bytes.is_multiple_of(ps as u64) {
                return bad(format!(
                    "grow_ahead window {bytes} is not a whole number of pages ({ps}) in 1..={MAX_GROW_WINDOW} bytes"
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

/// How a file protects its pages from being torn by a power cut during a
/// write ([`Config::torn_writes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum TornWrites {
    /// No protection: a page may be left part old, part new (at 512-byte
    /// sector boundaries) by a power cut during its write. For engines
    /// that checksum their pages and never overwrite a live one in place
    /// (redb, LMDB). The default.
    #[default]
    Allow,
    /// Every page is written with `RWF_ATOMIC` (Linux 6.11+, `O_DIRECT`):
    /// a run is cut into power-of-two pieces of whole pages, aligned to
    /// their length and at most the file's atomic unit
    /// ([`AtomicUnit`](crate::backend::AtomicUnit)), each one write from
    /// one memory segment. Open fails with
    /// [`Error::TornWrites`](crate::Error::TornWrites) where the file
    /// reports no atomic unit (no `O_DIRECT`, a file system without atomic
    /// writes such as ext4) or the page size is outside it.
    Atomic,
    /// Each flush first writes its pages as one record to a doublewrite
    /// area and syncs it, then writes them in place; open repairs torn
    /// pages from it ([`PagedCachedFile::recovery`](crate::PagedCachedFile::recovery)).
    /// A commit whose changes are all in durable records needs no
    /// `fdatasync` of the file; the file is synced when the area passes
    /// 16 MiB, for a change no record holds (a `set_len`), before a cut
    /// and at `close`. The area is `<path>.dblwr` beside a file opened by
    /// path, or the backend given to
    /// [`PagedCachedFile::with_doublewrite`](crate::PagedCachedFile::with_doublewrite).
    /// An open on a disk still full fails (op "doublewrite recovery: write
    /// page"), keeping the file and the area.
    DoubleWrite,
    /// `Atomic` where the file takes atomic writes of a page and the
    /// device does them itself (`AtomicUnit::device_max`), else
    /// `DoubleWrite` (atomic writes a file system emulates cost more than
    /// the area's copy); [`IoMode`] says which and why.
    Auto,
}

impl TornWrites {
    /// The mode's name, as in the enum.
    pub fn name(self) -> &'static str {
        match self {
            TornWrites::Allow => "Allow",
            TornWrites::Atomic => "Atomic",
            TornWrites::DoubleWrite => "DoubleWrite",
            TornWrites::Auto => "Auto",
        }
    }
}

/// Grow-ahead ([`Config::grow_ahead`]): whether a growing file's size runs
/// ahead of its data, so that commits into new space overwrite blocks
/// already written instead of allocating them (each allocation, and each
/// change of the file's size, is metadata the commit's `fdatasync` must
/// write too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum GrowAhead {
    /// Every write into new space allocates it. The default: the file's
    /// size is always its length.
    #[default]
    Off,
    /// The file's size runs up to `bytes` ahead of its data while it is
    /// open, that space written (zeros) ahead of the writes by a filler
    /// thread, and the true length kept in a trailer at the file's end.
    /// `bytes`: a whole number of pages, at least one, at most
    /// [`MAX_GROW_WINDOW`]. `close` cuts the file back to its length; a
    /// crash leaves the window and trailer, which the next open (with any
    /// configuration) cuts off. Needs [`TornWrites::Allow`].
    Window {
        /// Bytes the file's size may run ahead of the data.
        bytes: u64,
    },
}

/// The I/O in force for a [`PagedCachedFile`](crate::PagedCachedFile), a
/// streaming writer or an I/O worker, decided at open.
///
/// `Display` gives one line for reports, e.g. `io_uring QD32, O_DIRECT
/// (align 512)` or `pwritev (io_uring refused: Operation not permitted),
/// buffered`; the calls named are this platform's
/// ([`PLATFORM`](crate::backend::PLATFORM)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct IoMode {
    /// The engine flushes use (never `Auto`).
    pub engine: FlushEngine,
    /// Why the engine is not the one asked for, if it is not.
    pub engine_fallback: Option<String>,
    /// `O_DIRECT` alignment if the file bypasses the page cache.
    pub direct: Option<DioAlign>,
    /// Why the file is buffered although `O_DIRECT` was asked for (`Auto`).
    pub direct_fallback: Option<String>,
    /// The torn-page protection in force (never `Auto`).
    pub torn_writes: TornWrites,
    /// Why `Auto` chose what it did (or why the streaming tools write
    /// without protection), where there is something to say.
    pub torn_writes_why: Option<String>,
    /// Grow-ahead's window in bytes, where one is configured.
    pub grow_ahead: Option<u64>,
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.engine {
            FlushEngine::IoUring { queue_depth } => write!(f, "io_uring QD{queue_depth}")?,
            other => write!(f, "{}", other.syscall())?,
        }
        if let Some(why) = &self.engine_fallback {
            write!(f, " ({why})")?;
        }
        let direct = crate::backend::PLATFORM.direct_io.unwrap_or("direct I/O");
        match (&self.direct, &self.direct_fallback) {
            (Some(a), _) if a.memory == a.offset => write!(f, ", {direct} (align {})", a.offset),
            (Some(a), _) => write!(
                f,
                ", {direct} (align {} memory, {} offset)",
                a.memory, a.offset
            ),
            (None, Some(why)) => write!(f, ", buffered ({why})"),
            (None, None) => write!(f, ", buffered"),
        }?;
        match self.torn_writes {
            TornWrites::Allow => {}
            TornWrites::Atomic => write!(f, ", atomic page writes")?,
            _ => write!(f, ", doublewrite")?,
        }
        if let Some(why) = &self.torn_writes_why {
            write!(f, " ({why})")?;
        }
        if let Some(bytes) = self.grow_ahead {
            write!(f, ", grow-ahead {} KiB window", bytes >> 10)?;
        }
        Ok(())
    }
}

/// Defines [`Stats`], its atomic twin `Counters` and the snapshot from
/// one to the other, so a field is named once.
macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// A snapshot of a file's counters, all since it was opened
        /// ([`PagedCachedFile::stats`](crate::PagedCachedFile::stats)).
        ///
        /// Read one by one without a lock, so a snapshot taken while other
        /// threads work can be off by the operations in progress.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        #[non_exhaustive]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl Counters {
            /// The counters now; the time counters kept in ns read in µs.
            pub(crate) fn snapshot(&self) -> Stats {
                let mut s = Stats { $($name: self.$name.load(Relaxed),)* };
                s.write_us /= 1000;
                s.sync_us /= 1000;
                s
            }
        }

        impl Stats {
            /// The counters of two files together (a run over several
            /// files): each summed, `peak_buffered_bytes` the larger.
            pub fn combined(&self, o: &Stats) -> Stats {
                let mut s = Stats { $($name: self.$name + o.$name,)* };
                s.peak_buffered_bytes = self.peak_buffered_bytes.max(o.peak_buffered_bytes);
                s
            }
        }
    };
}

stats! {
    /// Pages handed to the file by writers (`write_page`, `write_all_at`,
    /// guards).
    pages_dirtied,
    /// Pages written to the backend (a page rewritten before a flush is
    /// written once).
    pages_written,
    /// Runs (contiguous ranges) written.
    runs,
    /// Write calls made to the backend (`pwrite`, `pwritev`,
    /// `io_uring_enter`).
    write_calls,
    /// Bytes written to the backend (in place).
    bytes_written,
    /// Flushes that wrote at least one page.
    flushes,
    /// `fdatasync` calls of the file.
    syncs,
    /// Commits that returned `Ok` (`sync`, `Writer::commit`, resolved
    /// tickets' passes).
    commits,
    /// Time spent in backend write calls, µs.
    write_us,
    /// Time spent in `fdatasync`, µs.
    sync_us,
    /// Writes made with `RWF_ATOMIC` ([`TornWrites::Atomic`]).
    atomic_writes,
    /// Records written to the doublewrite area ([`TornWrites::DoubleWrite`]).
    doublewrite_records,
    /// Bytes written to the doublewrite area (not in `bytes_written`).
    doublewrite_bytes,
    /// `fdatasync`s of the doublewrite area (not in `syncs`).
    doublewrite_syncs,
    /// Writers that found the write buffer full and flushed or waited.
    backpressure_waits,
    /// Reads served from the write buffer or the pages in flight.
    buffer_hits,
    /// Reads served from the read cache.
    cache_hits,
    /// Page reads from the backend.
    disk_reads,
    /// Dirty and in-flight bytes held now.
    buffered_bytes,
    /// Highest `buffered_bytes` seen.
    peak_buffered_bytes,
    /// Grow-ahead: times the window moved (one size change and one
    /// `fdatasync` each).
    grow_extensions,
    /// Grow-ahead: trailer records written by flushes that changed the
    /// length.
    grow_records,
    /// Grow-ahead: zero bytes the filler wrote ahead of the data.
    grow_zero_bytes,
    /// Grow-ahead: failed fill calls (the filler stops at the first;
    /// [`PagedCachedFile::grow_ahead_stopped`](crate::PagedCachedFile::grow_ahead_stopped)
    /// says why).
    grow_errors,
}

/// Adds `n` to a counter.
#[inline]
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

/// Adds the time since `start` to a time counter (kept in ns, read in
/// µs).
pub(crate) fn add_elapsed(counter: &AtomicU64, start: std::time::Instant) {
    counter.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
}
