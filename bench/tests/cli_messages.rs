//! Every refusal of the CLI names what the user typed: the flag and its
//! value, or the path; nothing is refused in a library field's name, and
//! a refusal touches no file. A cell with too few commits to rank is
//! marked as such instead of printing a ratio.
//!
//! `PAGEWRITER_BIN` runs these against another build of the binary (how
//! they were shown failing on the one before they were written).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> PathBuf {
    std::env::var_os("PAGEWRITER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pagewriter")))
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn run(args: &[&str], cwd: &Path) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

/// The command fails, its message holds every one of `want`, none of
/// `never`, and the directory it ran in holds nothing new.
fn refused(args: &[&str], want: &[&str], never: &[&str]) {
    let d = dir();
    let out = run(args, d.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded: {err}");
    for w in want {
        assert!(
            err.contains(w),
            "{args:?}: the message does not name {w:?}: {err}"
        );
    }
    for n in never {
        assert!(!err.contains(n), "{args:?}: the message says {n:?}: {err}");
    }
    let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
    assert!(left.is_empty(), "{args:?} left files behind: {left:?}");
}

#[test]
fn sizes_and_counts_are_refused_by_their_flag() {
    refused(
        &["flush", "--bs", "0"],
        &["--bs", "'0'"],
        &["max_write_bytes"],
    );
    refused(&["flush", "--bs", "3000"], &["--bs", "'3000'", "4096"], &[]);
    refused(
        &["scale", "--buffer-mib", "0"],
        &["--buffer-mib", "'0'"],
        &["max_write_buffer_bytes"],
    );
    refused(
        &[
            "write-file",
            "f.bin",
            "--size",
            "1MiB",
            "--buffer-size",
            "0",
        ],
        &["--buffer-size", "'0'"],
        &["buffer_size 0"],
    );
}

/// The commit settings the core no longer has are refused by name (the
/// file's behaviour they chose is fixed or derived now).
#[test]
fn retired_settings_are_refused_by_their_flag() {
    for (cmd, flag, value) in [
        ("scale", "--sync-lanes", "4"),
        ("scale", "--rounds-in-flight", "2"),
        ("scale", "--commit-strategy", "group"),
        ("scale", "--write-threads", "4"),
        ("scale", "--max-write-bytes", "1MiB"),
        ("flush", "--write-threads", "4"),
    ] {
        refused(&[cmd, flag, value], &[flag], &["panicked"]);
    }
    refused(
        &["scale", "--commit-dsync"],
        &["--commit-dsync"],
        &["panicked"],
    );
}

#[test]
fn negative_numbers_are_refused_by_their_flag() {
    refused(
        &["scale", "--rewrite", "-0.1"],
        &["--rewrite", "'-0.1'"],
        &["unexpected argument"],
    );
    refused(
        &["scale", "--duration", "-1"],
        &["--duration", "'-1'"],
        &["unexpected argument"],
    );
    refused(
        &["gen", "--size", "1MiB", "--dedup", "-2", "-o", "g.bin"],
        &["dedup", "-2"],
        &["unexpected argument"],
    );
}

#[test]
fn paths_are_named_as_given() {
    // A directory to verify: named, and called a directory.
    let d = dir();
    let out = run(&["gen", "--verify", "."], d.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--verify .") && err.contains("directory"),
        "{err}"
    );
    // A file in a directory that does not exist: the user's path, never a
    // temporary file's name they did not give.
    refused(
        &["flush", "--size", "8MiB", "--file", "nodir/f.bin"],
        &["--file nodir/f.bin", "nodir"],
        &[".pwtmp", "temporary"],
    );
    refused(
        &["write-file", "nodir/f.bin", "--size", "1MiB"],
        &["nodir/f.bin", "No such file"],
        &[".partial"],
    );
}

#[test]
fn gen_says_what_it_wrote_and_shows_only_the_targets_given() {
    let d = dir();
    let out = run(&["gen", "--size", "1MiB", "-o", "g.bin"], d.path());
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("g.bin") && err.contains("1048576"),
        "silent: {err:?}"
    );
    let out = run(&["gen", "--verify", "g.bin"], d.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(!text.contains("target"), "a target nobody gave: {text}");
    let out = run(&["gen", "--verify", "g.bin", "--dedup", "2"], d.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("target 2.000"), "{text}");
}

/// A read job that verifies another extent than the one written is
/// refused naming both, instead of reporting corruption that is not there.
#[test]
fn io_verify_of_another_extent_is_refused_naming_both() {
    let d = dir();
    let f = d.path().join("v.bin");
    let f = f.to_str().unwrap();
    let out = run(
        &["io", "--filename", f, "--rw", "write", "--size", "2MiB"],
        d.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = std::fs::read(f).unwrap();
    let out = run(
        &[
            "io",
            "--filename",
            f,
            "--rw",
            "read",
            "--size",
            "1MiB",
            "--verify",
        ],
        d.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("2097152") && err.contains("1048576"), "{err}");
    assert!(!err.contains("is bad"), "reported corruption: {err}");
    assert_eq!(std::fs::read(f).unwrap(), before, "the file changed");
    let out = run(
        &[
            "io",
            "--filename",
            f,
            "--rw",
            "read",
            "--size",
            "2MiB",
            "--verify",
        ],
        d.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cell too short to make enough commits is marked, not ranked.
#[test]
fn a_cell_with_too_few_commits_is_not_ranked() {
    let d = dir();
    let out = run(
        &[
            "scale",
            "--threads",
            "1",
            "--modes",
            "per-page,vectored",
            "--duration",
            "0.001",
            "--repeats",
            "1",
            "--path",
            ".",
        ],
        d.path(),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("too few"), "{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.trim_end().ends_with('x') && l.contains("vectored")),
        "{text}"
    );
}

#[cfg(feature = "cf")]
#[test]
fn cf_refuses_bad_settings_by_their_flag_before_any_file_is_made() {
    refused(&["cf", "--writers", "0"], &["--writers", "1 to 16"], &[]);
    refused(&["cf", "--writers", "17"], &["--writers", "17"], &[]);
    refused(&["cf", "--batches", "0"], &["--batches", "[0]"], &[]);
    refused(&["cf", "--seconds", "0"], &["--seconds", "0"], &[]);
    refused(&["cf", "--seconds", "-1"], &["--seconds", "-1"], &[]);
    refused(&["cf", "--rounds", "0"], &["--rounds"], &[]);
    refused(&["cf", "--readers", "65"], &["--readers", "65"], &[]);
    refused(
        &["cf", "--engines", "pw-cf,sqlite"],
        &["--engines", "\"sqlite\"", "pw-cf"],
        &[],
    );
    refused(
        &["cf", "--path", "no-such-dir"],
        &["--path", "no-such-dir"],
        &[],
    );
}

#[cfg(feature = "cf")]
#[test]
fn cf_runs_every_engine_it_names_reads_back_what_was_committed_and_leaves_nothing() {
    let d = dir();
    let plot = d.path().join("cf.svg");
    let out = Command::new(bin())
        .args([
            "cf",
            "--writers",
            "1,2",
            "--batches",
            "10",
            "--seconds",
            "0.3",
        ])
        .args(["--rounds", "1", "--readers", "1", "--json", "--plot"])
        .arg(&plot)
        .arg("--path")
        .arg(d.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cells = report["cells"].as_array().unwrap();
    // pw-cf, redb-files, pw-files, redb-one-file (and the peers this
    // build has) at 1 and 2 writers.
    assert!(cells.len() >= 8, "{} cells", cells.len());
    for engine in ["pw-cf", "redb-files", "pw-files", "redb-one-file"] {
        for writers in [1, 2] {
            let c = cells
                .iter()
                .find(|c| c["engine"] == engine && c["writers"] == writers)
                .unwrap_or_else(|| panic!("no cell of {engine} at {writers} writers"));
            assert!(c["commits_per_s"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["reads_per_s"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["bytes_on_disk"].as_u64().unwrap() > 0, "{c}");
            assert_eq!(c["hung"], false, "{c}");
        }
    }
    assert!(std::fs::read_to_string(&plot).unwrap().contains("<svg"));
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "cf.svg")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
