//! How a file is written and opened, as a user names it: the flush engine
//! ([`FlushEngine`]) and the `O_DIRECT` choice ([`DirectIo`]), with the
//! ring's queue-depth limits.

use crate::error::Result;

/// Most SQEs in flight on one ring (io_uring's own limit on SQ entries is
/// 32768; 4096 is past what any device here gains from).
pub const MAX_QUEUE_DEPTH: u32 = 4096;

/// How a flush turns runs of contiguous dirty pages into write calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FlushEngine {
    /// One `pwrite` per page, in offset order: the baseline that collapses
    /// under concurrent writers, which the tools measure against
    /// (`testing` feature).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    PerPage,
    /// Each run copied into one buffer and written with one `pwrite`: a
    /// baseline of the tools (`testing` feature).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    Concat,
    /// Each run is written with one `pwritev` from the flushing thread,
    /// straight from the page buffers (zero copy; under `O_DIRECT` a run
    /// scattered in memory is copied into one buffer first).
    #[default]
    Vectored,
    /// A flush of several runs has them in flight at once as SQEs on the
    /// file's ring, up to `queue_depth` (1..=[`MAX_QUEUE_DEPTH`]) (Linux,
    /// cargo feature `io-uring`); a flush of one run, or one that finds
    /// the ring taken, writes as `Vectored` does. Opening fails if the
    /// ring cannot be set up.
    IoUring {
        /// Most SQEs in flight.
        queue_depth: u32,
    },
    /// `IoUring` where a ring can be set up, else `Vectored`; the file's
    /// [`IoMode`](crate::IoMode) says which and why.
    Auto {
        /// Queue depth if io_uring is used.
        queue_depth: u32,
    },
}

impl FlushEngine {
    /// Short lower-case name used by the CLI and reports.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "testing")]
            FlushEngine::PerPage => "per-page",
            #[cfg(feature = "testing")]
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
            #[cfg(feature = "testing")]
            FlushEngine::PerPage | FlushEngine::Concat if cfg!(windows) => "WriteFile",
            #[cfg(feature = "testing")]
            FlushEngine::PerPage | FlushEngine::Concat => "pwrite",
            FlushEngine::Vectored => super::sys::PLATFORM.vectored_write,
            FlushEngine::IoUring { .. } => "io_uring writev",
            FlushEngine::Auto { .. } => "io_uring writev or pwritev",
        }
    }
}

/// Queue depth of an io_uring engine named without one: 32 SQEs in
/// flight, past what a single device queue usually gains from.
pub const DEFAULT_QUEUE_DEPTH: u32 = 32;

impl std::str::FromStr for FlushEngine {
    type Err = crate::Error;

    /// Parses a [`name`](FlushEngine::name); io_uring engines get
    /// [`DEFAULT_QUEUE_DEPTH`] (see [`with_queue_depth`](FlushEngine::with_queue_depth)).
    ///
    /// Errors: [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming
    /// the engines there are.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let queue_depth = DEFAULT_QUEUE_DEPTH;
        Ok(match s {
            #[cfg(feature = "testing")]
            "per-page" => FlushEngine::PerPage,
            #[cfg(feature = "testing")]
            "concat" => FlushEngine::Concat,
            "vectored" => FlushEngine::Vectored,
            "io-uring" | "io_uring" => FlushEngine::IoUring { queue_depth },
            "auto" => FlushEngine::Auto { queue_depth },
            other => {
                return Err(crate::Error::InvalidConfig(format!(
                    "unknown engine {other:?} (vectored, io-uring, auto)"
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
    /// [`IoMode`](crate::IoMode) says which and why.
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
                matches!(e, crate::Error::InvalidConfig(ref m) if m.contains("vectored")),
                "{bad:?}: {e}"
            );
        }
    }
}
