//! Synthetic data speed: pagewriter's `Generator::fill_at_parallel` against
//! dgen-data 0.2's `DataGenerator::fill_chunk`, in one process, for {1, 2
//! threads} x {incompressible, dedup = compress = 2}.
//!
//! Each round makes `--size` bytes of every cell with both generators into
//! one reused buffer (`--buffer`, 32 MiB by default: no I/O), the order of
//! the two alternating from round to round; the table shows medians of GB/s
//! and of the per-round ratios (pagewriter / dgen-data), and beside them
//! what `memset` of the same bytes from the same threads reaches (the
//! store bandwidth: a generator using ordinary stores cannot pass it). Then both
//! generators' bytes are measured (dedup by 4 KiB block, LZ4 compression,
//! as `pagewriter gen --verify`) and the run fails if pagewriter's ratios
//! are more than 5% off their targets.
//!
//! `cargo run --release --manifest-path scripts/compare-dgen/Cargo.toml -- --rounds 5`

use clap::Parser;
use pagewriter_bench::datagen::{self, GenConfig, Generator};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Bytes made per cell, generator and round (e.g. 4GiB).
    #[arg(long, default_value = "4GiB", value_parser = parse_bytes)]
    size: u64,
    /// Bytes of the reused buffer.
    #[arg(long, default_value = "32MiB", value_parser = parse_bytes)]
    buffer: u64,
    /// Interleaved rounds (the table shows medians).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Bytes measured per generator for the ratio check.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    verify_size: u64,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    match parse_size::parse_size(s) {
        Ok(0) => Err("must be more than 0 bytes".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Clone, Copy)]
struct Cell {
    threads: usize,
    /// Dedup and compression ratio (both).
    ratio: u32,
}

fn pagewriter_gen(cell: Cell, size: u64) -> Generator {
    Generator::new(GenConfig {
        size,
        dedup_ratio: f64::from(cell.ratio),
        compress_ratio: f64::from(cell.ratio),
        block_size: 4096,
        seed: 1,
    })
    .expect("valid generator config")
}

fn dgen_gen(cell: Cell, size: u64) -> dgen_data::DataGenerator {
    dgen_data::DataGenerator::new(dgen_data::GeneratorConfig {
        size: size as usize,
        dedup_factor: cell.ratio as usize,
        compress_factor: cell.ratio as usize,
        max_threads: Some(cell.threads),
        seed: Some(1),
        ..Default::default()
    })
}

/// GB/s of making `size` bytes with pagewriter into `buf`.
fn time_pagewriter(cell: Cell, size: u64, buf: &mut [u8]) -> f64 {
    let g = pagewriter_gen(cell, size);
    let t = Instant::now();
    let mut at = 0;
    while at < size {
        let n = (buf.len() as u64).min(size - at) as usize;
        g.fill_at_parallel(at, &mut buf[..n], cell.threads)
            .expect("in range");
        at += n as u64;
    }
    size as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// GB/s of making `size` bytes with dgen-data into `buf`.
fn time_dgen(cell: Cell, size: u64, buf: &mut [u8]) -> f64 {
    let mut g = dgen_gen(cell, size);
    let t = Instant::now();
    let mut made = 0u64;
    loop {
        let n = g.fill_chunk(buf);
        if n == 0 {
            break;
        }
        made += n as u64;
    }
    assert_eq!(made, size, "dgen-data made a different size");
    made as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// GB/s of writing `size` bytes of one constant into `buf` (`memset`)
/// from `cell.threads` threads, each its share of every buffer: the store
/// bandwidth no generator can pass with ordinary stores.
fn time_memset(cell: Cell, size: u64, buf: &mut [u8]) -> f64 {
    let t = Instant::now();
    let mut at = 0;
    let mut byte = 0u8;
    while at < size {
        let n = (buf.len() as u64).min(size - at) as usize;
        byte = byte.wrapping_add(1);
        let share = n.div_ceil(cell.threads);
        std::thread::scope(|s| {
            for piece in buf[..n].chunks_mut(share) {
                s.spawn(move || piece.fill(byte));
            }
        });
        at += n as u64;
    }
    std::hint::black_box(&buf);
    size as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// Dedup and compression ratios of the stream `make` writes into `buf`,
/// one buffer at a time (0 bytes: the end).
fn measure(buf: &mut [u8], mut make: impl FnMut(&mut [u8]) -> usize) -> datagen::MeasuredRatios {
    let (mut have, mut used) = (0, 0);
    datagen::measure(
        |out| {
            if used == have {
                have = make(buf);
                used = 0;
            }
            let n = out.len().min(have - used);
            out[..n].copy_from_slice(&buf[used..used + n]);
            used += n;
            Ok(n)
        },
        4096,
    )
    .expect("measure")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let args = Args::parse();
    let cells = [
        Cell {
            threads: 1,
            ratio: 1,
        },
        Cell {
            threads: 1,
            ratio: 2,
        },
        Cell {
            threads: 2,
            ratio: 1,
        },
        Cell {
            threads: 2,
            ratio: 2,
        },
    ];
    let mut buf = vec![0u8; args.buffer.min(args.size) as usize];
    // (pagewriter GB/s, dgen-data GB/s, ratio) per cell per round.
    let mut figures = vec![(Vec::new(), Vec::new(), Vec::new()); cells.len()];
    // memset GB/s per thread count (1, 2) per round.
    let mut ceiling = [Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        for (i, c) in ceiling.iter_mut().enumerate() {
            let cell = Cell {
                threads: i + 1,
                ratio: 1,
            };
            c.push(time_memset(cell, args.size, &mut buf));
        }
        for (cell, fig) in cells.iter().zip(&mut figures) {
            let (pw, dg) = if round % 2 == 0 {
                let dg = time_dgen(*cell, args.size, &mut buf);
                (time_pagewriter(*cell, args.size, &mut buf), dg)
            } else {
                let pw = time_pagewriter(*cell, args.size, &mut buf);
                (pw, time_dgen(*cell, args.size, &mut buf))
            };
            eprintln!(
                "round {round}: {} thr, ratios {}: pagewriter {pw:.2} GB/s, dgen-data {dg:.2} GB/s",
                cell.threads, cell.ratio
            );
            fig.0.push(pw);
            fig.1.push(dg);
            fig.2.push(pw / dg);
        }
    }
    println!(
        "{} per cell and generator, {} buffer, median of {} interleaved rounds",
        args.size, args.buffer, args.rounds
    );
    println!(
        "| threads | dedup = compress | pagewriter GB/s | dgen-data GB/s | ratio | memset GB/s |"
    );
    println!("|---|---|---|---|---|---|");
    for (cell, fig) in cells.iter().zip(&mut figures) {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            cell.threads,
            cell.ratio,
            median(&mut fig.0),
            median(&mut fig.1),
            median(&mut fig.2),
            median(&mut ceiling[cell.threads - 1].clone())
        );
    }

    // The ratios the bytes really have.
    let mut off = false;
    println!(
        "\nmeasured on {} of each (4 KiB dedup blocks, LZ4 per 64 KiB):",
        args.verify_size
    );
    println!("| generator | target | dedup | compression |");
    println!("|---|---|---|---|");
    for ratio in [1u32, 2] {
        let cell = Cell { threads: 2, ratio };
        let g = pagewriter_gen(cell, args.verify_size);
        let mut at = 0u64;
        let m = measure(&mut buf, |b| {
            let n = (b.len() as u64).min(args.verify_size - at) as usize;
            g.fill_at_parallel(at, &mut b[..n], 2).expect("in range");
            at += n as u64;
            n
        });
        let within = |got: f64| (got / f64::from(ratio) - 1.0).abs() <= 0.05;
        off |= !within(m.dedup_ratio) || !within(m.compress_ratio);
        println!(
            "| pagewriter | {ratio} | {:.3} | {:.3} |",
            m.dedup_ratio, m.compress_ratio
        );
        let mut d = dgen_gen(cell, args.verify_size);
        let m = measure(&mut buf, |b| d.fill_chunk(b));
        println!(
            "| dgen-data | {ratio} | {:.3} | {:.3} |",
            m.dedup_ratio, m.compress_ratio
        );
    }
    if off {
        eprintln!("FAIL: pagewriter's measured ratios are more than 5% off target");
        std::process::exit(1);
    }
}
