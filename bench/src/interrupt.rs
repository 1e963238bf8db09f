//! A clean stop on Ctrl-C (SIGINT) or SIGTERM for the CLI: the scratch
//! files of the run are removed, a `write-file` target is cut back to the
//! bytes known good (so an interrupted file is told by its size), a line
//! says what happened, and the process exits with 130.
//!
//! The handler runs on its own thread (the `ctrlc` crate), so it only
//! touches what was registered here: paths and one counter, no locks the
//! interrupted code could hold for long.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Exit code of an interrupted run (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static PARTIAL: Mutex<Option<(PathBuf, Arc<AtomicU64>)>> = Mutex::new(None);

/// Installs the handler (once per process; a second call is a no-op).
pub fn install() {
    let _ = ctrlc::set_handler(on_signal);
}

/// Registers a scratch file (or directory, removed with what it holds) to
/// remove if the run is interrupted (removing one that is already gone is
/// harmless).
pub fn scratch(path: PathBuf) {
    SCRATCH.lock().push(path);
}

/// Takes back a [`scratch`] registration: the file is the run's result
/// now and stays, even if a later signal comes.
pub fn forget(path: &std::path::Path) {
    SCRATCH.lock().retain(|p| p != path);
}

/// Registers the file `write-file` is writing and the counter of its
/// bytes known good from the start: an interrupted run cuts it to them.
pub fn partial(path: PathBuf, good: Arc<AtomicU64>) {
    *PARTIAL.lock() = Some((path, good));
}

fn on_signal() {
    for p in SCRATCH.lock().drain(..) {
        if p.is_dir() {
            let _ = std::fs::remove_dir_all(p);
        } else {
            let _ = std::fs::remove_file(p);
        }
    }
    if let Some((path, good)) = PARTIAL.lock().take() {
        let n = good.load(Ordering::Acquire);
        let cut = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(n));
        match cut {
            Ok(()) => eprintln!(
                "interrupted: {} holds the first {n} bytes written, cut to them (incomplete)",
                path.display()
            ),
            Err(e) => eprintln!(
                "interrupted: could not cut {} to {n} bytes: {e}",
                path.display()
            ),
        }
    } else {
        eprintln!("interrupted: the files this run created are removed");
    }
    std::process::exit(i32::from(EXIT_INTERRUPTED));
}
