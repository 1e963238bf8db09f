//! What a file and its device ask of the I/O made on it: the `O_DIRECT`
//! alignment ([`DioAlign`]), the sizes of untearable writes
//! ([`AtomicUnit`]) and the most iovecs one call takes ([`IOV_MAX`]).
//! Plain values, probed by the platform code in `sys/` and read by
//! everything above it.

/// Most iovecs one vectored write is handed: 1024 (`IOV_MAX` on Linux,
/// macOS and FreeBSD; the same cap on Windows, where a run is gathered).
pub const IOV_MAX: usize = 1024;

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

/// The write sizes a file takes as untearable `RWF_ATOMIC` writes, from
/// `statx(STATX_WRITE_ATOMIC)` (Linux 6.11+): a write of `min..=max` bytes,
/// a power of two, at an offset that is a multiple of its length, in at
/// most `segments_max` memory segments, reaches the device whole or not at
/// all across a power cut. On XFS over this crate's test disk: 4096,
/// 1 MiB, 1 segment, under `O_DIRECT` only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AtomicUnit {
    /// Smallest atomic write in bytes (a power of two).
    pub min: u32,
    /// Largest atomic write in bytes (a power of two).
    pub max: u32,
    /// Most memory segments (iovecs) in one atomic write; at least 1.
    pub segments_max: u32,
    /// The largest atomic write the block device does itself
    /// (`queue/atomic_write_unit_max_bytes` in sysfs), 0 where it has none
    /// or it is unknown. Larger atomic writes the file system emulates:
    /// XFS (6.16+) writes them out of place and remaps the blocks in a log
    /// transaction, which costs more than a plain write.
    pub device_max: u32,
}

impl AtomicUnit {
    /// Whether a write of `len` bytes at `offset` meets the unit: a power
    /// of two in `min..=max`, `offset` a multiple of `len`.
    pub fn fits(&self, offset: u64, len: usize) -> bool {
        len.is_power_of_two()
            && len >= self.min as usize
            && len <= self.max as usize
            && offset.is_multiple_of(len as u64)
    }
}
