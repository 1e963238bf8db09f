//! `pagewriter`: benchmarks of the page writer. Thin: parse, call the
//! library, print.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use pagewriter::{DirectIo, FlushEngine};
use pagewriter_bench::datagen;
use pagewriter_bench::plot;
use pagewriter_bench::workload::bulk::{self, BulkConfig, BulkRun};
use pagewriter_bench::workload::io::{IoEngine, Rw};
use pagewriter_bench::workload::scale::{self, CommitKind, Mode, ScaleConfig, ScaleReport};

#[derive(Parser)]
#[command(
    name = "pagewriter",
    version,
    about = "Page writer for storage engines: benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Commit throughput across thread counts: redb-style transactions of
    /// fresh and rewritten pages, each flush engine against one file per
    /// thread.
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
}

#[derive(clap::Args)]
struct IoArgs {
    /// The file (created if missing, never truncated).
    #[arg(
        long,
        required_unless_present = "shared_file",
        conflicts_with = "shared_file"
    )]
    filename: Option<PathBuf>,
    /// Shared-file mode: split --size bytes of this file into contiguous
    /// parts by rank and thread (remainder to the last part).
    #[arg(long)]
    shared_file: Option<PathBuf>,
    /// read, write, randread, randwrite, rw (readwrite), randrw.
    #[arg(long, default_value = "read")]
    rw: Rw,
    /// Percent reads for rw / randrw.
    #[arg(long, default_value_t = 50)]
    rwmix_read: u32,
    /// Bytes per I/O, e.g. 4KiB, 1MiB.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    bs: u64,
    /// Bytes per job region (shared-file mode: the whole file), e.g. 1GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    size: u64,
    /// Time-based: run this long cycling over the region (10s, 1m, 500ms
    /// or plain seconds).
    #[arg(long, value_parser = parse_duration)]
    runtime: Option<Duration>,
    /// I/Os in flight per job (io_uring).
    #[arg(long, default_value_t = 1)]
    iodepth: u32,
    /// Reap at least this many completions per wait.
    #[arg(long, default_value_t = 1)]
    iodepth_batch: u32,
    /// Jobs (threads).
    #[arg(long, default_value_t = 1)]
    numjobs: usize,
    /// O_DIRECT.
    #[arg(long, value_enum, default_value = "off")]
    direct: DirectArg,
    /// io_uring or psync.
    #[arg(long, default_value = "io_uring")]
    engine: IoEngine,
    /// Registered buffers (READ_FIXED / WRITE_FIXED).
    #[arg(long)]
    fixedbufs: bool,
    /// Registered file.
    #[arg(long)]
    registerfiles: bool,
    /// SQPOLL: a kernel thread submits.
    #[arg(long)]
    sqthread_poll: bool,
    /// IOPOLL (needs O_DIRECT and a device with poll queues).
    #[arg(long)]
    hipri: bool,
    /// Write even if the file system's free space looks too small.
    #[arg(long)]
    force: bool,
    /// Byte offset of job 0's region.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    offset: u64,
    /// Distance between job regions (default --size: each job its own
    /// region; 0: all on one region).
    #[arg(long, value_parser = parse_size)]
    offset_increment: Option<u64>,
    /// fdatasync after every N writes.
    #[arg(long, default_value_t = 0)]
    fsync_every: u64,
    /// fdatasync when the writes are done (always on in shared-file mode).
    #[arg(long)]
    end_fsync: bool,
    /// Data: gen (generator bytes at each offset), header (offset +
    /// checksum per block), fixed (buffers filled once, like fio).
    #[arg(long, default_value = "gen")]
    pattern: String,
    /// Dedup ratio of generated data.
    #[arg(long, default_value_t = 1.0)]
    dedup: f64,
    /// Compression ratio of generated data.
    #[arg(long, default_value_t = 1.0)]
    compress: f64,
    /// Seed of data and offsets.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Read the regions back after the run and check every block.
    #[arg(long)]
    verify: bool,
    /// io_uring buffers on 2 MiB huge pages (reserved, else transparent).
    #[arg(long)]
    hugepages: bool,
    /// This rank (default SLURM_PROCID, else 0).
    #[arg(long)]
    rank: Option<u32>,
    /// Ranks in all (default SLURM_NTASKS, else 1).
    #[arg(long)]
    ranks: Option<u32>,
    /// Write this rank's JSON report into DIR (rank-N.json).
    #[arg(long)]
    report_dir: Option<PathBuf>,
    /// With --report-dir: replace another run's reports found there.
    #[arg(long, requires = "report_dir")]
    overwrite: bool,
    /// The run's id, the same for every rank (default SLURM_JOB_ID.STEP
    /// under Slurm, else the launcher's PID).
    #[arg(long)]
    run_id: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Draw the latency percentile curve per direction into this SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// fio's JSON output (`--output-format=json`) of the same job: its
    /// latency curve is drawn dashed beside ours.
    #[arg(long, requires = "plot")]
    reference: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ReportArgs {
    /// Directory of rank-N.json reports.
    dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Draw per-rank bandwidth bars and the aggregate into this SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(clap::Args)]
struct PlotRoundsArgs {
    /// JSON `{"title": "...", "cases": {"case": [ratio, ...]}}` (what
    /// scripts/compare-fio.sh --plot writes).
    input: PathBuf,
    /// The SVG to write.
    #[arg(long)]
    plot: PathBuf,
}

#[derive(clap::Args)]
struct WriteFileArgs {
    /// File to write: the data goes to PATH.partial and replaces PATH only
    /// when complete (an interrupted run never touches PATH).
    path: PathBuf,
    /// Write even if the file system's free space looks too small.
    #[arg(long)]
    force: bool,
    /// Bytes to write, e.g. 8GiB, 100GB, 1500MiB.
    #[arg(long, value_parser = parse_size)]
    size: u64,
    /// Dedup ratio of the data (logical / unique 4 KiB blocks), >= 1.
    #[arg(long, default_value_t = 1.0)]
    dedup: f64,
    /// Compression ratio of the data (LZ4), 1..=32.
    #[arg(long, default_value_t = 1.0)]
    compress: f64,
    /// Seed of the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// O_DIRECT.
    #[arg(long, value_enum, default_value = "auto")]
    direct: DirectArg,
    /// I/O engine: io-uring, pwrite, auto (io_uring where it can be set up).
    #[arg(long, default_value = "auto")]
    engine: pagewriter_bench::stream::StreamEngine,
    /// Writes in flight (io_uring).
    #[arg(long)]
    queue_depth: Option<u32>,
    /// Bytes per buffer and per write, e.g. 4MiB.
    #[arg(long, value_parser = parse_size)]
    buffer_size: Option<u64>,
    /// Buffers in the pool.
    #[arg(long)]
    buffer_count: Option<usize>,
    /// Threads generating data (default: the CPU count).
    #[arg(long)]
    gen_threads: Option<usize>,
    /// Threads calling pwrite (engine pwrite).
    #[arg(long, default_value_t = 4)]
    writer_threads: usize,
    /// Pick buffer size, count, queue depth and fill threads from the CPU
    /// count and the device, and print the picks (explicit flags win).
    #[arg(long)]
    auto: bool,
    /// Back the buffers with 2 MiB huge pages (reserved, else transparent;
    /// the fallback is reported).
    #[arg(long)]
    hugepages: bool,
    /// Do not register the buffers with io_uring (plain WRITE, not WRITE_FIXED).
    #[arg(long)]
    no_fixed_buffers: bool,
    /// Do not fallocate the file first.
    #[arg(long)]
    no_preallocate: bool,
    /// Print the stats as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct GenArgs {
    /// Bytes to generate, e.g. 1GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    size: u64,
    /// Write -o even if the file system's free space looks too small.
    #[arg(long)]
    force: bool,
    /// Dedup ratio (logical / unique bytes at --block-size), >= 1.
    #[arg(long, default_value_t = 1.0)]
    dedup: f64,
    /// Compression ratio (logical / LZ4-compressed bytes), 1..=32.
    #[arg(long, default_value_t = 1.0)]
    compress: f64,
    /// Dedup block size in bytes.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    block_size: u64,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output file (created or truncated); stdout when absent.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Measure FILE's dedup and compression ratios instead of generating
    /// (the --dedup / --compress given are shown as targets).
    #[arg(long, value_name = "FILE")]
    verify: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum CommitArg {
    /// Durable commit (fdatasync, group commit).
    Sync,
    /// Flush to the OS only.
    Flush,
}

#[derive(Clone, Copy, ValueEnum)]
enum DirectArg {
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

#[derive(clap::Args)]
struct ScaleArgs {
    /// Writer thread counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    threads: Vec<usize>,
    /// Modes, comma separated: per-page, concat, vectored, io-uring, separate-files.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "per-page,concat,vectored,io-uring,separate-files"
    )]
    modes: Vec<Mode>,
    /// Pages per transaction.
    #[arg(long, default_value_t = 16)]
    pages: usize,
    /// Page size in bytes.
    #[arg(long, default_value_t = 4096)]
    page_size: usize,
    /// Fraction of each transaction's pages that rewrite earlier pages.
    #[arg(long, default_value_t = 0.125)]
    rewrite: f64,
    /// How each transaction ends.
    #[arg(long, value_enum, default_value = "sync")]
    commit: CommitArg,
    /// Seconds each cell runs.
    #[arg(long, default_value_t = 1.5)]
    duration: f64,
    /// Rounds over all cells (rows show medians).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Directory for the temporary files (removed afterwards).
    #[arg(long, default_value = ".")]
    path: PathBuf,
    /// Write buffer bound in MiB.
    #[arg(long, default_value_t = 64)]
    buffer_mib: usize,
    /// Commit rounds allowed in fdatasync at once (1 = strictly serial).
    #[arg(long, default_value_t = 4)]
    sync_lanes: usize,
    /// io_uring queue depth (SQEs in flight) of the io-uring mode.
    #[arg(long, default_value_t = 32)]
    queue_depth: u32,
    /// O_DIRECT (auto: where the file system takes it; buffered I/O lets
    /// the kernel coalesce per-page writes and hides what is measured).
    #[arg(long, value_enum, default_value = "auto")]
    direct: DirectArg,
    /// Seed of page contents and rewrite choices.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Dedup ratio of the page contents (at the page size).
    #[arg(long, default_value_t = 1.0)]
    dedup: f64,
    /// Compression ratio of the page contents (LZ4), 1 = incompressible.
    #[arg(long, default_value_t = 1.0)]
    compress: f64,
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw commits/s and p99 latency against threads into this SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// A reference drawn dashed in the plot: JSON `{"label": ..., "points":
    /// [{"threads": 1, "commits_per_s": .., "p99_us": ..}, ..]}`.
    #[arg(long, requires = "plot")]
    reference: Option<PathBuf>,
}

#[derive(clap::Args)]
struct FlushArgs {
    /// Bytes to write, e.g. 1GiB, 256MiB, 10GB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    size: u64,
    /// Engines, comma separated: per-page, concat, vectored, io-uring, auto.
    #[arg(long, value_delimiter = ',', default_value = "vectored,io-uring")]
    engines: Vec<FlushEngine>,
    /// io_uring queue depth.
    #[arg(long, default_value_t = 32)]
    queue_depth: u32,
    /// Bytes per write call (like fio's bs), e.g. 1MiB.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    bs: u64,
    /// O_DIRECT.
    #[arg(long, value_enum, default_value = "off")]
    direct: DirectArg,
    /// Repeats, engines interleaved.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// File to write (removed before each run and afterwards); default a
    /// temporary file in --path.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Directory for the temporary file.
    #[arg(long, default_value = ".")]
    path: PathBuf,
    /// Untimed warm-up passes first (memory first touched on a VM is slow).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

/// A byte size: a number, or with a unit (KiB .. EiB, KB .. EB). Units
/// past exabytes, and values past 16 EiB, get a message saying so.
fn parse_size(s: &str) -> Result<u64, String> {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    pagewriter_bench::interrupt::install();
    let result = match cli.command {
        Command::Scale(args) => cmd_scale(args),
        Command::Flush(args) => cmd_flush(args),
        Command::Gen(args) => cmd_gen(args),
        Command::WriteFile(args) => cmd_write_file(args),
        Command::Io(args) => cmd_io(args),
        Command::Report(args) => cmd_report(args),
        Command::PlotRounds(args) => cmd_plot_rounds(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pagewriter: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_scale(a: ScaleArgs) -> Result<(), Box<dyn std::error::Error>> {
    let modes = a
        .modes
        .iter()
        .map(|m| m.with_queue_depth(a.queue_depth))
        .collect();
    if !a.duration.is_finite() || a.duration <= 0.0 || a.duration > 3600.0 {
        return Err(format!("--duration {} is not in (0, 3600] seconds", a.duration).into());
    }
    if !a.path.is_dir() {
        return Err(format!("--path {} is not a directory", a.path.display()).into());
    }
    let config = ScaleConfig {
        threads: a.threads,
        modes,
        pages_per_txn: a.pages,
        page_size: a.page_size,
        rewrite_fraction: a.rewrite,
        commit: match a.commit {
            CommitArg::Sync => CommitKind::Sync,
            CommitArg::Flush => CommitKind::Flush,
        },
        cell_duration: Duration::from_secs_f64(a.duration),
        repeats: a.repeats,
        dir: a.path,
        seed: a.seed,
        max_write_buffer_bytes: a
            .buffer_mib
            .checked_mul(1 << 20)
            .ok_or("--buffer-mib too large")?,
        sync_lanes: a.sync_lanes,
        direct: a.direct.into(),
        dedup_ratio: a.dedup,
        compress_ratio: a.compress,
    };
    config.validate()?;
    // Plot path and reference are checked before minutes of work.
    if let Some(p) = &a.plot {
        plot::check_writable(p)?;
    }
    let reference: Option<plot::Reference> = match &a.reference {
        Some(p) => Some(read_json(p)?),
        None => None,
    };
    let total = config.threads.len() * config.modes.len() * config.repeats;
    let mut done = 0;
    let report = scale::run(&config, |c| {
        done += 1;
        eprintln!(
            "[{done}/{total}] repeat {} {:>2} threads {:<15} {:>10.0} pages/s",
            c.repeat + 1,
            c.threads,
            c.mode.name(),
            c.page_writes_per_s()
        );
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_scale(&report);
    }
    if let Some(p) = &a.plot {
        plot::line_svg(&plot::scale_figure(&report, reference.as_ref()), p)?;
        eprintln!("plot: {}", p.display());
    }
    Ok(())
}

fn print_scale(r: &ScaleReport) {
    let c = &r.config;
    for (mode, io) in &r.io_modes {
        println!("I/O {:<15} {io}", mode.name());
    }
    println!(
        "data: dedup {} compress {} (datagen, seed {})",
        c.dedup_ratio, c.compress_ratio, c.seed
    );
    println!(
        "commit: {}; txn: {} x {} B pages ({} rewrites); {} s per cell, median of {}",
        match c.commit {
            CommitKind::Sync => "sync (fdatasync, group commit)",
            CommitKind::Flush => "flush (no fdatasync)",
        },
        c.pages_per_txn,
        c.page_size,
        c.rewrites_per_txn(),
        c.cell_duration.as_secs_f64(),
        c.repeats
    );
    println!(
        "{:>7}  {:<15} {:>11} {:>10} {:>8} {:>13} {:>12} {:>8} {:>8} {:>11}",
        "threads",
        "mode",
        "pages/s",
        "commits/s",
        "MB/s",
        "writes/commit",
        "syncs/commit",
        "p50 us",
        "p99 us",
        "vs per-page"
    );
    for row in &r.rows {
        println!(
            "{:>7}  {:<15} {:>11.0} {:>10.0} {:>8.1} {:>13.2} {:>12.2} {:>8} {:>8} {:>11}",
            row.threads,
            row.mode.name(),
            row.page_writes_per_s,
            row.commits_per_s,
            row.mb_per_s,
            row.write_calls_per_commit,
            row.syncs_per_commit,
            row.p50_us,
            row.p99_us,
            row.vs_per_page
                .map_or("-".to_string(), |v| format!("{v:.2}x")),
        );
    }
}

fn cmd_flush(a: FlushArgs) -> Result<(), Box<dyn std::error::Error>> {
    let engines = a
        .engines
        .iter()
        .map(|e| e.with_queue_depth(a.queue_depth))
        .collect();
    if !a.path.is_dir() {
        return Err(format!("--path {} is not a directory", a.path.display()).into());
    }
    let config = BulkConfig {
        size: a.size,
        engines,
        page_size: 4096,
        max_write_bytes: usize::try_from(a.bs).map_err(|_| "--bs too large")?,
        direct: a.direct.into(),
        repeats: a.repeats,
        file: a.file,
        dir: a.path,
        warmup: a.warmup,
    };
    let runs = bulk::run(&config, |r: &BulkRun| {
        if !a.json {
            println!(
                "repeat {} {:<40} {:>8.3} GB/s  ({} B in {:.3} s, {} write calls, {} fdatasync)",
                r.repeat + 1,
                r.io_mode,
                r.gb_per_s,
                r.bytes,
                r.seconds,
                r.stats.write_calls,
                r.stats.syncs
            );
        }
    })
    .map_err(|e| with_path(config.file.as_deref().unwrap_or(&config.dir), e))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
    }
    Ok(())
}

fn cmd_gen(a: GenArgs) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::{Read, Write};
    let block_size = usize::try_from(a.block_size).map_err(|_| "--block-size too large")?;
    if let Some(path) = &a.verify {
        let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let started = std::time::Instant::now();
        let m = datagen::measure(|buf| f.read(buf), block_size)?;
        if a.json {
            println!(
                "{}",
                serde_json::json!({
                    "file": path, "bytes": m.bytes, "block_size": block_size,
                    "dedup_ratio": m.dedup_ratio, "compress_ratio": m.compress_ratio,
                    "target_dedup_ratio": a.dedup, "target_compress_ratio": a.compress,
                })
            );
        } else {
            println!(
                "{}: {} B in {:.1} s",
                path.display(),
                m.bytes,
                started.elapsed().as_secs_f64()
            );
            println!(
                "dedup ratio       {:>8.3}  (target {:.3}, block {} B, XXH3-128 per block)",
                m.dedup_ratio, a.dedup, block_size
            );
            println!(
                "compression ratio {:>8.3}  (target {:.3}, LZ4 per 64 KiB of unique data)",
                m.compress_ratio, a.compress
            );
        }
        return Ok(());
    }
    let generator = datagen::Generator::new(datagen::GenConfig {
        size: a.size,
        dedup_ratio: a.dedup,
        compress_ratio: a.compress,
        block_size,
        seed: a.seed,
    })?;
    let mut out: Box<dyn Write> = match &a.output {
        Some(p) => {
            // Checked before File::create truncates an existing output.
            pagewriter_bench::room::check(p, a.size, pagewriter_bench::room::held(p), a.force)?;
            Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Ctrl-C cuts -o to what was written (an incomplete file shows by size).
    let good = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    if let Some(p) = &a.output {
        pagewriter_bench::interrupt::partial(p.clone(), good.clone());
    }
    generator.write_to(&mut out, threads, &good)?;
    Ok(())
}

fn cmd_write_file(a: WriteFileArgs) -> Result<(), Box<dyn std::error::Error>> {
    use pagewriter_bench::stream::{self, WriteOptions};
    let mut opts = WriteOptions {
        dedup_ratio: a.dedup,
        compress_ratio: a.compress,
        seed: a.seed,
        direct: a.direct.into(),
        engine: a.engine,
        writer_threads: a.writer_threads,
        hugepages: a.hugepages,
        force: a.force,
        fixed_buffers: !a.no_fixed_buffers,
        preallocate: !a.no_preallocate,
        ..WriteOptions::default()
    };
    if a.auto {
        let (picked, why) = stream::auto_options(&a.path, &opts);
        opts = picked;
        for line in why {
            eprintln!("auto: {line}");
        }
    }
    if let Some(v) = a.buffer_size {
        opts.buffer_size = usize::try_from(v).map_err(|_| "--buffer-size too large")?;
    }
    if let Some(v) = a.buffer_count {
        opts.buffer_count = v;
    }
    if let Some(v) = a.queue_depth {
        opts.queue_depth = v;
    }
    if let Some(v) = a.gen_threads {
        opts.gen_threads = v;
    }
    let bar = indicatif::ProgressBar::new(a.size);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .expect("valid template"),
    );
    // Ctrl-C removes the partial file; the target is only ever replaced
    // whole, by a complete file.
    pagewriter_bench::interrupt::scratch(stream::partial_path(&a.path));
    let result = stream::write_file_with_progress(&a.path, a.size, &opts, &mut |p| {
        bar.set_position(p.bytes_done)
    });
    bar.finish_and_clear();
    let stats = match result {
        Ok(s) => s,
        Err(e) => {
            if a.json {
                println!("{}", serde_json::to_string_pretty(&e.stats)?);
            }
            return Err(format!("{}: {e}", a.path.display()).into());
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    println!(
        "wrote {} bytes to {} in {:.3} s: {:.3} GB/s ({:.3} GiB/s)",
        stats.bytes,
        a.path.display(),
        stats.duration_s,
        stats.gb_per_s,
        stats.gb_per_s * 1e9 / (1u64 << 30) as f64
    );
    println!("I/O: {}", stats.io_mode);
    println!(
        "time: generating {:.3} s over {} threads, waiting for writes {:.3} s, \
         waiting for data {:.3} s, truncate {:.3} s, fallocate {:.3} s, fdatasync {:.3} s; \
         {} writes",
        stats.gen_s,
        stats.gen_threads,
        stats.io_wait_s,
        stats.starved_s,
        stats.truncate_s,
        stats.preallocate_s,
        stats.fdatasync_s,
        stats.writes
    );
    Ok(())
}

fn cmd_io(a: IoArgs) -> Result<(), Box<dyn std::error::Error>> {
    use pagewriter_bench::workload::io::{self, IoConfig, Pattern, Ranks};
    let shared = a.shared_file.is_some();
    let path = a
        .shared_file
        .or(a.filename)
        .ok_or("--filename or --shared-file")?;
    if let Some(p) = &a.plot {
        plot::check_writable(p)?;
    }
    let fio: Option<serde_json::Value> = match &a.reference {
        Some(p) => Some(read_json(p)?),
        None => None,
    };
    let mut cfg = IoConfig::new(path);
    cfg.rw = a.rw;
    cfg.rwmix_read = a.rwmix_read;
    cfg.bs = usize::try_from(a.bs).map_err(|_| "--bs too large")?;
    cfg.size = a.size;
    cfg.runtime = a.runtime;
    cfg.iodepth = a.iodepth;
    cfg.iodepth_batch = a.iodepth_batch;
    cfg.numjobs = a.numjobs;
    cfg.direct = a.direct.into();
    cfg.engine = a.engine;
    cfg.fixedbufs = a.fixedbufs;
    cfg.registerfiles = a.registerfiles;
    cfg.sqthread_poll = a.sqthread_poll;
    cfg.hipri = a.hipri;
    cfg.force = a.force;
    cfg.run_id = a.run_id.clone().unwrap_or_else(io::default_run_id);
    if let Some(dir) = &a.report_dir {
        // Before the run: a directory of another run's reports is refused.
        io::claim_report_dir(dir, &cfg.run_id, a.overwrite)?;
    }
    cfg.offset = a.offset;
    cfg.offset_increment = a.offset_increment;
    cfg.fsync_every = a.fsync_every;
    cfg.end_fsync = a.end_fsync || shared;
    cfg.pattern = match a.pattern.as_str() {
        "gen" => Pattern::Gen,
        "header" => Pattern::Header,
        "fixed" => Pattern::Fixed,
        other => return Err(format!("unknown pattern {other:?} (gen, header, fixed)").into()),
    };
    cfg.dedup_ratio = a.dedup;
    cfg.compress_ratio = a.compress;
    cfg.seed = a.seed;
    cfg.verify = a.verify;
    cfg.hugepages = a.hugepages;
    if shared || a.rank.is_some() || a.ranks.is_some() {
        let env = Ranks::from_slurm_env();
        cfg.shared = Some(Ranks {
            rank: a.rank.or(env.map(|r| r.rank)).unwrap_or(0),
            ranks: a.ranks.or(env.map(|r| r.ranks)).unwrap_or(1),
            node: env.and_then(|r| r.node),
        });
        if !shared {
            return Err("--rank/--ranks need --shared-file".into());
        }
    }
    let bar = indicatif::ProgressBar::hidden();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("template"),
    );
    let report = io::run(&cfg, &mut |p| {
        if p.elapsed >= Duration::from_secs(2) && bar.is_hidden() {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_message(format!(
            "{:.1}% {:.3} GB/s {} B done",
            p.fraction * 100.0,
            p.bytes_per_sec / 1e9,
            p.bytes
        ));
        bar.tick();
    });
    bar.finish_and_clear();
    let report = report.map_err(|e| with_path(&cfg.path, e))?;
    if let Some(dir) = &a.report_dir {
        std::fs::create_dir_all(dir)?;
        let rank = cfg.shared.map_or(0, |r| r.rank);
        let tmp = dir.join(format!(".rank-{rank}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&report)?)?;
        std::fs::rename(&tmp, dir.join(format!("rank-{rank}.json")))?;
    }
    if let Some(p) = &a.plot {
        plot::line_svg(&plot::io_figure(&report, fio.as_ref()), p)?;
        eprintln!("plot: {}", p.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_io(&report);
    Ok(())
}

/// An I/O error from work on `path` names it (the library's I/O errors
/// carry the call and offset, not the file).
fn with_path(path: &std::path::Path, e: pagewriter::Error) -> Box<dyn std::error::Error> {
    match e {
        e @ (pagewriter::Error::Io { .. } | pagewriter::Error::PagesFailed { .. }) => {
            format!("{}: {e}", path.display()).into()
        }
        other => other.into(),
    }
}

/// Reads a JSON file into `T`; errors name the file.
fn read_json<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
) -> Result<T, Box<dyn std::error::Error>> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

fn cmd_plot_rounds(a: PlotRoundsArgs) -> Result<(), Box<dyn std::error::Error>> {
    plot::check_writable(&a.plot)?;
    let rounds: plot::Rounds = read_json(&a.input)?;
    plot::line_svg(&plot::rounds_figure(&rounds), &a.plot)?;
    eprintln!("plot: {}", a.plot.display());
    Ok(())
}

fn print_io(r: &pagewriter_bench::workload::io::IoReport) {
    let c = &r.config;
    let who = match c.shared {
        Some(s) => format!(" rank {}/{} on {}", s.rank, s.ranks, r.host),
        None => String::new(),
    };
    // psync has one I/O in flight per job whatever --iodepth says.
    let depth = match c.engine {
        pagewriter_bench::workload::io::IoEngine::Psync => 1,
        _ => c.iodepth,
    };
    println!(
        "{}{}: rw={} bs={} iodepth={} numjobs={} runtime={:.3}s",
        c.path.display(),
        who,
        c.rw.name(),
        c.bs,
        depth,
        c.numjobs,
        r.runtime_s
    );
    println!("  I/O: {}", r.io_mode);
    for (name, d) in [("read", &r.read), ("write", &r.write)] {
        let Some(d) = d else { continue };
        println!(
            "  {name}: IOPS={:.0}, BW={:.3} GB/s ({:.1} MiB/s) ({} B in {} I/Os)",
            d.iops,
            d.bw_bytes_per_s / 1e9,
            d.bw_bytes_per_s / (1u64 << 20) as f64,
            d.bytes,
            d.ios
        );
        let l = &d.lat_us;
        println!(
            "    lat (us): min={:.1} avg={:.1} max={:.1}, samples={}",
            l.min, l.mean, l.max, d.lat_samples
        );
        println!(
            "    percentiles (us): p50={:.1} p90={:.1} p99={:.1} p99.9={:.1} p99.99={:.1}",
            l.p50, l.p90, l.p99, l.p99_9, l.p99_99
        );
    }
    if r.fsyncs > 0 {
        println!("  fdatasync calls: {}", r.fsyncs);
    }
    if c.verify {
        println!("  verify: {} blocks OK", r.verified_blocks);
    }
}

fn cmd_report(a: ReportArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(p) = &a.plot {
        plot::check_writable(p)?;
    }
    let agg = pagewriter_bench::workload::io::aggregate(&a.dir)?;
    if let Some(p) = &a.plot {
        plot::bars_svg(
            &plot::report_title(&agg),
            "bandwidth (GiB/s)",
            &plot::report_bars(&agg),
            p,
        )?;
        eprintln!("plot: {}", p.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&agg)?);
        return Ok(());
    }
    println!(
        "{} of {} ranks: {} bytes in {:.3} s (earliest start to latest end): {:.3} GiB/s aggregate",
        agg.ranks, agg.ranks_expected, agg.total_bytes, agg.span_s, agg.aggregate_gib_per_s
    );
    println!(
        "slowest: rank {} on {}, {:.3} s",
        agg.slowest.0, agg.slowest.1, agg.slowest.2
    );
    for (rank, host, bytes, gib) in &agg.per_rank {
        println!("  rank {rank:>4} {host:<20} {bytes:>14} B {gib:8.3} GiB/s");
    }
    if (agg.ranks as u32) < agg.ranks_expected {
        return Err(format!(
            "only {} of {} ranks reported",
            agg.ranks, agg.ranks_expected
        )
        .into());
    }
    Ok(())
}
