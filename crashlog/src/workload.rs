//! The workloads: pagewriter on the logged file system, one per durability
//! path of the core. Each creates its page file in the run (so the file's
//! directory entry is part of what a crash may lose), records every write
//! and every acknowledged commit in a [`Tracker`], and writes `ack N` to
//! the logger's marks file after commit `N` returned `Ok`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pagewriter::{
    CommitTicket, Config, DirectIo, FileBackend, FlushEngine, GrowAhead, PagedCachedFile,
    StorageBackend, TornWrites,
};

use crate::expect::{Expect, Tracker};
use crate::serve::Faults;

/// Page size of the workloads but one: the device's sector outside the
/// page file's data blocks. Inside them (ext4, XFS) a crash cuts writes at
/// 512 B, so a page can tear; the `doublewrite` workload's 16 KiB pages
/// span four 4 KiB sectors, so they can tear on btrfs too.
pub const PS: usize = 4096;

/// One workload: its name, how it opens the file, and its body.
#[derive(Clone, Copy)]
pub struct Workload {
    pub name: &'static str,
    /// What the workload covers, for the report.
    pub about: &'static str,
    pub config: fn() -> Config,
    /// Pages torn by a crash are acceptable (`TornWrites::Allow`).
    pub torn_ok: bool,
    body: fn(&Ctx) -> Result<(), String>,
    /// The check of a replayed state, where the workload has its own
    /// (its commits acknowledged with notes); `None`: the page file read
    /// back whole against the page floors.
    pub check: Option<Check>,
}

/// A workload's own check of a replayed state: the page file's path on
/// the mounted state (it may be missing), the workload's config, what it
/// recorded, and the ids of the commits acknowledged before the state.
pub type Check = fn(&Path, &Config, &Expect, &[usize]) -> Result<(), String>;

/// What a workload runs with.
pub struct Ctx {
    /// The page file (on the logged file system).
    pub path: PathBuf,
    pub tracker: Tracker,
    marks: Mutex<std::fs::File>,
    pub faults: Arc<Mutex<Faults>>,
    pub config: Config,
}

impl Ctx {
    pub fn new(
        dir: &Path,
        marks: &Path,
        faults: Arc<Mutex<Faults>>,
        config: Config,
    ) -> Result<Ctx, String> {
        let marks = std::fs::OpenOptions::new()
            .write(true)
            .open(marks)
            .map_err(|e| format!("{}: {e}", marks.display()))?;
        Ok(Ctx {
            path: dir.join("pages.db"),
            tracker: Tracker::new(config.page_size),
            marks: Mutex::new(marks),
            faults,
            config,
        })
    }

    fn ps(&self) -> u64 {
        self.config.page_size as u64
    }

    fn open(&self) -> Result<PagedCachedFile, String> {
        PagedCachedFile::open(&self.path, self.config.clone())
            .map_err(|e| format!("open {}: {e}", self.path.display()))
    }

    /// Records an acknowledged commit with `floors` and logs its mark.
    fn ack(&self, floors: Vec<(u64, usize)>) -> Result<(), String> {
        let id = self.tracker.ack(floors);
        self.mark(id)
    }

    /// Records an acknowledged commit whose promise is `note` (for the
    /// workload's own check) and logs its mark.
    pub fn ack_note(&self, note: String) -> Result<(), String> {
        let id = self.tracker.ack_note(note);
        self.mark(id)
    }

    fn mark(&self, id: usize) -> Result<(), String> {
        let mut m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        m.write_all(format!("ack {id}\n").as_bytes())
            .map_err(|e| format!("writing mark {id}: {e}"))
    }

    fn write(&self, f: &PagedCachedFile, page: u64) -> Result<usize, String> {
        self.tracker
            .write(page, |b| f.write_page(page * self.ps(), b))
            .map_err(|e| format!("write page {page}: {e}"))
    }

    fn write_via(&self, w: &mut pagewriter::Writer<'_>, page: u64) -> Result<usize, String> {
        self.tracker
            .write(page, |b| w.write_page(page * self.ps(), b))
            .map_err(|e| format!("write page {page}: {e}"))
    }

    /// The tracker's next version of each page of a run from `first`,
    /// copied into `buf` (one page each, as many as it holds), with their
    /// floors, for a write of the run from `buf`.
    fn stage_run(&self, buf: &mut [u8], first: u64) -> Result<Vec<(u64, usize)>, String> {
        let ps = self.ps() as usize;
        let mut floors = Vec::new();
        for (page, at) in (first..).zip((0..buf.len()).step_by(ps)) {
            let v = self.tracker.write(page, |b| {
                buf[at..at + ps].copy_from_slice(b);
                Ok::<(), String>(())
            })?;
            floors.push((page, v));
        }
        Ok(floors)
    }

    /// `sync`, acknowledged with the floors of every page written before it.
    fn sync(&self, f: &PagedCachedFile) -> Result<(), String> {
        let floors = self.tracker.all_floors();
        f.sync().map_err(|e| format!("sync: {e}"))?;
        self.tracker.flushed_all();
        self.ack(floors)
    }
}

impl Workload {
    /// Runs the body.
    pub fn run(&self, ctx: &Ctx) -> Result<(), String> {
        (self.body)(ctx)
    }
}

fn base() -> Config {
    Config::default()
        .page_size(PS)
        .max_write_buffer_bytes(4 << 20)
}

/// Every workload.
pub const ALL: [Workload; 18] = [
    Workload {
        name: "sync-buffered",
        about: "sync() from 4 threads, buffered, vectored engine",
        config: || base().engine(FlushEngine::Vectored).direct(DirectIo::Off),
        torn_ok: true,
        body: |c| sync_threads(c, 4, 12),
        check: None,
    },
    Workload {
        name: "sync-direct-uring",
        about: "sync() from 2 threads, O_DIRECT, io_uring engine",
        config: || {
            base()
                .engine(FlushEngine::Auto { queue_depth: 8 })
                .direct(DirectIo::Auto)
        },
        torn_ok: true,
        body: |c| sync_threads(c, 2, 16),
        check: None,
    },
    Workload {
        name: "scoped-tickets",
        about: "Writer::commit from 3 threads inside written pages, commit_async with 4 tickets in flight, sync_async; O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_tickets,
        check: None,
    },
    Workload {
        name: "scoped-through",
        about: "Writer::write_and_commit from 3 threads rewriting written pages in two-page runs from page-aligned buffers (one write each, then an fdatasync begun after it, or one in flight begun after it); O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_through,
        check: None,
    },
    Workload {
        name: "scoped-large",
        about: "Writer::write_page of four-page runs, a page apart beside every other one, then Writer::commit, or sync() every fourth round (its promise covers the writer's pages too); O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_large,
        check: None,
    },
    Workload {
        name: "scoped-large-preallocated",
        about: "Writer::write_page of four-page runs into space reserved with fallocate (each commit's fdatasync commits the unwritten extents' conversion with the data), a page there beside every other run, then Writer::commit; O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_large_preallocated,
        check: None,
    },
    Workload {
        name: "scoped-large-growing",
        about: "Writer::write_page of four-page runs appended to an empty file (each commit grows it; its fdatasync makes the new size durable with the data), a page just past the run beside every other one, then Writer::commit; O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_large_growing,
        check: None,
    },
    Workload {
        name: "scoped-claimed",
        about: "Writer::commit from 3 threads of their own written pages, beside a thread calling sync(), whose promise covers the pages a scoped commit is writing when it is called; O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_claimed,
        check: None,
    },
    Workload {
        name: "scoped-growing",
        about: "Writer::commit from 3 threads on an empty file (their commits grow it); O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_growing,
        check: None,
    },
    Workload {
        name: "scoped-preallocated",
        about: "Writer::commit from 3 threads into space reserved with fallocate (unwritten extents their writes convert); O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_preallocated,
        check: None,
    },
    Workload {
        name: "resize-discard-reopen",
        about: "set_len down and up, discard, close and reopen; buffered",
        config: || base().direct(DirectIo::Off),
        torn_ok: true,
        body: resize_discard_reopen,
        check: None,
    },
    Workload {
        name: "doublewrite",
        about: "TornWrites::DoubleWrite (its area created in the run), 16 KiB pages, 2 threads rewriting pages in place",
        config: || {
            base()
                .page_size(16 << 10)
                .direct(DirectIo::Off)
                .torn_writes(TornWrites::DoubleWrite)
        },
        torn_ok: false,
        body: |c| rewrite_threads(c, 2, 10),
        check: None,
    },
    Workload {
        name: "doublewrite-4k",
        about: "TornWrites::DoubleWrite with 4 KiB pages, 2 threads rewriting pages in place: a page tears only where the device writes less than 4 KiB whole (the page file's data blocks, on ext4 and XFS)",
        config: || {
            base()
                .direct(DirectIo::Off)
                .torn_writes(TornWrites::DoubleWrite)
        },
        torn_ok: false,
        body: |c| rewrite_threads(c, 2, 10),
        check: None,
    },
    Workload {
        name: "grow-ahead",
        about: "a 1 MiB grow-ahead window, appends from 2 threads, close and reopen; O_DIRECT",
        config: || {
            base()
                .direct(DirectIo::Auto)
                .grow_ahead(GrowAhead::Window { bytes: 1 << 20 })
        },
        torn_ok: true,
        body: appends,
        check: None,
    },
    Workload {
        name: "scoped-eio",
        about: "Writer::commit from 3 threads of their own written pages while the device fails a cache flush with EIO: no commit acknowledged after a failure was seen, the file poisoned; O_DIRECT",
        config: || base().direct(DirectIo::Auto),
        torn_ok: true,
        body: scoped_eio,
        check: None,
    },
    Workload {
        name: "eio-on-flush",
        about: "sync() from 2 threads while the device fails one cache flush with EIO",
        config: || base().direct(DirectIo::Off),
        torn_ok: true,
        body: |c| eio(c, Fail::Flush),
        check: None,
    },
    Workload {
        name: "eio-on-write",
        about: "sync() from 2 threads while the device fails one write-back with EIO; buffered",
        config: || base().direct(DirectIo::Off),
        torn_ok: true,
        body: |c| eio(c, Fail::Write),
        check: None,
    },
    Workload {
        name: "column-families",
        about: "redb databases in column families of one file: three threads commit transactions into a family each (growing it by extents), a fourth fills one, deletes it and fills a new one in its space; each state reopened with redb and check_integrity; O_DIRECT",
        config: crate::families::config,
        torn_ok: true,
        body: crate::families::run,
        check: Some(crate::families::check),
    },
];

/// The workload named `name`.
pub fn by_name(name: &str) -> Option<Workload> {
    ALL.into_iter().chain(EXPERIMENTS).find(|w| w.name == name)
}

/// Workloads that check the file system rather than pagewriter, run by
/// name only (not by CI, not in `ALL`).
pub const EXPERIMENTS: [Workload; 1] = [Workload {
    name: "raw-fdatasync-threads",
    about: "no pagewriter: 3 threads write pages of their own with O_DIRECT through one descriptor and fdatasync on one of three descriptors in turn, so fdatasyncs of one file run at once (what sync lanes do)",
    config: base,
    torn_ok: true,
    body: raw_fdatasync_threads,
    check: None,
}];

/// Pages 0 to 39 written (`O_DIRECT`) and synced with plain calls; then
/// three threads write a page of their own through that descriptor and
/// `fdatasync` it on one of three descriptors (that one and two more, in
/// turn), 40 times, acknowledging each: pagewriter's sync lanes, without
/// pagewriter.
fn raw_fdatasync_threads(c: &Ctx) -> Result<(), String> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let open = |flags: i32| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(flags)
            .open(&c.path)
            .map_err(|e| format!("{}: {e}", c.path.display()))
    };
    // O_DIRECT writes from page-aligned memory, as pagewriter's.
    let data = open(libc::O_DIRECT)?;
    let ps = c.ps();
    // The page's bytes taken under the tracker's lock, written outside
    // it: the threads' writes overlap, as pagewriter's do.
    let write = |page: u64| -> std::io::Result<usize> {
        let mut mem = vec![0u8; 2 * ps as usize];
        let at = mem.as_ptr().align_offset(4096);
        let buf = &mut mem[at..at + ps as usize];
        let v = c.tracker.write(page, |b| {
            buf.copy_from_slice(b);
            Ok::<(), std::io::Error>(())
        })?;
        data.write_all_at(buf, page * ps)?;
        Ok(v)
    };
    for p in 0..40 {
        write(p).map_err(|e| format!("write page {p}: {e}"))?;
    }
    data.sync_data().map_err(|e| format!("fdatasync: {e}"))?;
    let floors = c.tracker.all_floors();
    c.tracker.flushed_all();
    c.ack(floors)?;
    // Three lanes, the first the writes' own descriptor, taken in turn.
    let lanes = [&data, &open(0)?, &open(0)?];
    on_threads(3, |t| {
        for i in 0..40u64 {
            let page = 1 + t * 13 + i % 13;
            let v = write(page).map_err(|e| format!("write page {page}: {e}"))?;
            let lane = lanes[((t + i) % 3) as usize];
            lane.sync_data().map_err(|e| format!("fdatasync: {e}"))?;
            c.ack(vec![(page, v)])?;
        }
        Ok(())
    })
}

/// `threads` threads, `commits` commits each: a page of the thread's own
/// and the shared page 0, then `sync`.
fn sync_threads(c: &Ctx, threads: u64, commits: u64) -> Result<(), String> {
    let f = c.open()?;
    on_threads(threads, |t| {
        for i in 0..commits {
            c.write(&f, 1 + t * commits + i)?;
            c.write(&f, 0)?;
            c.sync(&f)?;
        }
        Ok(())
    })?;
    f.close().map_err(|e| format!("close: {e}"))
}

/// Thread `t` of three commits its own pages and the shared page 0
/// through a writer of its own, ten times.
fn scoped_commits(c: &Ctx, f: &PagedCachedFile, t: u64) -> Result<(), String> {
    let mut w = f.writer();
    for i in 0..10u64 {
        let own = 1 + t * 10 + i;
        let a = c.write_via(&mut w, own)?;
        let b = c.write_via(&mut w, 0)?;
        w.commit().map_err(|e| format!("commit: {e}"))?;
        c.ack(vec![(own, a), (0, b)])?;
    }
    Ok(())
}

/// Pages 0 to 30 written and synced first, so the three threads'
/// commits stay inside the file (scoped commits proper); a fourth keeps
/// four asynchronous commits in flight past its end; then `sync_async`
/// of everything.
fn scoped_tickets(c: &Ctx) -> Result<(), String> {
    let f = c.open()?;
    for p in 0..31 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    on_threads(4, |t| {
        if t < 3 {
            return scoped_commits(c, &f, t);
        }
        let mut w = f.writer();
        let mut pending: std::collections::VecDeque<(CommitTicket, Vec<(u64, usize)>)> =
            Default::default();
        for i in 0..24u64 {
            let own = 100 + i;
            let a = c.write_via(&mut w, own)?;
            pending.push_back((
                w.commit_async().map_err(|e| format!("commit_async: {e}"))?,
                vec![(own, a)],
            ));
            if pending.len() == 4 {
                let (t, floors) = pending.pop_front().expect("four");
                t.wait().map_err(|e| format!("ticket: {e}"))?;
                c.ack(floors)?;
            }
        }
        for (t, floors) in pending {
            t.wait().map_err(|e| format!("ticket: {e}"))?;
            c.ack(floors)?;
        }
        Ok(())
    })?;
    let floors = c.tracker.all_floors();
    f.sync_async()
        .and_then(CommitTicket::wait)
        .map_err(|e| format!("sync_async: {e}"))?;
    c.ack(floors)?;
    f.close().map_err(|e| format!("close: {e}"))
}

/// Pages 0 to 29 written and synced; then three threads rewrite their own
/// ten pages, two at a time, each run with one `write_and_commit` from a
/// page-aligned buffer. A commit's two pages are acknowledged once it
/// returns.
fn scoped_through(c: &Ctx) -> Result<(), String> {
    let f = c.open()?;
    for p in 0..30 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    let ps = c.ps() as usize;
    on_threads(3, |t| {
        let mut w = f.writer();
        let mut buf = pagewriter::buffer::AlignedBuf::zeroed(2 * ps, 4096)
            .ok_or_else(|| "no memory for a buffer".to_string())?;
        for i in 0..10u64 {
            let first = t * 10 + (i % 5) * 2;
            // The tracker numbers the versions; each thread's pages are
            // its own, so their order is this thread's.
            let floors = c.stage_run(&mut buf, first)?;
            w.write_and_commit(first * c.ps(), &buf)
                .map_err(|e| format!("write_and_commit: {e}"))?;
            c.ack(floors)?;
        }
        Ok(())
    })?;
    f.close().map_err(|e| format!("close: {e}"))
}

/// Pages 0 to 39 written and synced; then one thread rewrites pages 0 to
/// 35 in runs of four with `Writer::write_page` from a page-aligned
/// buffer, in every other round writes one of pages 36 to 39 beside it,
/// and commits: what it wrote is acknowledged once the commit returns.
/// Every fourth round it calls `sync()` instead, whose promise covers the
/// pages the writer has not committed.
fn scoped_large(c: &Ctx) -> Result<(), String> {
    let f = c.open()?;
    for p in 0..40 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    let ps = c.ps() as usize;
    let mut w = f.writer();
    let mut buf = pagewriter::buffer::AlignedBuf::zeroed(4 * ps, 4096)
        .ok_or_else(|| "no memory for a buffer".to_string())?;
    for i in 0..20u64 {
        let first = (i % 9) * 4;
        let mut floors = c.stage_run(&mut buf, first)?;
        w.write_page(first * c.ps(), &buf)
            .map_err(|e| format!("write_page of a run: {e}"))?;
        if i % 2 == 0 {
            let single = 36 + i % 4;
            floors.push((single, c.write_via(&mut w, single)?));
        }
        if i % 4 == 3 {
            c.sync(&f)?;
            w.commit().map_err(|e| format!("commit after sync: {e}"))?;
        } else {
            w.commit().map_err(|e| format!("commit: {e}"))?;
            c.ack(floors)?;
        }
    }
    f.close().map_err(|e| format!("close: {e}"))
}

/// 48 pages reserved with `fallocate` (the file created by an open
/// first, reopened after: the open reads the unwritten space); then one
/// writer writes eleven four-page runs there, a page of the last four
/// beside every other run, and commits after each.
fn scoped_large_preallocated(c: &Ctx) -> Result<(), String> {
    reserve(c, 48)?;
    large_runs(c, |i| 44 + i % 4)
}

/// One writer on an empty file appends eleven four-page runs (each grows
/// the file), a page just past the run beside every other one (the next
/// run covers it), and commits after each.
fn scoped_large_growing(c: &Ctx) -> Result<(), String> {
    large_runs(c, |i| i * 4 + 4)
}

/// The file created (and its directory entry synced) by an open, then
/// `pages` pages reserved with `fallocate` and made durable: unwritten
/// extents the next open finds.
fn reserve(c: &Ctx, pages: u64) -> Result<(), String> {
    c.open()?.close().map_err(|e| format!("close: {e}"))?;
    let reserve = || {
        let be = FileBackend::open(&c.path)?;
        be.allocate(0, pages * c.ps())?;
        be.sync_data()
    };
    reserve().map_err(|e| format!("fallocate: {e}"))
}

/// One writer, on the file as it is: eleven four-page runs from page 0,
/// each written from an aligned buffer with `write_page`, the buffered
/// page `single(i)` beside every other run, a commit after each run
/// (acknowledged).
fn large_runs(c: &Ctx, single: impl Fn(u64) -> u64) -> Result<(), String> {
    let f = c.open()?;
    let ps = c.ps() as usize;
    let mut w = f.writer();
    let mut buf = pagewriter::buffer::AlignedBuf::zeroed(4 * ps, 4096)
        .ok_or_else(|| "no memory for a buffer".to_string())?;
    for i in 0..11u64 {
        let first = i * 4;
        let mut floors = c.stage_run(&mut buf, first)?;
        w.write_page(first * c.ps(), &buf)
            .map_err(|e| format!("write_page of a run: {e}"))?;
        if i % 2 == 0 {
            let page = single(i);
            floors.push((page, c.write_via(&mut w, page)?));
        }
        w.commit().map_err(|e| format!("commit: {e}"))?;
        c.ack(floors)?;
    }
    f.close().map_err(|e| format!("close: {e}"))
}

/// Pages 0 to 39 written and synced; then three threads commit their own
/// pages (two contiguous ones per commit, ten commits) through writers of
/// their own, while a fourth rewrites page 39 and calls `sync()` ten
/// times: each sync is acknowledged with every page written before it,
/// the pages scoped commits are writing at that moment among them.
fn scoped_claimed(c: &Ctx) -> Result<(), String> {
    let f = c.open()?;
    for p in 0..40 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    on_threads(4, |t| {
        if t == 3 {
            for _ in 0..10 {
                c.write(&f, 39)?;
                c.sync(&f)?;
            }
            return Ok(());
        }
        let mut w = f.writer();
        for i in 0..10u64 {
            let first = 1 + t * 12 + (i % 6) * 2;
            let a = c.write_via(&mut w, first)?;
            let b = c.write_via(&mut w, first + 1)?;
            w.commit().map_err(|e| format!("commit: {e}"))?;
            c.ack(vec![(first, a), (first + 1, b)])?;
        }
        Ok(())
    })?;
    f.close().map_err(|e| format!("close: {e}"))
}

/// The three scoped committers of [`scoped_tickets`] on an empty file:
/// commits whose pages reach past the file's length on disk grow it,
/// beside commits of pages other flushes brought inside it.
fn scoped_growing(c: &Ctx) -> Result<(), String> {
    let f = c.open()?;
    on_threads(3, |t| scoped_commits(c, &f, t))?;
    f.close().map_err(|e| format!("close: {e}"))
}

/// The file created (and its directory entry synced) by an open, then
/// 48 pages reserved with `fallocate` and pages 0 to 10 written and
/// synced; reopened, the three scoped committers of [`scoped_tickets`]:
/// the first's pages have data, the others' lie in unwritten extents.
fn scoped_preallocated(c: &Ctx) -> Result<(), String> {
    reserve(c, 48)?;
    let f = c.open()?;
    for p in 0..11 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    f.close().map_err(|e| format!("close: {e}"))?;
    let f = c.open()?;
    on_threads(3, |t| scoped_commits(c, &f, t))?;
    f.close().map_err(|e| format!("close: {e}"))
}

/// One thread: cuts, growths, a discarded page, a close and a reopen, a
/// commit after each.
fn resize_discard_reopen(c: &Ctx) -> Result<(), String> {
    let ps = PS as u64;
    let f = c.open()?;
    for p in 0..16 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    c.tracker
        .resize(8, || f.set_len(8 * ps))
        .map_err(|e| format!("set_len: {e}"))?;
    c.sync(&f)?;
    for p in 10..12 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    c.tracker
        .resize(24, || f.set_len(24 * ps))
        .map_err(|e| format!("set_len: {e}"))?;
    c.sync(&f)?;
    c.write(&f, 3)?;
    c.tracker
        .discard(3, || f.discard(3 * ps, ps))
        .map_err(|e| format!("discard: {e}"))?;
    c.write(&f, 4)?;
    c.sync(&f)?;
    c.tracker
        .resize(6, || f.set_len(6 * ps))
        .map_err(|e| format!("set_len: {e}"))?;
    f.close().map_err(|e| format!("close: {e}"))?;
    c.ack(c.tracker.all_floors())?;
    let f = c.open()?;
    for p in 20..23 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    f.close().map_err(|e| format!("close: {e}"))?;
    c.ack(c.tracker.all_floors())
}

/// `threads` threads rewriting four pages of their own in place,
/// `rounds` times, a `sync` after each round.
fn rewrite_threads(c: &Ctx, threads: u64, rounds: u64) -> Result<(), String> {
    let f = c.open()?;
    on_threads(threads, |t| {
        for _ in 0..rounds {
            for p in t * 4..t * 4 + 4 {
                c.write(&f, p)?;
            }
            c.sync(&f)?;
        }
        Ok(())
    })?;
    f.close().map_err(|e| format!("close: {e}"))
}

/// Two threads append (alternate pages), a `sync` after each append;
/// then a close, a reopen and more appends.
fn appends(c: &Ctx) -> Result<(), String> {
    for pass in 0..2u64 {
        let f = c.open()?;
        on_threads(2, |t| {
            for i in 0..12u64 {
                c.write(&f, pass * 64 + 2 * i + t)?;
                c.sync(&f)?;
            }
            Ok(())
        })?;
        f.close().map_err(|e| format!("close: {e}"))?;
    }
    Ok(())
}

/// Runs `body(t)` on `n` threads (`t` in `0..n`) and returns the first
/// error in thread order (a panic is one); every thread is joined.
pub(crate) fn on_threads(
    n: u64,
    body: impl Fn(u64) -> Result<(), String> + Sync,
) -> Result<(), String> {
    std::thread::scope(|s| {
        let body = &body;
        let handles: Vec<_> = (0..n).map(|t| s.spawn(move || body(t))).collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().map_err(|_| "a thread panicked".to_string())?)
    })
}

/// Pages 0 to 39 written and synced; then three threads commit their own
/// pages one at a time through writers of their own, and after a few
/// commits the device fails the next cache flush. A commit is acknowledged with its page; once any thread saw a
/// commit fail, no later commit may say Ok (the file is poisoned).
fn scoped_eio(c: &Ctx) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let f = c.open()?;
    for p in 0..40 {
        c.write(&f, p)?;
    }
    c.sync(&f)?;
    let failed = AtomicBool::new(false);
    on_threads(3, |t| {
        let mut w = f.writer();
        for i in 0..20u64 {
            if t == 0 && i == 6 {
                c.faults.lock().unwrap_or_else(|p| p.into_inner()).fsyncs = 1;
            }
            let page = 1 + t * 13 + i % 13;
            let v = match c.write_via(&mut w, page) {
                Ok(v) => v,
                // Refused on a poisoned file: what it must do.
                Err(_) if failed.load(Ordering::Acquire) => continue,
                Err(e) => return Err(e),
            };
            let seen = failed.load(Ordering::Acquire);
            match w.commit() {
                Ok(()) if seen => {
                    return Err(format!(
                        "thread {t}: commit {i} was acknowledged although an earlier one failed"
                    ));
                }
                Ok(()) => c.ack(vec![(page, v)])?,
                Err(_) => failed.store(true, Ordering::Release),
            }
        }
        Ok(())
    })?;
    if !failed.load(Ordering::Acquire) {
        return Err("no commit failed: the device's EIO never reached pagewriter".into());
    }
    if !f.is_poisoned() {
        return Err("a commit failed but the file is not poisoned".into());
    }
    Ok(())
}

/// Which device request the EIO workloads fail.
#[derive(Clone, Copy)]
enum Fail {
    /// The next cache flush (the loop device's PREFLUSH, FUSE `fsync`).
    Flush,
    /// The next three writes (the page cache's write-back of a dirty page, whose
    /// error the kernel reports at the next `fdatasync` and then forgets).
    Write,
}

/// Two threads commit with `sync()`; after a few commits the device fails
/// its next cache flush or write with EIO. Each thread goes on committing
/// after an error: a commit started after any thread saw an error must not
/// be acknowledged (the file is poisoned), which the workload checks here;
/// the replay checks that every commit acknowledged before it is on disk.
fn eio(c: &Ctx, fail: Fail) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let f = c.open()?;
    let failed = AtomicBool::new(false);
    on_threads(2, |t| {
        for i in 0..20u64 {
            if t == 0 && i == 6 {
                let mut faults = c.faults.lock().unwrap_or_else(|p| p.into_inner());
                match fail {
                    Fail::Flush => faults.fsyncs = 1,
                    // Three: the next write may be another
                    // thread's metadata, which btrfs keeps
                    // twice and so survives one failure of.
                    Fail::Write => faults.writes = 3,
                }
            }
            match c.write(&f, 1 + t * 20 + i) {
                Ok(_) => {}
                // Refused on a poisoned file: what it must do.
                Err(_) if failed.load(Ordering::Acquire) => continue,
                Err(e) => return Err(e),
            }
            let seen = failed.load(Ordering::Acquire);
            let floors = c.tracker.all_floors();
            match f.sync() {
                Ok(()) if seen => {
                    return Err(format!(
                        "thread {t}: commit {i} was acknowledged although an earlier one failed"
                    ));
                }
                Ok(()) => c.ack(floors)?,
                Err(_) => failed.store(true, Ordering::Release),
            }
        }
        Ok(())
    })?;
    if !failed.load(Ordering::Acquire) {
        if let Fail::Write = fail {
            // btrfs: the failed writes are counted (its `errs: wr N`) and
            // no fdatasync reports them; the replay then says whether an
            // acknowledged commit lost its pages.
            eprintln!("note: the failed writes reached no commit (every commit Ok)");
            return Ok(());
        }
        return Err("no commit failed: the device's EIO never reached pagewriter".into());
    }
    if !f.is_poisoned() {
        return Err("a commit failed but the file is not poisoned".into());
    }
    Ok(())
}
