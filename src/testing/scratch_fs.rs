//! Small real file systems for tests: a loop-mounted ext4, XFS or btrfs
//! image, or a tmpfs, made for one test and gone when it drops.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// A Linux file system a [`ScratchFs`] can make. Engines run on each, and
/// they differ where a page writer lives: `O_DIRECT` alignment, `fallocate`
/// and unwritten extents, `ENOSPC` timing under copy-on-write, the largest
/// file, and whether `O_DIRECT` is taken at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    /// ext4 with blocks of `block` bytes (1024, 2048 or 4096): with 1 KiB
    /// blocks a 4 KiB page is four blocks, and a full disk can end a write
    /// inside a page.
    Ext4 {
        /// Block size in bytes.
        block: u32,
    },
    /// XFS (mkfs.xfs refuses less than 300 MiB).
    Xfs,
    /// btrfs (copy-on-write; mkfs.btrfs refuses less than 114 MiB).
    Btrfs,
    /// tmpfs (memory; no image, no loop device).
    Tmpfs,
}

impl FsKind {
    /// Every kind the tests run on: ext4 with 4 KiB and with 1 KiB blocks,
    /// XFS, btrfs, tmpfs.
    pub const ALL: [FsKind; 5] = [
        FsKind::Ext4 { block: 4096 },
        FsKind::Ext4 { block: 1024 },
        FsKind::Xfs,
        FsKind::Btrfs,
        FsKind::Tmpfs,
    ];

    /// A short name: `ext4-4k`, `ext4-1k`, `xfs`, `btrfs`, `tmpfs`.
    pub fn name(self) -> String {
        match self {
            FsKind::Ext4 { block } => format!("ext4-{}k", block / 1024),
            FsKind::Xfs => "xfs".into(),
            FsKind::Btrfs => "btrfs".into(),
            FsKind::Tmpfs => "tmpfs".into(),
        }
    }

    /// Why this machine cannot make and mount this kind for a test, or
    /// `None` where it can: mounting needs Linux, root (the effective user id 0),
    /// an image-backed kind its `mkfs` on `PATH` and a loop device
    /// (`/dev/loop-control`). Cheap: nothing is made or mounted. For test
    /// harnesses that mark a test ignored, with this reason, where its
    /// file system cannot be had (and fail it when they must have it).
    pub fn missing(self) -> Option<String> {
        if !cfg!(target_os = "linux") {
            return Some(format!(
                "scratch file systems are Linux loop and tmpfs mounts; this is {}",
                std::env::consts::OS
            ));
        }
        // The effective user id: the second field of `Uid:`.
        let euid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("Uid:"))?;
                line.split_whitespace().nth(2)?.parse::<u32>().ok()
            });
        if euid != Some(0) {
            return Some(format!("mounting a scratch {} needs root", self.name()));
        }
        let tool = match self {
            FsKind::Ext4 { .. } => "mkfs.ext4",
            FsKind::Xfs => "mkfs.xfs",
            FsKind::Btrfs => "mkfs.btrfs",
            FsKind::Tmpfs => "mount",
        };
        let on_path = std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths)
                .chain(["/sbin".into(), "/usr/sbin".into()])
                .any(|d| d.join(tool).is_file())
        });
        if !on_path {
            return Some(format!("{tool} is not installed"));
        }
        if self != FsKind::Tmpfs && !Path::new("/dev/loop-control").exists() {
            return Some("no loop devices (/dev/loop-control)".into());
        }
        None
    }

    /// The smallest size in MiB its mkfs accepts (sizes asked for below it
    /// are raised to it).
    pub fn min_mib(self) -> u64 {
        match self {
            FsKind::Xfs => 300,
            FsKind::Btrfs => 128,
            _ => 16,
        }
    }
}

/// A small file system mounted for one test and unmounted (its image
/// deleted) on drop. `None`, with the reason on stderr, where this machine
/// refuses to make or mount it (no root, no loop devices, no mkfs).
#[derive(Debug)]
pub struct ScratchFs {
    kind: FsKind,
    mount: PathBuf,
    /// The image file (none for tmpfs).
    image: Option<PathBuf>,
}

impl ScratchFs {
    /// A fresh ext4 (4 KiB blocks) of `mib` MiB, its image and mount point
    /// made in `base` (which must exist).
    pub fn ext4(base: &Path, mib: u64) -> Option<Self> {
        Self::new(FsKind::Ext4 { block: 4096 }, base, mib)
    }

    /// A fresh file system of `kind` and `mib` MiB (at least
    /// [`FsKind::min_mib`]), its image and mount point made in `base`
    /// (which must exist).
    pub fn new(kind: FsKind, base: &Path, mib: u64) -> Option<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mib = mib.max(kind.min_mib());
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("scratch-{}-{n}-{}", std::process::id(), kind.name());
        let mount = base.join(&tag);
        std::fs::create_dir_all(&mount).ok()?;
        let image = (kind != FsKind::Tmpfs).then(|| base.join(format!("{tag}.img")));
        let skip = |why: String| {
            eprintln!(
                "scratch {} unavailable here ({why}): test skipped",
                kind.name()
            );
            if let Some(i) = &image {
                let _ = std::fs::remove_file(i);
            }
            let _ = std::fs::remove_dir(&mount);
            None
        };
        let made = match &image {
            None => run(
                "mount",
                &[
                    "-t".as_ref(),
                    "tmpfs".as_ref(),
                    "-o".as_ref(),
                    format!("size={mib}m").as_ref(),
                    "tmpfs".as_ref(),
                    mount.as_os_str(),
                ],
            ),
            Some(image) => make_image(kind, image, mib).and_then(|()| {
                run(
                    "mount",
                    &[
                        "-o".as_ref(),
                        "loop".as_ref(),
                        image.as_os_str(),
                        mount.as_os_str(),
                    ],
                )
            }),
        };
        match made {
            Ok(()) => Some(Self { kind, mount, image }),
            Err(why) => skip(why),
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// The kind of file system.
    pub fn kind(&self) -> FsKind {
        self.kind
    }
}

/// Makes a sparse image of `mib` MiB at `image` and a file system of
/// `kind` on it.
fn make_image(kind: FsKind, image: &Path, mib: u64) -> Result<(), String> {
    let f = std::fs::File::create(image).map_err(|e| format!("create image: {e}"))?;
    f.set_len(mib << 20)
        .map_err(|e| format!("size image: {e}"))?;
    drop(f);
    let img = image.as_os_str();
    match kind {
        FsKind::Ext4 { block } => run(
            "mkfs.ext4",
            &[
                "-q".as_ref(),
                "-F".as_ref(),
                "-b".as_ref(),
                block.to_string().as_ref(),
                img,
            ],
        ),
        FsKind::Xfs => run("mkfs.xfs", &["-q".as_ref(), "-f".as_ref(), img]),
        FsKind::Btrfs => run("mkfs.btrfs", &["-q".as_ref(), "-f".as_ref(), img]),
        FsKind::Tmpfs => unreachable!("tmpfs has no image"),
    }
}

/// Runs `cmd args`; the error names the command and its stderr.
fn run(cmd: &str, args: &[&OsStr]) -> Result<(), String> {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))
        .and_then(|o| {
            if o.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
        })
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        // A ring's registered file outlives its drop briefly (the kernel
        // tears rings down in deferred work): retry, then detach lazily.
        let umount = |lazy: bool| {
            let mut c = std::process::Command::new("umount");
            if lazy {
                c.arg("-l");
            }
            c.arg(&self.mount)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let mut done = false;
        for _ in 0..50 {
            if umount(false) {
                done = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if !done && !umount(true) {
            eprintln!("could not unmount {}", self.mount.display());
        }
        if let Some(i) = &self.image {
            let _ = std::fs::remove_file(i);
        }
        let _ = std::fs::remove_dir(&self.mount);
    }
}
