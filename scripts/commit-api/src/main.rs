//! Durable commits through pagewriter's public API only, the way an
//! engine's adapter makes them (redb's calls `write_all_at`): T threads,
//! each writing its own region of one `O_DIRECT` file in order, `--bs`
//! bytes per commit from its own `Vec<u8>` (not page-aligned), then one
//! of:
//!
//! - `sync`: `PagedCachedFile::write_all_at` + `PagedCachedFile::sync`;
//! - `scoped`: `Writer::write_all_at` + `Writer::commit`;
//! - `tickets`: `Writer::write_all_at` + `Writer::commit_async`, N tickets
//!   in flight per thread (`CommitTicket::wait` on the oldest).
//!
//! Prints `commits/s p99_us commits`. It names nothing but the public API
//! of the core, so it builds against any checkout of it
//! (`scripts/commit-api.sh` builds it twice and alternates the two).
//!
//! Usage: commit-api --path FILE --threads T --bs BYTES --kind K
//!        [--seconds S] [--region BYTES] [--tickets N]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pagewriter::{Config, DirectIo, PagedCachedFile};

struct Args {
    path: String,
    threads: usize,
    bs: usize,
    kind: String,
    seconds: f64,
    region: u64,
    tickets: usize,
}

fn parse() -> Args {
    let mut a = Args {
        path: String::new(),
        threads: 1,
        bs: 64 << 10,
        kind: "scoped".into(),
        seconds: 2.0,
        region: 512 << 20,
        tickets: 8,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--path" => a.path = v,
            "--threads" => a.threads = v.parse().expect("--threads"),
            "--bs" => a.bs = v.parse().expect("--bs (bytes)"),
            "--kind" => a.kind = v,
            "--seconds" => a.seconds = v.parse().expect("--seconds"),
            "--region" => a.region = v.parse().expect("--region (bytes)"),
            "--tickets" => a.tickets = v.parse().expect("--tickets"),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    assert!(!a.path.is_empty(), "--path is required");
    assert!(
        matches!(a.kind.as_str(), "sync" | "scoped" | "tickets"),
        "--kind sync|scoped|tickets"
    );
    assert!(a.bs > 0 && a.region >= a.bs as u64, "--bs and --region");
    a
}

/// One thread's loop; returns the latencies of its commits (µs).
fn run(file: &PagedCachedFile, a: &Args, t: usize, deadline: Instant) -> Vec<u32> {
    // The thread's own buffer, deliberately off page alignment.
    let mut own = vec![0u8; a.bs + 8];
    let buf_at = if (own.as_ptr() as usize).is_multiple_of(4096) {
        8
    } else {
        0
    };
    let base = t as u64 * a.region;
    let slots = a.region / a.bs as u64;
    let mut lat = Vec::with_capacity(1 << 16);
    let mut writer = file.writer();
    let mut pending: VecDeque<(Instant, pagewriter::CommitTicket)> = VecDeque::new();
    let mut i: u64 = 0;
    while Instant::now() < deadline {
        let buf = &mut own[buf_at..buf_at + a.bs];
        for page in buf.chunks_mut(4096) {
            page[..8].copy_from_slice(&i.to_le_bytes());
        }
        let offset = base + (i % slots) * a.bs as u64;
        let start = Instant::now();
        match a.kind.as_str() {
            "sync" => {
                file.write_all_at(offset, buf).expect("write_all_at");
                file.sync().expect("sync");
                lat.push(start.elapsed().as_micros() as u32);
            }
            "scoped" => {
                writer
                    .write_all_at(offset, buf)
                    .expect("Writer::write_all_at");
                writer.commit().expect("Writer::commit");
                lat.push(start.elapsed().as_micros() as u32);
            }
            _ => {
                writer
                    .write_all_at(offset, buf)
                    .expect("Writer::write_all_at");
                pending.push_back((start, writer.commit_async().expect("commit_async")));
                if pending.len() >= a.tickets {
                    let (s, ticket) = pending.pop_front().expect("not empty");
                    ticket.wait().expect("CommitTicket::wait");
                    lat.push(s.elapsed().as_micros() as u32);
                }
            }
        }
        i += 1;
    }
    for (s, ticket) in pending {
        ticket.wait().expect("CommitTicket::wait");
        lat.push(s.elapsed().as_micros() as u32);
    }
    lat
}

fn main() {
    let a = parse();
    let config = Config::default().direct(DirectIo::On);
    let file = PagedCachedFile::open(&a.path, config).expect("open");
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(a.seconds);
    let mut all: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.threads)
            .map(|t| {
                let (file, a) = (&file, &a);
                s.spawn(move || run(file, a, t, deadline))
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    if std::env::var_os("COMMIT_API_STATS").is_some() {
        let s = file.stats();
        eprintln!(
            "writes/commit {:.2} syncs/commit {:.2} ({} commits)",
            s.write_calls as f64 / s.commits.max(1) as f64,
            s.syncs as f64 / s.commits.max(1) as f64,
            s.commits
        );
    }
    file.close().expect("close");
    all.sort_unstable();
    let p99 = all
        .get(all.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or(0);
    println!("{:.1} {} {}", all.len() as f64 / elapsed, p99, all.len());
}
