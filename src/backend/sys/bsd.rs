//! macOS, FreeBSD and the other Unixes: `pwritev`, std's durable sync
//! (`fcntl(F_FULLFSYNC)` on Apple targets, `fdatasync` elsewhere), direct
//! I/O through `F_NOCACHE` (Apple) or `O_DIRECT` (FreeBSD),
//! `posix_fallocate` on FreeBSD. No atomic writes, one sync lane.

use std::fs::File;
use std::io::{self, IoSlice};

pub(crate) use super::unix::{
    file_identity, free_space, free_space_of, preadv as read_scatter_at, read_at, sync_dir,
    write_at,
};
use crate::backend::device::{AtomicUnit, DioAlign};

pub(crate) const VECTORED_WRITE: &str = "pwritev";

#[cfg(target_vendor = "apple")]
pub(crate) const SYNC: &str = "fcntl(F_FULLFSYNC)";
#[cfg(not(target_vendor = "apple"))]
pub(crate) const SYNC: &str = "fdatasync";

#[cfg(target_vendor = "apple")]
pub(crate) const DIRECT_IO: Option<&str> = Some("F_NOCACHE");
#[cfg(target_os = "freebsd")]
pub(crate) const DIRECT_IO: Option<&str> = Some("O_DIRECT");
#[cfg(not(any(target_vendor = "apple", target_os = "freebsd")))]
pub(crate) const DIRECT_IO: Option<&str> = None;

pub(crate) const ATOMIC_WRITES: bool = false;

/// Direct I/O asked at open: `O_DIRECT` on FreeBSD; on Apple targets
/// nothing here (`F_NOCACHE` is set after the open).
pub(crate) fn open_direct(o: &mut std::fs::OpenOptions) {
    #[cfg(target_os = "freebsd")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_DIRECT);
    }
    let _ = o;
}

/// `fcntl(F_NOCACHE, 1)` on Apple targets: the file's data bypasses the
/// unified buffer cache. Nothing elsewhere.
///
/// Errors: the `fcntl`'s.
pub(crate) fn after_open_direct(file: &File) -> io::Result<()> {
    #[cfg(target_vendor = "apple")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: F_NOCACHE takes an integer argument; the fd is open for
        // as long as `file`, which the caller borrows for the call.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    let _ = file;
    Ok(())
}

/// 4096 for memory and offsets: neither `F_NOCACHE` nor FreeBSD's
/// `O_DIRECT` reports an alignment, and a page meets every sector size in
/// use (512 and 4096 B). I/O that misses it goes through the cache on both
/// instead of failing, so this is what makes the bypass real.
pub(crate) fn dio_align(_file: &File) -> io::Result<DioAlign> {
    Ok(DioAlign {
        memory: 4096,
        offset: 4096,
    })
}

/// None: atomic writes are Linux's `RWF_ATOMIC`.
pub(crate) fn atomic_unit(_file: &File) -> Option<AtomicUnit> {
    None
}

/// `posix_fallocate` on FreeBSD (a file system that cannot preallocate,
/// ZFS, is `Unsupported`); `Unsupported` elsewhere.
pub(crate) fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "freebsd")]
    {
        use std::os::fd::AsRawFd;
        let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let n = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        loop {
            // SAFETY: posix_fallocate takes only integers; the fd is open
            // for as long as `file`, which outlives this call.
            let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), off, n) };
            match rc {
                0 => return Ok(()),
                libc::EINTR => {}
                libc::EINVAL | libc::EOPNOTSUPP | libc::ENODEV => {
                    return Err(io::ErrorKind::Unsupported.into());
                }
                e => return Err(io::Error::from_raw_os_error(e)),
            }
        }
    }
    #[cfg(not(target_os = "freebsd"))]
    {
        let _ = (file, offset, len);
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// `Unsupported`: zeros are written instead.
pub(crate) fn write_zeroes(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}

/// `Unsupported`: where data begins to hole is not asked here.
pub(crate) fn first_hole(_file: &File) -> io::Result<u64> {
    Err(io::ErrorKind::Unsupported.into())
}

/// `Unsupported` here.
pub(crate) fn punch_hole(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}

/// One `pwritev` of a prefix of `bufs` at `offset`; the bytes written.
pub(crate) fn write_gather_at(file: &File, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<usize> {
    super::unix::pwritev(file, bufs, offset)
}

/// `Unsupported`: no atomic writes here.
pub(crate) fn write_atomic_at(_file: &File, _buf: &[u8], _offset: u64) -> io::Result<usize> {
    Err(io::ErrorKind::Unsupported.into())
}

/// `None`: one sync lane here (no `/proc/self/fd` to reopen through, and
/// `F_FULLFSYNC` flushes the whole drive whichever descriptor asks).
pub(crate) fn reopen(_file: &File) -> io::Result<Option<File>> {
    Ok(None)
}

/// Whether `fdatasync`s of `file` must run one at a time: never asked
/// here (a file has one sync lane).
pub(crate) fn syncs_one_at_a_time(_file: &File) -> bool {
    false
}

/// `i64::MAX`: the largest offset the positional calls take (`off_t` is
/// signed). The file system's own limit is not probed here; a write past
/// it fails when it is made.
pub(crate) fn max_file_size(_file: &File) -> Option<u64> {
    Some(i64::MAX as u64)
}

/// `None`: block queue attributes are Linux's sysfs.
pub(crate) fn queue_attr(_file: &File, _name: &str) -> Option<String> {
    None
}
