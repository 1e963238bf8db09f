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

use crate::pw_backend::PagewriterBackend;
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
    inner: PagewriterBackend,
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
        Ok(Self::from_file(file))
    }

    pub(crate) fn from_file(file: File) -> Self {
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
        Self { inner }
    }
}

impl StorageBackend for FileBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
