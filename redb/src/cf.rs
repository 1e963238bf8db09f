//! Column families: many redb databases in one pagewriter file, each
//! writer committing its own pages.
//!
//! A [`ColumnFamily`] is a region of one [`PagedCachedFile`] made of
//! extents (ranges of the file) and implements [`redb::StorageBackend`]
//! over them, with a [`Writer`] of its own: its `sync_data` is a scoped
//! commit of the pages it wrote, which never drains another column
//! family's pages and shares `fdatasync`s with the commits that overlap it.
//!
//! Layout of the file:
//!
//! ```text
//! 0        directory slot 0 (256 KiB)
//! 256 KiB  directory slot 1 (256 KiB)
//! 1 MiB    extents, in 1 MiB units, appended at the end as families grow
//!
//! slot: magic "PWCFDIR1" | generation u64 | body bytes u32 | body crc32c u32
//!       | body
//! body: families u32 | per family: name bytes u16 | name | length u64
//!       | extents u32 | extents x (offset u64 | bytes u64)
//!       | free extents u32 | free x (offset u64 | bytes u64) | end u64
//! ```
//!
//! The directory changes by writing its next generation into the slot the
//! newest one is not in and committing it; an open takes the valid slot of
//! the higher generation, so a crash leaves the old directory or the new
//! one, never a mix (redb's two commit slots and LMDB's two meta pages
//! make the same choice). One directory change commits at a time, so the
//! slot being overwritten never holds the only valid directory.
//!
//! A family's length in the directory is the length its last commit made
//! durable; its extents are written as soon as another commit writes the
//! directory (an extent allocated and not yet committed is owned, not
//! leaked, after a crash). Space a deleted family held goes to the free
//! list and is zeroed, durably, before a family that grows gets it; new
//! space at the end is written with zeros (up to [`MAX_ZEROED_EXTENT`])
//! so that the families' writes overwrite allocated blocks.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

// The directory's and the handles' locks: std's, or with the `shuttle`
// feature shuttle's, so `tests/shuttle_cf.rs` can model check directory
// changes racing each other on the real code.
#[cfg(feature = "shuttle")]
use shuttle::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
#[cfg(not(feature = "shuttle"))]
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

use pagewriter::{Config, PagedCachedFile, Writer};

use crate::PagewriterBackend;

/// Magic bytes opening a directory slot.
pub(crate) const MAGIC: &[u8; 8] = b"PWCFDIR1";
/// Bytes of one directory slot: 256 KiB.
pub const SLOT_BYTES: u64 = 256 << 10;
/// Where the first extent may start: 1 MiB.
pub const DATA_START: u64 = 1 << 20;
/// Extents are whole multiples of this: 1 MiB.
pub const EXTENT_UNIT: u64 = 1 << 20;
/// A growing family's next extent is at least its capacity so far (so a
/// family of N bytes has about log2(N / 1 MiB) extents), at most this:
/// 1 GiB.
pub const MAX_EXTENT_STEP: u64 = 1 << 30;
/// A new extent appended at the file's end up to this size (8 MiB) is
/// written with zeros before use (`StorageBackend::write_zeroes`:
/// `FALLOC_FL_WRITE_ZEROES` where the kernel and device do it); larger
/// ones stay holes.
pub const MAX_ZEROED_EXTENT: u64 = 8 << 20;
/// Longest name of a column family in bytes: 255.
pub const MAX_NAME_BYTES: usize = 255;
/// Bytes of a slot's header (magic, generation, body length, crc).
const HEADER_BYTES: usize = 24;

/// Errors of the column families.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A name that is empty, longer than [`MAX_NAME_BYTES`] or holds a NUL.
    InvalidName {
        /// The name asked for (lossy where it was not UTF-8).
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The column family has a live [`ColumnFamily`] handle that excludes
    /// the one asked for: a writable handle excludes every other handle,
    /// read-only handles exclude a writable one (not each other), and any
    /// handle excludes a `delete`. Refused until it is dropped; nothing
    /// was changed.
    InUse {
        /// The column family.
        name: String,
    },
    /// `delete` or a read-only handle of a name the directory does not
    /// hold.
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// The file at `path` is not a column-family file (a plain redb file,
    /// say); nothing was written.
    NotColumnFamilies {
        /// The file's path.
        path: PathBuf,
    },
    /// Neither directory slot of the file at `path` holds a valid directory
    /// (a checksum that fails, a body that does not parse); nothing was
    /// written.
    BadDirectory {
        /// The file's path.
        path: PathBuf,
        /// What failed.
        why: String,
    },
    /// The directory would exceed its slot ([`SLOT_BYTES`]): too many
    /// families or extents. Nothing was changed.
    DirectoryFull {
        /// Bytes the directory would take.
        bytes: usize,
    },
    /// An error of the page writer underneath (I/O, a full disk, a poisoned
    /// file after a failed `fdatasync`, ...).
    Pagewriter(pagewriter::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::InvalidName { name, why } => write!(f, "column family name {name:?}: {why}"),
            Error::InUse { name } => write!(f, "column family {name:?} has a live handle"),
            Error::NotFound { name } => write!(f, "no column family {name:?}"),
            Error::NotColumnFamilies { path } => {
                write!(f, "{}: not a column-family file", path.display())
            }
            Error::BadDirectory { path, why } => {
                write!(
                    f,
                    "{}: no valid column-family directory: {why}",
                    path.display()
                )
            }
            Error::DirectoryFull { bytes } => write!(
                f,
                "the column-family directory would take {bytes} bytes, over its {SLOT_BYTES}"
            ),
            Error::Pagewriter(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Pagewriter(e) => Some(e),
            _ => None,
        }
    }
}

impl From<pagewriter::Error> for Error {
    fn from(e: pagewriter::Error) -> Self {
        Error::Pagewriter(e)
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Pagewriter(e) => io::Error::from(e),
            Error::DirectoryFull { .. } => io::Error::new(io::ErrorKind::StorageFull, e),
            e => io::Error::other(e),
        }
    }
}

/// Result of the column families.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A range of the file: `bytes` bytes at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Extent {
    offset: u64,
    bytes: u64,
}

/// A family as the directory records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entry {
    /// The length its last commit made durable.
    len: u64,
    /// Its extents, in logical order.
    extents: Vec<Extent>,
}

/// The directory: families, free space, the end of allocated space.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Directory {
    generation: u64,
    families: BTreeMap<String, Entry>,
    free: Vec<Extent>,
    end: u64,
}

impl Directory {
    fn new() -> Self {
        Directory {
            generation: 0,
            families: BTreeMap::new(),
            free: Vec::new(),
            end: DATA_START,
        }
    }

    /// The body's bytes (see the module docs).
    fn encode(&self) -> Vec<u8> {
        fn extents(out: &mut Vec<u8>, list: &[Extent]) {
            out.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for e in list {
                out.extend_from_slice(&e.offset.to_le_bytes());
                out.extend_from_slice(&e.bytes.to_le_bytes());
            }
        }
        let mut out = Vec::new();
        out.extend_from_slice(&(self.families.len() as u32).to_le_bytes());
        for (name, entry) in &self.families {
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&entry.len.to_le_bytes());
            extents(&mut out, &entry.extents);
        }
        extents(&mut out, &self.free);
        out.extend_from_slice(&self.end.to_le_bytes());
        out
    }

    /// Parses a body; `None` if it does not parse or is inconsistent
    /// (an extent outside the data area or overlapping another).
    fn decode(generation: u64, body: &[u8]) -> Option<Self> {
        struct Cursor<'a>(&'a [u8]);
        impl Cursor<'_> {
            fn take(&mut self, n: usize) -> Option<&[u8]> {
                if self.0.len() < n {
                    return None;
                }
                let (a, b) = self.0.split_at(n);
                self.0 = b;
                Some(a)
            }
            fn u16(&mut self) -> Option<u16> {
                Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
            }
            fn u32(&mut self) -> Option<u32> {
                Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
            }
            fn u64(&mut self) -> Option<u64> {
                Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
            }
            fn extents(&mut self) -> Option<Vec<Extent>> {
                let n = self.u32()? as usize;
                (0..n)
                    .map(|_| {
                        Some(Extent {
                            offset: self.u64()?,
                            bytes: self.u64()?,
                        })
                    })
                    .collect()
            }
        }
        let mut c = Cursor(body);
        let mut families = BTreeMap::new();
        for _ in 0..c.u32()? {
            let n = c.u16()? as usize;
            let name = std::str::from_utf8(c.take(n)?).ok()?.to_string();
            check_name(&name).ok()?;
            let len = c.u64()?;
            let extents = c.extents()?;
            let capacity: u64 = extents.iter().map(|e| e.bytes).sum();
            if len > capacity || families.insert(name, Entry { len, extents }).is_some() {
                return None;
            }
        }
        let free = c.extents()?;
        let end = c.u64()?;
        if !c.0.is_empty() || end < DATA_START {
            return None;
        }
        let dir = Directory {
            generation,
            families,
            free,
            end,
        };
        let mut all: Vec<Extent> = dir.all_extents().collect();
        all.sort_by_key(|e| e.offset);
        let mut at = DATA_START;
        for e in all {
            if e.offset < at || e.bytes == 0 || e.offset.checked_add(e.bytes)? > end {
                return None;
            }
            at = e.offset + e.bytes;
        }
        Some(dir)
    }

    fn all_extents(&self) -> impl Iterator<Item = Extent> + '_ {
        self.families
            .values()
            .flat_map(|e| e.extents.iter().copied())
            .chain(self.free.iter().copied())
    }

    /// An extent of `bytes` (a multiple of [`EXTENT_UNIT`]): the first free
    /// one large enough (split; `true`: it held another family's data), else
    /// appended at the end.
    fn allocate(&mut self, bytes: u64) -> (Extent, bool) {
        if let Some(i) = self.free.iter().position(|e| e.bytes >= bytes) {
            let e = self.free[i];
            if e.bytes == bytes {
                self.free.remove(i);
            } else {
                self.free[i] = Extent {
                    offset: e.offset + bytes,
                    bytes: e.bytes - bytes,
                };
            }
            return (
                Extent {
                    offset: e.offset,
                    bytes,
                },
                true,
            );
        }
        let e = Extent {
            offset: self.end,
            bytes,
        };
        self.end += bytes;
        (e, false)
    }

    /// Gives `extents` back to the free list, merging neighbours.
    fn release(&mut self, extents: &[Extent]) {
        self.free.extend_from_slice(extents);
        self.free.sort_by_key(|e| e.offset);
        let mut merged: Vec<Extent> = Vec::with_capacity(self.free.len());
        for e in self.free.drain(..) {
            match merged.last_mut() {
                Some(last) if last.offset + last.bytes == e.offset => last.bytes += e.bytes,
                _ => merged.push(e),
            }
        }
        self.free = merged;
    }
}

/// Checks a family's name: not empty, at most [`MAX_NAME_BYTES`], no NUL.
fn check_name(name: &str) -> Result<()> {
    let why = if name.is_empty() {
        "empty"
    } else if name.len() > MAX_NAME_BYTES {
        "longer than 255 bytes"
    } else if name.contains('\0') {
        "holds a NUL byte"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        name: name.to_string(),
        why,
    })
}

/// What every handle of one file shares.
#[derive(Debug)]
struct Shared {
    file: Arc<PagedCachedFile>,
    /// The directory as it is now (families' lengths as last committed).
    /// Held across a directory write and its commit: one directory change
    /// commits at a time.
    dir: Mutex<Directory>,
    /// Names with a live [`ColumnFamily`], and which kind. Taken before
    /// `dir` where both are held (`delete`, `column_family_read_only`);
    /// a handle's writer lock (`Mine`) comes before both, and neither is
    /// held while taking it.
    live: Mutex<HashMap<String, Live>>,
}

/// The live handles of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Live {
    /// One writable handle.
    Writer,
    /// This many read-only handles (at least one).
    Readers(usize),
}

impl Shared {
    fn dir(&self) -> MutexGuard<'_, Directory> {
        self.dir.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn live(&self) -> MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `next` the directory, durably: writes it as the next
    /// generation into the slot the current one is not in, through
    /// `writer`, commits `writer` (its other pages with it), then installs
    /// it in `dir`. The guard is held across the commit, so one directory
    /// change commits at a time and the slot being overwritten never holds
    /// the only valid directory. Nothing is installed on an error.
    fn commit_directory(
        &self,
        dir: &mut MutexGuard<'_, Directory>,
        mut next: Directory,
        writer: &mut Writer<'_>,
    ) -> Result<()> {
        let body = next.encode();
        if HEADER_BYTES + body.len() > SLOT_BYTES as usize {
            return Err(Error::DirectoryFull {
                bytes: HEADER_BYTES + body.len(),
            });
        }
        let generation = dir.generation + 1;
        let mut slot = Vec::with_capacity(HEADER_BYTES + body.len());
        slot.extend_from_slice(MAGIC);
        slot.extend_from_slice(&generation.to_le_bytes());
        slot.extend_from_slice(&(body.len() as u32).to_le_bytes());
        slot.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        slot.extend_from_slice(&body);
        writer.write_all_at((generation % 2) * SLOT_BYTES, &slot)?;
        writer.commit()?;
        next.generation = generation;
        **dir = next;
        Ok(())
    }
}

/// Whether either directory slot of `file` opens with the magic: a
/// column-family file, which a plain backend must not open.
pub(crate) fn holds_directory(file: &PagedCachedFile) -> pagewriter::Result<bool> {
    for at in [0, SLOT_BYTES] {
        if at + MAGIC.len() as u64 <= file.len() {
            let mut m = [0u8; 8];
            file.read_exact_at(at, &mut m)?;
            if &m == MAGIC {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Reads both directory slots of `file` and returns the valid one of the
/// higher generation. `Ok(None)` for an empty file.
fn read_directory(file: &PagedCachedFile, path: &Path) -> Result<Option<Directory>> {
    if file.is_empty() {
        return Ok(None);
    }
    let mut found: Option<Directory> = None;
    let mut why = Vec::new();
    let mut magic_seen = false;
    for slot in 0..2u64 {
        let at = slot * SLOT_BYTES;
        let mut header = [0u8; HEADER_BYTES];
        if at + HEADER_BYTES as u64 > file.len() {
            why.push(format!("slot {slot}: past the end of the file"));
            continue;
        }
        file.read_exact_at(at, &mut header)?;
        if &header[..8] != MAGIC {
            why.push(format!("slot {slot}: no magic"));
            continue;
        }
        magic_seen = true;
        let generation = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes")) as u64;
        let crc = u32::from_le_bytes(header[20..24].try_into().expect("4 bytes"));
        let body_at = at + HEADER_BYTES as u64;
        if len > SLOT_BYTES - HEADER_BYTES as u64 || body_at + len > file.len() {
            why.push(format!("slot {slot}: a body of {len} bytes does not fit"));
            continue;
        }
        let mut body = vec![0u8; len as usize];
        file.read_exact_at(body_at, &mut body)?;
        if crc32c::crc32c(&body) != crc {
            why.push(format!("slot {slot}: checksum fails"));
            continue;
        }
        match Directory::decode(generation, &body) {
            Some(d) if found.as_ref().is_none_or(|f| f.generation < d.generation) => {
                found = Some(d)
            }
            Some(_) => {}
            None => why.push(format!("slot {slot}: the body does not parse")),
        }
    }
    match found {
        Some(d) => Ok(Some(d)),
        None if creation_cut_short(file)? => Ok(None),
        None if !magic_seen => Err(Error::NotColumnFamilies {
            path: path.to_path_buf(),
        }),
        None => Err(Error::BadDirectory {
            path: path.to_path_buf(),
            why: why.join("; "),
        }),
    }
}

/// Whether `file` is what a crash leaves of a creation that never
/// committed its first directory: that write (an empty directory, into
/// slot 1) is the first the file sees, so the file reaches past slot 0 by
/// at most the page it lands in, and holds zeros but for slot 1, which
/// opens with the magic or is zeros too. Such a file holds nothing else,
/// so it is created again. Any other file of zeros (a user's, of another
/// length) is not column families.
fn creation_cut_short(file: &PagedCachedFile) -> pagewriter::Result<bool> {
    let first = SLOT_BYTES + (HEADER_BYTES + Directory::new().encode().len()) as u64;
    let reach = first.next_multiple_of(file.page_size() as u64);
    if file.len() <= SLOT_BYTES || file.len() > reach {
        return Ok(false);
    }
    let mut bytes = vec![0u8; file.len() as usize];
    file.read_exact_at(0, &mut bytes)?;
    let (head, slot1) = bytes.split_at(SLOT_BYTES as usize);
    let zeros = |b: &[u8]| b.iter().all(|&x| x == 0);
    Ok(zeros(head) && (zeros(slot1) || slot1.starts_with(MAGIC)))
}

/// Many redb databases (column families) in one pagewriter file. `Send +
/// Sync` and cheap to clone (an `Arc`): share it between threads.
///
/// ```no_run
/// use pagewriter_redb::ColumnFamilies;
/// use redb::{Database, TableDefinition};
///
/// const T: TableDefinition<u64, u64> = TableDefinition::new("t");
/// let cfs = ColumnFamilies::open("many.pwcf")?;
/// let users = Database::builder().create_with_backend(cfs.column_family("users")?)?;
/// let txn = users.begin_write()?;
/// txn.open_table(T)?.insert(1, 2)?;
/// txn.commit()?; // durable: this family's pages, sharing fdatasyncs
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ColumnFamilies {
    shared: Arc<Shared>,
}

impl ColumnFamilies {
    /// Opens (creating if missing, never truncating) the column-family file
    /// at `path` with [`PagewriterBackend::default_config`]. A new file gets
    /// an empty directory, durably, before this returns.
    ///
    /// Errors: [`Error::NotColumnFamilies`] for a file that is not one (a
    /// plain redb file), [`Error::BadDirectory`] where no slot holds a valid
    /// directory (nothing written either way); the page writer's errors
    /// (the file's lock is held by another open: `Locked`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, PagewriterBackend::default_config())
    }

    /// [`open`](Self::open) with `config` for the page writer underneath.
    ///
    /// Errors: as [`open`](Self::open).
    pub fn open_with(path: impl AsRef<Path>, config: Config) -> Result<Self> {
        let path = path.as_ref();
        let file = PagedCachedFile::open(path, config)?;
        Self::new(file, path)
    }

    /// Column families on an opened file (any backend: a memory or crash
    /// backend in tests); `path` names it in errors.
    ///
    /// Errors: as [`open`](Self::open).
    pub fn new(file: PagedCachedFile, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let found = read_directory(&file, &path)?;
        let file = Arc::new(file);
        let fresh = found.is_none();
        let mut dir = found.unwrap_or_else(Directory::new);
        // Space past the directory's end was allocated by a change a crash
        // lost: free, and zeroed before reuse like any free space.
        let tail = file.len().next_multiple_of(EXTENT_UNIT).max(dir.end);
        if tail > dir.end {
            dir.release(&[Extent {
                offset: dir.end,
                bytes: tail - dir.end,
            }]);
            dir.end = tail;
        }
        let end = dir.end;
        let shared = Arc::new(Shared {
            file,
            dir: Mutex::new(dir),
            live: Mutex::new(HashMap::new()),
        });
        if fresh {
            // The directory is the first write a new file sees (what
            // `creation_cut_short` knows a crash to leave).
            let mut dir = shared.dir();
            let next = dir.clone();
            let mut w = Writer::shared(Arc::clone(&shared.file));
            shared.commit_directory(&mut dir, next, &mut w)?;
        }
        // A crash may keep a directory whose extents reach past the file's
        // durable length: the file is extended (zeros) to cover them.
        if shared.file.len() < end {
            shared.file.set_len(end)?;
        }
        Ok(ColumnFamilies { shared })
    }

    /// The column family `name`, created (empty, durably) if missing. The
    /// handle keeps the file open on its own: it may outlive this value.
    ///
    /// Errors: [`Error::InvalidName`]; [`Error::InUse`] while another handle
    /// on `name` lives (a read-only one included); [`Error::DirectoryFull`];
    /// the page writer's errors (nothing created then).
    pub fn column_family(&self, name: &str) -> Result<ColumnFamily> {
        check_name(name)?;
        let s = &self.shared;
        {
            let mut live = s.live();
            if live.contains_key(name) {
                return Err(Error::InUse {
                    name: name.to_string(),
                });
            }
            live.insert(name.to_string(), Live::Writer);
        }
        let opened = self.open_family(name);
        if opened.is_err() {
            s.live().remove(name);
        }
        opened
    }

    /// A read-only handle on the existing column family `name`, for
    /// `redb::Builder::open_read_only_with_backend`: it has the length the
    /// family's last commit left (and reads the page writer's bytes, as
    /// every handle does), and refuses `write_at` and `set_len`
    /// (`PermissionDenied`); its `sync` has nothing to commit. Several
    /// read-only handles on one family may live at once; none while a
    /// writable one does. Nothing is created or written.
    ///
    /// Errors: [`Error::InvalidName`]; [`Error::NotFound`] where the
    /// directory does not hold `name`; [`Error::InUse`] while a writable
    /// handle on it lives.
    pub fn column_family_read_only(&self, name: &str) -> Result<ColumnFamily> {
        check_name(name)?;
        let s = &self.shared;
        let mut live = s.live();
        let readers = match live.get(name) {
            Some(Live::Writer) => {
                return Err(Error::InUse {
                    name: name.to_string(),
                });
            }
            Some(Live::Readers(n)) => *n,
            None => 0,
        };
        let Some(entry) = s.dir().families.get(name).cloned() else {
            return Err(Error::NotFound {
                name: name.to_string(),
            });
        };
        live.insert(name.to_string(), Live::Readers(readers + 1));
        Ok(self.handle(name, entry, true))
    }

    fn open_family(&self, name: &str) -> Result<ColumnFamily> {
        let s = &self.shared;
        let mut dir = s.dir();
        let entry = match dir.families.get(name) {
            Some(e) => e.clone(),
            None => {
                let mut next = dir.clone();
                next.families.insert(name.to_string(), Entry::default());
                let mut w = Writer::shared(Arc::clone(&s.file));
                s.commit_directory(&mut dir, next, &mut w)?;
                Entry::default()
            }
        };
        drop(dir);
        Ok(self.handle(name, entry, false))
    }

    /// A handle on `name`, whose directory entry is `entry`.
    fn handle(&self, name: &str, entry: Entry, read_only: bool) -> ColumnFamily {
        let s = &self.shared;
        let capacity = entry.extents.iter().map(|e| e.bytes).sum();
        ColumnFamily {
            shared: Arc::clone(s),
            name: name.to_string(),
            read_only,
            geometry: RwLock::new(Geometry {
                len: entry.len,
                extents: entry.extents,
            }),
            closed: AtomicBool::new(false),
            writer: Mutex::new(Mine {
                writer: Writer::shared(Arc::clone(&s.file)),
                committed_len: entry.len,
                extents_changed: false,
                // Bytes past the length a commit left may hold what a crash
                // kept of later writes.
                dirty_end: capacity,
            }),
        }
    }

    /// The names of the column families, sorted.
    pub fn names(&self) -> Vec<String> {
        self.shared.dir().families.keys().cloned().collect()
    }

    /// Deletes the column family `name`, durably; its space is reused by
    /// families that grow.
    ///
    /// Errors: [`Error::InvalidName`]; [`Error::NotFound`]; [`Error::InUse`]
    /// while a handle on it lives; the page writer's errors (then the
    /// family may or may not be deleted after a crash, and is still listed
    /// until a later delete succeeds).
    pub fn delete(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let s = &self.shared;
        let live = s.live();
        if live.contains_key(name) {
            return Err(Error::InUse {
                name: name.to_string(),
            });
        }
        let mut dir = s.dir();
        let mut next = dir.clone();
        let Some(entry) = next.families.remove(name) else {
            return Err(Error::NotFound {
                name: name.to_string(),
            });
        };
        next.release(&entry.extents);
        let mut w = Writer::shared(Arc::clone(&s.file));
        s.commit_directory(&mut dir, next, &mut w)
    }

    /// The page writer underneath (for its stats).
    pub fn file(&self) -> &PagedCachedFile {
        &self.shared.file
    }

    /// Bytes of the file's data area: the end of the last extent.
    pub fn allocated_bytes(&self) -> u64 {
        self.shared.dir().end
    }
}

/// Where a family's bytes are.
#[derive(Debug)]
struct Geometry {
    /// Its length now (bytes).
    len: u64,
    /// Its extents, in logical order.
    extents: Vec<Extent>,
}

impl Geometry {
    fn capacity(&self) -> u64 {
        self.extents.iter().map(|e| e.bytes).sum()
    }

    /// The file ranges holding logical bytes `range` (inside the
    /// capacity), in order, each with its logical start.
    fn map(&self, range: Range<u64>) -> Vec<(u64, Range<u64>)> {
        let mut out = Vec::new();
        let mut logical = 0u64;
        for e in &self.extents {
            let (lo, hi) = (logical, logical + e.bytes);
            let a = range.start.max(lo);
            let b = range.end.min(hi);
            if a < b {
                out.push((a, e.offset + (a - lo)..e.offset + (b - lo)));
            }
            logical = hi;
            if logical >= range.end {
                break;
            }
        }
        out
    }
}

/// What only the family's writing side touches.
#[derive(Debug)]
struct Mine {
    writer: Writer<'static>,
    /// The length the directory records for this family.
    committed_len: u64,
    /// Extents were added since the directory last recorded them.
    extents_changed: bool,
    /// Bytes of the capacity at or past the length and below this may be
    /// non-zero (written before a shrink, or kept by a crash); growing
    /// zeroes them first.
    dirty_end: u64,
}

/// One column family: a region of the shared file, a
/// [`redb::StorageBackend`] (`redb::Database::builder().create_with_backend`)
/// whose `sync_data` commits its own pages. Holds the file open: it may
/// outlive the [`ColumnFamilies`] it came from. Dropping it (or
/// [`close`](Self::close)) frees the name for a new handle; pages it wrote
/// and did not commit stay buffered.
///
/// Offsets are bounds-checked against the family's own length: a read past
/// it is `UnexpectedEof`, a write past it grows the family first, and no
/// offset reaches another family's space. A read-only handle
/// ([`ColumnFamilies::column_family_read_only`]) refuses writes and
/// `set_len` with `PermissionDenied`.
#[derive(Debug)]
pub struct ColumnFamily {
    shared: Arc<Shared>,
    name: String,
    /// From [`ColumnFamilies::column_family_read_only`].
    read_only: bool,
    geometry: RwLock<Geometry>,
    writer: Mutex<Mine>,
    /// `close` was called: the name is free, this handle refuses I/O.
    closed: AtomicBool,
}

impl ColumnFamily {
    /// The column family's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.geometry().len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file ranges it holds (its extents), in logical order.
    pub fn extents(&self) -> Vec<Range<u64>> {
        self.geometry()
            .extents
            .iter()
            .map(|e| e.offset..e.offset + e.bytes)
            .collect()
    }

    fn geometry(&self) -> RwLockReadGuard<'_, Geometry> {
        self.geometry.read().unwrap_or_else(|e| e.into_inner())
    }

    fn mine(&self) -> MutexGuard<'_, Mine> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads `out.len()` bytes at `offset`. Errors: `UnexpectedEof` past
    /// the family's length; the page writer's.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.check_open()?;
        let g = self.geometry();
        let end = offset
            .checked_add(out.len() as u64)
            .filter(|&e| e <= g.len)
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        for (logical, range) in g.map(offset..end) {
            let at = (logical - offset) as usize;
            let n = (range.end - range.start) as usize;
            self.shared
                .file
                .read_exact_at(range.start, &mut out[at..at + n])?;
        }
        Ok(())
    }

    /// Writes `data` at `offset`, growing the family first where it ends
    /// past its length. Errors: `InvalidInput` for an offset past `u64`;
    /// as [`set_len`](Self::set_len); the page writer's.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(io::ErrorKind::InvalidInput)?;
        let mut mine = self.mine_writable()?;
        if end > self.geometry().len {
            self.resize(&mut mine, end)?;
        }
        let g = self.geometry();
        for (logical, range) in g.map(offset..end) {
            let at = (logical - offset) as usize;
            let n = (range.end - range.start) as usize;
            mine.writer.write_all_at(range.start, &data[at..at + n])?;
        }
        Ok(())
    }

    /// Sets the length to `len` bytes; bytes it grows over read as zeros
    /// (new extents appended at the file's end, free space zeroed before
    /// reuse, bytes a shrink cut zeroed when it grows again). A shrink
    /// keeps the extents.
    ///
    /// Errors: `PermissionDenied` on a read-only handle; the page writer's
    /// (a full disk: `StorageFull`);
    /// [`Error::DirectoryFull`] as an `io::Error` of kind `StorageFull`.
    pub fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut mine = self.mine_writable()?;
        self.resize(&mut mine, len)
    }

    fn resize(&self, mine: &mut Mine, len: u64) -> Result<(), io::Error> {
        let (old, capacity) = {
            let g = self.geometry();
            (g.len, g.capacity())
        };
        if len < old {
            mine.dirty_end = mine.dirty_end.max(old);
        } else if len > old {
            if len > capacity {
                self.grow(mine, len - capacity, capacity)?;
            }
            if mine.dirty_end > old {
                self.zero(mine, old..len.min(mine.dirty_end))?;
            }
        }
        self.geometry.write().unwrap_or_else(|e| e.into_inner()).len = len;
        Ok(())
    }

    /// Writes zeros over logical bytes `range` through the family's writer.
    fn zero(&self, mine: &mut Mine, range: Range<u64>) -> Result<(), io::Error> {
        let zeros = vec![0u8; EXTENT_UNIT as usize];
        let g = self.geometry();
        for (_, r) in g.map(range) {
            let mut at = r.start;
            while at < r.end {
                let n = (r.end - at).min(EXTENT_UNIT);
                mine.writer.write_all_at(at, &zeros[..n as usize])?;
                at += n;
            }
        }
        Ok(())
    }

    /// Adds an extent of at least `need` bytes (at least the capacity so
    /// far, up to [`MAX_EXTENT_STEP`]). Free space that held another
    /// family's data is zeroed and committed before it is used.
    fn grow(&self, mine: &mut Mine, need: u64, capacity: u64) -> Result<(), io::Error> {
        let step = capacity.clamp(EXTENT_UNIT, MAX_EXTENT_STEP).max(need);
        let bytes = step
            .checked_next_multiple_of(EXTENT_UNIT)
            .ok_or(io::ErrorKind::InvalidInput)?;
        let s = &self.shared;
        let mut dir = s.dir();
        let mut next = dir.clone();
        let (extent, reused) = next.allocate(bytes);
        if let Some(entry) = next.families.get_mut(&self.name) {
            entry.extents.push(extent);
        }
        if !reused && s.file.len() < next.end {
            s.file.set_len(next.end)?;
        }
        let no_window = matches!(s.file.config().grow_ahead, pagewriter::GrowAhead::Off);
        if !reused && extent.bytes <= MAX_ZEROED_EXTENT && no_window {
            // Written zeros, not a hole: the family's writes then overwrite
            // allocated blocks instead of allocating them, which under
            // O_DIRECT serializes every family's writes on the file's
            // inode lock. Nothing buffers or caches these bytes yet; they
            // read as zeros either way, so their durability does not
            // matter.
            s.file.backend().write_zeroes(extent.offset, extent.bytes)?;
        }
        if reused {
            let zeros = vec![0u8; EXTENT_UNIT as usize];
            let mut w = Writer::shared(Arc::clone(&s.file));
            let mut at = extent.offset;
            while at < extent.offset + extent.bytes {
                w.write_all_at(at, &zeros)?;
                at += EXTENT_UNIT;
            }
            w.commit()?;
        }
        *dir = next;
        drop(dir);
        self.geometry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extents
            .push(extent);
        mine.extents_changed = true;
        Ok(())
    }

    /// Durable commit of this family's pages (and of the directory, where
    /// its length or extents changed): see [`redb::StorageBackend::sync_data`].
    ///
    /// Errors: the page writer's (a failed `fdatasync` poisons the file
    /// for every family); [`Error::DirectoryFull`] as `StorageFull`.
    pub fn sync(&self) -> Result<(), io::Error> {
        if self.read_only {
            return self.check_open();
        }
        let mut mine = self.mine_open()?;
        let (len, extents) = {
            let g = self.geometry();
            (g.len, g.extents.clone())
        };
        if len == mine.committed_len && !mine.extents_changed {
            return Ok(mine.writer.commit()?);
        }
        let s = &self.shared;
        let mut dir = s.dir();
        let mut next = dir.clone();
        let entry = next.families.entry(self.name.clone()).or_default();
        entry.len = len;
        entry.extents = extents;
        s.commit_directory(&mut dir, next, &mut mine.writer)?;
        drop(dir);
        mine.committed_len = len;
        mine.extents_changed = false;
        Ok(())
    }
}

impl ColumnFamily {
    /// Frees the name for a new handle (redb calls it when its database
    /// closes, possibly before the last reference to this handle goes);
    /// every later call on this handle is refused. Uncommitted pages stay
    /// buffered.
    ///
    /// A write, `set_len` or commit of this handle running on another
    /// thread ends first: none lands after `close` returns, so a new
    /// handle on the name never races the old one's changes.
    pub fn close(&self) {
        let _mine = self.mine();
        if !self.closed.swap(true, Ordering::AcqRel) {
            let mut live = self.shared.live();
            match live.get_mut(&self.name) {
                Some(Live::Readers(n)) if *n > 1 => *n -= 1,
                _ => {
                    live.remove(&self.name);
                }
            }
        }
    }

    /// The writing side's lock, refused on a closed handle: checked under
    /// the lock, which [`close`](Self::close) takes, so no change of a
    /// handle closed meanwhile goes ahead.
    fn mine_open(&self) -> Result<MutexGuard<'_, Mine>, io::Error> {
        let mine = self.mine();
        self.check_open()?;
        Ok(mine)
    }

    /// [`mine_open`](Self::mine_open), refused on a read-only handle.
    fn mine_writable(&self) -> Result<MutexGuard<'_, Mine>, io::Error> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("column family {:?}: a read-only handle", self.name),
            ));
        }
        self.mine_open()
    }

    /// Refuses a call on a closed handle.
    fn check_open(&self) -> Result<(), io::Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(io::Error::other(format!(
                "column family {:?}: this handle was closed",
                self.name
            )));
        }
        Ok(())
    }
}

impl Drop for ColumnFamily {
    fn drop(&mut self) {
        self.close();
    }
}

impl redb::StorageBackend for ColumnFamily {
    fn len(&self) -> Result<u64, io::Error> {
        self.check_open()?;
        Ok(ColumnFamily::len(self))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.read_at(offset, out)
    }

    /// Frees the family's name for a new handle: see
    /// [`ColumnFamily::close`].
    fn close(&self) -> Result<(), io::Error> {
        ColumnFamily::close(self);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        ColumnFamily::set_len(self, len)
    }

    /// A scoped commit of this family's pages (and of the directory where
    /// its length or extents changed): it never waits for another family's
    /// buffered pages, and concurrent ones share `fdatasync`s.
    fn sync_data(&self) -> Result<(), io::Error> {
        self.sync()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.write_at(offset, data)
    }
}
