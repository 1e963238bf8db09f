//! A length inside a 4 KiB page on an `O_DIRECT` file (redb's small page
//! sizes, 512 bytes in its own tests, set lengths such as 70,144 bytes):
//! the adapter rounds it up to whole pages instead of failing with
//! `Unaligned`, keeps what was written below it, and reads zeros above.

use pagewriter_redb::PagewriterBackend;
use redb::StorageBackend;

#[test]
fn a_length_inside_a_page_is_rounded_up_under_o_direct() {
    // On the build directory's file system: /tmp may be a tmpfs, which
    // refuses O_DIRECT.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("small.redb");
    let backend = PagewriterBackend::open(&path).unwrap();
    if backend.file().io_mode().direct.is_none() {
        println!(
            "skipped: {} refuses O_DIRECT ({})",
            dir.path().display(),
            backend.file().io_mode()
        );
        return;
    }
    backend.write(0, &[7u8; 1536]).unwrap();
    backend.set_len(70_144).unwrap();
    assert_eq!(backend.len().unwrap(), 73_728);
    let mut head = [0u8; 2048];
    backend.read(0, &mut head).unwrap();
    assert!(head[..1536].iter().all(|&b| b == 7));
    assert!(head[1536..].iter().all(|&b| b == 0));
    backend.write(70_144 - 512, &[9u8; 512]).unwrap();
    backend.sync_data().unwrap();
    // Shrinking inside a page keeps the bytes below the cut.
    backend.set_len(70_144 - 512 + 100).unwrap();
    assert_eq!(backend.len().unwrap(), 69_632 + 4096);
    let mut tail = [0u8; 512];
    backend.read(70_144 - 512, &mut tail).unwrap();
    assert!(tail.iter().all(|&b| b == 9));
    backend.close().unwrap();
    drop(backend);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 73_728);
}
