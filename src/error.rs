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

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors returned by `pagewriter`.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The page size is 0 or not a power of two (bytes).
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
    /// Two pages handed to [`coalesce`](crate::coalesce::coalesce) overlap:
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
    /// An I/O call failed.
    Io {
        /// What was being done: "pwritev", "pwrite", "pread", "fdatasync", ...
        op: &'static str,
        /// Byte offset of the failed call, where there is one.
        offset: Option<u64>,
        /// The operating system's error.
        source: io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with the operation and offset that failed.
    pub fn io(op: &'static str, offset: Option<u64>, source: io::Error) -> Self {
        Error::Io { op, offset, source }
    }

    /// The `io::ErrorKind` of an I/O error, `None` for other variants.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// A copy for handing the same failure to several group-commit waiters.
    /// `io::Error` is not `Clone`, so the copy keeps the kind, the raw OS
    /// error code when there is one, and the message.
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Error::InvalidPageSize(n) => Error::InvalidPageSize(*n),
            Error::Unaligned {
                offset,
                len,
                page_size,
            } => Error::Unaligned {
                offset: *offset,
                len: *len,
                page_size: *page_size,
            },
            Error::ZeroLength => Error::ZeroLength,
            Error::Overflow { offset, len } => Error::Overflow {
                offset: *offset,
                len: *len,
            },
            Error::OutOfBounds {
                offset,
                len,
                file_len,
            } => Error::OutOfBounds {
                offset: *offset,
                len: *len,
                file_len: *file_len,
            },
            Error::Overlap { offset } => Error::Overlap { offset: *offset },
            Error::InvalidConfig(s) => Error::InvalidConfig(s.clone()),
            Error::Closed => Error::Closed,
            Error::Poisoned => Error::Poisoned,
            Error::Io { op, offset, source } => Error::Io {
                op,
                offset: *offset,
                source: match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(source.kind(), source.to_string()),
                },
            },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidPageSize(n) => {
                write!(f, "page size {n} is not a non-zero power of two")
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
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io { source, .. } => source,
            other => {
                let kind = match other {
                    Error::OutOfBounds { .. } => io::ErrorKind::UnexpectedEof,
                    _ => io::ErrorKind::InvalidInput,
                };
                io::Error::new(kind, other)
            }
        }
    }
}
