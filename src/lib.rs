//! # pagewriter
//!
//! The layer a storage engine puts between its B-tree (or LSM) and the
//! disk. Many threads dirty pages in a bounded write buffer; a flush drains
//! it under short locks, sorts by offset, coalesces contiguous pages into
//! runs and writes each run with one `pwritev`; [`PagedCachedFile::sync`]
//! is a durable commit with group commit across threads.
//!
//! ```
//! use pagewriter::{Config, MemoryBackend, PagedCachedFile};
//!
//! let file = PagedCachedFile::new(MemoryBackend::new(), Config::default())?;
//! file.write_page(0, &[7u8; 4096])?;
//! {
//!     let mut page = file.write(4096, 4096)?; // current contents (zeros here)
//!     page[..5].copy_from_slice(b"hello");
//! } // dropping the guard puts the page in the write buffer
//! assert_eq!(&file.read(4096, 4096)?[..5], b"hello");
//! file.sync()?; // both pages durable (one pwritev, one fdatasync)
//! # Ok::<(), pagewriter::Error>(())
//! ```
//!
//! Layout: [`backend`] (where bytes go), [`buffer`] (aligned page memory),
//! [`coalesce`] (pages -> runs), [`PagedCachedFile`] (write buffer, flush,
//! group commit), [`workload`] (the benchmarks the CLI and benches share).

pub mod backend;
pub mod buffer;
pub mod cached_file;
pub mod coalesce;
pub mod datagen;
pub mod error;
pub mod stream;
pub(crate) mod sync;
pub mod testing;
pub mod workload;

pub use backend::{FileBackend, MemoryBackend, OpenOptions, StorageBackend};
pub use cached_file::{
    Config, DirectIo, FlushEngine, IoMode, PageRef, PagedCachedFile, Stats, WritablePage,
};
pub use error::{Error, Result};
