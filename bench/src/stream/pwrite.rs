//! The `pwrite` engine: `writer_threads` threads write filled buffers.

use super::*;

pub(super) fn run_pwrite(
    backend: &FileBackend,
    plan: &Plan<'_>,
    opts: &WriteOptions,
    bufs: Vec<AlignedBuf>,
    stats: &mut WriteStats,
    start: Instant,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    stats.engine = "pwrite".into();
    stats.queue_depth = opts.writer_threads.min(opts.buffer_count) as u32;
    let file: &File = backend.file();
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (free_tx, free_rx) = chan::unbounded::<(usize, AlignedBuf)>();
    let (filled_tx, filled_rx) = chan::bounded::<Filled<AlignedBuf>>(opts.buffer_count);
    // (chunk, offset, result, write ns, wait ns, slot, buf)
    type Done = (u64, std::io::Result<()>, u64, u64, usize, AlignedBuf);
    let (done_tx, done_rx) = chan::unbounded::<Done>();
    for (slot, buf) in bufs.into_iter().enumerate() {
        free_tx.send((slot, buf)).expect("receiver alive");
    }
    let mut tally = Tally::new(plan.chunks());
    let mut first_error: Option<Error> = None;
    let gen_ns = AtomicU64::new(0);
    std::thread::scope(|s| {
        let fillers = Fillers {
            plan,
            next: &next,
            stop: &stop,
            gen_ns: &gen_ns,
        };
        fillers.spawn(s, opts.gen_threads, &free_rx, filled_tx);
        for _ in 0..opts.writer_threads.min(opts.buffer_count) {
            let (filled_rx, done_tx) = (filled_rx.clone(), done_tx.clone());
            s.spawn(move || {
                use std::os::unix::fs::FileExt;
                loop {
                    let t = Instant::now();
                    let Ok(f) = filled_rx.recv() else { break };
                    let wait_ns = t.elapsed().as_nanos() as u64;
                    let t = Instant::now();
                    let (offset, _, _) = plan.extent(f.chunk);
                    let res = file.write_all_at(&f.buf[..f.io_len], offset);
                    let write_ns = t.elapsed().as_nanos() as u64;
                    if done_tx
                        .send((f.chunk, res, write_ns, wait_ns, f.slot, f.buf))
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
        drop(done_tx);
        drop(filled_rx);
        let mut free_tx = Some(free_tx);
        loop {
            if plan.cancelled_now(&mut first_error) {
                stop.store(true, Ordering::Relaxed);
                free_tx = None;
            }
            match done_rx.recv_timeout(Duration::from_millis(50)) {
                Ok((chunk, res, write_ns, wait_ns, slot, buf)) => {
                    stats.writes += 1;
                    stats.io_wait_s += write_ns as f64 / 1e9;
                    stats.starved_s += wait_ns as f64 / 1e9;
                    match res {
                        Ok(()) => {
                            tally.complete(plan, chunk);
                            if let Some(tx) = &free_tx {
                                let _ = tx.send((slot, buf));
                            }
                        }
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            first_error.get_or_insert(write_error(plan.extent(chunk).0, e));
                        }
                    }
                    if tally.finished() || first_error.is_some() {
                        // No more buffers to hand out: the fill threads run
                        // dry, then the writers, then `done_rx` disconnects.
                        free_tx = None;
                    }
                }
                Err(chan::RecvTimeoutError::Timeout) => {}
                Err(chan::RecvTimeoutError::Disconnected) => break,
            }
            tally.maybe_report(plan, start, progress);
        }
    });
    tally.finish(plan, stats, &gen_ns, first_error)
}
