//! A steady commit load allocates nothing: page buffers, their `Arc`s, the
//! stripes' maps, a batch's vectors and the writer's iovecs all go round
//! (`.project/page-slabs.md`, "No allocation per page or per flush").
//!
//! Counted by dhat's heap profiler, the global allocator of this test
//! binary only; the binary has one test function, so no other test thread
//! adds its own allocations to the count.

use std::sync::atomic::{AtomicU64, Ordering};

use pagewriter::{Config, DirectIo, FlushEngine, PagedCachedFile};

mod common;

/// Counts every allocation of this test binary (dhat's heap profiler).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Allocations made since the profiler started.
fn allocations() -> u64 {
    dhat::HeapStats::get().total_blocks
}

const PAGE: usize = 4096;
/// Pages per transaction, as `pagewriter scale` writes them.
const TXN_PAGES: u64 = 16;

/// One transaction: `TXN_PAGES` fresh pages and two rewrites of earlier
/// ones, through `write_page` or through guards, then `sync`.
fn transaction(file: &PagedCachedFile, next: &mut u64, guards: bool, data: &[u8]) {
    let rewrites = [*next / 2, *next / 3];
    for p in (*next..*next + TXN_PAGES).chain(rewrites) {
        if guards {
            let mut page = file.overwrite(p * PAGE as u64, PAGE).unwrap();
            page.copy_from_slice(data);
        } else {
            file.write_page(p * PAGE as u64, data).unwrap();
        }
    }
    *next += TXN_PAGES;
    file.sync().unwrap();
}

#[test]
fn a_steady_commit_load_allocates_nothing() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let mut engines = vec![FlushEngine::Vectored];
    if common::uring_available() {
        engines.push(FlushEngine::IoUring { queue_depth: 8 });
    } else {
        eprintln!("io_uring unavailable here: its cases are skipped");
    }
    let data = vec![0x5Au8; PAGE];
    let mut checked = 0;
    for engine in engines {
        for direct in [DirectIo::Off, DirectIo::Auto] {
            for guards in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("steady");
                let config = Config::default().engine(engine).direct(direct);
                let file = PagedCachedFile::open(&path, config).unwrap();
                let mut next = 0;
                // Warm up: the pool's slabs, the maps' and vectors' capacity.
                for _ in 0..300 {
                    transaction(&file, &mut next, guards, &data);
                }
                let before = allocations();
                let commits = 200;
                for _ in 0..commits {
                    transaction(&file, &mut next, guards, &data);
                }
                let allocations = allocations() - before;
                let mode = file.io_mode();
                eprintln!(
                    "{engine:?}, direct {:?}, guards {guards}: {allocations} allocations in {commits} commits",
                    mode.direct
                );
                assert_eq!(
                    allocations, 0,
                    "{engine:?} ({mode:?}), guards {guards}: {allocations} allocations in {commits} commits"
                );
                // The pages are all there.
                let end = next * PAGE as u64;
                assert_eq!(file.len(), end);
                file.close().unwrap();
                let on_disk = std::fs::read(&path).unwrap();
                assert_eq!(on_disk.len() as u64, end);
                assert!(on_disk.iter().all(|&b| b == 0x5A));
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "only {checked} cases ran");

    // Four threads committing at once: group commit rounds vary in size,
    // and a round larger than any before grows a map or a vector once.
    // Nothing is allocated per page or per commit, writer threads (rounds
    // whose transactions left gaps between them go out from several
    // threads) included.
    let mut engines = vec![(FlushEngine::Vectored, 1), (FlushEngine::Vectored, 4)];
    if common::uring_available() {
        engines.push((FlushEngine::IoUring { queue_depth: 8 }, 1));
    }
    for (engine, write_threads) in engines {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::default()
            .engine(engine)
            .write_threads(write_threads);
        let file = PagedCachedFile::open(dir.path().join("threads"), config).unwrap();
        let next = AtomicU64::new(0);
        let threads = 4;
        let commits_each = 300;
        let run = || {
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        for _ in 0..commits_each {
                            let first = next.fetch_add(TXN_PAGES, Ordering::Relaxed);
                            for p in first..first + TXN_PAGES {
                                let mut page = file.overwrite(p * PAGE as u64, PAGE).unwrap();
                                page.copy_from_slice(&data);
                            }
                            file.sync().unwrap();
                        }
                    });
                }
            })
        };
        run();
        let before = allocations();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {});
            }
        });
        let spawning = allocations() - before;
        let before = allocations();
        run();
        let allocations = (allocations() - before).saturating_sub(spawning);
        let commits = (threads * commits_each) as u64;
        let s = file.stats();
        eprintln!(
            "{engine:?} x{write_threads}, {threads} threads: {allocations} allocations in {commits} commits ({} runs in {} rounds)",
            s.runs, s.commit_rounds
        );
        assert!(
            allocations <= commits / 2,
            "{engine:?} x{write_threads}, {threads} threads: {allocations} allocations in {commits} commits"
        );
        assert_eq!(file.len(), next.load(Ordering::Relaxed) * PAGE as u64);
    }
}
