//! Byte-range locks on a file, for engines with multi-handle locking
//! protocols (redb's): shared or exclusive, over `start` plus a length in
//! bytes (`None`: to the end of the file, however it grows; locks may
//! cover bytes past the end). Who owns a lock differs by platform
//! ([`SCOPE`]):
//! - **Linux, macOS**: open file description locks (`F_OFD_SETLK`...),
//!   advisory: two opens in one process conflict, closing another
//!   descriptor never drops them, and they go with the description's last
//!   reference. Independent of [`File::lock`] (`flock`) on local file
//!   systems.
//! - **FreeBSD and other Unixes**: POSIX record locks, owned by the
//!   process: two opens in one process never conflict, and closing any
//!   descriptor of the file drops them all.
//! - **Windows**: `LockFileEx`, owned by the handle but mandatory (other
//!   handles' I/O on a locked range fails); locks do not merge, split or
//!   convert, so release exactly the ranges taken, and a handle's own lock
//!   conflicts with a new one over it ([`query_lock_range`] counts it).

use std::fs::File;
use std::io;

/// Who owns a byte-range lock on this platform (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum LockScope {
    /// The open file description (Linux and macOS OFD locks).
    OpenFileDescription,
    /// The process (POSIX `F_SETLK` locks).
    Process,
    /// The handle, and mandatory (Windows `LockFileEx`).
    Handle,
}

/// The lock owner of this build's platform.
pub const SCOPE: LockScope = imp::SCOPE;

/// Shared (read) or exclusive (write) lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// Many holders at once (`F_RDLCK`); needs a descriptor open for
    /// reading.
    Shared,
    /// One holder (`F_WRLCK`); on Unix needs a descriptor open for writing
    /// (`EBADF` on a read-only one).
    Exclusive,
}

/// Takes a lock over `len` bytes at `start` (`None`: to the end of the
/// file and beyond) if no other owner holds a conflicting one: `Ok(true)`
/// when taken, `Ok(false)` on a conflict. On Unix a range this owner
/// already holds is converted (shared to exclusive or back).
///
/// Errors: `InvalidInput` for a zero length or, on Unix, a range past
/// `i64::MAX` (fcntl's signed offsets); `EBADF` for an exclusive lock on a
/// descriptor not open for writing (Unix); other OS errors (`ENOLCK`).
pub fn try_lock_range(
    file: &File,
    start: u64,
    len: Option<u64>,
    kind: LockKind,
) -> io::Result<bool> {
    check(start, len)?;
    imp::try_lock(file, start, len, kind)
}

/// As [`try_lock_range`], but waits until a conflicting lock is released.
/// There is no deadlock detection for OFD or Windows locks: two owners
/// waiting on each other wait forever (POSIX locks report `EDEADLK`).
///
/// Errors: as [`try_lock_range`] (`EINTR` is retried).
pub fn lock_range(file: &File, start: u64, len: Option<u64>, kind: LockKind) -> io::Result<()> {
    check(start, len)?;
    imp::lock(file, start, len, kind)
}

/// Releases this owner's locks over the range (on Unix any part of it that
/// is not locked is left as it is; on Windows the range must be one that
/// was taken).
///
/// Errors: as [`try_lock_range`] for the range.
pub fn unlock_range(file: &File, start: u64, len: Option<u64>) -> io::Result<()> {
    check(start, len)?;
    imp::unlock(file, start, len)
}

/// Whether an exclusive lock over the range would conflict with a lock
/// another owner holds (on Unix this owner's own locks never conflict with
/// it; on Windows they do). Nothing is kept.
///
/// Errors: as [`try_lock_range`] for the range.
pub fn query_lock_range(file: &File, start: u64, len: Option<u64>) -> io::Result<bool> {
    check(start, len)?;
    imp::query(file, start, len)
}

/// The range checks every platform shares: a length is not zero, and on
/// Unix the range fits fcntl's signed offsets (`i64`).
fn check(start: u64, len: Option<u64>) -> io::Result<()> {
    let invalid = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("lock range at {start}: {why}"),
        )
    };
    let max = if cfg!(unix) {
        i64::MAX as u64
    } else {
        u64::MAX
    };
    if start > max {
        return Err(invalid("past the largest offset the lock call takes"));
    }
    match len {
        None if start == u64::MAX => Err(invalid("no byte left to lock")),
        Some(0) => Err(invalid("zero length")),
        Some(n) if n - 1 > max - start => {
            Err(invalid("ends past the largest offset the lock call takes"))
        }
        _ => Ok(()),
    }
}

#[cfg(unix)]
mod imp {
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;

    use super::{LockKind, LockScope};

    #[cfg(any(target_os = "linux", target_vendor = "apple"))]
    pub(super) const SCOPE: LockScope = LockScope::OpenFileDescription;
    #[cfg(any(target_os = "linux", target_vendor = "apple"))]
    const CMD: (libc::c_int, libc::c_int, libc::c_int) =
        (libc::F_OFD_SETLK, libc::F_OFD_SETLKW, libc::F_OFD_GETLK);

    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    pub(super) const SCOPE: LockScope = LockScope::Process;
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    const CMD: (libc::c_int, libc::c_int, libc::c_int) =
        (libc::F_SETLK, libc::F_SETLKW, libc::F_GETLK);

    pub(super) fn try_lock(
        file: &File,
        start: u64,
        len: Option<u64>,
        kind: LockKind,
    ) -> io::Result<bool> {
        match fcntl_lock(file, CMD.0, lock_type(kind), start, len) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn lock(
        file: &File,
        start: u64,
        len: Option<u64>,
        kind: LockKind,
    ) -> io::Result<()> {
        loop {
            match fcntl_lock(file, CMD.1, lock_type(kind), start, len) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r.map(|_| ()),
            }
        }
    }

    pub(super) fn unlock(file: &File, start: u64, len: Option<u64>) -> io::Result<()> {
        fcntl_lock(file, CMD.0, short(libc::F_UNLCK), start, len).map(|_| ())
    }

    pub(super) fn query(file: &File, start: u64, len: Option<u64>) -> io::Result<bool> {
        let fl = fcntl_lock(file, CMD.2, short(libc::F_WRLCK), start, len)?;
        Ok(fl.l_type != short(libc::F_UNLCK))
    }

    /// The lock-type constants are `c_int` on Linux and `c_short` on the
    /// BSDs; `struct flock` takes a `c_short`.
    #[allow(clippy::unnecessary_cast, reason = "c_short already on the BSDs")]
    fn short(t: impl Into<i32>) -> libc::c_short {
        t.into() as libc::c_short
    }

    fn lock_type(kind: LockKind) -> libc::c_short {
        match kind {
            LockKind::Shared => short(libc::F_RDLCK),
            LockKind::Exclusive => short(libc::F_WRLCK),
        }
    }

    /// One `fcntl` lock call over a range [`check`](super::check) passed.
    fn fcntl_lock(
        file: &File,
        cmd: libc::c_int,
        l_type: libc::c_short,
        start: u64,
        len: Option<u64>,
    ) -> io::Result<libc::flock> {
        // SAFETY: `flock` is a plain C struct for which all zeroes is a
        // valid value (l_pid must be 0 for OFD locks).
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = l_type;
        fl.l_whence = short(libc::SEEK_SET);
        // Both fit: `check` keeps the range within i64.
        fl.l_start = start as libc::off_t;
        fl.l_len = len.unwrap_or(0) as libc::off_t;
        // SAFETY: the descriptor is open for `file`'s lifetime and `fl` is
        // a valid, exclusively borrowed `struct flock` for the call.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
        if r == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(fl)
    }
}

#[cfg(windows)]
mod imp {
    use std::fs::File;
    use std::io;
    use std::os::windows::io::AsRawHandle;

    use windows_sys::Win32::Foundation::{ERROR_LOCK_VIOLATION, ERROR_NOT_LOCKED};
    use windows_sys::Win32::Storage::FileSystem::{
        LOCKFILE_EXCLUSIVE_LOCK, LOCKFILE_FAIL_IMMEDIATELY, LockFileEx, UnlockFile,
    };
    use windows_sys::Win32::System::IO::OVERLAPPED;

    use super::{LockKind, LockScope};

    pub(super) const SCOPE: LockScope = LockScope::Handle;

    /// The range as LockFileEx takes it: a length of `u64::MAX - start`
    /// for "to the end and beyond".
    fn span(start: u64, len: Option<u64>) -> u64 {
        len.unwrap_or(u64::MAX - start)
    }

    /// `LockFileEx` over the range; `Ok(false)` on a conflict when
    /// `fail_now`.
    fn lock_file(
        file: &File,
        start: u64,
        len: Option<u64>,
        kind: LockKind,
        fail_now: bool,
    ) -> io::Result<bool> {
        let len = span(start, len);
        let mut flags = if fail_now {
            LOCKFILE_FAIL_IMMEDIATELY
        } else {
            0
        };
        if kind == LockKind::Exclusive {
            flags |= LOCKFILE_EXCLUSIVE_LOCK;
        }
        // SAFETY: OVERLAPPED is plain old data; all-zero is valid.
        let mut ov: OVERLAPPED = unsafe { std::mem::zeroed() };
        ov.Anonymous.Anonymous.Offset = start as u32;
        ov.Anonymous.Anonymous.OffsetHigh = (start >> 32) as u32;
        // SAFETY: the handle is open for `file`'s lifetime; std opens files
        // for synchronous I/O, so the call returns only once the lock is
        // taken or refused and `ov` is not used after it.
        let ok = unsafe {
            LockFileEx(
                file.as_raw_handle(),
                flags,
                0,
                len as u32,
                (len >> 32) as u32,
                &mut ov,
            )
        };
        if ok != 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if fail_now && e.raw_os_error() == Some(ERROR_LOCK_VIOLATION as i32) {
            return Ok(false);
        }
        Err(e)
    }

    pub(super) fn try_lock(
        file: &File,
        start: u64,
        len: Option<u64>,
        kind: LockKind,
    ) -> io::Result<bool> {
        lock_file(file, start, len, kind, true)
    }

    pub(super) fn lock(
        file: &File,
        start: u64,
        len: Option<u64>,
        kind: LockKind,
    ) -> io::Result<()> {
        lock_file(file, start, len, kind, false).map(|_| ())
    }

    pub(super) fn unlock(file: &File, start: u64, len: Option<u64>) -> io::Result<()> {
        let len = span(start, len);
        // SAFETY: integers and a handle open for `file`'s lifetime.
        let ok = unsafe {
            UnlockFile(
                file.as_raw_handle(),
                start as u32,
                (start >> 32) as u32,
                len as u32,
                (len >> 32) as u32,
            )
        };
        if ok != 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // As on Unix, releasing a range not held is not an error.
        if e.raw_os_error() == Some(ERROR_NOT_LOCKED as i32) {
            return Ok(());
        }
        Err(e)
    }

    pub(super) fn query(file: &File, start: u64, len: Option<u64>) -> io::Result<bool> {
        if lock_file(file, start, len, LockKind::Exclusive, true)? {
            unlock(file, start, len)?;
            return Ok(false);
        }
        Ok(true)
    }
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
    #[cfg_attr(
        not(any(target_os = "linux", target_vendor = "apple", windows)),
        ignore = "POSIX record locks belong to the process: two opens in one never conflict"
    )]
    fn two_opens_in_one_process_conflict_and_release() {
        let (_t, a, b) = two_opens();
        let at = 1 << 62;
        assert!(try_lock_range(&a, at, Some(1), LockKind::Exclusive).unwrap());
        assert!(!try_lock_range(&b, at, Some(1), LockKind::Shared).unwrap());
        assert!(query_lock_range(&b, at, Some(1)).unwrap());
        // Not overlapping: no conflict.
        assert!(try_lock_range(&b, at + 1, None, LockKind::Exclusive).unwrap());
        assert_eq!(
            query_lock_range(&a, at, Some(1)).unwrap(),
            SCOPE == LockScope::Handle,
            "own locks conflict on Windows only"
        );
        unlock_range(&a, at, Some(1)).unwrap();
        assert!(try_lock_range(&b, at, Some(1), LockKind::Shared).unwrap());
        assert!(
            try_lock_range(&a, at, Some(1), LockKind::Shared).unwrap(),
            "shared with shared"
        );
        assert!(!try_lock_range(&a, at, Some(1), LockKind::Exclusive).unwrap());
        drop(b);
        if SCOPE == LockScope::Handle {
            // No conversion on Windows: a's shared lock would refuse its
            // own exclusive one.
            unlock_range(&a, at, Some(1)).unwrap();
        }
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
        if cfg!(unix) {
            assert_eq!(
                query_lock_range(&a, 2, Some(i64::MAX as u64))
                    .unwrap_err()
                    .kind(),
                io::ErrorKind::InvalidInput
            );
        } else {
            assert_eq!(
                query_lock_range(&a, 2, Some(u64::MAX)).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert!(try_lock_range(&a, 0, Some(i64::MAX as u64), LockKind::Shared).unwrap());
        let ro = File::open(t.path()).unwrap();
        let excl = try_lock_range(&ro, 0, Some(1), LockKind::Exclusive);
        #[cfg(unix)]
        assert_eq!(excl.unwrap_err().raw_os_error(), Some(libc::EBADF));
        // Windows takes it on a read-only handle, and a's shared lock over
        // the byte refuses it.
        #[cfg(windows)]
        assert!(!excl.unwrap());
        assert!(try_lock_range(&ro, 0, Some(1), LockKind::Shared).unwrap());
    }
}
