//! Opening a cached file: its backend and `O_DIRECT` fit, the torn-page
//! protection and the doublewrite recovery, grow-ahead's recovery and
//! window, the flush engine, its ring and the write slots, all decided
//! once at open from a validated [`Config`] ([`prepare`]). Builds what the
//! components are made of; holds no state.

use std::sync::Arc;

use super::config::Config;
use super::doublewrite::{self, Area, Recovery};
use super::gather::GatherBuf;
use super::grow::{self, Filler, GrowAhead, Window};
use super::io_mode::IoMode;
use super::lifecycle::{Access, LockHeld};
use super::slots::WriteSlot;
use super::torn::TornWrites;
use super::writer::RunWriter;
use super::writer_pool::WriterPool;
use crate::backend::{
    DirectIo, FileBackend, FlushEngine, OpenOptions, StorageBackend, open_with_options,
};
use crate::error::{Error, Result, short_error};

/// How the file under a cached file was opened.
#[derive(Debug, Clone, Default)]
pub(crate) struct Opening {
    pub(crate) access: Access,
    pub(crate) lock: LockHeld,
    /// Why [`DirectIo::Auto`] fell back to buffered I/O, if it did.
    pub(crate) direct_fallback: Option<String>,
}

/// What a cached file's components are built from, decided at open
/// ([`prepare`]).
pub(crate) struct Prepared {
    pub(crate) backend: Arc<dyn StorageBackend>,
    pub(crate) io_mode: IoMode,
    /// The logical length at open (bytes), after both recoveries.
    pub(crate) len: u64,
    /// The largest length a write may reach (bytes).
    pub(crate) max_len: u64,
    /// With [`TornWrites::Atomic`]: the largest atomic piece (bytes).
    pub(crate) atomic_max: Option<usize>,
    pub(crate) area: Option<Area>,
    pub(crate) recovery: Recovery,
    /// The longest run a flush writes (bytes).
    pub(crate) run_bytes: usize,
    pub(crate) slots: Vec<WriteSlot>,
    /// Sync lanes in use.
    pub(crate) lanes: usize,
    pub(crate) grow: Option<(Window, Filler)>,
}

/// Decides everything a cached file over `backend` is built from, in this
/// order: the `O_DIRECT` fit and the torn-page protection are checked
/// (before anything is written, and before a ring is set up: a ring
/// dropped on a refusal would keep the file, and its lock, until the
/// kernel's deferred teardown); then a grow-ahead window a crash left is
/// cut off, the doublewrite area recovers, and only then are the ring,
/// the write slots and grow-ahead's filler set up. `config` is validated
/// by the caller.
///
/// Errors: as [`PagedCachedFile::new`](crate::PagedCachedFile::new).
pub(crate) fn prepare(
    backend: impl StorageBackend + 'static,
    area: Option<Arc<dyn StorageBackend>>,
    config: &Config,
    opening: Opening,
) -> Result<Prepared> {
    let read_only = opening.access == Access::ReadOnly;
    let (window_bytes, max_len) = grow_ahead_limits(&backend, config, read_only)?;
    check_direct(&backend, config)?;
    let (torn_writes, torn_writes_why) = resolve_torn(&backend, config, area.is_some())?;
    // Every setting is checked: a window a crash left (or a drop without
    // close) is cut off now, whatever this open's configuration.
    let grown = grow::recover(&backend, read_only, config.page_align)
        .map_err(|e| Error::io("grow-ahead recovery", None, e))?;
    let len = match grown {
        Some(found) => found.len,
        None => backend.len().map_err(|e| Error::io("fstat", None, e))?,
    };
    // Recovery before the ring too: a failed one (a full disk) must not
    // leave a ring holding the file.
    let (area, recovery) = recover_area(&backend, area, torn_writes, config, read_only)?;
    let run_bytes = max_run_bytes(config);
    let (engine, engine_fallback, writer) =
        resolve_writer(&backend, config, run_bytes, config.rounds_in_flight)?;
    let io_mode = IoMode {
        engine,
        engine_fallback,
        direct: backend.dio_align(),
        direct_fallback: opening.direct_fallback,
        torn_writes,
        torn_writes_why,
        grow_ahead: window_bytes,
    };
    let backend: Arc<dyn StorageBackend> = Arc::new(backend);
    let atomic_max = (torn_writes == TornWrites::Atomic).then(|| {
        let unit = backend
            .atomic_write_unit()
            .expect("checked by resolve_torn");
        (unit.max as usize).min(run_bytes)
    });
    // Recovery may have grown the file (a page staged past the end, or
    // the length a record carries).
    let len = if recovery.repaired.is_empty() && !recovery.resized {
        len
    } else {
        backend.len().map_err(|e| Error::io("fstat", None, e))?
    };
    let grow = match window_bytes {
        Some(bytes) => Some(start_grow_ahead(&backend, bytes, config, len)?),
        None => None,
    };
    let slots = write_slots(&backend, config, writer, engine, atomic_max)?;
    let lanes = config.sync_lanes.min(backend.sync_lanes());
    Ok(Prepared {
        backend,
        io_mode,
        len,
        max_len,
        atomic_max,
        area,
        recovery,
        run_bytes,
        slots,
        lanes,
        grow,
    })
}

/// Grow-ahead's window in bytes (none on a read-only file or without
/// [`GrowAhead::Window`]) and the largest length a write may reach: the
/// file system's largest file, less the trailer with a window.
///
/// Errors: [`Error::InvalidConfig`] for a window past that largest file.
fn grow_ahead_limits(
    backend: &dyn StorageBackend,
    config: &Config,
    read_only: bool,
) -> Result<(Option<u64>, u64)> {
    let fs_max = backend.max_file_size().unwrap_or(u64::MAX);
    let window_bytes = match config.grow_ahead {
        GrowAhead::Window { bytes } if !read_only => bytes,
        _ => return Ok((None, fs_max)),
    };
    let max = Window::max_len(fs_max, grow::slot_bytes(backend), config.page_size as u64);
    if window_bytes > max {
        return Err(Error::InvalidConfig(format!(
            "grow_ahead window {window_bytes} is larger than the file system's largest file ({fs_max} bytes)"
        )));
    }
    Ok((Some(window_bytes), max))
}

/// Grow-ahead's trailer state and its filler thread, for a window of
/// `bytes` over a file of `len` bytes.
///
/// Errors: [`Error::NoMemory`] for the trailer's slots; `Error::Io` with
/// op "grow-ahead: start the filler thread".
fn start_grow_ahead(
    backend: &Arc<dyn StorageBackend>,
    bytes: u64,
    config: &Config,
    len: u64,
) -> Result<(Window, Filler)> {
    let slot = grow::slot_bytes(&**backend);
    let fs_max = backend.max_file_size().unwrap_or(u64::MAX);
    let page = config.page_size as u64;
    let window = Window::new(bytes, slot, page, config.page_align, fs_max)
        .ok_or(Error::NoMemory { bytes: 2 * slot })?;
    let filler = Filler::start(Arc::clone(backend), bytes, len)
        .map_err(|e| Error::io("grow-ahead: start the filler thread", None, e))?;
    Ok((window, filler))
}

/// Opens `path` for a [`PagedCachedFile`](crate::PagedCachedFile) with
/// `O_DIRECT` as `config.direct` asks, write caps and sync lanes set.
pub(crate) fn open_file(
    path: &std::path::Path,
    options: &OpenOptions,
    config: &Config,
) -> Result<(FileBackend, Option<String>)> {
    let (backend, why) =
        open_with_options(path, options, config.direct, &|b| direct_misfit(b, config))?;
    // A read-only open writes nothing and needs no `fdatasync` lanes: the
    // extra descriptions would be write opens, refused on a file or mount
    // the process may only read.
    let lanes = if options.is_read_only() {
        1
    } else {
        config.sync_lanes
    };
    let backend = backend
        .with_max_write_bytes(config.max_write_bytes)
        .with_sync_lanes(lanes)
        .map_err(|e| Error::open("reopen for sync lanes", path, e))?;
    Ok((backend, why))
}

/// Whether `backend` takes atomic writes of one page of `config`, and if
/// not, why.
fn atomic_fit(backend: &dyn StorageBackend, config: &Config) -> std::result::Result<(), String> {
    let Some(unit) = backend.atomic_write_unit() else {
        let platform = crate::backend::PLATFORM;
        return Err(if !platform.atomic_writes {
            format!(
                "untearable writes (RWF_ATOMIC) are a Linux interface; this is {}",
                platform.os
            )
        } else if backend.dio_align().is_none() {
            "atomic writes need O_DIRECT (DirectIo::On), and the file is buffered".into()
        } else {
            "statx reports no atomic write unit for this file (file system or device without RWF_ATOMIC)".into()
        });
    };
    let ps = config.page_size;
    if !unit.fits(0, ps) {
        return Err(format!(
            "the page size {ps} is outside the atomic write unit {}..={} B",
            unit.min, unit.max
        ));
    }
    Ok(())
}

/// Whether `Auto` picks atomic writes: the file takes them for a page and
/// the device does them itself (its atomic unit holds a page). Atomic
/// writes a file system emulates (XFS writing out of place and remapping)
/// cost more than the doublewrite area's copy.
// Measured in .project/torn-writes.md.
fn auto_atomic(backend: &dyn StorageBackend, config: &Config) -> std::result::Result<(), String> {
    atomic_fit(backend, config)?;
    let unit = backend.atomic_write_unit().expect("checked by atomic_fit");
    if (unit.device_max as usize) < config.page_size {
        return Err(format!(
            "the file takes atomic writes but the device has no atomic unit of a page \
             (device max {} B): the file system would emulate them, slower than the doublewrite area",
            unit.device_max
        ));
    }
    Ok(())
}

/// The torn-page protection in force for `config.torn_writes` on
/// `backend`, and why where `Auto` chose (never `Auto`).
///
/// Errors: [`Error::TornWrites`] for `Atomic` where the file takes no
/// atomic write of a page, for `DoubleWrite` (or `Auto` there) without an
/// area.
pub(crate) fn resolve_torn(
    backend: &dyn StorageBackend,
    config: &Config,
    has_area: bool,
) -> Result<(TornWrites, Option<String>)> {
    let mode = config.torn_writes;
    let refuse = |why: String| Error::TornWrites {
        mode: mode.name(),
        why,
    };
    let no_area = || {
        refuse(
            "no doublewrite area: open the file by path, or give one with PagedCachedFile::with_doublewrite"
                .into(),
        )
    };
    match mode {
        TornWrites::Allow => Ok((TornWrites::Allow, None)),
        TornWrites::Atomic => atomic_fit(backend, config)
            .map(|()| (TornWrites::Atomic, None))
            .map_err(refuse),
        TornWrites::DoubleWrite if has_area => Ok((TornWrites::DoubleWrite, None)),
        TornWrites::DoubleWrite => Err(no_area()),
        TornWrites::Auto => match auto_atomic(backend, config) {
            Ok(()) => Ok((TornWrites::Atomic, None)),
            Err(why) if has_area => Ok((TornWrites::DoubleWrite, Some(why))),
            Err(_) => Err(no_area()),
        },
    }
}

/// The doublewrite area's path for a file at `path`: `<path>.dblwr`.
pub(crate) fn area_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".dblwr");
    p.into()
}

/// Opens the doublewrite area beside `path` if `config.torn_writes` may
/// need one (`DoubleWrite`, or `Auto` where `backend` has no atomic
/// writes): buffered, created if missing, not locked (the data file's lock
/// covers it). A read-only open reads an existing area and writes none
/// (a missing one is an empty area).
///
/// Errors: `Error::Io` with op "open doublewrite area".
pub(crate) fn open_area(
    path: &std::path::Path,
    backend: &dyn StorageBackend,
    options: &OpenOptions,
    config: &Config,
) -> Result<Option<Arc<dyn StorageBackend>>> {
    let needed = match config.torn_writes {
        TornWrites::DoubleWrite => true,
        TornWrites::Auto => auto_atomic(backend, config).is_err(),
        _ => false,
    };
    if !needed {
        return Ok(None);
    }
    let area_path = area_path(path);
    let read_only = options.is_read_only();
    let opts = OpenOptions::new()
        .lock(false)
        .read_only(read_only)
        .create(!read_only);
    match FileBackend::open_with(&area_path, &opts, false) {
        Ok(b) => Ok(Some(Arc::new(b))),
        Err(e) if read_only && e.kind() == std::io::ErrorKind::NotFound => {
            Ok(Some(Arc::new(crate::backend::MemoryBackend::new())))
        }
        Err(e) => Err(Error::open("open doublewrite area", &area_path, e)),
    }
}

/// Why `O_DIRECT` cannot serve this configuration on this backend, if so:
/// pages must be whole multiples of the offset alignment, page memory
/// aligned for the memory alignment, and the file a whole number of pages.
pub(crate) fn direct_misfit(backend: &dyn StorageBackend, config: &Config) -> Option<String> {
    let a = backend.dio_align()?;
    if !config.page_size.is_multiple_of(a.offset as usize) {
        return Some(format!(
            "page size {} is not a multiple of the O_DIRECT alignment {}",
            config.page_size, a.offset
        ));
    }
    if !config.page_align.is_multiple_of(a.memory as usize) {
        return Some(format!(
            "page_align {} is not a multiple of the O_DIRECT memory alignment {}",
            config.page_align, a.memory
        ));
    }
    match backend.len() {
        Ok(len) if len % config.page_size as u64 != 0 => Some(format!(
            "file length {len} is not a whole number of {} B pages",
            config.page_size
        )),
        _ => None,
    }
}

/// Refuses `DirectIo::On` over a buffered backend, and an `O_DIRECT`
/// backend whose alignment the pages do not fit.
///
/// Errors: [`Error::InvalidConfig`].
pub(crate) fn check_direct(backend: &dyn StorageBackend, config: &Config) -> Result<()> {
    if config.direct == DirectIo::On && backend.dio_align().is_none() {
        return Err(Error::InvalidConfig(
            "DirectIo::On needs a backend opened with O_DIRECT (FileBackend::open_direct)".into(),
        ));
    }
    if let Some(why) = direct_misfit(backend, config) {
        return Err(Error::InvalidConfig(format!("O_DIRECT: {why}")));
    }
    Ok(())
}

/// With [`TornWrites::DoubleWrite`] in force: runs the recovery pass over
/// `backend` from `area` and makes the area the file's (an empty report
/// and no area otherwise).
///
/// Errors: the recovery's (`Error::Io`, op "doublewrite recovery: ...").
pub(crate) fn recover_area(
    backend: &dyn StorageBackend,
    area: Option<Arc<dyn StorageBackend>>,
    torn_writes: TornWrites,
    config: &Config,
    read_only: bool,
) -> Result<(Option<Area>, Recovery)> {
    match (torn_writes, area) {
        (TornWrites::DoubleWrite, Some(area)) => {
            let (report, next_seq) = doublewrite::recover(
                backend,
                &*area,
                config.page_size,
                config.page_align,
                read_only,
            )?;
            let ident = doublewrite::file_identity(backend);
            let a = Area::new(area, config.page_size, ident, next_seq);
            Ok((Some(a), report))
        }
        _ => Ok((None, Recovery::default())),
    }
}

/// The longest run a flush writes: `max_write_bytes`, capped at the write
/// buffer's bound (a run of buffered pages cannot be longer, and the
/// io_uring bounce buffers are sized by it).
pub(crate) fn max_run_bytes(config: &Config) -> usize {
    let ps = config.page_size;
    let buffer_pages = (config.max_write_buffer_bytes / ps).max(1);
    config.max_write_bytes.min(buffer_pages * ps).max(ps)
}

/// The write slots of a file: `writer` (resolved to `engine`) and one more
/// writer of the same engine per further round in flight
/// ([`Config::rounds_in_flight`]); pwritev writers get their writer
/// threads ([`Config::write_threads`]), and with `atomic_max` every slot
/// a copy buffer for atomic pieces.
///
/// Errors: as [`resolve_writer`] (a ring refused for a later slot is an
/// error, not a silent mix of engines); `Error::Io` with op "spawn writer
/// thread".
pub(crate) fn write_slots(
    backend: &Arc<dyn StorageBackend>,
    config: &Config,
    writer: RunWriter,
    engine: FlushEngine,
    atomic_max: Option<usize>,
) -> Result<Vec<WriteSlot>> {
    let run_bytes = max_run_bytes(config);
    let mut writers = vec![writer];
    for _ in 1..config.rounds_in_flight {
        // Every slot writes with the engine the first resolved to.
        let fixed = config.clone().engine(engine);
        let (_, _, w) = resolve_writer(&**backend, &fixed, run_bytes, config.rounds_in_flight)?;
        writers.push(w);
    }
    let mut slots = Vec::with_capacity(writers.len());
    for mut w in writers {
        // No writer threads on a buffered file: its writes copy into the
        // page cache, where more threads cost CPU for no more GB/s (see
        // `Config::write_threads`). A backend without a file writes as it
        // writes, and gets them.
        let page_cache = backend.file().is_some() && backend.dio_align().is_none();
        if let RunWriter::Vectored { pool, .. } = &mut w
            && config.write_threads > 1
            && !page_cache
        {
            let copy_align = backend.dio_align().map(|_| config.page_align);
            let helpers =
                WriterPool::new(Arc::clone(backend), config.write_threads - 1, copy_align)
                    .map_err(|e| Error::io("spawn writer thread", None, e))?;
            *pool = Some(Box::new(helpers));
        }
        let atomic_align = atomic_max.map(|_| config.page_align);
        slots.push(WriteSlot::new(w, atomic_align));
    }
    Ok(slots)
}

/// The flush writer for `backend` as `config.engine` asks: the engine it
/// is, the reason if that differs from the one asked for, and the writer.
/// Under `O_DIRECT` the io_uring writer gets `queue_depth` buffers of
/// `bounce_len` bytes (fewer if the write buffer holds fewer runs), which
/// runs are copied into, shared out over the `slots` writers the file
/// makes ([`Config::rounds_in_flight`]; each gets at least one).
///
/// Errors: `IoUring` asked for and refused (`Error::Io`), where there is
/// no io_uring ([`Error::Unsupported`]), or on a backend without a file
/// (`InvalidConfig`); [`Error::NoMemory`] for the buffers.
pub(crate) fn resolve_writer(
    backend: &dyn StorageBackend,
    config: &Config,
    bounce_len: usize,
    slots: usize,
) -> Result<(FlushEngine, Option<String>, RunWriter)> {
    // Under O_DIRECT the pwritev engine copies scattered runs
    // (`MAX_ZERO_COPY_SEGMENTS`).
    let copy = || {
        backend
            .dio_align()
            .map(|_| GatherBuf::new(config.page_align))
    };
    let vectored = || RunWriter::Vectored {
        iovecs: Vec::new(),
        pool: None,
        copy: copy(),
    };
    let plain = |engine| match engine {
        FlushEngine::PerPage => RunWriter::PerPage,
        FlushEngine::Concat => RunWriter::Concat {
            scratch: GatherBuf::new(config.page_align),
        },
        _ => vectored(),
    };
    let queue_depth = match config.engine {
        FlushEngine::IoUring { queue_depth } | FlushEngine::Auto { queue_depth } => queue_depth,
        other => return Ok((other, None, plain(other))),
    };
    let bounce = match backend.dio_align() {
        Some(_) => (queue_depth as usize)
            .min(config.max_write_buffer_bytes.div_ceil(bounce_len))
            .div_ceil(slots.max(1))
            .max(1),
        None => 0,
    };
    let ring = match backend.file() {
        Some(file) => uring_writer(file, queue_depth, bounce, bounce_len, config.page_align),
        None => Err(Error::InvalidConfig(
            "the io_uring engine needs a backend with a file".into(),
        )),
    };
    match (config.engine, ring) {
        (_, Ok(writer)) => Ok((FlushEngine::IoUring { queue_depth }, None, writer)),
        (FlushEngine::Auto { .. }, Err(e @ Error::NoMemory { .. })) => Err(e),
        (FlushEngine::Auto { .. }, Err(e)) => {
            let why = match &e {
                Error::Io { source, .. } => format!("io_uring refused: {}", short_error(source)),
                Error::Unsupported { why, .. } => format!("no io_uring: {why}"),
                _ => "io_uring not used: the backend has no file".into(),
            };
            Ok((FlushEngine::Vectored, Some(why), vectored()))
        }
        (_, Err(e)) => Err(e),
    }
}

/// The io_uring writer on `file`: a ring of `queue_depth` with the file
/// registered, and `bounce` buffers (registered where `RLIMIT_MEMLOCK`
/// allows) to copy runs into under `O_DIRECT`. Used from whichever thread
/// flushes, so not a single-issuer ring.
fn uring_writer(
    file: &std::fs::File,
    queue_depth: u32,
    bounce: usize,
    bounce_len: usize,
    align: usize,
) -> Result<RunWriter> {
    use super::writer::{UringScratch, bounce_buffers};
    use crate::backend::ring::{RingOptions, SlotRing};
    let mut opts = RingOptions::new(queue_depth);
    opts.single_issuer = false;
    let setup = |e: crate::backend::ring::RingSetupError| {
        if e.source.kind() == std::io::ErrorKind::Unsupported {
            Error::Unsupported {
                setting: "FlushEngine::IoUring",
                platform: std::env::consts::OS,
                why: e.source.to_string(),
            }
        } else {
            Error::io("io_uring setup", None, e.into())
        }
    };
    // The ring holds an open file description of its own, not the one
    // the open's lock is on: a killed process's ring keeps what it
    // registered until the kernel's deferred teardown, and the lock must
    // not outlive the process (a restarted engine opens its file at once).
    // Its requests are finished before the process's exit completes, so
    // none lands after a successor opened the file. Where the file cannot
    // be reopened (no /proc) the ring shares the locked description.
    let own = crate::backend::reopen_description(file).ok().flatten();
    let file = own.as_ref().unwrap_or(file);
    let bufs = bounce_buffers(bounce, bounce_len, align)?;
    let ring = match SlotRing::new(file, opts, bufs) {
        Err(e) if e.stage == "register buffers" => {
            opts.fixed_buffers = false;
            let bufs = bounce_buffers(bounce, bounce_len, align)?;
            SlotRing::new(file, opts, bufs).map_err(setup)?
        }
        r => r.map_err(setup)?,
    };
    Ok(RunWriter::Uring {
        ring: Box::new(ring),
        copy: bounce > 0,
        scratch: Box::new(UringScratch::new((bounce > 0).then_some(align))),
    })
}
