//! A ring that owns its I/O buffers (Linux, cargo feature `io-uring`).
//!
//! [`SlotRing`] holds a fixed set of aligned buffers ("slots"), optionally
//! registered with the kernel (`IORING_REGISTER_BUFFERS`, then
//! `IORING_OP_{READ,WRITE}_FIXED`), and the file, optionally registered
//! (`IORING_REGISTER_FILES`). A slot with an SQE in flight cannot be
//! touched: [`buf`](SlotRing::buf) and [`take`](SlotRing::take) return
//! `None` for it until its CQE is reaped, and dropping the ring waits for
//! every SQE in flight. That makes the ring safe to drive from ordinary
//! code: the streaming writer and the fio-style I/O worker of the tools
//! crate (`pagewriter-bench`) are built on it.
//!
//! Short transfers are reported, not continued: the caller resubmits the
//! rest (it knows whether a short read at end of file is an error).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, squeue, types};

use crate::buffer::AlignedBuf;

/// How to set a ring up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingOptions {
    /// SQ entries and most SQEs in flight, 1..=4096.
    pub queue_depth: u32,
    /// Register the file (`IORING_REGISTER_FILES`): saves the per-I/O file
    /// reference count.
    pub register_file: bool,
    /// Register the slots (`IORING_REGISTER_BUFFERS`) and use the `_FIXED`
    /// opcodes: saves pinning the pages on every I/O. The pages are pinned
    /// once, counted against `RLIMIT_MEMLOCK` unless `CAP_IPC_LOCK`.
    pub fixed_buffers: bool,
    /// A kernel thread polls the SQ (`IORING_SETUP_SQPOLL`, idle 1000 ms):
    /// submission without a syscall while it is awake.
    pub sqpoll: bool,
    /// Busy-poll completions (`IORING_SETUP_IOPOLL`): needs `O_DIRECT` and
    /// a device with poll queues (NVMe `poll_queues`), else each I/O
    /// completes with `EOPNOTSUPP`.
    pub iopoll: bool,
}

impl RingOptions {
    /// Queue depth `queue_depth`, file and buffers registered, no polling.
    pub fn new(queue_depth: u32) -> Self {
        Self {
            queue_depth,
            register_file: true,
            fixed_buffers: true,
            sqpoll: false,
            iopoll: false,
        }
    }
}

/// Which step of ring setup failed, and how.
#[derive(Debug)]
pub struct RingSetupError {
    /// `"io_uring setup"`, `"register files"` or `"register buffers"`.
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

/// A read or a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingOp {
    /// Read from the file into the slot.
    Read,
    /// Write from the slot to the file.
    Write,
}

/// One reaped CQE.
#[derive(Debug)]
pub struct Completion {
    /// The slot, now free to touch.
    pub slot: usize,
    /// What was asked.
    pub op: RingOp,
    /// File offset of the I/O in bytes.
    pub offset: u64,
    /// Bytes asked for.
    pub len: usize,
    /// Bytes transferred (may be short of `len`), or the error.
    pub result: io::Result<usize>,
    /// From [`push`](SlotRing::push) to the reap that saw the CQE.
    pub latency: Duration,
}

#[derive(Debug)]
struct Pending {
    op: RingOp,
    offset: u64,
    len: usize,
    start: Instant,
}

#[derive(Debug)]
struct Slot {
    buf: Option<AlignedBuf>,
    /// Start address registered for this slot, if buffers are registered.
    registered: Option<usize>,
    pending: Option<Pending>,
}

/// A ring with its own buffers; see the [module docs](self).
pub struct SlotRing {
    ring: IoUring,
    /// The ring's own descriptor of the file (a dup), so SQEs never name a
    /// descriptor that was closed (or reused) behind the ring's back.
    fd: OwnedFd,
    opts: RingOptions,
    slots: Vec<Slot>,
    in_flight: u32,
    /// SQEs pushed since the last submit.
    unsubmitted: u32,
    enter_calls: u64,
}

impl std::fmt::Debug for SlotRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotRing")
            .field("opts", &self.opts)
            .field("slots", &self.slots.len())
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl SlotRing {
    /// A ring on `file` (through a duplicate descriptor the ring owns)
    /// owning `bufs` as slots `0..bufs.len()`.
    ///
    /// Errors: `io_uring setup` (`EINVAL` for a queue depth outside
    /// 1..=[`MAX_QUEUE_DEPTH`](crate::backend::MAX_QUEUE_DEPTH) or unsupported flags, `EPERM`/`ENOSYS` where io_uring is
    /// disabled), `register files`, `register buffers` (`ENOMEM`/`EPERM`
    /// past `RLIMIT_MEMLOCK`, `EINVAL` for more than 16384 buffers or one
    /// over 1 GiB); the buffers are dropped with the error.
    pub fn new(
        file: &File,
        opts: RingOptions,
        bufs: Vec<AlignedBuf>,
    ) -> Result<Self, RingSetupError> {
        let fail = |stage, source| RingSetupError { stage, source };
        if !(1..=crate::backend::MAX_QUEUE_DEPTH).contains(&opts.queue_depth) {
            return Err(fail(
                "io_uring setup",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "queue depth {} is not in 1..={}",
                        opts.queue_depth,
                        crate::backend::MAX_QUEUE_DEPTH
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
            if lean && !opts.sqpoll {
                // One thread submits and reaps: completions' task work runs
                // at its next kernel entry instead of interrupting it
                // (COOP_TASKRUN, 5.19+; SINGLE_ISSUER, 6.0+). DEFER_TASKRUN
                // was tried too: no better on 128 KiB reads (noisy A/B,
                // `.project/io-worker.md`).
                builder.setup_coop_taskrun().setup_single_issuer();
            }
            builder.build(opts.queue_depth)
        };
        let ring = build(true)
            .or_else(|_| build(false))
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
        let mut slots: Vec<Slot> = bufs
            .into_iter()
            .map(|buf| Slot {
                buf: Some(buf),
                registered: None,
                pending: None,
            })
            .collect();
        if opts.fixed_buffers && !slots.is_empty() {
            let iovecs: Vec<libc::iovec> = slots
                .iter_mut()
                .map(|s| {
                    let b = s.buf.as_mut().expect("all slots filled at setup");
                    libc::iovec {
                        iov_base: b.as_mut_ptr().cast(),
                        iov_len: b.len(),
                    }
                })
                .collect();
            // SAFETY: every iovec describes a live buffer owned by `slots`.
            // The kernel pins the pages, so they stay valid for the kernel
            // even if a buffer is later taken out and freed; fixed opcodes
            // are only issued for a slot whose current buffer is the one
            // registered (checked in `push`).
            unsafe { ring.submitter().register_buffers(&iovecs) }
                .map_err(|e| fail("register buffers", e))?;
            for (s, iov) in slots.iter_mut().zip(&iovecs) {
                s.registered = Some(iov.iov_base as usize);
            }
        }
        Ok(Self {
            ring,
            fd,
            opts,
            slots,
            in_flight: 0,
            unsubmitted: 0,
            enter_calls: 0,
        })
    }

    /// The options the ring was set up with.
    pub fn options(&self) -> RingOptions {
        self.opts
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// SQEs pushed and not yet reaped.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// `io_uring_enter` calls made so far.
    pub fn enter_calls(&self) -> u64 {
        self.enter_calls
    }

    /// The slot's buffer; `None` while it is in flight or taken out.
    pub fn buf(&self, slot: usize) -> Option<&AlignedBuf> {
        let s = self.slots.get(slot)?;
        if s.pending.is_some() {
            return None;
        }
        s.buf.as_ref()
    }

    /// The slot's buffer to fill; `None` while it is in flight or taken out.
    pub fn buf_mut(&mut self, slot: usize) -> Option<&mut AlignedBuf> {
        let s = self.slots.get_mut(slot)?;
        if s.pending.is_some() {
            return None;
        }
        s.buf.as_mut()
    }

    /// Takes the slot's buffer out (to fill on another thread); `None`
    /// while it is in flight or already out.
    pub fn take(&mut self, slot: usize) -> Option<AlignedBuf> {
        let s = self.slots.get_mut(slot)?;
        if s.pending.is_some() {
            return None;
        }
        s.buf.take()
    }

    /// Puts a buffer back into an empty slot; gives it back if the slot
    /// does not exist or is not empty. A buffer other than the one
    /// registered for the slot is still usable, with the plain opcodes.
    pub fn put(&mut self, slot: usize, buf: AlignedBuf) -> Result<(), AlignedBuf> {
        match self.slots.get_mut(slot) {
            Some(s) if s.buf.is_none() => {
                s.buf = Some(buf);
                Ok(())
            }
            _ => Err(buf),
        }
    }

    /// Queues `op` on bytes `start..start + len` of the slot's buffer, at
    /// file `offset`. Nothing reaches the kernel until
    /// [`submit`](Self::submit) or [`wait`](Self::wait).
    ///
    /// Errors (`InvalidInput`, nothing queued): no such slot, the slot is
    /// in flight or empty, the range is outside the buffer or over 2 GiB,
    /// or `queue_depth` SQEs are already in flight.
    pub fn push(
        &mut self,
        slot: usize,
        op: RingOp,
        offset: u64,
        start: usize,
        len: usize,
    ) -> io::Result<()> {
        let invalid = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, m.to_string());
        if self.in_flight >= self.opts.queue_depth {
            return Err(invalid("queue depth reached"));
        }
        let fd = self.fd.as_raw_fd();
        let register_file = self.opts.register_file;
        let s = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| invalid("no such slot"))?;
        if s.pending.is_some() {
            return Err(invalid("slot in flight"));
        }
        let buf = s.buf.as_mut().ok_or_else(|| invalid("slot is empty"))?;
        let end = start
            .checked_add(len)
            .ok_or_else(|| invalid("range overflows"))?;
        if end > buf.len() || len > i32::MAX as usize {
            return Err(invalid("range outside the slot's buffer"));
        }
        let fixed = s.registered == Some(buf.as_ptr() as usize);
        let ptr = buf[start..].as_mut_ptr();
        // One SQE builder per file type: `types::Fixed` and `types::Fd`
        // are different types, so the opcode choice is written once and
        // expanded for each.
        macro_rules! sqe_for {
            ($fd:expr) => {
                match (op, fixed) {
                    (RingOp::Write, true) => {
                        opcode::WriteFixed::new($fd, ptr, len as u32, slot as u16)
                            .offset(offset)
                            .build()
                    }
                    (RingOp::Write, false) => opcode::Write::new($fd, ptr, len as u32)
                        .offset(offset)
                        .build(),
                    (RingOp::Read, true) => {
                        opcode::ReadFixed::new($fd, ptr, len as u32, slot as u16)
                            .offset(offset)
                            .build()
                    }
                    (RingOp::Read, false) => opcode::Read::new($fd, ptr, len as u32)
                        .offset(offset)
                        .build(),
                }
            };
        }
        let sqe = if register_file {
            sqe_for!(types::Fixed(0))
        } else {
            sqe_for!(types::Fd(fd))
        };
        let sqe: squeue::Entry = sqe.user_data(slot as u64);
        // SAFETY: the SQE points into the slot's buffer, which the ring
        // owns. From here until the CQE is reaped the slot is marked
        // pending, and `buf`, `buf_mut`, `take` and `push` refuse it, so the
        // memory is neither moved, freed nor touched; `Drop` waits for
        // every SQE in flight (or leaks the buffers if it cannot).
        if unsafe { self.ring.submission().push(&sqe) }.is_err() {
            // The SQ has queue_depth entries and fewer are in flight.
            return Err(io::Error::other("submission queue full"));
        }
        s.pending = Some(Pending {
            op,
            offset,
            len,
            start: Instant::now(),
        });
        self.in_flight += 1;
        self.unsubmitted += 1;
        Ok(())
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

    /// Submits what is queued, waits until at least `min` CQEs are ready
    /// (fewer if fewer are in flight), and appends every ready CQE to
    /// `out`. Returns the number appended. Queued SQEs are always
    /// submitted, even when enough CQEs are already waiting.
    ///
    /// Errors: `io_uring_enter`'s, other than `EINTR`/`EAGAIN`/`EBUSY`.
    pub fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<usize> {
        let min = min.min(self.in_flight as usize);
        let mut got = self.reap(out);
        while got < min || self.unsubmitted > 0 {
            self.enter_calls += 1;
            match self.ring.submit_and_wait(min.saturating_sub(got)) {
                Ok(n) => self.note_submitted(n),
                Err(e) if retryable(&e) => {}
                Err(e) => return Err(e),
            }
            got += self.reap(out);
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

    /// Appends every ready CQE to `out` without entering the kernel.
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let now = Instant::now();
        let mut n = 0;
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let slot = cqe.user_data() as usize;
            let Some(p) = self.slots.get_mut(slot).and_then(|s| s.pending.take()) else {
                continue;
            };
            self.in_flight -= 1;
            n += 1;
            let res = cqe.result();
            out.push(Completion {
                slot,
                op: p.op,
                offset: p.offset,
                len: p.len,
                result: if res >= 0 {
                    Ok(res as usize)
                } else {
                    Err(io::Error::from_raw_os_error(-res))
                },
                latency: now.saturating_duration_since(p.start),
            });
        }
        n
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
        if self.in_flight > 0 {
            // The kernel may still write into these buffers: never free them.
            for s in self.slots.drain(..) {
                std::mem::forget(s.buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn bufs(n: usize, len: usize) -> Vec<AlignedBuf> {
        (0..n)
            .map(|_| AlignedBuf::zeroed(len, 4096).unwrap())
            .collect()
    }

    #[test]
    fn writes_and_reads_back_through_fixed_and_plain_buffers() {
        let f = tempfile::tempfile().unwrap();
        for (fixed, file) in [(true, true), (false, false), (true, false), (false, true)] {
            let opts = RingOptions {
                queue_depth: 4,
                register_file: file,
                fixed_buffers: fixed,
                sqpoll: false,
                iopoll: false,
            };
            let mut ring = match SlotRing::new(&f, opts, bufs(4, 8192)) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("io_uring unavailable ({e}); skipped");
                    return;
                }
            };
            for slot in 0..4 {
                ring.buf_mut(slot).unwrap().fill(slot as u8 + 1);
                ring.push(slot, RingOp::Write, slot as u64 * 8192, 0, 8192)
                    .unwrap();
                assert!(ring.buf(slot).is_none(), "in flight slot must be hidden");
                assert!(ring.take(slot).is_none());
            }
            assert!(
                ring.push(0, RingOp::Write, 0, 0, 1).is_err(),
                "slot 0 is busy"
            );
            let mut done = Vec::new();
            while done.len() < 4 {
                ring.wait(4 - done.len(), &mut done).unwrap();
            }
            for c in &done {
                assert_eq!(c.result.as_ref().unwrap(), &8192);
            }
            let mut back = vec![0u8; 8192];
            for slot in 0..4u64 {
                f.read_exact_at(&mut back, slot * 8192).unwrap();
                assert!(back.iter().all(|&b| b == slot as u8 + 1));
            }
            // Read back through the ring into slot 2.
            ring.buf_mut(2).unwrap().fill(0);
            ring.push(2, RingOp::Read, 3 * 8192, 0, 8192).unwrap();
            done.clear();
            ring.wait(1, &mut done).unwrap();
            assert_eq!(done[0].slot, 2);
            assert!(ring.buf(2).unwrap().iter().all(|&b| b == 4));
        }
    }

    #[test]
    fn a_swapped_buffer_goes_out_with_the_plain_opcode() {
        let f = tempfile::tempfile().unwrap();
        let Ok(mut ring) = SlotRing::new(&f, RingOptions::new(2), bufs(1, 4096)) else {
            return;
        };
        let old = ring.take(0).unwrap();
        assert!(ring.take(0).is_none());
        let mut new = AlignedBuf::zeroed(4096, 4096).unwrap();
        new.fill(9);
        ring.put(0, new).unwrap();
        drop(old);
        ring.push(0, RingOp::Write, 0, 0, 4096).unwrap();
        let mut done = Vec::new();
        ring.wait(1, &mut done).unwrap();
        assert_eq!(done[0].result.as_ref().unwrap(), &4096);
        let mut back = vec![0u8; 4096];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back.iter().all(|&b| b == 9));
    }

    #[test]
    fn errors_come_back_per_io_and_bad_pushes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").unwrap();
        let ro = std::fs::File::open(&path).unwrap();
        let Ok(mut ring) = SlotRing::new(&ro, RingOptions::new(2), bufs(2, 4096)) else {
            return;
        };
        assert!(ring.push(5, RingOp::Write, 0, 0, 1).is_err());
        assert!(ring.push(0, RingOp::Write, 0, 4000, 200).is_err());
        ring.push(0, RingOp::Write, 0, 0, 4096).unwrap();
        let mut done = Vec::new();
        ring.wait(1, &mut done).unwrap();
        assert_eq!(
            done[0].result.as_ref().unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        assert!(ring.buf(0).is_some(), "slot is free again after its CQE");
        assert!(SlotRing::new(&ro, RingOptions::new(0), Vec::new()).is_err());
    }
}
