//! Flush of N dirty pages per engine, on a real file in the current
//! directory's file system (buffered I/O), and the coalescing step alone.
//!
//! `cargo bench --bench flush`

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pagewriter::coalesce::{RunLimits, coalesce};
use pagewriter::{Config, FlushEngine, PagedCachedFile};
use pagewriter_bench::rng::WyRand;
use pagewriter_bench::workload::flush::{Layout, dirty};

const PS: usize = 4096;

fn flush(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(".").expect("temp dir in the current directory");
    let mut g = c.benchmark_group("flush");
    g.sample_size(20);
    for layout in [Layout::Sequential, Layout::Clustered, Layout::Strided] {
        for n in [256u64, 4096] {
            g.throughput(Throughput::Bytes(n * PS as u64));
            for engine in [
                FlushEngine::PerPage,
                FlushEngine::Concat,
                FlushEngine::Vectored,
            ] {
                let path = dir.path().join(format!("{}-{layout:?}-{n}", engine.name()));
                let file = PagedCachedFile::open(&path, Config::default().engine(engine)).unwrap();
                let engine = file.io_mode().engine;
                let mut rng = WyRand::new(n);
                // Same pages every iteration: the file does not grow, so the
                // measurement is the write path, not block allocation.
                dirty(&file, layout, n, &mut rng).unwrap();
                file.flush().unwrap();
                g.bench_with_input(
                    BenchmarkId::new(format!("{layout:?}/{}", engine.name()), n),
                    &n,
                    |b, &n| {
                        b.iter_batched(
                            || dirty(&file, layout, n, &mut rng).unwrap(),
                            |()| file.flush().unwrap(),
                            BatchSize::PerIteration,
                        )
                    },
                );
            }
        }
    }
    g.finish();
}

fn coalesce_only(c: &mut Criterion) {
    let mut g = c.benchmark_group("coalesce");
    let page = vec![0u8; PS];
    for n in [1024u64, 16384] {
        let mut rng = WyRand::new(1);
        let mut base: Vec<(u64, &[u8])> = (0..n)
            .map(|i| (Layout::Clustered.page(i) * PS as u64, &page[..]))
            .collect();
        // Shuffle (drain order is hash order, not offset order).
        for i in (1..base.len()).rev() {
            base.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let limits = RunLimits {
            max_pages: 1024,
            max_bytes: 1 << 20,
        };
        let mut runs = Vec::new();
        g.throughput(Throughput::Elements(n));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter_batched(
                || base.clone(),
                |mut e| coalesce(&mut e, limits, &mut runs).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, flush, coalesce_only);
criterion_main!(benches);
