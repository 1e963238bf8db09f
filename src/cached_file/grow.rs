//! Grow-ahead ([`GrowAhead::Window`]): a growing file commits at the rate
//! of one written over in place.
//!
//! A change of size, or a block a write allocates, is metadata the
//! commit's `fdatasync` must make durable too (a journal commit). With a
//! window the file's size on the OS runs up to `window` bytes ahead of the
//! data, a filler thread writes that space (zeros) ahead of the writes,
//! and the length lives in a **trailer** at the file's end: two slots
//! (records of `format::trailer`) that commits rewrite in turn, the valid
//! one with the highest sequence holding the length. A commit into the
//! window overwrites written blocks and a slot; the size changes once per
//! window, in an extension made under the drain lock. Data stays below
//! the trailer's page.
//!
//! **Extension** (data or `set_len` would reach the trailer's page): both
//! slots are written at the new end (`need + window`, rounded to pages,
//! plus the trailer's page), moving the size in the same write; an
//! `fdatasync` makes size and trailer durable before anything is written
//! below them (blocks are written back in any order: zeros or data in a
//! window whose end is not durable could come back after a crash as the
//! file's end, with no trailer); then the old slots, now in the data's
//! range, are zeroed. After a crash the size is the old or the new end,
//! with valid slots there; an old trailer left unzeroed is found through
//! the new record's `prev` and zeroed at the next open. `prev` reaches
//! back one trailer only, so an extension first makes the previous
//! zeroing durable.
//!
//! **At rest the file is plain:** `close` cuts the window off, and every
//! open first looks for a trailer (`format::trailer::recover`) and cuts a
//! file a crash left with a window to its recorded length, whatever the
//! configuration. While open with a window the size runs ahead of the
//! length, which is why the window is opt-in.
//!
//! **The filler** (one thread per file) writes zeros from the data
//! frontier (the highest end any flush drained) up to `window` bytes
//! ahead, in [`FILL_CHUNK`] pieces, never below the frontier (a flush
//! whose pages reach into the piece being written waits for it first). It
//! writes only while [`FILL_RESERVE`] (or the window) stays free after it,
//! stops at the first error (counted in `Stats`, never a commit's), and on
//! a full disk gives the zeros above the frontier back (a hole punched).
//!
//! Owns: the trailer state ([`Window`], under the drain lock, in
//! `FileSize`) and the filler ([`Filler`], its own lock, taken under the
//! drain lock or alone; a leaf). Calls: the backend.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::config::{Config, GrowAhead};
use crate::backend::StorageBackend;
use crate::buffer::AlignedBuf;
use crate::error::{Error, Result};
use crate::format::trailer::{NO_PREV, Record, slot_bytes};
use crate::sync::{AtomicU64, Condvar, JoinHandle, Mutex, ThreadBuilder};

/// Zeros the filler writes per call: 1 MiB.
pub(crate) const FILL_CHUNK: u64 = 1 << 20;

/// Bytes the filler leaves free on the file system for the commits, at
/// least: it writes a piece only while this much (or the window, where
/// larger) stays free after it. 64 MiB: many commits' worth, chosen, not
/// measured.
pub(crate) const FILL_RESERVE: u64 = 64 << 20;

/// The trailer of a file with a window, under the drain lock (in `FileSize`).
pub(crate) struct Window {
    /// Bytes the size may run ahead of the data.
    bytes: u64,
    /// Bytes of one slot.
    slot: u64,
    /// Page size in bytes.
    page: u64,
    /// The file's size while a window is in place (0: none).
    end: u64,
    /// Sequence number of the newest record written.
    seq: u64,
    /// The slot the next record goes to (0 or 1).
    next: usize,
    /// The length the newest record holds (`None` after a failed write).
    recorded: Option<u64>,
    /// Both slots as last written (`2 * slot` bytes, page aligned).
    buf: AlignedBuf,
    /// Largest file length the backend holds.
    max: u64,
    /// An old trailer's slots whose zeroing failed (tried again first).
    stale: Option<u64>,
    /// Where the previous window's trailer was ([`NO_PREV`]): every record
    /// carries it, so recovery can zero it.
    prev: u64,
    /// The newest extension is not known durable (stays after its
    /// `fdatasync` failed: nothing more is written).
    unconfirmed: bool,
    /// The `write_seq` step of the latest zeroing of an old trailer: an
    /// `fdatasync` must cover it before the next extension.
    zeroed_at: u64,
}

/// What an extension did: the old trailer's slots, to zero.
pub(crate) struct Extended {
    pub(crate) old_slots: Option<u64>,
}

impl Window {
    /// A window of `bytes`, slots of `slot` bytes (memory aligned to
    /// `align`), pages of `page` bytes, files of at most `max` bytes.
    pub(crate) fn new(bytes: u64, slot: u64, page: u64, align: usize, max: u64) -> Option<Self> {
        Some(Self {
            bytes,
            slot,
            page,
            end: 0,
            seq: 0,
            next: 0,
            recorded: None,
            buf: AlignedBuf::zeroed(2 * slot as usize, align)?,
            max,
            stale: None,
            prev: NO_PREV,
            unconfirmed: false,
            zeroed_at: 0,
        })
    }

    /// The trailer's slots rounded up to pages.
    fn reserve(&self) -> u64 {
        (2 * self.slot).next_multiple_of(self.page)
    }

    /// Whether a window (and trailer) is in place.
    pub(crate) fn active(&self) -> bool {
        self.end > 0
    }

    /// The file's size on the OS while a window is in place.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Where data must end: below the trailer's page (0 with no window).
    pub(crate) fn usable(&self) -> u64 {
        self.end.saturating_sub(self.reserve())
    }

    /// Bytes of the trailer's two slots.
    pub(crate) fn slots_len(&self) -> u64 {
        2 * self.slot
    }

    /// Where the slots are.
    fn slots_at(&self) -> u64 {
        self.end - 2 * self.slot
    }

    /// Whether data and a length up to `need` bytes fit the window in
    /// place.
    pub(crate) fn covers(&self, need: u64) -> bool {
        self.active() && need <= self.usable()
    }

    /// Largest length a file with a window may have: the backend's largest
    /// file, less the trailer's page.
    pub(crate) fn max_len(max: u64, slot: u64, page: u64) -> u64 {
        max.saturating_sub((2 * slot).next_multiple_of(page))
    }

    /// Moves the trailer to a new end `need` + `bytes` (pages, plus the
    /// trailer's page), writing both slots there with `len` (which moves
    /// the size). The caller makes it durable, then zeros the old slots.
    ///
    /// Errors: the write's; nothing changed in memory.
    pub(crate) fn extend(
        &mut self,
        backend: &dyn StorageBackend,
        need: u64,
        len: u64,
    ) -> io::Result<Extended> {
        let want = need
            .max(len)
            .saturating_add(self.bytes)
            .next_multiple_of(self.page)
            .saturating_add(self.reserve());
        let end = want.min(self.max - self.max % self.page);
        debug_assert!(end - self.reserve() >= need.max(len), "checked by max_len");
        let prev = if self.active() {
            self.slots_at()
        } else {
            NO_PREV
        };
        self.seq += 1;
        let rec = Record {
            seq: self.seq,
            len,
            prev,
        };
        let slot = self.slot as usize;
        rec.encode(&mut self.buf[..slot]);
        rec.encode(&mut self.buf[slot..]);
        backend.write_all_at(end - 2 * self.slot, &self.buf)?;
        let old_slots = self.active().then(|| self.slots_at());
        self.end = end;
        self.recorded = Some(len);
        self.next = 0;
        self.prev = prev;
        Ok(Extended { old_slots })
    }

    /// Zeros the old trailer's slots at `at`, now in the data's range (or
    /// those a failed zeroing left, with `at` `None`).
    ///
    /// Errors: the write's (tried again at the next call).
    pub(crate) fn zero_old(
        &mut self,
        backend: &dyn StorageBackend,
        at: Option<u64>,
    ) -> io::Result<()> {
        let Some(at) = at.or(self.stale) else {
            return Ok(());
        };
        self.stale = Some(at);
        let zeros = AlignedBuf::zeroed(self.buf.len(), self.buf.align())
            .ok_or(io::ErrorKind::InvalidInput)?;
        backend.write_all_at(at, &zeros)?;
        self.stale = None;
        Ok(())
    }

    /// The extension just written is not durable yet: nothing is written
    /// until [`confirm`](Self::confirm).
    pub(crate) fn set_unconfirmed(&mut self) {
        self.unconfirmed = true;
    }

    /// An `fdatasync` made the newest extension durable.
    pub(crate) fn confirm(&mut self) {
        self.unconfirmed = false;
    }

    /// Whether the newest extension is not known durable.
    pub(crate) fn unconfirmed(&self) -> bool {
        self.unconfirmed
    }

    /// Where an old trailer that still waits to be zeroed is.
    pub(crate) fn stale(&self) -> Option<u64> {
        self.stale
    }

    /// An old trailer's zeroing was counted at `write_seq` step `step`.
    pub(crate) fn zeroed(&mut self, step: u64) {
        self.zeroed_at = step;
    }

    /// Whether the latest zeroing of an old trailer is not known durable
    /// when the latest successful `fdatasync` covered `write_seq` up to
    /// `fsynced`.
    pub(crate) fn zeroing_unsynced(&self, fsynced: u64) -> bool {
        self.zeroed_at > fsynced
    }

    /// Writes `len` into the next slot if the newest record holds another
    /// length; whether it wrote.
    ///
    /// Errors: the write's (the next commit writes it again).
    pub(crate) fn record(&mut self, backend: &dyn StorageBackend, len: u64) -> io::Result<bool> {
        if !self.active() || self.recorded == Some(len) {
            return Ok(false);
        }
        debug_assert!(len <= self.usable());
        // A failed write may still have landed (torn, or whole before an
        // error): the next attempt takes a higher sequence number and
        // writes whatever the length is then.
        self.seq += 1;
        self.recorded = None;
        let rec = Record {
            seq: self.seq,
            len,
            prev: self.prev,
        };
        let slot = self.slot as usize;
        let at = self.next * slot;
        rec.encode(&mut self.buf[at..at + slot]);
        backend.write_all_at(self.slots_at() + at as u64, &self.buf[at..at + slot])?;
        self.recorded = Some(len);
        self.next ^= 1;
        Ok(true)
    }

    /// The window is gone (the file was cut to its length): back to a
    /// plain file until the next extension.
    pub(crate) fn clear(&mut self) {
        self.end = 0;
        self.stale = None;
        self.prev = NO_PREV;
        self.unconfirmed = false;
    }
}

/// The filler: a thread that writes zeros ahead of the data frontier.
pub(crate) struct Filler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<FillState>,
    cv: Condvar,
    /// Zero bytes written.
    bytes: AtomicU64,
    /// Fill calls that failed (the filler stops at the first).
    errors: AtomicU64,
}

#[derive(Default)]
struct FillState {
    /// The highest end of the pages drained so far: nothing is written
    /// below it.
    frontier: u64,
    /// Zeros are written in `[frontier, zeroed)`.
    zeroed: u64,
    /// Where the window's data space ends (0: no window).
    limit: u64,
    /// The piece being written, without the lock.
    busy: Option<(u64, u64)>,
    /// Bytes to keep written ahead of the frontier.
    ahead: u64,
    stop: bool,
    /// Why the filler stopped, once it has.
    failed: Option<String>,
}

impl Filler {
    /// Starts the filler of `backend` keeping `ahead` bytes written ahead
    /// of the data, from a file whose data ends at `len`.
    ///
    /// Errors: the thread could not be started.
    pub(crate) fn start(
        backend: Arc<dyn StorageBackend>,
        ahead: u64,
        len: u64,
    ) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(FillState {
                frontier: len,
                zeroed: len,
                ahead,
                ..FillState::default()
            }),
            cv: Condvar::new(),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        });
        let s = Arc::clone(&shared);
        let thread = ThreadBuilder::new()
            .name("pagewriter-grow".into())
            .spawn(move || fill_loop(&s, &*backend))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// A flush drained pages ending at `end` (under the drain lock, before
    /// they are written): moves the frontier up, so no later piece starts
    /// below `end`, then waits for the piece being written if it reaches
    /// below `end` (one piece at most: the filler's next starts above).
    pub(crate) fn drained(&self, end: u64) {
        let mut st = self.shared.state.lock();
        if end > st.frontier {
            st.frontier = end;
            st.zeroed = st.zeroed.max(end);
            self.shared.cv.notify_all();
        }
        while st.busy.is_some_and(|(from, _)| from < end) {
            self.shared.cv.wait(&mut st);
        }
    }

    /// The window's data space now ends at `limit` (an extension, under
    /// the drain lock).
    pub(crate) fn set_limit(&self, limit: u64) {
        let mut st = self.shared.state.lock();
        st.limit = limit;
        self.shared.cv.notify_all();
    }

    /// The window is gone and the data ends at `len` (a cut, under
    /// the drain lock): waits for the piece in flight, then starts over from
    /// `len` with no window.
    pub(crate) fn reset(&self, len: u64) {
        let mut st = self.shared.state.lock();
        while st.busy.is_some() {
            self.shared.cv.wait(&mut st);
        }
        st.limit = 0;
        st.frontier = len;
        st.zeroed = len;
    }

    /// A commit's write found the file system full: the filler stops and
    /// gives the zeros above the frontier back (after the piece in
    /// flight), so the commit's retry finds the space.
    pub(crate) fn full(&self, backend: &dyn StorageBackend) {
        let mut st = self.shared.state.lock();
        while st.busy.is_some() {
            self.shared.cv.wait(&mut st);
        }
        give_back(&mut st, backend);
        if st.failed.is_none() {
            self.shared.errors.fetch_add(1, Ordering::Relaxed);
            st.failed = Some("grow-ahead stopped: a commit's write found the disk full".into());
        }
    }

    /// Zero bytes written so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    /// Failed fill calls (0 or 1: it stops at the first).
    pub(crate) fn errors(&self) -> u64 {
        self.shared.errors.load(Ordering::Relaxed)
    }

    /// Why the filler stopped, if it has.
    pub(crate) fn failed(&self) -> Option<String> {
        self.shared.state.lock().failed.clone()
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether `e` says the file system is full.
pub(crate) fn is_full(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == io::ErrorKind::StorageFull
}

/// Frees the zeros above the frontier (a hole punched, best effort: where
/// the file system cannot, they stay, harmless).
fn give_back(st: &mut FillState, backend: &dyn StorageBackend) {
    let keep = st.frontier;
    if st.zeroed > keep {
        let _ = backend.punch_hole(keep, st.zeroed - keep);
    }
    st.zeroed = keep;
}

/// The filler thread: writes the next piece whenever the zeros end less
/// than `ahead` bytes past the frontier and below the limit.
fn fill_loop(s: &Shared, backend: &dyn StorageBackend) {
    let mut st = s.state.lock();
    loop {
        if st.stop {
            return;
        }
        let from = st.zeroed.max(st.frontier);
        let target = st.limit.min(st.frontier.saturating_add(st.ahead));
        if st.failed.is_some() || from >= target {
            s.cv.wait(&mut st);
            continue;
        }
        let to = target.min(from + FILL_CHUNK);
        st.busy = Some((from, to));
        let reserve = st.ahead.max(FILL_RESERVE);
        drop(st);
        // The write takes time: others run before it lands.
        crate::sync::io_point();
        let r = match backend.free_bytes() {
            Some(free) if free < reserve.saturating_add(to - from) => Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("{free} bytes free, {reserve} kept for the commits"),
            )),
            _ => backend.write_zeroes(from, to - from),
        };
        st = s.state.lock();
        st.busy = None;
        match r {
            Ok(()) => {
                st.zeroed = to;
                s.bytes.fetch_add(to - from, Ordering::Relaxed);
            }
            Err(e) => {
                s.errors.fetch_add(1, Ordering::Relaxed);
                // A full disk: the zeros above the frontier go back, so
                // the space is the commits' again (best effort).
                if is_full(&e) {
                    give_back(&mut st, backend);
                }
                st.failed = Some(format!("grow-ahead stopped at byte {from}: {e}"));
            }
        }
        s.cv.notify_all();
    }
}

/// Grow-ahead's window in bytes (none on a read-only file or without
/// [`GrowAhead::Window`]) and the largest length a write may reach: the
/// file system's largest file, less the trailer with a window.
///
/// Errors: [`Error::InvalidConfig`] for a window past that largest file.
pub(crate) fn limits(
    backend: &dyn StorageBackend,
    config: &Config,
    read_only: bool,
) -> Result<(Option<u64>, u64)> {
    let fs_max = backend.max_file_size().unwrap_or(u64::MAX);
    let window_bytes = match config.grow_ahead {
        GrowAhead::Window { bytes } if !read_only => bytes,
        _ => return Ok((None, fs_max)),
    };
    let max = Window::max_len(fs_max, slot_bytes(backend), config.page_size as u64);
    if window_bytes > max {
        return Err(Error::InvalidConfig(format!(
            "grow_ahead window {window_bytes} is larger than the file system's largest file ({fs_max} bytes)"
        )));
    }
    Ok((Some(window_bytes), max))
}

/// Grow-ahead's trailer state and its filler thread, for a window of
/// `bytes` over a file of `len` bytes.
///
/// Errors: [`Error::NoMemory`] for the trailer's slots; `Error::Io` with
/// op "grow-ahead: start the filler thread".
pub(crate) fn open_window(
    backend: &Arc<dyn StorageBackend>,
    bytes: u64,
    config: &Config,
    len: u64,
) -> Result<(Window, Filler)> {
    let slot = slot_bytes(&**backend);
    let fs_max = backend.max_file_size().unwrap_or(u64::MAX);
    let page = config.page_size as u64;
    let window = Window::new(bytes, slot, page, config.page_align(), fs_max)
        .ok_or(Error::NoMemory { bytes: 2 * slot })?;
    let filler = Filler::start(Arc::clone(backend), bytes, len)
        .map_err(|e| Error::io("grow-ahead: start the filler thread", None, e))?;
    Ok((window, filler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;
    use crate::format::trailer::recover;

    #[test]
    fn recovery_cuts_to_the_newest_record_and_zeros_the_stale_one() {
        let be = MemoryBackend::new();
        let slot = 512u64;
        let page = 4096u64;
        let mut w = Window::new(8 * page, slot, page, 4096, u64::MAX).unwrap();
        be.write_all_at(0, &[1u8; 4096]).unwrap();
        w.extend(&be, 4096, 4096).unwrap();
        assert_eq!(be.len().unwrap(), 4096 + 8 * page + page);
        w.record(&be, 2 * page).unwrap();
        let first_slots = w.slots_at();
        // The data grows past the trailer: a second extension; its old
        // slots are left unzeroed (a crash before `zero_old`).
        let x = w.extend(&be, w.end() + page, w.end() + page).unwrap();
        assert_eq!(x.old_slots, Some(first_slots));
        w.record(&be, w.end() - 3 * page).unwrap();
        let want = w.end() - 3 * page;
        let found = recover(&be, false, 4096).unwrap().unwrap();
        assert_eq!(found.len, want);
        assert_eq!(be.len().unwrap(), want);
        let mut old = vec![9u8; 1024];
        be.read_exact_at(first_slots, &mut old).unwrap();
        assert!(old.iter().all(|&b| b == 0), "the stale trailer is zeroed");
        // A plain file: nothing to do.
        assert_eq!(recover(&be, false, 4096).unwrap(), None);
        assert_eq!(be.len().unwrap(), want);
    }

    /// A trailer written with 4 KiB slots (a device with 4 KiB sectors)
    /// is found by an open whose own slots are 512 bytes, and the other
    /// way round.
    #[test]
    fn a_trailer_of_another_slot_size_is_found() {
        for written in [4096u64, 512] {
            let be = MemoryBackend::new();
            let page = 4096u64;
            let mut w = Window::new(8 * page, written, page, 4096, u64::MAX).unwrap();
            be.write_all_at(0, &[1u8; 4096]).unwrap();
            w.extend(&be, 4096, 4096).unwrap();
            w.record(&be, 3 * page).unwrap();
            let found = recover(&be, false, 4096).unwrap().unwrap();
            assert_eq!(found.len, 3 * page, "slots of {written} B");
            assert_eq!(be.len().unwrap(), 3 * page);
        }
    }

    #[test]
    fn a_torn_extension_leaves_the_old_or_the_new_trailer_valid() {
        let slot = 512u64;
        let page = 4096u64;
        for kept in [[false, false], [true, false], [false, true], [true, true]] {
            let be = MemoryBackend::new();
            let mut w = Window::new(4 * page, slot, page, 4096, u64::MAX).unwrap();
            w.extend(&be, 0, 0).unwrap();
            w.record(&be, page).unwrap();
            let old_end = w.end();
            // The second extension's two sectors, kept as `kept` says.
            let mut img = vec![0u8; old_end as usize];
            be.read_exact_at(0, &mut img).unwrap();
            let shadow = MemoryBackend::new();
            shadow.write_all_at(0, &img).unwrap();
            w.extend(&shadow, 2 * page, 2 * page).unwrap();
            let new_end = w.end();
            let mut slots = vec![0u8; 1024];
            shadow.read_exact_at(new_end - 1024, &mut slots).unwrap();
            let crashed = MemoryBackend::new();
            crashed.write_all_at(0, &img).unwrap();
            for (i, keep) in kept.iter().enumerate() {
                if *keep {
                    crashed
                        .write_all_at(
                            new_end - 1024 + 512 * i as u64,
                            &slots[512 * i..512 * (i + 1)],
                        )
                        .unwrap();
                }
            }
            let found = recover(&crashed, false, 4096).unwrap().unwrap();
            let want = if kept.iter().any(|&k| k) {
                2 * page
            } else {
                page
            };
            assert_eq!(found.len, want, "kept {kept:?}");
        }
    }
}
