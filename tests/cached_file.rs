//! Behaviour of PagedCachedFile: the invariants of DESIGN.md, each engine.

mod common;

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::{ENGINES, page, tag_of};
use pagewriter::testing::{CrashBackend, FaultyBackend, WriteFault};
use pagewriter::{Config, Error, FlushEngine, MemoryBackend, PagedCachedFile, StorageBackend};

const PS: usize = 4096;

fn cfg(engine: FlushEngine) -> Config {
    Config::default().engine(engine)
}

/// One backend shared by the file under test (`Arc<B>` is a backend too)
/// and the test, which inspects it afterwards.
fn shared<B: StorageBackend>(b: B) -> (Arc<B>, Arc<B>) {
    let a = Arc::new(b);
    (a.clone(), a)
}

fn disk_page(be: &impl StorageBackend, page_no: u64) -> Vec<u8> {
    let mut buf = vec![0u8; PS];
    be.read_exact_at(page_no * PS as u64, &mut buf).unwrap();
    buf
}

#[test]
fn read_your_writes_from_buffer_cache_and_disk() {
    for engine in ENGINES {
        for cache in [0, 1 << 20] {
            let (be, sh) = shared(MemoryBackend::new());
            let f = PagedCachedFile::new(sh, cfg(engine).read_cache_bytes(cache)).unwrap();
            for p in 0..32u64 {
                f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            }
            // From the write buffer.
            for p in 0..32u64 {
                assert_eq!(f.read(p * PS as u64, PS).unwrap()[..], page(PS, p, 1)[..]);
            }
            f.flush().unwrap();
            // From the read cache (if on) or the backend.
            for p in 0..32u64 {
                assert_eq!(
                    f.read(p * PS as u64, PS).unwrap()[..],
                    page(PS, p, 1)[..],
                    "{engine:?}"
                );
                assert_eq!(disk_page(&*be, p), page(PS, p, 1));
            }
            // Multi-page read assembles pages from different places.
            f.write_page(PS as u64, &page(PS, 1, 2)).unwrap();
            let three = f.read(0, 3 * PS).unwrap();
            assert_eq!(three[..PS], page(PS, 0, 1)[..]);
            assert_eq!(three[PS..2 * PS], page(PS, 1, 2)[..]);
            assert_eq!(three[2 * PS..], page(PS, 2, 1)[..]);
            let s = f.stats();
            if cache > 0 {
                assert!(s.cache_hits >= 32, "{s:?}");
            } else {
                assert_eq!(s.cache_hits, 0);
                assert!(s.disk_reads >= 32);
            }
        }
    }
}

#[test]
fn writable_page_starts_with_current_contents() {
    let f = PagedCachedFile::new(MemoryBackend::new(), Config::default()).unwrap();
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    f.flush().unwrap();
    {
        let mut g = f.write(0, 2 * PS).unwrap();
        assert_eq!(g[..PS], page(PS, 0, 1)[..]);
        assert!(
            g[PS..].iter().all(|&b| b == 0),
            "past the end reads as zeros"
        );
        g[PS..2 * PS].copy_from_slice(&page(PS, 1, 7));
        g[16] ^= 0xff;
    }
    let mut want = page(PS, 0, 1);
    want[16] ^= 0xff;
    assert_eq!(f.read(0, PS).unwrap()[..], want[..]);
    assert_eq!(f.read(PS as u64, PS).unwrap()[..], page(PS, 1, 7)[..]);
    let g = f.overwrite(0, PS).unwrap();
    assert!(g.iter().all(|&b| b == 0), "overwrite starts zeroed");
}

#[test]
fn holes_read_as_zeros_and_reads_past_end_fail() {
    let f = PagedCachedFile::new(MemoryBackend::new(), Config::default()).unwrap();
    f.write_page(5 * PS as u64, &page(PS, 5, 1)).unwrap();
    assert!(f.read(2 * PS as u64, PS).unwrap().iter().all(|&b| b == 0));
    assert!(matches!(
        f.read(6 * PS as u64, PS),
        Err(Error::OutOfBounds { file_len, .. }) if file_len == 6 * PS as u64
    ));
    f.flush().unwrap();
    assert!(f.read(2 * PS as u64, PS).unwrap().iter().all(|&b| b == 0));
    assert_eq!(f.len(), 6 * PS as u64);
}

/// A backend whose writes block while the gate is closed, so a test can
/// act while a flush is in flight.
#[derive(Debug, Default)]
struct GateBackend {
    inner: MemoryBackend,
    closed: Mutex<bool>,
    cv: Condvar,
    entered: AtomicBool,
    /// When set, reads wait at the gate after reading (bytes in hand).
    gate_reads: AtomicBool,
}

impl GateBackend {
    fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }
    fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.cv.notify_all();
    }
    fn wait_gate(&self) {
        self.entered.store(true, Ordering::SeqCst);
        let mut c = self.closed.lock().unwrap();
        while *c {
            c = self.cv.wait(c).unwrap();
        }
    }
}

impl StorageBackend for GateBackend {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact_at(offset, buf)?;
        if self.gate_reads.load(Ordering::SeqCst) {
            self.wait_gate();
        }
        Ok(())
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        if self.gate_reads.load(Ordering::SeqCst) {
            return self.inner.write_all_at(offset, buf);
        }
        self.wait_gate();
        self.inner.write_all_at(offset, buf)
    }
    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        if !self.gate_reads.load(Ordering::SeqCst) {
            self.wait_gate();
        }
        self.inner.write_vectored_all_at(offset, bufs)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Opens the gate when dropped, so a failed assertion cannot leave a
/// thread parked at it (the test fails instead of hanging).
struct OpenOnDrop<'a>(&'a GateBackend);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

#[test]
fn slow_reader_never_caches_bytes_older_than_a_completed_flush() {
    for engine in ENGINES {
        let (be, sh) = shared(GateBackend::default());
        be.inner.write_all_at(0, &page(PS, 0, 1)).unwrap();
        let f = PagedCachedFile::new(sh, cfg(engine).read_cache_bytes(1 << 20)).unwrap();
        be.gate_reads.store(true, Ordering::SeqCst);
        be.close();
        std::thread::scope(|s| {
            let _open = OpenOnDrop(&be);
            // The reader reads version 1 from disk and parks before caching it.
            let reader = s.spawn(|| f.read(0, PS).map(|p| tag_of(&p)));
            while !be.entered.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            f.write_page(0, &page(PS, 0, 2)).unwrap();
            f.flush().unwrap();
            be.open();
            assert_eq!(reader.join().unwrap().unwrap(), (0, 1));
        });
        assert_eq!(
            tag_of(&f.read(0, PS).unwrap()),
            (0, 2),
            "{engine:?}: stale page cached"
        );
    }
}

#[test]
fn newest_wins_when_rewritten_while_in_flight() {
    for engine in ENGINES {
        let (be, sh) = shared(GateBackend::default());
        let f = PagedCachedFile::new(sh, cfg(engine).read_cache_bytes(1 << 20)).unwrap();
        f.write_page(0, &page(PS, 0, 1)).unwrap();
        be.close();
        std::thread::scope(|s| {
            let _open = OpenOnDrop(&be);
            let flusher = s.spawn(|| f.flush());
            while !be.entered.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            // Version 1 is in flight: readable, and a rewrite goes to the buffer.
            assert_eq!(tag_of(&f.read(0, PS).unwrap()), (0, 1));
            f.write_page(0, &page(PS, 0, 2)).unwrap();
            assert_eq!(tag_of(&f.read(0, PS).unwrap()), (0, 2));
            be.open();
            flusher.join().unwrap().unwrap();
        });
        assert_eq!(
            tag_of(&f.read(0, PS).unwrap()),
            (0, 2),
            "{engine:?}: read after first flush"
        );
        assert_eq!(tag_of(&disk_page(&be.inner, 0)), (0, 1));
        f.flush().unwrap();
        assert_eq!(
            tag_of(&disk_page(&be.inner, 0)),
            (0, 2),
            "{engine:?}: newest on disk"
        );
        assert_eq!(tag_of(&f.read(0, PS).unwrap()), (0, 2));
    }
}

#[test]
fn sync_makes_every_earlier_write_durable() {
    for engine in ENGINES {
        let (be, sh) = shared(CrashBackend::new());
        let f = PagedCachedFile::new(sh, cfg(engine)).unwrap();
        for p in 0..10u64 {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        f.flush().unwrap();
        assert!(be.durable_image().is_empty(), "flush alone is not durable");
        f.write_page(20 * PS as u64, &page(PS, 20, 1)).unwrap();
        f.sync().unwrap();
        let crashed = be.crash();
        for p in (0..10u64).chain([20]) {
            assert_eq!(
                disk_page(&crashed, p),
                page(PS, p, 1),
                "{engine:?} page {p}"
            );
        }
        // A write after the sync is not in the durable image.
        f.write_page(0, &page(PS, 0, 2)).unwrap();
        f.flush().unwrap();
        assert_eq!(tag_of(&disk_page(&be.crash(), 0)), (0, 1));
    }
}

/// Slow fdatasync, so concurrent committers pile up behind a round; counts
/// how many syncs overlapped at most.
#[derive(Debug, Default)]
struct SlowSync(
    CrashBackend,
    std::sync::atomic::AtomicUsize,
    std::sync::atomic::AtomicUsize,
);

impl StorageBackend for SlowSync {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_exact_at(offset, buf)
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_all_at(offset, buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let now = self.1.fetch_add(1, Ordering::SeqCst) + 1;
        self.2.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        let r = self.0.sync_data();
        self.1.fetch_sub(1, Ordering::SeqCst);
        r
    }
    fn sync_lanes(&self) -> usize {
        self.0.sync_lanes()
    }
}

/// An `fdatasync` that is held while `hold()` says so (a 30 s deadline
/// turns a hang into a failed assertion), counting the syncs started and
/// the most in flight at once.
struct HeldSync {
    inner: CrashBackend,
    hold: Box<dyn Fn(&HeldSync) -> bool + Send + Sync>,
    started: std::sync::atomic::AtomicUsize,
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for HeldSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldSync").finish_non_exhaustive()
    }
}

impl HeldSync {
    fn new(hold: impl Fn(&HeldSync) -> bool + Send + Sync + 'static) -> Self {
        Self {
            inner: CrashBackend::new(),
            hold: Box::new(hold),
            started: Default::default(),
            in_flight: Default::default(),
            max_in_flight: Default::default(),
        }
    }
}

impl StorageBackend for HeldSync {
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
        self.inner.write_all_at(offset, buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while (self.hold)(self) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = self.inner.sync_data();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        r
    }
    fn sync_lanes(&self) -> usize {
        self.inner.sync_lanes()
    }
}

/// Eight committers share `fdatasync`s, and each is durable when its
/// `sync` returns. Every `fdatasync` is held until all eight have called
/// `sync` once, so whatever the schedule, callers that wrote while one
/// was held all wait for it and share the next.
#[test]
fn concurrent_syncs_share_fdatasyncs_and_each_caller_is_durable() {
    const THREADS: u64 = 8;
    const TXNS: u64 = 20;
    let entered = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&entered);
    let (be, sh) = shared(HeldSync::new(move |_| {
        seen.load(Ordering::SeqCst) < THREADS
    }));
    let config = Config::default();
    let f = PagedCachedFile::new(sh, config).unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (f, be, entered) = (&f, &be, &entered);
            s.spawn(move || {
                for i in 0..TXNS {
                    let p = t * TXNS + i;
                    f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
                    if i == 0 {
                        entered.fetch_add(1, Ordering::SeqCst);
                    }
                    f.sync().unwrap();
                    // This caller's page is durable the moment sync returns.
                    let img = be.inner.durable_image();
                    let at = (p as usize) * PS;
                    assert!(img.len() >= at + PS, "page {p} missing after sync");
                    assert_eq!(img[at..at + PS], page(PS, p, 1)[..]);
                }
            });
        }
    });
    let s = f.stats();
    assert!(
        be.max_in_flight.load(Ordering::SeqCst) <= 4,
        "more syncs at once than sync_lanes"
    );
    assert_eq!(s.commits, THREADS * TXNS);
    // The first fdatasync is held until every thread waits: at least
    // those share the next.
    assert!(
        s.syncs < THREADS * TXNS && s.syncs >= 1,
        "no sharing: {s:?}"
    );
}

/// Rounds pipeline: while one round is in its `fdatasync`, the next drains,
/// writes and starts its own. The first `fdatasync` is held until a second
/// one has started; a second round that waited for the first to finish
/// would never start one, and the wait below ends in a failed assertion.
#[test]
fn a_round_syncs_while_the_next_one_writes_and_syncs() {
    let (be, sh) = shared(HeldSync::new(|b| b.started.load(Ordering::SeqCst) < 2));
    let config = Config::default();
    let f = Arc::new(PagedCachedFile::new(sh, config).unwrap());
    let committer = |p: u64| {
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            f.sync().unwrap();
        })
    };
    let wait_for = |n: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while be.started.load(Ordering::SeqCst) < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        be.started.load(Ordering::SeqCst) >= n
    };
    let first = committer(0);
    assert!(wait_for(1), "the first round never reached its fdatasync");
    let second = committer(1);
    assert!(
        wait_for(2),
        "the second round did not start its fdatasync while the first one was in its own"
    );
    first.join().unwrap();
    second.join().unwrap();
    assert_eq!(
        be.max_in_flight.load(Ordering::SeqCst),
        2,
        "rounds did not overlap"
    );
    let img = be.inner.durable_image();
    assert_eq!(img[..PS], page(PS, 0, 1)[..]);
    assert_eq!(img[PS..2 * PS], page(PS, 1, 1)[..]);
}

#[test]
fn one_write_and_one_sync_per_single_thread_commit() {
    for engine in [FlushEngine::Concat, FlushEngine::Vectored] {
        let f = PagedCachedFile::new(MemoryBackend::new(), cfg(engine)).unwrap();
        for txn in 0..10u64 {
            for p in txn * 16..txn * 16 + 16 {
                f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            }
            f.sync().unwrap();
        }
        let s = f.stats();
        assert_eq!(
            (s.write_calls, s.syncs, s.commits),
            (10, 10, 10),
            "{engine:?}"
        );
        assert_eq!(s.pages_written, 160);
        // Nothing new: no write and no fdatasync.
        f.sync().unwrap();
        assert_eq!(f.stats().syncs, 10);
    }
    let f = PagedCachedFile::new(MemoryBackend::new(), cfg(FlushEngine::PerPage)).unwrap();
    for p in 0..16u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync().unwrap();
    assert_eq!(f.stats().write_calls, 16);
}

#[test]
fn runs_respect_caps() {
    let f = PagedCachedFile::new(
        MemoryBackend::new(),
        Config::default().max_run_pages(4).max_write_bytes(1 << 20),
    )
    .unwrap();
    for p in 0..10u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.flush().unwrap();
    assert_eq!(f.stats().runs, 3);
    let f = PagedCachedFile::new(
        MemoryBackend::new(),
        Config::default().max_write_bytes(2 * PS),
    )
    .unwrap();
    for p in 0..10u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.flush().unwrap();
    assert_eq!(f.stats().runs, 5);
}

#[test]
fn write_buffer_stays_within_bound() {
    const THREADS: usize = 4;
    let max = 16 * PS;
    let f = PagedCachedFile::new(
        MemoryBackend::new(),
        Config::default().max_write_buffer_bytes(max),
    )
    .unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS as u64 {
            let f = &f;
            s.spawn(move || {
                for i in 0..500u64 {
                    let p = t * 1000 + i;
                    f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
                }
            });
        }
    });
    let s = f.stats();
    assert!(s.backpressure_waits > 0, "{s:?}");
    assert!(
        s.peak_buffered_bytes as usize <= max + THREADS * PS,
        "peak {} over bound {} + {} pages",
        s.peak_buffered_bytes,
        max,
        THREADS
    );
    f.flush().unwrap();
    assert_eq!(f.stats().buffered_bytes, 0);
    for t in 0..THREADS as u64 {
        for i in [0u64, 250, 499] {
            let p = t * 1000 + i;
            assert_eq!(f.read(p * PS as u64, PS).unwrap()[..], page(PS, p, 1)[..]);
        }
    }
}

#[test]
fn failed_write_keeps_pages_dirty_and_retry_succeeds() {
    for engine in ENGINES {
        for fault in [
            WriteFault::Errno(libc::EIO),
            WriteFault::Errno(libc::ENOSPC),
            WriteFault::TornThenEio(100),
        ] {
            let (be, sh) = shared(FaultyBackend::new(MemoryBackend::new()));
            let f = PagedCachedFile::new(sh, cfg(engine)).unwrap();
            // Two runs: pages 0..4 and 10..14.
            for p in (0..4u64).chain(10..14) {
                f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            }
            be.schedule_writes([fault]);
            let err = f.sync().unwrap_err();
            assert!(matches!(err, Error::PagesFailed { .. }), "{err}");
            assert!(!f.is_poisoned());
            for p in (0..4u64).chain(10..14) {
                assert_eq!(
                    f.read(p * PS as u64, PS).unwrap()[..],
                    page(PS, p, 1)[..],
                    "{engine:?} {fault:?}"
                );
            }
            // A page rewritten after the failure: the newer version wins.
            f.write_page(PS as u64, &page(PS, 1, 2)).unwrap();
            f.sync().unwrap();
            for p in (0..4u64).chain(10..14) {
                let v = if p == 1 { 2 } else { 1 };
                assert_eq!(
                    disk_page(be.inner(), p),
                    page(PS, p, v),
                    "{engine:?} {fault:?} page {p}"
                );
            }
            assert_eq!(f.stats().buffered_bytes, 0);
        }
    }
}

#[test]
fn failed_fdatasync_poisons_and_keeps_pages_readable() {
    for engine in ENGINES {
        let (be, sh) = shared(FaultyBackend::new(MemoryBackend::new()));
        let f = PagedCachedFile::new(sh, cfg(engine)).unwrap();
        for p in 0..4u64 {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        be.schedule_syncs([Some(libc::EIO)]);
        let err = f.sync().unwrap_err();
        assert_eq!(
            err.io_kind(),
            Some(std::io::Error::from_raw_os_error(libc::EIO).kind())
        );
        assert!(f.is_poisoned());
        assert!(matches!(f.sync(), Err(Error::Poisoned)));
        assert!(matches!(f.flush(), Err(Error::Poisoned)));
        assert!(matches!(
            f.write_page(0, &page(PS, 0, 2)),
            Err(Error::Poisoned)
        ));
        assert!(matches!(f.write(0, PS), Err(Error::Poisoned)));
        assert!(matches!(f.close(), Err(Error::Poisoned)));
        for p in 0..4u64 {
            assert_eq!(f.read(p * PS as u64, PS).unwrap()[..], page(PS, p, 1)[..]);
        }
        assert_eq!(be.sync_calls(), 1, "no retry of a failed fdatasync");
    }
}

#[test]
fn bad_input_is_a_typed_error_and_loses_nothing() {
    let f = PagedCachedFile::new(MemoryBackend::new(), Config::default()).unwrap();
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    assert!(matches!(
        f.write_page(1, &page(PS, 0, 9)),
        Err(Error::Unaligned { .. })
    ));
    assert!(matches!(
        f.write_page(0, &[1u8; 100]),
        Err(Error::Unaligned { .. })
    ));
    assert!(matches!(f.write_page(0, &[]), Err(Error::ZeroLength)));
    assert!(matches!(f.read(0, 0), Err(Error::ZeroLength)));
    assert!(matches!(f.read(100, PS), Err(Error::Unaligned { .. })));
    assert!(matches!(
        f.write(u64::MAX - 4095, 2 * PS),
        Err(Error::Overflow { .. })
    ));
    assert!(matches!(
        f.read(u64::MAX - 4095, 2 * PS),
        Err(Error::Overflow { .. })
    ));
    assert!(matches!(
        f.read(PS as u64, PS),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(f.overwrite(0, 3), Err(Error::Unaligned { .. })));
    assert_eq!(f.read(0, PS).unwrap()[..], page(PS, 0, 1)[..]);
    f.close().unwrap();
    assert!(matches!(f.read(0, PS), Err(Error::Closed)));
    assert!(matches!(
        f.write_page(0, &page(PS, 0, 1)),
        Err(Error::Closed)
    ));
    assert!(matches!(f.flush(), Err(Error::Closed)));
    assert!(matches!(f.sync(), Err(Error::Closed)));
    assert!(matches!(f.close(), Err(Error::Closed)));

    for ps in [0usize, 3, 1000, 4097] {
        let r = PagedCachedFile::new(MemoryBackend::new(), Config::default().page_size(ps));
        assert!(
            matches!(r, Err(Error::InvalidPageSize(n)) if n == ps),
            "{ps}"
        );
    }
    for bad in [
        Config::default().max_write_buffer_bytes(100),
        Config::default().max_run_pages(0),
        Config::default().max_run_pages(1025),
        Config::default().stripes(3),
        Config::default().stripes(0),
        Config::default().max_write_bytes(0),
    ] {
        assert!(matches!(
            PagedCachedFile::new(MemoryBackend::new(), bad),
            Err(Error::InvalidConfig(_))
        ));
    }
}

#[test]
fn real_file_round_trip_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    for engine in ENGINES {
        let _ = std::fs::remove_file(&path);
        {
            let f = PagedCachedFile::open(&path, cfg(engine)).unwrap();
            // Out of order, with a gap, and a multi-page write.
            for p in [7u64, 3, 0, 1, 2, 9] {
                f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            }
            let mut two = page(PS, 4, 1);
            two.extend(page(PS, 5, 1));
            f.write_page(4 * PS as u64, &two).unwrap();
            f.close().unwrap();
        }
        let f = PagedCachedFile::open(&path, cfg(engine)).unwrap();
        assert_eq!(f.len(), 10 * PS as u64);
        for p in [0u64, 1, 2, 3, 4, 5, 7, 9] {
            assert_eq!(
                f.read(p * PS as u64, PS).unwrap()[..],
                page(PS, p, 1)[..],
                "{engine:?} {p}"
            );
        }
        assert!(f.read(6 * PS as u64, PS).unwrap().iter().all(|&b| b == 0));
    }
}

#[test]
fn drop_flushes_to_the_os() {
    let (be, sh) = shared(CrashBackend::new());
    {
        let f = PagedCachedFile::new(sh, Config::default()).unwrap();
        f.write_page(0, &page(PS, 0, 1)).unwrap();
    }
    assert_eq!(be.live_image(), page(PS, 0, 1));
    assert!(be.durable_image().is_empty(), "Drop does not fdatasync");
}

#[test]
fn file_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let err = PagedCachedFile::open(dir.path(), Config::default()).unwrap_err();
    assert!(matches!(err, Error::Open { op: "open", .. }), "{err}");
    // The message names the path the caller gave.
    let shown = dir.path().display().to_string();
    assert!(err.to_string().contains(&shown), "{err}");
    let missing = dir.path().join("missing/x");
    let err = PagedCachedFile::open(&missing, Config::default()).unwrap_err();
    assert_eq!(err.io_kind(), Some(std::io::ErrorKind::NotFound));
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );

    // Truncated by someone else while open: a typed read error, no panic.
    let path = dir.path().join("t");
    let f = PagedCachedFile::open(&path, Config::default()).unwrap();
    for p in 0..4u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(PS as u64)
        .unwrap();
    let err = f.read(3 * PS as u64, PS).unwrap_err();
    assert_eq!(
        err.io_kind(),
        Some(std::io::ErrorKind::UnexpectedEof),
        "{err}"
    );
    assert_eq!(f.read(0, PS).unwrap()[..], page(PS, 0, 1)[..]);
}

#[test]
fn concurrent_readers_never_go_back_in_time() {
    // Writers bump per-page versions; readers check versions never decrease;
    // flushes and syncs race with both. Runs for each engine with the read
    // cache on, the path with the most hand-offs.
    for engine in ENGINES {
        let f = PagedCachedFile::new(
            MemoryBackend::new(),
            cfg(engine)
                .read_cache_bytes(64 * PS)
                .max_write_buffer_bytes(32 * PS)
                .stripes(4),
        )
        .unwrap();
        const PAGES: u64 = 64;
        for p in 0..PAGES {
            f.write_page(p * PS as u64, &page(PS, p, 0)).unwrap();
        }
        let stop = AtomicBool::new(false);
        let versions: Vec<std::sync::atomic::AtomicU64> = (0..PAGES)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..2u64)
                .map(|w| {
                    let (f, versions) = (&f, &versions);
                    s.spawn(move || {
                        for i in 0..3000u64 {
                            // Writer w owns the pages p with p % 2 == w.
                            let p = (i * 7 + w) % PAGES;
                            let p = p - p % 2 + w;
                            let v = versions[p as usize].load(Ordering::SeqCst) + 1;
                            f.write_page(p * PS as u64, &page(PS, p, v)).unwrap();
                            versions[p as usize].store(v, Ordering::SeqCst);
                            if i % 50 == 0 {
                                f.sync().unwrap();
                            }
                        }
                    })
                })
                .collect();
            let readers: Vec<_> = (0..2u64)
                .map(|r| {
                    let (f, versions, stop) = (&f, &versions, &stop);
                    s.spawn(move || {
                        let mut seen = vec![0u64; PAGES as usize];
                        let mut i = r;
                        while !stop.load(Ordering::SeqCst) {
                            let p = i % PAGES;
                            i += 13;
                            let floor = versions[p as usize].load(Ordering::SeqCst);
                            let (tp, v) = tag_of(&f.read(p * PS as u64, PS).unwrap());
                            assert_eq!(tp, p);
                            assert!(
                                v >= seen[p as usize],
                                "page {p} went back from {} to {v}",
                                seen[p as usize]
                            );
                            assert!(v >= floor, "page {p} read {v} after {floor} was written");
                            seen[p as usize] = v;
                        }
                    })
                })
                .collect();
            let flusher = s.spawn(|| {
                for _ in 0..200 {
                    f.flush().unwrap();
                    std::thread::yield_now();
                }
            });
            let writers_ok = writers.into_iter().all(|h| h.join().is_ok());
            stop.store(true, Ordering::SeqCst);
            let readers_ok = readers.into_iter().all(|h| h.join().is_ok());
            assert!(
                writers_ok && readers_ok && flusher.join().is_ok(),
                "{engine:?}: a thread failed"
            );
        });
        f.sync().unwrap();
        for p in 0..PAGES {
            let v = versions[p as usize].load(Ordering::SeqCst);
            assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, v));
        }
    }
}

#[test]
fn a_failed_fdatasync_among_concurrent_rounds_fails_everything_after_it() {
    const THREADS: u64 = 8;
    for lanes in [1usize, 4] {
        for fail_at in [1usize, 3, 7] {
            let (be, sh) = shared(SlowSync::default());
            be.0.schedule_syncs((0..fail_at).map(|i| i + 1 == fail_at));
            let f = PagedCachedFile::new(sh, Config::default()).unwrap();
            let results: Vec<Vec<(u64, bool)>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let f = &f;
                        s.spawn(move || {
                            let mut out = Vec::new();
                            for i in 0..10u64 {
                                let p = t * 100 + i;
                                if f.write_page(p * PS as u64, &page(PS, p, 1)).is_err() {
                                    break;
                                }
                                out.push((p, f.sync().is_ok()));
                            }
                            out
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(f.is_poisoned(), "lanes {lanes} fail_at {fail_at}");
            let img = be.0.durable_image();
            let mut oks = 0;
            for (p, ok) in results.iter().flatten() {
                if *ok {
                    oks += 1;
                    let at = (*p as usize) * PS;
                    assert!(img.len() >= at + PS, "acknowledged page {p} not durable");
                    assert_eq!(
                        img[at..at + PS],
                        page(PS, *p, 1)[..],
                        "acknowledged page {p}"
                    );
                }
                // Every page stays readable, acknowledged or not.
                assert_eq!(f.read(p * PS as u64, PS).unwrap()[..], page(PS, *p, 1)[..]);
            }
            assert!(oks < THREADS * 10, "the failure reached nobody");
            for thread in &results {
                let first_err = thread
                    .iter()
                    .position(|(_, ok)| !ok)
                    .unwrap_or(thread.len());
                assert!(
                    thread[first_err..].iter().all(|(_, ok)| !ok),
                    "a sync succeeded after the file was poisoned: {thread:?}"
                );
            }
            assert!(matches!(f.sync(), Err(Error::Poisoned)));
        }
    }
}

/// The crash backend reports a failed writeback as Linux does with one open
/// file description per sync lane: the failing sync returns the error, and
/// so does the next sync on every other lane, once; the lost writes stay
/// lost.
#[test]
fn crash_backend_reports_a_writeback_error_once_per_lane() {
    let be = CrashBackend::new();
    be.write_all_at(0, &page(PS, 0, 1)).unwrap();
    be.schedule_syncs([true]);
    assert!(be.sync_data_on(0).is_err(), "the failing sync");
    be.write_all_at(PS as u64, &page(PS, 1, 1)).unwrap();
    assert!(be.sync_data_on(1).is_err(), "lane 1 has not seen the error");
    assert!(be.sync_data_on(1).is_ok(), "reported once per lane");
    assert!(be.sync_data_on(0).is_ok(), "lane 0 saw it when it failed");
    let img = be.durable_image();
    // Page 0's write was dropped by the failed sync; page 1's was synced by
    // lane 1's sync, which wrote back before reporting the error.
    assert!(
        img[..PS].iter().all(|&b| b == 0),
        "a dropped write came back"
    );
    assert_eq!(img[PS..2 * PS], page(PS, 1, 1)[..]);
}

/// A file backend opens the sync lanes asked for (one more open file
/// description each) up to `MAX_SYNC_LANES`; every lane syncs the file.
/// Elsewhere than Linux a file has one lane.
#[test]
fn file_backend_opens_sync_lanes_up_to_the_most() {
    use pagewriter::backend::MAX_SYNC_LANES;
    let dir = tempfile::tempdir().unwrap();
    let be = pagewriter::FileBackend::open(dir.path().join("f"))
        .unwrap()
        .with_sync_lanes(4);
    if !cfg!(target_os = "linux") {
        assert_eq!(be.sync_lanes(), 1);
        return;
    }
    assert_eq!(be.sync_lanes(), 4);
    be.write_all_at(0, &page(PS, 0, 1)).unwrap();
    for lane in 0..4 {
        be.sync_data_on(lane).unwrap();
    }
    let err = be.sync_data_on(4).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(be.syscalls().syncs, 4);
    let be = be.with_sync_lanes(MAX_SYNC_LANES + 10);
    assert_eq!(be.sync_lanes(), MAX_SYNC_LANES, "at most MAX_SYNC_LANES");
}

/// A backend whose next write at `offset` panics (once).
#[derive(Debug)]
struct PanicsOnce {
    inner: MemoryBackend,
    offset: u64,
    armed: AtomicBool,
}

impl StorageBackend for PanicsOnce {
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
        self.inner.write_all_at(offset, buf)
    }
    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        if offset == self.offset && self.armed.swap(false, Ordering::SeqCst) {
            panic!("backend panics at {offset}");
        }
        self.inner.write_vectored_all_at(offset, bufs)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
}

/// Every run of a flush is written; a backend that panics in one of them
/// fails that run (its pages stay dirty) instead of leaving the flush
/// waiting, and the next sync writes it.
#[test]
fn a_panicking_write_fails_its_run_and_the_next_sync_writes_it() {
    {
        let (be, sh) = shared(PanicsOnce {
            inner: MemoryBackend::new(),
            offset: 10 * PS as u64,
            armed: AtomicBool::new(true),
        });
        let f = PagedCachedFile::new(sh, cfg(FlushEngine::Vectored)).unwrap();
        // Ten runs of one page each, every other page.
        for p in (0..20u64).step_by(2) {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        assert!(matches!(f.sync(), Err(Error::PagesFailed { .. })));
        assert!(!be.armed.load(Ordering::SeqCst));
        f.sync().unwrap();
        for p in (0..20u64).step_by(2) {
            assert_eq!(disk_page(&be.inner, p), page(PS, p, 1), "page {p}");
        }
        let s = f.stats();
        // Nine runs written, then the failed one; eleven write calls.
        assert_eq!((s.runs, s.write_calls), (10, 11));
    }
}
