//! Column families: redb databases in one file, bounds, the directory's
//! crash atomicity, delete and reuse, and bad input.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use pagewriter::testing::{CrashBackend, FsKind, ScratchFs};
use pagewriter::{Config, PagedCachedFile};
use pagewriter_redb::cf::{self, DATA_START, EXTENT_UNIT, SLOT_BYTES};
use pagewriter_redb::{ColumnFamilies, ColumnFamily, PagewriterBackend};
use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition};

const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");

fn value(writer: u64, key: u64) -> Vec<u8> {
    (0..150)
        .map(|i| (writer * 31 + key * 7 + i) as u8)
        .collect()
}

#[test]
fn four_databases_on_four_threads_commit_and_read_back_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    let cfs = ColumnFamilies::open(&path).unwrap();
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let cfs = cfs.clone();
            s.spawn(move || {
                let db = Database::builder()
                    .create_with_backend(cfs.column_family(&format!("cf{w}")).unwrap())
                    .unwrap();
                for batch in 0..20u64 {
                    let txn = db.begin_write().unwrap();
                    {
                        let mut t = txn.open_table(T).unwrap();
                        for k in batch * 50..(batch + 1) * 50 {
                            t.insert(k, value(w, k).as_slice()).unwrap();
                        }
                    }
                    txn.commit().unwrap();
                }
            });
        }
    });
    assert_eq!(cfs.names(), ["cf0", "cf1", "cf2", "cf3"]);
    drop(cfs);

    let cfs = ColumnFamilies::open(&path).unwrap();
    for w in 0..4u64 {
        let db = Database::builder()
            .create_with_backend(cfs.column_family(&format!("cf{w}")).unwrap())
            .unwrap();
        let txn = db.begin_read().unwrap();
        let t = txn.open_table(T).unwrap();
        assert_eq!(t.len().unwrap(), 1000);
        for k in [0, 499, 999] {
            assert_eq!(t.get(k).unwrap().unwrap().value(), value(w, k).as_slice());
        }
        drop(t);
        drop(txn);
        let mut db = db;
        assert!(db.check_integrity().unwrap());
    }
}

#[test]
fn a_family_outlives_its_column_families_and_is_send_and_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<ColumnFamilies>();
    send_sync::<ColumnFamily>();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    let family = ColumnFamilies::open(&path)
        .unwrap()
        .column_family("a")
        .unwrap();
    family.write_at(0, b"still open").unwrap();
    family.sync().unwrap();
    drop(family);
    let family = ColumnFamilies::open(&path)
        .unwrap()
        .column_family("a")
        .unwrap();
    let mut got = [0u8; 10];
    family.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"still open");
}

/// A pattern byte for family `f` at logical offset `at`.
fn byte(f: u8, at: u64) -> u8 {
    f.wrapping_mul(77).wrapping_add((at / 4096) as u8)
}

#[test]
fn families_growing_in_turns_never_touch_each_other_and_reads_stop_at_the_length() {
    let dir = tempfile::tempdir().unwrap();
    let cfs = ColumnFamilies::open(dir.path().join("cf.pwcf")).unwrap();
    let a = cfs.column_family("a").unwrap();
    let b = cfs.column_family("b").unwrap();
    // Interleaved growth: the extents of a and b alternate in the file.
    let chunk = vec![0u8; 300_000];
    for step in 0..12u64 {
        for (f, fam) in [(1u8, &a), (2u8, &b)] {
            let at = step * chunk.len() as u64;
            let data: Vec<u8> = (0..chunk.len() as u64).map(|i| byte(f, at + i)).collect();
            fam.write_at(at, &data).unwrap();
        }
    }
    a.sync().unwrap();
    b.sync().unwrap();
    let len = 12 * chunk.len() as u64;
    for (f, fam) in [(1u8, &a), (2u8, &b)] {
        assert_eq!(fam.len(), len);
        let mut all = vec![0u8; len as usize];
        fam.read_at(0, &mut all).unwrap();
        for (i, got) in all.iter().enumerate() {
            assert_eq!(*got, byte(f, i as u64), "family {f} byte {i}");
        }
        // Reads stop at the length; a write past it grows the family.
        let mut one = [0u8; 1];
        let err = fam.read_at(len, &mut one).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(fam.read_at(u64::MAX, &mut one).is_err());
        assert!(fam.write_at(u64::MAX, b"xy").is_err());
    }
    // No two extents overlap, none reaches the directory slots.
    let mut extents: Vec<_> = a.extents().into_iter().chain(b.extents()).collect();
    extents.sort_by_key(|r| r.start);
    assert!(extents[0].start >= DATA_START);
    for w in extents.windows(2) {
        assert!(w[0].end <= w[1].start, "{w:?}");
    }
    // Growth is geometric: a few extents, not one per write.
    assert!(a.extents().len() <= 4, "{:?}", a.extents());
}

#[test]
fn shrinking_then_growing_reads_zeros_where_bytes_were_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    let cfs = ColumnFamilies::open(&path).unwrap();
    let a = cfs.column_family("a").unwrap();
    a.write_at(0, &vec![0xAB; 3 * 4096]).unwrap();
    a.set_len(4096).unwrap();
    a.set_len(3 * 4096).unwrap();
    let mut got = vec![1u8; 2 * 4096];
    a.read_at(4096, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0));
    a.sync().unwrap();
    drop(a);
    drop(cfs);
    let a = ColumnFamilies::open(&path)
        .unwrap()
        .column_family("a")
        .unwrap();
    assert_eq!(a.len(), 3 * 4096);
}

#[test]
fn a_deleted_familys_space_is_reused_and_reads_as_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    let cfs = ColumnFamilies::open(&path).unwrap();
    {
        let old = cfs.column_family("old").unwrap();
        old.write_at(0, &vec![0xEE; 4 * EXTENT_UNIT as usize])
            .unwrap();
        old.sync().unwrap();
        assert!(matches!(cfs.delete("old"), Err(cf::Error::InUse { .. })));
    }
    let end = cfs.allocated_bytes();
    cfs.delete("old").unwrap();
    assert!(matches!(cfs.delete("old"), Err(cf::Error::NotFound { .. })));
    assert_eq!(cfs.names(), Vec::<String>::new());

    let new = cfs.column_family("new").unwrap();
    new.set_len(2 * EXTENT_UNIT).unwrap();
    assert_eq!(cfs.allocated_bytes(), end, "the freed space was reused");
    let mut got = vec![1u8; 2 * EXTENT_UNIT as usize];
    new.read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0), "old bytes showed through");
    new.sync().unwrap();
    drop(new);
    drop(cfs);

    // The delete and the reuse are durable.
    let cfs = ColumnFamilies::open(&path).unwrap();
    assert_eq!(cfs.names(), ["new"]);
    assert_eq!(cfs.allocated_bytes(), end);
}

#[test]
fn bad_names_and_second_handles_are_typed_errors_that_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfs = ColumnFamilies::open(dir.path().join("cf.pwcf")).unwrap();
    let long = "x".repeat(256);
    for bad in ["", long.as_str(), "a\0b"] {
        match cfs.column_family(bad) {
            Err(cf::Error::InvalidName { name, .. }) => assert_eq!(name, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
        assert!(matches!(
            cfs.delete(bad),
            Err(cf::Error::InvalidName { .. })
        ));
    }
    assert!(cfs.column_family(&"y".repeat(255)).is_ok());
    let a = cfs.column_family("a").unwrap();
    match cfs.column_family("a") {
        Err(cf::Error::InUse { name }) => assert_eq!(name, "a"),
        other => panic!("{other:?}"),
    }
    drop(a);
    cfs.column_family("a").unwrap();
    assert_eq!(cfs.names().len(), 2);
}

#[test]
fn plain_files_and_column_family_files_refuse_the_other_opener_and_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    // A plain redb file, opened as column families.
    let plain = dir.path().join("plain.redb");
    {
        let db = Database::create(&plain).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(T)
            .unwrap()
            .insert(1, b"v".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let before = std::fs::read(&plain).unwrap();
    match ColumnFamilies::open(&plain) {
        Err(cf::Error::NotColumnFamilies { path }) => assert_eq!(path, plain),
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(&plain).unwrap(), before);

    // A column-family file, opened as a plain backend.
    let cf_path = dir.path().join("cf.pwcf");
    drop(
        ColumnFamilies::open(&cf_path)
            .unwrap()
            .column_family("a")
            .unwrap(),
    );
    let before = std::fs::read(&cf_path).unwrap();
    match PagewriterBackend::open(&cf_path) {
        Err(pagewriter::Error::Open { path, .. }) => assert_eq!(path, cf_path),
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(&cf_path).unwrap(), before);
}

#[test]
fn a_creation_cut_short_by_a_power_cut_is_created_again_but_a_users_file_of_zeros_is_refused() {
    // Every image a power cut during the creation's one fdatasync could
    // leave opens as empty column families.
    let config = Config::default();
    let backend = Arc::new(CrashBackend::new().images_at_every_sync(16));
    let file = PagedCachedFile::new(Arc::clone(&backend), config.clone()).unwrap();
    drop(ColumnFamilies::new(file, "crash").unwrap());
    let images = backend.take_images();
    assert!(images.len() >= 16, "{} images", images.len());
    let mut cut_short = 0;
    for (i, image) in images.iter().enumerate() {
        let file = PagedCachedFile::new(CrashBackend::from_image(image), config.clone()).unwrap();
        let cfs = ColumnFamilies::new(file, "image").unwrap_or_else(|e| panic!("image {i}: {e}"));
        assert!(cfs.names().is_empty(), "image {i}");
        cut_short +=
            usize::from(!image.is_empty() && !image[SLOT_BYTES as usize..].starts_with(b"PWCF"));
    }
    assert!(cut_short > 0, "no image lost the directory's write");

    // Files of zeros no creation leaves: refused, left as they were.
    let dir = tempfile::tempdir().unwrap();
    for len in [1, 4096, SLOT_BYTES, SLOT_BYTES + (64 << 10), 2 * SLOT_BYTES] {
        let path = dir.path().join(format!("zeros-{len}"));
        std::fs::write(&path, vec![0u8; len as usize]).unwrap();
        match ColumnFamilies::open(&path) {
            Err(cf::Error::NotColumnFamilies { path: p }) => assert_eq!(p, path),
            other => panic!("{len} bytes of zeros: {other:?}"),
        }
        let after = std::fs::read(&path).unwrap();
        assert!(
            after.len() == len as usize && after.iter().all(|&b| b == 0),
            "{len}"
        );
    }
}

#[test]
fn a_directory_whose_checksums_fail_is_a_typed_error_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    {
        let cfs = ColumnFamilies::open(&path).unwrap();
        drop(cfs.column_family("a").unwrap());
    }
    let mut bytes = std::fs::read(&path).unwrap();
    // Flip a body byte in both slots.
    bytes[30] ^= 0xFF;
    bytes[SLOT_BYTES as usize + 30] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
    match ColumnFamilies::open(&path) {
        Err(cf::Error::BadDirectory { path: p, why }) => {
            assert_eq!(p, path);
            assert!(why.contains("checksum"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn a_torn_newest_directory_falls_back_to_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    {
        let cfs = ColumnFamilies::open(&path).unwrap();
        drop(cfs.column_family("a").unwrap()); // generation 2, slot 0
        drop(cfs.column_family("b").unwrap()); // generation 3, slot 1
    }
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[SLOT_BYTES as usize + 30] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(ColumnFamilies::open(&path).unwrap().names(), ["a"]);
}

/// A committed family: its length and fill byte.
type Family = (u64, u8);

/// Checks one crash image: the directory opens (the old one or the new
/// one, never a mix); every family in `intact` holds exactly what it was
/// committed with; `changing` (the family an operation was committing
/// when the power went: its pages may be torn between two versions, as a
/// file's overwrite would be) has one of the `lengths`, `None` for absent.
fn check_image(
    image: &[u8],
    config: &Config,
    intact: &[(String, Family)],
    changing: (&str, &[Option<u64>]),
    at: &str,
) {
    let file = PagedCachedFile::new(CrashBackend::from_image(image), config.clone()).unwrap();
    let cfs = ColumnFamilies::new(file, "image").unwrap_or_else(|e| panic!("{at}: {e}"));
    for (name, (len, fill)) in intact {
        assert!(cfs.names().contains(name), "{at}: {name} lost");
        let fam = cfs.column_family(name).unwrap();
        assert_eq!(fam.len(), *len, "{at}: {name}");
        let mut got = vec![0u8; *len as usize];
        fam.read_at(0, &mut got).unwrap();
        assert!(got.iter().all(|b| b == fill), "{at}: {name}'s bytes");
    }
    let (name, lengths) = changing;
    let len = cfs
        .names()
        .contains(&name.to_string())
        .then(|| cfs.column_family(name).unwrap().len());
    assert!(
        lengths.contains(&len),
        "{at}: {name} has length {len:?}, allowed {lengths:?}"
    );
}

#[test]
fn after_a_power_cut_at_any_fdatasync_the_directory_is_whole_and_every_commit_is_there() {
    // Families created, grown, written, committed and one deleted on a
    // backend that takes crash images (writes since the last fdatasync
    // kept, dropped or torn) at the start of every fdatasync.
    let config = Config::default().max_write_buffer_bytes(8 << 20);
    let mut images = 0;
    for seed in 0..8u64 {
        let backend = Arc::new(CrashBackend::new().images_at_every_sync(8));
        let file = PagedCachedFile::new(Arc::clone(&backend), config.clone()).unwrap();
        let cfs = ColumnFamilies::new(file, "crash").unwrap();
        // Long names: the directory spans several 512-byte sectors, so a
        // crash can tear its write.
        let mut committed: Vec<(String, Family)> = (0..6)
            .map(|i| (format!("{i}{}", "n".repeat(200)), (0, 0)))
            .collect();
        for (name, _) in &committed {
            drop(cfs.column_family(name).unwrap());
        }
        backend.take_images();
        for step in 0..7u64 {
            let name = format!("f{}", (seed + step) % 3);
            let before = committed.iter().find(|(n, _)| *n == name).map(|(_, f)| *f);
            let after = if step == 4 && before.is_some() {
                cfs.delete(&name).unwrap();
                None
            } else {
                let fam = cfs.column_family(&name).unwrap();
                let fill = (seed * 16 + step) as u8 | 1;
                let len = (1 + (seed + step) % 3) * 150_000;
                fam.set_len(0).unwrap();
                fam.write_at(0, &vec![fill; len as usize]).unwrap();
                fam.sync().unwrap();
                Some((len, fill))
            };
            // Images taken during this step: every other family as
            // committed; this one with its length before or after (0 once
            // a new one is named, before its data commit).
            let intact: Vec<(String, Family)> = committed
                .iter()
                .filter(|(n, _)| *n != name)
                .cloned()
                .collect();
            let mut lengths = vec![before.map(|f| f.0), after.map(|f| f.0)];
            if before.is_none() {
                lengths.push(Some(0));
            }
            for (i, image) in backend.take_images().iter().enumerate() {
                let at = format!("seed {seed} step {step} image {i}");
                check_image(image, &config, &intact, (&name, &lengths), &at);
                images += 1;
            }
            committed.retain(|(n, _)| *n != name);
            if let Some(f) = after {
                committed.push((name, f));
            }
        }
    }
    assert!(images > 100, "only {images} crash images");
}

#[test]
fn concurrent_commits_of_four_families_keep_their_bytes_with_at_most_one_fdatasync_each() {
    let dir = tempfile::tempdir().unwrap();
    let cfs = ColumnFamilies::open(dir.path().join("cf.pwcf")).unwrap();
    let families: Vec<Arc<ColumnFamily>> = (0..4)
        .map(|i| Arc::new(cfs.column_family(&format!("f{i}")).unwrap()))
        .collect();
    for f in &families {
        f.set_len(EXTENT_UNIT).unwrap();
        f.sync().unwrap();
    }
    let before = cfs.file().stats();
    let commits = 200u64;
    std::thread::scope(|s| {
        for (i, f) in families.iter().enumerate() {
            s.spawn(move || {
                for c in 0..commits {
                    f.write_at((c % 64) * 4096, &[i as u8; 4096]).unwrap();
                    f.sync().unwrap();
                }
            });
        }
    });
    let after = cfs.file().stats();
    let syncs = after.syncs - before.syncs;
    // Every commit is durable with at most one fdatasync of its own; the
    // count is not timing-dependent in that direction.
    assert!(syncs >= 1 && syncs <= 4 * commits, "{syncs}");
    for (i, f) in families.iter().enumerate() {
        let mut got = [0u8; 4096];
        f.read_at(0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == i as u8));
    }
}

#[test]
fn redbs_multi_process_modes_on_a_column_family_are_refused_at_open() {
    // A column family has no byte-range locks of its own: redb's
    // `SingleWriter` and `MultiWriter` modes need them and refuse the
    // open with a typed error; `ExclusiveWriter` (the default) works, and
    // a second handle on the family is refused by the column families.
    let dir = tempfile::tempdir().unwrap();
    let cfs = ColumnFamilies::open(dir.path().join("cf.pwcf")).unwrap();
    for mode in [
        redb::ConcurrencyMode::SingleWriter,
        redb::ConcurrencyMode::MultiWriter,
    ] {
        let got = Database::builder()
            .set_concurrency_mode(mode)
            .create_with_backend(cfs.column_family("m").unwrap());
        assert!(got.is_err(), "{mode:?} opened");
    }
    let db = Database::builder()
        .create_with_backend(cfs.column_family("m").unwrap())
        .unwrap();
    assert!(matches!(
        cfs.column_family("m"),
        Err(cf::Error::InUse { .. })
    ));
    drop(db);
    assert!(cfs.column_family("m").is_ok());
}

#[test]
fn a_full_disk_while_a_family_grows_fails_its_commit_and_leaves_the_others_intact() {
    for kind in FsKind::ALL {
        let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let Some(fs) = ScratchFs::new(kind, base, kind.min_mib()) else {
            assert!(
                std::env::var_os("PAGEWRITER_REQUIRE_FS").is_none(),
                "{} could not be mounted, and PAGEWRITER_REQUIRE_FS is set",
                kind.name()
            );
            continue;
        };
        full_disk_while_a_family_grows(kind, &fs);
    }
}

/// Family `b` grows a MiB per commit until `fs` is full; `a`, committed
/// before, commits an overwrite after (on btrfs, copy-on-write, that
/// needs space too: it may fail, typed); both read back after a reopen.
fn full_disk_while_a_family_grows(kind: FsKind, fs: &ScratchFs) {
    let name = kind.name();
    let path = fs.path().join("cf.pwcf");
    let cfs = ColumnFamilies::open(&path).unwrap();
    let a = cfs.column_family("a").unwrap();
    a.write_at(0, &vec![0xA1; EXTENT_UNIT as usize]).unwrap();
    a.sync().unwrap();
    let b = cfs.column_family("b").unwrap();
    let chunk = vec![0xB2; EXTENT_UNIT as usize];
    let mut committed = 0u64;
    let err = loop {
        assert!(
            committed <= kind.min_mib() * EXTENT_UNIT,
            "{name}: the file system never filled"
        );
        let written = b.write_at(committed, &chunk).and_then(|()| b.sync());
        match written {
            Ok(()) => committed += EXTENT_UNIT,
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), std::io::ErrorKind::StorageFull, "{name}: {err}");
    // The other family goes on committing in the space it has.
    let rewrote = a.write_at(4096, &[0xA3; 4096]).and_then(|()| a.sync());
    match &rewrote {
        Ok(()) => {}
        Err(e) if kind == FsKind::Btrfs => {
            assert_eq!(e.kind(), std::io::ErrorKind::StorageFull, "{name}: {e}")
        }
        Err(e) => panic!("{name}: a's overwrite failed on a full disk: {e}"),
    }
    let second = if rewrote.is_ok() { 0xA3 } else { 0xA1 };
    drop((a, b, cfs));

    let cfs = ColumnFamilies::open(&path).unwrap();
    let a = cfs.column_family("a").unwrap();
    let mut got = vec![0u8; EXTENT_UNIT as usize];
    a.read_at(0, &mut got).unwrap();
    assert!(
        got[..4096].iter().all(|&x| x == 0xA1),
        "{name}: a lost its first commit"
    );
    assert!(
        got[4096..8192].iter().all(|&x| x == second),
        "{name}: a's overwrite"
    );
    assert!(
        got[8192..].iter().all(|&x| x == 0xA1),
        "{name}: a lost its first commit"
    );
    let b = cfs.column_family("b").unwrap();
    assert!(
        b.len() >= committed,
        "{name}: b is shorter than its commits"
    );
    let mut got = vec![0u8; committed as usize];
    b.read_at(0, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 0xB2),
        "{name}: an acknowledged commit of b was lost"
    );
}

#[test]
fn close_frees_the_name_while_the_handle_lives_and_the_closed_handle_refuses_io() {
    let dir = tempfile::tempdir().unwrap();
    let cfs = ColumnFamilies::open(dir.path().join("cf.pwcf")).unwrap();
    let old = cfs.column_family("a").unwrap();
    old.write_at(0, b"first").unwrap();
    old.sync().unwrap();
    old.close();
    let new = cfs.column_family("a").unwrap();
    let mut got = [0u8; 5];
    new.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"first");
    assert!(old.write_at(0, b"stale").is_err());
    assert!(old.read_at(0, &mut got).is_err());
    assert!(old.set_len(0).is_err());
    assert!(old.sync().is_err());
    // Dropping the closed handle leaves the new one's claim on the name.
    drop(old);
    assert!(matches!(
        cfs.column_family("a"),
        Err(cf::Error::InUse { .. })
    ));
    // redb closes its backend when the database closes, with a read
    // transaction still alive: the file opens again at once.
    let db = Database::builder()
        .create_with_backend(cfs.column_family("r").unwrap())
        .unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(T)
        .unwrap()
        .insert(1, b"v".as_slice())
        .unwrap();
    txn.commit().unwrap();
    let read = db.begin_read().unwrap();
    db.close().unwrap();
    let db = Database::builder()
        .create_with_backend(cfs.column_family("r").unwrap())
        .unwrap();
    let t = db.begin_read().unwrap().open_table(T).unwrap();
    assert_eq!(t.get(1).unwrap().unwrap().value(), b"v");
    drop(read);
}

#[test]
fn power_cuts_while_four_threads_grow_and_commit_their_families_lose_no_acknowledged_commit() {
    // Four threads append versions to their own families (each version a
    // new chunk, so acknowledged bytes never change), a fifth creates and
    // deletes families, and power cuts are taken meanwhile: each image
    // opens with a whole directory and holds every version acknowledged
    // before the cut.
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;
    const CHUNK: usize = 40_000;
    let config = Config::default().max_write_buffer_bytes(8 << 20);
    let backend = Arc::new(CrashBackend::new());
    let file = PagedCachedFile::new(Arc::clone(&backend), config.clone()).unwrap();
    let cfs = ColumnFamilies::new(file, "crash").unwrap();
    let long = |i: u64| format!("{i}{}", "w".repeat(200));
    // Per writer: the newest version acknowledged (None: none yet).
    let acked: Vec<Mutex<Option<u64>>> = (0..4).map(|_| Mutex::new(None)).collect();
    // Families the churn thread created and not yet deleted.
    let churned: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let mut images = Vec::new();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (cfs, acked, stop) = (&cfs, &acked, &stop);
            s.spawn(move || {
                let fam = cfs.column_family(&long(t)).unwrap();
                for v in 0u64.. {
                    if stop.load(Ordering::Relaxed) || v == 60 {
                        return;
                    }
                    let fill = (v as u8) | 0x80;
                    fam.write_at(v * CHUNK as u64, &vec![fill; CHUNK]).unwrap();
                    fam.sync().unwrap();
                    *acked[t as usize].lock().unwrap() = Some(v);
                }
            });
        }
        {
            let (cfs, churned, stop) = (&cfs, &churned, &stop);
            s.spawn(move || {
                for i in 0u64..40 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let name = format!("churn{i}");
                    let f = cfs.column_family(&name).unwrap();
                    f.write_at(0, &[7u8; 5000]).unwrap();
                    f.sync().unwrap();
                    drop(f);
                    churned.lock().unwrap().push(name);
                    if i % 3 == 2 {
                        let old = churned.lock().unwrap().remove(0);
                        cfs.delete(&old).unwrap();
                    }
                }
            });
        }
        for seed in 0..40u64 {
            std::thread::sleep(std::time::Duration::from_millis(3));
            let before: Vec<Option<u64>> = acked.iter().map(|a| *a.lock().unwrap()).collect();
            images.push((backend.crash_image(seed), before));
        }
        stop.store(true, Ordering::Relaxed);
    });
    for (i, (image, before)) in images.iter().enumerate() {
        let file = PagedCachedFile::new(CrashBackend::from_image(image), config.clone()).unwrap();
        let cfs = ColumnFamilies::new(file, "image").unwrap_or_else(|e| panic!("image {i}: {e}"));
        let names = cfs.names();
        for (t, v) in before.iter().enumerate() {
            let Some(v) = *v else { continue };
            let name = long(t as u64);
            assert!(names.contains(&name), "image {i}: writer {t}'s family lost");
            let fam = cfs.column_family(&name).unwrap();
            assert!(
                fam.len() >= (v + 1) * CHUNK as u64,
                "image {i}: writer {t} version {v}"
            );
            let mut got = vec![0u8; CHUNK];
            for u in 0..=v {
                fam.read_at(u * CHUNK as u64, &mut got).unwrap();
                let fill = (u as u8) | 0x80;
                assert!(
                    got.iter().all(|&b| b == fill),
                    "image {i}: writer {t} version {u} of {v}"
                );
            }
        }
    }
}

#[test]
fn a_close_racing_the_handles_own_writes_lets_no_write_land_after_it() {
    // A thread rewrites the family through one handle, 16 MiB at a time,
    // while it is closed and a new handle on the name rewrites it once and
    // commits: no write of the closed handle may land after the close
    // returned (it would overwrite the new handle's bytes).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    let cfs = ColumnFamilies::open(&path).unwrap();
    let unit = 16 * EXTENT_UNIT as usize;
    for round in 0..20u8 {
        let old = Arc::new(cfs.column_family("a").unwrap());
        old.set_len(0).unwrap();
        old.write_at(0, &vec![1; unit]).unwrap();
        old.sync().unwrap();
        let started = Arc::new(std::sync::Barrier::new(2));
        let writer = {
            let (old, started) = (Arc::clone(&old), Arc::clone(&started));
            std::thread::spawn(move || {
                started.wait();
                let chunk = vec![0xA0 | (round & 0xF); unit];
                while old.write_at(0, &chunk).and_then(|()| old.sync()).is_ok() {}
            })
        };
        started.wait();
        std::thread::sleep(std::time::Duration::from_micros(200 * round as u64));
        old.close();
        let new = cfs.column_family("a").unwrap();
        new.write_at(0, &vec![0xBB; unit]).unwrap();
        new.sync().unwrap();
        writer.join().unwrap();
        let mut got = vec![0u8; unit];
        new.read_at(0, &mut got).unwrap();
        let stray = got.iter().position(|&b| b != 0xBB);
        assert_eq!(
            stray, None,
            "round {round}: a write of the closed handle landed after the close"
        );
    }
    drop(cfs);
    let cfs = ColumnFamilies::open(&path).unwrap();
    let mut got = vec![0u8; unit];
    cfs.column_family("a")
        .unwrap()
        .read_at(0, &mut got)
        .unwrap();
    assert!(got.iter().all(|&b| b == 0xBB), "after reopen");
}

#[test]
fn several_read_only_handles_read_one_family_at_once_and_keep_its_writers_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    let cfs = ColumnFamilies::open(&path).unwrap();
    let db = Database::builder()
        .create_with_backend(cfs.column_family("users").unwrap())
        .unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut t = txn.open_table(T).unwrap();
        for k in 0..500u64 {
            t.insert(k, value(1, k).as_slice()).unwrap();
        }
    }
    txn.commit().unwrap();
    // A live writable handle keeps read-only ones out.
    assert!(matches!(
        cfs.column_family_read_only("users"),
        Err(cf::Error::InUse { .. })
    ));
    drop(db);
    let names = cfs.names();
    let len = std::fs::metadata(&path).unwrap().len();

    let handles: Vec<ColumnFamily> = (0..3)
        .map(|_| cfs.column_family_read_only("users").unwrap())
        .collect();
    // Read-only handles keep a writable handle and a delete out.
    assert!(matches!(
        cfs.column_family("users"),
        Err(cf::Error::InUse { .. })
    ));
    assert!(matches!(cfs.delete("users"), Err(cf::Error::InUse { .. })));
    // One of several going frees nothing.
    drop(cfs.column_family_read_only("users").unwrap());
    assert!(matches!(
        cfs.column_family("users"),
        Err(cf::Error::InUse { .. })
    ));
    let before = {
        let mut b = vec![0u8; handles[0].len() as usize];
        handles[0].read_at(0, &mut b).unwrap();
        b
    };
    let refused = handles[0].write_at(0, &[7u8; 4096]).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
    let refused = handles[0].set_len(0).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
    handles[0].sync().unwrap();
    std::thread::scope(|s| {
        for h in handles {
            s.spawn(move || {
                let db = Database::builder().open_read_only_with_backend(h).unwrap();
                let txn = db.begin_read().unwrap();
                let t = txn.open_table(T).unwrap();
                assert_eq!(t.len().unwrap(), 500);
                for k in 0..500u64 {
                    assert_eq!(t.get(k).unwrap().unwrap().value(), value(1, k).as_slice());
                }
            });
        }
    });
    // Every read-only handle is gone: the writers' name is free again, and
    // nothing the read-only handles saw was changed.
    assert_eq!(cfs.names(), names);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    let family = cfs.column_family("users").unwrap();
    let mut after = vec![0u8; before.len()];
    family.read_at(0, &mut after).unwrap();
    assert!(after == before, "a read-only handle changed the family");
}

#[test]
fn a_read_only_handle_of_a_missing_or_badly_named_family_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cf.pwcf");
    let cfs = ColumnFamilies::open(&path).unwrap();
    let _a = cfs.column_family("a").unwrap();
    let image = std::fs::read(&path).unwrap();
    assert!(matches!(
        cfs.column_family_read_only("missing"),
        Err(cf::Error::NotFound { .. })
    ));
    assert!(matches!(
        cfs.column_family_read_only(""),
        Err(cf::Error::InvalidName { .. })
    ));
    assert!(matches!(
        cfs.column_family_read_only("a\0b"),
        Err(cf::Error::InvalidName { .. })
    ));
    assert_eq!(cfs.names(), ["a"]);
    assert!(std::fs::read(&path).unwrap() == image, "the file changed");
    // A refused read-only open leaves no claim on the name behind.
    cfs.delete("missing").unwrap_err();
    let _b = cfs.column_family("missing").unwrap();
}

#[test]
fn racing_opens_never_leave_a_writable_handle_beside_another_handle() {
    use std::sync::atomic::AtomicUsize;
    let dir = tempfile::tempdir().unwrap();
    let cfs = ColumnFamilies::open(dir.path().join("cf.pwcf")).unwrap();
    drop(cfs.column_family("f").unwrap());
    // Counted after a handle is taken and before it is dropped, so the
    // counts never claim less than what is live.
    let (writers, readers) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let start = std::sync::Barrier::new(6);
    std::thread::scope(|s| {
        for t in 0..6 {
            let (cfs, writers, readers, start) = (&cfs, &writers, &readers, &start);
            s.spawn(move || {
                start.wait();
                for _ in 0..20_000 {
                    let writable = t % 2 == 0;
                    let got = if writable {
                        cfs.column_family("f")
                    } else {
                        cfs.column_family_read_only("f")
                    };
                    let h = match got {
                        Ok(h) => h,
                        Err(cf::Error::InUse { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    };
                    let (mine, other) = if writable {
                        (writers, readers)
                    } else {
                        (readers, writers)
                    };
                    let before = mine.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(other.load(Ordering::SeqCst), 0, "a writer beside a reader");
                    if writable {
                        assert_eq!(before, 0, "two writable handles at once");
                    }
                    for _ in 0..8 {
                        assert_eq!(h.len(), 0);
                        std::thread::yield_now();
                    }
                    mine.fetch_sub(1, Ordering::SeqCst);
                    drop(h);
                }
            });
        }
    });
    // Every handle is gone: both kinds open again.
    drop(cfs.column_family_read_only("f").unwrap());
    drop(cfs.column_family("f").unwrap());
}
