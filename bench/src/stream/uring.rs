//! The io_uring engine: the calling thread keeps writes in flight on a
//! `SlotRing` whose slots are the pipeline's buffers.

use super::*;
use pagewriter::backend::ring::{Completion, RingOp, RingOptions, SlotBuf, SlotRing};

/// The ring for `opts`, or the buffers back for `pwrite` (engine
/// `Auto` where io_uring is refused; the reason goes to `fallbacks`).
pub(super) fn ring(
    backend: &FileBackend,
    opts: &WriteOptions,
    bufs: Vec<AlignedBuf>,
    stats: &mut WriteStats,
) -> Result<std::result::Result<SlotRing, Vec<AlignedBuf>>> {
    let file = backend.file();
    let mut ro = RingOptions::new(stats.queue_depth);
    ro.fixed_buffers = opts.fixed_buffers;
    // Setup errors drop the buffers; keep the lengths to remake them.
    let (len, align) = (bufs[0].len(), bufs[0].align());
    let remake = |n: usize| -> Vec<AlignedBuf> {
        (0..n)
            .map(|_| AlignedBuf::zeroed(len, align).expect("layout was valid"))
            .collect()
    };
    let n = bufs.len();
    let hugepages = opts.hugepages;
    match SlotRing::new(file, ro, bufs) {
        Ok(ring) => {
            stats.fixed_buffers = ro.fixed_buffers;
            Ok(Ok(ring))
        }
        Err(e) if e.stage == "register buffers" => {
            stats
                .fallbacks
                .push(format!("buffers not registered ({})", e.source));
            ro.fixed_buffers = false;
            let bufs = if hugepages {
                alloc_buffers(opts, align, stats)?
            } else {
                remake(n)
            };
            match SlotRing::new(file, ro, bufs) {
                Ok(ring) => Ok(Ok(ring)),
                Err(e) => Err(Error::io("io_uring setup", None, e.source)),
            }
        }
        Err(e) if opts.engine == StreamEngine::Auto => {
            stats
                .fallbacks
                .push(format!("io_uring refused ({e}); pwrite"));
            Ok(Err(remake(n)))
        }
        Err(e) => Err(Error::io("io_uring setup", None, e.source)),
    }
}

/// The calling thread drives the ring: submit filled buffers, reap
/// CQEs, resubmit short writes, hand completed buffers back.
pub(super) fn run(
    mut ring: SlotRing,
    plan: &Plan<'_>,
    opts: &WriteOptions,
    stats: &mut WriteStats,
    start: Instant,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let gen_ns = AtomicU64::new(0);
    let (free_tx, free_rx) = chan::unbounded::<(usize, SlotBuf)>();
    let (filled_tx, filled_rx) = chan::unbounded::<Filled<SlotBuf>>();
    for slot in 0..ring.slots() {
        let buf = ring
            .take(slot)
            .expect("fresh ring: every slot holds its buffer");
        free_tx.send((slot, buf)).expect("receiver alive");
    }
    // Per slot: the chunk it carries.
    let mut active: Vec<u64> = vec![0; ring.slots()];
    let mut tally = Tally::new(plan.chunks());
    let mut first_error: Option<Error> = None;
    let qd = ring.options().queue_depth;
    let mut cqes: Vec<Completion> = Vec::with_capacity(qd as usize);
    std::thread::scope(|s| {
        let fillers = Fillers {
            plan,
            next: &next,
            stop: &stop,
            gen_ns: &gen_ns,
        };
        fillers.spawn(s, opts.gen_threads, &free_rx, filled_tx);
        drop(free_rx);
        let mut free_tx = Some(free_tx);
        loop {
            if plan.cancelled_now(&mut first_error) {
                stop.store(true, Ordering::Relaxed);
                free_tx = None;
            }
            // Submit every filled buffer there is room for; block for
            // one only when the ring is idle.
            while first_error.is_none() && ring.in_flight() < qd {
                let f = if ring.in_flight() == 0 {
                    let t = Instant::now();
                    let r = filled_rx.recv_timeout(Duration::from_millis(50));
                    stats.starved_s += t.elapsed().as_secs_f64();
                    match r {
                        Ok(f) => f,
                        Err(_) => break,
                    }
                } else {
                    match filled_rx.try_recv() {
                        Ok(f) => f,
                        Err(_) => break,
                    }
                };
                let offset = plan.extent(f.chunk).0;
                let _ = ring.put(f.buf);
                active[f.slot] = f.chunk;
                if let Err(e) = ring.push(f.slot, RingOp::Write, offset, 0, f.io_len) {
                    first_error = Some(write_error(offset, e));
                    break;
                }
                stats.writes += 1;
            }
            if ring.in_flight() == 0 {
                if tally.finished() || first_error.is_some() {
                    break;
                }
                tally.maybe_report(plan, start, progress);
                continue;
            }
            let t = Instant::now();
            cqes.clear();
            if let Err(e) = ring.wait(1, &mut cqes) {
                first_error.get_or_insert(Error::io("io_uring_enter", None, e));
                // Keep reaping: the ring's Drop waits for what is left.
                break;
            }
            stats.io_wait_s += t.elapsed().as_secs_f64();
            for c in cqes.drain(..) {
                // The ring continued short and interrupted writes: a
                // completion is the whole chunk, or its error.
                match c.result {
                    Ok(_) => {
                        tally.complete(plan, active[c.slot]);
                        if let (Some(tx), Some(buf)) = (&free_tx, ring.take(c.slot)) {
                            let _ = tx.send((c.slot, buf));
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(write_error(c.offset, e));
                    }
                }
            }
            if first_error.is_some() {
                stop.store(true, Ordering::Relaxed);
                free_tx = None;
            }
            if tally.finished() {
                free_tx = None;
            }
            tally.maybe_report(plan, start, progress);
        }
        // Let the fill threads end: no more free buffers, and drain what
        // they already filled.
        drop(free_tx.take());
        stop.store(true, Ordering::Relaxed);
        while filled_rx.recv().is_ok() {}
    });
    // Whatever is still in flight (after an error) completes before the
    // ring's buffers are freed: SlotRing's Drop waits for it.
    let mut rest = Vec::new();
    while ring.in_flight() > 0 && ring.wait(1, &mut rest).is_ok() {}
    tally.finish(plan, stats, &gen_ns, first_error)
}
