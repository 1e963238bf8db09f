//! What a streaming write is asked to do, and `--auto`'s choices.

use super::*;

/// Largest `buffer_size`: 1 GiB (one io_uring SQE moves at most 2 GiB - 1,
/// and a registered buffer may be at most 1 GiB).
pub const MAX_BUFFER_SIZE: usize = 1 << 30;

/// How the bytes reach the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamEngine {
    /// io_uring; an error where it cannot be set up.
    IoUring,
    /// `pwrite` from `writer_threads` threads.
    Pwrite,
    /// io_uring where it can be set up, else `pwrite`, with the reason.
    #[default]
    Auto,
}

impl std::str::FromStr for StreamEngine {
    type Err = Error;

    /// Parses `io-uring` (or `io_uring`), `pwrite` (or `psync`) and `auto`.
    ///
    /// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) for any other name.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "io-uring" | "io_uring" => Ok(StreamEngine::IoUring),
            "pwrite" | "psync" => Ok(StreamEngine::Pwrite),
            "auto" => Ok(StreamEngine::Auto),
            other => Err(Error::config(format!(
                "unknown engine {other:?} (io-uring, pwrite, auto)"
            ))),
        }
    }
}

/// Settings of [`write_file`]. `WriteOptions::default()` and change what
/// you need.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteOptions {
    /// Bytes per buffer and per write: 1..=[`MAX_BUFFER_SIZE`]; with
    /// `O_DIRECT` a multiple of the file's alignment. Default 4 MiB.
    pub buffer_size: usize,
    /// Buffers in the pool (memory used: `buffer_size * buffer_count`).
    /// Default 8.
    pub buffer_count: usize,
    /// Most writes in flight (io_uring), 1..=4096; capped at
    /// `buffer_count`. Default 4.
    pub queue_depth: u32,
    /// I/O engine. Default [`StreamEngine::Auto`].
    pub engine: StreamEngine,
    /// `O_DIRECT`. Default [`DirectIo::Auto`].
    pub direct: DirectIo,
    /// Register the buffers with io_uring (`WRITE_FIXED`). Default true;
    /// where registration is refused the plain `WRITE` is used, reported.
    pub fixed_buffers: bool,
    /// Threads generating data. Default: the CPU count.
    pub gen_threads: usize,
    /// Threads calling `pwrite` (engine `Pwrite` only). Default 4.
    pub writer_threads: usize,
    /// Back the buffers with 2 MiB huge pages (reserved, else transparent,
    /// reported in [`WriteStats::hugepages`]). Default false.
    pub hugepages: bool,
    /// `fallocate` the whole file before writing. Default true.
    pub preallocate: bool,
    /// Write even if the file system's free space looks too small.
    /// Default false.
    pub force: bool,
    /// Dedup ratio of the data, >= 1 (see [`GenConfig`]). Default 1.
    pub dedup_ratio: f64,
    /// Compression ratio of the data, 1..=32. Default 1.
    pub compress_ratio: f64,
    /// Dedup block size in bytes. Default 4096.
    pub block_size: usize,
    /// Seed of the data.
    pub seed: u64,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            buffer_size: 4 << 20,
            buffer_count: 8,
            queue_depth: 4,
            engine: StreamEngine::Auto,
            direct: DirectIo::Auto,
            fixed_buffers: true,
            gen_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            writer_threads: 4,
            hugepages: false,
            preallocate: true,
            force: false,
            dedup_ratio: 1.0,
            compress_ratio: 1.0,
            block_size: 4096,
            seed: 0,
        }
    }
}

impl WriteOptions {
    /// The generator configuration for a file of `size` bytes.
    pub fn gen_config(&self, size: u64) -> GenConfig {
        GenConfig {
            size,
            dedup_ratio: self.dedup_ratio,
            compress_ratio: self.compress_ratio,
            block_size: self.block_size,
            seed: self.seed,
        }
    }

    /// Checks everything that does not need the file.
    ///
    /// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) naming the setting.
    pub fn validate(&self, size: u64) -> Result<()> {
        let bad = |m: String| Err(Error::config(m));
        if !(1..=MAX_BUFFER_SIZE).contains(&self.buffer_size) {
            return bad(format!(
                "buffer_size {} is not in 1..={MAX_BUFFER_SIZE}",
                self.buffer_size
            ));
        }
        if self.buffer_count == 0 || self.buffer_count > 16384 {
            return bad(format!(
                "buffer_count {} is not in 1..=16384",
                self.buffer_count
            ));
        }
        if !(1..=4096).contains(&self.queue_depth) {
            return bad(format!(
                "queue_depth {} is not in 1..=4096",
                self.queue_depth
            ));
        }
        if self.gen_threads == 0 || self.writer_threads == 0 {
            return bad("gen_threads and writer_threads must be at least 1".into());
        }
        Generator::new(self.gen_config(size)).map(|_| ())
    }
}

/// `--auto`: buffer size, count, queue depth and fill threads for this
/// CPU and the device holding `path` (or its directory), with the reasons.
///
/// Buffer size: the device's largest request (`max_sectors_kb`) times 4,
/// within 1..=8 MiB, so one write is a few full-size requests. Queue
/// depth: 4 writes in flight kept the device busy here (beyond it the
/// figures did not move, `.project/results.md`), at most `nr_requests /
/// requests per write`. Buffers: one per write in flight plus two per fill
/// thread, so filling never waits for a write. Fill threads: every CPU
/// (generation is ~6 GB/s per core, so one is often enough).
pub fn auto_options(path: &Path, base: &WriteOptions) -> (WriteOptions, Vec<String>) {
    let mut o = base.clone();
    let mut why = Vec::new();
    let probe = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file = File::open(path).or_else(|_| File::open(probe)).ok();
    let attr = |name: &str| -> Option<u64> {
        pagewriter::backend::queue_attr(file.as_ref()?, name)?
            .parse()
            .ok()
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max_req = attr("max_sectors_kb").map(|kb| kb * 1024);
    o.buffer_size = match max_req {
        Some(r) => ((r * 4) as usize)
            .clamp(1 << 20, 8 << 20)
            .next_power_of_two()
            .min(8 << 20),
        None => 4 << 20,
    };
    why.push(match max_req {
        Some(r) => format!(
            "buffer_size {} B: 4 x the device's largest request ({} B), within 1-8 MiB",
            o.buffer_size, r
        ),
        None => format!(
            "buffer_size {} B: no block queue found in sysfs",
            o.buffer_size
        ),
    });
    let per_write = max_req.map_or(1, |r| (o.buffer_size as u64).div_ceil(r).max(1));
    let nr = attr("nr_requests");
    o.queue_depth = nr.map_or(4, |n| (n / per_write).clamp(1, 4)) as u32;
    why.push(format!(
        "queue_depth {}: 4 writes in flight, within the device queue ({} requests)",
        o.queue_depth,
        nr.map_or("unknown".into(), |n| n.to_string())
    ));
    o.gen_threads = cpus;
    o.buffer_count = o.queue_depth as usize + 2 * cpus;
    why.push(format!(
        "gen_threads {cpus} (one per CPU), buffer_count {} (queue depth + 2 per fill thread)",
        o.buffer_count
    ));
    (o, why)
}
