//! The write latch's worst case: eight threads commit, and every commit
//! rewrites the same hot page (plus a page of the thread's own), with
//! `sync()` at one and at four rounds in flight and with direct commits
//! (each caller writing its own drain beside the others'), with scoped
//! commits (each thread's own `Writer`) and with asynchronous ones (two
//! tickets in flight per thread), on a real file (`O_DIRECT` where the
//! file system takes it), for every engine that runs on a file. After
//! each commit says Ok, the file holds the hot page at the version that
//! commit wrote or a newer one, and the caller's own page likewise; at the
//! end the hot page holds the last version written. Prints commits/s per
//! engine (figures, not a speed test).
//!
//! `PAGEWRITER_HOT_SECS` sets the seconds per engine (default 1).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{file_engines, page, tag_of};
use pagewriter::{Config, DirectIo, PagedCachedFile};

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

/// How each thread commits.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// `sync()`.
    Sync,
    /// Each thread's own `Writer::commit`.
    Scoped,
    /// Each thread's own `Writer::commit_async`, two tickets in flight.
    Async,
    /// Each thread's own `Writer::write_and_commit` from page-aligned
    /// buffers, the hot page and its own page in turn.
    Through,
    /// Each thread's own `Writer::write_page` of the hot page and its own
    /// page from page-aligned buffers, then `Writer::commit`.
    LargeWrite,
}

impl Way {
    fn name(self) -> String {
        match self {
            Way::Sync => "sync".into(),
            Way::Scoped => "scoped".into(),
            Way::Async => "async:2".into(),
            Way::Through => "through".into(),
            Way::LargeWrite => "large writes".into(),
        }
    }
}

#[test]
fn every_commit_rewrites_one_hot_page() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ways = [
        Way::Sync,
        Way::Scoped,
        Way::Async,
        Way::Through,
        Way::LargeWrite,
    ];
    for (engine, way) in file_engines()
        .into_iter()
        .flat_map(|e| ways.map(|w| (e, w)))
    {
        let path = dir
            .path()
            .join(format!("hot-{}-{}", engine.name(), way.name()));
        let config = Config::default().engine(engine).direct(DirectIo::Auto);
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
                    let own = 1 + t;
                    // After a commit of hot version `v` and own version
                    // `i` says Ok: both on disk at those versions or newer.
                    let check = |v: u64, i: u64| {
                        let (p, hot) = on_disk(reader, 0);
                        assert!(
                            p == 0 && hot >= v,
                            "{engine:?}, {}: hot page at version {hot} after a commit of {v}",
                            way.name()
                        );
                        let (p, mine) = on_disk(reader, own);
                        assert!(
                            p == own && mine >= i,
                            "{engine:?}, {}: own page at {mine} after a commit of {i}",
                            way.name()
                        );
                    };
                    let mut w = f.writer();
                    let mut pending = std::collections::VecDeque::new();
                    // At least one commit each, however late the thread
                    // starts on a loaded machine.
                    let mut i = 0u64;
                    let aligned = |bytes: &[u8]| {
                        let mut b = pagewriter::buffer::AlignedBuf::zeroed(PS, 4096).unwrap();
                        b.copy_from_slice(bytes);
                        b
                    };
                    while i == 0 || Instant::now() < deadline {
                        i += 1;
                        if let Way::Through = way {
                            // The hot page under the version lock, so the
                            // order of its writes is the order of versions.
                            let v = {
                                let mut v = last.lock().unwrap();
                                *v += 1;
                                w.write_and_commit(0, &aligned(&page(PS, 0, *v))).unwrap();
                                *v
                            };
                            let mine = aligned(&page(PS, own, i));
                            w.write_and_commit(own * PS as u64, &mine).unwrap();
                            commits.fetch_add(1, Ordering::Relaxed);
                            check(v, i);
                            continue;
                        }
                        let large = matches!(way, Way::LargeWrite);
                        let v = {
                            let mut v = last.lock().unwrap();
                            *v += 1;
                            let hot = page(PS, 0, *v);
                            if large {
                                w.write_page(0, &aligned(&hot)).unwrap();
                            } else {
                                w.write_page(0, &hot).unwrap();
                            }
                            *v
                        };
                        let mine = page(PS, own, i);
                        if large {
                            w.write_page(own * PS as u64, &aligned(&mine)).unwrap();
                        } else {
                            w.write_page(own * PS as u64, &mine).unwrap();
                        }
                        match way {
                            Way::Sync => f.sync().unwrap(),
                            Way::Scoped | Way::LargeWrite => w.commit().unwrap(),
                            Way::Through => unreachable!("committed above"),
                            Way::Async => {
                                pending.push_back((w.commit_async().unwrap(), v, i));
                                if pending.len() < 2 {
                                    continue;
                                }
                                let (ticket, v, i) = pending.pop_front().unwrap();
                                ticket.wait().unwrap();
                                commits.fetch_add(1, Ordering::Relaxed);
                                check(v, i);
                                continue;
                            }
                        }
                        commits.fetch_add(1, Ordering::Relaxed);
                        check(v, i);
                    }
                    for (ticket, v, i) in pending {
                        ticket.wait().unwrap();
                        commits.fetch_add(1, Ordering::Relaxed);
                        check(v, i);
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
            "{engine:?}, {}: newest wins",
            way.name()
        );
        assert!(n >= THREADS, "{engine:?}, {}: {n} commits", way.name());
        eprintln!(
            "hot page, {} ({}), 8 threads, {}: {n} commits, {:.0} commits/s, \
             {:.2} fdatasyncs per commit",
            engine.name(),
            if f.io_mode().direct.is_some() {
                "O_DIRECT"
            } else {
                "buffered"
            },
            way.name(),
            n as f64 / secs,
            stats.syncs as f64 / n.max(1) as f64,
        );
    }
}
