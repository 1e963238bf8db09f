//! Backends for testing code built on this crate: [`FaultyBackend`] fails
//! chosen calls, [`CrashBackend`] simulates power loss, and [`model`] runs
//! operation sequences against a reference model (shared by the proptests
//! and the fuzzer). Public so engine authors can test their own error
//! paths.

pub mod model;
mod scratch_fs;

pub use scratch_fs::{FsKind, ScratchFs};

/// Runs `body` under uniform random schedules and under PCT schedules
/// (depth 3, which finds bugs that need a few preemptions at the right
/// steps: a uniform random schedule rarely makes one thread run a dozen
/// steps while another waits between two of its own), `schedules` of each
/// unless `SHUTTLE_ITERATIONS` says otherwise. A failure panics with the
/// schedule that reproduces it. `shuttle` feature only.
#[cfg(feature = "shuttle")]
pub fn shuttle_check(body: fn(), schedules: usize) {
    let schedules = std::env::var("SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(schedules);
    shuttle::check_random(body, schedules);
    shuttle::check_pct(body, schedules, 3);
}

/// Whether this machine lets a process set up an io_uring ring (the kernel
/// has it, `io_uring_disabled` allows it, seccomp does not refuse it), so
/// tests can skip io_uring cases with a message instead of failing.
pub fn uring_available() -> bool {
    #[cfg(all(target_os = "linux", feature = "io-uring"))]
    return io_uring::IoUring::new(2).is_ok();
    #[cfg(not(all(target_os = "linux", feature = "io-uring")))]
    false
}

/// Whether the file system holding `dir` opens files with `O_DIRECT`
/// (probed on `dir/direct-probe`, which is left there).
pub fn direct_available(dir: &std::path::Path) -> bool {
    crate::FileBackend::open_direct(dir.join("direct-probe")).is_ok()
}

/// A seeded random stream for tests (splitmix64, Steele et al. 2014):
/// crash images and page contents that replay from a seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n` > 0; modulo bias is irrelevant for tests).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let w = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }
}

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::backend::{StorageBackend, UringFault};

/// What a scheduled fault does to one write call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFault {
    /// Pass the call through unchanged.
    Pass,
    /// Fail with this OS error (`libc::EIO`, `libc::ENOSPC`, ...) before
    /// writing anything.
    Errno(i32),
    /// Write the first `n` bytes, then fail with `EIO` (a torn write).
    TornThenEio(usize),
    /// A short write of `n` bytes that the writer must continue: the rest
    /// follows in a second write. For io_uring the kernel really writes
    /// only `n` bytes and the engine must resubmit the remainder.
    Short(usize),
}

/// Wraps a backend and fails the calls its schedule says to.
///
/// Write calls (`write_all_at` and `write_vectored_all_at`, one entry per
/// call, and each io_uring write SQE through
/// [`uring_fault`](StorageBackend::uring_fault)) take the next
/// [`WriteFault`] from the write schedule; `sync_data`
/// calls take the next `Option<i32>` errno from the sync schedule. An empty
/// schedule passes calls through.
#[derive(Debug)]
pub struct FaultyBackend<B> {
    inner: B,
    write_faults: Mutex<VecDeque<WriteFault>>,
    sync_faults: Mutex<VecDeque<Option<i32>>>,
    writes: AtomicU64,
    buffer_writes: AtomicU64,
    syncs: AtomicU64,
}

impl<B: StorageBackend> FaultyBackend<B> {
    /// Wraps `inner` with empty schedules.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            write_faults: Mutex::new(VecDeque::new()),
            sync_faults: Mutex::new(VecDeque::new()),
            writes: AtomicU64::new(0),
            buffer_writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        }
    }

    /// Appends faults for the next write calls, in order.
    pub fn schedule_writes(&self, faults: impl IntoIterator<Item = WriteFault>) {
        self.write_faults.lock().extend(faults);
    }

    /// Appends outcomes for the next `sync_data` calls: `Some(errno)` fails,
    /// `None` passes.
    pub fn schedule_syncs(&self, faults: impl IntoIterator<Item = Option<i32>>) {
        self.sync_faults.lock().extend(faults);
    }

    /// Write calls seen so far (failed ones included).
    pub fn write_calls(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Of the write calls, those of one buffer (`write_all_at`, a
    /// `pwrite`); the others are vectored or io_uring SQEs.
    pub fn buffer_write_calls(&self) -> u64 {
        self.buffer_writes.load(Ordering::Relaxed)
    }

    /// `sync_data` calls seen so far (failed ones included).
    pub fn sync_calls(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    fn next_write_fault(&self) -> WriteFault {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_faults
            .lock()
            .pop_front()
            .unwrap_or(WriteFault::Pass)
    }

    fn write_vectored(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        match self.next_write_fault() {
            WriteFault::Pass => self.inner.write_vectored_all_at(offset, bufs),
            WriteFault::Errno(code) => Err(io::Error::from_raw_os_error(code)),
            WriteFault::TornThenEio(n) => {
                let mut left = n;
                let mut at = offset;
                for buf in bufs.iter() {
                    let k = left.min(buf.len());
                    self.inner.write_all_at(at, &buf[..k])?;
                    at += k as u64;
                    left -= k;
                }
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            WriteFault::Short(n) => {
                // Split the iovecs at byte n without copying (the memory
                // stays aligned for O_DIRECT).
                let mut head: Vec<IoSlice<'_>> = Vec::new();
                let mut tail: Vec<IoSlice<'_>> = Vec::new();
                let mut left = n;
                for b in bufs.iter() {
                    let k = left.min(b.len());
                    if k > 0 {
                        head.push(IoSlice::new(&b[..k]));
                    }
                    if k < b.len() {
                        tail.push(IoSlice::new(&b[k..]));
                    }
                    left -= k;
                }
                let written: usize = head.iter().map(|b| b.len()).sum();
                self.inner.write_vectored_all_at(offset, &mut head)?;
                self.inner
                    .write_vectored_all_at(offset + written as u64, &mut tail)
            }
        }
    }
}

impl<B: StorageBackend> StorageBackend for FaultyBackend<B> {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_exact_at(offset, buf)
    }

    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.buffer_writes.fetch_add(1, Ordering::Relaxed);
        match self.next_write_fault() {
            WriteFault::Pass => self.inner.write_all_at(offset, buf),
            WriteFault::Errno(code) => Err(io::Error::from_raw_os_error(code)),
            WriteFault::TornThenEio(n) => {
                self.inner.write_all_at(offset, &buf[..n.min(buf.len())])?;
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            WriteFault::Short(n) => {
                let n = n.min(buf.len());
                self.inner.write_all_at(offset, &buf[..n])?;
                self.inner.write_all_at(offset + n as u64, &buf[n..])
            }
        }
    }

    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        self.write_vectored(offset, bufs)
    }
    fn uring_fault(&self, _offset: u64, _len: usize) -> Option<UringFault> {
        match self.next_write_fault() {
            WriteFault::Pass => None,
            WriteFault::Errno(e) => Some(UringFault::Errno(e)),
            // The SQE wrote everything, but reports EIO: the pages must stay
            // dirty all the same.
            WriteFault::TornThenEio(_) => Some(UringFault::Errno(libc::EIO)),
            WriteFault::Short(n) => Some(UringFault::Short(n)),
        }
    }

    fn dio_align(&self) -> Option<crate::backend::DioAlign> {
        self.inner.dio_align()
    }

    fn atomic_write_unit(&self) -> Option<crate::backend::AtomicUnit> {
        self.inner.atomic_write_unit()
    }

    /// Takes a write fault: `Errno` and `TornThenEio` fail with nothing
    /// written (an atomic write is never torn), `Short` passes whole (an
    /// atomic write is never short).
    fn write_atomic_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        match self.next_write_fault() {
            WriteFault::Errno(code) => return Err(io::Error::from_raw_os_error(code)),
            WriteFault::TornThenEio(_) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            WriteFault::Pass | WriteFault::Short(_) => {}
        }
        self.inner.write_atomic_at(offset, buf)
    }

    fn max_file_size(&self) -> Option<u64> {
        self.inner.max_file_size()
    }

    fn file(&self) -> Option<&std::fs::File> {
        self.inner.file()
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.allocate(offset, len)
    }

    /// Grow-ahead's zeros pass through without faults: the faults model
    /// the commits' writes and syncs.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.punch_hole(offset, len)
    }

    fn free_bytes(&self) -> Option<u64> {
        self.inner.free_bytes()
    }

    fn data_len(&self) -> Option<u64> {
        self.inner.data_len()
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync_data_on(0)
    }

    fn sync_lanes(&self) -> usize {
        self.inner.sync_lanes()
    }

    fn sync_data_on(&self, lane: usize) -> io::Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        // The fault is taken first: the queue's lock is not held over the
        // inner call (another lane's sync may run meanwhile).
        let fault = self.sync_faults.lock().pop_front().flatten();
        match fault {
            Some(code) => Err(io::Error::from_raw_os_error(code)),
            None => self.inner.sync_data_on(lane),
        }
    }
}

/// A file that remembers what was durable. The live image takes every
/// write and also logs it; a successful `sync_data` applies the log to the
/// durable image. [`crash`](Self::crash) gives a new backend holding only
/// the durable image, as a power cut would leave the file if the OS wrote
/// back nothing unsynced.
///
/// A sync scheduled to fail ([`schedule_syncs`](Self::schedule_syncs))
/// returns `EIO` and drops the log, as Linux does after failed writeback:
/// the pages are marked clean, stay readable from the page cache, and a
/// later successful `fdatasync` does not write them. As on Linux (each file
/// description samples the file's `errseq_t` and reports an error it has
/// not seen once), the error is also reported once by the next sync on
/// every other lane, which syncs its log first. It has 8 lanes
/// ([`with_sync_lanes`](Self::with_sync_lanes) sets another number).
/// Under the model check's scheduler other threads may
/// run while a sync is in progress, and two syncs on one lane at once
/// panic.
///
/// `set_len` is durable at the next sync (or durable write): a cut there
/// truncates the durable image before the log is applied, so bytes cut
/// and written again read as zeros, and unsynced writes past a cut appear
/// only in crash images (the cut itself may not have reached the disk).
#[derive(Debug)]
pub struct CrashBackend {
    state: Mutex<CrashState>,
}

#[derive(Debug, Default)]
struct CrashState {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    log: Vec<Logged>,
    /// The atomic unit this file reports (`with_atomic_unit`).
    atomic: Option<crate::backend::AtomicUnit>,
    /// Atomic writes so far (numbers their log entries).
    atomic_writes: u64,
    /// `set_len` since the last sync: the shortest length it set (a sync
    /// makes the cut durable before the file grows again: bytes past it
    /// read as zeros even where the durable image held older ones).
    cut_to: Option<usize>,
    /// `set_len` since the last sync: the next one makes the live length
    /// durable.
    len_changed: bool,
    sync_faults: VecDeque<bool>,
    /// Failed syncs so far (the file's `errseq_t`).
    errors: u64,
    /// Per lane: the failed syncs it has reported.
    seen: Vec<u64>,
    /// Per lane: a sync is in progress.
    syncing: Vec<bool>,
    /// Crash images to take at the start of every sync
    /// (`images_at_every_sync`), and those taken.
    images_per_sync: u64,
    images: Vec<Vec<u8>>,
}

impl CrashState {
    /// See [`CrashBackend::crash_image`].
    fn crash_image(&self, seed: u64) -> Vec<u8> {
        let mut image = self.durable.clone();
        let mut rng = Rng::new(seed);
        let mut atomic_kept: std::collections::HashMap<u64, bool> = Default::default();
        for Logged {
            offset,
            bytes,
            atomic,
            ..
        } in &self.log
        {
            if let Some(id) = atomic {
                let keep = *atomic_kept.entry(*id).or_insert_with(|| rng.below(2) == 0);
                if keep {
                    apply(&mut image, *offset, bytes);
                }
                continue;
            }
            match rng.below(3) {
                0 => apply(&mut image, *offset, bytes),
                1 => {}
                _ => {
                    for (i, sector) in bytes.chunks(512).enumerate() {
                        if rng.below(2) == 0 {
                            apply(&mut image, offset + (i * 512) as u64, sector);
                        }
                    }
                }
            }
        }
        image
    }
}

/// Sync lanes of a [`CrashBackend`] by default.
const CRASH_LANES: usize = 8;

/// One unsynced write (or what is left of it once later durable writes
/// covered part of it).
#[derive(Debug, Clone)]
struct Logged {
    offset: u64,
    bytes: Vec<u8>,
    /// The atomic write this came from: its pieces survive a crash
    /// together or not at all, and are never torn.
    atomic: Option<u64>,
    /// Past a `set_len` cut made after it: a crash may still show it (the
    /// write may have reached the disk before the cut, and the cut is not
    /// durable yet), but a sync never makes it durable.
    cut: bool,
}

fn apply(image: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let start = offset as usize;
    let end = start + bytes.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(bytes);
}

impl Default for CrashBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CrashBackend {
    /// An empty file.
    pub fn new() -> Self {
        Self::with_sync_lanes(CRASH_LANES)
    }

    /// An empty file with `lanes` sync lanes (1..=64).
    pub fn with_sync_lanes(lanes: usize) -> Self {
        let lanes = lanes.clamp(1, 64);
        Self {
            state: Mutex::new(CrashState {
                seen: vec![0; lanes],
                syncing: vec![false; lanes],
                ..CrashState::default()
            }),
        }
    }

    /// Appends outcomes for the next syncs: `true` fails with `EIO` and
    /// drops every write since the last successful sync from the durable
    /// path.
    pub fn schedule_syncs(&self, failures: impl IntoIterator<Item = bool>) {
        self.state.lock().sync_faults.extend(failures);
    }

    /// Makes the file report `unit` as its atomic write unit and take
    /// [`write_atomic_at`](StorageBackend::write_atomic_at) writes that fit
    /// it: [`crash_image`](Self::crash_image) keeps or drops such a write
    /// whole, never tears it.
    pub fn with_atomic_unit(self, unit: crate::backend::AtomicUnit) -> Self {
        self.state.lock().atomic = Some(unit);
        self
    }

    /// Takes `seeds` crash images ([`crash_image`](Self::crash_image)
    /// with seeds `0..seeds`) at the start of every `sync_data` and
    /// `sync_data_on` from now on, before its effect (a failing one
    /// included):
    /// the power cuts that land while an `fdatasync` is in flight, such
    /// as the one that makes a just-written grow-ahead trailer durable.
    /// [`take_images`](Self::take_images) hands them over.
    pub fn images_at_every_sync(self, seeds: u64) -> Self {
        self.state.lock().images_per_sync = seeds;
        self
    }

    /// The images taken so far at syncs
    /// ([`images_at_every_sync`](Self::images_at_every_sync)), oldest
    /// first; takes them away.
    pub fn take_images(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.state.lock().images)
    }

    /// The bytes a crash now would leave.
    pub fn durable_image(&self) -> Vec<u8> {
        self.state.lock().durable.clone()
    }

    /// The bytes the OS holds now (synced or not).
    pub fn live_image(&self) -> Vec<u8> {
        self.state.lock().live.clone()
    }

    /// A new backend with the durable image only; unsynced writes are lost.
    pub fn crash(&self) -> crate::backend::MemoryBackend {
        Self::memory(&self.durable_image())
    }

    /// The image a power cut now could leave: the durable image plus an
    /// arbitrary subset, chosen by `seed`, of the writes issued since the
    /// last sync: each write kept, dropped, or torn (a random subset of its
    /// 512-byte sectors kept), in issue order. An atomic write
    /// ([`with_atomic_unit`](Self::with_atomic_unit)) is kept or dropped
    /// whole, never torn.
    pub fn crash_image(&self, seed: u64) -> Vec<u8> {
        self.state.lock().crash_image(seed)
    }

    /// The images one power cut now could leave on this file and on
    /// `other` (a page file and its doublewrite area), each as
    /// [`crash_image`](Self::crash_image) makes it with its own seed. Both
    /// are taken under both files' locks, so no write or sync of either
    /// lands between them: a cut is one instant for every file, and a
    /// committer still running must not sync one file and start the
    /// other over in between. Locks `self`, then `other`: callers racing
    /// on the same two files pass them in the same order.
    pub fn crash_images_with(
        &self,
        other: &CrashBackend,
        seed: u64,
        other_seed: u64,
    ) -> (Vec<u8>, Vec<u8>) {
        let st = self.state.lock();
        let other_st = other.state.lock();
        (st.crash_image(seed), other_st.crash_image(other_seed))
    }

    /// A new crash backend whose live and durable images are `image` (a
    /// file reopened after a crash).
    pub fn from_image(image: &[u8]) -> Self {
        let be = Self::default();
        {
            let mut st = be.state.lock();
            st.live = image.to_vec();
            st.durable = image.to_vec();
        }
        be
    }

    fn memory(image: &[u8]) -> crate::backend::MemoryBackend {
        let be = crate::backend::MemoryBackend::new();
        be.write_all_at(0, image).expect("memory backend write");
        be.set_len(image.len() as u64)
            .expect("memory backend set_len");
        be
    }
}

impl StorageBackend for CrashBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.state.lock().live.len() as u64)
    }
    /// The file holds no holes: all of it.
    fn data_len(&self) -> Option<u64> {
        self.len().ok()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        if len < st.live.len() as u64 {
            // Unsynced bytes past the cut are gone from the file: a sync
            // must not bring them back (a crash before it may, with the
            // old length).
            let log = std::mem::take(&mut st.log);
            for w in log {
                if w.offset + w.bytes.len() as u64 > len && !w.cut {
                    let keep = len.saturating_sub(w.offset) as usize;
                    if keep > 0 {
                        st.log.push(Logged {
                            offset: w.offset,
                            bytes: w.bytes[..keep].to_vec(),
                            atomic: w.atomic,
                            cut: false,
                        });
                    }
                    st.log.push(Logged {
                        offset: w.offset + keep as u64,
                        bytes: w.bytes[keep..].to_vec(),
                        atomic: w.atomic,
                        cut: true,
                    });
                } else {
                    st.log.push(w);
                }
            }
        }
        st.live.resize(len as usize, 0);
        st.cut_to = Some(st.cut_to.map_or(len as usize, |c| c.min(len as usize)));
        st.len_changed = true;
        Ok(())
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let st = self.state.lock();
        let start = offset as usize;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= st.live.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&st.live[start..end]);
        Ok(())
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        // A write of nothing changes nothing (a 0-byte pwrite does not
        // extend the file).
        if buf.is_empty() {
            return Ok(());
        }
        let mut st = self.state.lock();
        apply(&mut st.live, offset, buf);
        st.log.push(Logged {
            offset,
            bytes: buf.to_vec(),
            atomic: None,
            cut: false,
        });
        Ok(())
    }
    fn atomic_write_unit(&self) -> Option<crate::backend::AtomicUnit> {
        self.state.lock().atomic
    }
    /// Refuses what the kernel refuses (`EINVAL`: no unit, or a size or
    /// offset that does not fit it).
    fn write_atomic_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock();
        if !st.atomic.is_some_and(|u| u.fits(offset, buf.len())) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        st.atomic_writes += 1;
        let id = st.atomic_writes;
        apply(&mut st.live, offset, buf);
        st.log.push(Logged {
            offset,
            bytes: buf.to_vec(),
            atomic: Some(id),
            cut: false,
        });
        Ok(())
    }
    fn sync_lanes(&self) -> usize {
        self.state.lock().seen.len()
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync_data_on(0)
    }
    /// A sync's effect is one atomic step under the state lock. Under the
    /// model check (the `shuttle` feature) the lane then stays busy until
    /// after a scheduling point, and a second sync on it meanwhile panics,
    /// failing the check. Elsewhere nothing is checked: a test backend
    /// wrapping this one may send every lane of its own to `sync_data`
    /// (lane 0), and a panic in one committer would leave the others
    /// waiting for its lane.
    fn sync_data_on(&self, lane: usize) -> io::Result<()> {
        {
            let mut st = self.state.lock();
            let Some(busy) = st.syncing.get_mut(lane) else {
                return Err(io::ErrorKind::InvalidInput.into());
            };
            if cfg!(feature = "shuttle") {
                assert!(!*busy, "two syncs at once on lane {lane}");
                *busy = true;
            }
        }
        let synced = self.sync_now(lane);
        if cfg!(feature = "shuttle") {
            crate::sync::io_point();
            self.state.lock().syncing[lane] = false;
        }
        synced
    }
}

impl CrashBackend {
    /// The effect of a sync on `lane` (see [`StorageBackend::sync_data_on`]).
    fn sync_now(&self, lane: usize) -> io::Result<()> {
        let mut st = self.state.lock();
        for seed in 0..st.images_per_sync {
            let image = st.crash_image(seed);
            st.images.push(image);
        }
        let log = std::mem::take(&mut st.log);
        if st.sync_faults.pop_front().unwrap_or(false) {
            st.errors += 1;
            st.seen[lane] = st.errors;
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if let Some(cut) = st.cut_to.take() {
            st.durable.truncate(cut);
        }
        for w in log.iter().filter(|w| !w.cut) {
            apply(&mut st.durable, w.offset, &w.bytes);
        }
        if std::mem::take(&mut st.len_changed) {
            let len = st.live.len();
            st.durable.resize(len, 0);
        }
        if st.seen[lane] < st.errors {
            st.seen[lane] = st.errors;
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One thread writes and syncs a version to `a`, then to `b`, over and
    /// over, so at every instant `a` is at least as new as `b`, in any
    /// image a power cut could leave (`b`'s unsynced write of a version
    /// comes after `a`'s sync of it). Images of both taken by
    /// `crash_images_with` never show `b` ahead; two separate
    /// `crash_image` calls can (the writer moves on between them).
    #[test]
    fn crash_images_with_is_one_instant_for_both_files() {
        let (a, b) = (CrashBackend::new(), CrashBackend::new());
        let stop = std::sync::atomic::AtomicBool::new(false);
        let written = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut v = 0u8;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    v = v.wrapping_add(1).max(1);
                    for f in [&a, &b] {
                        f.write_all_at(0, &[v; 512]).unwrap();
                        f.sync_data().unwrap();
                    }
                    written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if v == u8::MAX {
                        // Start over at 1 only once both are at 255, so
                        // the order below holds across the wrap too.
                        for f in [&a, &b] {
                            f.write_all_at(0, &[0; 512]).unwrap();
                            f.sync_data().unwrap();
                        }
                    }
                }
            });
            // Images until the writer has gone round twice, however the
            // threads are scheduled.
            let mut seed = 0u64;
            let mut ahead = None;
            while ahead.is_none()
                && (seed < 20_000 || written.load(std::sync::atomic::Ordering::Relaxed) < 600)
            {
                seed += 1;
                let (ia, ib) = a.crash_images_with(&b, seed, seed + 1);
                let (va, vb) = (ia.first().copied(), ib.first().copied());
                let b_ahead = match (va, vb) {
                    (None, Some(_)) => true,
                    (Some(x), Some(y)) => y > x && !(x == 0 && y == u8::MAX),
                    _ => false,
                };
                if b_ahead {
                    ahead = Some((seed, va, vb));
                }
            }
            // Stopped before the verdict, so a failure ends the writer.
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(ahead, None, "(seed, a, b) with b ahead of a");
        });
    }
}
