//! The write buffer: dirty and in-flight pages in lock stripes, the page
//! pool, the bound on buffered bytes (and the writers waiting for room),
//! and the page latches of live guards ([`WritablePage`]).
//!
//! Owns: the stripes (each a lock, with a condvar for its guard waiters),
//! the pool, `buffered` (dirty plus in-flight bytes), `guards` and the
//! room counter (a lock and a condvar). Calls: [`Length::grow`] under a
//! stripe lock, and a closure into the read cache (stripe before cache
//! stripe). The only I/O is a partial write's disk read, with no lock held.
//!
//! Invariants:
//! - page `n` lives in stripe `n & (stripes - 1)`: its newest version is in
//!   `dirty`, else in its youngest in-flight generation, else in neither;
//! - `buffered` counts a page from its insert (under the stripe lock) until
//!   its generation retires or it is dropped;
//! - a page under a live guard is written by no one but the guard's drop
//!   (the guard's own thread is refused, `Busy`);
//! - every event that may free room bumps `room` and notifies under its
//!   lock, so no writer sleeps through one.
//!
//! Lock order: stripe -> cache stripe; the room lock is a leaf. A drain,
//! a requeue and a retire take one stripe at a time; a cut and a refresh
//! take every stripe, in order.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::config::{Counters, add};
use super::generations::DrainHeld;
use super::length::Length;
use super::lifecycle::Lifecycle;
use crate::buffer::{AlignedBuf, BufferPool, UniqueBuf};
use crate::error::{Error, Result};
use crate::sync::{AtomicUsize, Condvar, Mutex, MutexGuard, ThreadId, current_thread_id};

/// A page (or a range of pages) as returned by
/// [`PagedCachedFile::read`](crate::PagedCachedFile::read): shared,
/// immutable, aligned to the page size (at most 4096 bytes). Derefs to
/// `[u8]`.
pub type PageRef = Arc<AlignedBuf>;

/// Hash for page numbers: a Fibonacci multiply (keys are dense integers).
#[derive(Default)]
pub(crate) struct PageHasher(u64);

impl Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

/// Page number -> page.
pub(crate) type PageMap = HashMap<u64, PageRef, BuildHasherDefault<PageHasher>>;

/// Fewest and most emptied maps a stripe keeps for its next drains: as
/// many as generations have been in flight at once, within these bounds.
const SPARE_MAPS: std::ops::RangeInclusive<usize> = 4..=64;

/// Largest capacity (pages) of a map kept as a spare (a bulk flush's is
/// dropped, so the maps that go round stay small to iterate).
pub(crate) const SPARE_MAP_MAX: usize = 1024;

/// One stripe's pages of an in-flight generation. Derefs to the pages.
pub(crate) struct InFlight {
    /// Generation number (drain order).
    generation: u64,
    pages: Arc<PageMap>,
}

impl std::ops::Deref for InFlight {
    type Target = PageMap;
    fn deref(&self) -> &PageMap {
        &self.pages
    }
}

/// One lock stripe of the write buffer.
#[derive(Default)]
pub(crate) struct Stripe {
    /// Newest versions written since the last drain.
    dirty: PageMap,
    /// Bumped on every change to `dirty` or to a page's disk bytes
    /// (`set_len`): a partial write that read a page without the lock
    /// inserts its merge only if this has not moved.
    seq: u64,
    /// Pages under a live guard, with the guard's thread.
    guarded: Vec<(u64, ThreadId)>,
    /// Pages discarded while in flight: a failed write does not put them
    /// back. Cleared when nothing of this stripe is in flight.
    discarded: Vec<u64>,
    /// What each flush in progress drained from this stripe, oldest first,
    /// until its writes (and for a commit, its fdatasync) completed.
    flushing: Vec<InFlight>,
    /// Emptied maps of retired generations, unique: the next drain swaps
    /// one in for `dirty` (so a steady load allocates none).
    spare: Vec<Arc<PageMap>>,
}

impl Stripe {
    /// The newest buffered or in-flight version of page `n`.
    fn newest(&self, n: u64) -> Option<&PageRef> {
        self.dirty
            .get(&n)
            .or_else(|| self.flushing.iter().rev().find_map(|g| g.get(&n)))
    }
}

/// Bytes written into part of one page ([`WriteBuffer::merge`]).
pub(crate) struct PartialPage<'a> {
    pub(crate) page_no: u64,
    /// Where in the page the bytes start.
    pub(crate) within: usize,
    pub(crate) bytes: &'a [u8],
    /// The logical length the write grows the file to (bytes).
    pub(crate) end: u64,
}

/// What became of a page a failed write gave back ([`WriteBuffer::requeue`]).
pub(crate) enum Requeued {
    /// Back in the write buffer, still counted.
    Kept,
    /// A newer version is buffered or in flight: this one goes.
    Newer,
    /// The engine discarded the page while it was in flight: it stays gone.
    Discarded,
}

/// The write buffer of one file (see the module docs).
pub(crate) struct WriteBuffer {
    stripes: Box<[Mutex<Stripe>]>,
    /// Per stripe: notified when a guard on one of its pages is dropped.
    unguarded: Box<[Condvar]>,
    /// Page buffers of retired generations, reused by writers.
    pool: BufferPool,
    /// Dirty plus in-flight bytes.
    buffered: AtomicUsize,
    /// Bound on `buffered` (`Config::max_write_buffer_bytes`).
    max_bytes: usize,
    /// Live guards (while 0, no guard scan).
    guards: AtomicUsize,
    /// Counts the events that may free room (settles, a poisoning): a
    /// writer finding the buffer full of in-flight pages sleeps on
    /// `room_freed` only if none happened since it last looked.
    room: Mutex<u64>,
    room_freed: Condvar,
    page_size: usize,
    page_align: usize,
    page_shift: u32,
    stripe_mask: u64,
}

impl WriteBuffer {
    /// An empty buffer of `stripes` stripes (a power of two) bounded at
    /// `max_bytes`, of `page_size`-byte pages aligned to `page_align`.
    pub(crate) fn new(
        stripes: usize,
        max_bytes: usize,
        page_size: usize,
        page_align: usize,
    ) -> Self {
        Self {
            stripes: (0..stripes)
                .map(|_| Mutex::new(Stripe::default()))
                .collect(),
            unguarded: (0..stripes).map(|_| Condvar::new()).collect(),
            pool: BufferPool::new(page_size, page_align, max_bytes).expect("alignment validated"),
            buffered: AtomicUsize::new(0),
            max_bytes,
            guards: AtomicUsize::new(0),
            room: Mutex::new(0),
            room_freed: Condvar::new(),
            page_size,
            page_align,
            page_shift: page_size.trailing_zeros(),
            stripe_mask: stripes as u64 - 1,
        }
    }

    // ---- geometry and memory ----

    /// The page that byte `offset` falls in.
    #[inline]
    pub(crate) fn page_no(&self, offset: u64) -> u64 {
        offset >> self.page_shift
    }

    /// The first byte of page `page_no`.
    #[inline]
    pub(crate) fn offset_of(&self, page_no: u64) -> u64 {
        page_no << self.page_shift
    }

    #[inline]
    pub(crate) fn stripe_count(&self) -> usize {
        self.stripes.len()
    }

    #[inline]
    fn stripe_no(&self, page_no: u64) -> usize {
        (page_no & self.stripe_mask) as usize
    }

    /// `pages` (as [`by_stripe`](Self::by_stripe) leaves them) in runs of
    /// one stripe each: the stripe's number and its pages.
    fn stripe_groups<'a>(&self, pages: &'a [u64]) -> impl Iterator<Item = (usize, &'a [u64])> {
        let mask = self.stripe_mask;
        pages
            .chunk_by(move |a, b| a & mask == b & mask)
            .map(move |group| ((group[0] & mask) as usize, group))
    }

    #[inline]
    fn stripe(&self, page_no: u64) -> &Mutex<Stripe> {
        &self.stripes[self.stripe_no(page_no)]
    }

    #[inline]
    pub(crate) fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Zeroed memory of `len` bytes: from the pool for one page, fresh
    /// otherwise. [`Error::NoMemory`] where the process cannot get it.
    pub(crate) fn alloc(&self, len: usize) -> Result<UniqueBuf> {
        if len == self.page_size {
            return self.page_buf();
        }
        match AlignedBuf::try_zeroed(len, self.page_align) {
            Ok(Some(b)) => Ok(UniqueBuf::new(b)),
            Ok(None) | Err(_) => Err(Error::NoMemory { bytes: len as u64 }),
        }
    }

    /// A zeroed page from the pool; [`Error::NoMemory`] where the process
    /// cannot get one.
    pub(crate) fn page_buf(&self) -> Result<UniqueBuf> {
        self.pool.try_zeroed().ok_or(Error::NoMemory {
            bytes: self.page_size as u64,
        })
    }

    /// Copies of `bytes` (whole pages) in the first slots of `out`, taken
    /// from the pool side by side in memory where it can (a run of them
    /// then goes out as one segment); [`Error::NoMemory`] (nothing kept).
    pub(crate) fn page_copies(&self, bytes: &[u8], out: &mut [Option<UniqueBuf>]) -> Result<()> {
        if self.pool.try_copies_of(bytes, out) {
            Ok(())
        } else {
            Err(Error::NoMemory {
                bytes: bytes.len() as u64,
            })
        }
    }

    /// A copy of `bytes` (one page); [`Error::NoMemory`].
    pub(crate) fn page_copy(&self, bytes: &[u8]) -> Result<UniqueBuf> {
        self.pool.try_copy_of(bytes).ok_or(Error::NoMemory {
            bytes: self.page_size as u64,
        })
    }

    // ---- room (the bound on buffered bytes) ----

    /// Dirty plus in-flight bytes.
    #[inline]
    pub(crate) fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Acquire)
    }

    /// Backpressure: while the buffer is at or over its bound, `flush`, or
    /// with nothing left to flush wait until a batch settles (the bound is
    /// exceeded by at most the pages of writers past this check). `check`
    /// refuses a file that takes no writes.
    ///
    /// Errors: `check`'s, or the flush's unless it still freed room.
    pub(crate) fn wait_for_room(
        &self,
        counters: &Counters,
        check: impl Fn() -> Result<()>,
        mut flush: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        let max = self.max_bytes;
        if self.buffered() < max {
            return Ok(());
        }
        add(&counters.backpressure_waits, 1);
        while self.buffered() >= max {
            check()?;
            let seen = *self.room.lock();
            let before = self.buffered();
            let flushed = match flush() {
                Ok(flushed) => flushed,
                // Failed pages stay dirty; if nothing was freed, waiting
                // would spin: the error is the answer.
                Err(Error::PagesFailed { .. }) if self.buffered() < before => true,
                Err(e) => return Err(e),
            };
            if !flushed {
                let mut room = self.room.lock();
                if *room == seen && self.buffered() >= max {
                    // Nothing settled since before the flush: every event
                    // that frees room bumps `room` under it, so none is
                    // missed. The timeout only bounds a hung fdatasync.
                    self.room_freed
                        .wait_for(&mut room, std::time::Duration::from_millis(100));
                }
            }
        }
        Ok(())
    }

    /// Wakes writers waiting for room: a settle, pages put back, a poison.
    pub(crate) fn notify_room(&self) {
        let mut room = self.room.lock();
        *room = room.wrapping_add(1);
        self.room_freed.notify_all();
    }

    /// Takes dropped `bytes` off the bound and wakes writers waiting.
    fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.uncount(bytes);
        self.notify_room();
    }

    /// Takes `bytes` off the bound; the caller wakes the waiters.
    #[inline]
    pub(crate) fn uncount(&self, bytes: usize) {
        debug_assert!(self.buffered() >= bytes, "buffered bytes would wrap");
        self.buffered.fetch_sub(bytes, Ordering::AcqRel);
    }

    // ---- writes ----

    /// Buffers one whole page (after another thread's guard on it is
    /// dropped; [`Error::Busy`] over this thread's own), growing the
    /// logical length to its end.
    pub(crate) fn insert(
        &self,
        page_no: u64,
        page: PageRef,
        length: &Length,
        counters: &Counters,
    ) -> Result<()> {
        let end = (page_no + 1) << self.page_shift;
        let mut stripe = self.stripe(page_no).lock();
        self.wait_unguarded(&mut stripe, page_no)?;
        self.insert_locked(&mut stripe, page_no, page, end, length, counters);
        Ok(())
    }

    /// Buffers one page under its stripe lock; the length grows to `end`.
    fn insert_locked(
        &self,
        stripe: &mut Stripe,
        page_no: u64,
        page: PageRef,
        end: u64,
        length: &Length,
        counters: &Counters,
    ) {
        let bytes = page.len();
        debug_assert_eq!(bytes, self.page_size);
        debug_assert!(end > page_no << self.page_shift && end <= (page_no + 1) << self.page_shift);
        stripe.seq = stripe.seq.wrapping_add(1);
        if !stripe.discarded.is_empty() {
            stripe.discarded.retain(|&p| p != page_no);
        }
        if stripe.dirty.insert(page_no, page).is_none() {
            // Counted under the stripe lock: a drain (which takes this lock)
            // must never see, and later subtract, a page not yet counted.
            let now = self.buffered.fetch_add(bytes, Ordering::AcqRel) + bytes;
            counters
                .peak_buffered_bytes
                .fetch_max(now as u64, Ordering::Relaxed);
        }
        // Under the stripe lock too: `set_len` holds every stripe lock when
        // it lowers the length, so no page can be left buffered past it.
        length.grow(end);
        add(&counters.pages_dirtied, 1);
    }

    /// Merges `write.bytes` into page `write.page_no` and buffers it (the
    /// length grows to `write.end`): into the buffered or in-flight version,
    /// else `cached`'s, else what `read_disk` reads with no lock held (kept
    /// only if `Stripe::seq` did not move, else redone).
    ///
    /// Errors: [`Error::Busy`] over a page this thread guards;
    /// [`Error::NoMemory`]; `read_disk`'s.
    pub(crate) fn merge(
        &self,
        write: PartialPage<'_>,
        length: &Length,
        cached: impl Fn(u64) -> Option<PageRef>,
        counters: &Counters,
        mut read_disk: impl FnMut(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let PartialPage {
            page_no,
            within,
            bytes,
            end,
        } = write;
        let stripe = self.stripe(page_no);
        loop {
            let seq = {
                let mut s = stripe.lock();
                self.wait_unguarded(&mut s, page_no)?;
                if let Some(page) = s.dirty.get_mut(&page_no).and_then(Arc::get_mut) {
                    // Nobody else holds the buffered page: merge in place.
                    page[within..within + bytes.len()].copy_from_slice(bytes);
                    s.seq = s.seq.wrapping_add(1);
                    length.grow(end);
                    add(&counters.pages_dirtied, 1);
                    return Ok(());
                }
                let newest = s.newest(page_no).cloned().or_else(|| cached(page_no));
                if let Some(cur) = newest {
                    let mut page = self.page_copy(&cur)?;
                    page[within..within + bytes.len()].copy_from_slice(bytes);
                    self.insert_locked(&mut s, page_no, page.share(), end, length, counters);
                    return Ok(());
                }
                s.seq
            };
            // In no buffer: read it without the lock, then merge if the
            // stripe did not change meanwhile.
            let mut page = self.page_buf()?;
            read_disk(&mut page)?;
            page[within..within + bytes.len()].copy_from_slice(bytes);
            let mut s = stripe.lock();
            if s.seq == seq && !s.guarded.iter().any(|&(p, _)| p == page_no) {
                self.insert_locked(&mut s, page_no, page.share(), end, length, counters);
                return Ok(());
            }
            drop(s);
            self.pool.put_all([page.share()]);
        }
    }

    // ---- reads ----

    /// The newest buffered or in-flight version of page `page_no`.
    pub(crate) fn find(&self, page_no: u64) -> Option<PageRef> {
        self.stripe(page_no).lock().newest(page_no).cloned()
    }

    /// Copies bytes `within..` of the newest buffered or in-flight version
    /// of page `page_no` into `dst`; `false` if there is none.
    pub(crate) fn copy_newest(&self, page_no: u64, within: usize, dst: &mut [u8]) -> bool {
        match self.stripe(page_no).lock().newest(page_no) {
            Some(page) => {
                dst.copy_from_slice(&page[within..within + dst.len()]);
                true
            }
            None => false,
        }
    }

    // ---- guards (page latches) ----

    /// Latches `pages` for a new guard of this thread, in page order (no
    /// cycle between overlapping guards), waiting for other threads'
    /// guards; counted in `guards` until [`unlatch`](Self::unlatch) or
    /// [`insert_guarded`](Self::insert_guarded).
    ///
    /// Errors: [`Error::Busy`] over a page this thread guards (nothing
    /// stays latched).
    pub(crate) fn latch(&self, pages: std::ops::Range<u64>) -> Result<()> {
        let me = current_thread_id();
        // Counted before the pages are marked: `discard`, `set_len` and
        // `close` look for marks only while this is non-zero.
        self.guards.fetch_add(1, Ordering::SeqCst);
        for p in pages.clone() {
            let mut s = self.stripe(p).lock();
            if let Err(e) = self.wait_unguarded(&mut s, p) {
                drop(s);
                self.unmark(pages.start..p);
                self.guards.fetch_sub(1, Ordering::SeqCst);
                return Err(e);
            }
            s.guarded.push((p, me));
        }
        Ok(())
    }

    /// Ends a guard without writing: unlatches `pages`, memory to the pool.
    pub(crate) fn unlatch(
        &self,
        pages: std::ops::Range<u64>,
        buf: UniqueBuf,
        split: Vec<UniqueBuf>,
    ) {
        self.unmark(pages);
        self.pool.put_all([buf.share()]);
        self.pool.put_all(split.into_iter().map(UniqueBuf::share));
        self.guards.fetch_sub(1, Ordering::SeqCst);
    }

    /// Removes the guard marks of `pages` and wakes their waiters.
    fn unmark(&self, pages: std::ops::Range<u64>) {
        for p in pages {
            self.stripe(p).lock().guarded.retain(|&(g, _)| g != p);
            self.unguarded[self.stripe_no(p)].notify_all();
        }
    }

    /// Buffers a guard's pages at byte `offset`, dropping each page's mark
    /// under the same lock (no other write slips in between); a guard over
    /// several pages is copied into `pages`, taken with the guard.
    pub(crate) fn insert_guarded(
        &self,
        offset: u64,
        buf: UniqueBuf,
        pages: Vec<UniqueBuf>,
        length: &Length,
        counters: &Counters,
    ) {
        let ps = self.page_size;
        let first = self.page_no(offset);
        let one = |p: u64, page: PageRef| {
            let mut s = self.stripe(p).lock();
            s.guarded.retain(|&(g, _)| g != p);
            let end = (p + 1) << self.page_shift;
            self.insert_locked(&mut s, p, page, end, length, counters);
            self.unguarded[self.stripe_no(p)].notify_all();
        };
        if buf.len() == ps {
            one(first, buf.share());
        } else {
            debug_assert_eq!(pages.len() * ps, buf.len());
            for (i, (chunk, mut page)) in buf.chunks(ps).zip(pages).enumerate() {
                page.copy_from_slice(chunk);
                one(first + i as u64, page.share());
            }
        }
        self.guards.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits, with the page's stripe locked, until no guard holds it;
    /// [`Error::Busy`] for this thread's own guard (never dropped while
    /// it waits).
    fn wait_unguarded(&self, s: &mut MutexGuard<'_, Stripe>, page_no: u64) -> Result<()> {
        if s.guarded.is_empty() {
            return Ok(());
        }
        let me = current_thread_id();
        while let Some(&(_, owner)) = s.guarded.iter().find(|(p, _)| *p == page_no) {
            if owner == me {
                return Err(Error::Busy {
                    offset: page_no << self.page_shift,
                });
            }
            self.unguarded[self.stripe_no(page_no)].wait(s);
        }
        Ok(())
    }

    pub(crate) fn check_unguarded(&self, offset: u64, len: u64) -> Result<()> {
        self.check_guards(offset, len, None)
    }

    /// Refuses a write over a page under this thread's own guard before
    /// anything is buffered (only this thread adds such guards, so the
    /// check cannot go stale).
    #[inline]
    pub(crate) fn check_not_own_guard(&self, offset: u64, len: u64) -> Result<()> {
        if self.guards.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        self.check_guards(offset, len, Some(current_thread_id()))
    }

    /// [`Error::Busy`] for the first page in `len` bytes at `offset` under
    /// a live guard (one taken by `owner`, where given).
    fn check_guards(&self, offset: u64, len: u64, owner: Option<ThreadId>) -> Result<()> {
        if self.guards.load(Ordering::SeqCst) == 0 || len == 0 {
            return Ok(());
        }
        let first = self.page_no(offset);
        let last = self.page_no(offset.saturating_add(len - 1));
        let hit =
            |&(p, t): &(u64, ThreadId)| p >= first && p <= last && owner.is_none_or(|o| o == t);
        let busy = |p: u64| {
            Err(Error::Busy {
                offset: p << self.page_shift,
            })
        };
        // A huge range: look at the (few) guarded pages instead.
        if last - first >= self.stripes.len() as u64 {
            let mut found: Option<u64> = None;
            for s in self.stripes.iter() {
                for &(p, _) in s.lock().guarded.iter().filter(|g| hit(g)) {
                    found = Some(found.map_or(p, |f| f.min(p)));
                }
            }
            return found.map_or(Ok(()), busy);
        }
        for p in first..=last {
            if self
                .stripe(p)
                .lock()
                .guarded
                .iter()
                .any(|g| g.0 == p && hit(g))
            {
                return busy(p);
            }
        }
        Ok(())
    }

    /// The byte offset of some page under a live guard, if any guard lives.
    pub(crate) fn a_guarded_page(&self) -> Option<u64> {
        if self.guards.load(Ordering::SeqCst) == 0 {
            return None;
        }
        self.stripes
            .iter()
            .find_map(|s| s.lock().guarded.first().map(|&(p, _)| p))
            .map(|p| p << self.page_shift)
    }

    // ---- drain, requeue, retire (the flush pipeline's side) ----

    /// Moves every stripe's dirty pages to in-flight generation `id` (a swap
    /// per stripe), appending (stripe, map) to `drained`. Returns the
    /// youngest older generation in flight holding one of these pages (the
    /// write latch: this one writes only after every one up to it has).
    pub(crate) fn drain(
        &self,
        _drain: &DrainHeld,
        id: u64,
        drained: &mut Vec<(usize, Arc<PageMap>)>,
    ) -> Option<u64> {
        let mut after: Option<u64> = None;
        for (i, stripe) in self.stripes.iter().enumerate() {
            let mut s = stripe.lock();
            if s.dirty.is_empty() {
                continue;
            }
            let mut map = s.spare.pop().unwrap_or_default();
            let Some(empty) = Arc::get_mut(&mut map) else {
                unreachable!("spare maps are unique: kept only after Arc::get_mut, never cloned")
            };
            std::mem::swap(empty, &mut s.dirty);
            // The write latch: an older version of one of these pages still
            // in flight must reach the OS before this one is written.
            for older in &s.flushing {
                if after.is_none_or(|a| older.generation > a)
                    && map.keys().any(|p| older.contains_key(p))
                {
                    after = Some(older.generation);
                }
            }
            s.flushing.push(InFlight {
                generation: id,
                pages: Arc::clone(&map),
            });
            drop(s);
            drained.push((i, map));
        }
        after
    }

    /// [`drain`](Self::drain) of the dirty pages among `pages` (as
    /// [`by_stripe`](Self::by_stripe) leaves them) only. For each of
    /// `pages` not dirty but in flight, pushes the youngest generation
    /// holding it to `in_flight` (the write the commit must wait for).
    pub(crate) fn drain_pages(
        &self,
        _drain: &DrainHeld,
        id: u64,
        pages: &[u64],
        drained: &mut Vec<(usize, Arc<PageMap>)>,
        in_flight: &mut Vec<u64>,
    ) -> Option<u64> {
        let mut after: Option<u64> = None;
        for (i, group) in self.stripe_groups(pages) {
            let mut s = self.stripes[i].lock();
            let mut map: Option<Arc<PageMap>> = None;
            for &p in group {
                let older = s.flushing.iter().rev().find(|g| g.contains_key(&p));
                let older = older.map(|g| g.generation);
                match s.dirty.remove(&p) {
                    Some(page) => {
                        if let Some(g) = older {
                            after = Some(after.map_or(g, |a| a.max(g)));
                        }
                        if map.is_none() {
                            map = Some(s.spare.pop().unwrap_or_default());
                        }
                        let m = map.as_mut().expect("set above");
                        let Some(m) = Arc::get_mut(m) else {
                            unreachable!("a map being filled is not shared yet")
                        };
                        m.insert(p, page);
                    }
                    None => in_flight.extend(older),
                }
            }
            if let Some(map) = map {
                s.flushing.push(InFlight {
                    generation: id,
                    pages: Arc::clone(&map),
                });
                drop(s);
                drained.push((i, map));
            }
        }
        after
    }

    /// Sorts page numbers by stripe (then by number) and drops repeats:
    /// the order [`drain_pages`](Self::drain_pages) takes them in.
    pub(crate) fn by_stripe(&self, pages: &mut Vec<u64>) {
        let mask = self.stripe_mask;
        pages.sort_unstable_by_key(|&p| (p & mask, p));
        pages.dedup();
    }

    /// Puts page `n`, whose write failed, back from the generation that
    /// drained it (`drained`), unless a newer version exists or it was
    /// discarded meanwhile. A page kept stays counted in `buffered`.
    pub(crate) fn requeue(
        &self,
        n: u64,
        page: &PageRef,
        drained: &[(usize, Arc<PageMap>)],
    ) -> Requeued {
        let stripe_no = self.stripe_no(n);
        let map = &drained
            .iter()
            .find(|(i, _)| *i == stripe_no)
            .expect("a drained page's stripe was drained")
            .1;
        let mut s = self.stripes[stripe_no].lock();
        let pos = s
            .flushing
            .iter()
            .position(|g| Arc::ptr_eq(&g.pages, map))
            .expect("generation still in flight");
        let newer =
            s.dirty.contains_key(&n) || s.flushing[pos + 1..].iter().any(|g| g.contains_key(&n));
        // A page the engine discarded while it was in flight stays gone.
        if !newer && !s.discarded.contains(&n) {
            s.dirty.insert(n, Arc::clone(page));
            s.seq = s.seq.wrapping_add(1);
            Requeued::Kept
        } else if s.discarded.contains(&n) {
            Requeued::Discarded
        } else {
            Requeued::Newer
        }
    }

    /// Removes a finished generation's `map` from stripe `stripe_no`,
    /// keeping it emptied as a spare; the bytes of its pages. Every page
    /// is in `dirty`, the read cache or on disk before it goes.
    pub(crate) fn retire(&self, stripe_no: usize, mut map: Arc<PageMap>, depth: usize) -> usize {
        let total = map.values().map(|p| p.len()).sum::<usize>();
        let mut s = self.stripes[stripe_no].lock();
        s.flushing.retain(|g| !Arc::ptr_eq(&g.pages, &map));
        if s.flushing.is_empty() {
            s.discarded.clear();
        }
        // Out of `flushing`, the batch holds the last reference: emptying
        // it leaves each page's last reference to the batch (for the pool).
        let room = s.spare.len() < depth.clamp(*SPARE_MAPS.start(), *SPARE_MAPS.end());
        match Arc::get_mut(&mut map) {
            Some(m) if room && m.capacity() <= SPARE_MAP_MAX => {
                m.clear();
                s.spare.push(map);
            }
            // A bulk flush's large map is freed outside the lock.
            _ => {
                drop(s);
                drop(map);
            }
        }
        total
    }

    // ---- discard, cut, refresh ----

    /// An engine's `discard` of `pages`: dirty ones leave the buffer,
    /// in-flight ones are marked so a failed write does not bring them back.
    pub(crate) fn discard(&self, pages: std::ops::Range<u64>) {
        let mut freed = 0usize;
        let drop_in = |s: &mut Stripe, freed: &mut usize, p: u64| {
            if let Some(page) = s.dirty.remove(&p) {
                *freed += page.len();
                s.seq = s.seq.wrapping_add(1);
            }
            let in_flight = s.flushing.iter().any(|g| g.contains_key(&p));
            if in_flight && !s.discarded.contains(&p) {
                s.discarded.push(p);
            }
        };
        if pages.end - pages.start <= 4 * self.stripes.len() as u64 {
            for p in pages.clone() {
                drop_in(&mut self.stripe(p).lock(), &mut freed, p);
            }
        } else {
            // A wide range: visit what is buffered instead of every page.
            for stripe in self.stripes.iter() {
                let mut s = stripe.lock();
                let mut hit: Vec<u64> = s.dirty.keys().copied().collect();
                for g in &s.flushing {
                    hit.extend(g.keys().copied());
                }
                hit.retain(|p| pages.contains(p));
                for p in hit {
                    drop_in(&mut s, &mut freed, p);
                }
            }
        }
        self.release(freed);
    }

    /// Cuts the buffer at byte `len` (a shrink, nothing in flight): with
    /// every stripe locked, pages past `len` go, the page `len` falls in
    /// keeps its head (copied into `tail_buf`, taken up front so nothing
    /// fails here), and `under_lock` runs (the caller's cache and lengths)
    /// before any stripe opens again.
    pub(crate) fn cut(&self, len: u64, tail_buf: Option<UniqueBuf>, under_lock: impl FnOnce()) {
        let ps = self.page_size as u64;
        let cut = (len + ps - 1) >> self.page_shift;
        let tail = (!len.is_multiple_of(ps)).then(|| (self.page_no(len), (len % ps) as usize));
        let mut tail_buf = tail_buf;
        let mut freed = 0usize;
        {
            let mut locked: Vec<_> = self.stripes.iter().map(|s| s.lock()).collect();
            for s in locked.iter_mut() {
                s.seq = s.seq.wrapping_add(1);
                debug_assert!(s.flushing.is_empty(), "set_len waited for in-flight pages");
                s.dirty.retain(|&p, page| {
                    let keep = p < cut;
                    if !keep {
                        freed += page.len();
                    }
                    keep
                });
            }
            if let Some((p, keep)) = tail {
                let s = &mut locked[self.stripe_no(p)];
                if let Some(page) = s.dirty.get_mut(&p) {
                    let mut zeroed = tail_buf.take().expect("taken for an unaligned cut");
                    zeroed[..keep].copy_from_slice(&page[..keep]);
                    *page = zeroed.share();
                }
            }
            under_lock();
        }
        if let Some(b) = tail_buf {
            self.pool.put_all([b.share()]);
        }
        self.release(freed);
    }

    /// Runs `f` with every stripe locked if nothing is buffered (a refresh:
    /// no write can be buffered until the stripes open again).
    ///
    /// Errors: [`Error::Buffered`] (then `f` did not run); `f`'s.
    pub(crate) fn with_nothing_buffered(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let locked: Vec<_> = self.stripes.iter().map(|s| s.lock()).collect();
        let bytes = self.buffered();
        if bytes != 0 || locked.iter().any(|s| !s.dirty.is_empty()) {
            return Err(Error::Buffered { bytes });
        }
        f()
    }
}

/// Write access to one or more pages, from
/// [`PagedCachedFile::write`](crate::PagedCachedFile::write) or
/// [`PagedCachedFile::overwrite`](crate::PagedCachedFile::overwrite) (or a
/// [`Writer`](crate::Writer)'s). Derefs to the page bytes; dropping it puts
/// them into the write buffer (newest wins over anything written to those
/// pages before the drop). While it lives its pages are latched (see
/// [`PagedCachedFile::write`](crate::PagedCachedFile::write)).
pub struct WritablePage<'a> {
    buffer: &'a WriteBuffer,
    length: &'a Length,
    counters: &'a Counters,
    life: &'a Lifecycle,
    offset: u64,
    buf: Option<UniqueBuf>,
    /// For a guard over several pages: the pages it is split into when
    /// dropped, taken with the guard so the drop cannot fail.
    pages: Vec<UniqueBuf>,
    /// A writer's scope: the guard's page numbers go there when it is
    /// dropped (buffered).
    scope: Option<&'a mut Vec<u64>>,
}

/// A guard's components, and a writer's scope for its pages.
pub(crate) struct GuardParts<'a> {
    pub(crate) buffer: &'a WriteBuffer,
    pub(crate) length: &'a Length,
    pub(crate) counters: &'a Counters,
    pub(crate) life: &'a Lifecycle,
    pub(crate) scope: Option<&'a mut Vec<u64>>,
}

impl<'a> WritablePage<'a> {
    /// A guard over `buf`'s pages at `offset`, already latched and counted
    /// as a write call; `pages`: the split memory.
    pub(crate) fn new(
        parts: GuardParts<'a>,
        offset: u64,
        buf: UniqueBuf,
        pages: Vec<UniqueBuf>,
    ) -> Self {
        Self {
            buffer: parts.buffer,
            length: parts.length,
            counters: parts.counters,
            life: parts.life,
            offset,
            buf: Some(buf),
            pages,
            scope: parts.scope,
        }
    }

    /// Byte offset of the first page.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Drops the guard without writing its pages.
    pub(crate) fn abandon(mut self) {
        if let Some(buf) = self.buf.take() {
            let first = self.buffer.page_no(self.offset);
            let count = (buf.len() / self.buffer.page_size) as u64;
            self.buffer
                .unlatch(first..first + count, buf, std::mem::take(&mut self.pages));
            self.life.end_kept_write();
        }
    }
}

impl Deref for WritablePage<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => b,
            None => &[],
        }
    }
}

impl DerefMut for WritablePage<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Some(b) => b,
            None => &mut [],
        }
    }
}

impl Drop for WritablePage<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let pages = std::mem::take(&mut self.pages);
            let first = self.buffer.page_no(self.offset);
            let count = (buf.len() / self.buffer.page_size) as u64;
            self.buffer
                .insert_guarded(self.offset, buf, pages, self.length, self.counters);
            if let Some(scope) = self.scope.as_mut() {
                scope.extend(first..first + count);
            }
            self.life.end_kept_write();
        }
    }
}
