//! `kill -9` during durable commits loses no acknowledged commit: a child
//! process commits on pagewriter and reports each commit after `commit()`
//! returned; after the kill, redb opens the file and holds every reported
//! commit.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pagewriter_redb::PagewriterBackend;
use redb::{Database, ReadableDatabase, TableDefinition};

const T: TableDefinition<u64, &[u8]> = TableDefinition::new("acks");
const CHILD_ENV: &str = "PAGEWRITER_REDB_KILL9_CHILD";

/// The child: commits forever, 16 rows of 1 KiB per transaction, printing
/// each transaction's number once `commit()` returned.
#[test]
fn kill9_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return; // only runs as the child
    };
    let db = Database::builder()
        .create_with_backend(PagewriterBackend::open(&path).unwrap())
        .unwrap();
    let start = {
        let r = db.begin_read().unwrap();
        match r.open_table(T) {
            Ok(t) => redb::ReadableTableMetadata::len(&t).unwrap() / 16,
            Err(_) => 0,
        }
    };
    let mut out = std::io::stdout().lock();
    for n in start.. {
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(T).unwrap();
            for i in 0..16u64 {
                t.insert(n * 16 + i, [n as u8; 1024].as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
        writeln!(out, "ack {n}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn kill9_loses_no_acknowledged_commit() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("kill9.redb");
    let mut acked: Option<u64> = None;
    for round in 0..6u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "kill9_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Kill after a varying number of commits (and at least one).
        let target = 5 + round * 37;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = 0;
        while seen < target && Instant::now() < deadline {
            match lines.next() {
                Some(Ok(l)) => {
                    if let Some(n) = l.strip_prefix("ack ") {
                        acked = Some(n.trim().parse().unwrap());
                        seen += 1;
                    }
                }
                _ => break,
            }
        }
        child.kill().unwrap(); // SIGKILL
        // Acks printed before the kill landed are still in the pipe.
        for l in lines.map_while(Result::ok) {
            if let Some(n) = l.strip_prefix("ack ") {
                acked = Some(n.trim().parse().unwrap());
            }
        }
        child.wait().unwrap();
        assert!(seen > 0, "round {round}: the child made no commit");
        let last = acked.expect("some commit acknowledged");
        let db = Database::builder()
            .create_with_backend(PagewriterBackend::open_after_crash(&path).unwrap())
            .unwrap();
        let r = db.begin_read().unwrap();
        let t = r.open_table(T).unwrap();
        for k in 0..(last + 1) * 16 {
            let v = t.get(k).unwrap().unwrap_or_else(|| {
                panic!(
                    "round {round}: row {k} of acknowledged commit {} lost",
                    k / 16
                )
            });
            assert_eq!(v.value(), &[(k / 16) as u8; 1024][..]);
        }
    }
}
