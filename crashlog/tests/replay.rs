//! Every workload on every file system, a bounded number of replayed crash
//! states each (`CRASHLOG_STATES`, default 40; `scripts/crash-replay.sh`
//! runs more). A test whose file system cannot be made here (not Linux,
//! not root, no FUSE or loop devices, a mkfs or fsck missing) is reported
//! as ignored with the reason printed, and fails under
//! `PAGEWRITER_REQUIRE_FS=1`. A libtest-mimic harness (`harness = false`),
//! run on one thread: each test holds a loop device and two mounts.

use std::path::Path;

use libtest_mimic::{Arguments, Failed, Trial};
use pagewriter_crashlog::run::{Plan, run};
use pagewriter_crashlog::system::{Fs, missing, undo_on_interrupt};
use pagewriter_crashlog::workload;

fn states() -> usize {
    std::env::var("CRASHLOG_STATES")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(40)
}

fn main() -> std::process::ExitCode {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    undo_on_interrupt();
    let require = std::env::var_os("PAGEWRITER_REQUIRE_FS").is_some();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("crashlog");
    let mut trials = Vec::new();
    for fs in Fs::ALL {
        let why = missing(fs);
        if let Some(why) = &why {
            eprintln!(
                "{}: crash replay {}: {why}",
                fs.name(),
                if require { "fails" } else { "ignored" }
            );
        }
        for w in workload::ALL {
            let name = format!("{}::{}", fs.name(), w.name);
            let plan = Plan {
                fs,
                workload: w,
                states: states(),
                seed: 1,
                work: root.join(format!("{}-{}", fs.name(), w.name)),
            };
            let ignored = why.is_some() && !require;
            let why = why.clone();
            let trial = Trial::test(name, move || {
                if let Some(why) = why {
                    return Err(Failed::from(format!("PAGEWRITER_REQUIRE_FS is set: {why}")));
                }
                let _ = std::fs::remove_dir_all(&plan.work);
                let started = std::time::Instant::now();
                let report = run(&plan);
                let _ = std::fs::remove_dir_all(&plan.work);
                let report = report.map_err(|e| Failed::from(format!("the run failed: {e}")))?;
                println!(
                    "{} {}: {report} in {:.0} s",
                    plan.fs.name(),
                    plan.workload.name,
                    started.elapsed().as_secs_f64()
                );
                if report.states == 0 {
                    return Err(Failed::from("no crash state was replayed"));
                }
                if plan.fs != Fs::Btrfs && report.fine_bytes == 0 {
                    return Err(Failed::from("no data block of the page file was found"));
                }
                if report.failures.is_empty() {
                    Ok(())
                } else {
                    Err(Failed::from(report.failures.join("\n")))
                }
            });
            trials.push(trial.with_ignored_flag(ignored));
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}
