//! [`PagedCachedFile`]: a write buffer of dirty pages over a
//! [`StorageBackend`](crate::StorageBackend), with coalesced flushes and
//! group commit.
//!
//! # Where a page lives
//!
//! The newest version of a page is in exactly one of these places, searched
//! in this order by [`PagedCachedFile::read`]:
//!
//! 1. the write buffer: a stripe's dirty map, written by writers;
//! 2. the in-flight generations: what each running flush or commit round
//!    drained and is writing or syncing, youngest last (also in the write
//!    buffer's stripes);
//! 3. the read cache of clean pages (optional);
//! 4. the backend.
//!
//! A page moves 1 -> 2 under its stripe lock (one map swap, no I/O), so a
//! reader holding that lock sees it in one of the two. It leaves 2 only
//! after its write completed (and, for a commit round, after the round's
//! `fdatasync`), and after the read cache was updated, so a reader that
//! misses 1 and 2 finds it in 3 or 4. A generation holding a page an older
//! one in flight also holds retires only after every older generation
//! has, so a younger version of a page in flight always shadows an older
//! one; a generation that shares no page with an older one in flight
//! retires as soon as it settles.
//!
//! A page a scoped commit writes through (`through.rs`: straight from the
//! caller's bytes) is in none of 1 to 3 while that write runs: it is
//! claimed in its stripe, readers and writers of it wait there until the
//! write completed, and then find it in 4.
//!
//! # The components
//!
//! `PagedCachedFile` (`file.rs`) holds one of each and calls them; each
//! owns its state and its locks, and says at its top what it owns, what it
//! calls and where it stands in the lock order. From the bottom up:
//!
//! | component | file | owns |
//! |---|---|---|
//! | `Length` | `length.rs` | logical, disk and written lengths; the shrink sequence |
//! | `Lifecycle` | `lifecycle.rs` | open / closed / poisoned / read-only; write calls in progress; the close handshake |
//! | `ReadCache` | `cache.rs` | clean pages in CLOCK stripes |
//! | `WriteBuffer` | `write_buffer.rs` | dirty and in-flight pages in stripes, the page pool, room, guard latches |
//! | `Durability` | `durability.rs` | `write_seq`, the durable watermark, `unstaged_at`, the sync lanes |
//! | `TornProtection` | `torn.rs`, `doublewrite.rs` | atomic piece size, or the doublewrite area and its recovery |
//! | `FlushPipeline` | `flush.rs` (+ `batch_write.rs`, `resize.rs`, `file_size.rs`, `generations.rs`, `slots.rs`, `batch.rs`, `flush_mode.rs`, `through.rs`) | the drain lock over `FileSize` (the file's size on the OS), write slots, in-flight generations, the gate between writes through and cuts |
//! | grow-ahead | `grow.rs` | the trailer (`Window`, in `FileSize`, under the drain lock) and the filler thread (`Filler`, its own lock), held by `FlushPipeline` |
//! | `Commit` | `commit.rs` (+ `group.rs`, `direct.rs`, `chooser.rs`) | group commit rounds (tickets, rounds, their condvars), direct commits, the chooser between them |
//! | `Unwritten` | `unwritten.rs` | the pages unwritten on disk at open (holes, unwritten extents) that no allocating scoped commit wrote since |
//!
//! The read path (`read.rs`) and the guard type (`guard.rs`) own nothing;
//! the run writers (`writer.rs`, `writer_pool.rs`, `gather.rs`) are what a
//! write slot writes with; `open.rs` decides at open what the components
//! are built from, and `io_mode.rs` reports it.
//!
//! # Words
//!
//! One name per idea: a **write** puts bytes in the write buffer
//! (`write_page`, `write_all_at`, or a guard from `write` / `overwrite`);
//! a **drain** moves the dirty pages into a **batch** (one in-flight
//! generation); a **flush** drains and writes a batch to the OS
//! (`FlushPipeline::flush`, or `flush_for_commit` for a commit, which
//! settles its batch only after its `fdatasync`); a batch **settles** when
//! it leaves flight; an **`fdatasync`** is the system call, made on a
//! **sync lane** (an open file description of its own: `sync()`'s
//! commits use `Config::sync_lanes` of them, scoped commits also spare
//! lanes opened on demand); a **commit** makes writes durable (`sync`:
//! everything written before it), as a group commit **round** or a
//! **direct** commit.
//!
//! # Lock order
//!
//! `closer` (a `close`, which then commits) -> commit state ->
//! drain lock -> `slots` -> generations -> stripe -> cache stripe.
//! Leaves (nothing is taken under them): the room counter, `close_wait`,
//! `unstaged_at`, the unwritten pages (`Unwritten`, taken by a scoped
//! commit with no other lock held), the gate of writes through (taken
//! alone, or by a cut under the drain lock, which waits there for the
//! writes through in flight: their holders take no drain lock), the sync
//! lanes, the spare batch
//! vectors, the doublewrite area's lock, grow-ahead's filler lock (taken
//! under the drain lock or alone; a flush may wait on it for the one zero
//! piece in flight). The
//! commit state is released around every call that takes the drain lock or
//! does I/O; a sync lane may be waited for with the drain lock held (a
//! doublewrite checkpoint), and a lane holder never takes the drain lock.
//! No I/O happens under a stripe or cache lock.

// The repository's .project/architecture.md draws the picture and follows
// a write, a flush and a commit through the components.
mod batch;
mod batch_write;
mod cache;
mod chooser;
mod commit;
mod config;
mod direct;
mod doublewrite;
mod durability;
mod file;
mod file_size;
mod flush;
mod flush_mode;
mod gather;
mod generations;
mod group;
mod grow;
mod guard;
mod io_mode;
mod length;
mod lifecycle;
mod open;
mod pages;
mod parts;
mod read;
mod resize;
mod scoped;
mod slots;
mod stats;
mod through;
mod ticket;
mod torn;
mod unwritten;
mod write_buffer;
mod writer;
mod writer_pool;

pub use chooser::CommitStrategy;
pub use config::{
    Config, DEFAULT_WRITE_THREADS, DEFAULT_WRITE_THROUGH_MIN_BYTES, MAX_PAGE_SIZE,
    MAX_ROUNDS_IN_FLIGHT, MAX_STRIPES, MAX_SYNC_LANES, MAX_WRITE_BYTES, MAX_WRITE_THREADS,
};
pub use doublewrite::Recovery;
pub use file::PagedCachedFile;
pub use flush::MAX_DIRECT_WRITERS;
pub use grow::{GrowAhead, MAX_GROW_WINDOW};
pub use guard::WritablePage;
pub use io_mode::IoMode;
pub use pages::PageRef;
pub use scoped::Writer;
pub use stats::Stats;
pub use ticket::CommitTicket;
pub use torn::TornWrites;

#[cfg(feature = "testing")]
pub(crate) use chooser::set_test_tuning;
#[cfg(feature = "testing")]
pub(crate) use grow::MAGIC as GROW_TRAILER_MAGIC;
