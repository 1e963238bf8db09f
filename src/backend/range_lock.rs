//! Byte-range locks on a file: Linux open file description (OFD) locks,
//! `fcntl(F_OFD_SETLK / F_OFD_SETLKW / F_OFD_GETLK)`.
//!
//! An OFD lock belongs to the open file description, not to the process:
//! two opens of one file in the same process conflict (what engines such
//! as redb need for their multi-handle locking protocols), a lock is never
//! dropped by another descriptor of the same process being closed (the trap
//! of classic POSIX `F_SETLK` locks), and it goes when the description's
//! last reference closes. Locks are advisory and may cover bytes past the
//! end of the file. They are independent of [`std::fs::File::lock`]
//! (`flock`) on local file systems.
//!
//! Ranges are `start` plus a length in bytes, `None` meaning "to the end of
//! the file, however it grows" (fcntl's `l_len = 0`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Shared (read) or exclusive (write) lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// Many holders at once (`F_RDLCK`); needs a descriptor open for reading.
    Shared,
    /// One holder (`F_WRLCK`); needs a descriptor open for writing
    /// (`EBADF` on a read-only one).
    Exclusive,
}

/// Takes a lock over `len` bytes at `start` (`None`: to the end of the
/// file and beyond) if no other open file description holds a conflicting
/// one: `Ok(true)` when taken, `Ok(false)` on a conflict. A range this
/// description already holds is converted (shared to exclusive or back).
///
/// Errors: `InvalidInput` for a zero length or a range past `i64::MAX`
/// (fcntl's signed offsets); `EBADF` for an exclusive lock on a
/// descriptor not open for writing; other `fcntl` errors (`ENOLCK`).
pub fn try_lock_range(
    file: &File,
    start: u64,
    len: Option<u64>,
    kind: LockKind,
) -> io::Result<bool> {
    match fcntl_lock(file, libc::F_OFD_SETLK, lock_type(kind), start, len) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// As [`try_lock_range`], but waits until a conflicting lock is released.
/// There is no deadlock detection for OFD locks: two descriptions waiting
/// on each other wait forever.
///
/// Errors: as [`try_lock_range`] (`EINTR` is retried).
pub fn lock_range(file: &File, start: u64, len: Option<u64>, kind: LockKind) -> io::Result<()> {
    loop {
        match fcntl_lock(file, libc::F_OFD_SETLKW, lock_type(kind), start, len) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r.map(|_| ()),
        }
    }
}

/// Releases this description's locks over the range (any part of it that
/// is not locked is left as it is).
///
/// Errors: as [`try_lock_range`] for the range.
pub fn unlock_range(file: &File, start: u64, len: Option<u64>) -> io::Result<()> {
    fcntl_lock(
        file,
        libc::F_OFD_SETLK,
        libc::F_UNLCK as libc::c_short,
        start,
        len,
    )
    .map(|_| ())
}

/// Whether an exclusive lock over the range would conflict with a lock
/// another open file description holds (this description's own locks
/// never conflict with it). Nothing is taken.
///
/// Errors: as [`try_lock_range`] for the range.
pub fn query_lock_range(file: &File, start: u64, len: Option<u64>) -> io::Result<bool> {
    let fl = fcntl_lock(
        file,
        libc::F_OFD_GETLK,
        libc::F_WRLCK as libc::c_short,
        start,
        len,
    )?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn lock_type(kind: LockKind) -> libc::c_short {
    (match kind {
        LockKind::Shared => libc::F_RDLCK,
        LockKind::Exclusive => libc::F_WRLCK,
    }) as libc::c_short
}

fn fcntl_lock(
    file: &File,
    cmd: libc::c_int,
    l_type: libc::c_short,
    start: u64,
    len: Option<u64>,
) -> io::Result<libc::flock> {
    let invalid = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("lock range at {start}: {why}"),
        )
    };
    let max = i64::MAX as u64;
    if start > max {
        return Err(invalid("past the largest offset fcntl takes"));
    }
    let l_len = match len {
        None => 0,
        Some(0) => return Err(invalid("zero length")),
        Some(n) if n - 1 > max - start => {
            return Err(invalid("ends past the largest offset fcntl takes"));
        }
        Some(n) => n as libc::off_t,
    };
    // SAFETY: `flock` is a plain C struct for which all zeroes is a valid
    // value (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = l_len;
    // SAFETY: the descriptor is open for `file`'s lifetime and `fl` is a
    // valid, exclusively borrowed `struct flock` for the call.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_opens() -> (tempfile::NamedTempFile, File, File) {
        let t = tempfile::NamedTempFile::new().unwrap();
        let a = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(t.path())
            .unwrap();
        let b = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(t.path())
            .unwrap();
        (t, a, b)
    }

    #[test]
    fn two_opens_in_one_process_conflict_and_release() {
        let (_t, a, b) = two_opens();
        let at = 1 << 62;
        assert!(try_lock_range(&a, at, Some(1), LockKind::Exclusive).unwrap());
        assert!(!try_lock_range(&b, at, Some(1), LockKind::Shared).unwrap());
        assert!(query_lock_range(&b, at, Some(1)).unwrap());
        // Not overlapping: no conflict.
        assert!(try_lock_range(&b, at + 1, None, LockKind::Exclusive).unwrap());
        assert!(
            !query_lock_range(&a, at, Some(1)).unwrap(),
            "own locks never conflict"
        );
        unlock_range(&a, at, Some(1)).unwrap();
        assert!(try_lock_range(&b, at, Some(1), LockKind::Shared).unwrap());
        assert!(
            try_lock_range(&a, at, Some(1), LockKind::Shared).unwrap(),
            "shared with shared"
        );
        assert!(!try_lock_range(&a, at, Some(1), LockKind::Exclusive).unwrap());
        drop(b);
        assert!(
            try_lock_range(&a, 0, None, LockKind::Exclusive).unwrap(),
            "closing releases"
        );
    }

    #[test]
    fn bad_ranges_and_read_only_exclusive_are_errors() {
        let (t, a, _b) = two_opens();
        assert_eq!(
            try_lock_range(&a, 0, Some(0), LockKind::Shared)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            try_lock_range(&a, u64::MAX, None, LockKind::Shared)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            query_lock_range(&a, 2, Some(i64::MAX as u64))
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(try_lock_range(&a, 0, Some(i64::MAX as u64), LockKind::Shared).unwrap());
        let ro = File::open(t.path()).unwrap();
        let e = try_lock_range(&ro, 0, Some(1), LockKind::Exclusive).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        assert!(try_lock_range(&ro, 0, Some(1), LockKind::Shared).unwrap());
    }
}
