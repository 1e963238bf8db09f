//! Helpers shared by the integration tests.
#![allow(dead_code)]

use pagewriter::FlushEngine;

/// Every flush engine: tests that take an engine run for each of these.
pub const ENGINES: [FlushEngine; 3] = [
    FlushEngine::PerPage,
    FlushEngine::Concat,
    FlushEngine::Vectored,
];

/// A page of `size` bytes whose contents encode (page number, version), so
/// a wrong or stale page is told apart from the right one.
pub fn page(size: usize, page_no: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let tag =
        page_no.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        let w = (tag ^ i as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    v[..8].copy_from_slice(&page_no.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    v
}

/// (page number, version) stored by [`page`].
pub fn tag_of(bytes: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(bytes[..8].try_into().unwrap()),
        u64::from_le_bytes(bytes[8..16].try_into().unwrap()),
    )
}

#[allow(unused_imports)]
pub use pagewriter::testing::{direct_available, uring_available};

/// Every engine that works on a real file: [`ENGINES`] plus io_uring where
/// a ring can be set up (said on stderr where not).
pub fn file_engines() -> Vec<FlushEngine> {
    let mut v = ENGINES.to_vec();
    if uring_available() {
        v.push(FlushEngine::IoUring { queue_depth: 8 });
    } else {
        eprintln!("io_uring unavailable here: its cases are skipped");
    }
    v
}

/// A small ext4 file system on a loop device, mounted for one test and
/// unmounted (image deleted) on drop. `None`, with the reason on stderr,
/// where this machine refuses to make or mount it (no root, no loop
/// devices, no mkfs.ext4).
pub struct ScratchFs {
    mount: tempfile::TempDir,
    image: std::path::PathBuf,
}

impl ScratchFs {
    /// A fresh ext4 of `mib` MiB.
    pub fn ext4(mib: u64) -> Option<Self> {
        let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let mount = tempfile::tempdir_in(base).ok()?;
        let image = base.join(format!(
            "scratch-{}-{}.ext4",
            std::process::id(),
            mount.path().file_name()?.to_string_lossy()
        ));
        let skip = |why: String| {
            eprintln!("scratch ext4 unavailable here ({why}): test skipped");
            let _ = std::fs::remove_file(&image);
            None
        };
        let f = std::fs::File::create(&image).ok()?;
        f.set_len(mib << 20).ok()?;
        drop(f);
        let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
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
        };
        if let Err(why) = run(
            "mkfs.ext4",
            &["-q".as_ref(), "-F".as_ref(), image.as_os_str()],
        ) {
            return skip(why);
        }
        if let Err(why) = run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_os_str(),
                mount.path().as_os_str(),
            ],
        ) {
            return skip(why);
        }
        Some(Self { mount, image })
    }

    /// The mount point.
    pub fn path(&self) -> &std::path::Path {
        self.mount.path()
    }
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
            c.arg(self.mount.path())
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
            eprintln!("could not unmount {}", self.mount.path().display());
        }
        let _ = std::fs::remove_file(&self.image);
    }
}
