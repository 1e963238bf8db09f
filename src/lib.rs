//! # pagewriter
//!
//! The layer a storage engine puts between its B-tree (or LSM) and the
//! disk. Many threads dirty pages in a bounded write buffer; a flush drains
//! it under short locks, sorts by offset, coalesces contiguous pages into
//! runs and writes each run with one call; [`PagedCachedFile::sync`] is a
//! durable commit shared by the threads that commit together.
//!
//! ```
//! use pagewriter::{Config, PagedCachedFile};
//!
//! fn main() -> pagewriter::Result<()> {
//!     let path = std::env::temp_dir().join(format!("crate-doc-{}.db", std::process::id()));
//!     let file = PagedCachedFile::open(&path, Config::default())?;
//!     // Threads write pages and commit; commits that arrive together share
//!     // one write per run of contiguous pages and one fdatasync.
//!     std::thread::scope(|s| {
//!         for t in 0..4u64 {
//!             let file = &file;
//!             s.spawn(move || {
//!                 file.write_page(t * 4096, &[t as u8; 4096]).unwrap();
//!                 file.sync().unwrap(); // durable when it returns
//!             });
//!         }
//!     });
//!     {
//!         // A guard over the newest bytes of a page; dropping it buffers them.
//!         let mut page = file.write(4096, 4096)?;
//!         page[..5].copy_from_slice(b"hello");
//!     }
//!     file.close()?; // syncs what is buffered
//!
//!     let file = PagedCachedFile::open(&path, Config::default())?;
//!     assert_eq!(&file.read(4096, 4096)?[..5], b"hello");
//!     assert!(file.read(3 * 4096, 4096)?.iter().all(|&b| b == 3));
//!     file.close()?;
//!     std::fs::remove_file(&path).map_err(|e| pagewriter::Error::io("remove", None, e))
//! }
//! ```
//!
//! [`PagedCachedFile`] is a composition of components (write buffer, read
//! cache, lengths, durability, lifecycle, torn-page protection, flush
//! pipeline, commit); [`Config`] sets it up, [`IoMode`] says what is in
//! force, [`Stats`] counts what it did, [`Error`] is every failure.
//! [`backend`] is where bytes go (files, `O_DIRECT`, io_uring rings),
//! [`buffer`] the aligned page memory. The tools (data generator,
//! benchmarks, the `pagewriter` CLI) are the crate `pagewriter-bench`.
//!
//! # Features
//!
//! - `io-uring` (default): the io_uring flush engine
//!   ([`FlushEngine::IoUring`], and [`FlushEngine::Auto`]'s first choice).
//!   Linux only; elsewhere, and without the feature, the engines are the
//!   `pwritev` ones and `Auto` picks [`FlushEngine::Vectored`].
//! - `serde`: `serde::Serialize` for the report types ([`IoMode`],
//!   [`Stats`], ...), for tools that print them as JSON.
//! - `testing`: the `testing` module: `FaultyBackend` (scheduled write and
//!   `fdatasync` failures), `CrashBackend` (power cuts: unsynced writes
//!   kept, dropped or torn at 512-byte sectors), the reference-model
//!   checker and scratch file systems, for testing an engine built on top
//!   (`examples/fault_injection.rs`). Enable it in an engine's
//!   dev-dependencies.
//! - `shuttle`: builds the file's locks and atomics on shuttle for the
//!   crate's own model check; not for use outside `shuttle::check_*`.
//!
//! # Examples
//!
//! `examples/embed.rs` (the engine API in one place), `kv_log.rs` (a
//! key-value store on an append-only page log, checked after `kill -9`),
//! `fault_injection.rs` (the `testing` backends and the model checker),
//! `pipelined.rs` (writers and tickets in flight).

pub mod backend;
pub mod buffer;
mod cached_file;
#[cfg(any(test, feature = "testing"))]
pub mod coalesce;
#[cfg(not(any(test, feature = "testing")))]
mod coalesce;
pub mod error;
mod format;
pub(crate) mod sync;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{DirectIo, FileBackend, FlushEngine, MemoryBackend, OpenOptions, StorageBackend};
pub use cached_file::{
    CommitTicket, Config, GrowAhead, IoMode, MAX_GROW_WINDOW, MAX_PAGE_SIZE, PageRef,
    PagedCachedFile, Stats, TornWrites, WritablePage, Writer,
};
pub use error::{Error, Result};
pub use format::doublewrite::Recovery;

/// The README's code blocks, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// `docs/api.md`'s code blocks, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/api.md")]
pub struct ApiDoctests;
