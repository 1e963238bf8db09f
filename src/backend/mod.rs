//! Where bytes go: the [`StorageBackend`] trait and its implementations.
//!
//! A backend is a flat, byte-addressed file. It does no caching of its own;
//! [`PagedCachedFile`](crate::PagedCachedFile) sits above it. All methods take
//! `&self` and may be called from many threads at once.
//!
//! From the bottom up: `device.rs` (what a file and its device ask:
//! alignment, atomic units, iovec caps), `sys/` (one file per platform),
//! `storage.rs` (the trait), `file.rs` ([`FileBackend`]) and `memory.rs`
//! ([`MemoryBackend`]), `engine.rs` (the engine and `O_DIRECT` a user
//! names), `open.rs` (opening with the `O_DIRECT` policy), `ring/` (the
//! io_uring loop), `range_lock.rs` (byte-range locks). This file only
//! names them.

mod device;
mod engine;
mod file;
mod memory;
mod open;
pub mod range_lock;
#[cfg(all(target_os = "linux", feature = "io-uring"))]
pub mod ring;
#[cfg(not(all(target_os = "linux", feature = "io-uring")))]
#[path = "no_ring.rs"]
pub(crate) mod ring;
mod storage;
mod sys;

pub use crate::error::short_error;
pub use device::{AtomicUnit, DioAlign, IOV_MAX};
pub use engine::{DEFAULT_QUEUE_DEPTH, DirectIo, FlushEngine, MAX_QUEUE_DEPTH};
pub(crate) use file::reopen_description;
pub use file::{
    DEFAULT_MAX_WRITE_BYTES, FileBackend, MAX_SYNC_LANES, OpenOptions, SyscallCounts, free_space,
    queue_attr,
};
pub use memory::MemoryBackend;
pub use open::{open_with_direct, open_with_options};
pub use storage::{StorageBackend, UringFault};
pub(crate) use sys::file_identity;
pub use sys::{PLATFORM, Platform};
