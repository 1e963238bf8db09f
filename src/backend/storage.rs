//! The [`StorageBackend`] trait: a flat, byte-addressed file that pages
//! are read from and written to, and the io_uring fail point a test
//! backend hands the ring ([`UringFault`]).

use std::io::{self, IoSlice, IoSliceMut};

use super::device::{AtomicUnit, DioAlign};

/// A fault a test backend asks an io_uring flush to act out for one write:
/// the io_uring fail point. Its hook, `StorageBackend::uring_fault`, exists
/// only with the `testing` feature (io_uring writes go to the file
/// descriptor directly, past the trait's write methods).
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

/// A flat file of bytes that pages are read from and written to.
///
/// Implementations must be `Send + Sync`: the write buffer calls them from
/// whichever thread flushes, while readers call `read_exact_at` from theirs.
///
/// Errors are plain [`io::Error`]s; the cached file wraps them with the
/// operation and offset. A write method returns `Ok` only when every byte was
/// handed to the OS: short writes are continued, never reported as success.
///
/// Below every component of `cached_file/`: the only way bytes reach a file.
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

    /// Fills `bufs` back to back from byte `offset`, as if they were one
    /// buffer. Reading past the end is `io::ErrorKind::UnexpectedEof`.
    ///
    /// The default is one [`read_exact_at`](Self::read_exact_at) per slice;
    /// [`FileBackend`](crate::FileBackend) overrides it with `preadv`.
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

    /// Writes `bufs` back to back starting at byte `offset`, as if they were
    /// one buffer. `bufs` may be modified (advanced past written bytes).
    ///
    /// The default is a loop of [`write_all_at`](Self::write_all_at), one call
    /// per slice; [`FileBackend`](crate::FileBackend) overrides it with `pwritev`.
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
    /// end (grow-ahead's filler: blocks written ahead of the data). The
    /// default writes them from a zeroed buffer of at most 1 MiB, aligned
    /// for `O_DIRECT`; [`FileBackend`](crate::FileBackend) first tries
    /// `fallocate(FALLOC_FL_WRITE_ZEROES)` (Linux 6.17+, where the device
    /// zeroes without the bytes moving). On an `O_DIRECT` backend `offset`
    /// and `len` are multiples of its alignment (the filler writes whole
    /// pages).
    ///
    /// Errors: the writes' (`ENOSPC`, ...). Panics: none.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        zero_writes(offset, len, |at, zeros| self.write_all_at(at, zeros))
    }

    /// Frees the blocks of `len` bytes at `offset` inside the file, which
    /// then read as zeros; the file's size stays
    /// (`fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`). Default:
    /// `Unsupported`.
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

    /// Makes every completed write durable (`fdatasync`).
    ///
    /// An error here is treated by the cached file as fatal (poison), since
    /// the OS may have dropped the pages it failed to write back.
    fn sync_data(&self) -> io::Result<()>;

    /// How many `fdatasync`s may run at once, each on its own lane (see
    /// [`sync_data_on`](Self::sync_data_on)). Default 1.
    fn sync_lanes(&self) -> usize {
        1
    }

    /// `fdatasync` on lane `lane` (`< sync_lanes()`). Calls on different
    /// lanes may overlap; calls on one lane never do. Each lane must see
    /// every writeback error that happens after its previous call, so a
    /// file backend gives each lane its own open file description (Linux
    /// reports a writeback error once per open file description, so two
    /// concurrent calls on one description could hide an error from one of
    /// them). Default: [`sync_data`](Self::sync_data).
    fn sync_data_on(&self, lane: usize) -> io::Result<()> {
        let _ = lane;
        self.sync_data()
    }

    /// The `O_DIRECT` alignment when every I/O of this backend bypasses the
    /// page cache and must be aligned; `None` for buffered I/O (default).
    fn dio_align(&self) -> Option<DioAlign> {
        None
    }

    /// The largest file length in bytes the storage can hold, where known
    /// (a file system's maximum file size). Writes reaching past it are
    /// refused when they are made, instead of failing at every flush.
    /// Default: `None` (unknown).
    fn max_file_size(&self) -> Option<u64> {
        None
    }

    /// The open file, for engines that lock byte ranges or query it
    /// themselves. Default: `None` (no file behind this backend).
    fn file(&self) -> Option<&std::fs::File> {
        None
    }

    /// The untearable write sizes of this file, where it has them (see
    /// [`AtomicUnit`]). Default: `None`. [`FileBackend`](crate::FileBackend) reports them for a
    /// file opened with `O_DIRECT` on a file system that offers them.
    fn atomic_write_unit(&self) -> Option<AtomicUnit> {
        None
    }

    /// Writes `buf` at `offset` as one atomic write (`pwritev2` with
    /// `RWF_ATOMIC`): after a power cut the
    /// device holds all of it or none of it. `buf` is one memory segment;
    /// its length and `offset` must fit [`atomic_write_unit`](Self::atomic_write_unit).
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
