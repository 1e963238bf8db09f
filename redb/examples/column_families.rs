//! Several redb databases in one pagewriter file, each written by its own
//! thread with a durable commit per batch; then the file is reopened and
//! every database read back and checked.
//!
//! ```text
//! cargo run --release -p pagewriter-redb --example column_families [FILE]
//! ```
//!
//! FILE defaults to a new file in the system's temporary directory, removed
//! at the end; a FILE given is kept.

use std::time::Instant;

use pagewriter_redb::ColumnFamilies;
use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition};

const USERS: TableDefinition<u64, &[u8]> = TableDefinition::new("rows");
const FAMILIES: u64 = 4;
const BATCHES: u64 = 200;
const BATCH: u64 = 10;

fn value(family: u64, key: u64) -> Vec<u8> {
    format!("family {family} key {key:>10} {}", "x".repeat(110)).into_bytes()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let given = std::env::args().nth(1);
    let path = match &given {
        Some(p) => p.into(),
        None => std::env::temp_dir().join(format!("column-families-{}.pwcf", std::process::id())),
    };

    // Write: one database per column family, one thread each, a durable
    // commit per batch of 10 rows. Commits of different families share
    // fdatasyncs; none waits for another family's pages.
    let cfs = ColumnFamilies::open(&path)?;
    let started = Instant::now();
    std::thread::scope(
        |s| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            let threads: Vec<_> = (0..FAMILIES)
                .map(|f| {
                    let cfs = cfs.clone();
                    s.spawn(
                        move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                            let family = cfs.column_family(&format!("family-{f}"))?;
                            let db = Database::builder().create_with_backend(family)?;
                            for b in 0..BATCHES {
                                let txn = db.begin_write()?;
                                {
                                    let mut t = txn.open_table(USERS)?;
                                    for k in b * BATCH..(b + 1) * BATCH {
                                        t.insert(k, value(f, k).as_slice())?;
                                    }
                                }
                                txn.commit()?;
                            }
                            Ok(())
                        },
                    )
                })
                .collect();
            for t in threads {
                t.join().expect("writer thread panicked")?;
            }
            Ok(())
        },
    )
    .map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();
    let commits = FAMILIES * BATCHES;
    let stats = cfs.file().stats();
    println!(
        "{commits} durable commits of {FAMILIES} families in {seconds:.2} s ({:.0}/s), {} fdatasyncs",
        commits as f64 / seconds,
        stats.syncs
    );
    drop(cfs);

    // Reopen and read every family back.
    let cfs = ColumnFamilies::open(&path)?;
    for name in cfs.names() {
        let f: u64 = name.trim_start_matches("family-").parse()?;
        let mut db = Database::builder().create_with_backend(cfs.column_family(&name)?)?;
        {
            let txn = db.begin_read()?;
            let t = txn.open_table(USERS)?;
            assert_eq!(t.len()?, BATCHES * BATCH, "{name}");
            for k in [0, BATCHES * BATCH / 2, BATCHES * BATCH - 1] {
                assert_eq!(t.get(k)?.expect("row").value(), value(f, k).as_slice());
            }
        }
        assert!(db.check_integrity()?, "{name}");
        println!(
            "{name}: {} rows read back, integrity checked",
            BATCHES * BATCH
        );
    }
    drop(cfs);
    if given.is_none() {
        std::fs::remove_file(&path)?;
    }
    Ok(())
}
