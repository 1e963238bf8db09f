//! The `pagewriter` binary: a short scale run and its argument errors.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pagewriter"))
}

/// Runs `cmd`, asserts it succeeded (showing its stderr if not).
fn succeed(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the binary with `args` and `--path dir`, asserts success, parses
/// its JSON output.
fn run_json<T: serde::de::DeserializeOwned>(args: &[&str], dir: &std::path::Path) -> T {
    let out = succeed(bin().args(args).arg("--path").arg(dir));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn scale_json_reports_every_cell_and_removes_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let v: serde_json::Value = run_json(
        &[
            "scale",
            "--threads",
            "1,2",
            "--duration",
            "0.2",
            "--repeats",
            "1",
            "--json",
            "--rewrite",
            "0",
        ],
        dir.path(),
    );
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 5);
    let io = v["io_modes"].as_array().unwrap();
    assert_eq!(io.len(), 5, "{io:?}");
    for r in rows {
        assert!(r["page_writes_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["p99_us"].as_u64().unwrap() >= r["p50_us"].as_u64().unwrap());
    }
    // Fresh pages only, one thread, vectored: one pwritev and one fdatasync per commit.
    let vec1 = rows
        .iter()
        .find(|r| r["mode"] == "vectored" && r["threads"] == 1)
        .unwrap();
    assert_eq!(vec1["write_calls_per_commit"].as_f64().unwrap(), 1.0);
    assert_eq!(vec1["syncs_per_commit"].as_f64().unwrap(), 1.0);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "temporary files left behind"
    );
}

/// Each commit kind and the streams mode run and report what they did:
/// one thread alone makes one write call and one `fdatasync` per commit
/// with a scoped commit, as the streams do by construction; async commits
/// complete (none left in flight at the end).
#[test]
fn scale_commit_kinds_and_streams_report_their_calls() {
    let dir = tempfile::tempdir().unwrap();
    for (commit, modes) in [
        ("scoped", "vectored,streams"),
        ("async:4", "io-uring"),
        ("global", "vectored"),
    ] {
        let v: serde_json::Value = run_json(
            &[
                "scale",
                "--threads",
                "1",
                "--modes",
                modes,
                "--commit",
                commit,
                "--duration",
                "0.3",
                "--repeats",
                "1",
                "--json",
                "--rewrite",
                "0",
            ],
            dir.path(),
        );
        assert_eq!(v["config"]["commit"], commit, "{v}");
        for r in v["rows"].as_array().unwrap() {
            assert!(r["commits_per_s"].as_f64().unwrap() > 0.0, "{r}");
            assert_eq!(r["write_kib_per_commit"].as_f64().unwrap(), 64.0, "{r}");
            if commit == "scoped" {
                assert_eq!(r["write_calls_per_commit"].as_f64().unwrap(), 1.0, "{r}");
                assert_eq!(r["syncs_per_commit"].as_f64().unwrap(), 1.0, "{r}");
            }
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn flush_reports_every_engine() {
    let dir = tempfile::tempdir().unwrap();
    let runs: Vec<serde_json::Value> = run_json(
        &[
            "flush",
            "--size",
            "4MiB",
            "--engines",
            "vectored,auto",
            "--repeats",
            "2",
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(runs.len(), 2 * 2);
    for r in &runs {
        assert_eq!(r["bytes"].as_u64().unwrap(), 4 << 20);
        assert!(r["gb_per_s"].as_f64().unwrap() > 0.0);
        assert_eq!(r["stats"]["pages_written"].as_u64().unwrap(), 1024, "{r}");
        assert_eq!(r["stats"]["syncs"].as_u64().unwrap(), 1);
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "temporary files left behind"
    );
}

#[test]
fn gen_then_verify_reports_the_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("g");
    succeed(
        bin()
            .args([
                "gen",
                "--size",
                "32MiB",
                "--dedup",
                "3",
                "--compress",
                "2",
                "--output",
            ])
            .arg(&file),
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 32 << 20);
    let out = succeed(bin().args(["gen", "--json", "--verify"]).arg(&file));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = v["dedup_ratio"].as_f64().unwrap();
    let c = v["compress_ratio"].as_f64().unwrap();
    assert!((d / 3.0 - 1.0).abs() < 0.05, "dedup {d}");
    assert!((c / 2.0 - 1.0).abs() < 0.05, "compress {c}");
    // Same configuration, same bytes, whether to a file or stdout.
    let out = bin()
        .args(["gen", "--size", "32MiB", "--dedup", "3", "--compress", "2"])
        .output()
        .unwrap();
    assert_eq!(out.stdout.len(), 32 << 20);
    assert!(
        out.stdout == std::fs::read(&file).unwrap(),
        "stdout and file differ"
    );
}

#[test]
fn write_file_writes_the_generated_bytes_and_reports_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wf");
    let out = succeed(
        bin()
            .args([
                "write-file",
                path.to_str().unwrap(),
                "--size",
                "3MiB",
                "--json",
            ])
            .args(["--buffer-size", "1MiB", "--compress", "2", "--seed", "9"]),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["bytes"], 3 << 20);
    assert!(v["gb_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["io_mode"].as_str().unwrap().contains("1048576 B buffers"));
    let g = pagewriter_bench::datagen::Generator::new(pagewriter_bench::datagen::GenConfig {
        size: 3 << 20,
        compress_ratio: 2.0,
        seed: 9,
        ..Default::default()
    })
    .unwrap();
    let mut want = vec![0u8; 3 << 20];
    g.fill_at(0, &mut want).unwrap();
    assert!(std::fs::read(&path).unwrap() == want);

    let out = bin()
        .args([
            "write-file",
            path.to_str().unwrap(),
            "--size",
            "1MiB",
            "--auto",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("auto: buffer_size") && err.contains("auto: queue_depth"),
        "{err}"
    );
}

/// What `srun -n 4` does: four processes with Slurm's rank variables set,
/// writing one shared file whose size does not divide by 4; then the
/// aggregate report, and every byte checked against the generator.
#[test]
fn four_ranks_as_processes_write_a_shared_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shared");
    let reports = dir.path().join("reports");
    let size: u64 = (12 << 20) + 4096 + 7;
    let children: Vec<_> = (0..4)
        .map(|rank| {
            bin()
                .args(["io", "--shared-file", file.to_str().unwrap()])
                .args([
                    "--size",
                    &size.to_string(),
                    "--rw",
                    "write",
                    "--bs",
                    "256KiB",
                ])
                .args(["--iodepth", "4", "--numjobs", "2", "--direct", "auto"])
                .arg("--report-dir")
                .arg(&reports)
                .env("SLURM_PROCID", rank.to_string())
                .env("SLURM_NTASKS", "4")
                .env("SLURM_NODEID", "0")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("rank {rank}/4")), "{text}");
    }
    let g = pagewriter_bench::datagen::Generator::new(pagewriter_bench::datagen::GenConfig {
        size,
        ..Default::default()
    })
    .unwrap();
    let mut want = vec![0u8; size as usize];
    g.fill_at(0, &mut want).unwrap();
    assert!(
        std::fs::read(&file).unwrap() == want,
        "shared file != generator"
    );

    let out = succeed(bin().arg("report").arg(&reports).arg("--json"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ranks"], 4);
    assert_eq!(v["total_bytes"], size);
    assert!(v["aggregate_gib_per_s"].as_f64().unwrap() > 0.0);

    // Every rank file carries the run's id (the launcher's, here).
    let ids: Vec<String> = (0..4)
        .map(|r| {
            let t = std::fs::read(reports.join(format!("rank-{r}.json"))).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&t).unwrap();
            v["config"]["run_id"].as_str().unwrap().to_string()
        })
        .collect();
    assert!(ids.iter().all(|i| i == &ids[0] && !i.is_empty()), "{ids:?}");

    // A duplicated rank with another missing: refused, naming both.
    let rank0 = std::fs::read(reports.join("rank-0.json")).unwrap();
    std::fs::write(reports.join("rank-3.json"), &rank0).unwrap();
    let out = bin().arg("report").arg(&reports).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rank 0 reported twice"));

    // A missing rank makes the report fail loudly.
    std::fs::remove_file(reports.join("rank-3.json")).unwrap();
    let out = bin().arg("report").arg(&reports).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing: 3"));

    // Another run into the same directory is refused before it runs, and
    // replaces the old reports with --overwrite; a report of two runs is
    // refused.
    let other = |extra: &[&str]| {
        bin()
            .args(["io", "--shared-file", file.to_str().unwrap()])
            .args([
                "--size",
                &size.to_string(),
                "--rw",
                "write",
                "--run-id",
                "other",
            ])
            .arg("--report-dir")
            .arg(&reports)
            .args(extra)
            .env("SLURM_PROCID", "1")
            .env("SLURM_NTASKS", "2")
            .output()
            .unwrap()
    };
    let out = other(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("another run"));
    let out = other(&["--overwrite"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !reports.join("rank-0.json").exists(),
        "the old run's reports are gone"
    );
    std::fs::write(reports.join("rank-0.json"), &rank0).unwrap();
    let out = bin().arg("report").arg(&reports).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("several runs"));
}

#[test]
fn bad_arguments_fail_with_a_message() {
    for args in [
        &["scale", "--modes", "nope"][..],
        &["scale", "--threads", "0"],
        &["scale", "--page-size", "1000"],
        &["scale", "--rewrite", "1.5"],
        &["scale", "--duration", "0"],
        &["scale", "--path", "/nonexistent/dir"],
        &["scale", "--queue-depth", "0"],
        &["scale", "--dedup", "0.5"],
        &["scale", "--compress", "100"],
        &["scale", "--commit", "async:0"],
        &["scale", "--commit", "later"],
        &["flush", "--size", "lots"],
        &["flush", "--size", "0"],
        &["flush", "--engines", "nope"],
        &["flush", "--queue-depth", "9999"],
        &["gen", "--dedup", "0.5"],
        &["gen", "--compress", "NaN"],
        &["gen", "--size", "0"],
        &["gen", "--block-size", "1000"],
        &["gen", "--verify", "/nonexistent/file"],
        &["write-file", "/tmp/pw-cli-never", "--size", "0"],
        &[
            "write-file",
            "/tmp/pw-cli-never",
            "--size",
            "1MiB",
            "--engine",
            "nope",
        ],
        &[
            "write-file",
            "/tmp/pw-cli-never",
            "--size",
            "1MiB",
            "--dedup",
            "NaN",
        ],
        &[
            "write-file",
            "/tmp/pw-cli-never",
            "--size",
            "1MiB",
            "--queue-depth",
            "0",
        ],
        &["write-file", "/nonexistent/dir/f", "--size", "1MiB"],
        &["io", "--filename", "/tmp/pw-cli-never", "--bs", "0"],
        &["io", "--filename", "/tmp/pw-cli-never", "--iodepth", "0"],
        &[
            "io",
            "--filename",
            "/tmp/pw-cli-never",
            "--rw",
            "rw",
            "--rwmix-read",
            "101",
        ],
        &[
            "io",
            "--filename",
            "/tmp/pw-cli-never",
            "--engine",
            "libaio",
        ],
        &["io", "--filename", "/tmp/pw-cli-never", "--rw", "sideways"],
        &["io", "--filename", "/tmp/pw-cli-never", "--runtime", "soon"],
        &["io", "--filename", "/tmp/pw-cli-never", "--rank", "1"],
        &[
            "io",
            "--shared-file",
            "/tmp/pw-cli-never",
            "--rank",
            "4",
            "--ranks",
            "4",
        ],
        &["report", "/nonexistent/dir"],
    ] {
        let out = bin().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("pagewriter:") || err.contains("error:"),
            "{args:?}: {err}"
        );
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
    if pagewriter::testing::uring_available() {
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
fn scale_refuses_a_preallocation_the_file_system_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args([
            "scale",
            "--preallocate",
            "1EiB",
            "--duration",
            "0.1",
            "--path",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("do not fit") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // Past the check, `fallocate` itself refuses; its error is reported
    // and the cell's file is removed.
    let out = bin()
        .args([
            "scale",
            "--preallocate",
            "1EiB",
            "--force",
            "--duration",
            "0.1",
        ])
        .args([
            "--threads",
            "1",
            "--modes",
            "vectored",
            "--repeats",
            "1",
            "--path",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fallocate"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
