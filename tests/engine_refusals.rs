//! Promises the engine API makes under races and refusals: a write racing
//! a shrink lands before or after it (never an I/O error), a refused
//! `close` changes nothing for other threads, `len()` after a successful
//! `sync` is what is durable, a guard's own thread gets `Busy` instead of a
//! deadlock, and memory the process cannot get is a typed error.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pagewriter::testing::{CrashBackend, FaultyBackend, WriteFault};
use pagewriter::{Config, Error, FileBackend, MemoryBackend, PagedCachedFile, StorageBackend};

const PS: usize = 4096;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Runs `f` on a thread and fails the test if it has not returned within
/// `secs` seconds (a hang is a failure, not a stuck test run).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(_) => panic!("{what}: still running after {secs} s (a hang)"),
    }
}

/// Whether a race loop goes on: for at least `min_ms`, and then until
/// `enough()` says both sides did enough work to mean something (a loaded
/// machine may starve one of them for a while), a minute at most (the
/// loop's own assertions then report what was done).
fn keep_going(started: Instant, min_ms: u64, enough: impl Fn() -> bool) -> bool {
    let spent = started.elapsed();
    if spent < Duration::from_millis(min_ms) {
        return true;
    }
    spent < Duration::from_secs(60) && !enough()
}

// ---- a write racing set_len ----

#[test]
fn partial_writes_racing_a_shrink_land_before_or_after_it() {
    // One thread merges 10 bytes into page 100 (not buffered, so read
    // from disk), another cuts the file to one page and grows it back.
    // Each merge lands before the cut (and is cut) or after it (and
    // stays); none fails, whatever the interleaving.
    for cache in [0usize, 1 << 20] {
        let d = dir();
        let path = d.path().join("race");
        let f = Arc::new(
            PagedCachedFile::open(&path, Config::default().read_cache_bytes(cache)).unwrap(),
        );
        f.set_len(1 << 20).unwrap();
        f.sync().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(AtomicU64::new(0));
        let writes_so_far = Arc::new(AtomicU64::new(0));
        let at = 100 * PS as u64 + 7;
        let writer = {
            let (f, stop, errors) = (Arc::clone(&f), Arc::clone(&stop), Arc::clone(&errors));
            let writes_so_far = Arc::clone(&writes_so_far);
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let ok = match n % 3 {
                        0 => f.write_all_at(at, b"0123456789").and_then(|()| f.sync()),
                        // A guard reads the page's current bytes too.
                        1 => f.write(100 * PS as u64, PS).map(|mut g| g[7] = b'g'),
                        _ => {
                            let mut buf = [0u8; 10];
                            f.read_exact_at(at, &mut buf).or_else(|e| match e {
                                // The read began past a cut: refused, typed.
                                Error::OutOfBounds { .. } => Ok(()),
                                e => Err(e),
                            })
                        }
                    };
                    if let Err(e) = ok {
                        eprintln!("racing write {n}: {e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                    writes_so_far.store(n, Ordering::Relaxed);
                }
                n
            })
        };
        // At least 1.5 s, and until both sides did enough (a loaded machine
        // may starve one for a while); a minute at most.
        let started = Instant::now();
        let mut cuts = 0u64;
        // A shrink over the page while the writer holds its guard is
        // refused (Busy) and changes nothing: try again.
        let set_len = |len| loop {
            match f.set_len(len) {
                Err(Error::Busy { .. }) => std::thread::yield_now(),
                r => break r.unwrap(),
            }
        };
        while keep_going(started, 1500, || {
            cuts > 10 && writes_so_far.load(Ordering::Relaxed) > 10
        }) {
            set_len(PS as u64);
            set_len(1 << 20);
            f.sync().unwrap();
            cuts += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert!(cuts > 10 && writes > 10, "{cuts} cuts, {writes} writes");
        assert_eq!(
            errors.load(Ordering::Relaxed),
            0,
            "cache {cache}: {writes} racing calls, {cuts} cuts"
        );
        // Whatever landed last, the page is the write's bytes or zeros,
        // with the guard's b'g' over the first byte if it came after.
        let mut buf = [0u8; 10];
        f.read_exact_at(at, &mut buf).unwrap();
        let tail_ok = &buf[1..] == b"123456789" || buf[1..].iter().all(|&b| b == 0);
        assert!(tail_ok && [b'0', b'g', 0].contains(&buf[0]), "{buf:?}");
        f.close().unwrap();
    }
}

#[test]
fn a_write_racing_a_shrink_never_brings_back_bytes_the_shrink_cut() {
    // Page 100 holds 0xAB on disk and in the read cache. One thread writes
    // the page's last byte over and over; another cuts the file at the
    // page's start. Whether a write lands before the cut (and is cut) or
    // after it (on a page the cut zeroed), no other byte of the page may
    // ever read 0xAB again once the cut has returned.
    let d = dir();
    let path = d.path().join("resurrect");
    let f = Arc::new(
        PagedCachedFile::open(&path, Config::default().read_cache_bytes(1 << 20)).unwrap(),
    );
    let page = 100 * PS as u64;
    let last = page + PS as u64 - 1;
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicU64::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (f, stop, go) = (Arc::clone(&f), Arc::clone(&stop), Arc::clone(&go));
        let written = Arc::clone(&written);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if go.load(Ordering::Acquire) % 2 == 1 {
                    f.write_all_at(last, &[1]).unwrap();
                    n += 1;
                    written.store(n, Ordering::Release);
                } else {
                    std::hint::spin_loop();
                }
            }
            n
        })
    };
    let started = Instant::now();
    let (mut rounds, mut seen) = (0u64, 0u64);
    while keep_going(started, 2000, || {
        rounds > 100 && written.load(Ordering::Acquire) > 100 && seen > 0
    }) {
        f.write_all_at(page, &[0xAB; PS]).unwrap();
        f.sync().unwrap();
        // The page is clean and cached: read it so a cache hit is certain.
        let mut buf = vec![0u8; PS];
        f.read_exact_at(page, &mut buf).unwrap();
        go.fetch_add(1, Ordering::AcqRel);
        f.set_len(page).unwrap();
        // Let one write land after the cut (the page is back), unless the
        // writer is starved for long on a loaded machine.
        let after = written.load(Ordering::Acquire);
        let wait = Instant::now();
        while written.load(Ordering::Acquire) == after && wait.elapsed() < Duration::from_millis(50)
        {
            std::hint::spin_loop();
        }
        // Past the cut: any byte the read sees but the writer's is zero.
        let mut got = vec![0u8; PS - 1];
        match f.read_exact_at(page, &mut got) {
            Ok(()) => {
                seen += 1;
                let bad = got.iter().position(|&b| b != 0);
                assert_eq!(
                    bad, None,
                    "round {rounds}: a byte the cut removed came back"
                );
            }
            Err(Error::OutOfBounds { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        go.fetch_add(1, Ordering::AcqRel);
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(
        rounds > 100 && writes > 100,
        "{rounds} rounds, {writes} writes"
    );
    assert!(
        seen > 0,
        "no round read the page after the cut ({rounds} rounds)"
    );
    eprintln!("{rounds} cuts, {writes} racing writes, {seen} pages read back after the cut");
    f.close().unwrap();
}

// ---- refused close ----

#[test]
fn a_close_refused_as_busy_leaves_the_file_open_for_every_thread() {
    let (be, f) = {
        let be = Arc::new(CrashBackend::new());
        (
            Arc::clone(&be),
            Arc::new(PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap()),
        )
    };
    f.write_page(0, &common::page(PS, 0, 1)).unwrap();
    let guard_file = Arc::clone(&f);
    let stop = Arc::new(AtomicBool::new(false));
    let closed_seen = Arc::new(AtomicU64::new(0));
    let calls_so_far = Arc::new(AtomicU64::new(0));
    let others: Vec<_> = (0..2u64)
        .map(|t| {
            let (f, stop, closed_seen) =
                (Arc::clone(&f), Arc::clone(&stop), Arc::clone(&closed_seen));
            let calls_so_far = Arc::clone(&calls_so_far);
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = 10 + t;
                    let w = f.write_all_at(p * PS as u64, &common::page(PS, p, n + 1));
                    let mut buf = [0u8; 16];
                    let r = f.read_exact_at(0, &mut buf);
                    for res in [w, r] {
                        match res {
                            Ok(()) => {}
                            Err(Error::Closed) => {
                                closed_seen.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    n += 1;
                    calls_so_far.fetch_add(1, Ordering::Relaxed);
                }
                n
            })
        })
        .collect();
    let g = guard_file.write(PS as u64, PS).unwrap();
    let mut refused = 0;
    let started = Instant::now();
    while keep_going(started, 500, || {
        refused > 100 && calls_so_far.load(Ordering::Relaxed) > 10
    }) {
        match f.close() {
            Err(Error::Busy { offset }) => {
                assert_eq!(offset, PS as u64);
                refused += 1;
            }
            other => panic!("close with a live guard: {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let calls: u64 = others.into_iter().map(|t| t.join().unwrap()).sum();
    drop(g);
    assert!(
        refused > 100 && calls > 10,
        "{refused} closes, {calls} calls"
    );
    assert_eq!(
        closed_seen.load(Ordering::Relaxed),
        0,
        "other threads were told Closed while {refused} closes were refused"
    );
    f.close().unwrap();
    assert_eq!(common::tag_of(&be.durable_image()), (0, 1));
}

/// A backend whose writes block until `open` and then fail while `fail` is
/// set: a `close` whose sync fails, with its failure window held open.
#[derive(Debug)]
struct GatedFail {
    inner: MemoryBackend,
    gate: parking_lot::Mutex<bool>,
    opened: parking_lot::Condvar,
    fail: AtomicBool,
    entered: AtomicBool,
}

impl GatedFail {
    fn wait(&self) {
        self.entered.store(true, Ordering::SeqCst);
        let mut open = self.gate.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
    }
    fn outcome(&self) -> std::io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        } else {
            Ok(())
        }
    }
}

impl StorageBackend for GatedFail {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact_at(offset, buf)
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.wait();
        self.outcome()?;
        self.inner.write_all_at(offset, buf)
    }
    fn write_vectored_all_at(
        &self,
        offset: u64,
        bufs: &mut [std::io::IoSlice<'_>],
    ) -> std::io::Result<()> {
        self.wait();
        self.outcome()?;
        self.inner.write_vectored_all_at(offset, bufs)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
}

#[test]
fn a_close_whose_sync_fails_never_tells_other_threads_closed() {
    let be = Arc::new(GatedFail {
        inner: MemoryBackend::new(),
        gate: parking_lot::Mutex::new(false),
        opened: parking_lot::Condvar::new(),
        fail: AtomicBool::new(true),
        entered: AtomicBool::new(false),
    });
    let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap());
    f.write_page(0, &common::page(PS, 0, 1)).unwrap();
    let closer = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || f.close())
    };
    while !be.entered.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    // close is inside its sync, which will fail: a write and a read from
    // another thread now must not be told the file is closed.
    let other = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            let r = f.read_exact_at(0, &mut buf).map(|()| buf);
            let w = f.write_page(PS as u64, &common::page(PS, 1, 1));
            (r, w)
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    *be.gate.lock() = true;
    be.opened.notify_all();
    let closed = closer.join().unwrap();
    assert!(
        matches!(closed, Err(Error::PagesFailed { .. })),
        "close over a failing write: {closed:?}"
    );
    let (r, w) = other.join().unwrap();
    assert_eq!(
        common::tag_of(&r.expect("read during a failed close")),
        (0, 1)
    );
    w.expect("write during a failed close");
    // The failed close left the file open; once writes work it closes.
    be.fail.store(false, Ordering::SeqCst);
    f.close().unwrap();
    let mut back = vec![0u8; 2 * PS];
    be.inner.read_exact_at(0, &mut back).unwrap();
    assert_eq!(common::tag_of(&back), (0, 1));
    assert_eq!(common::tag_of(&back[PS..]), (1, 1));
}

// ---- len() after sync is durable ----

#[test]
fn discarding_the_page_that_grew_the_file_keeps_the_length_len_reports() {
    let d = dir();
    for direct in [pagewriter::DirectIo::Off, pagewriter::DirectIo::Auto] {
        let path = d.path().join(format!("grow-{direct:?}"));
        let cfg = Config::default().direct(direct);
        let len = {
            let f = PagedCachedFile::open(&path, cfg.clone()).unwrap();
            f.write_all_at(0, &[1u8; PS]).unwrap();
            f.write_all_at(1 << 20, b"tail").unwrap();
            f.discard(1 << 20, PS as u64).unwrap();
            f.sync().unwrap();
            let len = f.len();
            f.close().unwrap();
            len
        };
        assert!(len > 1 << 20, "{len}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "{direct:?}");
        let f = PagedCachedFile::open(&path, cfg).unwrap();
        assert_eq!(f.len(), len);
        let mut buf = [9u8; 4];
        f.read_exact_at(1 << 20, &mut buf).unwrap();
        // Discarded: unspecified bytes, here zeros (never written).
        assert_eq!(buf, [0; 4]);
    }
}

#[test]
fn a_sync_makes_the_length_durable_in_a_crash_image() {
    // The same on the crash simulator: what survives a power cut after
    // sync has the length len() reported.
    let be = Arc::new(CrashBackend::new());
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    f.write_all_at(0, &[1u8; 100]).unwrap();
    f.write_all_at(3 * PS as u64 + 5, b"xy").unwrap();
    f.discard(3 * PS as u64, PS as u64).unwrap();
    f.sync().unwrap();
    assert_eq!(be.durable_image().len() as u64, f.len());
}

#[test]
fn len_before_a_sync_is_durable_when_it_returns_while_threads_grow_the_file() {
    // Four threads grow the file at once: each writes a few bytes at a new
    // end, sometimes discards the page it wrote (the length stays, the
    // page is not written), reads len(), syncs. Once its sync returned,
    // the durable image is at least that long, whichever round wrote what.
    let be = Arc::new(CrashBackend::new());
    let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap());
    let end = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (f, be, end) = (Arc::clone(&f), Arc::clone(&be), Arc::clone(&end));
            std::thread::spawn(move || {
                let mut discarded = 0;
                for i in 0..300u64 {
                    let page = end.fetch_add(PS as u64, Ordering::SeqCst);
                    f.write_all_at(page + 7, &[1 + t as u8; 9]).unwrap();
                    if (i + t) % 3 == 0 {
                        f.discard(page, PS as u64).unwrap();
                        discarded += 1;
                    }
                    let len = f.len();
                    f.sync().unwrap();
                    let durable = be.durable_image().len() as u64;
                    assert!(
                        durable >= len,
                        "t{t} commit {i}: len {len} before sync, {durable} durable"
                    );
                }
                discarded
            })
        })
        .collect();
    let discarded: u64 = threads.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(discarded > 0);
    assert_eq!(be.durable_image().len() as u64, f.len());
}

// ---- guards: the same thread gets Busy, other threads wait ----

#[test]
fn a_thread_asking_for_a_page_it_holds_a_guard_on_gets_busy_not_a_hang() {
    let out = within(10, "same-thread write over own guard", || {
        let f = PagedCachedFile::new(MemoryBackend::new(), Config::default()).unwrap();
        f.write_page(0, &[0; PS]).unwrap();
        let mut g = f.write(PS as u64, 2 * PS).unwrap();
        g[0] = 1;
        // Busy names the first page of the call that the guard holds.
        let busy = |r: pagewriter::Result<()>, page: u64| matches!(r, Err(Error::Busy { offset }) if offset == page * PS as u64);
        let results = [
            busy(f.write_page(2 * PS as u64, &[2; PS]), 2),
            busy(f.write_all_at(2 * PS as u64 + 3, b"x"), 2),
            busy(f.write(0, 3 * PS).map(drop), 1),
            busy(f.overwrite(2 * PS as u64, PS).map(drop), 2),
            // A multi-page write whose later page is guarded buffers none.
            busy(f.write_page(0, &[3; 3 * PS]), 1),
        ];
        let untouched = f.read(0, PS).unwrap().iter().all(|&b| b == 0);
        // Pages the guard does not hold are free.
        f.write_page(0, &[4; PS]).unwrap();
        drop(g);
        f.write_page(2 * PS as u64, &[2; PS]).unwrap();
        (results, untouched, f.read(PS as u64, PS).unwrap()[0])
    });
    assert_eq!(
        out.0, [true; 5],
        "write_page, write_all_at, write, overwrite, multi-page"
    );
    assert!(out.1, "a refused multi-page write buffered its first page");
    assert_eq!(out.2, 1);
}

#[test]
fn another_thread_waits_for_a_guard_and_lands_after_it() {
    let f = Arc::new(PagedCachedFile::new(MemoryBackend::new(), Config::default()).unwrap());
    let mut g = f.write(0, PS).unwrap();
    g[..4].copy_from_slice(b"grd!");
    let t = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || f.write_all_at(2, b"ZZ"))
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!t.is_finished(), "a write went past a live guard");
    drop(g);
    t.join().unwrap().unwrap();
    assert_eq!(&f.read(0, PS).unwrap()[..4], b"grZZ");
}

// ---- page size and memory ----

#[test]
fn a_page_size_past_the_bound_is_refused_by_validate() {
    let huge = Config::default()
        .page_size(1 << 40)
        .max_write_buffer_bytes(1 << 41);
    assert!(
        matches!(huge.validate(), Err(Error::InvalidPageSize(n)) if n == 1 << 40),
        "{:?}",
        huge.validate()
    );
    assert!(matches!(
        PagedCachedFile::new(MemoryBackend::new(), huge),
        Err(Error::InvalidPageSize(_))
    ));
    let top = Config::default()
        .page_size(pagewriter::MAX_PAGE_SIZE)
        .max_write_buffer_bytes(pagewriter::MAX_PAGE_SIZE);
    top.validate().unwrap();
}

#[test]
#[cfg_attr(
    not(unix),
    ignore = "caps the child's address space with bash's ulimit -v (Unix)"
)]
fn memory_the_process_cannot_get_is_no_memory_not_an_abort() {
    // In a child process with its address space capped at 1 GiB (`ulimit
    // -v`): pages of 256 MiB, a write buffer of 4 GiB. The fourth page
    // cannot be had.
    const CHILD: &str = "PAGEWRITER_NOMEM_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let ps = 256 << 20;
        let d = dir();
        let f = PagedCachedFile::open(
            d.path().join("big-pages"),
            Config::default()
                .page_size(ps)
                .max_write_buffer_bytes(4 << 30),
        )
        .unwrap();
        let data = vec![7u8; 16];
        let mut outcome = Vec::new();
        for p in 0..6u64 {
            let r = f.write_all_at(p * ps as u64, &data);
            outcome.push(match r {
                Ok(()) => "ok".to_string(),
                Err(Error::NoMemory { bytes }) => {
                    assert_eq!(bytes, ps as u64);
                    "nomem".to_string()
                }
                Err(e) => format!("{e}"),
            });
        }
        for p in 0..6u64 {
            let r = f.write(p * ps as u64, ps);
            outcome.push(match r {
                Ok(_) => "ok".to_string(),
                Err(Error::NoMemory { .. }) => "nomem".to_string(),
                Err(e) => format!("{e}"),
            });
        }
        println!("OUTCOME {}", outcome.join(","));
        return;
    }
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
        .arg(me)
        .args([
            "--exact",
            "memory_the_process_cannot_get_is_no_memory_not_an_abort",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child aborted: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("OUTCOME ").map(|(_, v)| v))
        .unwrap_or_else(|| panic!("no outcome: {stdout}"));
    let v: Vec<&str> = line.split(',').collect();
    assert!(v[0] == "ok", "{line}");
    assert!(
        v.contains(&"nomem"),
        "the address-space cap was never hit: {line}"
    );
    assert!(v.iter().all(|s| *s == "ok" || *s == "nomem"), "{line}");
}

// ---- a refused call changes nothing ----

#[test]
fn a_write_failure_in_close_keeps_every_page_and_the_file_open() {
    let d = dir();
    let be = Arc::new(FaultyBackend::new(
        FileBackend::open(d.path().join("f")).unwrap(),
    ));
    be.schedule_writes([WriteFault::Errno(libc::EIO)]);
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    f.write_page(0, &common::page(PS, 0, 1)).unwrap();
    assert!(matches!(f.close(), Err(Error::PagesFailed { .. })));
    assert_eq!(common::tag_of(&f.read(0, PS).unwrap()), (0, 1));
    f.write_page(PS as u64, &common::page(PS, 1, 1)).unwrap();
    f.close().unwrap();
    assert!(matches!(f.write_page(0, &[0; PS]), Err(Error::Closed)));
}
