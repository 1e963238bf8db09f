//! [`FileBackend`]: a regular file driven with `pread`, `pwritev`,
//! `fdatasync` and `fallocate`.

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::StorageBackend;

/// Most iovecs one `pwritev` call accepts on Linux (`IOV_MAX`, `UIO_MAXIOV`).
pub const IOV_MAX: usize = 1024;

/// Default cap on the bytes of one write call: 1 MiB.
///
/// Large enough to reach a NVMe device's sequential bandwidth with buffered
/// I/O, small enough that one call does not hold the inode lock for long.
pub const DEFAULT_MAX_WRITE_BYTES: usize = 1 << 20;

/// System calls a [`FileBackend`] has made, counted since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SyscallCounts {
    /// `pwrite` and `pwritev` calls, retries after a short write or `EINTR`
    /// included.
    pub writes: u64,
    /// `fdatasync` calls.
    pub syncs: u64,
}

/// `O_DIRECT` alignment of a file in bytes: buffer addresses must be
/// multiples of `memory`, file offsets and lengths multiples of `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DioAlign {
    /// Alignment of buffer addresses.
    pub memory: u32,
    /// Alignment of file offsets and I/O lengths.
    pub offset: u32,
}

/// How a file is opened: access, creation and locking. The default is what
/// a database opening its own file wants: read-write, created if missing
/// (never truncated), with an exclusive advisory lock.
///
/// The lock is `flock(2)` through std's [`File::try_lock`]: exclusive for a
/// read-write open, shared for a read-only one, held until the file is
/// dropped. It is advisory (it stops other `pagewriter` opens and programs
/// that lock, not plain `open`s) and per open file description, so a
/// second open in the same process conflicts too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    read_only: bool,
    create: bool,
    lock: bool,
    lock_wait: std::time::Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// Read-write, create if missing, lock.
    pub fn new() -> Self {
        Self {
            read_only: false,
            create: true,
            lock: true,
            lock_wait: std::time::Duration::ZERO,
        }
    }

    /// How long to retry a lock held elsewhere before giving up (polled
    /// every millisecond). Default zero: fail at once. An engine restarting
    /// after its process was killed may want a second or so: a killed
    /// process's io_uring ring holds its registered file, and with it the
    /// lock, until the kernel's deferred ring teardown has finished the
    /// writes that were in flight, which usually takes milliseconds.
    pub fn lock_wait(mut self, wait: std::time::Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// Opens read-only: every write is refused with
    /// [`Error::ReadOnly`](crate::Error::ReadOnly), the file must exist, and
    /// the lock taken is shared. Default `false`.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Creates the file if it is missing (read-write only). With `false`
    /// a missing file is `io::ErrorKind::NotFound`. Default `true`.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Takes the advisory lock at open. With `false` nothing is locked
    /// (the engine locks, or shares the file knowingly). Default `true`.
    pub fn lock(mut self, lock: bool) -> Self {
        self.lock = lock;
        self
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether the open takes the advisory lock.
    pub fn is_locking(&self) -> bool {
        self.lock
    }

    /// Opens `path` as asked, with `O_DIRECT` added when `direct`, and takes
    /// the lock. Errors: the open's error; `io::ErrorKind::WouldBlock` when
    /// the lock is held elsewhere.
    fn open(&self, path: &Path, direct: bool) -> io::Result<File> {
        let mut o = std::fs::OpenOptions::new();
        o.read(true);
        if !self.read_only {
            o.write(true).create(self.create).truncate(false);
        }
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let file = o.open(path)?;
        if !self.lock {
            return Ok(file);
        }
        let deadline = std::time::Instant::now() + self.lock_wait;
        loop {
            let locked = if self.read_only {
                file.try_lock_shared()
            } else {
                file.try_lock()
            };
            match locked {
                Ok(()) => return Ok(file),
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "the file is locked by another open",
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}

/// A regular file. Writes go straight to the OS (no buffering here).
///
/// Vectored writes use `pwritev`, split into calls of at most [`IOV_MAX`]
/// iovecs and at most `max_write_bytes` bytes (a single iovec larger than
/// that is written by itself). A short write is continued from where it
/// stopped, `EINTR` is retried, and a call that writes 0 bytes is an
/// `io::ErrorKind::WriteZero` error.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    /// Set when opened with `O_DIRECT`: the alignment every I/O must meet.
    direct: Option<DioAlign>,
    /// Set when opened with `O_DIRECT` on a file system that takes
    /// `RWF_ATOMIC` writes (`statx(STATX_WRITE_ATOMIC)`).
    atomic: Option<super::AtomicUnit>,
    /// Extra open file descriptions of the same file, one per sync lane
    /// past the first (lane 0 is `file`).
    lanes: Vec<File>,
    read_only: bool,
    /// Largest file length the file system accepts (probed at open).
    max_file_size: Option<u64>,
    max_write_bytes: usize,
    write_calls: AtomicU64,
    sync_calls: AtomicU64,
}

impl FileBackend {
    /// Opens `path` for reading and writing, creating it if missing, without
    /// a lock. An existing file is never truncated.
    ///
    /// Errors: whatever `open(2)` returns (`EISDIR` for a directory, `EACCES`
    /// for a read-only file, ...).
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        Self::open_with(path, &OpenOptions::new().lock(false), false)
    }

    /// Opens `path` as `options` say (access, creation, lock), with
    /// `O_DIRECT` when `direct` (alignment found as in
    /// [`open_direct`](Self::open_direct)).
    ///
    /// Errors: the open's error (`NotFound`, `EISDIR`, `EACCES`, `EINVAL`
    /// where `O_DIRECT` is refused); `io::ErrorKind::WouldBlock` when
    /// `options` lock and another open holds the lock.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: &OpenOptions,
        direct: bool,
    ) -> io::Result<Self> {
        let file = options.open(path.as_ref(), direct)?;
        let mut backend = Self::from_file(file);
        backend.read_only = options.read_only;
        if direct {
            backend.direct = Some(dio_align_of(&backend.file)?);
            backend.atomic = statx_atomic_unit(&backend.file);
        }
        Ok(backend)
    }

    /// Opens `path` like [`open`](Self::open) but with `O_DIRECT`, and
    /// finds the alignment I/O must meet: `statx(STATX_DIOALIGN)` (Linux
    /// 6.1+), else the device's logical block size for offsets and lengths
    /// and for memory.
    ///
    /// Errors: the open's error (`EINVAL` where the file system refuses
    /// `O_DIRECT`); `Unsupported` where `statx` reports that this file
    /// cannot do direct I/O.
    pub fn open_direct(path: impl AsRef<Path>) -> io::Result<Self> {
        Self::open_with(path, &OpenOptions::new().lock(false), true)
    }

    /// Wraps an already opened file, which must be readable and writable.
    pub fn from_file(file: File) -> Self {
        let max_file_size = probe_max_file_size(&file);
        Self {
            file,
            direct: None,
            atomic: None,
            lanes: Vec::new(),
            read_only: false,
            max_file_size,
            max_write_bytes: DEFAULT_MAX_WRITE_BYTES,
            write_calls: AtomicU64::new(0),
            sync_calls: AtomicU64::new(0),
        }
    }

    /// Sets the cap on bytes per write call (default
    /// [`DEFAULT_MAX_WRITE_BYTES`]). A value of 0 is taken as 1.
    pub fn with_max_write_bytes(mut self, max_write_bytes: usize) -> Self {
        self.max_write_bytes = max_write_bytes.max(1);
        self
    }

    /// Opens `lanes - 1` more file descriptions of the same file (through
    /// `/proc/self/fd`), so that up to `lanes` `fdatasync`s can run at once,
    /// each seeing every writeback error on its own (see
    /// [`StorageBackend::sync_data_on`]). 0 is taken as 1.
    ///
    /// Errors: the reopen's error (`ENOENT` where `/proc` is not mounted);
    /// use 1 lane there.
    pub fn with_sync_lanes(mut self, lanes: usize) -> io::Result<Self> {
        let proc_path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        self.lanes.clear();
        for _ in 1..lanes.max(1) {
            // A read-only file's lanes are read-only opens (fdatasync
            // takes any descriptor), never a request for write access.
            self.lanes.push(
                std::fs::OpenOptions::new()
                    .read(self.read_only)
                    .write(!self.read_only)
                    .open(&proc_path)?,
            );
        }
        Ok(self)
    }

    /// The cap on bytes per write call.
    pub fn max_write_bytes(&self) -> usize {
        self.max_write_bytes
    }

    /// The underlying file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The `O_DIRECT` alignment if the file was opened with `O_DIRECT`.
    pub fn direct(&self) -> Option<DioAlign> {
        self.direct
    }

    /// System calls made so far.
    pub fn syscalls(&self) -> SyscallCounts {
        SyscallCounts {
            writes: self.write_calls.load(Ordering::Relaxed),
            syncs: self.sync_calls.load(Ordering::Relaxed),
        }
    }

    /// `fallocate(2)` mode 0 (see [`StorageBackend::allocate`]).
    ///
    /// Errors: `EOPNOTSUPP` where the file system cannot preallocate, `ENOSPC`.
    fn fallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let n = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        loop {
            // SAFETY: fallocate takes only integers; the fd is open for as
            // long as `self.file` lives, which outlives this call.
            let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, off, n) };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// Writes all of `bufs` at `offset` with `pwritev` (`flags` 0) or
    /// `pwritev2(flags)`, in windows of at most `max_write_bytes`.
    fn pwritev_all(
        &self,
        mut offset: u64,
        mut bufs: &mut [IoSlice<'_>],
        flags: i32,
    ) -> io::Result<()> {
        // Empty slices would make a window of zero bytes look like a
        // zero-byte write; drop them up front.
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            let n = window(bufs, self.max_write_bytes);
            let written = self.pwritev_once(offset, &bufs[..n], flags)?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            offset += written as u64;
            IoSlice::advance_slices(&mut bufs, written);
        }
        Ok(())
    }

    /// One `pwritev` of (a prefix of) `bufs` at `offset`, `EINTR` retried.
    /// Slices adjacent in memory (pages carved from one slab in file order)
    /// go out as one iovec, up to [`MERGED_IOVECS`] iovecs per call. Returns
    /// the bytes written (possibly fewer than asked).
    ///
    /// `flags` are `pwritev2` flags (`RWF_*`); 0 makes it a plain `pwritev`.
    fn pwritev_once(&self, offset: u64, bufs: &[IoSlice<'_>], flags: i32) -> io::Result<usize> {
        debug_assert!(!bufs.is_empty() && bufs.len() <= IOV_MAX);
        let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MERGED_IOVECS];
        let n = merge_adjacent(bufs, &mut iov);
        loop {
            self.write_calls.fetch_add(1, Ordering::Relaxed);
            let rc = if flags == 0 {
                // SAFETY: `iov[..n]` covers exactly the bytes of a prefix of
                // `bufs` (adjacent slices joined), which stay borrowed for
                // the whole call; the kernel only reads them. `n` is at most
                // MERGED_IOVECS, so it fits in a c_int.
                unsafe { libc::pwritev(self.file.as_raw_fd(), iov.as_ptr(), n as libc::c_int, off) }
            } else {
                pwritev2(self.file.as_raw_fd(), &iov[..n], off, flags)
            };
            if rc >= 0 {
                return Ok(rc as usize);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

/// `pwritev2(fd, iov, off, flags)`: the raw return value (bytes or -1).
#[cfg(target_os = "linux")]
fn pwritev2(fd: libc::c_int, iov: &[libc::iovec], off: libc::off_t, flags: i32) -> isize {
    // SAFETY: every iovec in `iov` points at bytes the caller keeps
    // borrowed for the whole call (see `pwritev_once`); the kernel only
    // reads them. `iov.len()` is at most MERGED_IOVECS, so it fits in a
    // c_int.
    unsafe { libc::pwritev2(fd, iov.as_ptr(), iov.len() as libc::c_int, off, flags) }
}

/// No `pwritev2` here: callers pass flags only on Linux.
#[cfg(not(target_os = "linux"))]
fn pwritev2(_fd: libc::c_int, _iov: &[libc::iovec], _off: libc::off_t, _flags: i32) -> isize {
    unreachable!("pwritev2 flags are only passed on Linux")
}

/// Most iovecs [`FileBackend`] passes to one `pwritev` after joining
/// slices adjacent in memory: 64 (a stack array; the rest of a run goes in
/// the next call).
pub(crate) const MERGED_IOVECS: usize = 64;

/// The iovecs of `bufs` with slices adjacent in memory (one ends where the
/// next starts: pages carved from one slab in file order) joined into one,
/// and empty slices left out. Only addresses are compared and no Rust
/// slice spans two buffers: a joined iovec goes to the kernel only. Shared
/// by `pwritev` here and the io_uring WRITEV path (`ring`).
pub(crate) fn joined_iovecs<'a>(bufs: &'a [IoSlice<'_>]) -> impl Iterator<Item = libc::iovec> + 'a {
    let mut bufs = bufs.iter().filter(|b| !b.is_empty()).peekable();
    std::iter::from_fn(move || {
        let first = bufs.next()?;
        let start = first.as_ptr() as usize;
        let mut len = first.len();
        while let Some(next) = bufs.next_if(|b| b.as_ptr() as usize == start + len) {
            len += next.len();
        }
        Some(libc::iovec {
            iov_base: start as *mut libc::c_void,
            iov_len: len,
        })
    })
}

/// Fills `out` with the [`joined_iovecs`] of a prefix of `bufs` and
/// returns how many it filled (at least 1 when `bufs` has a non-empty
/// slice).
pub(crate) fn merge_adjacent(bufs: &[IoSlice<'_>], out: &mut [libc::iovec]) -> usize {
    let mut n = 0;
    for (slot, iov) in out.iter_mut().zip(joined_iovecs(bufs)) {
        *slot = iov;
        n += 1;
    }
    n
}

/// The `O_DIRECT` alignment of a file opened with `O_DIRECT`:
/// `statx(STATX_DIOALIGN)` where the kernel reports it, else the device's
/// logical block size (4096 where unknown).
///
/// Errors: `Unsupported` where `statx` reports that this file cannot do
/// direct I/O.
fn dio_align_of(file: &File) -> io::Result<DioAlign> {
    match statx_dio_align(file)? {
        Some(a) if a.memory == 0 || a.offset == 0 => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "statx reports no direct I/O support for this file",
        )),
        Some(a) => Ok(a),
        None => {
            let lbs = logical_block_size(file).unwrap_or(4096);
            Ok(DioAlign {
                memory: lbs,
                offset: lbs,
            })
        }
    }
}

/// The file system's largest file length (`s_maxbytes`) for `file`, found
/// by binary search with `lseek(SEEK_SET)`, which Linux refuses with
/// `EINVAL` past that length (`generic_file_llseek_size`); about 63 calls,
/// made once at open. The descriptor's file position is left wherever the
/// search ends (this backend does only positional I/O). `None` where
/// `lseek` does not behave so (a pipe, a file system with its own rule).
fn probe_max_file_size(file: &File) -> Option<u64> {
    let fd = file.as_raw_fd();
    let seek_ok = |pos: i64| {
        // SAFETY: lseek takes only integers; `fd` is open for as long as
        // `file`, which the caller borrows for this whole function.
        unsafe { libc::lseek(fd, pos, libc::SEEK_SET) == pos }
    };
    if !seek_ok(0) {
        return None;
    }
    let (mut lo, mut hi) = (0i64, i64::MAX);
    if seek_ok(hi) {
        return Some(hi as u64);
    }
    // Invariant: lo seeks, hi does not.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if seek_ok(mid) { lo = mid } else { hi = mid }
    }
    Some(lo as u64)
}

/// Bytes an unprivileged writer can still allocate on the file system
/// holding `path` (`statvfs`: `f_bavail * f_frsize`), for checking a large
/// write against free space before starting it.
///
/// Errors: `statvfs`'s (`ENOENT` for a missing path, ...);
/// `InvalidInput` for a path with a NUL byte.
pub fn free_space(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated string and `s` a live, writable
    // statvfs, both for the whole call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// `statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN)`: `Some` alignment when
/// the kernel and file system report it (zeros: no direct I/O), `None` when
/// they do not (kernels before 6.1, some file systems).
fn statx_dio_align(file: &File) -> io::Result<Option<DioAlign>> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a valid NUL-terminated empty string, `buf` is a
    // live, writable statx struct, and the fd is open for the call.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut buf,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EINVAL) => Ok(None),
            _ => Err(e),
        };
    }
    if buf.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(None);
    }
    Ok(Some(DioAlign {
        memory: buf.stx_dio_mem_align,
        offset: buf.stx_dio_offset_align,
    }))
}

/// `statx(fd, "", AT_EMPTY_PATH, STATX_WRITE_ATOMIC)`: the file's atomic
/// write unit for direct I/O where the kernel (6.11+) and file system
/// report one, else `None` (also on any statx error: atomic writes are an
/// option, never a reason to fail an open).
#[cfg(target_os = "linux")]
fn statx_atomic_unit(file: &File) -> Option<super::AtomicUnit> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a valid NUL-terminated empty string, `buf` is a
    // live, writable statx struct, and the fd is open for the call.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_WRITE_ATOMIC,
            &mut buf,
        )
    };
    let reported = rc == 0 && buf.stx_mask & libc::STATX_WRITE_ATOMIC != 0;
    let (min, max) = (buf.stx_atomic_write_unit_min, buf.stx_atomic_write_unit_max);
    (reported && min > 0 && max >= min && min.is_power_of_two() && max.is_power_of_two()).then(
        || super::AtomicUnit {
            min,
            max,
            segments_max: buf.stx_atomic_write_segments_max.max(1),
            device_max: queue_attr(file, "atomic_write_unit_max_bytes")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        },
    )
}

#[cfg(not(target_os = "linux"))]
fn statx_atomic_unit(_file: &File) -> Option<super::AtomicUnit> {
    None
}

/// The logical block size of the device holding `file`, from sysfs
/// (`/sys/dev/block/MAJ:MIN/queue/logical_block_size`, or the parent's for
/// a partition).
fn logical_block_size(file: &File) -> Option<u32> {
    queue_attr(file, "logical_block_size")?.parse().ok()
}

/// An attribute of the block queue under the file system holding `file`,
/// from `/sys/dev/block/MAJ:MIN/queue/NAME` (or the parent disk's queue for
/// a partition), trimmed: e.g. `max_sectors_kb`, `nr_requests`,
/// `rotational`, `io_poll`. `None` where sysfs has no such entry (tmpfs,
/// overlay, not Linux).
pub fn queue_attr(file: &File, name: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = file.metadata().ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    ["queue", "../queue"]
        .iter()
        .find_map(|dir| std::fs::read_to_string(format!("{base}/{dir}/{name}")).ok())
        .map(|s| s.trim().to_string())
}

/// How many of `bufs` (at least one) fit in one write call under the caps.
fn window(bufs: &[IoSlice<'_>], max_write_bytes: usize) -> usize {
    let mut bytes = 0usize;
    let mut n = 0usize;
    for buf in bufs.iter().take(IOV_MAX) {
        if n > 0 && bytes + buf.len() > max_write_bytes {
            break;
        }
        bytes += buf.len();
        n += 1;
    }
    n
}

impl StorageBackend for FileBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        FileExt::read_exact_at(&self.file, buf, offset)
    }

    fn read_vectored_exact_at(
        &self,
        mut offset: u64,
        mut bufs: &mut [IoSliceMut<'_>],
    ) -> io::Result<()> {
        IoSliceMut::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            let n = bufs.len().min(IOV_MAX);
            let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
            // SAFETY: `IoSliceMut` is ABI-compatible with `struct iovec` on
            // Unix; the slices (and the memory they point at) are borrowed
            // mutably for the whole call, so the kernel may write them; `n`
            // is at most IOV_MAX and fits in a c_int.
            let rc = unsafe {
                libc::preadv(
                    self.file.as_raw_fd(),
                    bufs.as_ptr().cast::<libc::iovec>(),
                    n as libc::c_int,
                    off,
                )
            };
            if rc < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if rc == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            offset += rc as u64;
            IoSliceMut::advance_slices(&mut bufs, rc as usize);
        }
        Ok(())
    }

    fn max_file_size(&self) -> Option<u64> {
        self.max_file_size
    }

    fn file(&self) -> Option<&File> {
        Some(&self.file)
    }

    fn write_all_at(&self, mut offset: u64, mut buf: &[u8]) -> io::Result<()> {
        // Written out rather than `FileExt::write_all_at` so every call is
        // counted; same contract (EINTR retried, 0 bytes is WriteZero).
        while !buf.is_empty() {
            self.write_calls.fetch_add(1, Ordering::Relaxed);
            match self.file.write_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        self.pwritev_all(offset, bufs, 0)
    }

    #[cfg(target_os = "linux")]
    fn write_vectored_all_at_dsync(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        // Each call is durable on its own return, so a write split at a
        // window or a short write is durable once the loop ends.
        self.pwritev_all(offset, bufs, libc::RWF_DSYNC)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync_calls.fetch_add(1, Ordering::Relaxed);
        // std's sync_data retries EINTR and calls fdatasync on Linux.
        self.file.sync_data()
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fallocate(offset, len)
    }

    fn sync_lanes(&self) -> usize {
        1 + self.lanes.len()
    }

    fn sync_data_on(&self, lane: usize) -> io::Result<()> {
        match lane {
            0 => self.sync_data(),
            n => {
                let file = self.lanes.get(n - 1).ok_or(io::ErrorKind::InvalidInput)?;
                self.sync_calls.fetch_add(1, Ordering::Relaxed);
                file.sync_data()
            }
        }
    }

    fn dio_align(&self) -> Option<DioAlign> {
        self.direct
    }

    fn atomic_write_unit(&self) -> Option<super::AtomicUnit> {
        self.atomic
    }

    #[cfg(target_os = "linux")]
    fn write_atomic_at(&self, offset: u64, buf: &[u8], dsync: bool) -> io::Result<()> {
        if self.atomic.is_none() {
            return Err(io::ErrorKind::Unsupported.into());
        }
        let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let iov = [libc::iovec {
            iov_base: buf.as_ptr().cast_mut().cast(),
            iov_len: buf.len(),
        }];
        let flags = libc::RWF_ATOMIC | if dsync { libc::RWF_DSYNC } else { 0 };
        loop {
            self.write_calls.fetch_add(1, Ordering::Relaxed);
            let rc = pwritev2(self.file.as_raw_fd(), &iov, off, flags);
            if rc >= 0 {
                return if rc as usize == buf.len() {
                    Ok(())
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("atomic write of {} B wrote {rc} B", buf.len()),
                    ))
                };
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_respects_both_caps() {
        let page = [0u8; 4096];
        let bufs: Vec<IoSlice<'_>> = (0..3000).map(|_| IoSlice::new(&page)).collect();
        assert_eq!(window(&bufs, usize::MAX), IOV_MAX);
        assert_eq!(window(&bufs, 1 << 20), 256);
        assert_eq!(window(&bufs, 4096 * 3 + 1), 3);
        // One slice larger than the cap still goes alone.
        assert_eq!(window(&bufs, 100), 1);
    }

    #[test]
    fn adjacent_slices_join_into_one_iovec_and_the_rest_waits() {
        let mem = vec![7u8; 64 << 10];
        let (a, rest) = mem.split_at(4096);
        let (b, rest) = rest.split_at(4096);
        let (_gap, c) = rest.split_at(4096);
        let empty: &[u8] = &[];
        let bufs = [
            IoSlice::new(a),
            IoSlice::new(empty),
            IoSlice::new(b),
            IoSlice::new(&c[..512]),
        ];
        let mut out = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        assert_eq!(merge_adjacent(&bufs, &mut out), 2);
        assert_eq!(out[0].iov_base as usize, a.as_ptr() as usize);
        assert_eq!(out[0].iov_len, 8192);
        assert_eq!(out[1].iov_base as usize, c.as_ptr() as usize);
        assert_eq!(out[1].iov_len, 512);
        // No room for the second: only the joined prefix.
        assert_eq!(merge_adjacent(&bufs, &mut out[..1]), 1);
        assert_eq!(out[0].iov_len, 8192);
        // Slices of one buffer in order become one iovec whatever their count.
        let many: Vec<IoSlice<'_>> = mem.chunks(512).map(IoSlice::new).collect();
        assert_eq!(merge_adjacent(&many, &mut out), 1);
        assert_eq!(out[0].iov_len, mem.len());
    }

    #[test]
    fn joined_and_separate_slices_land_in_file_order() {
        // Adjacent pieces of one buffer (joined) between separate buffers,
        // more than MERGED_IOVECS iovecs in all: every byte in order.
        let dir = tempfile::tempdir().unwrap();
        let be = FileBackend::open(dir.path().join("f")).unwrap();
        let big: Vec<u8> = (0..(8 << 10)).map(|i| (i % 253) as u8).collect();
        let small: Vec<Vec<u8>> = (0..200u32).map(|i| vec![i as u8; 100]).collect();
        let mut slices = Vec::new();
        let mut want = Vec::new();
        for (i, s) in small.iter().enumerate() {
            slices.push(IoSlice::new(s));
            want.extend_from_slice(s);
            if i % 50 == 0 {
                for piece in big.chunks(1000) {
                    slices.push(IoSlice::new(piece));
                }
                want.extend_from_slice(&big);
            }
        }
        be.write_vectored_all_at(0, &mut slices).unwrap();
        let mut back = vec![0u8; want.len()];
        be.read_exact_at(0, &mut back).unwrap();
        assert_eq!(back, want);
        // 200 + 4 iovecs after joining: at least 4 calls of at most 64.
        assert!(be.syscalls().writes >= 4, "{:?}", be.syscalls());
    }

    #[test]
    fn vectored_write_splits_and_lands_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let be = FileBackend::open(dir.path().join("f"))
            .unwrap()
            .with_max_write_bytes(3 * 512);
        let chunks: Vec<Vec<u8>> = (0..2100u32)
            .map(|i| vec![(i % 251) as u8 + 1; 512])
            .collect();
        let mut slices: Vec<IoSlice<'_>> = chunks.iter().map(|c| IoSlice::new(c)).collect();
        be.write_vectored_all_at(4096, &mut slices).unwrap();
        // 2100 slices of 512 bytes, 3 per call.
        assert_eq!(be.syscalls().writes, 700);
        let mut back = vec![0u8; 2100 * 512];
        be.read_exact_at(4096, &mut back).unwrap();
        assert_eq!(back, chunks.concat());
        let mut head = vec![1u8; 4096];
        be.read_exact_at(0, &mut head).unwrap();
        assert!(head.iter().all(|&b| b == 0));
    }

    #[test]
    fn direct_open_reports_an_alignment_and_writes_aligned_pages() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let be = match FileBackend::open_direct(dir.path().join("d")) {
            Ok(be) => be,
            Err(e) => {
                eprintln!("O_DIRECT refused here ({e}); skipped");
                return;
            }
        };
        let a = be.direct().unwrap();
        assert!(
            a.memory.is_power_of_two() && a.offset.is_power_of_two(),
            "{a:?}"
        );
        let page = crate::buffer::AlignedBuf::copy_from(&[9u8; 4096], 4096).unwrap();
        let mut iov = [IoSlice::new(&page), IoSlice::new(&page)];
        be.write_vectored_all_at(4096, &mut iov).unwrap();
        let mut back = crate::buffer::AlignedBuf::zeroed(8192, 4096).unwrap();
        be.read_exact_at(4096, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 9));
        // An unaligned buffer is refused by the kernel, not silently written.
        let mut odd = vec![0u8; 4097];
        assert!(be.write_all_at(0, &odd[1..]).is_err() || a.memory == 1);
        odd.clear();
    }
}
