//! Scratch files the benchmarks create: named with the creating process's
//! PID (`.pagewriter-<what>-<pid>-<random>.pwtmp`), removed on drop, and
//! those left by a process that is gone (killed, or aborted) removed at the
//! next start in the same directory. A file the user named is never one of
//! them.

use std::path::Path;

use crate::error::{Error, Result};

/// What every scratch file's (and directory's) name ends with.
pub const SUFFIX: &str = ".pwtmp";

/// A scratch file for `what` ("scale", "bulk") in `dir`, removed on drop.
///
/// Errors: `Error::Io` with op "create temporary file".
pub fn create(dir: &Path, what: &str) -> Result<tempfile::NamedTempFile> {
    let f = tempfile::Builder::new()
        .prefix(&format!(".pagewriter-{what}-{}-", std::process::id()))
        .suffix(SUFFIX)
        .tempfile_in(dir)
        .map_err(|e| Error::io("create temporary file", None, e))?;
    // Removed by Ctrl-C too (see `interrupt`).
    crate::interrupt::scratch(f.path().to_path_buf());
    Ok(f)
}

/// Removes the scratch files (and directories, with what they hold) in
/// `dir` whose creating process no longer runs (checked through
/// `/proc/PID`); returns how many. Those of live processes, and anything
/// not named like a scratch file, are left alone.
pub fn remove_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(scratch_pid) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let gone = if e.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(e.path())
        } else {
            std::fs::remove_file(e.path())
        };
        if gone.is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The doublewrite area a cached file opened on scratch file `path` makes
/// beside it (`<path>.dblwr`, [`pagewriter::TornWrites::DoubleWrite`]):
/// registered for Ctrl-C; remove it with the file. Stale ones go with
/// [`remove_stale`] too.
pub fn sidecar(path: &Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".dblwr");
    let p = std::path::PathBuf::from(p);
    crate::interrupt::scratch(p.clone());
    p
}

/// The PID in a scratch file's name (or its doublewrite area's), if it
/// is one.
fn scratch_pid(name: &str) -> Option<u32> {
    let name = name.strip_suffix(".dblwr").unwrap_or(name);
    let rest = name.strip_prefix(".pagewriter-")?.strip_suffix(SUFFIX)?;
    let mut parts = rest.splitn(3, '-');
    let (_what, pid, _random) = (parts.next()?, parts.next()?, parts.next()?);
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_of_dead_processes_go() {
        let d = tempfile::tempdir().unwrap();
        let mine = create(d.path(), "scale").unwrap();
        // PID 4194304 is past Linux's pid_max limit: never alive.
        let dead = d.path().join(".pagewriter-bulk-4194304-abc.pwtmp");
        let dead_area = d.path().join(".pagewriter-bulk-4194304-abc.pwtmp.dblwr");
        let users = d.path().join("pagewriter-bulk-4194304-abc.pwtmp");
        let odd = d.path().join(".pagewriter-bulk-notapid-abc.pwtmp");
        for p in [&dead, &dead_area, &users, &odd] {
            std::fs::write(p, b"x").unwrap();
        }
        assert_eq!(remove_stale(d.path()), 2);
        assert!(!dead.exists() && !dead_area.exists());
        assert!(users.exists() && odd.exists() && mine.path().exists());
        assert_eq!(scratch_pid(".pagewriter-scale-12-x.pwtmp"), Some(12));
    }

    #[test]
    fn directories_of_dead_processes_go_with_what_they_hold() {
        let d = tempfile::tempdir().unwrap();
        let dead = d.path().join(".pagewriter-cf-4194304-abc.pwtmp");
        let live = d
            .path()
            .join(format!(".pagewriter-cf-{}-abc.pwtmp", std::process::id()));
        for dir in [&dead, &live] {
            std::fs::create_dir_all(dir.join("fjall")).unwrap();
            std::fs::write(dir.join("fjall/journal"), b"x").unwrap();
        }
        assert_eq!(remove_stale(d.path()), 1);
        assert!(!dead.exists());
        assert!(live.join("fjall/journal").exists());
    }
}
