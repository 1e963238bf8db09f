//! One job: its I/O sequence, buffers filled with the pattern, `psync`.

use super::*;

pub(super) struct JobCtx<'a> {
    pub(super) cfg: &'a IoConfig,
    pub(super) generator: &'a Generator,
    pub(super) file: &'a File,
    pub(super) tail: &'a File,
    pub(super) dio: Option<DioAlign>,
    pub(super) align: u64,
    pub(super) done_bytes: &'a AtomicU64,
    pub(super) stop: &'a AtomicBool,
}

/// One I/O to issue.
#[derive(Debug, Clone, Copy)]
pub(super) struct Io {
    pub(super) read: bool,
    pub(super) offset: u64,
    pub(super) len: usize,
}

/// The I/Os of one job's region, in order.
pub(super) struct IoIter {
    pub(super) region: (u64, u64),
    pub(super) bs: u64,
    pub(super) random: bool,
    pub(super) read_percent: u32,
    pub(super) rng: WyRand,
    pub(super) perm: Permutation,
    pub(super) pass: u64,
    /// Next I/O index within the pass.
    pub(super) i: u64,
    /// I/Os per pass.
    pub(super) per_pass: u64,
    pub(super) time_based: bool,
}

impl IoIter {
    pub(super) fn new(cfg: &IoConfig, region: (u64, u64), job: usize) -> Self {
        let bs = cfg.bs as u64;
        let random = cfg.rw.random();
        // Random I/Os are whole blocks; a sequential pass ends with the
        // region's remainder.
        let per_pass = if random {
            region.1 / bs
        } else {
            region.1.div_ceil(bs)
        };
        let seed = cfg.seed ^ (job as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Self {
            region,
            bs,
            random,
            read_percent: cfg.rw.read_percent(cfg.rwmix_read),
            rng: WyRand::new(seed),
            perm: Permutation::new(per_pass, seed),
            pass: 0,
            i: 0,
            per_pass,
            time_based: cfg.runtime.is_some(),
        }
    }

    pub(super) fn next(&mut self) -> Option<Io> {
        if self.per_pass == 0 {
            return None;
        }
        if self.i == self.per_pass {
            if !self.time_based {
                return None;
            }
            self.pass += 1;
            self.i = 0;
            if self.random {
                self.perm = Permutation::new(self.per_pass, self.rng.next_u64());
            }
        }
        let block = if self.random {
            self.perm.apply(self.i)
        } else {
            self.i
        };
        self.i += 1;
        let at = block * self.bs;
        let len = self.bs.min(self.region.1 - at) as usize;
        let read = match self.read_percent {
            100 => true,
            0 => false,
            p => self.rng.below(100) < p as u64,
        };
        Some(Io {
            read,
            offset: self.region.0 + at,
            len,
        })
    }
}

/// Fills `buf` with what a write of `buf.len()` bytes at `offset` holds.
pub(super) fn fill(cfg: &IoConfig, generator: &Generator, offset: u64, buf: &mut [u8]) {
    match cfg.pattern {
        Pattern::Fixed => {}
        Pattern::Gen => generator
            .fill_at(offset, buf)
            .expect("I/Os lie inside the file extent"),
        Pattern::Header => {
            generator
                .fill_at(offset, buf)
                .expect("I/Os lie inside the file extent");
            for (k, block) in buf.chunks_mut(cfg.bs).enumerate() {
                if block.len() >= HEADER_LEN {
                    stamp(block, offset + (k * cfg.bs) as u64, cfg.seed);
                }
            }
        }
    }
}

pub(super) fn stamp(block: &mut [u8], offset: u64, seed: u64) {
    let sum = xxhash_rust::xxh3::xxh3_64(&block[HEADER_LEN..]);
    block[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    block[8..16].copy_from_slice(&offset.to_le_bytes());
    block[16..24].copy_from_slice(&seed.to_le_bytes());
    block[24..32].copy_from_slice(&sum.to_le_bytes());
}

pub(super) fn run_job(ctx: &JobCtx<'_>, job: usize) -> Result<JobOut> {
    let cfg = ctx.cfg;
    let region = cfg.region(job, ctx.align);
    let mut out = JobOut {
        began: None,
        ended: None,
        read: new_hist(),
        write: new_hist(),
        read_bytes: 0,
        write_bytes: 0,
        fsyncs: 0,
    };
    let mut iter = IoIter::new(cfg, region, job);
    match cfg.engine {
        IoEngine::Psync => run_psync(ctx, &mut iter, &mut out)?,
        #[cfg(all(target_os = "linux", feature = "io-uring"))]
        IoEngine::IoUring => uring::run(ctx, &mut iter, &mut out)?,
        #[cfg(not(all(target_os = "linux", feature = "io-uring")))]
        IoEngine::IoUring => {
            return Err(Error::config(
                "io_uring is not built in (cargo feature io-uring, Linux)".into(),
            ));
        }
    }
    if cfg.end_fsync && out.write_bytes > 0 {
        ctx.file
            .sync_data()
            .map_err(|e| Error::io("fdatasync", None, e))?;
        out.fsyncs += 1;
    }
    out.ended = Some(Instant::now());
    Ok(out)
}

/// Marks the job's start (after its setup) and returns its deadline.
pub(super) fn begin(ctx: &JobCtx<'_>, out: &mut JobOut) -> Option<Instant> {
    let now = Instant::now();
    out.began = Some(now);
    ctx.cfg.runtime.map(|r| now + r)
}

/// Whether `io` must go through the buffered descriptor: its length is
/// not a multiple of the `O_DIRECT` alignment (the end of a region).
pub(super) fn needs_tail(ctx: &JobCtx<'_>, io: &Io) -> bool {
    ctx.dio.is_some_and(|a| {
        !io.len.is_multiple_of(a.offset as usize) || !io.offset.is_multiple_of(a.offset as u64)
    })
}

/// A synchronous I/O on `file`; records latency and bytes.
pub(super) fn sync_io(
    ctx: &JobCtx<'_>,
    file: &File,
    io: Io,
    buf: &mut [u8],
    out: &mut JobOut,
) -> Result<()> {
    let buf = &mut buf[..io.len];
    if !io.read {
        fill(ctx.cfg, ctx.generator, io.offset, buf);
    }
    // Latency is the system call's, not the fill's.
    let t = Instant::now();
    if io.read {
        file.read_exact_at(buf, io.offset)
            .map_err(|e| Error::io("pread", Some(io.offset), e))?;
    } else {
        file.write_all_at(buf, io.offset)
            .map_err(|e| Error::io("pwrite", Some(io.offset), e))?;
    }
    out.record(io, t.elapsed());
    ctx.done_bytes.fetch_add(io.len as u64, Ordering::Relaxed);
    Ok(())
}

pub(super) fn run_psync(ctx: &JobCtx<'_>, iter: &mut IoIter, out: &mut JobOut) -> Result<()> {
    let mem_align = ctx
        .dio
        .map_or(DEFAULT_ALIGN, |a| (a.memory as usize).max(DEFAULT_ALIGN));
    let mut buf = AlignedBuf::zeroed(ctx.cfg.bs, mem_align)
        .ok_or_else(|| Error::config("buffer alignment".into()))?;
    ctx.generator
        .fill_at(
            0,
            &mut buf[..ctx.cfg.bs.min(ctx.generator.config().size as usize)],
        )
        .expect("inside the extent");
    let mut writes = 0u64;
    let mut n = 0u64;
    let deadline = begin(ctx, out);
    while let Some(io) = iter.next() {
        n += 1;
        if n.is_multiple_of(64)
            && (ctx.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d))
        {
            break;
        }
        let file = if needs_tail(ctx, &io) {
            ctx.tail
        } else {
            ctx.file
        };
        sync_io(ctx, file, io, &mut buf, out)?;
        if !io.read {
            writes += 1;
            if ctx.cfg.fsync_every > 0 && writes.is_multiple_of(ctx.cfg.fsync_every) {
                ctx.file
                    .sync_data()
                    .map_err(|e| Error::io("fdatasync", None, e))?;
                out.fsyncs += 1;
            }
        }
    }
    Ok(())
}
