//! An engine restarted after `kill -9` opens its own file at once, with
//! `Config::default()` and no lock wait; a second live holder is still
//! refused at once with `Error::Locked`.
//!
//! Real processes: this test binary runs itself as the child (the
//! environment variable `PAGEWRITER_RESTART_CHILD` names the file and the
//! I/O mode), which opens the file, says "ready" once it has committed, and
//! goes on writing and committing until it is killed with signal 9.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pagewriter::{Config, DirectIo, Error, PagedCachedFile};

const CHILD: &str = "PAGEWRITER_RESTART_CHILD";
const PS: usize = 4096;

fn config(direct: bool) -> Config {
    Config::default().direct(if direct { DirectIo::On } else { DirectIo::Off })
}

/// The child's side: open, commit, say ready, commit until killed.
fn child(path: &str, direct: bool) -> ! {
    let f = PagedCachedFile::open(path, config(direct)).expect("child open");
    let mut n = 0u64;
    loop {
        let p = n % 256;
        f.write_page(p * PS as u64, &[(n % 251) as u8; PS]).unwrap();
        f.sync().unwrap();
        if n == 0 {
            println!("ready {}", f.io_mode());
        }
        n += 1;
    }
}

/// A child holding `path`, once it has committed.
fn holder(path: &Path, direct: bool) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_restarted_engine_opens_its_file_after_kill_9",
            "--nocapture",
        ])
        .env(CHILD, format!("{}|{}", direct, path.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let mut line = String::new();
    let out = c.stdout.take().unwrap();
    let mut lines = BufReader::new(out);
    loop {
        line.clear();
        assert!(
            lines.read_line(&mut line).unwrap() > 0,
            "the child ended before it was ready"
        );
        if line.starts_with("ready") {
            break;
        }
    }
    // Keep reading so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while lines.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    c
}

#[test]
fn a_restarted_engine_opens_its_file_after_kill_9() {
    if let Ok(spec) = std::env::var(CHILD) {
        let (direct, path) = spec.split_once('|').unwrap();
        child(path, direct == "true");
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for direct in [false, true] {
        let path = dir.path().join(format!("restart-{direct}"));
        // O_DIRECT where the file system takes it (tmpfs does not).
        if direct && PagedCachedFile::open(&path, config(true)).is_err() {
            eprintln!(
                "O_DIRECT refused under {}: its case is skipped",
                dir.path().display()
            );
            continue;
        }
        let tries = 20;
        let mut opened = 0;
        for i in 0..tries {
            let mut c = holder(&path, direct);
            // A live holder: refused at once.
            let t = Instant::now();
            let second = PagedCachedFile::open(&path, config(direct));
            assert!(
                matches!(second, Err(Error::Locked)),
                "direct {direct}, try {i}: a second open of a live holder's file: {second:?}"
            );
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "the refusal waited"
            );
            // Killed with signal 9 and reaped, then opened at once.
            c.kill().unwrap();
            c.wait().unwrap();
            match PagedCachedFile::open(&path, config(direct)) {
                Ok(f) => {
                    opened += 1;
                    f.close().unwrap();
                }
                Err(e) => eprintln!("direct {direct}, try {i}: reopen after kill -9: {e}"),
            }
        }
        eprintln!("direct {direct}: {opened} of {tries} reopens after kill -9 succeeded");
        assert_eq!(
            opened, tries,
            "direct {direct}: a restarted engine was refused its file"
        );
    }
}
