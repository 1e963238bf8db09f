//! `stream::write_file` on real files: the bytes, O_DIRECT tails, ENOSPC
//! part way, bad arguments, progress.

mod common;

use std::path::Path;

use pagewriter::DirectIo;
use pagewriter_bench::datagen::Generator;
use pagewriter_bench::error::{CoreError, Error};
use pagewriter_bench::stream::{self, StreamEngine, WriteOptions};

/// Engines to run: pwrite always, io_uring where a ring can be set up.
fn engines() -> Vec<StreamEngine> {
    let mut v = vec![StreamEngine::Pwrite];
    if pagewriter::testing::uring_available() {
        v.push(StreamEngine::IoUring);
    } else {
        eprintln!("io_uring unavailable here: its cases are skipped");
    }
    v
}

fn small(engine: StreamEngine, direct: DirectIo) -> WriteOptions {
    WriteOptions {
        buffer_size: 1 << 20,
        buffer_count: 5,
        queue_depth: 3,
        engine,
        direct,
        gen_threads: 2,
        writer_threads: 3,
        dedup_ratio: 1.5,
        compress_ratio: 2.0,
        seed: 42,
        ..WriteOptions::default()
    }
}

/// Panics at the first byte of `path` that differs from the generator's.
fn assert_file_is_generated(path: &Path, size: u64, opts: &WriteOptions) {
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, size, "file length");
    let generator = Generator::new(opts.gen_config(size)).unwrap();
    let mut want = vec![0u8; size as usize];
    generator.fill_at(0, &mut want).unwrap();
    if let Some(i) = data.iter().zip(&want).position(|(a, b)| a != b) {
        panic!("byte {i} differs from the generator's");
    }
}

fn file_bytes_are_the_generators_bytes_at_every_offset() {
    let dir = tempfile::tempdir().unwrap();
    let size = (9 << 20) + 12_345; // a short last chunk
    for engine in engines() {
        for direct in [DirectIo::Off, DirectIo::Auto] {
            let path = dir.path().join(format!("f-{engine:?}-{direct:?}"));
            let opts = small(engine, direct);
            let stats = stream::write_file(&path, size, &opts).unwrap();
            assert_eq!(stats.bytes, size);
            assert_eq!(stats.contiguous_bytes, size);
            assert!(stats.writes >= 10, "{} writes", stats.writes);
            assert_eq!(
                stats.engine,
                match engine {
                    StreamEngine::IoUring => "io_uring",
                    _ => "pwrite",
                }
            );
            assert_file_is_generated(&path, size, &opts);
        }
    }
}

fn bytes_do_not_depend_on_buffer_size_threads_or_engine() {
    let dir = tempfile::tempdir().unwrap();
    let size = 5 << 20;
    let mut files = Vec::new();
    for (i, (buffer_size, gen_threads)) in [(1 << 20, 1), (64 << 10, 3), (3 << 20, 2)]
        .into_iter()
        .enumerate()
    {
        for engine in engines() {
            let path = dir.path().join(format!("d{i}-{engine:?}"));
            let opts = WriteOptions {
                buffer_size,
                gen_threads,
                ..small(engine, DirectIo::Off)
            };
            stream::write_file(&path, size, &opts).unwrap();
            files.push(std::fs::read(&path).unwrap());
        }
    }
    assert!(files.windows(2).all(|w| w[0] == w[1]));
}

fn o_direct_writes_an_unaligned_tail_and_cuts_the_file_to_size() {
    let dir = tempfile::tempdir().unwrap();
    if !pagewriter::testing::direct_available(dir.path()) {
        eprintln!("O_DIRECT refused here; skipped");
        return;
    }
    for engine in engines() {
        for size in [1u64, 511, 4097, (2 << 20) + 1] {
            let path = dir.path().join(format!("t-{engine:?}-{size}"));
            let opts = small(engine, DirectIo::On);
            let stats = stream::write_file(&path, size, &opts).unwrap();
            assert!(stats.direct.is_some(), "O_DIRECT was asked for: {stats:?}");
            assert_eq!(stats.bytes, size);
            assert_file_is_generated(&path, size, &opts);
        }
    }
}

fn bad_arguments_are_errors_and_leave_an_existing_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keep");
    std::fs::write(&path, b"precious").unwrap();
    let base = small(StreamEngine::Auto, DirectIo::Off);
    let cases: Vec<(u64, WriteOptions)> = vec![
        (0, base.clone()),
        (
            1 << 20,
            WriteOptions {
                dedup_ratio: 0.5,
                ..base.clone()
            },
        ),
        (
            1 << 20,
            WriteOptions {
                compress_ratio: f64::NAN,
                ..base.clone()
            },
        ),
        (
            1 << 20,
            WriteOptions {
                buffer_size: 0,
                ..base.clone()
            },
        ),
        (
            1 << 20,
            WriteOptions {
                buffer_size: 2 << 30,
                ..base.clone()
            },
        ),
        (
            1 << 20,
            WriteOptions {
                buffer_count: 0,
                ..base.clone()
            },
        ),
        (
            1 << 20,
            WriteOptions {
                queue_depth: 0,
                ..base.clone()
            },
        ),
        (
            1 << 20,
            WriteOptions {
                gen_threads: 0,
                ..base.clone()
            },
        ),
    ];
    for (size, opts) in cases {
        let err = stream::write_file(&path, size, &opts).unwrap_err();
        assert!(
            matches!(err.error, Error::Core(CoreError::InvalidConfig(_))),
            "{err}"
        );
        assert_eq!(err.stats.bytes, 0);
    }
    if pagewriter::testing::direct_available(dir.path()) {
        let opts = WriteOptions {
            buffer_size: 1000,
            ..small(StreamEngine::Auto, DirectIo::On)
        };
        let err = stream::write_file(&path, 1 << 20, &opts).unwrap_err();
        assert!(
            matches!(&err.error, Error::Core(CoreError::InvalidConfig(m)) if m.contains("O_DIRECT")),
            "{err}"
        );
        // Auto writes it buffered instead, and says why.
        let opts = WriteOptions {
            direct: DirectIo::Auto,
            ..opts
        };
        std::fs::write(&path, b"precious").unwrap();
        let stats = stream::write_file(dir.path().join("auto"), 100_000, &opts).unwrap();
        assert!(stats.direct.is_none());
        assert!(
            stats
                .fallbacks
                .iter()
                .any(|f| f.contains("buffer_size 1000"))
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

fn progress_is_reported_and_ends_at_the_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen: Vec<u64> = Vec::new();
    let size = 8 << 20;
    let opts = small(StreamEngine::Auto, DirectIo::Off);
    stream::write_file_with_progress(dir.path().join("p"), size, &opts, &mut |p| {
        assert_eq!(p.total, size);
        seen.push(p.bytes_done)
    })
    .unwrap();
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(seen.last(), Some(&size));
}

fn hugepage_buffers_work_or_report_the_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriteOptions {
        hugepages: true,
        ..small(StreamEngine::Auto, DirectIo::Auto)
    };
    let path = dir.path().join("h");
    let stats = stream::write_file(&path, 3 << 20, &opts).unwrap();
    let kind = stats.hugepages.expect("huge pages were asked for");
    if kind == pagewriter::buffer::HugePages::Transparent {
        assert!(
            stats.fallbacks.iter().any(|f| f.contains("MAP_HUGETLB")),
            "{:?}",
            stats.fallbacks
        );
    }
    assert_file_is_generated(&path, 3 << 20, &opts);
}

/// A 4 MiB tmpfs mounted in a temporary directory, unmounted on drop;
/// `None` where mounting is not allowed (not root, no CAP_SYS_ADMIN).
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "pagewriter-enospc"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Self(dir))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // A ring's file reference is released by the kernel shortly after
        // the ring closes: retry a busy unmount, then detach it lazily.
        for _ in 0..50 {
            let ok = std::process::Command::new("umount")
                .arg(self.0.path())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

fn enospc_part_way_is_an_error_that_says_how_far_it_got() {
    let Some(fs) = SmallFs::mount() else {
        common::require_fs(pagewriter::testing::FsKind::Tmpfs);
        return;
    };
    let size = 16 << 20;
    for engine in engines() {
        let path = fs.0.path().join("full");
        // `force`: past the free-space check, to reach ENOSPC part-way.
        let opts = WriteOptions {
            preallocate: false,
            buffer_size: 256 << 10,
            force: true,
            ..small(engine, DirectIo::Off)
        };
        let err = stream::write_file(&path, size, &opts).unwrap_err();
        match &err.error {
            Error::Core(CoreError::Io { source, .. }) => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC))
            }
            other => panic!("{other:?}"),
        }
        let s = &err.stats;
        // Writes complete out of offset order: the one at offset 0 may be
        // the one that found the file system full, so the prefix known
        // written may be empty; it never exceeds what fits.
        assert!(s.contiguous_bytes <= 4 << 20, "{s:?}");
        assert!(s.bytes >= s.contiguous_bytes && s.bytes < size, "{s:?}");
        // The partial file is gone (the file system is not left full), and
        // the target was never created.
        assert!(!path.exists());
        assert!(!stream::partial_path(&path).exists());

        // With preallocation the file is refused before any write.
        let opts = WriteOptions {
            preallocate: true,
            ..opts
        };
        let err = stream::write_file(&path, size, &opts).unwrap_err();
        assert!(
            matches!(&err.error, Error::Core(CoreError::Io { op, source, .. })
                if *op == "fallocate" && source.raw_os_error() == Some(libc::ENOSPC)),
            "{err}"
        );
        assert_eq!(err.stats.bytes, 0);
        assert!(!path.exists() && !stream::partial_path(&path).exists());
    }
}

fn a_cancelled_write_removes_its_partial_file_and_leaves_the_old_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    for engine in engines() {
        let path = dir.path().join(format!("c-{engine:?}"));
        std::fs::write(&path, b"the old file").unwrap();
        let opts = small(engine, DirectIo::Off);
        // Set before the start: nothing is written.
        let set = AtomicBool::new(true);
        let e =
            stream::write_file_cancellable(&path, 64 << 20, &opts, &mut |_| {}, &set).unwrap_err();
        assert!(matches!(e.error, Error::Cancelled), "{engine:?}: {e}");
        // Set by the first progress report, part way through a large file.
        let flag = AtomicBool::new(false);
        let mut reports = 0;
        let e = stream::write_file_cancellable(
            &path,
            64 << 30,
            &WriteOptions {
                preallocate: false,
                force: true,
                ..opts.clone()
            },
            &mut |_| {
                reports += 1;
                flag.store(true, Ordering::Relaxed);
            },
            &flag,
        )
        .unwrap_err();
        assert!(matches!(e.error, Error::Cancelled), "{engine:?}: {e}");
        assert!(reports >= 1);
        assert!(e.stats.bytes < 64 << 30, "stopped part way");
        assert!(
            !stream::partial_path(&path).exists(),
            "partial file removed"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"the old file");
    }
}

/// The tests, the one on a tmpfs made for it reported as ignored where it
/// cannot be made here (a libtest-mimic harness).
fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    common::print_fs_reasons(&[pagewriter::testing::FsKind::Tmpfs]);
    let trials = vec![
        common::trial(
            "file_bytes_are_the_generators_bytes_at_every_offset",
            file_bytes_are_the_generators_bytes_at_every_offset,
        ),
        common::trial(
            "bytes_do_not_depend_on_buffer_size_threads_or_engine",
            bytes_do_not_depend_on_buffer_size_threads_or_engine,
        ),
        common::trial(
            "o_direct_writes_an_unaligned_tail_and_cuts_the_file_to_size",
            o_direct_writes_an_unaligned_tail_and_cuts_the_file_to_size,
        ),
        common::trial(
            "bad_arguments_are_errors_and_leave_an_existing_file_alone",
            bad_arguments_are_errors_and_leave_an_existing_file_alone,
        ),
        common::trial(
            "progress_is_reported_and_ends_at_the_size",
            progress_is_reported_and_ends_at_the_size,
        ),
        common::trial(
            "hugepage_buffers_work_or_report_the_fallback",
            hugepage_buffers_work_or_report_the_fallback,
        ),
        common::fs_trial(
            "enospc_part_way_is_an_error_that_says_how_far_it_got",
            pagewriter::testing::FsKind::Tmpfs,
            enospc_part_way_is_an_error_that_says_how_far_it_got,
        ),
        common::trial(
            "a_cancelled_write_removes_its_partial_file_and_leaves_the_old_one",
            a_cancelled_write_removes_its_partial_file_and_leaves_the_old_one,
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
