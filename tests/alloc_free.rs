//! A steady commit load allocates nothing: page buffers, their `Arc`s, the
//! stripes' maps, a batch's vectors and the writer's iovecs all go round.
//!
//! Counted by dhat's heap profiler, the global allocator of this test
//! binary only; the binary has one test function, so no other test thread
//! adds its own allocations to the count.
//!
//! The verdicts do not depend on scheduling or load. Each commit way is
//! pinned (`Auto`'s probes are timed, so under load it would take a way
//! for the first time at a different commit), and `Auto` runs with the
//! test tuning that makes it use both ways during the warm-up. With one
//! committer nothing may be allocated at all. With four, the same threads
//! warm up and are measured (spawning and first parking are not in the
//! count), and what a load may still allocate is a pool reaching a depth
//! of concurrency it had not reached before (how many generations are in
//! flight at once depends on how long an `fdatasync` stalls, so on load):
//! a map per stripe and a batch's vectors per new level, at most 64
//! levels, however many commits run. With 8 stripes that is a few dozen
//! allocations per level; the bound, one allocation per 4 commits, holds
//! under any schedule a load makes, and a pool too small for the load
//! (found by this test: direct commits of four threads kept four spare
//! batches and allocated for every drain past them) exceeds it on every
//! run.

use std::sync::Barrier;
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

fn engines() -> Vec<FlushEngine> {
    let mut engines = vec![FlushEngine::Vectored];
    if common::uring_available() {
        engines.push(FlushEngine::IoUring { queue_depth: 8 });
    } else {
        eprintln!("io_uring unavailable here: its cases are skipped");
    }
    engines
}

/// One committer: after a warm-up, 200 commits allocate nothing, for each
/// engine, buffered and `O_DIRECT`, pages and guards.
fn one_committer() {
    let data = vec![0x5Au8; PAGE];
    let mut checked = 0;
    for engine in engines() {
        for direct in [DirectIo::Off, DirectIo::Auto] {
            for guards in [false, true] {
                {
                    let dir = tempfile::tempdir().unwrap();
                    let path = dir.path().join("steady");
                    let config = Config::default().engine(engine).direct(direct);
                    let file = PagedCachedFile::open(&path, config).unwrap();
                    let mut next = 0;
                    // Warm up: the pool's slabs, the maps' and vectors'
                    // capacity.
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
    }
    assert!(checked >= 4, "only {checked} cases ran");
}

/// One writer's scoped commits of pages inside written space: after a
/// warm-up, 200 commits allocate nothing, for each engine, buffered and
/// `O_DIRECT`.
fn one_scoped_committer() {
    let data = vec![0x5Au8; PAGE];
    let txn = vec![0x5Au8; PAGE * TXN_PAGES as usize];
    for engine in engines() {
        for direct in [DirectIo::Off, DirectIo::Auto] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("scoped");
            let config = Config::default().engine(engine).direct(direct);
            let file = PagedCachedFile::open(&path, config).unwrap();
            let written = 64 * TXN_PAGES;
            for p in 0..written {
                file.write_page(p * PAGE as u64, &data).unwrap();
            }
            file.sync().unwrap();
            let mut w = file.writer();
            let mut commit = |i: u64| {
                let first = (i * TXN_PAGES) % written;
                w.write_page(first * PAGE as u64, &txn).unwrap();
                w.write_page(((first + 7 * TXN_PAGES) % written) * PAGE as u64, &data)
                    .unwrap();
                w.commit().unwrap();
            };
            (0..300).for_each(&mut commit);
            let before = allocations();
            let commits = 200;
            (300..300 + commits).for_each(&mut commit);
            let allocations = allocations() - before;
            let mode = file.io_mode();
            eprintln!(
                "scoped, {engine:?}, direct {:?}: {allocations} allocations in {commits} commits",
                mode.direct
            );
            assert_eq!(
                allocations, 0,
                "scoped, {engine:?} ({mode:?}): {allocations} allocations in {commits} commits"
            );
            drop(w);
            file.close().unwrap();
        }
    }
}

/// Four committers, the same threads through the warm-up and the
/// measured commits. Returns the allocations of the measured commits.
fn four_committers(file: &PagedCachedFile, warm_up: usize, measured: usize) -> u64 {
    let threads = 4;
    let next = AtomicU64::new(0);
    let data = vec![0x5Au8; PAGE];
    // Warm-up done, measurement may start, measurement done.
    let phases = Barrier::new(threads + 1);
    let before = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let commit = || {
                    let first = next.fetch_add(TXN_PAGES, Ordering::Relaxed);
                    for p in first..first + TXN_PAGES {
                        let mut page = file.overwrite(p * PAGE as u64, PAGE).unwrap();
                        page.copy_from_slice(&data);
                    }
                    file.sync().unwrap();
                };
                (0..warm_up).for_each(|_| commit());
                phases.wait();
                phases.wait();
                (0..measured).for_each(|_| commit());
                phases.wait();
            });
        }
        phases.wait();
        before.store(allocations(), Ordering::SeqCst);
        phases.wait();
        phases.wait();
    });
    let allocations = allocations() - before.load(Ordering::SeqCst);
    assert_eq!(file.len(), next.load(Ordering::Relaxed) * PAGE as u64);
    allocations
}

/// Four threads committing at once: flushes vary in size and overlap, and
/// `fdatasync`s are shared. Nothing is allocated per page or per commit.
fn concurrent_committers() {
    for engine in engines() {
        {
            let dir = tempfile::tempdir().unwrap();
            let config = Config::default().engine(engine).stripes(8);
            let file = PagedCachedFile::open(dir.path().join("threads"), config).unwrap();
            let measured = 600;
            let commits = 4 * measured as u64;
            let allocations = four_committers(&file, 600, measured);
            let s = file.stats();
            eprintln!(
                "{engine:?}, 4 threads: {allocations} allocations in {commits} commits ({} runs, {} fdatasyncs)",
                s.runs, s.syncs
            );
            // See the module docs: pools reaching new depths stay far
            // under this; an allocation per commit or per drain does not.
            assert!(
                allocations <= commits / 4,
                "{engine:?}: {allocations} allocations in {commits} commits"
            );
        }
    }
}

#[test]
fn a_steady_commit_load_allocates_nothing() {
    let _profiler = dhat::Profiler::builder().testing().build();
    one_committer();
    one_scoped_committer();
    concurrent_committers();
}
