//! What I/O a file actually does: the engine and `O_DIRECT` decisions made
//! at open, with the reason for every fallback (nothing falls back
//! silently).

use std::fmt;

use super::{DioAlign, FileBackend, OpenOptions};
use crate::error::{Error, Result};

/// Most SQEs in flight on one ring (io_uring's own limit on SQ entries is
/// 32768; 4096 is past what any device here gains from).
pub const MAX_QUEUE_DEPTH: u32 = 4096;

/// The I/O mode in force for a [`PagedCachedFile`](crate::PagedCachedFile), a
/// streaming writer or an I/O worker.
///
/// `Display` gives one line for reports, e.g. `io_uring QD32, O_DIRECT
/// (align 512)` or `pwritev (io_uring refused: Operation not permitted),
/// buffered`; the calls named are this platform's ([`PLATFORM`](super::PLATFORM):
/// `F_NOCACHE` on macOS, `WriteFile per run` and `FILE_FLAG_NO_BUFFERING`
/// on Windows).
///
/// Decided at open (`cached_file/open.rs`) from the backend: what the flush pipeline's writers and the file really use.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct IoMode {
    /// The engine flushes use (never `Auto`).
    pub engine: FlushEngine,
    /// Why the engine is not the one asked for, if it is not.
    pub engine_fallback: Option<String>,
    /// `O_DIRECT` alignment if the file bypasses the page cache.
    pub direct: Option<DioAlign>,
    /// Why the file is buffered although `O_DIRECT` was asked for (`Auto`).
    pub direct_fallback: Option<String>,
    /// The torn-page protection in force (never `Auto`).
    pub torn_writes: crate::TornWrites,
    /// Why `Auto` chose what it did (or why the streaming tools write
    /// without protection), where there is something to say.
    pub torn_writes_why: Option<String>,
    /// Grow-ahead's window in bytes, where one is configured
    /// ([`GrowAhead::Window`](crate::GrowAhead::Window)).
    pub grow_ahead: Option<u64>,
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
        let direct = super::PLATFORM.direct_io.unwrap_or("direct I/O");
        match (&self.direct, &self.direct_fallback) {
            (Some(a), _) if a.memory == a.offset => write!(f, ", {direct} (align {})", a.offset),
            (Some(a), _) => write!(
                f,
                ", {direct} (align {} memory, {} offset)",
                a.memory, a.offset
            ),
            (None, Some(why)) => write!(f, ", buffered ({why})"),
            (None, None) => write!(f, ", buffered"),
        }?;
        match self.torn_writes {
            crate::TornWrites::Allow => {}
            crate::TornWrites::Atomic => write!(f, ", atomic page writes")?,
            _ => write!(f, ", doublewrite")?,
        }
        if let Some(why) = &self.torn_writes_why {
            write!(f, " ({why})")?;
        }
        if let Some(bytes) = self.grow_ahead {
            write!(f, ", grow-ahead {} KiB window", bytes >> 10)?;
        }
        Ok(())
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

/// Opens `path` (created if missing, never truncated) with `O_DIRECT` as
/// `direct` asks. `misfit` says why an `O_DIRECT` file cannot serve the
/// caller's sizes, if so: with `On` that is an [`Error::InvalidConfig`]
/// ("O_DIRECT: why"), with `Auto` the file is reopened buffered. Returns
/// the backend and, for `Auto` falling back to buffered, why.
///
/// Shared by the cached file and the tools that bypass it (the streaming
/// writer, the I/O worker), so all decide and report `O_DIRECT` the same
/// way.
///
/// Errors: `Error::Io` with op "open" or "open O_DIRECT";
/// [`Error::InvalidConfig`] with `On` and a misfit;
/// [`Error::Unsupported`] with `On` on a platform without direct I/O.
pub fn open_with_direct(
    path: &std::path::Path,
    direct: DirectIo,
    misfit: &dyn Fn(&FileBackend) -> Option<String>,
) -> Result<(FileBackend, Option<String>)> {
    open_with_options(path, &OpenOptions::new().lock(false), direct, misfit)
}

/// [`open_with_direct`] with access, creation and locking as `options`
/// say. A lock held elsewhere is [`Error::Locked`].
pub fn open_with_options(
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
    let Some(name) = super::PLATFORM.direct_io else {
        return match direct {
            DirectIo::Off => Ok((buffered()?, None)),
            DirectIo::On => Err(Error::Unsupported {
                setting: "DirectIo::On",
                platform: super::PLATFORM.os,
                why: "no direct I/O call here (O_DIRECT, F_NOCACHE)".into(),
            }),
            DirectIo::Auto => Ok((
                buffered()?,
                Some(format!("no direct I/O on {}", super::PLATFORM.os)),
            )),
        };
    };
    match direct {
        DirectIo::Off => Ok((buffered()?, None)),
        DirectIo::On => {
            let b = open(true, "open O_DIRECT")?;
            match misfit(&b) {
                Some(why) => Err(Error::InvalidConfig(format!("{name}: {why}"))),
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
                Some(format!("{name} refused: {}", short_error(&e))),
            )),
            Err(other) => Err(other),
        },
    }
}

/// How a flush turns runs of contiguous dirty pages into write calls.
///
/// The run writers of the flush pipeline's write slots (`cached_file/writer.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FlushEngine {
    /// One `pwrite` per page, in offset order. The baseline that collapses
    /// under concurrent writers; kept to measure against.
    PerPage,
    /// Each run is copied into one buffer and written with one `pwrite`.
    /// Few system calls, but every byte is copied once more.
    Concat,
    /// Each run is written with one `pwritev` straight from the page
    /// buffers (zero copy). The default.
    #[default]
    Vectored,
    /// Each run is one `IORING_OP_WRITEV` SQE on a ring per file, up to
    /// `queue_depth` (1..=[`MAX_QUEUE_DEPTH`]) in flight (Linux, cargo feature `io-uring`).
    /// Opening fails if the ring cannot be set up.
    IoUring {
        /// Most SQEs in flight.
        queue_depth: u32,
    },
    /// `IoUring` where a ring can be set up, else `Vectored`; the file's
    /// [`IoMode`] says which and why.
    Auto {
        /// Queue depth if io_uring is used.
        queue_depth: u32,
    },
}

impl FlushEngine {
    /// Short lower-case name used by the CLI and reports.
    pub fn name(self) -> &'static str {
        match self {
            FlushEngine::PerPage => "per-page",
            FlushEngine::Concat => "concat",
            FlushEngine::Vectored => "vectored",
            FlushEngine::IoUring { .. } => "io-uring",
            FlushEngine::Auto { .. } => "auto",
        }
    }

    /// The engine with its queue depth set to `queue_depth` (io_uring
    /// engines; the others are returned as they are).
    pub fn with_queue_depth(self, queue_depth: u32) -> Self {
        match self {
            FlushEngine::IoUring { .. } => FlushEngine::IoUring { queue_depth },
            FlushEngine::Auto { .. } => FlushEngine::Auto { queue_depth },
            other => other,
        }
    }

    /// The system call each write of this engine makes on this platform.
    pub fn syscall(self) -> &'static str {
        match self {
            FlushEngine::PerPage | FlushEngine::Concat if cfg!(windows) => "WriteFile",
            FlushEngine::PerPage | FlushEngine::Concat => "pwrite",
            FlushEngine::Vectored => super::PLATFORM.vectored_write,
            FlushEngine::IoUring { .. } => "io_uring writev",
            FlushEngine::Auto { .. } => "io_uring writev or pwritev",
        }
    }
}

/// Queue depth of an io_uring engine named without one: 32 SQEs in flight
/// (`.project/io-uring-and-direct.md`: deeper queues did not write faster
/// here).
pub const DEFAULT_QUEUE_DEPTH: u32 = 32;

impl std::str::FromStr for FlushEngine {
    type Err = crate::Error;

    /// Parses a [`name`](FlushEngine::name); io_uring engines get
    /// [`DEFAULT_QUEUE_DEPTH`] (see [`with_queue_depth`](FlushEngine::with_queue_depth)).
    ///
    /// Errors: [`Error::InvalidConfig`] naming
    /// the engines there are.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let queue_depth = DEFAULT_QUEUE_DEPTH;
        Ok(match s {
            "per-page" => FlushEngine::PerPage,
            "concat" => FlushEngine::Concat,
            "vectored" => FlushEngine::Vectored,
            "io-uring" | "io_uring" => FlushEngine::IoUring { queue_depth },
            "auto" => FlushEngine::Auto { queue_depth },
            other => {
                return Err(crate::Error::InvalidConfig(format!(
                    "unknown engine {other:?} (per-page, concat, vectored, io-uring, auto)"
                )));
            }
        })
    }
}

/// Whether the file is opened with `O_DIRECT` (bypassing the page cache).
///
/// Decided at open, below every component (`backend/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum DirectIo {
    /// Buffered I/O through the page cache. The default.
    #[default]
    Off,
    /// `O_DIRECT`; opening fails where the file system refuses it or the
    /// page size / page alignment do not meet its alignment.
    On,
    /// `O_DIRECT` where possible, else buffered; the file's
    /// [`IoMode`] says which and why.
    Auto,
}

#[cfg(feature = "serde")]
impl serde::Serialize for FlushEngine {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_parse_back_and_unknown_names_are_errors() {
        for e in [
            FlushEngine::PerPage,
            FlushEngine::Concat,
            FlushEngine::Vectored,
            FlushEngine::IoUring {
                queue_depth: DEFAULT_QUEUE_DEPTH,
            },
            FlushEngine::Auto {
                queue_depth: DEFAULT_QUEUE_DEPTH,
            },
        ] {
            assert_eq!(e.name().parse::<FlushEngine>().unwrap(), e);
        }
        assert_eq!(
            "io-uring"
                .parse::<FlushEngine>()
                .unwrap()
                .with_queue_depth(7),
            FlushEngine::IoUring { queue_depth: 7 }
        );
        assert_eq!(FlushEngine::Concat.with_queue_depth(7), FlushEngine::Concat);
        for bad in ["", "IO-URING", "pwritev", "io-uring:8"] {
            let e = bad.parse::<FlushEngine>().unwrap_err();
            assert!(
                matches!(e, crate::Error::InvalidConfig(ref m) if m.contains("per-page")),
                "{bad:?}: {e}"
            );
        }
    }
}
