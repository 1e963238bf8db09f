//! The CLI's promises about files and runs: what `io` creates goes when its
//! run fails or is interrupted, a read job reads a file its owner may only
//! read, `--verify` checks what was written and only that, a rank that
//! already reported is not silently replaced, `write-file` never replaces a
//! file it may not write and leaves nothing when its rename fails, and
//! `scale` and `flush` never fill the file system. Cases that need another
//! user run the binary as `nobody` with setpriv(1) (skipped with a printed
//! reason where that is not possible); cases that need a small file system
//! make a tmpfs (reported as ignored where this machine cannot).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pagewriter::testing::{FsKind, ScratchFs};

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn small_fs(mib: u64) -> Option<ScratchFs> {
    let fs = ScratchFs::new(FsKind::Tmpfs, Path::new(env!("CARGO_TARGET_TMPDIR")), mib);
    if fs.is_none() {
        common::require_fs(FsKind::Tmpfs);
    }
    fs
}

fn pw(args: &[&str], extra: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pagewriter"))
        .args(args)
        .args(extra)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Failed, with `needle` in its message, and no panic.
fn assert_refused(out: &Output, needle: &str) {
    let err = stderr(out);
    assert!(!out.status.success(), "succeeded: {err}");
    assert!(!err.contains("panicked"), "panicked: {err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
}

/// Whether this process is root (files' permissions do not stop it).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}

/// The CLI as a user permissions apply to: `nobody` through setpriv(1)
/// when this is root, else this user. `None` (reason printed) where root
/// cannot switch.
fn as_user(args: &[&str], extra: &[&Path]) -> Option<Output> {
    let bin = env!("CARGO_BIN_EXE_pagewriter");
    if !is_root() {
        return Some(pw(args, extra));
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin])
        .args(args)
        .args(extra)
        .env("RUST_BACKTRACE", "0")
        .output();
    match out {
        Ok(o) if stderr(&o).contains("setpriv:") => {
            eprintln!("setpriv refused here ({}): case skipped", stderr(&o).trim());
            None
        }
        Ok(o) => Some(o),
        Err(e) => {
            eprintln!("no setpriv here ({e}): case skipped");
            None
        }
    }
}

/// A directory in /tmp that `nobody` can enter and read (the target
/// directory may not be).
fn world_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

// ---- io ----

fn randwrite_verify_checks_the_whole_blocks_it_wrote_when_size_is_not_a_multiple_of_bs() {
    let d = dir();
    // 10 blocks of 64 KiB and a 5000-byte tail: random writes never cover
    // the tail and verify the 10 whole blocks; a sequential job writes the
    // tail too, and verifies it.
    for (rw, blocks) in [("randwrite", 10), ("write", 11)] {
        let f = d.path().join(format!("{rw}.bin"));
        let out = pw(
            &[
                "io",
                "--rw",
                rw,
                "--bs",
                "64KiB",
                "--size",
                "660360",
                "--verify",
                "--json",
                "--filename",
            ],
            &[&f],
        );
        assert!(out.status.success(), "{rw}: {}", stderr(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["verified_blocks"], blocks, "{rw}: {report}");
    }
}

fn a_read_job_reads_a_file_its_owner_may_only_read() {
    let d = world_dir();
    let f = d.path().join("ro.bin");
    let out = pw(&["write-file", "--size", "1MiB"], &[&f]);
    assert!(out.status.success(), "{}", stderr(&out));
    chmod(&f, 0o444);
    if is_root() {
        // nobody owns nothing here: give it the file.
        let ok = Command::new("chown")
            .arg("65534:65534")
            .arg(&f)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown");
    }
    let before = std::fs::read(&f).unwrap();
    for rw in ["read", "randread"] {
        let Some(out) = as_user(
            &[
                "io",
                "--rw",
                rw,
                "--bs",
                "4KiB",
                "--size",
                "1MiB",
                "--filename",
            ],
            &[&f],
        ) else {
            return;
        };
        assert!(out.status.success(), "{rw}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read(&f).unwrap(), before);
}

fn a_file_io_created_is_removed_when_its_run_fails() {
    let Some(fs) = small_fs(16) else { return };
    let f = fs.path().join("made.bin");
    // --force past the free space: the run fails on ENOSPC part-way.
    let out = pw(
        &[
            "io",
            "--rw",
            "write",
            "--bs",
            "1MiB",
            "--size",
            "64MiB",
            "--force",
            "--filename",
        ],
        &[&f],
    );
    assert!(!out.status.success(), "wrote 64 MiB into 16 MiB");
    assert!(
        !f.exists(),
        "the file the failed run created is still there"
    );
    let free = pagewriter::backend::free_space(fs.path()).unwrap();
    assert!(free > 15 << 20, "{free} B free after the failed run");
    // A file that was there before stays, whatever the run did.
    std::fs::write(&f, b"mine").unwrap();
    let out = pw(
        &[
            "io",
            "--rw",
            "write",
            "--bs",
            "1MiB",
            "--size",
            "64MiB",
            "--force",
            "--filename",
        ],
        &[&f],
    );
    assert!(!out.status.success());
    assert!(f.exists(), "a failed run removed a file it did not create");
}

fn an_interrupted_io_run_removes_the_file_it_created() {
    let d = dir();
    let f = d.path().join("long.bin");
    let child = Command::new(env!("CARGO_BIN_EXE_pagewriter"))
        .args([
            "io",
            "--rw",
            "randwrite",
            "--bs",
            "4KiB",
            "--size",
            "256MiB",
        ])
        .args(["--runtime", "30", "--filename"])
        .arg(&f)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A bounded wait for the job to start (a minute: a loaded machine may
    // be slow to start a process).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !f.exists() || std::fs::metadata(&f).unwrap().len() == 0 {
        assert!(std::time::Instant::now() < deadline, "io never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -INT");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(!f.exists(), "the interrupted run left its file");
}

fn a_rank_reporting_twice_in_one_run_is_refused_without_overwrite() {
    let d = dir();
    let f = d.path().join("shared.bin");
    let reports = d.path().join("reports");
    let rank0 = |extra: &[&str]| {
        let mut args = vec![
            "io",
            "--rw",
            "write",
            "--bs",
            "64KiB",
            "--size",
            "1MiB",
            "--rank",
            "0",
            "--ranks",
            "2",
            "--report-dir",
        ];
        args.push(reports.to_str().unwrap());
        args.extend_from_slice(extra);
        args.push("--shared-file");
        pw(&args, &[&f])
    };
    let out = rank0(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let first = std::fs::read(reports.join("rank-0.json")).unwrap();
    // The same rank again from the same shell: the same default run id.
    let again = rank0(&[]);
    assert_refused(&again, "already holds rank 0's report");
    assert_eq!(std::fs::read(reports.join("rank-0.json")).unwrap(), first);
    // Told to, it replaces it.
    let out = rank0(&["--overwrite"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_ne!(std::fs::read(reports.join("rank-0.json")).unwrap(), first);
}

// ---- write-file ----

fn write_file_refuses_a_target_its_user_may_not_write() {
    let d = world_dir();
    chmod(d.path(), 0o777);
    let f = d.path().join("ro.bin");
    std::fs::write(&f, b"keep me").unwrap();
    chmod(&f, 0o444);
    let Some(out) = as_user(&["write-file", "--size", "1MiB"], &[&f]) else {
        return;
    };
    assert_refused(&out, "not writable");
    assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
    let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "a partial file was left");
}

fn a_failed_rename_leaves_no_partial_file_and_claims_no_bytes() {
    if !is_root() {
        eprintln!("a bind mount needs root: case skipped");
        return;
    }
    let d = dir();
    let target = d.path().join("target.bin");
    let other = d.path().join("other.bin");
    std::fs::write(&target, b"old").unwrap();
    std::fs::write(&other, b"bound").unwrap();
    // A mount point cannot be renamed over (EBUSY).
    let ok = Command::new("mount")
        .arg("--bind")
        .arg(&other)
        .arg(&target)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("bind mount refused here: case skipped");
        return;
    }
    let out = pw(&["write-file", "--size", "1MiB"], &[&target]);
    let _ = Command::new("umount").arg(&target).status();
    assert_refused(&out, "rename into place");
    let err = stderr(&out);
    assert!(!err.contains("bytes are written"), "{err}");
    assert!(!PathBuf::from(format!("{}.partial", target.display())).exists());
    assert_eq!(std::fs::read(&target).unwrap(), b"old");
}

fn argument_errors_claim_no_bytes_written() {
    let d = dir();
    let f = d.path().join("x.bin");
    let out = pw(
        &["write-file", "--size", "1MiB", "--buffer-size", "0"],
        &[&f],
    );
    assert_refused(&out, "buffer");
    assert!(
        !stderr(&out).contains("bytes are written"),
        "{}",
        stderr(&out)
    );
    assert!(!f.exists());
}

fn write_file_through_a_symlink_replaces_its_target_and_keeps_the_link() {
    let d = dir();
    let real = d.path().join("real.bin");
    let link = d.path().join("link.bin");
    std::fs::write(&real, b"old").unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = pw(&["write-file", "--size", "64KiB"], &[&link]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::metadata(&real).unwrap().len(), 64 << 10);
    // flush --file through a link is taken too.
    let out = pw(
        &[
            "flush",
            "--size",
            "1MiB",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--file",
        ],
        &[&link],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // A link to nothing is refused, and nothing is created.
    let dangling = d.path().join("dangling.bin");
    std::os::unix::fs::symlink(d.path().join("nowhere"), &dangling).unwrap();
    let out = pw(&["write-file", "--size", "64KiB"], &[&dangling]);
    assert_refused(&out, "link to nothing");
    assert!(!d.path().join("nowhere").exists());
}

// ---- scale and flush never fill the file system ----

fn scale_refuses_a_transaction_larger_than_the_free_space() {
    let Some(fs) = small_fs(64) else { return };
    let out = pw(
        &[
            "scale",
            "--threads",
            "1",
            "--modes",
            "vectored",
            "--pages",
            "100000000",
            "--path",
        ],
        &[fs.path()],
    );
    assert_refused(&out, "do not fit");
    assert_eq!(std::fs::read_dir(fs.path()).unwrap().count(), 0);
}

fn a_scale_cell_ends_before_its_file_fills_the_file_system() {
    let Some(fs) = small_fs(96) else { return };
    // 1 MiB transactions for 20 s into 96 MiB: without the limit the file
    // would fill it within the first second.
    let out = pw(
        &[
            "scale",
            "--threads",
            "1",
            "--modes",
            "vectored",
            "--pages",
            "256",
            "--duration",
            "20",
            "--repeats",
            "1",
            "--direct",
            "off",
            "--commit",
            "flush",
            "--json",
            "--path",
        ],
        &[fs.path()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cell = &report["cells"][0];
    assert_eq!(cell["room_limited"], true, "{cell}");
    assert!(cell["seconds"].as_f64().unwrap() < 15.0, "{cell}");
    assert!(cell["commits"].as_u64().unwrap() > 0, "{cell}");
    assert!(stderr(&out).contains("ended early"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_dir(fs.path()).unwrap().count(),
        0,
        "scratch left"
    );
}

fn flush_refuses_more_than_the_free_space() {
    let Some(fs) = small_fs(32) else { return };
    let out = pw(
        &["flush", "--size", "64MiB", "--repeats", "1", "--path"],
        &[fs.path()],
    );
    assert_refused(&out, "do not fit");
    assert_eq!(std::fs::read_dir(fs.path()).unwrap().count(), 0);
}

fn an_absurd_duration_is_refused_in_a_short_line() {
    let d = dir();
    let out = pw(&["scale", "--duration", "1e300", "--path"], &[d.path()]);
    assert_refused(&out, "1e300");
    assert!(stderr(&out).len() < 200, "{}", stderr(&out));
}

/// `io` never reports a block it did not write: a size below one block is
/// refused, naming both, and no file is made.
fn io_refuses_a_size_below_one_block() {
    let d = dir();
    let f = d.path().join("small.bin");
    let out = pw(
        &[
            "io",
            "--rw",
            "write",
            "--size",
            "1KiB",
            "--bs",
            "4KiB",
            "--filename",
        ],
        &[&f],
    );
    assert_refused(&out, "size 1024 is smaller than one block (bs 4096)");
    assert!(!f.exists(), "a refused run made its file");
}

/// `io --direct on` never writes a tail through a buffered descriptor while
/// its header says O_DIRECT: refused (and its file gone); `--direct auto`
/// writes it and says so in the header.
fn io_direct_on_refuses_an_unaligned_tail_and_auto_says_which_descriptor() {
    let d = dir();
    if !pagewriter::testing::direct_available(d.path()) {
        eprintln!(
            "skipped: O_DIRECT is not available in {}",
            d.path().display()
        );
        return;
    }
    let f = d.path().join("tail.bin");
    let args = |direct: &'static str| {
        [
            "io",
            "--rw",
            "write",
            "--size",
            "1000",
            "--bs",
            "512",
            "--direct",
            direct,
            "--filename",
        ]
    };
    let out = pw(&args("on"), &[&f]);
    assert_refused(&out, "--direct on: the region ending at byte 1000");
    assert!(!f.exists(), "a refused run left its file");
    let out = pw(&args("auto"), &[&f]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("through a second, buffered descriptor"),
        "the header hides the buffered tail: {text}"
    );
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 1000);
}

/// `report` on a directory that is not there names it.
fn report_names_the_directory_it_cannot_read() {
    let d = dir();
    let missing = d.path().join("no-such-reports");
    let out = pw(&["report"], &[&missing]);
    assert_refused(&out, &missing.display().to_string());
}

/// The tests, those on a tmpfs made for them reported as ignored where it
/// cannot be made here (a libtest-mimic harness).
fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    common::print_fs_reasons(&[FsKind::Tmpfs]);
    let trials = vec![
        common::trial(
            "randwrite_verify_checks_the_whole_blocks_it_wrote_when_size_is_not_a_multiple_of_bs",
            randwrite_verify_checks_the_whole_blocks_it_wrote_when_size_is_not_a_multiple_of_bs,
        ),
        common::trial(
            "a_read_job_reads_a_file_its_owner_may_only_read",
            a_read_job_reads_a_file_its_owner_may_only_read,
        ),
        common::fs_trial(
            "a_file_io_created_is_removed_when_its_run_fails",
            FsKind::Tmpfs,
            a_file_io_created_is_removed_when_its_run_fails,
        ),
        common::trial(
            "an_interrupted_io_run_removes_the_file_it_created",
            an_interrupted_io_run_removes_the_file_it_created,
        ),
        common::trial(
            "a_rank_reporting_twice_in_one_run_is_refused_without_overwrite",
            a_rank_reporting_twice_in_one_run_is_refused_without_overwrite,
        ),
        common::trial(
            "write_file_refuses_a_target_its_user_may_not_write",
            write_file_refuses_a_target_its_user_may_not_write,
        ),
        common::trial(
            "a_failed_rename_leaves_no_partial_file_and_claims_no_bytes",
            a_failed_rename_leaves_no_partial_file_and_claims_no_bytes,
        ),
        common::trial(
            "argument_errors_claim_no_bytes_written",
            argument_errors_claim_no_bytes_written,
        ),
        common::trial(
            "write_file_through_a_symlink_replaces_its_target_and_keeps_the_link",
            write_file_through_a_symlink_replaces_its_target_and_keeps_the_link,
        ),
        common::fs_trial(
            "scale_refuses_a_transaction_larger_than_the_free_space",
            FsKind::Tmpfs,
            scale_refuses_a_transaction_larger_than_the_free_space,
        ),
        common::fs_trial(
            "a_scale_cell_ends_before_its_file_fills_the_file_system",
            FsKind::Tmpfs,
            a_scale_cell_ends_before_its_file_fills_the_file_system,
        ),
        common::fs_trial(
            "flush_refuses_more_than_the_free_space",
            FsKind::Tmpfs,
            flush_refuses_more_than_the_free_space,
        ),
        common::trial(
            "an_absurd_duration_is_refused_in_a_short_line",
            an_absurd_duration_is_refused_in_a_short_line,
        ),
        common::trial(
            "io_refuses_a_size_below_one_block",
            io_refuses_a_size_below_one_block,
        ),
        common::trial(
            "io_direct_on_refuses_an_unaligned_tail_and_auto_says_which_descriptor",
            io_direct_on_refuses_an_unaligned_tail_and_auto_says_which_descriptor,
        ),
        common::trial(
            "report_names_the_directory_it_cannot_read",
            report_names_the_directory_it_cannot_read,
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
