//! The engine API in one place: open a file with its lock, write and read
//! at any offset, resize, commit from several threads at once (group
//! commit), and read back what is in force and what it cost.
//!
//! `cargo run --release --example embed [DIR]` (default: a new temporary
//! directory, removed at the end). Every error is a typed
//! [`pagewriter::Error`], printed, with a non-zero exit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewriter::{Config, DirectIo, Error, FlushEngine, OpenOptions, PagedCachedFile};

const PAGE: usize = 4096;
const THREADS: u64 = 8;
const COMMITS_PER_THREAD: u64 = 200;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("embed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // A directory of the caller's, or a scratch one that goes at the end.
    let scratch;
    let dir: PathBuf = match std::env::args_os().nth(1) {
        Some(d) => d.into(),
        None => {
            scratch = tempfile::tempdir()?;
            scratch.path().to_path_buf()
        }
    };
    let path = dir.join("embed.db");
    if path.exists() {
        return Err(format!(
            "{} exists; embed writes only a file it creates",
            path.display()
        )
        .into());
    }

    let config = Config::default()
        .page_size(PAGE)
        .max_write_buffer_bytes(16 << 20)
        .read_cache_bytes(4 << 20)
        .engine(FlushEngine::Auto { queue_depth: 32 })
        .direct(DirectIo::Auto);
    // Locked at open: a second writer in any process gets Error::Locked.
    let file = Arc::new(PagedCachedFile::open_with(
        &path,
        &OpenOptions::new().create(true),
        config.clone(),
    )?);
    println!("opened {}: {}", path.display(), file.io_mode());
    let no_wait = OpenOptions::new().lock_wait(Duration::ZERO);
    match PagedCachedFile::open_with(&path, &no_wait, config.clone()) {
        Err(Error::Locked) => println!("a second open is refused: the file is locked"),
        Ok(_) => return Err("a second writer opened a locked file".into()),
        Err(e) => return Err(e.into()),
    }

    // A header at an odd offset (merged into page 0), a page at page 1.
    file.write_all_at(10, b"embed header")?;
    file.write_page(PAGE as u64, &[0x5A; PAGE])?;
    let mut header = [0u8; 12];
    file.read_exact_at(10, &mut header)?;
    println!(
        "read back before any flush: {:?} (newest bytes, from the write buffer)",
        std::str::from_utf8(&header)?
    );

    // Room for every thread's pages, then committing threads: each writes
    // its page and calls sync; concurrent syncs share rounds.
    let pages = 2 + THREADS;
    file.set_len(pages * PAGE as u64)?;
    let started = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let file = Arc::clone(&file);
            std::thread::spawn(move || -> Result<(), Error> {
                let at = (2 + t) * PAGE as u64;
                for i in 0..COMMITS_PER_THREAD {
                    let mut page = file.overwrite(at, PAGE)?;
                    page.fill(t as u8);
                    page[..8].copy_from_slice(&i.to_le_bytes());
                    drop(page);
                    file.sync()?;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "a committing thread panicked")??;
    }
    let secs = started.elapsed().as_secs_f64();
    let commits = THREADS * COMMITS_PER_THREAD;
    let st = file.stats();
    println!(
        "{THREADS} threads: {commits} durable commits in {secs:.2} s = {:.0} commits/s, \
         {} fdatasync ({:.2} per commit)",
        commits as f64 / secs,
        st.syncs,
        st.syncs as f64 / commits.max(1) as f64,
    );
    println!(
        "written: {} pages in {} runs, {} write calls, {} bytes",
        st.pages_written, st.runs, st.write_calls, st.bytes_written
    );

    // Every thread's last commit is there.
    for t in 0..THREADS {
        let page = file.read((2 + t) * PAGE as u64, PAGE)?;
        let last = u64::from_le_bytes(page[..8].try_into()?);
        if last != COMMITS_PER_THREAD - 1 || page[8..].iter().any(|&b| b != t as u8) {
            return Err(format!("thread {t}'s page holds commit {last}").into());
        }
    }
    println!("every thread's last commit reads back");

    // Shrink by one page, close (sync + unlock), reopen read-only.
    file.set_len((pages - 1) * PAGE as u64)?;
    file.close()?;
    let reader = PagedCachedFile::open_with(&path, &OpenOptions::new().read_only(true), config)?;
    reader.read_exact_at(10, &mut header)?;
    println!(
        "reopened read-only: {} bytes, header {:?}",
        reader.len(),
        std::str::from_utf8(&header)?
    );
    if reader.len() != (pages - 1) * PAGE as u64 || &header != b"embed header" {
        return Err("the reopened file differs from what was committed".into());
    }
    match reader.write_page(0, &[0; PAGE]) {
        Err(Error::ReadOnly) => println!("a write to the read-only file is refused"),
        other => return Err(format!("write to a read-only file: {other:?}").into()),
    }
    drop(reader);
    if std::env::args_os().nth(1).is_some() {
        std::fs::remove_file(&path)?;
    }
    Ok(())
}
