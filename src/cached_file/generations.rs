//! The in-flight generations: what each flush drained, numbered in drain
//! order, until it retires (generic over what a settled one carries).
//!
//! Owns: the queue and drain bookkeeping under one lock, two condvars, the
//! next number. Calls: the `retire` callback, under its lock.
//!
//! Invariants:
//! - generations are numbered and queued in drain order (drains hold the
//!   drain lock). One that shares a page with an older one in flight
//!   retires only after every older one has (a younger version shadows an
//!   older one for readers); one that shares none retires as soon as it
//!   settles, so an `fdatasync` stalled in an older generation does not
//!   hold its pages;
//! - a generation counts as written once its writes completed, failed or
//!   not; a failed write records that its pages went back
//!   ([`log_requeue`](Generations::log_requeue)) before it counts as
//!   written, so a flush that waited for it and drained without them
//!   learns it ([`wait_written_then_check`](Generations::wait_written_then_check)).
//!
//! Lock order: drain lock -> `slots` -> this -> stripe -> cache stripe (the
//! retire callback takes stripe and cache locks under it).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use crate::sync::{AtomicU64, AtomicUsize, Condvar, Mutex};

/// Proof that the drain lock is held: only `FileSize` (the state under it)
/// owns one and lends it for no longer than its guard lives, so a call
/// that needs the lock takes one and the compiler checks it.
pub(crate) struct DrainHeld(());

impl DrainHeld {
    /// The one proof of a drain lock: made by `FileSize::new` only.
    pub(crate) fn for_drain_lock() -> Self {
        DrainHeld(())
    }
}

/// The generations in flight (see the module docs).
pub(crate) struct Generations<T> {
    state: Mutex<Queue<T>>,
    /// Notified when a generation has written.
    written: Condvar,
    /// Notified when the last generation in flight retires (`set_len`).
    settled: Condvar,
    /// The next generation's number. Written only with the drain lock held.
    next: AtomicU64,
    /// The most generations in flight at once so far (spares kept).
    peak: AtomicUsize,
}

struct Queue<T> {
    /// In drain order.
    queue: VecDeque<Generation<T>>,
    /// Drains made so far (empty ones included).
    drains: u64,
    /// Drain numbers of the flushes that have not yet checked `requeues`.
    checking: Vec<u64>,
    /// Per failed write whose pages went back: its generation's drain
    /// number and the drain count then. A flush whose drain number lies in
    /// `(drained, requeued]` drained without them.
    requeues: Vec<(u64, u64)>,
    /// The newest cut of the file's tail made while older generations had
    /// not all retired: `(id, len)`. A generation below `id` retires with
    /// its growth of the disk length capped at `len`
    /// ([`cut_under`](Generations::cut_under)); later cuts are never
    /// shorter until a `set_len`, which waits for every generation.
    cut: Option<(u64, u64)>,
}

/// An in-flight generation; `written` once its writes completed, `done`
/// once it settled.
struct Generation<T> {
    id: u64,
    written: bool,
    /// The `write_seq` step its writes made (none if nothing reached the
    /// OS).
    step: Option<u64>,
    /// No older generation in flight holds one of its pages.
    alone: bool,
    done: Option<T>,
}

impl<T> Generations<T> {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(Queue {
                queue: VecDeque::new(),
                drains: 0,
                checking: Vec::new(),
                requeues: Vec::new(),
                cut: None,
            }),
            written: Condvar::new(),
            settled: Condvar::new(),
            next: AtomicU64::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// The number the next generation gets (every one below was drained).
    #[inline]
    pub(crate) fn next_id(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }

    /// Numbers a drain and registers its flush as one that will check the
    /// requeue records.
    pub(crate) fn begin_drain(&self, _drain: &DrainHeld) -> u64 {
        let mut g = self.state.lock();
        g.drains += 1;
        let no = g.drains;
        g.checking.push(no);
        no
    }

    /// Queues generation `id` (from [`next_id`](Self::next_id)), not yet
    /// written; `alone`: no older one in flight holds one of its pages.
    pub(crate) fn push(&self, _drain: &DrainHeld, id: u64, alone: bool) {
        self.next.store(id + 1, Ordering::Release);
        let mut g = self.state.lock();
        g.queue.push_back(Generation {
            id,
            written: false,
            step: None,
            alone,
            done: None,
        });
        self.peak.fetch_max(g.queue.len(), Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// The failed pages of the generation drained as `drain_no` went back.
    pub(crate) fn log_requeue(&self, drain_no: u64) {
        let mut g = self.state.lock();
        let now = g.drains;
        if now > drain_no {
            g.requeues.push((drain_no, now));
        }
    }

    /// Waits until every generation below `mark` has written, then tells
    /// whether an older generation's failed pages went back after the
    /// drain numbered `drain_no` (which drained without them), and ends
    /// that drain's check. Requeues are recorded before their generation
    /// counts as written, so none is missed.
    pub(crate) fn wait_written_then_check(&self, mark: u64, drain_no: u64) -> bool {
        let mut g = self.wait_below(mark);
        Self::end_check(&mut g, drain_no)
    }

    /// A scoped commit's wait: until each generation of `ids` (those holding
    /// its pages in flight) has written. Returns the highest `write_seq`
    /// step they made (`None` if one retired or wrote nothing: the caller
    /// takes `write_seq` as it is now) and the check of
    /// [`wait_written_then_check`](Self::wait_written_then_check).
    pub(crate) fn wait_ids_then_check(&self, ids: &[u64], drain_no: u64) -> (Option<u64>, bool) {
        let mut g = self.state.lock();
        let mut step = Some(0);
        for &id in ids {
            loop {
                match g.queue.iter().find(|x| x.id == id) {
                    Some(x) if !x.written => self.written.wait(&mut g),
                    Some(x) => {
                        step = step.zip(x.step).map(|(a, b)| a.max(b));
                        break;
                    }
                    None => {
                        step = None;
                        break;
                    }
                }
            }
        }
        (step, Self::end_check(&mut *g, drain_no))
    }

    /// Whether a requeue fell after the drain `drain_no`; ends its check.
    fn end_check(g: &mut Queue<T>, drain_no: u64) -> bool {
        let missed = g
            .requeues
            .iter()
            .any(|&(drained, requeued)| drained < drain_no && drain_no <= requeued);
        if let Some(i) = g.checking.iter().position(|&d| d == drain_no) {
            g.checking.swap_remove(i);
        }
        // A record no flush still checking can fall under is dropped (a
        // later drain is numbered above every record).
        let oldest = g.checking.iter().copied().min();
        g.requeues
            .retain(|&(_, requeued)| oldest.is_some_and(|d| d <= requeued));
        missed
    }

    /// Waits until every generation below `mark` has written.
    pub(crate) fn wait_written(&self, mark: u64) {
        drop(self.wait_below(mark));
    }

    fn wait_below(&self, mark: u64) -> crate::sync::MutexGuard<'_, Queue<T>> {
        let mut g = self.state.lock();
        while g.queue.iter().any(|x| x.id < mark && !x.written) {
            self.written.wait(&mut g);
        }
        g
    }

    /// Marks generation `id` written (as `write_seq` step `step`).
    pub(crate) fn mark_written(&self, id: u64, step: Option<u64>) {
        let mut g = self.state.lock();
        if let Some(x) = g.queue.iter_mut().find(|x| x.id == id) {
            x.written = true;
            x.step = step;
        }
        self.written.notify_all();
    }

    /// Whether every generation in flight has written (none is writing).
    pub(crate) fn all_written(&self) -> bool {
        self.state.lock().queue.iter().all(|g| g.written)
    }

    /// Whether no generation is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.state.lock().queue.is_empty()
    }

    /// Settles generation `id` with `done`: it retires at once (`retire`,
    /// under this lock) if it is alone; then every settled generation at
    /// the front retires, oldest first. `retire` gets the generation and
    /// the cap on its growth of the disk length ([`cut_under`](Self::cut_under)).
    pub(crate) fn settle(&self, id: u64, done: T, mut retire: impl FnMut(T, Option<u64>)) {
        let mut g = self.state.lock();
        let at = g
            .queue
            .iter()
            .position(|x| x.id == id)
            .expect("generation registered at drain");
        let cap =
            |g: &Queue<T>, id: u64| g.cut.filter(|&(below, _)| id < below).map(|(_, len)| len);
        let mut retired = false;
        if g.queue[at].alone && at > 0 {
            g.queue.remove(at);
            retire(done, cap(&g, id));
            retired = true;
        } else {
            g.queue[at].done = Some(done);
        }
        while g.queue.front().is_some_and(|x| x.done.is_some()) {
            let x = g.queue.pop_front().expect("checked");
            let done = x.done.expect("checked");
            retire(done, cap(&g, x.id));
            retired = true;
        }
        if retired && g.queue.is_empty() {
            self.settled.notify_all();
        }
    }

    /// Generation `id` (drain lock held, every older one written) cut the
    /// file to `len`: runs `lower` with no generation retiring meanwhile,
    /// and caps the disk length the older ones not yet retired may claim
    /// (one may have written the page `len` falls in whole).
    pub(crate) fn cut_under(&self, id: u64, len: u64, lower: impl FnOnce()) {
        let mut g = self.state.lock();
        g.cut = Some((id, len));
        lower();
    }

    /// Waits until no generation is in flight (a pass waiting for its
    /// `fdatasync` included).
    pub(crate) fn wait_all_settled(&self) {
        let mut g = self.state.lock();
        while !g.queue.is_empty() {
            self.settled.wait(&mut g);
        }
    }
}
