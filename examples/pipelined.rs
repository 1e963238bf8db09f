//! Commits that promise what the caller wrote, two ways an engine uses
//! them:
//!
//! - **Per-thread writers.** Each of four threads writes its transactions
//!   through a [`Writer`] of its own and commits with `Writer::commit`:
//!   durable on return, its own pages only, no waiting for the others'
//!   writes (each issues its own `fdatasync`, or rides on one that began
//!   after its writes).
//! - **A pipelined committer.** One thread keeps up to eight commits in
//!   flight with `Writer::commit_async`: it goes on writing while the
//!   file's committer thread writes and syncs, and it acknowledges a
//!   transaction only when its ticket resolves `Ok`, in order.
//!
//! Then the file is closed, reopened and every acknowledged transaction
//! read back; the program fails if one is missing.
//!
//! `cargo run --release --example pipelined`

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pagewriter::{CommitTicket, Config, PagedCachedFile, Writer};

const PAGE: usize = 4096;
/// Pages per transaction.
const TXN: u64 = 4;
/// Commits the pipelined thread keeps in flight.
const IN_FLIGHT: usize = 8;
const RUN: Duration = Duration::from_millis(500);
/// Transactions a stream may write: its pages lie in a 4 GiB region of
/// its own (the file is sparse).
const MAX_TXNS: u64 = 1 << 18;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Transaction `txn` of stream `stream`: `TXN` pages, each stamped with
/// both and its index.
fn write_txn(w: &mut Writer<'_>, stream: u64, txn: u64) -> Res<()> {
    let first = (stream * MAX_TXNS + txn) * TXN;
    for i in 0..TXN {
        let mut page = w.overwrite((first + i) * PAGE as u64, PAGE)?;
        page[..24].copy_from_slice(&[stream, txn, i].map(u64::to_le_bytes).concat());
    }
    Ok(())
}

/// Whether transaction `txn` of `stream` reads back whole.
fn holds(f: &PagedCachedFile, stream: u64, txn: u64) -> Res<bool> {
    let first = (stream * MAX_TXNS + txn) * TXN;
    let bytes = f.read(first * PAGE as u64, TXN as usize * PAGE)?;
    Ok(bytes
        .chunks(PAGE)
        .enumerate()
        .all(|(i, p)| p[..24] == [stream, txn, i as u64].map(u64::to_le_bytes).concat()[..]))
}

fn main() -> Res<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pipelined.db");
    let f = PagedCachedFile::open(&path, Config::default())?;
    let started = Instant::now();
    let acked: Vec<u64> = std::thread::scope(|s| {
        let per_thread: Vec<_> = (0..4u64)
            .map(|stream| {
                let f = &f;
                s.spawn(move || -> Res<u64> {
                    let mut w = f.writer();
                    let mut txn = 0;
                    while started.elapsed() < RUN && txn < MAX_TXNS {
                        write_txn(&mut w, stream, txn)?;
                        w.commit()?; // durable: acknowledge it
                        txn += 1;
                    }
                    Ok(txn)
                })
            })
            .collect();
        let pipelined = s.spawn(|| -> Res<u64> {
            let mut w = f.writer();
            let mut in_flight: VecDeque<(u64, CommitTicket)> = VecDeque::new();
            let (mut txn, mut acked) = (0, 0);
            while started.elapsed() < RUN && txn < MAX_TXNS {
                write_txn(&mut w, 4, txn)?;
                in_flight.push_back((txn, w.commit_async()?));
                txn += 1;
                if in_flight.len() == IN_FLIGHT {
                    let (t, ticket) = in_flight.pop_front().ok_or("empty")?;
                    ticket.wait()?; // durable: acknowledge transaction t
                    acked = t + 1;
                }
            }
            for (t, ticket) in in_flight {
                ticket.wait()?;
                acked = t + 1;
            }
            Ok(acked)
        });
        per_thread
            .into_iter()
            .chain([pipelined])
            .map(|h| h.join().map_err(|_| "a thread panicked")?)
            .collect::<Res<Vec<u64>>>()
    })?;
    let secs = started.elapsed().as_secs_f64();
    f.close()?;
    let f = PagedCachedFile::open(&path, Config::default())?;
    for (stream, &n) in acked.iter().enumerate() {
        for txn in 0..n {
            if !holds(&f, stream as u64, txn)? {
                return Err(
                    format!("stream {stream}: acknowledged transaction {txn} missing").into(),
                );
            }
        }
    }
    if acked.contains(&0) {
        return Err(format!("a stream acknowledged nothing: {acked:?}").into());
    }
    println!(
        "per-thread writers: {} commits/s ({:?} per thread); pipelined committer, {IN_FLIGHT} in \
         flight: {} commits/s; every acknowledged transaction read back after reopen",
        (acked[..4].iter().sum::<u64>() as f64 / secs) as u64,
        &acked[..4],
        (acked[4] as f64 / secs) as u64,
    );
    Ok(())
}
