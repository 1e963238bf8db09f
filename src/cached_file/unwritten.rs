//! The file's unwritten space: the pages that held no data on disk when
//! the file was opened (holes, and unwritten extents where the file
//! system reports them as holes: `StorageBackend::unwritten_ranges`) and
//! that no allocating scoped commit has written since. A scoped commit
//! whose pages lie there allocates blocks or converts extents, which its
//! `fdatasync` commits in the file system's journal, as a growing file's
//! does; such a commit is made as `sync` makes its commits (grouped).
//!
//! `set_len` growing the file with `ftruncate` adds the pages it adds
//! (a hole) to the ranges ([`Unwritten::add`]).
//!
//! Owns: the page ranges (sorted, disjoint) under a leaf lock, and a flag
//! that is cleared once none is left, after which a commit takes no lock.
//! Calls: nothing.
//!
//! A hint, never a promise: a page wrongly taken for unwritten costs one
//! grouped commit (which promises a superset of the scope), a page
//! wrongly taken for written one scoped commit that allocates; what is
//! durable is the same either way. Pages that other paths (`sync`,
//! `flush`, tickets) write stay in the ranges until a scoped commit of
//! theirs goes the grouped way once. At most [`MAX_RANGES`] ranges are
//! kept; past that (a file with more holes at open, or scattered writes
//! splitting them) the set is dropped and every page counts as written.

use std::ops::Range;
use std::sync::atomic::Ordering;

use crate::sync::{AtomicBool, Mutex};

/// Most ranges kept (at open and as writes split them): 64 KiB of ranges.
pub(crate) const MAX_RANGES: usize = 4096;

/// The unwritten pages of one file (see the module docs).
pub(crate) struct Unwritten {
    /// Whether `ranges` may hold a page (read without the lock).
    any: AtomicBool,
    /// Page-number ranges, sorted and disjoint.
    ranges: Mutex<Vec<Range<u64>>>,
}

impl Unwritten {
    /// The pages touched by the byte ranges `bytes` (sorted, as
    /// `unwritten_ranges` returns them), in pages of `page_size` bytes (a
    /// power of two); none past [`MAX_RANGES`].
    pub(crate) fn new(bytes: &[Range<u64>], page_size: usize) -> Self {
        let ps = page_size as u64;
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for r in bytes.iter().filter(|r| r.start < r.end) {
            let (first, end) = (r.start / ps, r.end.div_ceil(ps));
            match ranges.last_mut() {
                Some(last) if first <= last.end => last.end = last.end.max(end),
                _ => ranges.push(first..end),
            }
        }
        if ranges.len() > MAX_RANGES {
            ranges.clear();
        }
        Self {
            any: AtomicBool::new(!ranges.is_empty()),
            ranges: Mutex::new(ranges),
        }
    }

    /// Whether a page of `pages` (page numbers, any order) is unwritten.
    pub(crate) fn touches(&self, pages: &[u64]) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let ranges = self.ranges.lock();
        pages.iter().any(|&p| find(&ranges, p).is_some())
    }

    /// The whole pages of the byte range `bytes` (a hole the file just
    /// gained, as `set_len` growing it with `ftruncate` makes) are
    /// unwritten: merged into the ranges. A page the range covers only in
    /// part is left out (its head may share an allocated block with the
    /// old end). Past [`MAX_RANGES`] the set is dropped, as at open.
    pub(crate) fn add(&self, bytes: Range<u64>, page_size: usize) {
        let ps = page_size as u64;
        let (first, end) = (bytes.start.div_ceil(ps), bytes.end / ps);
        if first >= end {
            return;
        }
        let mut ranges = self.ranges.lock();
        // Every range touching or overlapping first..end merges with it.
        let lo = ranges.partition_point(|r| r.end < first);
        let hi = ranges.partition_point(|r| r.start <= end);
        let merged = ranges[lo..hi]
            .iter()
            .fold(first..end, |m, r| m.start.min(r.start)..m.end.max(r.end));
        ranges.splice(lo..hi, [merged]);
        if ranges.len() > MAX_RANGES {
            ranges.clear();
        }
        self.any.store(!ranges.is_empty(), Ordering::Release);
    }

    /// Whether a page of `pages` is unwritten.
    pub(crate) fn touches_range(&self, pages: Range<u64>) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let ranges = self.ranges.lock();
        let i = ranges.partition_point(|r| r.end <= pages.start);
        ranges.get(i).is_some_and(|r| r.start < pages.end)
    }

    /// `pages` were written and made durable: no longer unwritten.
    pub(crate) fn written(&self, pages: &[u64]) {
        self.written_each(pages.iter().copied());
    }

    /// The pages of `pages` were written (their commit's `fdatasync`
    /// makes the allocation durable): no longer unwritten.
    pub(crate) fn written_range(&self, pages: Range<u64>) {
        self.written_each(pages);
    }

    fn written_each(&self, pages: impl Iterator<Item = u64>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut ranges = self.ranges.lock();
        for p in pages {
            let Some(i) = find(&ranges, p) else { continue };
            let r = ranges[i].clone();
            match (r.start < p, p + 1 < r.end) {
                (false, false) => {
                    ranges.remove(i);
                }
                (false, true) => ranges[i].start = p + 1,
                (true, false) => ranges[i].end = p,
                (true, true) => {
                    ranges[i].end = p;
                    ranges.insert(i + 1, p + 1..r.end);
                }
            }
        }
        if ranges.len() > MAX_RANGES {
            ranges.clear();
        }
        if ranges.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }
}

/// The index of the range holding page `p`.
fn find(ranges: &[Range<u64>], p: u64) -> Option<usize> {
    let i = ranges.partition_point(|r| r.end <= p);
    ranges.get(i).filter(|r| r.start <= p).map(|_| i)
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    const PS: usize = 4096;

    fn held(u: &Unwritten) -> Vec<Range<u64>> {
        u.ranges.lock().clone()
    }

    #[test]
    fn byte_ranges_become_the_pages_they_touch() {
        let u = Unwritten::new(&[100..4096, 8192..12288, 12288..16385], PS);
        // 100..4096 touches page 0; 8192..16385 pages 2 to 4, merged.
        assert_eq!(held(&u), vec![0..1, 2..5]);
        assert!(u.touches(&[7, 0]));
        assert!(!u.touches(&[1, 5, 9]));
        let none = Unwritten::new(&[], PS);
        assert!(!none.touches(&[0]));
    }

    #[test]
    fn written_pages_leave_the_ranges_splitting_them() {
        let all = 0..10 * PS as u64;
        let u = Unwritten::new(std::slice::from_ref(&all), PS);
        u.written(&[4, 0, 9, 42]);
        assert_eq!(held(&u), vec![1..4, 5..9]);
        assert!(!u.touches(&[0, 4, 9]));
        assert!(u.touches(&[5]));
        u.written(&[1, 2, 3, 5, 6, 7, 8]);
        assert!(held(&u).is_empty());
        assert!(!u.any.load(Ordering::Acquire), "no lock once none is left");
    }

    #[test]
    fn a_hole_adds_its_whole_pages_merging_neighbours() {
        let u = Unwritten::new(&[], PS);
        let p = PS as u64;
        // 100 bytes into page 1 up to 100 bytes into page 4: pages 2, 3.
        u.add(p + 100..4 * p + 100, PS);
        assert_eq!(held(&u), vec![2..4]);
        assert!(u.any.load(Ordering::Acquire));
        // Less than a page: nothing.
        u.add(7 * p + 1..8 * p, PS);
        assert_eq!(held(&u), vec![2..4]);
        // Apart, then one touching both ends: all merged.
        u.add(6 * p..8 * p, PS);
        assert_eq!(held(&u), vec![2..4, 6..8]);
        u.add(4 * p..6 * p, PS);
        assert_eq!(held(&u), vec![2..8]);
        // Inside and overlapping: unchanged, then widened.
        u.add(3 * p..5 * p, PS);
        u.add(0..3 * p, PS);
        assert_eq!(held(&u), vec![0..8]);
        u.written(&[0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(!u.touches(&[3]));
        u.add(10 * p..11 * p, PS);
        assert!(u.touches(&[10]), "the flag is set again");
    }

    #[test]
    fn too_many_ranges_are_dropped() {
        let gaps: Vec<_> = (0..=MAX_RANGES as u64)
            .map(|i| 2 * i * PS as u64..(2 * i + 1) * PS as u64)
            .collect();
        assert!(!Unwritten::new(&gaps, PS).touches(&[0]));
        let all = 0..2 * MAX_RANGES as u64 * PS as u64 + PS as u64;
        let u = Unwritten::new(std::slice::from_ref(&all), PS);
        let every_other: Vec<u64> = (0..=MAX_RANGES as u64).map(|i| 2 * i + 1).collect();
        u.written(&every_other);
        assert!(!u.touches(&[0]), "split past the cap: dropped");
    }
}
