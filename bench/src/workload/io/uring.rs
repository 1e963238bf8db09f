//! Jobs through io_uring: a `SlotRing` of `iodepth` buffers.

use super::*;
use pagewriter::backend::ring::{Completion, RingOp, RingOptions, SlotRing};

pub(crate) fn run(ctx: &JobCtx<'_>, iter: &mut IoIter, out: &mut JobOut) -> Result<()> {
    let cfg = ctx.cfg;
    let mem_align = ctx
        .dio
        .map_or(DEFAULT_ALIGN, |a| (a.memory as usize).max(DEFAULT_ALIGN));
    // One mapping for all slots, advised for transparent huge pages:
    // physically contiguous buffers split into fewer device segments
    // (`.project/io-worker.md`); --hugepages asks for reserved ones.
    let mut bufs = if cfg.hugepages {
        (0..cfg.iodepth)
            .map(|_| AlignedBuf::huge(cfg.bs).map(|b| b.0))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| Error::io("allocate huge pages", None, e))?
    } else if mem_align <= DEFAULT_ALIGN {
        pagewriter::buffer::thp_slab(cfg.bs, cfg.iodepth as usize)
            .map_err(|e| Error::io("mmap", None, e))?
    } else {
        (0..cfg.iodepth)
            .map(|_| AlignedBuf::zeroed(cfg.bs, mem_align))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::config("buffer alignment".into()))?
    };
    for (k, b) in bufs.iter_mut().enumerate() {
        // Pattern::Fixed writes these bytes for ever.
        let at = (k * cfg.bs) as u64 % ctx.generator.config().size;
        let n = (ctx.generator.config().size - at).min(cfg.bs as u64) as usize;
        ctx.generator
            .fill_at(at, &mut b[..n])
            .expect("inside the extent");
    }
    let opts = RingOptions {
        queue_depth: cfg.iodepth,
        register_file: cfg.registerfiles || cfg.sqthread_poll,
        fixed_buffers: cfg.fixedbufs,
        sqpoll: cfg.sqthread_poll,
        iopoll: cfg.hipri,
        single_issuer: true,
    };
    let ring =
        SlotRing::new(ctx.file, opts, bufs).map_err(|e| Error::io(e.stage, None, e.source))?;
    let mut f = Flight::new(ring);
    let mut exhausted = false;
    let mut tail_buf: Option<AlignedBuf> = None;
    let deadline = begin(ctx, out);
    let mut queued = 0u32;
    loop {
        if !exhausted
            && (ctx.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d))
        {
            exhausted = true;
        }
        // Queue as many I/Os as there are free slots.
        while !exhausted && let Some(&slot) = f.free.last() {
            let Some(io) = iter.next() else {
                exhausted = true;
                break;
            };
            if needs_tail(ctx, &io) {
                let b = match &mut tail_buf {
                    Some(b) => b,
                    None => tail_buf
                        .insert(AlignedBuf::zeroed(cfg.bs, DEFAULT_ALIGN).expect("valid layout")),
                };
                // After every direct I/O in flight completes, so the
                // page cache never holds stale bytes of this region.
                f.drain(ctx, out)?;
                sync_io(ctx, ctx.tail, io, b, out)?;
                continue;
            }
            f.free.pop();
            let op = if io.read { RingOp::Read } else { RingOp::Write };
            if !io.read && cfg.pattern != Pattern::Fixed {
                let buf = f.ring.buf_mut(slot).expect("free slot");
                fill(cfg, ctx.generator, io.offset, &mut buf[..io.len]);
            }
            f.ring
                .push(slot, op, io.offset, 0, io.len)
                .map_err(|e| Error::io("io_uring push", Some(io.offset), e))?;
            f.active[slot] = io;
            queued += 1;
            if queued >= cfg.iodepth_batch {
                // Like fio's iodepth_batch_submit: each batch goes to
                // the device as soon as it is ready. Submitting 4 KiB
                // random reads one by one kept QD64 full: 1.2-1.3x the
                // IOPS of one submit per refill of all free slots.
                f.ring
                    .submit()
                    .map_err(|e| Error::io("io_uring_enter", None, e))?;
                queued = 0;
            }
        }
        if f.ring.in_flight() == 0 {
            if exhausted {
                break;
            }
            continue;
        }
        let before = f.writes;
        f.reap(ctx, out, cfg.iodepth_batch as usize)?;
        if cfg.fsync_every > 0 && f.writes / cfg.fsync_every > before / cfg.fsync_every {
            f.drain(ctx, out)?;
            ctx.file
                .sync_data()
                .map_err(|e| Error::io("fdatasync", None, e))?;
            out.fsyncs += 1;
        }
    }
    Ok(())
}

/// A job's ring and what is in flight on it.
struct Flight {
    ring: SlotRing,
    /// Per slot: the I/O it carries.
    active: Vec<Io>,
    /// Slots with nothing in flight.
    free: Vec<usize>,
    /// Reaped completions (reused).
    cqes: Vec<Completion>,
    /// Writes completed so far.
    writes: u64,
}

impl Flight {
    fn new(ring: SlotRing) -> Self {
        let slots = ring.slots();
        let idle = Io {
            read: true,
            offset: 0,
            len: 0,
        };
        Self {
            ring,
            active: vec![idle; slots],
            free: (0..slots).rev().collect(),
            cqes: Vec::with_capacity(slots),
            writes: 0,
        }
    }

    /// Waits until at least `min` I/Os (fewer if fewer are in flight)
    /// finished, and accounts them.
    fn reap(&mut self, ctx: &JobCtx<'_>, out: &mut JobOut, min: usize) -> Result<()> {
        self.cqes.clear();
        let min = min.min(self.ring.in_flight() as usize);
        self.ring
            .wait(min, &mut self.cqes)
            .map_err(|e| Error::io("io_uring_enter", None, e))?;
        self.complete(ctx, out)
    }

    /// Waits for every I/O in flight and accounts it.
    fn drain(&mut self, ctx: &JobCtx<'_>, out: &mut JobOut) -> Result<()> {
        while self.ring.in_flight() > 0 {
            self.reap(ctx, out, 1)?;
        }
        Ok(())
    }
    /// Accounts finished I/Os: each frees its slot; an error or a read cut
    /// short by the end of the file ends the job.
    fn complete(&mut self, ctx: &JobCtx<'_>, out: &mut JobOut) -> Result<()> {
        // The progress counter is shared by all jobs: one add per reap.
        let mut reaped_bytes = 0u64;
        for c in self.cqes.drain(..) {
            // The ring continued short and interrupted transfers: `Ok` is
            // the whole I/O unless a read met the end of the file.
            let io = self.active[c.slot];
            let op_name = if io.read { "read" } else { "write" };
            match c.result {
                Ok(n) if n == io.len => {
                    out.record(io, c.latency);
                    self.writes += u64::from(!io.read);
                    reaped_bytes += io.len as u64;
                    self.free.push(c.slot);
                }
                Ok(n) => {
                    return Err(Error::io(
                        op_name,
                        Some(io.offset + n as u64),
                        std::io::ErrorKind::UnexpectedEof.into(),
                    ));
                }
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) && ctx.cfg.hipri => {
                    return Err(Error::config(
                        "hipri: the device completes polled I/O with EOPNOTSUPP (no poll \
                     queues)"
                            .into(),
                    ));
                }
                Err(e) => return Err(Error::io(op_name, Some(io.offset), e)),
            }
        }
        ctx.done_bytes.fetch_add(reaped_bytes, Ordering::Relaxed);
        Ok(())
    }
}
