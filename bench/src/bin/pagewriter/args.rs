//! The command line: subcommands and their arguments, parsed by clap.

use super::*;

#[derive(Parser)]
#[command(
    name = "pagewriter",
    version,
    about = "Page writer for storage engines: benchmarks"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// What `scale`'s modes and columns mean (`scale --help`).
const SCALE_COLUMNS: &str = "\
Modes (each writes one file shared by all threads, except separate-files):
  per-page        one pwrite per page, no coalescing (the baseline; its commits still share fdatasyncs)
  concat          each run of contiguous pages copied into one buffer, one pwrite
  vectored        one pwritev per run from the pages themselves (writer threads under O_DIRECT)
  io-uring        runs as io_uring SQEs, queue depth --queue-depth (pwritev where a ring is refused)
  separate-files  one file per thread, one pwrite per page (the old way around per-page collapse)

Columns (one row per thread count and mode: the median of --repeats cells):
  pages/s          pages written by transactions per second (rewrites included)
  commits/s        transactions committed per second (sync or flush returned)
  MiB/s            page bytes written by transactions per second (2^20 bytes)
  writes/commit    write system calls (pwrite, pwritev, io_uring_enter) per commit
  syncs/commit     fdatasync calls per commit (a doublewrite area's included)
  KiB/commit       bytes written per commit, in place and to a doublewrite area (2^10 bytes)
  p50 us, p99 us   commit latency percentiles (a transaction's write_page calls with --fill fixed, then its commit call), microseconds
  CPU us/commit    user + system CPU of the whole process per commit, page fill included
                   (--json also gives its user-space part: cpu_user_us_per_commit)
  vs per-page      pages/s over the per-page mode's at the same thread count

The I/O lines above the table say what each mode really used (engine, O_DIRECT and its
alignment, or the reason for a fallback).";

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Commit throughput across thread counts: redb-style transactions of
    /// fresh and rewritten pages, each flush engine writing one file all
    /// threads share (and separate-files, one file per thread).
    #[command(after_long_help = SCALE_COLUMNS)]
    Scale(ScaleArgs),
    /// Bulk flush: dirty N bytes of pages in order, then one flush +
    /// fdatasync; GB/s per engine.
    Flush(FlushArgs),
    /// Synthetic data with known dedup and compression ratios, to a file
    /// or stdout; or `--verify FILE` to measure a file's ratios.
    Gen(GenArgs),
    /// Stream a generated file of any size to disk: generation overlapped
    /// with io_uring (or pwrite) writes from a fixed pool of aligned
    /// buffers, fallocate first, fdatasync last.
    WriteFile(WriteFileArgs),
    /// fio-style I/O worker: sequential or random reads/writes at a queue
    /// depth, per-I/O latency percentiles; --shared-file splits one file
    /// among threads and ranks (Slurm or --rank/--ranks).
    Io(IoArgs),
    /// Aggregate the per-rank JSON reports of `io --report-dir DIR`.
    Report(ReportArgs),
    /// Plot every round's ratio per case (scripts/compare-fio.sh --plot).
    PlotRounds(PlotRoundsArgs),
    /// Many writers, a database each: redb column families on pagewriter
    /// (one file) against redb on a file per writer, redb in one file, and
    /// the peers this build has (features peer-fjall, peer-manifold,
    /// peer-lmdb, peer-rocksdb);
    /// batches of u64 keys -> 150-byte values, a durable commit per batch,
    /// readers doing point reads meanwhile.
    #[cfg(feature = "cf")]
    #[command(after_long_help = CF_COLUMNS)]
    Cf(CfArgs),
}

/// What `cf`'s columns mean (`cf --help`).
#[cfg(feature = "cf")]
const CF_COLUMNS: &str = "\
Columns (one row per writers x batch x engine: the median over --rounds):
  ops/s          keys committed per second (all writers)
  commits/s      durable commits (batches) per second
  p99 us         99th percentile of a batch's inserts + commit, microseconds
  MiB on disk    blocks the engine's files hold at the end of the cell (2^20 bytes)
  reads/s        the readers' point reads per second while the writers run
  alone          the same readers' reads per second with no writer, on the same data
  vs redb-files  ops/s over redb on a file per writer in the same round (median)

How each engine makes a commit durable is printed above the table.";

#[cfg(feature = "cf")]
#[derive(clap::Args)]
pub(crate) struct CfArgs {
    /// Writer counts, comma separated (each 1 to 16).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub(crate) writers: Vec<usize>,
    /// Keys per commit, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,1000")]
    pub(crate) batches: Vec<u64>,
    /// Reader threads doing point reads of committed keys meanwhile.
    #[arg(long, default_value_t = 1)]
    pub(crate) readers: usize,
    /// Engines, comma separated: pw-cf, redb-files, pw-files,
    /// redb-one-file, and with their features fjall, manifold-wal,
    /// manifold-no-wal, lmdb, rocksdb. Default: every one this build has.
    #[arg(long, value_delimiter = ',')]
    pub(crate) engines: Vec<String>,
    /// Seconds each cell's writers run (its readers then run alone as long).
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    pub(crate) seconds: f64,
    /// Rounds over every cell (the engines' order rotates by round).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Directory the cells' scratch directories go in (each removed after
    /// its cell).
    #[arg(long, default_value = ".")]
    pub(crate) path: PathBuf,
    /// Print the report (every cell) as JSON on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write an SVG plot of ops/s over writers here.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct IoArgs {
    /// The file (created if missing, never truncated).
    #[arg(
        long,
        required_unless_present = "shared_file",
        conflicts_with = "shared_file"
    )]
    pub(crate) filename: Option<PathBuf>,
    /// Shared-file mode: split --size bytes of this file into contiguous
    /// parts by rank and thread (remainder to the last part).
    #[arg(long)]
    pub(crate) shared_file: Option<PathBuf>,
    /// read, write, randread, randwrite, rw (readwrite), randrw.
    #[arg(long, default_value = "read")]
    pub(crate) rw: Rw,
    /// Percent reads for rw / randrw.
    #[arg(long, default_value_t = 50)]
    pub(crate) rwmix_read: u32,
    /// Bytes per I/O, e.g. 4KiB, 1MiB.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    pub(crate) bs: u64,
    /// Bytes per job region (shared-file mode: the whole file), e.g. 1GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub(crate) size: u64,
    /// Time-based: run this long cycling over the region (10s, 1m, 500ms
    /// or plain seconds).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) runtime: Option<Duration>,
    /// I/Os in flight per job (io_uring).
    #[arg(long, default_value_t = 1)]
    pub(crate) iodepth: u32,
    /// Reap at least this many completions per wait.
    #[arg(long, default_value_t = 1)]
    pub(crate) iodepth_batch: u32,
    /// Jobs (threads).
    #[arg(long, default_value_t = 1)]
    pub(crate) numjobs: usize,
    /// O_DIRECT.
    #[arg(long, value_enum, default_value = "off")]
    pub(crate) direct: DirectArg,
    /// io_uring or psync.
    #[arg(long, default_value = "io_uring")]
    pub(crate) engine: IoEngine,
    /// Registered buffers (READ_FIXED / WRITE_FIXED).
    #[arg(long)]
    pub(crate) fixedbufs: bool,
    /// Registered file.
    #[arg(long)]
    pub(crate) registerfiles: bool,
    /// SQPOLL: a kernel thread submits.
    #[arg(long)]
    pub(crate) sqthread_poll: bool,
    /// IOPOLL (needs O_DIRECT and a device with poll queues).
    #[arg(long)]
    pub(crate) hipri: bool,
    /// Write even if the file system's free space looks too small.
    #[arg(long)]
    pub(crate) force: bool,
    /// Byte offset of job 0's region.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub(crate) offset: u64,
    /// Distance between job regions (default --size: each job its own
    /// region; 0: all on one region).
    #[arg(long, value_parser = parse_size)]
    pub(crate) offset_increment: Option<u64>,
    /// fdatasync after every N writes.
    #[arg(long, default_value_t = 0)]
    pub(crate) fsync_every: u64,
    /// fdatasync when the writes are done (always on in shared-file mode).
    #[arg(long)]
    pub(crate) end_fsync: bool,
    /// Data: gen (generator bytes at each offset, which depend on the
    /// job's extent: --verify with the writing job's --size, --numjobs and
    /// --offset), header (offset + checksum per block), fixed (buffers
    /// filled once, like fio).
    #[arg(long, default_value = "gen")]
    pub(crate) pattern: String,
    /// Dedup ratio of generated data (at least 1).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true,
          value_parser = number_in(1.0, f64::MAX))]
    pub(crate) dedup: f64,
    /// Compression ratio of generated data (at least 1).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true,
          value_parser = number_in(1.0, f64::MAX))]
    pub(crate) compress: f64,
    /// Seed of data and offsets.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Read the regions back after the run and check every block.
    #[arg(long)]
    pub(crate) verify: bool,
    /// io_uring buffers on 2 MiB huge pages (reserved, else transparent).
    #[arg(long)]
    pub(crate) hugepages: bool,
    /// This rank (default SLURM_PROCID, else 0).
    #[arg(long)]
    pub(crate) rank: Option<u32>,
    /// Ranks in all (default SLURM_NTASKS, else 1).
    #[arg(long)]
    pub(crate) ranks: Option<u32>,
    /// Write this rank's JSON report into DIR (rank-N.json).
    #[arg(long)]
    pub(crate) report_dir: Option<PathBuf>,
    /// With --report-dir: replace another run's reports found there.
    #[arg(long, requires = "report_dir")]
    pub(crate) overwrite: bool,
    /// The run's id, the same for every rank (default SLURM_JOB_ID.STEP
    /// under Slurm, else the launcher's PID).
    #[arg(long)]
    pub(crate) run_id: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw the latency percentile curve per direction into this SVG.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// fio's JSON output (`--output-format=json`) of the same job: its
    /// latency curve is drawn dashed beside ours.
    #[arg(long, requires = "plot")]
    pub(crate) reference: Option<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct ReportArgs {
    /// Directory of rank-N.json reports.
    pub(crate) dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw per-rank bandwidth bars and the aggregate into this SVG.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct PlotRoundsArgs {
    /// JSON `{"title": "...", "cases": {"case": [ratio, ...]}}` (what
    /// scripts/compare-fio.sh --plot writes).
    pub(crate) input: PathBuf,
    /// The SVG to write.
    #[arg(long)]
    pub(crate) plot: PathBuf,
}

#[derive(clap::Args)]
pub(crate) struct WriteFileArgs {
    /// File to write: the data goes to PATH.partial and replaces PATH only
    /// when complete (an interrupted run never touches PATH).
    pub(crate) path: PathBuf,
    /// Write even if the file system's free space looks too small.
    #[arg(long)]
    pub(crate) force: bool,
    /// Bytes to write, e.g. 8GiB, 100GB, 1500MiB.
    #[arg(long, value_parser = parse_size)]
    pub(crate) size: u64,
    /// Dedup ratio of the data (logical / unique 4 KiB blocks), >= 1.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub(crate) dedup: f64,
    /// Compression ratio of the data (LZ4), 1..=32.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub(crate) compress: f64,
    /// Seed of the data.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// O_DIRECT.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) direct: DirectArg,
    /// I/O engine: io-uring, pwrite, auto (io_uring where it can be set up).
    #[arg(long, default_value = "auto")]
    pub(crate) engine: pagewriter_bench::stream::StreamEngine,
    /// Writes in flight (io_uring).
    #[arg(long)]
    pub(crate) queue_depth: Option<u32>,
    /// Bytes per buffer and per write, e.g. 4MiB (1..=1GiB).
    #[arg(long, value_parser = size_in(1, pagewriter_bench::stream::MAX_BUFFER_SIZE as u64))]
    pub(crate) buffer_size: Option<u64>,
    /// Buffers in the pool.
    #[arg(long)]
    pub(crate) buffer_count: Option<usize>,
    /// Threads generating data (default: the CPU count).
    #[arg(long)]
    pub(crate) gen_threads: Option<usize>,
    /// Threads calling pwrite (engine pwrite).
    #[arg(long, default_value_t = 4)]
    pub(crate) writer_threads: usize,
    /// Pick buffer size, count, queue depth and fill threads from the CPU
    /// count and the device, and print the picks (explicit flags win).
    #[arg(long)]
    pub(crate) auto: bool,
    /// Back the buffers with 2 MiB huge pages (reserved, else transparent;
    /// the fallback is reported).
    #[arg(long)]
    pub(crate) hugepages: bool,
    /// Do not register the buffers with io_uring (plain WRITE, not WRITE_FIXED).
    #[arg(long)]
    pub(crate) no_fixed_buffers: bool,
    /// Do not fallocate the file first.
    #[arg(long)]
    pub(crate) no_preallocate: bool,
    /// Print the stats as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(clap::Args)]
pub(crate) struct GenArgs {
    /// Bytes to generate, e.g. 1GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub(crate) size: u64,
    /// Write -o even if the file system's free space looks too small.
    #[arg(long)]
    pub(crate) force: bool,
    /// Dedup ratio (logical / unique bytes at --block-size), >= 1
    /// (default 1).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) dedup: Option<f64>,
    /// Compression ratio (logical / LZ4-compressed bytes), 1..=32
    /// (default 1).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) compress: Option<f64>,
    /// Dedup block size in bytes.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    pub(crate) block_size: u64,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Output file (created or truncated); stdout when absent.
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    /// Measure FILE's dedup and compression ratios instead of generating
    /// (the --dedup / --compress given are shown as targets).
    #[arg(long, value_name = "FILE")]
    pub(crate) verify: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum TornArg {
    /// No protection (a power cut may tear a page).
    Allow,
    /// RWF_ATOMIC page writes (O_DIRECT on a file system that takes
    /// them, e.g. XFS on Linux 6.11+); an error elsewhere.
    Atomic,
    /// A doublewrite area written and synced before the pages go in place.
    Doublewrite,
    /// Atomic where the file takes it, else doublewrite.
    Auto,
}

impl From<TornArg> for pagewriter::TornWrites {
    fn from(t: TornArg) -> Self {
        match t {
            TornArg::Allow => Self::Allow,
            TornArg::Atomic => Self::Atomic,
            TornArg::Doublewrite => Self::DoubleWrite,
            TornArg::Auto => Self::Auto,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum DirectArg {
    /// Buffered I/O (page cache).
    Off,
    /// O_DIRECT; an error where it cannot be used.
    On,
    /// O_DIRECT where possible, else buffered (the reason is printed).
    Auto,
}

impl From<DirectArg> for DirectIo {
    fn from(d: DirectArg) -> Self {
        match d {
            DirectArg::Off => DirectIo::Off,
            DirectArg::On => DirectIo::On,
            DirectArg::Auto => DirectIo::Auto,
        }
    }
}

/// `scale --fill`: how transactions fill their pages.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub(crate) enum FillArg {
    /// Zeroed guards filled in place with generated bytes.
    Random,
    /// A buffer filled once, stamped and copied in per transaction.
    Fixed,
    /// As fixed, from an unaligned Vec<u8>, copied in with write_all_at.
    Bytes,
}

/// `scale --layout`: how each cell's file is laid out.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub(crate) enum LayoutArg {
    /// A fresh file; fresh pages extend it (each flush allocates).
    Growing,
    /// Blocks reserved with fallocate (unwritten extents) before the clock.
    Preallocated,
    /// Blocks written and synced before the clock; pages wrap around inside.
    Written,
}

#[derive(clap::Args)]
pub(crate) struct ScaleArgs {
    /// Writer thread counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub(crate) threads: Vec<usize>,
    /// Modes, comma separated: per-page, concat, vectored, io-uring, separate-files.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "per-page,concat,vectored,io-uring,separate-files"
    )]
    pub(crate) modes: Vec<Mode>,
    /// Pages per transaction.
    #[arg(long, default_value_t = 16)]
    pub(crate) pages: usize,
    /// Page size in bytes.
    #[arg(long, default_value_t = 4096)]
    pub(crate) page_size: usize,
    /// Fraction of each transaction's pages that rewrite earlier pages
    /// (0..=1).
    #[arg(long, default_value_t = 0.125, allow_negative_numbers = true,
          value_parser = number_in(0.0, 1.0))]
    pub(crate) rewrite: f64,
    /// How each transaction ends: global (sync(): durable, every page any
    /// thread wrote), scoped (each thread's own Writer::commit: its pages
    /// only), through (Writer::write_and_commit: a transaction's pages and
    /// its commit in one call; `--fill fixed`), async:N
    /// (Writer::commit_async, N tickets in flight per thread), flush (to
    /// the OS only). `sync` is `global`.
    #[arg(long, default_value = "global",
          value_parser = |s: &str| s.parse::<CommitKind>().map_err(|e| e.to_string()))]
    pub(crate) commit: CommitKind,
    /// Seconds each cell runs (above 0, at most 3600).
    #[arg(long, default_value_t = 1.5, allow_negative_numbers = true,
          value_parser = cell_seconds)]
    pub(crate) duration: f64,
    /// Rounds over all cells (rows show medians).
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Directory for the temporary files (removed afterwards).
    #[arg(long, default_value = ".")]
    pub(crate) path: PathBuf,
    /// Write buffer bound in MiB (at least 1).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub(crate) buffer_mib: u64,
    /// Torn-page protection of the cached file (`Config::torn_writes`).
    #[arg(long, value_enum, default_value = "allow")]
    pub(crate) torn_writes: TornArg,
    /// Grow-ahead window (`Config::grow_ahead`): the file's size runs this
    /// far ahead of its data, written ahead of the writes; 0 = off (bytes,
    /// units accepted).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub(crate) grow_ahead: u64,
    /// io_uring queue depth (SQEs in flight) of the io-uring mode.
    #[arg(long, default_value_t = 32)]
    pub(crate) queue_depth: u32,
    /// O_DIRECT (auto: where the file system takes it; buffered I/O lets
    /// the kernel coalesce per-page writes and hides what is measured).
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) direct: DirectArg,
    /// Seed of page contents and rewrite choices.
    #[arg(long, default_value_t = 0x5eed)]
    pub(crate) seed: u64,
    /// Dedup ratio of the page contents (at the page size).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub(crate) dedup: f64,
    /// Compression ratio of the page contents (LZ4), 1 = incompressible.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub(crate) compress: f64,
    /// Page reads per transaction before its commit (90% to the oldest
    /// tenth of the pages), for a read-heavy mix.
    #[arg(long, default_value_t = 0)]
    pub(crate) reads: usize,
    /// Read cache budget (e.g. 64MiB; CLOCK eviction); 0 = no read cache.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub(crate) read_cache: u64,
    /// How each cell's file is laid out before its clock starts: growing
    /// (fresh pages extend the file, every flush allocates), preallocated
    /// (`--preallocate` bytes reserved with fallocate, as fio's
    /// --fallocate=native), written (`--preallocate` bytes written and
    /// synced; pages wrap around inside them: pure overwrites).
    #[arg(long, value_enum)]
    pub(crate) layout: Option<LayoutArg>,
    /// How transactions fill their pages: random (zeroed guards filled in
    /// place with generated bytes, redb-style) or fixed (one buffer filled
    /// once per thread and copied in with write_page, a stamp per page per
    /// write: the CPU per write of fio's own jobs).
    #[arg(long, value_enum, default_value = "random")]
    pub(crate) fill: FillArg,
    /// Bytes laid out in each cell's file (e.g. 8GiB), split over the files
    /// of separate-files cells. Alone it means `--layout preallocated`;
    /// with `--layout preallocated` it defaults to 4GiB, with `--layout
    /// written` to 1GiB.
    #[arg(long, value_parser = parse_size)]
    pub(crate) preallocate: Option<u64>,
    /// Preallocate even if the file system's free space looks too small.
    #[arg(long)]
    pub(crate) force: bool,
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw commits/s and p99 latency against threads into this SVG.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// A reference drawn dashed in the plot: JSON `{"label": ..., "points":
    /// [{"threads": 1, "commits_per_s": .., "p99_us": ..}, ..]}`.
    #[arg(long, requires = "plot")]
    pub(crate) reference: Option<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct FlushArgs {
    /// Bytes to write, e.g. 1GiB, 256MiB, 10GB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub(crate) size: u64,
    /// Engines, comma separated: per-page, concat, vectored, io-uring, auto.
    #[arg(long, value_delimiter = ',', default_value = "vectored,io-uring")]
    pub(crate) engines: Vec<FlushEngine>,
    /// io_uring queue depth.
    #[arg(long, default_value_t = 32)]
    pub(crate) queue_depth: u32,
    /// Bytes per write call (like fio's bs), e.g. 1MiB: at least a page
    /// (4KiB), at most 1GiB.
    #[arg(long, default_value = "1MiB",
          value_parser = size_in(4096, 1 << 30))]
    pub(crate) bs: u64,
    /// O_DIRECT.
    #[arg(long, value_enum, default_value = "off")]
    pub(crate) direct: DirectArg,
    /// Repeats, engines interleaved.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// File to write into (created if missing, never removed or
    /// truncated; a pass into a file that already holds --size bytes is
    /// marked as an overwrite); default a temporary file in --path. The
    /// warm-up passes write a temporary file beside it, not it.
    #[arg(long)]
    pub(crate) file: Option<PathBuf>,
    /// Directory for the temporary file.
    #[arg(long, default_value = ".")]
    pub(crate) path: PathBuf,
    /// Untimed warm-up passes first (memory first touched on a VM is slow).
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write even if the file system has less free space than --size.
    #[arg(long)]
    pub(crate) force: bool,
}

/// A byte size ([`parse_size`]) in `lo..=hi`; clap's message names the
/// flag and the value as typed, this one the bounds.
pub(crate) fn size_in(
    lo: u64,
    hi: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |s| {
        let v = parse_size(s)?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{v} bytes is not in {lo}..={hi}"))
        }
    }
}

/// A number in `lo..=hi` (negative numbers parse, and are refused by
/// the bound with the flag named, not taken for a flag).
pub(crate) fn number_in(
    lo: f64,
    hi: f64,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s| {
        let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
        if v >= lo && v <= hi {
            Ok(v)
        } else if hi == f64::MAX {
            Err(format!("{v:?} is not a number >= {lo:?}"))
        } else {
            Err(format!("{v:?} is not in {lo:?}..={hi:?}"))
        }
    }
}

/// Seconds a `scale` cell runs: above 0, at most an hour.
pub(crate) fn cell_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v > 0.0 && v <= 3600.0 {
        Ok(v)
    } else {
        Err(format!("{v:?} is not in (0, 3600] seconds"))
    }
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

/// A byte size: a number, or with a unit (KiB .. EiB, KB .. EB). Units
/// past exabytes, and values past 16 EiB, get a message saying so.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::parse_size(s).map_err(|e| {
        let unit = s
            .trim()
            .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '_')
            .trim();
        if unit.to_ascii_uppercase().starts_with(['Z', 'Y', 'R', 'Q']) {
            format!("{s:?}: unit {unit:?} is past the largest size a u64 holds (16 EiB); units go up to EiB / EB")
        } else {
            format!("{s:?}: {e} (bytes, or a number with a unit: KiB .. EiB, KB .. EB)")
        }
    })
}
