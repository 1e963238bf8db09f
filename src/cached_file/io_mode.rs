//! What I/O a file actually does: the engine and `O_DIRECT` decisions made
//! at open, with the reason for every fallback (nothing falls back
//! silently).

use std::fmt;

use super::config::{Config, DirectIo, FlushEngine};
use crate::backend::{DioAlign, FileBackend, OpenOptions, StorageBackend};
use crate::error::{Error, Result};

/// The I/O mode in force for a [`PagedCachedFile`](super::PagedCachedFile).
///
/// `Display` gives one line for reports, e.g. `io_uring QD32, O_DIRECT
/// (align 512)` or `pwritev (io_uring refused: Operation not permitted),
/// buffered`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IoMode {
    /// The engine flushes use (never `Auto`).
    pub engine: FlushEngine,
    /// Why the engine is not the one asked for, if it is not.
    pub engine_fallback: Option<String>,
    /// `O_DIRECT` alignment if the file bypasses the page cache.
    pub direct: Option<DioAlign>,
    /// Why the file is buffered although `O_DIRECT` was asked for (`Auto`).
    pub direct_fallback: Option<String>,
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.engine {
            FlushEngine::IoUring { queue_depth } => write!(f, "io_uring QD{queue_depth}")?,
            FlushEngine::PerPage => write!(f, "pwrite per page")?,
            FlushEngine::Concat => write!(f, "pwrite per run (copied)")?,
            other => write!(f, "{}", other.syscall())?,
        }
        if let Some(why) = &self.engine_fallback {
            write!(f, " ({why})")?;
        }
        match (&self.direct, &self.direct_fallback) {
            (Some(a), _) if a.memory == a.offset => write!(f, ", O_DIRECT (align {})", a.offset),
            (Some(a), _) => write!(
                f,
                ", O_DIRECT (align {} memory, {} offset)",
                a.memory, a.offset
            ),
            (None, Some(why)) => write!(f, ", buffered ({why})"),
            (None, None) => write!(f, ", buffered"),
        }
    }
}

/// Short name of an I/O error for reports: the errno's name where known.
pub(crate) fn short_error(e: &std::io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::EPERM) => "EPERM",
        Some(libc::ENOSYS) => "ENOSYS",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        Some(libc::ENOMEM) => "ENOMEM",
        Some(libc::EACCES) => "EACCES",
        _ => return e.to_string(),
    };
    name.to_string()
}

/// Opens `path` (created if missing, never truncated) with `O_DIRECT` as
/// `direct` asks. `misfit` says why an `O_DIRECT` file cannot serve the
/// caller's sizes, if so: with `On` that is an [`Error::InvalidConfig`]
/// ("O_DIRECT: why"), with `Auto` the file is reopened buffered. Returns
/// the backend and, for `Auto` falling back to buffered, why.
///
/// Shared by the cached file, [`crate::stream`] and the `io` worker, so
/// all three decide and report `O_DIRECT` the same way.
pub(crate) fn open_with_direct(
    path: &std::path::Path,
    direct: DirectIo,
    misfit: &dyn Fn(&FileBackend) -> Option<String>,
) -> Result<(FileBackend, Option<String>)> {
    open_with_options(path, &OpenOptions::new().lock(false), direct, misfit)
}

/// [`open_with_direct`] with access, creation and locking as `options`
/// say. A lock held elsewhere is [`Error::Locked`].
pub(crate) fn open_with_options(
    path: &std::path::Path,
    options: &OpenOptions,
    direct: DirectIo,
    misfit: &dyn Fn(&FileBackend) -> Option<String>,
) -> Result<(FileBackend, Option<String>)> {
    let open = |direct: bool, op: &'static str| {
        FileBackend::open_with(path, options, direct).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                Error::Locked
            } else {
                Error::io(op, None, e)
            }
        })
    };
    let buffered = || open(false, "open");
    match direct {
        DirectIo::Off => Ok((buffered()?, None)),
        DirectIo::On => {
            let b = open(true, "open O_DIRECT")?;
            match misfit(&b) {
                Some(why) => Err(Error::InvalidConfig(format!("O_DIRECT: {why}"))),
                None => Ok((b, None)),
            }
        }
        DirectIo::Auto => match open(true, "open O_DIRECT") {
            Ok(b) => match misfit(&b) {
                None => Ok((b, None)),
                Some(why) => {
                    drop(b);
                    Ok((buffered()?, Some(why)))
                }
            },
            Err(Error::Io { source: e, .. }) => Ok((
                buffered()?,
                Some(format!("O_DIRECT refused: {}", short_error(&e))),
            )),
            Err(other) => Err(other),
        },
    }
}

/// Opens `path` for a [`PagedCachedFile`](super::PagedCachedFile) with
/// `O_DIRECT` as `config.direct` asks, write caps and sync lanes set.
pub(crate) fn open_file(
    path: &std::path::Path,
    options: &OpenOptions,
    config: &Config,
) -> Result<(FileBackend, Option<String>)> {
    let (backend, why) =
        open_with_options(path, options, config.direct, &|b| direct_misfit(b, config))?;
    let backend = backend
        .with_max_write_bytes(config.max_write_bytes)
        .with_sync_lanes(config.sync_lanes)
        .map_err(|e| Error::io("reopen for sync lanes", None, e))?;
    Ok((backend, why))
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

/// The engine to use on `backend` as `config.engine` asks, the reason if it
/// differs, and the ring for io_uring.
#[allow(clippy::type_complexity)]
pub(crate) fn resolve_engine(
    backend: &dyn StorageBackend,
    config: &Config,
) -> Result<(FlushEngine, Option<String>, Option<Ring>)> {
    match config.engine {
        FlushEngine::IoUring { queue_depth } => {
            let fd = backend.raw_fd().ok_or_else(|| {
                Error::InvalidConfig(
                    "the io_uring engine needs a backend with a file descriptor".into(),
                )
            })?;
            let ring =
                new_ring(fd, queue_depth).map_err(|e| Error::io("io_uring setup", None, e))?;
            Ok((config.engine, None, Some(ring)))
        }
        FlushEngine::Auto { queue_depth } => match backend.raw_fd() {
            None => Ok((
                FlushEngine::Vectored,
                Some("io_uring not used: the backend has no file descriptor".into()),
                None,
            )),
            Some(fd) => match new_ring(fd, queue_depth) {
                Ok(ring) => Ok((FlushEngine::IoUring { queue_depth }, None, Some(ring))),
                Err(e) => Ok((
                    FlushEngine::Vectored,
                    Some(format!("io_uring refused: {}", short_error(&e))),
                    None,
                )),
            },
        },
        other => Ok((other, None, None)),
    }
}

#[cfg(all(target_os = "linux", feature = "io-uring"))]
pub(crate) type Ring = crate::backend::uring::UringWriter;
/// Stand-in when built without io_uring; never constructed.
#[cfg(not(all(target_os = "linux", feature = "io-uring")))]
#[derive(Debug)]
pub(crate) struct Ring;

#[cfg(all(target_os = "linux", feature = "io-uring"))]
fn new_ring(fd: std::os::fd::RawFd, queue_depth: u32) -> std::io::Result<Ring> {
    Ring::new(fd, queue_depth)
}

#[cfg(not(all(target_os = "linux", feature = "io-uring")))]
fn new_ring(_fd: std::os::fd::RawFd, _queue_depth: u32) -> std::io::Result<Ring> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "built without the io-uring feature",
    ))
}
