//! Eight threads drive the whole engine API at once (odd-offset writes,
//! whole pages, guards, discard, reads, flush, sync, refused closes, and a
//! cutter moving the length with `set_len`) against a per-byte model, with
//! close, reopen and every byte checked between phases
//! (`tests/common/stress.rs`). Every engine, buffered and `O_DIRECT`,
//! with a small write buffer (backpressure), a read cache, `commit_dsync`
//! and writer threads among the configurations.
//!
//! About half a second per configuration; `PAGEWRITER_STRESS_SECS=N` runs
//! each for N seconds (minutes for a long run). Its count of unexpected
//! results and of lost bytes must be 0.

mod common;
#[path = "common/stress.rs"]
mod stress;

use common::{direct_available, file_engines};
use pagewriter::{Config, DirectIo, FlushEngine};

/// Seconds per configuration: `PAGEWRITER_STRESS_SECS`, else 0.5.
fn secs() -> f64 {
    std::env::var("PAGEWRITER_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.5)
}

#[test]
fn eight_threads_drive_the_engine_api_against_a_per_byte_model() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut directs = vec![DirectIo::Off];
    if direct_available(dir.path()) {
        directs.push(DirectIo::On);
    } else {
        eprintln!("O_DIRECT refused here: its configurations are skipped");
    }
    let mut configs = Vec::new();
    for direct in directs {
        for engine in file_engines() {
            let base = Config::default()
                .engine(engine)
                .direct(direct)
                .stripes(8)
                .max_write_buffer_bytes(24 << 12);
            configs.push(base.clone());
            if matches!(engine, FlushEngine::Vectored | FlushEngine::IoUring { .. }) {
                configs.push(base.read_cache_bytes(64 << 12));
            }
        }
    }
    let plan = stress::Plan::eight_threads(secs());
    let mut failed = Vec::new();
    for (i, cfg) in configs.iter().enumerate() {
        let path = dir.path().join(format!("stress-{i}"));
        let r = stress::run(&path, cfg, &plan);
        let what = format!(
            "{} {:?} cache {}",
            cfg.engine.name(),
            cfg.direct,
            cfg.read_cache_bytes
        );
        eprintln!(
            "{what}: {} ops, {} refusals, {} out-of-bounds, {} cuts, {} reopens, {} bytes checked, {} lost, {} unexpected, {:.1} s",
            r.ops,
            r.refusals,
            r.out_of_bounds,
            r.cuts,
            r.reopens,
            r.checked_bytes,
            r.lost_bytes,
            r.unexpected,
            r.seconds
        );
        assert!(
            r.ops > 1000 && r.cuts > 0 && r.refusals > 0,
            "{what}: {r:?}"
        );
        if r.unexpected > 0 || r.lost_bytes > 0 {
            failed.push(format!("{what}: {r:?}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
