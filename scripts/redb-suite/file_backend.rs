// redb's `FileBackend`, swapped by `scripts/redb-suite.sh` for one that
// stores the database through pagewriter (`PagewriterBackend`, the
// pagewriter-redb adapter compiled into this copy of redb as
// `crate::pw_backend`). Every database redb's tests open on a file goes
// through it: `Database::create`/`open`, `Builder`, `FileBackend::new`.
//
// The file redb opened is reopened through `/proc/self/fd/N` (so
// pagewriter can ask for O_DIRECT and open its sync lanes), read-only
// when redb opened it read-only. `PW_REDB_SUITE_DIRECT=off` opens it
// buffered; otherwise the adapter's defaults (O_DIRECT where the file
// system takes it, io_uring where a ring can be set up).
// `PW_REDB_SUITE_GROW_AHEAD=<bytes>` adds a grow-ahead window.
//
// `PW_REDB_SUITE_CF=<dir>` stores each database in a column family of one
// shared file in <dir> instead (named by the identity of the file redb
// opened: device, inode, birth time), while a thread of the process keeps
// writing and committing another family of that file.

use crate::pw_backend::PagewriterBackend;
use crate::pw_backend::cf::{ColumnFamilies, ColumnFamily};
#[cfg(not(feature = "experimental-api-5"))]
use crate::DatabaseError;
use crate::{BackendError, StorageBackend};
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::os::fd::AsRawFd;

/// Stores a database as a file on-disk, through pagewriter.
#[derive(Debug)]
pub struct FileBackend {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    File(PagewriterBackend),
    Family(ColumnFamily),
    /// The family has a live handle: every lock is held elsewhere, so
    /// redb reports the database as open, as it does for a second open of
    /// a locked file; any I/O fails.
    Refused,
}

/// The backend of a family another handle holds.
#[derive(Debug)]
struct Held;

impl StorageBackend for Held {
    fn len(&self) -> Result<u64, io::Error> {
        Err(io::Error::other("the column family has a live handle"))
    }
    fn read(&self, _: u64, _: &mut [u8]) -> Result<(), io::Error> {
        Err(io::Error::other("the column family has a live handle"))
    }
    fn set_len(&self, _: u64) -> Result<(), io::Error> {
        Err(io::Error::other("the column family has a live handle"))
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        Err(io::Error::other("the column family has a live handle"))
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), io::Error> {
        Err(io::Error::other("the column family has a live handle"))
    }
    fn try_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, BackendError> {
        Ok(false)
    }
    fn try_lock_shared_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, BackendError> {
        Ok(false)
    }
}

impl Inner {
    fn get(&self) -> &dyn StorageBackend {
        match self {
            Inner::File(f) => f,
            Inner::Family(f) => f,
            Inner::Refused => &Held,
        }
    }
}

/// The process's shared column-family file (`PW_REDB_SUITE_CF`), with its
/// writer of another family started.
fn families() -> Option<&'static ColumnFamilies> {
    static CFS: std::sync::OnceLock<Option<ColumnFamilies>> = std::sync::OnceLock::new();
    CFS.get_or_init(|| {
        let dir = std::env::var_os("PW_REDB_SUITE_CF")?;
        let path = std::path::Path::new(&dir).join(format!("shared-{}.pwcf", std::process::id()));
        let cfs = ColumnFamilies::open(&path).expect("open the shared column-family file");
        let noise = cfs.column_family("noise").expect("the writer's family");
        std::thread::spawn(move || {
            for i in 0u64.. {
                let page = [i as u8; 4096];
                if noise.write_at((i % 256) * 4096, &page).and_then(|()| noise.sync()).is_err() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        Some(cfs)
    })
    .as_ref()
}

/// The family of the file redb opened: its device, inode and birth time
/// (a read-only handle where redb opened the file read-only).
fn family_of(file: &File) -> Option<Result<ColumnFamily, crate::pw_backend::cf::Error>> {
    use std::os::unix::fs::MetadataExt;
    let cfs = families()?;
    let m = file.metadata().expect("fstat the file redb opened");
    let born = m
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let name = format!("{}-{}-{born}", m.dev(), m.ino());
    if opened_read_only(file.as_raw_fd()) {
        // Several read-only handles may share a family; a family no
        // writable open made yet is created as before.
        match cfs.column_family_read_only(&name) {
            Err(crate::pw_backend::cf::Error::NotFound { .. }) => {}
            found => return Some(found),
        }
    }
    Some(cfs.column_family(&name))
}

/// Whether the description behind `fd` was opened read-only, from
/// `/proc/self/fdinfo` (octal `flags`, access mode in the low two bits).
fn opened_read_only(fd: i32) -> bool {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .is_some_and(|flags| flags & 3 == 0)
}

impl FileBackend {
    /// Creates a new backend which stores data to the given file.
    #[cfg(feature = "experimental-api-5")]
    pub fn new(file: File) -> Self {
        Self::from_file(file)
    }

    /// Creates a new backend which stores data to the given file.
    #[cfg(not(feature = "experimental-api-5"))]
    pub fn new(file: File) -> Result<Self, DatabaseError> {
        match family_of(&file) {
            Some(Ok(family)) => Ok(Self { inner: Inner::Family(family) }),
            // A live handle excludes this one: every lock is held, so
            // redb's open reports the database as open, as it does for a
            // second open of a locked file.
            Some(Err(crate::pw_backend::cf::Error::InUse { .. })) => {
                Ok(Self { inner: Inner::Refused })
            }
            Some(Err(e)) => panic!("column family of the file redb opened: {e}"),
            None => Ok(Self::from_file(file)),
        }
    }

    pub(crate) fn from_file(file: File) -> Self {
        match family_of(&file) {
            Some(Ok(family)) => return Self { inner: Inner::Family(family) },
            Some(Err(crate::pw_backend::cf::Error::InUse { .. })) => return Self { inner: Inner::Refused },
            Some(Err(e)) => panic!("column family of the file redb opened: {e}"),
            None => {}
        }
        let fd = file.as_raw_fd();
        let read_only = opened_read_only(fd);
        let mut config = PagewriterBackend::default_config();
        if std::env::var("PW_REDB_SUITE_DIRECT").as_deref() == Ok("off") {
            config = config.direct(pagewriter::DirectIo::Off);
        }
        if let Ok(bytes) = std::env::var("PW_REDB_SUITE_GROW_AHEAD") {
            let bytes = bytes.parse().expect("PW_REDB_SUITE_GROW_AHEAD: bytes");
            config = config.grow_ahead(pagewriter::GrowAhead::Window { bytes });
        }
        let options = pagewriter::OpenOptions::new()
            .lock(false)
            .create(false)
            .read_only(read_only);
        let inner = PagewriterBackend::open_with(format!("/proc/self/fd/{fd}"), &options, config)
            .unwrap_or_else(|e| panic!("pagewriter could not open the file redb opened: {e}"));
        drop(file);
        Self { inner: Inner::File(inner) }
    }
}

impl StorageBackend for FileBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.get().len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.get().read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.get().set_len(len)
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        self.inner.get().sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.inner.get().write(offset, data)
    }
    fn close(&self) -> Result<(), io::Error> {
        self.inner.get().close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.get().try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.get().try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.get().lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.get().lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.get().unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.get().query_lock_range(start, end)
    }
}
