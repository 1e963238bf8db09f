//! Model check of the pipelined group commit with shuttle: the real
//! `PagedCachedFile` (its locks and atomics swapped for shuttle's by the
//! `shuttle` feature), run under thousands of randomized schedules.
//!
//! `cargo test --features shuttle --test shuttle_commit` (CI runs it). A
//! failure prints the schedule that reproduces it.
#![cfg(feature = "shuttle")]

use std::sync::Arc;

use pagewriter::testing::{CrashBackend, FaultyBackend, WriteFault};
use pagewriter::{Config, Error, PagedCachedFile};

const PS: usize = 512;

/// 10,000 random and 10,000 PCT schedules (`SHUTTLE_ITERATIONS`
/// overrides).
fn check(body: fn()) {
    pagewriter::testing::shuttle_check(body, 10_000);
}

fn tag(page: u64, version: u64) -> u8 {
    (page * 16 + version) as u8
}

/// Small pages, 2 stripes, and a write buffer of `pages` pages, so that
/// committers' flushes overlap and writers hit backpressure.
fn config(pages: usize) -> Config {
    Config::default()
        .page_size(PS)
        .stripes(2)
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

/// A commit whose write fails puts its pages back in the write buffer. A
/// writer that found the buffer full while those pages were in
/// flight (so its own flush found nothing to write) must notice and flush
/// them itself, not sleep on a wakeup it missed: the model has no
/// timeouts, so a missed one is reported as a deadlock (found by the PCT
/// schedules; the window is a few steps wide).
#[test]
fn a_writer_waiting_for_room_sees_pages_a_failed_commit_put_back() {
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

/// Two committers whose flushes have several runs, one write of which
/// fails: a caller told Ok has every page it wrote before its `sync`
/// durable, even a page that an earlier flush drained and failed to write
/// (it goes back to the write buffer only when that write is done, so a
/// flush that drained meanwhile does not hold it), and after close every
/// page is durable.
#[test]
fn an_ok_sync_covers_pages_an_earlier_flush_failed_to_write() {
    check(|| failed_write_under_concurrent_commits(config(8)));
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
                    // Pages 2 apart: every flush has several runs.
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
        // call always happened, in some commit's flush: its caller was
        // told, even if a later commit succeeded first.
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

/// Three committers rewrite one hot page (and write pages of their own),
/// each writing its flush from its own thread, so one drains the page
/// while an older version of it is still being written: the newer write
/// waits for the older (the backend fails the test if both are in flight
/// at once), an acknowledged version (or a newer one) is what is durable,
/// and the last version written wins.
#[test]
fn flushes_in_flight_never_write_one_page_twice_at_once() {
    check(|| {
        let be = Arc::new(LatchCheck {
            inner: CrashBackend::new(),
            in_flight: std::sync::Mutex::new(Vec::new()),
        });
        let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config(8)).unwrap());
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
        let (_be, f) = file_with(config(8));
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

/// Crash images taken while commits overlap: after a committer's `sync`
/// returned Ok, no image a power cut could leave (the durable image plus
/// any subset of the writes issued since, some torn at 512-byte sectors)
/// holds a page it committed at an older version, the hot page included:
/// an older version of a page is never issued after a newer one, and a
/// commit's `fdatasync` starts only after every write drained before it.
#[test]
fn no_crash_image_loses_an_acknowledged_commit_while_commits_overlap() {
    check(|| no_crash_image_loses_a_commit(config(8)));
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
/// commit running beside it drained first and is still writing: the
/// flush waits for that write instead of returning because it found
/// nothing dirty. (The backend yields halfway through each write, so the
/// flush can run while the commit's write is in flight.)
#[test]
fn a_flush_returns_after_pages_another_commit_drained_reach_the_os() {
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

/// Doublewrite with three committers: each flush stages its pages in the
/// area before writing them in place, after any older flush still writing
/// one of them. After every acknowledged commit, a power cut
/// (crash images of the file and of the area) followed by the recovery
/// pass leaves the hot page at the acknowledged version or a newer one:
/// the area's records hold a page's versions in the order they were
/// written, so replaying them never ends on an older one.
#[test]
fn doublewrite_recovery_never_ends_on_an_older_version() {
    check(|| {
        let be = Arc::new(CrashBackend::new());
        let area = Arc::new(CrashBackend::new());
        let cfg = config(8).torn_writes(pagewriter::TornWrites::DoubleWrite);
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
    /// commit grows the file.
    Written,
    /// An empty file: commits grow it, beside commits of pages other
    /// writers' flushes already covered.
    Empty,
    /// The shared page written and synced, then `set_len` grows the file
    /// over the writers' pages (a hole): every commit's own page lies in
    /// space the grow added.
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
    let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config).unwrap());
    if let Start::Written = start {
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

/// One `fdatasync` at a time: four threads commit (one with `sync()`,
/// three with their own writers), each twice. A commit that finds an
/// `fdatasync` in flight begun before its writes waits for it; when it
/// returns, the waiters it covered go and one of the others issues the
/// next for all of them. Every commit is durable when it returns, and
/// nobody sleeps with no `fdatasync` in flight to wake it (shuttle
/// reports that as a deadlock).
#[test]
fn commits_missing_the_fdatasync_in_flight_share_the_next_and_nobody_sleeps() {
    check(|| {
        let be = Arc::new(CrashBackend::new());
        let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), config(8)).unwrap());
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
        let s = f.stats();
        assert!(s.commits >= 8, "{s:?}");
        f.close().unwrap();
    });
}

/// Scoped commits on a growing file: commits whose pages reach past the
/// file's length on disk grow it, beside commits of writers whose pages
/// another writer's flush already brought inside it. Neither loses an
/// acknowledged page, nor the length it needs.
#[test]
fn scoped_commits_that_grow_the_file_lose_nothing() {
    check(|| scoped_writers_lose_nothing(config(8), Scoped::Commit, Start::Empty));
}

/// Scoped commits into the hole `set_len` made (see `Start::Grown`), beside
/// each other. No acknowledged page is lost.
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

// ---- a scoped commit beside other flushes of its pages ----

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

/// A writer's buffered page, drained and being written by its scoped
/// commit, while another thread's `sync()`, called after the page was
/// written, drains: the sync must wait for that write, so once it says Ok
/// every crash image holds the page. A sync that took a page in flight
/// for written would find it missing from some image.
#[test]
fn a_sync_covers_a_page_a_scoped_commit_is_writing() {
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
        assert!(f.stats().commits >= 3, "the scoped commit ran");
        f.close().unwrap();
    });
}

/// Two writers write the same page, one after the other, and commit at
/// once: the first one's commit may drain the second one's version (the
/// newest, buffered) and write it. The second commit must then wait for
/// that write: once it says Ok, every crash image holds its version. A
/// scoped drain that took a page in flight in another commit for written
/// would accept an `fdatasync` begun before the write.
#[test]
fn a_scoped_commit_waits_for_its_page_another_commit_is_writing() {
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

/// A reader of a page whose scoped commit is writing it finds the
/// committed bytes (in flight), never the older version in the read cache
/// or on disk.
#[test]
fn a_read_during_a_commit_finds_the_newest_version() {
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
        f.close().unwrap();
    });
}

/// A scoped commit's write fails (EIO) while a `sync()` called after the
/// page was written waits for it: the page goes back to the buffer, the
/// commit reports it, and the sync drains again and writes it (the backend
/// fails one write only), so when the sync says Ok the page is durable. A
/// sync that returned once the write was done, without looking for the
/// page put back, would say Ok without it.
#[test]
fn a_sync_writes_a_page_whose_write_in_a_scoped_commit_failed() {
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

/// Another thread rewrites a page while a scoped commit writes it, and
/// syncs: the rewrite's write waits for that one (the write latch), so the
/// newer version reaches the disk after the older one, and once the sync
/// says Ok every crash image holds it.
#[test]
fn a_rewrite_during_a_commit_lands_after_it() {
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
