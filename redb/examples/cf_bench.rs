//! W writers, each inserting batches of B u64 keys -> 150-byte values into
//! its own database with one durable commit per batch, three ways:
//!
//! - `cf`: redb column families on pagewriter, one file
//!   (`ColumnFamilies`; a commit is a scoped commit of the family's pages);
//! - `files`: redb on W separate files, redb's own backend (a commit is
//!   redb's `pwrite`s and `fdatasync` of its file);
//! - `pw-files`: redb on W separate files through `PagewriterBackend` (a
//!   commit is one coalesced write pass and `fdatasync` of its file);
//! - `one-file`: one redb file, a table per writer (redb's one write
//!   transaction at a time: writers take turns).
//!
//! ```text
//! cargo run --release -p pagewriter-redb --example cf_bench DIR [SECONDS] [ROUNDS]
//! ```
//!
//! Every cell (writers 1 and 8, batches of 10 and 1000) runs each way in
//! turn, the order rotating by round, in fresh files under DIR (removed
//! after each run); medians over the rounds of ops/s, commits/s and the
//! p99 commit latency, and each way's ops/s over `files`' in the same
//! round.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pagewriter_redb::ColumnFamilies;
use redb::{Database, TableDefinition};

const VALUE: usize = 150;
const WAYS: [&str; 4] = ["cf", "files", "pw-files", "one-file"];

#[derive(Clone, Copy)]
struct Run {
    ops: f64,
    commits: f64,
    p99_us: f64,
}

fn table(w: usize) -> TableDefinition<'static, u64, &'static [u8]> {
    const NAMES: [&str; 8] = ["w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"];
    TableDefinition::new(NAMES[w])
}

/// Batches of `batch` rows into `db`'s table `w` until `stop`; the commit
/// latencies in microseconds.
fn writer(db: &Database, w: usize, batch: u64, stop: &AtomicBool) -> Vec<u32> {
    let value = [w as u8; VALUE];
    let mut lat = Vec::new();
    let mut key = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let txn = db.begin_write().expect("begin_write");
        {
            let mut tab = txn.open_table(table(w)).expect("open_table");
            for _ in 0..batch {
                tab.insert(key, value.as_slice()).expect("insert");
                key += 1;
            }
        }
        txn.commit().expect("commit");
        lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
    }
    lat
}

fn run(way: &str, dir: &Path, writers: usize, batch: u64, seconds: f64) -> Run {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("create the run's directory");
    let dbs: Vec<Database> = match way {
        "cf" => {
            let cfs = ColumnFamilies::open(dir.join("cf.pwcf")).expect("open column families");
            (0..writers)
                .map(|w| {
                    let family = cfs.column_family(&format!("w{w}")).expect("family");
                    Database::builder()
                        .create_with_backend(family)
                        .expect("create")
                })
                .collect()
        }
        "files" => (0..writers)
            .map(|w| Database::create(dir.join(format!("w{w}.redb"))).expect("create"))
            .collect(),
        "pw-files" => (0..writers)
            .map(|w| {
                let backend =
                    pagewriter_redb::PagewriterBackend::open(dir.join(format!("w{w}.redb")))
                        .expect("open");
                Database::builder()
                    .create_with_backend(backend)
                    .expect("create")
            })
            .collect(),
        _ => vec![Database::create(dir.join("one.redb")).expect("create")],
    };
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let lat: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let db = &dbs[w % dbs.len()];
                let stop = &stop;
                s.spawn(move || writer(db, w, batch, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().expect("writer"))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    drop(dbs);
    let _ = std::fs::remove_dir_all(dir);
    let mut all: Vec<u32> = lat.into_iter().flatten().collect();
    all.sort_unstable();
    let commits = all.len() as f64;
    let p99 = all.get((all.len() * 99 / 100).min(all.len().saturating_sub(1)));
    Run {
        ops: commits * batch as f64 / elapsed,
        commits: commits / elapsed,
        p99_us: p99.copied().unwrap_or(0) as f64,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(base) = args.first().map(PathBuf::from) else {
        eprintln!("usage: cf_bench DIR [SECONDS] [ROUNDS]");
        std::process::exit(2);
    };
    let seconds: f64 = args.get(1).map_or(3.0, |s| s.parse().expect("SECONDS"));
    let rounds: usize = args.get(2).map_or(3, |s| s.parse().expect("ROUNDS"));
    let dir = base.join(format!("cf-bench-{}", std::process::id()));
    println!(
        "| writers | batch | way | ops/s | commits/s | p99 commit us | ops/s over files (per round) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for writers in [1usize, 8] {
        for batch in [10u64, 1000] {
            let mut runs: Vec<Vec<Run>> = vec![Vec::new(); WAYS.len()];
            for r in 0..rounds {
                for i in 0..WAYS.len() {
                    let way = (i + r) % WAYS.len();
                    runs[way].push(run(WAYS[way], &dir, writers, batch, seconds));
                }
            }
            for (i, way) in WAYS.iter().enumerate() {
                let ratios: Vec<f64> = (0..rounds)
                    .map(|r| runs[i][r].ops / runs[1][r].ops)
                    .collect();
                println!(
                    "| {writers} | {batch} | {way} | {:.0} | {:.0} | {:.0} | {:.2} ({}) |",
                    median(runs[i].iter().map(|r| r.ops).collect()),
                    median(runs[i].iter().map(|r| r.commits).collect()),
                    median(runs[i].iter().map(|r| r.p99_us).collect()),
                    median(ratios.clone()),
                    ratios
                        .iter()
                        .map(|x| format!("{x:.2}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
        }
    }
}
