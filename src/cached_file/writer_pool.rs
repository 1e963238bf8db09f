//! Writer threads for the vectored engine ([`Config::write_threads`]): a
//! flush's runs go out as `pwritev` calls from several threads at once, so
//! a round's runs are in flight together, as io_uring has them, on hosts
//! without io_uring (or where it is refused, as under Docker's default
//! seccomp profile).
//!
//! The flushing thread copies the runs and page references into the pool's
//! job (vectors kept between flushes, so nothing is allocated), wakes the
//! helpers, takes runs itself, and returns when every run completed. Each
//! run goes out as the engine writes it on one thread
//! ([`write_run`]): under `O_DIRECT`, scattered
//! pages from a copy in the writing thread's own buffer.
//! Helpers hold the job's read lock while writing; a job is installed and
//! let go under the write lock, so no helper sees a half-installed job and
//! no page reference outlives its flush.
//!
//! [`Config::write_threads`]: crate::Config::write_threads

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::gather::{GatherBuf, write_run};
use super::pages::PageRef;
use crate::backend::StorageBackend;
use crate::coalesce::Run;
use crate::sync::{AtomicUsize, Condvar, JoinHandle, Mutex, RwLock, ThreadBuilder};

/// A run that failed: its index in the flush's runs, the call
/// (`"pwritev"`, `"pwrite"` for a copied run), and the error.
pub(crate) type RunFailure = (usize, &'static str, std::io::Error);

/// One flush's runs and the pages they cover.
#[derive(Default)]
struct Job {
    entries: Vec<(u64, PageRef)>,
    runs: Vec<Run>,
}

#[derive(Default)]
struct State {
    /// Bumped per job: a helper works once per bump it sees.
    generation: u64,
    shutdown: bool,
}

struct Shared {
    backend: Arc<dyn StorageBackend>,
    job: RwLock<Job>,
    state: Mutex<State>,
    /// Helpers wait here for a job (or shutdown).
    start: Condvar,
    /// The flushing thread waits here for the last run.
    done: Condvar,
    /// Next run to take.
    next: AtomicUsize,
    /// Runs finished, failed ones included.
    completed: AtomicUsize,
    /// (run index, the call, error) of the runs that failed.
    failures: Mutex<Vec<RunFailure>>,
}

/// Helper threads, joined on drop.
pub(crate) struct WriterPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl WriterPool {
    /// Starts `helpers` threads writing to `backend`; with `copy_align`
    /// (under `O_DIRECT`) each copies scattered runs into a buffer of its
    /// own aligned to it. Errors: the OS refused a thread (the ones started
    /// are stopped again).
    pub(crate) fn new(
        backend: Arc<dyn StorageBackend>,
        helpers: usize,
        copy_align: Option<usize>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            backend,
            job: RwLock::new(Job::default()),
            state: Mutex::new(State::default()),
            start: Condvar::new(),
            done: Condvar::new(),
            next: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            failures: Mutex::new(Vec::new()),
        });
        let mut pool = Self {
            shared,
            threads: Vec::with_capacity(helpers),
        };
        for i in 0..helpers {
            let s = Arc::clone(&pool.shared);
            let t = ThreadBuilder::new()
                .name(format!("pagewriter-w{i}"))
                .spawn(move || helper(&s, copy_align.map(GatherBuf::new)))?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    /// Threads that write a job: the helpers and the calling thread.
    pub(crate) fn threads(&self) -> usize {
        self.threads.len() + 1
    }

    /// Writes every run of `entries`, the calling thread too; appends the
    /// failed runs (index into `runs`, the call that failed, error) to
    /// `failed`. `iovecs` and
    /// `copy` are the calling thread's iovec vector and copy buffer, kept
    /// between flushes.
    pub(crate) fn write(
        &self,
        runs: &[Run],
        entries: &[(u64, PageRef)],
        iovecs: &mut Vec<IoSlice<'static>>,
        copy: Option<&mut GatherBuf>,
        failed: &mut Vec<RunFailure>,
    ) {
        let s = &*self.shared;
        {
            let mut job = s.job.write();
            job.entries.clear();
            job.entries.extend(entries.iter().cloned());
            job.runs.clear();
            job.runs.extend_from_slice(runs);
            s.next.store(0, Ordering::Relaxed);
            s.completed.store(0, Ordering::Relaxed);
        }
        {
            let mut st = s.state.lock();
            st.generation += 1;
            s.start.notify_all();
        }
        work(s, iovecs, copy);
        {
            let mut st = s.state.lock();
            while s.completed.load(Ordering::Acquire) < runs.len() {
                s.done.wait(&mut st);
            }
        }
        failed.append(&mut s.failures.lock());
        // Let go of the page references (after any helper still looking at
        // the finished job has dropped its read lock).
        s.job.write().entries.clear();
    }
}

impl Drop for WriterPool {
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.start.notify_all();
        for t in self.threads.drain(..) {
            // A helper never panics (`work` catches the backend's panics).
            let _ = t.join();
        }
    }
}

fn helper(s: &Shared, mut copy: Option<GatherBuf>) {
    let mut seen = 0;
    let mut iovecs = Vec::new();
    loop {
        {
            let mut st = s.state.lock();
            while st.generation == seen && !st.shutdown {
                s.start.wait(&mut st);
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
        }
        work(s, &mut iovecs, copy.as_mut());
    }
}

/// Takes runs of the installed job until none is left. A panic in the
/// backend fails its run instead of leaving the flushing thread waiting
/// for it forever.
fn work(s: &Shared, iovecs: &mut Vec<IoSlice<'static>>, mut copy: Option<&mut GatherBuf>) {
    let job = s.job.read();
    let total = job.runs.len();
    loop {
        let i = s.next.fetch_add(1, Ordering::AcqRel);
        let Some(run) = job.runs.get(i) else { break };
        let pages = &job.entries[run.entries()];
        let (r, op) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let copy = copy.as_deref_mut();
            write_run(&*s.backend, run, pages, iovecs, copy, false)
        }))
        .unwrap_or_else(|_| {
            let e = std::io::Error::other("the backend panicked in a writer thread");
            (Err(e), "pwritev")
        });
        if let Err(e) = r {
            s.failures.lock().push((i, op, e));
        }
        if s.completed.fetch_add(1, Ordering::AcqRel) + 1 == total {
            let _st = s.state.lock();
            s.done.notify_all();
        }
    }
}
