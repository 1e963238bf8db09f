//! `pagewriter`: benchmarks of the page writer. Thin: parse, call the
//! library, print.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use pagewriter::{DirectIo, FlushEngine};
use pagewriter_bench::datagen;
use pagewriter_bench::error::{CoreError, Error};
use pagewriter_bench::plot;
use pagewriter_bench::workload::bulk::{self, BulkConfig, BulkRun};
use pagewriter_bench::workload::io::{IoEngine, Rw};
use pagewriter_bench::workload::scale::{
    self, CommitKind, Fill, Layout, Mode, ScaleConfig, ScaleReport,
};

mod args;
mod print;

use args::*;
use print::*;

fn main() -> ExitCode {
    let cli = Cli::parse();
    pagewriter_bench::interrupt::install();
    let result = match cli.command {
        Command::Scale(args) => cmd_scale(args),
        #[cfg(feature = "cf")]
        Command::Cf(args) => cmd_cf(args),
        Command::Flush(args) => cmd_flush(args),
        Command::Gen(args) => cmd_gen(args),
        Command::WriteFile(args) => cmd_write_file(args),
        Command::Io(args) => cmd_io(args),
        Command::Report(args) => cmd_report(args),
        Command::PlotRounds(args) => cmd_plot_rounds(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pagewriter: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_scale(a: ScaleArgs) -> Result<(), Box<dyn std::error::Error>> {
    let modes = a
        .modes
        .iter()
        .map(|m| m.with_queue_depth(a.queue_depth))
        .collect();
    if !a.path.is_dir() {
        return Err(format!("--path {} is not a directory", a.path.display()).into());
    }
    let (layout, preallocate_bytes) = match (a.layout, a.preallocate) {
        (None | Some(LayoutArg::Growing), None) => (Layout::Growing, 0),
        (Some(LayoutArg::Growing), Some(n)) => (Layout::Growing, n),
        (None | Some(LayoutArg::Preallocated), n) => (Layout::Preallocated, n.unwrap_or(4 << 30)),
        (Some(LayoutArg::Written), n) => (Layout::Written, n.unwrap_or(1 << 30)),
    };
    let config = ScaleConfig {
        threads: a.threads,
        modes,
        pages_per_txn: a.pages,
        page_size: a.page_size,
        rewrite_fraction: a.rewrite,
        commit: a.commit,
        cell_duration: Duration::from_secs_f64(a.duration),
        repeats: a.repeats,
        dir: a.path,
        seed: a.seed,
        max_write_buffer_bytes: usize::try_from(a.buffer_mib << 20)
            .map_err(|_| format!("--buffer-mib {} is too large here", a.buffer_mib))?,
        torn_writes: a.torn_writes.into(),
        grow_ahead: a.grow_ahead,
        direct: a.direct.into(),
        dedup_ratio: a.dedup,
        compress_ratio: a.compress,
        reads_per_txn: a.reads,
        read_cache_bytes: usize::try_from(a.read_cache).map_err(|_| "--read-cache too large")?,
        layout,
        fill: match a.fill {
            FillArg::Random => Fill::Random,
            FillArg::Fixed => Fill::Fixed,
            FillArg::Bytes => Fill::Bytes,
        },
        preallocate_bytes,
        force: a.force,
    };
    config.validate()?;
    // Plot path and reference are checked before minutes of work.
    if let Some(p) = &a.plot {
        plot::check_writable(p)?;
    }
    let reference: Option<plot::Reference> = match &a.reference {
        Some(p) => Some(read_json(p)?),
        None => None,
    };
    let total = config.threads.len() * config.modes.len() * config.repeats;
    let mut done = 0;
    let report = scale::run(&config, |c| {
        done += 1;
        eprintln!(
            "[{done}/{total}] repeat {} {:>2} threads {:<15} {:>10.0} pages/s{}",
            c.repeat + 1,
            c.threads,
            c.mode.name(),
            c.page_writes_per_s(),
            if c.room_limited {
                " (ended early: the file system is nearly full)"
            } else {
                ""
            }
        );
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_scale(&report);
    }
    if let Some(p) = &a.plot {
        plot::line_svg(&plot::scale_figure(&report, reference.as_ref()), p)?;
        eprintln!("plot: {}", p.display());
    }
    Ok(())
}

#[cfg(feature = "cf")]
fn cmd_cf(a: CfArgs) -> Result<(), Box<dyn std::error::Error>> {
    use pagewriter_bench::workload::cf::{self, CfConfig, Engine};
    let engines = if a.engines.is_empty() {
        Engine::all()
    } else {
        a.engines
            .iter()
            .map(|s| {
                Engine::parse(s).ok_or_else(|| {
                    let have: Vec<&str> = Engine::all().iter().map(|e| e.name()).collect();
                    format!(
                        "--engines: {s:?} is not one this build has ({}; the peers need their features)",
                        have.join(", ")
                    )
                })
            })
            .collect::<Result<_, _>>()?
    };
    let config = CfConfig {
        writers: a.writers,
        batches: a.batches,
        readers: a.readers,
        engines,
        seconds: a.seconds,
        rounds: a.rounds,
        dir: a.path,
    };
    config.validate()?;
    if let Some(p) = &a.plot {
        plot::check_writable(p)?;
    }
    pagewriter_bench::scratch::remove_stale(&config.dir);
    let bar = indicatif::ProgressBar::new(config.cells() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} cells, {elapsed} {msg}")
            .expect("template"),
    );
    // A bar on a terminal; a line per cell otherwise (a log).
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut done = 0;
    let report = cf::run(&config, |c| {
        done += 1;
        let line = format!(
            "round {} {} writers x {} {}: {:.0} ops/s{}",
            c.round + 1,
            c.writers,
            c.batch,
            c.engine.name(),
            c.ops_per_s,
            if c.hung { " (a writer hung)" } else { "" }
        );
        if terminal {
            bar.inc(1);
            bar.set_message(line);
        } else {
            eprintln!("[{done}/{}] {line}", config.cells());
        }
    });
    bar.finish_and_clear();
    let report = report?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_cf(&report);
    }
    if let Some(p) = &a.plot {
        plot::line_svg(&cf::figure(&report), p)?;
        eprintln!("plot: {}", p.display());
    }
    Ok(())
}

fn cmd_flush(a: FlushArgs) -> Result<(), Box<dyn std::error::Error>> {
    let engines = a
        .engines
        .iter()
        .map(|e| e.with_queue_depth(a.queue_depth))
        .collect();
    if !a.path.is_dir() {
        return Err(format!("--path {} is not a directory", a.path.display()).into());
    }
    if let Some(file) = &a.file {
        let parent = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
        if !parent.is_dir() {
            return Err(format!(
                "--file {}: its directory {} does not exist",
                file.display(),
                parent.display()
            )
            .into());
        }
        if file.is_dir() {
            return Err(format!("--file {}: a directory, not a file", file.display()).into());
        }
    }
    let config = BulkConfig {
        size: a.size,
        engines,
        page_size: 4096,
        max_write_bytes: usize::try_from(a.bs).map_err(|_| "--bs too large")?,
        direct: a.direct.into(),
        repeats: a.repeats,
        file: a.file,
        dir: a.path,
        warmup: a.warmup,
        force: a.force,
    };
    let runs = bulk::run(&config, |r: &BulkRun| {
        if !a.json {
            println!(
                "repeat {} {:<40} {:>8.3} GB/s  ({} B in {:.3} s, {} write calls, {} fdatasync){}",
                r.repeat + 1,
                r.io_mode,
                r.gb_per_s,
                r.bytes,
                r.seconds,
                r.stats.write_calls,
                r.stats.syncs,
                if r.overwrite {
                    ", overwrite of written blocks"
                } else {
                    ""
                }
            );
        }
    })
    .map_err(|e| with_path(config.file.as_deref().unwrap_or(&config.dir), e))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
    }
    Ok(())
}

fn cmd_gen(a: GenArgs) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::{Read, Write};
    let block_size = usize::try_from(a.block_size).map_err(|_| "--block-size too large")?;
    if let Some(path) = &a.verify {
        if path.is_dir() {
            return Err(format!("--verify {}: a directory, not a file", path.display()).into());
        }
        let mut f =
            std::fs::File::open(path).map_err(|e| format!("--verify {}: {e}", path.display()))?;
        let started = std::time::Instant::now();
        let m = datagen::measure(|buf| f.read(buf), block_size)
            .map_err(|e| format!("--verify {}: {e}", path.display()))?;
        // A target only where one was given.
        let target = |t: Option<f64>| t.map_or(String::new(), |t| format!("target {t:.3}, "));
        if a.json {
            println!(
                "{}",
                serde_json::json!({
                    "file": path, "bytes": m.bytes, "block_size": block_size,
                    "dedup_ratio": m.dedup_ratio, "compress_ratio": m.compress_ratio,
                    "target_dedup_ratio": a.dedup, "target_compress_ratio": a.compress,
                })
            );
        } else {
            println!(
                "{}: {} B in {:.1} s",
                path.display(),
                m.bytes,
                started.elapsed().as_secs_f64()
            );
            println!(
                "dedup ratio       {:>8.3}  ({}block {} B, XXH3-128 per block)",
                m.dedup_ratio,
                target(a.dedup),
                block_size
            );
            println!(
                "compression ratio {:>8.3}  ({}LZ4 per 64 KiB of unique data)",
                m.compress_ratio,
                target(a.compress)
            );
        }
        return Ok(());
    }
    let (dedup, compress) = (a.dedup.unwrap_or(1.0), a.compress.unwrap_or(1.0));
    let generator = datagen::Generator::new(datagen::GenConfig {
        size: a.size,
        dedup_ratio: dedup,
        compress_ratio: compress,
        block_size,
        seed: a.seed,
    })?;
    let mut out: Box<dyn Write> = match &a.output {
        Some(p) => {
            // Checked before File::create truncates an existing output.
            pagewriter_bench::room::check(p, a.size, pagewriter_bench::room::held(p), a.force)?;
            Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Ctrl-C cuts -o to what was written (an incomplete file shows by size).
    let good = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    if let Some(p) = &a.output {
        pagewriter_bench::interrupt::partial(p.clone(), good.clone());
    }
    generator.write_to(&mut out, threads, &good)?;
    if let Some(p) = &a.output {
        eprintln!(
            "{}: {} B written (dedup {dedup}, compression {compress}, block {block_size} B, seed {})",
            p.display(),
            a.size,
            a.seed
        );
    }
    Ok(())
}

fn cmd_write_file(a: WriteFileArgs) -> Result<(), Box<dyn std::error::Error>> {
    use pagewriter_bench::stream::{self, WriteOptions};
    let mut opts = WriteOptions {
        dedup_ratio: a.dedup,
        compress_ratio: a.compress,
        seed: a.seed,
        direct: a.direct.into(),
        engine: a.engine,
        writer_threads: a.writer_threads,
        hugepages: a.hugepages,
        force: a.force,
        fixed_buffers: !a.no_fixed_buffers,
        preallocate: !a.no_preallocate,
        ..WriteOptions::default()
    };
    if a.auto {
        let (picked, why) = stream::auto_options(&a.path, &opts);
        opts = picked;
        for line in why {
            eprintln!("auto: {line}");
        }
    }
    if let Some(v) = a.buffer_size {
        opts.buffer_size = usize::try_from(v).map_err(|_| "--buffer-size too large")?;
    }
    if let Some(v) = a.buffer_count {
        opts.buffer_count = v;
    }
    if let Some(v) = a.queue_depth {
        opts.queue_depth = v;
    }
    if let Some(v) = a.gen_threads {
        opts.gen_threads = v;
    }
    let bar = indicatif::ProgressBar::new(a.size);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .expect("valid template"),
    );
    // Ctrl-C removes the partial file; the target is only ever replaced
    // whole, by a complete file (through a symlink: its target).
    let target = stream::resolve_target(&a.path).map_err(|e| with_path(&a.path, e))?;
    pagewriter_bench::interrupt::scratch(stream::partial_path(&target));
    let result = stream::write_file_with_progress(&a.path, a.size, &opts, &mut |p| {
        bar.set_position(p.bytes_done)
    });
    bar.finish_and_clear();
    let stats = match result {
        Ok(s) => s,
        Err(e) => {
            if a.json {
                println!("{}", serde_json::to_string_pretty(&e.stats)?);
            }
            return Err(format!("{}: {e}", a.path.display()).into());
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    println!(
        "wrote {} bytes to {} in {:.3} s: {:.3} GB/s ({:.3} GiB/s)",
        stats.bytes,
        a.path.display(),
        stats.duration_s,
        stats.gb_per_s,
        stats.gb_per_s * 1e9 / (1u64 << 30) as f64
    );
    println!("I/O: {}", stats.io_mode);
    println!(
        "time: generating {:.3} s over {} threads, waiting for writes {:.3} s, \
         waiting for data {:.3} s, truncate {:.3} s, fallocate {:.3} s, fdatasync {:.3} s; \
         {} writes",
        stats.gen_s,
        stats.gen_threads,
        stats.io_wait_s,
        stats.starved_s,
        stats.truncate_s,
        stats.preallocate_s,
        stats.fdatasync_s,
        stats.writes
    );
    Ok(())
}

fn cmd_io(a: IoArgs) -> Result<(), Box<dyn std::error::Error>> {
    use pagewriter_bench::workload::io::{self, IoConfig, Pattern, Ranks};
    let shared = a.shared_file.is_some();
    let path = a
        .shared_file
        .or(a.filename)
        .ok_or("--filename or --shared-file")?;
    if let Some(p) = &a.plot {
        plot::check_writable(p)?;
    }
    let fio: Option<serde_json::Value> = match &a.reference {
        Some(p) => Some(read_json(p)?),
        None => None,
    };
    let mut cfg = IoConfig::new(path);
    cfg.rw = a.rw;
    cfg.rwmix_read = a.rwmix_read;
    cfg.bs = usize::try_from(a.bs).map_err(|_| "--bs too large")?;
    cfg.size = a.size;
    cfg.runtime = a.runtime;
    cfg.iodepth = a.iodepth;
    cfg.iodepth_batch = a.iodepth_batch;
    cfg.numjobs = a.numjobs;
    cfg.direct = a.direct.into();
    cfg.engine = a.engine;
    cfg.fixedbufs = a.fixedbufs;
    cfg.registerfiles = a.registerfiles;
    cfg.sqthread_poll = a.sqthread_poll;
    cfg.hipri = a.hipri;
    cfg.force = a.force;
    cfg.run_id = a.run_id.clone().unwrap_or_else(io::default_run_id);
    // This run's rank, as `cfg.shared` gets it below.
    let rank = if shared || a.rank.is_some() || a.ranks.is_some() {
        a.rank
            .or(Ranks::from_slurm_env().map(|r| r.rank))
            .unwrap_or(0)
    } else {
        0
    };
    if let Some(dir) = &a.report_dir {
        // Before the run: a directory of another run's reports, or this
        // rank's report of this run already there, is refused.
        io::claim_report_dir(dir, &cfg.run_id, rank, a.overwrite)?;
    }
    cfg.offset = a.offset;
    cfg.offset_increment = a.offset_increment;
    cfg.fsync_every = a.fsync_every;
    cfg.end_fsync = a.end_fsync || shared;
    cfg.pattern = match a.pattern.as_str() {
        "gen" => Pattern::Gen,
        "header" => Pattern::Header,
        "fixed" => Pattern::Fixed,
        other => return Err(format!("unknown pattern {other:?} (gen, header, fixed)").into()),
    };
    cfg.dedup_ratio = a.dedup;
    cfg.compress_ratio = a.compress;
    cfg.seed = a.seed;
    cfg.verify = a.verify;
    cfg.hugepages = a.hugepages;
    if shared || a.rank.is_some() || a.ranks.is_some() {
        let env = Ranks::from_slurm_env();
        cfg.shared = Some(Ranks {
            rank: a.rank.or(env.map(|r| r.rank)).unwrap_or(0),
            ranks: a.ranks.or(env.map(|r| r.ranks)).unwrap_or(1),
            node: env.and_then(|r| r.node),
        });
        if !shared {
            return Err("--rank/--ranks need --shared-file".into());
        }
    }
    // A file this run creates goes again if it is interrupted (a failed
    // run removes it itself); a complete run's file stays.
    let created = io::created_by(&cfg);
    if created {
        pagewriter_bench::interrupt::scratch(cfg.path.clone());
    }
    let bar = indicatif::ProgressBar::hidden();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("template"),
    );
    let report = io::run(&cfg, &mut |p| {
        if p.elapsed >= Duration::from_secs(2) && bar.is_hidden() {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_message(format!(
            "{:.1}% {:.3} GB/s {} B done",
            p.fraction * 100.0,
            p.bytes_per_sec / 1e9,
            p.bytes
        ));
        bar.tick();
    });
    bar.finish_and_clear();
    if created && report.is_ok() {
        pagewriter_bench::interrupt::forget(&cfg.path);
    }
    let report = report.map_err(|e| with_path(&cfg.path, e))?;
    if let Some(dir) = &a.report_dir {
        std::fs::create_dir_all(dir)?;
        let rank = cfg.shared.map_or(0, |r| r.rank);
        let tmp = dir.join(format!(".rank-{rank}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&report)?)?;
        std::fs::rename(&tmp, dir.join(format!("rank-{rank}.json")))?;
    }
    if let Some(p) = &a.plot {
        plot::line_svg(&plot::io_figure(&report, fio.as_ref()), p)?;
        eprintln!("plot: {}", p.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_io(&report);
    Ok(())
}

/// An I/O error from work on `path` names it (the library's I/O errors
/// carry the call and offset, not the file).
fn with_path(path: &std::path::Path, e: Error) -> Box<dyn std::error::Error> {
    match e {
        e @ Error::Core(CoreError::Io { .. } | CoreError::PagesFailed { .. }) => {
            format!("{}: {e}", path.display()).into()
        }
        other => other.into(),
    }
}

/// Reads a JSON file into `T`; errors name the file.
fn read_json<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
) -> Result<T, Box<dyn std::error::Error>> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

fn cmd_plot_rounds(a: PlotRoundsArgs) -> Result<(), Box<dyn std::error::Error>> {
    plot::check_writable(&a.plot)?;
    let rounds: plot::Rounds = read_json(&a.input)?;
    plot::line_svg(&plot::rounds_figure(&rounds), &a.plot)?;
    eprintln!("plot: {}", a.plot.display());
    Ok(())
}

fn cmd_report(a: ReportArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(p) = &a.plot {
        plot::check_writable(p)?;
    }
    let agg = pagewriter_bench::workload::io::aggregate(&a.dir)?;
    if let Some(p) = &a.plot {
        plot::bars_svg(
            &plot::report_title(&agg),
            "bandwidth (GiB/s)",
            &plot::report_bars(&agg),
            p,
        )?;
        eprintln!("plot: {}", p.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&agg)?);
        return Ok(());
    }
    println!(
        "{} of {} ranks: {} bytes in {:.3} s (earliest start to latest end): {:.3} GiB/s aggregate",
        agg.ranks, agg.ranks_expected, agg.total_bytes, agg.span_s, agg.aggregate_gib_per_s
    );
    println!(
        "slowest: rank {} on {}, {:.3} s",
        agg.slowest.0, agg.slowest.1, agg.slowest.2
    );
    for (rank, host, bytes, gib) in &agg.per_rank {
        println!("  rank {rank:>4} {host:<20} {bytes:>14} B {gib:8.3} GiB/s");
    }
    if (agg.ranks as u32) < agg.ranks_expected {
        return Err(format!(
            "only {} of {} ranks reported",
            agg.ranks, agg.ranks_expected
        )
        .into());
    }
    Ok(())
}
