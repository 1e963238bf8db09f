//! Torn-page protection ([`TornWrites`]): which protection a file has
//! ([`TornProtection`]: atomic writes where the file offers them, else the
//! doublewrite area), decided at open ([`resolve_torn`]); the doublewrite
//! area itself ([`Area`]) and the recovery pass that repairs pages from it
//! at open ([`recover`]).
//!
//! Owns: the atomic piece size, the area (its own lock, a leaf: nothing is
//! taken under it, and its records are staged one at a time with it held)
//! and the recovery report; all fixed at open. Calls: the area's backend.
//! The flush pipeline stages records and writes atomic pieces; commits
//! hand the area the durable watermark.
//!
//! # How it works
//!
//! A power cut during a page write can leave the page half old, half new:
//! the device promises whole sectors, not whole pages. InnoDB's answer
//! (`buf0dblwr.cc`) is to write every page first to a doublewrite buffer,
//! make that durable, and only then write the pages in place; after a
//! crash, a page torn in place is whole in the buffer. Here the buffer is
//! a sidecar file, and each flush writes its pages there as one record
//! with one sequential write (header, page table with a CRC32C per page,
//! the page images back to back), then `fdatasync`s it:
//!
//! ```text
//! record: magic "PWDBLWR2" | seq u64 | id u64 | ino u64 | page_size u32
//!         | count u32 | header crc32c u32 | 0u32 | file length u64 (56 bytes)
//!         | count x (page offset u64 | page crc32c u32 | 0u32)
//!         | count x page image
//! ```
//!
//! Records are appended; `seq` counts up by one from record to record. The
//! area goes back to offset 0 (a new record overwrites the old ones) only
//! when no staged flush is still writing in place and an `fdatasync` of
//! the data file covered every in-place write of the records: then no page
//! depends on the area. Older records left behind the new ones have a
//! lower `seq`, so recovery, which reads records from 0 while each is
//! whole and its `seq` is the last one's plus one, never reaches them.
//!
//! A commit whose pages are all in durable records needs no `fdatasync` of
//! the file: the area holds them, so a commit's pass skips it when every
//! change to the file since the last `fdatasync` was a staged batch (or
//! the length its record carries). The file is synced when the area grows
//! past [`CHECKPOINT_BYTES`] (then the area starts over), at `close`, and
//! before a cut. A commit costs one sequential write and one `fdatasync`
//! of the area, besides the writes in place.
//!
//! Recovery replays every whole record in order (the newest version of a
//! page wins), writing a page in place where the file holds different
//! bytes (torn, or never written), then syncs the file and empties the
//! area. A record with a bad checksum (the tail a crash cut short: its
//! pages never went in place, since in-place writes start only after the
//! record is durable) ends the scan with a warning; an area of another
//! file (device and inode differ) is reported and not applied. An area of this file holding records of another page size
//! refuses the open instead (nothing is changed): skipping its records and
//! emptying the area would throw away the copies of pages a crash may have
//! torn; the open with the page size the records were written with repairs
//! them.

use std::collections::BTreeSet;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::sync::Arc;

use super::config::{Config, Counters, TornWrites, add};
use super::write_buffer::PageRef;
use crate::backend::{FileBackend, OpenOptions, StorageBackend};
use crate::buffer::AlignedBuf;
use crate::error::{Error, Result};
use crate::sync::Mutex;

/// What the doublewrite recovery pass at open found and did
/// ([`PagedCachedFile::recovery`](crate::PagedCachedFile::recovery)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Whole records read from the area.
    pub records: usize,
    /// Page images in them (a page staged by several records counts once
    /// per record).
    pub pages: usize,
    /// Byte offsets of the pages written back in place because the file
    /// held other bytes (a page torn or never written by a crash), sorted.
    pub repaired: Vec<u64>,
    /// Byte offsets of pages that differ from the area but were not
    /// written back (a read-only open repairs nothing), sorted.
    pub unrepaired: Vec<u64>,
    /// What was skipped and why: a record cut short by the crash (bad
    /// checksum, truncated), an area of another file or page size.
    pub warnings: Vec<String>,
    /// The file's length was set to the newest record's (grown by a
    /// commit acknowledged on the area alone) with no page to repair.
    pub resized: bool,
}

const MAGIC: &[u8; 8] = b"PWDBLWR2";
const HEADER: usize = 56;
const ENTRY: usize = 16;

/// Identifies the data file an area belongs to: its birth time (ns) and
/// inode number (volume serial and file index on Windows), which survive
/// a remount and a reboot (the device number does not: another loop
/// device, a btrfs subvolume's anonymous device, disks found in another
/// order); `(0, 0)` for a backend without a file.
pub(crate) fn file_identity(backend: &dyn StorageBackend) -> (u64, u64) {
    backend
        .file()
        .and_then(|f| crate::backend::file_identity(f).ok())
        .unwrap_or((0, 0))
}

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
    /// was staged and that no later in-place write has replaced: possibly
    /// torn on disk, so the area keeps its records until they are written
    /// whole (or discarded, which leaves their bytes unspecified).
    failed: BTreeSet<u64>,
    /// The header and page table of the record being written (reused).
    head: Vec<u8>,
}

/// Area bytes past which a flush first makes the pages written in place
/// durable (an `fdatasync` of the file), so the area starts over and its
/// next records overwrite blocks already allocated (an `fdatasync` of a
/// growing area also commits its new size and blocks).
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

    /// Writes `entries` (sorted `(offset, page)`) as one record and makes
    /// it durable. On success the caller writes the pages in place and then
    /// calls [`written`](Self::written) once. Records are staged one at a
    /// time (the lock is held through the write and its `fdatasync`).
    ///
    /// Errors: the area's write or `fdatasync` error; nothing was staged
    /// (the next record is written at the same place).
    ///
    /// `file_len` is the file's logical length, which recovery restores
    /// (a commit acknowledged on the area alone may have grown the file).
    /// `synced`: the durable watermark now (`Durability::fsynced`): the
    /// data file is durable in place up to there.
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
        head.clear();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&seq.to_le_bytes());
        head.extend_from_slice(&self.ident.0.to_le_bytes());
        head.extend_from_slice(&self.ident.1.to_le_bytes());
        head.extend_from_slice(&(self.page_size as u32).to_le_bytes());
        head.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        head.extend_from_slice(&[0u8; 8]);
        head.extend_from_slice(&file_len.to_le_bytes());
        for (offset, page) in entries {
            head.extend_from_slice(&offset.to_le_bytes());
            head.extend_from_slice(&crc32c::crc32c(page).to_le_bytes());
            head.extend_from_slice(&[0u8; 4]);
        }
        let crc = crc32c::crc32c(&head);
        head[40..44].copy_from_slice(&crc.to_le_bytes());
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

    /// Pages in `[start, end)` were discarded: their bytes are unspecified
    /// until written again, so a failed write of theirs no longer holds
    /// the area.
    pub(crate) fn forget_failed(&self, start: u64, end: u64) {
        let mut st = self.state.lock();
        if !st.failed.is_empty() {
            let gone: Vec<u64> = st.failed.range(start..end).copied().collect();
            for o in gone {
                st.failed.remove(&o);
            }
        }
    }

    /// An `fdatasync` of the data file covered `write_seq` up to `covered`
    /// (the watermark, which [`stage`](Self::stage) and
    /// [`wants_checkpoint`](Self::wants_checkpoint) are also handed).
    #[cfg(test)]
    pub(crate) fn data_synced(&self, covered: u64) {
        let mut st = self.state.lock();
        st.synced = st.synced.max(covered);
    }

    /// Whether the area has grown past `limit` bytes with records whose
    /// pages may not be durable in place: the next flush should `fdatasync`
    /// the file first ([`CHECKPOINT_BYTES`]).
    /// `synced`: the durable watermark now.
    pub(crate) fn wants_checkpoint(&self, limit: u64, synced: u64) -> bool {
        let mut st = self.state.lock();
        st.synced = st.synced.max(synced);
        st.tail >= limit && st.synced < st.last_written
    }

    /// Empties the area (after the data file was synced with nothing in
    /// flight: `set_len` cutting the file, a successful `close`), so no
    /// record can bring back a page past a cut.
    pub(crate) fn clear(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        self.backend.set_len(0)?;
        self.backend.sync_data()?;
        st.tail = 0;
        Ok(())
    }
}

/// The area holds records of this page size (bytes), not the one the file
/// is opened with.
#[derive(Debug)]
struct OtherPageSize(usize);

impl std::fmt::Display for OtherPageSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "records of {} B pages", self.0)
    }
}

impl std::error::Error for OtherPageSize {}

/// One whole record read back.
struct Record {
    seq: u64,
    /// The file's logical length when it was staged.
    file_len: u64,
    pages: Vec<(u64, Vec<u8>)>,
}

/// Reads the records of `area` from offset 0 (see the module docs).
/// Returns them and the warnings.
///
/// Errors: the area's reads; [`OtherPageSize`] (as the error's inner
/// error) for records of this file written with another page size.
fn read_records(
    area: &dyn StorageBackend,
    page_size: usize,
    ident: (u64, u64),
) -> io::Result<(Vec<Record>, Vec<String>)> {
    let len = area.len()?;
    let mut records: Vec<Record> = Vec::new();
    let mut warnings = Vec::new();
    let mut at = 0u64;
    while at < len {
        let n = records.len();
        if len - at < HEADER as u64 {
            warnings.push(format!(
                "record {n} at {at}: truncated ({} B left, a header is {HEADER} B); skipped",
                len - at
            ));
            break;
        }
        let mut head = vec![0u8; HEADER];
        area.read_exact_at(at, &mut head)?;
        let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
        if &head[..8] != MAGIC {
            if n == 0 {
                warnings.push("not a doublewrite area (bad magic at 0); not applied".into());
            }
            // Past the first record: bytes of an older cycle or a record
            // whose write never landed.
            break;
        }
        let seq = u64_at(&head, 8);
        if records.last().is_some_and(|r| seq != r.seq + 1) {
            // An older record left behind newer ones.
            break;
        }
        let (id, ino) = (u64_at(&head, 16), u64_at(&head, 24));
        let (ps, count) = (u32_at(&head, 32) as usize, u32_at(&head, 36) as usize);
        let table_len = count as u64 * ENTRY as u64;
        let body = table_len + count as u64 * ps as u64;
        if len - at - (HEADER as u64) < body {
            warnings.push(format!(
                "record {n} (seq {seq}) at {at}: truncated; skipped with every record after it"
            ));
            break;
        }
        let mut table = vec![0u8; table_len as usize];
        area.read_exact_at(at + HEADER as u64, &mut table)?;
        let want = u32_at(&head, 40);
        head[40..44].fill(0);
        let mut crc = crc32c::crc32c(&head);
        crc = crc32c::crc32c_append(crc, &table);
        if crc != want {
            warnings.push(format!(
                "record {n} (seq {seq}) at {at}: bad header checksum; skipped with every record after it"
            ));
            break;
        }
        if (id, ino) != ident {
            warnings.push(format!(
                "the area belongs to another file (birth {id}, inode {ino}; this file: birth {}, inode {}); not applied",
                ident.0, ident.1
            ));
            return Ok((Vec::new(), warnings));
        }
        if ps != page_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                OtherPageSize(ps),
            ));
        }
        let mut pages = Vec::with_capacity(count);
        let mut data_at = at + HEADER as u64 + table_len;
        let mut whole = true;
        for e in table.chunks_exact(ENTRY) {
            let (offset, crc) = (u64_at(e, 0), u32_at(e, 8));
            let mut page = vec![0u8; ps];
            area.read_exact_at(data_at, &mut page)?;
            data_at += ps as u64;
            if crc32c::crc32c(&page) != crc || offset % ps as u64 != 0 {
                warnings.push(format!(
                    "record {n} (seq {seq}): page at {offset} has a bad checksum; record skipped with every record after it"
                ));
                whole = false;
                break;
            }
            pages.push((offset, page));
        }
        if !whole {
            break;
        }
        records.push(Record {
            seq,
            file_len: u64_at(&head, 48),
            pages,
        });
        at = data_at;
    }
    Ok((records, warnings))
}

/// The recovery pass at open: replays the area's whole records into
/// `backend` (unless `read_only`), syncs it, and empties the area. Returns
/// the report and the `seq` the next record takes.
///
/// Errors: reading the area or the file, or writing and syncing the
/// repaired pages (`Error::Io` with op "doublewrite recovery ..."); the
/// file was not changed past what the error names.
pub(crate) fn recover(
    backend: &dyn StorageBackend,
    area: &dyn StorageBackend,
    page_size: usize,
    page_align: usize,
    read_only: bool,
) -> Result<(Recovery, u64)> {
    let io = |op| move |e| Error::io(op, None, e);
    let ident = file_identity(backend);
    let (records, warnings) = match read_records(area, page_size, ident) {
        Ok(read) => read,
        Err(e) => {
            if let Some(OtherPageSize(ps)) = e.get_ref().and_then(|i| i.downcast_ref()) {
                return Err(Error::InvalidConfig(format!(
                    "page_size {page_size}: the doublewrite area beside this file holds records of \
                     {ps} B pages (pages a crash may have torn, not yet repaired); open it with \
                     page_size({ps}) once to repair them, then with any page size"
                )));
            }
            return Err(Error::io("doublewrite recovery: read area", None, e));
        }
    };
    let mut report = Recovery {
        records: records.len(),
        pages: records.iter().map(|r| r.pages.len()).sum(),
        warnings,
        ..Recovery::default()
    };
    let next_seq = records.last().map_or(0, |r| r.seq + 1);
    // The newest image of each page (records in order, later wins).
    let mut newest: std::collections::BTreeMap<u64, &[u8]> = Default::default();
    for r in &records {
        for (offset, page) in &r.pages {
            newest.insert(*offset, page);
        }
    }
    let mut buf = AlignedBuf::zeroed(page_size, page_align).ok_or(Error::NoMemory {
        bytes: page_size as u64,
    })?;
    let file_len = backend.len().map_err(io("doublewrite recovery: fstat"))?;
    for (&offset, &image) in &newest {
        let same = offset + page_size as u64 <= file_len
            && backend
                .read_exact_at(offset, &mut buf)
                .map(|()| buf[..] == *image)
                .map_err(|e| Error::io("doublewrite recovery: read page", Some(offset), e))?;
        if same {
            continue;
        }
        if read_only {
            report.unrepaired.push(offset);
            continue;
        }
        buf.copy_from_slice(image);
        backend
            .write_all_at(offset, &buf)
            .map_err(|e| Error::io("doublewrite recovery: write page", Some(offset), e))?;
        report.repaired.push(offset);
    }
    // The longest length a record saw (records are staged in the order
    // their writes go out, not the order their lengths were read): a
    // commit acknowledged on the area alone may have grown the file, never
    // shrunk it (a cut empties the area). Each record's length covers its
    // pages; replayed pages past an unaligned length are cut back to it.
    if let Some(want) = records.iter().map(|r| r.file_len).max()
        && !read_only
    {
        let now = backend.len().map_err(io("doublewrite recovery: fstat"))?;
        let len = want.max(file_len);
        if now != len {
            backend
                .set_len(len)
                .map_err(io("doublewrite recovery: ftruncate"))?;
            report.repaired.sort_unstable();
            if report.repaired.is_empty() {
                // Only the length changed: it must be made durable too.
                report.resized = true;
            }
        }
    }
    if !report.unrepaired.is_empty() {
        report.warnings.push(format!(
            "{} pages differ from the doublewrite area and were not repaired (read-only open); open read-write to repair them",
            report.unrepaired.len()
        ));
    }
    if !read_only && (!records.is_empty() || area.len().unwrap_or(0) > 0) {
        if !report.repaired.is_empty() || report.resized {
            backend
                .sync_data()
                .map_err(io("doublewrite recovery: fdatasync"))?;
        }
        area.set_len(0)
            .and_then(|()| area.sync_data())
            .map_err(io("doublewrite recovery: empty area"))?;
    }
    Ok((report, next_seq))
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
/// need one (`DoubleWrite`, or `Auto` where `backend` has no atomic
/// writes): buffered, created if missing, not locked (the data file's lock
/// covers it). A read-only open reads an existing area and writes none
/// (a missing one is an empty area).
///
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
            let (report, next_seq) = recover(
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
