//! A tiny key-value store on pagewriter: an append-only log of record
//! pages and an in-memory page index (key -> newest record's page), rebuilt
//! by one sequential scan on open. Many threads commit at once; each `put`
//! is one page and one `sync`, and concurrent syncs share a group commit.
//!
//! `cargo run --release --example kv_log [ROUNDS]` runs the crash test: a
//! child process commits from 8 threads and prints each commit once its
//! `sync` returned; the parent `kill -9`s it at a random moment, reopens
//! the log and checks that every acknowledged commit is there (a key reads
//! its acknowledged value or a newer one). `ROUNDS` rounds (default 3) on
//! one log, each child continuing where the last left off.
//! `KV_LOG_GROW_AHEAD=<bytes>` runs it with a grow-ahead window (the
//! killed child leaves the window and its trailer; the reopen cuts them
//! off). `KV_LOG_COMMIT=scoped` has each thread append through a `Writer`
//! of its own and commit only its record (`Writer::commit`);
//! `KV_LOG_COMMIT=async` keeps up to four commits in flight per thread
//! (`Writer::commit_async`) and acknowledges each once its ticket
//! resolves. The default, `global`, is `sync()` per put.
//!
//! Record page (4096 bytes, little-endian):
//! `magic u32 | crc32c u32 of the rest | seq u64 | key u64 | len u32 | value`.
//! A page that is zeros, torn by the crash, or never written fails the
//! magic or the checksum and is skipped.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pagewriter::{CommitTicket, Config, Error, OpenOptions, PagedCachedFile, Writer};

const PAGE: usize = 4096;
const MAGIC: u32 = 0x4B56_4C47; // "KVLG"
const HEADER: usize = 4 + 4 + 8 + 8 + 4;
const THREADS: u64 = 8;
/// Keys per thread: each thread owns its keys, so its acknowledgements
/// of one key come in seq order.
const KEYS_PER_THREAD: u64 = 64;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The store: the log file and the index.
struct KvLog {
    file: PagedCachedFile,
    /// key -> (seq, page number) of its newest record.
    index: std::sync::Mutex<HashMap<u64, (u64, u64)>>,
    next_page: AtomicU64,
    next_seq: AtomicU64,
}

/// 4 KiB pages; with `KV_LOG_GROW_AHEAD=<bytes>` in the environment, a
/// grow-ahead window of that many bytes (the log grows by appends).
fn config() -> Res<Config> {
    let cfg = Config::default().page_size(PAGE);
    Ok(match std::env::var("KV_LOG_GROW_AHEAD") {
        Ok(b) => {
            let bytes = b
                .parse()
                .map_err(|_| format!("KV_LOG_GROW_AHEAD must be bytes, not {b:?}"))?;
            cfg.grow_ahead(pagewriter::GrowAhead::Window { bytes })
        }
        Err(_) => cfg,
    })
}

/// What the scan found on open.
#[derive(Debug, Default)]
struct Recovery {
    records: u64,
    skipped: u64,
}

impl KvLog {
    /// Opens (or creates) the log at `path` and rebuilds the index. Right
    /// after a `kill -9` of the previous writer the file opens at once: a
    /// dead process holds no lock.
    fn open(path: &Path) -> Res<(KvLog, Recovery)> {
        let file = PagedCachedFile::open_with(path, &OpenOptions::new(), config()?)?;
        let pages = file.len().div_ceil(PAGE as u64);
        let mut index = HashMap::new();
        let mut rec = Recovery::default();
        let mut max_seq = 0;
        // One sequential pass, 256 pages per read.
        let chunk = 256u64;
        let mut p = 0;
        while p < pages {
            let n = chunk.min(pages - p);
            let len = (n as usize * PAGE).min((file.len() - p * PAGE as u64) as usize);
            let mut buf = vec![0u8; len];
            file.read_exact_at(p * PAGE as u64, &mut buf)?;
            for (i, page) in buf.chunks(PAGE).enumerate() {
                match decode(page) {
                    Some((seq, key, _)) => {
                        rec.records += 1;
                        max_seq = max_seq.max(seq);
                        let at = p + i as u64;
                        let e = index.entry(key).or_insert((seq, at));
                        if seq > e.0 {
                            *e = (seq, at);
                        }
                    }
                    None => rec.skipped += 1,
                }
            }
            p += n;
        }
        let kv = KvLog {
            file,
            index: std::sync::Mutex::new(index),
            next_page: AtomicU64::new(pages),
            next_seq: AtomicU64::new(max_seq + 1),
        };
        Ok((kv, rec))
    }

    /// Appends a record and makes it durable; returns its seq.
    fn put(&self, key: u64, value: &[u8]) -> Res<u64> {
        if value.len() > PAGE - HEADER {
            return Err(
                format!("value of {} bytes: at most {}", value.len(), PAGE - HEADER).into(),
            );
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let at = self.next_page.fetch_add(1, Ordering::Relaxed);
        let mut page = self.file.overwrite(at * PAGE as u64, PAGE)?;
        encode(&mut page, seq, key, value);
        drop(page);
        self.file.sync()?;
        let mut index = self.index.lock().map_err(|_| "index lock poisoned")?;
        let e = index.entry(key).or_insert((seq, at));
        if seq > e.0 {
            *e = (seq, at);
        }
        Ok(seq)
    }

    /// Appends a record through the thread's writer `w` (not yet
    /// committed); returns its seq.
    fn append(&self, w: &mut Writer<'_>, key: u64, value: &[u8]) -> Res<u64> {
        if value.len() > PAGE - HEADER {
            return Err(
                format!("value of {} bytes: at most {}", value.len(), PAGE - HEADER).into(),
            );
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let at = self.next_page.fetch_add(1, Ordering::Relaxed);
        let mut page = w.overwrite(at * PAGE as u64, PAGE)?;
        encode(&mut page, seq, key, value);
        drop(page);
        let mut index = self.index.lock().map_err(|_| "index lock poisoned")?;
        let e = index.entry(key).or_insert((seq, at));
        if seq > e.0 {
            *e = (seq, at);
        }
        Ok(seq)
    }

    /// The newest value of `key` and its seq.
    fn get(&self, key: u64) -> Res<Option<(u64, Vec<u8>)>> {
        let found = self
            .index
            .lock()
            .map_err(|_| "index lock poisoned")?
            .get(&key)
            .copied();
        let Some((seq, at)) = found else {
            return Ok(None);
        };
        let page = self.file.read(at * PAGE as u64, PAGE)?;
        match decode(&page) {
            Some((s, k, v)) if s == seq && k == key => Ok(Some((seq, v.to_vec()))),
            _ => Err(format!("page {at} no longer holds key {key} seq {seq}").into()),
        }
    }
}

fn encode(page: &mut [u8], seq: u64, key: u64, value: &[u8]) {
    page.fill(0);
    page[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    page[8..16].copy_from_slice(&seq.to_le_bytes());
    page[16..24].copy_from_slice(&key.to_le_bytes());
    page[24..28].copy_from_slice(&(value.len() as u32).to_le_bytes());
    page[HEADER..HEADER + value.len()].copy_from_slice(value);
    let crc = crc32c::crc32c(&page[8..]);
    page[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// `(seq, key, value)` of a whole, valid record page.
fn decode(page: &[u8]) -> Option<(u64, u64, &[u8])> {
    let bytes = |at: usize, n: usize| page.get(at..at + n);
    let u32_at = |at| Some(u32::from_le_bytes(bytes(at, 4)?.try_into().ok()?));
    let u64_at = |at| Some(u64::from_le_bytes(bytes(at, 8)?.try_into().ok()?));
    if page.len() != PAGE || u32_at(0)? != MAGIC || u32_at(4)? != crc32c::crc32c(&page[8..]) {
        return None;
    }
    Some((
        u64_at(8)?,
        u64_at(16)?,
        bytes(HEADER, u32_at(24)? as usize)?,
    ))
}

/// The value a thread writes for `key` in its commit `i`.
fn value_of(key: u64, i: u64) -> Vec<u8> {
    format!("key {key} commit {i}").into_bytes()
}

/// How the child's threads commit (`KV_LOG_COMMIT`).
#[derive(Clone, Copy, PartialEq)]
enum Commit {
    /// `sync()` per put: every thread's records.
    Global,
    /// Each thread's own `Writer::commit`: its record only.
    Scoped,
    /// `Writer::commit_async`, up to [`IN_FLIGHT`] tickets per thread.
    Async,
}

/// Tickets a thread keeps in flight with `KV_LOG_COMMIT=async`.
const IN_FLIGHT: usize = 4;

fn commit_kind() -> Res<Commit> {
    match std::env::var("KV_LOG_COMMIT").as_deref() {
        Err(_) | Ok("global") => Ok(Commit::Global),
        Ok("scoped") => Ok(Commit::Scoped),
        Ok("async") => Ok(Commit::Async),
        Ok(other) => {
            Err(format!("KV_LOG_COMMIT must be global, scoped or async, not {other:?}").into())
        }
    }
}

/// Prints `ack KEY SEQ`: the commit of that record returned Ok.
fn ack(key: u64, seq: u64) -> Res<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ack {key} {seq}")?;
    out.flush()?;
    Ok(())
}

/// The child: commits from [`THREADS`] threads until killed, printing
/// `ack KEY SEQ` after each commit returned (or its ticket resolved).
fn serve(path: &Path) -> Res<()> {
    let how = commit_kind()?;
    let (kv, _) = KvLog::open(path)?;
    let kv = Arc::new(kv);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let kv = Arc::clone(&kv);
            std::thread::spawn(move || -> Res<()> {
                let mut w = kv.file.writer();
                let mut tickets: std::collections::VecDeque<(CommitTicket, u64, u64)> =
                    std::collections::VecDeque::new();
                let mut i = 0u64;
                loop {
                    let key = t * KEYS_PER_THREAD + i % KEYS_PER_THREAD;
                    i += 1;
                    match how {
                        Commit::Global => {
                            let seq = kv.put(key, &value_of(key, i - 1))?;
                            ack(key, seq)?;
                        }
                        Commit::Scoped => {
                            let seq = kv.append(&mut w, key, &value_of(key, i - 1))?;
                            w.commit()?;
                            ack(key, seq)?;
                        }
                        Commit::Async => {
                            let seq = kv.append(&mut w, key, &value_of(key, i - 1))?;
                            tickets.push_back((w.commit_async()?, key, seq));
                            if tickets.len() == IN_FLIGHT {
                                let (ticket, key, seq) = tickets.pop_front().ok_or("no ticket")?;
                                ticket.wait()?;
                                ack(key, seq)?;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "a committing thread panicked")??;
    }
    Ok(())
}

/// One crash round: run a child, kill it after `after`, check the log.
fn crash_round(path: &Path, after: Duration) -> Res<(u64, Recovery, f64)> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("serve")
        .arg(path)
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let reader = std::thread::spawn(move || {
        let mut acks = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let mut w = line.split_whitespace();
            if let (Some("ack"), Some(k), Some(s)) = (w.next(), w.next(), w.next())
                && let (Ok(k), Ok(s)) = (k.parse::<u64>(), s.parse::<u64>())
            {
                acks.push((k, s));
            }
        }
        acks
    });
    let started = Instant::now();
    std::thread::sleep(after);
    // SIGKILL: no destructor, no close, no final sync.
    child.kill()?;
    let status = child.wait()?;
    let secs = started.elapsed().as_secs_f64();
    let acks = reader.join().map_err(|_| "the ack reader panicked")?;
    if status.success() {
        return Err("the child exited on its own before the kill".into());
    }
    if acks.is_empty() {
        return Err("the child acknowledged no commit: nothing was tested".into());
    }
    // Newest acknowledged seq per key.
    let mut newest: HashMap<u64, u64> = HashMap::new();
    for &(k, s) in &acks {
        let e = newest.entry(k).or_insert(s);
        *e = (*e).max(s);
    }
    let (kv, rec) = KvLog::open(path)?;
    for (&key, &seq) in &newest {
        match kv.get(key)? {
            Some((got, value)) if got >= seq => {
                if !value.starts_with(format!("key {key} ").as_bytes()) {
                    return Err(format!("key {key}: value {value:?} is not the key's").into());
                }
            }
            Some((got, _)) => {
                return Err(format!("key {key}: acknowledged seq {seq}, found only {got}").into());
            }
            None => return Err(format!("key {key}: acknowledged seq {seq}, key missing").into()),
        }
    }
    Ok((acks.len() as u64, rec, secs))
}

fn main() -> std::process::ExitCode {
    let mut args = std::env::args_os().skip(1);
    let result = match args.next() {
        Some(a) if a == "serve" => match args.next() {
            Some(p) => serve(Path::new(&p)),
            None => Err("serve needs the log's path".into()),
        },
        rounds => crash_test(rounds.map(|r| r.to_string_lossy().into_owned())),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv_log: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn crash_test(rounds: Option<String>) -> Res<()> {
    let rounds: u32 = match rounds {
        None => 3,
        Some(r) => r
            .parse()
            .map_err(|_| format!("ROUNDS must be a count, not {r:?}"))?,
    };
    if rounds == 0 {
        return Err("ROUNDS must be at least 1".into());
    }
    let dir = tempfile::tempdir()?;
    let path: PathBuf = dir.path().join("kv.log");
    let mut total = 0;
    for round in 0..rounds {
        // A different moment each round: 300 to 900 ms in.
        let ms = 300 + (std::process::id() as u64 * 7919 + round as u64 * 104_729) % 600;
        let (acked, rec, secs) = crash_round(&path, Duration::from_millis(ms))?;
        total += acked;
        println!(
            "round {round}: killed after {secs:.2} s, {acked} acknowledged commits ({:.0}/s from \
             {THREADS} threads); reopened: {} records, {} pages skipped (unwritten or torn); \
             every acknowledged commit found",
            acked as f64 / secs,
            rec.records,
            rec.skipped
        );
    }
    println!(
        "{rounds} kill -9 rounds ({} commits), {total} acknowledged commits, none lost",
        match commit_kind()? {
            Commit::Global => "global",
            Commit::Scoped => "scoped",
            Commit::Async => "async",
        }
    );
    // A clean close after the crashes: the store still takes commits.
    let (kv, _) = KvLog::open(&path)?;
    let seq = kv.put(u64::MAX, b"after the crashes")?;
    kv.file.close().map_err(|e: Error| format!("close: {e}"))?;
    let (kv, _) = KvLog::open(&path)?;
    match kv.get(u64::MAX)? {
        Some((s, v)) if s == seq && v == b"after the crashes" => Ok(()),
        other => Err(format!("the last put read back as {other:?}").into()),
    }
}
