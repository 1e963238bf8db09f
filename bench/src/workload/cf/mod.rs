//! `pagewriter cf`: many writers on one machine, each inserting batches of
//! B u64 keys -> 150-byte values into a database of its own (a column
//! family, a file, a table or a keyspace, as the engine holds it), one
//! durable commit per batch, while R readers do point reads of committed
//! keys. Every engine runs each cell in turn, the order rotating by round,
//! each in a fresh directory removed afterwards.
//!
//! Per cell: ops/s (keys committed), commits/s, the p99 commit latency,
//! the bytes the engine's files hold on disk at the end, the readers'
//! reads/s while the writers run and then alone for as long, on the same
//! data. A reader that misses a key a commit acknowledged is an error.

pub mod engines;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

pub use engines::{Engine, MAX_WRITERS, Store};

/// Bytes per value.
pub const VALUE_BYTES: usize = 150;

/// How long a writer may take to return after the stop before its cell is
/// reported as hung (and the run goes on without it).
pub const HANG_AFTER: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CfConfig {
    /// Writer counts (each 1 to [`MAX_WRITERS`]).
    pub writers: Vec<usize>,
    /// Keys per commit (each at least 1).
    pub batches: Vec<u64>,
    /// Reader threads beside the writers (0: none).
    pub readers: usize,
    /// The engines, in their first round's order.
    pub engines: Vec<Engine>,
    /// Seconds each cell's writers run (and its readers alone after).
    pub seconds: f64,
    /// Rounds over every cell.
    pub rounds: usize,
    /// The directory the cells' directories are made in.
    pub dir: PathBuf,
}

/// A bad [`CfConfig`] or a failed cell.
#[derive(Debug)]
pub enum CfError {
    /// A setting out of range: which, and why.
    Config(String),
    /// The scratch directory could not be made or listed.
    Scratch(std::io::Error),
    /// An engine failed to open, commit or read: which, and what it said.
    Engine { engine: &'static str, why: String },
    /// A reader did not find a key whose commit had returned.
    Lost {
        engine: &'static str,
        writer: usize,
        key: u64,
    },
}

impl std::fmt::Display for CfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CfError::Config(why) => write!(f, "{why}"),
            CfError::Scratch(e) => write!(f, "scratch directory: {e}"),
            CfError::Engine { engine, why } => write!(f, "{engine}: {why}"),
            CfError::Lost {
                engine,
                writer,
                key,
            } => write!(
                f,
                "{engine}: writer {writer}'s key {key} was committed but a reader does not find it"
            ),
        }
    }
}

impl std::error::Error for CfError {}

impl CfConfig {
    /// Errors: [`CfError::Config`] naming the setting.
    pub fn validate(&self) -> Result<(), CfError> {
        let bad = |s: String| Err(CfError::Config(s));
        if self.writers.is_empty() || self.writers.iter().any(|&w| w == 0 || w > MAX_WRITERS) {
            return bad(format!(
                "--writers: each 1 to {MAX_WRITERS}, got {:?}",
                self.writers
            ));
        }
        if self.batches.is_empty() || self.batches.iter().any(|&b| b == 0 || b > 1 << 20) {
            return bad(format!(
                "--batches: each 1 to 1048576 keys, got {:?}",
                self.batches
            ));
        }
        if self.readers > 64 {
            return bad(format!("--readers: at most 64, got {}", self.readers));
        }
        if self.engines.is_empty() {
            return bad("--engines: at least one".into());
        }
        if !(self.seconds > 0.0 && self.seconds <= 3600.0) {
            return bad(format!(
                "--seconds: above 0, at most 3600, got {}",
                self.seconds
            ));
        }
        if self.rounds == 0 {
            return bad("--rounds: at least 1".into());
        }
        if !self.dir.is_dir() {
            return bad(format!("--path {} is not a directory", self.dir.display()));
        }
        Ok(())
    }

    /// Cells in all (engines x writers x batches x rounds).
    pub fn cells(&self) -> usize {
        self.engines.len() * self.writers.len() * self.batches.len() * self.rounds
    }
}

/// One engine's run of one cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    pub engine: Engine,
    pub writers: usize,
    pub batch: u64,
    /// Round, from 0.
    pub round: usize,
    /// Keys committed per second.
    pub ops_per_s: f64,
    pub commits_per_s: f64,
    /// 99th percentile of the commit latency (the batch's inserts and its
    /// commit), microseconds.
    pub p99_commit_us: f64,
    /// Bytes the engine's files hold on disk at the end (allocated blocks).
    pub bytes_on_disk: u64,
    /// The readers' point reads per second while the writers run.
    pub reads_per_s: f64,
    /// The same readers' reads per second alone, after the writers.
    pub reads_per_s_alone: f64,
    /// A writer had not returned [`HANG_AFTER`] after the stop: the
    /// figures count what the others did.
    pub hung: bool,
}

/// Every cell of a run, in the order run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CfReport {
    pub config: CfConfig,
    /// Kernel, CPUs, memory.
    pub machine: String,
    pub cells: Vec<Cell>,
}

/// Runs every cell (see the module docs); `on_cell` sees each as it ends.
///
/// Errors: [`CfError`]: a bad config (before any file is made), an engine
/// failing, a reader missing a committed key.
pub fn run(config: &CfConfig, mut on_cell: impl FnMut(&Cell)) -> Result<CfReport, CfError> {
    config.validate()?;
    let mut cells = Vec::new();
    for round in 0..config.rounds {
        for &writers in &config.writers {
            for &batch in &config.batches {
                let n = config.engines.len();
                for i in 0..n {
                    let engine = config.engines[(i + round) % n];
                    let mut cell = run_cell(config, engine, writers, batch)?;
                    cell.round = round;
                    on_cell(&cell);
                    cells.push(cell);
                }
            }
        }
    }
    Ok(CfReport {
        config: config.clone(),
        machine: crate::plot::machine(),
        cells,
    })
}

/// What the threads share.
struct Shared {
    store: Arc<dyn Store>,
    /// Keys committed so far, per writer (keys `0..n`).
    committed: Vec<AtomicU64>,
    stop: AtomicBool,
}

enum Done {
    Writer(Result<Histogram<u64>, String>),
    Reader(Result<u64, CfError>),
}

fn run_cell(
    config: &CfConfig,
    engine: Engine,
    writers: usize,
    batch: u64,
) -> Result<Cell, CfError> {
    let scratch = tempfile::Builder::new()
        .prefix(&format!(".pagewriter-cf-{}-", std::process::id()))
        .suffix(crate::scratch::SUFFIX)
        .tempdir_in(&config.dir)
        .map_err(CfError::Scratch)?;
    crate::interrupt::scratch(scratch.path().to_path_buf());
    let failed = |why: String| CfError::Engine {
        engine: engine.name(),
        why,
    };
    let store: Arc<dyn Store> =
        Arc::from(engines::open(engine, scratch.path(), writers).map_err(failed)?);
    let shared = Arc::new(Shared {
        store,
        committed: (0..writers).map(|_| AtomicU64::new(0)).collect(),
        stop: AtomicBool::new(false),
    });
    let phase = run_writers(config, &shared, engine, batch)?;
    let reads_per_s_alone = if phase.hung || config.readers == 0 {
        0.0
    } else {
        run_readers_alone(config, &shared, engine)?
    };
    let bytes_on_disk = disk_bytes(scratch.path()).map_err(CfError::Scratch)?;
    if !phase.hung {
        // Closed before its directory goes; a hung engine keeps its store.
        drop(shared);
    }
    crate::interrupt::forget(scratch.path());
    drop(scratch);
    let commits = phase.latencies.len() as f64;
    Ok(Cell {
        engine,
        writers,
        batch,
        round: 0,
        ops_per_s: commits * batch as f64 / phase.elapsed,
        commits_per_s: commits / phase.elapsed,
        p99_commit_us: phase.latencies.value_at_quantile(0.99) as f64,
        bytes_on_disk,
        reads_per_s: phase.reads as f64 / phase.elapsed,
        reads_per_s_alone,
        hung: phase.hung,
    })
}

/// What a cell's writers (and the readers beside them) did.
struct WritePhase {
    /// Every writer's commit latencies (µs).
    latencies: Histogram<u64>,
    /// Point reads the readers made meanwhile.
    reads: u64,
    /// Seconds from the threads' start to the stop.
    elapsed: f64,
    /// Whether some thread had not finished [`HANG_AFTER`] past the stop.
    hung: bool,
}

/// Runs one writer per entry of `shared.committed` and the configured
/// readers for `config.seconds`, then gathers them. The first error of
/// any thread is the phase's.
fn run_writers(
    config: &CfConfig,
    shared: &Arc<Shared>,
    engine: Engine,
    batch: u64,
) -> Result<WritePhase, CfError> {
    let writers = shared.committed.len();
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    for w in 0..writers {
        let (s, tx) = (Arc::clone(shared), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send(Done::Writer(write(&s, w, batch)));
        });
    }
    for r in 0..config.readers {
        let (s, tx) = (Arc::clone(shared), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send(Done::Reader(read(&s, engine, r as u64)));
        });
    }
    std::thread::sleep(Duration::from_secs_f64(config.seconds));
    shared.stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies = Histogram::<u64>::new(3).expect("3 significant digits");
    let mut reads = 0u64;
    let mut first_error = None;
    let mut waiting = writers + config.readers;
    let deadline = Instant::now() + HANG_AFTER;
    while waiting > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Done::Writer(Ok(h))) => latencies.add(&h).expect("same bounds"),
            Ok(Done::Writer(Err(why))) => {
                first_error.get_or_insert(CfError::Engine {
                    engine: engine.name(),
                    why,
                });
            }
            Ok(Done::Reader(Ok(n))) => reads += n,
            Ok(Done::Reader(Err(e))) => {
                first_error.get_or_insert(e);
            }
            Err(_) => break,
        }
        waiting -= 1;
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(WritePhase {
            latencies,
            reads,
            elapsed,
            hung: waiting > 0,
        }),
    }
}

/// The configured readers alone on what the writers committed, for
/// `config.seconds`: their reads per second.
fn run_readers_alone(config: &CfConfig, shared: &Shared, engine: Engine) -> Result<f64, CfError> {
    let alone = Arc::new(Shared {
        store: Arc::clone(&shared.store),
        committed: shared
            .committed
            .iter()
            .map(|c| AtomicU64::new(c.load(Ordering::Acquire)))
            .collect(),
        stop: AtomicBool::new(false),
    });
    let started = Instant::now();
    let handles: Vec<_> = (0..config.readers)
        .map(|r| {
            let s = Arc::clone(&alone);
            std::thread::spawn(move || read(&s, engine, r as u64))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(config.seconds));
    alone.stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let mut n = 0;
    for h in handles {
        n += h.join().map_err(|_| CfError::Engine {
            engine: engine.name(),
            why: "a reader panicked".into(),
        })??;
    }
    Ok(n as f64 / elapsed)
}

/// Writer `w`: batches of `batch` keys from 0 until the stop; its commit
/// latencies (µs).
fn write(s: &Shared, w: usize, batch: u64) -> Result<Histogram<u64>, String> {
    let value = [w as u8 ^ 0x5a; VALUE_BYTES];
    let mut lat = Histogram::<u64>::new(3).expect("3 significant digits");
    let mut next = 0u64;
    while !s.stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        s.store.commit(w, next..next + batch, &value)?;
        lat.record(t.elapsed().as_micros().max(1) as u64)
            .map_err(|e| e.to_string())?;
        next += batch;
        s.committed[w].store(next, Ordering::Release);
    }
    Ok(lat)
}

/// Reader `r`: point reads of committed keys of random writers until the
/// stop; how many.
fn read(s: &Shared, engine: Engine, r: u64) -> Result<u64, CfError> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (r + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut n = 0;
    while !s.stop.load(Ordering::Relaxed) {
        let w = (next() % s.committed.len() as u64) as usize;
        let upto = s.committed[w].load(Ordering::Acquire);
        if upto == 0 {
            std::thread::yield_now();
            continue;
        }
        let key = next() % upto;
        let found = s.store.get(w, key).map_err(|why| CfError::Engine {
            engine: engine.name(),
            why,
        })?;
        if !found {
            return Err(CfError::Lost {
                engine: engine.name(),
                writer: w,
                key,
            });
        }
        n += 1;
    }
    Ok(n)
}

/// Bytes allocated on disk to the files under `dir`.
fn disk_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut sum = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        sum += if m.is_dir() {
            disk_bytes(&e.path())?
        } else {
            m.blocks() * 512
        };
    }
    Ok(sum)
}

/// One row of the table: an engine's medians over the rounds of one
/// (writers, batch) cell.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub engine: Engine,
    pub writers: usize,
    pub batch: u64,
    pub ops_per_s: f64,
    pub commits_per_s: f64,
    pub p99_commit_us: f64,
    pub bytes_on_disk: f64,
    pub reads_per_s: f64,
    pub reads_per_s_alone: f64,
    /// Median over the rounds of ops/s over `redb-files`' in the same
    /// round (`None` without `redb-files`).
    pub vs_redb_files: Option<f64>,
    /// Rounds in which it hung.
    pub hung: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// The table's rows, per (writers, batch) in config order, engines in
/// config order.
pub fn rows(report: &CfReport) -> Vec<Row> {
    let c = &report.config;
    let mut out = Vec::new();
    for &writers in &c.writers {
        for &batch in &c.batches {
            let of = |e: Engine| -> Vec<&Cell> {
                report
                    .cells
                    .iter()
                    .filter(|x| x.engine == e && x.writers == writers && x.batch == batch)
                    .collect()
            };
            let base = of(Engine::RedbFiles);
            for &engine in &c.engines {
                let cells = of(engine);
                let med = |f: fn(&Cell) -> f64| median(cells.iter().map(|x| f(x)).collect());
                let ratios: Vec<f64> = cells
                    .iter()
                    .filter_map(|x| {
                        base.iter()
                            .find(|b| b.round == x.round)
                            .map(|b| x.ops_per_s / b.ops_per_s)
                    })
                    .collect();
                out.push(Row {
                    engine,
                    writers,
                    batch,
                    ops_per_s: med(|x| x.ops_per_s),
                    commits_per_s: med(|x| x.commits_per_s),
                    p99_commit_us: med(|x| x.p99_commit_us),
                    bytes_on_disk: med(|x| x.bytes_on_disk as f64),
                    reads_per_s: med(|x| x.reads_per_s),
                    reads_per_s_alone: med(|x| x.reads_per_s_alone),
                    vs_redb_files: (!ratios.is_empty()).then(|| median(ratios)),
                    hung: cells.iter().filter(|x| x.hung).count(),
                });
            }
        }
    }
    out
}

/// The figure: ops/s over writers, a panel per batch size, a line per
/// engine.
pub fn figure(report: &CfReport) -> crate::plot::Figure {
    use crate::plot::{Axis, Figure, Panel, Scale, Series};
    let rows = rows(report);
    let c = &report.config;
    Figure {
        title: format!(
            "pagewriter cf: {} readers, {:.1} s cells, {} rounds ({})",
            c.readers, c.seconds, c.rounds, report.machine
        ),
        x: Axis {
            label: "writers".into(),
            scale: Scale::Log2,
        },
        panels: c
            .batches
            .iter()
            .map(|&b| Panel {
                y: Axis {
                    label: format!("ops/s, batches of {b}"),
                    scale: Scale::Log10,
                },
                series: c
                    .engines
                    .iter()
                    .map(|&e| Series {
                        label: e.name().into(),
                        points: rows
                            .iter()
                            .filter(|r| r.engine == e && r.batch == b)
                            .map(|r| (r.writers as f64, r.ops_per_s))
                            .collect(),
                        dashed: e != Engine::PwCf,
                    })
                    .collect(),
            })
            .collect(),
    }
}
