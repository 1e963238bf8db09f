//! Coalescing: drained dirty pages -> sorted runs of contiguous pages.
//!
//! The core of every flush (LMDB's `mdb_page_flush` does the same walk over
//! its sorted dirty list): sort by offset, then extend the current run while
//! the next page starts exactly where the run ends and the run stays within
//! both caps. A run is written with one call (`pwritev`, one io_uring SQE).
//!
//! Pure: no I/O, no locks, no allocation beyond growing `runs`.

use crate::error::{Error, Result};

/// Caps on one run, which is one write call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// Most pages (iovecs) in one run; at most
    /// [`IOV_MAX`](crate::backend::IOV_MAX) for `pwritev`. 0 is taken as 1.
    pub max_pages: usize,
    /// Most bytes in one run. A single page larger than this still forms a
    /// run of its own (pages are never split).
    pub max_bytes: usize,
}

/// A maximal range of contiguous pages written with one call: the entries
/// `start..start + count` of the sorted input, covering `len` bytes from
/// byte `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Byte offset of the first page.
    pub offset: u64,
    /// Bytes in the run (sum of its pages' lengths).
    pub len: usize,
    /// Index of the run's first entry in the sorted input.
    pub start: usize,
    /// Number of entries (pages, iovecs) in the run; at least 1.
    pub count: usize,
}

impl Run {
    /// The run's entries as an index range into the sorted input.
    pub fn entries(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.count
    }
}

/// Sorts `entries` by offset and fills `runs` (cleared first) with the runs
/// that cover them, in offset order.
///
/// Each entry is `(byte offset, page)`, where the page is anything that
/// derefs to bytes (`&[u8]`, `Vec<u8>`, [`PageRef`](crate::PageRef)). Runs are contiguous inside,
/// sorted, non-overlapping, cover exactly the input, and are maximal: two
/// neighbouring runs are either not contiguous or could not be merged
/// without breaking a cap.
///
/// Errors (`runs` then holds the runs found before the bad entry):
/// [`Error::Overlap`] if two entries overlap (a repeated offset included);
/// [`Error::ZeroLength`] for an empty entry; [`Error::Overflow`] if an
/// entry's end overflows `u64`.
pub fn coalesce<P, T>(
    entries: &mut [(u64, P)],
    limits: RunLimits,
    runs: &mut Vec<Run>,
) -> Result<()>
where
    P: std::ops::Deref<Target = T>,
    T: AsRef<[u8]> + ?Sized,
{
    runs.clear();
    // Key is the offset alone: reading the length would dereference every
    // page inside the comparator (a cache miss per comparison).
    entries.sort_unstable_by_key(|(offset, _)| *offset);
    let max_pages = limits.max_pages.max(1);
    let mut current: Option<Run> = None;
    let mut prev_end = 0u64;
    for (i, (offset, page)) in entries.iter().enumerate() {
        let len = (**page).as_ref().len();
        if len == 0 {
            runs.extend(current);
            return Err(Error::ZeroLength);
        }
        let end = offset.checked_add(len as u64).ok_or(Error::Overflow {
            offset: *offset,
            len,
        })?;
        if i > 0 && *offset < prev_end {
            runs.extend(current);
            return Err(Error::Overlap { offset: *offset });
        }
        prev_end = end;
        match &mut current {
            Some(run)
                if run.offset + run.len as u64 == *offset
                    && run.count < max_pages
                    && run.len.saturating_add(len) <= limits.max_bytes =>
            {
                run.len += len;
                run.count += 1;
            }
            _ => {
                runs.extend(current.take());
                current = Some(Run {
                    offset: *offset,
                    len,
                    start: i,
                    count: 1,
                });
            }
        }
    }
    runs.extend(current);
    debug_assert!(runs_are_sound(entries, limits, runs));
    Ok(())
}

/// Splits each run of pages of `page_size` bytes (a power of two) into
/// pieces that an atomic write takes ([`AtomicUnit`](crate::backend::AtomicUnit)):
/// each piece a power-of-two number of pages, at most `max_bytes` long
/// (rounded down to a power of two, at least one page), starting at a file
/// offset that is a multiple of its length. Greedy from the front: at each
/// offset the largest piece that is aligned there and fits what is left
/// (the natural alignment of a buddy allocator), so a run of 2^k aligned
/// pages stays one piece. `runs` is rewritten in place (order and
/// coverage kept); `scratch` is emptied and kept for reuse.
pub fn split_for_atomic(
    runs: &mut Vec<Run>,
    page_size: usize,
    max_bytes: usize,
    scratch: &mut Vec<Run>,
) {
    debug_assert!(page_size.is_power_of_two());
    let cap = if max_bytes <= page_size {
        page_size
    } else {
        1usize << (usize::BITS - 1 - max_bytes.leading_zeros())
    };
    scratch.clear();
    for run in runs.iter() {
        let (mut offset, mut left, mut start) = (run.offset, run.len, run.start);
        while left > 0 {
            // Largest power of two dividing the offset (any, at 0).
            let align = if offset == 0 {
                usize::MAX
            } else {
                1usize
                    .checked_shl(offset.trailing_zeros())
                    .unwrap_or(usize::MAX)
            };
            let fit = 1usize << (usize::BITS - 1 - left.leading_zeros());
            let len = cap.min(align).min(fit).max(page_size);
            let count = len / page_size;
            scratch.push(Run {
                offset,
                len,
                start,
                count,
            });
            offset += len as u64;
            left -= len;
            start += count;
        }
    }
    std::mem::swap(runs, scratch);
    scratch.clear();
}

/// What `coalesce` promises (checked in debug builds): runs in order, each
/// covering the next entries exactly, contiguous inside, within the caps
/// (a single page may exceed `max_bytes`), and together covering the input.
fn runs_are_sound<P, T>(entries: &[(u64, P)], limits: RunLimits, runs: &[Run]) -> bool
where
    P: std::ops::Deref<Target = T>,
    T: AsRef<[u8]> + ?Sized,
{
    let mut next = 0;
    let mut prev_end = 0u64;
    for run in runs {
        if run.start != next || run.count == 0 || run.count > limits.max_pages.max(1) {
            return false;
        }
        if run.count > 1 && run.len > limits.max_bytes {
            return false;
        }
        if next > 0 && run.offset < prev_end {
            return false;
        }
        let mut at = run.offset;
        for (offset, page) in &entries[run.entries()] {
            if *offset != at {
                return false;
            }
            at += (**page).as_ref().len() as u64;
        }
        if at - run.offset != run.len as u64 {
            return false;
        }
        prev_end = at;
        next += run.count;
    }
    next == entries.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_pages: usize, max_bytes: usize) -> RunLimits {
        RunLimits {
            max_pages,
            max_bytes,
        }
    }

    #[test]
    fn contiguous_pages_become_one_run() {
        let page = [1u8; 4096];
        let mut e: Vec<(u64, &[u8])> = vec![(8192, &page), (0, &page), (4096, &page)];
        let mut runs = Vec::new();
        coalesce(&mut e, limits(1024, 1 << 20), &mut runs).unwrap();
        assert_eq!(
            runs,
            vec![Run {
                offset: 0,
                len: 12288,
                start: 0,
                count: 3
            }]
        );
        assert_eq!(e[0].0, 0);
    }

    #[test]
    fn gap_and_caps_split_runs() {
        let page = [1u8; 4096];
        let mut e: Vec<(u64, &[u8])> = [0u64, 1, 2, 3, 5, 6]
            .iter()
            .map(|&p| (p * 4096, &page[..]))
            .collect();
        let mut runs = Vec::new();
        coalesce(&mut e, limits(3, 1 << 20), &mut runs).unwrap();
        let shape: Vec<(u64, usize)> = runs.iter().map(|r| (r.offset, r.count)).collect();
        assert_eq!(shape, vec![(0, 3), (3 * 4096, 1), (5 * 4096, 2)]);
        coalesce(&mut e, limits(1024, 8192), &mut runs).unwrap();
        let shape: Vec<(u64, usize)> = runs.iter().map(|r| (r.offset, r.count)).collect();
        assert_eq!(shape, vec![(0, 2), (2 * 4096, 2), (5 * 4096, 2)]);
    }

    #[test]
    fn overlap_and_overflow_are_errors() {
        let page = [1u8; 4096];
        let mut e: Vec<(u64, &[u8])> = vec![(0, &page), (100, &page)];
        let mut runs = Vec::new();
        assert!(matches!(
            coalesce(&mut e, limits(8, 1 << 20), &mut runs),
            Err(Error::Overlap { offset: 100 })
        ));
        let mut e: Vec<(u64, &[u8])> = vec![(u64::MAX - 10, &page)];
        assert!(matches!(
            coalesce(&mut e, limits(8, 1 << 20), &mut runs),
            Err(Error::Overflow { .. })
        ));
    }

    #[test]
    fn atomic_pieces_are_aligned_powers_of_two() {
        let ps = 4096usize;
        // Pages 3..=13 (11 pages) and 16..=47 (32 pages).
        let mut runs = vec![
            Run {
                offset: 3 * 4096,
                len: 11 * ps,
                start: 0,
                count: 11,
            },
            Run {
                offset: 16 * 4096,
                len: 32 * ps,
                start: 11,
                count: 32,
            },
        ];
        let mut scratch = Vec::new();
        split_for_atomic(&mut runs, ps, 64 * 1024, &mut scratch);
        let shape: Vec<(u64, usize)> = runs.iter().map(|r| (r.offset / 4096, r.count)).collect();
        // 3 | 4..8 | 8..12 | 12..14 | 16..32 | 32..48
        assert_eq!(
            shape,
            vec![(3, 1), (4, 4), (8, 4), (12, 2), (16, 16), (32, 16)]
        );
        let mut next = 0;
        for r in &runs {
            assert_eq!(r.start, next);
            assert!(r.len.is_power_of_two() && r.offset % r.len as u64 == 0);
            assert_eq!(r.len, r.count * ps);
            next += r.count;
        }
        assert_eq!(next, 43);
        // A cap below a page still writes whole pages.
        split_for_atomic(&mut runs, ps, 100, &mut scratch);
        assert!(runs.iter().all(|r| r.count == 1));
        assert_eq!(runs.len(), 43);
    }

    #[test]
    fn oversized_page_is_its_own_run() {
        let big = vec![0u8; 10_000];
        let mut e: Vec<(u64, &[u8])> = vec![(0, &big), (10_000, &big)];
        let mut runs = Vec::new();
        coalesce(&mut e, limits(8, 4096), &mut runs).unwrap();
        assert_eq!(runs.len(), 2);
    }
}
