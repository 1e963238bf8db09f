//! The locks and atomics of the cached file, behind one facade: parking_lot
//! and std in every normal build; with the `shuttle` feature, shuttle's
//! (randomized schedule exploration), so `tests/shuttle_commit.rs` can model
//! check the pipelined group commit on the real code.
//!
//! Only [`crate::cached_file`] goes through here: its lock order and
//! wakeups are what the model check is about. A build with `shuttle` works
//! only inside `shuttle::check_*`.

#[cfg(not(feature = "shuttle"))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::thread::{Builder as ThreadBuilder, JoinHandle};

/// The calling thread's id (a guard records its owner: a thread asking for
/// a page it holds a guard on is refused instead of waiting on itself).
/// Kept per thread: `std::thread::current()` clones the thread's handle
/// (an atomic count up and down) on every call.
#[cfg(not(feature = "shuttle"))]
pub(crate) fn current_thread_id() -> ThreadId {
    std::thread_local! {
        static ID: ThreadId = std::thread::current().id();
    }
    ID.with(|id| *id)
}
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::thread::ThreadId;

/// Where a long I/O call without a lock starts: nothing in a normal
/// build; under shuttle a point where other threads may run before the
/// call's effect lands (the test backends take a plain lock, no yield).
#[cfg(not(feature = "shuttle"))]
#[inline(always)]
pub(crate) fn io_point() {}

/// A spin-wait's pause: `std::thread::yield_now`; under shuttle its
/// yield, which lets the schedulers run the threads the wait is for.
#[cfg(not(feature = "shuttle"))]
#[inline(always)]
pub(crate) fn yield_now() {
    std::thread::yield_now();
}

/// See the other `yield_now`.
#[cfg(feature = "shuttle")]
pub(crate) fn yield_now() {
    shuttle::thread::yield_now();
}

/// See the other `io_point`.
#[cfg(feature = "shuttle")]
pub(crate) fn io_point() {
    shuttle::thread::yield_now();
}

#[cfg(feature = "shuttle")]
pub(crate) fn current_thread_id() -> ThreadId {
    shuttle::thread::current().id()
}
#[cfg(feature = "shuttle")]
pub(crate) use shuttle::thread::ThreadId;

/// Wakers taken out under a lock, to be woken once it is dropped (a woken
/// thread's first step is usually to take that lock): fill it with
/// [`push`](Self::push) under the lock, then [`wake`](Self::wake). The
/// list is kept per thread, so a steady load allocates none.
pub(crate) struct Woken(Vec<std::task::Waker>);

std::thread_local! {
    static WOKEN: std::cell::Cell<Vec<std::task::Waker>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Woken {
    /// An empty list (this thread's kept one).
    pub(crate) fn new() -> Self {
        Self(WOKEN.take())
    }

    pub(crate) fn push(&mut self, waker: std::task::Waker) {
        self.0.push(waker);
    }

    /// Wakes every waker in the list (with no lock held).
    pub(crate) fn wake(mut self) {
        self.0.drain(..).for_each(std::task::Waker::wake);
    }
}

impl Drop for Woken {
    fn drop(&mut self) {
        self.0.clear();
        WOKEN.set(std::mem::take(&mut self.0));
    }
}

/// A `Waker` that unparks the calling thread, and [`park`] to wait for
/// it: how a thread blocks until the event it registered for (an
/// `fdatasync` that covers its commit) wakes exactly it. Cached per
/// thread, so a steady load allocates none.
#[cfg(not(feature = "shuttle"))]
pub(crate) fn thread_waker() -> std::task::Waker {
    std::thread_local! {
        static WAKER: std::task::Waker =
            std::task::Waker::from(std::sync::Arc::new(ThreadWake(std::thread::current())));
    }
    WAKER.with(std::task::Waker::clone)
}

/// Blocks the calling thread until its waker is woken (or spuriously:
/// callers recheck their condition).
#[cfg(not(feature = "shuttle"))]
pub(crate) fn park() {
    std::thread::park();
}

#[cfg(not(feature = "shuttle"))]
struct ThreadWake(std::thread::Thread);

#[cfg(not(feature = "shuttle"))]
impl std::task::Wake for ThreadWake {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// See the other `thread_waker` (a fresh one per call: shuttle's threads
/// are not the OS's, so no thread-local cache).
#[cfg(feature = "shuttle")]
pub(crate) fn thread_waker() -> std::task::Waker {
    std::task::Waker::from(std::sync::Arc::new(ShuttleWake(shuttle::thread::current())))
}

/// See the other `park`.
#[cfg(feature = "shuttle")]
pub(crate) fn park() {
    shuttle::thread::park();
}

#[cfg(feature = "shuttle")]
struct ShuttleWake(shuttle::thread::Thread);

#[cfg(feature = "shuttle")]
impl std::task::Wake for ShuttleWake {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

#[cfg(feature = "shuttle")]
pub(crate) use self::model::{Condvar, Mutex, MutexGuard};
#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(feature = "shuttle")]
pub(crate) use shuttle::thread::{Builder as ThreadBuilder, JoinHandle};

/// parking_lot's API (what the cached file uses of it) over shuttle's
/// std-like primitives.
#[cfg(feature = "shuttle")]
mod model {
    use std::ops::{Deref, DerefMut};

    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(shuttle::sync::Mutex<T>);

    /// A guard that can be given up and taken again in place
    /// ([`Condvar::wait`]).
    pub(crate) struct MutexGuard<'a, T> {
        guard: Option<shuttle::sync::MutexGuard<'a, T>>,
    }

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(shuttle::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard {
                guard: Some(self.0.lock().unwrap_or_else(|p| p.into_inner())),
            }
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            let guard = match self.0.try_lock() {
                Ok(g) => g,
                Err(shuttle::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(shuttle::sync::TryLockError::WouldBlock) => return None,
            };
            Some(MutexGuard { guard: Some(guard) })
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.guard.as_deref().expect("guard held")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.guard.as_deref_mut().expect("guard held")
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct Condvar(shuttle::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(shuttle::sync::Condvar::new())
        }

        pub(crate) fn wait<T>(&self, g: &mut MutexGuard<'_, T>) {
            let inner = g.guard.take().expect("guard held");
            g.guard = Some(self.0.wait(inner).unwrap_or_else(|p| p.into_inner()));
        }

        /// No timeouts in the model: a wait that only a timeout would end
        /// shows up as a deadlock, which is the point.
        pub(crate) fn wait_for<T>(&self, g: &mut MutexGuard<'_, T>, _timeout: std::time::Duration) {
            self.wait(g)
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
    }
}
