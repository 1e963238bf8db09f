//! The operating system under `FileBackend`: one
//! file per platform, each with the same functions, so that nothing above
//! `backend/` names a platform.
//!
//! | | Linux | macOS | FreeBSD | Windows |
//! |---|---|---|---|---|
//! | vectored write | `pwritev`, `pwritev2` | `pwritev` | `pwritev` | one `WriteFile` per run (gathered) |
//! | durable sync | `fdatasync` | `fcntl(F_FULLFSYNC)` | `fdatasync` | `FlushFileBuffers` |
//! | direct I/O | `O_DIRECT`, `statx` alignment | `F_NOCACHE` | `O_DIRECT` | `FILE_FLAG_NO_BUFFERING`, sector alignment |
//! | preallocate | `fallocate` | none | `posix_fallocate` | none |
//! | atomic writes | `RWF_ATOMIC` | none | none | none |
//! | range locks | OFD (`F_OFD_SETLK`) | OFD (`F_OFD_SETLK`) | process (`F_SETLK`) | handle (`LockFileEx`) |
//! | sync lanes | `/proc/self/fd` reopen (one on btrfs) | one | one | one |
//!
//! The durable sync is std's [`File::sync_data`](std::fs::File::sync_data),
//! which calls each platform's own: on Apple targets `fsync` does not flush
//! the drive's write cache, and std calls `fcntl(F_FULLFSYNC)`, which does
//! (Apple's `fsync(2)` man page; SQLite's `fullfsync` pragma makes the same
//! choice).

#[cfg(unix)]
mod unix;

#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod imp;

#[cfg(all(unix, not(target_os = "linux")))]
#[path = "bsd.rs"]
mod imp;

#[cfg(windows)]
#[path = "windows.rs"]
mod imp;

#[cfg(not(any(unix, windows)))]
compile_error!("pagewriter's file backend needs a Unix or Windows target");

pub(crate) use imp::*;

/// What this platform's file backend does: the calls behind each part of
/// `FileBackend`, for reports and for an engine
/// deciding what to ask for. [`PLATFORM`] is the one in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Platform {
    /// `std::env::consts::OS`: `linux`, `macos`, `freebsd`, `windows`, ...
    pub os: &'static str,
    /// The call a vectored flush makes per run.
    pub vectored_write: &'static str,
    /// The call behind `StorageBackend::sync_data`.
    pub sync: &'static str,
    /// How the file bypasses the OS cache under `DirectIo`
    /// `On`/`Auto`; `None` where it cannot (asking `On` is then an
    /// [`Error::Unsupported`](crate::Error::Unsupported)).
    pub direct_io: Option<&'static str>,
    /// Whether the io_uring flush engine exists here (Linux with the
    /// `io-uring` feature).
    pub io_uring: bool,
    /// Whether untearable page writes (`RWF_ATOMIC`,
    /// [`TornWrites::Atomic`](crate::TornWrites::Atomic)) can exist here.
    pub atomic_writes: bool,
    /// Who owns a byte-range lock ([`range_lock`](super::range_lock)).
    pub range_locks: super::range_lock::LockScope,
}

/// The platform this crate was built for.
pub const PLATFORM: Platform = Platform {
    os: std::env::consts::OS,
    vectored_write: imp::VECTORED_WRITE,
    sync: imp::SYNC,
    direct_io: imp::DIRECT_IO,
    io_uring: cfg!(all(target_os = "linux", feature = "io-uring")),
    atomic_writes: imp::ATOMIC_WRITES,
    range_locks: super::range_lock::SCOPE,
};
