//! What every Unix shares: positioned and vectored I/O (`pread`, `pwrite`,
//! `preadv`, `pwritev`), `statvfs` and a file's identity (birth time, inode).

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Most iovecs passed to one `pwritev` after joining slices adjacent in
/// memory: 64 (a stack array; the rest of a run goes in the next call).
pub(crate) const MERGED_IOVECS: usize = 64;

/// The iovecs of `bufs` with slices adjacent in memory (one ends where the
/// next starts: pages carved from one slab in file order) joined into one,
/// and empty slices left out. Only addresses are compared and no Rust
/// slice spans two buffers: a joined iovec goes to the kernel only. Shared
/// by `pwritev` here and the io_uring WRITEV path (`ring`).
pub(crate) fn joined_iovecs<'a>(bufs: &'a [IoSlice<'_>]) -> impl Iterator<Item = libc::iovec> + 'a {
    joined_segments(bufs).map(|(start, len)| libc::iovec {
        iov_base: start as *mut libc::c_void,
        iov_len: len,
    })
}

/// The pieces of memory of `bufs` as `(address, length)`, slices adjacent
/// in memory (one ends where the next starts: pages carved from one slab
/// in file order) joined into one and empty slices left out. Only
/// addresses are compared: a joined piece goes to the kernel only, never
/// back into a Rust slice.
pub(crate) fn joined_segments<'a>(
    bufs: &'a [IoSlice<'_>],
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let mut bufs = bufs.iter().filter(|b| !b.is_empty()).peekable();
    std::iter::from_fn(move || {
        let first = bufs.next()?;
        let start = first.as_ptr() as usize;
        let mut len = first.len();
        while let Some(next) = bufs.next_if(|b| b.as_ptr() as usize == start + len) {
            len += next.len();
        }
        Some((start, len))
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

/// One `pwritev` of (a prefix of) `bufs` at `offset`, adjacent slices
/// joined ([`merge_adjacent`]). `EINTR` is the caller's to retry. Returns
/// the bytes written (possibly fewer than asked).
pub(crate) fn pwritev(file: &File, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<usize> {
    let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MERGED_IOVECS];
    let n = merge_adjacent(bufs, &mut iov);
    // SAFETY: `iov[..n]` covers exactly the bytes of a prefix of `bufs`
    // (adjacent slices joined), which stay borrowed for the whole call; the
    // kernel only reads them. `n` is at most MERGED_IOVECS, so it fits in a
    // c_int.
    let rc = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), n as libc::c_int, off) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// One `preadv` into `bufs` (at most `IOV_MAX`
/// of them) at `offset`; `EINTR` is the caller's to retry. Returns the bytes
/// read, 0 at the end of the file.
pub(crate) fn preadv(file: &File, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
    let n = bufs.len().min(crate::backend::device::IOV_MAX);
    let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `IoSliceMut` is ABI-compatible with `struct iovec` on Unix;
    // the slices (and the memory they point at) are borrowed mutably for
    // the whole call, so the kernel may write them; `n` is at most IOV_MAX
    // and fits in a c_int.
    let rc = unsafe {
        libc::preadv(
            file.as_raw_fd(),
            bufs.as_ptr().cast::<libc::iovec>(),
            n as libc::c_int,
            off,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// One `pwrite`.
pub(crate) fn write_at(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    file.write_at(buf, offset)
}

/// One `pread`.
pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.read_at(buf, offset)
}

/// `(birth time in ns, st_ino)`: which file this is, whatever path
/// reached it, the same after a remount or a reboot.
pub(crate) fn file_identity(file: &File) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    // Birth time in ns (0 where the file system keeps none) and inode:
    // both survive a remount, unlike `st_dev` (another loop device, a
    // btrfs subvolume's anonymous device, disks found in another order).
    let born = m
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    Ok((born, m.ino()))
}

/// `statvfs`: `f_bavail * f_frsize`.
pub(crate) fn free_space(path: &Path) -> io::Result<u64> {
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
    Ok(avail_bytes(&s))
}

/// `f_bavail * f_frsize`: bytes free to an unprivileged user.
fn avail_bytes(s: &libc::statvfs) -> u64 {
    // The field types differ by platform (u32 block counts on macOS).
    #[allow(clippy::useless_conversion)]
    let (avail, frsize) = (u64::from(s.f_bavail), u64::from(s.f_frsize));
    avail.saturating_mul(frsize)
}

/// `fstatvfs`: `f_bavail * f_frsize` of the file system holding `file`.
pub(crate) fn free_space_of(file: &File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open for as long as `file` lives, which outlives
    // the call; `s` is a live, writable statvfs.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(avail_bytes(&s))
}

/// Makes the directory `dir`'s entries durable (`fsync` of the
/// directory): a file created in it survives a power cut under its name.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
