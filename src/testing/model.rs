//! Reference-model checking of [`PagedCachedFile`]: run a sequence of
//! operations against a file over [`CrashBackend`] (with [`FaultyBackend`]
//! faults) and against a map of the bytes each page must hold, and report
//! the first disagreement. The proptests (`tests/model.rs`) and the fuzz
//! target (`fuzz/`) both drive [`check`].
//!
//! What is checked, after every operation:
//! - every read returns the model's newest bytes (zeros for pages never
//!   written), however the page got where it is;
//! - a successful `sync` made every page's newest bytes durable;
//! - after a crash (the durable image plus any subset of later writes,
//!   each kept, dropped or torn at 512-byte sectors), every sector of
//!   every page holds bytes of its synced version or of a version written
//!   after that sync: nothing synced is lost, nothing never written shows;
//! - with [`TornWrites::Atomic`] or [`TornWrites::DoubleWrite`], after a
//!   crash (and the recovery pass at reopen) every page holds one version
//!   whole: none is torn ([`check_torn`] counts the torn pages found with
//!   `Allow`, where a crash may tear them);
//! - a failed write leaves the pages readable and a later sync makes them
//!   durable; a failed `fdatasync` poisons the file;
//! - buffered bytes stay within the bound (plus the pages of one write).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::Rng;
use super::{CrashBackend, FaultyBackend, WriteFault};
use crate::backend::AtomicUnit;
use crate::backend::{FileBackend, FlushEngine, StorageBackend};
use crate::cached_file::{Config, GrowAhead, PagedCachedFile, TornWrites};
use crate::error::Error;

/// Pages the model addresses: 0..MAX_PAGES.
pub const MAX_PAGES: u64 = 64;

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `write_page` of `pages` (1..=3) pages from `page`.
    Write {
        /// First page.
        page: u64,
        /// Page count.
        pages: u64,
    },
    /// `write` guard over one page, incrementing one byte.
    Guard {
        /// Page.
        page: u64,
        /// Byte to change (taken modulo the page size).
        byte: usize,
    },
    /// `read` of `pages` pages from `page`.
    Read {
        /// First page.
        page: u64,
        /// Page count.
        pages: u64,
    },
    /// `flush`.
    Flush,
    /// `sync`.
    Sync,
    /// The next write call fails this way.
    FailNextWrite(WriteFault),
    /// The next `fdatasync` fails (and, as on Linux, forgets the unsynced
    /// writes it could not write back).
    FailNextSync,
    /// Power cut now, then reopen; `seed` picks which unsynced writes
    /// survive.
    Crash {
        /// Seed of the surviving subset.
        seed: u64,
    },
    /// `close`, then reopen.
    Close,
    /// `set_len` to `pages` whole pages (taken modulo `MAX_PAGES + 1`):
    /// pages past it read as zeros from then on, and the next successful
    /// `sync` makes the length durable.
    SetLen {
        /// New length in pages.
        pages: u64,
    },
    /// A scoped transaction: a new [`Writer`](crate::Writer) writes
    /// `pages` (1..=3) pages from `page`, then commits (`Writer::commit`),
    /// or with `ticket` starts the commit (`Writer::commit_async`) and
    /// keeps its ticket for a later [`Op::WaitTicket`]. When the commit
    /// (or its ticket) says Ok, those pages are durable at the versions
    /// written or later ones; nothing is promised of other pages.
    Scoped {
        /// First page.
        page: u64,
        /// Page count.
        pages: u64,
        /// Commit asynchronously.
        ticket: bool,
    },
    /// A scoped transaction in one call: a new [`Writer`](crate::Writer)'s
    /// `write_and_commit` of `pages` (1..=3) pages from `page`. When it
    /// says Ok, those pages are durable at the versions written or later
    /// ones. On an error a read tells which pages the write took (they
    /// count as written, as a failed commit's pages do).
    Through {
        /// First page.
        page: u64,
        /// Page count.
        pages: u64,
    },
    /// `sync_async`: a ticket for everything written so far.
    SyncAsync,
    /// Waits for the oldest ticket kept (nothing without one).
    WaitTicket,
}

/// The file's settings for a run.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Engine (the memory-backed model has no file descriptor, so io_uring
    /// runs as its reported `Auto` fallback).
    pub engine: FlushEngine,
    /// Page size in bytes (power of two, at least 512).
    pub page_size: usize,
    /// Write buffer bound in pages.
    pub buffer_pages: usize,
    /// Read cache in pages (0: off).
    pub cache_pages: usize,
    /// Lock stripes.
    pub stripes: usize,
    /// `None`: the file lives in a [`CrashBackend`] (crashes simulated;
    /// io_uring runs as its reported fallback, having no descriptor).
    /// `Some(dir)`: a real file in `dir` (io_uring runs for real; `Crash`
    /// ops are skipped, durability is checked by reading the file after a
    /// successful `fdatasync`).
    pub dir: Option<PathBuf>,
    /// With `dir`: open the real file with `O_DIRECT`
    /// ([`FileBackend::open_direct`]), so the aligned write paths and the
    /// preallocation of a growing file run too. Ignored without `dir`.
    pub direct: bool,
    /// [`Config::torn_writes`]. In memory, the file takes atomic writes of
    /// [`MODEL_ATOMIC_UNIT`] and has a doublewrite area beside it (a
    /// second [`CrashBackend`], crashed with the file); on a real file
    /// only `Allow` runs (other modes are skipped: `check` returns `Ok`).
    pub torn_writes: TornWrites,
    /// [`Config::grow_ahead`]'s window in bytes (`None`: off); only with
    /// `TornWrites::Allow` (other modes run without it). A crash image
    /// is reopened and must hold the length of the last successful sync
    /// or one set since, never more: the window and its trailer never
    /// count as data.
    pub grow_ahead: Option<u64>,
}

/// The atomic write unit of the model's in-memory file: 512 B to 8 KiB,
/// so runs of the model's pages are cut into several atomic pieces.
pub const MODEL_ATOMIC_UNIT: AtomicUnit = AtomicUnit {
    min: 512,
    max: 8192,
    segments_max: 1,
    device_max: 8192,
};

impl ModelConfig {
    fn config(&self) -> Config {
        Config::default()
            .engine(self.engine)
            .page_size(self.page_size)
            .max_write_buffer_bytes(self.buffer_pages.max(1) * self.page_size)
            .read_cache_bytes(self.cache_pages * self.page_size)
            .stripes(self.stripes)
            .torn_writes(self.torn_writes)
            .grow_ahead(match self.grow_ahead {
                Some(bytes) if self.torn_writes == TornWrites::Allow => GrowAhead::Window { bytes },
                _ => GrowAhead::Off,
            })
            .max_run_pages(5)
    }
}

/// The bytes of version `version` of page `page`: every 512-byte sector
/// distinct, so a torn page shows which version each sector came from.
pub fn page_bytes(page_size: usize, page: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; page_size];
    Rng::new(page.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_add(1)).fill(&mut v);
    v
}

enum Store {
    /// The file and its doublewrite area.
    Memory(Arc<CrashBackend>, Arc<CrashBackend>),
    File(PathBuf),
}

impl Store {
    /// What survives a crash now (memory) or what the file holds (file;
    /// called after a successful fdatasync).
    fn durable_image(&self) -> Result<Vec<u8>, String> {
        match self {
            Store::Memory(c, _) => Ok(c.durable_image()),
            Store::File(p) => std::fs::read(p).map_err(|e| format!("read back: {e}")),
        }
    }
}

struct World {
    store: Store,
    faulty: Arc<FaultyBackend<Arc<dyn StorageBackend>>>,
    file: PagedCachedFile,
}

/// A ticket kept by the model, with the versions its commit promises
/// (page, version number).
struct Pending {
    ticket: crate::CommitTicket,
    promised: Vec<(u64, u64)>,
}

fn open(store: Store, cfg: &ModelConfig) -> Result<World, String> {
    let (inner, engine): (Arc<dyn StorageBackend>, FlushEngine) = match &store {
        Store::Memory(c, _) => {
            let engine = match cfg.engine {
                FlushEngine::IoUring { queue_depth } => FlushEngine::Auto { queue_depth },
                e => e,
            };
            (Arc::clone(c) as Arc<dyn StorageBackend>, engine)
        }
        Store::File(p) => {
            let be = if cfg.direct {
                FileBackend::open_direct(p).map_err(|e| format!("open file O_DIRECT: {e}"))?
            } else {
                FileBackend::open(p).map_err(|e| format!("open file: {e}"))?
            };
            (Arc::new(be) as Arc<dyn StorageBackend>, cfg.engine)
        }
    };
    let faulty = Arc::new(FaultyBackend::new(inner));
    let mut c = cfg.config();
    c.engine = engine;
    let file = match &store {
        Store::Memory(_, area) => {
            PagedCachedFile::with_doublewrite(Arc::clone(&faulty), Arc::clone(area) as _, c)
        }
        Store::File(_) => PagedCachedFile::new(Arc::clone(&faulty), c),
    }
    .map_err(|e| format!("open: {e}"))?;
    Ok(World {
        store,
        faulty,
        file,
    })
}

#[derive(Default)]
struct Model {
    newest: BTreeMap<u64, Vec<u8>>,
    durable: BTreeMap<u64, Vec<u8>>,
    /// Versions written since the last successful sync, per page.
    since: BTreeMap<u64, Vec<Vec<u8>>>,
    /// The number of each entry of `since` (written versions are numbered
    /// in write order: bytes alone are ambiguous, a cut page's zeros
    /// repeat).
    since_ids: BTreeMap<u64, Vec<u64>>,
    /// Numbers written versions.
    next_id: u64,
    poisoned: bool,
    version: u64,
    /// Pages found torn after crashes (`Allow` only; an error otherwise).
    torn: u64,
    /// The file's length at the last successful sync.
    durable_len: u64,
    /// The lengths the file had since (after each write and `set_len`):
    /// a crash may leave any length between the least and the greatest
    /// of these and `durable_len`, and no other.
    lens_since: Vec<u64>,
    /// Tickets of asynchronous commits, oldest first.
    tickets: std::collections::VecDeque<Pending>,
    /// An asynchronous commit started: the file's syncer thread makes
    /// `fdatasync`s between operations, and one that fails poisons the
    /// file outside any operation.
    syncer: bool,
}

impl Model {
    fn expect(&self, page: u64, ps: usize) -> Vec<u8> {
        self.newest
            .get(&page)
            .cloned()
            .unwrap_or_else(|| vec![0; ps])
    }

    /// A write of `pages` pages (1..=3, clipped at the last page) from
    /// `page` (taken modulo `MAX_PAGES`): the first page and each page's
    /// bytes at a new version.
    fn next_versions(&mut self, ps: usize, page: u64, pages: u64) -> (u64, Vec<Vec<u8>>) {
        let pages = pages.clamp(1, 3).min(MAX_PAGES - page % MAX_PAGES);
        let page = page % MAX_PAGES;
        self.version += 1;
        let versions = (0..pages)
            .map(|i| page_bytes(ps, page + i, self.version))
            .collect();
        (page, versions)
    }

    fn write(&mut self, page: u64, bytes: Vec<u8>) {
        self.since.entry(page).or_default().push(bytes.clone());
        self.next_id += 1;
        self.since_ids.entry(page).or_default().push(self.next_id);
        self.newest.insert(page, bytes);
    }

    /// The number of `page`'s newest version, if it is not durable yet.
    fn newest_id(&self, page: u64) -> Option<u64> {
        self.since_ids.get(&page).and_then(|v| v.last().copied())
    }

    /// A scoped commit (or its ticket) made version `id` of `page`
    /// durable: it, or a later version, is what the page holds after a
    /// crash. Raises the page's durable version to it if it is one of the
    /// versions written since (never lowers it: a later sync may have gone
    /// past).
    fn durable_at_least(&mut self, page: u64, id: u64) {
        let (Some(since), Some(ids)) = (self.since.get_mut(&page), self.since_ids.get_mut(&page))
        else {
            return;
        };
        if let Some(i) = ids.iter().position(|&x| x == id) {
            let v = since[i].clone();
            since.drain(..=i);
            ids.drain(..=i);
            self.durable.insert(page, v);
        }
    }

    fn synced(&mut self, len: u64) {
        self.durable = self.newest.clone();
        self.since.clear();
        self.since_ids.clear();
        self.durable_len = len;
        self.lens_since.clear();
    }

    /// The lengths a crash may leave: `durable_len` to the largest length
    /// since, or down to the least (a cut since).
    fn crash_lens(&self) -> (u64, u64) {
        let lo = self
            .lens_since
            .iter()
            .copied()
            .fold(self.durable_len, u64::min);
        let hi = self
            .lens_since
            .iter()
            .copied()
            .fold(self.durable_len, u64::max);
        (lo, hi)
    }
}

/// Runs `ops` on a fresh file and checks it against the model. `Err` names
/// the first operation (by index) whose outcome the model does not allow.
pub fn check(cfg: &ModelConfig, ops: &[Op]) -> Result<(), String> {
    check_torn(cfg, ops).map(|_| ())
}

/// A fresh in-memory file for `cfg` (with its atomic unit where asked).
fn crash_file(cfg: &ModelConfig, image: &[u8]) -> Arc<CrashBackend> {
    let be = CrashBackend::from_image(image);
    Arc::new(match cfg.torn_writes {
        TornWrites::Atomic | TornWrites::Auto => be.with_atomic_unit(MODEL_ATOMIC_UNIT),
        _ => be,
    })
}

/// As [`check`]; returns how many pages crash images held torn (part one
/// version, part another) after recovery: 0 unless `cfg.torn_writes` is
/// `Allow` (in the other modes a torn page is an `Err`).
pub fn check_torn(cfg: &ModelConfig, ops: &[Op]) -> Result<u64, String> {
    let ps = cfg.page_size;
    let store = match &cfg.dir {
        None => Store::Memory(crash_file(cfg, &[]), Arc::new(CrashBackend::new())),
        Some(_) if cfg.torn_writes != TornWrites::Allow => return Ok(0),
        Some(dir) => {
            let path = dir.join("model.pw");
            let _ = std::fs::remove_file(&path);
            Store::File(path)
        }
    };
    let mut w = open(store, cfg)?;
    let mut m = Model::default();
    let bound = cfg.buffer_pages.max(1) * ps + 3 * ps;
    for (i, op) in ops.iter().enumerate() {
        step(cfg, &mut w, &mut m, op).map_err(|e| format!("op {i} {op:?}: {e}"))?;
        m.lens_since.push(w.file.len());
        let buffered = w.file.stats().buffered_bytes as usize;
        // A write through that failed while the committer thread's failed
        // `fdatasync` poisoned the file puts its pages into the buffer past
        // the bound (making room failed; they must not be lost). Nothing
        // new enters a poisoned file after it: one call's pages at most.
        let bound = bound + if w.file.is_poisoned() { 3 * ps } else { 0 };
        if buffered > bound {
            return Err(format!(
                "op {i} {op:?}: buffered {buffered} B over bound {bound} B"
            ));
        }
    }
    Ok(m.torn)
}

fn step(cfg: &ModelConfig, w: &mut World, m: &mut Model, op: &Op) -> Result<(), String> {
    let ps = cfg.page_size;
    let at = |p: u64| p * ps as u64;
    let mutation_result = |r: crate::Result<()>, m: &mut Model| -> Result<bool, String> {
        match r {
            Ok(()) if m.poisoned => Err("succeeded on a poisoned file".into()),
            Ok(()) => Ok(true),
            Err(Error::Poisoned) if m.poisoned => Ok(false),
            // Grow-ahead moving its trailer syncs inside a flush: its
            // failure poisons the file as a commit's does.
            // Grow-ahead moving its trailer, or the syncer thread of an
            // asynchronous commit, made the fdatasync that failed.
            Err(Error::Poisoned)
                if (cfg.grow_ahead.is_some() || m.syncer) && w.file.is_poisoned() =>
            {
                m.poisoned = true;
                Ok(false)
            }
            // A flush's or a cut's own fdatasync (grow-ahead moving its
            // trailer, a cut with a doublewrite area) failed: the file is
            // poisoned as after a commit's.
            Err(Error::Io {
                op: "fdatasync", ..
            }) if !m.poisoned => {
                if !w.file.is_poisoned() {
                    return Err("failed fdatasync did not poison the file".into());
                }
                m.poisoned = true;
                Ok(false)
            }
            // A write fault reaching a backpressure flush, or the flush.
            Err(Error::Io { .. } | Error::PagesFailed { .. }) if !m.poisoned => Ok(false),
            Err(e) => Err(format!("unexpected error {e}")),
        }
    };
    match *op {
        Op::Write { page, pages } => {
            let (page, versions) = m.next_versions(ps, page, pages);
            if mutation_result(w.file.write_page(at(page), &versions.concat()), m)? {
                for (i, v) in versions.into_iter().enumerate() {
                    m.write(page + i as u64, v);
                }
            }
        }
        Op::Guard { page, byte } => {
            let page = page % MAX_PAGES;
            match w.file.write(at(page), ps) {
                Ok(mut g) => {
                    if m.poisoned {
                        return Err("guard on a poisoned file".into());
                    }
                    let want = m.expect(page, ps);
                    if g[..] != want[..] {
                        return Err(format!(
                            "guard on page {page} does not hold the newest bytes"
                        ));
                    }
                    let b = byte % ps;
                    g[b] = g[b].wrapping_add(1);
                    let mut next = want;
                    next[b] = next[b].wrapping_add(1);
                    drop(g);
                    m.write(page, next);
                }
                Err(e) => {
                    mutation_result(Err(e), m)?;
                }
            }
        }
        Op::Read { page, pages } => {
            let page = page % MAX_PAGES;
            let pages = pages.clamp(1, 3);
            let len_pages = w.file.len().div_ceil(ps as u64);
            match w.file.read(at(page), pages as usize * ps) {
                Ok(got) => {
                    for i in 0..pages {
                        let want = m.expect(page + i, ps);
                        let s = i as usize * ps;
                        if got[s..s + ps] != want[..] {
                            return Err(format!(
                                "page {} does not read as its newest bytes",
                                page + i
                            ));
                        }
                    }
                }
                Err(Error::OutOfBounds { .. }) if page + pages > len_pages => {}
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
        Op::Flush => {
            mutation_result(w.file.flush(), m)?;
        }
        Op::SetLen { pages } => {
            let pages = pages % (MAX_PAGES + 1);
            // Attempted, even if it fails: like a failed write's bytes, a
            // crash may show it (an extending write that failed partway).
            m.lens_since.push(at(pages));
            // A cut with a doublewrite area (or a grow-ahead window) syncs
            // the file: a failed fdatasync poisons it, and nothing was cut
            // (`mutation_result`).
            let before = w.file.len();
            let r = w.file.set_len(at(pages));
            // With a grow-ahead window the cut is made, then synced: a
            // failed fdatasync poisons the file after the cut (`len`
            // shows it).
            let cut_then_failed = r.is_err() && at(pages) < before && w.file.len() == at(pages);
            if mutation_result(r, m)? || cut_then_failed {
                let cut: Vec<u64> = m.newest.range(pages..).map(|(&p, _)| p).collect();
                for p in cut {
                    m.write(p, vec![0; ps]);
                }
            }
        }
        Op::Sync => {
            let r = w.file.sync();
            sync_outcome(cfg, w, m, r)?;
        }
        Op::FailNextWrite(fault) => w.faulty.schedule_writes([fault]),
        Op::FailNextSync => match &w.store {
            Store::Memory(c, _) => c.schedule_syncs([true]),
            Store::File(_) => w.faulty.schedule_syncs([Some(libc::EIO)]),
        },
        Op::Crash { seed } => {
            let Store::Memory(c, area) = &w.store else {
                // A real file cannot lose power here.
                return Ok(());
            };
            // Tickets resolved before the power cut promise their pages
            // in every image it can leave; the others are lost with the
            // process (their pages may or may not have made it).
            for Pending { ticket, promised } in std::mem::take(&mut m.tickets) {
                if ticket.is_durable() {
                    for &(p, id) in &promised {
                        m.durable_at_least(p, id);
                    }
                }
            }
            // One instant for both files: a committer still running may
            // sync the file and start the area over between two separate
            // images, which no power cut can do.
            let (image, area_image) = c.crash_images_with(area, seed, seed ^ 0x5EED);
            let crash = crash_file(cfg, &image);
            let area = Arc::new(CrashBackend::from_image(&area_image));
            // The reopen runs the doublewrite recovery, which may rewrite
            // pages of the image: check what the file holds after it.
            let next = open(Store::Memory(Arc::clone(&crash), area), cfg)?;
            let old = std::mem::replace(w, next);
            drop(old);
            let image = crash.live_image();
            after_crash(cfg, w, m, &image)?;
        }
        Op::Scoped {
            page,
            pages,
            ticket,
        } => {
            let (page, versions) = m.next_versions(ps, page, pages);
            let mut writer = w.file.writer();
            if !mutation_result(writer.write_page(at(page), &versions.concat()), m)? {
                return Ok(());
            }
            let mut promised: Vec<(u64, u64)> = Vec::new();
            for (i, v) in versions.into_iter().enumerate() {
                let p = page + i as u64;
                m.write(p, v);
                promised.extend(m.newest_id(p).map(|id| (p, id)));
            }
            if ticket {
                match writer.commit_async() {
                    Ok(t) => {
                        m.syncer = true;
                        m.tickets.push_back(Pending {
                            ticket: t,
                            promised,
                        });
                    }
                    Err(e) => {
                        scoped_failed(w, m, e)?;
                    }
                }
            } else {
                let r = writer.commit();
                scoped_outcome(cfg, w, m, r, &promised)?;
            }
        }
        Op::Through { page, pages } => {
            let (page, versions) = m.next_versions(ps, page, pages);
            let new = versions.concat();
            let r = w.file.writer().write_and_commit(at(page), &new);
            // Which pages it took the error does not say (the buffered
            // way's write takes pages one by one, and backpressure may
            // stop it part way): the newest bytes do, page by page (the
            // write's version, or the model's).
            let taken: Vec<bool> = match &r {
                Ok(()) => vec![true; versions.len()],
                Err(_) => {
                    let mut taken = Vec::new();
                    for (i, v) in versions.iter().enumerate() {
                        let p = page + i as u64;
                        taken.push(match w.file.read(at(p), ps) {
                            Ok(got) if got[..] == v[..] => true,
                            Ok(got) if got[..] == m.expect(p, ps)[..] => false,
                            // Past the end: nothing grew the file to it.
                            Err(Error::OutOfBounds { .. }) => false,
                            Ok(_) => {
                                return Err(format!(
                                    "after a failed write_and_commit, page {p} holds neither version"
                                ));
                            }
                            Err(e) => return Err(format!("read after write_and_commit: {e}")),
                        });
                    }
                    taken
                }
            };
            if !taken.contains(&true) {
                mutation_result(r, m)?;
                return Ok(());
            }
            let mut promised: Vec<(u64, u64)> = Vec::new();
            for (i, v) in versions.into_iter().enumerate() {
                let p = page + i as u64;
                if taken[i] {
                    m.write(p, v);
                    promised.extend(m.newest_id(p).map(|id| (p, id)));
                }
            }
            scoped_outcome(cfg, w, m, r, &promised)?;
        }
        Op::SyncAsync => match w.file.sync_async() {
            Ok(t) => {
                m.syncer = true;
                let promised = m
                    .since_ids
                    .iter()
                    .filter_map(|(&p, ids)| ids.last().map(|&id| (p, id)))
                    .collect();
                m.tickets.push_back(Pending {
                    ticket: t,
                    promised,
                });
            }
            Err(e) => scoped_failed(w, m, e)?,
        },
        Op::WaitTicket => {
            if let Some(Pending { ticket, promised }) = m.tickets.pop_front() {
                let r = ticket.wait();
                scoped_outcome(cfg, w, m, r, &promised)?;
            }
        }
        Op::Close => {
            let r = w.file.close();
            let closed = r.is_ok();
            if sync_outcome(cfg, w, m, r)? {
                // The close's commit covered every ticket not resolved
                // yet; one the committer resolved before may have failed
                // on a write (its pages stayed dirty and the close wrote
                // them), never on an fdatasync (the close would have
                // failed, the file poisoned).
                for Pending { ticket, promised } in std::mem::take(&mut m.tickets) {
                    match ticket.wait() {
                        Ok(()) => {}
                        Err(e) if is_write_failure(&e) => {}
                        Err(e) => {
                            return Err(format!("a ticket failed after a successful close: {e}"));
                        }
                    }
                    for &(p, id) in &promised {
                        m.durable_at_least(p, id);
                    }
                }
            }
            if closed {
                let store = match &w.store {
                    Store::Memory(c, a) => Store::Memory(Arc::clone(c), Arc::clone(a)),
                    Store::File(p) => Store::File(p.clone()),
                };
                let next = open(store, cfg)?;
                let old = std::mem::replace(w, next);
                drop(old);
            }
        }
    }
    Ok(())
}

/// Checks the outcome of a scoped commit or a ticket that promised
/// `promised` (page, version number): on Ok, each of those pages holds in the
/// durable image (after recovery, where the mode has one) the version
/// promised or a later one, and counts as durable at it from then on.
fn scoped_outcome(
    cfg: &ModelConfig,
    w: &World,
    m: &mut Model,
    r: crate::Result<()>,
    promised: &[(u64, u64)],
) -> Result<(), String> {
    let ps = cfg.page_size;
    if let Err(e) = r {
        return scoped_failed(w, m, e);
    }
    for &(p, id) in promised {
        m.durable_at_least(p, id);
    }
    let img = durable_view(cfg, w)?;
    for (p, _) in promised {
        let s = (*p as usize * ps).min(img.len());
        let e = (s + ps).min(img.len());
        let mut got = img[s..e].to_vec();
        got.resize(ps, 0);
        let zero = vec![0u8; ps];
        let floor = m.durable.get(p).unwrap_or(&zero);
        let later: &[Vec<u8>] = m.since.get(p).map_or(&[], |v| v.as_slice());
        let whole = *floor == got || later.contains(&got);
        // Where torn pages are allowed, a later write that failed part way
        // may have replaced some sectors of the promised version: each
        // sector holds the promised version or a later one.
        let sectors = cfg.torn_writes == TornWrites::Allow
            && got.chunks(512).enumerate().all(|(k, sector)| {
                let r = k * 512..k * 512 + sector.len();
                floor[r.clone()] == *sector || later.iter().any(|v| v[r.clone()] == *sector)
            });
        if !whole && !sectors {
            return Err(format!(
                "page {p} is not durable at the version a scoped commit promised, or a later one"
            ));
        }
    }
    Ok(())
}

/// A write that failed (its pages stay dirty), not an `fdatasync`.
fn is_write_failure(e: &Error) -> bool {
    match e {
        Error::Io { op, .. } => *op != "fdatasync",
        Error::PagesFailed { .. } => true,
        _ => false,
    }
}

/// A scoped commit, a ticket or `sync_async` that failed: as a failed
/// `sync` (a failed `fdatasync` poisons the file, and what the file
/// refuses after it is refused with `Poisoned`), or a write fault (the
/// committer thread's pass may have met one before the file was poisoned,
/// whenever the model learned of that).
fn scoped_failed(w: &World, m: &mut Model, e: Error) -> Result<(), String> {
    if m.syncer && is_write_failure(&e) {
        return Ok(());
    }
    match e {
        Error::Io {
            op: "fdatasync", ..
        }
        | Error::Poisoned => {
            if !w.file.is_poisoned() {
                return Err(format!("{e} but the file is not poisoned"));
            }
            m.poisoned = true;
            Ok(())
        }
        Error::Io { .. } | Error::PagesFailed { .. } if !m.poisoned => Ok(()),
        e => Err(format!("unexpected error {e}")),
    }
}

/// What the file holds durably, as a reader after a crash would find it.
/// A commit may be durable on the doublewrite area alone, or its length in
/// grow-ahead's trailer: what counts is what recovery makes of the durable
/// images. A real file with a grow-ahead window is longer than its length
/// while open, and its trailer, not `len`, says where the data ends (after
/// a failed `fdatasync` the two differ): recovery reads it.
fn durable_view(cfg: &ModelConfig, w: &World) -> Result<Vec<u8>, String> {
    match &w.store {
        Store::Memory(c, area)
            if cfg.torn_writes == TornWrites::DoubleWrite || cfg.grow_ahead.is_some() =>
        {
            recovered(cfg, &c.durable_image(), &area.durable_image())
        }
        Store::File(_) if cfg.grow_ahead.is_some() => {
            recovered(cfg, &w.store.durable_image()?, &[])
        }
        store => store.durable_image(),
    }
}

/// What a file reopened over `image` with doublewrite area `area` holds
/// after the recovery pass.
fn recovered(cfg: &ModelConfig, image: &[u8], area: &[u8]) -> Result<Vec<u8>, String> {
    let data = crash_file(cfg, image);
    let area = Arc::new(CrashBackend::from_image(area));
    let w = open(Store::Memory(Arc::clone(&data), area), cfg)?;
    drop(w);
    Ok(data.live_image())
}

/// Checks the outcome of `sync` or `close`; returns whether it succeeded.
fn sync_outcome(
    cfg: &ModelConfig,
    w: &World,
    m: &mut Model,
    r: crate::Result<()>,
) -> Result<bool, String> {
    let ps = cfg.page_size;
    match r {
        Ok(()) => {
            if m.poisoned {
                return Err("sync succeeded on a poisoned file".into());
            }
            m.synced(w.file.len());
            let img = durable_view(cfg, w)?;
            // `sync` makes `len()` durable (a real file may be longer on
            // disk: O_DIRECT extends it ahead).
            if matches!(w.store, Store::Memory(..)) && img.len() as u64 != w.file.len() {
                return Err(format!(
                    "length {} B not durable after a successful sync ({} B on disk)",
                    w.file.len(),
                    img.len()
                ));
            }
            for (&p, want) in &m.newest {
                // Zero-padded: after a crash the file may end inside a page.
                let s = (p as usize * ps).min(img.len());
                let e = (s + ps).min(img.len());
                let mut got = img[s..e].to_vec();
                got.resize(ps, 0);
                if got != *want {
                    return Err(format!("page {p} not durable after a successful sync"));
                }
            }
            Ok(true)
        }
        Err(Error::Io {
            op: "fdatasync", ..
        }) => {
            if !w.file.is_poisoned() {
                return Err("failed fdatasync did not poison the file".into());
            }
            m.poisoned = true;
            Ok(false)
        }
        Err(Error::Poisoned) if m.poisoned => Ok(false),
        // Grow-ahead moving its trailer synced inside the commit's flush,
        // and that fdatasync failed.
        Err(Error::Poisoned) if (cfg.grow_ahead.is_some() || m.syncer) && w.file.is_poisoned() => {
            m.poisoned = true;
            Ok(false)
        }
        // A write fault: the failed pages stay dirty, a later sync retries
        // them (the others may be durable already; a crash image may hold
        // either version of a page written since the last good sync).
        Err(Error::Io { .. } | Error::PagesFailed { .. }) if !m.poisoned => Ok(false),
        Err(e) => Err(format!("unexpected error {e}")),
    }
}

/// Checks a crash image against the model sector by sector, then makes the
/// model match what the reopened file holds.
fn after_crash(
    cfg: &ModelConfig,
    w: &mut World,
    m: &mut Model,
    image: &[u8],
) -> Result<(), String> {
    let ps = cfg.page_size;
    let zero = vec![0u8; ps];
    for p in 0..MAX_PAGES {
        let s = p as usize * ps;
        let mut got = vec![0u8; ps];
        if s < image.len() {
            let n = (image.len() - s).min(ps);
            got[..n].copy_from_slice(&image[s..s + n]);
        }
        let synced = m.durable.get(&p).unwrap_or(&zero);
        let later: &[Vec<u8>] = m.since.get(&p).map_or(&[], |v| v.as_slice());
        // After a failed fdatasync, the writes it lost are gone while
        // others since may have stuck (the file system writes back on its
        // own): a page may show what that place held before, such as a
        // grow-ahead trailer since moved on (its zeroing among the lost
        // writes, the trailer that moved it kept).
        let stale_trailer = |sector: &[u8]| {
            m.poisoned
                && cfg.grow_ahead.is_some()
                && sector.starts_with(crate::cached_file::GROW_TRAILER_MAGIC)
        };
        let mut stale = false;
        for (k, sector) in got.chunks(512).enumerate() {
            let r = k * 512..(k * 512 + sector.len());
            let ok = synced[r.clone()] == *sector || later.iter().any(|v| v[r.clone()] == *sector);
            stale |= !ok && stale_trailer(sector);
            if !ok && !stale_trailer(sector) {
                return Err(format!(
                    "after crash, page {p} sector {k} holds bytes of no synced or later version"
                ));
            }
        }
        // Whole: one version in every sector.
        if !stale && got != *synced && !later.contains(&got) {
            if cfg.torn_writes != TornWrites::Allow {
                return Err(format!(
                    "after crash, page {p} is torn (sectors of different versions) with {:?}",
                    cfg.torn_writes
                ));
            }
            m.torn += 1;
        }
        // A page wholly past the end (cut by a durable `set_len`) is gone.
        if (m.durable.contains_key(&p) && s < image.len()) || got != zero {
            m.newest.insert(p, got);
        } else {
            m.newest.remove(&p);
        }
    }
    let (lo, hi) = m.crash_lens();
    let len = w.file.len();
    // After a failed fdatasync (poisoned) the writes it dropped are gone
    // while the size they made may have stuck: a grow-ahead window's end
    // can then come back as the length, its trailer lost (zeros past the
    // data). Checked only while nothing has failed.
    if !m.poisoned && (len > hi || len < lo) {
        return Err(format!(
            "after crash the file is {len} B long: not the length of the last sync or one set since ({lo}..={hi} B)"
        ));
    }
    m.synced(len);
    m.poisoned = false;
    // The reopened file reads what the image holds.
    for (&p, want) in &m.newest {
        let got = w
            .file
            .read(p * ps as u64, ps)
            .map_err(|e| format!("read after crash: {e}"))?;
        if got[..] != want[..] {
            return Err(format!("page {p} reads differently from the crash image"));
        }
    }
    Ok(())
}
