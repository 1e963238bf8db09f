//! The engines `pagewriter cf` runs, each behind [`Store`]: a database
//! (or column family, or keyspace) per writer, batches of keys committed
//! durably, point reads. The peers are behind cargo features
//! (`peer-fjall`, `peer-manifold`, `peer-lmdb`), so the default build has
//! only redb and pagewriter-redb.

use std::path::Path;

use redb::{Database, ReadableDatabase, TableDefinition};

/// At most this many writers (a table name each in the one-file engine).
pub const MAX_WRITERS: usize = 16;

const TABLES: [&str; MAX_WRITERS] = [
    "w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10", "w11", "w12", "w13", "w14",
    "w15",
];

fn table(w: usize) -> TableDefinition<'static, u64, &'static [u8]> {
    TableDefinition::new(TABLES[w])
}

/// An engine under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// redb column families on pagewriter, one file.
    PwCf,
    /// redb on a file per writer, redb's own backend.
    RedbFiles,
    /// redb on a file per writer through `PagewriterBackend`.
    PwFiles,
    /// One redb file, a table per writer.
    RedbOneFile,
    /// fjall keyspaces, one database.
    #[cfg(feature = "peer-fjall")]
    Fjall,
    /// manifold-db column families with its WAL (its default).
    #[cfg(feature = "peer-manifold")]
    ManifoldWal,
    /// manifold-db column families without its WAL.
    #[cfg(feature = "peer-manifold")]
    ManifoldNoWal,
    /// LMDB named databases, one environment.
    #[cfg(feature = "peer-lmdb")]
    Lmdb,
    /// RocksDB column families, one database.
    #[cfg(feature = "peer-rocksdb")]
    #[serde(rename = "rocksdb")]
    RocksDb,
}

impl Engine {
    /// Every engine this build has, in table order.
    pub fn all() -> Vec<Engine> {
        vec![
            Engine::PwCf,
            Engine::RedbFiles,
            Engine::PwFiles,
            Engine::RedbOneFile,
            #[cfg(feature = "peer-fjall")]
            Engine::Fjall,
            #[cfg(feature = "peer-manifold")]
            Engine::ManifoldWal,
            #[cfg(feature = "peer-manifold")]
            Engine::ManifoldNoWal,
            #[cfg(feature = "peer-lmdb")]
            Engine::Lmdb,
            #[cfg(feature = "peer-rocksdb")]
            Engine::RocksDb,
        ]
    }

    /// Its name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Engine::PwCf => "pw-cf",
            Engine::RedbFiles => "redb-files",
            Engine::PwFiles => "pw-files",
            Engine::RedbOneFile => "redb-one-file",
            #[cfg(feature = "peer-fjall")]
            Engine::Fjall => "fjall",
            #[cfg(feature = "peer-manifold")]
            Engine::ManifoldWal => "manifold-wal",
            #[cfg(feature = "peer-manifold")]
            Engine::ManifoldNoWal => "manifold-no-wal",
            #[cfg(feature = "peer-lmdb")]
            Engine::Lmdb => "lmdb",
            #[cfg(feature = "peer-rocksdb")]
            Engine::RocksDb => "rocksdb",
        }
    }

    /// How a commit is made durable.
    pub fn durability(self) -> &'static str {
        match self {
            Engine::PwCf => {
                "redb on a pagewriter column family per writer, one file: a scoped commit of the family's pages (and of the directory when its extents changed); concurrent commits share fdatasyncs"
            }
            Engine::RedbFiles => {
                "redb on a file per writer, its own backend: pwrite of the pages, fdatasync of that file (Durability::Immediate)"
            }
            Engine::PwFiles => {
                "redb on a file per writer through PagewriterBackend: one coalesced write pass and an fdatasync of that file"
            }
            Engine::RedbOneFile => {
                "one redb file, a table per writer: one write transaction at a time, each synced (writers take turns)"
            }
            #[cfg(feature = "peer-fjall")]
            Engine::Fjall => {
                "fjall 3, a keyspace per writer: a WriteBatch with PersistMode::SyncData, the shared journal fdatasynced per batch"
            }
            #[cfg(feature = "peer-manifold")]
            Engine::ManifoldWal => {
                "manifold-db 3.1 ColumnFamilyDatabase (WAL, its default): a WAL entry synced per commit, the main file synced at checkpoints"
            }
            #[cfg(feature = "peer-manifold")]
            Engine::ManifoldNoWal => {
                "manifold-db 3.1 ColumnFamilyDatabase without its WAL: the column family's pages synced per commit"
            }
            #[cfg(feature = "peer-lmdb")]
            Engine::Lmdb => {
                "LMDB (lmdb-rkv 0.14), a named database per writer in one environment: one write transaction at a time, fdatasync per commit (its default sync)"
            }
            #[cfg(feature = "peer-rocksdb")]
            Engine::RocksDb => {
                "RocksDB (rocksdb 0.25), a column family per writer: a WriteBatch with WriteOptions::set_sync(true); the write group's leader appends the group's batches to the one WAL and syncs it once"
            }
        }
    }

    /// The engine named `s`.
    pub fn parse(s: &str) -> Option<Engine> {
        Engine::all().into_iter().find(|e| e.name() == s)
    }
}

/// A database per writer, however the engine holds it. `Send + Sync`:
/// writers and readers share it.
pub trait Store: Send + Sync {
    /// Inserts `keys` of writer `w` (each with `value`) and commits them
    /// durably as one batch.
    fn commit(&self, w: usize, keys: std::ops::Range<u64>, value: &[u8]) -> Result<(), String>;
    /// Whether writer `w`'s `key` is there (one point read, in a read
    /// transaction or snapshot of its own).
    fn get(&self, w: usize, key: u64) -> Result<bool, String>;
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Opens `engine` for `writers` writers in the empty directory `dir`.
///
/// Errors: the engine's, as text.
pub fn open(engine: Engine, dir: &Path, writers: usize) -> Result<Box<dyn Store>, String> {
    Ok(match engine {
        Engine::PwCf => {
            let cfs =
                pagewriter_redb::ColumnFamilies::open(dir.join("families.pwcf")).map_err(err)?;
            let dbs = (0..writers)
                .map(|w| {
                    let family = cfs.column_family(TABLES[w]).map_err(err)?;
                    Database::builder().create_with_backend(family).map_err(err)
                })
                .collect::<Result<_, _>>()?;
            Box::new(RedbEach(dbs))
        }
        Engine::RedbFiles => Box::new(RedbEach(
            (0..writers)
                .map(|w| Database::create(dir.join(format!("{}.redb", TABLES[w]))).map_err(err))
                .collect::<Result<_, _>>()?,
        )),
        Engine::PwFiles => Box::new(RedbEach(
            (0..writers)
                .map(|w| {
                    let backend = pagewriter_redb::PagewriterBackend::open(
                        dir.join(format!("{}.redb", TABLES[w])),
                    )
                    .map_err(err)?;
                    Database::builder()
                        .create_with_backend(backend)
                        .map_err(err)
                })
                .collect::<Result<_, _>>()?,
        )),
        Engine::RedbOneFile => Box::new(RedbOne(
            Database::create(dir.join("one.redb")).map_err(err)?,
        )),
        #[cfg(feature = "peer-fjall")]
        Engine::Fjall => Box::new(peers::Fjall::open(dir, writers)?),
        #[cfg(feature = "peer-manifold")]
        Engine::ManifoldWal => Box::new(peers::Manifold::open(dir, writers, true)?),
        #[cfg(feature = "peer-manifold")]
        Engine::ManifoldNoWal => Box::new(peers::Manifold::open(dir, writers, false)?),
        #[cfg(feature = "peer-lmdb")]
        Engine::Lmdb => Box::new(peers::Lmdb::open(dir, writers)?),
        #[cfg(feature = "peer-rocksdb")]
        Engine::RocksDb => Box::new(peers::Rocks::open(dir, writers)?),
    })
}

/// A redb database per writer (each in table `t`).
struct RedbEach(Vec<Database>);

/// One redb database, a table per writer.
struct RedbOne(Database);

const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");

fn redb_commit(
    db: &Database,
    t: TableDefinition<u64, &[u8]>,
    keys: std::ops::Range<u64>,
    value: &[u8],
) -> Result<(), String> {
    let txn = db.begin_write().map_err(err)?;
    {
        let mut tab = txn.open_table(t).map_err(err)?;
        for k in keys {
            tab.insert(k, value).map_err(err)?;
        }
    }
    txn.commit().map_err(err)
}

fn redb_get(db: &Database, t: TableDefinition<u64, &[u8]>, key: u64) -> Result<bool, String> {
    let txn = db.begin_read().map_err(err)?;
    match txn.open_table(t) {
        Ok(tab) => Ok(tab.get(key).map_err(err)?.is_some()),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
        Err(e) => Err(err(e)),
    }
}

impl Store for RedbEach {
    fn commit(&self, w: usize, keys: std::ops::Range<u64>, value: &[u8]) -> Result<(), String> {
        redb_commit(&self.0[w], T, keys, value)
    }
    fn get(&self, w: usize, key: u64) -> Result<bool, String> {
        redb_get(&self.0[w], T, key)
    }
}

impl Store for RedbOne {
    fn commit(&self, w: usize, keys: std::ops::Range<u64>, value: &[u8]) -> Result<(), String> {
        redb_commit(&self.0, table(w), keys, value)
    }
    fn get(&self, w: usize, key: u64) -> Result<bool, String> {
        redb_get(&self.0, table(w), key)
    }
}

#[cfg(any(
    feature = "peer-fjall",
    feature = "peer-manifold",
    feature = "peer-lmdb"
))]
mod peers {
    use super::*;

    #[cfg(feature = "peer-fjall")]
    pub struct Fjall {
        db: fjall::Database,
        keyspaces: Vec<fjall::Keyspace>,
    }

    #[cfg(feature = "peer-fjall")]
    impl Fjall {
        pub fn open(dir: &Path, writers: usize) -> Result<Self, String> {
            let db = fjall::Database::builder(dir.join("fjall"))
                .open()
                .map_err(err)?;
            let keyspaces = (0..writers)
                .map(|w| {
                    db.keyspace(TABLES[w], fjall::KeyspaceCreateOptions::default)
                        .map_err(err)
                })
                .collect::<Result<_, _>>()?;
            Ok(Fjall { db, keyspaces })
        }
    }

    #[cfg(feature = "peer-fjall")]
    impl Store for Fjall {
        fn commit(&self, w: usize, keys: std::ops::Range<u64>, value: &[u8]) -> Result<(), String> {
            let mut batch = self
                .db
                .batch()
                .durability(Some(fjall::PersistMode::SyncData));
            for k in keys {
                batch.insert(&self.keyspaces[w], k.to_be_bytes(), value);
            }
            batch.commit().map_err(err)
        }
        fn get(&self, w: usize, key: u64) -> Result<bool, String> {
            self.keyspaces[w]
                .contains_key(key.to_be_bytes())
                .map_err(err)
        }
    }

    #[cfg(feature = "peer-manifold")]
    pub struct Manifold {
        /// Kept open for the families' sake.
        _db: manifold::column_family::ColumnFamilyDatabase,
        families: Vec<manifold::column_family::ColumnFamily>,
    }

    #[cfg(feature = "peer-manifold")]
    const MT: manifold::TableDefinition<u64, &[u8]> = manifold::TableDefinition::new("t");

    #[cfg(feature = "peer-manifold")]
    impl Manifold {
        pub fn open(dir: &Path, writers: usize, wal: bool) -> Result<Self, String> {
            let path = dir.join("manifold.db");
            let db = if wal {
                manifold::column_family::ColumnFamilyDatabase::open(&path)
            } else {
                manifold::column_family::ColumnFamilyDatabase::builder()
                    .without_wal()
                    .open(&path)
            }
            .map_err(err)?;
            let families = (0..writers)
                .map(|w| db.column_family_or_create(TABLES[w]).map_err(err))
                .collect::<Result<_, _>>()?;
            Ok(Manifold { _db: db, families })
        }
    }

    #[cfg(feature = "peer-manifold")]
    impl Store for Manifold {
        fn commit(&self, w: usize, keys: std::ops::Range<u64>, value: &[u8]) -> Result<(), String> {
            let txn = self.families[w].begin_write().map_err(err)?;
            {
                let mut tab = txn.open_table(MT).map_err(err)?;
                for k in keys {
                    tab.insert(k, value).map_err(err)?;
                }
            }
            txn.commit().map_err(err)
        }
        fn get(&self, w: usize, key: u64) -> Result<bool, String> {
            let txn = self.families[w].begin_read().map_err(err)?;
            match txn.open_table(MT) {
                Ok(tab) => Ok(tab.get(key).map_err(err)?.is_some()),
                Err(manifold::TableError::TableDoesNotExist(_)) => Ok(false),
                Err(e) => Err(err(e)),
            }
        }
    }

    #[cfg(feature = "peer-lmdb")]
    pub struct Lmdb {
        env: lmdb::Environment,
        dbs: Vec<lmdb::Database>,
    }

    /// The environment's map (the most it can hold): sparse until written.
    #[cfg(feature = "peer-lmdb")]
    const LMDB_MAP_BYTES: usize = 16 << 30;

    #[cfg(feature = "peer-lmdb")]
    impl Lmdb {
        pub fn open(dir: &Path, writers: usize) -> Result<Self, String> {
            let path = dir.join("lmdb");
            std::fs::create_dir_all(&path).map_err(err)?;
            let env = lmdb::Environment::new()
                .set_max_dbs(MAX_WRITERS as u32)
                .set_map_size(LMDB_MAP_BYTES)
                .open(&path)
                .map_err(err)?;
            let dbs = (0..writers)
                .map(|w| {
                    env.create_db(Some(TABLES[w]), lmdb::DatabaseFlags::empty())
                        .map_err(err)
                })
                .collect::<Result<_, _>>()?;
            Ok(Lmdb { env, dbs })
        }
    }

    #[cfg(feature = "peer-lmdb")]
    impl Store for Lmdb {
        fn commit(&self, w: usize, keys: std::ops::Range<u64>, value: &[u8]) -> Result<(), String> {
            use lmdb::Transaction;
            let mut txn = self.env.begin_rw_txn().map_err(err)?;
            for k in keys {
                txn.put(
                    self.dbs[w],
                    &k.to_be_bytes(),
                    &value,
                    lmdb::WriteFlags::empty(),
                )
                .map_err(err)?;
            }
            txn.commit().map_err(err)
        }
        fn get(&self, w: usize, key: u64) -> Result<bool, String> {
            use lmdb::Transaction;
            let txn = self.env.begin_ro_txn().map_err(err)?;
            match txn.get(self.dbs[w], &key.to_be_bytes()) {
                Ok(_) => Ok(true),
                Err(lmdb::Error::NotFound) => Ok(false),
                Err(e) => Err(err(e)),
            }
        }
    }

    #[cfg(feature = "peer-rocksdb")]
    pub struct Rocks {
        db: rocksdb::DB,
    }

    #[cfg(feature = "peer-rocksdb")]
    impl Rocks {
        pub fn open(dir: &Path, writers: usize) -> Result<Self, String> {
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            opts.create_missing_column_families(true);
            let names = TABLES[..writers].iter().copied();
            let db = rocksdb::DB::open_cf(&opts, dir.join("rocksdb"), names).map_err(err)?;
            Ok(Rocks { db })
        }
    }

    #[cfg(feature = "peer-rocksdb")]
    impl Store for Rocks {
        fn commit(&self, w: usize, keys: std::ops::Range<u64>, value: &[u8]) -> Result<(), String> {
            let cf = self.db.cf_handle(TABLES[w]).ok_or("no column family")?;
            let mut batch = rocksdb::WriteBatch::default();
            for k in keys {
                batch.put_cf(&cf, k.to_be_bytes(), value);
            }
            let mut wo = rocksdb::WriteOptions::default();
            wo.set_sync(true);
            self.db.write_opt(batch, &wo).map_err(err)
        }
        fn get(&self, w: usize, key: u64) -> Result<bool, String> {
            let cf = self.db.cf_handle(TABLES[w]).ok_or("no column family")?;
            Ok(self
                .db
                .get_pinned_cf(&cf, key.to_be_bytes())
                .map_err(err)?
                .is_some())
        }
    }
}
