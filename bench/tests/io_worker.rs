//! `workload::io` (`pagewriter io`) on real files: bytes written, verify,
//! shared-file partitions across ranks, reports, bad arguments.

use std::os::unix::fs::FileExt;

use pagewriter::DirectIo;
use pagewriter_bench::datagen::{GenConfig, Generator};
use pagewriter_bench::error::{CoreError, Error};
use pagewriter_bench::workload::io::{self, IoConfig, IoEngine, Pattern, Ranks, Rw};
use proptest::prelude::*;

fn engines() -> Vec<IoEngine> {
    let mut v = vec![IoEngine::Psync];
    if pagewriter::testing::uring_available() {
        v.push(IoEngine::IoUring);
    } else {
        eprintln!("io_uring unavailable here: its cases are skipped");
    }
    v
}

/// The generator of a file of `size` bytes written with `cfg`'s data knobs.
fn generator(cfg: &IoConfig, size: u64) -> Generator {
    Generator::new(GenConfig {
        size,
        dedup_ratio: cfg.dedup_ratio,
        compress_ratio: cfg.compress_ratio,
        block_size: 4096,
        seed: cfg.seed,
    })
    .unwrap()
}

fn assert_generated(path: &std::path::Path, cfg: &IoConfig, size: u64) {
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, size);
    let mut want = vec![0u8; size as usize];
    generator(cfg, size).fill_at(0, &mut want).unwrap();
    if let Some(i) = data.iter().zip(&want).position(|(a, b)| a != b) {
        panic!("byte {i} differs from the generator's");
    }
}

#[test]
fn every_pattern_and_engine_writes_the_generators_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for engine in engines() {
        for (rw, direct) in [
            (Rw::Write, DirectIo::Off),
            (Rw::RandWrite, DirectIo::Off),
            (Rw::Write, DirectIo::Auto),
            (Rw::RandWrite, DirectIo::Auto),
        ] {
            let path = dir.path().join(format!("f-{engine:?}-{rw:?}-{direct:?}"));
            let mut cfg = IoConfig::new(&path);
            cfg.rw = rw;
            cfg.engine = engine;
            cfg.direct = direct;
            cfg.bs = 64 << 10;
            cfg.size = 1 << 20;
            cfg.numjobs = 3;
            cfg.iodepth = 8;
            cfg.seed = 5;
            cfg.compress_ratio = 2.0;
            cfg.verify = true;
            cfg.end_fsync = true;
            let r = io::run(&cfg, &mut |_| {}).unwrap();
            let w = r.write.as_ref().expect("writes");
            assert_eq!(w.bytes, 3 << 20);
            assert_eq!(w.ios, 3 * 16);
            assert_eq!(w.lat_samples, w.ios, "every I/O timed");
            assert!(w.lat_us.p50 > 0.0 && w.lat_us.max >= w.lat_us.p99);
            assert!(r.read.is_none());
            assert_eq!(r.verified_blocks, 48);
            assert_eq!(r.fsyncs, 3);
            assert_generated(&path, &cfg, 3 << 20);

            // Read it back through the same engine.
            cfg.rw = if rw == Rw::Write {
                Rw::Read
            } else {
                Rw::RandRead
            };
            let r = io::run(&cfg, &mut |_| {}).unwrap();
            assert_eq!(r.read.as_ref().unwrap().bytes, 3 << 20);
            assert!(r.write.is_none());
        }
    }
}

#[test]
fn mixed_and_time_based_runs_split_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mix");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    for engine in engines() {
        let mut cfg = IoConfig::new(&path);
        cfg.engine = engine;
        cfg.rw = Rw::RandRw;
        cfg.rwmix_read = 70;
        cfg.size = 1 << 20;
        cfg.iodepth = 4;
        cfg.runtime = Some(std::time::Duration::from_millis(300));
        cfg.fsync_every = 100;
        let r = io::run(&cfg, &mut |_| {}).unwrap();
        let (rd, wr) = (r.read.unwrap(), r.write.unwrap());
        let share = rd.ios as f64 / (rd.ios + wr.ios) as f64;
        assert!((0.6..0.8).contains(&share), "read share {share}");
        assert!(rd.ios + wr.ios > 256, "time-based runs past one pass");
        assert!(r.runtime_s >= 0.3 && r.runtime_s < 5.0, "{}", r.runtime_s);
        assert!(
            r.fsyncs >= wr.ios / 100,
            "{} fsyncs for {} writes",
            r.fsyncs,
            wr.ios
        );
    }
}

#[test]
fn verify_catches_a_flipped_byte_and_names_its_block() {
    let dir = tempfile::tempdir().unwrap();
    for pattern in [Pattern::Gen, Pattern::Header] {
        let path = dir.path().join(format!("v-{pattern:?}"));
        let mut cfg = IoConfig::new(&path);
        cfg.rw = Rw::Write;
        cfg.bs = 4096;
        cfg.size = 256 << 10;
        cfg.pattern = pattern;
        cfg.verify = true;
        let r = io::run(&cfg, &mut |_| {}).unwrap();
        assert_eq!(r.verified_blocks, 64);

        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut b = [0u8; 1];
        let at = 37 * 4096 + 1234;
        file.read_exact_at(&mut b, at).unwrap();
        file.write_all_at(&[b[0] ^ 0x10], at).unwrap();
        let g = generator(&cfg, cfg.size);
        let err = io::verify_region(&cfg, &g, &file, 0, cfg.size).unwrap_err();
        assert_eq!(err.offset, 37 * 4096, "{err:?}");

        // The run reports it as an error naming the offset.
        cfg.rw = Rw::Read;
        let e = io::run(&cfg, &mut |_| {}).unwrap_err();
        assert!(
            matches!(e, Error::VerifyFailed { offset, .. } if offset == 37 * 4096),
            "{e:?}"
        );

        if pattern == Pattern::Header {
            // A block moved elsewhere is caught by its header.
            let mut blk = vec![0u8; 4096];
            file.read_exact_at(&mut blk, 0).unwrap();
            file.write_all_at(&blk, 5 * 4096).unwrap();
            let err = io::verify_region(&cfg, &g, &file, 0, 36 * 4096).unwrap_err();
            assert_eq!(err.offset, 5 * 4096);
            assert!(err.why.contains("offset 0"), "{err:?}");
        }
    }
}

#[test]
fn ranks_sharing_a_file_write_every_byte_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared");
    // 4 ranks x 2 jobs over a size that divides by neither.
    let size = (5 << 20) + 4096 * 3 + 123;
    let ranks = 4;
    let reports = dir.path().join("reports");
    std::fs::create_dir(&reports).unwrap();
    std::thread::scope(|s| {
        for rank in 0..ranks {
            let (path, reports) = (&path, &reports);
            s.spawn(move || {
                let mut cfg = IoConfig::new(path);
                cfg.rw = Rw::Write;
                cfg.bs = 64 << 10;
                cfg.size = size;
                cfg.numjobs = 2;
                cfg.iodepth = 4;
                cfg.direct = DirectIo::Auto;
                cfg.end_fsync = true;
                cfg.shared = Some(Ranks {
                    rank,
                    ranks,
                    node: None,
                });
                let r = io::run(&cfg, &mut |_| {}).unwrap();
                std::fs::write(
                    reports.join(format!("rank-{rank}.json")),
                    serde_json::to_vec(&r).unwrap(),
                )
                .unwrap();
            });
        }
    });
    let mut cfg = IoConfig::new(&path);
    cfg.size = size;
    assert_generated(&path, &cfg, size);

    let agg = io::aggregate(&reports).unwrap();
    assert_eq!(agg.ranks, 4);
    assert_eq!(agg.ranks_expected, 4);
    assert_eq!(agg.total_bytes, size);
    assert!(agg.aggregate_gib_per_s > 0.0 && agg.span_s > 0.0);
    assert_eq!(agg.per_rank.len(), 4);
    assert!(agg.per_rank.iter().map(|r| r.2).sum::<u64>() == size);
}

#[test]
fn a_rank_never_truncates_a_longer_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long");
    std::fs::write(&path, vec![7u8; 3 << 20]).unwrap();
    let mut cfg = IoConfig::new(&path);
    cfg.rw = Rw::Write;
    cfg.size = 1 << 20;
    cfg.bs = 64 << 10;
    cfg.shared = Some(Ranks {
        rank: 1,
        ranks: 2,
        node: None,
    });
    io::run(&cfg, &mut |_| {}).unwrap();
    let data = std::fs::read(&path).unwrap();
    assert_eq!(data.len(), 3 << 20);
    assert!(
        data[..512 << 10].iter().all(|&b| b == 7),
        "rank 0's part untouched"
    );
    assert!(
        data[1 << 20..].iter().all(|&b| b == 7),
        "bytes past size untouched"
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad");
    let base = {
        let mut c = IoConfig::new(&path);
        c.rw = Rw::Write;
        c.size = 1 << 20;
        c
    };
    type Change = Box<dyn Fn(&mut IoConfig)>;
    let cases: Vec<(&str, Change)> = vec![
        ("bs", Box::new(|c| c.bs = 0)),
        ("iodepth", Box::new(|c| c.iodepth = 0)),
        ("iodepth_batch", Box::new(|c| c.iodepth_batch = 2)),
        ("rwmix_read", Box::new(|c| c.rwmix_read = 101)),
        ("numjobs", Box::new(|c| c.numjobs = 0)),
        ("size", Box::new(|c| c.size = 0)),
        (
            "runtime",
            Box::new(|c| c.runtime = Some(std::time::Duration::ZERO)),
        ),
        (
            "rank",
            Box::new(|c| {
                c.shared = Some(Ranks {
                    rank: 4,
                    ranks: 4,
                    node: None,
                })
            }),
        ),
        ("hipri", Box::new(|c| c.hipri = true)),
        (
            "io_uring option",
            Box::new(|c| {
                c.engine = IoEngine::Psync;
                c.fixedbufs = true
            }),
        ),
        ("overflow", Box::new(|c| c.offset = u64::MAX - 10)),
        ("ratio", Box::new(|c| c.dedup_ratio = f64::NAN)),
    ];
    for (what, change) in cases {
        let mut cfg = base.clone();
        change(&mut cfg);
        match io::run(&cfg, &mut |_| {}) {
            Err(Error::Core(CoreError::InvalidConfig(m))) => assert!(!m.is_empty(), "{what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    assert!(!path.exists(), "no bad configuration touched the file");
    assert!("sideways".parse::<Rw>().is_err());
    assert!("libaio".parse::<IoEngine>().is_err());

    if pagewriter::testing::direct_available(dir.path()) {
        let mut cfg = base.clone();
        cfg.direct = DirectIo::On;
        cfg.bs = 1000;
        match io::run(&cfg, &mut |_| {}) {
            Err(Error::Core(CoreError::InvalidConfig(m))) => assert!(m.contains("O_DIRECT"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn hipri_runs_or_says_the_device_has_no_poll_queues() {
    let dir = tempfile::tempdir().unwrap();
    if !pagewriter::testing::uring_available() || !pagewriter::testing::direct_available(dir.path())
    {
        eprintln!("needs io_uring and O_DIRECT; skipped");
        return;
    }
    let mut cfg = IoConfig::new(dir.path().join("poll"));
    cfg.rw = Rw::Write;
    cfg.size = 256 << 10;
    cfg.direct = DirectIo::On;
    cfg.hipri = true;
    match io::run(&cfg, &mut |_| {}) {
        Ok(r) => assert_eq!(r.write.unwrap().bytes, 256 << 10),
        Err(Error::Core(CoreError::InvalidConfig(m))) => assert!(m.contains("poll queues"), "{m}"),
        Err(e) => panic!("unclear error: {e}"),
    }
}

proptest! {
    /// Parts of any size among any ranks and threads cover [0, S) exactly,
    /// in order, without overlap; all but the last are aligned.
    #[test]
    fn shared_file_parts_cover_the_file_exactly(
        size in 1u64..1 << 50,
        ranks in 1u32..64,
        jobs in 1usize..16,
        align_log in 0u32..21,
    ) {
        let align = 1u64 << align_log;
        let mut cfg = IoConfig::new("unused");
        cfg.size = size;
        cfg.numjobs = jobs;
        let mut at = 0u64;
        for rank in 0..ranks {
            cfg.shared = Some(Ranks { rank, ranks, node: None });
            for j in 0..jobs {
                let (off, len) = cfg.region(j, align);
                prop_assert_eq!(off, at);
                prop_assert_eq!(off % align, 0);
                at += len;
            }
        }
        prop_assert_eq!(at, size);
    }
}

#[test]
fn ring_options_all_write_the_same_bytes() {
    if !pagewriter::testing::uring_available() {
        eprintln!("io_uring unavailable here; skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (fixedbufs, registerfiles, sqpoll, batch) in [
        (true, false, false, 1),
        (false, true, false, 4),
        (true, true, true, 1),
        (false, false, true, 8),
    ] {
        let path = dir
            .path()
            .join(format!("o-{fixedbufs}-{registerfiles}-{sqpoll}-{batch}"));
        let mut cfg = IoConfig::new(&path);
        cfg.rw = Rw::RandWrite;
        cfg.bs = 16 << 10;
        cfg.size = 1 << 20;
        cfg.iodepth = 8;
        cfg.iodepth_batch = batch;
        cfg.fixedbufs = fixedbufs;
        cfg.registerfiles = registerfiles;
        cfg.sqthread_poll = sqpoll;
        cfg.direct = DirectIo::Auto;
        cfg.verify = true;
        let r = io::run(&cfg, &mut |_| {}).unwrap();
        assert_eq!(r.write.unwrap().ios, 64);
        assert_eq!(r.verified_blocks, 64);
        assert_generated(&path, &cfg, 1 << 20);
    }
}
