//! `coalesce` on arbitrary entries: on success the runs tile the sorted
//! entries, are contiguous, within the caps and maximal; an error comes
//! exactly when two entries overlap or one is empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pagewriter::coalesce::{RunLimits, coalesce};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let limits = RunLimits {
        max_pages: usize::from(data[0] % 40) + 1,
        max_bytes: usize::from(u16::from_le_bytes([data[1], data[2]])) * 16 + 1,
    };
    let buf = vec![0u8; 255 * 512];
    // Each entry: 2 bytes of offset (in 512-byte units), 1 byte of length.
    let mut entries: Vec<(u64, &[u8])> = data[3..]
        .chunks_exact(3)
        .map(|c| {
            let off = u64::from(u16::from_le_bytes([c[0], c[1]])) * 512;
            (off, &buf[..usize::from(c[2]) * 512])
        })
        .collect();
    let mut sorted: Vec<(u64, usize)> = entries.iter().map(|(o, p)| (*o, p.len())).collect();
    sorted.sort_unstable();
    let bad = sorted.iter().any(|(_, l)| *l == 0) || sorted.windows(2).any(|w| w[1].0 < w[0].0 + w[0].1 as u64);
    let mut runs = Vec::new();
    match coalesce(&mut entries, limits, &mut runs) {
        Err(_) => assert!(bad, "error without an overlap or empty entry"),
        Ok(()) => {
            assert!(!bad, "overlap or empty entry accepted");
            let mut next = 0;
            for r in &runs {
                assert_eq!(r.start, next);
                next = r.start + r.count;
                let mut at = r.offset;
                for (off, p) in &entries[r.entries()] {
                    assert_eq!(*off, at);
                    at += p.len() as u64;
                }
                assert_eq!((at - r.offset) as usize, r.len);
                assert!(r.count <= limits.max_pages);
                assert!(r.len <= limits.max_bytes || r.count == 1);
            }
            assert_eq!(next, entries.len());
            for w in runs.windows(2) {
                let contiguous = w[0].offset + w[0].len as u64 == w[1].offset;
                let fits = w[0].count + w[1].count <= limits.max_pages && w[0].len + w[1].len <= limits.max_bytes;
                assert!(!(contiguous && fits), "mergeable runs {:?} {:?}", w[0], w[1]);
            }
        }
    }
});
