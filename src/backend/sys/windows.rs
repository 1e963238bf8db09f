//! Windows: positioned `ReadFile`/`WriteFile` (std's `seek_read` and
//! `seek_write`), one write per run (a run whose pages lie apart in memory
//! is gathered into one buffer first), `FlushFileBuffers` (std's
//! `sync_data`), unbuffered I/O (`FILE_FLAG_NO_BUFFERING`) at the volume's
//! sector alignment, the file's identity from `GetFileInformationByHandle`.
//!
//! `WriteFileGather` is not used: it takes only whole system pages of
//! memory, only on a handle opened unbuffered and overlapped.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::windows::fs::{FileExt, OpenOptionsExt};
use std::os::windows::io::AsRawHandle;
use std::path::Path;

use windows_sys::Win32::Storage::FileSystem as fs;

use crate::backend::device::{AtomicUnit, DioAlign};
use crate::buffer::AlignedBuf;

pub(crate) const VECTORED_WRITE: &str = "WriteFile per run";
pub(crate) const SYNC: &str = "FlushFileBuffers";
pub(crate) const DIRECT_IO: Option<&str> = Some("FILE_FLAG_NO_BUFFERING");
pub(crate) const ATOMIC_WRITES: bool = false;

/// Asks the open for unbuffered I/O: `FILE_FLAG_NO_BUFFERING`.
pub(crate) fn open_direct(o: &mut std::fs::OpenOptions) {
    o.custom_flags(fs::FILE_FLAG_NO_BUFFERING);
}

/// Nothing to do after an unbuffered open.
pub(crate) fn after_open_direct(_file: &File) -> io::Result<()> {
    Ok(())
}

/// Unbuffered I/O's alignment: offsets and lengths a multiple of the
/// volume's logical sector size, buffers aligned to its physical sector
/// size (`GetFileInformationByHandleEx(FileStorageInfo)`; Microsoft's
/// "File Buffering" page). 4096 for both where the volume does not say.
pub(crate) fn dio_align(file: &File) -> io::Result<DioAlign> {
    // SAFETY: FILE_STORAGE_INFO is plain old data; all-zero is valid.
    let mut info: fs::FILE_STORAGE_INFO = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is open for as long as `file`; `info` is a live,
    // writable FILE_STORAGE_INFO of the size passed.
    let ok = unsafe {
        fs::GetFileInformationByHandleEx(
            file.as_raw_handle(),
            fs::FileStorageInfo,
            (&raw mut info).cast(),
            std::mem::size_of::<fs::FILE_STORAGE_INFO>() as u32,
        )
    };
    let sane = |n: u32| (n.is_power_of_two() && (512..=65536).contains(&n)).then_some(n);
    let (logical, physical) = if ok != 0 {
        (
            sane(info.LogicalBytesPerSector),
            sane(info.PhysicalBytesPerSectorForPerformance),
        )
    } else {
        (None, None)
    };
    let offset = logical.unwrap_or(4096);
    Ok(DioAlign {
        memory: physical.unwrap_or(4096).max(offset),
        offset,
    })
}

/// None: no atomic writes here.
pub(crate) fn atomic_unit(_file: &File) -> Option<AtomicUnit> {
    None
}

/// `Unsupported`: callers take it as "not needed".
pub(crate) fn allocate(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
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

thread_local! {
    /// The gather buffer of this thread's writes of scattered runs, grown
    /// to the largest (at most the backend's `max_write_bytes`, which
    /// caps what one call is handed).
    static GATHER: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// One `WriteFile` at `offset` of `bufs`: a single slice as it is, several
/// gathered into one buffer first (aligned to 4096, for unbuffered
/// handles; pages adjacent in memory are copied too, since no Rust slice
/// may span two of them). The bytes written.
pub(crate) fn write_gather_at(file: &File, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<usize> {
    let mut nonempty = bufs.iter().filter(|b| !b.is_empty());
    let Some(first) = nonempty.next() else {
        return Ok(0);
    };
    if nonempty.next().is_none() {
        return file.seek_write(first, offset);
    }
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    GATHER.with_borrow_mut(|slot| {
        if slot.as_ref().is_none_or(|b| b.len() < total) {
            let cap = total.next_power_of_two().max(4096);
            *slot = Some(
                AlignedBuf::try_zeroed(cap, 4096)
                    .ok()
                    .flatten()
                    .ok_or(io::ErrorKind::OutOfMemory)?,
            );
        }
        let buf = slot.as_mut().expect("filled above");
        let mut at = 0;
        for b in bufs {
            buf[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        file.seek_write(&buf[..total], offset)
    })
}

/// `Unsupported`: no atomic writes here.
pub(crate) fn write_atomic_at(_file: &File, _buf: &[u8], _offset: u64) -> io::Result<usize> {
    Err(io::ErrorKind::Unsupported.into())
}

/// One `ReadFile` at `offset` into the first non-empty slice; the bytes
/// read, 0 at the end of the file.
pub(crate) fn read_scatter_at(
    file: &File,
    bufs: &mut [IoSliceMut<'_>],
    offset: u64,
) -> io::Result<usize> {
    match bufs.iter_mut().find(|b| !b.is_empty()) {
        Some(b) => file.seek_read(b, offset),
        None => Ok(0),
    }
}

/// One positioned `WriteFile`.
pub(crate) fn write_at(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    file.seek_write(buf, offset)
}

/// One positioned `ReadFile`.
pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.seek_read(buf, offset)
}

/// `None`: one sync lane here.
pub(crate) fn reopen(_file: &File) -> io::Result<Option<File>> {
    Ok(None)
}

/// Whether `fdatasync`s of `file` must run one at a time: never asked
/// here (a file has one sync lane).
pub(crate) fn syncs_one_at_a_time(_file: &File) -> bool {
    false
}

/// `i64::MAX`: the largest offset the positional calls take (`LARGE_INTEGER` is
/// signed). The file system's own limit is not probed here; a write past
/// it fails when it is made.
pub(crate) fn max_file_size(_file: &File) -> Option<u64> {
    Some(i64::MAX as u64)
}

/// `None`: block queue attributes are Linux's sysfs.
pub(crate) fn queue_attr(_file: &File, _name: &str) -> Option<String> {
    None
}

/// `(volume serial number, file index)` from `GetFileInformationByHandle`:
/// which file this is, whatever path reached it.
pub(crate) fn file_identity(file: &File) -> io::Result<(u64, u64)> {
    // SAFETY: BY_HANDLE_FILE_INFORMATION is plain old data; all-zero is
    // valid.
    let mut info: fs::BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is open for as long as `file`; `info` is live and
    // writable for the call.
    if unsafe { fs::GetFileInformationByHandle(file.as_raw_handle(), &mut info) } == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((
        u64::from(info.dwVolumeSerialNumber),
        (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow),
    ))
}

/// The bytes free on the volume holding an open file: not asked here
/// (`GetDiskFreeSpaceExW` takes a path, which a handle does not keep).
pub(crate) fn free_space_of(_file: &File) -> io::Result<u64> {
    Err(io::ErrorKind::Unsupported.into())
}

/// `GetDiskFreeSpaceExW`: the bytes free to this user on the volume
/// holding `path` (a file's own directory when `path` is a file).
/// Nothing: a directory cannot be opened for a flush here, and NTFS logs
/// a file's creation in its own journal.
pub(crate) fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

pub(crate) fn free_space(path: &Path) -> io::Result<u64> {
    use std::os::windows::ffi::OsStrExt;
    let dir = if path.is_file() {
        path.parent().unwrap_or(path)
    } else {
        path
    };
    let wide: Vec<u16> = dir.as_os_str().encode_wide().chain(Some(0)).collect();
    if wide[..wide.len() - 1].contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path holds a NUL character",
        ));
    }
    let mut avail = 0u64;
    // SAFETY: `wide` is NUL-terminated and lives for the call; `avail` is
    // writable; the two other outputs are optional (null).
    let ok = unsafe {
        fs::GetDiskFreeSpaceExW(
            wide.as_ptr(),
            &mut avail,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(avail)
}
