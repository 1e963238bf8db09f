//! What a run is asked to do: access pattern, engine, data, ranks.

use super::*;

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

    pub(super) fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }

    /// Percentage of I/Os that are reads.
    pub(super) fn read_percent(self, rwmix_read: u32) -> u32 {
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

impl std::str::FromStr for Rw {
    type Err = Error;

    /// Parses fio's names: read, write, randread, randwrite, rw (readwrite),
    /// randrw.
    ///
    /// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) for any other name.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "rw" | "readwrite" => Self::Rw,
            "randrw" => Self::RandRw,
            other => {
                return Err(Error::config(format!(
                    "unknown rw {other:?} (read, write, randread, randwrite, rw, randrw)"
                )));
            }
        })
    }
}

impl std::str::FromStr for IoEngine {
    type Err = Error;

    /// Parses `io_uring` (or `io-uring`) and `psync` (or `pwrite`).
    ///
    /// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) for any other name.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "io_uring" | "io-uring" => Ok(Self::IoUring),
            "psync" | "pwrite" => Ok(Self::Psync),
            other => Err(Error::config(format!(
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
    /// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) naming the setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::config(m));
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
        if self.size < self.bs as u64 {
            // Every I/O is a whole block: a region shorter than one would
            // be one short I/O, reported as if it were a block.
            return bad(format!(
                "size {} is smaller than one block (bs {}): give a size of at least bs",
                self.size, self.bs
            ));
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
            .ok_or_else(|| Error::config("offset + regions overflow a u64".into()))?;
        Generator::new(self.gen_config(end)).map(|_| ())
    }

    /// Bytes from 0 to the end of the last region.
    pub(super) fn file_extent(&self) -> Option<u64> {
        if self.shared.is_some() {
            return Some(self.size);
        }
        let inc = self.offset_increment.unwrap_or(self.size);
        inc.checked_mul(self.numjobs as u64 - 1)?
            .checked_add(self.offset)?
            .checked_add(self.size)
    }

    pub(super) fn gen_config(&self, size: u64) -> GenConfig {
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
