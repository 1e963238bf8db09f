//! A multi-threaded stress of the engine API against a per-byte model,
//! shared by `tests/engine_stress.rs` (a temporary directory, every engine)
//! and `tests/fs_matrix.rs` (each Linux file system on its own mount).
//!
//! Layout of the file (pages of `ps` bytes, `T` threads):
//!
//! - region `t` (`region_pages` pages): thread `t` alone writes it, with
//!   `write_all_at` at odd offsets and lengths across page boundaries,
//!   `write_page`, guards (`write`, `overwrite`), `discard`, and reads it
//!   back; its bytes are known exactly (a discarded byte is unknown until
//!   written again, as `discard` documents);
//! - one sentinel page, under a guard the main thread holds for the whole
//!   phase, so every `close` attempt of a worker is refused (`Busy`) and
//!   must change nothing;
//! - the zone (`zone_pages` per thread): a cutter thread moves the length
//!   inside it (`set_len` shrink, then grow back), racing the threads'
//!   partial writes and reads there. A zone byte holds the last value its
//!   thread wrote, or zeros where a cut came after that write; where a cut
//!   overlapped it, either (a global clock orders the calls).
//!
//! Thread 0 also keeps a guard of its own on a page of its region and must
//! get `Busy` (not a hang) for its own writes over that page. Every call
//! result that is not the documented one counts as unexpected. Each phase
//! ends with the workers stopped, the length grown back, `close`, a reopen
//! with the same configuration, and every byte of the file checked against
//! the model (on disk with `std::fs::read`, and through the reopened file).

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pagewriter::testing::Rng;
use pagewriter::{Config, Error, PagedCachedFile, WritablePage};

/// Engine calls a phase makes at least before it ends (see `run`).
pub const MIN_OPS_PER_PHASE: u64 = 500;

/// How big and how long.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Worker threads (each with its region and zone part).
    pub threads: u64,
    /// Pages per thread region.
    pub region_pages: u64,
    /// Pages per thread in the zone the cutter works in.
    pub zone_pages: u64,
    /// Run time of one phase.
    pub phase: Duration,
    /// Phases, each ending in close, reopen and a full check.
    pub phases: u32,
}

impl Plan {
    /// 8 threads; `secs` seconds in all over 3 phases.
    pub fn eight_threads(secs: f64) -> Self {
        Plan {
            threads: 8,
            region_pages: 12,
            zone_pages: 3,
            phase: Duration::from_secs_f64(secs / 3.0),
            phases: 3,
        }
    }
}

/// What a run did and found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Engine API calls made by the workers and the cutter.
    pub ops: u64,
    /// Results other than the documented ones (must be 0).
    pub unexpected: u64,
    /// Documented refusals: `Busy` for a close attempt or a write over the
    /// caller's own guard (each checked to change nothing).
    pub refusals: u64,
    /// Zone reads refused as past the end while a cut was under way.
    pub out_of_bounds: u64,
    /// `set_len` shrinks.
    pub cuts: u64,
    /// Closes and reopens.
    pub reopens: u64,
    /// Bytes that did not match the model after a reopen (must be 0).
    pub lost_bytes: u64,
    /// Bytes checked after reopens.
    pub checked_bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// The first unexpected results, for the failure message.
    pub first: Vec<String>,
}

/// The last write of one zone byte: its value and the clock around it.
#[derive(Debug, Clone, Copy, Default)]
struct Last {
    value: u8,
    start: u64,
    end: u64,
}

/// A shrink of the length to `len` and the grow back after it (clock).
#[derive(Debug, Clone, Copy)]
struct Cut {
    len: u64,
    shrink: (u64, u64),
    /// `u64::MAX` until the grow returned.
    grow_end: u64,
}

/// One worker's part of the model, kept across phases.
struct Part {
    t: u64,
    region: Vec<Option<u8>>,
    zone: Vec<Last>,
    rng: Rng,
}

/// Where things are in the file.
#[derive(Clone, Copy)]
struct Geometry<'a> {
    ps: u64,
    plan: &'a Plan,
}

impl Geometry<'_> {
    fn region_base(&self, t: u64) -> u64 {
        t * self.plan.region_pages * self.ps
    }
    fn sentinel(&self) -> u64 {
        self.plan.threads * self.plan.region_pages * self.ps
    }
    fn zone_start(&self) -> u64 {
        self.sentinel() + self.ps
    }
    fn zone_base(&self, t: u64) -> u64 {
        self.zone_start() + t * self.plan.zone_pages * self.ps
    }
    fn full_len(&self) -> u64 {
        self.zone_base(self.plan.threads)
    }
}

/// The values a zone byte at `b` may read as, given its last write, the
/// cuts, and a read between clock `rs` and `re`: `Some(v)` exactly, or
/// `None` for "its last value or zero".
fn zone_expect(cuts: &[Cut], b: u64, last: Last, rs: u64, re: u64) -> Option<u8> {
    let mut maybe = false;
    for c in cuts.iter().filter(|c| c.len <= b) {
        if c.shrink.0 > last.end && c.shrink.1 < rs {
            return Some(0);
        }
        if c.shrink.0 < re && c.shrink.1 > last.start {
            maybe = true;
        }
    }
    if maybe { None } else { Some(last.value) }
}

struct Shared<'a> {
    f: &'a PagedCachedFile,
    geo: Geometry<'a>,
    ps: u64,
    plan: &'a Plan,
    direct: bool,
    clock: &'a AtomicU64,
    cuts: Mutex<Vec<Cut>>,
    stop: AtomicBool,
    ops: AtomicU64,
    refusals: AtomicU64,
    out_of_bounds: AtomicU64,
    unexpected: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Shared<'_> {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }
    fn region_base(&self, t: u64) -> u64 {
        self.geo.region_base(t)
    }
    fn zone_start(&self) -> u64 {
        self.geo.zone_start()
    }
    fn zone_base(&self, t: u64) -> u64 {
        self.geo.zone_base(t)
    }
    fn full_len(&self) -> u64 {
        self.geo.full_len()
    }
    fn fail(&self, what: String) {
        self.unexpected.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap();
        if first.len() < 8 {
            first.push(what);
        }
    }
    fn op(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
    }

    /// The outcome of a call that must be refused as `Busy` exactly when
    /// `busy` (this thread's own guard covers it): its value when it went
    /// ahead as it should; `None` for a refusal (counted) or anything else
    /// (a failure, named by `what`).
    fn expect_busy<T>(
        &self,
        t: u64,
        res: pagewriter::Result<T>,
        busy: bool,
        what: impl FnOnce() -> String,
    ) -> Option<T> {
        match res {
            Ok(v) if !busy => Some(v),
            Err(Error::Busy { .. }) if busy => {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                None
            }
            other => {
                let got = other
                    .map(|_| "Ok".to_string())
                    .unwrap_or_else(|e| e.to_string());
                self.fail(format!("t{t} {} (busy {busy}): {got}", what()));
                None
            }
        }
    }

    fn zone_expect(&self, b: u64, last: Last, rs: u64, re: u64) -> Option<u8> {
        zone_expect(&self.cuts.lock().unwrap(), b, last, rs, re)
    }

    /// Whether the length may have been below `end` at some point between
    /// clock `rs` and `re` (a cut to below it, not yet grown back).
    fn may_be_short(&self, end: u64, rs: u64, re: u64) -> bool {
        self.cuts
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.len < end && c.shrink.0 < re && c.grow_end > rs)
    }
}

/// Runs `plan` on a new file at `path` opened with `cfg` (which must not
/// exist yet).
pub fn run(path: &Path, cfg: &Config, plan: &Plan) -> Report {
    let started = Instant::now();
    let mut report = Report::default();
    let mut parts: Vec<Part> = (0..plan.threads)
        .map(|t| Part {
            t,
            region: vec![Some(0); (plan.region_pages * cfg.page_size as u64) as usize],
            zone: vec![Last::default(); (plan.zone_pages * cfg.page_size as u64) as usize],
            rng: Rng::new(0x5EED ^ t.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        })
        .collect();
    let clock = AtomicU64::new(1);
    let geo = Geometry {
        ps: cfg.page_size as u64,
        plan,
    };
    let mut sentinel_bytes = vec![0u8; cfg.page_size];
    let fail = |report: &mut Report, what: String| {
        report.unexpected += 1;
        if report.first.len() < 8 {
            report.first.push(what);
        }
    };
    for phase in 0..plan.phases {
        let f = PagedCachedFile::open(path, cfg.clone()).expect("open for the stress");
        if phase == 0 {
            f.set_len(geo.full_len()).expect("initial length");
        }
        assert_eq!(
            f.len(),
            geo.full_len(),
            "length at the start of phase {phase}"
        );
        let sh = Shared {
            f: &f,
            geo,
            ps: geo.ps,
            plan,
            direct: f.io_mode().direct.is_some(),
            clock: &clock,
            cuts: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            out_of_bounds: AtomicU64::new(0),
            unexpected: AtomicU64::new(0),
            first: Mutex::new(Vec::new()),
        };
        // The sentinel guard: every worker's close attempt must be refused.
        let mut sentinel = f
            .write(geo.sentinel(), cfg.page_size)
            .expect("sentinel guard");
        sentinel[0] = sentinel[0].wrapping_add(1);
        sentinel_bytes[0] = sentinel[0];
        let cuts = std::thread::scope(|s| {
            let workers: Vec<_> = parts
                .drain(..)
                .map(|part| {
                    let sh = &sh;
                    s.spawn(move || worker(sh, part))
                })
                .collect();
            let cutter = s.spawn(|| cutter(&sh));
            // The phase's time, and then until the workers and the cutter
            // have done enough for the run's checks to mean something (a
            // loaded machine may starve a thread for a while); a minute
            // past its time at most.
            let phase_started = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(10));
                let spent = phase_started.elapsed();
                let enough = sh.ops.load(Ordering::Relaxed) >= MIN_OPS_PER_PHASE
                    && sh.refusals.load(Ordering::Relaxed) > 0
                    && !sh.cuts.lock().unwrap().is_empty();
                if (spent >= plan.phase && enough) || spent >= plan.phase + Duration::from_secs(60)
                {
                    break;
                }
            }
            sh.stop.store(true, Ordering::SeqCst);
            for w in workers {
                parts.push(w.join().expect("a worker panicked"));
            }
            cutter.join().expect("the cutter panicked")
        });
        drop(sentinel);
        report.cuts += cuts;
        report.ops += sh.ops.load(Ordering::Relaxed);
        report.refusals += sh.refusals.load(Ordering::Relaxed);
        report.out_of_bounds += sh.out_of_bounds.load(Ordering::Relaxed);
        report.unexpected += sh.unexpected.load(Ordering::Relaxed);
        report.first.extend(sh.first.into_inner().unwrap());
        let cut_log = sh.cuts.into_inner().unwrap();
        if let Err(e) = f.close() {
            fail(&mut report, format!("close after phase {phase}: {e}"));
        }
        drop(f);
        report.reopens += 1;
        // The whole file, on disk and through a reopened file.
        let disk = std::fs::read(path).expect("read the file back");
        let now = clock.fetch_add(1, Ordering::SeqCst);
        if disk.len() as u64 != geo.full_len() {
            fail(
                &mut report,
                format!(
                    "phase {phase}: the file is {} bytes, the model {}",
                    disk.len(),
                    geo.full_len()
                ),
            );
        }
        let g = PagedCachedFile::open(path, cfg.clone()).expect("reopen");
        let mut through = vec![0u8; geo.full_len() as usize];
        if let Err(e) = g.read_exact_at(0, &mut through) {
            fail(&mut report, format!("phase {phase}: read back: {e}"));
        }
        drop(g);
        for image in [&disk, &through] {
            let byte = |at: u64| image.get(at as usize).copied();
            for part in &parts {
                let base = geo.region_base(part.t);
                for (i, want) in part.region.iter().enumerate() {
                    report.checked_bytes += 1;
                    if let Some(w) = want
                        && byte(base + i as u64) != Some(*w)
                    {
                        report.lost_bytes += 1;
                    }
                }
                let zbase = geo.zone_base(part.t);
                for (i, last) in part.zone.iter().enumerate() {
                    report.checked_bytes += 1;
                    let b = zbase + i as u64;
                    let got = byte(b);
                    let ok = match zone_expect(&cut_log, b, *last, now, now) {
                        Some(v) => got == Some(v),
                        None => got == Some(0) || got == Some(last.value),
                    };
                    if !ok {
                        report.lost_bytes += 1;
                    }
                }
            }
            let s = geo.sentinel() as usize;
            report.checked_bytes += sentinel_bytes.len() as u64;
            if image.get(s..s + sentinel_bytes.len()) != Some(&sentinel_bytes[..]) {
                report.lost_bytes += 1;
            }
        }
        // What was read is what the model knows from here on.
        for part in &mut parts {
            let base = geo.region_base(part.t);
            for (i, want) in part.region.iter_mut().enumerate() {
                *want = disk.get(base as usize + i).copied();
            }
            let zbase = geo.zone_base(part.t);
            for (i, last) in part.zone.iter_mut().enumerate() {
                *last = Last {
                    value: disk.get(zbase as usize + i).copied().unwrap_or(0),
                    start: now,
                    end: now,
                };
            }
        }
        clock.fetch_add(1, Ordering::SeqCst);
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}

/// Moves the length inside the zone until told to stop, then leaves it
/// at the full length. Returns the number of cuts.
fn cutter(sh: &Shared<'_>) -> u64 {
    let mut rng = Rng::new(0xC07);
    let zone = sh.full_len() - sh.zone_start();
    let mut cuts = 0;
    while !sh.stop.load(Ordering::SeqCst) {
        let mut len = sh.zone_start() + rng.below(zone);
        if sh.direct {
            len -= len % sh.ps;
        }
        let s0 = sh.tick();
        let at = {
            let mut c = sh.cuts.lock().unwrap();
            c.push(Cut {
                len,
                shrink: (s0, u64::MAX),
                grow_end: u64::MAX,
            });
            c.len() - 1
        };
        sh.op();
        if let Err(e) = sh.f.set_len(len) {
            sh.fail(format!("set_len({len}) shrink: {e}"));
        }
        let s1 = sh.tick();
        sh.cuts.lock().unwrap()[at].shrink.1 = s1;
        cuts += 1;
        std::thread::sleep(Duration::from_micros(rng.below(300)));
        sh.op();
        if let Err(e) = sh.f.set_len(sh.full_len()) {
            sh.fail(format!("set_len grow: {e}"));
        }
        let g1 = sh.tick();
        sh.cuts.lock().unwrap()[at].grow_end = g1;
        if rng.below(4) == 0 {
            sh.op();
            if let Err(e) = sh.f.sync() {
                sh.fail(format!("cutter sync: {e}"));
            }
        }
        std::thread::sleep(Duration::from_micros(rng.below(500)));
    }
    cuts
}

/// One worker: random calls on its region and zone part until told to
/// stop. Thread 0 keeps a guard on a page of its region.
fn worker<'a>(sh: &'a Shared<'a>, mut part: Part) -> Part {
    let ps = sh.ps;
    let rlen = part.region.len() as u64;
    let base = sh.region_base(part.t);
    let mut own: Option<(u64, WritablePage<'a>)> = None;
    let mut n = 0u64;
    while !sh.stop.load(Ordering::SeqCst) {
        n += 1;
        if part.t == 0 && n % 40 == 1 {
            // Rotate the guard: take the next, then drop the old one.
            let page = part.rng.below(sh.plan.region_pages);
            let old = own.take();
            if old.as_ref().is_some_and(|(p, _)| *p == page) {
                own = old;
            } else {
                if let Some((p, g)) = old {
                    apply_guard(&mut part, p, ps, g);
                }
                sh.op();
                match sh.f.write(base + page * ps, ps as usize) {
                    Ok(mut g) => {
                        let i = part.rng.below(ps) as usize;
                        g[i] = g[i].wrapping_add(1);
                        own = Some((page, g));
                    }
                    Err(e) => sh.fail(format!("t0 guard on page {page}: {e}")),
                }
            }
        }
        let guarded = own.as_ref().map(|(p, _)| *p);
        // Whether the pages of [off, off + len) of the region include the
        // page under this thread's own guard.
        let hits = |off: u64, len: u64| {
            guarded.is_some_and(|g| len > 0 && off / ps <= g && g <= (off + len - 1) / ps)
        };
        let r = part.rng.below(100);
        sh.op();
        match r {
            // A partial write at an odd offset, across pages.
            0..=24 => {
                let off = part.rng.below(rlen - 1);
                let len = 1 + part.rng.below((rlen - off).min(ps * 5 / 2));
                let mut data = vec![0u8; len as usize];
                part.rng.fill(&mut data);
                let res = sh.f.write_all_at(base + off, &data);
                expect_write(
                    sh,
                    &mut part,
                    off,
                    &data,
                    res,
                    hits(off, len),
                    "write_all_at",
                );
            }
            // Whole pages.
            25..=34 => {
                let pages = 1 + part.rng.below(3.min(sh.plan.region_pages));
                let p = part.rng.below(sh.plan.region_pages - pages + 1);
                let mut data = vec![0u8; (pages * ps) as usize];
                part.rng.fill(&mut data);
                let res = sh.f.write_page(base + p * ps, &data);
                let busy = hits(p * ps, pages * ps);
                expect_write(sh, &mut part, p * ps, &data, res, busy, "write_page");
            }
            // A guard over the current bytes, a few changed.
            35..=44 => {
                let pages = 1 + part.rng.below(2);
                let p = part.rng.below(sh.plan.region_pages - pages + 1);
                let busy = hits(p * ps, pages * ps);
                let res = sh.f.write(base + p * ps, (pages * ps) as usize);
                if let Some(mut g) =
                    sh.expect_busy(part.t, res, busy, || format!("write guard page {p}"))
                {
                    // The guard starts from the newest bytes.
                    let at = (p * ps) as usize;
                    for (i, want) in part.region[at..at + g.len()].iter().enumerate() {
                        if want.is_some_and(|w| w != g[i]) {
                            sh.fail(format!("t{} guard at page {p}: byte {i} stale", part.t));
                            break;
                        }
                    }
                    for _ in 0..4 {
                        let i = part.rng.below(g.len() as u64) as usize;
                        g[i] = part.rng.next_u64() as u8;
                    }
                    for (i, &b) in g.iter().enumerate() {
                        part.region[at + i] = Some(b);
                    }
                }
            }
            // A guard over a page filled whole.
            45..=49 => {
                let p = part.rng.below(sh.plan.region_pages);
                let busy = hits(p * ps, ps);
                let res = sh.f.overwrite(base + p * ps, ps as usize);
                if let Some(mut g) =
                    sh.expect_busy(part.t, res, busy, || format!("overwrite page {p}"))
                {
                    part.rng.fill(&mut g);
                    let at = (p * ps) as usize;
                    for (i, &b) in g.iter().enumerate() {
                        part.region[at + i] = Some(b);
                    }
                }
            }
            // Read back any range of the region.
            50..=67 => {
                let off = part.rng.below(rlen - 1);
                let len = 1 + part.rng.below((rlen - off).min(ps * 3));
                let mut buf = vec![0u8; len as usize];
                match sh.f.read_exact_at(base + off, &mut buf) {
                    Ok(()) => check_region(sh, &part, off, &buf, "read_exact_at"),
                    Err(e) => sh.fail(format!("t{} read_exact_at: {e}", part.t)),
                }
            }
            68..=71 => {
                let p = part.rng.below(sh.plan.region_pages);
                match sh.f.read(base + p * ps, ps as usize) {
                    Ok(page) => check_region(sh, &part, p * ps, &page, "read"),
                    Err(e) => sh.fail(format!("t{} read: {e}", part.t)),
                }
            }
            // Discard: unknown bytes until written again.
            72..=75 => {
                let p = part.rng.below(sh.plan.region_pages);
                let busy = hits(p * ps, ps);
                let res = sh.f.discard(base + p * ps, ps);
                if sh
                    .expect_busy(part.t, res, busy, || format!("discard page {p}"))
                    .is_some()
                {
                    let at = (p * ps) as usize;
                    part.region[at..at + ps as usize].fill(None);
                }
            }
            76..=79 => {
                if let Err(e) = sh.f.flush() {
                    sh.fail(format!("t{} flush: {e}", part.t));
                }
            }
            80..=86 => {
                if let Err(e) = sh.f.sync() {
                    sh.fail(format!("t{} sync: {e}", part.t));
                }
            }
            // A close attempt: the sentinel guard refuses it.
            87..=88 => match sh.f.close() {
                Err(Error::Busy { .. }) => {
                    sh.refusals.fetch_add(1, Ordering::Relaxed);
                }
                other => sh.fail(format!("t{} close with guards alive: {other:?}", part.t)),
            },
            // The zone: partial writes racing the cutter.
            89..=94 => {
                let zlen = part.zone.len() as u64;
                let off = part.rng.below(zlen - 1);
                let len = 1 + part.rng.below((zlen - off).min(ps + ps / 2));
                let data: Vec<u8> = (0..len).map(|_| 1 + part.rng.below(255) as u8).collect();
                let start = sh.tick();
                let res = sh.f.write_all_at(sh.zone_base(part.t) + off, &data);
                let end = sh.tick();
                match res {
                    Ok(()) => {
                        for (i, &v) in data.iter().enumerate() {
                            part.zone[off as usize + i] = Last {
                                value: v,
                                start,
                                end,
                            };
                        }
                    }
                    Err(e) => sh.fail(format!("t{} zone write: {e}", part.t)),
                }
            }
            _ => {
                let zlen = part.zone.len() as u64;
                let off = part.rng.below(zlen - 1);
                let len = 1 + part.rng.below((zlen - off).min(ps * 2));
                let mut buf = vec![0u8; len as usize];
                let at = sh.zone_base(part.t) + off;
                let start = sh.tick();
                let res = sh.f.read_exact_at(at, &mut buf);
                let end = sh.tick();
                match res {
                    Ok(()) => {
                        for (i, &got) in buf.iter().enumerate() {
                            let b = at + i as u64;
                            let last = part.zone[off as usize + i];
                            let ok = match sh.zone_expect(b, last, start, end) {
                                Some(v) => got == v,
                                None => got == 0 || got == last.value,
                            };
                            if !ok {
                                sh.fail(format!(
                                    "t{} zone byte {b}: read {got}, last wrote {} ({:?})",
                                    part.t,
                                    last.value,
                                    sh.zone_expect(b, last, start, end)
                                ));
                                break;
                            }
                        }
                    }
                    Err(Error::OutOfBounds { .. }) if sh.may_be_short(at + len, start, end) => {
                        sh.out_of_bounds.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => sh.fail(format!("t{} zone read at {at}+{len}: {e}", part.t)),
                }
            }
        }
    }
    if let Some((p, g)) = own.take() {
        apply_guard(&mut part, p, ps, g);
    }
    part
}

/// Drops thread 0's own guard on page `p`: its bytes go to the model.
fn apply_guard(part: &mut Part, p: u64, ps: u64, g: WritablePage<'_>) {
    let at = (p * ps) as usize;
    for (i, &b) in g.iter().enumerate() {
        part.region[at + i] = Some(b);
    }
    drop(g);
}

/// A region write's outcome: applied to the model on `Ok`; `Busy` where
/// the caller's own guard covers it, and then nothing may have changed.
fn expect_write(
    sh: &Shared<'_>,
    part: &mut Part,
    off: u64,
    data: &[u8],
    res: pagewriter::Result<()>,
    busy: bool,
    what: &str,
) {
    match res {
        Ok(()) if !busy => {
            for (i, &b) in data.iter().enumerate() {
                part.region[off as usize + i] = Some(b);
            }
        }
        Err(Error::Busy { .. }) if busy => {
            sh.refusals.fetch_add(1, Ordering::Relaxed);
        }
        other => {
            // Whatever happened, those bytes are unknown now.
            for i in 0..data.len() {
                part.region[off as usize + i] = None;
            }
            sh.fail(format!(
                "t{} {what} {}+{} (own guard over it: {busy}): {other:?}",
                part.t,
                off,
                data.len()
            ));
        }
    }
}

/// Checks bytes read at region offset `off` against the model.
fn check_region(sh: &Shared<'_>, part: &Part, off: u64, got: &[u8], what: &str) {
    for (i, &g) in got.iter().enumerate() {
        if let Some(w) = part.region[off as usize + i]
            && w != g
        {
            sh.fail(format!(
                "t{} {what}: region byte {} is {g}, wrote {w}",
                part.t,
                off as usize + i
            ));
            return;
        }
    }
}
