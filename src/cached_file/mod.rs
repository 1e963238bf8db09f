//! [`PagedCachedFile`]: a write buffer of dirty pages over a
//! [`StorageBackend`](crate::StorageBackend), with coalesced flushes and
//! commits that share `fdatasync`s.
//!
//! # Where a page lives
//!
//! The newest version of a page is in exactly one of these places, searched
//! in this order by [`PagedCachedFile::read`]:
//!
//! 1. the write buffer: a stripe's dirty map;
//! 2. the in-flight generations: what each running flush drained (a
//!    commit's, until its `fdatasync` returned), youngest last;
//! 3. the read cache of clean pages (optional);
//! 4. the backend.
//!
//! A page moves 1 -> 2 under its stripe lock (a map swap, no I/O). It
//! leaves 2 only after its write completed (for a commit, its `fdatasync`)
//! and the read cache was updated, so a reader that misses 1 and 2 finds
//! it in 3 or 4. A generation sharing a page with an older one retires
//! after it, so a younger version in flight always shadows an older one.
//!
//! # The components, from the bottom up
//!
//! | file | owns |
//! |---|---|
//! | `config.rs` | the settings, what is in force (`IoMode`), the counters (`Stats`) |
//! | `lifecycle.rs` | open / closed / poisoned / read-only; write calls in progress; the close handshake |
//! | `length.rs` | logical, disk and written lengths; the shrink sequence |
//! | `durability.rs` | the write sequence, the durable watermark, the `fdatasync`s; tickets and the committer |
//! | `generations.rs` | the in-flight generations in drain order, the write latch's bookkeeping |
//! | `write_buffer.rs` | dirty and in-flight pages in stripes, the page pool, room, guard latches |
//! | `torn.rs` | atomic piece size, or the doublewrite area (its records: `format`) |
//! | `grow.rs` | grow-ahead's trailer (`Window`) and filler thread |
//! | `write.rs` | write slots, the `pwritev` writer and the ring: how runs become write calls |
//! | `read.rs` | the read cache; `Parts` (the components borrowed together) and the read path |
//! | `batch.rs` | a batch: one drain's pages, their requeue and retire |
//! | `flush.rs` | the flush pipeline: the drain lock over the file's size, drain, write, settle |
//! | `size.rs` | the file's size changes: `set_len`, grow-ahead's room, `refresh` |
//! | `file.rs` | the entry points, and opening |
//! | `commit.rs` | the one commit (`sync`, `sync_async`, `Writer`) |
//!
//! Each file imports only from the files above it in this table.
//!
//! # Words
//!
//! A **write** puts bytes in the write buffer (`write_page`,
//! `write_all_at`, or a guard from `write` / `overwrite`); a **drain**
//! moves dirty pages into a **batch** (one in-flight generation); a
//! **flush** drains and writes a batch to the OS; a batch **settles** when
//! it leaves flight; an **`fdatasync`** is the system call; a **commit**
//! makes writes durable, of the whole file or of one writer's pages, and
//! is done once the **durable watermark** covers the write-sequence step
//! that counted them.
//!
//! # Lock order
//!
//! `closer` (a `close`, which then commits) -> drain lock -> ring ->
//! generations -> stripe -> cache stripe. Leaves: the room counter,
//! `close_wait`, `unstaged_at`, the `fdatasync` state, the commit queue,
//! the scratch vectors, the write slots, the doublewrite area's lock,
//! grow-ahead's filler lock. An `fdatasync` may be waited for with the
//! drain lock held, and a thread in `fdatasync` never takes it. No I/O
//! happens under a stripe or cache lock.

mod batch;
mod commit;
mod config;
mod durability;
mod file;
mod flush;
mod generations;
mod grow;
mod length;
mod lifecycle;
mod read;
mod size;
mod torn;
mod write;
mod write_buffer;

pub use commit::Writer;
pub use config::{Config, GrowAhead, IoMode, MAX_GROW_WINDOW, MAX_PAGE_SIZE, Stats, TornWrites};
pub use durability::CommitTicket;
pub use file::PagedCachedFile;
pub use write_buffer::{PageRef, WritablePage};

#[cfg(feature = "testing")]
pub(crate) use crate::format::trailer::MAGIC as GROW_TRAILER_MAGIC;
