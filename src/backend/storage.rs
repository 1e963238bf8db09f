//! The [`StorageBackend`] trait: a flat, byte-addressed file that pages
//! are read from and written to, and the io_uring fail point a test
//! backend hands the ring ([`UringFault`]).

use std::io::{self, IoSlice, IoSliceMut};

use super::device::{AtomicUnit, DioAlign};

/// A fault a test backend asks an io_uring flush to act out for one write
/// (the hook `StorageBackend::uring_fault`, `testing` feature only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UringFault {
    /// Submit only the first `n` bytes: the kernel makes a real short write
    /// and the engine must resubmit the rest.
    Short(usize),
    /// Complete the SQE with `-errno` instead of its real result.
    Errno(i32),
}
/// Writes `len` zero bytes at `offset` with `write`, from one zeroed
/// buffer of at most 1 MiB aligned for `O_DIRECT` (the default of
/// [`StorageBackend::write_zeroes`]).
pub(crate) fn zero_writes(
    offset: u64,
    len: u64,
    write: impl Fn(u64, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let chunk = len.min(1 << 20) as usize;
    if chunk == 0 {
        return Ok(());
    }
    let zeros = crate::buffer::AlignedBuf::zeroed(chunk, crate::buffer::DEFAULT_ALIGN)
        .ok_or(io::ErrorKind::OutOfMemory)?;
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let n = ((end - at) as usize).min(chunk);
        write(at, &zeros[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// A flat file of bytes that pages are read from and written to: the only
/// way bytes reach a file. `Send + Sync`: flushes and readers call it from
/// their own threads. Errors are plain [`io::Error`]s (the cached file adds
/// the operation and offset); a write returns `Ok` only when every byte was
/// handed to the OS.
pub trait StorageBackend: Send + Sync + std::fmt::Debug {
    /// Current length of the file in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Sets the length in bytes, truncating or extending with zeros.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Fills `buf` from byte `offset`. Reading past the end is
    /// `io::ErrorKind::UnexpectedEof`.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Fills `bufs` back to back from byte `offset` (past the end:
    /// `UnexpectedEof`). Default: one [`read_exact_at`](Self::read_exact_at)
    /// per slice; [`FileBackend`](crate::FileBackend) uses `preadv`.
    fn read_vectored_exact_at(&self, offset: u64, bufs: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs.iter_mut() {
            self.read_exact_at(at, buf)?;
            at += buf.len() as u64;
        }
        Ok(())
    }

    /// Writes all of `buf` at byte `offset`, extending the file if needed.
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;

    /// Writes `bufs` back to back from byte `offset`; `bufs` may be
    /// advanced past written bytes. Default: one
    /// [`write_all_at`](Self::write_all_at) per slice;
    /// [`FileBackend`](crate::FileBackend) uses `pwritev`.
    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs.iter() {
            self.write_all_at(at, buf)?;
            at += buf.len() as u64;
        }
        Ok(())
    }

    /// Reserves blocks for `len` bytes at `offset` and extends the file to
    /// cover them (`fallocate` mode 0); existing data is kept, new bytes
    /// read as zeros. Default: `Unsupported`, which callers treat as "not
    /// needed".
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Writes `len` zero bytes at `offset`, inside the file or past its
    /// end (grow-ahead's filler), from a zeroed buffer of at most 1 MiB by
    /// default; [`FileBackend`](crate::FileBackend) first tries
    /// `fallocate(FALLOC_FL_WRITE_ZEROES)` (Linux 6.17+). Under `O_DIRECT`
    /// `offset` and `len` are multiples of the alignment. Errors: the
    /// writes' (`ENOSPC`, ...).
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        zero_writes(offset, len, |at, zeros| self.write_all_at(at, zeros))
    }

    /// Frees the blocks of `len` bytes at `offset` (they read as zeros,
    /// the size stays: `FALLOC_FL_PUNCH_HOLE`). Default: `Unsupported`.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Bytes free to this user on the file system holding the file
    /// (`fstatvfs`: `f_bavail * f_frsize`), or `None` where unknown (the
    /// default; Windows). Grow-ahead's filler writes zeros only while
    /// enough stays free for the commits.
    fn free_bytes(&self) -> Option<u64> {
        None
    }

    /// Bytes from the start of the file that hold written data: the offset
    /// of its first hole or unwritten extent (the file's length if none),
    /// or `None` where unknown (the default). A write below it allocates
    /// nothing. [`FileBackend`](crate::FileBackend): `lseek(SEEK_HOLE)` on
    /// Linux (ext4, XFS and btrfs report unwritten extents as holes).
    fn data_len(&self) -> Option<u64> {
        None
    }

    /// Makes every completed write durable (`fdatasync`). An error poisons
    /// the cached file: the OS may have dropped the pages it failed to write.
    fn sync_data(&self) -> io::Result<()>;

    /// How many `fdatasync`s may run at once, each on its own lane (see
    /// [`sync_data_on`](Self::sync_data_on)). Default 1.
    fn sync_lanes(&self) -> usize {
        1
    }

    /// `fdatasync` on lane `lane` (`< sync_lanes()`). Calls on different
    /// lanes may overlap, on one lane never. Each lane must see every
    /// writeback error after its previous call, so a file backend gives
    /// each its own open file description (Linux reports a writeback error
    /// once per description). Default: [`sync_data`](Self::sync_data).
    fn sync_data_on(&self, lane: usize) -> io::Result<()> {
        let _ = lane;
        self.sync_data()
    }

    /// The `O_DIRECT` alignment when every I/O of this backend bypasses the
    /// page cache and must be aligned; `None` for buffered I/O (default).
    fn dio_align(&self) -> Option<DioAlign> {
        None
    }

    /// The largest file length in bytes the storage holds, where known:
    /// writes past it are refused when made. Default: `None`.
    fn max_file_size(&self) -> Option<u64> {
        None
    }

    /// The open file, for engines that lock byte ranges (default `None`).
    fn file(&self) -> Option<&std::fs::File> {
        None
    }

    /// The untearable write sizes of this file ([`AtomicUnit`]), where it
    /// has them (`O_DIRECT` on a file system that offers them). Default: `None`.
    fn atomic_write_unit(&self) -> Option<AtomicUnit> {
        None
    }

    /// Writes `buf` (one segment, fitting
    /// [`atomic_write_unit`](Self::atomic_write_unit)) at `offset` as one
    /// atomic write (`pwritev2` with `RWF_ATOMIC`): all of it or none.
    ///
    /// Errors: `Unsupported` (the default) where the backend has no atomic
    /// writes; `InvalidInput` (`EINVAL`) for a size or offset the unit does
    /// not take; a short write is an error (`WriteZero`), never continued:
    /// the rest would not be atomic with it. The caller writes it again.
    fn write_atomic_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let _ = (offset, buf);
        Err(io::ErrorKind::Unsupported.into())
    }

    #[cfg(feature = "testing")]
    /// For test backends: the fault an io_uring flush should act out for
    /// its next write of `len` bytes at `offset` (io_uring writes go to
    /// the [`file`](Self::file) directly, past this trait's write methods).
    /// Default: none.
    fn uring_fault(&self, offset: u64, len: usize) -> Option<UringFault> {
        let _ = (offset, len);
        None
    }
}

impl<B: StorageBackend + ?Sized> StorageBackend for std::sync::Arc<B> {
    fn len(&self) -> io::Result<u64> {
        (**self).len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        (**self).set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_exact_at(offset, buf)
    }
    fn read_vectored_exact_at(&self, offset: u64, bufs: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        (**self).read_vectored_exact_at(offset, bufs)
    }
    fn max_file_size(&self) -> Option<u64> {
        (**self).max_file_size()
    }
    fn file(&self) -> Option<&std::fs::File> {
        (**self).file()
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_all_at(offset, buf)
    }
    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        (**self).write_vectored_all_at(offset, bufs)
    }
    fn sync_data(&self) -> io::Result<()> {
        (**self).sync_data()
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).allocate(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).write_zeroes(offset, len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).punch_hole(offset, len)
    }
    fn free_bytes(&self) -> Option<u64> {
        (**self).free_bytes()
    }
    fn data_len(&self) -> Option<u64> {
        (**self).data_len()
    }
    fn sync_lanes(&self) -> usize {
        (**self).sync_lanes()
    }
    fn sync_data_on(&self, lane: usize) -> io::Result<()> {
        (**self).sync_data_on(lane)
    }
    fn dio_align(&self) -> Option<DioAlign> {
        (**self).dio_align()
    }
    fn atomic_write_unit(&self) -> Option<AtomicUnit> {
        (**self).atomic_write_unit()
    }
    fn write_atomic_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_atomic_at(offset, buf)
    }
    #[cfg(feature = "testing")]
    fn uring_fault(&self, offset: u64, len: usize) -> Option<UringFault> {
        (**self).uring_fault(offset, len)
    }
}
