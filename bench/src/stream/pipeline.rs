//! The buffer pipeline shared by both engines: the plan of chunks, the
//! fill threads, and the completion tally.

use super::*;

/// What to write: chunk `k` is `chunk` bytes at `k * chunk`, the last one
/// shorter; I/O lengths are rounded up to `io_align`.
pub(super) struct Plan<'a> {
    pub(super) generator: &'a Generator,
    pub(super) size: u64,
    pub(super) chunk: u64,
    pub(super) io_align: u64,
    /// Set by the caller to stop the write (`Error::Cancelled`).
    pub(super) cancel: &'a AtomicBool,
}

impl Plan<'_> {
    /// Whether the caller cancelled and no error was recorded yet; then
    /// records `Error::Cancelled` in `first_error`. The engine stops as it
    /// does on its first error.
    pub(super) fn cancelled_now(&self, first_error: &mut Option<Error>) -> bool {
        if first_error.is_none() && self.cancel.load(Ordering::Relaxed) {
            *first_error = Some(Error::Cancelled);
            return true;
        }
        false
    }

    pub(super) fn chunks(&self) -> u64 {
        self.size.div_ceil(self.chunk)
    }

    /// (offset, data bytes, I/O bytes) of chunk `k`.
    pub(super) fn extent(&self, k: u64) -> (u64, usize, usize) {
        let offset = k * self.chunk;
        let len = self.chunk.min(self.size - offset);
        let io_len = len.div_ceil(self.io_align) * self.io_align;
        (offset, len as usize, io_len as usize)
    }

    /// Fills `buf` with chunk `k` and zero padding; returns its I/O length.
    pub(super) fn fill(&self, k: u64, buf: &mut [u8]) -> usize {
        let (offset, len, io_len) = self.extent(k);
        self.generator
            .fill_at(offset, &mut buf[..len])
            .expect("chunks lie inside the generator's size");
        buf[len..io_len].fill(0);
        io_len
    }
}

/// A filled buffer on its way to the I/O side.
pub(super) struct Filled<B> {
    pub(super) slot: usize,
    pub(super) buf: B,
    pub(super) chunk: u64,
    pub(super) io_len: usize,
}

/// Completion bookkeeping shared by both engines.
pub(super) struct Tally {
    pub(super) done: Vec<bool>,
    pub(super) first_missing: u64,
    pub(super) bytes: u64,
    pub(super) last_report: Instant,
    pub(super) last_bytes: u64,
}

impl Tally {
    pub(super) fn new(chunks: u64) -> Self {
        Self {
            done: vec![false; chunks as usize],
            first_missing: 0,
            bytes: 0,
            last_report: Instant::now(),
            last_bytes: 0,
        }
    }

    pub(super) fn complete(&mut self, plan: &Plan<'_>, chunk: u64) {
        self.done[chunk as usize] = true;
        self.bytes += plan.extent(chunk).1 as u64;
        while (self.first_missing as usize) < self.done.len()
            && self.done[self.first_missing as usize]
        {
            self.first_missing += 1;
        }
    }

    pub(super) fn contiguous(&self, plan: &Plan<'_>) -> u64 {
        (self.first_missing * plan.chunk).min(plan.size)
    }

    pub(super) fn finished(&self) -> bool {
        self.first_missing as usize == self.done.len()
    }

    /// Puts the totals in `stats`; the first error, or an error if not
    /// every chunk was written.
    pub(super) fn finish(
        &self,
        plan: &Plan<'_>,
        stats: &mut WriteStats,
        gen_ns: &AtomicU64,
        first_error: Option<Error>,
    ) -> Result<()> {
        stats.gen_s = gen_ns.load(Ordering::Relaxed) as f64 / 1e9;
        stats.bytes = self.bytes;
        stats.contiguous_bytes = self.contiguous(plan);
        match first_error {
            Some(e) => Err(e),
            None if !self.finished() => Err(Error::config(
                "a fill thread stopped before the file was complete".into(),
            )),
            None => Ok(()),
        }
    }

    pub(super) fn maybe_report(
        &mut self,
        plan: &Plan<'_>,
        start: Instant,
        progress: &mut dyn FnMut(Progress),
    ) {
        let dt = self.last_report.elapsed();
        if dt >= Duration::from_millis(200) {
            progress(Progress {
                bytes_done: self.bytes,
                contiguous_bytes: self.contiguous(plan),
                total: plan.size,
                elapsed: start.elapsed(),
                bytes_per_sec: (self.bytes - self.last_bytes) as f64 / dt.as_secs_f64(),
            });
            self.last_report = Instant::now();
            self.last_bytes = self.bytes;
        }
    }
}

/// What the fill threads share: the plan, the next chunk number, the stop
/// flag and their summed generation time.
pub(super) struct Fillers<'a, 'p> {
    pub(super) plan: &'a Plan<'p>,
    pub(super) next: &'a AtomicU64,
    pub(super) stop: &'a AtomicBool,
    pub(super) gen_ns: &'a AtomicU64,
}

impl<'a> Fillers<'a, '_> {
    /// Starts `threads` fill threads in scope `s`; `filled` is moved in so
    /// that the channel closes when the last of them ends.
    pub(super) fn spawn<'s, B: DerefMut<Target = [u8]> + Send + 's>(
        &self,
        s: &'s std::thread::Scope<'s, '_>,
        threads: usize,
        free: &chan::Receiver<(usize, B)>,
        filled: chan::Sender<Filled<B>>,
    ) where
        'a: 's,
    {
        for _ in 0..threads {
            let (free, filled) = (free.clone(), filled.clone());
            let (plan, next, stop, gen_ns) = (self.plan, self.next, self.stop, self.gen_ns);
            s.spawn(move || {
                let ns = fill_loop(plan, next, stop, &free, &filled);
                gen_ns.fetch_add(ns, Ordering::Relaxed);
            });
        }
    }
}

/// Fill threads: take a free buffer, claim the next chunk, fill, pass on.
/// Return the nanoseconds spent generating.
pub(super) fn fill_loop<B: DerefMut<Target = [u8]>>(
    plan: &Plan<'_>,
    next: &AtomicU64,
    stop: &AtomicBool,
    free: &chan::Receiver<(usize, B)>,
    filled: &chan::Sender<Filled<B>>,
) -> u64 {
    let mut gen_ns = 0u64;
    while let Ok((slot, mut buf)) = free.recv() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let chunk = next.fetch_add(1, Ordering::Relaxed);
        if chunk >= plan.chunks() {
            break;
        }
        let t = Instant::now();
        let io_len = plan.fill(chunk, &mut buf);
        gen_ns += t.elapsed().as_nanos() as u64;
        let msg = Filled {
            slot,
            buf,
            chunk,
            io_len,
        };
        if filled.send(msg).is_err() {
            break;
        }
    }
    gen_ns
}
