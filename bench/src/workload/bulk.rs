//! Bulk flush: dirty `size` bytes of pages in order, then one flush +
//! `fdatasync`, timed. Shows how close a flush engine gets to the device's
//! sequential write bandwidth (compare with fio: `scripts/compare-fio.sh`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::rng::WyRand;
use pagewriter::{Config, DirectIo, FlushEngine, PagedCachedFile, Stats};

/// Settings of a bulk flush run.
#[derive(Debug, Clone, Serialize)]
pub struct BulkConfig {
    /// Bytes to write; rounded down to whole pages. Default 1 GiB.
    pub size: u64,
    /// Engines, one measurement each per repeat.
    pub engines: Vec<FlushEngine>,
    /// Page size in bytes. Default 4096.
    pub page_size: usize,
    /// Bytes per write call (run cap), like fio's `bs`. Default 1 MiB.
    pub max_write_bytes: usize,
    /// `O_DIRECT` or buffered.
    pub direct: DirectIo,
    /// Repeats, engines interleaved; the report keeps every run.
    pub repeats: usize,
    /// The file written into (created if missing; never removed or
    /// truncated, a non-regular file is refused), or `None` for a temporary
    /// file in `dir`.
    pub file: Option<PathBuf>,
    /// Directory of the temporary file.
    pub dir: PathBuf,
    /// Untimed passes before the first measured one (the first engine).
    /// On a virtual machine the first touch of memory the host has taken
    /// back costs a hypervisor fault per page: a cold first pass measured
    /// here ran at 0.26-0.30 GB/s where warm ones ran at 1.0 GB/s.
    /// They write a temporary file beside `file` (or in `dir`), removed
    /// after, never `file` itself: a pass into `file` would leave its
    /// blocks allocated and written, and the timed pass would measure an
    /// overwrite (1.3-1.9x faster than a fresh file here, O_DIRECT).
    /// Default 1.
    pub warmup: usize,
    /// Skip the free-space check (`crate::room`). Default `false`.
    pub force: bool,
}

impl Default for BulkConfig {
    fn default() -> Self {
        Self {
            size: 1 << 30,
            engines: vec![
                FlushEngine::Vectored,
                FlushEngine::IoUring { queue_depth: 32 },
            ],
            page_size: 4096,
            max_write_bytes: 1 << 20,
            direct: DirectIo::Off,
            repeats: 3,
            file: None,
            dir: PathBuf::from("."),
            warmup: 1,
            force: false,
        }
    }
}

/// One timed flush.
#[derive(Debug, Clone, Serialize)]
pub struct BulkRun {
    /// Engine used (after any fallback).
    pub engine: FlushEngine,
    /// I/O mode as printed by [`IoMode`](pagewriter::IoMode).
    pub io_mode: String,
    /// Repeat number, 0-based.
    pub repeat: usize,
    /// Bytes written.
    pub bytes: u64,
    /// Seconds from the start of the flush to the end of the `fdatasync`.
    pub seconds: f64,
    /// Bytes per second / 10^9.
    pub gb_per_s: f64,
    /// CPU seconds (user + system, whole process) per 10^9 bytes over the
    /// same span as `seconds`.
    pub cpu_s_per_gb: f64,
    /// The target already held `bytes` bytes when this pass opened it, so
    /// the pass overwrote allocated blocks (faster than writing a fresh
    /// file; fio's job in `scripts/compare-fio.sh` writes a fresh one).
    /// Always false for a temporary file.
    pub overwrite: bool,
    /// The file's counters.
    pub stats: Stats,
}

/// Runs every engine `repeats` times, interleaved.
///
/// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) for size 0 or no engines, or a size
/// the file system has no room for (unless `force`); any open or I/O
/// error.
pub fn run(config: &BulkConfig, mut progress: impl FnMut(&BulkRun)) -> Result<Vec<BulkRun>> {
    let pages = config.size / config.page_size.max(1) as u64;
    if pages == 0 {
        return Err(Error::config("bulk size is less than one page".into()));
    }
    if config.engines.is_empty() || config.repeats == 0 {
        return Err(Error::config("no engines or no repeats".into()));
    }
    // Every page is held in memory until the one flush: a size the
    // machine cannot hold is refused here, not an abort half-way.
    let bytes = pages * config.page_size as u64;
    if let Some(avail) = mem_available()
        && bytes > avail
    {
        return Err(Error::config(format!(
            "size {bytes} B does not fit in memory ({avail} B available): the bulk flush \
             holds every page until its one flush"
        )));
    }
    if usize::try_from(bytes).is_err() {
        return Err(Error::config(format!(
            "size {bytes} B does not fit in memory"
        )));
    }
    if let Some(p) = &config.file {
        check_target(p)?;
    }
    // Each pass writes `bytes` into the target (a temporary file in `dir`,
    // removed after it, or `file`, whose blocks count as room), and the
    // warm-up passes as much into a temporary file beside it.
    match &config.file {
        Some(p) => crate::room::check(p, bytes, crate::room::held(p), config.force)?,
        None => crate::room::check(&config.dir.join("bulk"), bytes, 0, config.force)?,
    }
    if config.warmup > 0 {
        crate::room::check(&warm_dir(config).join("warm-up"), bytes, 0, config.force)?;
    }
    for &engine in &config.engines {
        Config::default()
            .page_size(config.page_size)
            .max_write_bytes(config.max_write_bytes)
            .engine(engine)
            .validate()?;
    }
    let warm_dir = warm_dir(config);
    crate::scratch::remove_stale(&config.dir);
    if warm_dir != config.dir {
        crate::scratch::remove_stale(warm_dir);
    }
    for _ in 0..config.warmup {
        run_one(config, None, warm_dir, config.engines[0], pages, 0)?;
    }
    let mut out = Vec::new();
    for repeat in 0..config.repeats {
        for &engine in &config.engines {
            let r = run_one(
                config,
                config.file.as_deref(),
                &config.dir,
                engine,
                pages,
                repeat,
            )?;
            progress(&r);
            out.push(r);
        }
    }
    Ok(out)
}

/// Where the warm-up passes write: beside the target, on its file system,
/// or in `dir` when there is no target.
fn warm_dir(config: &BulkConfig) -> &Path {
    match config.file.as_deref().and_then(Path::parent) {
        Some(d) if !d.as_os_str().is_empty() => d,
        Some(_) => Path::new("."),
        None => &config.dir,
    }
}

/// One pass into `file`, or into a temporary file in `dir` (removed on
/// return).
fn run_one(
    config: &BulkConfig,
    file: Option<&Path>,
    dir: &Path,
    engine: FlushEngine,
    pages: u64,
    repeat: usize,
) -> Result<BulkRun> {
    let temp;
    let path = match file {
        // Written into like fio's target: created if missing, never
        // removed or truncated (the run overwrites its first `size` bytes).
        Some(p) => p.to_path_buf(),
        None => {
            temp = crate::scratch::create(dir, "bulk")?;
            temp.path().to_path_buf()
        }
    };
    let ps = config.page_size;
    let bytes = pages * ps as u64;
    let overwrite = file.is_some_and(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= bytes));
    let cfg = Config::default()
        .page_size(ps)
        .max_write_bytes(config.max_write_bytes)
        .max_write_buffer_bytes(
            usize::try_from(bytes)
                .unwrap_or(usize::MAX)
                .saturating_add(ps),
        )
        .direct(config.direct)
        .engine(engine);
    let file = PagedCachedFile::open(&path, cfg)?;
    let mut rng = WyRand::new(repeat as u64 + 1);
    for p in 0..pages {
        let mut page = file.overwrite(p * ps as u64, ps)?;
        rng.fill(&mut page);
    }
    let started = Instant::now();
    let cpu = crate::cpu::process_time();
    file.sync()?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_s = crate::cpu::seconds_since(cpu);
    let run = BulkRun {
        engine: file.io_mode().engine,
        io_mode: file.io_mode().to_string(),
        repeat,
        bytes,
        seconds,
        gb_per_s: bytes as f64 / seconds / 1e9,
        cpu_s_per_gb: cpu_s / (bytes as f64 / 1e9),
        overwrite,
        stats: file.stats(),
    };
    file.close()?;
    Ok(run)
}

/// A `--file` target must be a regular file (or a symlink to one), or not
/// exist yet: a FIFO, a device node, a directory or a link to nothing is
/// refused (and never removed).
fn check_target(p: &std::path::Path) -> Result<()> {
    let refuse = |what: &str| {
        Err(Error::config(format!(
            "{} is not a regular file ({what}): refused",
            p.display()
        )))
    };
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) if m.is_dir() => refuse("a directory"),
        Ok(_) => refuse("a FIFO, socket or device"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(p).is_ok() {
                refuse("a link to nothing")
            } else {
                Ok(())
            }
        }
        Err(e) => Err(Error::io("stat", None, e)),
    }
}

/// Memory this process can get, in bytes: `MemAvailable` of
/// `/proc/meminfo`, or less under an address-space limit (`ulimit -v`,
/// `/proc/self/limits`, with 256 MiB left for the program itself).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            let line = l.lines().find(|l| l.starts_with("Max address space"))?;
            line.split_whitespace().nth(3)?.parse::<u64>().ok()
        })
        .map(|soft| soft.saturating_sub(256 << 20));
    Some(limit.map_or(kib * 1024, |l| l.min(kib * 1024)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_passes_write_beside_the_target_never_into_it() {
        let mut c = BulkConfig {
            dir: PathBuf::from("/scratch"),
            ..BulkConfig::default()
        };
        assert_eq!(warm_dir(&c), Path::new("/scratch"));
        c.file = Some(PathBuf::from("/data/target.bin"));
        assert_eq!(warm_dir(&c), Path::new("/data"));
        c.file = Some(PathBuf::from("target.bin"));
        assert_eq!(warm_dir(&c), Path::new("."));
    }

    #[test]
    fn a_run_into_a_file_leaves_only_that_file() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target.bin");
        let c = BulkConfig {
            size: 1 << 20,
            engines: vec![FlushEngine::Vectored],
            repeats: 1,
            warmup: 2,
            file: Some(target.clone()),
            dir: d.path().join("elsewhere"),
            ..BulkConfig::default()
        };
        let runs = run(&c, |_| {}).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].bytes, 1 << 20);
        // The timed pass wrote a fresh file: the warm-ups did not fill it.
        assert!(!runs[0].overwrite);
        assert_eq!(std::fs::metadata(&target).unwrap().len(), 1 << 20);
        // The warm-up files went beside the target, and were removed.
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("target.bin")]);
        // A second pass into the same file is an overwrite, and says so.
        let again = run(&BulkConfig { warmup: 0, ..c }, |_| {}).unwrap();
        assert!(again[0].overwrite);
    }
}
