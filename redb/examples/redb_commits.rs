//! Durable redb commits per second on pagewriter against redb's own file
//! backend: 16 rows of 1 KiB per transaction, `Durability::Immediate`.
//!
//! ```text
//! redb_commits compare DIR [SECONDS] [ROUNDS]   both backends, 1 and 8 threads,
//!                                             interleaved; median of ROUNDS
//! redb_commits run DIR BACKEND THREADS TXNS     a fixed number of commits (for
//!                                             strace -c); BACKEND: redb|pagewriter
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pagewriter_redb::PagewriterBackend;
use redb::{Database, TableDefinition};

const T: TableDefinition<u64, &[u8]> = TableDefinition::new("rows");
const ROWS_PER_TXN: u64 = 16;
const ROW_BYTES: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Backend {
    Redb,
    Pagewriter,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Redb => "redb FileBackend",
            Backend::Pagewriter => "pagewriter",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        match s {
            "redb" => Some(Backend::Redb),
            "pagewriter" => Some(Backend::Pagewriter),
            _ => None,
        }
    }
}

fn create(dir: &Path, backend: Backend) -> (Database, PathBuf) {
    let path = dir.join(format!(
        "bench-{}-{}.redb",
        std::process::id(),
        backend as u8
    ));
    let _ = std::fs::remove_file(&path);
    let db = match backend {
        Backend::Redb => Database::create(&path).expect("create redb file"),
        Backend::Pagewriter => {
            // PAGEWRITER_REDB_ENGINE=vectored|io-uring overrides the flush
            // engine, for comparing them.
            let mut cfg = PagewriterBackend::default_config();
            match std::env::var("PAGEWRITER_REDB_ENGINE").as_deref() {
                Ok("vectored") => cfg = cfg.engine(pagewriter::FlushEngine::Vectored),
                Ok("io-uring") => {
                    cfg = cfg.engine(pagewriter::FlushEngine::IoUring { queue_depth: 32 })
                }
                _ => {}
            }
            match std::env::var("PAGEWRITER_REDB_DIRECT").as_deref() {
                Ok("on") => cfg = cfg.direct(pagewriter::DirectIo::On),
                Ok("off") => cfg = cfg.direct(pagewriter::DirectIo::Off),
                _ => {}
            }
            // PAGEWRITER_REDB_GROW_AHEAD=<bytes> opens with a grow-ahead
            // window (redb grows its file by set_len).
            if let Ok(bytes) = std::env::var("PAGEWRITER_REDB_GROW_AHEAD") {
                let bytes = bytes.parse().expect("PAGEWRITER_REDB_GROW_AHEAD: bytes");
                cfg = cfg.grow_ahead(pagewriter::GrowAhead::Window { bytes });
            }
            let be = PagewriterBackend::open_with(&path, &pagewriter::OpenOptions::new(), cfg)
                .expect("open pagewriter file");
            Database::builder()
                .create_with_backend(be)
                .expect("create redb on pagewriter")
        }
    };
    (db, path)
}

/// One durable transaction of 16 x 1 KiB rows at keys from `n * 16`.
fn commit(db: &Database, n: u64) {
    let txn = db.begin_write().expect("begin_write");
    {
        let mut t = txn.open_table(T).expect("open_table");
        let row = [n as u8; ROW_BYTES];
        for i in 0..ROWS_PER_TXN {
            t.insert(n * ROWS_PER_TXN + i, row.as_slice())
                .expect("insert");
        }
    }
    txn.commit().expect("commit");
}

/// Commits from `threads` threads for `secs`; commits per second.
fn timed(dir: &Path, backend: Backend, threads: u64, secs: f64) -> f64 {
    let (db, path) = create(dir, backend);
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    commit(&db, next.fetch_add(1, Ordering::Relaxed));
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    let rate = next.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    drop(db);
    let _ = std::fs::remove_file(path);
    rate
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: redb_commits compare DIR [SECONDS] [ROUNDS] | run DIR BACKEND THREADS TXNS";
    match args.get(1).map(String::as_str) {
        Some("compare") if args.len() >= 3 => {
            let dir = PathBuf::from(&args[2]);
            let secs: f64 = args.get(3).map_or(3.0, |s| s.parse().expect(usage));
            let rounds: usize = args.get(4).map_or(3, |s| s.parse().expect(usage));
            println!("| threads | redb FileBackend commits/s | pagewriter commits/s | ratio |");
            println!("|---|---|---|---|");
            for threads in [1u64, 8] {
                let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..rounds {
                    // Interleaved, so drift on a shared machine hits both.
                    let x = timed(&dir, Backend::Redb, threads, secs);
                    let y = timed(&dir, Backend::Pagewriter, threads, secs);
                    a.push(x);
                    b.push(y);
                    r.push(y / x);
                }
                println!(
                    "| {threads} | {:.0} | {:.0} | {:.2} |",
                    median(&mut a),
                    median(&mut b),
                    median(&mut r)
                );
            }
        }
        Some("run") if args.len() == 6 => {
            let dir = PathBuf::from(&args[2]);
            let backend = Backend::parse(&args[3]).expect(usage);
            let threads: u64 = args[4].parse().expect(usage);
            let txns: u64 = args[5].parse().expect(usage);
            let (db, path) = create(&dir, backend);
            let next = AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        loop {
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            if n >= txns {
                                break;
                            }
                            commit(&db, n);
                        }
                    });
                }
            });
            drop(db);
            let _ = std::fs::remove_file(path);
            eprintln!("{}: {txns} commits from {threads} threads", backend.name());
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
