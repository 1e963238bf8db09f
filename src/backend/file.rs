//! [`FileBackend`]: a regular file driven with `pread`, `pwritev`,
//! `fdatasync` and `fallocate`.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SyscallCounts {
    /// `pwrite` and `pwritev` calls, retries after a short write or `EINTR`
    /// included.
    pub writes: u64,
    /// `fdatasync` calls.
    pub syncs: u64,
}

/// `O_DIRECT` alignment of a file in bytes: buffer addresses must be
/// multiples of `memory`, file offsets and lengths multiples of `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DioAlign {
    /// Alignment of buffer addresses.
    pub memory: u32,
    /// Alignment of file offsets and I/O lengths.
    pub offset: u32,
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
    /// Extra open file descriptions of the same file, one per sync lane
    /// past the first (lane 0 is `file`).
    lanes: Vec<File>,
    max_write_bytes: usize,
    write_calls: AtomicU64,
    sync_calls: AtomicU64,
}

impl FileBackend {
    /// Opens `path` for reading and writing, creating it if missing. An
    /// existing file is never truncated.
    ///
    /// Errors: whatever `open(2)` returns (`EISDIR` for a directory, `EACCES`
    /// for a read-only file, ...).
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(Self::from_file(file))
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
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let align = match statx_dio_align(&file)? {
            Some(a) if a.memory == 0 || a.offset == 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "statx reports no direct I/O support for this file",
                ));
            }
            Some(a) => a,
            None => {
                let lbs = logical_block_size(&file).unwrap_or(4096);
                DioAlign {
                    memory: lbs,
                    offset: lbs,
                }
            }
        };
        let mut backend = Self::from_file(file);
        backend.direct = Some(align);
        Ok(backend)
    }

    /// Wraps an already opened file, which must be readable and writable.
    pub fn from_file(file: File) -> Self {
        Self {
            file,
            direct: None,
            lanes: Vec::new(),
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
            self.lanes
                .push(OpenOptions::new().write(true).open(&proc_path)?);
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

    /// One `pwritev` of `bufs` at `offset`, `EINTR` retried. Returns the bytes
    /// written (possibly fewer than asked).
    fn pwritev_once(&self, offset: u64, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        debug_assert!(!bufs.is_empty() && bufs.len() <= IOV_MAX);
        let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        loop {
            self.write_calls.fetch_add(1, Ordering::Relaxed);
            // SAFETY: `IoSlice` is guaranteed ABI-compatible with `struct
            // iovec` on Unix; `bufs` (and the memory each slice points at)
            // is borrowed for the whole call and the kernel only reads it.
            // `bufs.len()` is at most IOV_MAX, so it fits in a c_int.
            let rc = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    bufs.as_ptr().cast::<libc::iovec>(),
                    bufs.len() as libc::c_int,
                    off,
                )
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

    fn write_vectored_all_at(
        &self,
        mut offset: u64,
        mut bufs: &mut [IoSlice<'_>],
    ) -> io::Result<()> {
        // Empty slices would make a window of zero bytes look like a
        // zero-byte write; drop them up front.
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            let n = window(bufs, self.max_write_bytes);
            let written = self.pwritev_once(offset, &bufs[..n])?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            offset += written as u64;
            IoSlice::advance_slices(&mut bufs, written);
        }
        Ok(())
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

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn dio_align(&self) -> Option<DioAlign> {
        self.direct
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
