//! Generation speed: GB/s of `Generator::fill_at` (one thread) and
//! `fill_at_parallel` (all cores), for incompressible and compressible data.
//!
//! Also `stream::write_file` of 256 MiB per engine (io_uring, pwrite),
//! O_DIRECT where the file system takes it, in a temporary directory
//! under the current one.
//!
//! `cargo bench --bench datagen`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pagewriter_bench::datagen::{GenConfig, Generator};

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

fn write_file(c: &mut Criterion) {
    use pagewriter_bench::stream::{self, StreamEngine, WriteOptions};
    let mut g = c.benchmark_group("write_file");
    let size: u64 = 256 << 20;
    g.throughput(Throughput::Bytes(size));
    g.sample_size(10);
    let dir = tempfile::tempdir_in(".").unwrap();
    let path = dir.path().join("bench");
    for engine in [StreamEngine::IoUring, StreamEngine::Pwrite] {
        let opts = WriteOptions {
            engine,
            direct: pagewriter::DirectIo::Auto,
            ..WriteOptions::default()
        };
        if let Err(e) = stream::write_file(&path, size, &opts) {
            eprintln!("write_file {engine:?} skipped: {e}");
            continue;
        }
        g.bench_function(format!("{engine:?}"), |b| {
            b.iter(|| {
                let _ = std::fs::remove_file(&path);
                stream::write_file(&path, size, &opts).unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, generation, write_file);
criterion_main!(benches);
