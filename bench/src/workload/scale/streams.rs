//! The `streams` mode ([`Mode::Streams`](super::Mode::Streams)): no page
//! writer. Each thread writes its transactions to the shared file with
//! `pwrite` on a descriptor of its own (`O_DIRECT` as `--direct` says) and
//! `fdatasync`s after each: fio's commit job (independent `write +
//! fdatasync` streams), run inside this benchmark so a commit is timed
//! whole, as pagewriter's are.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use pagewriter::Stats;
use pagewriter::backend::{StorageBackend, open_with_options};
use pagewriter::buffer::AlignedBuf;

use super::{Fill, Room, ScaleConfig, Tally, new_histogram};
use crate::error::{CoreError, Result};
use crate::rng::WyRand;

/// One stream: transactions until `stop` (or no room), each one `pwrite`
/// of its fresh pages (contiguous), one per rewrite, then `fdatasync`.
pub(super) fn writer(
    config: &ScaleConfig,
    path: &Path,
    alloc: &AtomicU64,
    stop: &AtomicBool,
    room: Room<'_>,
    seed: u64,
) -> Result<Tally> {
    let opts = pagewriter::OpenOptions::new().lock(false);
    let (file, _) = open_with_options(path, &opts, config.direct, &|_| None)?;
    let ps = config.page_size as u64;
    let rewrites = config.rewrites_per_txn() as u64;
    let fresh = config.pages_per_txn as u64 - rewrites;
    let mut rng = WyRand::new(seed);
    let len = (fresh.max(1) * ps) as usize;
    let mut buf = AlignedBuf::zeroed(len, 4096).ok_or(CoreError::NoMemory { bytes: len as u64 })?;
    config
        .generator()?
        .fill_at(seed.wrapping_mul(ps) % (1 << 40), &mut buf)?;
    let mut latency = new_histogram();
    let (mut pages, mut commits) = (0u64, 0u64);
    let mut own_io = Stats::default();
    let io = |op, at, e| crate::error::Error::io(op, Some(at), e);
    while !stop.load(Ordering::Relaxed) {
        let Some(first) = room.claim(alloc, fresh, stop) else {
            break;
        };
        if config.fill == Fill::Random {
            config.generator()?.fill_at(first * ps, &mut buf)?;
        } else {
            for page in buf.chunks_mut(ps as usize) {
                page[..8].copy_from_slice(&commits.to_le_bytes());
            }
        }
        let t0 = Instant::now();
        if fresh > 0 {
            file.write_all_at(first * ps, &buf[..(fresh * ps) as usize])
                .map_err(|e| io("pwrite", first * ps, e))?;
            own_io.write_calls += 1;
        }
        for _ in 0..rewrites {
            let high = room.wrap_pages.map_or(alloc.load(Ordering::Relaxed), |w| {
                w.min(alloc.load(Ordering::Relaxed))
            });
            let p = if high == 0 { first } else { rng.below(high) };
            file.write_all_at(p * ps, &buf[..ps as usize])
                .map_err(|e| io("pwrite", p * ps, e))?;
            own_io.write_calls += 1;
        }
        file.sync_data().map_err(|e| io("fdatasync", 0, e))?;
        own_io.syncs += 1;
        latency.saturating_record(t0.elapsed().as_micros().max(1) as u64);
        pages += fresh + rewrites;
        own_io.pages_written += fresh + rewrites;
        own_io.bytes_written += (fresh + rewrites) * ps;
        commits += 1;
    }
    Ok(Tally {
        pages,
        commits,
        reads: 0,
        latency,
        own_io,
    })
}
