//! Bad input on the real file backend: an immutable (read-only) file, a
//! read-only descriptor, and a full disk (RLIMIT_FSIZE). Each is a typed
//! error, no panic, and nothing acknowledged is lost.

mod common;

use std::process::Command;

use common::{page, tag_of};
use pagewriter::{Config, Error, FileBackend, FlushEngine, PagedCachedFile};

const PS: usize = 4096;

#[test]
fn immutable_file_is_a_typed_open_error() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("ro");
    std::fs::write(&path, vec![0u8; PS]).unwrap();
    // As root, permission bits do not stop a writer; the immutable flag does.
    let ok = Command::new("chattr")
        .arg("+i")
        .arg(&path)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("chattr +i unavailable here: immutable-file case skipped");
        return;
    }
    let r = PagedCachedFile::open(&path, Config::default());
    let _ = Command::new("chattr").arg("-i").arg(&path).status();
    let err = r.unwrap_err();
    assert!(matches!(err, Error::Open { op: "open", .. }), "{err}");
    assert_eq!(
        err.io_kind(),
        Some(std::io::ErrorKind::PermissionDenied),
        "{err}"
    );
}

#[test]
fn read_only_descriptor_fails_writes_and_keeps_pages() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("rofd");
    std::fs::write(&path, b"").unwrap();
    for engine in common::file_engines() {
        let file = std::fs::File::open(&path).unwrap();
        let f = PagedCachedFile::new(
            FileBackend::from_file(file),
            Config::default().engine(engine),
        )
        .unwrap();
        for p in 0..4u64 {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        let err = f.sync().unwrap_err();
        // Every page failed (EBADF), and the error names them all.
        match &err {
            Error::PagesFailed { failed, .. } => {
                assert_eq!(
                    (failed.len(), &failed[0]),
                    (1, &(0..4 * PS as u64)),
                    "{engine:?}"
                )
            }
            other => panic!("{engine:?}: {other}"),
        }
        for p in 0..4u64 {
            assert_eq!(
                tag_of(&f.read(p * PS as u64, PS).unwrap()),
                (p, 1),
                "{engine:?}"
            );
        }
        assert!(!f.is_poisoned(), "a write error is not a sync error");
    }
}

#[test]
fn full_disk_keeps_pages_dirty_for_a_retry() {
    // In-process: a file backend on a descriptor whose writes fail like a
    // full disk would (ENOSPC injected), then space "comes back".
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("full");
    for engine in common::file_engines() {
        let _ = std::fs::remove_file(&path);
        let be = std::sync::Arc::new(pagewriter::testing::FaultyBackend::new(
            FileBackend::open(&path).unwrap(),
        ));
        be.schedule_writes([pagewriter::testing::WriteFault::Errno(libc::ENOSPC); 3]);
        let f = PagedCachedFile::new(be.clone(), Config::default().engine(engine)).unwrap();
        for p in 0..8u64 {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        let mut errors = 0;
        while f.sync().is_err() {
            errors += 1;
            assert!(errors < 10, "{engine:?}: never recovered");
        }
        assert!(errors >= 1, "{engine:?}: the fault never hit");
        drop(f);
        let f =
            PagedCachedFile::open(&path, Config::default().engine(FlushEngine::Vectored)).unwrap();
        for p in 0..8u64 {
            assert_eq!(
                tag_of(&f.read(p * PS as u64, PS).unwrap()),
                (p, 1),
                "{engine:?}"
            );
        }
    }
}
