//! Eight threads race writes, rewrites of the same pages, reads, flushes
//! and syncs on one file, every engine, buffered and O_DIRECT, with and
//! without `commit_dsync`, and the vectored engine with writer threads. Each page
//! carries (page, version); writes to one page are ordered by a per-page
//! lock in the test, so the newest version is known. Checked: a reader
//! never sees a version older than one already written or already seen,
//! and after the final sync the reopened file holds every page's newest
//! version.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::{direct_available, file_engines, page, tag_of};
use pagewriter::testing::Rng as WyRand;
use pagewriter::{Config, DirectIo, PagedCachedFile};
use parking_lot::Mutex;

const PS: usize = 4096;
const PAGES: u64 = 256;
const THREADS: u64 = 8;
const OPS: u64 = 600;

#[test]
fn eight_threads_race_and_the_newest_version_wins() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut modes = vec![DirectIo::Off];
    if direct_available(dir.path()) {
        modes.push(DirectIo::On);
    }
    for direct in modes {
        for engine in file_engines() {
            let path = dir
                .path()
                .join(format!("stress-{}-{direct:?}", engine.name()));
            let cfg = Config::default()
                .engine(engine)
                .direct(direct)
                .max_write_buffer_bytes(48 * PS)
                .read_cache_bytes(32 * PS)
                .stripes(8);
            let f = PagedCachedFile::open(&path, cfg.clone()).unwrap();
            // Version 0 of every page, so every page is readable.
            for p in 0..PAGES {
                f.write_page(p * PS as u64, &page(PS, p, 0)).unwrap();
            }
            let versions: Vec<Mutex<u64>> = (0..PAGES).map(|_| Mutex::new(0)).collect();
            let published: Vec<AtomicU64> = (0..PAGES).map(|_| AtomicU64::new(0)).collect();
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (f, versions, published) = (&f, &versions, &published);
                        s.spawn(move || {
                            let mut rng = WyRand::new(t + 1);
                            let mut seen = vec![0u64; PAGES as usize];
                            for _ in 0..OPS {
                                // Hot pages are rewritten by every thread.
                                let p = if rng.below(4) == 0 {
                                    rng.below(8)
                                } else {
                                    rng.below(PAGES)
                                };
                                match rng.below(20) {
                                    0..=8 => {
                                        let mut v = versions[p as usize].lock();
                                        *v += 1;
                                        f.write_page(p * PS as u64, &page(PS, p, *v)).unwrap();
                                        published[p as usize].store(*v, Ordering::SeqCst);
                                    }
                                    9..=16 => {
                                        let floor = published[p as usize].load(Ordering::SeqCst);
                                        let (tp, v) = tag_of(&f.read(p * PS as u64, PS).unwrap());
                                        assert_eq!(tp, p);
                                        assert!(
                                            v >= floor,
                                            "page {p}: read v{v} after v{floor} was written"
                                        );
                                        assert!(
                                            v >= seen[p as usize],
                                            "page {p}: went back to v{v}"
                                        );
                                        seen[p as usize] = v;
                                    }
                                    17 => f.flush().unwrap(),
                                    _ => f.sync().unwrap(),
                                }
                            }
                        })
                    })
                    .collect();
                let failed = handles
                    .into_iter()
                    .map(|h| h.join())
                    .filter(Result::is_err)
                    .count();
                assert_eq!(failed, 0, "{engine:?} {direct:?}: {failed} threads failed");
            });
            f.close().unwrap();
            let s = f.stats();
            assert!(s.commits > 0 && s.flushes > 0, "{s:?}");
            eprintln!(
                "{engine:?} {direct:?}: {} commits, {} fdatasyncs",
                s.commits, s.syncs
            );
            drop(f);
            let f = PagedCachedFile::open(&path, cfg).unwrap();
            for p in 0..PAGES {
                let want = *versions[p as usize].lock();
                assert_eq!(
                    tag_of(&f.read(p * PS as u64, PS).unwrap()),
                    (p, want),
                    "{engine:?} {direct:?}"
                );
            }
        }
    }
}
