//! Torn-page protection on real files: `RWF_ATOMIC` writes on an XFS loop
//! mount (taken, counted, read back, by the pwritev and io_uring engines),
//! refused on ext4 where `Auto` picks the doublewrite area, and the
//! doublewrite recovery repairing a torn page planted by hand, with every
//! kind of bad area reported rather than applied.

mod common;

use std::path::Path;

use pagewriter::testing::{FsKind, ScratchFs};
use pagewriter::{
    Config, DirectIo, Error, FileBackend, FlushEngine, PagedCachedFile, StorageBackend, TornWrites,
};

const PS: usize = 4096;
/// The head of a doublewrite record of four pages: 56-byte header, 16
/// bytes per page in its table.
const RECORD_HEAD: usize = 56 + 4 * 16;

fn page(n: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; PS];
    pagewriter::testing::Rng::new(n * 1_000_003 + version).fill(&mut v);
    v
}

fn engines() -> Vec<FlushEngine> {
    let mut e = vec![FlushEngine::Vectored, FlushEngine::PerPage];
    if pagewriter::testing::uring_available() {
        e.push(FlushEngine::IoUring { queue_depth: 8 });
    } else {
        eprintln!("io_uring unavailable here: the atomic ring path is not run");
    }
    e
}

/// Writes pages in runs of every shape (1, 3, 8, 13 pages, unaligned
/// starts), syncs, and checks the file's bytes.
fn write_runs_and_check(f: &PagedCachedFile, path: &Path, version: u64) {
    let mut want = std::collections::BTreeMap::new();
    for (start, count) in [(0u64, 1u64), (3, 3), (8, 8), (19, 13), (40, 2)] {
        let bytes: Vec<u8> = (start..start + count)
            .flat_map(|p| page(p, version))
            .collect();
        f.write_page(start * PS as u64, &bytes).unwrap();
        for p in start..start + count {
            want.insert(p, page(p, version));
        }
    }
    f.sync().unwrap();
    let on_disk = std::fs::read(path).unwrap();
    for (p, bytes) in want {
        let s = p as usize * PS;
        assert!(on_disk[s..s + PS] == bytes[..], "page {p} on disk");
    }
}

fn atomic_writes_on_xfs() {
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(fs) = scratch(FsKind::Xfs, base.path(), 300) else {
        return;
    };
    let probe = fs.path().join("probe");
    let unit = match FileBackend::open_direct(&probe) {
        Ok(b) => b.atomic_write_unit(),
        Err(e) => {
            eprintln!("skipped: XFS refuses O_DIRECT here ({e})");
            return;
        }
    };
    let Some(unit) = unit else {
        eprintln!("skipped: statx reports no atomic write unit on XFS (kernel before 6.11?)");
        return;
    };
    eprintln!("XFS atomic write unit: {unit:?}");
    assert!(unit.fits(0, PS), "a 4 KiB page fits {unit:?}");
    for engine in engines() {
        for mode in [TornWrites::Atomic, TornWrites::Auto] {
            let path = fs.path().join(format!("{engine:?}-{mode:?}"));
            let cfg = Config::default()
                .engine(engine)
                .direct(DirectIo::On)
                .torn_writes(mode)
                .max_write_bytes(16 * PS);
            let f = PagedCachedFile::open(&path, cfg).unwrap();
            if mode == TornWrites::Auto && (unit.device_max as usize) < PS {
                // Emulated by XFS (no device atomic unit): Auto takes the
                // doublewrite area, and says why.
                assert_eq!(f.io_mode().torn_writes, TornWrites::DoubleWrite);
                let why = f.io_mode().torn_writes_why.clone().unwrap();
                assert!(why.contains("emulate"), "{why}");
                write_runs_and_check(&f, &path, 1);
                assert!(f.stats().doublewrite_records > 0);
                f.close().unwrap();
                continue;
            }
            assert_eq!(
                f.io_mode().torn_writes,
                TornWrites::Atomic,
                "{engine:?} {mode:?}"
            );
            assert!(
                f.io_mode().to_string().contains("atomic"),
                "{}",
                f.io_mode()
            );
            write_runs_and_check(&f, &path, 1);
            write_runs_and_check(&f, &path, 2);
            let st = f.stats();
            // 5 runs cut into aligned power-of-two pieces of at most 16
            // pages: 0 | 3, 4..6 | 8..16 | 19, 20..24, 24..32 | 40..42 =
            // 8 pieces a round.
            assert_eq!(st.atomic_writes, 2 * 8, "{engine:?} {mode:?}: {st:?}");
            assert_eq!(st.pages_written, 2 * 27);
            f.close().unwrap();
            assert!(!dblwr(&path).exists());
        }
        // A page the atomic unit cannot hold is refused at open, before
        // the file is written.
        let big = unit.max as usize * 2;
        let path = fs.path().join(format!("{engine:?}-big"));
        let err = PagedCachedFile::open(
            &path,
            Config::default()
                .engine(engine)
                .direct(DirectIo::On)
                .page_size(big)
                .max_write_buffer_bytes(4 * big)
                .torn_writes(TornWrites::Atomic),
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::TornWrites { mode: "Atomic", why } if why.contains("outside")),
            "{err}"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }
    // Buffered: refused (atomic writes need O_DIRECT).
    let err = PagedCachedFile::open(
        fs.path().join("buffered"),
        Config::default().torn_writes(TornWrites::Atomic),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::TornWrites { why, .. } if why.contains("O_DIRECT")),
        "{err}"
    );
}

fn ext4_refuses_atomic_and_auto_picks_doublewrite() {
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(fs) = scratch(FsKind::Ext4 { block: 4096 }, base.path(), 64) else {
        return;
    };
    let path = fs.path().join("data");
    let err = PagedCachedFile::open(
        &path,
        Config::default()
            .direct(DirectIo::On)
            .torn_writes(TornWrites::Atomic),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::TornWrites { mode: "Atomic", .. }),
        "{err}"
    );
    for engine in engines() {
        let f = PagedCachedFile::open(
            &path,
            Config::default()
                .engine(engine)
                .direct(DirectIo::On)
                .torn_writes(TornWrites::Auto),
        )
        .unwrap();
        let mode = f.io_mode().clone();
        assert_eq!(mode.torn_writes, TornWrites::DoubleWrite);
        assert!(mode.torn_writes_why.is_some(), "{mode}");
        eprintln!("ext4, Auto: {mode}");
        write_runs_and_check(&f, &path, 3);
        let st = f.stats();
        assert_eq!(st.atomic_writes, 0);
        assert!(
            st.doublewrite_records >= 1 && st.doublewrite_syncs >= 1,
            "{st:?}"
        );
        // Header + table + the 27 page images.
        assert!(st.doublewrite_bytes >= 27 * PS as u64, "{st:?}");
        f.close().unwrap();
        let area = std::fs::metadata(format!("{}.dblwr", path.display())).unwrap();
        assert_eq!(area.len(), 0, "a clean close empties the area");
    }
}

/// Writes v1 of pages 0..4, syncs; writes v2 of pages 1 and 2, syncs, and
/// drops the file without `close`. Both commits were durable on the area
/// alone (nothing but staged pages changed the file), so the area keeps
/// both records: v1 of pages 0..4, then v2 of pages 1 and 2.
fn two_versions(path: &Path) {
    let f = PagedCachedFile::open(path, Config::default().torn_writes(TornWrites::DoubleWrite))
        .unwrap();
    let v1: Vec<u8> = (0..4).flat_map(|p| page(p, 1)).collect();
    f.write_page(0, &v1).unwrap();
    f.sync().unwrap();
    let v2: Vec<u8> = (1..3).flat_map(|p| page(p, 2)).collect();
    f.write_page(PS as u64, &v2).unwrap();
    f.sync().unwrap();
    drop(f);
}

/// Half old, half new: the first half of `page(p, 1)` over page `p`.
fn tear(path: &Path, p: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    common::write_at(&file, &page(p, 1)[..PS / 2], p * PS as u64);
}

fn dblwr(path: &Path) -> std::path::PathBuf {
    format!("{}.dblwr", path.display()).into()
}

fn doublewrite_repairs_a_planted_torn_page() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("data");
    two_versions(&path);
    tear(&path, 2);
    let torn = std::fs::read(&path).unwrap();
    assert!(
        torn[2 * PS..3 * PS] != page(2, 2)[..],
        "the plant tore page 2"
    );
    // A read-only open reports the page and repairs nothing.
    let ro = PagedCachedFile::open_with(
        &path,
        &pagewriter::OpenOptions::new().read_only(true),
        Config::default().torn_writes(TornWrites::DoubleWrite),
    )
    .unwrap();
    assert_eq!(ro.recovery().unrepaired, vec![2 * PS as u64]);
    assert!(ro.recovery().repaired.is_empty());
    drop(ro);
    assert_eq!(std::fs::read(&path).unwrap(), torn);
    let f = PagedCachedFile::open(
        &path,
        Config::default().torn_writes(TornWrites::DoubleWrite),
    )
    .unwrap();
    let rec = f.recovery().clone();
    eprintln!("recovery: {rec:?}");
    assert_eq!(rec.records, 2);
    assert_eq!(rec.pages, 6);
    assert_eq!(rec.repaired, vec![2 * PS as u64]);
    assert!(rec.warnings.is_empty(), "{rec:?}");
    for (p, v) in [(0u64, 1u64), (1, 2), (2, 2), (3, 1)] {
        assert!(
            f.read(p * PS as u64, PS).unwrap()[..] == page(p, v)[..],
            "page {p}"
        );
    }
    // Repaired on disk, and the area emptied.
    let disk = std::fs::read(&path).unwrap();
    assert!(disk[2 * PS..3 * PS] == page(2, 2)[..]);
    assert_eq!(std::fs::metadata(dblwr(&path)).unwrap().len(), 0);
    f.close().unwrap();
}

fn bad_doublewrite_areas_are_reported_not_applied() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cfg = || Config::default().torn_writes(TornWrites::DoubleWrite);
    let reopen = |path: &Path| {
        let f = PagedCachedFile::open(path, cfg()).unwrap();
        let rec = f.recovery().clone();
        let p2 = f.read(2 * PS as u64, PS).unwrap().to_vec();
        f.close().unwrap();
        (rec, p2)
    };
    // Bad checksum: one byte of a page image flipped.
    let path = dir.path().join("crc");
    two_versions(&path);
    tear(&path, 2);
    let area = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dblwr(&path))
        .unwrap();
    // Inside the first record's first page image.
    let at = (RECORD_HEAD + 100) as u64;
    let mut b = [0u8; 1];
    common::read_at(&area, &mut b, at);
    common::write_at(&area, &[b[0] ^ 0xFF], at);
    let (rec, p2) = reopen(&path);
    assert_eq!(rec.records, 0);
    assert!(rec.repaired.is_empty());
    assert!(rec.warnings[0].contains("bad checksum"), "{rec:?}");
    assert!(
        p2 != page(2, 2),
        "a record with a bad checksum must not be applied"
    );

    // Truncated: the record cut short.
    let path = dir.path().join("short");
    two_versions(&path);
    tear(&path, 2);
    let area = std::fs::OpenOptions::new()
        .write(true)
        .open(dblwr(&path))
        .unwrap();
    // The first record cut inside its images.
    area.set_len((RECORD_HEAD + 2 * PS - 100) as u64).unwrap();
    let (rec, _) = reopen(&path);
    assert_eq!(rec.records, 0);
    assert!(rec.warnings[0].contains("truncated"), "{rec:?}");

    // Another file's area: copied over this one's.
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    two_versions(&a);
    two_versions(&b);
    tear(&b, 2);
    std::fs::copy(dblwr(&a), dblwr(&b)).unwrap();
    let (rec, p2) = reopen(&b);
    assert_eq!(rec.records, 0);
    assert!(rec.warnings[0].contains("another file"), "{rec:?}");
    assert!(p2 != page(2, 2));

    // Not an area at all.
    let path = dir.path().join("junk");
    two_versions(&path);
    std::fs::write(dblwr(&path), vec![7u8; 100]).unwrap();
    let (rec, _) = reopen(&path);
    assert!(
        rec.warnings[0].contains("not a doublewrite area"),
        "{rec:?}"
    );

    // Missing: nothing to recover, no warning.
    let path = dir.path().join("missing");
    two_versions(&path);
    std::fs::remove_file(dblwr(&path)).unwrap();
    let (rec, _) = reopen(&path);
    assert_eq!(rec, pagewriter::Recovery::default());
}

fn doublewrite_needs_an_area() {
    let err = PagedCachedFile::new(
        pagewriter::MemoryBackend::new(),
        Config::default().torn_writes(TornWrites::DoubleWrite),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TornWrites {
                mode: "DoubleWrite",
                ..
            }
        ),
        "{err}"
    );
    let err = PagedCachedFile::new(
        pagewriter::MemoryBackend::new(),
        Config::default().torn_writes(TornWrites::Auto),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::TornWrites { mode: "Auto", .. }),
        "{err}"
    );
}

/// A shrink empties the area (after syncing the file), so recovery can
/// never write back a page past the cut.
fn set_len_cut_is_not_undone_by_recovery() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("cut");
    let f = PagedCachedFile::open(
        &path,
        Config::default().torn_writes(TornWrites::DoubleWrite),
    )
    .unwrap();
    let v1: Vec<u8> = (0..8).flat_map(|p| page(p, 1)).collect();
    f.write_page(0, &v1).unwrap();
    f.sync().unwrap();
    assert!(std::fs::metadata(dblwr(&path)).unwrap().len() > 0);
    f.set_len(2 * PS as u64).unwrap();
    f.sync().unwrap();
    assert_eq!(std::fs::metadata(dblwr(&path)).unwrap().len(), 0);
    drop(f);
    let f = PagedCachedFile::open(
        &path,
        Config::default().torn_writes(TornWrites::DoubleWrite),
    )
    .unwrap();
    assert_eq!(f.len(), 2 * PS as u64);
    assert!(f.recovery().repaired.is_empty());
}

/// What a power cut now leaves of `data` and `area`, after the recovery
/// pass: (file bytes, recovery report).
fn recovered(
    data: &pagewriter::testing::CrashBackend,
    area: &pagewriter::testing::CrashBackend,
) -> (Vec<u8>, pagewriter::Recovery) {
    use pagewriter::testing::CrashBackend;
    use std::sync::Arc;
    let d = Arc::new(CrashBackend::from_image(&data.durable_image()));
    let a = Arc::new(CrashBackend::from_image(&area.durable_image()));
    let f = PagedCachedFile::with_doublewrite(
        Arc::clone(&d),
        a,
        Config::default().torn_writes(TornWrites::DoubleWrite),
    )
    .unwrap();
    let rec = f.recovery().clone();
    drop(f);
    (d.live_image(), rec)
}

/// A commit whose changes are all in durable doublewrite records is
/// acknowledged without an `fdatasync` of the file (the pages survive a
/// power cut through recovery); one that also changed what no record
/// holds (a `set_len` that grows the file) syncs the file, so the length
/// survives too. A clean close syncs the file and empties the area.
fn commits_durable_on_the_area_alone_until_a_change_no_record_holds() {
    use pagewriter::testing::CrashBackend;
    use std::sync::Arc;
    let data = Arc::new(CrashBackend::new());
    let area = Arc::new(CrashBackend::new());
    let f = PagedCachedFile::with_doublewrite(
        Arc::clone(&data),
        Arc::clone(&area) as _,
        Config::default().torn_writes(TornWrites::DoubleWrite),
    )
    .unwrap();
    let v1: Vec<u8> = (0..4).flat_map(|p| page(p, 1)).collect();
    f.write_page(0, &v1).unwrap();
    f.sync().unwrap();
    assert_eq!(f.stats().syncs, 0, "durable on the area alone");
    assert_eq!(f.stats().doublewrite_syncs, 1);
    assert!(data.durable_image().is_empty(), "nothing synced in place");
    let (img, rec) = recovered(&data, &area);
    assert_eq!(img, v1, "recovery brings the commit back: {rec:?}");
    // A length no record holds: the file is synced.
    f.set_len(16 * PS as u64).unwrap();
    f.sync().unwrap();
    assert_eq!(f.stats().syncs, 1);
    let (img, _) = recovered(&data, &area);
    assert_eq!(img.len(), 16 * PS);
    assert_eq!(&img[..4 * PS], &v1[..]);
    // And pages again on the area alone.
    f.write_page(5 * PS as u64, &page(5, 2)).unwrap();
    f.sync().unwrap();
    assert_eq!(f.stats().syncs, 1);
    let (img, _) = recovered(&data, &area);
    assert_eq!(&img[5 * PS..6 * PS], &page(5, 2)[..]);
    assert_eq!(img.len(), 16 * PS);
    f.close().unwrap();
    assert_eq!(f.stats().syncs, 2, "close syncs the file");
    assert!(area.durable_image().is_empty(), "and empties the area");
    assert_eq!(&data.durable_image()[5 * PS..6 * PS], &page(5, 2)[..]);
}

/// A file system of `kind` in `base`, or `None` (said on stderr) where it
/// cannot be made; a panic with `PAGEWRITER_REQUIRE_FS` set. (The harness
/// already reports the tests ignored where `FsKind::missing` says so.)
fn scratch(kind: FsKind, base: &Path, mib: u64) -> Option<ScratchFs> {
    let fs = ScratchFs::new(kind, base, mib);
    if fs.is_none() && std::env::var_os("PAGEWRITER_REQUIRE_FS").is_some() {
        panic!(
            "{}: could not be made or mounted, and PAGEWRITER_REQUIRE_FS is set",
            kind.name()
        );
    }
    fs
}

/// The tests, the two on a file system made for them reported as ignored
/// where it cannot be made here (a libtest-mimic harness).
fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    common::print_fs_reasons(&[FsKind::Xfs, FsKind::Ext4 { block: 4096 }]);
    let trials = vec![
        common::fs_trial(
            "atomic_writes_on_xfs".into(),
            FsKind::Xfs,
            atomic_writes_on_xfs,
        ),
        common::fs_trial(
            "ext4_refuses_atomic_and_auto_picks_doublewrite".into(),
            FsKind::Ext4 { block: 4096 },
            ext4_refuses_atomic_and_auto_picks_doublewrite,
        ),
        common::trial(
            "doublewrite_repairs_a_planted_torn_page",
            doublewrite_repairs_a_planted_torn_page,
        ),
        common::trial(
            "bad_doublewrite_areas_are_reported_not_applied",
            bad_doublewrite_areas_are_reported_not_applied,
        ),
        common::trial("doublewrite_needs_an_area", doublewrite_needs_an_area),
        common::trial(
            "set_len_cut_is_not_undone_by_recovery",
            set_len_cut_is_not_undone_by_recovery,
        ),
        common::trial(
            "commits_durable_on_the_area_alone_until_a_change_no_record_holds",
            commits_durable_on_the_area_alone_until_a_change_no_record_holds,
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
