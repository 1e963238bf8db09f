//! Generation speed: GB/s of `Generator::fill_at` (one thread) and
//! `fill_at_parallel` (all cores), for incompressible and compressible data.
//!
//! `cargo bench --bench datagen`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pagewriter::datagen::{GenConfig, Generator};

fn generation(c: &mut Criterion) {
    let mut g = c.benchmark_group("datagen");
    let len = 16 << 20;
    g.throughput(Throughput::Bytes(len as u64));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (dedup, compress) in [(1.0, 1.0), (1.0, 2.0), (3.0, 2.0)] {
        let generator = Generator::new(GenConfig {
            size: 1 << 30,
            dedup_ratio: dedup,
            compress_ratio: compress,
            block_size: 4096,
            seed: 1,
        })
        .unwrap();
        let mut buf = vec![0u8; len];
        let name = format!("dedup{dedup}-compress{compress}");
        g.bench_with_input(
            BenchmarkId::new(format!("{name}/1-thread"), len),
            &len,
            |b, _| b.iter(|| generator.fill_at(0, &mut buf).unwrap()),
        );
        g.bench_with_input(
            BenchmarkId::new(format!("{name}/{threads}-threads"), len),
            &len,
            |b, _| b.iter(|| generator.fill_at_parallel(0, &mut buf, threads).unwrap()),
        );
    }
    g.finish();
}

criterion_group!(benches, generation);
criterion_main!(benches);
