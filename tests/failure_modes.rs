//! Failure modes an engine must be able to live with, on a real small file
//! system (a loop-mounted ext4 made for each test; skipped with a printed
//! reason where mounting is refused): sparse preallocation, pages the file
//! system can never hold, and a full disk.

mod common;

use std::io::{self, IoSlice};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{ScratchFs, page, tag_of};
use pagewriter::{
    Config, DirectIo, Error, FileBackend, FlushEngine, PagedCachedFile, StorageBackend,
};

const PS: usize = 4096;
const GIB: u64 = 1 << 30;

/// Engines worth running here: vectored, and io_uring where it works.
fn engines() -> Vec<FlushEngine> {
    let mut v = vec![FlushEngine::Vectored];
    if common::uring_available() {
        v.push(FlushEngine::IoUring { queue_depth: 8 });
    }
    v
}

/// Commits the file system's journal (`sync -f`, syncfs(2)).
fn sync_fs(path: &std::path::Path) {
    let ok = std::process::Command::new("sync")
        .arg("-f")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "sync -f {}", path.display());
}

/// Free bytes including the blocks reserved for root (`stat -f` %f).
fn free_blocks_for_root(path: &std::path::Path) -> u64 {
    stat_free(path, "%f")
}

/// Free bytes available to unprivileged users (`stat -f` %a).
fn free_bytes(path: &std::path::Path) -> u64 {
    stat_free(path, "%a")
}

/// `stat -f` free blocks (`blocks`: a `%a` or `%f` format) times the block
/// size, in bytes.
fn stat_free(path: &std::path::Path, blocks: &str) -> u64 {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", &format!("{blocks} %S")])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut it = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    it.next().unwrap() * it.next().unwrap()
}

#[test]
fn o_direct_preallocates_only_what_is_written() {
    let Some(fs) = ScratchFs::ext4(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), 64) else {
        return;
    };
    for engine in engines() {
        let path = fs.path().join(format!("sparse-{}", engine.name()));
        let cfg = Config::default().engine(engine).direct(DirectIo::On);
        let f = match PagedCachedFile::open(&path, cfg.clone()) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("O_DIRECT refused on the scratch ext4 ({e}): skipped");
                return;
            }
        };
        f.write_page(0, &page(PS, 0, 1)).unwrap();
        f.write_page(GIB, &page(PS, GIB / PS as u64, 1)).unwrap();
        f.sync().unwrap();
        f.close().unwrap();
        drop(f);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), GIB + PS as u64);
        let allocated = meta.blocks() * 512;
        // Two pages, plus at most a few extent-tree blocks.
        assert!(
            allocated <= 6 * PS as u64,
            "{engine:?}: {allocated} bytes allocated"
        );
        assert!(free_bytes(fs.path()) > 32 << 20, "file system left full");
        let f = PagedCachedFile::open(&path, cfg).unwrap();
        assert_eq!(tag_of(&f.read(0, PS).unwrap()), (0, 1));
        assert_eq!(tag_of(&f.read(GIB, PS).unwrap()), (GIB / PS as u64, 1));
        drop(f);
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_page_past_the_largest_file_is_refused_when_written() {
    let Some(fs) = ScratchFs::ext4(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), 64) else {
        return;
    };
    for direct in [DirectIo::Off, DirectIo::Auto] {
        let path = fs.path().join(format!("big-{direct:?}"));
        let cfg = Config::default().direct(direct);
        {
            let f = PagedCachedFile::open(&path, cfg.clone()).unwrap();
            for (off, len) in [(1u64 << 62, PS as u64), (u64::MAX - 8191, PS as u64)] {
                match f.write_all_at(off, &vec![1u8; len as usize]) {
                    Err(Error::FileTooLarge { offset, max, .. }) => {
                        assert_eq!(offset, off);
                        assert!((GIB..1 << 62).contains(&max), "max {max}");
                    }
                    other => panic!("{direct:?}: {other:?}"),
                }
            }
            assert!(matches!(
                f.write_page(1 << 62, &[1; PS]),
                Err(Error::FileTooLarge { .. })
            ));
            assert!(matches!(
                f.set_len(1 << 62),
                Err(Error::FileTooLarge { .. })
            ));
            f.write_page(0, &page(PS, 0, 1)).unwrap();
            f.sync().unwrap();
            assert_eq!(f.len(), PS as u64);
        }
        let f = PagedCachedFile::open(&path, cfg).unwrap();
        assert_eq!(tag_of(&f.read(0, PS).unwrap()), (0, 1));
    }
}

/// A file backend that does not know its file system's largest file, so a
/// page past it reaches the kernel and fails there (EFBIG) at every flush.
/// It also counts the calls made through it (the second field; io_uring
/// writes go to the file itself and are not counted).
#[derive(Debug)]
struct UnknownMax(FileBackend, Arc<Calls>);

#[derive(Debug, Default)]
struct Calls {
    fallocate: AtomicU64,
    pwritev: AtomicU64,
}

impl UnknownMax {
    fn new(be: FileBackend) -> Self {
        Self(be, Arc::default())
    }
}

impl StorageBackend for UnknownMax {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_exact_at(offset, buf)
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.0.write_all_at(offset, buf)
    }
    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        self.1.pwritev.fetch_add(1, Ordering::Relaxed);
        self.0.write_vectored_all_at(offset, bufs)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.1.fallocate.fetch_add(1, Ordering::Relaxed);
        self.0.allocate(offset, len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn dio_align(&self) -> Option<pagewriter::backend::DioAlign> {
        self.0.dio_align()
    }
    fn file(&self) -> Option<&std::fs::File> {
        StorageBackend::file(&self.0)
    }
}

#[test]
fn one_bad_page_does_not_hold_the_others_hostage() {
    let Some(fs) = ScratchFs::ext4(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), 64) else {
        return;
    };
    // At the largest file of this small ext4 (1 KiB blocks: 4 TiB).
    let bad = 1u64 << 42;
    for engine in engines() {
        for direct in [false, true] {
            let path = fs
                .path()
                .join(format!("hostage-{}-{direct}", engine.name()));
            let be = if direct {
                match FileBackend::open_direct(&path) {
                    Ok(b) => b,
                    Err(e) => {
                        eprintln!("O_DIRECT refused ({e}): direct case skipped");
                        continue;
                    }
                }
            } else {
                FileBackend::open(&path).unwrap()
            };
            let f = PagedCachedFile::new(UnknownMax::new(be), Config::default().engine(engine))
                .unwrap();
            f.write_page(bad, &[1u8; PS]).unwrap();
            for p in 0..3u64 {
                f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            }
            let syncs = f.stats().syncs;
            for round in 0..2 {
                match f.sync() {
                    Err(Error::PagesFailed { failed, source, .. }) => {
                        assert_eq!(failed, vec![bad..bad + PS as u64], "{engine:?} {direct}");
                        assert_eq!(source.raw_os_error(), Some(libc::EFBIG), "{source}");
                    }
                    other => panic!("{engine:?} {direct} round {round}: {other:?}"),
                }
                assert!(!f.is_poisoned(), "a write error is not a sync error");
            }
            // The good pages were made durable each time all the same.
            assert_eq!(f.stats().syncs, syncs + 1, "{engine:?} {direct}");
            let on_disk = std::fs::read(&path).unwrap();
            for p in 0..3usize {
                assert_eq!(tag_of(&on_disk[p * PS..]), (p as u64, 1));
            }
            // The engine drops the bad page. Its write grew the length,
            // which a sync must make durable and this file system cannot
            // hold: the engine sets the length back too, and commits
            // succeed again.
            f.discard(bad, PS as u64).unwrap();
            assert_eq!(f.len(), bad + PS as u64);
            match f.sync() {
                Err(e) => assert_eq!(e.io_kind(), Some(io::ErrorKind::FileTooLarge), "{e}"),
                Ok(()) => panic!("{engine:?} {direct}: a length past the largest file synced"),
            }
            f.set_len(3 * PS as u64).unwrap();
            f.write_page(3 * PS as u64, &page(PS, 3, 1)).unwrap();
            f.sync().unwrap();
            f.close().unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() < GIB);
        }
    }
}

#[test]
fn a_full_disk_keeps_pages_dirty_until_space_returns() {
    // (engine, direct, MiB written, runs): 8 MiB goes out as eight runs of
    // `max_write_bytes` (1 MiB); 4 MiB with `max_write_bytes` at 4 MiB as
    // one run (IOV_MAX pages), which a lone committer writes inline with
    // `pwritev` on every engine (io_uring included, `RunWriter::writes_inline`).
    let cases = engines().into_iter().flat_map(|engine| {
        [DirectIo::Off, DirectIo::Auto]
            .into_iter()
            .flat_map(move |direct| [(engine, direct, 8u64, 8u64), (engine, direct, 4, 1)])
    });
    for (engine, direct, mib, runs) in cases {
        let what = format!("{engine:?}, {direct:?}, {mib} MiB in {runs} run(s)");
        // A file system per case: the blocks of a file the case before
        // removed come back late (at the journal's next commit, and after
        // a ring's deferred teardown drops its file), and would make this
        // disk not full any more in the middle of the case.
        let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let Some(fs) = ScratchFs::ext4(tmp, 64) else {
            return;
        };
        let filler = fs.path().join("filler");
        // Free blocks as root sees them (root may use the reserved ones).
        let free = free_blocks_for_root(fs.path());
        // Leave about 2 MiB free, then write `mib` MiB of pages.
        let fill = FileBackend::open(&filler).unwrap();
        let keep = 2u64 << 20;
        fill.allocate(0, free - keep).expect("fallocate filler");
        fill.sync_data().unwrap();
        sync_fs(fs.path());
        let left = free_blocks_for_root(fs.path());
        assert!(
            left < 3 << 20,
            "{what}: {left} bytes still free after the filler"
        );
        let path = fs.path().join("full");
        let cfg = Config::default()
            .engine(engine)
            .direct(direct)
            .max_write_bytes(((mib / runs) << 20) as usize);
        let f = PagedCachedFile::open(&path, cfg).unwrap();
        let pages = (mib << 20) / PS as u64;
        for p in 0..pages {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        let err = match f.sync() {
            Ok(()) => panic!("{what}: synced into {left} free bytes"),
            Err(e) => e,
        };
        assert_eq!(
            err.io_kind(),
            Some(io::ErrorKind::StorageFull),
            "{what}: {err}"
        );
        assert!(matches!(err, Error::PagesFailed { .. }), "{what}: {err}");
        assert!(!f.is_poisoned());
        // Every page still reads back; nothing was lost.
        for p in [0, pages / 2, pages - 1] {
            assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, 1));
        }
        drop(fill);
        std::fs::remove_file(&filler).unwrap();
        // ext4 frees a removed file's blocks at its next journal commit:
        // commit it, or the space may not be back yet.
        sync_fs(filler.parent().expect("filler is in a directory"));
        f.sync().unwrap();
        // Runs that reached the OS, counted over both syncs: each run of
        // the first sync was written whole or is written again whole.
        let written = f.stats().runs;
        if runs == 1 {
            assert_eq!(written, 1, "{what}");
        } else {
            assert!(written >= runs, "{what}: {written} runs written");
        }
        f.close().unwrap();
        drop(f);
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len() as u64, pages * PS as u64);
        for p in 0..pages as usize {
            assert_eq!(
                tag_of(&on_disk[p * PS..]),
                (p as u64, 1),
                "{what}: page {p}"
            );
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn backpressure_is_not_held_hostage_by_a_bad_page() {
    // A write buffer of 8 pages: every few writes must flush to make room.
    // The bad page fails each of those flushes; the writes must go on as
    // long as the flush frees room, and `sync` must name only the bad page.
    let Some(fs) = ScratchFs::ext4(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), 64) else {
        return;
    };
    let bad = 1u64 << 42; // the 4 TiB largest file of this small ext4
    let path = fs.path().join("pressure");
    let be = UnknownMax::new(FileBackend::open(&path).unwrap());
    let f = PagedCachedFile::new(be, Config::default().max_write_buffer_bytes(8 * PS)).unwrap();
    f.write_page(bad, &[1u8; PS]).unwrap();
    for p in 0..64u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    match f.sync() {
        Err(Error::PagesFailed { failed, .. }) => assert_eq!(failed, vec![bad..bad + PS as u64]),
        other => panic!("{other:?}"),
    }
    f.discard(bad, PS as u64).unwrap();
    f.set_len(64 * PS as u64).unwrap();
    f.sync().unwrap();
    f.close().unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk.len(), 64 * PS);
    for p in 0..64usize {
        assert_eq!(tag_of(&on_disk[p * PS..]), (p as u64, 1));
    }
}

#[test]
fn only_writes_in_flight_beside_others_preallocate_under_o_direct() {
    // Growing an O_DIRECT file: a flush whose writes are in flight beside
    // each other (io_uring, writer threads; several runs) reserves the
    // blocks first (parallel writes into one file need them allocated); a
    // writer with one write call at a time lets each write allocate
    // written blocks itself (`preallocate` in src/cached_file/flush.rs).
    // A lone committer's round of one run is one write on every engine:
    // io_uring writes it inline with `pwritev`, no ring, no fallocate.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // (config, preallocates with two runs per commit, with one)
    let mut cases = vec![
        (Config::default(), false, false),
        (Config::default().engine(FlushEngine::Concat), false, false),
        (Config::default().engine(FlushEngine::PerPage), false, false),
        (Config::default().write_threads(2), true, false),
    ];
    if common::uring_available() {
        let ring = Config::default().engine(FlushEngine::IoUring { queue_depth: 8 });
        cases.push((ring, true, false));
    }
    for (i, (cfg, two_runs, one_run)) in cases.into_iter().enumerate() {
        for (runs, preallocates) in [(2u64, two_runs), (1, one_run)] {
            let path = dir.path().join(format!("grow-{i}-{runs}"));
            let be = match FileBackend::open_direct(&path) {
                Ok(b) => UnknownMax::new(b),
                Err(e) => {
                    eprintln!("O_DIRECT refused ({e}): skipped");
                    return;
                }
            };
            let calls = Arc::clone(&be.1);
            let f = PagedCachedFile::new(be, cfg.clone()).unwrap();
            assert!(f.io_mode().direct.is_some(), "{cfg:?}");
            for commit in 0..4u64 {
                // Two runs per flush give writer threads two to spread.
                for r in 0..runs {
                    let p = commit * 40 + r * 20;
                    for q in p..p + 4 {
                        f.write_page(q * PS as u64, &page(PS, q, 1)).unwrap();
                    }
                }
                f.sync().unwrap();
            }
            let fallocates = calls.fallocate.load(Ordering::Relaxed);
            let pwritevs = calls.pwritev.load(Ordering::Relaxed);
            let what = format!(
                "{cfg:?}, {runs} run(s) per commit: {fallocates} fallocate, {pwritevs} pwritev"
            );
            assert_eq!(fallocates > 0, preallocates, "{what}");
            if matches!(cfg.engine, FlushEngine::IoUring { .. }) {
                // The ring's writes bypass the backend; inline ones do not.
                assert_eq!(pwritevs, if runs == 1 { 4 } else { 0 }, "{what}");
            }
            for q in [0u64, 3, 123] {
                assert_eq!(tag_of(&f.read(q * PS as u64, PS).unwrap()), (q, 1));
            }
            if runs == 2 {
                assert_eq!(tag_of(&f.read(143 * PS as u64, PS).unwrap()), (143, 1));
            }
            f.close().unwrap();
        }
    }
}
