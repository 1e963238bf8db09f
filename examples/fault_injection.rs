//! How an engine tests itself with `pagewriter::testing` (the `testing`
//! feature): failed writes and failed `fdatasync`s injected with
//! [`FaultyBackend`], power cuts simulated with [`CrashBackend`], and the
//! reference-model checker run over random operation sequences.
//!
//! `cargo run --release --example fault_injection --features testing`
//! (an engine enables the feature in its dev-dependencies:
//! `pagewriter = { version = "0.1", features = ["testing"] }`).
//! Each part checks what it shows and exits non-zero if the file breaks a
//! promise.

use std::sync::Arc;

use pagewriter::testing::model::{self, ModelConfig, Op};
use pagewriter::testing::{CrashBackend, FaultyBackend, Rng, WriteFault};
use pagewriter::{Config, Error, FlushEngine, PagedCachedFile};

const PAGE: usize = 4096;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One part of the walk-through: its name and what it shows.
type Part = (&'static str, fn() -> Res<String>);

fn main() -> std::process::ExitCode {
    let parts: [Part; 4] = [
        ("a failed write", failed_write),
        ("a failed fdatasync", failed_fdatasync),
        ("power cuts", power_cuts),
        ("the model checker", model_checker),
    ];
    for (name, part) in parts {
        match part() {
            Ok(what) => println!("{name}: {what}"),
            Err(e) => {
                eprintln!("fault_injection: {name}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}

/// The engine's commit under test: two pages and a sync.
fn commit(f: &PagedCachedFile, version: u8) -> Result<(), Error> {
    f.write_page(0, &[version; PAGE])?;
    f.write_page(8 * PAGE as u64, &[version; PAGE])?;
    f.sync()
}

/// A write that fails with EIO: `sync` reports exactly the pages that did
/// not reach the OS, keeps them buffered, and the next `sync` writes them.
fn failed_write() -> Res<String> {
    let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default().page_size(PAGE))?;
    // Two runs (pages 0 and 8): the first write call fails, the second passes.
    be.schedule_writes([WriteFault::Errno(libc::EIO), WriteFault::Pass]);
    let failed = match commit(&f, 1) {
        Err(Error::PagesFailed { failed, .. }) => failed,
        other => return Err(format!("expected PagesFailed, got {other:?}").into()),
    };
    if failed.len() != 1 || failed[0] != (0..PAGE as u64) {
        return Err(format!("failed ranges {failed:?}, expected page 0 only").into());
    }
    // The failed page is still buffered and readable; a retry makes it durable.
    if f.read(0, PAGE)?[0] != 1 {
        return Err("the failed page's bytes are gone".into());
    }
    f.sync()?;
    let img = be.inner().durable_image();
    if img[0] != 1 || img[8 * PAGE] != 1 {
        return Err("the retried sync did not make both pages durable".into());
    }
    Ok(format!(
        "sync said PagesFailed {failed:?}; the page stayed buffered and the retry made it \
         durable ({} write calls)",
        be.write_calls()
    ))
}

/// A failed `fdatasync` poisons the file: the kernel may have dropped the
/// pages it could not write, so no later call reports success.
fn failed_fdatasync() -> Res<String> {
    let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default().page_size(PAGE))?;
    commit(&f, 1)?;
    be.schedule_syncs([Some(libc::EIO)]);
    let first = commit(&f, 2);
    let then = commit(&f, 3);
    match (&first, &then) {
        (Err(Error::Io { .. }), Err(Error::Poisoned)) if f.is_poisoned() => {}
        _ => return Err(format!("fdatasync EIO gave {first:?}, then {then:?}").into()),
    }
    // What survives is what the last good sync made durable.
    let img = be.inner().durable_image();
    if img[0] != 1 {
        return Err(format!("page 0 after the failed sync holds {}", img[0]).into());
    }
    Ok("the sync failed with EIO, the next call was Poisoned, version 1 stays durable".into())
}

/// Power cuts: after a commit of version 1 and an unsynced version 2,
/// every crash image (each unsynced write kept, dropped or torn at
/// 512-byte sectors) reopens with version 1 or 2 in every sector.
fn power_cuts() -> Res<String> {
    let be = Arc::new(CrashBackend::new());
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default().page_size(PAGE))?;
    commit(&f, 1)?;
    f.write_page(0, &[2; PAGE])?;
    f.write_page(8 * PAGE as u64, &[2; PAGE])?;
    f.flush()?; // written, not synced: what a crash may or may not keep
    let (mut torn, mut new, images) = (0, 0, 1000);
    for seed in 0..images {
        let image = be.crash_image(seed);
        // Reopen the image as the engine would after the crash.
        let after = PagedCachedFile::new(CrashBackend::from_image(&image), Config::default())?;
        let page = after.read(0, PAGE)?;
        if page.iter().any(|&b| b != 1 && b != 2) {
            return Err(format!("seed {seed}: page 0 holds bytes never written").into());
        }
        if page.contains(&1) && page.contains(&2) {
            torn += 1;
        } else if page[0] == 2 {
            new += 1;
        }
    }
    if torn == 0 {
        return Err("no crash image tore page 0: the simulator tested nothing".into());
    }
    Ok(format!(
        "{images} crash images: page 0 old in {}, new in {new}, torn (old and new sectors) \
         in {torn}; never bytes that were not written (an engine checksums its pages to \
         tell a torn one)",
        images - torn - new
    ))
}

/// The reference-model checker over random operation sequences (writes,
/// guards, reads, flushes, syncs, faults, crashes, close and reopen), for
/// every engine: the same checker the crate's own property tests use.
fn model_checker() -> Res<String> {
    let mut rng = Rng::new(0xFA17);
    let engines = [
        FlushEngine::PerPage,
        FlushEngine::Concat,
        FlushEngine::Vectored,
        FlushEngine::Auto { queue_depth: 8 },
    ];
    let (mut runs, mut ops_total) = (0, 0);
    for engine in engines {
        for _ in 0..50 {
            let cfg = ModelConfig {
                grow_ahead: None,
                engine,
                page_size: 512 << rng.below(4),
                buffer_pages: 1 + rng.below(16) as usize,
                cache_pages: [0, 4, 64][rng.below(3) as usize],
                stripes: 1 << rng.below(4),
                dir: None,
                direct: false,
                torn_writes: pagewriter::TornWrites::Allow,
            };
            let ops: Vec<Op> = (0..40).map(|_| random_op(&mut rng)).collect();
            model::check(&cfg, &ops).map_err(|e| format!("{cfg:?}: {e}"))?;
            runs += 1;
            ops_total += ops.len();
        }
    }
    Ok(format!(
        "{runs} random sequences ({ops_total} operations) over 4 engines agree with the model"
    ))
}

fn random_op(rng: &mut Rng) -> Op {
    let page = rng.below(model::MAX_PAGES);
    match rng.below(21) {
        0..=6 => Op::Write {
            page,
            pages: 1 + rng.below(3),
        },
        7..=8 => Op::Guard {
            page,
            byte: rng.below(4096) as usize,
        },
        9..=11 => Op::Read {
            page,
            pages: 1 + rng.below(3),
        },
        12 => Op::Flush,
        13..=15 => Op::Sync,
        16 => Op::FailNextWrite(WriteFault::Errno(libc::EIO)),
        17 => Op::FailNextSync,
        18 => Op::Crash {
            seed: rng.next_u64(),
        },
        19 => Op::SetLen {
            pages: rng.below(model::MAX_PAGES + 1),
        },
        _ => Op::Close,
    }
}
