//! The doublewrite area's records ([`TornWrites::DoubleWrite`](crate::TornWrites::DoubleWrite)):
//! their layout, and the recovery pass that replays them into the file at
//! open ([`recover`]).
//!
//! Each flush of a file with a doublewrite area writes its pages to the
//! area as one record, with one sequential write, and makes it durable
//! before any of them is written in place:
//!
//! ```text
//! record: magic "PWDBLWR2" | seq u64 | id u64 | ino u64 | page_size u32
//!         | count u32 | header crc32c u32 | 0u32 | file length u64 (56 bytes)
//!         | count x (page offset u64 | page crc32c u32 | 0u32)
//!         | count x page image
//! ```
//!
//! Records are appended, `seq` one up from record to record; an area that
//! starts over at offset 0 leaves older records behind the new ones with
//! a lower `seq`, which a scan from 0 never reaches.
//!
//! Recovery replays every whole record in order (the newest version of a
//! page wins), writing a page in place where the file holds different
//! bytes (torn, or never written), then syncs the file and empties the
//! area. A record with a bad checksum (the tail a crash cut short: its
//! pages never went in place, since in-place writes start only after the
//! record is durable) ends the scan with a warning; an area of another
//! file (birth time and inode differ) is reported and not applied. An area
//! of this file holding records of another page size refuses the open,
//! changing nothing (the open with that page size repairs them).

use std::io;

use crate::backend::StorageBackend;
use crate::buffer::AlignedBuf;
use crate::error::{Error, Result};

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
pub(crate) const HEADER: usize = 56;
pub(crate) const ENTRY: usize = 16;

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

/// Writes the header and page table of a record into `head` (cleared
/// first): record `seq` of the file `ident` ([`file_identity`]), `pages`
/// (offset, image) of `page_size` bytes, the file's logical length
/// `file_len`. The page images follow it in the area, in the same order.
pub(crate) fn encode_head<'a>(
    head: &mut Vec<u8>,
    seq: u64,
    ident: (u64, u64),
    page_size: usize,
    file_len: u64,
    pages: impl ExactSizeIterator<Item = (u64, &'a [u8])>,
) {
    head.clear();
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&seq.to_le_bytes());
    head.extend_from_slice(&ident.0.to_le_bytes());
    head.extend_from_slice(&ident.1.to_le_bytes());
    head.extend_from_slice(&(page_size as u32).to_le_bytes());
    head.extend_from_slice(&(pages.len() as u32).to_le_bytes());
    head.extend_from_slice(&[0u8; 8]);
    head.extend_from_slice(&file_len.to_le_bytes());
    for (offset, page) in pages {
        head.extend_from_slice(&offset.to_le_bytes());
        head.extend_from_slice(&crc32c::crc32c(page).to_le_bytes());
        head.extend_from_slice(&[0u8; 4]);
    }
    let crc = crc32c::crc32c(head);
    head[40..44].copy_from_slice(&crc.to_le_bytes());
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
