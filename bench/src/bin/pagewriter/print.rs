//! Human-readable reports of `scale` and `io`.

use super::*;

pub(crate) fn print_scale(r: &ScaleReport) {
    let c = &r.config;
    for (mode, io) in &r.io_modes {
        println!("I/O {:<15} {io}", mode.name());
    }
    println!(
        "data: dedup {} compress {} (datagen, seed {})",
        c.dedup_ratio, c.compress_ratio, c.seed
    );
    println!(
        "commit: {}; layout: {}; fill: {}; txn: {} x {} B pages ({} rewrites); {} s per cell, median of {}",
        match c.commit {
            CommitKind::Sync => "global (sync(): every page any thread wrote)".to_string(),
            CommitKind::Flush => "flush (no fdatasync)".to_string(),
            CommitKind::Scoped => "scoped (Writer::commit: each thread's own pages)".to_string(),
            CommitKind::Through => {
                "through (Writer::write_and_commit: each thread's own pages, one call)".to_string()
            }
            CommitKind::Async { in_flight } => {
                format!("async ({in_flight} tickets in flight per thread)")
            }
        },
        c.layout.name(),
        c.fill.name(),
        c.pages_per_txn,
        c.page_size,
        c.rewrites_per_txn(),
        c.cell_duration.as_secs_f64(),
        c.repeats
    );
    println!(
        "{:>7}  {:<15} {:>11} {:>10} {:>8} {:>13} {:>12} {:>11} {:>8} {:>8} {:>13} {:>11}",
        "threads",
        "mode",
        "pages/s",
        "commits/s",
        "MiB/s",
        "writes/commit",
        "syncs/commit",
        "KiB/commit",
        "p50 us",
        "p99 us",
        "CPU us/commit",
        "vs per-page"
    );
    for row in &r.rows {
        println!(
            "{:>7}  {:<15} {:>11.0} {:>10.0} {:>8.1} {:>13.2} {:>12.2} {:>11.1} {:>8} {:>8} {:>13.1} {:>11}",
            row.threads,
            row.mode.name(),
            row.page_writes_per_s,
            row.commits_per_s,
            row.mb_per_s * 1e6 / (1 << 20) as f64,
            row.write_calls_per_commit,
            row.syncs_per_commit,
            row.write_kib_per_commit,
            row.p50_us,
            row.p99_us,
            row.cpu_us_per_commit,
            match (row.ranked, row.vs_per_page) {
                (false, _) => "too few".to_string(),
                (true, Some(v)) => format!("{v:.2}x"),
                (true, None) => "-".to_string(),
            },
        );
    }
    if r.rows.iter().any(|row| !row.ranked) {
        println!(
            "too few: a cell of the row made fewer than {} commits (the fewest: {}), too few for \
             its rates to rank; run longer cells (--duration)",
            pagewriter_bench::workload::scale::MIN_RANKED_COMMITS,
            r.rows.iter().map(|row| row.min_commits).min().unwrap_or(0)
        );
    }
    if c.reads_per_txn > 0 {
        println!(
            "reads: {} per transaction, read cache {} B (CLOCK)",
            c.reads_per_txn, c.read_cache_bytes
        );
        println!(
            "{:>7}  {:<15} {:>11} {:>15}",
            "threads", "mode", "reads/s", "cache hit ratio"
        );
        for row in &r.rows {
            println!(
                "{:>7}  {:<15} {:>11.0} {:>15}",
                row.threads,
                row.mode.name(),
                row.reads_per_s,
                row.cache_hit_ratio
                    .map_or("-".to_string(), |h| format!("{h:.3}")),
            );
        }
    }
}

pub(crate) fn print_io(r: &pagewriter_bench::workload::io::IoReport) {
    let c = &r.config;
    let who = match c.shared {
        Some(s) => format!(" rank {}/{} on {}", s.rank, s.ranks, r.host),
        None => String::new(),
    };
    // psync has one I/O in flight per job whatever --iodepth says.
    let depth = match c.engine {
        pagewriter_bench::workload::io::IoEngine::Psync => 1,
        _ => c.iodepth,
    };
    println!(
        "{}{}: rw={} bs={} iodepth={} numjobs={} runtime={:.3}s",
        c.path.display(),
        who,
        c.rw.name(),
        c.bs,
        depth,
        c.numjobs,
        r.runtime_s
    );
    println!("  I/O: {}", r.io_mode);
    for (name, d) in [("read", &r.read), ("write", &r.write)] {
        let Some(d) = d else { continue };
        println!(
            "  {name}: IOPS={:.0}, BW={:.3} GB/s ({:.1} MiB/s) ({} B in {} I/Os)",
            d.iops,
            d.bw_bytes_per_s / 1e9,
            d.bw_bytes_per_s / (1u64 << 20) as f64,
            d.bytes,
            d.ios
        );
        let l = &d.lat_us;
        println!(
            "    lat (us): min={:.1} avg={:.1} max={:.1}, samples={}",
            l.min, l.mean, l.max, d.lat_samples
        );
        println!(
            "    percentiles (us): p50={:.1} p90={:.1} p99={:.1} p99.9={:.1} p99.99={:.1}",
            l.p50, l.p90, l.p99, l.p99_9, l.p99_99
        );
    }
    if r.fsyncs > 0 {
        println!("  fdatasync calls: {}", r.fsyncs);
    }
    if c.verify {
        println!("  verify: {} blocks OK", r.verified_blocks);
    }
}

#[cfg(feature = "cf")]
pub(crate) fn print_cf(r: &pagewriter_bench::workload::cf::CfReport) {
    use pagewriter_bench::workload::cf;
    let c = &r.config;
    println!(
        "{} readers; {} s cells, median of {} rounds, the engines alternating; {}",
        c.readers, c.seconds, c.rounds, r.machine
    );
    for e in &c.engines {
        println!("  {:<16} {}", e.name(), e.durability());
    }
    println!(
        "{:>7} {:>6} {:<16} {:>10} {:>10} {:>9} {:>11} {:>10} {:>10} {:>13}",
        "writers",
        "batch",
        "engine",
        "ops/s",
        "commits/s",
        "p99 us",
        "MiB on disk",
        "reads/s",
        "alone",
        "vs redb-files"
    );
    for row in cf::rows(r) {
        println!(
            "{:>7} {:>6} {:<16} {:>10.0} {:>10.0} {:>9.0} {:>11.1} {:>10.0} {:>10.0} {:>13}{}",
            row.writers,
            row.batch,
            row.engine.name(),
            row.ops_per_s,
            row.commits_per_s,
            row.p99_commit_us,
            row.bytes_on_disk / (1u64 << 20) as f64,
            row.reads_per_s,
            row.reads_per_s_alone,
            row.vs_redb_files.map_or("-".into(), |v| format!("{v:.2}")),
            if row.hung > 0 {
                format!("  (hung in {} rounds)", row.hung)
            } else {
                String::new()
            }
        );
    }
}
