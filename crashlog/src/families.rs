//! The column-family workload: redb databases in column families of one
//! pagewriter file (`pagewriter_redb::ColumnFamilies`), written and
//! committed from four threads at once while families are created, grown
//! by extents, one deleted and a new one made in its space. Each
//! acknowledged step is a note: "create a" (redb created its database on
//! family `a`), "commit a 7" (transaction 7 of `a` is durable), "deleting
//! d" (logged before the delete starts: from there `d` may be gone) and
//! "delete d"; the workload's own check reopens every family of a
//! replayed state with redb.

use std::collections::BTreeMap;
use std::path::Path;

use pagewriter::{Config, DirectIo};
use pagewriter_redb::ColumnFamilies;
use redb::{Database, ReadableDatabase, TableDefinition};

use crate::expect::Expect;
use crate::workload::{Ctx, PS};

const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");

/// Every family the workload may make, in order of creation per thread:
/// `a`, `b`, `c` one thread each; `d`, then (once `d` is deleted) `e` in
/// its space, on the fourth.
const FAMILIES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// Transactions per family of the first three threads, and per family of
/// the fourth.
const TXNS: u64 = 24;
const SHORT_TXNS: u64 = 6;

/// Keys per transaction and bytes per value: a family of the first three
/// grows past 1 MiB, so by several extents.
const KEYS: u64 = 16;
const VALUE_BYTES: usize = 3000;

/// The configuration: 4 KiB pages (redb's), a 4 MiB write buffer, O_DIRECT.
pub fn config() -> Config {
    Config::default()
        .page_size(PS)
        .max_write_buffer_bytes(4 << 20)
        .direct(DirectIo::Auto)
}

/// The value of `key` in family `family`: differs per family, key and
/// byte, so a family reading another's bytes is seen.
fn value(family: &str, key: u64) -> Vec<u8> {
    let mut x = (key + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(family.as_bytes()[0]);
    (0..VALUE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Transactions `0..txns` into the family `name`, a note after each
/// commit returned `Ok`.
fn transactions(c: &Ctx, cfs: &ColumnFamilies, name: &str, txns: u64) -> Result<(), String> {
    let fam = cfs
        .column_family(name)
        .map_err(|e| format!("column family {name}: {e}"))?;
    let db = Database::builder()
        .create_with_backend(fam)
        .map_err(|e| format!("redb on {name}: {e}"))?;
    c.ack_note(format!("create {name}"))?;
    for txn in 0..txns {
        let w = db.begin_write().map_err(|e| format!("{name}: {e}"))?;
        {
            let mut t = w.open_table(T).map_err(|e| format!("{name}: {e}"))?;
            for key in txn * KEYS..(txn + 1) * KEYS {
                t.insert(key, value(name, key).as_slice())
                    .map_err(|e| format!("{name} insert {key}: {e}"))?;
            }
        }
        w.commit()
            .map_err(|e| format!("{name} commit {txn}: {e}"))?;
        c.ack_note(format!("commit {name} {txn}"))?;
    }
    Ok(())
}

/// The body: the file's column families created by the first open; three
/// threads each fill a family of their own, a fourth fills `d`, deletes
/// it and fills `e`, which reuses its space.
pub fn run(c: &Ctx) -> Result<(), String> {
    let cfs = ColumnFamilies::open_with(&c.path, c.config.clone())
        .map_err(|e| format!("open {}: {e}", c.path.display()))?;
    crate::workload::on_threads(4, |t| match t {
        0..3 => transactions(c, &cfs, FAMILIES[t as usize], TXNS),
        _ => {
            transactions(c, &cfs, "d", SHORT_TXNS)?;
            // From here a state may have lost `d` (not a promise: a mark).
            c.ack_note("deleting d".into())?;
            cfs.delete("d").map_err(|e| format!("delete d: {e}"))?;
            c.ack_note("delete d".into())?;
            transactions(c, &cfs, "e", SHORT_TXNS)
        }
    })
}

/// The check of a replayed state: without the file, nothing may have
/// been acknowledged. With it, the column families open; a family whose
/// delete was acknowledged is gone; a family whose creation was
/// acknowledged is there (unless its delete had begun), and redb opens it
/// and its `check_integrity` passes (a family whose creation was not
/// acknowledged may also be absent, or cut short before redb wrote its
/// magic number); each family present holds whole transactions, a prefix
/// of those written (every acknowledged one), with its own values.
pub fn check(path: &Path, config: &Config, expect: &Expect, acked: &[usize]) -> Result<(), String> {
    let mut committed: BTreeMap<&str, u64> = BTreeMap::new();
    let mut deleted = Vec::new();
    let mut created = Vec::new();
    let mut deleting = Vec::new();
    for id in acked {
        let note = expect
            .notes
            .get(id)
            .ok_or_else(|| format!("acknowledged commit {id} has no note"))?;
        let words: Vec<&str> = note.split(' ').collect();
        match words.as_slice() {
            ["commit", name, txn] => {
                let name = FAMILIES
                    .into_iter()
                    .find(|f| f == name)
                    .ok_or_else(|| format!("a note of an unknown family: {note}"))?;
                let txn: u64 = txn.parse().map_err(|_| format!("a bad note: {note}"))?;
                let c = committed.entry(name).or_insert(txn);
                *c = (*c).max(txn);
            }
            ["create", name] => created.push(name.to_string()),
            ["deleting", name] => deleting.push(name.to_string()),
            ["delete", name] => deleted.push(name.to_string()),
            _ => return Err(format!("a bad note: {note}")),
        }
    }
    if !path.exists() {
        return crate::expect::missing_file(acked);
    }
    let cfs = ColumnFamilies::open_with(path, config.clone())
        .map_err(|e| format!("the column families do not open: {e}"))?;
    let names = cfs.names();
    if let Some(stray) = names.iter().find(|n| !FAMILIES.contains(&n.as_str())) {
        return Err(format!("a family never made: {stray:?}"));
    }
    for name in FAMILIES {
        let present = names.iter().any(|n| n == name);
        let gone = deleted.iter().any(|d| d == name);
        if gone && present {
            return Err(format!("{name} is there after its delete was acknowledged"));
        }
        if !present {
            let may_be_gone = deleting.iter().any(|d| d == name);
            if !may_be_gone && created.iter().any(|c| c == name) {
                return Err(format!("{name} is gone, but its creation was acknowledged"));
            }
            continue;
        }
        let fam = cfs
            .column_family(name)
            .map_err(|e| format!("{name} does not open: {e}"))?;
        let mut db = match Database::builder().create_with_backend(fam) {
            Ok(db) => db,
            // redb writes its magic number last when it creates a
            // database: before that, no open succeeds.
            Err(_) if !created.iter().any(|c| c == name) && !redb_magic(&cfs, name)? => continue,
            Err(e) => return Err(format!("redb does not open {name}: {e}")),
        };
        match db.check_integrity() {
            Ok(true) => {}
            Ok(false) => return Err(format!("{name}: check_integrity repaired the database")),
            Err(e) => return Err(format!("{name}: check_integrity: {e}")),
        }
        let read = db.begin_read().map_err(|e| format!("{name}: {e}"))?;
        let txns = match read.open_table(T) {
            Ok(t) => whole_transactions(name, &t)?,
            Err(redb::TableError::TableDoesNotExist(_)) => 0,
            Err(e) => return Err(format!("{name}: {e}")),
        };
        if let Some(&txn) = committed.get(name)
            && txns <= txn
        {
            return Err(format!(
                "{name} holds {txns} transactions, but its commit {txn} was acknowledged"
            ));
        }
    }
    Ok(())
}

/// Whether family `name` holds redb's magic number (its first 9 bytes
/// not all zeros: redb's creation of it got that far).
fn redb_magic(cfs: &ColumnFamilies, name: &str) -> Result<bool, String> {
    let fam = cfs
        .column_family(name)
        .map_err(|e| format!("{name} does not open: {e}"))?;
    let mut magic = [0u8; 9];
    Ok(fam.len() >= 9 && {
        fam.read_at(0, &mut magic)
            .map_err(|e| format!("reading {name}: {e}"))?;
        magic != [0; 9]
    })
}

/// How many transactions `table` of family `name` holds: each whole, with
/// the family's values, and the first ones written (no gap).
fn whole_transactions(name: &str, table: &redb::ReadOnlyTable<u64, &[u8]>) -> Result<u64, String> {
    use redb::ReadableTableMetadata;
    let len = table.len().map_err(|e| format!("{name}: {e}"))?;
    if len % KEYS != 0 {
        return Err(format!("{name} holds {len} keys: a transaction is torn"));
    }
    let txns = len / KEYS;
    for key in 0..len {
        let got = table
            .get(key)
            .map_err(|e| format!("{name} key {key}: {e}"))?
            .ok_or_else(|| format!("{name} holds {len} keys but not key {key}"))?;
        if got.value() != value(name, key).as_slice() {
            return Err(format!(
                "{name} key {key} holds bytes that are not its value"
            ));
        }
    }
    Ok(txns)
}
