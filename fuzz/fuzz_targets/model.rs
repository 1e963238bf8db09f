//! Arbitrary operation sequences (writes, reads, flushes, syncs, injected
//! faults, crashes, close/reopen) against the reference model, through the
//! same checker as `tests/model.rs`.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use pagewriter::FlushEngine;
use pagewriter::testing::WriteFault;
use pagewriter::testing::model::{MAX_PAGES, ModelConfig, Op, check};

fn config(u: &mut Unstructured<'_>) -> Result<ModelConfig> {
    Ok(ModelConfig {
        grow_ahead: None,
        engine: match u.int_in_range(0..=3u8)? {
            0 => FlushEngine::PerPage,
            1 => FlushEngine::Concat,
            2 => FlushEngine::Vectored,
            _ => FlushEngine::IoUring { queue_depth: 4 },
        },
        page_size: 512 << u.int_in_range(0..=3u8)?,
        buffer_pages: u.int_in_range(1..=24usize)?,
        cache_pages: [0, 4, 64][u.int_in_range(0..=2usize)?],
        stripes: [1, 4, 64][u.int_in_range(0..=2usize)?],
        dir: None,
        direct: false,
        torn_writes: pagewriter::TornWrites::Allow,
    })
}

fn op(u: &mut Unstructured<'_>) -> Result<Op> {
    Ok(match u.int_in_range(0..=31u8)? {
        0..=7 => Op::Write {
            page: u.int_in_range(0..=MAX_PAGES - 1)?,
            pages: u.int_in_range(1..=3)?,
        },
        8..=10 => Op::Guard {
            page: u.int_in_range(0..=MAX_PAGES - 1)?,
            byte: u.arbitrary()?,
        },
        11..=16 => Op::Read {
            page: u.int_in_range(0..=MAX_PAGES - 1)?,
            pages: u.int_in_range(1..=3)?,
        },
        17..=18 => Op::Flush,
        19..=21 => Op::Sync,
        22 => Op::FailNextWrite(match u.int_in_range(0..=5u8)? {
            0 => WriteFault::Errno(libc_eio()),
            1 => WriteFault::Errno(28), // ENOSPC
            2 => WriteFault::Errno(4),  // EINTR
            3 => WriteFault::Errno(11), // EAGAIN
            4 => WriteFault::TornThenEio(512 * u.int_in_range(0..=8usize)?),
            _ => WriteFault::Short(512 * u.int_in_range(1..=16usize)?),
        }),
        23 => Op::FailNextSync,
        24 => Op::Crash { seed: u.arbitrary()? },
        25 => Op::SetLen {
            pages: u.int_in_range(0..=MAX_PAGES)?,
        },
        26..=27 => Op::Scoped {
            page: u.int_in_range(0..=MAX_PAGES - 1)?,
            pages: u.int_in_range(1..=3)?,
            ticket: u.arbitrary()?,
        },
        28 => Op::SyncAsync,
        29 => Op::WaitTicket,
        30 => Op::Through {
            page: u.int_in_range(0..=MAX_PAGES - 1)?,
            pages: u.int_in_range(1..=3)?,
        },
        _ => Op::Close,
    })
}

fn libc_eio() -> i32 {
    5
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(cfg) = config(&mut u) else { return };
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < 300 {
        match op(&mut u) {
            Ok(o) => ops.push(o),
            Err(_) => break,
        }
    }
    if let Err(e) = check(&cfg, &ops) {
        panic!("{e}\nconfig {cfg:?}\nops {ops:?}");
    }
});
