//! The crate's error type.
//!
//! Every fallible call returns [`Result`]. Argument errors are checked before
//! anything is touched, so a rejected call changes nothing. I/O errors carry
//! the operation and byte offset that failed. A failed `fdatasync` is latched:
//! the file is poisoned and every later mutating call returns
//! [`Error::Poisoned`], because after a failed `fdatasync` the kernel may
//! already have dropped the dirty pages it failed to write, and retrying would
//! report success over lost data.

use std::fmt;
use std::io;
use std::sync::Arc;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors returned by `pagewriter`.
///
/// Returned by every component; a refusal changes nothing. `Clone`: the
/// operating system's errors are shared (`Arc`), so one failure can be
/// handed to every caller it concerns (the commits of a failed pass, the
/// tickets of a failed `fdatasync`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The page size is 0, not a power of two, or over
    /// [`MAX_PAGE_SIZE`](crate::MAX_PAGE_SIZE) (bytes).
    InvalidPageSize(usize),
    /// An offset or length is not a multiple of the page size (bytes).
    Unaligned {
        /// Byte offset asked for.
        offset: u64,
        /// Length in bytes asked for.
        len: usize,
        /// The file's page size in bytes.
        page_size: usize,
    },
    /// A length of 0 bytes was asked for.
    ZeroLength,
    /// `offset + len` does not fit in a `u64`.
    Overflow {
        /// Byte offset asked for.
        offset: u64,
        /// Length in bytes asked for.
        len: usize,
    },
    /// A read reaches past the end of the file (buffered pages included).
    OutOfBounds {
        /// Byte offset asked for.
        offset: u64,
        /// Length in bytes asked for.
        len: usize,
        /// The file's logical length in bytes.
        file_len: u64,
    },
    /// Two pages handed to the coalescer overlap:
    /// the entry at `offset` starts before the previous one ends.
    Overlap {
        /// Byte offset of the entry that overlaps its predecessor.
        offset: u64,
    },
    /// A configuration value is out of range; the message says which.
    InvalidConfig(String),
    /// The file was closed; no call but `stats` is allowed afterwards.
    Closed,
    /// An earlier `fdatasync` failed. The file accepts no more writes,
    /// flushes or syncs. Pages written since the last successful sync stay
    /// readable from memory.
    Poisoned,
    /// The file was opened read-only ([`OpenOptions::read_only`](crate::OpenOptions::read_only));
    /// no write, `set_len` or `discard` is accepted.
    ReadOnly,
    /// Another open of the file holds its lock (an exclusive lock for a
    /// read-write open, a shared one for read-only): a second writer, or a
    /// writer while readers hold it.
    Locked,
    /// The page at byte `offset` is under a live
    /// [`WritablePage`](crate::WritablePage) guard: a second guard, a write,
    /// `discard` or `set_len` over it, or `close`, is refused until the
    /// guard is dropped.
    Busy {
        /// Byte offset of the page under the guard.
        offset: u64,
    },
    /// [`refresh`](crate::PagedCachedFile::refresh) found `bytes` of pages
    /// still in the write buffer (or being written): flush first.
    Buffered {
        /// Bytes buffered or in flight.
        bytes: usize,
    },
    /// `offset + len` reaches past the largest file the file system holds
    /// (`max`, in bytes; probed at open), so the write could never succeed.
    FileTooLarge {
        /// Byte offset asked for.
        offset: u64,
        /// Length in bytes asked for.
        len: u64,
        /// Largest file length the file system accepts, in bytes.
        max: u64,
    },
    /// Some pages could not be written. Every other page of the flush
    /// reached the OS (and, for `sync`, was made durable); the failed pages
    /// stay dirty, so a later flush retries them, or
    /// [`discard`](crate::PagedCachedFile::discard) drops them.
    PagesFailed {
        /// Byte ranges (`start..end`) that did not reach the OS, sorted.
        failed: Vec<std::ops::Range<u64>>,
        /// The call that failed first in offset order: "pwritev", "pwrite",
        /// "io_uring writev", "fallocate", ...
        op: &'static str,
        /// The operating system's error of that call.
        source: Arc<io::Error>,
    },
    /// Memory for `bytes` bytes could not be had (a read of more than the
    /// process can hold); nothing was changed.
    NoMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// The torn-write protection asked for
    /// ([`Config::torn_writes`](crate::Config::torn_writes)) cannot be
    /// given on this file; checked at open, before anything is written.
    TornWrites {
        /// The mode asked for: "Atomic", "DoubleWrite" or "Auto".
        mode: &'static str,
        /// Why not: no `O_DIRECT`, no atomic unit reported by `statx`, a
        /// page size outside the unit, no doublewrite area.
        why: String,
    },
    /// A setting this platform cannot honour, asked for explicitly (the
    /// io_uring engine off Linux, direct I/O where the platform has none);
    /// checked at open, before anything is written. Under an `Auto`
    /// setting the file falls back instead and its
    /// [`io_mode`](crate::PagedCachedFile::io_mode) says why.
    Unsupported {
        /// The setting, e.g. `"FlushEngine::IoUring"`.
        setting: &'static str,
        /// `std::env::consts::OS` of this build: `"macos"`, `"windows"`, ...
        platform: &'static str,
        /// Why not.
        why: String,
    },
    /// Opening a file at a path failed: the file itself, its doublewrite
    /// area, or a further description of it.
    Open {
        /// What was being opened: "open", "open O_DIRECT", "open
        /// doublewrite area", "reopen for sync lanes".
        op: &'static str,
        /// The path, as given (the area's: the file's with `.dblwr`).
        path: std::path::PathBuf,
        /// The operating system's error.
        source: Arc<io::Error>,
    },
    /// An I/O call failed.
    Io {
        /// What was being done: "pwritev", "pwrite", "pread", "fdatasync", ...
        op: &'static str,
        /// Byte offset of the failed call, where there is one.
        offset: Option<u64>,
        /// The operating system's error.
        source: Arc<io::Error>,
    },
}

impl Error {
    /// Wraps an I/O error with the operation and offset that failed.
    pub fn io(op: &'static str, offset: Option<u64>, source: io::Error) -> Self {
        Error::Io {
            op,
            offset,
            source: Arc::new(source),
        }
    }

    /// An open of the file at `path` that failed.
    pub fn open(op: &'static str, path: &std::path::Path, source: io::Error) -> Self {
        Error::Open {
            op,
            path: path.to_path_buf(),
            source: Arc::new(source),
        }
    }

    /// The `io::ErrorKind` of an I/O error, `None` for other variants.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Io { source, .. }
            | Error::Open { source, .. }
            | Error::PagesFailed { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// The error as an `io::Error` of the same kind, keeping the OS's
    /// error code where there is one (a copy: the source is shared).
    pub(crate) fn to_io(&self) -> io::Error {
        match self {
            Error::Io { source, .. }
            | Error::Open { source, .. }
            | Error::PagesFailed { source, .. } => copy_io(source),
            other => io::Error::new(io::Error::from(other.clone()).kind(), other.to_string()),
        }
    }
}

/// A copy of an `io::Error`: the raw OS code where there is one, else the
/// kind and message.
fn copy_io(source: &io::Error) -> io::Error {
    match source.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(source.kind(), source.to_string()),
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidPageSize(n) => {
                write!(
                    f,
                    "page size {n} is not a power of two in 1..={}",
                    crate::MAX_PAGE_SIZE
                )
            }
            Error::Unaligned {
                offset,
                len,
                page_size,
            } => write!(
                f,
                "offset {offset} / length {len} is not a multiple of the page size {page_size}"
            ),
            Error::ZeroLength => write!(f, "length is 0"),
            Error::Overflow { offset, len } => {
                write!(f, "offset {offset} + length {len} overflows u64")
            }
            Error::OutOfBounds {
                offset,
                len,
                file_len,
            } => write!(
                f,
                "read of {len} bytes at {offset} is past the end of the file ({file_len} bytes)"
            ),
            Error::Overlap { offset } => {
                write!(f, "page at offset {offset} overlaps the page before it")
            }
            Error::InvalidConfig(msg) => write!(f, "invalid configuration: {msg}"),
            Error::Closed => write!(f, "file is closed"),
            Error::Poisoned => write!(
                f,
                "file is poisoned: an earlier fdatasync failed and durability can no longer be promised"
            ),
            Error::ReadOnly => write!(f, "file is open read-only"),
            Error::NoMemory { bytes } => {
                write!(f, "cannot allocate {bytes} bytes of memory for this call")
            }
            Error::Buffered { bytes } => write!(
                f,
                "{bytes} bytes of pages are still buffered or being written: flush first"
            ),
            Error::Locked => write!(
                f,
                "file is locked by another open (a second writer, or a writer while readers hold it)"
            ),
            Error::Busy { offset } => {
                write!(f, "page at offset {offset} is under a live write guard")
            }
            Error::FileTooLarge { offset, len, max } => write!(
                f,
                "{len} bytes at offset {offset} reach past the file system's largest file ({max} bytes)"
            ),
            Error::PagesFailed { failed, op, source } => {
                write!(f, "{op} failed ({source}); pages not written:")?;
                for (i, r) in failed.iter().enumerate().take(8) {
                    let sep = if i == 0 { " " } else { ", " };
                    write!(f, "{sep}{}..{}", r.start, r.end)?;
                }
                if failed.len() > 8 {
                    write!(f, " and {} more ranges", failed.len() - 8)?;
                }
                Ok(())
            }
            Error::TornWrites { mode, why } => {
                write!(f, "torn-write protection {mode} is not available: {why}")
            }
            Error::Unsupported {
                setting,
                platform,
                why,
            } => write!(f, "{setting} is not available on {platform}: {why}"),
            Error::Open { op, path, source } => {
                write!(f, "{op} {} failed: {source}", path.display())
            }
            Error::Io {
                op,
                offset: Some(off),
                source,
            } => write!(f, "{op} at offset {off} failed: {source}"),
            Error::Io {
                op,
                offset: None,
                source,
            } => write!(f, "{op} failed: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. }
            | Error::Open { source, .. }
            | Error::PagesFailed { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io { source, .. } | Error::Open { source, .. } => {
                Arc::try_unwrap(source).unwrap_or_else(|shared| copy_io(&shared))
            }
            other => {
                let kind = match other {
                    Error::OutOfBounds { .. } => io::ErrorKind::UnexpectedEof,
                    Error::Locked | Error::Busy { .. } | Error::Buffered { .. } => {
                        io::ErrorKind::WouldBlock
                    }
                    Error::ReadOnly => io::ErrorKind::PermissionDenied,
                    Error::NoMemory { .. } => io::ErrorKind::OutOfMemory,
                    Error::FileTooLarge { .. } => io::ErrorKind::FileTooLarge,
                    Error::PagesFailed { ref source, .. } => source.kind(),
                    Error::TornWrites { .. } | Error::Unsupported { .. } => {
                        io::ErrorKind::Unsupported
                    }
                    _ => io::ErrorKind::InvalidInput,
                };
                io::Error::new(kind, other)
            }
        }
    }
}

/// Short name of an I/O error for reports: the errno's name where known
/// (`EINVAL`, `EPERM`, ...), else the error's message.
pub fn short_error(e: &std::io::Error) -> String {
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
