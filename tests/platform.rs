//! What each platform gives and refuses, on a real file: the calls
//! [`PLATFORM`] names are the ones in force, every setting the platform
//! cannot honour is a typed error naming the platform and the setting when
//! asked for explicitly and a reported fallback under `Auto`, and a commit
//! is durable through the platform's own sync call. Runs on every target
//! (under Wine for the Windows build).

use pagewriter::backend::PLATFORM;
use pagewriter::backend::range_lock::LockScope;
use pagewriter::{Config, DirectIo, Error, FlushEngine, OpenOptions, PagedCachedFile, TornWrites};

const PS: usize = 4096;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

#[test]
fn the_platform_names_its_own_calls() {
    assert_eq!(PLATFORM.os, std::env::consts::OS);
    let want = match PLATFORM.os {
        "linux" => (
            "pwritev",
            "fdatasync",
            Some("O_DIRECT"),
            true,
            LockScope::OpenFileDescription,
        ),
        "macos" => (
            "pwritev",
            "fcntl(F_FULLFSYNC)",
            Some("F_NOCACHE"),
            false,
            LockScope::OpenFileDescription,
        ),
        "freebsd" => (
            "pwritev",
            "fdatasync",
            Some("O_DIRECT"),
            false,
            LockScope::Process,
        ),
        "windows" => (
            "WriteFile per run",
            "FlushFileBuffers",
            Some("FILE_FLAG_NO_BUFFERING"),
            false,
            LockScope::Handle,
        ),
        other => panic!("no expectation written for {other}"),
    };
    assert_eq!(
        (
            PLATFORM.vectored_write,
            PLATFORM.sync,
            PLATFORM.direct_io,
            PLATFORM.atomic_writes,
            PLATFORM.range_locks,
        ),
        want
    );
    assert_eq!(
        PLATFORM.io_uring,
        cfg!(all(target_os = "linux", feature = "io-uring"))
    );
    assert_eq!(
        FlushEngine::Vectored.syscall(),
        PLATFORM.vectored_write,
        "the engine reports the platform's call"
    );
}

#[test]
fn io_uring_asked_for_is_refused_by_name_where_there_is_none_and_auto_says_why() {
    let d = dir();
    let asked = Config::default().engine(FlushEngine::IoUring { queue_depth: 8 });
    let r = PagedCachedFile::open(d.path().join("explicit"), asked);
    if PLATFORM.io_uring {
        // Linux: a ring, or the kernel's refusal (not a platform one).
        if let Err(e) = r {
            assert!(matches!(e, Error::Io { .. }), "{e}");
        }
    } else {
        match r {
            Err(Error::Unsupported {
                setting, platform, ..
            }) => {
                assert_eq!(setting, "FlushEngine::IoUring");
                assert_eq!(platform, std::env::consts::OS);
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
        // Nothing was left half made: the path opens again at once.
        let auto = Config::default().engine(FlushEngine::Auto { queue_depth: 8 });
        let f = PagedCachedFile::open(d.path().join("explicit"), auto).unwrap();
        assert_eq!(f.io_mode().engine, FlushEngine::Vectored);
        let why = f.io_mode().engine_fallback.clone().unwrap();
        assert!(why.contains("io_uring"), "{why}");
        assert!(f.io_mode().to_string().contains(PLATFORM.vectored_write));
    }
}

#[test]
fn atomic_page_writes_are_refused_by_name_where_there_are_none() {
    if PLATFORM.atomic_writes {
        eprintln!("this platform may have atomic writes: tests/torn_writes.rs covers it");
        return;
    }
    let d = dir();
    let path = d.path().join("atomic");
    for direct in [DirectIo::Off, DirectIo::Auto] {
        let cfg = Config::default()
            .torn_writes(TornWrites::Atomic)
            .direct(direct);
        match PagedCachedFile::open(&path, cfg) {
            Err(Error::TornWrites { mode, why }) => {
                assert_eq!(mode, "Atomic");
                assert!(why.contains(PLATFORM.os), "{why}");
            }
            other => panic!("expected TornWrites, got {other:?}"),
        }
    }
    // Auto takes the doublewrite area, and says why.
    let f = PagedCachedFile::open(&path, Config::default().torn_writes(TornWrites::Auto)).unwrap();
    assert_eq!(f.io_mode().torn_writes, TornWrites::DoubleWrite);
    let why = f.io_mode().torn_writes_why.clone().unwrap();
    assert!(why.contains(PLATFORM.os), "{why}");
    f.write_page(0, &vec![3u8; PS]).unwrap();
    f.sync().unwrap();
    f.close().unwrap();
}

#[test]
fn direct_io_is_the_platforms_own_and_io_mode_names_it() {
    let d = dir();
    let path = d.path().join("direct");
    let f = PagedCachedFile::open(&path, Config::default().direct(DirectIo::Auto)).unwrap();
    let mode = f.io_mode().clone();
    let line = mode.to_string();
    match (mode.direct, PLATFORM.direct_io) {
        (Some(a), Some(name)) => {
            assert!(line.contains(name), "{line}");
            assert!(a.offset.is_power_of_two() && a.memory.is_power_of_two());
            // Pages written and read back through the bypass.
            let pages: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i + 1; PS]).collect();
            for (i, p) in pages.iter().enumerate() {
                f.write_page((i * PS) as u64, p).unwrap();
            }
            f.sync().unwrap();
            f.close().unwrap();
            drop(f);
            let back = std::fs::read(&path).unwrap();
            assert_eq!(back, pages.concat());
        }
        (None, _) => {
            let why = mode.direct_fallback.unwrap();
            assert!(!why.is_empty(), "a fallback says why: {line}");
        }
        (Some(_), None) => panic!("direct I/O in force where the platform has none: {line}"),
    }
    // Asked for explicitly where there is none: a typed refusal.
    if PLATFORM.direct_io.is_none() {
        match PagedCachedFile::open(d.path().join("on"), Config::default().direct(DirectIo::On)) {
            Err(Error::Unsupported { setting, .. }) => assert_eq!(setting, "DirectIo::On"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}

#[test]
fn the_whole_file_lock_refuses_a_second_open_and_goes_with_the_first() {
    let d = dir();
    let path = d.path().join("locked");
    let first = PagedCachedFile::open_with(&path, &OpenOptions::new(), Config::default()).unwrap();
    for _ in 0..2 {
        assert!(matches!(
            PagedCachedFile::open_with(&path, &OpenOptions::new(), Config::default()),
            Err(Error::Locked)
        ));
    }
    let ro = OpenOptions::new().read_only(true).create(false);
    assert!(matches!(
        PagedCachedFile::open_with(&path, &ro, Config::default()),
        Err(Error::Locked)
    ));
    first.close().unwrap();
    drop(first);
    PagedCachedFile::open_with(&path, &OpenOptions::new(), Config::default()).unwrap();
}

#[test]
fn a_commit_calls_the_platforms_sync_and_the_bytes_are_in_the_file() {
    let d = dir();
    let path = d.path().join("synced");
    let f = PagedCachedFile::open(&path, Config::default()).unwrap();
    let before = f.stats().syncs;
    for round in 0..4u8 {
        for p in 0..4usize {
            f.write_page((p * PS) as u64, &vec![round * 4 + p as u8; PS])
                .unwrap();
        }
        f.sync().unwrap();
    }
    assert!(f.stats().syncs >= before + 4, "{:?}", f.stats());
    f.close().unwrap();
    drop(f);
    let back = std::fs::read(&path).unwrap();
    let want: Vec<u8> = (0..4u8).flat_map(|p| vec![12 + p; PS]).collect();
    assert_eq!(back, want);
}

/// `StorageBackend::data_len` is where the first hole or unwritten extent
/// begins: the whole of a written file, the written head of one a
/// `set_len` grew, nothing of one `fallocate` reserved (Linux, where
/// `lseek(SEEK_HOLE)` reports unwritten extents as holes); unknown
/// elsewhere.
#[test]
fn data_len_ends_at_the_first_hole_or_unwritten_extent() {
    use pagewriter::{FileBackend, StorageBackend};
    let d = dir();
    let path = d.path().join("dense");
    let be = FileBackend::open(&path).unwrap();
    be.write_all_at(0, &[1u8; 16 * PS]).unwrap();
    be.sync_data().unwrap();
    if PLATFORM.os != "linux" {
        assert_eq!(be.data_len(), None);
        return;
    }
    assert_eq!(be.data_len(), Some(16 * PS as u64));
    be.set_len(64 * PS as u64).unwrap();
    assert_eq!(be.data_len(), Some(16 * PS as u64), "a hole past the head");
    let reserved = FileBackend::open(d.path().join("reserved")).unwrap();
    match reserved.allocate(0, 16 * PS as u64) {
        // tmpfs allocates pages, not unwritten extents.
        Ok(()) if reserved.data_len() == Some(16 * PS as u64) => {
            eprintln!("fallocate allocated data here (tmpfs)")
        }
        Ok(()) => assert_eq!(
            reserved.data_len(),
            Some(0),
            "unwritten extents are no data"
        ),
        Err(e) => eprintln!("fallocate refused here ({e}): the reserved case is not checked"),
    }
}
