//! The ring's own tests: transfers through fixed and plain buffers, lent
//! buffers, short and interrupted transfers, vectored runs, errors.

use super::*;
use std::os::unix::fs::FileExt;

fn bufs(n: usize, len: usize) -> Vec<AlignedBuf> {
    (0..n)
        .map(|_| AlignedBuf::zeroed(len, 4096).unwrap())
        .collect()
}

#[test]
fn writes_and_reads_back_through_fixed_and_plain_buffers() {
    let f = tempfile::tempfile().unwrap();
    for (fixed, file) in [(true, true), (false, false), (true, false), (false, true)] {
        let opts = RingOptions {
            queue_depth: 4,
            register_file: file,
            fixed_buffers: fixed,
            single_issuer: true,
            sqpoll: false,
            iopoll: false,
        };
        let mut ring = match SlotRing::new(&f, opts, bufs(4, 8192)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("io_uring unavailable ({e}); skipped");
                return;
            }
        };
        for slot in 0..4 {
            ring.buf_mut(slot).unwrap().fill(slot as u8 + 1);
            ring.push(slot, RingOp::Write, slot as u64 * 8192, 0, 8192)
                .unwrap();
            assert!(ring.buf(slot).is_none(), "in flight slot must be hidden");
            assert!(ring.take(slot).is_none());
        }
        assert!(
            ring.push(0, RingOp::Write, 0, 0, 1).is_err(),
            "slot 0 is busy"
        );
        let mut done = Vec::new();
        while done.len() < 4 {
            ring.wait(4 - done.len(), &mut done).unwrap();
        }
        for c in &done {
            assert_eq!(c.result.as_ref().unwrap(), &8192);
        }
        let mut back = vec![0u8; 8192];
        for slot in 0..4u64 {
            f.read_exact_at(&mut back, slot * 8192).unwrap();
            assert!(back.iter().all(|&b| b == slot as u8 + 1));
        }
        // Read back through the ring into slot 2.
        ring.buf_mut(2).unwrap().fill(0);
        ring.push(2, RingOp::Read, 3 * 8192, 0, 8192).unwrap();
        done.clear();
        ring.wait(1, &mut done).unwrap();
        assert_eq!(done[0].slot, 2);
        assert!(ring.buf(2).unwrap().iter().all(|&b| b == 4));
    }
}

#[test]
fn a_lent_buffer_is_filled_elsewhere_and_never_freed_by_its_holder() {
    let f = tempfile::tempfile().unwrap();
    let Ok(mut ring) = SlotRing::new(&f, RingOptions::new(2), bufs(2, 4096)) else {
        eprintln!("io_uring unavailable; skipped");
        return;
    };
    let mut lent = ring.take(0).unwrap();
    assert!(ring.take(0).is_none(), "one lender per slot");
    assert!(ring.buf(0).is_none());
    assert!(
        ring.push(0, RingOp::Write, 0, 0, 4096).is_err(),
        "slot is out"
    );
    let other = ring.take(1).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| lent.fill(9));
    });
    ring.put(lent).unwrap();
    ring.push(0, RingOp::Write, 0, 0, 4096).unwrap();
    let mut done = Vec::new();
    ring.wait(1, &mut done).unwrap();
    assert_eq!(done[0].result.as_ref().unwrap(), &4096);
    let mut back = vec![0u8; 4096];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 9));
    // A buffer of another ring is refused; a dropped one leaves its
    // slot empty but the memory with the ring.
    let Ok(mut second) = SlotRing::new(&f, RingOptions::new(2), bufs(2, 4096)) else {
        return;
    };
    let foreign = second.take(1).unwrap();
    let foreign = ring.put(foreign).unwrap_err();
    second.put(foreign).unwrap();
    drop(other);
    assert!(ring.buf(1).is_none() && ring.take(1).is_none());
    assert_eq!(ring.buffers.owners(1), 1, "the ring still owns it");
}

#[test]
fn short_and_interrupted_transfers_are_continued_by_the_ring() {
    let f = tempfile::tempfile().unwrap();
    let Ok(mut ring) = SlotRing::new(&f, RingOptions::new(2), bufs(2, 8192)) else {
        eprintln!("io_uring unavailable; skipped");
        return;
    };
    // Job 3 goes out as 100 bytes, then 3000, then EAGAIN, then the
    // rest; job 5 fails. 7 jobs through 2 slots.
    let jobs: Vec<CopyJob> = (0..7u64)
        .map(|i| CopyJob {
            offset: i * 10_000,
            len: 8192,
        })
        .collect();
    let plan = std::cell::RefCell::new(vec![
        Some(UringFault::Errno(libc::EAGAIN)),
        Some(UringFault::Short(3000)),
        Some(UringFault::Short(100)),
    ]);
    let fault = |off: u64, _len: usize| match off {
        50_000 => Some(UringFault::Errno(libc::EIO)),
        o if (30_000..40_000).contains(&o) => plan.borrow_mut().pop().flatten(),
        _ => None,
    };
    let mut fill = |j: usize, buf: &mut [u8]| buf.fill(j as u8 + 1);
    let mut errs = Vec::new();
    ring.write_copied(&jobs, &mut fill, &mut errs, Some(&fault))
        .unwrap();
    for (j, e) in errs.iter().enumerate() {
        assert_eq!(e.is_some(), j == 5, "job {j}: {e:?}");
    }
    for j in [0u64, 1, 2, 3, 4, 6] {
        let mut back = vec![0u8; 8192];
        f.read_exact_at(&mut back, j * 10_000).unwrap();
        assert!(back.iter().all(|&b| b == j as u8 + 1), "job {j}");
    }
    assert!(plan.borrow().is_empty(), "every fault was acted out");
    assert!(
        ring.write_copied(
            &[CopyJob {
                offset: 0,
                len: 8193
            }],
            &mut fill,
            &mut errs,
            None
        )
        .is_err(),
        "a job longer than a slot"
    );
    // A short read is continued; a read at the end of the file comes
    // back with the bytes there were.
    let injected = std::cell::Cell::new(false);
    let short_once =
        |_: u64, _: usize| (!injected.replace(true)).then_some(UringFault::Short(1000));
    ring.buf_mut(0).unwrap().fill(0);
    ring.push_slot(0, RingOp::Read, 60_000, 0, 8192, Some(&short_once))
        .unwrap();
    let mut done = Vec::new();
    ring.wait_with(1, &mut done, Some(&short_once)).unwrap();
    assert_eq!(done[0].result.as_ref().unwrap(), &(68_192 - 60_000));
    assert!(ring.buf(0).unwrap()[..8192].iter().all(|&b| b == 7));
    assert!(injected.get());
}

#[test]
fn vectored_runs_at_queue_depth_and_beyond_iov_max() {
    let f = tempfile::tempfile().unwrap();
    let Ok(mut ring) = SlotRing::new(&f, RingOptions::new(4), Vec::new()) else {
        eprintln!("io_uring unavailable; skipped");
        return;
    };
    // 10 runs of 3 pages with gaps, and one run of 1500 512-byte
    // segments (more than IOV_MAX, so it takes two SQEs), with a short
    // write crossing a segment in run 2.
    let pages: Vec<Vec<u8>> = (0..30u8).map(|i| vec![i + 1; 4096]).collect();
    let small: Vec<Vec<u8>> = (0..1500u32)
        .map(|i| vec![(i % 200) as u8 + 1; 512])
        .collect();
    let iovs: Vec<Vec<IoSlice<'_>>> = pages
        .chunks(3)
        .map(|c| c.iter().map(|p| IoSlice::new(p)).collect())
        .collect();
    let big: Vec<IoSlice<'_>> = small.iter().map(|p| IoSlice::new(p)).collect();
    let mut runs: Vec<VectoredRun<'_, '_>> = iovs
        .iter()
        .enumerate()
        .map(|(i, v)| VectoredRun {
            offset: i as u64 * 4 * 4096,
            bufs: v,
        })
        .collect();
    runs.push(VectoredRun {
        offset: 1 << 20,
        bufs: &big,
    });
    let shorts = std::cell::Cell::new(0);
    let fault = |off: u64, _len: usize| {
        (off == 2 * 4 * 4096 && shorts.get() == 0).then(|| {
            shorts.set(1);
            UringFault::Short(5000)
        })
    };
    let mut errs = vec![Some(io::Error::other("stale"))];
    ring.write_vectored(&runs, &mut errs, Some(&fault)).unwrap();
    assert_eq!(errs.len(), runs.len());
    assert!(errs.iter().all(|e| e.is_none()), "{errs:?}");
    assert_eq!(shorts.get(), 1);
    for (i, p) in pages.iter().enumerate() {
        let at = (i / 3) * 4 * 4096 + (i % 3) * 4096;
        let mut back = vec![0u8; 4096];
        f.read_exact_at(&mut back, at as u64).unwrap();
        assert_eq!(&back, p, "page {i}");
    }
    let mut back = vec![0u8; 1500 * 512];
    f.read_exact_at(&mut back, 1 << 20).unwrap();
    assert_eq!(back, small.concat());
}

#[test]
fn a_failed_vectored_run_does_not_stop_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, b"x").unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let Ok(mut ring) = SlotRing::new(&file, RingOptions::new(2), Vec::new()) else {
        eprintln!("io_uring unavailable; skipped");
        return;
    };
    let page = vec![1u8; 4096];
    let one = [IoSlice::new(&page)];
    let runs: Vec<VectoredRun<'_, '_>> = (0..3)
        .map(|i| VectoredRun {
            offset: i * 8192,
            bufs: &one,
        })
        .collect();
    let fault = |off: u64, _: usize| (off == 8192).then_some(UringFault::Errno(libc::EIO));
    let mut errs = Vec::new();
    ring.write_vectored(&runs, &mut errs, Some(&fault)).unwrap();
    let codes: Vec<_> = errs
        .iter()
        .map(|e| e.as_ref().and_then(|e| e.raw_os_error()))
        .collect();
    assert_eq!(codes, [None, Some(libc::EIO), None]);
    let mut back = vec![0u8; 4096];
    file.read_exact_at(&mut back, 16384).unwrap();
    assert_eq!(back, page);
}

#[test]
fn errors_come_back_per_io_and_bad_pushes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro");
    std::fs::write(&path, b"x").unwrap();
    let ro = std::fs::File::open(&path).unwrap();
    let Ok(mut ring) = SlotRing::new(&ro, RingOptions::new(2), bufs(2, 4096)) else {
        return;
    };
    assert!(ring.push(5, RingOp::Write, 0, 0, 1).is_err());
    assert!(ring.push(0, RingOp::Write, 0, 4000, 200).is_err());
    ring.push(0, RingOp::Write, 0, 0, 4096).unwrap();
    let mut done = Vec::new();
    ring.wait(1, &mut done).unwrap();
    assert_eq!(
        done[0].result.as_ref().unwrap_err().raw_os_error(),
        Some(libc::EBADF)
    );
    assert!(ring.buf(0).is_some(), "slot is free again after its CQE");
    assert!(SlotRing::new(&ro, RingOptions::new(0), Vec::new()).is_err());
    assert!(SlotRing::new(&ro, RingOptions::new(MAX_QUEUE_DEPTH + 1), Vec::new()).is_err());
}
