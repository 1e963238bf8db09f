//! Torn-page protection ([`TornWrites`]): which protection a file has
//! ([`TornProtection`]: atomic writes where the file offers them, else the
//! doublewrite area of `doublewrite.rs`), and what recovery did at open.
//!
//! Owns: the atomic piece size, the doublewrite area (its own lock, see
//! `doublewrite.rs`) and the recovery report; all fixed at open.
//! Calls: nothing; the flush pipeline stages records and writes atomic
//! pieces, group commit and the syncs outside rounds tell the area what
//! an `fdatasync` covered. Lock order: the area's lock is a leaf (nothing
//! is taken under it).

use super::doublewrite::{Area, Recovery};

/// How a file protects its pages from being torn by a power cut during a
/// write ([`Config::torn_writes`](crate::Config::torn_writes)).
///
/// Component: torn-page protection (`cached_file/torn.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum TornWrites {
    /// No protection: a page may be left part old, part new (at 512-byte
    /// sector boundaries) by a power cut during its write. For engines
    /// that checksum their pages and never overwrite a live one in place
    /// (redb, LMDB). The default.
    #[default]
    Allow,
    /// Every page is written with `RWF_ATOMIC` (Linux 6.11+, `O_DIRECT`):
    /// a run is cut into power-of-two pieces of whole pages, aligned to
    /// their length and at most the file's atomic unit max
    /// ([`AtomicUnit`](crate::backend::AtomicUnit)), each one write from
    /// one memory segment, by the `pwritev` engines (`pwritev2`) and the
    /// io_uring engine (`rw_flags`). Open fails with
    /// [`Error::TornWrites`](crate::Error::TornWrites) where the file reports no atomic unit (no
    /// `O_DIRECT`, a file system without atomic writes such as ext4 here)
    /// or the page size is outside it. Writer threads
    /// ([`Config::write_threads`](crate::Config::write_threads)) are not
    /// used in this mode.
    Atomic,
    /// Each flush first writes its pages as one record to a doublewrite
    /// area and syncs it, then writes them in place; open repairs torn
    /// pages from the area ([`PagedCachedFile::recovery`](crate::PagedCachedFile::recovery)).
    /// A commit whose changes are all in durable records is acknowledged
    /// without an `fdatasync` of the file (recovery brings its pages back);
    /// the file is synced when the area passes 16 MiB (the area then
    /// starts over), when a `set_len` or other
    /// change no record holds is committed, before a cut, and at `close`.
    /// So a commit costs one sequential write and one `fdatasync` of the
    /// area besides its writes in place. The area is
    /// the file `<path>.dblwr` beside a file opened by path, or the
    /// backend given to
    /// [`PagedCachedFile::with_doublewrite`](crate::PagedCachedFile::with_doublewrite).
    ///
    /// Recovery writes pages in place, so it needs room: after a full disk
    /// refused some writes, an open on the still-full disk fails with
    /// `Error::Io` (op "doublewrite recovery: write page", `ENOSPC`),
    /// keeping the file and the area; open again once space is free.
    DoubleWrite,
    /// `Atomic` where the file takes atomic writes of a page and the
    /// device does them itself (`AtomicUnit::device_max`), else
    /// `DoubleWrite` (atomic writes a file system emulates, out of place,
    /// cost more than the area's copy); [`IoMode::torn_writes`](crate::IoMode::torn_writes)
    /// says which is in force and
    /// [`IoMode::torn_writes_why`](crate::IoMode::torn_writes_why) why.
    Auto,
}

impl TornWrites {
    /// The mode's name, as in the enum.
    pub fn name(self) -> &'static str {
        match self {
            TornWrites::Allow => "Allow",
            TornWrites::Atomic => "Atomic",
            TornWrites::DoubleWrite => "DoubleWrite",
            TornWrites::Auto => "Auto",
        }
    }
}

/// The torn-page protection in force for one open file.
pub(crate) struct TornProtection {
    /// [`TornWrites::Atomic`] in force: the largest atomic piece in bytes.
    atomic_max: Option<usize>,
    /// [`TornWrites::DoubleWrite`] in force: the area.
    area: Option<Area>,
    /// What the doublewrite recovery at open did.
    recovery: Recovery,
}

impl TornProtection {
    /// Atomic pieces of at most `atomic_max` bytes, or the doublewrite
    /// `area` (recovered as `recovery` says), or neither (`Allow`).
    pub(crate) fn new(atomic_max: Option<usize>, area: Option<Area>, recovery: Recovery) -> Self {
        debug_assert!(atomic_max.is_none() || area.is_none());
        Self {
            atomic_max,
            area,
            recovery,
        }
    }

    /// The largest atomic piece in bytes, with [`TornWrites::Atomic`] in
    /// force.
    #[inline]
    pub(crate) fn atomic_max(&self) -> Option<usize> {
        self.atomic_max
    }

    /// The doublewrite area, with [`TornWrites::DoubleWrite`] in force.
    #[inline]
    pub(crate) fn area(&self) -> Option<&Area> {
        self.area.as_ref()
    }

    /// What the recovery pass at open did.
    pub(crate) fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Pages in `[start, end)` were discarded: a failed write of theirs no
    /// longer holds the area.
    #[inline]
    pub(crate) fn forget_failed(&self, start: u64, end: u64) {
        if let Some(area) = &self.area {
            area.forget_failed(start, end);
        }
    }
}
