//! The redb-style commit workload behind `pagewriter scale`.
//!
//! `T` writer threads each run transactions of `K` pages: mostly fresh
//! pages taken from a shared page allocator (contiguous within a
//! transaction), plus a fraction rewriting random earlier pages (the
//! B-tree's root path), filled with pseudo-random bytes; then a commit
//! (`sync`, or `flush` only). Each (mode, thread count) cell runs for a
//! fixed time; cells are interleaved and repeated, and rows report medians,
//! so that a slow moment of a shared machine hits every mode alike.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::datagen::{GenConfig, Generator};
use crate::error::{CoreError, Error, Result};

mod sink;
mod streams;

use crate::rng::WyRand;
use pagewriter::buffer::AlignedBuf;
use pagewriter::{
    Config, DirectIo, FileBackend, FlushEngine, PagedCachedFile, Stats, StorageBackend, TornWrites,
};
use sink::Sink;

/// What a cell measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// All threads share one [`PagedCachedFile`] using this engine.
    Engine(FlushEngine),
    /// One file per thread, each with the [`FlushEngine::PerPage`] engine:
    /// the old way around a per-page flush that collapses on a shared file.
    SeparateFiles,
    /// No page writer: each thread writes its transaction to the shared
    /// file with `pwrite` (one call for its fresh pages, one per rewrite)
    /// on an `O_DIRECT` descriptor of its own, then `fdatasync`s; each
    /// commit timed whole. fio's commit job, inside this benchmark.
    Streams,
}

impl Mode {
    /// The modes `scale` runs by default, baseline first (io-uring at queue
    /// depth 32; the CLI's `--queue-depth` changes it).
    pub const DEFAULT: [Mode; 5] = [
        Mode::Engine(FlushEngine::PerPage),
        Mode::Engine(FlushEngine::Concat),
        Mode::Engine(FlushEngine::Vectored),
        Mode::Engine(FlushEngine::IoUring {
            queue_depth: pagewriter::backend::DEFAULT_QUEUE_DEPTH,
        }),
        Mode::SeparateFiles,
    ];

    /// Name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Engine(e) => e.name(),
            Mode::SeparateFiles => "separate-files",
            Mode::Streams => "streams",
        }
    }

    /// The mode with its io_uring queue depth set to `queue_depth`.
    pub fn with_queue_depth(self, queue_depth: u32) -> Mode {
        match self {
            Mode::Engine(e) => Mode::Engine(e.with_queue_depth(queue_depth)),
            other => other,
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = Error;

    /// Parses a [`name`](Mode::name): `separate-files` or a flush engine
    /// other than `auto` (io-uring at the engine's default queue depth).
    fn from_str(s: &str) -> Result<Mode> {
        match s {
            "separate-files" => Ok(Mode::SeparateFiles),
            "streams" => Ok(Mode::Streams),
            "auto" => Err(Error::config(
                "mode auto: scale measures named engines (per-page, concat, vectored, \
                 io-uring, separate-files)"
                    .into(),
            )),
            engine => engine.parse().map(Mode::Engine).map_err(|_| {
                Error::config(format!(
                    "unknown mode {engine:?} (per-page, concat, vectored, io-uring, \
                     separate-files, streams)"
                ))
            }),
        }
    }
}

impl Serialize for Mode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// How each transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitKind {
    /// `sync()`: durable, every page any thread wrote before it (the
    /// global promise). The default.
    #[default]
    Sync,
    /// `flush()`: pages reach the OS, no `fdatasync`.
    Flush,
    /// Each thread writes through its own [`pagewriter::Writer`] and
    /// commits with `Writer::commit`: durable, its own pages only, no
    /// leader.
    Scoped,
    /// As `Scoped`, with a transaction's fresh pages (`--fill fixed` or
    /// `bytes`: one run) and its commit in one `Writer::write_and_commit`
    /// call; rewrites are written first, and the call commits them too.
    Through,
    /// As `Scoped` with `Writer::commit_async`: each thread keeps up to
    /// `in_flight` tickets and waits for the oldest when it has that many;
    /// a commit's latency runs from its start (its transaction's writes)
    /// to its ticket's resolution.
    Async {
        /// Tickets in flight per thread (at least 1).
        in_flight: usize,
    },
}

impl CommitKind {
    /// The name on the command line and in reports: `global`, `flush`,
    /// `scoped`, `through`, `async:N`.
    pub fn name(self) -> String {
        match self {
            CommitKind::Sync => "global".into(),
            CommitKind::Flush => "flush".into(),
            CommitKind::Scoped => "scoped".into(),
            CommitKind::Through => "through".into(),
            CommitKind::Async { in_flight } => format!("async:{in_flight}"),
        }
    }
}

impl std::str::FromStr for CommitKind {
    type Err = Error;

    /// Parses a [`name`](CommitKind::name) (`sync` is `global`).
    fn from_str(s: &str) -> Result<CommitKind> {
        Ok(match s {
            "global" | "sync" => CommitKind::Sync,
            "flush" => CommitKind::Flush,
            "scoped" => CommitKind::Scoped,
            "through" => CommitKind::Through,
            other => match other.strip_prefix("async:").map(str::parse::<usize>) {
                Some(Ok(n)) if (1..=1024).contains(&n) => CommitKind::Async { in_flight: n },
                _ => {
                    return Err(Error::config(format!(
                        "unknown commit {other:?} (global, flush, scoped, through, async:N with N in 1..=1024)"
                    )));
                }
            },
        })
    }
}

impl Serialize for CommitKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// How each cell's file is laid out before its clock starts. The file
/// system's cost of a commit depends on it more than on anything the page
/// writer tunes: a fresh block carries an allocation into the commit's
/// `fdatasync`, an unwritten extent a conversion, a written block nothing
/// (fio's commit job measured 7.7k, 13.2k and 31.8k commits/s at 8 jobs on
/// this crate's test disk, `.project/commit-layouts.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// A fresh file that fresh pages extend: every flush allocates new
    /// blocks (an engine appending, or growing its file page by page).
    #[default]
    Growing,
    /// [`ScaleConfig::preallocate_bytes`] reserved with `fallocate` (mode
    /// 0: unwritten extents, as fio's `--fallocate=native` lays out its
    /// file) before the clock starts; writes land inside and convert the
    /// extents. Pages past the region extend the file.
    Preallocated,
    /// [`ScaleConfig::preallocate_bytes`] written (zeros, `O_DIRECT` where
    /// the file system takes it) and synced before the clock starts, and
    /// the transactions' pages wrap around inside it: every write is an
    /// overwrite of a written block, no allocation and no size change (a
    /// database file's steady state).
    Written,
}

impl Layout {
    /// The layout's name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Growing => "growing",
            Layout::Preallocated => "preallocated",
            Layout::Written => "written",
        }
    }
}

/// How transactions fill their pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fill {
    /// Each page is taken as a zeroed guard ([`PagedCachedFile::overwrite`])
    /// and filled in place with the generator's bytes (the configured dedup
    /// and compression ratios): an engine building its pages in the
    /// buffer, as redb does. The default.
    #[default]
    Random,
    /// Each transaction copies its pages in with one
    /// [`PagedCachedFile::write_page`] from a buffer filled once per
    /// thread, with the transaction's number stamped into the first 8
    /// bytes of every page (no two writes carry the same bytes, as fio's
    /// `scramble_buffers`): an engine handing over page images it already
    /// has, and the CPU cost per write of fio's own jobs, for comparisons
    /// with fio.
    Fixed,
    /// As `Fixed`, from a `Vec<u8>` of the thread's own that is not
    /// page-aligned, copied in with `write_all_at`: an engine writing bytes
    /// from its own buffers (redb's adapter does).
    Bytes,
}

impl Fill {
    /// The fill's name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fill::Random => "random",
            Fill::Fixed => "fixed",
            Fill::Bytes => "bytes",
        }
    }
}

/// Settings of a scale run.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleConfig {
    /// Writer thread counts, one cell each. Default 1, 2, 4, 8.
    pub threads: Vec<usize>,
    /// Modes, one cell each per thread count. Default [`Mode::DEFAULT`].
    pub modes: Vec<Mode>,
    /// Pages per transaction. Default 16.
    pub pages_per_txn: usize,
    /// Page size in bytes. Default 4096.
    pub page_size: usize,
    /// Fraction of each transaction's pages that rewrite random earlier
    /// pages, in `[0, 1]`. Default 0.125 (2 of 16).
    pub rewrite_fraction: f64,
    /// How transactions end. Default [`CommitKind::Sync`].
    pub commit: CommitKind,
    /// Time each cell runs. Default 1.5 s (5 modes x 4 thread counts x 3
    /// repeats stay under 2 minutes).
    pub cell_duration: Duration,
    /// Rounds over all cells; rows report the median. Default 3.
    pub repeats: usize,
    /// Directory for the temporary files. Default: the current directory.
    pub dir: PathBuf,
    /// Seed of the page contents and rewrite choices.
    pub seed: u64,
    /// Write buffer bound in bytes. Default 64 MiB.
    pub max_write_buffer_bytes: usize,
    /// Torn-page protection ([`Config::torn_writes`]). Default
    /// [`TornWrites::Allow`]. A doublewrite area is a scratch file too.
    pub torn_writes: TornWrites,
    /// Grow-ahead window in bytes ([`Config::grow_ahead`]), 0 = off.
    /// Default 0.
    pub grow_ahead: u64,
    /// Dedup ratio of the page contents (`datagen`). Default 1.
    pub dedup_ratio: f64,
    /// Compression ratio of the page contents (`datagen`). Default 1
    /// (incompressible).
    pub compress_ratio: f64,
    /// Page reads per transaction (before its commit), for a read-heavy
    /// mix: 90% of them go to the oldest tenth of the file's pages (an
    /// engine's upper B-tree levels), the rest anywhere in it. At most
    /// [`MAX_READS_PER_TXN`]. Default 0.
    pub reads_per_txn: usize,
    /// Read cache budget in bytes ([`Config::read_cache_bytes`]; CLOCK
    /// eviction). Default 0 (no read cache).
    pub read_cache_bytes: usize,
    /// How each cell's file is laid out before its clock starts. Default
    /// [`Layout::Growing`].
    pub layout: Layout,
    /// How transactions fill their pages. Default [`Fill::Random`].
    pub fill: Fill,
    /// Bytes of each cell's file laid out before its clock starts with
    /// [`Layout::Preallocated`] (reserved with `fallocate`) or
    /// [`Layout::Written`] (written and synced; the pages wrap around
    /// inside it), split evenly over the files of a separate-files cell.
    /// Must be 0 with [`Layout::Growing`] and at least one transaction per
    /// thread with the others. At most `i64::MAX`.
    pub preallocate_bytes: u64,
    /// `O_DIRECT` or buffered. Default [`DirectIo::Auto`]: with buffered
    /// I/O the kernel's writeback coalesces per-page writes itself, which
    /// hides the cost this benchmark exists to show (`.project/results.md`).
    pub direct: DirectIo,
    /// Skip the free-space check before the run ([`room_needed`](Self::room_needed)).
    /// A cell still ends early when its file would outgrow the free space
    /// (`Cell::room_limited`). Default `false`.
    pub force: bool,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        Self {
            threads: vec![1, 2, 4, 8],
            modes: Mode::DEFAULT.to_vec(),
            pages_per_txn: 16,
            page_size: 4096,
            rewrite_fraction: 0.125,
            commit: CommitKind::Sync,
            cell_duration: Duration::from_millis(1500),
            repeats: 3,
            dir: PathBuf::from("."),
            seed: 0x5eed,
            max_write_buffer_bytes: 64 << 20,
            torn_writes: Config::default().torn_writes,
            grow_ahead: 0,
            direct: DirectIo::Auto,
            dedup_ratio: 1.0,
            compress_ratio: 1.0,
            reads_per_txn: 0,
            read_cache_bytes: 0,
            layout: Layout::Growing,
            fill: Fill::Random,
            preallocate_bytes: 0,
            force: false,
        }
    }
}

/// Most page reads per transaction [`ScaleConfig::reads_per_txn`] takes.
pub const MAX_READS_PER_TXN: usize = 1 << 16;

impl ScaleConfig {
    /// Pages of each transaction that are rewrites.
    pub fn rewrites_per_txn(&self) -> usize {
        ((self.pages_per_txn as f64) * self.rewrite_fraction).round() as usize
    }

    /// The page-content generator: page `p` holds the generator's bytes at
    /// `p * page_size` of a 16 TiB virtual file, so the contents have the
    /// configured dedup and compression ratios at the page size.
    pub fn generator(&self) -> Result<Generator> {
        Generator::new(GenConfig {
            size: 1 << 44,
            dedup_ratio: self.dedup_ratio,
            compress_ratio: self.compress_ratio,
            block_size: self.page_size.clamp(512, 1 << 20),
            seed: self.seed,
        })
    }

    /// Bytes each file of a cell with `files` files preallocates: the
    /// preallocation split evenly, each share rounded up to a page.
    pub fn preallocation_share(&self, files: usize) -> u64 {
        (self.preallocate_bytes / files.max(1) as u64).next_multiple_of(self.page_size as u64)
    }

    /// The most bytes one cell's files preallocate together (cells run one
    /// at a time, and each removes its files): what the file system must
    /// have free. A separate-files cell can take up to a page per file more
    /// than `preallocate_bytes`, its shares being rounded up to pages.
    pub fn preallocated_per_cell(&self) -> u64 {
        if self.preallocate_bytes == 0 {
            return 0;
        }
        let separate = if self.modes.contains(&Mode::SeparateFiles) {
            self.threads
                .iter()
                .map(|&t| self.preallocation_share(t).saturating_mul(t as u64))
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        separate.max(self.preallocate_bytes)
    }

    /// Bytes a run needs free before it starts: a cell's preallocation,
    /// and one transaction of fresh pages per thread at the largest thread
    /// count (a run with no room for that measures nothing).
    pub fn room_needed(&self) -> u64 {
        let threads = self.threads.iter().copied().max().unwrap_or(1) as u64;
        let txn = (self.pages_per_txn as u64).saturating_mul(self.page_size as u64);
        self.preallocated_per_cell()
            .saturating_add(threads.saturating_mul(txn))
    }

    /// With [`Layout::Written`], the page number the transactions' fresh
    /// pages wrap around at in a file of `pages` laid-out pages: whole
    /// transactions only, so none straddles the end and the file never
    /// grows. `None` for the other layouts.
    pub fn wrap_pages(&self, pages: u64) -> Option<u64> {
        match self.layout {
            Layout::Written => {
                let fresh = (self.pages_per_txn - self.rewrites_per_txn()).max(1) as u64;
                Some((pages / fresh * fresh).max(fresh))
            }
            _ => None,
        }
    }

    /// Checks the settings. Errors: [`CoreError::InvalidConfig`] naming the
    /// first bad one, [`CoreError::InvalidPageSize`].
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::config(m.to_string()));
        if self.threads.is_empty() || self.threads.contains(&0) {
            return bad("thread counts must be at least 1");
        }
        if self.threads.iter().any(|&t| t > 4096) {
            return bad("thread counts above 4096 are not supported");
        }
        if self.modes.is_empty() {
            return bad("no modes to run");
        }
        if self.pages_per_txn == 0 {
            return bad("pages per transaction must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.rewrite_fraction) {
            return bad("rewrite fraction must be in [0, 1]");
        }
        if self.repeats == 0 {
            return bad("repeats must be at least 1");
        }
        if self.reads_per_txn > MAX_READS_PER_TXN {
            return Err(Error::config(format!(
                "reads per transaction {} is above {MAX_READS_PER_TXN}",
                self.reads_per_txn
            )));
        }
        if self.cell_duration.is_zero() {
            return bad("cell duration must be above 0");
        }
        if i64::try_from(self.preallocate_bytes).is_err() {
            return bad("preallocation above i64::MAX bytes is not supported");
        }
        let txn_bytes = (self.pages_per_txn as u64).saturating_mul(self.page_size as u64);
        let threads = self.threads.iter().copied().max().unwrap_or(1) as u64;
        match self.layout {
            Layout::Growing if self.preallocate_bytes > 0 => {
                return bad("a growing layout lays nothing out: its size must be 0");
            }
            Layout::Preallocated | Layout::Written
                if self.preallocate_bytes < txn_bytes.saturating_mul(threads) =>
            {
                return Err(Error::config(format!(
                    "a {} layout of {} bytes is below one transaction per thread ({} bytes)",
                    self.layout.name(),
                    self.preallocate_bytes,
                    txn_bytes.saturating_mul(threads)
                )));
            }
            _ => {}
        }
        // The page size is also the generator's block size: say "page
        // size" before the generator says "block size".
        if !self.page_size.is_power_of_two() || !(512..=1 << 20).contains(&self.page_size) {
            return Err(Error::config(format!(
                "page size {} is not a power of two in 512..=1MiB",
                self.page_size
            )));
        }
        self.generator()?;
        for mode in &self.modes {
            let engine = match mode {
                Mode::Engine(e) => *e,
                Mode::SeparateFiles | Mode::Streams => FlushEngine::PerPage,
            };
            Config::default()
                .page_size(self.page_size)
                .max_write_buffer_bytes(self.max_write_buffer_bytes)
                .engine(engine)
                .validate()?;
        }
        Ok(())
    }
}

/// One measured cell: a mode at a thread count, one repeat.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Mode measured.
    pub mode: Mode,
    /// Writer threads.
    pub threads: usize,
    /// Which repeat (0-based).
    pub repeat: usize,
    /// Wall time from start to the last thread's end, seconds.
    pub seconds: f64,
    /// CPU seconds (user + system, whole process) over `seconds`.
    pub cpu_s: f64,
    /// The user-space part of `cpu_s` (the rest is the kernel's).
    pub cpu_user_s: f64,
    /// Pages written by transactions (rewrites included).
    pub page_writes: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Pages read by transactions.
    pub reads: u64,
    /// File counters at the end (summed over files in separate-files mode).
    pub stats: Stats,
    /// Commit latency percentiles in µs: p50, p99. A commit's latency is
    /// its call (`sync`, `flush`, `Writer::commit`, a ticket's wait) plus,
    /// with `--fill fixed`, the time its transaction spent in `write_page`
    /// calls, as a stream's `pwrite` + `fdatasync` is timed whole.
    pub p50_us: u64,
    /// See `p50_us`.
    pub p99_us: u64,
    /// The cell ended before its time: its files would have outgrown the
    /// free space (see [`run`]).
    pub room_limited: bool,
    #[serde(skip)]
    latency: Histogram<u64>,
}

impl Cell {
    /// Page writes per second.
    pub fn page_writes_per_s(&self) -> f64 {
        self.page_writes as f64 / self.seconds
    }
}

/// The median of the repeats of one (mode, threads) cell.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Mode.
    pub mode: Mode,
    /// Writer threads.
    pub threads: usize,
    /// Median page writes per second.
    pub page_writes_per_s: f64,
    /// Median commits per second.
    pub commits_per_s: f64,
    /// Median MB/s of page bytes written by transactions (10^6 bytes).
    pub mb_per_s: f64,
    /// Median write system calls per commit.
    pub write_calls_per_commit: f64,
    /// Median `fdatasync` calls per commit (a doublewrite area's
    /// included).
    pub syncs_per_commit: f64,
    /// Median KiB written per commit: in place, and to the doublewrite
    /// area where there is one ([`Config::torn_writes`]).
    pub write_kib_per_commit: f64,
    /// Median page reads per second.
    pub reads_per_s: f64,
    /// Reads served by the read cache over reads that missed the write
    /// buffer (cache hits + disk reads), over all repeats; `None` without
    /// reads.
    pub cache_hit_ratio: Option<f64>,
    /// Median CPU seconds (user + system, whole process: page fill,
    /// commits, I/O) per 10^9 bytes of pages written by transactions.
    pub cpu_s_per_gb: f64,
    /// Median CPU µs (user + system, whole process) per commit.
    pub cpu_us_per_commit: f64,
    /// Median user-space CPU µs per commit (the part of
    /// `cpu_us_per_commit` outside the kernel: page fill, the write
    /// buffer, the commit's own bookkeeping).
    pub cpu_user_us_per_commit: f64,
    /// Commit latency over all repeats, µs.
    pub p50_us: u64,
    /// See `p50_us`.
    pub p99_us: u64,
    /// `page_writes_per_s` over the per-page engine's at the same thread
    /// count (`None` when per-page was not run, or either row is not
    /// [`ranked`](Self::ranked)).
    pub vs_per_page: Option<f64>,
    /// The fewest commits any of the row's cells made.
    pub min_commits: u64,
    /// Every cell made at least [`MIN_RANKED_COMMITS`]: fewer are too few
    /// for a rate or a ratio to mean anything (run longer cells).
    pub ranked: bool,
}

/// Fewest commits a cell makes for its row to be ranked (its ratio to
/// per-page printed).
pub const MIN_RANKED_COMMITS: u64 = 20;

/// Everything a scale run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    /// The settings.
    pub config: ScaleConfig,
    /// How each mode did I/O, as [`IoMode`](pagewriter::IoMode) prints it.
    pub io_modes: Vec<(Mode, String)>,
    /// Medians, in the order of `config.threads` x `config.modes`.
    pub rows: Vec<Row>,
    /// Every cell measured.
    pub cells: Vec<Cell>,
}

impl ScaleReport {
    /// The row of `mode` at `threads`, if it was measured.
    pub fn row(&self, mode: Mode, threads: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.mode == mode && r.threads == threads)
    }
}

/// Runs every cell `config.repeats` times, interleaved, calling `progress`
/// after each, and returns the report.
///
/// The files grow by the pages the transactions write: a cell ends early
/// (`Cell::room_limited`) when its files would take more than the free
/// space of `config.dir` at the cell's start, less a margin (a twentieth,
/// at least 64 MiB), so a run never fills the file system.
///
/// Errors: a bad config; [`CoreError::InvalidConfig`] where `config.dir` has
/// less free space than [`ScaleConfig::room_needed`] (unless
/// `config.force`); any I/O error of a cell (its temporary files are
/// removed).
pub fn run(config: &ScaleConfig, mut progress: impl FnMut(&Cell)) -> Result<ScaleReport> {
    config.validate()?;
    crate::room::check(
        &config.dir.join("scale"),
        config.room_needed(),
        0,
        config.force,
    )?;
    crate::scratch::remove_stale(&config.dir);
    let mut cells = Vec::new();
    let mut io_modes: Vec<(Mode, String)> = Vec::new();
    for repeat in 0..config.repeats {
        for &threads in &config.threads {
            for &mode in &config.modes {
                let (cell, io) = run_cell(config, mode, threads, repeat)?;
                if !io_modes.iter().any(|(m, _)| *m == mode) {
                    io_modes.push((mode, io));
                }
                progress(&cell);
                cells.push(cell);
            }
        }
    }
    let rows = summarize(config, &cells);
    Ok(ScaleReport {
        config: config.clone(),
        io_modes,
        rows,
        cells,
    })
}

/// A scratch file in `dir`, removed on drop, laid out as `layout` over
/// `bytes` (nothing for [`Layout::Growing`]).
///
/// Errors: the file cannot be created; `fallocate` fails (`ENOSPC`, or a
/// file system without it: [`CoreError::Io`], op `"fallocate"`); writing or
/// syncing the written layout fails (op `"lay out: pwrite"` or `"lay out:
/// fdatasync"`). The file is removed either way.
fn temp_file(dir: &Path, layout: Layout, bytes: u64) -> Result<tempfile::NamedTempFile> {
    let t = crate::scratch::create(dir, "scale")?;
    match layout {
        Layout::Growing => {}
        Layout::Preallocated => {
            FileBackend::open(t.path())
                .and_then(|b| b.allocate(0, bytes))
                .map_err(|e| Error::io("fallocate", Some(0), e))?;
        }
        Layout::Written => write_zeros(t.path(), bytes)?,
    }
    Ok(t)
}

/// Writes `bytes` of zeros at the start of the file at `path` in 1 MiB
/// writes (`O_DIRECT` where the file system takes it, so the page cache is
/// not filled) and syncs it: every block written, nothing left to
/// allocate or convert.
fn write_zeros(path: &Path, bytes: u64) -> Result<()> {
    const CHUNK: usize = 1 << 20;
    let opts = pagewriter::OpenOptions::new().lock(false);
    let (file, _) = pagewriter::backend::open_with_options(path, &opts, DirectIo::Auto, &|_| None)?;
    let align = file
        .dio_align()
        .map_or(4096, |a| a.memory as usize)
        .max(4096);
    let buf = pagewriter::buffer::AlignedBuf::zeroed(CHUNK, align).ok_or(CoreError::NoMemory {
        bytes: CHUNK as u64,
    })?;
    let mut at = 0u64;
    while at < bytes {
        let n = (bytes - at).min(CHUNK as u64) as usize;
        file.write_all_at(at, &buf[..n])
            .map_err(|e| Error::io("lay out: pwrite", Some(at), e))?;
        at += n as u64;
    }
    file.sync_data()
        .map_err(|e| Error::io("lay out: fdatasync", None, e))
}

fn open_cached(
    file: &tempfile::NamedTempFile,
    config: &ScaleConfig,
    engine: FlushEngine,
) -> Result<PagedCachedFile> {
    // Where io_uring is refused the mode runs as pwritev and its I/O line
    // says why, so the default run works everywhere.
    let engine = match engine {
        FlushEngine::IoUring { queue_depth } => FlushEngine::Auto { queue_depth },
        other => other,
    };
    let cfg = Config::default()
        .page_size(config.page_size)
        .max_write_buffer_bytes(config.max_write_buffer_bytes)
        .torn_writes(config.torn_writes)
        .grow_ahead(match config.grow_ahead {
            0 => pagewriter::GrowAhead::Off,
            bytes => pagewriter::GrowAhead::Window { bytes },
        })
        .read_cache_bytes(config.read_cache_bytes)
        .direct(config.direct)
        .engine(engine);
    if config.torn_writes != TornWrites::Allow {
        crate::scratch::sidecar(file.path());
    }
    Ok(PagedCachedFile::open(file.path(), cfg)?)
}

/// Runs one cell; returns it with the I/O mode its file(s) used.
pub fn run_cell(
    config: &ScaleConfig,
    mode: Mode,
    threads: usize,
    repeat: usize,
) -> Result<(Cell, String)> {
    let (temps, files): (Vec<_>, Vec<_>) = match mode {
        Mode::Engine(engine) => {
            let t = temp_file(&config.dir, config.layout, config.preallocate_bytes)?;
            let f = Arc::new(open_cached(&t, config, engine)?);
            (vec![t], vec![f])
        }
        Mode::SeparateFiles => {
            let mut temps = Vec::new();
            let mut files = Vec::new();
            let share = config.preallocation_share(threads);
            for _ in 0..threads {
                let t = temp_file(&config.dir, config.layout, share)?;
                files.push(Arc::new(open_cached(&t, config, FlushEngine::PerPage)?));
                temps.push(t);
            }
            (temps, files)
        }
        Mode::Streams => {
            let t = temp_file(&config.dir, config.layout, config.preallocate_bytes)?;
            (vec![t], vec![])
        }
    };
    let slots = files.len().max(1);
    let allocators: Vec<AtomicU64> = (0..slots).map(|_| AtomicU64::new(0)).collect();
    // Pages each file may grow to: its share of the free space now, less
    // a margin, plus what it preallocated (already taken from the free
    // space).
    let prealloc_pages = match mode {
        Mode::Engine(_) | Mode::Streams => config.preallocate_bytes,
        Mode::SeparateFiles => config.preallocation_share(threads),
    } / config.page_size as u64;
    let limit_pages = pagewriter::backend::free_space(&config.dir).map_or(u64::MAX, |free| {
        let margin = (free / 20).max(64 << 20);
        free.saturating_sub(margin) / slots as u64 / config.page_size as u64 + prealloc_pages
    });
    let wrap_pages = config.wrap_pages(prealloc_pages);
    let room_limited = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let cpu = crate::cpu::process_times();
    let results: Vec<Result<Tally>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let which = t % slots;
                let file = files.get(which);
                let path = temps[which.min(temps.len() - 1)].path();
                let alloc = &allocators[which];
                let stop = &stop;
                let room = Room {
                    limit_pages,
                    wrap_pages,
                    hit: &room_limited,
                };
                let seed = config.seed
                    ^ ((repeat as u64) << 32)
                    ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9);
                s.spawn(move || match file {
                    Some(file) => writer(config, file, alloc, stop, room, seed),
                    None => streams::writer(config, path, alloc, stop, room, seed),
                })
            })
            .collect();
        // The cell's time, or until a writer ends it (no room left).
        while !stop.load(Ordering::Relaxed) {
            let left = config.cell_duration.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or(Err(Error::Panicked {
                    worker: "scale writer thread",
                }))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let (cpu_user_s, cpu_system_s) = crate::cpu::split_since(cpu);
    let cpu_s = cpu_user_s + cpu_system_s;
    let mut latency = new_histogram();
    let (mut page_writes, mut commits, mut reads) = (0, 0, 0);
    let mut stats = files
        .iter()
        .fold(Stats::default(), |acc, f| acc.combined(&f.stats()));
    for r in results {
        let t = r?;
        page_writes += t.pages;
        commits += t.commits;
        reads += t.reads;
        latency.add(&t.latency).expect("same histogram bounds");
        stats = stats.combined(&t.own_io);
    }
    let io = match files.first() {
        Some(f) => f.io_mode().to_string(),
        None => format!(
            "pwrite + fdatasync per commit on a descriptor per thread (no page writer), {}",
            match config.direct {
                DirectIo::Off => "buffered",
                _ => "O_DIRECT where the file system takes it",
            }
        ),
    };
    drop(files);
    if config.torn_writes != TornWrites::Allow {
        for t in &temps {
            let _ = std::fs::remove_file(crate::scratch::sidecar(t.path()));
        }
    }
    drop(temps);
    let cell = Cell {
        mode,
        threads,
        repeat,
        seconds,
        cpu_s,
        cpu_user_s,
        page_writes,
        commits,
        reads,
        stats,
        p50_us: latency.value_at_quantile(0.50),
        p99_us: latency.value_at_quantile(0.99),
        room_limited: room_limited.load(Ordering::Relaxed),
        latency,
    };
    Ok((cell, io))
}

pub(super) fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid bounds")
}

/// What one writer thread did.
pub(super) struct Tally {
    pub(super) pages: u64,
    pub(super) commits: u64,
    pub(super) reads: u64,
    /// Commit latency, µs.
    pub(super) latency: Histogram<u64>,
    /// Calls made outside a page writer (the streams mode): write calls,
    /// bytes, `fdatasync`s.
    pub(super) own_io: Stats,
}

/// How far a cell's file may grow, and the flag set when it would grow
/// past that.
#[derive(Clone, Copy)]
pub(super) struct Room<'a> {
    pub(super) limit_pages: u64,
    /// A written layout: page numbers wrap around below this.
    pub(super) wrap_pages: Option<u64>,
    pub(super) hit: &'a AtomicBool,
}

impl Room<'_> {
    /// The first of the next `fresh` pages a transaction writes, taken
    /// from `alloc` (wrapped in a written layout); `None`, with `hit` and
    /// `stop` set, where they would grow the file past the limit.
    pub(super) fn claim(&self, alloc: &AtomicU64, fresh: u64, stop: &AtomicBool) -> Option<u64> {
        let first = alloc.fetch_add(fresh, Ordering::Relaxed);
        match self.wrap_pages {
            Some(wrap) => Some(first % wrap),
            None if first.saturating_add(fresh) > self.limit_pages => {
                self.hit.store(true, Ordering::Relaxed);
                stop.store(true, Ordering::Relaxed);
                None
            }
            None => Some(first),
        }
    }
}

/// A thread's transaction buffer for `--fill fixed` (page-aligned, as an
/// engine's page buffers are, so `O_DIRECT` can write from them) or
/// `bytes` (a `Vec<u8>` eight bytes off page alignment).
enum Fixed {
    Aligned(AlignedBuf),
    Unaligned(Vec<u8>),
}

impl Fixed {
    fn new(fill: Fill, len: usize, init: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<Fixed> {
        let mut f = match fill {
            Fill::Bytes => {
                let mut v = vec![0u8; len + 8];
                // Off page alignment whatever the allocator gave.
                let skew = if (v.as_ptr() as usize).is_multiple_of(4096) {
                    8
                } else {
                    0
                };
                v.drain(..skew);
                v.truncate(len);
                Fixed::Unaligned(v)
            }
            _ => Fixed::Aligned(
                AlignedBuf::zeroed(len, 4096).ok_or(CoreError::NoMemory { bytes: len as u64 })?,
            ),
        };
        init(f.bytes())?;
        Ok(f)
    }

    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Fixed::Aligned(b) => b,
            Fixed::Unaligned(v) => v,
        }
    }
}

/// One writer thread: transactions until `stop`, or until the next one
/// would grow the file past `room` (then it stops the cell).
fn writer(
    config: &ScaleConfig,
    file: &PagedCachedFile,
    alloc: &AtomicU64,
    stop: &AtomicBool,
    room: Room<'_>,
    seed: u64,
) -> Result<Tally> {
    let ps = config.page_size as u64;
    let rewrites = config.rewrites_per_txn() as u64;
    let fresh = config.pages_per_txn as u64 - rewrites;
    let mut rng = WyRand::new(seed);
    let data = config.generator()?;
    let mut sink = Sink::new(file, config.commit);
    let mut latency = new_histogram();
    let (mut pages, mut commits, mut reads) = (0u64, 0u64, 0u64);
    // Fill::Fixed: one transaction's pages, filled once (page-aligned, as
    // an engine's page buffers are, so `O_DIRECT` can write from them).
    let mut fixed = match config.fill {
        Fill::Fixed | Fill::Bytes => Some(Fixed::new(
            config.fill,
            (fresh.max(1) * ps) as usize,
            |b| data.fill_at(seed.wrapping_mul(ps) % (1 << 40), b),
        )?),
        Fill::Random => None,
    };
    let bytes = config.fill == Fill::Bytes;
    // `through`: the fresh pages go with the commit, in one call.
    let through = matches!(config.commit, CommitKind::Through) && fixed.is_some() && fresh > 0;
    while !stop.load(Ordering::Relaxed) {
        let Some(first) = room.claim(alloc, fresh, stop) else {
            break;
        };
        // Time in this transaction's `write_page` calls: part of its
        // commit's latency, as a stream's `pwrite` is part of its own.
        let mut wrote = Duration::ZERO;
        match config.fill {
            Fill::Random => {
                for p in first..first + fresh {
                    let mut page = sink.overwrite(p * ps, ps as usize)?;
                    data.fill_at(p * ps, &mut page)?;
                }
            }
            Fill::Fixed | Fill::Bytes if fresh > 0 => {
                let fixed = fixed.as_mut().expect("filled").bytes();
                for page in fixed.chunks_mut(ps as usize) {
                    page[..8].copy_from_slice(&commits.to_le_bytes());
                }
                if !through {
                    let t0 = Instant::now();
                    sink.write(first * ps, fixed, bytes)?;
                    wrote += t0.elapsed();
                }
            }
            Fill::Fixed | Fill::Bytes => {}
        }
        for _ in 0..rewrites {
            let mut high = alloc.load(Ordering::Relaxed);
            if let Some(wrap) = room.wrap_pages {
                high = high.min(wrap);
            }
            let p = if high == 0 { first } else { rng.below(high) };
            match config.fill {
                Fill::Random => {
                    let mut page = sink.overwrite(p * ps, ps as usize)?;
                    // A rewrite carries other bytes: the generator's page
                    // further on.
                    data.fill_at(((p + (1 << 30)) * ps) % (1 << 44), &mut page)?;
                }
                Fill::Fixed | Fill::Bytes => {
                    let fixed = fixed.as_mut().expect("filled").bytes();
                    let page = &mut fixed[..ps as usize];
                    page[..8].copy_from_slice(&(!commits).to_le_bytes());
                    let t0 = Instant::now();
                    sink.write(p * ps, page, bytes)?;
                    wrote += t0.elapsed();
                    if through {
                        // Its fresh pages go out at the commit, from here.
                        page[..8].copy_from_slice(&commits.to_le_bytes());
                    }
                }
            }
        }
        pages += fresh + rewrites;
        // Reads of whole pages the transactions have allocated so far
        // (pages allocated but not yet written by their thread read as
        // zeros); not the file's length, which a preallocated file has
        // from the start.
        let have = alloc.load(Ordering::Relaxed).min(file.len() / ps);
        if have > 0 {
            let hot = (have / 10).max(1);
            for _ in 0..config.reads_per_txn {
                let p = if rng.below(10) < 9 {
                    rng.below(hot)
                } else {
                    rng.below(have)
                };
                std::hint::black_box(file.read(p * ps, ps as usize)?);
                reads += 1;
            }
        }
        commits += match fixed.as_mut() {
            Some(fixed) if through => {
                sink.write_and_commit(first * ps, fixed.bytes(), wrote, &mut latency)?
            }
            _ => sink.commit(wrote, &mut latency)?,
        };
    }
    commits += sink.finish(&mut latency)?;
    Ok(Tally {
        pages,
        commits,
        reads,
        latency,
        own_io: Stats::default(),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Medians per (mode, threads), and each mode's ratio to per-page.
pub fn summarize(config: &ScaleConfig, cells: &[Cell]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &threads in &config.threads {
        for &mode in &config.modes {
            let these: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.mode == mode && c.threads == threads)
                .collect();
            if these.is_empty() {
                continue;
            }
            let per = |f: &dyn Fn(&Cell) -> f64| median(these.iter().map(|c| f(c)).collect());
            let mut latency = new_histogram();
            for c in &these {
                latency.add(&c.latency).expect("same histogram bounds");
            }
            let per_commit = |n: u64, c: &Cell| {
                if c.commits == 0 {
                    0.0
                } else {
                    n as f64 / c.commits as f64
                }
            };
            rows.push(Row {
                mode,
                threads,
                page_writes_per_s: per(&|c| c.page_writes_per_s()),
                commits_per_s: per(&|c| c.commits as f64 / c.seconds),
                mb_per_s: per(&|c| {
                    c.page_writes as f64 * config.page_size as f64 / c.seconds / 1e6
                }),
                write_calls_per_commit: per(&|c| per_commit(c.stats.write_calls, c)),
                syncs_per_commit: per(&|c| {
                    per_commit(c.stats.syncs + c.stats.doublewrite_syncs, c)
                }),
                write_kib_per_commit: per(&|c| {
                    per_commit(c.stats.bytes_written + c.stats.doublewrite_bytes, c) / 1024.0
                }),
                reads_per_s: per(&|c| c.reads as f64 / c.seconds),
                cache_hit_ratio: {
                    let hits: u64 = these.iter().map(|c| c.stats.cache_hits).sum();
                    let disk: u64 = these.iter().map(|c| c.stats.disk_reads).sum();
                    (hits + disk > 0).then(|| hits as f64 / (hits + disk) as f64)
                },
                cpu_s_per_gb: per(&|c| {
                    c.cpu_s / (c.page_writes.max(1) as f64 * config.page_size as f64 / 1e9)
                }),
                cpu_us_per_commit: per(&|c| c.cpu_s * 1e6 / c.commits.max(1) as f64),
                cpu_user_us_per_commit: per(&|c| c.cpu_user_s * 1e6 / c.commits.max(1) as f64),
                p50_us: latency.value_at_quantile(0.50),
                p99_us: latency.value_at_quantile(0.99),
                vs_per_page: None,
                min_commits: these.iter().map(|c| c.commits).min().unwrap_or(0),
                ranked: these.iter().all(|c| c.commits >= MIN_RANKED_COMMITS),
            });
        }
    }
    let base: Vec<(usize, f64)> = rows
        .iter()
        .filter(|r| r.mode == Mode::Engine(FlushEngine::PerPage) && r.ranked)
        .map(|r| (r.threads, r.page_writes_per_s))
        .collect();
    for r in &mut rows {
        if let Some(&(_, b)) = base.iter().find(|(t, _)| *t == r.threads)
            && b > 0.0
            && r.ranked
        {
            r.vs_per_page = Some(r.page_writes_per_s / b);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names_parse_back_and_auto_is_refused() {
        for m in Mode::DEFAULT {
            assert_eq!(m.name().parse::<Mode>().unwrap(), m);
        }
        assert_eq!(
            "io-uring".parse::<Mode>().unwrap().with_queue_depth(4),
            Mode::Engine(FlushEngine::IoUring { queue_depth: 4 })
        );
        assert!("auto".parse::<Mode>().is_err());
        assert!("separate".parse::<Mode>().is_err());
    }

    #[test]
    fn reads_hit_the_read_cache_once_it_holds_the_hot_pages() {
        let dir = tempfile::tempdir().unwrap();
        let config = |cache| ScaleConfig {
            threads: vec![2],
            modes: vec![Mode::Engine(FlushEngine::Vectored)],
            cell_duration: Duration::from_millis(300),
            repeats: 1,
            dir: dir.path().to_path_buf(),
            direct: DirectIo::Off,
            commit: CommitKind::Flush,
            reads_per_txn: 32,
            read_cache_bytes: cache,
            ..ScaleConfig::default()
        };
        let rows = |cache| run(&config(cache), |_| {}).unwrap().rows;
        let none = &rows(0)[0];
        assert!(none.reads_per_s > 0.0);
        // Without a cache every read that misses the write buffer is a
        // disk read.
        assert_eq!(none.cache_hit_ratio, Some(0.0));
        // A cache larger than the whole file serves nearly every read that
        // missed the write buffer (the first read of each page misses).
        let big = &rows(1 << 30)[0];
        let hit = big.cache_hit_ratio.expect("reads missed the write buffer");
        assert!(hit > 0.5, "hit ratio {hit}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn too_many_reads_per_transaction_is_a_config_error() {
        let c = ScaleConfig {
            reads_per_txn: MAX_READS_PER_TXN + 1,
            ..ScaleConfig::default()
        };
        assert!(
            matches!(c.validate(), Err(Error::Core(CoreError::InvalidConfig(m))) if m.contains("reads"))
        );
        let c = ScaleConfig {
            reads_per_txn: MAX_READS_PER_TXN,
            ..ScaleConfig::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn a_written_layout_never_grows_the_file_and_its_pages_wrap_around() {
        let dir = tempfile::tempdir().unwrap();
        // 1 MiB laid out: 16 transactions of 16 pages.
        let config = ScaleConfig {
            threads: vec![1],
            layout: Layout::Written,
            preallocate_bytes: 1 << 20,
            rewrite_fraction: 0.125,
            direct: DirectIo::Off,
            ..ScaleConfig::default()
        };
        config.validate().unwrap();
        let t = temp_file(dir.path(), Layout::Written, 1 << 20).unwrap();
        let before = std::fs::read(t.path()).unwrap();
        assert_eq!(before.len(), 1 << 20, "the layout is written out");
        assert!(before.iter().all(|&b| b == 0));
        let f = open_cached(&t, &config, FlushEngine::Vectored).unwrap();
        let (alloc, stop, hit) = (
            AtomicU64::new(0),
            AtomicBool::new(false),
            AtomicBool::new(false),
        );
        let room = Room {
            limit_pages: u64::MAX,
            wrap_pages: config.wrap_pages(256),
            hit: &hit,
        };
        let tally = std::thread::scope(|s| {
            let w = s.spawn(|| writer(&config, &f, &alloc, &stop, room, 7));
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::Relaxed);
            w.join().unwrap().unwrap()
        });
        assert!(
            tally.commits > 16,
            "{} commits: too few to wrap",
            tally.commits
        );
        assert_eq!(f.len(), 1 << 20, "the file grew past its layout");
        drop(f);
        assert_eq!(std::fs::metadata(t.path()).unwrap().len(), 1 << 20);
    }

    #[test]
    fn layouts_refuse_sizes_that_do_not_fit_them() {
        let bad = |layout, bytes| {
            let c = ScaleConfig {
                layout,
                preallocate_bytes: bytes,
                ..ScaleConfig::default()
            };
            matches!(c.validate(), Err(Error::Core(CoreError::InvalidConfig(_))))
        };
        assert!(
            bad(Layout::Growing, 1 << 20),
            "a growing layout lays nothing out"
        );
        // Below one 16-page transaction per thread (8 threads).
        assert!(bad(Layout::Written, 8 * 16 * 4096 - 1));
        assert!(bad(Layout::Preallocated, 4096));
        assert!(!bad(Layout::Written, 8 * 16 * 4096));
        assert!(!bad(Layout::Growing, 0));
    }

    #[test]
    fn a_preallocated_cell_file_holds_its_blocks_and_writes_inside_them() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let t = temp_file(dir.path(), Layout::Preallocated, 8 << 20).unwrap();
        let m = std::fs::metadata(t.path()).unwrap();
        assert_eq!(m.len(), 8 << 20);
        assert!(m.blocks() * 512 >= 8 << 20, "{} blocks", m.blocks());
        // Fresh pages land inside the reserved blocks: the file keeps its
        // length.
        let config = ScaleConfig {
            direct: DirectIo::Off,
            ..ScaleConfig::default()
        };
        let f = open_cached(&t, &config, FlushEngine::Vectored).unwrap();
        f.write_page(0, &[1u8; 4096]).unwrap();
        f.sync().unwrap();
        assert_eq!(std::fs::metadata(t.path()).unwrap().len(), 8 << 20);
        drop(f);
        let path = t.path().to_path_buf();
        drop(t);
        assert!(!path.exists());
        // Separate-files shares round up to a page: the room check counts
        // what the files take together, not the figure asked for.
        let c = ScaleConfig {
            preallocate_bytes: 10_000,
            threads: vec![1, 3],
            modes: vec![Mode::Engine(FlushEngine::Vectored), Mode::SeparateFiles],
            ..ScaleConfig::default()
        };
        assert_eq!(c.preallocation_share(3), 4096);
        assert_eq!(c.preallocated_per_cell(), 3 * 4096);
        let c = ScaleConfig {
            modes: vec![Mode::Engine(FlushEngine::Vectored)],
            ..c
        };
        assert_eq!(c.preallocated_per_cell(), 10_000);
        // Bad sizes are refused before any file is made.
        let c = ScaleConfig {
            preallocate_bytes: u64::MAX,
            ..ScaleConfig::default()
        };
        assert!(
            matches!(c.validate(), Err(Error::Core(CoreError::InvalidConfig(m))) if m.contains("preallocation"))
        );
    }
}
