//! Linux: `O_DIRECT` with `statx` alignment, `pwritev2(RWF_ATOMIC)`,
//! `fallocate`, sync lanes reopened through `/proc/self/fd`,
//! the file system's largest file length and the block queue's sysfs
//! attributes.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// For the io_uring WRITEV path (`ring`).
#[cfg(feature = "io-uring")]
pub(crate) use super::unix::joined_iovecs;
pub(crate) use super::unix::{
    file_identity, free_space, free_space_of, preadv as read_scatter_at, read_at, sync_dir,
    write_at,
};
use crate::backend::device::{AtomicUnit, DioAlign};

pub(crate) const VECTORED_WRITE: &str = "pwritev";
pub(crate) const SYNC: &str = "fdatasync";
pub(crate) const DIRECT_IO: Option<&str> = Some("O_DIRECT");
pub(crate) const ATOMIC_WRITES: bool = true;

/// Asks the open for direct I/O: `O_DIRECT`.
pub(crate) fn open_direct(o: &mut std::fs::OpenOptions) {
    o.custom_flags(libc::O_DIRECT);
}

/// Nothing to do after a direct open: the flag was given at open.
pub(crate) fn after_open_direct(_file: &File) -> io::Result<()> {
    Ok(())
}

/// The `O_DIRECT` alignment of a file opened with `O_DIRECT`:
/// `statx(STATX_DIOALIGN)` where the kernel reports it, else the device's
/// logical block size (4096 where unknown).
///
/// Errors: `Unsupported` where `statx` reports that this file cannot do
/// direct I/O.
pub(crate) fn dio_align(file: &File) -> io::Result<DioAlign> {
    match statx_dio_align(file)? {
        Some(a) if a.memory == 0 || a.offset == 0 => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "statx reports no direct I/O support for this file",
        )),
        Some(a) => Ok(a),
        None => {
            let lbs = queue_attr(file, "logical_block_size")
                .and_then(|s| s.parse().ok())
                .unwrap_or(4096);
            Ok(DioAlign {
                memory: lbs,
                offset: lbs,
            })
        }
    }
}

/// `statx(fd, "", AT_EMPTY_PATH, mask)`: what the kernel filled in (check
/// `stx_mask` for the fields asked for).
///
/// Errors: the call's (`ENOSYS`, `EINVAL` on kernels without `statx` or
/// without the mask's bits).
fn statx(file: &File, mask: u32) -> io::Result<libc::statx> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a valid NUL-terminated empty string, `buf` is a
    // live, writable statx struct, and the fd is open for the call.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            mask,
            &mut buf,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(buf)
}

/// `statx(STATX_DIOALIGN)`: `Some` alignment when the kernel and file
/// system report it (zeros: no direct I/O), `None` when they do not
/// (kernels before 6.1, some file systems).
fn statx_dio_align(file: &File) -> io::Result<Option<DioAlign>> {
    let buf = match statx(file, libc::STATX_DIOALIGN) {
        Ok(buf) => buf,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EINVAL)) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if buf.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(None);
    }
    Ok(Some(DioAlign {
        memory: buf.stx_dio_mem_align,
        offset: buf.stx_dio_offset_align,
    }))
}

/// `statx(STATX_WRITE_ATOMIC)`: the file's atomic write unit for direct
/// I/O where the kernel (6.11+) and file system report one, else `None`
/// (also on any statx error: atomic writes are an option, never a reason
/// to fail an open).
pub(crate) fn atomic_unit(file: &File) -> Option<AtomicUnit> {
    let buf = statx(file, libc::STATX_WRITE_ATOMIC).ok()?;
    let reported = buf.stx_mask & libc::STATX_WRITE_ATOMIC != 0;
    let (min, max) = (buf.stx_atomic_write_unit_min, buf.stx_atomic_write_unit_max);
    (reported && min > 0 && max >= min && min.is_power_of_two() && max.is_power_of_two()).then(
        || AtomicUnit {
            min,
            max,
            segments_max: buf.stx_atomic_write_segments_max.max(1),
            device_max: queue_attr(file, "atomic_write_unit_max_bytes")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        },
    )
}

/// `fallocate(2)` mode 0: blocks reserved, the file extended to cover them.
///
/// Errors: `EOPNOTSUPP` where the file system cannot preallocate, `ENOSPC`.
pub(crate) fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate_mode(file, 0, offset, len)
}

/// `FALLOC_FL_WRITE_ZEROES` (Linux 6.17, `include/uapi/linux/falloc.h`):
/// written zeroed blocks, the device's WRITE ZEROES doing the zeroing.
const FALLOC_FL_WRITE_ZEROES: libc::c_int = 0x80;

/// `fallocate(FALLOC_FL_WRITE_ZEROES)` over `len` bytes at `offset`.
///
/// Errors: `Unsupported` where the kernel, file system or device refuses
/// the mode (`EOPNOTSUPP`, `EINVAL`; the caller writes zeros instead);
/// `ENOSPC`, `EFBIG`.
pub(crate) fn write_zeroes(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate_mode(file, FALLOC_FL_WRITE_ZEROES, offset, len).map_err(|e| match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            io::ErrorKind::Unsupported.into()
        }
        _ => e,
    })
}

/// The offset of the first hole (or unwritten extent with no page cached)
/// in `file`: its length where there is none.
///
/// Errors: `lseek`'s.
pub(crate) fn first_hole(file: &File) -> io::Result<u64> {
    // SAFETY: lseek takes only integers; the fd is open for as long as
    // `file` lives, which outlives this call. It moves the description's
    // offset, which nothing reads (every I/O is positional).
    let r = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_HOLE) };
    u64::try_from(r).map_err(|_| io::Error::last_os_error())
}

/// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`: the blocks go,
/// the range reads as zeros, the size stays.
///
/// Errors: `EOPNOTSUPP` where the file system cannot punch holes.
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate_mode(
        file,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        offset,
        len,
    )
}

fn fallocate_mode(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    let n = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    loop {
        // SAFETY: fallocate takes only integers; the fd is open for as long
        // as `file` lives, which outlives this call.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, off, n) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// One `pwritev` of a prefix of `bufs` at `offset`; the bytes written.
pub(crate) fn write_gather_at(file: &File, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<usize> {
    super::unix::pwritev(file, bufs, offset)
}

/// One `pwritev2(RWF_ATOMIC)` of `buf` at `offset`; the bytes written.
pub(crate) fn write_atomic_at(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    let iov = [libc::iovec {
        iov_base: buf.as_ptr().cast_mut().cast(),
        iov_len: buf.len(),
    }];
    pwritev2(file, &iov, offset, libc::RWF_ATOMIC)
}

/// `pwritev2(fd, iov, off, flags)`.
fn pwritev2(file: &File, iov: &[libc::iovec], offset: u64, flags: i32) -> io::Result<usize> {
    let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: every iovec in `iov` points at bytes the caller keeps
    // borrowed for the whole call; the kernel only reads them. `iov.len()`
    // is at most MERGED_IOVECS, so it fits in a c_int.
    let rc = unsafe {
        libc::pwritev2(
            file.as_raw_fd(),
            iov.as_ptr(),
            iov.len() as libc::c_int,
            off,
            flags,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Another open file description of `file` through `/proc/self/fd`, with
/// its access mode and `O_DIRECT` flag (`fcntl(F_GETFL)`). Errors:
/// `F_GETFL`'s; the reopen's (`ENOENT` where `/proc` is not mounted).
pub(crate) fn reopen(file: &File) -> io::Result<Option<File>> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL takes only the descriptor, which `file` keeps open
    // for the whole call; it writes nothing.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let access = flags & libc::O_ACCMODE;
    let mut o = std::fs::OpenOptions::new();
    o.read(access != libc::O_WRONLY)
        .write(access != libc::O_RDONLY)
        .custom_flags(flags & libc::O_DIRECT);
    o.open(format!("/proc/self/fd/{fd}")).map(Some)
}

/// `statfs`'s `f_type` of btrfs (`BTRFS_SUPER_MAGIC`).
const BTRFS_SUPER_MAGIC: u32 = 0x9123_683e;

/// Whether `fdatasync`s of `file` must run one at a time: on btrfs (found
/// with `fstatfs`), an `fdatasync` that starts while another of the same
/// file is in flight was seen to return at once without making a
/// completed `O_DIRECT` write durable (Linux 6.18, under the crash
/// replay). `false` where `fstatfs` fails.
pub(crate) fn syncs_one_at_a_time(file: &File) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `fstatfs` writes one `statfs` into `st`, which has room for
    // it, and reads only the descriptor, which `file` keeps open.
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if r != 0 {
        return false;
    }
    // SAFETY: `fstatfs` returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // `f_type`'s type differs by architecture (a signed 32-bit one holds
    // the magic as a negative number): its low 32 bits are the magic.
    st.f_type as u32 == BTRFS_SUPER_MAGIC
}

/// The file system's largest file length (`s_maxbytes`), by binary search
/// with `lseek(SEEK_SET)`, which Linux refuses with `EINVAL` past it
/// (about 63 calls, once at open; the file position is left anywhere).
/// `None` where `lseek` does not behave so.
pub(crate) fn max_file_size(file: &File) -> Option<u64> {
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

/// `/sys/dev/block/MAJ:MIN/queue/NAME` (or the parent disk's), trimmed.
pub(crate) fn queue_attr(file: &File, name: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = file.metadata().ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    ["queue", "../queue"]
        .iter()
        .find_map(|dir| std::fs::read_to_string(format!("{base}/{dir}/{name}")).ok())
        .map(|s| s.trim().to_string())
}
