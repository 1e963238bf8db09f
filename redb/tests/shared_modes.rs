//! redb's multi-process modes on pagewriter: two writable handles on one
//! file (`MultiWriter`) take turns and each reads the other's commits; a
//! read-only handle beside a single writer (`SingleWriter`) follows its
//! commits; a default (`ExclusiveWriter`) open beside them is refused.
//! Each handle has its own description, so its locks conflict with the
//! others' exactly as another process's would.

use pagewriter_redb::PagewriterBackend;
use redb::{ConcurrencyMode, Database, DatabaseError, ReadableDatabase, TableDefinition};

const T: TableDefinition<u64, u64> = TableDefinition::new("t");

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn open(path: &std::path::Path, mode: ConcurrencyMode) -> Result<Database, DatabaseError> {
    let mut b = Database::builder();
    b.set_concurrency_mode(mode);
    b.create_with_backend(PagewriterBackend::open(path).unwrap())
}

fn get(db: &Database, k: u64) -> Option<u64> {
    let r = db.begin_read().unwrap();
    let t = r.open_table(T).unwrap();
    t.get(k).unwrap().map(|v| v.value())
}

#[test]
fn two_writers_take_turns_and_read_each_others_commits() {
    let d = dir();
    let path = d.path().join("multi.redb");
    let a = open(&path, ConcurrencyMode::MultiWriter).unwrap();
    let b = open(&path, ConcurrencyMode::MultiWriter).unwrap();
    assert!(matches!(
        open(&path, ConcurrencyMode::ExclusiveWriter),
        Err(DatabaseError::DatabaseAlreadyOpen)
    ));
    for round in 0..40u64 {
        let (w, r) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let txn = w.begin_write().unwrap();
        {
            let mut t = txn.open_table(T).unwrap();
            // Enough rows that the tree spans pages the other handle has
            // read (and cached) before.
            for k in 0..50u64 {
                t.insert(round * 50 + k, round).unwrap();
            }
            t.insert(u64::MAX, round).unwrap();
        }
        txn.commit().unwrap();
        assert_eq!(get(r, u64::MAX), Some(round), "round {round}");
        assert_eq!(get(r, round * 50 + 49), Some(round));
        if round > 0 {
            assert_eq!(get(r, (round - 1) * 50), Some(round - 1));
        }
    }
    drop(a);
    drop(b);
    let mut db = open(&path, ConcurrencyMode::ExclusiveWriter).unwrap();
    assert!(db.check_integrity().unwrap());
    assert_eq!(get(&db, u64::MAX), Some(39));
}

#[test]
fn a_reader_follows_a_single_writers_commits() {
    let d = dir();
    let path = d.path().join("single.redb");
    let w = open(&path, ConcurrencyMode::SingleWriter).unwrap();
    let txn = w.begin_write().unwrap();
    txn.open_table(T).unwrap().insert(0, 0).unwrap();
    txn.commit().unwrap();
    let mut b = Database::builder();
    b.set_concurrency_mode(ConcurrencyMode::SingleWriter);
    let reader = b
        .open_read_only_with_backend(PagewriterBackend::open_read_only(&path).unwrap())
        .unwrap();
    assert!(matches!(
        open(&path, ConcurrencyMode::SingleWriter),
        Err(DatabaseError::DatabaseAlreadyOpen)
    ));
    for v in 1..30u64 {
        let txn = w.begin_write().unwrap();
        {
            let mut t = txn.open_table(T).unwrap();
            t.insert(0, v).unwrap();
            t.insert(v, v).unwrap();
        }
        txn.commit().unwrap();
        let r = reader.begin_read().unwrap();
        let t = r.open_table(T).unwrap();
        assert_eq!(t.get(0).unwrap().unwrap().value(), v);
        assert_eq!(t.get(v).unwrap().unwrap().value(), v);
    }
}

/// `open_with` with pagewriter's default options (which lock the file)
/// leaves the locking to redb: the open works, a second one is refused
/// as redb refuses it.
#[test]
fn open_with_default_options_leaves_the_locking_to_redb() {
    let d = dir();
    let path = d.path().join("opts.redb");
    let be = PagewriterBackend::open_with(
        &path,
        &pagewriter::OpenOptions::new(),
        PagewriterBackend::default_config(),
    )
    .unwrap();
    let db = Database::builder().create_with_backend(be).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(T).unwrap().insert(1, 1).unwrap();
    txn.commit().unwrap();
    assert!(matches!(
        open(&path, ConcurrencyMode::ExclusiveWriter),
        Err(DatabaseError::DatabaseAlreadyOpen)
    ));
    assert_eq!(get(&db, 1), Some(1));
}

/// A lock taken when the file cannot follow another writer (here: closed
/// underneath) is released again and the error returned, so no other
/// handle waits on a lock redb thinks it does not hold.
#[test]
fn a_lock_that_cannot_follow_is_released() {
    use redb::StorageBackend;
    use std::ops::Bound::{Excluded, Included};
    let d = dir();
    let path = d.path().join("lock.redb");
    let be = PagewriterBackend::open(&path).unwrap();
    be.file().close().unwrap();
    assert!(be.lock_range(Included(0), Excluded(10)).is_err());
    assert!(be.try_lock_shared_range(Included(0), Excluded(10)).is_err());
    let other = PagewriterBackend::open(&path).unwrap();
    assert!(other.try_lock_range(Included(0), Excluded(10)).unwrap());
    assert!(be.query_lock_range(Included(0), Excluded(10)).unwrap());
}
