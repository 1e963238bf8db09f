//! [`CommitTicket`]: an asynchronous commit's promise, resolved once an
//! `fdatasync` covering its writes has returned; and the syncer thread
//! that issues the `fdatasync`s asynchronous commits ask for.
//!
//! Owns: a ticket holds its target (a `write_seq` counting its writes) and
//! the durability component it resolves against (shared, so a ticket
//! outlives a borrow of the file, and can be sent to any thread); the
//! syncer, its thread. Calls: `Durability` (`resolved`, `sync_to`,
//! `wait_with`, `next_ask`). The syncer is started by the first
//! asynchronous commit and ended by `close` or the file's drop.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::durability::Durability;
use crate::error::Result;
use crate::sync::{JoinHandle, Mutex, ThreadBuilder};

/// The promise of a commit started with
/// [`Writer::commit_async`](crate::Writer::commit_async) or
/// [`PagedCachedFile::sync_async`](crate::PagedCachedFile::sync_async):
/// resolves `Ok` once the commit's pages are durable (an `fdatasync` that
/// began after their writes completed has returned), or with the error
/// that kept them from it.
///
/// Resolve it with [`wait`](Self::wait) (blocking), poll it with
/// [`is_durable`](Self::is_durable), or `.await` it: it is a `Future` and
/// needs no particular runtime (its `Waker` is woken from whichever thread
/// completes the `fdatasync`). Dropping it does not cancel the commit.
/// `Send + Sync`; it may outlive the file.
///
/// Errors it resolves with: `Error::Io` with op "fdatasync" from the
/// failed `fdatasync` that covered it (the file is poisoned);
/// [`Error::Poisoned`](crate::Error::Poisoned) when an earlier
/// `fdatasync` failed; [`Error::Closed`](crate::Error::Closed) when the
/// file was dropped without `close` before its pages were made durable.
/// A ticket of a file closed with `close` resolves as that close's sync
/// did. No ticket resolves `Ok` past a failed `fdatasync`.
///
/// Component: commit (`cached_file/ticket.rs`).
#[must_use = "a ticket only says whether the commit became durable; wait for it or poll it"]
pub struct CommitTicket {
    durability: Arc<Durability>,
    target: u64,
    /// This ticket's registration as a waiter, while polled and pending.
    waiter: Option<u64>,
}

impl CommitTicket {
    pub(crate) fn new(durability: Arc<Durability>, target: u64) -> Self {
        Self {
            durability,
            target,
            waiter: None,
        }
    }

    /// Whether the commit's pages are durable now (never blocks).
    pub fn is_durable(&self) -> bool {
        matches!(self.durability.resolved(self.target), Some(Ok(())))
    }

    /// Blocks until the commit is resolved: `Ok` once its pages are
    /// durable. If no `fdatasync` covering them is in flight, this thread
    /// issues one rather than wait for the syncer.
    ///
    /// Errors: see the type's docs.
    pub fn wait(mut self) -> Result<()> {
        self.forget();
        self.durability.sync_to(self.target)
    }

    fn forget(&mut self) {
        if let Some(id) = self.waiter.take() {
            self.durability.forget_waiter(id);
        }
    }
}

impl Future for CommitTicket {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.forget();
        match this.durability.poll_target(this.target, cx.waker()) {
            Ok(done) => Poll::Ready(done),
            Err(id) => {
                this.waiter = Some(id);
                Poll::Pending
            }
        }
    }
}

impl Drop for CommitTicket {
    fn drop(&mut self) {
        self.forget();
    }
}

impl std::fmt::Debug for CommitTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitTicket")
            .field("target", &self.target)
            .field("durable", &self.is_durable())
            .finish()
    }
}

/// The syncer thread of one file: issues the `fdatasync`s asynchronous
/// commits ask for (`Durability::ask`), one covering every target asked
/// so far, the next as soon as it returns if more were asked meanwhile.
pub(crate) struct Syncer {
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Syncer {
    pub(crate) fn new() -> Self {
        Self {
            thread: Mutex::new(None),
        }
    }

    /// Starts the thread if it is not running.
    ///
    /// Errors: the thread could not be started (`io::Error`).
    pub(crate) fn ensure(&self, durability: &Arc<Durability>) -> std::io::Result<()> {
        let mut t = self.thread.lock();
        if t.is_none() {
            let d = Arc::clone(durability);
            let handle = ThreadBuilder::new()
                .name("pagewriter-sync".into())
                .spawn(move || {
                    while let Some(target) = d.next_ask() {
                        // A failure is the tickets' to report (and ends
                        // the loop: nothing can become durable any more).
                        let _ = d.sync_to(target);
                    }
                })?;
            *t = Some(handle);
        }
        Ok(())
    }

    /// Ends the thread (after the `fdatasync` it is making) and waits for
    /// it.
    pub(crate) fn stop(&self, durability: &Durability) {
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            durability.stop_syncer();
            let _ = h.join();
        }
    }
}
