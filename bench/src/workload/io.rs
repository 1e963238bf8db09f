//! `pagewriter io`: a fio-style I/O worker, and shared-file writes split
//! across threads, processes and Slurm ranks.
//!
//! Each job (thread) works on its own region of one file: `[offset +
//! j * offset_increment, + size)`, or, in shared-file mode, part
//! `rank * numjobs + j` of [`part`]'s partition of the whole file. A job
//! issues `bs`-byte I/Os (the last one of a region shorter) sequentially or
//! at seeded random offsets that visit every block once per pass, reads or
//! writes or a mix, through io_uring (a [`SlotRing`] of `iodepth` buffers:
//! fixed buffers, registered file, SQPOLL and IOPOLL on request) or `psync`
//! (`pread`/`pwrite`, one at a time). Every I/O's latency, from submission
//! to the reap that saw its completion, goes into the job's HdrHistogram;
//! the jobs' histograms are merged at the end (not a sample: all of them).
//!
//! Written bytes are the [`Generator`]'s bytes at their file offset
//! (`Pattern::Gen`), so any part of the file can be checked against the
//! generator; `Pattern::Header` puts a header with the block's offset and a
//! checksum at the start of each block; `Pattern::Fixed` fills each buffer
//! once and writes it again and again, as fio does by default.
//!
//! [`SlotRing`]: pagewriter::backend::ring::SlotRing

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;

use crate::datagen::{GenConfig, Generator, Permutation};
use crate::rng::WyRand;
use pagewriter::DirectIo;
use pagewriter::backend::open_with_direct;
use pagewriter::backend::{DioAlign, FileBackend, StorageBackend};
use pagewriter::buffer::{AlignedBuf, DEFAULT_ALIGN};
use pagewriter::error::{Error, Result};

/// Access pattern, as fio's `rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential, each I/O a read with probability `rwmix_read` %.
    Rw,
    /// Random, each I/O a read with probability `rwmix_read` %.
    RandRw,
}

impl Rw {
    /// fio's name of this pattern.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::RandRead => "randread",
            Self::RandWrite => "randwrite",
            Self::Rw => "rw",
            Self::RandRw => "randrw",
        }
    }

    /// Parses fio's names: read, write, randread, randwrite, rw (readwrite),
    /// randrw.
    ///
    /// Errors: [`Error::InvalidConfig`] for any other name.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "rw" | "readwrite" => Self::Rw,
            "randrw" => Self::RandRw,
            other => {
                return Err(Error::InvalidConfig(format!(
                    "unknown rw {other:?} (read, write, randread, randwrite, rw, randrw)"
                )));
            }
        })
    }

    fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }

    /// Percentage of I/Os that are reads.
    fn read_percent(self, rwmix_read: u32) -> u32 {
        match self {
            Self::Read | Self::RandRead => 100,
            Self::Write | Self::RandWrite => 0,
            Self::Rw | Self::RandRw => rwmix_read,
        }
    }
}

/// How I/O is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoEngine {
    /// io_uring, up to `iodepth` I/Os in flight per job.
    IoUring,
    /// `pread`/`pwrite`, one I/O at a time per job.
    Psync,
}

impl IoEngine {
    /// Parses `io_uring` (or `io-uring`) and `psync` (or `pwrite`).
    ///
    /// Errors: [`Error::InvalidConfig`] for any other name.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "io_uring" | "io-uring" => Ok(Self::IoUring),
            "psync" | "pwrite" => Ok(Self::Psync),
            other => Err(Error::InvalidConfig(format!(
                "unknown engine {other:?} (io_uring, psync)"
            ))),
        }
    }
}

/// What written blocks hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// The generator's bytes at the I/O's file offset (filled per I/O).
    Gen,
    /// Per block of `bs`: a 32-byte header (magic, offset, seed, XXH3-64 of
    /// the rest) then the generator's bytes.
    Header,
    /// Each buffer filled once at start and rewritten (fio's default).
    Fixed,
}

/// Shared-file mode: this process's place among the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ranks {
    /// This rank, `0..ranks`.
    pub rank: u32,
    /// Ranks in all.
    pub ranks: u32,
    /// Slurm node id, if known (reports only).
    pub node: Option<u32>,
}

/// The id all ranks of one run share, written into every rank's report so
/// that `report` never mixes runs: `SLURM_JOB_ID[.SLURM_STEP_ID]` under
/// Slurm, else `ppid-N` (ranks started by one launcher share its PID).
/// The CLI's `--run-id` overrides it.
pub fn default_run_id() -> String {
    match (
        std::env::var("SLURM_JOB_ID"),
        std::env::var("SLURM_STEP_ID"),
    ) {
        (Ok(job), Ok(step)) => format!("slurm-{job}.{step}"),
        (Ok(job), Err(_)) => format!("slurm-{job}"),
        _ => format!("ppid-{}", std::os::unix::process::parent_id()),
    }
}

impl Ranks {
    /// From Slurm's environment: `SLURM_PROCID`, `SLURM_NTASKS`,
    /// `SLURM_NODEID`; `None` where the first two are not set.
    pub fn from_slurm_env() -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok()?.parse::<u32>().ok();
        Some(Self {
            rank: var("SLURM_PROCID")?,
            ranks: var("SLURM_NTASKS")?,
            node: var("SLURM_NODEID"),
        })
    }
}

/// A job's settings; `IoConfig::new(path)` and change what you need.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IoConfig {
    /// The file.
    pub path: PathBuf,
    /// Access pattern.
    pub rw: Rw,
    /// Percent reads for `rw` / `randrw`, 0..=100.
    pub rwmix_read: u32,
    /// Bytes per I/O; with `O_DIRECT` a multiple of the file's alignment.
    pub bs: usize,
    /// Bytes per job region; in shared-file mode, the whole file.
    pub size: u64,
    /// Time-based: run this long, cycling over the region; `None`: one
    /// pass over the region.
    pub runtime: Option<Duration>,
    /// I/Os in flight per job (io_uring), 1..=4096.
    pub iodepth: u32,
    /// Reap at least this many completions per wait (and so submit in
    /// batches), 1..=iodepth.
    pub iodepth_batch: u32,
    /// Jobs (threads).
    pub numjobs: usize,
    /// `O_DIRECT`.
    pub direct: DirectIo,
    /// Engine.
    pub engine: IoEngine,
    /// io_uring: registered buffers (`READ_FIXED`/`WRITE_FIXED`).
    pub fixedbufs: bool,
    /// io_uring: registered file.
    pub registerfiles: bool,
    /// io_uring: `IORING_SETUP_SQPOLL`.
    pub sqthread_poll: bool,
    /// io_uring: `IORING_SETUP_IOPOLL` (needs `O_DIRECT` and poll queues).
    pub hipri: bool,
    /// Allocate even when the file system's free space looks too small.
    #[serde(default)]
    pub force: bool,
    /// The run this job belongs to (see [`default_run_id`]); every rank of
    /// a shared-file run must use the same.
    #[serde(default)]
    pub run_id: String,
    /// Byte offset of job 0's region.
    pub offset: u64,
    /// Distance between job regions in bytes; `None`: `size` (each job its
    /// own region); `Some(0)`: all jobs on the same region.
    pub offset_increment: Option<u64>,
    /// `fdatasync` after every N writes (0: never); in-flight writes
    /// complete first.
    pub fsync_every: u64,
    /// `fdatasync` when a job's writes are done (timed).
    pub end_fsync: bool,
    /// Data written.
    pub pattern: Pattern,
    /// Dedup ratio of generated data.
    pub dedup_ratio: f64,
    /// Compression ratio of generated data.
    pub compress_ratio: f64,
    /// Seed of data and random offsets.
    pub seed: u64,
    /// After the run, read each job's region back and check every block.
    pub verify: bool,
    /// io_uring buffers on 2 MiB huge pages (reserved, else transparent):
    /// physically contiguous, so a large I/O needs few segments.
    #[serde(default)]
    pub hugepages: bool,
    /// Shared-file mode: split `size` among ranks and jobs.
    pub shared: Option<Ranks>,
}

impl IoConfig {
    /// Defaults like fio's: sequential read, 4 KiB, 1 GiB, QD 1, one job,
    /// buffered, io_uring, generated data.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            rw: Rw::Read,
            rwmix_read: 50,
            bs: 4096,
            size: 1 << 30,
            runtime: None,
            iodepth: 1,
            iodepth_batch: 1,
            numjobs: 1,
            direct: DirectIo::Off,
            engine: IoEngine::IoUring,
            fixedbufs: false,
            registerfiles: false,
            sqthread_poll: false,
            hipri: false,
            force: false,
            run_id: String::new(),
            offset: 0,
            offset_increment: None,
            fsync_every: 0,
            end_fsync: false,
            pattern: Pattern::Gen,
            dedup_ratio: 1.0,
            compress_ratio: 1.0,
            seed: 0,
            verify: false,
            hugepages: false,
            shared: None,
        }
    }

    /// Checks the settings that do not need the file.
    ///
    /// Errors: [`Error::InvalidConfig`] naming the setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.verify && matches!(self.rw, Rw::Rw | Rw::RandRw) {
            return bad(format!(
                "--verify with --rw {}: the job reads blocks it never wrote, so their \
                 bytes are not known; verify a write job (write, randwrite) instead",
                self.rw.name()
            ));
        }
        if self.verify && self.pattern == Pattern::Fixed {
            return bad(
                "--verify with --pattern fixed: every block holds the same bytes, so a \
                 misplaced or stale block cannot be told apart; use --pattern gen or header"
                    .into(),
            );
        }
        if self.bs == 0 || self.bs > crate::stream::MAX_BUFFER_SIZE {
            return bad(format!("bs {} is not in 1..=1 GiB", self.bs));
        }
        if self.size == 0 {
            return bad("size must be at least 1 byte".into());
        }
        if !(1..=4096).contains(&self.iodepth) {
            return bad(format!("iodepth {} is not in 1..=4096", self.iodepth));
        }
        if self.iodepth_batch == 0 || self.iodepth_batch > self.iodepth {
            return bad(format!(
                "iodepth_batch {} is not in 1..=iodepth ({})",
                self.iodepth_batch, self.iodepth
            ));
        }
        if self.numjobs == 0 || self.numjobs > 4096 {
            return bad(format!("numjobs {} is not in 1..=4096", self.numjobs));
        }
        if self.rwmix_read > 100 {
            return bad(format!("rwmix_read {} is over 100", self.rwmix_read));
        }
        if self.runtime.is_some_and(|r| r.is_zero()) {
            return bad("runtime must be positive".into());
        }
        if self.pattern == Pattern::Header && self.bs < HEADER_LEN {
            return bad(format!("the header pattern needs bs >= {HEADER_LEN}"));
        }
        if self.hipri && self.direct == DirectIo::Off {
            return bad("hipri (IOPOLL) needs O_DIRECT (--direct on)".into());
        }
        if self.engine == IoEngine::Psync
            && (self.fixedbufs || self.registerfiles || self.sqthread_poll || self.hipri)
        {
            return bad(
                "fixedbufs, registerfiles, sqthread_poll and hipri are io_uring options".into(),
            );
        }
        if let Some(r) = self.shared
            && (r.ranks == 0 || r.rank >= r.ranks)
        {
            return bad(format!("rank {} is not in 0..ranks ({})", r.rank, r.ranks));
        }
        let end = self
            .file_extent()
            .ok_or_else(|| Error::InvalidConfig("offset + regions overflow a u64".into()))?;
        Generator::new(self.gen_config(end)).map(|_| ())
    }

    /// Bytes from 0 to the end of the last region.
    fn file_extent(&self) -> Option<u64> {
        if self.shared.is_some() {
            return Some(self.size);
        }
        let inc = self.offset_increment.unwrap_or(self.size);
        inc.checked_mul(self.numjobs as u64 - 1)?
            .checked_add(self.offset)?
            .checked_add(self.size)
    }

    fn gen_config(&self, size: u64) -> GenConfig {
        GenConfig {
            size,
            dedup_ratio: self.dedup_ratio,
            compress_ratio: self.compress_ratio,
            block_size: 4096,
            seed: self.seed,
        }
    }

    /// Job `job`'s region: (byte offset, bytes). In shared-file mode the
    /// parts are aligned to `align` bytes (see [`part`]).
    ///
    /// # Panics
    /// In shared-file mode if `job >= numjobs`, `rank >= ranks`, a count
    /// is 0 or `align` is 0; otherwise if the offset overflows a `u64`
    /// (debug builds). [`validate`](Self::validate) rules all of these out
    /// for `job < numjobs`.
    pub fn region(&self, job: usize, align: u64) -> (u64, u64) {
        match self.shared {
            Some(r) => part(
                self.size,
                r.ranks as u64 * self.numjobs as u64,
                r.rank as u64 * self.numjobs as u64 + job as u64,
                align,
            ),
            None => {
                let inc = self.offset_increment.unwrap_or(self.size);
                (self.offset + inc * job as u64, self.size)
            }
        }
    }
}

/// Part `index` of `size` bytes split into `parts` contiguous parts: every
/// part but the last is `size / parts` rounded down to a multiple of
/// `align`; the last takes the rest (so parts cover `[0, size)` exactly,
/// without overlap, whether or not `size` divides evenly). Returns (byte
/// offset, bytes); parts may be empty when `size < parts * align`.
///
/// # Panics
/// If `parts` is 0, `index >= parts` or `align` is 0.
pub fn part(size: u64, parts: u64, index: u64, align: u64) -> (u64, u64) {
    assert!(parts > 0 && index < parts && align > 0, "bad partition");
    let base = size / parts / align * align;
    let offset = base * index;
    if index + 1 == parts {
        (offset, size - offset)
    } else {
        (offset, base)
    }
}

/// Bytes of the [`Pattern::Header`] header.
pub const HEADER_LEN: usize = 32;
const MAGIC: u64 = u64::from_le_bytes(*b"PWBLOCK1");

/// Latency and volume of one direction (reads or writes).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DirStats {
    /// Bytes transferred.
    pub bytes: u64,
    /// I/Os completed.
    pub ios: u64,
    /// Bytes per second over the run (wall time of the slowest job).
    pub bw_bytes_per_s: f64,
    /// I/Os per second.
    pub iops: f64,
    /// Latency samples (one per I/O).
    pub lat_samples: u64,
    /// Latency, µs: min, mean, p50, p90, p99, p99.9, p99.99, max.
    pub lat_us: LatencyUs,
    /// The latency percentile curve: (percentile, µs) at each of
    /// [`PERCENTILES`], for plots. Empty in reports written before it was.
    #[serde(default)]
    pub percentiles_us: Vec<(f64, f64)>,
}

/// Percentiles of the latency curve in a report ([`DirStats::percentiles_us`]).
pub const PERCENTILES: [f64; 14] = [
    1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999,
];

/// Latency figures in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyUs {
    /// Minimum.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// 99.99th percentile.
    pub p99_99: f64,
    /// Maximum.
    pub max: f64,
}

/// The result of [`run`]: one rank's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IoReport {
    /// What was run.
    pub config: IoConfig,
    /// I/O actually used: engine, options, `O_DIRECT` verdict.
    pub io_mode: String,
    /// Host name.
    pub host: String,
    /// Start, ns since the Unix epoch (for aggregating ranks).
    pub start_unix_ns: u128,
    /// End (after the final fdatasync), ns since the Unix epoch.
    pub end_unix_ns: u128,
    /// Wall time of the run, seconds.
    pub runtime_s: f64,
    /// Reads, if any.
    pub read: Option<DirStats>,
    /// Writes, if any.
    pub write: Option<DirStats>,
    /// `fdatasync` calls made (every N writes and at the end).
    pub fsyncs: u64,
    /// Blocks verified after the run (0 without `verify`).
    pub verified_blocks: u64,
}

/// A verify failure: the first block that is not what was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    /// Byte offset of the first bad block.
    pub offset: u64,
    /// What is wrong with it.
    pub why: String,
}

/// Live figures passed to [`run`]'s progress callback about twice a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IoProgress {
    /// Since the start.
    pub elapsed: Duration,
    /// Bytes done so far, all jobs.
    pub bytes: u64,
    /// Bytes per second over the last interval.
    pub bytes_per_sec: f64,
    /// Fraction done (by bytes or by time), 0..=1.
    pub fraction: f64,
}

/// What a job hands back.
struct JobOut {
    /// First I/O issued (after the job's setup), and its last completed.
    began: Option<Instant>,
    ended: Option<Instant>,
    read: Histogram<u64>,
    write: Histogram<u64>,
    read_bytes: u64,
    write_bytes: u64,
    fsyncs: u64,
}

impl JobOut {
    /// Accounts one completed I/O and its latency.
    fn record(&mut self, io: Io, latency: Duration) {
        let ns = (latency.as_nanos() as u64).max(1);
        if io.read {
            self.read.saturating_record(ns);
            self.read_bytes += io.len as u64;
        } else {
            self.write.saturating_record(ns);
            self.write_bytes += io.len as u64;
        }
    }
}

fn new_hist() -> Histogram<u64> {
    // 1 ns .. 1 hour at 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

/// Checks the target before anything is created or allocated: a read-only
/// job needs the file to exist and hold its regions (reading what was never
/// written would measure nothing, or fail on end of file after the run
/// started); a writing job needs the file system to have room for the bytes
/// it allocates, unless `cfg.force`.
fn check_target(cfg: &IoConfig, extent: u64, writes: bool, align: u64) -> Result<()> {
    let shown = cfg.path.display();
    let len = match std::fs::metadata(&cfg.path) {
        Ok(m) if m.is_dir() => {
            return Err(Error::InvalidConfig(format!("{shown} is a directory")));
        }
        Ok(m) => Some(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io("stat", None, e)),
    };
    if !writes {
        match len {
            None => {
                return Err(Error::InvalidConfig(format!(
                    "{shown} does not exist: a read job needs its data laid out first \
                     (e.g. pagewriter write-file {shown} --size {extent})"
                )));
            }
            Some(l) if l < extent => {
                return Err(Error::InvalidConfig(format!(
                    "{shown} holds {l} B, less than the {extent} B the read job covers \
                     (write it first, or lower --size / --offset)"
                )));
            }
            Some(_) => {}
        }
        return Ok(());
    }
    if cfg.force {
        return Ok(());
    }
    let new: u64 = (0..cfg.numjobs)
        .map(|j| cfg.region(j, align))
        .map(|(off, n)| match len {
            // Bytes past the current end are new blocks; inside, the file
            // may already hold them.
            Some(l) => (off + n).saturating_sub(l.max(off)),
            None => n,
        })
        .sum();
    crate::room::check(&cfg.path, new, 0, false)
}

/// Opens the file as `cfg.direct` asks; returns it, a buffered descriptor
/// for unaligned tails, and why `O_DIRECT` is off under `Auto`.
fn open(cfg: &IoConfig) -> Result<(FileBackend, File, Option<String>)> {
    let (backend, why) = open_with_direct(&cfg.path, cfg.direct, &|b: &FileBackend| {
        let a = b.direct()?;
        (!cfg.bs.is_multiple_of(a.offset as usize) || !cfg.offset.is_multiple_of(a.offset as u64))
            .then(|| {
                format!(
                    "bs {} / offset {} not a multiple of the O_DIRECT alignment {}",
                    cfg.bs, cfg.offset, a.offset
                )
            })
    })?;
    let tail = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&cfg.path)
        .map_err(|e| Error::io("open", None, e))?;
    Ok((backend, tail, why))
}

/// Runs the job(s) of `cfg` and returns this rank's report. `progress` is
/// called from the calling thread about every 500 ms.
///
/// The file is created if missing and never truncated; a job that writes
/// extends it with `fallocate` (falling back to
/// `set_len`) to the end of the regions if it is shorter, so concurrent
/// ranks never shrink it. A read job on a file shorter than its region
/// fails (`UnexpectedEof`).
///
/// Errors: [`Error::InvalidConfig`] for bad settings (before the file is
/// touched) or `hipri` on a device without poll queues; [`Error::Io`] for
/// I/O; a verify failure is [`Error::InvalidConfig`] naming the first bad
/// offset (see [`verify_region`] for the typed result).
pub fn run(cfg: &IoConfig, progress: &mut dyn FnMut(IoProgress)) -> Result<IoReport> {
    cfg.validate()?;
    let extent = cfg.file_extent().expect("validated");
    let generator = Generator::new(cfg.gen_config(extent))?;
    // Parts are aligned so that no 4 KiB page is shared by two jobs (a
    // buffered tail write would otherwise read-modify-write a neighbour's
    // page).
    let align = lcm(cfg.bs as u64, 4096);
    let writes = cfg.rw.read_percent(cfg.rwmix_read) < 100;
    check_target(cfg, extent, writes, align)?;
    let (backend, tail, direct_why) = open(cfg)?;
    let dio = backend.direct();
    if writes {
        // Only the regions this rank writes are allocated (a job at a far
        // --offset leaves the file sparse before it); fallocate never
        // shrinks. Where it is not supported, set_len, only when the file
        // is still shorter (another rank may have grown it).
        let mut unsupported = false;
        for j in 0..cfg.numjobs {
            let (off, len) = cfg.region(j, align);
            if len == 0 || unsupported {
                continue;
            }
            if let Err(e) = backend.allocate(off, len) {
                if e.kind() == std::io::ErrorKind::Unsupported
                    || e.raw_os_error() == Some(libc::EOPNOTSUPP)
                {
                    unsupported = true;
                } else {
                    return Err(Error::io("fallocate", Some(off), e));
                }
            }
        }
        let len = backend.len().map_err(|e| Error::io("stat", None, e))?;
        if len < extent {
            backend
                .set_len(extent)
                .map_err(|e| Error::io("set_len", Some(extent), e))?;
        }
    }
    if cfg.hipri
        && let Some(v) = pagewriter::backend::queue_attr(backend.file(), "io_poll")
        && v.trim() == "0"
    {
        return Err(Error::InvalidConfig(
            "hipri: the device has no poll queues (queue/io_poll is 0; NVMe needs \
             nvme.poll_queues > 0)"
                .into(),
        ));
    }
    let mut io_mode = match cfg.engine {
        IoEngine::IoUring => {
            let mut m = format!("io_uring QD{}", cfg.iodepth);
            for (on, name) in [
                (cfg.fixedbufs, "fixedbufs"),
                (cfg.registerfiles, "registerfiles"),
                (cfg.sqthread_poll, "sqpoll"),
                (cfg.hipri, "hipri"),
            ] {
                if on {
                    m += &format!(", {name}");
                }
            }
            m
        }
        IoEngine::Psync => "psync".into(),
    };
    match (dio, &direct_why) {
        (Some(a), _) => io_mode += &format!(", O_DIRECT (align {})", a.offset),
        (None, Some(why)) => io_mode += &format!(", buffered ({why})"),
        (None, None) => io_mode += ", buffered",
    }

    let start_wall = SystemTime::now();
    let start = Instant::now();
    let done_bytes = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let total_bytes: u64 = (0..cfg.numjobs).map(|j| cfg.region(j, align).1).sum();
    let ctx = JobCtx {
        cfg,
        generator: &generator,
        file: backend.file(),
        tail: &tail,
        dio,
        align,
        done_bytes: &done_bytes,
        stop: &stop,
    };
    let outs: Vec<Result<JobOut>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.numjobs)
            .map(|j| {
                let ctx = &ctx;
                s.spawn(move || {
                    let r = run_job(ctx, j);
                    if r.is_err() {
                        ctx.stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut last = (Instant::now(), 0u64);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
            let dt = last.0.elapsed();
            if dt >= Duration::from_millis(500) {
                let bytes = done_bytes.load(Ordering::Relaxed);
                let fraction = match cfg.runtime {
                    Some(rt) => start.elapsed().as_secs_f64() / rt.as_secs_f64(),
                    None => bytes as f64 / total_bytes.max(1) as f64,
                };
                progress(IoProgress {
                    elapsed: start.elapsed(),
                    bytes,
                    bytes_per_sec: (bytes - last.1) as f64 / dt.as_secs_f64(),
                    fraction: fraction.min(1.0),
                });
                last = (Instant::now(), bytes);
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::InvalidConfig("a job panicked".into())))
            })
            .collect()
    });
    let mut read = new_hist();
    let mut write = new_hist();
    let (mut rb, mut wb, mut fsyncs) = (0u64, 0u64, 0u64);
    let (mut began, mut ended): (Option<Instant>, Option<Instant>) = (None, None);
    for o in outs {
        let o = o?;
        began = match (began, o.began) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        ended = match (ended, o.ended) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        read.add(&o.read).expect("same bounds");
        write.add(&o.write).expect("same bounds");
        rb += o.read_bytes;
        wb += o.write_bytes;
        fsyncs += o.fsyncs;
    }
    let mut verified_blocks = 0;
    if cfg.verify {
        for j in 0..cfg.numjobs {
            let (off, len) = cfg.region(j, align);
            verified_blocks += verify_region(cfg, &generator, &tail, off, len).map_err(|e| {
                Error::InvalidConfig(format!("verify: block at {} is bad: {}", e.offset, e.why))
            })?;
        }
        if verified_blocks == 0 {
            return Err(Error::InvalidConfig(
                "verify: no block was checked, which proves nothing".into(),
            ));
        }
    }
    // Like fio, the run is timed from the first job's first I/O (after its
    // setup) to the last job's last completion (its final fdatasync
    // included).
    let began = began.unwrap_or(start);
    let ended = ended.unwrap_or(began).max(began);
    let runtime = ended - began;
    let start_wall = start_wall + (began - start);
    let end_wall = start_wall + runtime;
    let secs = runtime.as_secs_f64().max(1e-9);
    let dir = |h: &Histogram<u64>, bytes: u64| {
        (!h.is_empty()).then(|| DirStats {
            bytes,
            ios: h.len(),
            bw_bytes_per_s: bytes as f64 / secs,
            iops: h.len() as f64 / secs,
            lat_samples: h.len(),
            lat_us: LatencyUs {
                min: h.min() as f64 / 1e3,
                mean: h.mean() / 1e3,
                p50: h.value_at_quantile(0.50) as f64 / 1e3,
                p90: h.value_at_quantile(0.90) as f64 / 1e3,
                p99: h.value_at_quantile(0.99) as f64 / 1e3,
                p99_9: h.value_at_quantile(0.999) as f64 / 1e3,
                p99_99: h.value_at_quantile(0.9999) as f64 / 1e3,
                max: h.max() as f64 / 1e3,
            },
            percentiles_us: PERCENTILES
                .iter()
                .map(|&p| (p, h.value_at_quantile(p / 100.0) as f64 / 1e3))
                .collect(),
        })
    };
    let unix = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Ok(IoReport {
        config: cfg.clone(),
        io_mode,
        host: hostname(),
        start_unix_ns: unix(start_wall),
        end_unix_ns: unix(end_wall),
        runtime_s: runtime.as_secs_f64(),
        read: dir(&read, rb),
        write: dir(&write, wb),
        fsyncs,
        verified_blocks,
    })
}

fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

struct JobCtx<'a> {
    cfg: &'a IoConfig,
    generator: &'a Generator,
    file: &'a File,
    tail: &'a File,
    dio: Option<DioAlign>,
    align: u64,
    done_bytes: &'a AtomicU64,
    stop: &'a AtomicBool,
}

/// One I/O to issue.
#[derive(Debug, Clone, Copy)]
struct Io {
    read: bool,
    offset: u64,
    len: usize,
}

/// The I/Os of one job's region, in order.
struct IoIter {
    region: (u64, u64),
    bs: u64,
    random: bool,
    read_percent: u32,
    rng: WyRand,
    perm: Permutation,
    pass: u64,
    /// Next I/O index within the pass.
    i: u64,
    /// I/Os per pass.
    per_pass: u64,
    time_based: bool,
}

impl IoIter {
    fn new(cfg: &IoConfig, region: (u64, u64), job: usize) -> Self {
        let bs = cfg.bs as u64;
        let random = cfg.rw.random();
        // Random I/Os are whole blocks; a sequential pass ends with the
        // region's remainder.
        let per_pass = if random {
            region.1 / bs
        } else {
            region.1.div_ceil(bs)
        };
        let seed = cfg.seed ^ (job as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Self {
            region,
            bs,
            random,
            read_percent: cfg.rw.read_percent(cfg.rwmix_read),
            rng: WyRand::new(seed),
            perm: Permutation::new(per_pass, seed),
            pass: 0,
            i: 0,
            per_pass,
            time_based: cfg.runtime.is_some(),
        }
    }

    fn next(&mut self) -> Option<Io> {
        if self.per_pass == 0 {
            return None;
        }
        if self.i == self.per_pass {
            if !self.time_based {
                return None;
            }
            self.pass += 1;
            self.i = 0;
            if self.random {
                self.perm = Permutation::new(self.per_pass, self.rng.next_u64());
            }
        }
        let block = if self.random {
            self.perm.apply(self.i)
        } else {
            self.i
        };
        self.i += 1;
        let at = block * self.bs;
        let len = self.bs.min(self.region.1 - at) as usize;
        let read = match self.read_percent {
            100 => true,
            0 => false,
            p => self.rng.below(100) < p as u64,
        };
        Some(Io {
            read,
            offset: self.region.0 + at,
            len,
        })
    }
}

/// Fills `buf` with what a write of `buf.len()` bytes at `offset` holds.
fn fill(cfg: &IoConfig, generator: &Generator, offset: u64, buf: &mut [u8]) {
    match cfg.pattern {
        Pattern::Fixed => {}
        Pattern::Gen => generator
            .fill_at(offset, buf)
            .expect("I/Os lie inside the file extent"),
        Pattern::Header => {
            generator
                .fill_at(offset, buf)
                .expect("I/Os lie inside the file extent");
            for (k, block) in buf.chunks_mut(cfg.bs).enumerate() {
                if block.len() >= HEADER_LEN {
                    stamp(block, offset + (k * cfg.bs) as u64, cfg.seed);
                }
            }
        }
    }
}

fn stamp(block: &mut [u8], offset: u64, seed: u64) {
    let sum = xxhash_rust::xxh3::xxh3_64(&block[HEADER_LEN..]);
    block[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    block[8..16].copy_from_slice(&offset.to_le_bytes());
    block[16..24].copy_from_slice(&seed.to_le_bytes());
    block[24..32].copy_from_slice(&sum.to_le_bytes());
}

fn run_job(ctx: &JobCtx<'_>, job: usize) -> Result<JobOut> {
    let cfg = ctx.cfg;
    let region = cfg.region(job, ctx.align);
    let mut out = JobOut {
        began: None,
        ended: None,
        read: new_hist(),
        write: new_hist(),
        read_bytes: 0,
        write_bytes: 0,
        fsyncs: 0,
    };
    let mut iter = IoIter::new(cfg, region, job);
    match cfg.engine {
        IoEngine::Psync => run_psync(ctx, &mut iter, &mut out)?,
        #[cfg(all(target_os = "linux", feature = "io-uring"))]
        IoEngine::IoUring => uring::run(ctx, &mut iter, &mut out)?,
        #[cfg(not(all(target_os = "linux", feature = "io-uring")))]
        IoEngine::IoUring => {
            return Err(Error::InvalidConfig(
                "io_uring is not built in (cargo feature io-uring, Linux)".into(),
            ));
        }
    }
    if cfg.end_fsync && out.write_bytes > 0 {
        ctx.file
            .sync_data()
            .map_err(|e| Error::io("fdatasync", None, e))?;
        out.fsyncs += 1;
    }
    out.ended = Some(Instant::now());
    Ok(out)
}

/// Marks the job's start (after its setup) and returns its deadline.
fn begin(ctx: &JobCtx<'_>, out: &mut JobOut) -> Option<Instant> {
    let now = Instant::now();
    out.began = Some(now);
    ctx.cfg.runtime.map(|r| now + r)
}

/// Whether `io` must go through the buffered descriptor: its length is
/// not a multiple of the `O_DIRECT` alignment (the end of a region).
fn needs_tail(ctx: &JobCtx<'_>, io: &Io) -> bool {
    ctx.dio.is_some_and(|a| {
        !io.len.is_multiple_of(a.offset as usize) || !io.offset.is_multiple_of(a.offset as u64)
    })
}

/// A synchronous I/O on `file`; records latency and bytes.
fn sync_io(ctx: &JobCtx<'_>, file: &File, io: Io, buf: &mut [u8], out: &mut JobOut) -> Result<()> {
    let buf = &mut buf[..io.len];
    if !io.read {
        fill(ctx.cfg, ctx.generator, io.offset, buf);
    }
    // Latency is the system call's, not the fill's.
    let t = Instant::now();
    if io.read {
        file.read_exact_at(buf, io.offset)
            .map_err(|e| Error::io("pread", Some(io.offset), e))?;
    } else {
        file.write_all_at(buf, io.offset)
            .map_err(|e| Error::io("pwrite", Some(io.offset), e))?;
    }
    out.record(io, t.elapsed());
    ctx.done_bytes.fetch_add(io.len as u64, Ordering::Relaxed);
    Ok(())
}

fn run_psync(ctx: &JobCtx<'_>, iter: &mut IoIter, out: &mut JobOut) -> Result<()> {
    let mem_align = ctx
        .dio
        .map_or(DEFAULT_ALIGN, |a| (a.memory as usize).max(DEFAULT_ALIGN));
    let mut buf = AlignedBuf::zeroed(ctx.cfg.bs, mem_align)
        .ok_or_else(|| Error::InvalidConfig("buffer alignment".into()))?;
    ctx.generator
        .fill_at(
            0,
            &mut buf[..ctx.cfg.bs.min(ctx.generator.config().size as usize)],
        )
        .expect("inside the extent");
    let mut writes = 0u64;
    let mut n = 0u64;
    let deadline = begin(ctx, out);
    while let Some(io) = iter.next() {
        n += 1;
        if n.is_multiple_of(64)
            && (ctx.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d))
        {
            break;
        }
        let file = if needs_tail(ctx, &io) {
            ctx.tail
        } else {
            ctx.file
        };
        sync_io(ctx, file, io, &mut buf, out)?;
        if !io.read {
            writes += 1;
            if ctx.cfg.fsync_every > 0 && writes.is_multiple_of(ctx.cfg.fsync_every) {
                ctx.file
                    .sync_data()
                    .map_err(|e| Error::io("fdatasync", None, e))?;
                out.fsyncs += 1;
            }
        }
    }
    Ok(())
}

#[cfg(all(target_os = "linux", feature = "io-uring"))]
mod uring {
    use super::*;
    use pagewriter::backend::ring::{Completion, RingOp, RingOptions, SlotRing};

    pub(super) fn run(ctx: &JobCtx<'_>, iter: &mut IoIter, out: &mut JobOut) -> Result<()> {
        let cfg = ctx.cfg;
        let mem_align = ctx
            .dio
            .map_or(DEFAULT_ALIGN, |a| (a.memory as usize).max(DEFAULT_ALIGN));
        // One mapping for all slots, advised for transparent huge pages:
        // physically contiguous buffers split into fewer device segments
        // (`.project/io-worker.md`); --hugepages asks for reserved ones.
        let mut bufs = if cfg.hugepages {
            (0..cfg.iodepth)
                .map(|_| AlignedBuf::huge(cfg.bs).map(|b| b.0))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| Error::io("allocate huge pages", None, e))?
        } else if mem_align <= DEFAULT_ALIGN {
            pagewriter::buffer::thp_slab(cfg.bs, cfg.iodepth as usize)
                .map_err(|e| Error::io("mmap", None, e))?
        } else {
            (0..cfg.iodepth)
                .map(|_| AlignedBuf::zeroed(cfg.bs, mem_align))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Error::InvalidConfig("buffer alignment".into()))?
        };
        for (k, b) in bufs.iter_mut().enumerate() {
            // Pattern::Fixed writes these bytes for ever.
            let at = (k * cfg.bs) as u64 % ctx.generator.config().size;
            let n = (ctx.generator.config().size - at).min(cfg.bs as u64) as usize;
            ctx.generator
                .fill_at(at, &mut b[..n])
                .expect("inside the extent");
        }
        let opts = RingOptions {
            queue_depth: cfg.iodepth,
            register_file: cfg.registerfiles || cfg.sqthread_poll,
            fixed_buffers: cfg.fixedbufs,
            sqpoll: cfg.sqthread_poll,
            iopoll: cfg.hipri,
            single_issuer: true,
        };
        let mut ring =
            SlotRing::new(ctx.file, opts, bufs).map_err(|e| Error::io(e.stage, None, e.source))?;
        let mut free: Vec<usize> = (0..cfg.iodepth as usize).rev().collect();
        // Per slot: the I/O it carries.
        let mut active: Vec<Io> = vec![
            Io {
                read: true,
                offset: 0,
                len: 0
            };
            cfg.iodepth as usize
        ];
        let mut cqes: Vec<Completion> = Vec::with_capacity(cfg.iodepth as usize);
        let mut writes = 0u64;
        let mut exhausted = false;
        let mut tail_buf: Option<AlignedBuf> = None;
        let deadline = begin(ctx, out);
        let mut queued = 0u32;
        loop {
            if !exhausted
                && (ctx.stop.load(Ordering::Relaxed)
                    || deadline.is_some_and(|d| Instant::now() >= d))
            {
                exhausted = true;
            }
            // Queue as many I/Os as there are free slots.
            while !exhausted && let Some(&slot) = free.last() {
                let Some(io) = iter.next() else {
                    exhausted = true;
                    break;
                };
                if needs_tail(ctx, &io) {
                    let b = match &mut tail_buf {
                        Some(b) => b,
                        None => tail_buf.insert(
                            AlignedBuf::zeroed(cfg.bs, DEFAULT_ALIGN).expect("valid layout"),
                        ),
                    };
                    // After every direct I/O in flight completes, so the
                    // page cache never holds stale bytes of this region.
                    drain(
                        ctx,
                        &mut ring,
                        &mut cqes,
                        &mut active,
                        &mut free,
                        out,
                        &mut writes,
                    )?;
                    sync_io(ctx, ctx.tail, io, b, out)?;
                    continue;
                }
                free.pop();
                let op = if io.read { RingOp::Read } else { RingOp::Write };
                if !io.read && cfg.pattern != Pattern::Fixed {
                    let buf = ring.buf_mut(slot).expect("free slot");
                    fill(cfg, ctx.generator, io.offset, &mut buf[..io.len]);
                }
                ring.push(slot, op, io.offset, 0, io.len)
                    .map_err(|e| Error::io("io_uring push", Some(io.offset), e))?;
                active[slot] = io;
                queued += 1;
                if queued >= cfg.iodepth_batch {
                    // Like fio's iodepth_batch_submit: each batch goes to
                    // the device as soon as it is ready. Submitting 4 KiB
                    // random reads one by one kept QD64 full: 1.2-1.3x the
                    // IOPS of one submit per refill of all free slots.
                    ring.submit()
                        .map_err(|e| Error::io("io_uring_enter", None, e))?;
                    queued = 0;
                }
            }
            if ring.in_flight() == 0 {
                if exhausted {
                    break;
                }
                continue;
            }
            cqes.clear();
            let min = (cfg.iodepth_batch as usize).min(ring.in_flight() as usize);
            ring.wait(min, &mut cqes)
                .map_err(|e| Error::io("io_uring_enter", None, e))?;
            let before = writes;
            complete(ctx, &mut cqes, &mut active, &mut free, out, &mut writes)?;
            if cfg.fsync_every > 0 && writes / cfg.fsync_every > before / cfg.fsync_every {
                drain(
                    ctx,
                    &mut ring,
                    &mut cqes,
                    &mut active,
                    &mut free,
                    out,
                    &mut writes,
                )?;
                ctx.file
                    .sync_data()
                    .map_err(|e| Error::io("fdatasync", None, e))?;
                out.fsyncs += 1;
            }
        }
        Ok(())
    }

    /// Waits for every I/O in flight and accounts it.
    fn drain(
        ctx: &JobCtx<'_>,
        ring: &mut SlotRing,
        cqes: &mut Vec<Completion>,
        active: &mut [Io],
        free: &mut Vec<usize>,
        out: &mut JobOut,
        writes: &mut u64,
    ) -> Result<()> {
        while ring.in_flight() > 0 {
            cqes.clear();
            ring.wait(1, cqes)
                .map_err(|e| Error::io("io_uring_enter", None, e))?;
            complete(ctx, cqes, active, free, out, writes)?;
        }
        Ok(())
    }

    /// Accounts finished I/Os: each frees its slot; an error or a read cut
    /// short by the end of the file ends the job.
    fn complete(
        ctx: &JobCtx<'_>,
        cqes: &mut Vec<Completion>,
        active: &mut [Io],
        free: &mut Vec<usize>,
        out: &mut JobOut,
        writes: &mut u64,
    ) -> Result<()> {
        // The progress counter is shared by all jobs: one add per reap.
        let mut reaped_bytes = 0u64;
        for c in cqes.drain(..) {
            // The ring continued short and interrupted transfers: `Ok` is
            // the whole I/O unless a read met the end of the file.
            let io = active[c.slot];
            let op_name = if io.read { "read" } else { "write" };
            match c.result {
                Ok(n) if n == io.len => {
                    out.record(io, c.latency);
                    *writes += u64::from(!io.read);
                    reaped_bytes += io.len as u64;
                    free.push(c.slot);
                }
                Ok(n) => {
                    return Err(Error::io(
                        op_name,
                        Some(io.offset + n as u64),
                        std::io::ErrorKind::UnexpectedEof.into(),
                    ));
                }
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) && ctx.cfg.hipri => {
                    return Err(Error::InvalidConfig(
                        "hipri: the device completes polled I/O with EOPNOTSUPP (no poll \
                         queues)"
                            .into(),
                    ));
                }
                Err(e) => return Err(Error::io(op_name, Some(io.offset), e)),
            }
        }
        ctx.done_bytes.fetch_add(reaped_bytes, Ordering::Relaxed);
        Ok(())
    }
}

/// Reads `[offset, offset + len)` of `file` back in `bs` blocks and checks
/// each against `cfg.pattern`: the generator's bytes (`Gen`), or a valid
/// header naming the block's own offset and seed with a matching checksum
/// (`Header`). `Fixed` data cannot be checked and counts 0 blocks.
/// Returns the blocks checked.
///
/// Errors: the first bad block, or an I/O error (offset and message).
pub fn verify_region(
    cfg: &IoConfig,
    generator: &Generator,
    file: &File,
    offset: u64,
    len: u64,
) -> std::result::Result<u64, VerifyError> {
    if cfg.pattern == Pattern::Fixed {
        return Ok(0);
    }
    let bs = cfg.bs;
    let mut got = vec![0u8; bs];
    let mut want = vec![0u8; bs];
    let mut blocks = 0;
    let mut at = offset;
    while at < offset + len {
        let n = (bs as u64).min(offset + len - at) as usize;
        file.read_exact_at(&mut got[..n], at)
            .map_err(|e| VerifyError {
                offset: at,
                why: format!("read failed: {e}"),
            })?;
        let bad = |why: String| VerifyError { offset: at, why };
        match cfg.pattern {
            Pattern::Gen => {
                generator
                    .fill_at(at, &mut want[..n])
                    .map_err(|e| bad(e.to_string()))?;
                if let Some(i) = got[..n].iter().zip(&want[..n]).position(|(a, b)| a != b) {
                    return Err(bad(format!("byte {i} differs from the generator's")));
                }
            }
            Pattern::Header if n >= HEADER_LEN => {
                let word = |k: usize| u64::from_le_bytes(got[k..k + 8].try_into().unwrap());
                if word(0) != MAGIC {
                    return Err(bad("no block header".into()));
                }
                if word(8) != at {
                    return Err(bad(format!("header names offset {}", word(8))));
                }
                if word(16) != cfg.seed {
                    return Err(bad(format!("header names seed {}", word(16))));
                }
                if word(24) != xxhash_rust::xxh3::xxh3_64(&got[HEADER_LEN..n]) {
                    return Err(bad("checksum mismatch".into()));
                }
            }
            _ => {}
        }
        blocks += 1;
        at += n as u64;
    }
    Ok(blocks)
}

/// Refuses reports that are not exactly one run's ranks: two run ids, two
/// rank counts or sizes, a rank twice, or a rank missing.
fn check_one_run(dir: &Path, reports: &[IoReport]) -> Result<()> {
    let bad = |why: String| Err(Error::InvalidConfig(format!("{}: {why}", dir.display())));
    let mut ids: Vec<&str> = reports.iter().map(|r| r.config.run_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > 1 {
        return bad(format!(
            "reports of several runs ({}); one run per directory",
            ids.join(", ")
        ));
    }
    let shape = |r: &IoReport| (r.config.shared.map_or(1, |s| s.ranks), r.config.size);
    if reports.iter().any(|r| shape(r) != shape(&reports[0])) {
        return bad("reports disagree on the rank count or the size: not one run".into());
    }
    let ranks = shape(&reports[0]).0;
    let mut seen = vec![false; ranks as usize];
    for r in reports {
        let rank = r.config.shared.map_or(0, |s| s.rank);
        match seen.get_mut(rank as usize) {
            Some(s) if !*s => *s = true,
            Some(_) => return bad(format!("rank {rank} reported twice")),
            None => return bad(format!("rank {rank} is not below the rank count {ranks}")),
        }
    }
    let missing: Vec<String> = (0..ranks)
        .filter(|&r| !seen[r as usize])
        .map(|r| r.to_string())
        .collect();
    if !missing.is_empty() {
        return bad(format!(
            "{} of {ranks} ranks reported; missing: {}",
            ranks as usize - missing.len(),
            missing.join(", ")
        ));
    }
    Ok(())
}

/// Prepares `dir` for this run's rank report: refuses a directory holding
/// reports of another run (by run id) unless `overwrite`, which removes
/// them (only `rank-*.json` files that parse as reports).
///
/// Errors: [`Error::InvalidConfig`] naming the other run; `Error::Io`.
pub fn claim_report_dir(dir: &Path, run_id: &str, overwrite: bool) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create report dir", None, e))?;
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("read_dir", None, e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("rank-") && name.ends_with(".json")) {
            continue;
        }
        let Ok(text) = std::fs::read(&path) else {
            continue;
        };
        let Ok(other) = serde_json::from_slice::<IoReport>(&text) else {
            continue;
        };
        if other.config.run_id == run_id {
            continue;
        }
        if !overwrite {
            return Err(Error::InvalidConfig(format!(
                "{} holds reports of another run ({}): use another --report-dir, or \
                 --overwrite to replace them",
                dir.display(),
                other.config.run_id
            )));
        }
        std::fs::remove_file(&path).map_err(|e| Error::io("remove old report", None, e))?;
    }
    Ok(())
}

/// The aggregate of several ranks' reports (`pagewriter report DIR`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Aggregate {
    /// Reports read.
    pub ranks: usize,
    /// Ranks the reports say there should be (the largest `ranks` seen).
    pub ranks_expected: u32,
    /// Bytes read and written by all ranks.
    pub total_bytes: u64,
    /// From the earliest start to the latest end, seconds.
    pub span_s: f64,
    /// `total_bytes / span_s` in GiB/s.
    pub aggregate_gib_per_s: f64,
    /// The rank that took longest: (rank, host, seconds).
    pub slowest: (u32, String, f64),
    /// Per rank: (rank, host, bytes, GiB/s).
    pub per_rank: Vec<(u32, String, u64, f64)>,
}

/// Reads every `*.json` in `dir` as an [`IoReport`] and aggregates them.
///
/// Errors: [`Error::Io`] reading the directory or a file;
/// [`Error::InvalidConfig`] for a file that is not a report, or no reports.
pub fn aggregate(dir: &Path) -> Result<Aggregate> {
    let mut reports: Vec<IoReport> = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("read_dir", None, e))?;
    for entry in entries {
        let path = entry.map_err(|e| Error::io("read_dir", None, e))?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read(&path).map_err(|e| Error::io("read", None, e))?;
            let r = serde_json::from_slice(&text).map_err(|e| {
                Error::InvalidConfig(format!("{} is not a report: {e}", path.display()))
            })?;
            reports.push(r);
        }
    }
    if reports.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "no *.json reports in {}",
            dir.display()
        )));
    }
    reports.sort_by_key(|r| r.config.shared.map_or(0, |s| s.rank));
    check_one_run(dir, &reports)?;
    let bytes = |r: &IoReport| {
        r.read.as_ref().map_or(0, |d| d.bytes) + r.write.as_ref().map_or(0, |d| d.bytes)
    };
    let rank = |r: &IoReport| r.config.shared.map_or(0, |s| s.rank);
    let first = reports.iter().map(|r| r.start_unix_ns).min().unwrap_or(0);
    let last = reports.iter().map(|r| r.end_unix_ns).max().unwrap_or(0);
    let span_s = (last.saturating_sub(first)) as f64 / 1e9;
    let total: u64 = reports.iter().map(bytes).sum();
    let slowest = reports
        .iter()
        .max_by(|a, b| a.runtime_s.total_cmp(&b.runtime_s))
        .expect("not empty");
    Ok(Aggregate {
        ranks: reports.len(),
        ranks_expected: reports
            .iter()
            .filter_map(|r| r.config.shared.map(|s| s.ranks))
            .max()
            .unwrap_or(1),
        total_bytes: total,
        span_s,
        aggregate_gib_per_s: total as f64 / span_s.max(1e-9) / (1u64 << 30) as f64,
        slowest: (rank(slowest), slowest.host.clone(), slowest.runtime_s),
        per_rank: reports
            .iter()
            .map(|r| {
                (
                    rank(r),
                    r.host.clone(),
                    bytes(r),
                    bytes(r) as f64 / r.runtime_s.max(1e-9) / (1u64 << 30) as f64,
                )
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_file_for_small_cases() {
        for size in 1..200u64 {
            for parts in 1..7 {
                let mut at = 0;
                for i in 0..parts {
                    let (off, len) = part(size, parts, i, 8);
                    assert_eq!(off, at);
                    at += len;
                }
                assert_eq!(at, size);
            }
        }
    }

    #[test]
    fn random_pass_visits_every_block_once() {
        let mut cfg = IoConfig::new("unused");
        cfg.rw = Rw::RandWrite;
        cfg.bs = 512;
        let mut it = IoIter::new(&cfg, (4096, 512 * 1000 + 100), 3);
        let mut seen = vec![false; 1000];
        while let Some(io) = it.next() {
            assert_eq!(io.len, 512);
            let b = ((io.offset - 4096) / 512) as usize;
            assert!(!seen[b], "block {b} twice");
            seen[b] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn sequential_pass_ends_with_the_remainder() {
        let mut cfg = IoConfig::new("unused");
        cfg.bs = 1000;
        let ios: Vec<Io> = {
            let mut it = IoIter::new(&cfg, (10, 2500), 0);
            std::iter::from_fn(|| it.next()).collect()
        };
        let got: Vec<(u64, usize)> = ios.iter().map(|i| (i.offset, i.len)).collect();
        assert_eq!(got, vec![(10, 1000), (1010, 1000), (2010, 500)]);
    }
}
