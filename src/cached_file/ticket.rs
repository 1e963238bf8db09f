//! Asynchronous commits: [`CommitTicket`], the promise the caller holds;
//! [`Requests`], the commits asked for and how each ended; and the
//! [`Committer`] thread that makes them durable.
//!
//! An asynchronous commit ([`Writer::commit_async`](crate::Writer::commit_async),
//! [`PagedCachedFile::sync_async`](crate::PagedCachedFile::sync_async)) does
//! no I/O on the caller's thread: it takes the next request number and
//! returns a ticket for it. The committer thread loops: it takes the
//! newest request number asked so far, makes one commit of the whole file
//! (`sync`: every page written before it, by any thread, and the length),
//! and resolves every request up to that number as the commit ended. While
//! it commits, the callers go on writing and asking; the next pass covers
//! all of that at once. So a thread keeps commits in flight without
//! waiting for its writes, and the writes of many commits coalesce into
//! the runs of one flush.
//!
//! Owns: the request numbers, the outcomes of the passes (a failed one's
//! error for the requests it covered), the waiters of tickets, the
//! committer's thread. Calls: nothing of the file: the committer is handed
//! the pass to run (the file's `sync`) when it is started, so this module
//! does not depend on the file's.
//!
//! Lock order: the request state is a leaf (no other lock is taken under
//! it; wakers are woken after it is released).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::error::{Error, Result};
use crate::sync::{Condvar, JoinHandle, Mutex, ThreadBuilder, park, thread_waker};

/// Failed passes remembered apart; past this many the two oldest merge
/// (their requests keep failing, with the later error).
const MAX_FAILURES: usize = 64;

/// The commits asked for and how each ended (see the module docs). Shared
/// by the file, its committer thread and every ticket.
pub(crate) struct Requests {
    st: Mutex<State>,
    /// The committer waits here for a request.
    asked: Condvar,
}

#[derive(Default)]
struct State {
    /// The newest request number handed out (0: none yet).
    asked: u64,
    /// Requests up to this one are resolved.
    done: u64,
    /// Resolved requests that failed: `(first, last, error)`, oldest
    /// first, disjoint.
    failures: std::collections::VecDeque<(u64, u64, Error)>,
    /// Tickets waiting: (waiter id, request, waker).
    waiters: Vec<(u64, u64, Waker)>,
    next_waiter: u64,
    /// The committer should end after its pass.
    stop: bool,
    /// The file was dropped without `close`: what is not resolved now will
    /// not be (`Error::Closed`).
    abandoned: bool,
}

impl State {
    fn resolution(&self, r: u64) -> Option<Result<()>> {
        if r <= self.done {
            let failed = self
                .failures
                .iter()
                .find(|(a, b, _)| (*a..=*b).contains(&r));
            return Some(failed.map_or(Ok(()), |(_, _, e)| Err(e.clone())));
        }
        self.abandoned.then_some(Err(Error::Closed))
    }

    fn push_waiter(&mut self, r: u64, waker: Waker) -> u64 {
        self.next_waiter += 1;
        self.waiters.push((self.next_waiter, r, waker));
        self.next_waiter
    }

    fn forget(&mut self, id: u64) {
        self.waiters.retain(|w| w.0 != id);
    }

    /// The waiters whose requests are resolved now, taken out.
    fn take_resolved(&mut self) -> Vec<Waker> {
        let (done, abandoned) = (self.done, self.abandoned);
        let mut woken = Vec::new();
        self.waiters.retain(|(_, r, w)| {
            let resolved = *r <= done || abandoned;
            if resolved {
                woken.push(w.clone());
            }
            !resolved
        });
        woken
    }
}

impl Requests {
    pub(crate) fn new() -> Self {
        Self {
            st: Mutex::new(State::default()),
            asked: Condvar::new(),
        }
    }

    /// A new request: its number, the committer woken.
    pub(crate) fn ask(&self) -> u64 {
        let mut st = self.st.lock();
        st.asked += 1;
        let r = st.asked;
        drop(st);
        self.asked.notify_one();
        r
    }

    /// The newest request number handed out.
    pub(crate) fn asked(&self) -> u64 {
        self.st.lock().asked
    }

    /// The committer's next pass: blocks until a request is not resolved
    /// yet and returns the newest one (the pass covers everything up to
    /// it); `None` once the committer should end.
    fn next_pass(&self) -> Option<u64> {
        let mut st = self.st.lock();
        loop {
            if st.stop {
                return None;
            }
            if st.asked > st.done {
                return Some(st.asked);
            }
            self.asked.wait(&mut st);
        }
    }

    /// Resolves every request up to `upto` (those not resolved yet) as
    /// `outcome` says, and wakes their tickets.
    pub(crate) fn resolve(&self, upto: u64, outcome: Result<()>) {
        let mut st = self.st.lock();
        if upto <= st.done {
            return;
        }
        if let Err(e) = outcome {
            let first = st.done + 1;
            st.failures.push_back((first, upto, e));
            if st.failures.len() > MAX_FAILURES {
                let (a, _, _) = st.failures.pop_front().expect("more than one");
                st.failures.front_mut().expect("more than one").0 = a;
            }
        }
        st.done = upto;
        let woken = st.take_resolved();
        drop(st);
        woken.into_iter().for_each(Waker::wake);
    }

    /// The file was dropped without `close`: requests not resolved now
    /// resolve `Error::Closed`.
    pub(crate) fn abandon(&self) {
        let mut st = self.st.lock();
        st.abandoned = true;
        let woken = st.take_resolved();
        drop(st);
        woken.into_iter().for_each(Waker::wake);
    }

    fn resolution(&self, r: u64) -> Option<Result<()>> {
        self.st.lock().resolution(r)
    }

    /// Blocks until request `r` is resolved; its outcome.
    fn wait(&self, r: u64) -> Result<()> {
        let mut id = None;
        loop {
            let mut st = self.st.lock();
            if let Some(i) = id.take() {
                st.forget(i);
            }
            if let Some(done) = st.resolution(r) {
                return done;
            }
            id = Some(st.push_waiter(r, thread_waker()));
            drop(st);
            park();
        }
    }

    /// A ticket's poll: `Ok` with the outcome, or `Err` with the waiter
    /// registered to wake `waker` (under the same lock as the look, so no
    /// wake-up falls between).
    fn poll(&self, r: u64, waker: &Waker) -> std::result::Result<Result<()>, u64> {
        let mut st = self.st.lock();
        match st.resolution(r) {
            Some(done) => Ok(done),
            None => Err(st.push_waiter(r, waker.clone())),
        }
    }

    fn forget(&self, id: u64) {
        self.st.lock().forget(id);
    }
}

/// The promise of a commit started with
/// [`Writer::commit_async`](crate::Writer::commit_async) or
/// [`PagedCachedFile::sync_async`](crate::PagedCachedFile::sync_async):
/// resolves `Ok` once every page written before the commit was asked for
/// is durable (with the file's length), or with the error that kept them
/// from it. The file's committer thread makes them durable: starting the
/// commit did no I/O.
///
/// Resolve it with [`wait`](Self::wait) (blocking), poll it with
/// [`is_durable`](Self::is_durable), or `.await` it: it is a `Future` and
/// needs no particular runtime (its `Waker` is woken from the committer
/// thread). Dropping it does not cancel the commit. Tickets resolve in
/// the order their commits were asked for. `Send + Sync`; it may outlive
/// the file.
///
/// Errors it resolves with: those of [`sync`](crate::PagedCachedFile::sync)
/// for the commit that covered it: [`Error::PagesFailed`](crate::Error::PagesFailed)
/// for pages that could not be written (they stay dirty; a later commit
/// tries them again), `Error::Io` with op "fdatasync" from a failed
/// `fdatasync` (the file is poisoned), [`Error::Poisoned`](crate::Error::Poisoned)
/// after an earlier one failed; [`Error::Closed`](crate::Error::Closed)
/// when the file was dropped without `close` before a commit covered it.
/// A ticket of a file closed with `close` resolves as that close's commit
/// did. No ticket resolves `Ok` past a failed `fdatasync`.
///
/// Component: commit (`cached_file/ticket.rs`).
#[must_use = "a ticket only says whether the commit became durable; wait for it or poll it"]
pub struct CommitTicket {
    /// `None`: resolved `Ok` from the start (a read-only file).
    requests: Option<Arc<Requests>>,
    request: u64,
    /// This ticket's registration as a waiter, while polled and pending.
    waiter: Option<u64>,
}

impl CommitTicket {
    pub(crate) fn new(requests: Arc<Requests>, request: u64) -> Self {
        Self {
            requests: Some(requests),
            request,
            waiter: None,
        }
    }

    /// A ticket resolved `Ok` already (nothing to commit).
    pub(crate) fn ready() -> Self {
        Self {
            requests: None,
            request: 0,
            waiter: None,
        }
    }

    fn outcome(&self) -> Option<Result<()>> {
        self.requests
            .as_ref()
            .map_or(Some(Ok(())), |q| q.resolution(self.request))
    }

    /// Whether the commit's pages are durable now (never blocks).
    pub fn is_durable(&self) -> bool {
        matches!(self.outcome(), Some(Ok(())))
    }

    /// Blocks until the commit is resolved: `Ok` once its pages are
    /// durable.
    ///
    /// Errors: see the type's docs.
    pub fn wait(mut self) -> Result<()> {
        self.forget();
        match &self.requests {
            None => Ok(()),
            Some(q) => q.wait(self.request),
        }
    }

    fn forget(&mut self) {
        if let (Some(id), Some(q)) = (self.waiter.take(), &self.requests) {
            q.forget(id);
        }
    }
}

impl Future for CommitTicket {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.forget();
        let Some(q) = &this.requests else {
            return Poll::Ready(Ok(()));
        };
        match q.poll(this.request, cx.waker()) {
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
            .field("request", &self.request)
            .field("durable", &self.is_durable())
            .finish()
    }
}

/// The committer thread of one file (see the module docs).
pub(crate) struct Committer {
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Committer {
    pub(crate) fn new() -> Self {
        Self {
            thread: Mutex::new(None),
        }
    }

    /// Starts the thread if it is not running; it runs the pass `make`
    /// returns (one commit of the whole file) for each batch of requests.
    ///
    /// Errors: the thread could not be started (`io::Error`).
    pub(crate) fn ensure<F>(
        &self,
        requests: &Arc<Requests>,
        make: impl FnOnce() -> F,
    ) -> std::io::Result<()>
    where
        F: FnMut() -> Result<()> + Send + 'static,
    {
        let mut t = self.thread.lock();
        if t.is_none() {
            let q = Arc::clone(requests);
            let mut pass = make();
            q.st.lock().stop = false;
            let handle = ThreadBuilder::new()
                .name("pagewriter-commit".into())
                .spawn(move || {
                    while let Some(upto) = q.next_pass() {
                        q.resolve(upto, pass());
                    }
                })?;
            *t = Some(handle);
        }
        Ok(())
    }

    /// Ends the thread (after the pass it is making) and waits for it.
    pub(crate) fn stop(&self, requests: &Requests) {
        let mut t = self.thread.lock();
        if let Some(h) = t.take() {
            requests.st.lock().stop = true;
            requests.asked.notify_all();
            let _ = h.join();
        }
    }
}
