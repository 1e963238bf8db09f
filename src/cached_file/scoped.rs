//! [`Writer`]: a scope of promise over the shared file. Its writes go into
//! the same write buffer as every other (reads, coalescing and the bound
//! are shared); its [`commit`](Writer::commit) promises only the pages
//! written through it, so it never waits for another writer's writes, and
//! it has no leader: the committing thread drains its own pages, writes
//! them, and waits for an `fdatasync` that began after those writes
//! completed, or issues one (`Durability::sync_to`).
//!
//! Owns: the page numbers written through the writer since its last
//! commit, the `write_seq` step of its latest large write through (its
//! commit needs an `fdatasync` covering it), whether large writes go
//! through (not after an asynchronous commit), and scratch space for its
//! commits. Calls: the file's write
//! entry points (recording the pages they buffer) and its scoped commits
//! (`PagedCachedFile::commit_scope`, `commit_scope_async`).

use super::file::PagedCachedFile;
use super::guard::WritablePage;
use super::through::{self, Through, Written};
use super::ticket::CommitTicket;
use crate::error::Result;

/// A handle for writes whose commit promises exactly what was written
/// through it: one per thread, or per transaction, from
/// [`PagedCachedFile::writer`]. `Send`: a transaction may move between
/// threads; not `Sync` (one user at a time, like the transaction it
/// serves).
///
/// [`write_page`](Self::write_page), [`write_all_at`](Self::write_all_at)
/// and [`write`](Self::write) do what the file's methods of the same names
/// do, with the same checks and typed errors; the writer also notes which
/// pages they buffered. [`commit`](Self::commit) makes those pages durable;
/// [`commit_async`](Self::commit_async) starts the same commit and returns
/// a [`CommitTicket`] at once. Pages other writers (or the file's own
/// methods) wrote are not promised by this writer's commit, and their
/// writes are not waited for; reads see every writer's newest bytes.
///
/// Component: commit (scoped commits: `cached_file/scoped.rs`).
pub struct Writer<'a> {
    file: &'a PagedCachedFile,
    /// Page numbers written through this writer since its last commit
    /// (repeats allowed; sorted by stripe at commit).
    pages: Vec<u64>,
    /// Scratch: generations holding the scope's pages in flight.
    in_flight: Vec<u64>,
    /// Scratch of commits written from the write buffer (boxed on the
    /// first: a writer stays small and free to make).
    scratch: Option<Box<through::Scratch>>,
    /// The `write_seq` step of this writer's latest write through since
    /// its last commit (0: none): the commit needs an `fdatasync` covering
    /// it.
    written_through: u64,
    /// Whether large writes go through: the writer's latest commit was a
    /// blocking one (or it has made none). After
    /// [`commit_async`](Writer::commit_async) they go into the buffer, so
    /// the thread keeps writing while its commits run.
    writes_through: bool,
}

impl PagedCachedFile {
    /// A [`Writer`] over this file: writes whose commit promises only
    /// what was written through it (see there). Cheap: it allocates only
    /// as it records pages.
    pub fn writer(&self) -> Writer<'_> {
        Writer {
            file: self,
            pages: Vec::new(),
            in_flight: Vec::new(),
            scratch: None,
            written_through: 0,
            writes_through: true,
        }
    }
}

impl<'a> Writer<'a> {
    /// The file this writer writes.
    pub fn file(&self) -> &'a PagedCachedFile {
        self.file
    }

    /// Writes whole pages at `offset`, as [`PagedCachedFile::write_page`]
    /// (same checks and errors), and adds them to this writer's commit.
    /// After an error the pages buffered before it are in the commit too.
    ///
    /// A large write (whole pages of at least
    /// [`Config::write_through_min_bytes`](crate::Config::write_through_min_bytes),
    /// 64 KiB by default) goes straight to disk where it can: one `pwrite`
    /// from `data` now, no copy into the write buffer, and the commit then
    /// needs only an `fdatasync` that began after that write (counted in
    /// [`Stats::through_writes`](crate::Stats::through_writes)). It can
    /// where [`write_and_commit`](Self::write_and_commit) could write
    /// through (whole pages in written space inside the file's length on
    /// disk, no other version of them buffered, in flight or under a
    /// guard, no torn-page protection or grow-ahead window, `data` aligned
    /// for `O_DIRECT`), and also in space unwritten on disk (holes and
    /// unwritten extents, as [`commit`](Self::commit) says) or past the
    /// file's end (the write grows the file and its length at once) while
    /// no [`PagedCachedFile::sync`] or commit that allocates is under way
    /// on another thread (otherwise its commit joins theirs: they are
    /// grouped); its commit's `fdatasync` then commits the allocation and
    /// the new size with the data. All that while this writer's latest
    /// commit was a blocking
    /// one (after [`commit_async`](Self::commit_async) its writes go into
    /// the buffer, so the thread does not wait for them), and while no
    /// `fdatasync` of the file is in flight (with other threads committing
    /// at once, commits written from the buffer complete sooner). Where
    /// the write through fails, `data` goes into the write buffer and the
    /// call returns `Ok`: the commit writes the pages again and reports
    /// what fails then (where the process has no memory for that copy, the
    /// error, op "pwrite", is returned here and names the pages). Until
    /// the commit, bytes written through are no more durable than buffered
    /// ones; reads see them either way.
    pub fn write_page(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        if self.wrote_through(offset, data)? {
            return Ok(());
        }
        let pages = &mut self.pages;
        self.file
            .write_page_recorded(offset, data, &mut |p| pages.push(p))
    }

    /// Writes any bytes at `offset`, as [`PagedCachedFile::write_all_at`]
    /// (same checks and errors), and adds the pages they touch to this
    /// writer's commit. After an error the pages buffered before it are in
    /// the commit too. Whole pages of
    /// [`Config::write_through_min_bytes`](crate::Config::write_through_min_bytes)
    /// or more go straight to disk where they can, as
    /// [`write_page`](Self::write_page) says.
    pub fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> Result<()> {
        if self.wrote_through(offset, buf)? {
            return Ok(());
        }
        let pages = &mut self.pages;
        self.file
            .write_all_at_recorded(offset, buf, &mut |p| pages.push(p))
    }

    /// A large write through (see [`write_page`](Self::write_page)):
    /// `true` where `buf` went to disk, or into the buffer after the
    /// write failed; `false` where the buffered way should write it.
    fn wrote_through(&mut self, offset: u64, buf: &[u8]) -> Result<bool> {
        let large = self
            .file
            .config()
            .write_through_min_bytes
            .is_some_and(|min| buf.len() >= min);
        if !self.writes_through || !large {
            return Ok(false);
        }
        match self.file.write_through(offset, buf, &mut self.pages)? {
            Written::At(step) => {
                self.written_through = self.written_through.max(step);
                Ok(true)
            }
            // The pages are buffered and in this writer's scope.
            Written::Requeued(_) => Ok(true),
            Written::Declined => Ok(false),
        }
    }

    /// A guard over the newest bytes of `len` bytes at `offset`, as
    /// [`PagedCachedFile::write`] (same checks, errors and latching); its
    /// pages join this writer's commit when it is dropped. The guard
    /// borrows the writer: a commit waits for it to be dropped.
    pub fn write(&mut self, offset: u64, len: usize) -> Result<WritablePage<'_>> {
        self.file.write_guard(offset, len, Some(&mut self.pages))
    }

    /// A zeroed guard over `len` bytes at `offset`, as
    /// [`PagedCachedFile::overwrite`], for pages the caller fills whole;
    /// its pages join this writer's commit when it is dropped.
    pub fn overwrite(&mut self, offset: u64, len: usize) -> Result<WritablePage<'_>> {
        self.file.guard(offset, len, Some(&mut self.pages))
    }

    /// Durable commit of this writer's pages: when it returns `Ok`, every
    /// page written through this writer since its previous commit survives
    /// a crash with the bytes it wrote or a later version, together with
    /// the file's length those pages need. It promises nothing about pages
    /// other writers wrote, and, unless it allocates (below), waits
    /// for no other writer's writes but those of its own pages that
    /// another flush took first.
    ///
    /// How: this thread takes its dirty pages out of the write buffer,
    /// writes them from there (one call per run of contiguous pages), and
    /// then needs an `fdatasync` that began after those writes completed:
    /// it returns at once if one has completed, waits for one in flight,
    /// or issues its own (pages a large write already sent to disk, see
    /// [`write_page`](Self::write_page), need only that `fdatasync`).
    /// Where no other thread holds them (in a flush, or
    /// under a guard) and the file has no torn-page protection and no
    /// grow-ahead window, the pages are claimed rather than drained: no
    /// lock the other committers share is taken (counted in
    /// [`Stats::claimed_commits`](crate::Stats::claimed_commits)); while
    /// they are written, reads of them find them and writes of them wait. Commits of
    /// several writers at once each issue theirs (the kernel merges
    /// concurrent cache flushes); none waits for a leader. A writer with
    /// nothing written since its last commit returns at once.
    ///
    /// A commit that allocates is made as [`PagedCachedFile::sync`] makes
    /// its commits instead, promising every page written before it: one
    /// whose pages reach past the file's length on disk (it grows the
    /// file), or lie in space that held no data on disk when the file was
    /// opened (holes, and unwritten extents such as `fallocate` leaves,
    /// where the backend reports them:
    /// [`StorageBackend::unwritten_ranges`](crate::StorageBackend::unwritten_ranges))
    /// or that [`PagedCachedFile::set_len`] added since (whole pages of
    /// the hole it leaves); such a page counts as written once a commit
    /// of it went this way.
    /// Each `fdatasync` after such writes commits the allocation in the
    /// file system's journal, so grouping these commits serves many with
    /// one (counted in
    /// [`Stats::allocating_scoped_commits`](crate::Stats::allocating_scoped_commits)).
    ///
    /// Errors: [`Error::Closed`](crate::Error::Closed);
    /// [`Error::Poisoned`](crate::Error::Poisoned) after a failed
    /// `fdatasync`; [`Error::PagesFailed`](crate::Error::PagesFailed) for
    /// pages that could not be written (they stay dirty and stay in this
    /// writer's next commit; the rest were made durable); `Error::Io` with
    /// op "fdatasync" when the `fdatasync` failed (the file is poisoned).
    /// On an error the writer keeps its pages: a later commit tries them
    /// again.
    pub fn commit(&mut self) -> Result<()> {
        let written = (self.written_through > 0).then_some(self.written_through);
        self.file.commit_scope(
            &mut self.pages,
            &mut self.in_flight,
            &mut self.scratch,
            written,
        )?;
        self.pages.clear();
        self.written_through = 0;
        self.writes_through = true;
        Ok(())
    }

    /// Writes `buf` at `offset` (any offset and length) and commits it
    /// with this writer's other pages: the promise, checks and errors of
    /// [`write_all_at`](Self::write_all_at) followed by
    /// [`commit`](Self::commit).
    ///
    /// Where it can, it skips the write buffer: one `pwrite` straight from
    /// `buf` (no copy), then an `fdatasync` that began after it, as one
    /// stream of `pwrite` + `fdatasync` would, counted in
    /// [`Stats::through_commits`](crate::Stats::through_commits). It can
    /// when `buf` is whole pages at a page-aligned `offset`; this writer
    /// has nothing else to commit; no version of these
    /// pages is buffered, being written, or under a guard; they lie inside
    /// the file's length on disk, in space that holds data (a commit that
    /// allocates is grouped, as `commit` says); the file has no torn-page
    /// protection and no grow-ahead window; and under `O_DIRECT`, `buf`'s
    /// address meets the file's memory alignment
    /// ([`StorageBackend::dio_align`](crate::StorageBackend::dio_align)).
    /// Otherwise it writes into the buffer and commits, with the same
    /// promise. While the write runs, reads and writes of these pages by
    /// other threads wait for it; a shrinking
    /// [`set_len`](PagedCachedFile::set_len) waits for it too.
    ///
    /// `offset` is in bytes; `buf` any length (empty: a commit alone).
    ///
    /// Errors: as `write_all_at` and `commit`. If the write through fails
    /// ([`Error::PagesFailed`](crate::Error::PagesFailed), op "pwrite"),
    /// the pages are put into the write buffer from `buf` and stay in this
    /// writer's next commit, as a failed commit's do (where the process
    /// cannot get memory for that copy, they are not kept: the error still
    /// names them, and the caller writes them again). Panics: none.
    pub fn write_and_commit(&mut self, offset: u64, buf: &[u8]) -> Result<()> {
        if self.pages.is_empty() {
            match self.file.commit_through(offset, buf, &mut self.pages)? {
                Through::Done => {
                    // Its `fdatasync` began after this writer's earlier
                    // writes through too.
                    self.written_through = 0;
                    self.writes_through = true;
                    return Ok(());
                }
                Through::Declined => {}
            }
        }
        self.write_all_at(offset, buf)?;
        self.commit()
    }

    /// Starts a commit of this writer's pages and returns at once, with a
    /// [`CommitTicket`] that resolves once they are durable: the file's
    /// committer thread writes and syncs them (with every other page
    /// written before it: one commit covers every asynchronous commit
    /// asked for meanwhile, of any writer), so this thread may go on
    /// writing at once. Tickets resolve in the order they were asked for.
    ///
    /// Errors: [`Error::Closed`](crate::Error::Closed),
    /// [`Error::Poisoned`](crate::Error::Poisoned) after a failed
    /// `fdatasync`; `Error::Io` with op "start the committer thread". The
    /// commit's errors are the ticket's.
    pub fn commit_async(&mut self) -> Result<CommitTicket> {
        // The ticket covers every write made before it, these writer's
        // writes through included.
        let ticket = self.file.commit_scope_async()?;
        self.pages.clear();
        self.written_through = 0;
        self.writes_through = false;
        Ok(ticket)
    }
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("pages", &self.pages.len())
            .finish_non_exhaustive()
    }
}
