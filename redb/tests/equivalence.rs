//! redb on pagewriter holds exactly what redb on its own file backend
//! holds, after the same randomized multi-table workload, a close and a
//! reopen.

use std::collections::BTreeMap;

use pagewriter_redb::PagewriterBackend;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

const TABLES: [TableDefinition<u64, &[u8]>; 3] = [
    TableDefinition::new("a"),
    TableDefinition::new("b"),
    TableDefinition::new("c"),
];

/// xorshift64*: a seeded stream, so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

type Content = Vec<BTreeMap<u64, Vec<u8>>>;

/// Runs the workload of `seed` on `db`.
fn workload(db: &Database, seed: u64, txns: usize) {
    let mut rng = Rng(seed | 1);
    for t in 0..txns {
        let mut txn = db.begin_write().unwrap();
        // Mixed durability; the last commit is durable.
        let durable = t + 1 == txns || rng.below(3) != 0;
        if !durable {
            txn.set_durability(Durability::None).unwrap();
        }
        for _ in 0..1 + rng.below(24) {
            let table = rng.below(3) as usize;
            let key = rng.below(500);
            let mut t = txn.open_table(TABLES[table]).unwrap();
            match rng.below(10) {
                0..=5 => {
                    // Values from 1 byte to several pages (overflow pages).
                    let len = match rng.below(8) {
                        0 => 1 + rng.below(20_000) as usize,
                        _ => 1 + rng.below(1_500) as usize,
                    };
                    let fill = rng.next() as u8;
                    t.insert(key, vec![fill; len].as_slice()).unwrap();
                }
                6..=8 => {
                    t.remove(key).unwrap();
                }
                _ => {
                    // Overwrite every key in a small range.
                    for k in key..key + 8 {
                        t.insert(k, k.to_le_bytes().as_slice()).unwrap();
                    }
                }
            }
        }
        txn.commit().unwrap();
    }
}

fn content(db: &Database) -> Content {
    let r = db.begin_read().unwrap();
    TABLES
        .iter()
        .map(|def| match r.open_table(*def) {
            Ok(t) => t
                .iter()
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    (k.value(), v.value().to_vec())
                })
                .collect(),
            Err(redb::TableError::TableDoesNotExist(_)) => BTreeMap::new(),
            Err(e) => panic!("{e}"),
        })
        .collect()
}

#[test]
fn same_content_as_redbs_own_backend_after_reopen() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for seed in [1u64, 2, 3] {
        let ours = dir.path().join(format!("pw-{seed}.redb"));
        let theirs = dir.path().join(format!("redb-{seed}.redb"));
        {
            let db = Database::builder()
                .create_with_backend(PagewriterBackend::open(&ours).unwrap())
                .unwrap();
            workload(&db, seed, 300);
            let db2 = Database::create(&theirs).unwrap();
            workload(&db2, seed, 300);
            assert_eq!(content(&db), content(&db2), "seed {seed}, before close");
        }
        let db = Database::builder()
            .create_with_backend(PagewriterBackend::open(&ours).unwrap())
            .unwrap();
        let db2 = Database::create(&theirs).unwrap();
        let (a, b) = (content(&db), content(&db2));
        assert!(
            a.iter().map(BTreeMap::len).sum::<usize>() > 100,
            "workload too small"
        );
        assert_eq!(a, b, "seed {seed}, after reopen");
        // And redb's own integrity check passes on our file.
        drop(db);
        let mut db = Database::builder()
            .create_with_backend(PagewriterBackend::open(&ours).unwrap())
            .unwrap();
        assert!(db.check_integrity().unwrap(), "seed {seed}");
    }
}

#[test]
fn a_second_open_of_the_database_is_refused_at_once_as_redb_refuses_it() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("locked.redb");
    let db = Database::builder()
        .create_with_backend(PagewriterBackend::open(&path).unwrap())
        .unwrap();
    // A second writer and a reader, while the writer is open: redb's own
    // error, without a wait.
    let t = std::time::Instant::now();
    match Database::builder().create_with_backend(PagewriterBackend::open(&path).unwrap()) {
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => {}
        other => panic!("second writer: {other:?}"),
    }
    match Database::builder()
        .open_read_only_with_backend(PagewriterBackend::open_read_only(&path).unwrap())
    {
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => {}
        other => panic!("reader beside a writer: {:?}", other.map(|_| ())),
    }
    assert!(
        t.elapsed() < std::time::Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    drop(db);
    // Readers share the file with each other and exclude a writer.
    let r1 = Database::builder()
        .open_read_only_with_backend(PagewriterBackend::open_read_only(&path).unwrap())
        .unwrap();
    let r2 = Database::builder()
        .open_read_only_with_backend(PagewriterBackend::open_read_only(&path).unwrap())
        .unwrap();
    match Database::builder().create_with_backend(PagewriterBackend::open(&path).unwrap()) {
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => {}
        other => panic!("writer beside readers: {other:?}"),
    }
    drop((r1, r2));
    Database::builder()
        .create_with_backend(PagewriterBackend::open(&path).unwrap())
        .unwrap();
}
