//! Opening a cached file's backend: `O_DIRECT` fit, the flush engine and
//! its ring, decided once at open from the [`Config`].

use super::config::Config;
use crate::backend::{
    FileBackend, FlushEngine, OpenOptions, StorageBackend, open_with_options, short_error,
};
use crate::error::{Error, Result};

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
            let file = backend.file().ok_or_else(|| {
                Error::InvalidConfig("the io_uring engine needs a backend with a file".into())
            })?;
            let ring =
                new_ring(file, queue_depth).map_err(|e| Error::io("io_uring setup", None, e))?;
            Ok((config.engine, None, Some(ring)))
        }
        FlushEngine::Auto { queue_depth } => match backend.file() {
            None => Ok((
                FlushEngine::Vectored,
                Some("io_uring not used: the backend has no file".into()),
                None,
            )),
            Some(file) => match new_ring(file, queue_depth) {
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
fn new_ring(file: &std::fs::File, queue_depth: u32) -> std::io::Result<Ring> {
    Ring::new(file, queue_depth)
}

#[cfg(not(all(target_os = "linux", feature = "io-uring")))]
fn new_ring(_file: &std::fs::File, _queue_depth: u32) -> std::io::Result<Ring> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "built without the io-uring feature",
    ))
}
