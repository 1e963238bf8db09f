//! Commits: every durable call is one function,
//! [`PagedCachedFile::commit`], over a scope (the whole file, or one
//! [`Writer`]'s pages) and a wait (block, or a [`CommitTicket`]):
//!
//! | | block | ticket |
//! |---|---|---|
//! | the whole file | [`PagedCachedFile::sync`], `close` | [`PagedCachedFile::sync_async`] |
//! | a writer's pages | [`Writer::commit`] | [`Writer::commit_async`] |
//!
//! Every commit is a numbered request in the file's commit queue
//! (`Requests`). A *pass* takes every request asked so far, flushes the
//! union of their scopes (`FlushPipeline::flush`, which returns the
//! write-sequence step counting those writes), waits until the watermark
//! covers that step (`Durability::sync_to`) and resolves them. One pass
//! writes at a time; its `fdatasync` runs beside the next pass's writes.
//!
//! A blocking commit ([`Core::commit_now`]) leads a pass on the caller's
//! thread when no pass is writing; otherwise it waits, and the first
//! waiting thread to find the writes done leads the next pass for all of
//! them (group commit without a leader thread). One exception: a writer's
//! commit whose pages all lie in data the file held at open (no hole, no
//! unwritten extent: `Length::dense`), arriving while a pass writes,
//! writes them on its own thread beside that pass and needs its own
//! `fdatasync` ([`Core::commit_alone`]): such an overwrite allocates
//! nothing grouping would share. A ticket's request is led by a blocking
//! commit that comes along or by the file's committer thread, while the
//! caller goes on writing. A writer's commit drains no other writer's
//! pages but those of commits in its pass.
//!
//! Owns: nothing but a [`Writer`]'s scope (the page numbers written
//! through it since its last commit). Calls: the flush pipeline, the
//! durability watermark, the committer and its requests. Locks: only the
//! scratch vectors of scoped drains (`Core::scratch`, a leaf), never held
//! across I/O.

use std::sync::Arc;

use super::config::add;
use super::durability::{Asked, CommitTicket, Pass, Step};
use super::file::{Core, PagedCachedFile};
use super::flush::{Drain, Flushed};
use super::write_buffer::WritablePage;
use crate::error::{Error, Result};

/// What a commit promises.
pub(crate) enum Scope<'a> {
    /// Every page any thread wrote before the call, and the length.
    File,
    /// A writer's pages (repeats allowed; a ticket takes them, a blocking
    /// commit leaves them to the writer) and the length they need.
    Pages(&'a mut Vec<u64>),
}

/// How a commit's caller waits.
pub(crate) enum Wait {
    /// Until the scope is durable.
    Block,
    /// Not at all: a ticket resolves when the committer thread made the
    /// scope durable.
    Ticket,
}

impl Core {
    /// A blocking commit of `scope`: its request joins the queue; the
    /// thread leads a pass where none is writing, else waits for its
    /// request's pass, stepping again whenever the write stage frees (a
    /// writer's overwrite commits alone instead: see the module docs).
    ///
    /// Errors: as [`PagedCachedFile::sync`].
    pub(super) fn commit_now(&self, scope: Scope<'_>) -> Result<()> {
        self.life.check_writable()?;
        let r = match scope {
            Scope::File => self.requests.ask(None),
            // Nothing written through the writer since its last commit.
            Scope::Pages(pages) if pages.is_empty() => return Ok(()),
            Scope::Pages(pages) if self.requests.writing() && self.overwrites(pages) => {
                return self.commit_alone(pages);
            }
            Scope::Pages(pages) => self.requests.ask(Some(pages)),
        };
        loop {
            match self.requests.step(r) {
                Step::Done(outcome) => return outcome,
                Step::Lead(pass) => self.run_pass(pass),
                Step::Wait => {}
            }
        }
    }

    /// Leads `pass`: drains and writes what its requests asked for, frees
    /// the write stage, waits for an `fdatasync` covering those writes,
    /// settles the batch and resolves the requests.
    pub(super) fn run_pass(&self, pass: Pass) {
        let p = self.parts();
        let mut pages = match pass.asked {
            Asked::File => None,
            Asked::Pages(mut pages) => {
                p.buffer.by_stripe(&mut pages);
                Some(pages)
            }
        };
        let mut in_flight = self.scratch.lock().pop().unwrap_or_default();
        let drain = match &pages {
            None => Drain::All,
            Some(pages) => Drain::Pages(pages, &mut in_flight),
        };
        let flushed = self.flush.flush(&p, drain);
        self.requests.wrote();
        self.scratch.lock().push(in_flight);
        let outcome = self.make_durable(flushed);
        if outcome.is_ok() {
            add(&p.counters.commits, pass.hi - pass.lo);
        }
        self.requests.resolve(pass.lo, pass.hi, outcome);
        if let Some(pages) = pages.take() {
            self.requests.give_back(pages);
        }
    }

    /// A writer's commit made beside the pass that is writing, on this
    /// thread alone: its pages overwrite data the file held at open, so no
    /// allocation is shared by waiting for that pass (see the module
    /// docs). Errors: as [`commit_now`](Self::commit_now).
    fn commit_alone(&self, pages: &mut Vec<u64>) -> Result<()> {
        let p = self.parts();
        p.buffer.by_stripe(pages);
        let mut in_flight = self.scratch.lock().pop().unwrap_or_default();
        let flushed = self.flush.flush(&p, Drain::Pages(pages, &mut in_flight));
        self.scratch.lock().push(in_flight);
        let outcome = self.make_durable(flushed);
        if outcome.is_ok() {
            add(&p.counters.commits, 1);
        }
        outcome
    }

    /// Whether every page of `pages` lies in data the file held at open
    /// (`Length::dense`): a write of them allocates nothing.
    fn overwrites(&self, pages: &[u64]) -> bool {
        let last = pages.iter().copied().max().unwrap_or(0);
        self.buffer.offset_of(last + 1) <= self.length.dense()
    }

    /// The end of a commit whose pages `flushed` wrote: an `fdatasync`
    /// covering those writes (joining one in flight or issuing one), or
    /// none where the doublewrite area holds every change since the last
    /// one; then the batch settles. The commit's outcome.
    fn make_durable(&self, flushed: Flushed) -> Result<()> {
        let p = self.parts();
        let by_area = p.torn.area().is_some() && flushed.unstaged_at <= p.durability.fsynced();
        let durable = if by_area {
            Ok(())
        } else {
            p.durability.sync_to(flushed.target)
        };
        if let Some(batch) = flushed.batch {
            self.flush.settle(&p, batch, durable.is_ok());
        }
        match (durable, flushed.error) {
            (Err(e), _) | (Ok(()), Some(e)) => Err(e),
            // A failed `fdatasync` may have lost pages of these scopes
            // another flush wrote.
            (Ok(()), None) if self.life.is_poisoned() => Err(Error::Poisoned),
            (Ok(()), None) => Ok(()),
        }
    }
}

impl PagedCachedFile {
    /// The one commit: `scope` made durable, waiting as `wait` says (a
    /// blocking commit returns a resolved ticket). A read-only file has
    /// nothing to commit.
    ///
    /// Errors: as [`sync`](Self::sync) when blocking; as
    /// [`sync_async`](Self::sync_async) for a ticket.
    pub(crate) fn commit(&self, scope: Scope<'_>, wait: Wait) -> Result<CommitTicket> {
        let core = &self.core;
        if core.life.is_read_only() && !core.life.is_closed() {
            return Ok(CommitTicket::ready());
        }
        if let Wait::Block = wait {
            return core.commit_now(scope).map(|()| CommitTicket::ready());
        }
        let _writer = core.life.begin_write()?;
        self.committer
            .ensure(&core.requests, || {
                let core = Arc::clone(&self.core);
                move |pass| core.run_pass(pass)
            })
            .map_err(|e| Error::io("start the committer thread", None, e))?;
        let request = match scope {
            Scope::File => core.requests.ask(None),
            Scope::Pages(pages) => {
                let r = core.requests.ask(Some(pages));
                pages.clear();
                r
            }
        };
        Ok(CommitTicket::new(Arc::clone(&core.requests), request))
    }

    /// `close`'s commit: the committer ends after its pass, and one commit
    /// of the whole file resolves every ticket asked for so far (with its
    /// error if it fails; the file stays open).
    ///
    /// Errors: as [`sync`](Self::sync).
    pub(super) fn commit_at_close(&self) -> Result<()> {
        self.committer.stop(&self.core.requests);
        let synced = self.core.commit_now(Scope::File);
        if let Err(e) = &synced {
            self.core.requests.fail_pending(e);
        }
        synced
    }

    /// Durable commit of the whole file: when it returns `Ok`, every page
    /// written before the call (by any thread) survives a crash, and so
    /// does the length [`len`](Self::len) reported before the call (a
    /// file whose last pages were discarded is extended to it with zeros).
    ///
    /// Where no other commit is writing, the calling thread writes what is
    /// buffered (every thread's pages); commits arriving meanwhile are
    /// written together by the first of them to find the writes done. It
    /// then needs an `fdatasync` that began after those writes: it returns
    /// at once if one has, waits for one in flight, or issues its own.
    ///
    /// Errors: [`Error::Closed`]; [`Error::Poisoned`] if an earlier
    /// `fdatasync` failed; [`Error::PagesFailed`] when some pages could not
    /// be written (it names them; every other page was still made durable;
    /// the failed ones stay dirty and a later `sync` retries them); as
    /// [`flush`](Self::flush) for the file's length; `Error::Io` with op
    /// "fdatasync" when the `fdatasync` failed (the file is poisoned from
    /// then on; the pages of that commit stay in memory and readable).
    pub fn sync(&self) -> Result<()> {
        self.commit(Scope::File, Wait::Block).map(drop)
    }

    /// Starts the commit of [`sync`](Self::sync) and returns at once with a
    /// [`CommitTicket`] that resolves when it is durable: the next blocking
    /// commit's pass or the file's committer thread makes it (one pass
    /// for every commit asked for meanwhile); this thread goes on writing.
    ///
    /// Errors: [`Error::Closed`], [`Error::Poisoned`]; `Error::Io` with op
    /// "start the committer thread". The commit's errors are the ticket's.
    pub fn sync_async(&self) -> Result<CommitTicket> {
        self.commit(Scope::File, Wait::Ticket)
    }

    /// A [`Writer`] over this file: writes whose commit promises only what
    /// was written through it. Cheap: it allocates only as it records
    /// pages.
    pub fn writer(&self) -> Writer<'_> {
        Writer {
            file: Held::Borrowed(self),
            pages: Vec::new(),
        }
    }
}

/// A handle for writes whose commit promises exactly what was written
/// through it: one per thread, or per transaction, from
/// [`PagedCachedFile::writer`]. `Send`: a transaction may move between
/// threads; not `Sync` (one user at a time, like the transaction it
/// serves).
///
/// Its writes do what the file's methods of the same names do, into the
/// same write buffer, and note which pages they buffered;
/// [`commit`](Self::commit) makes those pages durable and
/// [`commit_async`](Self::commit_async) starts the same commit with a
/// [`CommitTicket`]. Pages other writers wrote are not promised by this
/// writer's commit; reads see every writer's newest bytes.
pub struct Writer<'a> {
    file: Held<'a>,
    /// Page numbers written through this writer since its last commit
    /// (repeats allowed).
    pages: Vec<u64>,
}

/// How a [`Writer`] holds its file: borrowed, or shared for a writer that
/// must outlive any borrow (an engine's `'static` backend).
enum Held<'a> {
    Borrowed(&'a PagedCachedFile),
    Shared(Arc<PagedCachedFile>),
}

impl std::ops::Deref for Held<'_> {
    type Target = PagedCachedFile;
    fn deref(&self) -> &PagedCachedFile {
        match self {
            Held::Borrowed(f) => f,
            Held::Shared(f) => f,
        }
    }
}

impl Writer<'static> {
    /// A writer that holds its file through `file` (an `Arc`), as
    /// [`PagedCachedFile::writer`] otherwise: for a writer kept in a
    /// `'static` value, such as a storage backend over a region of the file.
    pub fn shared(file: Arc<PagedCachedFile>) -> Self {
        Writer {
            file: Held::Shared(file),
            pages: Vec::new(),
        }
    }
}

impl Writer<'_> {
    /// The file this writer writes.
    pub fn file(&self) -> &PagedCachedFile {
        &self.file
    }

    /// Writes whole pages at `offset`, as [`PagedCachedFile::write_page`]
    /// (same checks and errors), and adds them to this writer's commit.
    /// After an error the pages buffered before it are in the commit too.
    pub fn write_page(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let pages = &mut self.pages;
        self.file
            .write_page_recorded(offset, data, &mut |p| pages.push(p))
    }

    /// Writes any bytes at `offset`, as [`PagedCachedFile::write_all_at`]
    /// (same checks and errors), and adds the pages they touch to this
    /// writer's commit. After an error the pages buffered before it are in
    /// the commit too.
    pub fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> Result<()> {
        let pages = &mut self.pages;
        self.file
            .write_all_at_recorded(offset, buf, &mut |p| pages.push(p))
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
    /// other writers wrote and drains none of theirs but those of commits
    /// asked for at the same time.
    ///
    /// It is made as [`PagedCachedFile::sync`] is, draining only these
    /// pages (and those of commits in the same pass), except that one
    /// whose pages all overwrite data the file held when it was opened
    /// writes its own beside a pass that is writing instead of waiting for
    /// it. A writer with nothing written since its last commit returns at
    /// once.
    ///
    /// Errors: [`Error::Closed`]; [`Error::Poisoned`] after a failed
    /// `fdatasync`; [`Error::PagesFailed`] for pages that could not be
    /// written (they stay dirty and stay in this writer's next commit; the
    /// rest were made durable); `Error::Io` with op "fdatasync" when the
    /// `fdatasync` failed (the file is poisoned). On an error the writer
    /// keeps its pages: a later commit tries them again.
    pub fn commit(&mut self) -> Result<()> {
        self.file
            .commit(Scope::Pages(&mut self.pages), Wait::Block)
            .map(drop)?;
        self.pages.clear();
        Ok(())
    }

    /// Writes `buf` at `offset` (any offset and length) and commits it
    /// with this writer's other pages: [`write_all_at`](Self::write_all_at)
    /// followed by [`commit`](Self::commit), with their checks and errors.
    /// `offset` is in bytes; `buf` any length (empty: a commit alone).
    pub fn write_and_commit(&mut self, offset: u64, buf: &[u8]) -> Result<()> {
        self.write_all_at(offset, buf)?;
        self.commit()
    }

    /// Starts the commit of [`commit`](Self::commit) and returns at once
    /// with a [`CommitTicket`] that resolves once those pages are durable
    /// (made as [`PagedCachedFile::sync_async`]'s are; each ticket
    /// promises its own writer's pages). The writer starts a new scope.
    ///
    /// Errors: [`Error::Closed`], [`Error::Poisoned`] after a failed
    /// `fdatasync`; `Error::Io` with op "start the committer thread". The
    /// commit's errors are the ticket's; pages that failed to write stay
    /// dirty, and the next flush or `sync` of the file writes them.
    pub fn commit_async(&mut self) -> Result<CommitTicket> {
        self.file
            .commit(Scope::Pages(&mut self.pages), Wait::Ticket)
    }
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("pages", &self.pages.len())
            .finish_non_exhaustive()
    }
}
