//! The components a flush, a commit or a read acts on, borrowed together
//! from the file: [`Parts`]. The flush pipeline and group commit own
//! their own state and locks; what they act on (pages, lengths, the
//! watermark, ...) belongs to these components, which they reach through
//! methods.

use super::cache::ReadCache;
use super::config::Config;
use super::durability::Durability;
use super::length::Length;
use super::lifecycle::Lifecycle;
use super::stats::Counters;
use super::torn::TornProtection;
use super::unwritten::Unwritten;
use super::write_buffer::WriteBuffer;
use crate::backend::StorageBackend;

/// The file's components below the flush pipeline, borrowed (see the
/// module docs). Built on each call by `PagedCachedFile::parts`.
#[derive(Clone, Copy)]
pub(crate) struct Parts<'a> {
    /// Where the bytes go.
    pub(crate) backend: &'a dyn StorageBackend,
    pub(crate) config: &'a Config,
    pub(crate) counters: &'a Counters,
    /// Dirty and in-flight pages, the pool, room, guards.
    pub(crate) buffer: &'a WriteBuffer,
    /// Clean pages.
    pub(crate) cache: &'a ReadCache,
    /// Logical, disk and written lengths.
    pub(crate) length: &'a Length,
    /// Write sequence, durable watermark, sync lanes.
    pub(crate) durability: &'a Durability,
    /// Flags and the close handshake.
    pub(crate) life: &'a Lifecycle,
    /// Atomic pieces or the doublewrite area.
    pub(crate) torn: &'a TornProtection,
    /// Pages unwritten on disk (a hint for scoped commits).
    pub(crate) unwritten: &'a Unwritten,
    /// The backend does `O_DIRECT`.
    pub(crate) direct: bool,
}
