//! Torn-page protection ([`TornWrites`]): which protection a file has
//! ([`TornProtection`]: atomic writes where the file offers them, else the
//! doublewrite area), decided at open ([`resolve_torn`]); the doublewrite
//! area itself ([`Area`]), and opening and recovering it ([`recover_area`]).
//!
//! Owns: the atomic piece size, the area (its own lock, a leaf, held while
//! a record is staged) and the recovery report, fixed at open. Calls: the
//! area's backend.
//!
//! # How it works
//!
//! A power cut during a page write can leave the page half old, half new.
//! InnoDB's answer (`buf0dblwr.cc`) is to write every page first to a
//! doublewrite buffer, make that durable, and only then write the pages in
//! place. Here the buffer is a sidecar file: each flush appends its pages
//! as one record (`format::doublewrite`) with one write and `fdatasync`s
//! it. The area goes back to offset 0 only when no staged flush is still
//! writing in place and an `fdatasync` of the file covered every in-place
//! write of its records: then no page depends on it.
//!
//! A commit whose pages are all in durable records needs no `fdatasync` of
//! the file: its pass skips it when every change since the last one was a
//! staged batch (or the length its record carries). The file is synced
//! when the area passes [`CHECKPOINT_BYTES`] (then it starts over), at
//! `close` and before a cut. At open the records are replayed into the
//! file (`format::doublewrite::recover`) before anything else is written.

use std::collections::BTreeSet;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::sync::Arc;

use super::config::{Config, Counters, TornWrites, add};
use super::write_buffer::PageRef;
use crate::backend::{FileBackend, OpenOptions, StorageBackend};
use crate::error::{Error, Result};
use crate::format::doublewrite::{self, Recovery, file_identity};
use crate::sync::Mutex;

/// The doublewrite area of one open file.
pub(crate) struct Area {
    backend: Arc<dyn StorageBackend>,
    page_size: usize,
    ident: (u64, u64),
    state: Mutex<AreaState>,
}

struct AreaState {
    /// Where the next record goes.
    tail: u64,
    /// The next record's `seq`.
    next_seq: u64,
    /// Records whose pages are still being written in place.
    open: u64,
    /// `write_seq` after the last in-place write of a staged batch.
    last_written: u64,
    /// `write_seq` the last successful data `fdatasync` covered.
    synced: u64,
    /// Pages (byte offsets) whose in-place write failed after their record
    /// was staged, not replaced since: possibly torn, so the area keeps
    /// their records until they are written whole (or discarded).
    failed: BTreeSet<u64>,
    /// The header and page table of the record being written (reused).
    head: Vec<u8>,
}

/// Area bytes past which a flush first `fdatasync`s the file, so the area
/// starts over and its records overwrite blocks already allocated.
pub(crate) const CHECKPOINT_BYTES: u64 = 16 << 20;

impl Area {
    pub(crate) fn new(
        backend: Arc<dyn StorageBackend>,
        page_size: usize,
        ident: (u64, u64),
        next_seq: u64,
    ) -> Self {
        Self {
            backend,
            page_size,
            ident,
            state: Mutex::new(AreaState {
                tail: 0,
                next_seq,
                open: 0,
                last_written: 0,
                synced: 0,
                failed: BTreeSet::new(),
                head: Vec::new(),
            }),
        }
    }

    /// Writes `entries` (sorted `(offset, page)`) as one record with the
    /// logical length `file_len` (which recovery restores) and makes it
    /// durable, the lock held throughout; the caller then writes the pages
    /// in place and calls [`written`](Self::written). `synced`: the
    /// watermark now.
    ///
    /// Errors: the area's write or `fdatasync`; nothing was staged.
    pub(crate) fn stage(
        &self,
        entries: &[(u64, PageRef)],
        file_len: u64,
        synced: u64,
        counters: &Counters,
    ) -> io::Result<()> {
        let mut st = self.state.lock();
        st.synced = st.synced.max(synced);
        if st.open == 0 && st.synced >= st.last_written && st.failed.is_empty() {
            // Every page of every record is durable in place, whole.
            st.tail = 0;
        }
        let seq = st.next_seq;
        let mut head = std::mem::take(&mut st.head);
        let pages = entries.iter().map(|(offset, page)| (*offset, &page[..]));
        doublewrite::encode_head(&mut head, seq, self.ident, self.page_size, file_len, pages);
        let mut bufs: Vec<IoSlice<'_>> = Vec::with_capacity(entries.len() + 1);
        bufs.push(IoSlice::new(&head));
        bufs.extend(entries.iter().map(|(_, p)| IoSlice::new(p)));
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let at = st.tail;
        let r = self
            .backend
            .write_vectored_all_at(at, &mut bufs)
            .and_then(|()| {
                add(&counters.doublewrite_syncs, 1);
                self.backend.sync_data()
            });
        drop(bufs);
        st.head = head;
        r?;
        add(&counters.doublewrite_records, 1);
        add(&counters.doublewrite_bytes, len);
        st.tail = at + len;
        st.next_seq = seq + 1;
        st.open += 1;
        Ok(())
    }

    /// The in-place write of a staged record is over: `seq` is the
    /// `write_seq` it left if some of it reached the OS; `failed` the
    /// ranges of `entries` (indices) whose write failed.
    pub(crate) fn written(
        &self,
        seq: Option<u64>,
        entries: &[(u64, PageRef)],
        failed: &[Range<usize>],
    ) {
        let mut st = self.state.lock();
        st.open -= 1;
        if let Some(s) = seq {
            st.last_written = st.last_written.max(s);
        }
        if failed.is_empty() && st.failed.is_empty() {
            return;
        }
        for (i, (offset, _)) in entries.iter().enumerate() {
            if failed.iter().any(|r| r.contains(&i)) {
                st.failed.insert(*offset);
            } else {
                st.failed.remove(offset);
            }
        }
    }

    /// Whether some page's in-place write failed and was not replaced
    /// since (see [`written`](Self::written)).
    pub(crate) fn has_failed(&self) -> bool {
        !self.state.lock().failed.is_empty()
    }

    /// Pages in `[start, end)` were discarded: a failed write of theirs no
    /// longer holds the area.
    pub(crate) fn forget_failed(&self, start: u64, end: u64) {
        let mut st = self.state.lock();
        if !st.failed.is_empty() {
            let gone: Vec<u64> = st.failed.range(start..end).copied().collect();
            for o in gone {
                st.failed.remove(&o);
            }
        }
    }

    /// An `fdatasync` of the data file covered `write_seq` up to `covered`.
    #[cfg(test)]
    pub(crate) fn data_synced(&self, covered: u64) {
        let mut st = self.state.lock();
        st.synced = st.synced.max(covered);
    }

    /// Whether the area has grown past `limit` bytes with records whose
    /// pages may not be durable in place (`synced`: the watermark now).
    pub(crate) fn wants_checkpoint(&self, limit: u64, synced: u64) -> bool {
        let mut st = self.state.lock();
        st.synced = st.synced.max(synced);
        st.tail >= limit && st.synced < st.last_written
    }

    /// Empties the area (the data file synced, nothing in flight), so no
    /// record can bring back a page past a cut.
    pub(crate) fn clear(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        self.backend.set_len(0)?;
        self.backend.sync_data()?;
        st.tail = 0;
        Ok(())
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

    /// The largest atomic piece in bytes, with [`TornWrites::Atomic`].
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

/// Whether `backend` takes atomic writes of one page of `config`, and if
/// not, why.
fn atomic_fit(backend: &dyn StorageBackend, config: &Config) -> std::result::Result<(), String> {
    let Some(unit) = backend.atomic_write_unit() else {
        let platform = crate::backend::PLATFORM;
        return Err(if !platform.atomic_writes {
            format!(
                "untearable writes (RWF_ATOMIC) are a Linux interface; this is {}",
                platform.os
            )
        } else if backend.dio_align().is_none() {
            "atomic writes need O_DIRECT (DirectIo::On), and the file is buffered".into()
        } else {
            "statx reports no atomic write unit for this file (file system or device without RWF_ATOMIC)".into()
        });
    };
    let ps = config.page_size;
    if !unit.fits(0, ps) {
        return Err(format!(
            "the page size {ps} is outside the atomic write unit {}..={} B",
            unit.min, unit.max
        ));
    }
    Ok(())
}

/// Whether `Auto` picks atomic writes: the file takes them for a page and
/// the device does them itself (its atomic unit holds a page). Atomic
/// writes a file system emulates (XFS writing out of place and remapping)
/// cost more than the doublewrite area's copy.
fn auto_atomic(backend: &dyn StorageBackend, config: &Config) -> std::result::Result<(), String> {
    atomic_fit(backend, config)?;
    let unit = backend.atomic_write_unit().expect("checked by atomic_fit");
    if (unit.device_max as usize) < config.page_size {
        return Err(format!(
            "the file takes atomic writes but the device has no atomic unit of a page \
             (device max {} B): the file system would emulate them, slower than the doublewrite area",
            unit.device_max
        ));
    }
    Ok(())
}

/// The torn-page protection in force for `config.torn_writes` on
/// `backend`, and why where `Auto` chose (never `Auto`).
///
/// Errors: [`Error::TornWrites`] for `Atomic` where the file takes no
/// atomic write of a page, for `DoubleWrite` (or `Auto` there) without an
/// area.
pub(crate) fn resolve_torn(
    backend: &dyn StorageBackend,
    config: &Config,
    has_area: bool,
) -> Result<(TornWrites, Option<String>)> {
    let mode = config.torn_writes;
    let refuse = |why: String| Error::TornWrites {
        mode: mode.name(),
        why,
    };
    let no_area = || {
        refuse(
            "no doublewrite area: open the file by path, or give one with PagedCachedFile::with_doublewrite"
                .into(),
        )
    };
    match mode {
        TornWrites::Allow => Ok((TornWrites::Allow, None)),
        TornWrites::Atomic => atomic_fit(backend, config)
            .map(|()| (TornWrites::Atomic, None))
            .map_err(refuse),
        TornWrites::DoubleWrite if has_area => Ok((TornWrites::DoubleWrite, None)),
        TornWrites::DoubleWrite => Err(no_area()),
        TornWrites::Auto => match auto_atomic(backend, config) {
            Ok(()) => Ok((TornWrites::Atomic, None)),
            Err(why) if has_area => Ok((TornWrites::DoubleWrite, Some(why))),
            Err(_) => Err(no_area()),
        },
    }
}

/// The doublewrite area's path for a file at `path`: `<path>.dblwr`.
pub(crate) fn area_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".dblwr");
    p.into()
}

/// Opens the doublewrite area beside `path` if `config.torn_writes` may
/// need one (`DoubleWrite`, or `Auto` without atomic writes): buffered,
/// created if missing (read-only: a missing one is empty), not locked.
/// Errors: `Error::Io` with op "open doublewrite area".
pub(crate) fn open_area(
    path: &std::path::Path,
    backend: &dyn StorageBackend,
    options: &OpenOptions,
    config: &Config,
) -> Result<Option<Arc<dyn StorageBackend>>> {
    let needed = match config.torn_writes {
        TornWrites::DoubleWrite => true,
        TornWrites::Auto => auto_atomic(backend, config).is_err(),
        _ => false,
    };
    if !needed {
        return Ok(None);
    }
    let area_path = area_path(path);
    let read_only = options.is_read_only();
    let opts = OpenOptions::new()
        .lock(false)
        .read_only(read_only)
        .create(!read_only);
    match FileBackend::open_with(&area_path, &opts, false) {
        Ok(b) => Ok(Some(Arc::new(b))),
        Err(e) if read_only && e.kind() == std::io::ErrorKind::NotFound => {
            Ok(Some(Arc::new(crate::backend::MemoryBackend::new())))
        }
        Err(e) => Err(Error::open("open doublewrite area", &area_path, e)),
    }
}

/// With [`TornWrites::DoubleWrite`] in force: runs the recovery pass over
/// `backend` from `area` and makes the area the file's (an empty report
/// and no area otherwise).
///
/// Errors: the recovery's (`Error::Io`, op "doublewrite recovery: ...").
pub(crate) fn recover_area(
    backend: &dyn StorageBackend,
    area: Option<Arc<dyn StorageBackend>>,
    torn_writes: TornWrites,
    config: &Config,
    read_only: bool,
) -> Result<(Option<Area>, Recovery)> {
    match (torn_writes, area) {
        (TornWrites::DoubleWrite, Some(area)) => {
            let (report, next_seq) = doublewrite::recover(
                backend,
                &*area,
                config.page_size,
                config.page_align(),
                read_only,
            )?;
            let ident = file_identity(backend);
            let a = Area::new(area, config.page_size, ident, next_seq);
            Ok((Some(a), report))
        }
        _ => Ok((None, Recovery::default())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;
    use crate::buffer::AlignedBuf;
    use crate::format::doublewrite::{ENTRY, HEADER};

    fn page(byte: u8) -> PageRef {
        let mut b = AlignedBuf::zeroed(512, 512).expect("alloc");
        b.fill(byte);
        Arc::new(b)
    }

    /// The area starts over only when every page of its records is
    /// durable in place and whole: a page whose in-place write failed
    /// (perhaps torn) keeps its record until a later write replaces it,
    /// even across an `fdatasync` and batches without that page.
    #[test]
    fn a_failed_in_place_write_keeps_the_area_until_the_page_is_written_whole() {
        let area = Area::new(Arc::new(MemoryBackend::new()), 512, (1, 2), 1);
        let c = Counters::default();
        let tail = |a: &Area| a.state.lock().tail;
        let all_failed = [Range { start: 0, end: 1 }];
        let one = (HEADER + ENTRY + 512) as u64;
        let p0 = [(0u64, page(1))];
        area.stage(&p0, 512, 0, &c).unwrap();
        area.written(Some(1), &p0, &all_failed);
        area.data_synced(1);
        let p1 = [(512u64, page(2))];
        area.stage(&p1, 1024, 0, &c).unwrap();
        assert_eq!(tail(&area), 2 * one, "page 0's record was dropped");
        area.written(Some(2), &p1, &[]);
        area.data_synced(2);
        let p0 = [(0u64, page(3))];
        area.stage(&p0, 1024, 0, &c).unwrap();
        assert_eq!(tail(&area), 3 * one);
        area.written(Some(3), &p0, &[]);
        area.data_synced(3);
        // Page 0 is written whole and synced: the area starts over.
        area.stage(&p1, 1024, 0, &c).unwrap();
        assert_eq!(tail(&area), one);
        area.written(Some(4), &p1, &[]);
        // A discarded page no longer holds the area.
        area.stage(&p0, 1024, 0, &c).unwrap();
        area.written(Some(5), &p0, &all_failed);
        area.forget_failed(0, 512);
        area.data_synced(5);
        area.stage(&p1, 1024, 0, &c).unwrap();
        assert_eq!(tail(&area), one);
    }
}
