//! Every engine (io_uring included) and both I/O modes (buffered and
//! O_DIRECT) on real files: round trips, injected write faults, short
//! writes, failed fdatasync, concurrency, and the reported fallbacks.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{direct_available, file_engines, page, tag_of};
use pagewriter::testing::{FaultyBackend, WriteFault};
use pagewriter::{Config, DirectIo, Error, FileBackend, FlushEngine, PagedCachedFile};

const PS: usize = 4096;

fn modes(dir: &std::path::Path) -> Vec<DirectIo> {
    if direct_available(dir) {
        vec![DirectIo::Off, DirectIo::On]
    } else {
        eprintln!(
            "O_DIRECT unavailable in {}: direct cases skipped",
            dir.display()
        );
        vec![DirectIo::Off]
    }
}

/// A test directory on the checkout's file system (tmpfs /tmp would not
/// show the disk's O_DIRECT behaviour).
fn test_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn open_backend(path: &std::path::Path, direct: DirectIo) -> FileBackend {
    match direct {
        DirectIo::On => FileBackend::open_direct(path).unwrap(),
        _ => FileBackend::open(path).unwrap(),
    }
}

#[test]
fn round_trip_every_engine_buffered_and_direct() {
    let dir = test_dir();
    for direct in modes(dir.path()) {
        for engine in file_engines() {
            let path = dir.path().join(format!("rt-{}-{direct:?}", engine.name()));
            {
                let f =
                    PagedCachedFile::open(&path, Config::default().engine(engine).direct(direct))
                        .unwrap();
                assert_eq!(
                    f.io_mode().direct.is_some(),
                    direct == DirectIo::On,
                    "{}",
                    f.io_mode()
                );
                assert_eq!(f.io_mode().engine, engine);
                // Out of order, gaps, a multi-page write, a rewrite.
                for p in [7u64, 3, 0, 1, 2, 9, 30, 31, 32] {
                    f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
                }
                let mut two = page(PS, 4, 1);
                two.extend(page(PS, 5, 1));
                f.write_page(4 * PS as u64, &two).unwrap();
                f.sync().unwrap();
                f.write_page(PS as u64, &page(PS, 1, 2)).unwrap();
                f.close().unwrap();
            }
            let f = PagedCachedFile::open(&path, Config::default().engine(engine).direct(direct))
                .unwrap();
            for p in [0u64, 2, 3, 4, 5, 7, 9, 30, 31, 32] {
                assert_eq!(
                    tag_of(&f.read(p * PS as u64, PS).unwrap()),
                    (p, 1),
                    "{engine:?} {direct:?} {p}"
                );
            }
            assert_eq!(tag_of(&f.read(PS as u64, PS).unwrap()), (1, 2));
            assert!(f.read(6 * PS as u64, PS).unwrap().iter().all(|&b| b == 0));
        }
    }
}

fn faulty_file(
    path: &std::path::Path,
    direct: DirectIo,
) -> (
    Arc<FaultyBackend<FileBackend>>,
    Arc<FaultyBackend<FileBackend>>,
) {
    let be = Arc::new(FaultyBackend::new(open_backend(path, direct)));
    (be.clone(), be)
}

fn disk(path: &std::path::Path, p: u64) -> (u64, u64) {
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; PS];
    common::read_at(&f, &mut buf, p * PS as u64);
    tag_of(&buf)
}

#[test]
fn write_faults_keep_pages_dirty_on_every_engine() {
    let dir = test_dir();
    for direct in modes(dir.path()) {
        for engine in file_engines() {
            // Short writes must be sector-sized under O_DIRECT.
            let short = if direct == DirectIo::On {
                2 * 512
            } else {
                1000
            };
            for fault in [
                WriteFault::Errno(libc::EIO),
                WriteFault::Errno(libc::ENOSPC),
                WriteFault::TornThenEio(512),
            ] {
                let path = dir
                    .path()
                    .join(format!("wf-{}-{direct:?}-{fault:?}", engine.name()));
                let (be, sh) = faulty_file(&path, direct);
                let f = PagedCachedFile::new(sh, Config::default().engine(engine).max_run_pages(4))
                    .unwrap();
                for p in (0..4u64).chain(10..14) {
                    f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
                }
                // The first write call (first page for per-page) fails.
                be.schedule_writes([fault]);
                let err = f.sync().unwrap_err();
                assert!(matches!(err, Error::PagesFailed { .. }), "{err}");
                for p in (0..4u64).chain(10..14) {
                    assert_eq!(
                        tag_of(&f.read(p * PS as u64, PS).unwrap()),
                        (p, 1),
                        "{engine:?} {fault:?}"
                    );
                }
                f.write_page(PS as u64, &page(PS, 1, 2)).unwrap();
                f.sync().unwrap();
                for p in (0..4u64).chain(10..14) {
                    let v = if p == 1 { 2 } else { 1 };
                    assert_eq!(
                        disk(&path, p),
                        (p, v),
                        "{engine:?} {direct:?} {fault:?} page {p}"
                    );
                }
                assert_eq!(f.stats().buffered_bytes, 0);
            }
            // A short write is continued, not reported as an error.
            let path = dir
                .path()
                .join(format!("short-{}-{direct:?}", engine.name()));
            let (be, sh) = faulty_file(&path, direct);
            let f = PagedCachedFile::new(sh, Config::default().engine(engine)).unwrap();
            for p in 0..8u64 {
                f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            }
            be.schedule_writes([WriteFault::Short(short), WriteFault::Short(PS + short)]);
            f.sync().unwrap();
            for p in 0..8u64 {
                assert_eq!(
                    disk(&path, p),
                    (p, 1),
                    "{engine:?} {direct:?} short write, page {p}"
                );
            }
        }
    }
}

#[test]
fn failed_fdatasync_poisons_on_every_engine() {
    let dir = test_dir();
    for engine in file_engines() {
        let path = dir.path().join(format!("fs-{}", engine.name()));
        let (be, sh) = faulty_file(&path, DirectIo::Off);
        let f = PagedCachedFile::new(sh, Config::default().engine(engine)).unwrap();
        for p in 0..4u64 {
            f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        }
        be.schedule_syncs([Some(libc::EIO)]);
        assert!(matches!(
            f.sync(),
            Err(Error::Io {
                op: "fdatasync",
                ..
            })
        ));
        assert!(matches!(f.sync(), Err(Error::Poisoned)));
        assert!(matches!(
            f.write_page(0, &page(PS, 0, 2)),
            Err(Error::Poisoned)
        ));
        for p in 0..4u64 {
            assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, 1));
        }
    }
}

#[test]
fn concurrent_writers_readers_and_commits_on_every_engine() {
    let dir = test_dir();
    for direct in modes(dir.path()) {
        for engine in file_engines() {
            let path = dir.path().join(format!("cc-{}-{direct:?}", engine.name()));
            let f = PagedCachedFile::open(
                &path,
                Config::default()
                    .engine(engine)
                    .direct(direct)
                    .read_cache_bytes(32 * PS)
                    .max_write_buffer_bytes(64 * PS),
            )
            .unwrap();
            const PAGES: u64 = 128;
            let versions: Vec<AtomicU64> = (0..PAGES).map(|_| AtomicU64::new(0)).collect();
            for p in 0..PAGES {
                f.write_page(p * PS as u64, &page(PS, p, 0)).unwrap();
            }
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                let writers: Vec<_> = (0..4u64)
                    .map(|w| {
                        let (f, versions) = (&f, &versions);
                        s.spawn(move || {
                            for i in 0..400u64 {
                                let p = ((i * 13 + w) % (PAGES / 4)) * 4 + w;
                                let v = versions[p as usize].load(Ordering::SeqCst) + 1;
                                f.write_page(p * PS as u64, &page(PS, p, v)).unwrap();
                                versions[p as usize].store(v, Ordering::SeqCst);
                                if i % 20 == 0 {
                                    f.sync().unwrap();
                                }
                            }
                        })
                    })
                    .collect();
                let reader = s.spawn(|| {
                    let mut i = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let p = (i * 7) % PAGES;
                        i += 1;
                        let floor = versions[p as usize].load(Ordering::SeqCst);
                        let (tp, v) = tag_of(&f.read(p * PS as u64, PS).unwrap());
                        assert_eq!(tp, p);
                        assert!(v >= floor, "{engine:?}: page {p} read {v} after {floor}");
                    }
                });
                let ok = writers.into_iter().all(|h| h.join().is_ok());
                stop.store(true, Ordering::SeqCst);
                assert!(
                    reader.join().is_ok() && ok,
                    "{engine:?} {direct:?}: a thread failed"
                );
            });
            f.close().unwrap();
            for p in 0..PAGES {
                assert_eq!(
                    disk(&path, p),
                    (p, versions[p as usize].load(Ordering::SeqCst))
                );
            }
        }
    }
}

/// A file backend whose `file()` is an io_uring ring's own descriptor,
/// which the kernel refuses to register in a ring (EBADF): ring setup for
/// the flush engine fails for real.
#[cfg(target_os = "linux")]
#[derive(Debug)]
struct UnregistrableFd(FileBackend, std::fs::File);

#[cfg(target_os = "linux")]
impl pagewriter::StorageBackend for UnregistrableFd {
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
        self.0.sync_data()
    }
    fn file(&self) -> Option<&std::fs::File> {
        Some(&self.1)
    }
}

/// Linux only: io_uring.
#[test]
#[cfg(target_os = "linux")]
fn io_uring_setup_failure_is_an_error_or_a_reported_fallback() {
    if !common::uring_available() {
        eprintln!("io_uring unavailable here: skipped");
        return;
    }
    let dir = test_dir();
    let be = || {
        use std::os::fd::AsFd;
        let ring = io_uring::IoUring::new(2).unwrap();
        let fd = ring.as_fd().try_clone_to_owned().unwrap();
        UnregistrableFd(
            FileBackend::open(dir.path().join("fb")).unwrap(),
            std::fs::File::from(fd),
        )
    };
    let err = PagedCachedFile::new(
        be(),
        Config::default().engine(FlushEngine::IoUring { queue_depth: 8 }),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Io {
                op: "io_uring setup",
                ..
            }
        ),
        "{err}"
    );
    let f = PagedCachedFile::new(
        be(),
        Config::default().engine(FlushEngine::Auto { queue_depth: 8 }),
    )
    .unwrap();
    assert_eq!(f.io_mode().engine, FlushEngine::Vectored);
    let why = f.io_mode().engine_fallback.clone().unwrap();
    assert!(why.contains("io_uring refused"), "{why}");
    assert!(
        f.io_mode()
            .to_string()
            .starts_with("pwritev (io_uring refused"),
        "{}",
        f.io_mode()
    );
    // And it works as the fallback engine.
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    f.sync().unwrap();
    assert_eq!(disk(&dir.path().join("fb"), 0), (0, 1));

    // No descriptor at all (a memory backend).
    let err = PagedCachedFile::new(
        pagewriter::MemoryBackend::new(),
        Config::default().engine(FlushEngine::IoUring { queue_depth: 8 }),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    let f = PagedCachedFile::new(
        pagewriter::MemoryBackend::new(),
        Config::default().engine(FlushEngine::Auto { queue_depth: 8 }),
    )
    .unwrap();
    assert_eq!(f.io_mode().engine, FlushEngine::Vectored);
    assert!(f.io_mode().engine_fallback.is_some());
    for qd in [0u32, 4097] {
        let r = PagedCachedFile::new(
            pagewriter::MemoryBackend::new(),
            Config::default().engine(FlushEngine::IoUring { queue_depth: qd }),
        );
        assert!(
            matches!(r, Err(Error::InvalidConfig(_))),
            "queue depth {qd}"
        );
    }
}

#[test]
fn direct_io_misfits_are_errors_or_reported_fallbacks() {
    let dir = test_dir();
    if !direct_available(dir.path()) {
        eprintln!("O_DIRECT unavailable: skipped");
        return;
    }
    let align = FileBackend::open_direct(dir.path().join("a"))
        .unwrap()
        .direct()
        .unwrap();
    // A page smaller than the offset alignment.
    let small = (align.offset as usize / 2).max(1).next_power_of_two();
    if small < align.offset as usize {
        let cfg = Config::default()
            .page_size(small)
            .max_write_buffer_bytes(1 << 20);
        let err = PagedCachedFile::open(dir.path().join("s1"), cfg.clone().direct(DirectIo::On))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
        let f = PagedCachedFile::open(dir.path().join("s2"), cfg.direct(DirectIo::Auto)).unwrap();
        assert!(f.io_mode().direct.is_none());
        assert!(
            f.io_mode().to_string().contains("buffered (page size"),
            "{}",
            f.io_mode()
        );
    }
    // A file whose length is not a whole number of pages.
    let odd = dir.path().join("odd");
    std::fs::write(&odd, vec![1u8; PS + 100]).unwrap();
    let err = PagedCachedFile::open(&odd, Config::default().direct(DirectIo::On)).unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    let f = PagedCachedFile::open(&odd, Config::default().direct(DirectIo::Auto)).unwrap();
    assert!(
        f.io_mode()
            .direct_fallback
            .as_deref()
            .unwrap()
            .contains("not a whole number")
    );
    assert_eq!(f.read(0, PS).unwrap()[..], vec![1u8; PS][..]);
    // A buffered backend cannot serve DirectIo::On.
    let err = PagedCachedFile::new(
        FileBackend::open(dir.path().join("b")).unwrap(),
        Config::default().direct(DirectIo::On),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    // What is in force is printed as such.
    let f = PagedCachedFile::open(
        dir.path().join("ok"),
        Config::default()
            .direct(DirectIo::On)
            .engine(FlushEngine::Vectored),
    )
    .unwrap();
    assert_eq!(
        f.io_mode().to_string(),
        format!(
            "{}, {} (align {})",
            pagewriter::backend::PLATFORM.vectored_write,
            pagewriter::backend::PLATFORM.direct_io.unwrap(),
            align.offset
        )
        .replace(
            &format!("align {}", align.offset),
            &if align.memory == align.offset {
                format!("align {}", align.offset)
            } else {
                format!("align {} memory, {} offset", align.memory, align.offset)
            },
        )
    );
}

/// Under `O_DIRECT` the pwritev engine writes a run whose pages lie
/// scattered in memory from one copy (one `pwrite` of the whole run), and
/// a run in one piece of memory zero-copy (`pwritev`); buffered, every run
/// is a `pwritev`. So does the io_uring engine with a lone one-run flush,
/// which it writes on the flushing thread. Both read back whole after a
/// reopen, the copy too with `commit_dsync`'s durable write.
#[test]
fn scattered_runs_are_copied_under_direct_io() {
    let dir = test_dir();
    let engines = file_engines()
        .into_iter()
        .filter(|e| matches!(e, FlushEngine::Vectored | FlushEngine::IoUring { .. }));
    for (engine, direct) in engines.flat_map(|e| modes(dir.path()).into_iter().map(move |d| (e, d)))
    {
        {
            let path = dir
                .path()
                .join(format!("gather-{}-{engine:?} {direct:?}", engine.name()));
            let (be, sh) = faulty_file(&path, direct);
            let cfg = Config::default().engine(engine);
            let f = PagedCachedFile::new(sh, cfg.clone()).unwrap();
            // Fresh pages (`overwrite`) taken in file order come out of one
            // slab in address order: one piece of memory.
            for p in 0..16u64 {
                let mut g = f.overwrite(p * PS as u64, PS).unwrap();
                g.copy_from_slice(&page(PS, p, 1));
            }
            let (calls, buffers) = (be.write_calls(), be.buffer_write_calls());
            f.sync().unwrap();
            assert_eq!(
                be.write_calls() - calls,
                1,
                "{engine:?} {direct:?}: one run, one call"
            );
            assert_eq!(
                be.buffer_write_calls() - buffers,
                0,
                "{engine:?} {direct:?}: a run in one piece goes out zero-copy"
            );
            // Written back to front, the next run's pages lie in memory in
            // the opposite order of the file: 16 pieces.
            for p in (16..32u64).rev() {
                f.write_page(p * PS as u64, &page(PS, p, 2)).unwrap();
            }
            let (calls, buffers) = (be.write_calls(), be.buffer_write_calls());
            f.sync().unwrap();
            assert_eq!(
                be.write_calls() - calls,
                1,
                "{engine:?} {direct:?}: one run, one call"
            );
            let copied = u64::from(direct == DirectIo::On);
            assert_eq!(
                be.buffer_write_calls() - buffers,
                copied,
                "{engine:?} {direct:?}: scattered pages copied only under O_DIRECT"
            );
            f.close().unwrap();
            let f = PagedCachedFile::open(&path, cfg.direct(direct)).unwrap();
            for p in 0..32u64 {
                let v = if p < 16 { 1 } else { 2 };
                assert_eq!(disk(&path, p), (p, v), "{engine:?} {direct:?}: page {p}");
                assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, v));
            }
        }
    }
}

/// The vectored engine's writer threads copy scattered runs under
/// `O_DIRECT` too, each into its own buffer: a flush of four runs, each
/// written back to front, goes out as four `pwrite`s (four `pwritev`s
/// buffered), and every page reads back from the file.
#[test]
fn writer_threads_copy_scattered_runs_under_direct_io() {
    let dir = test_dir();
    for direct in modes(dir.path()) {
        let path = dir.path().join(format!("pool-gather-{direct:?}"));
        let (be, sh) = faulty_file(&path, direct);
        let cfg = Config::default().engine(FlushEngine::Vectored);
        let f = PagedCachedFile::new(sh, cfg.clone()).unwrap();
        // Runs of 4 pages at pages 0, 8, 16 and 24, each written back to
        // front: 4 pieces of memory per run.
        for run in 0..4u64 {
            for p in (run * 8..run * 8 + 4).rev() {
                f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
            }
        }
        let (calls, buffers) = (be.write_calls(), be.buffer_write_calls());
        f.flush().unwrap();
        assert_eq!(be.write_calls() - calls, 4, "{direct:?}: a call per run");
        let copied = if direct == DirectIo::On { 4 } else { 0 };
        assert_eq!(
            be.buffer_write_calls() - buffers,
            copied,
            "{direct:?}: scattered runs copied only under O_DIRECT"
        );
        f.close().unwrap();
        for run in 0..4u64 {
            for p in run * 8..run * 8 + 4 {
                assert_eq!(disk(&path, p), (p, 1), "{direct:?}: page {p}");
            }
        }
    }
}
