//! Grow-ahead on a real file: the file's size runs a window ahead of the
//! data while it is open, the filler writes that window, and the length
//! stays the engine's: after `sync`, after `close`, and after a crash (a
//! copy of the file taken while it is open is what a crash leaves of its
//! synced state), reopened with or without a window, read-write or
//! read-only. Runs on every target.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{page, tag_of};
use pagewriter::{
    Config, Error, GrowAhead, MAX_GROW_WINDOW, OpenOptions, PagedCachedFile, TornWrites,
};

const PS: usize = 4096;
const MIB: u64 = 1 << 20;
/// An error for a scheduled write fault (`EIO` on Linux; any error will do).
const EIO: i32 = 5;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn window(bytes: u64) -> Config {
    Config::default().grow_ahead(GrowAhead::Window { bytes })
}

/// Unlocked: a copy of the file is taken while it is open (Windows locks
/// are mandatory).
fn unlocked() -> OpenOptions {
    OpenOptions::new().lock(false)
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Bytes the file system allocated to the file (`st_blocks * 512`), where
/// the platform says.
fn allocated(path: &Path) -> Option<u64> {
    #[cfg(unix)]
    return Some(std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(path).unwrap()) * 512);
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Waits until the filler has written `bytes` of zeros.
fn wait_for_zeros(f: &PagedCachedFile, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while f.stats().grow_zero_bytes < bytes {
        assert!(
            f.grow_ahead_stopped().is_none() && Instant::now() < deadline,
            "the filler wrote {} of {bytes} B: {:?}",
            f.stats().grow_zero_bytes,
            f.grow_ahead_stopped()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn assert_pages(bytes: &[u8], pages: std::ops::Range<u64>, what: &str) {
    for p in pages {
        assert_eq!(
            tag_of(&bytes[p as usize * PS..]),
            (p, 1),
            "{what}: page {p}"
        );
    }
}

#[test]
fn the_window_runs_ahead_while_open_and_close_leaves_the_length() {
    let d = dir();
    let path = d.path().join("f");
    let f = PagedCachedFile::open(&path, window(MIB)).unwrap();
    assert_eq!(f.io_mode().grow_ahead, Some(MIB));
    for p in 0..10u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync().unwrap();
    assert_eq!(f.len(), 10 * PS as u64);
    assert!(
        size(&path) >= 10 * PS as u64 + MIB,
        "the size runs a window ahead: {}",
        size(&path)
    );
    wait_for_zeros(&f, MIB);
    if let Some(a) = allocated(&path) {
        assert!(a >= MIB, "the window is written blocks: {a} B allocated");
    }
    // Appends into the window: no change of size per commit, one trailer
    // record each.
    let before = f.stats();
    for p in 10..110u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        f.sync().unwrap();
    }
    let s = f.stats();
    let extensions = s.grow_extensions - before.grow_extensions;
    let records = s.grow_records - before.grow_records;
    assert!(extensions <= 1, "{extensions} extensions for 400 KiB");
    assert!(records >= 99, "{records} records for 100 commits");
    assert_eq!(f.len(), 110 * PS as u64);
    f.close().unwrap();
    assert_eq!(size(&path), 110 * PS as u64, "close cuts the window off");
    drop(f);
    let on_disk = std::fs::read(&path).unwrap();
    assert_pages(&on_disk, 0..110, "after close");
    let f = PagedCachedFile::open(&path, Config::default()).unwrap();
    assert_eq!(f.len(), 110 * PS as u64);
}

#[test]
fn a_crash_with_the_window_open_reopens_at_the_synced_length() {
    let d = dir();
    let path = d.path().join("f");
    let f = PagedCachedFile::open_with(&path, &unlocked(), window(MIB)).unwrap();
    for p in 0..5u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync().unwrap();
    // Buffered, never flushed: a crash loses them.
    for p in 5..8u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    wait_for_zeros(&f, MIB / 2);
    let crashed: Vec<_> = ["rw-plain", "rw-window", "ro", "refused"]
        .iter()
        .map(|name| {
            let c = d.path().join(name);
            std::fs::copy(&path, &c).unwrap();
            assert!(size(&c) > 8 * PS as u64, "the copy holds the window");
            c
        })
        .collect();
    drop(f);
    // Reopened without a window: cut to the synced length, made durable.
    let g = PagedCachedFile::open(&crashed[0], Config::default()).unwrap();
    assert_eq!(g.len(), 5 * PS as u64);
    assert_eq!(size(&crashed[0]), 5 * PS as u64);
    assert_pages(&g.read(0, 5 * PS).unwrap(), 0..5, "reopened plain");
    drop(g);
    // Reopened with a window: the same, and it grows on from there.
    let g = PagedCachedFile::open(&crashed[1], window(MIB)).unwrap();
    assert_eq!(g.len(), 5 * PS as u64);
    assert_eq!(size(&crashed[1]), 5 * PS as u64);
    g.write_page(5 * PS as u64, &page(PS, 5, 1)).unwrap();
    g.close().unwrap();
    assert_pages(
        &std::fs::read(&crashed[1]).unwrap(),
        0..6,
        "grown after the crash",
    );
    assert_eq!(size(&crashed[1]), 6 * PS as u64);
    drop(g);
    // An open refused for a bad setting touches nothing: the window and
    // its trailer stay for the next open.
    let before = std::fs::read(&crashed[3]).unwrap();
    let refused = PagedCachedFile::new(
        pagewriter::FileBackend::open(&crashed[3]).unwrap(),
        Config::default().direct(pagewriter::DirectIo::On),
    );
    assert!(
        matches!(refused, Err(Error::InvalidConfig(_))),
        "{refused:?}"
    );
    assert_eq!(
        std::fs::read(&crashed[3]).unwrap(),
        before,
        "the refused open wrote"
    );
    // Read-only: the length from the trailer, the file left as it is.
    let before = size(&crashed[2]);
    let g = PagedCachedFile::open_with(
        &crashed[2],
        &OpenOptions::new().read_only(true),
        Config::default(),
    )
    .unwrap();
    assert_eq!(g.len(), 5 * PS as u64);
    assert_pages(&g.read(0, 5 * PS).unwrap(), 0..5, "read-only");
    assert!(
        g.read(5 * PS as u64, PS).is_err(),
        "nothing past the length"
    );
    assert_eq!(size(&crashed[2]), before, "a read-only open writes nothing");
}

#[test]
fn a_set_len_far_out_writes_only_the_window_and_shrinks_back() {
    let d = dir();
    let path = d.path().join("f");
    let f = PagedCachedFile::open(&path, window(MIB)).unwrap();
    for p in 0..4u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    let far = 1u64 << 40;
    match f.set_len(far) {
        Ok(()) => {}
        // A file system whose files stop short of 1 TiB.
        Err(Error::FileTooLarge { .. }) => {
            eprintln!("skipped the 1 TiB set_len: the file system refuses it");
            return;
        }
        Err(e) => panic!("set_len 1 TiB: {e}"),
    }
    f.sync().unwrap();
    assert_eq!(f.len(), far);
    wait_for_zeros(&f, MIB - 4 * PS as u64);
    // Let the filler settle: it has nothing more to do.
    std::thread::sleep(Duration::from_millis(50));
    let zeros = f.stats().grow_zero_bytes;
    // At most the window past the data (the filler may have started
    // before the pages were drained, from 0).
    assert!(
        zeros <= MIB + 4 * PS as u64,
        "{zeros} B of zeros for a 1 MiB window"
    );
    if let Some(a) = allocated(&path) {
        assert!(a <= 8 * MIB, "sparse beyond the window: {a} B allocated");
    }
    // Back down below the window: the file is cut, its pages kept.
    f.set_len(3 * PS as u64).unwrap();
    f.sync().unwrap();
    f.close().unwrap();
    assert_eq!(size(&path), 3 * PS as u64);
    assert_pages(&std::fs::read(&path).unwrap(), 0..3, "after the shrink");
}

#[test]
fn bad_windows_are_refused_before_the_file_is_touched() {
    let d = dir();
    let path = d.path().join("never");
    let bad = [
        (window(0), "0 bytes"),
        (window(PS as u64 + 1), "not whole pages"),
        (
            window(MAX_GROW_WINDOW + PS as u64),
            "past the largest window",
        ),
        (
            window(MIB).torn_writes(TornWrites::DoubleWrite),
            "beside the doublewrite area",
        ),
    ];
    for (cfg, what) in bad {
        match PagedCachedFile::open(&path, cfg) {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains("grow_ahead"), "{what}: {msg}"),
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
        assert!(!path.exists(), "{what}: the file was created");
    }
}

#[test]
fn appenders_on_many_threads_cross_many_windows_and_lose_nothing() {
    const THREADS: u64 = 4;
    const COMMITS: u64 = 40;
    const TXN: u64 = 4; // pages per commit
    let d = dir();
    let path = d.path().join("f");
    // 64 KiB windows: an extension every 16 pages.
    let f = Arc::new(PagedCachedFile::open(&path, window(64 << 10)).unwrap());
    let next = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            let (f, next) = (Arc::clone(&f), Arc::clone(&next));
            s.spawn(move || {
                for _ in 0..COMMITS {
                    let first = next.fetch_add(TXN, Ordering::Relaxed);
                    for p in first..first + TXN {
                        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
                    }
                    f.sync().unwrap();
                    assert!(f.len() >= (first + TXN) * PS as u64);
                }
            });
        }
    });
    let pages = THREADS * COMMITS * TXN;
    let s = f.stats();
    assert!(s.grow_extensions >= 4, "{} extensions", s.grow_extensions);
    assert_eq!(f.grow_ahead_stopped(), None);
    f.close().unwrap();
    assert_eq!(size(&path), pages * PS as u64);
    assert_pages(&std::fs::read(&path).unwrap(), 0..pages, "after close");
}

#[test]
fn a_set_len_inside_the_window_is_durable_after_sync() {
    let d = dir();
    let path = d.path().join("f");
    let f = PagedCachedFile::open_with(&path, &unlocked(), window(MIB)).unwrap();
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    f.sync().unwrap();
    // No page to write: only the trailer's record carries the new length.
    f.set_len(10 * PS as u64).unwrap();
    f.sync().unwrap();
    let up = d.path().join("up");
    std::fs::copy(&path, &up).unwrap();
    f.set_len(3 * PS as u64).unwrap();
    f.sync().unwrap();
    let down = d.path().join("down");
    std::fs::copy(&path, &down).unwrap();
    drop(f);
    for (copy, want) in [(&up, 10u64), (&down, 3)] {
        let g = PagedCachedFile::open(copy, Config::default()).unwrap();
        assert_eq!(g.len(), want * PS as u64, "{}", copy.display());
        assert_pages(&g.read(0, PS).unwrap(), 0..1, "page 0");
        assert!(g.read(PS as u64, PS).unwrap().iter().all(|&b| b == 0));
    }
}

/// An old trailer whose zeroing fails (the window was extended and made
/// durable, then the write of zeros over the old slots failed) reads as
/// zeros, is zeroed before the next extension moves the trailer again (or
/// before `close` cuts the window off), and is gone from the file at
/// rest. Pages of 512 B, so the old slots (1 KiB) are two whole pages of
/// the data's range.
#[test]
fn an_old_trailer_whose_zeroing_failed_is_never_read_and_is_zeroed_before_the_next_extension() {
    for case in [Then::ExtendAgain, Then::Close, Then::CloseAfterDiscard] {
        a_failed_zeroing(case);
    }
}

/// What follows the failed zeroing in [`a_failed_zeroing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// A third extension, then `close`.
    ExtendAgain,
    /// `close`, with nothing left to write (the failed commit's page
    /// discarded).
    Close,
    /// The extension came from a `sync` of a length with no page to write
    /// (the page past the window discarded), then `close`.
    CloseAfterDiscard,
}

fn a_failed_zeroing(case: Then) {
    let extend_again = case == Then::ExtendAgain;
    use pagewriter::testing::{FaultyBackend, WriteFault};
    use pagewriter::{FileBackend, FlushEngine};
    const P: u64 = 512;
    let d = dir();
    let path = d.path().join("f");
    let backend = Arc::new(FaultyBackend::new(FileBackend::open(&path).unwrap()));
    let cfg = window(8 * P)
        .page_size(P as usize)
        .engine(FlushEngine::PerPage)
        .max_write_buffer_bytes(2 * P as usize)
        .stripes(1);
    let f = PagedCachedFile::new(Arc::clone(&backend), cfg).unwrap();
    let mut w = f.writer();
    w.write_and_commit(11 * P, &[1; 2 * P as usize]).unwrap();
    assert_eq!(f.stats().grow_extensions, 1);
    let old_slots = size(&path) - 2 * P;
    // The next commit reaches past the window: its extension's trailer
    // write passes, the zeroing of the old slots fails.
    let at = old_slots + 4 * P;
    let fail_the_zeroing = || backend.schedule_writes([WriteFault::Pass, WriteFault::Errno(EIO)]);
    let e = if case == Then::CloseAfterDiscard {
        f.write_page(at, &[2; P as usize]).unwrap();
        f.discard(at, P).unwrap();
        fail_the_zeroing();
        f.sync().unwrap_err()
    } else {
        fail_the_zeroing();
        w.write_and_commit(at, &[2; P as usize]).unwrap_err()
    };
    assert!(e.to_string().contains("grow-ahead trailer"), "{e}");
    assert_eq!(f.stats().grow_extensions, 2, "the extension itself passed");
    let zeros = |what: &str| {
        let got = f.read(old_slots, 2 * P as usize).unwrap();
        assert!(
            got.iter().all(|&b| b == 0),
            "{what}: the old slots read {:?}",
            &got[..16]
        );
    };
    zeros("after the failed zeroing");
    let mut end = at + P;
    if case == Then::Close {
        // Nothing left to write: `close` only cuts the window off.
        f.discard(at, P).unwrap();
    } else if case == Then::CloseAfterDiscard {
        // Nothing buffered, nothing to write: the close's commit may find
        // nothing to do.
    } else {
        // Pages past the second window's end: a third extension.
        let far = size(&path) + 2 * P;
        f.write_page(far, &[3; 3 * P as usize]).unwrap();
        f.write_page(0, &[4; P as usize]).unwrap();
        f.sync().unwrap();
        assert_eq!(f.stats().grow_extensions, 3);
        zeros("after the next extension");
        w.write_and_commit(at, &[2; P as usize]).unwrap();
        end = far + 3 * P;
    }
    f.close().unwrap();
    drop(w);
    drop(f);
    let on_disk = std::fs::read(&path).unwrap();
    let what = if extend_again {
        "extended again"
    } else {
        "closed"
    };
    assert_eq!(on_disk.len() as u64, end, "{what}");
    let magic = on_disk.windows(8).position(|x| x == b"PWGROW01");
    assert_eq!(magic, None, "{what}: a trailer left in the file at rest");
    let expect = |from: u64, n: u64, v: u8| {
        let r = from as usize..(from + n) as usize;
        assert!(
            on_disk[r.clone()].iter().all(|&b| b == v),
            "{what}: bytes {r:?} are not {v}"
        );
    };
    expect(11 * P, 2 * P, 1);
    expect(13 * P, at - 13 * P, 0);
    if extend_again {
        expect(0, P, 4);
        expect(P, 10 * P, 0);
        expect(at, P, 2);
        expect(end - 3 * P, 3 * P, 3);
    } else {
        expect(at, P, 0);
    }
}

/// Extensions back to back, with no commit between them (a flush that
/// grows the file past its window twice): the old trailer zeroed after
/// one extension's `fdatasync` must be durably zeroed before the next
/// extension's trailer is written, since that trailer points back one
/// window only. Checked in the crash images of every `fdatasync`: no
/// recovered file holds a trailer record below its length.
#[test]
fn no_power_cut_leaves_an_old_trailer_inside_the_data() {
    use pagewriter::FlushEngine;
    use pagewriter::testing::CrashBackend;
    const P: u64 = 512;
    const SEEDS: u64 = 16;
    let backend = Arc::new(CrashBackend::new().images_at_every_sync(SEEDS));
    let cfg = window(P)
        .page_size(P as usize)
        .engine(FlushEngine::PerPage)
        .stripes(1);
    let f = PagedCachedFile::new(Arc::clone(&backend), cfg).unwrap();
    for i in 0..12u64 {
        // Two windows further out each time: each flush extends.
        f.write_page(3 * i * P, &[1 + i as u8; P as usize]).unwrap();
        f.flush().unwrap();
    }
    f.sync().unwrap();
    f.close().unwrap();
    let images = backend.take_images();
    assert!(images.len() as u64 >= 12 * SEEDS, "{} images", images.len());
    for (i, image) in images.iter().enumerate() {
        let crashed = Arc::new(CrashBackend::from_image(image));
        // Recovery runs at every open, whatever the configuration.
        let f = PagedCachedFile::new(
            Arc::clone(&crashed),
            Config::default().page_size(P as usize),
        )
        .unwrap();
        let len = f.len() as usize;
        drop(f);
        let bytes = crashed.live_image();
        let at = bytes[..len].windows(8).position(|x| x == b"PWGROW01");
        assert_eq!(at, None, "image {i} ({len} B): a trailer inside the data");
    }
}
