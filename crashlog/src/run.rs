//! One run end to end: a file system made on an image, the image served
//! by the logger, a loop device over it, the file system mounted there,
//! the workload run on it, everything taken down; then states of the log
//! replayed and each one checked.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pagewriter::PagedCachedFile;

use crate::expect::Expect;
use crate::log::{Kind, Log};
use crate::replay::{Replayer, State, sparse_copy};
use crate::serve::{Faults, Logger};
use crate::system::{Fs, LoopDev, Mounted, data_extents, fsck, mkfs};
use crate::workload::{Ctx, Workload};

/// What to run.
#[derive(Clone)]
pub struct Plan {
    pub fs: Fs,
    pub workload: Workload,
    /// States to replay at most (flush points first, then states between
    /// flush points).
    pub states: usize,
    pub seed: u64,
    /// Where the images, the log and the mount points go (created).
    pub work: PathBuf,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub log: String,
    pub flush_points: usize,
    pub acked: usize,
    pub states: usize,
    pub torn_states: usize,
    /// Bytes of the page files' data blocks, where torn states cut writes
    /// at 512 B (0 on btrfs).
    pub fine_bytes: u64,
    /// States whose `fsck` reported a problem after a failed flush (the
    /// file system's own reaction to the injected error, not a finding).
    pub fsck_after_failure: usize,
    pub failures: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "log: {}; {} flush points, {} acknowledged commits; {} states replayed ({} with torn \
             writes after the last flush, cut at 512 B in {} KiB of data blocks): {} failures",
            self.log,
            self.flush_points,
            self.acked,
            self.states,
            self.torn_states,
            self.fine_bytes >> 10,
            self.failures.len()
        )?;
        if self.fsck_after_failure > 0 {
            write!(
                f,
                "; fsck flagged {} states after the failed flush (the file system's error state)",
                self.fsck_after_failure
            )?;
        }
        Ok(())
    }
}

/// Runs the workload on a logged file system and replays the log (see the
/// module docs).
///
/// Errors: setting up or taking down the file system, the logger or the
/// loop device; the workload's own error; the log unreadable.
pub fn run(plan: &Plan) -> Result<Report, String> {
    let work = &plan.work;
    std::fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
    let base = work.join("base.img");
    mkfs(plan.fs, &base)?;
    let image = work.join("disk.img");
    sparse_copy(&base, &image)?;
    let log_path = work.join("write.log");
    let _ = std::fs::remove_file(&log_path);
    let expect = log_workload(plan, &image, &log_path)?;
    let log = Log::open(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let data = final_data_extents(plan, &log, &base)?;
    let report = replay(plan, &log, &base, &expect, data);
    let _ = std::fs::remove_file(&image);
    report
}

/// Where the page files' data blocks are on the device once every logged
/// write is applied ([`data_extents`] of that image mounted): taken from
/// the log, not the run's own mount, which an injected error may have
/// shut down (XFS does).
///
/// Errors: building, mounting or unmounting the image; `filefrag`.
fn final_data_extents(
    plan: &Plan,
    log: &Log,
    base: &Path,
) -> Result<Vec<std::ops::Range<u64>>, String> {
    let work = plan.work.join("final");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let img = work.join("final.img");
    let mut replayer = Replayer::new(log, base, &work)?;
    let all = State {
        at: log.records.len(),
        torn: None,
    };
    replayer.build(all, &img)?;
    drop(replayer);
    let found = (|| {
        let mnt = Mounted::check_mount(plan.fs, &img, &work.join("mnt"))?;
        let data = data_extents(plan.fs, mnt.path());
        mnt.unmount()?;
        data
    })();
    let _ = std::fs::remove_dir_all(&work);
    found
}

/// Serves `image`, runs the workload on it, logs to `log`; returns what
/// the workload wrote and promised.
fn log_workload(plan: &Plan, image: &Path, log: &Path) -> Result<Expect, String> {
    let work = &plan.work;
    let (logger, faults): (Logger, Arc<Mutex<Faults>>) =
        Logger::new(work, image, log).map_err(|e| format!("logger: {e}"))?;
    let fuse_dir = work.join("fuse");
    std::fs::create_dir_all(&fuse_dir).map_err(|e| format!("{}: {e}", fuse_dir.display()))?;
    let mut fuse_cfg = fuser::Config::default();
    fuse_cfg.mount_options = vec![fuser::MountOption::FSName("pagewriter-crashlog".into())];
    let session = fuser::spawn_mount(logger, &fuse_dir, &fuse_cfg)
        .map_err(|e| format!("FUSE mount on {}: {e}", fuse_dir.display()))?;
    let outcome = (|| {
        let dev = LoopDev::attach(&fuse_dir.join("disk"))?;
        let mnt = Mounted::mount(plan.fs, dev.path(), &work.join("mnt"), "")?;
        let config = (plan.workload.config)();
        let ctx = Ctx::new(mnt.path(), &fuse_dir.join("marks"), faults, config)?;
        let ran = plan.workload.run(&ctx);
        let expect = ctx.tracker.finish();
        drop(ctx);
        mnt.unmount()?;
        dev.detach()?;
        ran.map(|()| expect)
    })();
    session
        .umount_and_join()
        .map_err(|e| format!("FUSE unmount: {e}"))?;
    outcome
}

/// The states to replay: every flush point (sampled evenly if there are
/// more than half of `states`), the device before the log, and states with
/// torn writes after a flush point, drawn from the seed; in log order.
fn pick(points: &[usize], states: usize, seed: u64) -> Vec<State> {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut at: Vec<usize> = vec![0];
    at.extend_from_slice(points);
    let whole = (states / 2).max(1);
    let mut picked: Vec<State> = if at.len() <= whole {
        at.iter().map(|&a| State { at: a, torn: None }).collect()
    } else {
        (0..whole)
            .map(|i| State {
                at: at[i * (at.len() - 1) / (whole - 1).max(1)],
                torn: None,
            })
            .collect()
    };
    picked.dedup();
    while picked.len() < states {
        let a = at[(next() % at.len() as u64) as usize];
        picked.push(State {
            at: a,
            torn: Some(next()),
        });
    }
    picked.sort_by_key(|s| (s.at, s.torn));
    picked
}

fn replay(
    plan: &Plan,
    log: &Log,
    base: &Path,
    expect: &Expect,
    data: Vec<std::ops::Range<u64>>,
) -> Result<Report, String> {
    let work = &plan.work;
    let mut replayer = Replayer::new(log, base, work)?;
    let fine_bytes = data.iter().map(|r| r.end - r.start).sum();
    replayer.fine_sectors(data);
    let mut report = Report {
        fine_bytes,
        log: log.summary(),
        flush_points: replayer.flush_points().len(),
        acked: expect.acks.len(),
        ..Report::default()
    };
    let first_failed = log.records.iter().position(|r| r.kind == Kind::FailedFlush);
    let states = pick(replayer.flush_points(), plan.states, plan.seed);
    let state_img = work.join("state.img");
    let check_dir = work.join("check");
    let config = (plan.workload.config)();
    for state in states {
        report.states += 1;
        report.torn_states += usize::from(state.torn.is_some());
        let name = match state.torn {
            None => format!("flush point at record {}", state.at),
            Some(s) => format!("record {} + torn writes (seed {s:#x})", state.at),
        };
        replayer.build(state, &state_img)?;
        let acked = replayer.acked(state)?;
        let found = (|| -> Result<(), String> {
            let mnt = Mounted::check_mount(plan.fs, &state_img, &check_dir)
                .map_err(|e| format!("the file system does not mount: {e}"))?;
            let path = mnt.path().join("pages.db");
            if let Some(check) = plan.workload.check {
                let found = check(&path, &config, expect, &acked);
                mnt.unmount()?;
                return found;
            }
            let bytes = if path.exists() {
                let f = PagedCachedFile::open(&path, config.clone())
                    .map_err(|e| format!("the page file does not open: {e}"))?;
                if std::env::var_os("CRASHLOG_VERBOSE").is_some() {
                    eprintln!("recovery: {:?}", f.recovery());
                }
                let len = f.len();
                let b = if len == 0 {
                    Vec::new()
                } else {
                    f.read(0, len as usize)
                        .map_err(|e| format!("reading the page file: {e}"))?
                        .to_vec()
                };
                drop(f);
                Some(b)
            } else {
                None
            };
            mnt.unmount()?;
            expect.check(bytes.as_deref(), &acked, plan.workload.torn_ok)
        })();
        let fsck = fsck(plan.fs, &state_img);
        if std::env::var_os("CRASHLOG_VERBOSE").is_some() {
            eprintln!("{name}: {} acked: {found:?}, fsck {fsck:?}", acked.len());
        }
        if let Err(e) = found {
            if std::env::var_os("CRASHLOG_KEEP_FAILED").is_some() {
                let keep = work.join(format!("failed-{}.img", report.failures.len()));
                let _ = sparse_copy(&state_img, &keep);
            }
            report
                .failures
                .push(format!("{name}, {} acknowledged: {e}", acked.len()));
        }
        if let Err(e) = fsck {
            // The window of a state runs to the next good flush: a failed
            // flush inside or before it reaches this state.
            if first_failed.is_some_and(|f| f < replayer.next_flush(state.at)) {
                report.fsck_after_failure += 1;
            } else {
                report.failures.push(format!("{name}: fsck: {e}"));
            }
        }
    }
    let _ = std::fs::remove_file(&state_img);
    let _ = std::fs::remove_file(work.join("replay-state.img"));
    Ok(report)
}
