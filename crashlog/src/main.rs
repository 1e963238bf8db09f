//! `pagewriter-crashlog`: runs workloads on logged file systems and
//! replays their crashes (see the library's docs).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use pagewriter_crashlog::run::{Plan, run};
use pagewriter_crashlog::system::{Fs, missing, undo_on_interrupt};
use pagewriter_crashlog::workload;

#[derive(Parser)]
#[command(about = "Replays crashes of pagewriter workloads below ext4, XFS and btrfs")]
struct Args {
    /// File systems, comma-separated: ext4, xfs, btrfs.
    #[arg(long, default_value = "ext4,xfs,btrfs")]
    fs: String,
    /// Workloads, comma-separated, or `all` (every one CI runs; the
    /// experiments, which check the file system without pagewriter, run
    /// by name only).
    #[arg(long, default_value = "all")]
    workloads: String,
    /// States to replay per workload and file system.
    #[arg(long, default_value_t = 40)]
    states: usize,
    /// Seed of the states with torn writes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Work directory (images, logs, mount points); created, and removed
    /// afterwards unless --keep.
    #[arg(long)]
    work: Option<PathBuf>,
    /// Keep the work directory (the logs and base images) for a look.
    #[arg(long)]
    keep: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    undo_on_interrupt();
    let mut fss = Vec::new();
    for name in args.fs.split(',') {
        match Fs::parse(name) {
            Some(f) => fss.push(f),
            None => {
                eprintln!("--fs: {name:?} is not ext4, xfs or btrfs");
                return ExitCode::from(2);
            }
        }
    }
    let mut wls = Vec::new();
    if args.workloads == "all" {
        wls.extend(workload::ALL);
    } else {
        for name in args.workloads.split(',') {
            match workload::by_name(name) {
                Some(w) => wls.push(w),
                None => {
                    let names: Vec<&str> = workload::ALL
                        .iter()
                        .chain(&workload::EXPERIMENTS)
                        .map(|w| w.name)
                        .collect();
                    eprintln!("--workloads: {name:?} is not one of {}", names.join(", "));
                    return ExitCode::from(2);
                }
            }
        }
    }
    if args.states == 0 {
        eprintln!("--states: at least 1");
        return ExitCode::from(2);
    }
    let tmp;
    let work = match &args.work {
        Some(w) => w.clone(),
        None => match tempfile::Builder::new().prefix("crashlog-").tempdir_in(".") {
            Ok(t) => {
                tmp = t;
                tmp.path().to_path_buf()
            }
            Err(e) => {
                eprintln!("a work directory here: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let mut failed = false;
    for fs in fss {
        if let Some(why) = missing(fs) {
            eprintln!("{}: skipped: {why}", fs.name());
            failed |= std::env::var_os("PAGEWRITER_REQUIRE_FS").is_some();
            continue;
        }
        for w in &wls {
            let plan = Plan {
                fs,
                workload: *w,
                states: args.states,
                seed: args.seed,
                work: work.join(format!("{}-{}", fs.name(), w.name)),
            };
            let started = std::time::Instant::now();
            match run(&plan) {
                Ok(r) => {
                    println!(
                        "{} {} ({}): {r} in {:.0} s",
                        fs.name(),
                        w.name,
                        w.about,
                        started.elapsed().as_secs_f64()
                    );
                    for f in &r.failures {
                        println!("  FAILED {f}");
                    }
                    failed |= !r.failures.is_empty();
                }
                Err(e) => {
                    println!("{} {}: the run failed: {e}", fs.name(), w.name);
                    failed = true;
                }
            }
            if !args.keep {
                let _ = std::fs::remove_dir_all(&plan.work);
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
