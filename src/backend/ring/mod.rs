//! The io_uring loop of the crate and its tools (Linux, cargo feature
//! `io-uring`): [`SlotRing`] is the one place where SQEs are submitted,
//! CQEs reaped and short or interrupted transfers resubmitted. The flush
//! of [`PagedCachedFile`](crate::PagedCachedFile) writes runs as
//! `IORING_OP_WRITEV` SQEs from page memory
//! ([`write_vectored`](SlotRing::write_vectored)) or, under `O_DIRECT`,
//! copied into the ring's buffers ([`write_copied`](SlotRing::write_copied));
//! the tools crate drives the buffers itself ([`push`](SlotRing::push),
//! [`wait`](SlotRing::wait)).
//!
//! The ring owns a fixed set of aligned buffers ("slots", `buffers.rs`),
//! optionally registered (`IORING_REGISTER_BUFFERS`, `_FIXED` opcodes), and
//! a duplicate of the file's descriptor, optionally registered. Memory the
//! kernel may touch stays valid: a slot with an SQE in flight is refused by
//! [`buf`](SlotRing::buf), [`take`](SlotRing::take) and
//! [`push`](SlotRing::push) until its CQE is reaped; a lent [`SlotBuf`]
//! shares ownership with the ring; registered buffers are freed only after
//! `Drop` unregistered them and waited for every SQE in flight (or leaked
//! them); borrowed page memory of `write_vectored` is used only within
//! that call.
//!
//! A transfer is reported once, complete or failed: short transfers and
//! `EAGAIN`/`EINTR` completions are resubmitted (up to [`MAX_RETRIES`]
//! times); a read that meets the end of the file reports what it got.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, squeue, types};

use super::device::IOV_MAX;
use super::engine::MAX_QUEUE_DEPTH;
use super::storage::UringFault;
use crate::buffer::AlignedBuf;

mod buffers;

pub use buffers::SlotBuf;
use buffers::SlotBuffers;

/// Resubmissions of one transfer after `EAGAIN` or `EINTR` before its error
/// is reported.
pub const MAX_RETRIES: u32 = 1000;

/// `user_data` bit that marks a vectored transfer (its tag in the low
/// bits); without it, `user_data` is a slot number.
const VECTORED: u64 = 1 << 63;

/// The fail point of tests: asked before each SQE with (file offset,
/// bytes), it may make the SQE a short transfer or complete it with an
/// error. `None` outside tests.
pub type FaultHook<'a> = Option<&'a dyn Fn(u64, usize) -> Option<UringFault>>;

/// How to set a ring up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingOptions {
    /// SQ entries and most SQEs in flight, 1..=[`MAX_QUEUE_DEPTH`].
    pub queue_depth: u32,
    /// Register the file (`IORING_REGISTER_FILES`): saves the per-I/O file
    /// reference count.
    pub register_file: bool,
    /// Register the slots (`IORING_REGISTER_BUFFERS`) and use the `_FIXED`
    /// opcodes: saves pinning the pages on every I/O. The pages are pinned
    /// once, counted against `RLIMIT_MEMLOCK` unless `CAP_IPC_LOCK`.
    pub fixed_buffers: bool,
    /// One thread submits and reaps (`IORING_SETUP_SINGLE_ISSUER` with
    /// `COOP_TASKRUN`; a plain ring on older kernels). Off for a ring used
    /// from several threads in turn (a flush): the kernel refuses them.
    pub single_issuer: bool,
    /// A kernel thread polls the SQ (`IORING_SETUP_SQPOLL`, idle 1000 ms).
    pub sqpoll: bool,
    /// Busy-poll completions (`IORING_SETUP_IOPOLL`): needs `O_DIRECT` and
    /// a device with poll queues, else each I/O fails with `EOPNOTSUPP`.
    pub iopoll: bool,
}

impl RingOptions {
    /// Queue depth `queue_depth`, file and buffers registered, one issuing
    /// thread, no polling.
    pub fn new(queue_depth: u32) -> Self {
        Self {
            queue_depth,
            register_file: true,
            fixed_buffers: true,
            single_issuer: true,
            sqpoll: false,
            iopoll: false,
        }
    }
}

/// Which step of ring setup failed, and how.
#[derive(Debug)]
pub struct RingSetupError {
    /// `"io_uring setup"`, `"dup file descriptor"`, `"register files"` or
    /// `"register buffers"`.
    pub stage: &'static str,
    /// The kernel's error.
    pub source: io::Error,
}

impl std::fmt::Display for RingSetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.stage, self.source)
    }
}

impl std::error::Error for RingSetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl From<RingSetupError> for io::Error {
    fn from(e: RingSetupError) -> Self {
        io::Error::new(e.source.kind(), e.to_string())
    }
}

/// A read or a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingOp {
    /// Read from the file into the slot.
    Read,
    /// Write from the slot to the file.
    Write,
}

/// One finished transfer.
#[derive(Debug)]
pub struct Completion {
    /// The slot, now free to touch.
    pub slot: usize,
    /// What was asked.
    pub op: RingOp,
    /// File offset of the transfer's first byte.
    pub offset: u64,
    /// Bytes asked for.
    pub len: usize,
    /// Bytes transferred, all of `len` unless a read met the end of the
    /// file; or the error (the transfer may have been partly done).
    pub result: io::Result<usize>,
    /// From [`push`](SlotRing::push) to the reap that saw the last CQE.
    pub latency: Duration,
}

/// A transfer in flight: where it started and how far it got.
#[derive(Debug)]
struct Pending {
    op: RingOp,
    offset: u64,
    len: usize,
    /// Bytes done by earlier SQEs of this transfer.
    done: usize,
    /// Byte in the slot's buffer where the transfer starts.
    at: usize,
    retries: u32,
    /// An injected error to report at the next CQE (fail point).
    forced: Option<i32>,
    start: Instant,
}

/// A vectored transfer's state: the caller's segments, and the iovecs of
/// the SQE in flight (kept alive until its CQE).
#[derive(Default)]
struct VecIo {
    pending: Option<Pending>,
    segs: Vec<libc::iovec>,
    sqe_iov: Vec<libc::iovec>,
}

// SAFETY: the iovecs only describe memory of a `write_vectored` call,
// which is borrowed for the whole call and not used after it returns.
unsafe impl Send for VecIo {}
// SAFETY: as for `Send`; the ring is only used through `&mut self`
// when a `VecIo` is read.
unsafe impl Sync for VecIo {}

/// A ring with its own buffers; see the [module docs](self).
pub struct SlotRing {
    ring: IoUring,
    /// The ring's own descriptor of the file (a dup), so SQEs never name a
    /// descriptor that was closed (or reused) behind the ring's back.
    fd: OwnedFd,
    opts: RingOptions,
    /// The slots' memory and who holds each.
    buffers: SlotBuffers,
    /// Per slot: the transfer in flight from it.
    slot_io: Vec<Option<Pending>>,
    buffers_registered: bool,
    /// One per tag of `write_vectored` (`queue_depth` of them, made at
    /// its first call).
    vec_io: Vec<VecIo>,
    /// Tags of `vec_io` not in flight (kept between calls).
    free_tags: Vec<usize>,
    /// Per slot or tag: the job of `write_vectored`/`write_copied` it
    /// carries.
    job_of: Vec<usize>,
    in_flight: u32,
    /// SQEs pushed since the last submit.
    unsubmitted: u32,
    enter_calls: u64,
    /// `rw_flags` of every write SQE (`RWF_ATOMIC`, ...); 0 by default.
    write_flags: i32,
    /// CQEs copied out of the CQ before they are handled (reused).
    cqes: Vec<(u64, i32)>,
    /// Completions `drive` reaped and has not yet handled (reused).
    done: Vec<Completion>,
}

impl std::fmt::Debug for SlotRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotRing")
            .field("opts", &self.opts)
            .field("slots", &self.buffers.count())
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// Where a vectored transfer's bytes are, and at which file offset.
#[derive(Debug)]
pub struct VectoredRun<'a, 'b> {
    /// File offset of the first byte.
    pub offset: u64,
    /// The bytes, in order.
    pub bufs: &'a [IoSlice<'b>],
}

/// A job of [`SlotRing::write_copied`]: `len` bytes at file `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyJob {
    /// File offset in bytes.
    pub offset: u64,
    /// Bytes; at most one slot's buffer.
    pub len: usize,
}

impl SlotRing {
    /// A ring on a duplicate of `file`'s descriptor, owning `bufs` as slots
    /// `0..bufs.len()` (none for a ring that only writes vectored).
    ///
    /// Errors, the buffers dropped with them: `io_uring setup` (`EINVAL` for
    /// a queue depth outside 1..=[`MAX_QUEUE_DEPTH`], `EPERM`/`ENOSYS` where
    /// io_uring is disabled), `dup file descriptor`, `register files`,
    /// `register buffers` (`ENOMEM`/`EPERM` past `RLIMIT_MEMLOCK`).
    pub fn new(
        file: &File,
        opts: RingOptions,
        bufs: Vec<AlignedBuf>,
    ) -> Result<Self, RingSetupError> {
        let fail = |stage, source| RingSetupError { stage, source };
        if !(1..=MAX_QUEUE_DEPTH).contains(&opts.queue_depth) {
            return Err(fail(
                "io_uring setup",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "queue depth {} is not in 1..={MAX_QUEUE_DEPTH}",
                        opts.queue_depth
                    ),
                ),
            ));
        }
        let build = |lean: bool| {
            let mut builder = IoUring::builder();
            if opts.sqpoll {
                builder.setup_sqpoll(1000);
            }
            if opts.iopoll {
                builder.setup_iopoll();
            }
            if lean {
                // DEFER_TASKRUN was tried too: no better on 128 KiB reads.
                builder.setup_coop_taskrun().setup_single_issuer();
            }
            builder.build(opts.queue_depth)
        };
        let lean = opts.single_issuer && !opts.sqpoll;
        let ring = build(lean)
            .or_else(|e| if lean { build(false) } else { Err(e) })
            .map_err(|e| fail("io_uring setup", e))?;
        let fd = file
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| fail("dup file descriptor", e))?;
        if opts.register_file {
            ring.submitter()
                .register_files(&[fd.as_raw_fd()])
                .map_err(|e| fail("register files", e))?;
        }
        let buffers = SlotBuffers::new(bufs);
        let mut buffers_registered = false;
        if opts.fixed_buffers && buffers.count() > 0 {
            let iovecs = buffers.iovecs();
            // SAFETY: every iovec describes a live buffer owned by
            // `buffers`, whose memory is freed only after `Drop`
            // unregistered it (a `SlotBuf` lent out shares ownership).
            unsafe { ring.submitter().register_buffers(&iovecs) }
                .map_err(|e| fail("register buffers", e))?;
            buffers_registered = true;
        }
        let qd = opts.queue_depth as usize;
        Ok(Self {
            ring,
            fd,
            opts,
            buffers_registered,
            vec_io: Vec::new(),
            free_tags: Vec::new(),
            job_of: vec![0; qd.max(buffers.count())],
            slot_io: (0..buffers.count()).map(|_| None).collect(),
            buffers,
            in_flight: 0,
            unsubmitted: 0,
            enter_calls: 0,
            write_flags: 0,
            cqes: Vec::with_capacity(qd),
            done: Vec::new(),
        })
    }

    /// The options the ring was set up with.
    pub fn options(&self) -> RingOptions {
        self.opts
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.buffers.count()
    }

    /// Whether the slots' buffers are registered (the `_FIXED` opcodes).
    pub fn buffers_registered(&self) -> bool {
        self.buffers_registered
    }

    /// Transfers pushed and not yet reported.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// `io_uring_enter` calls made so far.
    pub fn enter_calls(&self) -> u64 {
        self.enter_calls
    }

    /// The slot's buffer; `None` while it is in flight or lent out.
    pub fn buf(&self, slot: usize) -> Option<&[u8]> {
        self.buffers.get(slot)
    }

    /// The slot's buffer to fill; `None` while it is in flight or lent out.
    pub fn buf_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        self.buffers.get_mut(slot)
    }

    /// Lends the slot's buffer out (to fill on another thread); `None`
    /// while it is in flight or already out. The slot cannot be used until
    /// the buffer is [`put`](Self::put) back.
    pub fn take(&mut self, slot: usize) -> Option<SlotBuf> {
        self.buffers.lend(slot)
    }

    /// Puts a lent buffer back into its slot; gives it back if it is not
    /// this ring's.
    pub fn put(&mut self, buf: SlotBuf) -> Result<(), SlotBuf> {
        self.buffers.put(buf)
    }

    /// Queues `op` on bytes `start..start + len` of the slot's buffer, at
    /// file `offset`. Nothing reaches the kernel until
    /// [`submit`](Self::submit) or [`wait`](Self::wait).
    ///
    /// Errors (`InvalidInput`, nothing queued): no such slot, the slot is
    /// in flight or lent out, the range is outside the buffer or over
    /// 2 GiB, or `queue_depth` transfers are already in flight.
    pub fn push(
        &mut self,
        slot: usize,
        op: RingOp,
        offset: u64,
        start: usize,
        len: usize,
    ) -> io::Result<()> {
        self.push_slot(slot, op, offset, start, len, None)
    }

    fn push_slot(
        &mut self,
        slot: usize,
        op: RingOp,
        offset: u64,
        start: usize,
        len: usize,
        fault: FaultHook<'_>,
    ) -> io::Result<()> {
        if self.in_flight >= self.opts.queue_depth {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queue depth reached",
            ));
        }
        self.buffers.give_to_kernel(slot, start, len)?;
        self.slot_io[slot] = Some(Pending::new(op, offset, len, start));
        self.start(slot as u64, fault)
    }

    /// Writes `bufs` at `offset` as vectored SQEs under `tag`.
    ///
    /// # Safety
    /// The memory `bufs` describes must stay valid and unchanged until the
    /// transfer's completion was reaped.
    unsafe fn push_vectored(
        &mut self,
        tag: usize,
        offset: u64,
        bufs: &[IoSlice<'_>],
        fault: FaultHook<'_>,
    ) -> io::Result<()> {
        let v = &mut self.vec_io[tag];
        debug_assert!(v.pending.is_none(), "tag {tag} reused while in flight");
        v.segs.clear();
        // Slices adjacent in memory become one segment.
        v.segs.extend(super::sys::joined_iovecs(bufs));
        let len = bufs.iter().map(|b| b.len()).sum();
        v.pending = Some(Pending::new(RingOp::Write, offset, len, 0));
        self.start(tag as u64 | VECTORED, fault)
    }

    /// Queues the first SQE of a transfer just made pending; undoes it if
    /// the SQ refuses.
    fn start(&mut self, id: u64, fault: FaultHook<'_>) -> io::Result<()> {
        let sqe = self.next_sqe(id, fault);
        if let Err(e) = self.queue(&sqe) {
            self.pending_mut(id).take();
            if id & VECTORED == 0 {
                self.buffers.returned(id as usize);
            }
            return Err(e);
        }
        self.in_flight += 1;
        Ok(())
    }

    fn pending_mut(&mut self, id: u64) -> &mut Option<Pending> {
        if id & VECTORED != 0 {
            &mut self.vec_io[(id & !VECTORED) as usize].pending
        } else {
            &mut self.slot_io[id as usize]
        }
    }

    /// The SQE for what is left of transfer `id` (its `Pending` is set).
    fn next_sqe(&mut self, id: u64, fault: FaultHook<'_>) -> squeue::Entry {
        let raw_fd = self.fd.as_raw_fd();
        let register_file = self.opts.register_file;
        let flags = self.write_flags;
        // With flags (RWF_ATOMIC), a plain WRITE: the kernel takes an
        // atomic write only from one user buffer (`iter_is_ubuf`), and a
        // registered buffer is a bvec (EINVAL, measured on XFS, 6.18).
        let fixed = self.buffers_registered && flags == 0;
        // `types::Fixed` and `types::Fd` are different types: the opcode
        // choice is written once and expanded for each.
        macro_rules! with_fd {
            ($build:ident) => {
                if register_file {
                    $build!(types::Fixed(0))
                } else {
                    $build!(types::Fd(raw_fd))
                }
            };
        }
        if id & VECTORED != 0 {
            let v = &mut self.vec_io[(id & !VECTORED) as usize];
            let p = v.pending.as_mut().expect("a transfer in flight");
            v.sqe_iov.clear();
            let mut skip = p.done;
            for s in &v.segs {
                if skip >= s.iov_len {
                    skip -= s.iov_len;
                    continue;
                }
                v.sqe_iov.push(libc::iovec {
                    iov_base: (s.iov_base as usize + skip) as *mut libc::c_void,
                    iov_len: s.iov_len - skip,
                });
                skip = 0;
                if v.sqe_iov.len() == IOV_MAX {
                    break;
                }
            }
            let at = p.offset + p.done as u64;
            let bytes: usize = v.sqe_iov.iter().map(|i| i.iov_len).sum();
            match fault.and_then(|f| f(at, bytes)) {
                Some(UringFault::Short(k)) if k > 0 && k < bytes => {
                    let mut left = k;
                    v.sqe_iov.retain_mut(|i| {
                        let keep = left > 0;
                        i.iov_len = i.iov_len.min(left);
                        left -= i.iov_len;
                        keep
                    });
                }
                Some(UringFault::Errno(e)) => p.forced = Some(e),
                _ => {}
            }
            let (ptr, n) = (v.sqe_iov.as_ptr(), v.sqe_iov.len() as u32);
            macro_rules! writev {
                ($fd:expr) => {
                    opcode::Writev::new($fd, ptr, n)
                        .offset(at)
                        .rw_flags(flags)
                        .build()
                };
            }
            return with_fd!(writev).user_data(id);
        }
        let slot = id as usize;
        let base = self.buffers.base(slot);
        let p = self.slot_io[slot].as_mut().expect("a transfer in flight");
        let ptr = (base + p.at + p.done) as *mut u8;
        let at = p.offset + p.done as u64;
        let mut len = (p.len - p.done) as u32;
        match fault.and_then(|f| f(at, len as usize)) {
            Some(UringFault::Short(k)) if k > 0 && k < len as usize => len = k as u32,
            Some(UringFault::Errno(e)) => p.forced = Some(e),
            _ => {}
        }
        let (op, buf_index) = (p.op, slot as u16);
        macro_rules! rw {
            ($fd:expr) => {
                match (op, fixed) {
                    (RingOp::Write, true) => opcode::WriteFixed::new($fd, ptr, len, buf_index)
                        .offset(at)
                        .rw_flags(flags)
                        .build(),
                    (RingOp::Write, false) => opcode::Write::new($fd, ptr, len)
                        .offset(at)
                        .rw_flags(flags)
                        .build(),
                    (RingOp::Read, true) => opcode::ReadFixed::new($fd, ptr, len, buf_index)
                        .offset(at)
                        .build(),
                    (RingOp::Read, false) => opcode::Read::new($fd, ptr, len).offset(at).build(),
                }
            };
        }
        with_fd!(rw).user_data(id)
    }

    /// Puts one SQE in the submission queue.
    fn queue(&mut self, sqe: &squeue::Entry) -> io::Result<()> {
        // SAFETY: every SQE points at memory that outlives the kernel's use
        // of it:
        // - a slot's buffer: the slot is pending from here until its last
        //   CQE is reaped, and meanwhile `buf`, `buf_mut`, `take` and
        //   `push` refuse it; the memory is owned by the ring (and freed
        //   only after `Drop` waited for every SQE in flight);
        // - a vectored transfer: its segments are borrowed for the whole
        //   `write_vectored` call, which returns only when nothing is in
        //   flight; the iovec array is `VecIo::sqe_iov`, left untouched
        //   until the SQE's CQE is reaped.
        // A transfer has at most one SQE in flight.
        if unsafe { self.ring.submission().push(sqe) }.is_err() {
            // The SQ has queue_depth entries, and no more transfers are in
            // flight.
            return Err(io::Error::other("submission queue full"));
        }
        self.unsubmitted += 1;
        Ok(())
    }

    /// Sets the `rw_flags` of the write SQEs queued from now on (for
    /// example `RWF_ATOMIC`, which takes one segment of a power-of-two
    /// length aligned to it: write with [`write_copied`](Self::write_copied)
    /// then). 0 for plain writes. While set, slot writes go out as plain
    /// `WRITE`, not `WRITE_FIXED`.
    pub fn set_write_flags(&mut self, flags: i32) {
        self.write_flags = flags;
    }

    /// Sets or clears `RWF_ATOMIC` on the writes queued from now on (see
    /// [`set_write_flags`](Self::set_write_flags)).
    pub fn set_atomic(&mut self, on: bool) {
        self.set_write_flags(if on { libc::RWF_ATOMIC } else { 0 });
    }

    /// Submits what is queued without waiting. Returns SQEs submitted.
    ///
    /// Errors: `io_uring_enter`'s, other than `EINTR`/`EAGAIN`/`EBUSY`
    /// (those return 0; the SQEs stay queued).
    pub fn submit(&mut self) -> io::Result<usize> {
        self.enter_calls += 1;
        match self.ring.submit() {
            Ok(n) => {
                self.note_submitted(n);
                Ok(n)
            }
            Err(e) if retryable(&e) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Submits what is queued (resubmissions included), waits until at
    /// least `min` transfers finished (fewer if fewer are in flight), and
    /// appends every finished one to `out`; returns the number appended.
    ///
    /// Errors: `io_uring_enter`'s, other than `EINTR`/`EAGAIN`/`EBUSY`.
    pub fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<usize> {
        self.wait_with(min, out, None)
    }

    fn wait_with(
        &mut self,
        min: usize,
        out: &mut Vec<Completion>,
        fault: FaultHook<'_>,
    ) -> io::Result<usize> {
        let min = min.min(self.in_flight as usize);
        let mut got = self.reap_with(out, fault);
        while got < min || self.unsubmitted > 0 {
            self.enter_calls += 1;
            match self.ring.submit_and_wait(min.saturating_sub(got)) {
                Ok(n) => self.note_submitted(n),
                Err(e) if retryable(&e) => {}
                Err(e) => return Err(e),
            }
            got += self.reap_with(out, fault);
        }
        Ok(got)
    }

    /// Accounts `n` SQEs taken by an enter. Under SQPOLL the kernel thread
    /// takes them by itself (the enter reports 0), so all count as gone.
    fn note_submitted(&mut self, n: usize) {
        self.unsubmitted = if self.opts.sqpoll {
            0
        } else {
            self.unsubmitted.saturating_sub(n as u32)
        };
    }

    /// Appends every finished transfer to `out` without entering the
    /// kernel; short and interrupted ones are queued again for the rest.
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        self.reap_with(out, None)
    }

    fn reap_with(&mut self, out: &mut Vec<Completion>, fault: FaultHook<'_>) -> usize {
        let mut cqes = std::mem::take(&mut self.cqes);
        {
            let mut cq = self.ring.completion();
            cq.sync();
            cqes.extend((&mut cq).map(|c| (c.user_data(), c.result())));
        }
        let now = Instant::now();
        let mut n = 0;
        for (id, res) in cqes.drain(..) {
            let Some(p) = self.pending_mut(id).as_mut() else {
                continue;
            };
            let res = p.forced.take().map_or(res, |e| -e);
            let result = if res > 0 {
                p.done += res as usize;
                debug_assert!(p.done <= p.len, "the kernel transferred more than asked");
                (p.done >= p.len).then_some(Ok(p.done))
            } else if res == 0 {
                // End of file for a read; a write that cannot go on.
                Some(match p.op {
                    RingOp::Read => Ok(p.done),
                    RingOp::Write => Err(io::ErrorKind::WriteZero.into()),
                })
            } else if (res == -libc::EAGAIN || res == -libc::EINTR) && p.retries < MAX_RETRIES {
                p.retries += 1;
                None
            } else {
                Some(Err(io::Error::from_raw_os_error(-res)))
            };
            let result = match result {
                Some(r) => r,
                None => {
                    // Resubmit the rest; the transfer stays in flight.
                    let sqe = self.next_sqe(id, fault);
                    match self.queue(&sqe) {
                        Ok(()) => continue,
                        Err(e) => Err(e),
                    }
                }
            };
            let p = self.pending_mut(id).take().expect("checked above");
            if id & VECTORED == 0 {
                self.buffers.returned(id as usize);
            }
            self.in_flight -= 1;
            n += 1;
            out.push(Completion {
                slot: (id & !VECTORED) as usize,
                op: p.op,
                offset: p.offset,
                len: p.len,
                result,
                latency: now.saturating_duration_since(p.start),
            });
        }
        self.cqes = cqes;
        n
    }

    /// Runs jobs `0..jobs`: `begin(ring, job)` pushes one while fewer than
    /// `capacity` are in flight, `end(ring, completion)` accounts one.
    /// Returns when nothing is in flight, also after an `io_uring_enter`
    /// failure (returned; no further job begins).
    fn drive(
        &mut self,
        jobs: usize,
        capacity: u32,
        fault: FaultHook<'_>,
        begin: &mut dyn FnMut(&mut Self, usize) -> io::Result<()>,
        end: &mut dyn FnMut(&mut Self, Completion),
    ) -> io::Result<()> {
        if self.in_flight > 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "transfers pushed by the caller are still in flight",
            ));
        }
        let mut next = 0;
        let mut fatal: Option<io::Error> = None;
        let mut done = std::mem::take(&mut self.done);
        loop {
            while fatal.is_none() && next < jobs && self.in_flight < capacity {
                if let Err(e) = begin(self, next) {
                    fatal = Some(e);
                }
                next += 1;
            }
            if self.in_flight == 0 && (next >= jobs || fatal.is_some()) {
                break;
            }
            match self.wait_with(1, &mut done, fault) {
                Ok(_) => {}
                Err(e) => {
                    // Submit nothing more, but keep reaping until nothing
                    // is in flight; the pause lets task work post CQEs.
                    fatal.get_or_insert(e);
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            for c in done.drain(..) {
                end(self, c);
            }
        }
        self.done = done;
        fatal.map_or(Ok(()), Err)
    }

    /// Writes each run from the caller's memory as `IORING_OP_WRITEV`
    /// SQEs, up to `queue_depth` at once (over `IOV_MAX` segments: several
    /// SQEs in turn), returning when none is in flight. Sets `errors` to
    /// each run's error: a failed run does not stop the others. `fault` is
    /// the test fail point.
    ///
    /// Errors (`Err`): `InvalidInput` if [`push`](Self::push)ed transfers
    /// are in flight (nothing written); `io_uring_enter` failing (other
    /// than `EINTR`/`EBUSY`/`EAGAIN`), any run then maybe partly written.
    pub fn write_vectored(
        &mut self,
        runs: &[VectoredRun<'_, '_>],
        errors: &mut Vec<Option<io::Error>>,
        fault: FaultHook<'_>,
    ) -> io::Result<()> {
        let qd = self.opts.queue_depth as usize;
        if self.vec_io.len() < qd {
            self.vec_io.resize_with(qd, VecIo::default);
        }
        self.free_tags.clear();
        self.free_tags.extend((0..qd).rev());
        errors.clear();
        errors.resize_with(runs.len(), || None);
        let mut begin = |ring: &mut Self, j: usize| {
            let run = &runs[j];
            if run.bufs.iter().all(|b| b.is_empty()) {
                return Ok(());
            }
            let tag = ring.free_tags.pop().expect("fewer than qd in flight");
            ring.job_of[tag] = j;
            // SAFETY: `runs` is borrowed for this whole call, and `drive`
            // returns only when nothing is in flight.
            let pushed = unsafe { ring.push_vectored(tag, run.offset, run.bufs, fault) };
            if pushed.is_err() {
                ring.free_tags.push(tag);
            }
            pushed
        };
        let mut end = |ring: &mut Self, c: Completion| {
            ring.free_tags.push(c.slot);
            errors[ring.job_of[c.slot]] = c.result.err();
        };
        self.drive(
            runs.len(),
            self.opts.queue_depth,
            fault,
            &mut begin,
            &mut end,
        )
    }

    /// Writes each job from the ring's own buffers: `fill(job, buf)` copies
    /// its bytes into a free slot, which goes out as one segment; up to
    /// `min(queue_depth, slots)` writes in flight, the next copy overlapping
    /// them. Sets `errors` as [`write_vectored`](Self::write_vectored) does.
    ///
    /// Errors (`Err`): `InvalidInput` if the ring has no slot or a job is
    /// longer than a slot's buffer (nothing written); otherwise as
    /// [`write_vectored`](Self::write_vectored).
    ///
    /// Panics: if `fill` panics. The SQEs then in flight point only at the
    /// ring's own slots, which stay valid: the ring's `Drop` waits for them.
    pub fn write_copied(
        &mut self,
        jobs: &[CopyJob],
        fill: &mut dyn FnMut(usize, &mut [u8]),
        errors: &mut Vec<Option<io::Error>>,
        fault: FaultHook<'_>,
    ) -> io::Result<()> {
        let shortest = self.buffers.shortest();
        if self.buffers.count() == 0 || jobs.iter().any(|j| j.len > shortest) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no slot, or a job longer than a slot's buffer",
            ));
        }
        let capacity = self.opts.queue_depth.min(self.buffers.count() as u32);
        errors.clear();
        errors.resize_with(jobs.len(), || None);
        let mut begin = |ring: &mut Self, j: usize| {
            let job = jobs[j];
            if job.len == 0 {
                return Ok(());
            }
            let slot = ring
                .buffers
                .first_home()
                .ok_or_else(|| io::Error::other("no free slot"))?;
            fill(j, &mut ring.buf_mut(slot).expect("a free slot")[..job.len]);
            ring.job_of[slot] = j;
            ring.push_slot(slot, RingOp::Write, job.offset, 0, job.len, fault)
        };
        let mut end = |ring: &mut Self, c: Completion| {
            errors[ring.job_of[c.slot]] = c.result.err();
        };
        self.drive(jobs.len(), capacity, fault, &mut begin, &mut end)
    }
}

impl Pending {
    fn new(op: RingOp, offset: u64, len: usize, at: usize) -> Self {
        Self {
            op,
            offset,
            len,
            done: 0,
            at,
            retries: 0,
            forced: None,
            start: Instant::now(),
        }
    }
}

fn retryable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

impl Drop for SlotRing {
    fn drop(&mut self) {
        let mut sink = Vec::new();
        let mut failures = 0;
        while self.in_flight > 0 && failures < 100 {
            if self.wait(1, &mut sink).is_err() {
                failures += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            sink.clear();
        }
        let unregistered =
            !self.buffers_registered || self.ring.submitter().unregister_buffers().is_ok();
        if self.in_flight > 0 || !unregistered {
            // The kernel may still use these buffers: never free them.
            self.buffers.leak();
        }
    }
}
#[cfg(test)]
mod tests;
