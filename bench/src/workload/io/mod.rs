//! `pagewriter io`: a fio-style I/O worker, and shared-file writes split
//! across threads, processes and Slurm ranks.
//!
//! Each job (thread) works on its own region of one file: `[offset +
//! j * offset_increment, + size)`, or, in shared-file mode, part
//! `rank * numjobs + j` of [`part`]'s partition of the whole file. A job
//! issues `bs`-byte I/Os (the last one of a region shorter) sequentially or
//! at seeded random offsets that visit every block once per pass, reads or
//! writes or a mix, through io_uring (a [`SlotRing`] of `iodepth` buffers:
//! fixed buffers, registered file, SQPOLL and IOPOLL on request) or `psync`
//! (`pread`/`pwrite`, one at a time). Every I/O's latency, from submission
//! to the reap that saw its completion, goes into the job's HdrHistogram;
//! the jobs' histograms are merged at the end (not a sample: all of them).
//!
//! Written bytes are the [`Generator`]'s bytes at their file offset
//! (`Pattern::Gen`), so any part of the file can be checked against the
//! generator; `Pattern::Header` puts a header with the block's offset and a
//! checksum at the start of each block; `Pattern::Fixed` fills each buffer
//! once and writes it again and again, as fio does by default.
//!
//! [`SlotRing`]: pagewriter::backend::ring::SlotRing

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;

use crate::datagen::{GenConfig, Generator, Permutation};
use crate::error::{Error, Result};
use crate::rng::WyRand;
use pagewriter::DirectIo;
use pagewriter::backend::open_with_options;
use pagewriter::backend::{DioAlign, FileBackend, StorageBackend};
use pagewriter::buffer::{AlignedBuf, DEFAULT_ALIGN};

mod aggregate;
mod config;
mod job;
mod report;
#[cfg(all(target_os = "linux", feature = "io-uring"))]
mod uring;
mod verify;

pub use aggregate::*;
pub use config::*;
use job::*;
pub use report::*;
pub use verify::*;
#[allow(unused_imports)]
use {config::*, report::*, verify::*};

/// Makes the file ready for the jobs: allocates the regions this rank
/// writes (only those: a job at a far `--offset` leaves the file sparse
/// before it; `fallocate` never shrinks; where it is not supported,
/// `set_len`, only when the file is still shorter, since another rank may
/// have grown it), and refuses `hipri` on a device without poll queues.
fn prepare(
    cfg: &IoConfig,
    backend: &FileBackend,
    extent: u64,
    align: u64,
    writes: bool,
) -> Result<()> {
    if writes {
        let mut unsupported = false;
        for j in 0..cfg.numjobs {
            let (off, len) = cfg.region(j, align);
            if len == 0 || unsupported {
                continue;
            }
            if let Err(e) = backend.allocate(off, len) {
                if e.kind() == std::io::ErrorKind::Unsupported
                    || e.raw_os_error() == Some(libc::EOPNOTSUPP)
                {
                    unsupported = true;
                } else {
                    return Err(Error::io("fallocate", Some(off), e));
                }
            }
        }
        let len = backend.len().map_err(|e| Error::io("stat", None, e))?;
        if len < extent {
            backend
                .set_len(extent)
                .map_err(|e| Error::io("set_len", Some(extent), e))?;
        }
    }
    if cfg.hipri
        && let Some(v) = pagewriter::backend::queue_attr(backend.file(), "io_poll")
        && v.trim() == "0"
    {
        return Err(Error::config(
            "hipri: the device has no poll queues (queue/io_poll is 0; NVMe needs \
             nvme.poll_queues > 0)"
                .into(),
        ));
    }
    Ok(())
}

/// The ends of the jobs' regions that are not a multiple of the `O_DIRECT`
/// alignment `dio` (none when the file is buffered): each region's last
/// I/O there goes through the buffered descriptor.
fn unaligned_tails(cfg: &IoConfig, dio: Option<DioAlign>, align: u64) -> Vec<u64> {
    let Some(a) = dio else {
        return Vec::new();
    };
    (0..cfg.numjobs)
        .map(|j| cfg.region(j, align))
        .map(|(start, len)| start + len)
        .filter(|end| !end.is_multiple_of(a.offset as u64))
        .collect()
}

/// The report's `io_mode`: engine, queue depth and ring options, and
/// whether `O_DIRECT` is on (or why not).
fn io_mode_line(cfg: &IoConfig, dio: Option<DioAlign>, direct_why: Option<&str>) -> String {
    let mut io_mode = match cfg.engine {
        IoEngine::IoUring => {
            let mut m = format!("io_uring QD{}", cfg.iodepth);
            for (on, name) in [
                (cfg.fixedbufs, "fixedbufs"),
                (cfg.registerfiles, "registerfiles"),
                (cfg.sqthread_poll, "sqpoll"),
                (cfg.hipri, "hipri"),
            ] {
                if on {
                    m += &format!(", {name}");
                }
            }
            m
        }
        IoEngine::Psync => "psync".into(),
    };
    match (dio, direct_why) {
        (Some(a), _) => io_mode += &format!(", O_DIRECT (align {})", a.offset),
        (None, Some(why)) => io_mode += &format!(", buffered ({why})"),
        (None, None) => io_mode += ", buffered",
    }
    io_mode
}

/// Runs every job on its own thread and reports progress every 500 ms
/// until all ended; a failed job stops the others.
fn run_jobs(
    ctx: &JobCtx<'_>,
    total_bytes: u64,
    start: Instant,
    progress: &mut dyn FnMut(IoProgress),
) -> Vec<Result<JobOut>> {
    let cfg = ctx.cfg;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.numjobs)
            .map(|j| {
                s.spawn(move || {
                    let r = run_job(ctx, j);
                    if r.is_err() {
                        ctx.stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut last = (Instant::now(), 0u64);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
            let dt = last.0.elapsed();
            if dt >= Duration::from_millis(500) {
                let bytes = ctx.done_bytes.load(Ordering::Relaxed);
                let fraction = match cfg.runtime {
                    Some(rt) => start.elapsed().as_secs_f64() / rt.as_secs_f64(),
                    None => bytes as f64 / total_bytes.max(1) as f64,
                };
                progress(IoProgress {
                    elapsed: start.elapsed(),
                    bytes,
                    bytes_per_sec: (bytes - last.1) as f64 / dt.as_secs_f64(),
                    fraction: fraction.min(1.0),
                });
                last = (Instant::now(), bytes);
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(Error::Panicked { worker: "io job" }))
            })
            .collect()
    })
}

/// Checks the target before anything is created or allocated: a read-only
/// job needs the file to exist and hold its regions (reading what was never
/// written would measure nothing, or fail on end of file after the run
/// started); a writing job needs the file system to have room for the bytes
/// it allocates, unless `cfg.force`.
fn check_target(cfg: &IoConfig, extent: u64, writes: bool, align: u64) -> Result<()> {
    let shown = cfg.path.display();
    let len = match std::fs::metadata(&cfg.path) {
        Ok(m) if m.is_dir() => {
            return Err(Error::config(format!("{shown} is a directory")));
        }
        Ok(m) => Some(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io("stat", None, e)),
    };
    if !writes {
        match len {
            None => {
                return Err(Error::config(format!(
                    "{shown} does not exist: a read job needs its data laid out first \
                     (e.g. pagewriter write-file {shown} --size {extent})"
                )));
            }
            Some(l) if l < extent => {
                return Err(Error::config(format!(
                    "{shown} holds {l} B, less than the {extent} B the read job covers \
                     (write it first, or lower --size / --offset)"
                )));
            }
            Some(_) => {}
        }
        return Ok(());
    }
    if cfg.force {
        return Ok(());
    }
    let new: u64 = (0..cfg.numjobs)
        .map(|j| cfg.region(j, align))
        .map(|(off, n)| match len {
            // Bytes past the current end are new blocks; inside, the file
            // may already hold them.
            Some(l) => (off + n).saturating_sub(l.max(off)),
            None => n,
        })
        .sum();
    crate::room::check(&cfg.path, new, 0, false)
}

/// Opens the file as `cfg.direct` asks, read-only for a job that only
/// reads (so a file its owner may only read can be read); returns it, a
/// buffered descriptor for unaligned tails, and why `O_DIRECT` is off
/// under `Auto`.
fn open(cfg: &IoConfig, writes: bool) -> Result<(FileBackend, File, Option<String>)> {
    let options = pagewriter::OpenOptions::new()
        .lock(false)
        .read_only(!writes);
    let misfit = |b: &FileBackend| {
        let a = b.direct()?;
        (!cfg.bs.is_multiple_of(a.offset as usize) || !cfg.offset.is_multiple_of(a.offset as u64))
            .then(|| {
                format!(
                    "bs {} / offset {} not a multiple of the O_DIRECT alignment {}",
                    cfg.bs, cfg.offset, a.offset
                )
            })
    };
    let (backend, why) = open_with_options(&cfg.path, &options, cfg.direct, &misfit)?;
    let tail = std::fs::OpenOptions::new()
        .read(true)
        .write(writes)
        .open(&cfg.path)
        .map_err(|e| Error::io("open", None, e))?;
    Ok((backend, tail, why))
}

/// Runs the job(s) of `cfg` and returns this rank's report. `progress` is
/// called from the calling thread about every 500 ms.
///
/// The file is created if missing and never truncated; a job that writes
/// extends it with `fallocate` (falling back to
/// `set_len`) to the end of the regions if it is shorter, so concurrent
/// ranks never shrink it. A read job on a file shorter than its region
/// fails (`UnexpectedEof`); a read-only job opens the file read-only.
///
/// A file this run created (not in shared-file mode, where other ranks
/// write it too) is removed again when the run fails: a failed run leaves
/// nothing behind to fill the file system. [`created_by`] tells a caller
/// that wants to remove it on an interrupt.
///
/// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) for bad settings (before the file is
/// touched) or `hipri` on a device without poll queues; [`CoreError::Io`](crate::error::CoreError::Io) for
/// I/O; [`Error::VerifyFailed`] naming the first bad block.
pub fn run(cfg: &IoConfig, progress: &mut dyn FnMut(IoProgress)) -> Result<IoReport> {
    cfg.validate()?;
    let created = created_by(cfg);
    let result = run_checked(cfg, progress);
    if result.is_err() && created {
        let _ = std::fs::remove_file(&cfg.path);
    }
    result
}

/// A read job that verifies generator bytes must cover what the writing
/// job covered: the generator's bytes at an offset depend on the whole
/// extent it was made for (its dedup and compression layout spans it), so
/// a job of another size would find every block "bad". The file a write
/// job created holds its extent exactly: a file of another length is
/// refused, naming both.
///
/// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig);
/// `Io` reading the file's length.
fn check_verify_extent(cfg: &IoConfig, extent: u64) -> Result<()> {
    let len = std::fs::metadata(&cfg.path)
        .map_err(|e| Error::io("stat", None, e))?
        .len();
    if len == extent {
        return Ok(());
    }
    Err(Error::config(format!(
        "--verify of {}: the file is {len} bytes and this job covers {extent} (from 0 to the \
         end of its last region, --size {} per job); the generator's bytes at an offset depend \
         on the extent of the job that wrote them, so verify with that job's --size, --numjobs \
         and --offset",
        cfg.path.display(),
        cfg.size,
    )))
}

/// Whether a run of `cfg` would create its file: it does not exist yet
/// and the run is not one rank of a shared file (whose file other ranks
/// create and write too). Such a file is removed if the run fails.
pub fn created_by(cfg: &IoConfig) -> bool {
    cfg.shared.is_none()
        && matches!(std::fs::symlink_metadata(&cfg.path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

fn run_checked(cfg: &IoConfig, progress: &mut dyn FnMut(IoProgress)) -> Result<IoReport> {
    let extent = cfg.file_extent().expect("validated");
    let generator = Generator::new(cfg.gen_config(extent))?;
    // Parts are aligned so that no 4 KiB page is shared by two jobs (a
    // buffered tail write would otherwise read-modify-write a neighbour's
    // page).
    let align = lcm(cfg.bs as u64, 4096);
    let writes = cfg.rw.read_percent(cfg.rwmix_read) < 100;
    check_target(cfg, extent, writes, align)?;
    if cfg.verify && !writes && cfg.pattern == Pattern::Gen {
        check_verify_extent(cfg, extent)?;
    }
    let (backend, tail, direct_why) = open(cfg, writes)?;
    let dio = backend.direct();
    // An I/O at the end of a region that is not a whole number of
    // O_DIRECT units goes through the buffered descriptor: refused when
    // O_DIRECT was asked for, said in the header under `auto`.
    let tails = unaligned_tails(cfg, dio, align);
    if let (Some(a), Some(first)) = (dio, tails.first())
        && cfg.direct == DirectIo::On
    {
        return Err(Error::config(format!(
            "--direct on: the region ending at byte {first} is not a multiple of the O_DIRECT \
             alignment {} B, so its last I/O could only be written buffered; give --size (and \
             --offset) in whole multiples of {}, or --direct auto (the header then says so)",
            a.offset, a.offset
        )));
    }
    prepare(cfg, &backend, extent, align, writes)?;
    let mut io_mode = io_mode_line(cfg, dio, direct_why.as_deref());
    if dio.is_some() && !tails.is_empty() {
        io_mode += &format!(
            "; the last I/O of {} region(s) (not a whole number of O_DIRECT units) through a \
             second, buffered descriptor",
            tails.len()
        );
    }

    let start_wall = SystemTime::now();
    let start = Instant::now();
    let done_bytes = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let total_bytes: u64 = (0..cfg.numjobs).map(|j| cfg.region(j, align).1).sum();
    let ctx = JobCtx {
        cfg,
        generator: &generator,
        file: backend.file(),
        tail: &tail,
        dio,
        align,
        done_bytes: &done_bytes,
        stop: &stop,
    };
    let cpu = crate::cpu::process_time();
    let outs = run_jobs(&ctx, total_bytes, start, progress);
    let cpu_s = crate::cpu::seconds_since(cpu);
    let mut read = new_hist();
    let mut write = new_hist();
    let (mut rb, mut wb, mut fsyncs) = (0u64, 0u64, 0u64);
    let (mut began, mut ended): (Option<Instant>, Option<Instant>) = (None, None);
    for o in outs {
        let o = o?;
        began = match (began, o.began) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        ended = match (ended, o.ended) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        read.add(&o.read).expect("same bounds");
        write.add(&o.write).expect("same bounds");
        rb += o.read_bytes;
        wb += o.write_bytes;
        fsyncs += o.fsyncs;
    }
    let mut verified_blocks = 0;
    if cfg.verify {
        for j in 0..cfg.numjobs {
            let (off, len) = cfg.region(j, align);
            // Random I/Os are whole blocks: a tail shorter than `bs` is
            // never written, so it is not checked.
            let len = if cfg.rw.random() {
                len - len % cfg.bs as u64
            } else {
                len
            };
            verified_blocks += verify_region(cfg, &generator, &tail, off, len).map_err(|e| {
                Error::VerifyFailed {
                    offset: e.offset,
                    why: e.why,
                }
            })?;
        }
        if verified_blocks == 0 {
            return Err(Error::config(
                "verify: no block was checked, which proves nothing".into(),
            ));
        }
    }
    // Like fio, the run is timed from the first job's first I/O (after its
    // setup) to the last job's last completion (its final fdatasync
    // included).
    let began = began.unwrap_or(start);
    let ended = ended.unwrap_or(began).max(began);
    let runtime = ended - began;
    let start_wall = start_wall + (began - start);
    let end_wall = start_wall + runtime;
    let secs = runtime.as_secs_f64().max(1e-9);
    let unix = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Ok(IoReport {
        config: cfg.clone(),
        io_mode,
        host: hostname(),
        start_unix_ns: unix(start_wall),
        end_unix_ns: unix(end_wall),
        runtime_s: runtime.as_secs_f64(),
        cpu_s,
        read: DirStats::from_hist(&read, rb, secs),
        write: DirStats::from_hist(&write, wb, secs),
        fsyncs,
        verified_blocks,
    })
}

fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_file_for_small_cases() {
        for size in 1..200u64 {
            for parts in 1..7 {
                let mut at = 0;
                for i in 0..parts {
                    let (off, len) = part(size, parts, i, 8);
                    assert_eq!(off, at);
                    at += len;
                }
                assert_eq!(at, size);
            }
        }
    }

    #[test]
    fn random_pass_visits_every_block_once() {
        let mut cfg = IoConfig::new("unused");
        cfg.rw = Rw::RandWrite;
        cfg.bs = 512;
        let mut it = IoIter::new(&cfg, (4096, 512 * 1000 + 100), 3);
        let mut seen = vec![false; 1000];
        while let Some(io) = it.next() {
            assert_eq!(io.len, 512);
            let b = ((io.offset - 4096) / 512) as usize;
            assert!(!seen[b], "block {b} twice");
            seen[b] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn sequential_pass_ends_with_the_remainder() {
        let mut cfg = IoConfig::new("unused");
        cfg.bs = 1000;
        let ios: Vec<Io> = {
            let mut it = IoIter::new(&cfg, (10, 2500), 0);
            std::iter::from_fn(|| it.next()).collect()
        };
        let got: Vec<(u64, usize)> = ios.iter().map(|i| (i.offset, i.len)).collect();
        assert_eq!(got, vec![(10, 1000), (1010, 1000), (2010, 500)]);
    }
}
