//! io_uring submission of flush runs (Linux, cargo feature `io-uring`).
//!
//! One [`UringWriter`] per file: a ring with the file registered
//! (`IORING_REGISTER_FILES`, addressed as `types::Fixed(0)`), runs submitted
//! as `IORING_OP_WRITEV` SQEs, up to `queue_depth` in flight, one
//! `io_uring_enter` per batch of submissions, completions reaped as they
//! come while the queue is kept full.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use io_uring::{IoUring, opcode, types};

use super::{IOV_MAX, MAX_QUEUE_DEPTH, UringFault};

/// Resubmissions of one run after `EAGAIN` before it counts as failed.
const MAX_EAGAIN: u32 = 1000;

/// One run to write: bytes `iov` at byte `offset`. `iov` is advanced past
/// what was written; on return `error` holds the run's error, if any.
#[derive(Debug)]
pub struct UringRun<'a, 'b> {
    /// Byte offset of the run's first byte.
    pub offset: u64,
    /// The run's buffers; advanced in place as bytes are written.
    pub iov: &'a mut [IoSlice<'b>],
    /// Set if the run failed; its bytes may be partly written.
    pub error: Option<io::Error>,
    eagain: u32,
    /// Truncated iovecs of an injected short write, alive until its CQE.
    truncated: Vec<libc::iovec>,
    /// Injected error to report at the next CQE.
    forced_errno: Option<i32>,
}

impl<'a, 'b> UringRun<'a, 'b> {
    /// A run of `iov` at `offset`.
    pub fn new(offset: u64, iov: &'a mut [IoSlice<'b>]) -> Self {
        Self {
            offset,
            iov,
            error: None,
            eagain: 0,
            truncated: Vec::new(),
            forced_errno: None,
        }
    }
}

/// A ring bound to one file.
pub struct UringWriter {
    ring: IoUring,
    /// The ring's own descriptor of the file (a dup): registered at
    /// setup, so it lives exactly as long as the writer.
    _file: OwnedFd,
    queue_depth: u32,
    submit_calls: u64,
}

impl std::fmt::Debug for UringWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringWriter")
            .field("queue_depth", &self.queue_depth)
            .field("submit_calls", &self.submit_calls)
            .finish_non_exhaustive()
    }
}

impl UringWriter {
    /// Sets up a ring of `queue_depth` SQ entries (1..=[`MAX_QUEUE_DEPTH`])
    /// and registers a duplicate of `file`'s descriptor, which the writer
    /// owns (so it stays open for the ring's lifetime, whatever the caller
    /// does with `file`).
    ///
    /// Errors: `EINVAL` for a bad queue depth; `ENOSYS` (no io_uring),
    /// `EPERM` (seccomp, or `kernel.io_uring_disabled`), `ENOMEM`
    /// (`RLIMIT_MEMLOCK` on old kernels) from the setup.
    pub fn new(file: &File, queue_depth: u32) -> io::Result<Self> {
        if !(1..=MAX_QUEUE_DEPTH).contains(&queue_depth) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queue depth {queue_depth} is not in 1..={MAX_QUEUE_DEPTH}"),
            ));
        }
        // CQ is twice the SQ by default, so `queue_depth` in flight never
        // overflows it.
        let ring = IoUring::new(queue_depth)?;
        let fd = file.as_fd().try_clone_to_owned()?;
        ring.submitter().register_files(&[fd.as_raw_fd()])?;
        Ok(Self {
            ring,
            _file: fd,
            queue_depth,
            submit_calls: 0,
        })
    }

    /// One `io_uring_enter`: submit what is queued and wait for a CQE.
    /// `EINTR`, `EBUSY` (CQ busy) and `EAGAIN` are for the caller to reap
    /// and retry. Any other error is kept in `fatal` (the caller then
    /// submits nothing more but keeps reaping until nothing is in flight);
    /// the short sleep lets task work post the outstanding CQEs.
    fn enter(&mut self, fatal: &mut Option<io::Error>) {
        self.submit_calls += 1;
        match self.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN)
                ) => {}
            Err(e) => {
                fatal.get_or_insert(e);
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }

    /// Queue depth: most SQEs in flight.
    pub fn queue_depth(&self) -> u32 {
        self.queue_depth
    }

    /// `io_uring_enter` calls made so far.
    pub fn submit_calls(&self) -> u64 {
        self.submit_calls
    }

    /// Writes every run, up to `queue_depth` at once, and returns only when
    /// no SQE is in flight. A short write is resubmitted for its remainder,
    /// `EAGAIN` and `EINTR` completions are resubmitted, and a run of more
    /// than `IOV_MAX` iovecs goes in several SQEs one after another. Any
    /// other negative result is stored in the run's `error` and the other
    /// runs go on. Returns the number of runs that failed.
    ///
    /// Errors (`Err`): `io_uring_enter` failing other than with `EINTR`,
    /// `EBUSY` or `EAGAIN`; then every run not completed carries an error
    /// too, and the call still waited for every SQE in flight to complete.
    ///
    /// `fault` is asked before each SQE (offset, bytes left) and may make it
    /// a short write or a failure; pass `&|_, _| None` outside tests.
    pub fn write_runs(
        &mut self,
        runs: &mut [UringRun<'_, '_>],
        fault: &dyn Fn(u64, usize) -> Option<UringFault>,
    ) -> io::Result<usize> {
        let mut next = 0usize;
        let mut retry: Vec<usize> = Vec::new();
        let mut in_flight = 0u32;
        let mut fatal: Option<io::Error> = None;
        loop {
            // Fill the submission queue up to the queue depth.
            while fatal.is_none() && in_flight < self.queue_depth {
                let idx = match retry.pop() {
                    Some(i) => i,
                    None if next < runs.len() => {
                        next += 1;
                        next - 1
                    }
                    None => break,
                };
                let run = &mut runs[idx];
                if run.iov.is_empty() {
                    continue;
                }
                let n = run.iov.len().min(IOV_MAX);
                let mut iov_ptr = run.iov.as_ptr().cast::<libc::iovec>();
                let mut iov_len = n as u32;
                let bytes: usize = run.iov[..n].iter().map(|b| b.len()).sum();
                match fault(run.offset, bytes) {
                    Some(UringFault::Short(k)) if k > 0 && k < bytes => {
                        run.truncated.clear();
                        let mut left = k;
                        for b in run.iov[..n].iter() {
                            if left == 0 {
                                break;
                            }
                            let take = left.min(b.len());
                            run.truncated.push(libc::iovec {
                                iov_base: b.as_ptr() as *mut libc::c_void,
                                iov_len: take,
                            });
                            left -= take;
                        }
                        iov_ptr = run.truncated.as_ptr();
                        iov_len = run.truncated.len() as u32;
                    }
                    Some(UringFault::Errno(e)) => run.forced_errno = Some(e),
                    _ => {}
                }
                let sqe = opcode::Writev::new(types::Fixed(0), iov_ptr, iov_len)
                    .offset(run.offset)
                    .build()
                    .user_data(idx as u64);
                // SAFETY: the SQE points at `run.iov` (IoSlice is
                // ABI-compatible with iovec) or at `run.truncated`, and at the
                // buffers they borrow. All are owned by or borrowed from
                // `runs` for this whole call and left untouched until this
                // run's CQE, and this call does not return while any SQE is
                // in flight (the loop below waits until `in_flight == 0`), so
                // the memory outlives the kernel's use of it. A run is never
                // in flight twice.
                let pushed = unsafe { self.ring.submission().push(&sqe) };
                if pushed.is_err() {
                    // SQ full (cannot happen: in_flight < entries); retry later.
                    retry.push(idx);
                    break;
                }
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            self.enter(&mut fatal);
            let mut cq = self.ring.completion();
            cq.sync();
            for cqe in &mut cq {
                in_flight -= 1;
                let idx = cqe.user_data() as usize;
                let run = &mut runs[idx];
                let res = match run.forced_errno.take() {
                    Some(e) => -e,
                    None => cqe.result(),
                };
                if res > 0 {
                    let n = res as usize;
                    run.offset += n as u64;
                    let mut rest: &mut [IoSlice<'_>] = std::mem::take(&mut run.iov);
                    IoSlice::advance_slices(&mut rest, n);
                    run.iov = rest;
                    if !run.iov.is_empty() {
                        // Short write, or more than IOV_MAX iovecs: go on.
                        retry.push(idx);
                    }
                } else if res == 0 {
                    run.error = Some(io::ErrorKind::WriteZero.into());
                } else if (res == -libc::EAGAIN || res == -libc::EINTR) && run.eagain < MAX_EAGAIN {
                    run.eagain += 1;
                    retry.push(idx);
                } else {
                    run.error = Some(io::Error::from_raw_os_error(-res));
                }
            }
        }
        if let Some(e) = fatal {
            for run in runs.iter_mut() {
                if !run.iov.is_empty() && run.error.is_none() {
                    run.error = Some(io::Error::new(e.kind(), format!("io_uring_enter: {e}")));
                }
            }
            return Err(e);
        }
        Ok(runs.iter().filter(|r| r.error.is_some()).count())
    }
}

/// One job of [`UringWriter::write_copied`]: `len` bytes at `offset`.
#[derive(Debug, Clone, Copy)]
pub struct CopyJob {
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes; at most the bounce buffer length.
    pub len: usize,
}

impl UringWriter {
    /// Writes each job from a bounce buffer: `fill(job, buf)` copies the
    /// job's bytes into one of `bufs` (the caller's, allocated up front;
    /// up to `queue_depth` of them are used), which is submitted as one
    /// `IORING_OP_WRITE`
    /// (a single segment: with `O_DIRECT` the kernel's per-segment cost
    /// exceeds a memcpy, `.project/io-uring-and-direct.md`). The copy of
    /// the next job overlaps with the writes in flight; a buffer is refilled
    /// only after its CQE. Short writes, `EAGAIN`/`EINTR` and faults behave
    /// as in [`write_runs`](Self::write_runs). Returns each job's error.
    ///
    /// Errors (`Err`): as `write_runs`; also `InvalidInput` if `bufs` is
    /// empty or a job is longer than a buffer.
    pub fn write_copied(
        &mut self,
        jobs: &[CopyJob],
        bufs: &mut [crate::buffer::AlignedBuf],
        fill: &mut dyn FnMut(usize, &mut [u8]),
        fault: &dyn Fn(u64, usize) -> Option<UringFault>,
    ) -> io::Result<Vec<Option<io::Error>>> {
        let buffer_len = bufs.iter().map(|b| b.len()).min().unwrap_or(0);
        if bufs.is_empty() || jobs.iter().any(|j| j.len > buffer_len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no bounce buffer, or a job longer than one",
            ));
        }
        let slots = (self.queue_depth as usize).min(jobs.len()).min(bufs.len());
        let mut free: Vec<usize> = (0..slots).rev().collect();
        // Per slot: (job, bytes done, EAGAIN count, injected errno).
        let mut slot_job: Vec<(usize, usize, u32, Option<i32>)> = vec![(0, 0, 0, None); slots];
        let mut errors: Vec<Option<io::Error>> = (0..jobs.len()).map(|_| None).collect();
        let mut retry: Vec<usize> = Vec::new();
        let mut next = 0usize;
        let mut in_flight = 0u32;
        let mut fatal: Option<io::Error> = None;
        loop {
            while fatal.is_none() && in_flight < self.queue_depth {
                let slot = match retry.pop() {
                    Some(slot) => slot,
                    None if next < jobs.len() => {
                        let Some(slot) = free.pop() else { break };
                        fill(next, &mut bufs[slot][..jobs[next].len]);
                        slot_job[slot] = (next, 0, 0, None);
                        next += 1;
                        slot
                    }
                    None => break,
                };
                let (job, done, _, _) = slot_job[slot];
                let mut len = jobs[job].len - done;
                let offset = jobs[job].offset + done as u64;
                match fault(offset, len) {
                    Some(UringFault::Short(k)) if k > 0 && k < len => len = k,
                    Some(UringFault::Errno(e)) => slot_job[slot].3 = Some(e),
                    _ => {}
                }
                let ptr = bufs[slot][done..].as_ptr();
                let sqe = opcode::Write::new(types::Fixed(0), ptr, len as u32)
                    .offset(offset)
                    .build()
                    .user_data(slot as u64);
                // SAFETY: the SQE points into `bufs[slot]`, owned by this
                // call; a slot is refilled only after its CQE (it goes back
                // to `free` then), and this call does not return while any
                // SQE is in flight, so the buffer outlives the kernel's use.
                if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                    retry.push(slot);
                    break;
                }
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            self.enter(&mut fatal);
            let mut cq = self.ring.completion();
            cq.sync();
            for cqe in &mut cq {
                in_flight -= 1;
                let slot = cqe.user_data() as usize;
                let (job, done, eagain, forced) = slot_job[slot];
                let res = forced.map_or(cqe.result(), |e| -e);
                slot_job[slot].3 = None;
                if res > 0 {
                    let done = done + res as usize;
                    slot_job[slot].1 = done;
                    if done < jobs[job].len {
                        retry.push(slot);
                    } else {
                        free.push(slot);
                    }
                } else if (res == -libc::EAGAIN || res == -libc::EINTR) && eagain < MAX_EAGAIN {
                    slot_job[slot].2 += 1;
                    retry.push(slot);
                } else {
                    errors[job] = Some(if res == 0 {
                        io::ErrorKind::WriteZero.into()
                    } else {
                        io::Error::from_raw_os_error(-res)
                    });
                    free.push(slot);
                }
            }
        }
        if let Some(e) = fatal {
            // Jobs never submitted, or cut short, did not reach the file.
            for (slot, &(job, done, _, _)) in slot_job.iter().enumerate() {
                if !free.contains(&slot) && done < jobs[job].len && errors[job].is_none() {
                    errors[job] = Some(io::Error::new(e.kind(), format!("io_uring_enter: {e}")));
                }
            }
            for err in errors.iter_mut().skip(next) {
                err.get_or_insert_with(|| io::Error::new(e.kind(), format!("io_uring_enter: {e}")));
            }
            return Err(e);
        }
        Ok(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A fresh read-write file in a temporary directory (kept alive by the
    /// returned guard).
    fn scratch_file(name: &str) -> (tempfile::TempDir, std::fs::File) {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join(name))
            .unwrap();
        (dir, file)
    }

    #[test]
    fn writes_runs_at_queue_depth_and_beyond_iov_max() {
        let (_dir, file) = scratch_file("u");
        let Ok(mut w) = UringWriter::new(&file, 4) else {
            eprintln!("io_uring unavailable here; skipped");
            return;
        };
        // 10 runs of 3 pages with gaps, and one run of 1500 512-byte iovecs
        // (more than IOV_MAX, so it takes two SQEs).
        let pages: Vec<Vec<u8>> = (0..30u8).map(|i| vec![i + 1; 4096]).collect();
        let small: Vec<Vec<u8>> = (0..1500u32)
            .map(|i| vec![(i % 200) as u8 + 1; 512])
            .collect();
        let mut iovs: Vec<Vec<IoSlice<'_>>> = pages
            .chunks(3)
            .map(|c| c.iter().map(|p| IoSlice::new(p)).collect())
            .collect();
        let mut big: Vec<IoSlice<'_>> = small.iter().map(|p| IoSlice::new(p)).collect();
        let mut runs: Vec<UringRun<'_, '_>> = iovs
            .iter_mut()
            .enumerate()
            .map(|(i, v)| UringRun::new(i as u64 * 4 * 4096, v))
            .collect();
        runs.push(UringRun::new(1 << 20, &mut big));
        assert_eq!(w.write_runs(&mut runs, &|_, _| None).unwrap(), 0);
        assert!(runs.iter().all(|r| r.iov.is_empty() && r.error.is_none()));
        for (i, p) in pages.iter().enumerate() {
            let at = (i / 3) * 4 * 4096 + (i % 3) * 4096;
            let mut back = vec![0u8; 4096];
            file.read_exact_at(&mut back, at as u64).unwrap();
            assert_eq!(&back, p, "page {i}");
        }
        let mut back = vec![0u8; 1500 * 512];
        file.read_exact_at(&mut back, 1 << 20).unwrap();
        assert_eq!(back, small.concat());
    }

    #[test]
    fn injected_short_writes_are_continued_and_errors_reported() {
        let (_dir, file) = scratch_file("s");
        let Ok(mut w) = UringWriter::new(&file, 8) else {
            eprintln!("io_uring unavailable here; skipped");
            return;
        };
        let pages: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i + 1; 4096]).collect();
        let mut a: Vec<IoSlice<'_>> = pages[..4].iter().map(|p| IoSlice::new(p)).collect();
        let mut b: Vec<IoSlice<'_>> = pages[4..].iter().map(|p| IoSlice::new(p)).collect();
        let mut runs = vec![UringRun::new(0, &mut a), UringRun::new(65536, &mut b)];
        // Run a: 1000 bytes, then 5000 more, then the rest (two short
        // writes, one crossing a page). Run b: EIO.
        let plan = std::cell::RefCell::new(vec![
            Some(UringFault::Short(5000)),
            Some(UringFault::Short(1000)),
        ]);
        let fault = |off: u64, _len: usize| {
            if off >= 65536 {
                Some(UringFault::Errno(libc::EIO))
            } else {
                plan.borrow_mut().pop().flatten()
            }
        };
        assert_eq!(w.write_runs(&mut runs, &fault).unwrap(), 1);
        assert!(runs[0].error.is_none() && runs[0].iov.is_empty());
        assert_eq!(
            runs[1].error.as_ref().unwrap().raw_os_error(),
            Some(libc::EIO)
        );
        let mut back = vec![0u8; 4 * 4096];
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, pages[..4].concat());
        assert!(plan.borrow().is_empty(), "both short writes were acted out");
    }

    #[test]
    fn copied_jobs_reuse_slots_and_continue_short_writes() {
        let (_dir, file) = scratch_file("c");
        let Ok(mut w) = UringWriter::new(&file, 2) else {
            eprintln!("io_uring unavailable here; skipped");
            return;
        };
        // 7 jobs through 2 slots; job 3 is written in three short pieces,
        // job 5 fails.
        let jobs: Vec<CopyJob> = (0..7u64)
            .map(|i| CopyJob {
                offset: i * 10_000,
                len: 8192,
            })
            .collect();
        let plan = std::cell::RefCell::new(vec![
            Some(UringFault::Short(100)),
            Some(UringFault::Short(3000)),
        ]);
        let fault = |off: u64, _len: usize| match off {
            50_000 => Some(UringFault::Errno(libc::EIO)),
            o if (30_000..40_000).contains(&o) => plan.borrow_mut().pop().flatten(),
            _ => None,
        };
        let mut fill = |j: usize, buf: &mut [u8]| buf.fill(j as u8 + 1);
        let mut bufs: Vec<crate::buffer::AlignedBuf> = (0..2)
            .map(|_| crate::buffer::AlignedBuf::zeroed(8192, 4096).unwrap())
            .collect();
        let errs = w.write_copied(&jobs, &mut bufs, &mut fill, &fault).unwrap();
        for (j, e) in errs.iter().enumerate() {
            assert_eq!(e.is_some(), j == 5, "job {j}: {e:?}");
        }
        for j in [0u64, 1, 2, 3, 4, 6] {
            let mut back = vec![0u8; 8192];
            file.read_exact_at(&mut back, j * 10_000).unwrap();
            assert!(back.iter().all(|&b| b == j as u8 + 1), "job {j}");
        }
        assert!(plan.borrow().is_empty());
    }

    #[test]
    fn bad_queue_depth_and_fd_are_errors() {
        let (_dir, file) = scratch_file("qd");
        assert!(UringWriter::new(&file, 0).is_err());
        assert!(UringWriter::new(&file, MAX_QUEUE_DEPTH + 1).is_err());
        if let Ok(ring) = IoUring::new(4) {
            // A ring's own descriptor cannot be registered in a ring: EBADF.
            let fd = ring.as_fd().try_clone_to_owned().unwrap();
            assert!(UringWriter::new(&File::from(fd), 4).is_err());
        }
    }

    #[test]
    fn a_failed_run_does_not_stop_the_others() {
        let dir = tempfile::tempdir().unwrap();
        // Opened read-only: every write fails with EBADF.
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let Ok(mut w) = UringWriter::new(&file, 2) else {
            eprintln!("io_uring unavailable here; skipped");
            return;
        };
        let page = vec![1u8; 4096];
        let mut a = [IoSlice::new(&page)];
        let mut b = [IoSlice::new(&page)];
        let mut c = [IoSlice::new(&page)];
        let mut runs = vec![
            UringRun::new(0, &mut a),
            UringRun::new(8192, &mut b),
            UringRun::new(16384, &mut c),
        ];
        assert_eq!(w.write_runs(&mut runs, &|_, _| None).unwrap(), 3);
        assert!(
            runs.iter()
                .all(|r| r.error.as_ref().and_then(|e| e.raw_os_error()) == Some(libc::EBADF))
        );
    }
}
