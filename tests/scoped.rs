//! Scoped commits and commit tickets: a writer's commit makes exactly its
//! own pages durable, with no leader; a ticket resolves when they are, in
//! order, and carries the failure that kept them from it.
//!
//! On the crash-simulating backend (`CrashBackend`): its durable image is
//! what a power cut would keep of what reached it before the last
//! successful `fdatasync`.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::task::{Context, Poll, Wake, Waker};

use common::{page, tag_of};
use pagewriter::testing::{CrashBackend, FaultyBackend};
use pagewriter::{CommitTicket, Config, Error, MemoryBackend, PagedCachedFile, StorageBackend};

const PS: usize = 4096;

fn crash_file(config: Config) -> (Arc<CrashBackend>, PagedCachedFile) {
    let be = Arc::new(CrashBackend::new());
    let f = PagedCachedFile::new(Arc::clone(&be), config).unwrap();
    (be, f)
}

fn image_page(img: &[u8], p: u64) -> Option<(u64, u64)> {
    let at = p as usize * PS;
    img.get(at..at + PS).map(tag_of)
}

/// Eight writers, each committing its own pages and rewriting a shared
/// page: when a commit returns Ok its own pages are durable with the bytes
/// it wrote (the shared one with its version or a later one).
#[test]
fn a_writer_commit_makes_its_own_pages_durable() {
    let (be, f) = crash_file(Config::default());
    let shared_version = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (f, be, shared_version) = (&f, &be, &shared_version);
            s.spawn(move || {
                let mut w = f.writer();
                for i in 0..20u64 {
                    let own = 100 + t * 20 + i;
                    w.write_page(own * PS as u64, &page(PS, own, 1)).unwrap();
                    let v = shared_version.fetch_add(1, Ordering::SeqCst) + 1;
                    // The shared page's versions race: only "this one or a
                    // later one" is promised, which the tag's version shows.
                    w.write_page(0, &page(PS, 0, v)).unwrap();
                    w.commit().unwrap();
                    let img = be.durable_image();
                    assert_eq!(image_page(&img, own), Some((own, 1)), "own page {own}");
                    let shared = image_page(&img, 0).expect("shared page durable");
                    assert!(shared.0 == 0 && shared.1 >= 1, "shared page {shared:?}");
                }
            });
        }
    });
    f.close().unwrap();
}

/// Pages `0..n` written at version 0 and synced: commits of pages inside
/// them grow nothing.
fn written(f: &PagedCachedFile, n: u64) {
    for p in 0..n {
        f.write_page(p * PS as u64, &page(PS, p, 0)).unwrap();
    }
    f.sync().unwrap();
}

/// One writer alone: one write call and one fdatasync per commit, whether
/// its pages are inside the file or grow it, and a commit with nothing
/// written since the last one issues nothing.
#[test]
fn a_lone_writer_commits_with_one_write_and_one_fdatasync() {
    let (_be, f) = crash_file(Config::default());
    written(&f, 40);
    let mut w = f.writer();
    let mut commits = |version: u64, first: u64| {
        let before = f.stats();
        for i in 0..10u64 {
            for p in 0..4u64 {
                let p = first + 4 * i + p;
                w.write_page(p * PS as u64, &page(PS, p, version)).unwrap();
            }
            w.commit().unwrap();
        }
        let after = f.stats();
        assert_eq!(after.write_calls - before.write_calls, 10, "{after:?}");
        assert_eq!(after.syncs - before.syncs, 10, "{after:?}");
    };
    commits(1, 0);
    commits(1, 40);
    let after = f.stats();
    w.commit().unwrap();
    assert_eq!(f.stats().syncs, after.syncs, "an empty commit synced");
    f.close().unwrap();
}

/// A writer's commit promises nothing about another writer's pages, and
/// does not write them.
#[test]
fn a_writer_commit_leaves_other_writers_pages_alone() {
    let (be, f) = crash_file(Config::default());
    written(&f, 2);
    let mut a = f.writer();
    let mut b = f.writer();
    a.write_page(0, &page(PS, 0, 1)).unwrap();
    b.write_page(PS as u64, &page(PS, 1, 1)).unwrap();
    a.commit().unwrap();
    let img = be.durable_image();
    assert_eq!(image_page(&img, 0), Some((0, 1)));
    assert_eq!(
        image_page(&img, 1),
        Some((1, 0)),
        "b's page went out with a's commit"
    );
    // The file's own reads see b's page all the same.
    assert_eq!(tag_of(&f.read(PS as u64, PS).unwrap()), (1, 1));
    b.commit().unwrap();
    assert_eq!(image_page(&be.durable_image(), 1), Some((1, 1)));
    f.close().unwrap();
}

/// A commit whose pages reach past the file's length on disk grows the
/// file: the length its pages need is durable with them, another writer's
/// page is not written. A page written in part at the end counts by the
/// logical length it reaches.
#[test]
fn a_commit_that_grows_the_file_makes_its_length_durable() {
    let (be, f) = crash_file(Config::default());
    written(&f, 2);
    let mut a = f.writer();
    let mut b = f.writer();
    a.write_page(0, &page(PS, 0, 1)).unwrap();
    b.write_page(3 * PS as u64, &page(PS, 3, 1)).unwrap();
    b.commit().unwrap();
    let img = be.durable_image();
    assert_eq!(img.len(), 4 * PS, "the length b's page needs");
    assert_eq!(image_page(&img, 3), Some((3, 1)));
    assert_eq!(
        image_page(&img, 0),
        Some((0, 0)),
        "a's page went out with b's commit"
    );
    // Five bytes past the end: the last page is written in part.
    a.write_all_at(4 * PS as u64, b"tail!").unwrap();
    a.commit().unwrap();
    assert_eq!(image_page(&be.durable_image(), 0), Some((0, 1)));
    let img = be.durable_image();
    assert_eq!(img.len(), 4 * PS + 5);
    assert_eq!(&img[4 * PS..], b"tail!");
    f.close().unwrap();
}

/// A page another flush took before the writer's commit (backpressure,
/// `flush`) is waited for, not lost: the commit still covers it.
#[test]
fn a_commit_covers_its_pages_another_flush_took() {
    let (be, f) = crash_file(Config::default());
    let mut w = f.writer();
    w.write_page(0, &page(PS, 0, 1)).unwrap();
    f.flush().unwrap();
    w.write_all_at(PS as u64 + 10, b"hello").unwrap();
    {
        let mut g = w.write(2 * PS as u64, PS).unwrap();
        g.copy_from_slice(&page(PS, 2, 1));
    }
    w.commit().unwrap();
    let img = be.durable_image();
    assert_eq!(image_page(&img, 0), Some((0, 1)));
    assert_eq!(&img[PS + 10..PS + 15], b"hello");
    assert_eq!(image_page(&img, 2), Some((2, 1)));
    f.close().unwrap();
}

/// `Writer::overwrite` hands out a zeroed page (not the bytes on disk), and
/// the page joins the writer's commit when the guard is dropped.
#[test]
fn an_overwrite_guard_is_zeroed_and_joins_the_commit() {
    let (be, f) = crash_file(Config::default());
    let mut w = f.writer();
    w.write_page(3 * PS as u64, &page(PS, 3, 1)).unwrap();
    w.commit().unwrap();
    {
        let mut g = w.overwrite(3 * PS as u64, PS).unwrap();
        assert!(
            g.iter().all(|&b| b == 0),
            "an overwrite guard holds old bytes"
        );
        g.copy_from_slice(&page(PS, 3, 2));
    }
    let mut other = f.writer();
    other.write_page(4 * PS as u64, &page(PS, 4, 1)).unwrap();
    w.commit().unwrap();
    let img = be.durable_image();
    assert_eq!(image_page(&img, 3), Some((3, 2)));
    assert!(
        image_page(&img, 4).is_none_or(|(p, _)| p != 4),
        "another writer's page went out with this commit"
    );
    other.commit().unwrap();
    f.close().unwrap();
}

/// A waker that counts its wakes, for polling tickets by hand.
struct Count(AtomicU64);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Polls `t` until it is ready (the committer thread, or a close,
/// resolves it); fails after 60 s rather than hang.
fn block_on(mut t: CommitTicket) -> (pagewriter::Result<()>, u64) {
    let count = Arc::new(Count(AtomicU64::new(0)));
    let waker = Waker::from(Arc::clone(&count));
    let mut cx = Context::from_waker(&waker);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Poll::Ready(r) = std::pin::Pin::new(&mut t).poll(&mut cx) {
            return (r, count.0.load(Ordering::SeqCst));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a ticket never resolved"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Tickets: a writer keeps several commits in flight; each ticket
/// resolves once its pages are durable (by the syncer, by `wait`, or
/// polled as a future), in order, and dropping one cancels nothing.
#[test]
fn tickets_resolve_in_order_once_their_pages_are_durable() {
    let (be, f) = crash_file(Config::default());
    let mut w = f.writer();
    let mut tickets = Vec::new();
    for i in 0..8u64 {
        w.write_page(i * PS as u64, &page(PS, i, 1)).unwrap();
        tickets.push((i, w.commit_async().unwrap()));
    }
    // Dropped without a look: its commit goes on.
    drop(tickets.remove(3));
    let mut durable_before: Option<u64> = None;
    for (i, t) in tickets {
        let (r, _) = if i % 2 == 0 {
            (t.wait(), 0)
        } else {
            block_on(t)
        };
        r.unwrap();
        assert_eq!(image_page(&be.durable_image(), i), Some((i, 1)), "page {i}");
        assert!(durable_before.is_none_or(|d| d < i));
        durable_before = Some(i);
    }
    f.close().unwrap();
    assert_eq!(
        image_page(&be.durable_image(), 3),
        Some((3, 1)),
        "dropped ticket's page"
    );
}

/// `sync_async` promises what `sync` does: every page any thread wrote
/// before it.
#[test]
fn sync_async_covers_every_thread_s_pages() {
    let (be, f) = crash_file(Config::default());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let f = &f;
            s.spawn(move || f.write_page(t * PS as u64, &page(PS, t, 1)).unwrap());
        }
    });
    let t = f.sync_async().unwrap();
    t.wait().unwrap();
    let img = be.durable_image();
    for p in 0..4 {
        assert_eq!(image_page(&img, p), Some((p, 1)));
    }
    f.close().unwrap();
}

/// A failed fdatasync fails the tickets it covered with its error and
/// every later one with `Poisoned`; none resolves Ok past it; earlier
/// tickets stay Ok. The file is poisoned.
#[test]
fn a_failed_fdatasync_fails_exactly_the_tickets_it_covers() {
    let (be, f) = crash_file(Config::default());
    let mut w = f.writer();
    w.write_page(0, &page(PS, 0, 1)).unwrap();
    let first = w.commit_async().unwrap();
    first.wait().unwrap();
    be.schedule_syncs([true]);
    w.write_page(PS as u64, &page(PS, 1, 1)).unwrap();
    let failed = w.commit_async().unwrap();
    match failed.wait() {
        Err(Error::Io {
            op: "fdatasync", ..
        }) => {}
        other => panic!("the ticket the failed fdatasync covered: {other:?}"),
    }
    assert!(f.is_poisoned());
    assert!(matches!(
        w.write_page(2 * PS as u64, &page(PS, 2, 1)),
        Err(Error::Poisoned)
    ));
    assert!(matches!(w.commit_async(), Err(Error::Poisoned)));
    assert!(matches!(f.sync_async(), Err(Error::Poisoned)));
    assert!(matches!(w.commit(), Err(Error::Poisoned)));
}

/// A ticket waited on after its file was closed resolves with the close's
/// sync (Ok); one whose file was dropped without close before its pages
/// were synced resolves `Closed`, never hangs; a writer of a closed file
/// gets `Closed`.
#[test]
fn tickets_after_close_and_drop_resolve_and_writers_get_closed() {
    let (be, f) = crash_file(Config::default());
    let mut w = f.writer();
    w.write_page(0, &page(PS, 0, 1)).unwrap();
    let t = w.commit_async().unwrap();
    drop(w);
    f.close().unwrap();
    block_on(t).0.unwrap();
    assert_eq!(image_page(&be.durable_image(), 0), Some((0, 1)));
    let mut w = f.writer();
    assert!(matches!(
        w.write_page(0, &page(PS, 0, 2)),
        Err(Error::Closed)
    ));
    assert!(matches!(w.commit(), Err(Error::Closed)));
    assert!(matches!(w.commit_async(), Err(Error::Closed)));
    drop(w);

    // Dropped without close, its fdatasync failing: the ticket resolves
    // (with the failure) and never hangs.
    let (be, f) = crash_file(Config::default());
    be.schedule_syncs(std::iter::repeat_n(true, 100));
    let mut w = f.writer();
    w.write_page(0, &page(PS, 0, 1)).unwrap();
    let t = w.commit_async().unwrap();
    drop(w);
    drop(f);
    let (r, _) = block_on(t);
    assert!(r.is_err(), "{r:?}");
}

/// A backend that records which threads wrote and synced.
#[derive(Debug, Default)]
struct Threads {
    inner: MemoryBackend,
    names: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Threads {
    fn note(&self) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        self.names.lock().unwrap().insert(name);
    }
}

impl StorageBackend for Threads {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact_at(offset, buf)
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.note();
        self.inner.write_all_at(offset, buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.note();
        self.inner.sync_data()
    }
}

/// An asynchronous commit does no I/O on the thread that asks for it: the
/// committer thread writes and syncs (the pages of many commits in one
/// pass), and the caller goes on writing.
#[test]
fn an_asynchronous_commit_writes_and_syncs_on_the_committer_thread() {
    let be = Arc::new(Threads::default());
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    let mut w = f.writer();
    let mut tickets = Vec::new();
    for p in 0..32u64 {
        w.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
        tickets.push(w.commit_async().unwrap());
    }
    tickets.push(f.sync_async().unwrap());
    for t in tickets {
        t.wait().unwrap();
    }
    let names = be.names.lock().unwrap().clone();
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["pagewriter-commit"],
        "I/O on another thread than the committer"
    );
    for p in 0..32u64 {
        assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, 1));
    }
    f.close().unwrap();
}

/// A write that fails in the committer's pass fails the tickets that pass
/// covered with `PagesFailed`, poisons nothing, and leaves the pages dirty:
/// the writer's next ticket promises only its new pages, and the next
/// `sync` writes the failed one.
#[test]
fn a_failed_write_fails_the_tickets_of_its_pass_and_sync_writes_the_pages_later() {
    let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    let mut w = f.writer();
    w.write_page(0, &page(PS, 0, 1)).unwrap();
    be.schedule_writes([pagewriter::testing::WriteFault::Errno(libc::EIO)]);
    match w.commit_async().unwrap().wait() {
        Err(Error::PagesFailed { .. }) => {}
        other => panic!("a ticket whose pass failed to write: {other:?}"),
    }
    assert!(!f.is_poisoned());
    w.write_page(PS as u64, &page(PS, 1, 1)).unwrap();
    w.commit_async().unwrap().wait().unwrap();
    let img = be.inner().durable_image();
    assert_eq!(image_page(&img, 1), Some((1, 1)));
    assert_ne!(
        image_page(&img, 0),
        Some((0, 1)),
        "a later pass carried the failed page"
    );
    f.sync().unwrap();
    let img = be.inner().durable_image();
    assert_eq!(
        image_page(&img, 0),
        Some((0, 1)),
        "sync wrote the failed page"
    );
    f.close().unwrap();
}

/// A writer's commit after another writer's commit failed to write
/// neither writes nor waits for that writer's pages: it succeeds with its
/// own, and the failed writer keeps its pages for its next commit.
#[test]
fn a_writers_commit_never_carries_another_writers_failed_pages() {
    let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    let (mut a, mut b) = (f.writer(), f.writer());
    b.write_page(0, &page(PS, 0, 1)).unwrap();
    be.schedule_writes([pagewriter::testing::WriteFault::Errno(libc::ENOSPC)]);
    assert!(matches!(b.commit(), Err(Error::PagesFailed { .. })));
    a.write_page(PS as u64, &page(PS, 1, 1)).unwrap();
    let calls = be.write_calls();
    a.commit().unwrap();
    assert_eq!(
        be.write_calls() - calls,
        1,
        "a's commit wrote more than its page"
    );
    let img = be.inner().durable_image();
    assert_eq!(image_page(&img, 1), Some((1, 1)));
    assert_ne!(
        image_page(&img, 0),
        Some((0, 1)),
        "b's failed page went out with a's commit"
    );
    b.commit().unwrap();
    assert_eq!(image_page(&be.inner().durable_image(), 0), Some((0, 1)));
}

/// Writes through a writer obey every check the file's own writes do,
/// with the same typed errors, and a refused write buffers nothing.
#[test]
fn a_writer_s_writes_obey_the_file_s_checks() {
    let f = PagedCachedFile::new(MemoryBackend::new(), Config::default()).unwrap();
    let mut w = f.writer();
    assert!(matches!(
        w.write_page(100, &[0u8; PS]),
        Err(Error::Unaligned { .. })
    ));
    assert!(matches!(w.write_page(0, &[]), Err(Error::ZeroLength)));
    assert!(matches!(
        w.write_all_at(u64::MAX - 2, b"abcd"),
        Err(Error::Overflow { .. })
    ));
    assert!(matches!(w.write(100, PS), Err(Error::Unaligned { .. })));
    assert_eq!(f.stats().pages_dirtied, 0);
    w.commit().unwrap();
    assert_eq!(f.stats().syncs, 0, "a commit with nothing written synced");

    // Read-only: refused as the file refuses.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro");
    PagedCachedFile::open(&path, Config::default())
        .unwrap()
        .close()
        .unwrap();
    let ro = PagedCachedFile::open_with(
        &path,
        &pagewriter::OpenOptions::new().read_only(true),
        Config::default(),
    )
    .unwrap();
    let mut w = ro.writer();
    assert!(matches!(w.write_page(0, &[0u8; PS]), Err(Error::ReadOnly)));
    w.commit().unwrap();
}

/// Writers on many threads commit while another thread's fdatasyncs
/// fail: every commit that returned Ok has its pages in the durable
/// image, and none returns Ok after the failure.
#[test]
fn no_writer_is_told_durable_past_a_failed_fdatasync() {
    let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    let failed = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (f, be, failed) = (&f, &be, &failed);
            s.spawn(move || {
                let mut w = f.writer();
                for i in 0..30u64 {
                    let p = t * 100 + i;
                    if w.write_page(p * PS as u64, &page(PS, p, 1)).is_err() {
                        break;
                    }
                    if t == 0 && i == 10 {
                        be.schedule_syncs([Some(libc::EIO)]);
                    }
                    match w.commit() {
                        Ok(()) => {
                            let img = be.inner().durable_image();
                            assert_eq!(image_page(&img, p), Some((p, 1)), "page {p}");
                        }
                        Err(_) => {
                            failed.store(true, Ordering::SeqCst);
                            break;
                        }
                    }
                }
            });
        }
    });
    assert!(failed.load(Ordering::SeqCst) && f.is_poisoned());
}

fn _assert_send_sync() {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    send::<pagewriter::Writer<'static>>();
    sync::<CommitTicket>();
    let _ = <CrashBackend as StorageBackend>::len;
}

/// A writer holding its file through an `Arc` outlives every borrow: it
/// moves to another thread with the file, commits there, and its commit
/// promises its own pages only (another writer's stay buffered).
#[test]
fn a_shared_writer_commits_its_own_pages_from_another_thread() {
    let be = Arc::new(CrashBackend::new());
    let f = Arc::new(PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap());
    let mut other = f.writer();
    other.write_page(0, &page(PS, 0, 9)).unwrap();
    let mut w = pagewriter::Writer::shared(Arc::clone(&f));
    std::thread::spawn(move || {
        w.write_all_at(PS as u64 + 3, b"mine").unwrap();
        w.commit().unwrap();
    })
    .join()
    .unwrap();
    let durable = be.durable_image();
    assert_eq!(&durable[PS + 3..PS + 7], b"mine");
    assert!(
        durable[..PS].iter().all(|&b| b == 0),
        "another writer's page was committed"
    );
    other.commit().unwrap();
    assert_eq!(&be.durable_image()[..PS], &page(PS, 0, 9)[..]);
}

// ---- write_and_commit ----

/// On a written file, `write_and_commit` of two contiguous pages is one
/// write call, and the pages are durable and read back.
#[test]
fn write_and_commit_makes_its_pages_durable_with_one_write() {
    let (be, f) = crash_file(Config::default());
    for p in 0..4u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync().unwrap();
    let (dirtied, calls) = (f.stats().pages_dirtied, f.stats().write_calls);
    let mut w = f.writer();
    let two = [page(PS, 1, 2), page(PS, 2, 2)].concat();
    w.write_and_commit(PS as u64, &two).unwrap();
    let s = f.stats();
    assert_eq!(s.pages_dirtied, dirtied + 2);
    assert_eq!(s.write_calls, calls + 1, "one write call");
    assert_eq!(s.buffered_bytes, 0);
    let img = be.durable_image();
    assert_eq!(image_page(&img, 1), Some((1, 2)));
    assert_eq!(image_page(&img, 2), Some((2, 2)));
    assert_eq!(tag_of(&f.read(2 * PS as u64, PS).unwrap()), (2, 2));
    f.close().unwrap();
}

/// `write_and_commit` commits the writer's other pages pending with its
/// own, keeps newest-wins over a version another call buffered, takes
/// part of a page, grows the file, and works with a grow-ahead window:
/// each commit is durable.
#[test]
fn write_and_commit_commits_with_the_writer_s_other_pages() {
    let (be, f) = crash_file(Config::default());
    for p in 0..4u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync().unwrap();
    let mut w = f.writer();
    // Pages of its own pending: one commit covers both.
    w.write_page(0, &page(PS, 0, 2)).unwrap();
    w.write_and_commit(PS as u64, &page(PS, 1, 2)).unwrap();
    // Another version buffered: it must not land after this one.
    f.write_page(2 * PS as u64, &page(PS, 2, 2)).unwrap();
    w.write_and_commit(2 * PS as u64, &page(PS, 2, 3)).unwrap();
    // Part of a page.
    w.write_and_commit(3 * PS as u64 + 8, b"partial").unwrap();
    // Past the end of the file.
    w.write_and_commit(6 * PS as u64, &page(PS, 6, 1)).unwrap();
    let img = be.durable_image();
    for (p, v) in [(0, 2), (1, 2), (2, 3), (6, 1)] {
        assert_eq!(image_page(&img, p), Some((p, v)), "page {p}");
    }
    assert_eq!(&img[3 * PS + 8..3 * PS + 15], b"partial");
    f.sync().unwrap();
    assert_eq!(
        tag_of(&f.read(2 * PS as u64, PS).unwrap()),
        (2, 3),
        "newest wins"
    );
    f.close().unwrap();

    let window = pagewriter::GrowAhead::Window {
        bytes: 16 * PS as u64,
    };
    let (be, f) = crash_file(Config::default().grow_ahead(window));
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    f.sync().unwrap();
    f.writer().write_and_commit(0, &page(PS, 0, 2)).unwrap();
    assert_eq!(image_page(&be.durable_image(), 0), Some((0, 2)));
    f.close().unwrap();
}

/// A `write_and_commit` whose write fails leaves the bytes in the write
/// buffer: reads see them, the error names the pages, the file is not
/// poisoned, and the writer's next commit makes them durable.
#[test]
fn a_failed_write_and_commit_keeps_its_pages_for_the_next_commit() {
    let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    f.write_page(0, &page(PS, 0, 1)).unwrap();
    f.sync().unwrap();
    let mut w = f.writer();
    be.schedule_writes([pagewriter::testing::WriteFault::Errno(libc::EIO)]);
    match w.write_and_commit(0, &page(PS, 0, 2)) {
        Err(Error::PagesFailed { failed, op, .. }) => {
            assert_eq!(failed, vec![0..PS as u64]);
            assert_eq!(op, "pwritev");
        }
        other => panic!("a failed write_and_commit: {other:?}"),
    }
    assert!(!f.is_poisoned());
    assert_eq!(
        tag_of(&f.read(0, PS).unwrap()),
        (0, 2),
        "reads see the bytes"
    );
    assert_eq!(f.stats().buffered_bytes, PS as u64);
    w.commit().unwrap();
    assert_eq!(image_page(&be.inner().durable_image(), 0), Some((0, 2)));
    f.close().unwrap();
}

/// `write_and_commit` refuses what `write_all_at` refuses, with the same
/// errors, on a closed or read-only file too.
#[test]
fn write_and_commit_refuses_what_writes_refuse() {
    let f = PagedCachedFile::new(MemoryBackend::new(), Config::default()).unwrap();
    let mut w = f.writer();
    assert!(matches!(
        w.write_and_commit(u64::MAX - 2, b"abcd"),
        Err(Error::Overflow { .. })
    ));
    let g = f.write(0, PS).unwrap();
    assert!(matches!(
        w.write_and_commit(0, &page(PS, 0, 1)),
        Err(Error::Busy { .. })
    ));
    drop(g);
    drop(w);
    f.close().unwrap();
    assert!(matches!(
        f.writer().write_and_commit(0, &page(PS, 0, 1)),
        Err(Error::Closed)
    ));
}

/// On a real file with `O_DIRECT`, a page-aligned buffer and one at an odd
/// address both commit and read back after a reopen. Skipped, with the
/// reason printed, where the file system refuses `O_DIRECT`.
#[test]
fn write_and_commit_on_a_real_file_with_o_direct() {
    let dir = tempfile::tempdir().unwrap();
    if !pagewriter::testing::direct_available(dir.path()) {
        eprintln!("skipped: O_DIRECT refused here");
        return;
    }
    let path = dir.path().join("through");
    let config = Config::default().direct(pagewriter::DirectIo::On);
    let f = PagedCachedFile::open(&path, config.clone()).unwrap();
    for p in 0..4u64 {
        f.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    f.sync().unwrap();
    let mut w = f.writer();
    let mut aligned = pagewriter::buffer::AlignedBuf::zeroed(PS, 4096).unwrap();
    aligned.copy_from_slice(&page(PS, 1, 2));
    w.write_and_commit(PS as u64, &aligned).unwrap();
    let mut odd = vec![0u8; PS + 1];
    odd[1..].copy_from_slice(&page(PS, 2, 2));
    w.write_and_commit(2 * PS as u64, &odd[1..]).unwrap();
    drop(w);
    f.close().unwrap();
    let f = PagedCachedFile::open(&path, config).unwrap();
    for (p, v) in [(0, 1), (1, 2), (2, 2), (3, 1)] {
        assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, v));
    }
    f.close().unwrap();
}

// ---- an fdatasync in flight ----

/// A crash-simulating backend with one sync lane whose next `fdatasync`,
/// once armed, tells when it started and holds until released.
#[derive(Debug)]
struct HoldsASync {
    inner: CrashBackend,
    held: std::sync::Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl HoldsASync {
    fn new() -> Self {
        Self {
            inner: CrashBackend::with_sync_lanes(1),
            held: std::sync::Mutex::new(None),
        }
    }

    /// Waits at the armed hold, if any, and disarms it.
    fn wait_if_held(&self) {
        let hold = self.held.lock().unwrap().take();
        if let Some((started, release)) = hold {
            started.send(()).unwrap();
            release.recv().unwrap();
        }
    }

    /// Arms the hold: the receiver hears when the next `fdatasync`
    /// started; it returns once the sender sends.
    fn hold_next(&self) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        *self.held.lock().unwrap() = Some((started_tx, release_rx));
        (started_rx, release_tx)
    }
}

impl StorageBackend for HoldsASync {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact_at(offset, buf)
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_all_at(offset, buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.sync_data_on(0)
    }
    fn sync_lanes(&self) -> usize {
        self.inner.sync_lanes()
    }
    fn sync_data_on(&self, lane: usize) -> std::io::Result<()> {
        self.wait_if_held();
        self.inner.sync_data_on(lane)
    }
}

/// Writer A's `fdatasync` is held; writer B writes after it began, so it
/// does not cover B: B's commit waits for it to end and then issues its
/// own. Both commits return with their pages durable.
#[test]
fn a_commit_the_fdatasync_in_flight_does_not_cover_issues_the_next() {
    let be = Arc::new(HoldsASync::new());
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    written(&f, 2);
    let (started, release) = be.hold_next();
    std::thread::scope(|s| {
        let a = s.spawn(|| {
            let mut w = f.writer();
            w.write_page(0, &page(PS, 0, 1)).unwrap();
            w.commit()
        });
        started.recv().unwrap();
        let b = s.spawn(|| f.writer().write_and_commit(PS as u64, &page(PS, 1, 1)));
        release.send(()).unwrap();
        a.join().unwrap().unwrap();
        b.join().unwrap().unwrap();
    });
    let img = be.inner.durable_image();
    assert_eq!(image_page(&img, 0), Some((0, 1)));
    assert_eq!(image_page(&img, 1), Some((1, 1)));
    f.close().unwrap();
}

// ---- a writer's commit of its buffered pages ----

/// A writer's buffered pages inside written space go out with one write
/// call per run (pages 1-2 and 5: two) and one `fdatasync`; reads see them
/// before and after (with the read cache on, from the cache after), and
/// the write buffer is empty once the commit returns.
#[test]
fn a_commit_writes_its_pages_one_call_per_run_and_one_fdatasync() {
    let (be, f) = crash_file(Config::default().read_cache_bytes(1 << 20));
    written(&f, 8);
    let mut w = f.writer();
    for p in [5u64, 1, 2] {
        w.write_page(p * PS as u64, &page(PS, p, 1)).unwrap();
    }
    let before = f.stats();
    w.commit().unwrap();
    let after = f.stats();
    assert_eq!(after.write_calls - before.write_calls, 2, "one per run");
    assert_eq!(after.syncs - before.syncs, 1);
    assert_eq!(after.buffered_bytes, 0, "the pages left the buffer");
    let img = be.durable_image();
    for (p, v) in [(0, 0), (1, 1), (2, 1), (3, 0), (5, 1)] {
        assert_eq!(image_page(&img, p), Some((p, v)), "page {p}");
        assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, v));
    }
    assert!(
        f.stats().cache_hits > after.cache_hits,
        "released into the cache"
    );
    f.close().unwrap();
}

/// A writer's commit keeps its promise with a grow-ahead window or
/// torn-page protection configured, and with a page of it under another
/// thread's guard.
#[test]
fn a_commit_is_durable_beside_grow_ahead_torn_page_protection_and_a_guard() {
    let window = pagewriter::GrowAhead::Window {
        bytes: 16 * PS as u64,
    };
    let (be, f) = crash_file(Config::default().grow_ahead(window));
    written(&f, 4);
    let mut w = f.writer();
    w.write_page(PS as u64, &page(PS, 1, 1)).unwrap();
    w.commit().unwrap();
    assert_eq!(image_page(&be.durable_image(), 1), Some((1, 1)));
    drop(w);
    f.close().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("doublewrite");
    let config = Config::default().torn_writes(pagewriter::TornWrites::DoubleWrite);
    let f = PagedCachedFile::open(&path, config.clone()).unwrap();
    written(&f, 4);
    let mut w = f.writer();
    w.write_page(PS as u64, &page(PS, 1, 1)).unwrap();
    w.commit().unwrap();
    drop(w);
    f.close().unwrap();
    let f = PagedCachedFile::open(&path, config).unwrap();
    assert_eq!(tag_of(&f.read(PS as u64, PS).unwrap()), (1, 1));
    f.close().unwrap();

    let (be, f) = crash_file(Config::default());
    written(&f, 4);
    let mut w = f.writer();
    w.write_page(2 * PS as u64, &page(PS, 2, 1)).unwrap();
    let (latched_tx, latched_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let f = &f;
        s.spawn(move || {
            let g = f.write(2 * PS as u64, PS).unwrap();
            latched_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(g);
        });
        latched_rx.recv().unwrap();
        w.commit().unwrap();
        assert_eq!(image_page(&be.durable_image(), 2), Some((2, 1)));
        release_tx.send(()).unwrap();
    });
    f.close().unwrap();
}

/// A failed write of a writer's commit (EIO) puts the pages back: reads
/// see them, the error names them, the file is not poisoned, the other
/// run is durable, and the writer's next commit makes them durable.
#[test]
fn a_failed_write_of_a_commit_keeps_its_pages_for_the_next_commit() {
    let be = Arc::new(FaultyBackend::new(CrashBackend::new()));
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    written(&f, 4);
    let mut w = f.writer();
    w.write_page(0, &page(PS, 0, 1)).unwrap();
    w.write_page(2 * PS as u64, &page(PS, 2, 1)).unwrap();
    be.schedule_writes([
        pagewriter::testing::WriteFault::Errno(libc::EIO),
        pagewriter::testing::WriteFault::Pass,
    ]);
    match w.commit() {
        Err(Error::PagesFailed { failed, .. }) => assert_eq!(failed, vec![0..PS as u64]),
        other => panic!("a failed write from the buffer: {other:?}"),
    }
    assert!(!f.is_poisoned());
    assert_eq!(f.stats().buffered_bytes, PS as u64, "page 0 is back");
    let img = be.inner().durable_image();
    assert_eq!(image_page(&img, 0), Some((0, 0)));
    assert_eq!(
        image_page(&img, 2),
        Some((2, 1)),
        "the other run is durable"
    );
    assert_eq!(
        tag_of(&f.read(0, PS).unwrap()),
        (0, 1),
        "reads see the bytes"
    );
    w.commit().unwrap();
    assert_eq!(image_page(&be.inner().durable_image(), 0), Some((0, 1)));
    f.close().unwrap();
}

/// On a real file with `O_DIRECT`: eight writers commit their own pages
/// (a run of three and a page apart, rewriting one page all of them
/// share), while another thread reads and calls `sync()`. After close and
/// reopen every page holds its last version.
#[test]
fn commits_of_eight_writers_on_a_real_file_with_o_direct() {
    let dir = tempfile::tempdir().unwrap();
    let direct = pagewriter::testing::direct_available(dir.path());
    if !direct {
        eprintln!("O_DIRECT refused here: buffered I/O instead");
    }
    let path = dir.path().join("claimed");
    let config = Config::default().direct(match direct {
        true => pagewriter::DirectIo::On,
        false => pagewriter::DirectIo::Off,
    });
    let f = PagedCachedFile::open(&path, config.clone()).unwrap();
    written(&f, 8 * 8 + 1);
    {
        let mut w = f.writer();
        w.write_page(PS as u64, &page(PS, 1, 1)).unwrap();
        w.commit().unwrap();
    }
    const ROUNDS: u64 = 30;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (f, stop) = (&f, &stop);
        for t in 0..8u64 {
            s.spawn(move || {
                let mut w = f.writer();
                let first = 1 + 8 * t;
                for v in 2..2 + ROUNDS {
                    for p in [first, first + 1, first + 2, first + 5] {
                        w.write_page(p * PS as u64, &page(PS, p, v)).unwrap();
                    }
                    w.write_page(0, &page(PS, 0, v)).unwrap();
                    w.commit().unwrap();
                }
            });
        }
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                f.sync().unwrap();
                let (p, v) = tag_of(&f.read(PS as u64, PS).unwrap());
                assert!(p == 1 && v >= 1, "page 1 read as {p}/{v}");
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(1));
        // The scope joins the writers first only if they finish: stop the
        // syncing thread once they have.
        s.spawn(move || {
            while f.stats().commits < 1 + 8 * ROUNDS {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    f.close().unwrap();
    let f = PagedCachedFile::open(&path, config).unwrap();
    let last = 1 + ROUNDS;
    for t in 0..8u64 {
        let first = 1 + 8 * t;
        for p in [first, first + 1, first + 2, first + 5] {
            assert_eq!(
                tag_of(&f.read(p * PS as u64, PS).unwrap()),
                (p, last),
                "page {p}"
            );
        }
    }
    assert_eq!(tag_of(&f.read(0, PS).unwrap()), (0, last));
    f.close().unwrap();
}

// ---- large writes through a writer ----

/// Pages of a large write: 16 pages (64 KiB), from `first`, version `v`.
fn large(first: u64, v: u64) -> Vec<u8> {
    (first..first + 16).flat_map(|p| page(PS, p, v)).collect()
}

/// A writer's large writes (64 KiB of whole pages, by `write_all_at` or
/// `write_page`) are covered by its commit with its small ones, by a
/// `sync()` before the writer commits, and by a later `write_and_commit`.
#[test]
fn large_writes_are_covered_by_every_commit_after_them() {
    let (be, f) = crash_file(Config::default());
    f.write_page(0, &vec![0u8; 64 * PS]).unwrap();
    f.sync().unwrap();
    let mut w = f.writer();
    w.write_all_at(16 * PS as u64, &large(16, 1)).unwrap();
    w.write_page(0, &page(PS, 0, 1)).unwrap();
    w.commit().unwrap();
    let img = be.durable_image();
    assert_eq!(image_page(&img, 0), Some((0, 1)));
    assert_eq!(image_page(&img, 31), Some((31, 1)));

    w.write_page(32 * PS as u64, &large(32, 1)).unwrap();
    f.sync().unwrap();
    assert_eq!(image_page(&be.durable_image(), 40), Some((40, 1)), "sync()");

    w.write_page(48 * PS as u64, &large(48, 1)).unwrap();
    w.write_and_commit(PS as u64, &page(PS, 1, 1)).unwrap();
    let img = be.durable_image();
    assert_eq!(image_page(&img, 1), Some((1, 1)));
    assert_eq!(image_page(&img, 63), Some((63, 1)), "write_and_commit");
    f.close().unwrap();
}

/// Eight writers on a real file (`O_DIRECT` where the file system takes
/// it), each writing 64 KiB runs of its own from an aligned buffer and
/// committing, beside a thread calling `sync()`: every page reads back
/// after a reopen with its last committed version.
#[test]
fn large_writes_of_eight_writers_on_a_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large");
    let direct = if pagewriter::testing::direct_available(dir.path()) {
        pagewriter::DirectIo::On
    } else {
        eprintln!("O_DIRECT refused here: buffered I/O");
        pagewriter::DirectIo::Off
    };
    let config = Config::default().direct(direct);
    let f = PagedCachedFile::open(&path, config.clone()).unwrap();
    f.write_page(0, &vec![0u8; 8 * 64 * PS]).unwrap();
    f.sync().unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                f.sync().unwrap();
            }
        });
        let writers: Vec<_> = (0..8u64)
            .map(|t| {
                let f = &f;
                s.spawn(move || {
                    let mut w = f.writer();
                    let mut buf = pagewriter::buffer::AlignedBuf::zeroed(16 * PS, 4096).unwrap();
                    for i in 0..12u64 {
                        let first = t * 64 + (i % 4) * 16;
                        buf.copy_from_slice(&large(first, i + 1));
                        w.write_page(first * PS as u64, &buf).unwrap();
                        w.commit().unwrap();
                    }
                })
            })
            .collect();
        for h in writers {
            h.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    f.close().unwrap();
    let f = PagedCachedFile::open(&path, config).unwrap();
    for t in 0..8u64 {
        for i in 8..12u64 {
            let first = t * 64 + (i % 4) * 16;
            for p in [first, first + 15] {
                assert_eq!(tag_of(&f.read(p * PS as u64, PS).unwrap()), (p, i + 1));
            }
        }
    }
    f.close().unwrap();
}

/// A `close` whose commit fails leaves no ticket hanging: a ticket asked
/// while the committer waited on a failing `fdatasync` resolves (with an
/// error) by the time `close` returns, with the file still open.
#[test]
fn a_close_that_fails_resolves_the_tickets_no_pass_took() {
    let be = Arc::new(HoldsASync::new());
    let f = PagedCachedFile::new(Arc::clone(&be), Config::default()).unwrap();
    written(&f, 2);
    let (started, release) = be.hold_next();
    be.inner.schedule_syncs([true]);
    let mut w = f.writer();
    w.write_page(0, &page(PS, 0, 1)).unwrap();
    let first = w.commit_async().unwrap();
    started.recv().unwrap();
    // The committer waits on the held fdatasync: no pass takes this one.
    w.write_page(PS as u64, &page(PS, 1, 1)).unwrap();
    let mut second = w.commit_async().unwrap();
    drop(w);
    std::thread::scope(|s| {
        let closing = s.spawn(|| f.close());
        // Let close stop the committer first (either order must pass).
        std::thread::sleep(std::time::Duration::from_millis(20));
        release.send(()).unwrap();
        assert!(
            closing.join().unwrap().is_err(),
            "close after a failed fdatasync"
        );
    });
    let waker = Waker::from(Arc::new(Count(AtomicU64::new(0))));
    let polled = std::pin::Pin::new(&mut second).poll(&mut Context::from_waker(&waker));
    assert!(
        matches!(polled, Poll::Ready(Err(_))),
        "the ticket no pass took resolved with close: {polled:?}"
    );
    assert!(matches!(
        first.wait(),
        Err(Error::Io {
            op: "fdatasync",
            ..
        })
    ));
    assert!(f.is_poisoned());
}
