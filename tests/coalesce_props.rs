//! Properties of `coalesce`: runs cover exactly the input bytes, are
//! sorted, non-overlapping, contiguous inside, within the caps and maximal.

use pagewriter::coalesce::{Run, RunLimits, coalesce};
use proptest::prelude::*;

/// Distinct page numbers with a page size, shuffled: the drained entries of
/// one flush.
fn entries() -> impl Strategy<Value = (usize, Vec<u64>)> {
    (
        prop::sample::select(vec![512usize, 4096, 16384]),
        prop::collection::btree_set(0u64..400, 0..200),
    )
        .prop_flat_map(|(ps, set)| {
            let v: Vec<u64> = set.into_iter().collect();
            (Just(ps), Just(v).prop_shuffle())
        })
}

fn limits() -> impl Strategy<Value = RunLimits> {
    (1usize..40, 1usize..200_000).prop_map(|(max_pages, max_bytes)| RunLimits {
        max_pages,
        max_bytes,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn runs_are_exact_sorted_contiguous_capped_and_maximal((ps, pages) in entries(), lim in limits()) {
        let bufs: Vec<Vec<u8>> = pages.iter().map(|&p| vec![p as u8; ps]).collect();
        let mut e: Vec<(u64, &[u8])> = pages.iter().zip(&bufs).map(|(&p, b)| (p * ps as u64, &b[..])).collect();
        let mut runs: Vec<Run> = Vec::new();
        coalesce(&mut e, lim, &mut runs).unwrap();

        // Entries sorted, runs tile the entries in order.
        prop_assert!(e.windows(2).all(|w| w[0].0 < w[1].0));
        let mut next = 0;
        let mut covered = 0usize;
        for r in &runs {
            prop_assert_eq!(r.start, next);
            prop_assert!(r.count >= 1);
            next = r.start + r.count;
            // Contiguous inside, length and offset agree with the entries.
            let mut at = r.offset;
            for (off, page) in &e[r.entries()] {
                prop_assert_eq!(*off, at);
                at += page.len() as u64;
            }
            prop_assert_eq!(at - r.offset, r.len as u64);
            covered += r.len;
            // Caps (a single page over the byte cap may stand alone).
            prop_assert!(r.count <= lim.max_pages);
            prop_assert!(r.len <= lim.max_bytes || r.count == 1);
        }
        prop_assert_eq!(next, e.len());
        prop_assert_eq!(covered, pages.len() * ps);
        // Sorted, non-overlapping, maximal.
        for w in runs.windows(2) {
            let (a, b) = (w[0], w[1]);
            prop_assert!(a.offset + a.len as u64 <= b.offset);
            let contiguous = a.offset + a.len as u64 == b.offset;
            let fits = a.count + b.count <= lim.max_pages && a.len + b.len <= lim.max_bytes;
            prop_assert!(!(contiguous && fits), "runs {:?} and {:?} could merge", a, b);
        }
    }

    #[test]
    fn any_overlap_is_reported(offsets in prop::collection::vec(0u64..50_000, 1..60), len in 1usize..5000) {
        let buf = vec![0u8; len];
        let mut e: Vec<(u64, &[u8])> = offsets.iter().map(|&o| (o, &buf[..])).collect();
        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        let overlaps = sorted.windows(2).any(|w| w[1] < w[0] + len as u64);
        let mut runs = Vec::new();
        let r = coalesce(&mut e, RunLimits { max_pages: 1024, max_bytes: 1 << 20 }, &mut runs);
        prop_assert_eq!(r.is_err(), overlaps);
    }
}
