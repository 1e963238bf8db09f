//! Helpers shared by the integration tests.
#![allow(dead_code)]

use pagewriter::FlushEngine;

/// Every flush engine: tests that take an engine run for each of these.
pub const ENGINES: [FlushEngine; 3] = [
    FlushEngine::PerPage,
    FlushEngine::Concat,
    FlushEngine::Vectored,
];

/// A page of `size` bytes whose contents encode (page number, version), so
/// a wrong or stale page is told apart from the right one.
pub fn page(size: usize, page_no: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let tag =
        page_no.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        let w = (tag ^ i as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    v[..8].copy_from_slice(&page_no.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    v
}

/// (page number, version) stored by [`page`].
pub fn tag_of(bytes: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(bytes[..8].try_into().unwrap()),
        u64::from_le_bytes(bytes[8..16].try_into().unwrap()),
    )
}

#[allow(unused_imports)]
pub use pagewriter::testing::{direct_available, uring_available};

/// Every engine that works on a real file: [`ENGINES`] plus io_uring where
/// a ring can be set up (said on stderr where not).
pub fn file_engines() -> Vec<FlushEngine> {
    let mut v = ENGINES.to_vec();
    if uring_available() {
        v.push(FlushEngine::IoUring { queue_depth: 8 });
    } else {
        eprintln!("io_uring unavailable here: its cases are skipped");
    }
    v
}

#[allow(unused_imports)]
pub use pagewriter::testing::ScratchFs;

/// A test of a file system made for it, as a libtest-mimic trial (the
/// harness of `failure_modes.rs` and `torn_writes.rs`): ignored where this
/// machine cannot make `kind` ([`FsKind::missing`](pagewriter::testing::FsKind::missing)
/// says why; the harness prints it), so `cargo test` reports it as ignored,
/// not as passed. With `PAGEWRITER_REQUIRE_FS` set it runs regardless, and
/// fails where the file system cannot be had.
pub fn fs_trial(
    name: String,
    kind: pagewriter::testing::FsKind,
    f: impl FnOnce() + Send + 'static,
) -> libtest_mimic::Trial {
    let ignored = kind.missing().is_some() && std::env::var_os("PAGEWRITER_REQUIRE_FS").is_none();
    trial(name, f).with_ignored_flag(ignored)
}

/// A plain test as a libtest-mimic trial (a panic fails it).
pub fn trial(name: impl Into<String>, f: impl FnOnce() + Send + 'static) -> libtest_mimic::Trial {
    libtest_mimic::Trial::test(name, move || {
        f();
        Ok(())
    })
}

/// Prints, once per kind, why the trials on file systems this machine
/// cannot make are ignored (libtest shows them as `ignored`; this says
/// why).
pub fn print_fs_reasons(kinds: &[pagewriter::testing::FsKind]) {
    if std::env::var_os("PAGEWRITER_REQUIRE_FS").is_some() {
        return;
    }
    for k in kinds {
        if let Some(why) = k.missing() {
            println!("ignored: the {} tests ({why})", k.name());
        }
    }
}

/// Fills `buf` from byte `offset` of a plain `File` (through a
/// [`FileBackend`](pagewriter::FileBackend) on a clone of its handle, so
/// the same call works on every platform). Panics on an error.
pub fn read_at(file: &std::fs::File, buf: &mut [u8], offset: u64) {
    use pagewriter::StorageBackend;
    pagewriter::FileBackend::from_file(file.try_clone().unwrap())
        .read_exact_at(offset, buf)
        .unwrap();
}

/// Writes all of `buf` at byte `offset` of a plain `File`, as
/// [`read_at`] reads. Panics on an error.
pub fn write_at(file: &std::fs::File, buf: &[u8], offset: u64) {
    use pagewriter::StorageBackend;
    pagewriter::FileBackend::from_file(file.try_clone().unwrap())
        .write_all_at(offset, buf)
        .unwrap();
}
