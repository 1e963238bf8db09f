//! The write logger: a FUSE file system of two files, `disk` (the image,
//! read and written through) and `marks` (lines a workload writes), that
//! appends every write to `disk`, every `fsync` of it and every line
//! written to `marks` to the log, in the order the kernel sent them.
//!
//! A loop device over `disk` (`losetup --direct-io=off`) turns the block
//! layer's requests into FUSE requests: each WRITE into a write (split at
//! FUSE's largest write), each cache flush (REQ_PREFLUSH, and the flush
//! the loop driver makes after a REQ_FUA write) into an `fsync`. `disk` is
//! opened with `FOPEN_DIRECT_IO`, so no page cache sits between the loop
//! device and this process: a write is logged when the kernel sends it,
//! and the loop device completes it only after this process replied. One
//! thread serves every request, so the log's order is the order the
//! requests were served; a flush is logged after every write the kernel
//! completed before sending it.
//!
//! The logger can fail `fsync`s or writes with EIO on demand ([`Faults`]):
//! a failed flush is logged as such, a failed write leaves the image alone.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite,
    Request, WriteFlags,
};

use crate::log::{Kind, LogWriter};

const DISK: INodeNo = INodeNo(2);
const MARKS: INodeNo = INodeNo(3);
const TTL: Duration = Duration::from_secs(3600);

/// EIO on demand: the next `fsyncs` flushes and the next `writes` writes
/// of `disk` fail.
#[derive(Debug, Default)]
pub struct Faults {
    pub fsyncs: u32,
    pub writes: u32,
}

/// The logger's state (see the module docs).
pub struct Logger {
    image: File,
    size: u64,
    log: Mutex<LogWriter>,
    faults: Arc<Mutex<Faults>>,
    /// The first error writing the log or the image (the workload sees EIO
    /// from then on; the run reports it).
    broken: Mutex<Option<String>>,
}

impl Logger {
    /// A logger serving `image` (a regular file) and logging to `log` (a
    /// new file), both inside `work`.
    ///
    /// Errors: `image` is not a regular file, either path is outside
    /// `work`, or the files cannot be opened or created.
    pub fn new(
        work: &Path,
        image: &Path,
        log: &Path,
    ) -> std::io::Result<(Logger, Arc<Mutex<Faults>>)> {
        let inside = |p: &Path| -> std::io::Result<PathBuf> {
            let dir = p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .canonicalize()?;
            let work = work.canonicalize()?;
            if !dir.starts_with(&work) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{} is outside the work directory {}",
                        p.display(),
                        work.display()
                    ),
                ));
            }
            Ok(dir)
        };
        inside(image)?;
        inside(log)?;
        let meta = std::fs::metadata(image)?;
        if !meta.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", image.display()),
            ));
        }
        let size = meta.len();
        let image = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(image)?;
        let faults = Arc::new(Mutex::new(Faults::default()));
        Ok((
            Logger {
                image,
                size,
                log: Mutex::new(LogWriter::create(log, size)?),
                faults: Arc::clone(&faults),
                broken: Mutex::new(None),
            },
            faults,
        ))
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0, 0o755, 2),
            DISK => (FileType::RegularFile, self.size, 0o600, 1),
            MARKS => (FileType::RegularFile, 0, 0o600, 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    fn record(&self, kind: Kind, offset: u64, payload: &[u8]) -> Result<(), Errno> {
        let mut log = self.log.lock().expect("log lock");
        match log.append(kind, offset, payload).and_then(|()| {
            if kind == Kind::Flush || kind == Kind::Mark {
                log.flush()
            } else {
                Ok(())
            }
        }) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.broken
                    .lock()
                    .expect("broken lock")
                    .get_or_insert(format!("writing the log: {e}"));
                Err(Errno::EIO)
            }
        }
    }

    /// The first error writing the log or the image, if any.
    pub fn broken(&self) -> Option<String> {
        self.broken.lock().expect("broken lock").clone()
    }
}

impl Filesystem for Logger {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ino = match (parent, name.to_str()) {
            (INodeNo::ROOT, Some("disk")) => DISK,
            (INodeNo::ROOT, Some("marks")) => MARKS,
            _ => return reply.error(Errno::ENOENT),
        };
        let attr = self.attr(ino).expect("known inode");
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino {
            DISK | MARKS => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != DISK {
            return reply.data(&[]);
        }
        let end = (offset + size as u64).min(self.size);
        let mut buf = vec![0u8; end.saturating_sub(offset) as usize];
        match self.image.read_exact_at(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino == MARKS {
            return match self.record(Kind::Mark, 0, data) {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(e),
            };
        }
        if ino != DISK {
            return reply.error(Errno::EBADF);
        }
        if offset + data.len() as u64 > self.size {
            return reply.error(Errno::ENOSPC);
        }
        {
            let mut f = self.faults.lock().expect("faults lock");
            if f.writes > 0 {
                f.writes -= 1;
                drop(f);
                return match self.record(Kind::FailedWrite, offset, &[]) {
                    Ok(()) => reply.error(Errno::EIO),
                    Err(e) => reply.error(e),
                };
            }
        }
        if let Err(e) = self.record(Kind::Write, offset, data) {
            return reply.error(e);
        }
        match self.image.write_all_at(data, offset) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => {
                self.broken
                    .lock()
                    .expect("broken lock")
                    .get_or_insert(format!("writing the image: {e}"));
                reply.error(Errno::EIO)
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if ino != DISK {
            return reply.ok();
        }
        let failed = {
            let mut f = self.faults.lock().expect("faults lock");
            let fail = f.fsyncs > 0;
            f.fsyncs = f.fsyncs.saturating_sub(1);
            fail
        };
        let kind = if failed {
            Kind::FailedFlush
        } else {
            Kind::Flush
        };
        match self.record(kind, 0, &[]) {
            Ok(()) if failed => reply.error(Errno::EIO),
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (DISK, FileType::RegularFile, "disk"),
            (MARKS, FileType::RegularFile, "marks"),
        ];
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_that_is_no_file_or_outside_the_work_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let work = root.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let dir_image = work.join("dir.img");
        std::fs::create_dir(&dir_image).unwrap();
        let err = Logger::new(&work, &dir_image, &work.join("log"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("is not a regular file"), "{err}");
        assert!(
            !work.join("log").exists(),
            "a refused image left a log behind"
        );

        let outside = root.path().join("outside.img");
        std::fs::write(&outside, [0u8; 4096]).unwrap();
        let err = Logger::new(&work, &outside, &work.join("log"))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("outside the work directory"),
            "{err}"
        );
        let err = Logger::new(&work, &work.join("x.img"), &root.path().join("log"))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("outside the work directory"),
            "{err}"
        );
        assert!(!root.path().join("log").exists());

        let image = work.join("disk.img");
        std::fs::write(&image, [0u8; 4096]).unwrap();
        assert!(Logger::new(&work, &image, &work.join("log")).is_ok());
    }
}
