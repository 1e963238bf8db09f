//! The report of what I/O a cached file actually does ([`IoMode`]): the
//! engine, `O_DIRECT`, torn-page protection and grow-ahead in force, each
//! decided at open (`open.rs`), with the reason for every fallback
//! (nothing falls back silently).

use std::fmt;

use super::torn::TornWrites;
use crate::backend::{DioAlign, FlushEngine};

/// The I/O mode in force for a [`PagedCachedFile`](crate::PagedCachedFile), a
/// streaming writer or an I/O worker.
///
/// `Display` gives one line for reports, e.g. `io_uring QD32, O_DIRECT
/// (align 512)` or `pwritev (io_uring refused: Operation not permitted),
/// buffered`; the calls named are this platform's ([`PLATFORM`](crate::backend::PLATFORM):
/// `F_NOCACHE` on macOS, `WriteFile per run` and `FILE_FLAG_NO_BUFFERING`
/// on Windows).
///
/// Decided at open from the backend: what the flush pipeline's writers
/// and the file really use.
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
    pub torn_writes: TornWrites,
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
        let direct = crate::backend::PLATFORM.direct_io.unwrap_or("direct I/O");
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
            TornWrites::Allow => {}
            TornWrites::Atomic => write!(f, ", atomic page writes")?,
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
