//! The tools' error: every error of the core ([`CoreError`]), and the
//! three only the tools raise (a worker thread that panicked, work
//! cancelled, data read back that is not what was written).

use std::fmt;
use std::io;

pub use pagewriter::Error as CoreError;

/// Result alias of the tools.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the tools.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// An error of the core: a bad argument or configuration, an I/O call
    /// that failed (with its operation and offset), ...
    Core(CoreError),
    /// A worker thread panicked (an I/O job, a `scale` writer, a fill
    /// thread); what it was doing is unknown, so its work counts as not
    /// done.
    Panicked {
        /// Which worker: "io job", "scale writer", "fill thread", ...
        worker: &'static str,
    },
    /// The caller asked the work to stop (a cancel flag, Ctrl-C in a
    /// binding); what it left is reported as not done.
    Cancelled,
    /// Data read back is not what was written: the first bad block.
    VerifyFailed {
        /// Byte offset of the bad block.
        offset: u64,
        /// What is wrong with it.
        why: String,
    },
}

impl Error {
    /// An I/O error with the operation and byte offset that failed.
    pub fn io(op: &'static str, offset: Option<u64>, source: io::Error) -> Self {
        Error::Core(CoreError::io(op, offset, source))
    }

    /// A configuration value out of range; `msg` says which.
    pub fn config(msg: String) -> Self {
        Error::Core(CoreError::InvalidConfig(msg))
    }

    /// The `io::ErrorKind` of an I/O error, `None` for other errors.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Core(e) => e.io_kind(),
            _ => None,
        }
    }

    /// The core's error, if it is one.
    pub fn core(&self) -> Option<&CoreError> {
        match self {
            Error::Core(e) => Some(e),
            _ => None,
        }
    }
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        Error::Core(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Core(e) => e.fmt(f),
            Error::Panicked { worker } => write!(f, "a {worker} panicked; its work is not done"),
            Error::Cancelled => write!(f, "cancelled before the work was done"),
            Error::VerifyFailed { offset, why } => {
                write!(f, "verify: block at offset {offset} is bad: {why}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Core(e) => e.source(),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match e {
            Error::Core(e) => return e.into(),
            Error::Panicked { .. } => io::ErrorKind::Other,
            Error::Cancelled => io::ErrorKind::Interrupted,
            Error::VerifyFailed { .. } => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_errors_keep_their_kind_and_core_errors_pass_through() {
        let e: io::Error = Error::Cancelled.into();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        let e: io::Error = Error::VerifyFailed {
            offset: 4096,
            why: "byte 0 differs".into(),
        }
        .into();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("4096"), "{e}");
        let core = Error::io(
            "pwrite",
            Some(8),
            io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert_eq!(core.io_kind(), Some(io::ErrorKind::StorageFull));
        let e: io::Error = core.into();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert!(Error::config("bs 0".into()).to_string().contains("bs 0"));
    }
}
