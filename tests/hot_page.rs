//! The write latch's worst case: eight threads commit, and every commit
//! rewrites the same hot page (plus a page of the thread's own), with one
//! and with four rounds in flight, and with direct commits (each caller
//! writing its own drain beside the others'), on a real file (`O_DIRECT`
//! where the file system takes it), for every engine that runs on a file. After each `sync` returns Ok,
//! the file holds the hot page at the version that caller wrote or a newer
//! one, and the caller's own page; at the end the hot page holds the last
//! version written. Prints commits/s per engine (figures, not a speed test).
//!
//! `PAGEWRITER_HOT_SECS` sets the seconds per engine (default 1).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{file_engines, page, tag_of};
use pagewriter::{CommitStrategy, Config, DirectIo, PagedCachedFile};

const PS: usize = 4096;
const THREADS: u64 = 8;

fn seconds() -> f64 {
    std::env::var("PAGEWRITER_HOT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

/// The hot page's version on disk (read through a separate descriptor,
/// buffered: after an `O_DIRECT` write the page cache holds nothing stale).
fn on_disk(file: &std::fs::File, page_no: u64) -> (u64, u64) {
    let mut buf = vec![0u8; PS];
    common::read_at(file, &mut buf, page_no * PS as u64);
    tag_of(&buf)
}

#[test]
fn every_commit_rewrites_one_hot_page() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ways = [
        (CommitStrategy::Group, 1),
        (CommitStrategy::Group, 4),
        (CommitStrategy::Direct, 1),
    ];
    for (engine, (strategy, rounds)) in file_engines()
        .into_iter()
        .flat_map(|e| ways.map(|w| (e, w)))
    {
        let path = dir.path().join(format!(
            "hot-{}-{}-{rounds}",
            engine.name(),
            strategy.name()
        ));
        let config = Config::default()
            .engine(engine)
            .direct(DirectIo::Auto)
            .commit_strategy(strategy)
            .rounds_in_flight(rounds);
        let f = Arc::new(PagedCachedFile::open(&path, config).unwrap());
        let reader = std::fs::File::open(&path).unwrap();
        // Hot-page versions in write order: a thread takes the next one and
        // writes it under this lock, so the last one taken is the newest.
        let last = Arc::new(Mutex::new(0u64));
        let commits = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs_f64(seconds());
        let started = Instant::now();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (f, last, commits, reader) = (&f, &last, &commits, &reader);
                s.spawn(move || {
                    // At least one commit each, however late the thread
                    // starts on a loaded machine.
                    let mut i = 0u64;
                    while i == 0 || Instant::now() < deadline {
                        i += 1;
                        let v = {
                            let mut v = last.lock().unwrap();
                            *v += 1;
                            f.write_page(0, &page(PS, 0, *v)).unwrap();
                            *v
                        };
                        let own = 1 + t;
                        f.write_page(own * PS as u64, &page(PS, own, i)).unwrap();
                        f.sync().unwrap();
                        commits.fetch_add(1, Ordering::Relaxed);
                        let (p, hot) = on_disk(reader, 0);
                        assert!(
                            p == 0 && hot >= v,
                            "{engine:?}: hot page at version {hot} after a sync of {v}"
                        );
                        assert_eq!(on_disk(reader, own), (own, i), "{engine:?}: own page");
                    }
                });
            }
        });
        let secs = started.elapsed().as_secs_f64();
        let n = commits.load(Ordering::Relaxed);
        let stats = f.stats();
        f.close().unwrap();
        assert_eq!(
            on_disk(&reader, 0),
            (0, *last.lock().unwrap()),
            "{engine:?}: newest wins"
        );
        assert!(n >= THREADS, "{engine:?}: {n} commits");
        eprintln!(
            "hot page, {} ({}), 8 threads, {} commits, rounds_in_flight {rounds}: \
             {:.0} commits/s, {:.2} commits per round, {:.2} rounds in flight",
            engine.name(),
            if f.io_mode().direct.is_some() {
                "O_DIRECT"
            } else {
                "buffered"
            },
            strategy.name(),
            n as f64 / secs,
            stats.avg_commit_group(),
            stats.mean_rounds_in_flight(),
        );
    }
}
