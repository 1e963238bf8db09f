//! Failure modes an engine must be able to live with, on every Linux file
//! system an engine runs on: ext4 with 4 KiB and 1 KiB blocks, XFS, btrfs
//! and tmpfs, each a small file system made for the test (a loop mount, or
//! a tmpfs mount; reported as ignored, with the reason printed, where this
//! machine cannot make it (not root, no mkfs, no loop devices), and run
//! regardless, to fail, with `PAGEWRITER_REQUIRE_FS=1`, as CI sets where it
//! installed the tools). A libtest-mimic harness (`harness = false`), so a
//! test that cannot run says so in its outcome.
//!
//! Per file system: the `O_DIRECT` decision and alignment as `io_mode()`
//! reports them, sparse `O_DIRECT` writes allocating only what is written,
//! the largest file taken and a page past it refused, one bad page among
//! good ones, backpressure past a bad page, a full disk then retry (every
//! acknowledged sync intact after the engine gives up and reopens with its
//! own options), the same with eight committers and overlapping rounds,
//! the 8-thread engine-API stress with close and reopen, and asynchronous
//! commits (writers keeping tickets in flight) into a full disk.

mod common;
#[path = "common/stress.rs"]
mod stress;

use std::io::{self, IoSlice};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{page, tag_of};
use pagewriter::testing::{FsKind, ScratchFs};
use pagewriter::{
    Config, DirectIo, Error, FileBackend, FlushEngine, GrowAhead, PagedCachedFile, StorageBackend,
    TornWrites,
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

/// A fresh file system of `kind` (`mib` MiB, or its minimum), or `None`
/// with the reason printed; with `PAGEWRITER_REQUIRE_FS` set, a panic.
fn scratch(kind: FsKind, mib: u64) -> Option<ScratchFs> {
    let fs = ScratchFs::new(kind, Path::new(env!("CARGO_TARGET_TMPDIR")), mib);
    if fs.is_none() && std::env::var_os("PAGEWRITER_REQUIRE_FS").is_some() {
        panic!(
            "{}: could not be made or mounted, and PAGEWRITER_REQUIRE_FS is set",
            kind.name()
        );
    }
    fs
}

/// `DirectIo::On` where the file system takes `O_DIRECT` for 4 KiB pages
/// (probed in `dir`), else `Off`.
fn direct_mode(dir: &Path) -> DirectIo {
    let probe = dir.join("direct-mode-probe");
    let mode = match PagedCachedFile::open(&probe, Config::default().direct(DirectIo::Auto)) {
        Ok(f) if f.io_mode().direct.is_some() => DirectIo::On,
        _ => DirectIo::Off,
    };
    let _ = std::fs::remove_file(&probe);
    mode
}

/// Commits the file system's journal (`sync -f`, syncfs(2)).
fn sync_fs(path: &Path) {
    let ok = std::process::Command::new("sync")
        .arg("-f")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "sync -f {}", path.display());
}

/// Free bytes including the blocks reserved for root (`stat -f` %f).
fn free_blocks_for_root(path: &Path) -> u64 {
    stat_free(path, "%f")
}

/// `stat -f` free blocks (`blocks`: a `%a` or `%f` format) times the block
/// size, in bytes.
fn stat_free(path: &Path, blocks: &str) -> u64 {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", &format!("{blocks} %S")])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut it = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    it.next().unwrap() * it.next().unwrap()
}

/// Fills the file system at `dir` with the file `filler` until it takes
/// no more (`fallocate` in steps: what statfs calls free is more than a
/// copy-on-write file system lets a file take), then gives `keep` bytes
/// back (a punched hole) and commits, so about `keep` bytes are free.
fn fill_leaving(dir: &Path, filler: &Path, keep: u64) -> FileBackend {
    let fill = FileBackend::open(filler).unwrap();
    let mut at = 0u64;
    let big = free_blocks_for_root(dir).saturating_sub(keep + (8 << 20));
    if big > 0 && fill.allocate(0, big).is_ok() {
        at = big;
    }
    for step in [1u64 << 20, 64 << 10, 4 << 10] {
        while fill.allocate(at, step).is_ok() {
            at += step;
        }
    }
    fill.sync_data().unwrap();
    let punched = std::process::Command::new("fallocate")
        .args(["-p", "-o", "0", "-l", &keep.to_string()])
        .arg(filler)
        .status()
        .is_ok_and(|s| s.success());
    assert!(punched, "fallocate -p on {}", filler.display());
    fill.sync_data().unwrap();
    sync_fs(dir);
    fill
}

/// Removes the filler `fill_leaving` made and waits until at least `need`
/// bytes are free. A removed file's blocks come back at the journal's (or
/// the transaction's) next commit: commit it. And only once nothing holds
/// the file any more: a child another test thread forked holds a copy of
/// every descriptor until it execs, so the blocks of a file closed and
/// removed meanwhile come back a moment later (seen on tmpfs, 1 run in 60:
/// ENOSPC with the space free a moment after).
fn give_space_back(dir: &Path, fill: FileBackend, filler: &Path, need: u64, what: &str) {
    drop(fill);
    std::fs::remove_file(filler).unwrap();
    sync_fs(dir);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while free_blocks_for_root(dir) < need {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the filler's blocks never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        sync_fs(dir);
    }
}

/// The largest file of the file system holding `dir`, as the backend probes
/// it at open.
fn largest_file(dir: &Path) -> u64 {
    let probe = dir.join("max-probe");
    let max = FileBackend::open(&probe)
        .unwrap()
        .max_file_size()
        .expect("lseek probe works on a regular file");
    std::fs::remove_file(&probe).unwrap();
    max
}

// ---- the cases, each on one file system ----

/// A file backend opens its extra sync lanes (descriptions of its own, so
/// `fdatasync`s run at once) on every file system but btrfs, where an
/// `fdatasync` started beside another of the same file may return without
/// making a completed write durable: there the file keeps one lane, and
/// commits from several threads share it.
fn sync_lanes_are_opened_except_on_btrfs(kind: FsKind) {
    let Some(fs) = scratch(kind, 64) else { return };
    let path = fs.path().join("lanes");
    let btrfs = kind == FsKind::Btrfs;
    let be = FileBackend::open(&path).unwrap().with_sync_lanes(4);
    let want = if cfg!(target_os = "linux") && !btrfs {
        4
    } else {
        1
    };
    assert_eq!(be.sync_lanes(), want, "{}", kind.name());
    drop(be);
    let f = PagedCachedFile::open(&path, Config::default()).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let f = &f;
            s.spawn(move || {
                let mut w = f.writer();
                for i in 0..25u64 {
                    let p = t * 25 + i;
                    w.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
                    w.commit().unwrap();
                }
            });
        }
    });
    f.close().unwrap();
    drop(f);
    let bytes = std::fs::read(&path).unwrap();
    for p in 0..100u64 {
        assert_eq!(
            tag_of(&bytes[p as usize * PS..]),
            (p, 1),
            "{}: page {p}",
            kind.name()
        );
    }
}

fn o_direct_decision_and_alignment(kind: FsKind) {
    let Some(fs) = scratch(kind, 64) else { return };
    let path = fs.path().join("mode");
    let auto = PagedCachedFile::open(&path, Config::default().direct(DirectIo::Auto)).unwrap();
    let mode = auto.io_mode().clone();
    eprintln!("{}: io_mode {mode}", kind.name());
    drop(auto);
    let on = PagedCachedFile::open(&path, Config::default().direct(DirectIo::On));
    match (mode.direct, on) {
        (Some(a), Ok(f)) => {
            assert!(
                a.memory.is_power_of_two() && a.offset.is_power_of_two(),
                "{a:?}"
            );
            assert!(a.offset <= PS as u32 && a.memory <= PS as u32, "{a:?}");
            assert_eq!(f.io_mode().direct, Some(a));
            // Aligned pages go out and come back through O_DIRECT.
            f.write_page(0, &page(PS, 0, 1)).unwrap();
            f.write_all_at(PS as u64 + 5, b"odd").unwrap();
            f.sync().unwrap();
            assert_eq!(f.len(), 2 * PS as u64, "O_DIRECT keeps whole pages");
            f.close().unwrap();
            let back = std::fs::read(&path).unwrap();
            assert_eq!(tag_of(&back), (0, 1));
            assert_eq!(&back[PS + 5..PS + 8], b"odd");
            // A page size the alignment cannot serve is refused with On,
            // a reported fallback with Auto.
            if a.offset > 512 {
                let small = Config::default().page_size(512);
                assert!(matches!(
                    PagedCachedFile::open(
                        fs.path().join("small"),
                        small.clone().direct(DirectIo::On)
                    ),
                    Err(Error::InvalidConfig(_))
                ));
            }
        }
        (None, Err(e)) => {
            // Refused: typed, and Auto said why it fell back.
            assert!(
                matches!(e, Error::Io { .. } | Error::InvalidConfig(_)),
                "{e}"
            );
            assert!(mode.direct_fallback.is_some(), "{mode}");
        }
        (direct, on) => panic!(
            "{}: Auto chose {direct:?}, On gave {:?}",
            kind.name(),
            on.map(|f| f.io_mode().clone())
        ),
    }
}

fn sparse_o_direct_writes_allocate_only_what_is_written(kind: FsKind) {
    let Some(fs) = scratch(kind, 64) else { return };
    let direct = direct_mode(fs.path());
    for engine in engines() {
        let path = fs.path().join(format!("sparse-{}", engine.name()));
        let cfg = Config::default().engine(engine).direct(direct);
        let f = PagedCachedFile::open(&path, cfg.clone()).unwrap();
        f.write_page(0, &page(PS, 0, 1)).unwrap();
        f.write_page(GIB, &page(PS, GIB / PS as u64, 1)).unwrap();
        f.sync().unwrap();
        f.close().unwrap();
        drop(f);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), GIB + PS as u64);
        let allocated = allocated_bytes(&meta);
        // Two pages, plus at most a few extent-tree blocks.
        assert!(
            allocated <= 6 * PS as u64,
            "{} {engine:?} {direct:?}: {allocated} bytes allocated",
            kind.name()
        );
        let f = PagedCachedFile::open(&path, cfg).unwrap();
        assert_eq!(tag_of(&f.read(0, PS).unwrap()), (0, 1));
        assert_eq!(tag_of(&f.read(GIB, PS).unwrap()), (GIB / PS as u64, 1));
        drop(f);
        std::fs::remove_file(&path).unwrap();
    }
}

fn the_largest_file_is_taken_and_a_page_past_it_refused(kind: FsKind) {
    let Some(fs) = scratch(kind, 64) else { return };
    let max = largest_file(fs.path());
    assert!(max >= GIB, "{}: largest file {max}", kind.name());
    for direct in [DirectIo::Off, direct_mode(fs.path())] {
        let path = fs.path().join(format!("big-{direct:?}"));
        let cfg = Config::default().direct(direct);
        // The last whole page that fits: `max` is the largest length.
        let last = max / PS as u64 * PS as u64 - PS as u64;
        {
            let f = PagedCachedFile::open(&path, cfg.clone()).unwrap();
            for (off, len) in [(last + PS as u64, PS as u64), (u64::MAX - 8191, PS as u64)] {
                match f.write_all_at(off, &vec![1u8; len as usize]) {
                    Err(Error::FileTooLarge { offset, max: m, .. }) => {
                        assert_eq!((offset, m), (off, max));
                    }
                    other => panic!("{} {direct:?} at {off}: {other:?}", kind.name()),
                }
            }
            assert!(matches!(
                f.write_page(last + PS as u64, &[1; PS]),
                Err(Error::FileTooLarge { .. })
            ));
            assert!(matches!(
                f.set_len(last + 2 * PS as u64),
                Err(Error::FileTooLarge { .. })
            ));
            // Nothing of that was buffered or grew the file.
            assert_eq!(f.len(), 0);
            f.write_page(0, &page(PS, 0, 1)).unwrap();
            // The last page that fits is taken, made durable, read back.
            f.write_page(last, &page(PS, last / PS as u64, 1)).unwrap();
            f.sync().unwrap();
            assert_eq!(f.len(), last + PS as u64);
            assert_eq!(tag_of(&f.read(last, PS).unwrap()), (last / PS as u64, 1));
            f.set_len(PS as u64).unwrap();
            f.sync().unwrap();
        }
        let f = PagedCachedFile::open(&path, cfg).unwrap();
        assert_eq!(f.len(), PS as u64);
        assert_eq!(tag_of(&f.read(0, PS).unwrap()), (0, 1));
    }
}

/// A file backend that does not know its file system's largest file, so a
/// page past it reaches the kernel and fails there (EFBIG, or EINVAL past
/// the largest offset) at every flush. It also counts the calls made
/// through it (the second field; io_uring writes go to the file itself and
/// are not counted). Nor does it say how much space is free, so
/// grow-ahead's filler writes its zeros whatever is left (as on a platform
/// without `fstatvfs`, or a disk another process fills).
#[derive(Debug)]
struct UnknownMax(FileBackend, Arc<Calls>);

#[derive(Debug, Default)]
struct Calls {
    fallocate: AtomicU64,
    /// `pwrite` and `pwritev` calls.
    writes: AtomicU64,
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
        self.1.writes.fetch_add(1, Ordering::Relaxed);
        self.0.write_all_at(offset, buf)
    }
    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        self.1.writes.fetch_add(1, Ordering::Relaxed);
        self.0.write_vectored_all_at(offset, bufs)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.1.fallocate.fetch_add(1, Ordering::Relaxed);
        self.0.allocate(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.0.write_zeroes(offset, len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.0.punch_hole(offset, len)
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

/// The first page past the largest file of the file system at `dir`.
fn bad_page(dir: &Path) -> u64 {
    (largest_file(dir) + 1).next_multiple_of(PS as u64)
}

/// Whether `e` is how a kernel refuses a write past the largest file.
fn refused_for_good(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EFBIG) | Some(libc::EINVAL))
        || e.kind() == io::ErrorKind::InvalidInput
}

fn one_bad_page_does_not_hold_the_others_hostage(kind: FsKind) {
    let Some(fs) = scratch(kind, 64) else { return };
    let bad = bad_page(fs.path());
    let direct = direct_mode(fs.path()) == DirectIo::On;
    for engine in engines() {
        for direct in [false, direct] {
            let path = fs
                .path()
                .join(format!("hostage-{}-{direct}", engine.name()));
            let be = if direct {
                FileBackend::open_direct(&path).unwrap()
            } else {
                FileBackend::open(&path).unwrap()
            };
            let what = format!("{} {engine:?} direct {direct}", kind.name());
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
                        assert_eq!(failed, vec![bad..bad + PS as u64], "{what}");
                        assert!(refused_for_good(&source), "{what}: {source}");
                    }
                    other => panic!("{what} round {round}: {other:?}"),
                }
                assert!(!f.is_poisoned(), "a write error is not a sync error");
            }
            // The good pages were made durable each time all the same.
            assert_eq!(f.stats().syncs, syncs + 1, "{what}");
            let on_disk = std::fs::read(&path).unwrap();
            assert_eq!(
                on_disk.len() % PS,
                0,
                "{what}: a failed flush left a partial page"
            );
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
                Err(e) => assert!(
                    e.io_kind() == Some(io::ErrorKind::FileTooLarge)
                        || e.io_kind() == Some(io::ErrorKind::InvalidInput),
                    "{what}: {e}"
                ),
                Ok(()) => panic!("{what}: a length past the largest file synced"),
            }
            f.set_len(3 * PS as u64).unwrap();
            f.write_page(3 * PS as u64, &page(PS, 3, 1)).unwrap();
            f.sync().unwrap();
            f.close().unwrap();
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * PS as u64);
        }
    }
}

fn backpressure_is_not_held_hostage_by_a_bad_page(kind: FsKind) {
    // A write buffer of 8 pages: every few writes must flush to make room.
    // The bad page fails each of those flushes; the writes must go on as
    // long as the flush frees room, and `sync` must name only the bad page.
    let Some(fs) = scratch(kind, 64) else { return };
    let bad = bad_page(fs.path());
    let path = fs.path().join("pressure");
    let be = UnknownMax::new(FileBackend::open(&path).unwrap());
    let f = PagedCachedFile::new(be, Config::default().max_write_buffer_bytes(8 * PS)).unwrap();
    f.write_page(bad, &[1u8; PS]).unwrap();
    for p in 0..64u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    match f.sync() {
        Err(Error::PagesFailed { failed, .. }) => assert_eq!(failed, vec![bad..bad + PS as u64]),
        other => panic!("{}: {other:?}", kind.name()),
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

fn a_full_disk_keeps_pages_dirty_until_space_returns(kind: FsKind) {
    // (engine, direct, MiB written, runs): 8 MiB goes out as eight runs of
    // `max_write_bytes` (1 MiB); 4 MiB with `max_write_bytes` at 4 MiB as
    // one run (IOV_MAX pages), which a lone committer writes inline on
    // every engine (io_uring included, `RunWriter::writes_inline`): a
    // `pwritev`, or under O_DIRECT a `pwrite` of scattered pages' copy.
    let Some(probe_fs) = scratch(kind, 64) else {
        return;
    };
    let direct_on = direct_mode(probe_fs.path());
    drop(probe_fs);
    let cases = engines().into_iter().flat_map(|engine| {
        [DirectIo::Off, direct_on]
            .into_iter()
            .flat_map(move |direct| [(engine, direct, 8u64, 8u64), (engine, direct, 4, 1)])
    });
    for (engine, direct, mib, runs) in cases {
        let what = format!(
            "{}: {engine:?}, {direct:?}, {mib} MiB in {runs} run(s)",
            kind.name()
        );
        // A file system per case: the blocks of a file the case before
        // removed come back late (at the journal's next commit, and after
        // a ring's deferred teardown drops its file), and would make this
        // disk not full any more in the middle of the case.
        let Some(fs) = scratch(kind, 64) else { return };
        let path = fs.path().join("full");
        let cfg = Config::default()
            .engine(engine)
            .direct(direct)
            .max_write_bytes(((mib / runs) << 20) as usize);
        let acked = 64u64;
        let pages = (mib << 20) / PS as u64;
        // An acknowledged commit before the disk fills.
        let f = PagedCachedFile::open(&path, cfg.clone()).unwrap();
        for p in 0..acked {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        f.sync().unwrap();
        // Leave about 2 MiB free (as root sees it: root may use the
        // reserved blocks), then write `mib` MiB of pages.
        let filler = fs.path().join("filler");
        // 1 MiB and 3 KiB: where blocks are 1 KiB, a write into it ends
        // inside a page.
        let fill = fill_leaving(fs.path(), &filler, (1 << 20) + (3 << 10));
        let left = free_blocks_for_root(fs.path());
        // btrfs counts space kept for metadata as free: its ENOSPC is the
        // only measure there.
        assert!(
            left < mib << 20 || kind == FsKind::Btrfs,
            "{what}: {left} bytes still free after the filler"
        );
        for p in acked..acked + pages {
            f.write_page(p * PS as u64, &page(PS, p, 2)).unwrap();
        }
        for attempt in 0..2 {
            let err = match f.sync() {
                Ok(()) => panic!("{what}: synced into {left} free bytes"),
                Err(e) => e,
            };
            assert_eq!(
                err.io_kind(),
                Some(io::ErrorKind::StorageFull),
                "{what}, attempt {attempt}: {err}"
            );
            assert!(matches!(err, Error::PagesFailed { .. }), "{what}: {err}");
            assert!(!f.is_poisoned(), "{what}");
            // Every page still reads back; nothing was lost.
            for p in [0, acked, acked + pages / 2, acked + pages - 1] {
                let v = if p < acked { 1 } else { 2 };
                assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, v));
            }
        }
        // The engine gives up and exits (drop: a best-effort flush, which
        // fails too). The file is a whole number of pages, so the engine
        // reopens it with its own options; the acknowledged commit is there.
        drop(f);
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            len % PS as u64,
            0,
            "{what}: {len} bytes after the failed flushes"
        );
        let f = PagedCachedFile::open(&path, cfg.clone())
            .unwrap_or_else(|e| panic!("{what}: reopen with the same options: {e}"));
        assert_eq!(
            f.io_mode().direct.is_some(),
            direct == DirectIo::On,
            "{what}"
        );
        for p in 0..acked {
            assert_eq!(
                tag_of(&f.read(p * PS as u64, PS).unwrap()),
                (p, 1),
                "{what}"
            );
        }
        // Space returns; the engine writes the lost pages again.
        give_space_back(fs.path(), fill, &filler, 2 * (mib << 20), &what);
        for p in acked..acked + pages {
            f.write_page(p * PS as u64, &page(PS, p, 2)).unwrap();
        }
        f.sync().unwrap_or_else(|e| {
            let ls = std::process::Command::new("ls")
                .args(["-ls"])
                .arg(fs.path())
                .output()
                .unwrap();
            panic!(
                "{what}: sync once space returned: {e}; {} bytes free; {}",
                free_blocks_for_root(fs.path()),
                String::from_utf8_lossy(&ls.stdout)
            )
        });
        let written = f.stats().runs;
        if runs == 1 {
            assert_eq!(written, 1, "{what}");
        } else {
            assert!(written >= runs, "{what}: {written} runs written");
        }
        f.close().unwrap();
        drop(f);
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len() as u64, (acked + pages) * PS as u64);
        for p in 0..(acked + pages) as usize {
            let v = if (p as u64) < acked { 1 } else { 2 };
            assert_eq!(
                tag_of(&on_disk[p * PS..]),
                (p as u64, v),
                "{what}: page {p}"
            );
        }
    }
}

/// Eight committers with three rounds in flight run into a full disk, so
/// the writes of several rounds fail while others are in flight: every
/// commit acknowledged before stays intact, the file stays a whole number
/// of pages (the cut back after a failed write waits until no write is in
/// flight) and reopens with the same options, and once space returns
/// everything syncs.
fn overlapping_rounds_on_a_full_disk(kind: FsKind) {
    for engine in engines() {
        // A file system per case: the case before leaves it full.
        let Some(fs) = scratch(kind, 64) else { return };
        full_disk_under_overlap(kind, engine, TornWrites::Allow, GrowAhead::Off, &fs);
        // Grow-ahead's filler races the commits for the last blocks: when
        // it meets the full disk it stops and gives its zeros back; a
        // commit's ENOSPC leaves its pages dirty as without it, and the
        // window never reaches the length (drop without close leaves it;
        // the reopen cuts it off).
        let Some(fs) = scratch(kind, 64) else { return };
        let window = GrowAhead::Window { bytes: 8 << 20 };
        full_disk_under_overlap(kind, engine, TornWrites::Allow, window, &fs);
        // The doublewrite area fills the disk too (its records, then the
        // pages in place; btrfs copies the pages it rewrites): room for
        // the area, a record and the copies.
        let Some(fs) = scratch(kind, 256) else { return };
        full_disk_under_overlap(kind, engine, TornWrites::DoubleWrite, GrowAhead::Off, &fs);
    }
}

fn full_disk_under_overlap(
    kind: FsKind,
    engine: FlushEngine,
    torn: TornWrites,
    grow: GrowAhead,
    fs: &ScratchFs,
) {
    const THREADS: u64 = 8;
    const TXN: u64 = 16; // pages per commit (64 KiB)
    const REGION: u64 = 1024; // pages per thread (4 MiB): 32 MiB in all
    let direct = direct_mode(fs.path());
    let what = format!(
        "{}, {}, {direct:?}, {torn:?}, {grow:?}, 3 rounds in flight",
        kind.name(),
        engine.name()
    );
    let filler = fs.path().join("filler");
    // 2 MiB and 3 KiB: where blocks are 1 KiB, a write into it ends inside
    // a page.
    let fill = fill_leaving(fs.path(), &filler, (2 << 20) + (3 << 10));
    let path = fs.path().join("full");
    let cfg = Config::default()
        .engine(engine)
        .direct(direct)
        .torn_writes(torn)
        .grow_ahead(grow);
    // Doublewrite records of at most 4 MiB.
    let cfg = match torn {
        TornWrites::DoubleWrite => cfg.max_write_buffer_bytes(4 << 20),
        _ => cfg,
    };
    let f = PagedCachedFile::open(&path, cfg.clone()).unwrap();
    // Per thread: commits acknowledged, and the error that stopped it.
    let outcomes: Vec<(u64, Option<Error>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let f = &f;
                s.spawn(move || {
                    for k in 0..REGION / TXN {
                        let first = t * REGION + k * TXN;
                        for p in first..first + TXN {
                            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
                        }
                        if let Err(e) = f.sync() {
                            return (k, Some(e));
                        }
                    }
                    (REGION / TXN, None)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let failed = outcomes.iter().filter(|(_, e)| e.is_some()).count();
    assert!(failed > 0, "{what}: 32 MiB synced into 2 MiB free");
    let acked: u64 = outcomes.iter().map(|(k, _)| k).sum();
    eprintln!(
        "{what}: {acked} commits acknowledged, {failed} threads stopped by the full disk; \
         grow-ahead: {:?}",
        f.grow_ahead_stopped()
    );
    if let Some(why) = f.grow_ahead_stopped() {
        // It stopped for want of space, nothing else.
        assert!(
            ["No space", "kept for the commits", "disk full"]
                .iter()
                .any(|w| why.contains(w)),
            "{what}: {why}"
        );
    }
    // The engine gives up (drop: a best-effort flush, which fails too).
    drop(f);
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(
        len % PS as u64,
        0,
        "{what}: {len} bytes after the failed writes"
    );
    // Doublewrite recovery may have pages to write in place (records of
    // the writes the full disk refused): on the full disk that is ENOSPC,
    // with the file and the area kept; with space back it opens.
    let (f, fill) = match PagedCachedFile::open(&path, cfg.clone()) {
        Ok(f) => (f, Some(fill)),
        Err(Error::Io { source, .. })
            if torn == TornWrites::DoubleWrite && source.raw_os_error() == Some(libc::ENOSPC) =>
        {
            eprintln!("{what}: reopen on the full disk: recovery needs space ({source})");
            give_space_back(fs.path(), fill, &filler, 40 << 20, &what);
            let f = PagedCachedFile::open(&path, cfg)
                .unwrap_or_else(|e| panic!("{what}: reopen once space returned: {e}"));
            (f, None)
        }
        Err(e) => panic!("{what}: reopen with the same options: {e}"),
    };
    // A window the drop left is cut off at the open: the file's size is
    // its length again.
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        f.len(),
        "{what}: size after the reopen"
    );
    // (A record the full disk cut short is a warning, never applied.)
    assert!(
        f.recovery().unrepaired.is_empty(),
        "{what}: {:?}",
        f.recovery()
    );
    let committed = |t: u64, k: u64| t * REGION + k * TXN..t * REGION + (k + 1) * TXN;
    for (t, &(k, _)) in outcomes.iter().enumerate() {
        for p in (0..k).flat_map(|k| committed(t as u64, k)) {
            assert_eq!(
                tag_of(&f.read(p * PS as u64, PS).unwrap()),
                (p, 1),
                "{what}: acknowledged page {p}"
            );
        }
    }
    // Space returns: every page is written again and synced.
    if let Some(fill) = fill {
        give_space_back(fs.path(), fill, &filler, 40 << 20, &what);
    }
    for p in 0..THREADS * REGION {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync()
        .unwrap_or_else(|e| panic!("{what}: sync once space returned: {e}"));
    f.close().unwrap();
    drop(f);
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk.len() as u64, THREADS * REGION * PS as u64, "{what}");
    for p in 0..(THREADS * REGION) as usize {
        assert_eq!(
            tag_of(&on_disk[p * PS..]),
            (p as u64, 1),
            "{what}: page {p}"
        );
    }
}

/// The filler writes a window of zeros (a MiB less than the space left)
/// above a page at 16 MiB on a nearly full disk; then 3 MiB of pages go
/// into the holes below. Their commit finds the disk full (the zeros hold
/// the space): the filler gives its zeros back, and the commit (or its
/// retry) succeeds with no space returned from outside; nothing is lost.
/// Where the file system refuses the zeros first (btrfs keeps space for
/// its metadata), the filler gives back what it wrote and the commit
/// succeeds.
fn grow_ahead_gives_its_zeros_back_when_a_commit_finds_the_disk_full(kind: FsKind) {
    let Some(fs) = scratch(kind, 64) else { return };
    let what = kind.name();
    let filler = fs.path().join("filler");
    let keep = if kind == FsKind::Btrfs {
        24u64 << 20
    } else {
        5 << 20
    };
    let _fill = fill_leaving(fs.path(), &filler, keep);
    let path = fs.path().join("grow");
    let window = keep - (1 << 20);
    let cfg = Config::default().grow_ahead(GrowAhead::Window { bytes: window });
    let f = PagedCachedFile::new(UnknownMax::new(FileBackend::open(&path).unwrap()), cfg).unwrap();
    let hi = 4096u64; // page number of the page at 16 MiB
    f.write_page(hi * PS as u64, &page(PS, hi, 1)).unwrap();
    f.sync().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let filled = loop {
        if f.stats().grow_zero_bytes >= window - PS as u64 {
            break true;
        }
        if let Some(why) = f.grow_ahead_stopped() {
            assert!(why.contains("No space"), "{what}: {why}");
            break false;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the filler hangs"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let low = 768u64; // 3 MiB of pages below
    for p in 0..low {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    if let Err(e) = f.sync() {
        assert_eq!(e.io_kind(), Some(io::ErrorKind::StorageFull), "{what}: {e}");
        f.sync()
            .unwrap_or_else(|e| panic!("{what}: the retry after the zeros went back: {e}"));
    }
    let why = f.grow_ahead_stopped().expect("the filler stopped");
    eprintln!("{what}: window written: {filled}; {why}");
    if filled {
        assert!(why.contains("disk full"), "{what}: {why}");
    }
    f.close().unwrap();
    drop(f);
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk.len() as u64, (hi + 1) * PS as u64, "{what}");
    for p in (0..low).chain([hi]) {
        assert_eq!(
            tag_of(&on_disk[p as usize * PS..]),
            (p, 1),
            "{what}: page {p}"
        );
    }
}

fn eight_threads_with_close_and_reopen(kind: FsKind) {
    let Some(fs) = scratch(kind, 64) else { return };
    let direct = direct_mode(fs.path());
    let secs = std::env::var("PAGEWRITER_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.6);
    let plan = stress::Plan::eight_threads(secs);
    for engine in engines() {
        let cfg = Config::default()
            .engine(engine)
            .direct(direct)
            .stripes(8)
            .max_write_buffer_bytes(24 * PS);
        let path = fs.path().join(format!("stress-{}", engine.name()));
        let r = stress::run(&path, &cfg, &plan);
        eprintln!(
            "{} {} {direct:?}: {} ops, 8 threads, {:.1} s, {} reopens, {} refusals, {} cuts, {} bytes checked, {} lost, {} unexpected",
            kind.name(),
            engine.name(),
            r.ops,
            r.seconds,
            r.reopens,
            r.refusals,
            r.cuts,
            r.checked_bytes,
            r.lost_bytes,
            r.unexpected
        );
        assert!(r.ops > 1000 && r.cuts > 0, "{r:?}");
        assert_eq!(
            (r.unexpected, r.lost_bytes),
            (0, 0),
            "{}: {r:?}",
            kind.name()
        );
    }
}

/// Asynchronous commits into a full disk: four threads, each with its own
/// writer keeping up to four tickets in flight, fill the last megabytes.
/// Every ticket that resolves Ok has its pages on disk; the ones the full
/// disk stopped fail with a storage-full error (their pages stay dirty
/// and readable), never a hang; nothing poisons the file. Once space
/// returns, the next asynchronous commit writes everything.
fn asynchronous_commits_on_a_full_disk(kind: FsKind) {
    writers_commit_on_a_full_disk(kind, Commits::Tickets);
}

/// As [`asynchronous_commits_on_a_full_disk`] with `Writer::commit`: each
/// commit grows the file, so it is made as `sync()` makes its commits; one
/// the full disk stopped fails with a storage-full error and its writer
/// keeps its pages for the next.
fn scoped_commits_on_a_full_disk(kind: FsKind) {
    writers_commit_on_a_full_disk(kind, Commits::Scoped);
}

/// How the writers of [`writers_commit_on_a_full_disk`] commit.
#[derive(Clone, Copy)]
enum Commits {
    /// `Writer::commit_async`, up to four tickets in flight per writer.
    Tickets,
    /// `Writer::commit`, each waited for.
    Scoped,
}

fn writers_commit_on_a_full_disk(kind: FsKind, how: Commits) {
    let Some(fs) = scratch(kind, 64) else { return };
    let direct = direct_mode(fs.path());
    let path = fs.path().join("writers-full");
    let f = PagedCachedFile::open(&path, Config::default().direct(direct)).unwrap();
    let what = format!("{}: {direct:?}", kind.name());
    let filler = fs.path().join("filler");
    let fill = fill_leaving(fs.path(), &filler, (1 << 20) + (3 << 10));
    // 4 threads x 4 MiB: far more than the free space.
    let chunk = 64u64; // pages per commit
    let per_thread = 16u64; // commits per thread
    let failed = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (f, failed, what, path) = (&f, &failed, &what, &path);
            s.spawn(move || {
                let mut w = f.writer();
                let mut tickets = std::collections::VecDeque::new();
                let mut disk = std::fs::File::open(path).unwrap();
                let mut settle = |done: pagewriter::Result<()>, first: u64| match done {
                    Ok(()) => {
                        for p in [first, first + chunk - 1] {
                            let mut buf = vec![0u8; PS];
                            io::Seek::seek(&mut disk, io::SeekFrom::Start(p * PS as u64)).unwrap();
                            io::Read::read_exact(&mut disk, &mut buf).unwrap();
                            assert_eq!(tag_of(&buf), (p, 1), "{what}: page {p} after Ok");
                        }
                    }
                    Err(e) => {
                        assert_eq!(
                            e.io_kind(),
                            Some(io::ErrorKind::StorageFull),
                            "{what}: pages from {first}: {e}"
                        );
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                };
                for c in 0..per_thread {
                    let first = (t * per_thread + c) * chunk;
                    for p in first..first + chunk {
                        w.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
                    }
                    if let Commits::Scoped = how {
                        settle(w.commit(), first);
                        continue;
                    }
                    tickets.push_back((w.commit_async().unwrap(), first));
                    if tickets.len() == 4 {
                        let (ticket, first) = tickets.pop_front().unwrap();
                        settle(ticket.wait(), first);
                    }
                }
                for (ticket, first) in tickets {
                    settle(ticket.wait(), first);
                }
            });
        }
    });
    let pages = 4 * per_thread * chunk;
    assert!(
        failed.load(Ordering::Relaxed) > 0,
        "{what}: every ticket Ok with 16 MiB written into about 1 MiB free"
    );
    let back = |f: &PagedCachedFile| {
        give_space_back(fs.path(), fill, &filler, 2 * pages * PS as u64, &what);
        f.sync_async().and_then(pagewriter::CommitTicket::wait)
    };
    every_page_once_space_returns(f, &path, (pages, 1), 61, &what, back);
}

/// The end of a full-disk case: `f` is not poisoned and reads pages
/// `0..pages` (every `step`-th) at version `version`, the pages the full
/// disk stopped included; `then` gives the space back and commits; after
/// `close` the file at `path` is exactly those pages at that version.
fn every_page_once_space_returns(
    f: PagedCachedFile,
    path: &Path,
    (pages, version): (u64, u64),
    step: usize,
    what: &str,
    then: impl FnOnce(&PagedCachedFile) -> pagewriter::Result<()>,
) {
    assert!(!f.is_poisoned(), "{what}");
    for p in (0..pages).step_by(step) {
        assert_eq!(
            tag_of(&f.read(p * PS as u64, PS).unwrap()),
            (p, version),
            "{what}"
        );
    }
    then(&f).unwrap_or_else(|e| panic!("{what}: once space returned: {e}"));
    f.close().unwrap();
    drop(f);
    let on_disk = std::fs::read(path).unwrap();
    assert_eq!(on_disk.len() as u64, pages * PS as u64, "{what}");
    for p in 0..pages as usize {
        assert_eq!(
            tag_of(&on_disk[p * PS..]),
            (p as u64, version),
            "{what}: page {p}"
        );
    }
}

/// Writes through on a full disk: a written file (every page on disk,
/// synced) is rewritten in place by four threads with `write_and_commit`
/// from page-aligned buffers while the disk has about 1 MiB free. Where
/// an overwrite needs no new blocks (ext4, XFS, tmpfs) each commit writes
/// through; where it does (btrfs copies on write) a commit may fail with
/// a storage-full error, its pages then stay dirty and readable, and the
/// file is not poisoned. Every commit that says Ok has its pages on disk;
/// once space returns, a `sync` writes the rest.
fn writes_through_on_a_full_disk(kind: FsKind) {
    writes_through_on_a_full_disk_by(kind, Through::WriteAndCommit);
}

/// As [`writes_through_on_a_full_disk`], each commit a `Writer::write_page`
/// of its 64 KiB (written straight to disk at once where nothing else is
/// syncing, into the buffer otherwise) and then `Writer::commit`.
fn large_writes_on_a_full_disk(kind: FsKind) {
    writes_through_on_a_full_disk_by(kind, Through::LargeWrite);
}

/// As [`large_writes_on_a_full_disk`], into the hole `set_len` left (space
/// unwritten on disk, which a lone writer's large write goes through to,
/// and which the full disk refuses to allocate).
fn large_writes_into_a_hole_on_a_full_disk(kind: FsKind) {
    writes_through_on_a_full_disk_by(kind, Through::LargeWriteIntoHole);
}

/// As [`large_writes_on_a_full_disk`], on an empty file: each write past
/// the end grows it (a failed one that grew it partway is cut back).
fn large_writes_past_the_end_on_a_full_disk(kind: FsKind) {
    writes_through_on_a_full_disk_by(kind, Through::LargeWritePastTheEnd);
}

/// How [`writes_through_on_a_full_disk_by`] writes and commits a chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Through {
    WriteAndCommit,
    LargeWrite,
    /// `LargeWrite`, the file's pages a hole (`set_len`) at the start.
    LargeWriteIntoHole,
    /// `LargeWrite`, the file empty at the start.
    LargeWritePastTheEnd,
}

fn writes_through_on_a_full_disk_by(kind: FsKind, how: Through) {
    let Some(fs) = scratch(kind, 64) else { return };
    let direct = direct_mode(fs.path());
    let path = fs.path().join("through-full");
    let what = format!("{}: {direct:?}, {how:?}", kind.name());
    let chunk = 16u64; // pages per commit
    let per_thread = 16u64; // commits per thread
    let pages = 4 * per_thread * chunk;
    let f = PagedCachedFile::open(&path, Config::default().direct(direct)).unwrap();
    if how == Through::LargeWriteIntoHole {
        f.set_len(pages * PS as u64).unwrap();
    } else if how == Through::LargeWritePastTheEnd {
        // Empty.
    } else {
        for p in 0..pages {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
    }
    f.sync().unwrap();
    let filler = fs.path().join("filler");
    let fill = fill_leaving(fs.path(), &filler, (1 << 20) + (3 << 10));
    let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (f, ok, failed, what, path) = (&f, &ok, &failed, &what, &path);
            s.spawn(move || {
                let mut w = f.writer();
                let mut disk = std::fs::File::open(path).unwrap();
                let len = (chunk as usize) * PS;
                let mut buf = pagewriter::buffer::AlignedBuf::zeroed(len, 4096).unwrap();
                for c in 0..per_thread {
                    let first = (t * per_thread + c) * chunk;
                    for (i, p) in (first..first + chunk).enumerate() {
                        buf[i * PS..(i + 1) * PS].copy_from_slice(&page(PS, p, 2));
                    }
                    let at = first * PS as u64;
                    let done = match how {
                        Through::WriteAndCommit => w.write_and_commit(at, &buf),
                        Through::LargeWrite
                        | Through::LargeWriteIntoHole
                        | Through::LargeWritePastTheEnd => {
                            w.write_page(at, &buf).and_then(|()| w.commit())
                        }
                    };
                    match done {
                        Ok(()) => {
                            let mut got = vec![0u8; PS];
                            for p in [first, first + chunk - 1] {
                                io::Seek::seek(&mut disk, io::SeekFrom::Start(p * PS as u64))
                                    .unwrap();
                                io::Read::read_exact(&mut disk, &mut got).unwrap();
                                assert_eq!(tag_of(&got), (p, 2), "{what}: page {p} after Ok");
                            }
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            assert_eq!(
                                e.io_kind(),
                                Some(io::ErrorKind::StorageFull),
                                "{what}: pages from {first}: {e}"
                            );
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert_eq!(ok + failed, 4 * per_thread, "{what}");
    eprintln!("{what}: {ok} commits Ok, {failed} stopped by the full disk");
    let back = |f: &PagedCachedFile| {
        give_space_back(fs.path(), fill, &filler, 2 * pages * PS as u64, &what);
        f.sync()
    };
    every_page_once_space_returns(f, &path, (pages, 2), 7, &what, back);
}

/// A case run on every file system, and its name.
type Case = (&'static str, fn(FsKind));

/// The cases run on every file system.
const CASES: [Case; 16] = [
    (
        "sync_lanes_are_opened_except_on_btrfs",
        sync_lanes_are_opened_except_on_btrfs,
    ),
    (
        "grow_ahead_gives_its_zeros_back_when_a_commit_finds_the_disk_full",
        grow_ahead_gives_its_zeros_back_when_a_commit_finds_the_disk_full,
    ),
    (
        "o_direct_decision_and_alignment",
        o_direct_decision_and_alignment,
    ),
    (
        "sparse_o_direct_writes_allocate_only_what_is_written",
        sparse_o_direct_writes_allocate_only_what_is_written,
    ),
    (
        "the_largest_file_is_taken_and_a_page_past_it_refused",
        the_largest_file_is_taken_and_a_page_past_it_refused,
    ),
    (
        "one_bad_page_does_not_hold_the_others_hostage",
        one_bad_page_does_not_hold_the_others_hostage,
    ),
    (
        "backpressure_is_not_held_hostage_by_a_bad_page",
        backpressure_is_not_held_hostage_by_a_bad_page,
    ),
    (
        "a_full_disk_keeps_pages_dirty_until_space_returns",
        a_full_disk_keeps_pages_dirty_until_space_returns,
    ),
    (
        "overlapping_rounds_on_a_full_disk",
        overlapping_rounds_on_a_full_disk,
    ),
    (
        "eight_threads_with_close_and_reopen",
        eight_threads_with_close_and_reopen,
    ),
    (
        "asynchronous_commits_on_a_full_disk",
        asynchronous_commits_on_a_full_disk,
    ),
    (
        "scoped_commits_on_a_full_disk",
        scoped_commits_on_a_full_disk,
    ),
    (
        "writes_through_on_a_full_disk",
        writes_through_on_a_full_disk,
    ),
    ("large_writes_on_a_full_disk", large_writes_on_a_full_disk),
    (
        "large_writes_into_a_hole_on_a_full_disk",
        large_writes_into_a_hole_on_a_full_disk,
    ),
    (
        "large_writes_past_the_end_on_a_full_disk",
        large_writes_past_the_end_on_a_full_disk,
    ),
];

/// Every case on every file system (a test named `<fs>::<case>`, ignored
/// where the file system cannot be made here), and the one case that runs
/// in the target directory.
/// Bytes the file system allocated to a file (`st_blocks * 512`; its
/// length where the platform does not say).
fn allocated_bytes(meta: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    return std::os::unix::fs::MetadataExt::blocks(meta) * 512;
    #[cfg(not(unix))]
    meta.len()
}

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    common::print_fs_reasons(&FsKind::ALL);
    let mut trials = Vec::new();
    for kind in FsKind::ALL {
        let module = kind.name().replace('-', "_");
        for (case, f) in CASES {
            trials.push(common::fs_trial(
                format!("{module}::{case}"),
                kind,
                move || f(kind),
            ));
        }
    }
    trials.push(common::trial(
        "only_writes_in_flight_beside_others_preallocate_under_o_direct",
        only_writes_in_flight_beside_others_preallocate_under_o_direct,
    ));
    libtest_mimic::run(&args, trials).exit_code()
}

fn only_writes_in_flight_beside_others_preallocate_under_o_direct() {
    // Growing an O_DIRECT file: a flush whose writes are in flight beside
    // each other (io_uring, several runs) reserves the blocks first
    // (parallel writes into one file need them allocated); a writer with
    // one write call at a time lets each write allocate written blocks
    // itself (`FileSize::preallocate`, src/cached_file/size.rs). A lone
    // committer's flush of one run is one write on every engine: io_uring
    // writes it inline (`pwritev`, or `pwrite` from a copy of scattered
    // pages), no ring, no fallocate.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // (config, preallocates with two runs per commit, with one)
    let mut cases = vec![
        (
            Config::default().engine(FlushEngine::Vectored),
            false,
            false,
        ),
        (Config::default().engine(FlushEngine::Concat), false, false),
        (Config::default().engine(FlushEngine::PerPage), false, false),
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
                // Two runs per flush give the ring two to have in flight.
                for r in 0..runs {
                    let p = commit * 40 + r * 20;
                    for q in p..p + 4 {
                        f.write_page(q * PS as u64, &page(PS, q, 1)).unwrap();
                    }
                }
                f.sync().unwrap();
            }
            let fallocates = calls.fallocate.load(Ordering::Relaxed);
            let writes = calls.writes.load(Ordering::Relaxed);
            let what = format!(
                "{cfg:?}, {runs} run(s) per commit: {fallocates} fallocate, {writes} pwrite(v)"
            );
            assert_eq!(fallocates > 0, preallocates, "{what}");
            if matches!(cfg.engine, FlushEngine::IoUring { .. }) {
                // The ring's writes bypass the backend; inline ones do not.
                assert_eq!(writes, if runs == 1 { 4 } else { 0 }, "{what}");
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
