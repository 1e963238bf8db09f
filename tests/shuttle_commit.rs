//! Model check of the pipelined group commit with shuttle: the real
//! `PagedCachedFile` (its locks and atomics swapped for shuttle's by the
//! `shuttle` feature), run under thousands of randomized schedules.
//!
//! `cargo test --features shuttle --test shuttle_commit` (CI runs it). A
//! failure prints the schedule that reproduces it.
#![cfg(feature = "shuttle")]

use std::sync::Arc;

use pagewriter::testing::{CrashBackend, FaultyBackend, WriteFault};
use pagewriter::{CommitStrategy, Config, Error, PagedCachedFile};

const PS: usize = 512;

/// Runs `body` under uniform random schedules and under PCT schedules
/// (depth 3, which finds bugs that need a few preemptions at the right
/// steps: a uniform random schedule rarely makes one thread run a dozen
/// steps while another waits between two of its own).
fn check(body: fn()) {
    shuttle::check_random(body, iterations());
    shuttle::check_pct(body, iterations(), 3);
}

/// Schedules per test and scheduler; `SHUTTLE_ITERATIONS` overrides.
fn iterations() -> usize {
    std::env::var("SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

fn tag(page: u64, version: u64) -> u8 {
    (page * 16 + version) as u8
}

/// Small pages, 2 stripes, 2 sync lanes, 2 rounds in flight, and a write
/// buffer of `pages` pages, so that rounds pipeline and overlap and writers
/// hit backpressure. No writer threads (the default starts 3 per write
/// slot, which would multiply the schedules to explore); the writer-thread
/// test adds one.
fn config(pages: usize) -> Config {
    Config::default()
        .write_threads(1)
        .page_size(PS)
        .page_align(PS)
        .stripes(2)
        .sync_lanes(2)
        .rounds_in_flight(2)
        .max_write_buffer_bytes(pages * PS)
}

fn file_with(config: Config) -> (Arc<CrashBackend>, Arc<PagedCachedFile>) {
    let be = Arc::new(CrashBackend::new());
    let f = PagedCachedFile::new(Arc::clone(&be), config).unwrap();
    (be, Arc::new(f))
}

fn assert_page(img: &[u8], page: u64, version: u64, what: &str) {
    let at = page as usize * PS;
    assert!(img.len() >= at + PS, "{what}: page {page} missing");
    assert!(
        img[at..at + PS].iter().all(|&b| b == tag(page, version)),
        "{what}: page {page} is not version {version}"
    );
}

/// Three writers commit their own pages while rewriting one shared page:
/// when `sync` returns Ok, everything the caller wrote before is durable,
/// and the shared page ends as the last version written.
#[test]
fn a_successful_sync_covers_everything_written_before_it() {
    check(|| sync_covers_everything(config(3)));
}

/// The same with every commit direct: each caller writes what it drained
/// and `fdatasync`s itself unless a completed `fdatasync` covers its
/// writes. A caller that skipped its `fdatasync` on a watermark that does
/// not cover it would find a page missing from the durable image.
#[test]
fn a_direct_commit_never_skips_an_fdatasync_its_writes_need() {
    check(|| sync_covers_everything(config(3).commit_strategy(CommitStrategy::Direct)));
}

/// The same with `commit_dsync`: a round that goes out as one durable
/// write (the crash backend makes only that write durable) must not be
/// taken for a sync of pages another flush wrote before it.
#[test]
fn a_durable_write_round_covers_everything_written_before_it() {
    check(|| sync_covers_everything(config(3).commit_dsync(true)));
}

/// The same with a grow-ahead window of 4 pages: the trailer moves as the
/// writers' pages grow the file, the filler thread writes zeros above the
/// data frontier between their flushes, and a flush reaching into the
/// piece it writes waits for it. After every `sync`, what recovery makes
/// of the durable image (the file cut to its trailer's length) holds the
/// caller's pages, and no zero lands on a page once it was written.
#[test]
fn grow_ahead_never_zeros_a_written_page_and_keeps_the_length() {
    check(|| {
        let config = config(3).grow_ahead(pagewriter::GrowAhead::Window {
            bytes: 4 * PS as u64,
        });
        let (be, f) = file_with(config.clone());
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let (f, be, config) = (Arc::clone(&f), Arc::clone(&be), config.clone());
                shuttle::thread::spawn(move || {
                    for i in 0..3u64 {
                        let p = t + 2 * i;
                        f.write_page(p * PS as u64, &[tag(p, 1); PS]).unwrap();
                        f.sync().unwrap();
                        // This writer's pages (the other's may not be
                        // synced yet: `len()` could count them).
                        let len = (p + 1) * PS as u64;
                        assert!(f.len() >= len);
                        let img = recovered(&be.durable_image(), &config);
                        assert!(img.len() as u64 >= len, "length {len} not durable");
                        assert!(
                            img.len() as u64 <= 6 * PS as u64,
                            "the window leaked into the length: {} B",
                            img.len()
                        );
                        for q in (t..=p).step_by(2) {
                            assert_page(&img, q, 1, "after sync");
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        f.close().unwrap();
        let img = be.durable_image();
        assert_eq!(img.len(), 6 * PS, "close leaves the length");
        for q in 0..6 {
            assert_page(&img, q, 1, "after close");
        }
    });
}

/// What a file reopened over `image` holds after grow-ahead's recovery.
fn recovered(image: &[u8], config: &Config) -> Vec<u8> {
    let be = Arc::new(CrashBackend::from_image(image));
    drop(PagedCachedFile::new(Arc::clone(&be), config.clone()).unwrap());
    be.live_image()
}

fn sync_covers_everything(config: Config) {
    {
        let (be, f) = file_with(config);
        let last_shared = Arc::new(shuttle::sync::Mutex::new(0u64));
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let (f, be, last_shared) =
                    (Arc::clone(&f), Arc::clone(&be), Arc::clone(&last_shared));
                shuttle::thread::spawn(move || {
                    for i in 0..2u64 {
                        let p = 1 + t * 2 + i;
                        f.write_page(p * PS as u64, &[tag(p, 1); PS]).unwrap();
                        {
                            // Versions of the shared page 0 in write order.
                            let mut v = last_shared.lock().unwrap();
                            *v += 1;
                            f.write_page(0, &[tag(0, *v); PS]).unwrap();
                        }
                        f.sync().unwrap();
                        let img = be.durable_image();
                        for q in 1 + t * 2..=p {
                            assert_page(&img, q, 1, "after sync");
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        f.close().unwrap();
        let img = be.durable_image();
        assert_page(&img, 0, *last_shared.lock().unwrap(), "newest wins");
        assert_eq!(f.stats().buffered_bytes, 0);
    }
}

/// A failed fdatasync under concurrent commits and flushes: nobody hangs,
/// nobody is told Ok for pages the failed sync covered, and the file is
/// poisoned from then on.
#[test]
fn a_failed_fdatasync_poisons_and_nobody_hangs() {
    check(|| failed_fdatasync(config(3)));
}

/// The same with every commit direct (the callers' `fdatasync`s overlap on
/// their own lanes).
#[test]
fn a_failed_direct_fdatasync_poisons_and_nobody_hangs() {
    check(|| failed_fdatasync(config(3).commit_strategy(CommitStrategy::Direct)));
}

fn failed_fdatasync(config: Config) {
    {
        let (be, f) = file_with(config);
        // The second fdatasync fails.
        be.schedule_syncs([false, true]);
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let (f, be) = (Arc::clone(&f), Arc::clone(&be));
                shuttle::thread::spawn(move || {
                    for i in 0..2u64 {
                        let p = t * 2 + i;
                        match f.write_page(p * PS as u64, &[tag(p, 1); PS]) {
                            Ok(()) => {}
                            Err(Error::Poisoned) => return,
                            Err(e) => panic!("write: {e}"),
                        }
                        let r = if t == 2 && i == 0 {
                            f.flush()
                        } else {
                            f.sync()
                        };
                        match r {
                            Ok(()) if t == 2 && i == 0 => {}
                            Ok(()) => assert_page(&be.durable_image(), p, 1, "Ok sync"),
                            Err(Error::Poisoned) | Err(Error::Io { .. }) => {
                                assert!(f.is_poisoned());
                                return;
                            }
                            Err(e) => panic!("sync: {e}"),
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        if f.is_poisoned() {
            assert!(matches!(f.sync(), Err(Error::Poisoned)));
        }
    }
}

/// A commit round whose write fails puts its pages back in the write
/// buffer. A writer that found the buffer full while those pages were in
/// flight (so its own flush found nothing to write) must notice and flush
/// them itself, not sleep on a wakeup it missed: the model has no
/// timeouts, so a missed one is reported as a deadlock (found by the PCT
/// schedules; the window is a few steps wide).
#[test]
fn a_writer_waiting_for_room_sees_pages_a_failed_round_put_back() {
    check(|| {
        let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
        be.schedule_writes([WriteFault::Errno(libc::EIO)]);
        let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config(2)).unwrap());
        let committer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                for p in 0..2u64 {
                    f.write_page(p * PS as u64, &[tag(p, 1); PS]).unwrap();
                }
                // Ok, or the failed write (the pages stay buffered);
                // nothing after it wakes the other writer.
                match f.sync() {
                    Ok(()) | Err(Error::PagesFailed { .. }) => {}
                    Err(e) => panic!("sync: {e}"),
                }
            })
        };
        let writer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                loop {
                    match f.write_page(2 * PS as u64, &[tag(2, 1); PS]) {
                        Ok(()) => break,
                        // Its own flush met the failing write first.
                        Err(Error::PagesFailed { .. }) => continue,
                        Err(e) => panic!("write: {e}"),
                    }
                }
            })
        };
        committer.join().unwrap();
        writer.join().unwrap();
        f.close().unwrap();
        let img = be.inner().durable_image();
        for p in 0..3 {
            assert_page(&img, p, 1, "after close");
        }
    });
}

/// Two committers whose rounds have several runs, one write of which
/// fails: a caller told Ok has every page it wrote before its `sync`
/// durable, even a page that an earlier round drained and failed to write
/// (it goes back to the write buffer only when that round settles, so a
/// round that drained meanwhile does not hold it), and after close every
/// page is durable.
#[test]
fn an_ok_sync_covers_pages_an_earlier_round_failed_to_write() {
    check(|| failed_write_under_concurrent_commits(config(8)));
}

/// The same with writer threads (`write_threads(2)`: one helper beside
/// the flushing thread, which waits for the helper's runs; the helper is
/// joined when the file drops).
#[test]
fn writer_threads_write_every_run_and_report_the_failed_one() {
    check(|| failed_write_under_concurrent_commits(config(8).write_threads(2)));
}

/// The same with direct commits: a caller's flush that drained after a
/// failed write of another caller's drain writes those pages again before
/// it syncs.
#[test]
fn a_direct_commit_covers_pages_another_caller_failed_to_write() {
    check(|| {
        failed_write_under_concurrent_commits(config(8).commit_strategy(CommitStrategy::Direct))
    });
}

fn failed_write_under_concurrent_commits(config: Config) {
    {
        let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
        be.schedule_writes([WriteFault::Pass, WriteFault::Errno(libc::EIO)]);
        let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config).unwrap());
        let errors = Arc::new(shuttle::sync::atomic::AtomicUsize::new(0));
        let committers: Vec<_> = (0..2u64)
            .map(|t| {
                let (f, be, errors) = (Arc::clone(&f), Arc::clone(&be), Arc::clone(&errors));
                shuttle::thread::spawn(move || {
                    // Pages 2 apart: every round has several runs.
                    let pages = [t * 2, 4 + t * 2];
                    for &p in &pages {
                        f.write_page(p * PS as u64, &[tag(p, 1); PS]).unwrap();
                    }
                    loop {
                        match f.sync() {
                            Ok(()) => break,
                            Err(Error::PagesFailed { .. }) => {
                                errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                            Err(e) => panic!("sync: {e}"),
                        }
                    }
                    for &p in &pages {
                        assert_page(&be.inner().durable_image(), p, 1, "Ok sync");
                    }
                })
            })
            .collect();
        for c in committers {
            c.join().unwrap();
        }
        // No two of the pages are adjacent, so the failing second write
        // call always happened, in some round: that round's callers were
        // told, even if a later round succeeded first.
        assert!(
            errors.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "a failed write reached no caller"
        );
        f.close().unwrap();
        let img = be.inner().durable_image();
        for p in [0, 2, 4, 6] {
            assert_page(&img, p, 1, "after close");
        }
    }
}

/// A write merging into a cached page races a `set_len` that cuts the
/// page: once both returned, the page's other bytes are zeros (the write
/// landed after the cut, on a zeroed page) or the page is gone (it landed
/// before and was cut). Its old bytes never come back from the read cache.
#[test]
fn a_write_racing_a_shrink_never_brings_back_cut_bytes() {
    check(|| {
        let (_be, f) = file_with(config(8).read_cache_bytes(4 * PS));
        f.write_page(0, &[tag(0, 1); PS]).unwrap();
        f.write_page(PS as u64, &[tag(1, 1); PS]).unwrap();
        f.sync().unwrap();
        // Page 1 is clean and in the read cache now.
        let mut buf = vec![0u8; PS];
        f.read_exact_at(PS as u64, &mut buf).unwrap();
        let writer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || f.write_all_at(2 * PS as u64 - 1, &[7]).unwrap())
        };
        f.set_len(PS as u64).unwrap();
        writer.join().unwrap();
        if f.len() == 2 * PS as u64 {
            f.read_exact_at(PS as u64, &mut buf).unwrap();
            assert_eq!(buf[PS - 1], 7);
            assert!(
                buf[..PS - 1].iter().all(|&b| b == 0),
                "bytes the cut removed came back"
            );
        } else {
            assert_eq!(f.len(), PS as u64, "the write landed before the cut");
        }
        f.close().unwrap();
    });
}

/// A commit that read an aligned length and then drained a page a writer
/// had just put past it (growing the length to mid-page) writes that
/// page whole, past the length; a flush of a newer version of the page
/// cuts the file back to the length, before or after the commit's
/// generation retires (it waits for its `fdatasync`). Afterwards a
/// partial write, which reads the page from disk, must not meet the
/// file's end where the disk length still says the whole page is there,
/// and every byte reads back as written.
#[test]
fn a_cut_tail_never_leaves_reads_past_the_end_of_the_file() {
    check(|| {
        let (_be, f) = file_with(config(8));
        synced_pages(&f, 1);
        let grower = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || f.write_all_at(PS as u64 + 10, &[1]).unwrap())
        };
        let committer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || f.sync().unwrap())
        };
        f.write_all_at(PS as u64 + 5, &[2]).unwrap();
        f.flush().unwrap();
        grower.join().unwrap();
        committer.join().unwrap();
        f.write_all_at(PS as u64 + 3, &[3]).unwrap();
        f.flush().unwrap();
        assert_eq!(f.len(), PS as u64 + 11);
        let mut tail = vec![9u8; 11];
        f.read_exact_at(PS as u64, &mut tail).unwrap();
        assert_eq!(tail, [0, 0, 0, 3, 0, 2, 0, 0, 0, 0, 1]);
        f.close().unwrap();
    });
}

/// A `close` refused as `Busy` (a guard lives) while another thread
/// writes: the writer never hears `Closed`, its page is buffered, and the
/// file closes once the guard is gone.
#[test]
fn a_close_refused_as_busy_never_tells_a_writer_closed() {
    check(|| {
        let (be, f) = file_with(config(8));
        let guard = f.write(0, PS).unwrap();
        let writer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || f.write_page(2 * PS as u64, &[tag(2, 1); PS]))
        };
        match f.close() {
            Err(Error::Busy { .. }) => {}
            other => panic!("close with a guard alive: {other:?}"),
        }
        match writer.join().unwrap() {
            Ok(()) => {}
            Err(e) => panic!("a writer beside a refused close: {e}"),
        }
        drop(guard);
        f.close().unwrap();
        assert_page(&be.durable_image(), 2, 1, "after close");
    });
}

/// A backend that fails the test if two writes of one byte range are in
/// flight at once (each write yields to the scheduler halfway, so another
/// thread's write can start meanwhile), over a [`CrashBackend`].
#[derive(Debug)]
struct LatchCheck {
    inner: CrashBackend,
    in_flight: std::sync::Mutex<Vec<std::ops::Range<u64>>>,
}

impl LatchCheck {
    fn write(
        &self,
        at: std::ops::Range<u64>,
        write: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        {
            let mut w = self.in_flight.lock().unwrap();
            if let Some(other) = w.iter().find(|r| r.start < at.end && at.start < r.end) {
                panic!("two writes of one page in flight: {at:?} and {other:?}");
            }
            w.push(at.clone());
        }
        shuttle::thread::yield_now();
        let r = write();
        self.in_flight.lock().unwrap().retain(|r| *r != at);
        r
    }
}

impl pagewriter::StorageBackend for LatchCheck {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact_at(offset, buf)
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.write(offset..offset + buf.len() as u64, || {
            self.inner.write_all_at(offset, buf)
        })
    }
    fn write_vectored_all_at(
        &self,
        offset: u64,
        bufs: &mut [std::io::IoSlice<'_>],
    ) -> std::io::Result<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.write(offset..offset + len, || {
            self.inner.write_vectored_all_at(offset, bufs)
        })
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn sync_lanes(&self) -> usize {
        self.inner.sync_lanes()
    }
    fn sync_data_on(&self, lane: usize) -> std::io::Result<()> {
        self.inner.sync_data_on(lane)
    }
}

/// Three committers, two commits each: every commit rewrites the hot page
/// 0 (versions taken in write order under a lock) and writes a page of the
/// committer's own (`1 + t * 2 + i`), then syncs; `after_sync(t, i, p, v)`
/// checks what must hold once that sync returned Ok (`p` its own page, `v`
/// its version of page 0). Returns the last version of page 0 written.
fn hot_page_committers(
    f: &Arc<PagedCachedFile>,
    after_sync: impl Fn(u64, u64, u64, u64) + Send + Sync + 'static,
) -> u64 {
    let last = Arc::new(shuttle::sync::Mutex::new(0u64));
    let after_sync = Arc::new(after_sync);
    let committers: Vec<_> = (0..3u64)
        .map(|t| {
            let (f, last, after_sync) = (Arc::clone(f), Arc::clone(&last), Arc::clone(&after_sync));
            shuttle::thread::spawn(move || {
                for i in 0..2u64 {
                    let v = {
                        let mut v = last.lock().unwrap();
                        *v += 1;
                        f.write_page(0, &[tag(0, *v); PS]).unwrap();
                        *v
                    };
                    let p = 1 + t * 2 + i;
                    f.write_page(p * PS as u64, &[tag(p, 1); PS]).unwrap();
                    f.sync().unwrap();
                    after_sync(t, i, p, v);
                }
            })
        })
        .collect();
    for c in committers {
        c.join().unwrap();
    }
    *last.lock().unwrap()
}

/// Three committers rewrite one hot page (and write pages of their own)
/// with three rounds in flight, so a round drains the page while an older
/// version of it is still being written: the newer write waits for the
/// older (the backend fails the test if both are in flight at once), an
/// acknowledged version (or a newer one) is what is durable, and the last
/// version written wins.
#[test]
fn rounds_in_flight_never_write_one_page_twice_at_once() {
    check(|| {
        let be = Arc::new(LatchCheck {
            inner: CrashBackend::new(),
            in_flight: std::sync::Mutex::new(Vec::new()),
        });
        let f =
            Arc::new(PagedCachedFile::new(Arc::clone(&be), config(8).rounds_in_flight(3)).unwrap());
        let seen = Arc::clone(&be);
        let last = hot_page_committers(&f, move |_, _, p, v| {
            let img = seen.inner.durable_image();
            assert_page(&img, p, 1, "after sync");
            assert!(
                img[..PS].iter().all(|&b| b >= tag(0, v)),
                "page 0 older than acknowledged version {v}"
            );
        });
        f.close().unwrap();
        assert_page(&be.inner.durable_image(), 0, last, "newest wins");
    });
}

/// Generations retire out of drain order when they share no page with an
/// older one in flight: three direct committers rewrite one hot page (and
/// write pages of their own), so a commit's generation may settle while an
/// older one holding the hot page is still in its `fdatasync`. After its
/// `sync`, each reads the hot page back: never a version older than the
/// one it wrote (a generation holding the hot page that retired before an
/// older one would leave the older version in flight for the read to
/// find), and its own page as written.
#[test]
fn a_read_never_finds_an_older_version_when_generations_retire_out_of_order() {
    check(|| {
        let (_be, f) = file_with(config(8).commit_strategy(CommitStrategy::Direct));
        let reader = Arc::clone(&f);
        let last = hot_page_committers(&f, move |_, _, p, v| {
            let hot = reader.read(0, PS).unwrap();
            assert!(
                hot.iter().all(|&b| b >= tag(0, v)),
                "page 0 read back older than version {v} this thread wrote"
            );
            let own = reader.read(p * PS as u64, PS).unwrap();
            assert!(
                own.iter().all(|&b| b == tag(p, 1)),
                "page {p} read back wrong"
            );
        });
        assert!(f.read(0, PS).unwrap().iter().all(|&b| b == tag(0, last)));
        f.close().unwrap();
    });
}

/// Crash images taken while rounds overlap: after a committer's `sync`
/// returned Ok, no image a power cut could leave (the durable image plus
/// any subset of the writes issued since, some torn at 512-byte sectors)
/// holds a page it committed at an older version, the hot page included:
/// an older version of a page is never issued after a newer one, and a
/// round's `fdatasync` starts only after every write drained before it.
#[test]
fn no_crash_image_loses_an_acknowledged_commit_while_rounds_overlap() {
    check(|| no_crash_image_loses_a_commit(config(8).rounds_in_flight(3)));
}

/// The same with direct commits: the callers' writes of the hot page
/// overlap (each from its own inline slot) and their `fdatasync`s too.
#[test]
fn no_crash_image_loses_an_acknowledged_direct_commit() {
    check(|| no_crash_image_loses_a_commit(config(8).commit_strategy(CommitStrategy::Direct)));
}

fn no_crash_image_loses_a_commit(config: Config) {
    {
        let (be, f) = file_with(config);
        let seen = Arc::clone(&be);
        hot_page_committers(&f, move |t, i, p, v| {
            for seed in 0..4 {
                let img = seen.crash_image(t * 100 + i * 10 + seed);
                for q in 1 + t * 2..=p {
                    assert_page(&img, q, 1, "crash image after sync");
                }
                assert!(
                    img[..PS].iter().all(|&b| b >= tag(0, v)),
                    "a crash image holds page 0 older than acknowledged version {v}"
                );
            }
        });
        f.close().unwrap();
    }
}

/// `flush` hands every page buffered before it to the OS, even one that a
/// commit round running beside it drained first and is still writing: the
/// flush waits for that write instead of returning because it found
/// nothing dirty. (The backend yields halfway through each write, so the
/// flush can run while the round's write is in flight.)
#[test]
fn a_flush_returns_after_pages_another_round_drained_reach_the_os() {
    check(|| {
        let be = Arc::new(LatchCheck {
            inner: CrashBackend::new(),
            in_flight: std::sync::Mutex::new(Vec::new()),
        });
        let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config(8)).unwrap());
        let committer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                f.write_page(PS as u64, &[tag(1, 1); PS]).unwrap();
                f.sync().unwrap();
            })
        };
        f.write_page(2 * PS as u64, &[tag(2, 1); PS]).unwrap();
        f.flush().unwrap();
        assert_page(&be.inner.live_image(), 2, 1, "after flush");
        committer.join().unwrap();
        f.close().unwrap();
    });
}

/// Doublewrite with three rounds in flight: each round stages its pages in
/// the area before writing them in place, after any older round still
/// writing one of them. After every acknowledged commit, a power cut
/// (crash images of the file and of the area) followed by the recovery
/// pass leaves the hot page at the acknowledged version or a newer one:
/// the area's records hold a page's versions in the order they were
/// written, so replaying them never ends on an older one.
#[test]
fn doublewrite_recovery_never_ends_on_an_older_version() {
    check(|| {
        let be = Arc::new(CrashBackend::new());
        let area = Arc::new(CrashBackend::new());
        let cfg = config(8)
            .rounds_in_flight(3)
            .torn_writes(pagewriter::TornWrites::DoubleWrite);
        let f = Arc::new(
            PagedCachedFile::with_doublewrite(Arc::clone(&be), Arc::clone(&area) as _, cfg.clone())
                .unwrap(),
        );
        let (seen, seen_area) = (Arc::clone(&be), Arc::clone(&area));
        hot_page_committers(&f, move |t, i, p, v| {
            let seed = t * 100 + i * 10;
            let (img, area_img) = seen.crash_images_with(&seen_area, seed, seed + 1);
            let recovered = Arc::new(CrashBackend::from_image(&img));
            let r = PagedCachedFile::with_doublewrite(
                Arc::clone(&recovered),
                Arc::new(CrashBackend::from_image(&area_img)),
                cfg.clone(),
            )
            .unwrap();
            drop(r);
            let img = recovered.live_image();
            assert_page(&img, p, 1, "recovered after sync");
            assert!(
                img[..PS].iter().all(|&b| b >= tag(0, v)),
                "recovery left page 0 older than acknowledged version {v}"
            );
        });
        f.close().unwrap();
    });
}

/// `refresh` (following another writer) racing with this file's own
/// writes and flushes: it either refuses (`Buffered`) or finds nothing
/// buffered, so it never drops a page or shortens the length under a
/// write; every write reads back and reaches the file.
#[test]
fn a_refresh_racing_with_writes_never_loses_one() {
    check(|| {
        let (be, f) = file_with(config(8).read_cache_bytes(4 * PS));
        f.write_page(0, &[tag(0, 1); PS]).unwrap();
        f.sync().unwrap();
        let writer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                f.write_page(PS as u64, &[tag(1, 1); PS]).unwrap();
                f.flush().unwrap();
                // A partial write merges into the cached or on-disk page.
                f.write_all_at(PS as u64 + 7, &[tag(1, 2)]).unwrap();
            })
        };
        for _ in 0..3 {
            match f.refresh() {
                Ok(()) | Err(Error::Buffered { .. }) => {}
                Err(e) => panic!("refresh: {e}"),
            }
        }
        writer.join().unwrap();
        assert_eq!(f.len(), 2 * PS as u64);
        let mut buf = vec![0u8; PS];
        f.read_exact_at(PS as u64, &mut buf).unwrap();
        assert_eq!(buf[7], tag(1, 2));
        assert!(buf[..7].iter().chain(&buf[8..]).all(|&b| b == tag(1, 1)));
        f.sync().unwrap();
        let img = be.durable_image();
        assert_eq!(&img[PS..2 * PS], &buf[..]);
        f.close().unwrap();
    });
}

// ---- scoped commits and tickets ----

/// How a scoped committer ends its transaction.
#[derive(Clone, Copy)]
enum Scoped {
    /// `Writer::commit`.
    Commit,
    /// `Writer::commit_async`, then the ticket's `wait`.
    Ticket,
    /// `Writer::commit_async`; the ticket waited on after the next one's
    /// writes (one commit kept in flight).
    Pipelined,
}

/// What the file holds when the scoped writers start.
#[derive(Clone, Copy)]
enum Start {
    /// Every page the writers write is already written and synced: no
    /// commit grows the file, so each is a scoped commit proper.
    Written,
    /// An empty file: a commit whose pages reach past the file's length
    /// on disk is made as `sync()` makes its commits, beside scoped
    /// commits of pages other writers' flushes already covered.
    Empty,
    /// Written as `Written`, but the file reports each writer's first
    /// page (1, 3, 5) unwritten at open (space reserved, never written):
    /// a writer's first commit is made as `sync()` makes its commits and
    /// takes the page out of the unwritten set, while other writers'
    /// second commits go the scoped way.
    Reserved,
    /// The shared page written and synced, then `set_len` grows the file
    /// over the writers' pages (a hole): every commit's own page lies in
    /// space the grow added, so each commit is made as `sync()` makes its
    /// commits and takes its page out of the unwritten set.
    Grown,
}

/// Three writers, each with pages of its own and a shared page they all
/// rewrite, commit through their own `Writer` with no leader: a committer
/// writes its pages and needs an `fdatasync` that began after those writes
/// completed (it waits for one in flight that did, or issues its own; the
/// other writers' commits run beside it). When a commit (or its ticket)
/// says Ok, every crash image a power cut could leave holds the writer's
/// own pages and the shared page at its version or a later one. A writer
/// that accepted an `fdatasync` begun before its writes completed would
/// find a page of its own missing from some image.
fn scoped_writers_lose_nothing(config: Config, how: Scoped, start: Start) {
    scoped_writers_lose_nothing_on(CrashBackend::new(), config, how, start);
}

/// [`scoped_writers_lose_nothing`] on `be`.
fn scoped_writers_lose_nothing_on(be: CrashBackend, config: Config, how: Scoped, start: Start) {
    let be = Arc::new(be);
    let mut f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config.clone()).unwrap());
    if let Start::Written | Start::Reserved = start {
        for p in 0..7u64 {
            f.write_page(p * PS as u64, &[tag(p, 0); PS]).unwrap();
        }
        f.sync().unwrap();
    }
    if let Start::Grown = start {
        f.write_page(0, &[tag(0, 0); PS]).unwrap();
        f.sync().unwrap();
        f.set_len(7 * PS as u64).unwrap();
    }
    if let Start::Reserved = start {
        f.close().unwrap();
        let ps = PS as u64;
        be.report_unwritten(vec![ps..2 * ps, 3 * ps..4 * ps, 5 * ps..6 * ps]);
        f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config).unwrap());
    }
    let last_shared = Arc::new(shuttle::sync::Mutex::new(0u64));
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let (f, be, last_shared) = (Arc::clone(&f), Arc::clone(&be), Arc::clone(&last_shared));
            shuttle::thread::spawn(move || {
                let mut w = f.writer();
                let mut pending: Option<(pagewriter::CommitTicket, u64, u64)> = None;
                let check = |p: u64, v: u64, seed: u64| {
                    let img = be.crash_image(seed);
                    assert_page(&img, p, 1, "crash image after a scoped commit");
                    assert!(
                        img[..PS].iter().all(|&b| b >= tag(0, v)),
                        "a crash image holds page 0 older than acknowledged version {v}"
                    );
                };
                for i in 0..2u64 {
                    let p = 1 + t * 2 + i;
                    w.write_page(p * PS as u64, &[tag(p, 1); PS]).unwrap();
                    let v = {
                        let mut v = last_shared.lock().unwrap();
                        *v += 1;
                        w.write_page(0, &[tag(0, *v); PS]).unwrap();
                        *v
                    };
                    match how {
                        Scoped::Commit => {
                            w.commit().unwrap();
                            check(p, v, t * 10 + i);
                        }
                        Scoped::Ticket => {
                            w.commit_async().unwrap().wait().unwrap();
                            check(p, v, t * 10 + i);
                        }
                        Scoped::Pipelined => {
                            let next = w.commit_async().unwrap();
                            if let Some((ticket, q, u)) = pending.replace((next, p, v)) {
                                ticket.wait().unwrap();
                                check(q, u, t * 10 + i);
                            }
                        }
                    }
                }
                if let Some((ticket, q, u)) = pending {
                    ticket.wait().unwrap();
                    check(q, u, t * 10 + 9);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    f.close().unwrap();
    assert_page(
        &be.durable_image(),
        0,
        *last_shared.lock().unwrap(),
        "newest wins",
    );
    let extending = f.stats().allocating_scoped_commits;
    match start {
        Start::Written => assert_eq!(extending, 0, "no commit grew a written file"),
        // The first commit finds the file empty on disk.
        Start::Empty => assert!(
            extending > 0,
            "a commit that grew the file went the scoped way"
        ),
        Start::Reserved => assert_eq!(extending, 3, "each writer's first commit allocates"),
        Start::Grown => assert_eq!(extending, 6, "every commit's own page lies in the hole"),
    }
}

#[test]
fn a_scoped_commit_never_accepts_an_fdatasync_that_began_before_its_writes() {
    check(|| scoped_writers_lose_nothing(config(8), Scoped::Commit, Start::Written));
}

#[test]
fn a_resolved_ticket_never_loses_its_pages() {
    check(|| scoped_writers_lose_nothing(config(8), Scoped::Ticket, Start::Written));
}

#[test]
fn pipelined_tickets_never_lose_their_pages() {
    check(|| scoped_writers_lose_nothing(config(8), Scoped::Pipelined, Start::Written));
}

/// One sync lane at first, for rounds and scoped commits alike: a scoped
/// commit that finds it syncing opens another (each lane a description of
/// its own, never two `fdatasync`s on one at once: the backend panics),
/// and its `fdatasync` there covers its writes like any other. Nothing
/// acknowledged is lost, by commits or tickets.
#[test]
fn scoped_commits_on_lanes_opened_on_demand_lose_nothing() {
    check(|| {
        let config = config(8).sync_lanes(1);
        scoped_writers_lose_nothing_on(
            CrashBackend::with_sync_lanes(1),
            config,
            Scoped::Commit,
            Start::Written,
        );
    });
    check(|| {
        let config = config(8).sync_lanes(1);
        scoped_writers_lose_nothing_on(
            CrashBackend::with_sync_lanes(1),
            config,
            Scoped::Pipelined,
            Start::Written,
        );
    });
}

/// One round lane and one spare lane, and no more to open: `sync()`
/// callers wait for the round lane while scoped commits take either. A
/// lane that comes back wakes one waiter that may take it; one woken for
/// the round lane may find the spare one free first and take that, so
/// the round lane must go on to the next waiter (else a `sync()` caller
/// sleeps beside a free lane: shuttle reports the deadlock).
#[test]
fn sync_and_scoped_commits_share_few_lanes_and_nobody_sleeps_beside_a_free_one() {
    check(|| {
        let be = Arc::new(CrashBackend::with_sync_lanes(2).most_sync_lanes(2));
        let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config(8).sync_lanes(1)).unwrap());
        for p in 0..5u64 {
            f.write_page(p * PS as u64, &[tag(p, 0); PS]).unwrap();
        }
        f.sync().unwrap();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (f, be) = (Arc::clone(&f), Arc::clone(&be));
                shuttle::thread::spawn(move || {
                    for v in 1..=2u64 {
                        let p = t + 1;
                        if t == 0 {
                            f.write_page(p * PS as u64, &[tag(p, v); PS]).unwrap();
                            f.sync().unwrap();
                        } else {
                            f.writer()
                                .write_and_commit(p * PS as u64, &[tag(p, v); PS])
                                .unwrap();
                        }
                        assert_page(&be.durable_image(), p, v, "after a commit");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(f.stats().sync_lanes_opened, 0);
        f.close().unwrap();
    });
}

/// Scoped commits on a growing file: a commit whose pages reach past the
/// file's length on disk goes the way of `sync()` (group rounds), beside
/// scoped commits of writers whose pages another writer's flush already
/// brought inside it. Neither loses an acknowledged page.
#[test]
fn scoped_commits_that_grow_the_file_lose_nothing() {
    check(|| scoped_writers_lose_nothing(config(8), Scoped::Commit, Start::Empty));
}

/// Scoped commits into space the file reports unwritten (see
/// `Start::Reserved`): commits that allocate go the way of `sync()` and
/// update the unwritten set while other writers' commits go the scoped
/// way. No acknowledged page is lost.
#[test]
fn scoped_commits_into_unwritten_space_lose_nothing() {
    check(|| scoped_writers_lose_nothing(config(8), Scoped::Commit, Start::Reserved));
}

/// Scoped commits into the hole `set_len` made (see `Start::Grown`): each
/// goes the way of `sync()` while the others' run beside it, and updates
/// the unwritten set. No acknowledged page is lost.
#[test]
fn scoped_commits_into_space_set_len_added_lose_nothing() {
    check(|| scoped_writers_lose_nothing(config(8), Scoped::Commit, Start::Grown));
}

/// Backpressure under scoped commits: a write buffer of three pages, so
/// writers' pages are drained by other writers' backpressure flushes and
/// a commit must wait for the generation that holds its page rather than
/// find it dirty.
#[test]
fn a_scoped_commit_covers_pages_a_backpressure_flush_took() {
    check(|| scoped_writers_lose_nothing(config(3), Scoped::Commit, Start::Written));
}

/// A failed `fdatasync` under scoped and asynchronous commits: nobody
/// hangs, no commit or ticket says Ok for pages it did not make durable,
/// and every one after it fails.
#[test]
fn a_failed_fdatasync_under_scoped_commits_fails_exactly_what_it_covers() {
    check(|| failed_fdatasync_under_scoped_commits(CrashBackend::new(), config(8)));
}

/// The same with one sync lane at first: the failure may come on a lane
/// opened since (which reports it, as a new description sees any error
/// no description has seen) or on the first while others sync on new
/// ones (which then report it too).
#[test]
fn a_failed_fdatasync_on_lanes_opened_on_demand_fails_exactly_what_it_covers() {
    check(|| {
        let config = config(8).sync_lanes(1);
        failed_fdatasync_under_scoped_commits(CrashBackend::with_sync_lanes(1), config)
    });
}

fn failed_fdatasync_under_scoped_commits(be: CrashBackend, config: Config) {
    {
        let be = Arc::new(be);
        let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config).unwrap());
        be.schedule_syncs([false, true]);
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let (f, be) = (Arc::clone(&f), Arc::clone(&be));
                shuttle::thread::spawn(move || {
                    let mut w = f.writer();
                    let mut failed = false;
                    for i in 0..3u64 {
                        let p = 1 + t * 3 + i;
                        if w.write_page(p * PS as u64, &[tag(p, 1); PS]).is_err() {
                            assert!(failed || f.is_poisoned());
                            break;
                        }
                        let r = if t == 0 {
                            w.commit()
                        } else {
                            w.commit_async().and_then(|tk| tk.wait())
                        };
                        match r {
                            Ok(()) => {
                                assert!(!failed, "Ok after a failure");
                                assert_page(&be.durable_image(), p, 1, "after Ok");
                            }
                            Err(_) => failed = true,
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
    }
}

/// A scoped commit with a grow-ahead window while another thread flushes
/// (and an asynchronous commit's committer thread runs): the flush may
/// take the writer's pages past the old end with the length it read
/// before the writer's writes. When the commit says Ok, what recovery
/// makes of the durable image (the file cut to its trailer's length)
/// holds the writer's pages: the commit records the length itself.
#[test]
fn a_scoped_commit_records_the_length_another_flush_missed() {
    check(|| {
        let config = config(8).grow_ahead(pagewriter::GrowAhead::Window {
            bytes: 4 * PS as u64,
        });
        let (be, f) = file_with(config.clone());
        let flusher = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                for _ in 0..3 {
                    f.flush().unwrap();
                }
                f.sync_async().unwrap().wait().unwrap();
            })
        };
        let mut w = f.writer();
        for p in [2u64, 9] {
            w.write_page(p * PS as u64, &[tag(p, 1); PS]).unwrap();
            w.commit().unwrap();
            let img = recovered(&be.durable_image(), &config);
            assert_page(&img, p, 1, "recovered after a scoped commit");
        }
        drop(w);
        flusher.join().unwrap();
        f.close().unwrap();
    });
}

// ---- writes through (`Writer::write_and_commit` skipping the buffer) ----

/// Three writers commit pages of their own with `write_and_commit` on a
/// written file, so each commit writes through (one write from the
/// caller's bytes) and needs an `fdatasync` that began after that write
/// completed. Every crash image after a commit returns holds its page. A
/// commit that took an `fdatasync` begun before its write completed (a
/// target read before the write) would find its page missing from some
/// image.
#[test]
fn a_write_through_never_accepts_an_fdatasync_that_began_before_it() {
    check(|| {
        let (be, f) = file_with(config(8));
        for p in 0..7u64 {
            f.write_page(p * PS as u64, &[tag(p, 0); PS]).unwrap();
        }
        f.sync().unwrap();
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let (f, be) = (Arc::clone(&f), Arc::clone(&be));
                shuttle::thread::spawn(move || {
                    let mut w = f.writer();
                    for i in 0..2u64 {
                        let p = 1 + t * 2 + i;
                        w.write_and_commit(p * PS as u64, &[tag(p, 1); PS]).unwrap();
                        let img = be.crash_image(t * 10 + i);
                        assert_page(&img, p, 1, "crash image after a write through");
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(f.stats().through_commits, 6, "every commit wrote through");
        f.close().unwrap();
    });
}

/// A page with an older version buffered or in flight (written, then
/// flushed by another thread at any point) is never written through: the
/// commit takes the buffered way, so the older version cannot land after
/// the newer one. Meanwhile a reader (the read cache on) reads whole
/// versions only, and once the commit returns, a read and every crash
/// image give the committed version. Writing through over the older
/// version would end with it on disk; a release that kept the cache's
/// copy would read back an older version.
#[test]
fn a_write_through_never_lands_under_an_older_version() {
    check(|| {
        let (be, f) = file_with(config(8).read_cache_bytes(4 * PS));
        synced_pages(&f, 1);
        let flusher = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                for _ in 0..2 {
                    f.flush().unwrap();
                }
            })
        };
        let reader = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                for _ in 0..2 {
                    let page = f.read(0, PS).unwrap();
                    let v = page[0];
                    assert!(
                        (0..=2).any(|v| tag(0, v) == page[0]),
                        "a read of page 0 found no version"
                    );
                    assert!(page.iter().all(|&b| b == v), "a read found a torn page");
                }
            })
        };
        f.write_page(0, &[tag(0, 1); PS]).unwrap();
        let mut w = f.writer();
        w.write_and_commit(0, &[tag(0, 2); PS]).unwrap();
        assert_page(&f.read(0, PS).unwrap(), 0, 2, "a read after the commit");
        assert_page(&be.crash_image(7), 0, 2, "crash image after the commit");
        flusher.join().unwrap();
        reader.join().unwrap();
        f.sync().unwrap();
        assert_page(&be.durable_image(), 0, 2, "newest wins");
        assert_page(&f.read(0, PS).unwrap(), 0, 2, "a read at the end");
        f.close().unwrap();
    });
}

/// A write through racing with a shrinking `set_len` over its page: the
/// write lands before the cut (which removes it) or is refused the way
/// through and written after it (growing the file again, as any write
/// past the end does). Either way the file's size on disk is its length,
/// and a page past the cut is the committed version. A write through
/// landing after the `ftruncate` would leave the file longer than its
/// length.
#[test]
fn a_write_through_never_lands_past_a_cut() {
    check(|| {
        let (be, f) = file_with(config(8));
        for p in 0..4u64 {
            f.write_page(p * PS as u64, &[tag(p, 0); PS]).unwrap();
        }
        f.sync().unwrap();
        let writer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                f.writer()
                    .write_and_commit(3 * PS as u64, &[tag(3, 1); PS])
                    .unwrap();
            })
        };
        f.set_len(2 * PS as u64).unwrap();
        writer.join().unwrap();
        f.sync().unwrap();
        let img = be.durable_image();
        assert_eq!(img.len() as u64, f.len(), "the file's size is its length");
        if f.len() > 2 * PS as u64 {
            assert_page(&img, 3, 1, "a write after the cut");
        }
        f.close().unwrap();
    });
}

/// Two writers' large writes (two pages each) into the hole `set_len`
/// left, each then committed, beside a thread rewriting page 0 and
/// calling `sync()`: a write goes through where no `sync()` is under way
/// (its commit then needs an `fdatasync` begun after it), into the buffer
/// otherwise (grouped). Every crash image after a commit holds the
/// writer's pages, and every one after a `sync()` the page it covered.
#[test]
fn large_writes_into_unwritten_space_lose_nothing() {
    check(|| {
        let (be, f) = file_with(config(8).write_through_min_bytes(Some(2 * PS)));
        synced_pages(&f, 1);
        f.set_len(6 * PS as u64).unwrap();
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let (f, be) = (Arc::clone(&f), Arc::clone(&be));
                shuttle::thread::spawn(move || {
                    let mut w = f.writer();
                    let first = 2 + t * 2;
                    let bytes: Vec<u8> = (first..first + 2).flat_map(|p| [tag(p, 1); PS]).collect();
                    w.write_page(first * PS as u64, &bytes).unwrap();
                    w.commit().unwrap();
                    let img = be.crash_image(t);
                    for p in first..first + 2 {
                        assert_page(&img, p, 1, "crash image after a commit");
                    }
                })
            })
            .collect();
        f.write_page(0, &[tag(0, 1); PS]).unwrap();
        f.sync().unwrap();
        assert_page(&be.crash_image(7), 0, 1, "crash image after sync()");
        for w in writers {
            w.join().unwrap();
        }
        UNWRITTEN_THROUGH.fetch_add(
            f.stats().through_writes,
            std::sync::atomic::Ordering::Relaxed,
        );
        f.close().unwrap();
    });
    assert!(
        UNWRITTEN_THROUGH.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no schedule wrote through"
    );
}

/// Large writes through in the check above, summed over its schedules.
static UNWRITTEN_THROUGH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A writer's large write past the file's end (two pages), then its
/// commit, beside a thread rewriting page 0 and calling `sync()` and a
/// reader: the write goes through where no `sync()` is under way (it
/// grows the file and every length), into the buffer otherwise. A reader
/// that sees the new length reads the written pages, never zeros; every
/// crash image after the commit holds them and the length they need.
#[test]
fn a_large_write_past_the_end_loses_nothing() {
    check(|| {
        let (be, f) = file_with(config(8).write_through_min_bytes(Some(2 * PS)));
        synced_pages(&f, 2);
        let writer = {
            let (f, be) = (Arc::clone(&f), Arc::clone(&be));
            shuttle::thread::spawn(move || {
                let mut w = f.writer();
                let bytes: Vec<u8> = (2..4u64).flat_map(|p| [tag(p, 1); PS]).collect();
                w.write_page(2 * PS as u64, &bytes).unwrap();
                w.commit().unwrap();
                let img = be.crash_image(1);
                assert_page(&img, 2, 1, "crash image after the commit");
                assert_page(&img, 3, 1, "crash image after the commit");
            })
        };
        let reader = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                if f.len() >= 4 * PS as u64 {
                    let page = f.read(3 * PS as u64, PS).unwrap();
                    assert!(
                        page.iter().all(|&b| b == tag(3, 1)),
                        "a read within the new length found no data"
                    );
                }
            })
        };
        f.write_page(0, &[tag(0, 1); PS]).unwrap();
        f.sync().unwrap();
        assert_page(&be.crash_image(7), 0, 1, "crash image after sync()");
        writer.join().unwrap();
        reader.join().unwrap();
        assert_eq!(f.len(), 4 * PS as u64);
        PAST_END_THROUGH.fetch_add(
            f.stats().through_writes,
            std::sync::atomic::Ordering::Relaxed,
        );
        f.close().unwrap();
        assert_eq!(be.durable_image().len(), 4 * PS, "the length at close");
    });
    assert!(
        PAST_END_THROUGH.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no schedule wrote through"
    );
}

/// Large writes through in the check above, summed over its schedules.
static PAST_END_THROUGH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A writer's large write past the file's end racing with a shrinking
/// `set_len` (and then its commit): the write lands whole before the cut
/// (which removes it), or after it, or goes into the buffer and lands
/// before or after it page by page. The file's size on disk is its
/// length, and the last page past the cut is the committed version.
#[test]
fn a_large_write_past_the_end_racing_a_cut_keeps_the_size_the_length() {
    check(|| {
        large_write_racing_a_cut(2, 1);
    });
}

/// A writer's large write through (two pages) racing with a shrinking
/// `set_len` over its pages, then its commit: the write lands whole before
/// the cut (which removes it), or is refused the way through and buffered,
/// landing before or after the cut page by page. Either way the file's
/// size on disk is its length, and the last page past the cut is the
/// committed version. A write through landing after the `ftruncate` would
/// leave the file longer than its length.
#[test]
fn a_large_write_through_never_lands_past_a_cut() {
    check(|| {
        let through = large_write_racing_a_cut(4, 2);
        THROUGH_BEFORE_CUT.fetch_add(through, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(
        THROUGH_BEFORE_CUT.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no schedule wrote through"
    );
}

/// A file of `synced` pages, synced; a writer writes pages 2 and 3 with
/// one large write (through where it can) and commits, racing a `set_len`
/// to `cut` pages. Then: the file's size on disk is its length, every
/// page past the cut is the write or zeros (the buffered way lands page
/// by page), and the last page past it is the write. Returns the writes
/// through.
fn large_write_racing_a_cut(synced: u64, cut: u64) -> u64 {
    let (be, f) = file_with(config(8).write_through_min_bytes(Some(2 * PS)));
    synced_pages(&f, synced);
    let writer = {
        let f = Arc::clone(&f);
        shuttle::thread::spawn(move || {
            let mut w = f.writer();
            let bytes: Vec<u8> = (2..4u64).flat_map(|p| [tag(p, 1); PS]).collect();
            w.write_page(2 * PS as u64, &bytes).unwrap();
            w.commit().unwrap();
        })
    };
    f.set_len(cut * PS as u64).unwrap();
    writer.join().unwrap();
    f.sync().unwrap();
    let img = be.durable_image();
    assert_eq!(img.len() as u64, f.len(), "the file's size is its length");
    let pages = f.len() / PS as u64;
    for p in cut..pages {
        let bytes = &img[p as usize * PS..(p as usize + 1) * PS];
        assert!(
            bytes.iter().all(|&b| b == tag(p, 1)) || bytes.iter().all(|&b| b == 0),
            "page {p} past the cut is neither the write nor zeros"
        );
    }
    if pages > cut {
        assert_page(&img, pages - 1, 1, "a write after the cut");
    }
    let through = f.stats().through_writes;
    f.close().unwrap();
    through
}

/// Large writes through in the check above, summed over its schedules.
static THROUGH_BEFORE_CUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A writer's large write through racing with `close`: it either lands
/// before the close (whose `fdatasync` covers it) or is refused with
/// `Closed`; nothing reaches the file after `close` returns, so the
/// durable image is the file as it is. A write through that did not
/// count as a write in flight could land after the close's `fdatasync`.
#[test]
fn a_large_write_through_never_lands_after_close() {
    check(|| {
        let (be, f) = file_with(config(8).write_through_min_bytes(Some(2 * PS)));
        synced_pages(&f, 2);
        let writer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                let mut w = f.writer();
                let bytes: Vec<u8> = (0..2u64).flat_map(|p| [tag(p, 1); PS]).collect();
                match w.write_page(0, &bytes) {
                    Ok(()) => {}
                    Err(Error::Closed) => return false,
                    Err(e) => panic!("a write racing close: {e}"),
                }
                match w.commit() {
                    Ok(()) | Err(Error::Closed) => true,
                    Err(e) => panic!("a commit racing close: {e}"),
                }
            })
        };
        f.close().unwrap();
        let wrote = writer.join().unwrap();
        let durable = be.durable_image();
        assert_eq!(
            durable,
            be.live_image(),
            "a write reached the file after close"
        );
        if wrote {
            for p in 0..2 {
                assert_page(&durable, p, 1, "a write accepted before close");
            }
        }
    });
}

/// The version of page `page` in `img` (pages are filled with one tag),
/// `None` if it is missing, torn or no tag of `versions`.
fn version_in(img: &[u8], page: u64, versions: std::ops::RangeInclusive<u64>) -> Option<u64> {
    let at = page as usize * PS;
    let bytes = img.get(at..at + PS)?;
    versions
        .into_iter()
        .find(|&v| bytes.iter().all(|&b| b == tag(page, v)))
}

/// A plain `write_page` of a page racing with another thread's write
/// through of the same page, with a read cache: whichever lands last, a
/// read at the end finds what the disk holds. A plain write that did not
/// wait for the claim could be drained and written before the write
/// through and retired into the read cache after it, so reads would find
/// the version the disk lost.
#[test]
fn a_write_racing_a_write_through_of_its_page_reads_as_the_disk_holds() {
    check(|| {
        let (be, f) = file_with(config(8).read_cache_bytes(4 * PS));
        synced_pages(&f, 1);
        let plain = {
            let (be, f) = (Arc::clone(&be), Arc::clone(&f));
            shuttle::thread::spawn(move || {
                f.write_page(0, &[tag(0, 1); PS]).unwrap();
                f.sync().unwrap();
                let v = version_in(&be.crash_image(3), 0, 1..=2);
                assert!(
                    v.is_some(),
                    "crash image after the plain write's sync: {v:?}"
                );
            })
        };
        f.writer().write_and_commit(0, &[tag(0, 2); PS]).unwrap();
        let v = version_in(&be.crash_image(5), 0, 1..=2);
        assert!(v.is_some(), "crash image after the write through: {v:?}");
        plain.join().unwrap();
        f.sync().unwrap();
        let disk = version_in(&be.durable_image(), 0, 1..=2);
        let read = version_in(&f.read(0, PS).unwrap(), 0, 1..=2);
        assert!(disk.is_some(), "the disk holds no version of page 0");
        assert_eq!(read, disk, "a read finds what the disk holds");
        f.close().unwrap();
    });
}

// ---- scoped commits written from the write buffer (claims) ----

/// Writes version 0 of pages `0..pages` and syncs them.
fn synced_pages(f: &PagedCachedFile, pages: u64) {
    for p in 0..pages {
        f.write_page(p * PS as u64, &[tag(p, 0); PS]).unwrap();
    }
    f.sync().unwrap();
}

/// A thread with its own writer: writes `version` of `page`, then
/// commits it and hands the result to `then`. Returns once the page is
/// written (the commit may not have begun).
fn commit_after_writing(
    f: &Arc<PagedCachedFile>,
    page: u64,
    version: u64,
    then: impl FnOnce(&mut pagewriter::Writer<'_>, pagewriter::Result<()>) + Send + 'static,
) -> shuttle::thread::JoinHandle<()> {
    let (written_tx, written_rx) = shuttle::sync::mpsc::channel();
    let f = Arc::clone(f);
    let t = shuttle::thread::spawn(move || {
        let mut w = f.writer();
        w.write_page(page * PS as u64, &[tag(page, version); PS])
            .unwrap();
        written_tx.send(()).unwrap();
        let r = w.commit();
        then(&mut w, r);
    });
    written_rx.recv().unwrap();
    t
}

/// A writer's buffered page, claimed by its scoped commit (written from
/// the write buffer outside any generation), while another thread's
/// `sync()`, called after the page was written, drains: the sync must
/// wait for that write, so once it says Ok every crash image holds the
/// page. A sync that took a claimed page for written (it is neither dirty
/// nor in flight) would find it missing from some image.
#[test]
fn a_sync_covers_a_page_a_scoped_commit_claimed_from_the_buffer() {
    check(|| {
        let (be, f) = file_with(config(8));
        synced_pages(&f, 3);
        let committer = {
            let be = Arc::clone(&be);
            commit_after_writing(&f, 1, 1, move |_, r| {
                r.unwrap();
                assert_page(&be.crash_image(1), 1, 1, "after the scoped commit");
            })
        };
        f.write_page(2 * PS as u64, &[tag(2, 1); PS]).unwrap();
        f.sync().unwrap();
        let img = be.crash_image(2);
        assert_page(&img, 1, 1, "after a sync called once the page was written");
        assert_page(&img, 2, 1, "after the sync");
        committer.join().unwrap();
        assert!(
            f.stats().claimed_commits >= 1 || f.stats().commits >= 2,
            "the scoped commit ran"
        );
        f.close().unwrap();
    });
}

/// The same race with `commit_dsync` and group rounds: the `sync()` round
/// may go out as one `RWF_DSYNC` write standing in for its `fdatasync`. That write
/// covers only itself, not the scoped commit's write counted beside it
/// (the scoped commit takes no drain lock): once the scoped commit says
/// Ok, its page must be durable, whichever way the round went.
#[test]
fn a_durable_round_write_never_stands_in_for_a_scoped_commits_fdatasync() {
    check(|| {
        let config = config(8)
            .commit_dsync(true)
            .commit_strategy(CommitStrategy::Group)
            .engine(pagewriter::FlushEngine::Vectored);
        let (be, f) = file_with(config);
        synced_pages(&f, 3);
        let committer = {
            let be = Arc::clone(&be);
            commit_after_writing(&f, 1, 1, move |_, r| {
                r.unwrap();
                assert_page(&be.durable_image(), 1, 1, "after the scoped commit");
            })
        };
        f.write_page(2 * PS as u64, &[tag(2, 1); PS]).unwrap();
        f.sync().unwrap();
        assert_page(&be.durable_image(), 2, 1, "after the sync");
        committer.join().unwrap();
        f.close().unwrap();
    });
}

/// Two writers write the same page, one after the other, and commit at
/// once: the first one's commit may claim the second one's version (the
/// newest, buffered) and write it. The second commit must then wait for
/// that write: once it says Ok, every crash image holds its version. A
/// scoped drain that took a page claimed by another commit for written
/// would accept an `fdatasync` begun before the write.
#[test]
fn a_scoped_commit_waits_for_its_page_another_commit_claimed() {
    check(|| {
        let (be, f) = file_with(config(8));
        synced_pages(&f, 1);
        let first = commit_after_writing(&f, 0, 1, |_, r| r.unwrap());
        let mut w = f.writer();
        w.write_page(0, &[tag(0, 2); PS]).unwrap();
        w.commit().unwrap();
        assert_page(&be.crash_image(4), 0, 2, "after the second commit");
        first.join().unwrap();
        assert_page(&be.durable_image(), 0, 2, "newest wins");
        f.close().unwrap();
    });
}

/// A reader of a page whose scoped commit is writing it from the write
/// buffer finds the committed bytes (the claim holds the page), never the
/// older version in the read cache or on disk, and never waits for the
/// write to find them.
#[test]
fn a_read_during_a_commit_from_the_buffer_finds_the_newest_version() {
    check(|| {
        let (be, f) = file_with(config(8).read_cache_bytes(4 * PS));
        synced_pages(&f, 1);
        assert_page(&f.read(0, PS).unwrap(), 0, 0, "cached");
        let mut w = f.writer();
        w.write_page(0, &[tag(0, 1); PS]).unwrap();
        let reader = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                for _ in 0..2 {
                    assert_page(&f.read(0, PS).unwrap(), 0, 1, "a read during the commit");
                }
            })
        };
        w.commit().unwrap();
        reader.join().unwrap();
        assert_page(&be.crash_image(3), 0, 1, "after the commit");
        assert_page(&f.read(0, PS).unwrap(), 0, 1, "a read after the commit");
        assert_eq!(f.stats().claimed_commits, 1, "written from the buffer");
        f.close().unwrap();
    });
}

/// A scoped commit's write from the write buffer fails (EIO) while a
/// `sync()` called after the page was written waits for it: the page goes
/// back to the buffer, the commit reports it, and the sync drains again
/// and writes it (the backend fails one write only), so when the sync
/// says Ok the page is durable. A sync that returned once the claim was
/// gone, without looking for the page put back, would say Ok without it.
#[test]
fn a_sync_writes_a_page_whose_write_from_the_buffer_failed() {
    check(|| {
        let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
        let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config(8)).unwrap());
        synced_pages(&f, 3);
        be.schedule_writes([WriteFault::Errno(libc::EIO)]);
        let committer = {
            let be = Arc::clone(&be);
            commit_after_writing(&f, 1, 1, move |w, r| {
                match r {
                    Ok(()) => {}
                    Err(Error::PagesFailed { .. }) => w.commit().unwrap(),
                    Err(e) => panic!("commit: {e}"),
                }
                assert_page(&be.inner().crash_image(1), 1, 1, "after the commit");
            })
        };
        loop {
            match f.sync() {
                Ok(()) => break,
                Err(Error::PagesFailed { .. }) => {}
                Err(e) => panic!("sync: {e}"),
            }
        }
        assert_page(&be.inner().crash_image(2), 1, 1, "after an Ok sync");
        committer.join().unwrap();
        f.close().unwrap();
    });
}

/// Another thread rewrites a page while a scoped commit writes it from the
/// write buffer, and syncs: the rewrite waits for that write (the claim),
/// so the newer version reaches the disk after the older one, and once
/// the sync says Ok every crash image holds it. A rewrite that went into
/// the buffer at once could be drained and written before the claimed
/// version, which would then land over it.
#[test]
fn a_rewrite_during_a_commit_from_the_buffer_lands_after_it() {
    check(|| {
        let (be, f) = file_with(config(8));
        synced_pages(&f, 1);
        let committer = commit_after_writing(&f, 0, 1, |_, r| r.unwrap());
        f.write_page(0, &[tag(0, 2); PS]).unwrap();
        f.sync().unwrap();
        assert_page(&be.crash_image(5), 0, 2, "after the rewrite's sync");
        committer.join().unwrap();
        assert_page(&be.durable_image(), 0, 2, "newest wins");
        assert_page(&f.read(0, PS).unwrap(), 0, 2, "a read at the end");
        f.close().unwrap();
    });
}

// ---- large writes through a writer (`Writer::write_page`) ----

/// Large writes through, summed over every schedule a check ran.
static LARGE_WRITES_THROUGH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Two writers write two pages each at a time (the threshold set to two
/// pages, so these go straight to disk where nothing else is syncing)
/// and commit them, while a third thread calls `sync()`. Once a commit
/// returns, every crash image holds the writer's pages: its commit waited
/// for an `fdatasync` that began after the write completed. A write that
/// handed its commit a target read before the write would accept an
/// `fdatasync` begun before it, and some image would lack the pages.
#[test]
fn a_large_write_through_is_committed_only_by_an_fdatasync_begun_after_it() {
    check(|| {
        let (be, f) = file_with(config(8).write_through_min_bytes(Some(2 * PS)));
        synced_pages(&f, 8);
        let syncer = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                for _ in 0..2 {
                    f.sync().unwrap();
                }
            })
        };
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let (f, be) = (Arc::clone(&f), Arc::clone(&be));
                shuttle::thread::spawn(move || {
                    let mut w = f.writer();
                    for i in 0..2u64 {
                        let first = t * 4 + i * 2;
                        let bytes: Vec<u8> =
                            (first..first + 2).flat_map(|p| [tag(p, 1); PS]).collect();
                        w.write_page(first * PS as u64, &bytes).unwrap();
                        w.commit().unwrap();
                        let img = be.crash_image(t * 10 + i);
                        for p in first..first + 2 {
                            assert_page(&img, p, 1, "crash image after a large write's commit");
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        syncer.join().unwrap();
        LARGE_WRITES_THROUGH.fetch_add(
            f.stats().through_writes,
            std::sync::atomic::Ordering::Relaxed,
        );
        f.close().unwrap();
    });
    assert!(
        LARGE_WRITES_THROUGH.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no schedule wrote through"
    );
}

/// A large write through racing a reader and a flush of another version:
/// a version buffered first is never overwritten on disk by an older one,
/// a read finds whole versions only, and after the commit every crash
/// image and a read give the committed version.
#[test]
fn a_large_write_through_never_lands_under_an_older_version() {
    check(|| {
        let (be, f) = file_with(config(8).write_through_min_bytes(Some(2 * PS)));
        synced_pages(&f, 2);
        f.write_page(0, &[tag(0, 1); PS]).unwrap();
        let other = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                f.flush().unwrap();
            })
        };
        let reader = {
            let f = Arc::clone(&f);
            shuttle::thread::spawn(move || {
                let page = f.read(PS as u64, PS).unwrap();
                assert!(
                    (0..=2).any(|v| tag(1, v) == page[0]),
                    "a read of page 1 found no version"
                );
                assert!(
                    page.iter().all(|&b| b == page[0]),
                    "a read found a torn page"
                );
            })
        };
        let mut w = f.writer();
        let bytes: Vec<u8> = (0..2u64).flat_map(|p| [tag(p, 2); PS]).collect();
        w.write_page(0, &bytes).unwrap();
        w.commit().unwrap();
        other.join().unwrap();
        reader.join().unwrap();
        LARGE_WRITES_THROUGH_2.fetch_add(
            f.stats().through_writes,
            std::sync::atomic::Ordering::Relaxed,
        );
        for p in 0..2 {
            let read = f.read(p * PS as u64, PS).unwrap();
            assert!(
                read.iter().all(|&b| b == tag(p, 2)),
                "a read of page {p} after the commit"
            );
            assert_page(&be.crash_image(3), p, 2, "crash image after the commit");
        }
        f.close().unwrap();
    });
    assert!(
        LARGE_WRITES_THROUGH_2.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no schedule wrote through"
    );
}

/// Large writes through in the check above, summed over its schedules.
static LARGE_WRITES_THROUGH_2: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
