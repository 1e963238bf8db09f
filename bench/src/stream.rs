//! Streaming writes of generated files: [`write_file`] writes `size` bytes
//! of [`datagen`](crate::datagen) data to a file, sequentially, at the
//! storage's speed, in constant memory (files larger than RAM are fine).
//!
//! Generation and I/O overlap. A fixed pool of `buffer_count` aligned
//! buffers of `buffer_size` bytes circulates:
//!
//! ```text
//!  free buffers ──► fill threads (Generator::fill_at) ──► filled ──► I/O ──┐
//!       ▲                                                                 │
//!       └──────────────────── after its write completes ◄────────────────┘
//! ```
//!
//! Chunk `k` is bytes `k * buffer_size ..` of the file; a fill thread takes
//! the next chunk number when it takes a free buffer, so every buffer is
//! written at its own global offset and the bytes do not depend on the
//! thread count. A buffer is refilled only after its write completed.
//!
//! The I/O is io_uring (the calling thread keeps up to `queue_depth` writes
//! in flight, buffers registered for `IORING_OP_WRITE_FIXED` and the file
//! registered) or, as the fallback, `pwrite` from `writer_threads`
//! threads. The data goes to `PATH.partial` ([`partial_path`]), which is
//! `fallocate`d to its size, written, `fdatasync`ed and renamed over `PATH`
//! before `write_file` returns; with `O_DIRECT` the unaligned tail of the
//! last buffer is written padded with zeros and the file then cut to
//! `size`. A failed run removes its partial file; a killed one leaves it,
//! recognisable by its name.

use std::fs::File;
use std::ops::DerefMut;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel as chan;

use crate::datagen::{GenConfig, Generator};
use pagewriter::DirectIo;
use pagewriter::backend::open_with_direct;
use pagewriter::backend::{DioAlign, FileBackend, StorageBackend};
use pagewriter::buffer::{AlignedBuf, DEFAULT_ALIGN, HugePages};
use pagewriter::error::{Error, Result};

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
    /// Errors: [`Error::InvalidConfig`] naming the setting.
    pub fn validate(&self, size: u64) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
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

/// Progress of a [`write_file`] call, passed to its callback.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Bytes whose writes have completed.
    pub bytes_done: u64,
    /// Bytes from the start of the file whose writes have all completed.
    pub contiguous_bytes: u64,
    /// Bytes in the file.
    pub total: u64,
    /// Since the call started.
    pub elapsed: Duration,
    /// Bytes per second over the last interval (about 200 ms).
    pub bytes_per_sec: f64,
}

/// What a [`write_file`] call did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct WriteStats {
    /// Bytes asked for.
    pub size: u64,
    /// Bytes whose writes completed (padding excluded).
    pub bytes: u64,
    /// Every byte below this offset was written: how far the file is
    /// known good after an error.
    pub contiguous_bytes: u64,
    /// Wall time from open to the end of the final `fdatasync`, seconds.
    pub duration_s: f64,
    /// `bytes / duration_s / 1e9`.
    pub gb_per_s: f64,
    /// One line: engine, queue depth, buffers, `O_DIRECT` verdict.
    pub io_mode: String,
    /// `"io_uring"` or `"pwrite"`.
    pub engine: String,
    /// Why the engine, fixed buffers or `O_DIRECT` are not as asked.
    pub fallbacks: Vec<String>,
    /// `O_DIRECT` alignment if the file was written with `O_DIRECT`.
    pub direct: Option<DioAlign>,
    /// io_uring wrote from registered buffers (`WRITE_FIXED`).
    pub fixed_buffers: bool,
    /// Huge-page backing of the buffers, if asked for.
    pub hugepages: Option<HugePages>,
    /// Bytes per buffer.
    pub buffer_size: usize,
    /// Buffers in the pool.
    pub buffer_count: usize,
    /// Most writes in flight.
    pub queue_depth: u32,
    /// Threads generating data.
    pub gen_threads: usize,
    /// Write calls or SQEs (short writes resubmitted count again).
    pub writes: u64,
    /// Time spent generating, summed over the fill threads, seconds.
    pub gen_s: f64,
    /// Time spent waiting for writes: the I/O thread blocked on CQEs
    /// (io_uring) or inside `pwrite` summed over writer threads, seconds.
    pub io_wait_s: f64,
    /// Time the I/O side waited for a filled buffer (generation was the
    /// bottleneck), seconds (summed over writer threads for `pwrite`).
    pub starved_s: f64,
    /// Truncating an existing file (freeing its blocks), seconds.
    pub truncate_s: f64,
    /// The `fallocate` before writing, seconds.
    pub preallocate_s: f64,
    /// The final `fdatasync`, seconds.
    pub fdatasync_s: f64,
}

/// [`write_file`] failed; `stats` says how far it got
/// ([`WriteStats::contiguous_bytes`]).
#[derive(Debug)]
pub struct WriteFileError {
    /// What failed.
    pub error: Error,
    /// The figures up to the failure.
    pub stats: Box<WriteStats>,
}

impl std::fmt::Display for WriteFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (after {} of {} bytes; the first {} bytes are written)",
            self.error, self.stats.bytes, self.stats.size, self.stats.contiguous_bytes
        )
    }
}

impl std::error::Error for WriteFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<Error> for WriteFileError {
    fn from(error: Error) -> Self {
        Self {
            error,
            stats: Box::default(),
        }
    }
}

/// Writes `size` bytes of generated data to `path` (created, or replaced
/// once complete) and `fdatasync`s it; see the [module docs](self) and
/// [`write_file_with_progress`].
///
/// Errors ([`WriteFileError`], with the stats so far): bad options
/// ([`Error::InvalidConfig`], checked before the file is touched; with
/// `DirectIo::On` also a `buffer_size` that is not a multiple of the
/// file's `O_DIRECT` alignment, checked before it is truncated); open,
/// `fallocate` (`ENOSPC` when the file does not fit), a write or the
/// `fdatasync` failing ([`Error::Io`] with the offset).
pub fn write_file(
    path: impl AsRef<Path>,
    size: u64,
    opts: &WriteOptions,
) -> std::result::Result<WriteStats, WriteFileError> {
    write_file_with_progress(path, size, opts, &mut |_| {})
}

/// Where [`write_file`] writes before the file is complete: `PATH.partial`,
/// renamed over `PATH` once every byte is written and synced. A file of
/// that name left behind is an interrupted run (`kill -9`); the next run
/// to the same path replaces it.
pub fn partial_path(path: &Path) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".partial");
    s.into()
}

/// [`write_file`] calling `progress` about every 200 ms and once at the end,
/// from the calling thread.
///
/// The data goes to [`partial_path`] first and replaces `path` (atomically,
/// `rename`, then the directory is synced) only when complete: until then
/// an existing `path` is untouched, and a failed run removes its partial
/// file (the error's stats say how far it got).
pub fn write_file_with_progress(
    path: impl AsRef<Path>,
    size: u64,
    opts: &WriteOptions,
    progress: &mut dyn FnMut(Progress),
) -> std::result::Result<WriteStats, WriteFileError> {
    let path = path.as_ref();
    opts.validate(size)?;
    if let Ok(m) = std::fs::symlink_metadata(path)
        && !m.is_file()
    {
        return Err(Error::InvalidConfig(format!(
            "{} exists and is not a regular file: refused",
            path.display()
        ))
        .into());
    }
    let partial = partial_path(path);
    match write_partial(&partial, size, opts, progress) {
        Ok(stats) => {
            let done = std::fs::rename(&partial, path)
                .and_then(|()| sync_dir(path))
                .map_err(|e| Error::io("rename into place", None, e));
            match done {
                Ok(()) => Ok(stats),
                Err(error) => Err(WriteFileError {
                    error,
                    stats: Box::new(stats),
                }),
            }
        }
        Err(e) => {
            // Nothing half-written stays behind to fill the file system.
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// `fsync` of the directory holding `path`, so a rename into it is durable.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// The whole run, on the partial file.
fn write_partial(
    path: &Path,
    size: u64,
    opts: &WriteOptions,
    progress: &mut dyn FnMut(Progress),
) -> std::result::Result<WriteStats, WriteFileError> {
    let generator = Generator::new(opts.gen_config(size))?;
    let start = Instant::now();
    let mut stats = WriteStats {
        size,
        buffer_size: opts.buffer_size,
        buffer_count: opts.buffer_count,
        queue_depth: opts.queue_depth.min(opts.buffer_count as u32),
        gen_threads: opts.gen_threads,
        ..WriteStats::default()
    };
    let (backend, direct_why) = open(path, opts)?;
    stats.direct = backend.direct();
    stats.fallbacks.extend(direct_why);
    let io_align = stats.direct.map_or(1, |a| a.offset as u64);
    let fail = |error: Error, stats: &WriteStats| WriteFileError {
        error,
        stats: Box::new(stats.clone()),
    };
    if let Some(max) = backend.max_file_size()
        && size > max
    {
        let e = Error::FileTooLarge {
            offset: 0,
            len: size,
            max,
        };
        return Err(fail(e, &stats));
    }
    let padded = size
        .div_ceil(io_align)
        .checked_mul(io_align)
        .ok_or_else(|| {
            fail(
                Error::FileTooLarge {
                    offset: 0,
                    len: size,
                    max: u64::MAX - io_align + 1,
                },
                &stats,
            )
        })?;

    // Nothing is truncated before the file system is known to hold the
    // result: a size past its largest file, or past its free space (plus
    // what the old file frees), fails with the file as it was.
    // The old file stays until the rename: only a stale partial file of
    // ours gives its blocks back.
    crate::room::check(path, padded, crate::room::held(path), opts.force)
        .map_err(|e| fail(e, &stats))?;
    let t = Instant::now();
    backend
        .set_len(0)
        .map_err(|e| fail(Error::io("truncate", Some(0), e), &stats))?;
    stats.truncate_s = t.elapsed().as_secs_f64();
    if opts.preallocate {
        let t = Instant::now();
        match backend.allocate(0, padded) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                stats.fallbacks.push("fallocate not supported".into())
            }
            Err(e) => return Err(fail(Error::io("fallocate", Some(0), e), &stats)),
        }
        stats.preallocate_s = t.elapsed().as_secs_f64();
    }

    let mem_align = stats
        .direct
        .map_or(DEFAULT_ALIGN, |a| (a.memory as usize).max(DEFAULT_ALIGN));
    let bufs = alloc_buffers(opts, mem_align, &mut stats).map_err(|e| fail(e, &stats))?;
    let plan = Plan {
        generator: &generator,
        size,
        chunk: opts.buffer_size as u64,
        io_align,
    };

    let outcome = run_io(&backend, &plan, opts, bufs, &mut stats, start, progress);
    stats.duration_s = start.elapsed().as_secs_f64();
    if let Err(error) = outcome {
        return Err(fail(error, &stats));
    }
    if padded != size {
        backend
            .set_len(size)
            .map_err(|e| fail(Error::io("truncate to size", Some(size), e), &stats))?;
    }
    let t = Instant::now();
    backend
        .sync_data()
        .map_err(|e| fail(Error::io("fdatasync", None, e), &stats))?;
    stats.fdatasync_s = t.elapsed().as_secs_f64();
    stats.duration_s = start.elapsed().as_secs_f64();
    stats.gb_per_s = stats.bytes as f64 / stats.duration_s.max(1e-9) / 1e9;
    stats.io_mode = io_mode_line(&stats);
    progress(Progress {
        bytes_done: stats.bytes,
        contiguous_bytes: stats.contiguous_bytes,
        total: size,
        elapsed: start.elapsed(),
        bytes_per_sec: stats.bytes as f64 / stats.duration_s.max(1e-9),
    });
    Ok(stats)
}

/// What to write: chunk `k` is `chunk` bytes at `k * chunk`, the last one
/// shorter; I/O lengths are rounded up to `io_align`.
struct Plan<'a> {
    generator: &'a Generator,
    size: u64,
    chunk: u64,
    io_align: u64,
}

impl Plan<'_> {
    fn chunks(&self) -> u64 {
        self.size.div_ceil(self.chunk)
    }

    /// (offset, data bytes, I/O bytes) of chunk `k`.
    fn extent(&self, k: u64) -> (u64, usize, usize) {
        let offset = k * self.chunk;
        let len = self.chunk.min(self.size - offset);
        let io_len = len.div_ceil(self.io_align) * self.io_align;
        (offset, len as usize, io_len as usize)
    }

    /// Fills `buf` with chunk `k` and zero padding; returns its I/O length.
    fn fill(&self, k: u64, buf: &mut [u8]) -> usize {
        let (offset, len, io_len) = self.extent(k);
        self.generator
            .fill_at(offset, &mut buf[..len])
            .expect("chunks lie inside the generator's size");
        buf[len..io_len].fill(0);
        io_len
    }
}

/// Opens `path` for writing with `O_DIRECT` as `opts.direct` asks,
/// without truncating it yet (argument errors must leave it untouched).
fn open(path: &Path, opts: &WriteOptions) -> Result<(FileBackend, Option<String>)> {
    open_with_direct(path, opts.direct, &|b: &FileBackend| {
        let a = b.direct()?;
        (!opts.buffer_size.is_multiple_of(a.offset as usize)).then(|| {
            format!(
                "buffer_size {} is not a multiple of the O_DIRECT alignment {}",
                opts.buffer_size, a.offset
            )
        })
    })
}

fn alloc_buffers(
    opts: &WriteOptions,
    align: usize,
    stats: &mut WriteStats,
) -> Result<Vec<AlignedBuf>> {
    if !opts.hugepages && align <= DEFAULT_ALIGN {
        // One mapping advised for transparent huge pages: physically
        // contiguous buffers need fewer device segments per write
        // (`.project/io-worker.md`: 1 MiB direct writes split in two on a
        // 254-segment virtio queue when their pages are scattered).
        return pagewriter::buffer::thp_slab(opts.buffer_size, opts.buffer_count)
            .map_err(|e| Error::io("mmap", None, e));
    }
    let mut bufs = Vec::with_capacity(opts.buffer_count);
    for _ in 0..opts.buffer_count {
        if opts.hugepages {
            let (buf, kind, why) = AlignedBuf::huge(opts.buffer_size)
                .map_err(|e| Error::io("allocate huge pages", None, e))?;
            if stats.hugepages.is_none()
                && let Some(why) = why
            {
                stats.fallbacks.push(format!(
                    "no reserved 2 MiB huge pages (MAP_HUGETLB: {why}); transparent huge pages"
                ));
            }
            stats.hugepages.get_or_insert(kind);
            bufs.push(buf);
        } else {
            bufs.push(
                AlignedBuf::zeroed(opts.buffer_size, align)
                    .ok_or_else(|| Error::InvalidConfig("buffer alignment".into()))?,
            );
        }
    }
    Ok(bufs)
}

fn io_mode_line(s: &WriteStats) -> String {
    let mut line = match s.engine.as_str() {
        "io_uring" => format!(
            "io_uring QD{}{}",
            s.queue_depth,
            if s.fixed_buffers {
                ", fixed buffers"
            } else {
                ""
            }
        ),
        other => other.to_string(),
    };
    line += &format!(", {} x {} B buffers", s.buffer_count, s.buffer_size);
    match s.hugepages {
        Some(HugePages::Reserved) => line += " on 2 MiB huge pages",
        Some(HugePages::Transparent) => line += " on transparent huge pages",
        None => {}
    }
    match s.direct {
        Some(a) => line += &format!(", O_DIRECT (align {})", a.offset),
        None => line += ", buffered",
    }
    for why in &s.fallbacks {
        line += &format!(" [{why}]");
    }
    line
}

/// A filled buffer on its way to the I/O side.
struct Filled<B> {
    slot: usize,
    buf: B,
    chunk: u64,
    io_len: usize,
}

/// Completion bookkeeping shared by both engines.
struct Tally {
    done: Vec<bool>,
    first_missing: u64,
    bytes: u64,
    last_report: Instant,
    last_bytes: u64,
}

impl Tally {
    fn new(chunks: u64) -> Self {
        Self {
            done: vec![false; chunks as usize],
            first_missing: 0,
            bytes: 0,
            last_report: Instant::now(),
            last_bytes: 0,
        }
    }

    fn complete(&mut self, plan: &Plan<'_>, chunk: u64) {
        self.done[chunk as usize] = true;
        self.bytes += plan.extent(chunk).1 as u64;
        while (self.first_missing as usize) < self.done.len()
            && self.done[self.first_missing as usize]
        {
            self.first_missing += 1;
        }
    }

    fn contiguous(&self, plan: &Plan<'_>) -> u64 {
        (self.first_missing * plan.chunk).min(plan.size)
    }

    fn finished(&self) -> bool {
        self.first_missing as usize == self.done.len()
    }

    /// Puts the totals in `stats`; the first error, or an error if not
    /// every chunk was written.
    fn finish(
        &self,
        plan: &Plan<'_>,
        stats: &mut WriteStats,
        gen_ns: &AtomicU64,
        first_error: Option<Error>,
    ) -> Result<()> {
        stats.gen_s = gen_ns.load(Ordering::Relaxed) as f64 / 1e9;
        stats.bytes = self.bytes;
        stats.contiguous_bytes = self.contiguous(plan);
        match first_error {
            Some(e) => Err(e),
            None if !self.finished() => Err(Error::InvalidConfig(
                "a fill thread stopped before the file was complete".into(),
            )),
            None => Ok(()),
        }
    }

    fn maybe_report(
        &mut self,
        plan: &Plan<'_>,
        start: Instant,
        progress: &mut dyn FnMut(Progress),
    ) {
        let dt = self.last_report.elapsed();
        if dt >= Duration::from_millis(200) {
            progress(Progress {
                bytes_done: self.bytes,
                contiguous_bytes: self.contiguous(plan),
                total: plan.size,
                elapsed: start.elapsed(),
                bytes_per_sec: (self.bytes - self.last_bytes) as f64 / dt.as_secs_f64(),
            });
            self.last_report = Instant::now();
            self.last_bytes = self.bytes;
        }
    }
}

/// What the fill threads share: the plan, the next chunk number, the stop
/// flag and their summed generation time.
struct Fillers<'a, 'p> {
    plan: &'a Plan<'p>,
    next: &'a AtomicU64,
    stop: &'a AtomicBool,
    gen_ns: &'a AtomicU64,
}

impl<'a> Fillers<'a, '_> {
    /// Starts `threads` fill threads in scope `s`; `filled` is moved in so
    /// that the channel closes when the last of them ends.
    fn spawn<'s, B: DerefMut<Target = [u8]> + Send + 's>(
        &self,
        s: &'s std::thread::Scope<'s, '_>,
        threads: usize,
        free: &chan::Receiver<(usize, B)>,
        filled: chan::Sender<Filled<B>>,
    ) where
        'a: 's,
    {
        for _ in 0..threads {
            let (free, filled) = (free.clone(), filled.clone());
            let (plan, next, stop, gen_ns) = (self.plan, self.next, self.stop, self.gen_ns);
            s.spawn(move || {
                let ns = fill_loop(plan, next, stop, &free, &filled);
                gen_ns.fetch_add(ns, Ordering::Relaxed);
            });
        }
    }
}

/// Fill threads: take a free buffer, claim the next chunk, fill, pass on.
/// Return the nanoseconds spent generating.
fn fill_loop<B: DerefMut<Target = [u8]>>(
    plan: &Plan<'_>,
    next: &AtomicU64,
    stop: &AtomicBool,
    free: &chan::Receiver<(usize, B)>,
    filled: &chan::Sender<Filled<B>>,
) -> u64 {
    let mut gen_ns = 0u64;
    while let Ok((slot, mut buf)) = free.recv() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let chunk = next.fetch_add(1, Ordering::Relaxed);
        if chunk >= plan.chunks() {
            break;
        }
        let t = Instant::now();
        let io_len = plan.fill(chunk, &mut buf);
        gen_ns += t.elapsed().as_nanos() as u64;
        let msg = Filled {
            slot,
            buf,
            chunk,
            io_len,
        };
        if filled.send(msg).is_err() {
            break;
        }
    }
    gen_ns
}

fn run_io(
    backend: &FileBackend,
    plan: &Plan<'_>,
    opts: &WriteOptions,
    bufs: Vec<AlignedBuf>,
    stats: &mut WriteStats,
    start: Instant,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    #[cfg(all(target_os = "linux", feature = "io-uring"))]
    if opts.engine != StreamEngine::Pwrite {
        match uring::ring(backend, opts, bufs, stats)? {
            Ok(ring) => {
                stats.engine = "io_uring".into();
                return uring::run(ring, plan, opts, stats, start, progress);
            }
            Err(bufs) => return run_pwrite(backend, plan, opts, bufs, stats, start, progress),
        }
    }
    if opts.engine == StreamEngine::IoUring {
        return Err(Error::InvalidConfig(
            "the io_uring engine is not built in (cargo feature io-uring, Linux)".into(),
        ));
    }
    if opts.engine == StreamEngine::Auto {
        stats.fallbacks.push("io_uring not built in; pwrite".into());
    }
    run_pwrite(backend, plan, opts, bufs, stats, start, progress)
}

/// A write that failed, as the crate's error.
fn write_error(offset: u64, e: std::io::Error) -> Error {
    Error::io("write", Some(offset), e)
}

fn run_pwrite(
    backend: &FileBackend,
    plan: &Plan<'_>,
    opts: &WriteOptions,
    bufs: Vec<AlignedBuf>,
    stats: &mut WriteStats,
    start: Instant,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    stats.engine = "pwrite".into();
    stats.queue_depth = opts.writer_threads.min(opts.buffer_count) as u32;
    let file: &File = backend.file();
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (free_tx, free_rx) = chan::unbounded::<(usize, AlignedBuf)>();
    let (filled_tx, filled_rx) = chan::bounded::<Filled<AlignedBuf>>(opts.buffer_count);
    // (chunk, offset, result, write ns, wait ns, slot, buf)
    type Done = (u64, std::io::Result<()>, u64, u64, usize, AlignedBuf);
    let (done_tx, done_rx) = chan::unbounded::<Done>();
    for (slot, buf) in bufs.into_iter().enumerate() {
        free_tx.send((slot, buf)).expect("receiver alive");
    }
    let mut tally = Tally::new(plan.chunks());
    let mut first_error: Option<Error> = None;
    let gen_ns = AtomicU64::new(0);
    std::thread::scope(|s| {
        let fillers = Fillers {
            plan,
            next: &next,
            stop: &stop,
            gen_ns: &gen_ns,
        };
        fillers.spawn(s, opts.gen_threads, &free_rx, filled_tx);
        for _ in 0..opts.writer_threads.min(opts.buffer_count) {
            let (filled_rx, done_tx) = (filled_rx.clone(), done_tx.clone());
            s.spawn(move || {
                use std::os::unix::fs::FileExt;
                loop {
                    let t = Instant::now();
                    let Ok(f) = filled_rx.recv() else { break };
                    let wait_ns = t.elapsed().as_nanos() as u64;
                    let t = Instant::now();
                    let (offset, _, _) = plan.extent(f.chunk);
                    let res = file.write_all_at(&f.buf[..f.io_len], offset);
                    let write_ns = t.elapsed().as_nanos() as u64;
                    if done_tx
                        .send((f.chunk, res, write_ns, wait_ns, f.slot, f.buf))
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
        drop(done_tx);
        drop(filled_rx);
        let mut free_tx = Some(free_tx);
        loop {
            match done_rx.recv_timeout(Duration::from_millis(50)) {
                Ok((chunk, res, write_ns, wait_ns, slot, buf)) => {
                    stats.writes += 1;
                    stats.io_wait_s += write_ns as f64 / 1e9;
                    stats.starved_s += wait_ns as f64 / 1e9;
                    match res {
                        Ok(()) => {
                            tally.complete(plan, chunk);
                            if let Some(tx) = &free_tx {
                                let _ = tx.send((slot, buf));
                            }
                        }
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            first_error.get_or_insert(write_error(plan.extent(chunk).0, e));
                        }
                    }
                    if tally.finished() || first_error.is_some() {
                        // No more buffers to hand out: the fill threads run
                        // dry, then the writers, then `done_rx` disconnects.
                        free_tx = None;
                    }
                }
                Err(chan::RecvTimeoutError::Timeout) => {}
                Err(chan::RecvTimeoutError::Disconnected) => break,
            }
            tally.maybe_report(plan, start, progress);
        }
    });
    tally.finish(plan, stats, &gen_ns, first_error)
}

#[cfg(all(target_os = "linux", feature = "io-uring"))]
mod uring {
    use super::*;
    use pagewriter::backend::ring::{Completion, RingOp, RingOptions, SlotBuf, SlotRing};

    /// The ring for `opts`, or the buffers back for `pwrite` (engine
    /// `Auto` where io_uring is refused; the reason goes to `fallbacks`).
    pub(super) fn ring(
        backend: &FileBackend,
        opts: &WriteOptions,
        bufs: Vec<AlignedBuf>,
        stats: &mut WriteStats,
    ) -> Result<std::result::Result<SlotRing, Vec<AlignedBuf>>> {
        let file = backend.file();
        let mut ro = RingOptions::new(stats.queue_depth);
        ro.fixed_buffers = opts.fixed_buffers;
        // Setup errors drop the buffers; keep the lengths to remake them.
        let (len, align) = (bufs[0].len(), bufs[0].align());
        let remake = |n: usize| -> Vec<AlignedBuf> {
            (0..n)
                .map(|_| AlignedBuf::zeroed(len, align).expect("layout was valid"))
                .collect()
        };
        let n = bufs.len();
        let hugepages = opts.hugepages;
        match SlotRing::new(file, ro, bufs) {
            Ok(ring) => {
                stats.fixed_buffers = ro.fixed_buffers;
                Ok(Ok(ring))
            }
            Err(e) if e.stage == "register buffers" => {
                stats
                    .fallbacks
                    .push(format!("buffers not registered ({})", e.source));
                ro.fixed_buffers = false;
                let bufs = if hugepages {
                    alloc_buffers(opts, align, stats)?
                } else {
                    remake(n)
                };
                match SlotRing::new(file, ro, bufs) {
                    Ok(ring) => Ok(Ok(ring)),
                    Err(e) => Err(Error::io("io_uring setup", None, e.source)),
                }
            }
            Err(e) if opts.engine == StreamEngine::Auto => {
                stats
                    .fallbacks
                    .push(format!("io_uring refused ({e}); pwrite"));
                Ok(Err(remake(n)))
            }
            Err(e) => Err(Error::io("io_uring setup", None, e.source)),
        }
    }

    /// The calling thread drives the ring: submit filled buffers, reap
    /// CQEs, resubmit short writes, hand completed buffers back.
    pub(super) fn run(
        mut ring: SlotRing,
        plan: &Plan<'_>,
        opts: &WriteOptions,
        stats: &mut WriteStats,
        start: Instant,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        let next = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let gen_ns = AtomicU64::new(0);
        let (free_tx, free_rx) = chan::unbounded::<(usize, SlotBuf)>();
        let (filled_tx, filled_rx) = chan::unbounded::<Filled<SlotBuf>>();
        for slot in 0..ring.slots() {
            let buf = ring
                .take(slot)
                .expect("fresh ring: every slot holds its buffer");
            free_tx.send((slot, buf)).expect("receiver alive");
        }
        // Per slot: the chunk it carries.
        let mut active: Vec<u64> = vec![0; ring.slots()];
        let mut tally = Tally::new(plan.chunks());
        let mut first_error: Option<Error> = None;
        let qd = ring.options().queue_depth;
        let mut cqes: Vec<Completion> = Vec::with_capacity(qd as usize);
        std::thread::scope(|s| {
            let fillers = Fillers {
                plan,
                next: &next,
                stop: &stop,
                gen_ns: &gen_ns,
            };
            fillers.spawn(s, opts.gen_threads, &free_rx, filled_tx);
            drop(free_rx);
            let mut free_tx = Some(free_tx);
            loop {
                // Submit every filled buffer there is room for; block for
                // one only when the ring is idle.
                while first_error.is_none() && ring.in_flight() < qd {
                    let f = if ring.in_flight() == 0 {
                        let t = Instant::now();
                        let r = filled_rx.recv_timeout(Duration::from_millis(50));
                        stats.starved_s += t.elapsed().as_secs_f64();
                        match r {
                            Ok(f) => f,
                            Err(_) => break,
                        }
                    } else {
                        match filled_rx.try_recv() {
                            Ok(f) => f,
                            Err(_) => break,
                        }
                    };
                    let offset = plan.extent(f.chunk).0;
                    let _ = ring.put(f.buf);
                    active[f.slot] = f.chunk;
                    if let Err(e) = ring.push(f.slot, RingOp::Write, offset, 0, f.io_len) {
                        first_error = Some(write_error(offset, e));
                        break;
                    }
                    stats.writes += 1;
                }
                if ring.in_flight() == 0 {
                    if tally.finished() || first_error.is_some() {
                        break;
                    }
                    tally.maybe_report(plan, start, progress);
                    continue;
                }
                let t = Instant::now();
                cqes.clear();
                if let Err(e) = ring.wait(1, &mut cqes) {
                    first_error.get_or_insert(Error::io("io_uring_enter", None, e));
                    // Keep reaping: the ring's Drop waits for what is left.
                    break;
                }
                stats.io_wait_s += t.elapsed().as_secs_f64();
                for c in cqes.drain(..) {
                    // The ring continued short and interrupted writes: a
                    // completion is the whole chunk, or its error.
                    match c.result {
                        Ok(_) => {
                            tally.complete(plan, active[c.slot]);
                            if let (Some(tx), Some(buf)) = (&free_tx, ring.take(c.slot)) {
                                let _ = tx.send((c.slot, buf));
                            }
                        }
                        Err(e) => {
                            first_error.get_or_insert(write_error(c.offset, e));
                        }
                    }
                }
                if first_error.is_some() {
                    stop.store(true, Ordering::Relaxed);
                    free_tx = None;
                }
                if tally.finished() {
                    free_tx = None;
                }
                tally.maybe_report(plan, start, progress);
            }
            // Let the fill threads end: no more free buffers, and drain what
            // they already filled.
            drop(free_tx.take());
            stop.store(true, Ordering::Relaxed);
            while filled_rx.recv().is_ok() {}
        });
        // Whatever is still in flight (after an error) completes before the
        // ring's buffers are freed: SlotRing's Drop waits for it.
        let mut rest = Vec::new();
        while ring.in_flight() > 0 && ring.wait(1, &mut rest).is_ok() {}
        tally.finish(plan, stats, &gen_ns, first_error)
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
