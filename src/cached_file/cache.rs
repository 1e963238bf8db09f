//! The read cache: clean pages under a byte budget, striped as the write
//! buffer is, each stripe evicted by CLOCK (second chance; Corbató 1968,
//! as in most buffer pools).
//!
//! Each cached page has a slot on a ring and a referenced bit, set by every
//! hit. Eviction moves the hand around the ring: a referenced page loses
//! its bit and stays, the first unreferenced one goes. A page hit between
//! two sweeps is therefore never evicted, which is what keeps an engine's
//! hot pages (its header page, rewritten at every commit) cached while a
//! stream of once-written pages passes through.
//!
//! Owns: the cache stripes, each its own lock, and their budget. Calls:
//! nothing (evicted pages go to the pool the caller names). Lock order: a
//! cache stripe is taken last, after a write-buffer stripe if any; no I/O
//! under it. Invariant: every change a flush makes to a stripe bumps its
//! `seq`; a reader that read the disk offers its copy with the `seq` it
//! saw before the read, and the copy is kept only if `seq` did not move
//! (a slow reader never caches bytes older than a completed write).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::pages::{PageHasher, PageRef};
use crate::buffer::BufferPool;
use crate::sync::Mutex;

/// The read cache of one file (see the module docs); empty (every call a
/// miss, nothing kept) when `Config::read_cache_bytes` is 0.
pub(crate) struct ReadCache {
    stripes: Box<[Mutex<CacheStripe>]>,
    /// Page `n` is in stripe `n & mask`.
    mask: u64,
    /// Bytes per stripe.
    budget: usize,
}

impl ReadCache {
    /// A cache of `bytes` in `stripes` stripes (a power of two), none if
    /// `bytes` is 0.
    pub(crate) fn new(stripes: usize, bytes: usize) -> Self {
        let n = if bytes > 0 { stripes } else { 0 };
        Self {
            stripes: (0..n).map(|_| Mutex::new(CacheStripe::default())).collect(),
            mask: stripes as u64 - 1,
            budget: bytes / stripes,
        }
    }

    /// Whether pages are kept at all.
    #[inline]
    pub(crate) fn is_enabled(&self) -> bool {
        !self.stripes.is_empty()
    }

    fn stripe(&self, page_no: u64) -> Option<&Mutex<CacheStripe>> {
        self.stripes.get((page_no & self.mask) as usize)
    }

    /// The cached page `page_no` (marked referenced), or on a miss the
    /// stripe's `seq` to [`offer`](Self::offer) a copy read from disk
    /// with (`None` with the cache off).
    pub(crate) fn lookup(&self, page_no: u64) -> Result<PageRef, Option<u64>> {
        let Some(c) = self.stripe(page_no) else {
            return Err(None);
        };
        let mut c = c.lock();
        match c.get(page_no) {
            Some(page) => Ok(page.clone()),
            None => Err(Some(c.seq)),
        }
    }

    /// The cached page `page_no`, marked referenced.
    pub(crate) fn get(&self, page_no: u64) -> Option<PageRef> {
        self.stripe(page_no)?.lock().get(page_no).cloned()
    }

    /// Copies bytes `within..` of the cached page `page_no` into `dst`
    /// (under the stripe's lock, no reference taken); `false` on a miss.
    pub(crate) fn copy_into(&self, page_no: u64, within: usize, dst: &mut [u8]) -> bool {
        let Some(c) = self.stripe(page_no) else {
            return false;
        };
        match c.lock().get(page_no) {
            Some(page) => {
                dst.copy_from_slice(&page[within..within + dst.len()]);
                true
            }
            None => false,
        }
    }

    /// The `seq` of page `page_no`'s stripe, to [`offer`](Self::offer) a
    /// copy read from disk with; `None` with the cache off.
    pub(crate) fn seq(&self, page_no: u64) -> Option<u64> {
        self.stripe(page_no).map(|c| c.lock().seq)
    }

    /// Caches `page`, read from disk after the stripe showed `seq`, unless
    /// a flush changed the stripe since (then the copy may be older than a
    /// completed write, and is dropped). Evicted pages go to `pool`.
    pub(crate) fn offer(&self, page_no: u64, seq: u64, page: PageRef, pool: &BufferPool) {
        if let Some(c) = self.stripe(page_no) {
            let mut c = c.lock();
            if c.seq == seq {
                self.insert(&mut c, page_no, page, pool);
            }
        }
    }

    /// Caches `page`, just written, as the newest version of `page_no`
    /// (a flush's retire): the stripe's `seq` moves, so a read of the
    /// older bytes racing with it is not cached.
    pub(crate) fn update(&self, page_no: u64, page: PageRef, pool: &BufferPool) {
        if let Some(c) = self.stripe(page_no) {
            let mut c = c.lock();
            c.seq += 1;
            self.insert(&mut c, page_no, page, pool);
        }
    }

    /// Drops the cached pages whose number `gone` selects (a discard, a
    /// cut, a refresh); their memory goes to `pool`.
    pub(crate) fn remove_where(&self, gone: impl Fn(u64) -> bool, pool: &BufferPool) {
        for c in self.stripes.iter() {
            let mut c = c.lock();
            c.seq += 1;
            c.remove_where(&gone, &mut |old| pool.put_all([old]));
        }
    }

    /// Drops the cached copy of page `page_no`, if any, and moves its
    /// stripe's `seq` (a write that bypasses the write buffer: a read of
    /// the older bytes racing with it is not cached). Its memory goes to
    /// `pool`.
    pub(crate) fn forget(&self, page_no: u64, pool: &BufferPool) {
        if let Some(c) = self.stripe(page_no) {
            let mut c = c.lock();
            c.seq += 1;
            if let Some(old) = c.remove(page_no) {
                pool.put_all([old]);
            }
        }
    }

    /// Inserts a clean page into stripe `c` (CLOCK eviction within the
    /// stripe's budget); evicted pages go back to `pool` (their memory is
    /// reused if nothing else holds them: a steady write load with the
    /// read cache on does not allocate a page per write).
    fn insert(&self, c: &mut CacheStripe, page_no: u64, page: PageRef, pool: &BufferPool) {
        c.insert(page_no, page, self.budget, &mut |old| pool.put_all([old]));
    }
}

/// A slot of the ring that holds no page.
const EMPTY: u64 = u64::MAX;

struct Entry {
    page: PageRef,
    referenced: bool,
    slot: usize,
}

/// One read-cache stripe (see the module docs).
#[derive(Default)]
struct CacheStripe {
    pages: HashMap<u64, Entry, BuildHasherDefault<PageHasher>>,
    /// Page numbers in clock order; `EMPTY` where a page was removed.
    ring: Vec<u64>,
    free_slots: Vec<usize>,
    hand: usize,
    /// Bytes of the cached pages.
    pub(crate) bytes: usize,
    /// Bumped whenever a flush updates this stripe; a reader that read the
    /// backend inserts its page only if `seq` has not moved meanwhile, so a
    /// slow reader never caches bytes older than a completed write.
    pub(crate) seq: u64,
}

impl CacheStripe {
    /// The cached page `page_no`, marked referenced.
    pub(crate) fn get(&mut self, page_no: u64) -> Option<&PageRef> {
        let e = self.pages.get_mut(&page_no)?;
        e.referenced = true;
        Some(&e.page)
    }

    /// Caches `page` as `page_no` (replacing an older copy), then evicts
    /// until the stripe holds at most `budget` bytes; `page_no` itself is
    /// never the victim. A page larger than the budget is not cached (and
    /// an older copy is dropped). Every page that leaves goes to `dropped`.
    pub(crate) fn insert(
        &mut self,
        page_no: u64,
        page: PageRef,
        budget: usize,
        dropped: &mut dyn FnMut(PageRef),
    ) {
        let bytes = page.len();
        if bytes > budget {
            if let Some(old) = self.remove(page_no) {
                dropped(old);
            }
            return;
        }
        match self.pages.get_mut(&page_no) {
            Some(e) => {
                let old = std::mem::replace(&mut e.page, page);
                e.referenced = true;
                self.bytes = self.bytes - old.len() + bytes;
                dropped(old);
            }
            None => {
                let slot = match self.free_slots.pop() {
                    Some(s) => {
                        self.ring[s] = page_no;
                        s
                    }
                    None => {
                        self.ring.push(page_no);
                        self.ring.len() - 1
                    }
                };
                // New pages start unreferenced: a page read once goes first.
                self.pages.insert(
                    page_no,
                    Entry {
                        page,
                        referenced: false,
                        slot,
                    },
                );
                self.bytes += bytes;
            }
        }
        while self.bytes > budget {
            match self.victim(page_no) {
                Some(v) => {
                    if let Some(old) = self.remove(v) {
                        dropped(old);
                    }
                }
                None => break,
            }
        }
        debug_assert!(self.bytes <= budget || self.pages.len() == 1);
    }

    /// Removes `page_no`; returns its page.
    pub(crate) fn remove(&mut self, page_no: u64) -> Option<PageRef> {
        let e = self.pages.remove(&page_no)?;
        self.ring[e.slot] = EMPTY;
        self.free_slots.push(e.slot);
        self.bytes -= e.page.len();
        Some(e.page)
    }

    /// Removes every page `gone` selects; each goes to `dropped`.
    pub(crate) fn remove_where(
        &mut self,
        gone: impl Fn(u64) -> bool,
        dropped: &mut dyn FnMut(PageRef),
    ) {
        let hit: Vec<u64> = self.pages.keys().copied().filter(|&p| gone(p)).collect();
        for p in hit {
            if let Some(old) = self.remove(p) {
                dropped(old);
            }
        }
    }

    /// The next unreferenced page under the hand other than `keep`,
    /// clearing referenced bits on the way; at most two sweeps.
    fn victim(&mut self, keep: u64) -> Option<u64> {
        let n = self.ring.len();
        for _ in 0..2 * n {
            let p = self.ring[self.hand];
            self.hand = (self.hand + 1) % n;
            if p == EMPTY || p == keep {
                continue;
            }
            let e = self.pages.get_mut(&p).expect("ring and map agree");
            if e.referenced {
                e.referenced = false;
            } else {
                return Some(p);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::AlignedBuf;
    use std::sync::Arc;

    fn page() -> PageRef {
        Arc::new(AlignedBuf::zeroed(4096, 4096).unwrap())
    }

    #[test]
    fn a_page_hit_between_sweeps_survives_a_stream_of_new_pages() {
        let mut c = CacheStripe::default();
        let budget = 4 * 4096;
        let mut dropped = 0;
        c.insert(0, page(), budget, &mut |_| dropped += 1);
        for p in 1..1000u64 {
            assert!(c.get(0).is_some(), "hot page evicted before page {p}");
            c.insert(p, page(), budget, &mut |_| dropped += 1);
            assert!(c.bytes <= budget);
        }
        assert_eq!(dropped, 1000 - 4);
        assert_eq!(c.pages.len(), 4);
    }

    #[test]
    fn removal_frees_slots_and_bytes() {
        let mut c = CacheStripe::default();
        for p in 0..8u64 {
            c.insert(p, page(), 1 << 20, &mut |_| {});
        }
        c.remove_where(|p| p % 2 == 0, &mut |_| {});
        assert_eq!((c.pages.len(), c.bytes), (4, 4 * 4096));
        for p in 100..104u64 {
            c.insert(p, page(), 1 << 20, &mut |_| {});
        }
        assert_eq!(c.ring.len(), 8, "freed slots are reused");
        assert!(c.get(2).is_none() && c.get(3).is_some());
        // Too big for the budget: not cached, older copy dropped.
        c.insert(3, page(), 100, &mut |_| {});
        assert!(c.get(3).is_none());
    }
}
