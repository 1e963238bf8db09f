//! Model check (shuttle) of column-family directory changes racing each
//! other: two threads change the directory at once (creating, growing,
//! committing and deleting families) while a power cut lands at a moment
//! the schedule picks; every crash image it could leave opens with a whole
//! directory that holds every family whose creation was acknowledged.
//!
//! `cargo test -p pagewriter-redb --features shuttle --test shuttle_cf`;
//! `SHUTTLE_ITERATIONS` sets the schedules per scheduler (default 1,000).
#![cfg(feature = "shuttle")]

use std::sync::Arc;

use pagewriter::testing::CrashBackend;
use pagewriter::{Config, PagedCachedFile};
use pagewriter_redb::ColumnFamilies;
use shuttle::sync::Mutex;

/// 1,000 random and 1,000 PCT schedules (`SHUTTLE_ITERATIONS`
/// overrides).
fn check(body: fn()) {
    pagewriter::testing::shuttle_check(body, 1_000);
}

/// Crash images taken at the power cut, each with its own seed (writes
/// since the last `fdatasync` kept, dropped or torn).
const SEEDS: u64 = 4;

/// Power cuts per schedule, each at a moment the schedule picks.
const CUTS: usize = 3;

/// Families made before the threads start.
const LONG: [&str; 3] = [
    "long name 0 ..................................................................................................................................................................................................................",
    "long name 1 ..................................................................................................................................................................................................................",
    "long name 2 ..................................................................................................................................................................................................................",
];

/// What the threads have been told, as the power cut sees it.
#[derive(Default)]
struct Acked {
    /// Families whose creation returned, with the length and fill byte of
    /// their last acknowledged commit.
    families: Vec<(&'static str, u64, u8)>,
    /// Families whose delete has begun: they may be gone.
    deleting: Vec<&'static str>,
}

fn config() -> Config {
    Config::default().max_write_buffer_bytes(4 << 20)
}

/// Opens `image` as column families and checks it against `acked`.
fn check_image(image: &[u8], acked: &Acked, at: &str) {
    let file = PagedCachedFile::new(CrashBackend::from_image(image), config()).unwrap();
    let cfs = ColumnFamilies::new(file, "image")
        .unwrap_or_else(|e| panic!("{at}: no whole directory after the cut: {e}"));
    let names = cfs.names();
    for (name, len, fill) in &acked.families {
        if acked.deleting.contains(name) {
            continue;
        }
        assert!(
            names.iter().any(|n| n == name),
            "{at}: {name} was acknowledged and is gone ({names:?})"
        );
        let family = cfs.column_family(name).unwrap();
        assert!(
            family.len() >= *len,
            "{at}: {name} is {} bytes, its commit made {len}",
            family.len()
        );
        let mut got = vec![0u8; *len as usize];
        family.read_at(0, &mut got).unwrap();
        assert!(
            got.iter().all(|b| b == fill),
            "{at}: {name} lost its commit's bytes"
        );
    }
}

/// Two threads change the directory at once; a third is the power cut.
fn directory_changes_racing_a_power_cut() {
    let backend = Arc::new(CrashBackend::new());
    let file = PagedCachedFile::new(Arc::clone(&backend), config()).unwrap();
    let cfs = ColumnFamilies::new(file, "model").unwrap();
    // Long names: the directory spans several 512-byte sectors, so a cut
    // can tear its write.
    for name in LONG {
        drop(cfs.column_family(name).unwrap());
    }
    let acked = Arc::new(Mutex::new(Acked {
        families: LONG.iter().map(|name| (*name, 0, 0)).collect(),
        deleting: Vec::new(),
    }));

    // Creates `a`, commits 4 KiB into it (a new extent: the directory
    // changes with the data's commit), then deletes it.
    let grower = {
        let (cfs, acked) = (cfs.clone(), Arc::clone(&acked));
        shuttle::thread::spawn(move || {
            let a = cfs.column_family("a").unwrap();
            acked.lock().unwrap().families.push(("a", 0, 0));
            a.write_at(0, &[0xA5; 4096]).unwrap();
            a.sync().unwrap();
            acked.lock().unwrap().families.push(("a", 4096, 0xA5));
            drop(a);
            acked.lock().unwrap().deleting.push("a");
            cfs.delete("a").unwrap();
        })
    };
    // Creates `b` and `c`, one directory change each.
    let creator = {
        let (cfs, acked) = (cfs.clone(), Arc::clone(&acked));
        shuttle::thread::spawn(move || {
            for name in ["b", "c"] {
                drop(cfs.column_family(name).unwrap());
                acked.lock().unwrap().families.push((name, 0, 0));
            }
        })
    };
    let cut = {
        let (backend, acked) = (Arc::clone(&backend), Arc::clone(&acked));
        shuttle::thread::spawn(move || {
            for cut in 0..CUTS {
                // One instant: what was acknowledged, then the images.
                let acked = acked.lock().unwrap();
                let images: Vec<_> = (0..SEEDS).map(|s| backend.crash_image(s)).collect();
                for (seed, image) in images.iter().enumerate() {
                    check_image(image, &acked, &format!("cut {cut}, seed {seed}"));
                }
                drop(acked);
                shuttle::thread::yield_now();
            }
        })
    };
    grower.join().unwrap();
    creator.join().unwrap();
    cut.join().unwrap();
    let names = cfs.names();
    assert_eq!(
        names.len(),
        LONG.len() + 2,
        "the directory after every change: {names:?}"
    );
    assert!(names.iter().any(|n| n == "b") && names.iter().any(|n| n == "c"));
    let acked = acked.lock().unwrap();
    check_image(&backend.durable_image(), &acked, "the end");
}

#[test]
fn directory_changes_racing_each_other_leave_a_whole_directory_at_any_power_cut() {
    check(directory_changes_racing_a_power_cut);
}
