//! Writes through: a scoped commit of whole pages that no one else holds
//! writes the caller's bytes straight to disk (one `pwrite` from the
//! caller's buffer, no copy into the write buffer, no drain), then needs
//! an `fdatasync` that began after that write (`Durability::sync_to`), as
//! any scoped commit does. `Writer::write_and_commit` takes this way when
//! it can and the buffered way otherwise. A `Writer`'s large writes take
//! the write half alone ([`write`]) and leave the `fdatasync` to its next
//! commit.
//!
//! `Writer::commit` writes its buffered pages the same way where it can
//! ([`commit_buffered`]): it claims their dirty versions out of the write
//! buffer (the claim holds the page, so reads find it there), writes them
//! from the buffer with one call per run on its own thread, and releases
//! them to the read cache: no drain lock and no generation, which every
//! other commit would contend on. What waits for such a claim: a writer
//! of the page (as for any claim), a `sync()` or flush whose drain meets
//! it (it must cover the page, written before it was called), and a
//! scoped drain holding the page in its scope (`WriteBuffer::wait_claims`);
//! a failed write puts the pages back in `dirty`, and whoever waited
//! drains again.
//!
//! Owns: the gate between writes through and cuts ([`ThroughGate`]).
//! Calls: the write buffer (claims: `WriteBuffer::claim_through`), the
//! lengths, the unwritten pages, the backend's write and the durability
//! watermark.
//!
//! Lock order: the gate's lock is a leaf, taken alone or (by a cut) under
//! the drain lock; a cut waits there for the passes in flight, so a pass
//! holder never takes the drain lock (it drops the pass before anything
//! that could: making room after a failed write, the `fdatasync`).
//!
//! Why it is safe to skip the buffer, each by a check made before the
//! write:
//! - no other version of the pages is buffered, in flight, guarded or
//!   being written through (the claim, all or nothing), and until the
//!   claim is released no one reads or writes them: readers and writers
//!   wait, so no read meets bytes the write is changing, and no newer
//!   version can be written before this one;
//! - `write_and_commit`'s pages lie inside the file's length on disk, in
//!   space holding data (not `Unwritten`): the write changes no size and
//!   allocates nothing (a commit that allocates is grouped, see
//!   `Writer::commit`). A writer's large write, where no such grouped
//!   commit is under way, goes into unwritten space too
//!   ([`Allocating::Write`]) and past the end ([`Allocating::Grow`], with
//!   the drain lock held across it and the lengths grown once it
//!   completed): a lone writer's commit gains nothing from a group, and
//!   the `fdatasync` begun after the write commits the allocation and the
//!   new size with the data;
//! - no cut runs meanwhile: a write through passes the [`ThroughGate`],
//!   which a shrinking `set_len` closes and waits to empty before its
//!   `ftruncate` (a write landing after the cut would grow the file
//!   again);
//! - no torn-page protection and no grow-ahead window is configured
//!   (both need the buffered path's records and trailer);
//! - under `O_DIRECT` the caller's buffer meets the memory alignment.
//!
//! A failed write puts the pages into the write buffer from the caller's
//! bytes before the claim is released, so reads see them and the
//! writer's next commit writes them again (as a failed flush requeues);
//! it waits for room first, as a write does, and goes past the bound only
//! if making room failed too.

use std::io::IoSlice;
use std::ops::Range;
use std::sync::Arc;

use super::file_size::FileSize;
use super::flush::FlushPipeline;
use super::gather::{GatherBuf, write_run};
use super::pages::PageRef;
use super::parts::Parts;
use super::stats::{add, add_elapsed};
use crate::coalesce::{Run, RunLimits, coalesce};
use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex, MutexGuard};

/// Writes through in flight and whether a cut holds them off (see the
/// module docs).
pub(crate) struct ThroughGate {
    state: Mutex<Gate>,
    /// Notified when the last write through in flight leaves.
    empty: Condvar,
}

#[derive(Default)]
struct Gate {
    /// Writes through between [`ThroughGate::enter`] and the drop of
    /// their pass.
    in_flight: usize,
    /// A cut is waiting or running: no write through enters.
    cutting: bool,
}

/// A write through's way past the gate; leaves it when dropped.
pub(crate) struct ThroughPass<'a>(&'a ThroughGate);

/// A cut's hold on the gate: no write through is in flight or enters
/// until it is dropped.
pub(crate) struct CutHold<'a>(&'a ThroughGate);

impl ThroughGate {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(Gate::default()),
            empty: Condvar::new(),
        }
    }

    /// A pass for one write through; `None` while a cut holds the gate
    /// (the commit then takes the buffered way).
    pub(crate) fn enter(&self) -> Option<ThroughPass<'_>> {
        let mut g = self.state.lock();
        if g.cutting {
            return None;
        }
        g.in_flight += 1;
        Some(ThroughPass(self))
    }

    /// Closes the gate and waits until no write through is in flight (a
    /// write through never waits for a cut, so this ends).
    pub(crate) fn hold_for_cut(&self) -> CutHold<'_> {
        let mut g = self.state.lock();
        g.cutting = true;
        while g.in_flight > 0 {
            self.empty.wait(&mut g);
        }
        CutHold(self)
    }
}

impl Drop for ThroughPass<'_> {
    fn drop(&mut self) {
        let mut g = self.0.state.lock();
        g.in_flight -= 1;
        if g.in_flight == 0 {
            self.0.empty.notify_all();
        }
    }
}

impl Drop for CutHold<'_> {
    fn drop(&mut self) {
        self.0.state.lock().cutting = false;
    }
}

/// What a write through did.
pub(crate) enum Through {
    /// Written and durable: the commit is done.
    Done,
    /// Not taken (a check failed, nothing changed): commit the buffered
    /// way.
    Declined,
}

/// A scoped commit of `buf` (whole pages) at `offset` written through (see
/// the module docs), passing `gate`; [`Through::Declined`] where a check
/// fails. `failed_pages` receives the page numbers of a failed write,
/// which go into the write buffer (the writer's next commit covers them)
/// once `room` (backpressure, as a write's) made room for them, or past
/// the bound if it failed.
///
/// Errors: [`Error::PagesFailed`] with op "pwrite" (the pages stay dirty);
/// an `fdatasync` failure as `Writer::commit` reports it (the file is
/// poisoned).
pub(crate) fn commit(
    p: &Parts<'_>,
    gate: &ThroughGate,
    offset: u64,
    buf: &[u8],
    failed_pages: &mut Vec<u64>,
    room: &dyn Fn() -> Result<()>,
) -> Result<Through> {
    let step = match write(
        p,
        gate,
        offset,
        buf,
        failed_pages,
        room,
        Allocating::Decline,
    )? {
        Written::Declined => return Ok(Through::Declined),
        Written::Requeued(e) => return Err(e),
        Written::At(step) => step,
    };
    p.durability.sync_to_own(step)?;
    add(&p.counters.commits, 1);
    add(&p.counters.through_commits, 1);
    Ok(Through::Done)
}

/// Whether a write through may allocate: go into space unwritten on disk
/// ([`Unwritten`](super::unwritten::Unwritten): holes and unwritten
/// extents) or past the file's length on disk, where its `fdatasync` also
/// commits the allocation (and the new size).
pub(crate) enum Allocating<'a> {
    /// Declined there: the commit is made the grouped way.
    Decline,
    /// Written into unwritten space too (the pages count as written from
    /// then on); declined past the length on disk.
    Write,
    /// As `Write`, and past the length on disk too, with the flush
    /// pipeline's drain lock (taken before the pass: a cut holds it while
    /// it waits for passes). It is held across the write: the size the
    /// flushes know (`FileSize::os_len`) follows the write before any
    /// flush compares a length with it, and a failed write that grew the
    /// file is cut back as a flush's is.
    Grow(MutexGuard<'a, FileSize>, &'a FlushPipeline),
}

/// What the write half of a write through did.
pub(crate) enum Written {
    /// Written: durable once an `fdatasync` covers this `write_seq` step
    /// (`Durability::sync_to_own`).
    At(u64),
    /// Not taken (a check failed, nothing changed): write the buffered
    /// way.
    Declined,
    /// The write failed (the error, op "pwrite"), and the caller's bytes
    /// went into the write buffer as the pages' dirty versions: a later
    /// commit writes them again.
    Requeued(Error),
}

/// The write half of [`commit`]: `buf` (whole pages) at `offset` written
/// straight from the caller's buffer under the same checks, with no
/// `fdatasync`. `Writer::write_page` takes it for large writes, and its
/// commit then needs an `fdatasync` covering the step. `allocating`:
/// whether it may write space unwritten on disk (those pages count as
/// written once it did) and past the file's length on disk
/// ([`Allocating`]).
///
/// Errors: [`Error::PagesFailed`] with op "pwrite" where the write failed
/// and there was no memory to keep the caller's bytes (the pages hold
/// whatever the disk has; `failed_pages` names them).
pub(crate) fn write(
    p: &Parts<'_>,
    gate: &ThroughGate,
    offset: u64,
    buf: &[u8],
    failed_pages: &mut Vec<u64>,
    room: &dyn Fn() -> Result<()>,
    allocating: Allocating<'_>,
) -> Result<Written> {
    let ps = p.config.page_size as u64;
    let len = buf.len() as u64;
    if len == 0 || !offset.is_multiple_of(ps) || !len.is_multiple_of(ps) {
        return Ok(Written::Declined);
    }
    if let Some(a) = p.backend.dio_align()
        && !(buf.as_ptr() as usize).is_multiple_of(a.memory.max(1) as usize)
    {
        return Ok(Written::Declined);
    }
    let Some(end) = offset.checked_add(len) else {
        return Ok(Written::Declined);
    };
    let Some(pass) = gate.enter() else {
        return Ok(Written::Declined);
    };
    // Inside the file's length on disk (else only with the drain lock,
    // `Allocating::Grow`) and in space holding data (else only where it
    // may allocate): only a cut lowers these lengths, and none runs while
    // the pass is held.
    let inside = p.length.get().min(p.length.disk()).min(p.length.written());
    let pages: Range<u64> = offset / ps..end / ps;
    let (may_allocate, mut grow) = match allocating {
        Allocating::Decline => (false, None),
        Allocating::Write => (true, None),
        Allocating::Grow(size, flush) => (true, Some((size, flush))),
    };
    if (end > inside && grow.is_none()) || p.length.check_max(offset, len).is_err() {
        return Ok(Written::Declined);
    }
    let unwritten = p.unwritten.touches_range(pages.clone());
    if unwritten && !may_allocate {
        return Ok(Written::Declined);
    }
    if !p.buffer.claim_through(pages.clone(), p.cache) {
        return Ok(Written::Declined);
    }
    // Under the model check, others may run between the claim and the
    // write (a real write takes long enough for them to).
    crate::sync::io_point();
    let started = std::time::Instant::now();
    let written = p.backend.write_all_at(offset, buf);
    add_elapsed(&p.counters.write_ns, started);
    add(&p.counters.write_calls, 1);
    if let Err(e) = written {
        if let Some((mut size, flush)) = grow.take() {
            // A write past the end that failed partway may have grown
            // the file: cut back to what completed writes left, as after
            // a flush's failed write (now, or by the next holder of the
            // drain lock once no write is in flight). The drain lock goes
            // before making room, which may flush.
            flush
                .cut_pending
                .store(true, std::sync::atomic::Ordering::Release);
            flush.cut_back_if_idle(p, &mut size);
        }
        return keep_failed(p, pass, buf, pages, failed_pages, room, e);
    }
    if let Some((size, _)) = grow.as_mut() {
        // The file holds `end` bytes at least now; readers waiting for
        // the claim find them on disk, and the length counts as written
        // by the step below.
        size.expect_end(end);
        p.length.grow_written(end);
        p.length.grow_disk(end);
        p.length.grow(end);
    }
    let step = p.durability.step();
    add(&p.counters.runs, 1);
    add(&p.counters.pages_written, pages.end - pages.start);
    add(&p.counters.bytes_written, len);
    if unwritten {
        // A hint (see `Unwritten`): the commit's `fdatasync` makes the
        // allocation durable with the data.
        p.unwritten.written_range(pages.clone());
    }
    p.buffer.release_through(pages, p.cache);
    drop(pass);
    drop(grow);
    Ok(Written::At(step))
}

/// After a failed write through of `buf` (pages `pages`, claimed, passed
/// by `pass`): the caller's bytes go into the write buffer and the pages
/// into `failed_pages`; [`Written::Requeued`] with the error, or the
/// error itself where there was no memory to keep the bytes.
fn keep_failed(
    p: &Parts<'_>,
    pass: ThroughPass<'_>,
    buf: &[u8],
    pages: Range<u64>,
    failed_pages: &mut Vec<u64>,
    room: &dyn Fn() -> Result<()>,
    e: std::io::Error,
) -> Result<Written> {
    let ps = p.config.page_size as u64;
    let offset = pages.start * ps;
    let end = pages.end * ps;
    // The disk holds some mix of old and new bytes: the caller's go
    // into the buffer before anyone can read the pages, within the
    // bound where backpressure can make room (it flushes other pages:
    // these are claimed, not dirty), past it where it cannot. The pass
    // goes first: making room may flush, which takes the drain lock,
    // under which a cut waits for passes (a cut from here on orders
    // with these pages as with any write after it).
    drop(pass);
    let _ = room();
    let copies = buf
        .chunks_exact(ps as usize)
        .map(|chunk| p.buffer.page_copy_of(chunk))
        .collect::<Result<Vec<_>>>();
    let kept = copies.is_ok();
    match copies {
        Ok(copies) => p
            .buffer
            .requeue_through(pages.start, copies, p.cache, p.length, p.counters),
        // No memory for them: the pages are released as the disk
        // holds them, and the error says they failed.
        Err(_) => p.buffer.release_through(pages.clone(), p.cache),
    }
    failed_pages.extend(pages);
    let e = Error::PagesFailed {
        failed: std::iter::once(offset..end).collect(),
        op: "pwrite",
        source: Arc::new(e),
    };
    if kept {
        Ok(Written::Requeued(e))
    } else {
        Err(e)
    }
}

/// What a writer keeps between its commits written from the write buffer
/// ([`commit_buffered`]): the claimed pages, their runs, the iovecs and,
/// under `O_DIRECT`, the copy buffer of a run scattered in memory.
#[derive(Default)]
pub(crate) struct Scratch {
    entries: Vec<(u64, PageRef)>,
    runs: Vec<Run>,
    iovecs: Vec<IoSlice<'static>>,
    copy: Option<GatherBuf>,
}

/// A scoped commit of the buffered `pages` (page numbers grouped by
/// stripe) written straight from the write buffer: their dirty versions
/// are claimed (`WriteBuffer::claim_buffered`), written from this thread
/// with one call per run, released to the read cache, and then an
/// `fdatasync` that began after those writes makes them durable, as a
/// write through of the caller's bytes does. No drain lock, no
/// generation: nothing another commit has to wait on but the claims, and
/// those only for their pages (`sync` waits for the claims it meets in its
/// drain, a scoped drain for those of its own pages).
///
/// [`Through::Declined`], with nothing changed, where the checks of a
/// write through fail (a cut holds the gate; a page reaches past the
/// length on disk or into space unwritten there) or a page is in flight,
/// guarded or claimed already (the drain's way waits for those).
///
/// Errors: [`Error::PagesFailed`] for runs whose write failed (their
/// pages are dirty again and stay in the writer's commit; the other pages
/// were made durable); an `fdatasync` failure as `Writer::commit` reports
/// it (the file is poisoned).
pub(crate) fn commit_buffered(
    p: &Parts<'_>,
    flush: &FlushPipeline,
    pages: &[u64],
    scratch: &mut Scratch,
) -> Result<Through> {
    let Some(pass) = flush.through.enter() else {
        return Ok(Through::Declined);
    };
    let ps = p.config.page_size as u64;
    let inside = p.length.get().min(p.length.disk()).min(p.length.written());
    let Some(&last) = pages.iter().max() else {
        return Ok(Through::Declined);
    };
    if (last + 1).saturating_mul(ps) > inside || p.unwritten.touches(pages) {
        return Ok(Through::Declined);
    }
    let Scratch {
        entries,
        runs,
        iovecs,
        copy,
    } = scratch;
    if !p.buffer.claim_buffered(pages, entries) {
        return Ok(Through::Declined);
    }
    if entries.is_empty() {
        // Every page went out with other flushes, which counted its write
        // before they retired it.
        drop(pass);
        p.durability.sync_to_own(p.durability.write_seq())?;
        add(&p.counters.commits, 1);
        add(&p.counters.claimed_commits, 1);
        return Ok(Through::Done);
    }
    crate::sync::io_point();
    let limits = RunLimits {
        max_pages: p.config.max_run_pages,
        max_bytes: flush.max_run_bytes,
    };
    if coalesce(entries, limits, runs).is_err() {
        // Not reached: claimed pages have distinct offsets.
        p.buffer.requeue_buffered(entries.drain(..));
        return Ok(Through::Declined);
    }
    if copy.is_none()
        && let Some(align) = flush.inline_copy_align
    {
        *copy = Some(GatherBuf::new(align));
    }
    let failed = write_claimed(p, runs, entries, iovecs, copy.as_mut());
    // Counted before the claims go: a commit that finds a page released
    // reads a `write_seq` that covers its write.
    let step = p.durability.step();
    if let Some(f) = &failed {
        // Back to `dirty` first, then the rest released (the failed runs'
        // entries taken out of `entries`, last first so indices hold).
        let mut back = Vec::new();
        for run in f.runs.iter().rev() {
            back.extend(entries.drain(run.entries()));
        }
        p.buffer.requeue_buffered(back.into_iter());
    }
    p.buffer.release_buffered(entries, p.cache);
    drop(pass);
    p.durability.sync_to_own(step)?;
    add(&p.counters.commits, 1);
    match failed {
        None => {
            add(&p.counters.claimed_commits, 1);
            Ok(Through::Done)
        }
        Some(f) => Err(Error::PagesFailed {
            failed: f.ranges.into_iter().collect(),
            op: f.op,
            source: Arc::new(f.error),
        }),
    }
}

/// The runs of a commit written from the write buffer that failed: their
/// byte ranges, the runs, and the first error with its op.
struct FailedRuns {
    ranges: Vec<std::ops::Range<u64>>,
    runs: Vec<Run>,
    op: &'static str,
    error: std::io::Error,
}

/// Writes `runs` of the claimed `entries`, one call each on this thread,
/// every run tried whatever the others did, and counts them. Returns the
/// failed ones, if any.
fn write_claimed(
    p: &Parts<'_>,
    runs: &[Run],
    entries: &[(u64, PageRef)],
    iovecs: &mut Vec<IoSlice<'static>>,
    mut copy: Option<&mut GatherBuf>,
) -> Option<FailedRuns> {
    let started = std::time::Instant::now();
    let mut failed: Option<FailedRuns> = None;
    for run in runs {
        let (out, op) = write_run(
            p.backend,
            run,
            &entries[run.entries()],
            iovecs,
            copy.as_deref_mut(),
            false,
        );
        add(&p.counters.write_calls, 1);
        match out {
            Ok(()) => {
                add(&p.counters.runs, 1);
                add(&p.counters.pages_written, run.count as u64);
                add(&p.counters.bytes_written, run.len as u64);
            }
            Err(error) => {
                let range = run.offset..run.offset + run.len as u64;
                let f = failed.get_or_insert_with(|| FailedRuns {
                    ranges: Vec::new(),
                    runs: Vec::new(),
                    op,
                    error,
                });
                f.ranges.push(range);
                f.runs.push(*run);
            }
        }
    }
    add_elapsed(&p.counters.write_ns, started);
    failed
}
