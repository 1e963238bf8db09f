//! One stripe of the read cache: clean pages under a byte budget, evicted
//! by CLOCK (second chance; Corbató 1968, as in most buffer pools).
//!
//! Each cached page has a slot on a ring and a referenced bit, set by every
//! hit. Eviction moves the hand around the ring: a referenced page loses
//! its bit and stays, the first unreferenced one goes. A page hit between
//! two sweeps is therefore never evicted, which is what keeps an engine's
//! hot pages (its header page, rewritten at every commit) cached while a
//! stream of once-written pages passes through.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::pages::{PageHasher, PageRef};

/// A slot of the ring that holds no page.
const EMPTY: u64 = u64::MAX;

struct Entry {
    page: PageRef,
    referenced: bool,
    slot: usize,
}

/// One read-cache stripe (see the module docs).
#[derive(Default)]
pub(crate) struct CacheStripe {
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
