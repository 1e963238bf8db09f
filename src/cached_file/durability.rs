//! What is durable: the write sequence, the one durable watermark and the
//! `fdatasync`s that advance it ([`Durability::sync_to`]); the commit
//! queue ([`Requests`]), its tickets ([`CommitTicket`]) and committer.
//!
//! Every durable promise of the file is one statement: *an `fdatasync`
//! that began after write-sequence step N has returned Ok*. `write_seq`
//! steps after every batch whose writes completed and every change of the
//! file's length; an `fdatasync` covers the `write_seq` read just before
//! it began; `fsynced`, the watermark, is the highest step a successful
//! one covered (PostgreSQL's `XLogFlush(lsn)` is the same rule).
//!
//! A commit waiting for N ([`sync_to`](Durability::sync_to)) returns at
//! once if the watermark covers it, waits for an `fdatasync` in flight
//! that began after N, or issues one on a free lane (with none free, it
//! waits and then issues one for everyone who waited).
//!
//! Owns: `write_seq`, `fsynced`, `unstaged_at` (its own lock), the
//! `fdatasync` state under another (free lanes, those in flight and what
//! each covers, the waiters, the first failure), and the commit queue (a
//! lock of its own). Calls: the backend's `sync_data_on`; sets the
//! poison flag when an `fdatasync` fails. All three locks are leaves;
//! waiters are woken after the lock is dropped.
//!
//! Invariants:
//! - a lane's `fdatasync`s never overlap, and each lane is its own open
//!   file description, so each sees every writeback error since its
//!   previous sync (Linux reports such an error once per description);
//! - after the first failed `fdatasync` only targets the watermark covered
//!   before it are durable ([`Failure::good_upto`]); the ones it covered
//!   get its error, later ones `Poisoned`: no promise is kept past it;
//! - a change no durable doublewrite record holds sets `unstaged_at` with
//!   its step under `unstaged_at`'s lock, and [`snapshot`](Durability::snapshot)
//!   reads both under it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use super::config::{Counters, add, add_elapsed};
use crate::backend::StorageBackend;
use crate::error::{Error, Result};
use crate::sync::{
    AtomicBool, AtomicU64, Condvar, JoinHandle, Mutex, ThreadBuilder, Woken, park, thread_waker,
};

/// Most `fdatasync`s of one file in flight at once (each on its own lane).
pub(crate) const SYNC_LANES: usize = 4;

/// The write sequence, the watermark and the `fdatasync`s of one file.
pub(crate) struct Durability {
    write_seq: AtomicU64,
    /// The watermark.
    fsynced: AtomicU64,
    /// The step of the latest change no durable doublewrite record holds:
    /// a commit needs an `fdatasync` of the file unless it is covered.
    unstaged_at: Mutex<u64>,
    syncs: Mutex<Syncs>,
    backend: Arc<dyn StorageBackend>,
    counters: Arc<Counters>,
    /// The file's poison flag (the lifecycle's).
    poisoned: Arc<AtomicBool>,
}

struct Syncs {
    free: Vec<usize>,
    in_flight: Vec<InFlight>,
    next_sync: u64,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    failure: Option<Failure>,
}

struct InFlight {
    id: u64,
    covers: u64,
}

/// A thread waiting until `fsynced >= target`.
struct Waiter {
    id: u64,
    target: u64,
    waker: Waker,
}

/// The first failed `fdatasync` of the file.
struct Failure {
    /// `fsynced` when it failed: targets at or below were durable before.
    good_upto: u64,
    /// What it covered: targets up to here get its error, later ones
    /// [`Error::Poisoned`].
    covers: u64,
    error: Error,
}

impl Durability {
    /// Nothing written yet; `fdatasync`s on up to `lanes` of `backend`'s.
    pub(crate) fn new(
        lanes: usize,
        backend: Arc<dyn StorageBackend>,
        counters: Arc<Counters>,
        poisoned: Arc<AtomicBool>,
    ) -> Self {
        let lanes = lanes.clamp(1, backend.sync_lanes().max(1));
        Self {
            write_seq: AtomicU64::new(0),
            fsynced: AtomicU64::new(0),
            unstaged_at: Mutex::new(0),
            syncs: Mutex::new(Syncs {
                free: (0..lanes).rev().collect(),
                in_flight: Vec::with_capacity(lanes),
                next_sync: 0,
                waiters: VecDeque::new(),
                next_waiter: 0,
                failure: None,
            }),
            backend,
            counters,
            poisoned,
        }
    }

    #[inline]
    pub(crate) fn write_seq(&self) -> u64 {
        self.write_seq.load(Ordering::Acquire)
    }

    /// The watermark.
    #[inline]
    pub(crate) fn fsynced(&self) -> u64 {
        self.fsynced.load(Ordering::Acquire)
    }

    /// Counts a batch whose writes completed, or a change of length a
    /// durable doublewrite record carries. Returns the new step.
    #[inline]
    pub(crate) fn step(&self) -> u64 {
        self.write_seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Counts a change only an `fdatasync` of the file makes durable (no
    /// doublewrite record holds it). Returns the step.
    pub(crate) fn step_unstaged(&self) -> u64 {
        let mut u = self.unstaged_at.lock();
        *u = self.step();
        *u
    }

    /// `write_seq` and `unstaged_at`, read together.
    pub(crate) fn snapshot(&self) -> (u64, u64) {
        let u = self.unstaged_at.lock();
        (self.write_seq(), *u)
    }

    /// Returns once writes counted up to step `target` are durable (see
    /// the module docs).
    ///
    /// Errors: after the first failed `fdatasync`, its error for targets
    /// it covered, [`Error::Poisoned`] for later ones (and once the file
    /// is poisoned otherwise); targets covered before it stay `Ok`.
    pub(crate) fn sync_to(&self, target: u64) -> Result<()> {
        let mut id = None;
        loop {
            let mut st = self.syncs.lock();
            if let Some(i) = id.take() {
                st.forget(i);
            }
            if let Some(done) = self.resolution(&st, target) {
                return done;
            }
            if !st.covered(target)
                && let Some(lane) = st.free.pop()
            {
                drop(st);
                self.fdatasync_on(lane);
                continue;
            }
            id = Some(st.wait_for(target));
            drop(st);
            park();
        }
    }

    /// [`sync_to`](Self::sync_to) the write sequence now (a doublewrite
    /// checkpoint, grow-ahead's extension, a cut, `close`).
    ///
    /// Errors: as `sync_to`; [`Error::Poisoned`] at once on a poisoned
    /// file (a later `fdatasync` would make sizes set since durable over
    /// the writes the failed one lost).
    pub(crate) fn sync_all(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        self.sync_to(self.write_seq())
    }

    /// One `fdatasync` on `lane`, covering the `write_seq` read before it
    /// began; then the covered waiters are woken, and an uncovered one per
    /// free lane to issue the next.
    fn fdatasync_on(&self, lane: usize) {
        let (id, covers) = {
            let mut st = self.syncs.lock();
            let covers = self.write_seq();
            st.next_sync += 1;
            let id = st.next_sync;
            st.in_flight.push(InFlight { id, covers });
            (id, covers)
        };
        add(&self.counters.syncs, 1);
        let started = std::time::Instant::now();
        let synced = self.backend.sync_data_on(lane);
        add_elapsed(&self.counters.sync_us, started);
        let mut st = self.syncs.lock();
        st.in_flight.retain(|s| s.id != id);
        st.free.push(lane);
        let woken = match synced {
            // A failure before this returned: Linux reports a writeback
            // error once per description, so this success vouches for
            // nothing the failed one lost.
            Ok(()) if st.failure.is_some() => st.take_all(),
            Ok(()) => {
                self.fsynced.fetch_max(covers, Ordering::AcqRel);
                st.take_covered(self.fsynced())
            }
            Err(e) => {
                self.poisoned.store(true, Ordering::Release);
                if st.failure.is_none() {
                    st.failure = Some(Failure {
                        good_upto: self.fsynced(),
                        covers,
                        error: Error::io("fdatasync", None, e),
                    });
                }
                st.take_all()
            }
        };
        drop(st);
        woken.wake();
    }

    /// What a commit waiting for `target` gets now (`None`: wait).
    fn resolution(&self, st: &Syncs, target: u64) -> Option<Result<()>> {
        if let Some(f) = &st.failure {
            return Some(if target <= f.good_upto {
                Ok(())
            } else if target <= f.covers {
                Err(f.error.clone())
            } else {
                Err(Error::Poisoned)
            });
        }
        if self.fsynced() >= target {
            return Some(Ok(()));
        }
        if self.poisoned.load(Ordering::Acquire) {
            return Some(Err(Error::Poisoned));
        }
        None
    }
}

impl Syncs {
    /// Whether an `fdatasync` in flight covers `target`.
    fn covered(&self, target: u64) -> bool {
        self.in_flight.iter().any(|s| s.covers >= target)
    }

    fn wait_for(&mut self, target: u64) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.waiters.push_back(Waiter {
            id,
            target,
            waker: thread_waker(),
        });
        id
    }

    fn forget(&mut self, id: u64) {
        if let Some(i) = self.waiters.iter().position(|w| w.id == id) {
            self.waiters.remove(i);
        }
    }

    /// The wakers of the waiters `fsynced` covers (dropped from the
    /// list), then of one for each free lane of those no `fdatasync` in
    /// flight covers: each issues the next for everyone still waiting.
    /// Woken once the lock is dropped (a woken thread's first step is to
    /// take it).
    fn take_covered(&mut self, fsynced: u64) -> Woken {
        let mut woken = Woken::new();
        self.waiters.retain(|w| {
            let covered = w.target <= fsynced;
            if covered {
                woken.push(w.waker.clone());
            }
            !covered
        });
        let in_flight = &self.in_flight;
        let next = self
            .waiters
            .iter()
            .filter(|w| !in_flight.iter().any(|s| s.covers >= w.target))
            .take(self.free.len());
        next.for_each(|w| woken.push(w.waker.clone()));
        woken
    }

    /// The wakers of every waiter, dropped from the list.
    fn take_all(&mut self) -> Woken {
        let mut woken = Woken::new();
        self.waiters.drain(..).for_each(|w| woken.push(w.waker));
        woken
    }
}

/// What the commits of one pass asked to make durable.
pub(crate) enum Asked {
    /// Every page written before them (a whole-file commit among them).
    File,
    /// These pages (writers' scopes, concatenated).
    Pages(Vec<u64>),
}

/// A pass to lead: every request in `(lo, hi]`, made durable as one
/// commit of what they asked.
pub(crate) struct Pass {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    pub(crate) asked: Asked,
}

/// What a committing thread does next ([`Requests::step`]).
pub(crate) enum Step {
    /// Its request is resolved: the outcome.
    Done(Result<()>),
    /// No pass is writing: it leads this one (its own request among them).
    Lead(Pass),
    /// It waited (woken as the write stage frees or its request resolves).
    Wait,
}

/// Failed passes remembered apart; past this many the two oldest merge.
const MAX_FAILURES: usize = 64;

/// The commit queue of one file: numbered requests for scopes, taken by
/// passes (see `commit.rs`); one pass in its *write stage* at a time.
/// Requests resolve in order: a pass that ends before an earlier one
/// waits for it.
pub(crate) struct Requests {
    st: Mutex<Queue>,
    /// The committer waits here for a pass to lead.
    lead_cv: Condvar,
}

#[derive(Default)]
struct Queue {
    /// The newest request number (0: none yet).
    asked: u64,
    /// Requests up to this one are in a pass.
    taken: u64,
    /// Requests up to this one are resolved.
    done: u64,
    /// A pass is in its write stage.
    writing: bool,
    /// What the requests not yet taken asked for: the whole file, or
    /// these pages.
    whole: bool,
    pages: Vec<u64>,
    /// An emptied page vector a pass gave back, for the next.
    spare: Vec<u64>,
    /// Passes resolved while an earlier one was not: `(lo, hi, outcome)`.
    early: Vec<(u64, u64, Result<()>)>,
    /// Resolved requests that failed: `(first, last, error)`, disjoint.
    failures: VecDeque<(u64, u64, Error)>,
    /// Threads and tickets waiting: (waiter id, request, waker).
    waiters: Vec<(u64, u64, Waker)>,
    next_waiter: u64,
    /// The committer ends.
    stop: bool,
    /// Dropped without `close`: what is unresolved is `Error::Closed`.
    abandoned: bool,
}

impl Queue {
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

    /// Takes every pending request into a pass, the write stage with it;
    /// `None` while a pass writes or nothing is pending.
    fn lead(&mut self) -> Option<Pass> {
        if self.writing || self.taken == self.asked {
            return None;
        }
        self.writing = true;
        let asked = if std::mem::take(&mut self.whole) {
            self.pages.clear();
            Asked::File
        } else {
            let spare = std::mem::take(&mut self.spare);
            Asked::Pages(std::mem::replace(&mut self.pages, spare))
        };
        let pass = Pass {
            lo: self.taken,
            hi: self.asked,
            asked,
        };
        self.taken = self.asked;
        Some(pass)
    }

    /// Records `outcome` for `(lo, hi]`; `done` moves over passes in order.
    fn finish(&mut self, lo: u64, hi: u64, outcome: Result<()>) {
        self.early.push((lo, hi, outcome));
        while let Some(i) = self.early.iter().position(|e| e.0 == self.done) {
            let (lo, hi, outcome) = self.early.swap_remove(i);
            if let Err(e) = outcome {
                self.failures.push_back((lo + 1, hi, e));
                if self.failures.len() > MAX_FAILURES {
                    let (a, _, _) = self.failures.pop_front().expect("more than one");
                    self.failures.front_mut().expect("more than one").0 = a;
                }
            }
            self.done = hi;
        }
    }

    /// Takes out the wakers of the waiters whose requests are resolved
    /// now, to be woken once the lock is dropped (a woken thread's first
    /// step is to take this lock).
    fn take_resolved(&mut self) -> Woken {
        let (done, abandoned) = (self.done, self.abandoned);
        let mut woken = Woken::new();
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
            st: Mutex::new(Queue::default()),
            lead_cv: Condvar::new(),
        }
    }

    /// A new request for the whole file (`None`) or for `pages` (copied):
    /// its number. The committer is woken.
    pub(crate) fn ask(&self, pages: Option<&[u64]>) -> u64 {
        let mut st = self.st.lock();
        match pages {
            None => st.whole = true,
            Some(pages) => st.pages.extend_from_slice(pages),
        }
        st.asked += 1;
        let r = st.asked;
        drop(st);
        self.lead_cv.notify_one();
        r
    }

    /// What the thread committing request `r` does next (see [`Step`]);
    /// with `Wait` it is registered to be woken, and parks.
    pub(crate) fn step(&self, r: u64) -> Step {
        let mut st = self.st.lock();
        if let Some(done) = st.resolution(r) {
            return Step::Done(done);
        }
        if let Some(pass) = st.lead() {
            return Step::Lead(pass);
        }
        let id = st.push_waiter(r, thread_waker());
        drop(st);
        park();
        self.st.lock().waiters.retain(|w| w.0 != id);
        Step::Wait
    }

    /// Whether a pass is in its write stage.
    pub(crate) fn writing(&self) -> bool {
        self.st.lock().writing
    }

    /// The pass's writes are done: wakes the first thread whose request no
    /// pass holds (it leads every pending one), and the committer.
    pub(crate) fn wrote(&self) {
        let mut st = self.st.lock();
        st.writing = false;
        let taken = st.taken;
        let next = st.waiters.iter().find(|w| w.1 > taken).map(|w| w.2.clone());
        drop(st);
        if let Some(w) = next {
            w.wake();
        }
        self.lead_cv.notify_one();
    }

    /// Resolves the requests `(lo, hi]` of a pass as `outcome` says, in
    /// order with earlier passes, and wakes their waiters.
    pub(crate) fn resolve(&self, lo: u64, hi: u64, outcome: Result<()>) {
        let mut st = self.st.lock();
        st.finish(lo, hi, outcome);
        let woken = st.take_resolved();
        drop(st);
        woken.wake();
    }

    /// Resolves every request no pass took with `error` (a `close` whose
    /// commit failed: the committer is stopped, no pass would come).
    pub(crate) fn fail_pending(&self, error: &Error) {
        let mut st = self.st.lock();
        if st.taken < st.asked {
            let (lo, hi) = (st.taken, st.asked);
            st.taken = hi;
            st.whole = false;
            st.pages.clear();
            st.finish(lo, hi, Err(error.clone()));
            let woken = st.take_resolved();
            drop(st);
            woken.wake();
        }
    }

    /// A pass is done with its page vector (kept for the next). Pages
    /// whose writes failed do not join the next pass: they are back in the
    /// write buffer, a blocking writer's stay in its scope, and the next
    /// whole-file commit writes them; a writer's commit never carries
    /// another writer's failed pages.
    pub(crate) fn give_back(&self, mut pages: Vec<u64>) {
        let mut st = self.st.lock();
        pages.clear();
        if st.spare.capacity() < pages.capacity() {
            st.spare = pages;
        }
    }

    /// The committer's next pass (blocks); `None` once it should end.
    fn next_pass(&self) -> Option<Pass> {
        let mut st = self.st.lock();
        loop {
            if st.stop {
                return None;
            }
            if let Some(pass) = st.lead() {
                return Some(pass);
            }
            self.lead_cv.wait(&mut st);
        }
    }

    /// Dropped without `close`: unresolved requests resolve `Closed`.
    pub(crate) fn abandon(&self) {
        let mut st = self.st.lock();
        st.abandoned = true;
        let woken = st.take_resolved();
        drop(st);
        woken.wake();
    }

    /// Blocks until request `r` is resolved; its outcome.
    fn wait(&self, r: u64) -> Result<()> {
        let mut id = None;
        loop {
            let mut st = self.st.lock();
            if let Some(i) = id.take() {
                st.waiters.retain(|w| w.0 != i);
            }
            if let Some(done) = st.resolution(r) {
                return done;
            }
            id = Some(st.push_waiter(r, thread_waker()));
            drop(st);
            park();
        }
    }
}

/// The promise of an asynchronous commit
/// ([`Writer::commit_async`](crate::Writer::commit_async): the writer's
/// pages; [`PagedCachedFile::sync_async`](crate::PagedCachedFile::sync_async):
/// every page written before it): resolves `Ok` once those pages are
/// durable (with the length they need), or with the error that kept them
/// from it. A pass writes and syncs them (the next blocking commit's, or
/// the file's committer thread's); starting the commit did no I/O.
///
/// Resolve it with [`wait`](Self::wait) (blocking), poll it with
/// [`is_durable`](Self::is_durable), or `.await` it: a `Future` that needs
/// no particular runtime (its `Waker` is woken by the thread that resolves
/// it). Dropping it does not cancel the commit. Tickets resolve in
/// the order their commits were asked for. `Send + Sync`; it may outlive
/// the file.
///
/// Errors it resolves with: those of [`sync`](crate::PagedCachedFile::sync)
/// for the pass that covered it ([`Error::PagesFailed`](crate::Error::PagesFailed):
/// the pages stay dirty and the next flush or `sync` of the file writes
/// them; `Error::Io` with op "fdatasync", the file poisoned;
/// [`Error::Poisoned`](crate::Error::Poisoned)), and
/// [`Error::Closed`](crate::Error::Closed) when the file was dropped
/// without `close` first. A ticket of a file closed with `close` resolves
/// as that close's commit did. No ticket resolves `Ok` past a failed
/// `fdatasync`.
#[must_use = "a ticket only says whether the commit became durable; wait for it or poll it"]
pub struct CommitTicket {
    /// `None`: resolved `Ok` from the start.
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

    /// A ticket resolved `Ok` already.
    pub(crate) fn ready() -> Self {
        Self {
            requests: None,
            request: 0,
            waiter: None,
        }
    }

    fn outcome(&self) -> Option<Result<()>> {
        match &self.requests {
            None => Some(Ok(())),
            Some(q) => q.st.lock().resolution(self.request),
        }
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
            q.st.lock().waiters.retain(|w| w.0 != id);
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
        // The look and the registration under one lock: no wake-up falls
        // between them.
        let mut st = q.st.lock();
        match st.resolution(this.request) {
            Some(done) => Poll::Ready(done),
            None => {
                this.waiter = Some(st.push_waiter(this.request, cx.waker().clone()));
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

/// The committer thread of one file: started by the first asynchronous
/// commit, it leads the passes of requests no committing thread carries
/// along (it runs the pass it was handed) until stopped.
pub(crate) struct Committer {
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Committer {
    pub(crate) fn new() -> Self {
        Self {
            thread: Mutex::new(None),
        }
    }

    /// Starts the thread if it is not running, running the pass `make`
    /// returns for each pass it leads.
    ///
    /// Errors: the thread could not be started.
    pub(crate) fn ensure<F>(
        &self,
        requests: &Arc<Requests>,
        make: impl FnOnce() -> F,
    ) -> std::io::Result<()>
    where
        F: FnMut(Pass) + Send + 'static,
    {
        let mut t = self.thread.lock();
        if t.is_none() {
            let q = Arc::clone(requests);
            let mut run = make();
            q.st.lock().stop = false;
            let handle = ThreadBuilder::new()
                .name("pagewriter-commit".into())
                .spawn(move || {
                    while let Some(pass) = q.next_pass() {
                        run(pass);
                    }
                })?;
            *t = Some(handle);
        }
        Ok(())
    }

    /// Ends the thread (after the pass it is leading) and waits for it.
    pub(crate) fn stop(&self, requests: &Requests) {
        let mut t = self.thread.lock();
        if let Some(h) = t.take() {
            requests.st.lock().stop = true;
            requests.lead_cv.notify_all();
            let _ = h.join();
        }
    }
}
