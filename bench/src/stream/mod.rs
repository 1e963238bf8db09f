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
use crate::error::{CoreError, Error, Result};
use pagewriter::DirectIo;
use pagewriter::backend::open_with_direct;
use pagewriter::backend::{DioAlign, FileBackend, StorageBackend};
use pagewriter::buffer::{AlignedBuf, DEFAULT_ALIGN, HugePages};

mod options;
mod pipeline;
mod pwrite;
#[cfg(all(target_os = "linux", feature = "io-uring"))]
mod uring;

pub use options::*;
use pipeline::*;
use pwrite::run_pwrite;

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
    /// CPU seconds (user + system, whole process: fill threads and I/O)
    /// per 10^9 bytes over `duration_s`.
    pub cpu_s_per_gb: f64,
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
    /// The error; once writing began, how far it got. A failed run removes
    /// its partial file and leaves the target as it was, so no byte of it
    /// is claimed written.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.stats.bytes == 0 {
            return write!(f, "{}", self.error);
        }
        write!(
            f,
            "{} (after {} of {} bytes; the partial file is removed, the target is as it was)",
            self.error, self.stats.bytes, self.stats.size
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
/// ([`CoreError::InvalidConfig`], checked before the file is touched; with
/// `DirectIo::On` also a `buffer_size` that is not a multiple of the
/// file's `O_DIRECT` alignment, checked before it is truncated); open,
/// `fallocate` (`ENOSPC` when the file does not fit), a write or the
/// `fdatasync` failing ([`CoreError::Io`] with the offset).
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
    write_file_cancellable(path, size, opts, progress, &AtomicBool::new(false))
}

/// [`write_file_with_progress`] that stops when `cancel` is set (checked
/// at least every 50 ms and after every progress report, so `progress`
/// may set it): the writes in flight complete, the partial file is
/// removed, and the error is [`Error::Cancelled`].
pub fn write_file_cancellable(
    path: impl AsRef<Path>,
    size: u64,
    opts: &WriteOptions,
    progress: &mut dyn FnMut(Progress),
    cancel: &AtomicBool,
) -> std::result::Result<WriteStats, WriteFileError> {
    opts.validate(size)?;
    let path = &resolve_target(path.as_ref())?;
    let partial = partial_path(path);
    match write_partial(&partial, size, opts, progress, cancel) {
        Ok(stats) => {
            match std::fs::rename(&partial, path) {
                Ok(()) => {}
                Err(e) => {
                    // Complete, but not where it was asked for: nothing of
                    // it is kept (the target is as it was).
                    let _ = std::fs::remove_file(&partial);
                    return Err(WriteFileError {
                        error: Error::io("rename into place", None, e),
                        stats: Box::new(stats),
                    });
                }
            }
            match sync_dir(path) {
                Ok(()) => Ok(stats),
                Err(e) => Err(WriteFileError {
                    error: Error::io("fsync of the directory after the rename", None, e),
                    stats: Box::new(stats),
                }),
            }
        }
        Err(mut e) => {
            // Nothing half-written stays behind to fill the file system.
            let _ = std::fs::remove_file(&partial);
            // The caller named `path`, not the partial file beside it: an
            // open that failed (a missing directory, no permission) names
            // what was asked for.
            if let Error::Core(CoreError::Open { path: p, .. }) = &mut e.error
                && *p == partial
            {
                p.clone_from(path);
            }
            Err(e)
        }
    }
}

/// The file to write for `path`, checked before anything is touched: a
/// regular file the caller may write (a read-only one is refused, not
/// replaced: the rename would need no write access to it), a symlink to
/// one (its target is written, the link stays), or a name not taken yet.
///
/// Errors: [`CoreError::InvalidConfig`] for a directory, device, FIFO, socket,
/// dangling link or a file the caller may not write; [`CoreError::Io`] for a
/// `stat` that fails otherwise.
pub fn resolve_target(path: &Path) -> Result<std::path::PathBuf> {
    let refuse = |why: String| Err(Error::config(format!("{}: {why}: refused", path.display())));
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(path.to_path_buf()),
        Err(e) => return Err(Error::io("stat", None, e)),
        Ok(m) if m.is_dir() => return refuse("a directory".into()),
        Ok(_) => {}
    }
    let resolved = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) => return refuse(format!("a link to nothing ({e})")),
    };
    match std::fs::metadata(&resolved) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return refuse("not a regular file (a directory, device, FIFO or socket)".into()),
        Err(e) => return Err(Error::io("stat", None, e)),
    }
    // Writable by this process (permissions, a read-only mount): opened
    // for writing, not truncated, closed at once.
    if let Err(e) = std::fs::OpenOptions::new().write(true).open(&resolved) {
        return refuse(format!("not writable ({e}); the file is unchanged"));
    }
    Ok(resolved)
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
    cancel: &AtomicBool,
) -> std::result::Result<WriteStats, WriteFileError> {
    let generator = Generator::new(opts.gen_config(size))?;
    let start = Instant::now();
    let cpu = crate::cpu::process_time();
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
        let e = Error::Core(CoreError::FileTooLarge {
            offset: 0,
            len: size,
            max,
        });
        return Err(fail(e, &stats));
    }
    let padded = size
        .div_ceil(io_align)
        .checked_mul(io_align)
        .ok_or_else(|| {
            fail(
                Error::Core(CoreError::FileTooLarge {
                    offset: 0,
                    len: size,
                    max: u64::MAX - io_align + 1,
                }),
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
        cancel,
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
    stats.cpu_s_per_gb = crate::cpu::seconds_since(cpu) / (stats.bytes.max(1) as f64 / 1e9);
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

/// Opens `path` for writing with `O_DIRECT` as `opts.direct` asks,
/// without truncating it yet (argument errors must leave it untouched).
fn open(path: &Path, opts: &WriteOptions) -> Result<(FileBackend, Option<String>)> {
    let opened = open_with_direct(path, opts.direct, &|b: &FileBackend| {
        let a = b.direct()?;
        (!opts.buffer_size.is_multiple_of(a.offset as usize)).then(|| {
            format!(
                "buffer_size {} is not a multiple of the O_DIRECT alignment {}",
                opts.buffer_size, a.offset
            )
        })
    })?;
    Ok(opened)
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
                    .ok_or_else(|| Error::config("buffer alignment".into()))?,
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
        return Err(Error::config(
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
