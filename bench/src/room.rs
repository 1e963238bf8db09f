//! Free-space checks before a tool writes a large file: a write the file
//! system cannot hold is refused up front instead of filling the disk and
//! failing half-way (`--force` skips the check).

use std::path::Path;

use crate::error::{Error, Result};

/// Refuses writing `new_bytes` of new blocks into `path` when its file
/// system has less free space, counting `reclaimed` bytes the write frees
/// first (an old file it truncates). Passes where free space cannot be
/// read (the write then fails on its own if it must).
///
/// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) naming the path, both figures and
/// `--force`.
pub fn check(path: &Path, new_bytes: u64, reclaimed: u64, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(free) = pagewriter::backend::free_space(dir) else {
        return Ok(());
    };
    if new_bytes > free.saturating_add(reclaimed) {
        return Err(Error::config(format!(
            "{}: {new_bytes} B do not fit: the file system has {free} B free{}; \
             --force to try anyway",
            path.display(),
            if reclaimed > 0 {
                format!(" (plus {reclaimed} B the old file gives back)")
            } else {
                String::new()
            }
        )));
    }
    Ok(())
}

/// Bytes of blocks `path` holds now (0 if it does not exist).
pub fn held(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}
