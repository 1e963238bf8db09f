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
    assert!(matches!(err, Error::Io { op: "open", .. }), "{err}");
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

/// Runs the CLI's bulk flush under `ulimit -f` (SIGXFSZ ignored, as a
/// server would): writes past the limit are short, then EFBIG.
fn flush_under_fsize_limit(engine: &str, direct: &str) -> std::process::Output {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let script = format!(
        "trap '' XFSZ; ulimit -f 2048; exec '{}' flush --size 8MiB --engines {engine} --direct {direct} --repeats 1 --warmup 0 --path '{}'",
        env!("CARGO_BIN_EXE_pagewriter"),
        dir.path().display()
    );
    Command::new("sh").arg("-c").arg(script).output().unwrap()
}

#[test]
fn full_disk_is_a_typed_error_not_a_panic() {
    let mut engines = vec!["per-page", "concat", "vectored"];
    if common::uring_available() {
        engines.push("io-uring");
    }
    for engine in engines {
        for direct in ["off", "auto"] {
            let out = flush_under_fsize_limit(engine, direct);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{engine} {direct}: succeeded past the file size limit"
            );
            assert!(!err.contains("panicked"), "{engine} {direct}: {err}");
            assert!(
                err.contains("File too large") || err.contains("EFBIG"),
                "{engine} {direct}: expected EFBIG, got: {err}"
            );
        }
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
