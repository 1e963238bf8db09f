//! What an engine embedding the page writer relies on: `set_len`, writes
//! and reads at any offset and length, `discard`, open modes and the lock,
//! exclusive guards, and `close`.

mod common;

use std::sync::Arc;

use common::{page, tag_of};
use pagewriter::testing::CrashBackend;
use pagewriter::{
    Config, DirectIo, Error, MemoryBackend, OpenOptions, PagedCachedFile, StorageBackend,
    TornWrites,
};

const PS: usize = 4096;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn crash_file(cfg: Config) -> (Arc<CrashBackend>, PagedCachedFile) {
    let be = Arc::new(CrashBackend::new());
    let f = PagedCachedFile::new(Arc::clone(&be), cfg).unwrap();
    (be, f)
}

// ---- set_len ----

#[test]
fn set_len_shrink_drops_buffered_pages_and_they_are_never_written() {
    for cache in [0, 1 << 20] {
        let (be, f) = crash_file(Config::default().read_cache_bytes(cache));
        for p in 0..8u64 {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        f.sync().unwrap();
        // Pages 6 and 7 rewritten but still buffered, page 9 fresh.
        f.write_page(6 * PS as u64, &page(PS, 6, 2)).unwrap();
        f.write_page(9 * PS as u64, &page(PS, 9, 2)).unwrap();
        assert_eq!(f.len(), 10 * PS as u64);
        f.set_len(4 * PS as u64).unwrap();
        assert_eq!(f.len(), 4 * PS as u64);
        assert!(matches!(
            f.read(4 * PS as u64, PS),
            Err(Error::OutOfBounds { .. })
        ));
        f.sync().unwrap();
        assert_eq!(be.live_image().len(), 4 * PS, "cache {cache}");
        assert_eq!(be.durable_image().len(), 4 * PS, "cache {cache}");
        // Growing again reads zeros, not the dropped or cached pages.
        f.set_len(10 * PS as u64).unwrap();
        assert_eq!(f.len(), 10 * PS as u64);
        for p in 4..10u64 {
            let got = f.read(p * PS as u64, PS).unwrap();
            assert!(got.iter().all(|&b| b == 0), "page {p}, cache {cache}");
        }
        f.sync().unwrap();
        assert_eq!(be.durable_image().len(), 10 * PS);
        assert!(be.durable_image()[4 * PS..].iter().all(|&b| b == 0));
        assert_eq!(f.stats().buffered_bytes, 0);
    }
}

#[test]
fn set_len_alone_is_made_durable_by_the_next_sync() {
    let (be, f) = crash_file(Config::default());
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    f.sync().unwrap();
    let syncs = f.stats().syncs;
    f.set_len(3 * PS as u64).unwrap();
    f.sync().unwrap();
    assert_eq!(
        f.stats().syncs,
        syncs + 1,
        "a length change needs an fdatasync"
    );
    assert_eq!(be.durable_image().len(), 3 * PS);
    f.set_len(100).unwrap();
    f.sync().unwrap();
    assert_eq!(be.durable_image().len(), 100);
    assert_eq!(&be.durable_image()[..], &page(PS, 0, 1)[..100]);
}

#[test]
fn set_len_unaligned_zeroes_the_tail_and_the_file_never_grows_past_it() {
    let d = dir();
    let path = d.path().join("tail");
    let f = PagedCachedFile::open(&path, Config::default()).unwrap();
    f.write_page(0, &[0xAB; PS]).unwrap();
    f.set_len(100).unwrap();
    assert_eq!(f.len(), 100);
    // Grow by a partial write past the cut: bytes 100..200 must be zeros.
    f.write_all_at(300, b"xyz").unwrap();
    assert_eq!(f.len(), 303);
    f.sync().unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 303);
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk[..100].iter().all(|&b| b == 0xAB));
    assert!(on_disk[100..300].iter().all(|&b| b == 0));
    assert_eq!(&on_disk[300..], b"xyz");
    let mut back = [1u8; 303];
    f.read_exact_at(0, &mut back).unwrap();
    assert_eq!(&back[..], &on_disk[..]);
}

#[test]
fn set_len_waits_for_a_round_in_flight_then_cuts() {
    // A flush of pages past the new end that is in flight when set_len is
    // called is written first and cut afterwards: nothing past the end
    // survives on disk, whatever the interleaving.
    for _ in 0..20 {
        let (be, f) = crash_file(Config::default());
        let f = Arc::new(f);
        for p in 0..64u64 {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        let g = Arc::clone(&f);
        let t = std::thread::spawn(move || g.sync());
        f.set_len(8 * PS as u64).unwrap();
        t.join().unwrap().unwrap();
        f.sync().unwrap();
        assert_eq!(be.durable_image().len(), 8 * PS);
        assert_eq!(f.len(), 8 * PS as u64);
    }
}

// ---- write_all_at / read_exact_at ----

#[test]
fn partial_writes_merge_without_reading_buffered_or_cached_pages() {
    let d = dir();
    let path = d.path().join("merge");
    let f = PagedCachedFile::open(&path, Config::default().read_cache_bytes(1 << 20)).unwrap();
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    f.write_all_at(10, b"hello").unwrap(); // buffered: merged in place
    f.sync().unwrap(); // written pages enter the read cache
    f.write_all_at(4000, &[7u8; 200]).unwrap(); // spans pages 0 and 1
    assert_eq!(
        f.stats().disk_reads,
        0,
        "no read for buffered or cached pages"
    );
    f.sync().unwrap();
    let mut want = page(PS, 0, 1);
    want[10..15].copy_from_slice(b"hello");
    want[4000..].fill(7);
    let mut got = vec![0u8; PS + 104];
    f.read_exact_at(0, &mut got).unwrap();
    assert_eq!(&got[..PS], &want[..]);
    assert!(got[PS..].iter().all(|&b| b == 7));
    assert_eq!(f.len(), 4200);
    drop(f);
    // Reopened without a cache: the partial write reads the page once.
    let f = PagedCachedFile::open(&path, Config::default()).unwrap();
    f.write_all_at(20, b"world").unwrap();
    assert_eq!(f.stats().disk_reads, 1);
    f.close().unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[10..15], b"hello");
    assert_eq!(&on_disk[20..25], b"world");
    assert_eq!(on_disk.len(), 4200);
}

#[test]
fn concurrent_partial_writes_to_one_page_lose_nothing() {
    // 8 threads each own 512 bytes of the same two pages and write them in
    // 64-byte pieces while flushes run: a lost read-modify-write shows up
    // as a piece left at an older value.
    for cache in [0, 1 << 20] {
        let d = dir();
        let f = PagedCachedFile::open(
            d.path().join("race"),
            Config::default().read_cache_bytes(cache),
        )
        .unwrap();
        f.write_page(0, &[0u8; 2 * PS]).unwrap();
        f.sync().unwrap();
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let f = &f;
                s.spawn(move || {
                    for round in 1..=20u8 {
                        for piece in 0..16u64 {
                            let at = t as u64 * 1024 + piece * 64;
                            f.write_all_at(at, &[round; 64]).unwrap();
                        }
                        if t == 0 {
                            f.flush().unwrap();
                        }
                    }
                });
            }
        });
        f.sync().unwrap();
        let mut back = vec![0u8; 2 * PS];
        f.read_exact_at(0, &mut back).unwrap();
        for t in 0..8usize {
            assert!(
                back[t * 1024..t * 1024 + 1024].iter().all(|&b| b == 20),
                "thread {t}'s bytes lost (cache {cache})"
            );
        }
    }
}

#[test]
fn read_exact_at_does_one_read_per_stretch_and_copies_buffered_pages() {
    let d = dir();
    let path = d.path().join("stretch");
    {
        let f = PagedCachedFile::open(&path, Config::default()).unwrap();
        for p in 0..16u64 {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        f.close().unwrap();
    }
    let f = PagedCachedFile::open(&path, Config::default()).unwrap();
    // Pages 5 and 11 buffered: disk stretches 0..5, 6..11, 12..16.
    f.write_page(5 * PS as u64, &page(PS, 5, 2)).unwrap();
    f.write_page(11 * PS as u64, &page(PS, 11, 2)).unwrap();
    let mut buf = vec![0u8; 16 * PS - 100];
    f.read_exact_at(50, &mut buf).unwrap();
    assert_eq!(f.stats().disk_reads, 3);
    let mut want = Vec::new();
    for p in 0..16u64 {
        want.extend(page(PS, p, if p == 5 || p == 11 { 2 } else { 1 }));
    }
    assert_eq!(&buf[..], &want[50..16 * PS - 50]);
    // Bounds: the logical length, not the page.
    let mut one = [0u8; 1];
    assert!(matches!(
        f.read_exact_at(16 * PS as u64, &mut one),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        f.read_exact_at(u64::MAX, &mut one),
        Err(Error::Overflow { .. })
    ));
    f.read_exact_at(0, &mut []).unwrap();
}

#[test]
fn read_exact_at_under_o_direct_and_with_a_cache() {
    let d = dir();
    let path = d.path().join("rd");
    let direct = common::direct_available(d.path());
    for (cache, dio) in [
        (1 << 20, DirectIo::Off),
        (0, DirectIo::On),
        (1 << 20, DirectIo::On),
    ] {
        if dio == DirectIo::On && !direct {
            eprintln!("O_DIRECT refused here: direct cases skipped");
            continue;
        }
        let _ = std::fs::remove_file(&path);
        let cfg = Config::default().read_cache_bytes(cache).direct(dio);
        {
            let f = PagedCachedFile::open(&path, cfg.clone()).unwrap();
            for p in 0..8u64 {
                f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            }
            f.close().unwrap();
        }
        let f = PagedCachedFile::open(&path, cfg).unwrap();
        let mut buf = vec![0u8; 3 * PS + 10];
        f.read_exact_at(PS as u64 - 5, &mut buf).unwrap();
        let mut want = Vec::new();
        for p in 0..8u64 {
            want.extend(page(PS, p, 1));
        }
        assert_eq!(&buf[..], &want[PS - 5..4 * PS + 5], "{dio:?} cache {cache}");
        assert_eq!(f.stats().disk_reads, 1, "{dio:?} cache {cache}");
        if cache > 0 {
            // Whole pages read went to the cache: a second read is free.
            f.read_exact_at(PS as u64 - 5, &mut buf).unwrap();
            assert_eq!(f.stats().disk_reads, 1);
        }
    }
}

#[test]
fn write_all_at_bad_input_changes_nothing() {
    let (be, f) = crash_file(Config::default());
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    assert!(matches!(
        f.write_all_at(u64::MAX - 2, &[1, 2, 3, 4]),
        Err(Error::Overflow { .. })
    ));
    f.write_all_at(u64::MAX - 3, &[]).unwrap();
    assert_eq!(f.len(), PS as u64);
    f.sync().unwrap();
    assert_eq!(be.durable_image(), page(PS, 0, 1));
}

// ---- discard ----

#[test]
fn discard_drops_buffered_pages_and_cached_copies() {
    let (be, f) = crash_file(Config::default().read_cache_bytes(1 << 20));
    for p in 0..4u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync().unwrap();
    f.write_page(PS as u64, &page(PS, 1, 2)).unwrap();
    f.write_page(2 * PS as u64, &page(PS, 2, 2)).unwrap();
    f.discard(PS as u64, 2 * PS as u64).unwrap();
    assert_eq!(f.stats().buffered_bytes, 0);
    f.sync().unwrap();
    let img = be.durable_image();
    assert_eq!(
        tag_of(&img[PS..]),
        (1, 1),
        "the discarded write never landed"
    );
    assert_eq!(tag_of(&img[2 * PS..]), (2, 1));
    // Bad input: typed errors, nothing dropped.
    f.write_page(0, &page(PS, 0, 3)).unwrap();
    assert!(matches!(
        f.discard(1, PS as u64),
        Err(Error::Unaligned { .. })
    ));
    assert!(matches!(f.discard(0, 0), Err(Error::ZeroLength)));
    assert!(matches!(
        f.discard(u64::MAX - 4095, 2 * PS as u64),
        Err(Error::Overflow { .. })
    ));
    assert_eq!(f.stats().buffered_bytes, PS as u64);
    // A huge range is fine (visits what is buffered).
    f.discard(0, 1 << 50).unwrap();
    assert_eq!(f.stats().buffered_bytes, 0);
}

// ---- open modes, lock, file ----

#[test]
fn second_writer_is_locked_out_until_the_first_closes() {
    let d = dir();
    let path = d.path().join("locked");
    let a = PagedCachedFile::open(&path, Config::default()).unwrap();
    assert!(matches!(
        PagedCachedFile::open(&path, Config::default()),
        Err(Error::Locked)
    ));
    let ro = OpenOptions::new().read_only(true);
    assert!(matches!(
        PagedCachedFile::open_with(&path, &ro, Config::default()),
        Err(Error::Locked)
    ));
    // Unlocked opens are the caller's choice.
    let unlocked = OpenOptions::new().lock(false);
    PagedCachedFile::open_with(&path, &unlocked, Config::default()).unwrap();
    a.write_page(0, &page(PS, 0, 1)).unwrap();
    a.close().unwrap();
    // Closed releases the lock even before the value is dropped.
    let r1 = PagedCachedFile::open_with(&path, &ro, Config::default()).unwrap();
    let r2 = PagedCachedFile::open_with(&path, &ro, Config::default()).unwrap();
    assert_eq!(tag_of(&r2.read(0, PS).unwrap()), (0, 1));
    assert!(matches!(
        PagedCachedFile::open(&path, Config::default()),
        Err(Error::Locked)
    ));
    drop((r1, r2, a));
    PagedCachedFile::open(&path, Config::default()).unwrap();
}

#[test]
fn read_only_refuses_every_write_and_changes_nothing() {
    let d = dir();
    let path = d.path().join("ro");
    {
        let f = PagedCachedFile::open(&path, Config::default()).unwrap();
        f.write_page(0, &page(PS, 0, 1)).unwrap();
        f.close().unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let ro = OpenOptions::new().read_only(true);
    let f = PagedCachedFile::open_with(&path, &ro, Config::default()).unwrap();
    assert!(f.is_read_only());
    assert!(matches!(
        f.write_page(0, &page(PS, 0, 2)),
        Err(Error::ReadOnly)
    ));
    assert!(matches!(f.write_all_at(5, b"x"), Err(Error::ReadOnly)));
    assert!(matches!(f.write(0, PS), Err(Error::ReadOnly)));
    assert!(matches!(f.set_len(0), Err(Error::ReadOnly)));
    assert!(matches!(f.discard(0, PS as u64), Err(Error::ReadOnly)));
    f.sync().unwrap();
    let mut b = [0u8; 16];
    f.read_exact_at(0, &mut b).unwrap();
    assert_eq!(tag_of(&b), (0, 1));
    f.close().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), before);
    // Read-only never creates.
    let missing = d.path().join("missing-ro");
    let err = PagedCachedFile::open_with(&missing, &ro, Config::default()).unwrap_err();
    assert_eq!(err.io_kind(), Some(std::io::ErrorKind::NotFound));
    assert!(!missing.exists());
}

#[test]
fn must_exist_open_does_not_create_and_the_file_is_reachable() {
    let d = dir();
    let path = d.path().join("must");
    let o = OpenOptions::new().create(false);
    let err = PagedCachedFile::open_with(&path, &o, Config::default()).unwrap_err();
    assert_eq!(err.io_kind(), Some(std::io::ErrorKind::NotFound), "{err}");
    assert!(!path.exists());
    std::fs::write(&path, [0u8; PS]).unwrap();
    let f = PagedCachedFile::open_with(&path, &o, Config::default()).unwrap();
    let file = f.file().expect("a file backend has a file");
    assert_eq!(file.metadata().unwrap().len(), PS as u64);
    let mem = PagedCachedFile::new(MemoryBackend::new(), Config::default()).unwrap();
    assert!(mem.file().is_none());
}

// ---- guards and close ----

#[test]
fn guards_latch_their_pages_and_close_refuses_a_live_one() {
    let (be, f) = crash_file(Config::default());
    let f = Arc::new(f);
    let mut g = f.write(0, 2 * PS).unwrap();
    g[..4].copy_from_slice(b"head");
    // A second guard and a write over the latched pages wait for the drop,
    // then land after it; other pages are free meanwhile.
    let (tx, rx) = std::sync::mpsc::channel();
    let waiters: Vec<_> = [0u8, 1]
        .into_iter()
        .map(|k| {
            let (f, tx) = (Arc::clone(&f), tx.clone());
            std::thread::spawn(move || {
                if k == 0 {
                    let mut g2 = f.write(PS as u64, PS).unwrap();
                    g2[..4].copy_from_slice(b"2nd!");
                } else {
                    f.write_all_at(4, b"!").unwrap();
                }
                tx.send(k).unwrap();
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(rx.try_recv().is_err(), "a write went past a live guard");
    f.write_page(2 * PS as u64, &[2; PS]).unwrap();
    // Structural calls refuse instead of waiting.
    assert!(matches!(
        f.discard(0, PS as u64),
        Err(Error::Busy { offset: 0 })
    ));
    assert!(matches!(f.set_len(PS as u64), Err(Error::Busy { offset }) if offset == PS as u64));
    assert!(matches!(f.close(), Err(Error::Busy { .. })));
    assert_eq!(f.len(), 3 * PS as u64);
    drop(g);
    for w in waiters {
        w.join().unwrap();
    }
    assert_eq!(rx.try_iter().count(), 2);
    // The refused close left the file open and working.
    f.close().unwrap();
    let img = be.durable_image();
    assert_eq!(&img[..5], b"head!");
    assert_eq!(&img[PS..PS + 4], b"2nd!");
    assert!(matches!(f.write_page(0, &[0; PS]), Err(Error::Closed)));
    assert!(matches!(f.write(0, PS), Err(Error::Closed)));
}

#[test]
fn a_failed_guard_read_buffers_nothing() {
    // The page under the guard cannot be read: the guard is not handed
    // out, and dropping it must not write zeros over the page.
    let be = Arc::new(pagewriter::testing::FaultyBackend::new(MemoryBackend::new()));
    be.inner().write_all_at(0, &[9u8; PS]).unwrap();
    // Reads fail once armed (after the open, whose look for a grow-ahead
    // trailer reads the file's tail).
    struct NoRead(
        Arc<pagewriter::testing::FaultyBackend<MemoryBackend>>,
        Arc<std::sync::atomic::AtomicBool>,
    );
    impl std::fmt::Debug for NoRead {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("NoRead")
        }
    }
    impl StorageBackend for NoRead {
        fn len(&self) -> std::io::Result<u64> {
            self.0.len()
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.0.set_len(len)
        }
        fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            if self.1.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            self.0.read_exact_at(offset, buf)
        }
        fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            self.0.write_all_at(offset, buf)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.0.sync_data()
        }
    }
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = PagedCachedFile::new(
        NoRead(Arc::clone(&be), Arc::clone(&armed)),
        Config::default(),
    )
    .unwrap();
    armed.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(f.write(0, PS).is_err());
    assert_eq!(f.stats().buffered_bytes, 0);
    f.close().unwrap();
    assert!(be.inner().contents().iter().all(|&b| b == 9));
}

#[test]
fn close_waits_for_running_writers_and_loses_nothing() {
    // Also with a grow-ahead window: close cuts it off while writers race
    // it, and the file at rest is its length.
    let window = Config::default().grow_ahead(pagewriter::GrowAhead::Window {
        bytes: 16 * PS as u64,
    });
    for cfg in std::iter::repeat_n(Config::default(), 20).chain(std::iter::repeat_n(window, 20)) {
        let windowed = cfg.grow_ahead != pagewriter::GrowAhead::Off;
        let (be, f) = crash_file(cfg);
        let f = Arc::new(f);
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || {
                    let mut done = Vec::new();
                    for i in 0..50u64 {
                        let p = t * 100 + i;
                        match f.write_page(p * PS as u64, &page(PS, p, 1)) {
                            Ok(()) => done.push(p),
                            Err(Error::Closed) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    done
                })
            })
            .collect();
        std::thread::yield_now();
        f.close().unwrap();
        let img = be.durable_image();
        if windowed {
            assert_eq!(img.len() as u64, f.len(), "the window outlived close");
        }
        for w in writers {
            for p in w.join().unwrap() {
                let at = p as usize * PS;
                assert_eq!(
                    tag_of(&img[at..at + PS]),
                    (p, 1),
                    "acknowledged page {p} lost"
                );
            }
        }
    }
}

#[test]
fn lock_wait_takes_a_lock_released_meanwhile() {
    let d = dir();
    let path = d.path().join("wait");
    let a = PagedCachedFile::open(&path, Config::default()).unwrap();
    let started = std::time::Instant::now();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(a);
    });
    let o = OpenOptions::new().lock_wait(std::time::Duration::from_secs(10));
    PagedCachedFile::open_with(&path, &o, Config::default()).unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(100));
    t.join().unwrap();
}

#[test]
fn huge_reads_and_guards_are_typed_errors_not_aborts() {
    let (_be, f) = crash_file(Config::default());
    // A guard larger than the write buffer.
    assert!(matches!(
        f.write(0, usize::MAX & !(PS - 1)),
        Err(Error::InvalidConfig(_) | Error::FileTooLarge { .. } | Error::Overflow { .. })
    ));
    assert!(matches!(f.write(0, 1 << 40), Err(Error::InvalidConfig(_))));
    // Past the end: bounds, before any allocation.
    assert!(matches!(f.read(0, 1 << 40), Err(Error::OutOfBounds { .. })));
    // Inside a 2 TiB sparse file: memory the process cannot get.
    if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "1") {
        eprintln!("vm.overcommit_memory=1 would hand out 1 TiB: the memory case is skipped");
        return;
    }
    let d = dir();
    let f = PagedCachedFile::open(d.path().join("sparse"), Config::default()).unwrap();
    f.set_len(2 << 40).unwrap();
    assert!(matches!(f.read(0, 1 << 40), Err(Error::NoMemory { bytes }) if bytes == 1 << 40));
    f.set_len(0).unwrap();
}

// ---- refresh: following another writer ----

/// Two handles on one file taking turns, as redb's multi-process modes
/// do: after `refresh`, a handle reads what the other wrote and flushed
/// (not its cached copy) and its length follows a grow and a cut; with
/// pages buffered it refuses and changes nothing.
#[test]
fn refresh_follows_another_handles_writes_and_length() {
    for direct in [DirectIo::Off, DirectIo::Auto] {
        let d = dir();
        let path = d.path().join("shared");
        let cfg = Config::default().read_cache_bytes(1 << 20).direct(direct);
        let opts = OpenOptions::new().lock(false);
        let a = PagedCachedFile::open_with(&path, &opts, cfg.clone()).unwrap();
        let b = PagedCachedFile::open_with(&path, &opts, cfg).unwrap();
        for p in 0..4u64 {
            a.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        a.flush().unwrap();
        b.refresh().unwrap();
        assert_eq!(b.len(), 4 * PS as u64);
        // b caches page 1, then a rewrites it and grows the file.
        assert_eq!(tag_of(&b.read(PS as u64, PS).unwrap()), (1, 1));
        a.write_page(PS as u64, &page(PS, 1, 2)).unwrap();
        a.write_page(6 * PS as u64, &page(PS, 6, 2)).unwrap();
        a.flush().unwrap();
        b.refresh().unwrap();
        assert_eq!(b.len(), 7 * PS as u64);
        assert_eq!(tag_of(&b.read(PS as u64, PS).unwrap()), (1, 2));
        assert_eq!(tag_of(&b.read(6 * PS as u64, PS).unwrap()), (6, 2));
        // a cuts the file; b follows.
        a.set_len(2 * PS as u64).unwrap();
        b.refresh().unwrap();
        assert_eq!(b.len(), 2 * PS as u64);
        assert!(matches!(
            b.read(6 * PS as u64, PS),
            Err(Error::OutOfBounds { .. })
        ));
        // Buffered pages: refused, nothing dropped; after a flush, fine.
        b.write_page(3 * PS as u64, &page(PS, 3, 3)).unwrap();
        assert!(matches!(b.refresh(), Err(Error::Buffered { bytes }) if bytes == PS));
        assert_eq!(b.len(), 4 * PS as u64);
        assert_eq!(tag_of(&b.read(3 * PS as u64, PS).unwrap()), (3, 3));
        b.flush().unwrap();
        b.refresh().unwrap();
        assert_eq!(tag_of(&b.read(3 * PS as u64, PS).unwrap()), (3, 3));
        a.refresh().unwrap();
        assert_eq!(a.len(), 4 * PS as u64);
        assert_eq!(tag_of(&a.read(3 * PS as u64, PS).unwrap()), (3, 3));
        b.close().unwrap();
        assert!(matches!(b.refresh(), Err(Error::Closed)));
        a.close().unwrap();
    }
}

// ---- page size on reopen ----

/// The data file keeps no page size: a file written with 4 KiB pages
/// reads the same at 8 KiB pages, and its length need not be a whole
/// number of the new pages. A doublewrite area holding records of 4 KiB
/// pages (a crash may have torn the pages they copy) refuses an open at 8
/// KiB with a typed error naming both sizes and changes nothing; the open
/// at 4 KiB repairs from it as always.
#[test]
fn a_reopen_at_another_page_size_reads_the_same_bytes_and_never_drops_repairs() {
    let d = dir();
    let path = d.path().join("ps");
    let f = PagedCachedFile::open(&path, Config::default()).unwrap();
    for p in 0..3u64 {
        f.write_page(p * 4096, &[p as u8 + 1; 4096]).unwrap();
    }
    f.close().unwrap();
    let big = Config::default().page_size(8192);
    let f = PagedCachedFile::open(&path, big.clone()).unwrap();
    assert_eq!(f.len(), 3 * 4096);
    let mut all = vec![0u8; 3 * 4096];
    f.read_exact_at(0, &mut all).unwrap();
    assert!(
        all.chunks(4096)
            .enumerate()
            .all(|(p, c)| c.iter().all(|&b| b == p as u8 + 1))
    );
    f.close().unwrap();

    // Records of 4 KiB pages left in the area: a drop without close.
    let path = d.path().join("dw");
    let small = Config::default().torn_writes(TornWrites::DoubleWrite);
    let f = PagedCachedFile::open(&path, small.clone()).unwrap();
    f.write_page(0, &[7u8; 4096]).unwrap();
    f.sync().unwrap();
    drop(f);
    let area = d.path().join("dw.dblwr");
    let (file_before, area_before) = (std::fs::read(&path).unwrap(), std::fs::read(&area).unwrap());
    assert!(!area_before.is_empty(), "the area holds the record");
    let refused = PagedCachedFile::open(&path, small.clone().page_size(8192));
    match refused {
        Err(Error::InvalidConfig(m)) => {
            assert!(m.contains("8192") && m.contains("4096"), "{m}")
        }
        other => panic!("an open at 8 KiB over an area of 4 KiB records: {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        file_before,
        "the file changed"
    );
    assert_eq!(
        std::fs::read(&area).unwrap(),
        area_before,
        "the area changed"
    );
    let f = PagedCachedFile::open(&path, small).unwrap();
    assert_eq!(f.recovery().records, 1, "{:?}", f.recovery());
    assert!(f.read(0, 4096).unwrap().iter().all(|&b| b == 7));
    f.close().unwrap();
}
