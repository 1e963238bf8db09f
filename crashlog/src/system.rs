//! The machine's side: file systems made, loop devices set up and mounts
//! made by the run, each owned by a guard that undoes it on drop, and
//! undone by a Ctrl-C handler too (a registry of what is set up, undone
//! in reverse order before the process exits).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The logged device's sector: what it writes whole, and where a crash
/// may cut a write it had not flushed yet.
pub const SECTOR: u64 = 4096;

/// Where a crash may cut a write inside the page file's data blocks
/// ([`data_extents`]): a device that writes 512 bytes whole, no more, so
/// a 4 KiB page can tear. File-system metadata keeps [`SECTOR`]: the file
/// systems are made for 4 KiB sectors and count on writing them whole
/// (a 1 KiB ext4 superblock torn in two does not mount).
pub const FINE_SECTOR: u64 = 512;

/// The file systems a run can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    Ext4,
    Xfs,
    Btrfs,
}

impl Fs {
    pub const ALL: [Fs; 3] = [Fs::Ext4, Fs::Xfs, Fs::Btrfs];

    pub fn name(self) -> &'static str {
        match self {
            Fs::Ext4 => "ext4",
            Fs::Xfs => "xfs",
            Fs::Btrfs => "btrfs",
        }
    }

    /// The image size: each file system's minimum with room for the
    /// workloads (XFS refuses less than 300 MiB).
    pub fn image_mib(self) -> u64 {
        match self {
            Fs::Ext4 => 64,
            Fs::Xfs => 320,
            Fs::Btrfs => 128,
        }
    }

    fn mkfs(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Fs::Ext4 => ("mkfs.ext4", &["-F", "-q", "-b", "4096"]),
            Fs::Xfs => ("mkfs.xfs", &["-f", "-q", "-s", "size=4096"]),
            Fs::Btrfs => ("mkfs.btrfs", &["-f", "-q"]),
        }
    }

    /// Mount options of a check's mount: XFS refuses a second file system
    /// with a UUID it has seen mounted unless told.
    fn check_options(self) -> &'static str {
        match self {
            Fs::Xfs => "loop,nouuid",
            _ => "loop",
        }
    }

    /// The file system's own checker, read-only, on an image file:
    /// command and arguments before the path.
    fn fsck(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Fs::Ext4 => ("e2fsck", &["-f", "-n"]),
            Fs::Xfs => ("xfs_repair", &["-n", "-f"]),
            Fs::Btrfs => ("btrfs", &["check", "--readonly"]),
        }
    }

    pub fn parse(s: &str) -> Option<Fs> {
        Fs::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// Why this machine cannot run a replay on `fs`, or `None` where it can:
/// root, `/dev/fuse`, loop devices, `mkfs` and the checker.
pub fn missing(fs: Fs) -> Option<String> {
    if !cfg!(target_os = "linux") {
        return Some("crash replay needs Linux (FUSE and loop devices)".into());
    }
    if !is_root() {
        return Some("crash replay mounts file systems and loop devices: it needs root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse (FUSE is not available)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control (no loop devices)".into());
    }
    for tool in [fs.mkfs().0, fs.fsck().0, "losetup", "mount", "umount"] {
        if !on_path(tool) {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// Whether the effective user is root (`/proc/self/status`).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
            .unwrap_or(false)
    })
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Runs `cmd args`; its stderr (and stdout) in the error.
pub fn run(cmd: &str, args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{cmd} {args:?}: {}: {}", out.status, text.trim()))
    }
}

/// The device byte ranges that hold the data of the regular files in
/// `dir` (a mounted file system's root, not recursive), as FIEMAP
/// reports them after syncing each file (`filefrag -s -v -b512`). Empty
/// for btrfs, whose FIEMAP offsets are its own logical addresses, not the
/// device's.
///
/// Errors: reading `dir`, or `filefrag` failing or printing an extent
/// line it cannot parse.
pub fn data_extents(fs: Fs, dir: &Path) -> Result<Vec<std::ops::Range<u64>>, String> {
    if fs == Fs::Btrfs {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        if !e.file_type().map_err(|e| format!("{e}"))?.is_file() {
            continue;
        }
        let path = e.path();
        let text = run(
            "filefrag",
            &[
                "-s".as_ref(),
                "-v".as_ref(),
                "-b512".as_ref(),
                path.as_os_str(),
            ],
        )?;
        out.extend(parse_filefrag(&text)?);
    }
    out.sort_by_key(|r| r.start);
    Ok(out)
}

/// The extents of `filefrag -v -b512` output, in device bytes: lines
/// `N: logical..logical: physical..physical: length: [expected:] flags`,
/// those with no place on the device yet (`unknown_loc`, `delalloc`,
/// `inline`) left out.
fn parse_filefrag(text: &str) -> Result<Vec<std::ops::Range<u64>>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').map(str::trim).collect();
        let is_extent =
            fields.len() >= 4 && fields[0].parse::<u64>().is_ok() && fields[1].contains("..");
        if !is_extent {
            continue;
        }
        if ["unknown_loc", "delalloc", "inline"]
            .iter()
            .any(|f| line.contains(f))
        {
            continue;
        }
        let bad = || format!("filefrag: an extent line not understood: {line:?}");
        let (start, _) = fields[2].split_once("..").ok_or_else(bad)?;
        let start: u64 = start.trim().parse().map_err(|_| bad())?;
        let len: u64 = fields[3].parse().map_err(|_| bad())?;
        out.push(start * 512..(start + len) * 512);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn filefrag_extents_are_read_in_device_bytes() {
        let text = "Filesystem type is: ef53
File size of /m/pages.db is 1069056 (2088 blocks of 512 bytes)
 ext:     logical_offset:        physical_offset: length:   expected: flags:
   0:        0..      39:     293768..    293807:     40:
   1:       40..    2087:     300000..    302047:   2048:     293808: last,unwritten,eof
   2:     2088..    2095:          0..         7:      8:             unknown_loc,delalloc
/m/pages.db: 2 extents found
";
        let got = super::parse_filefrag(text).unwrap();
        assert_eq!(
            got,
            vec![293768 * 512..293808 * 512, 300000 * 512..302048 * 512]
        );
        assert!(super::parse_filefrag("   0:        0..      39:     x..  y:  40:").is_err());
    }
}

/// Makes `fs` on the image file `image` (created, `fs.image_mib()` MiB,
/// sparse).
pub fn mkfs(fs: Fs, image: &Path) -> Result<(), String> {
    let f = std::fs::File::create(image).map_err(|e| format!("{}: {e}", image.display()))?;
    f.set_len(fs.image_mib() << 20)
        .map_err(|e| format!("{}: {e}", image.display()))?;
    drop(f);
    let (cmd, args) = fs.mkfs();
    let mut a: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    a.push(image.as_os_str());
    run(cmd, &a).map(|_| ())
}

/// The file system's checker on the image file `image` (not mounted).
/// `Err` with its report if it found a problem.
pub fn fsck(fs: Fs, image: &Path) -> Result<(), String> {
    let (cmd, args) = fs.fsck();
    let mut a: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    a.push(image.as_os_str());
    run(cmd, &a).map(|_| ())
}

/// What a guard set up, for the Ctrl-C handler.
#[derive(Debug, Clone)]
enum Held {
    Mount(PathBuf),
    Loop(PathBuf),
}

static HELD: Mutex<Vec<(u64, Held)>> = Mutex::new(Vec::new());
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn hold(h: Held) -> u64 {
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    HELD.lock().unwrap_or_else(|p| p.into_inner()).push((id, h));
    id
}

fn release(id: u64) {
    HELD.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(i, _)| *i != id);
}

fn undo(h: &Held) {
    match h {
        Held::Mount(dir) => {
            if run("umount", &[dir.as_os_str()]).is_err() {
                let _ = run("umount", &["-l".as_ref(), dir.as_os_str()]);
            }
        }
        Held::Loop(dev) => {
            let _ = run("losetup", &["-d".as_ref(), dev.as_os_str()]);
        }
    }
}

/// Installs a Ctrl-C (and SIGTERM) handler that undoes every mount and
/// loop device still held, newest first, then exits with status 130.
/// Once per process; later calls do nothing.
pub fn undo_on_interrupt() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            let held: Vec<Held> = HELD
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .rev()
                .map(|(_, h)| h.clone())
                .collect();
            for h in &held {
                undo(h);
            }
            eprintln!("interrupted: {} mounts and loop devices undone", held.len());
            std::process::exit(130);
        });
    });
}

/// A loop device over a file, detached on drop.
pub struct LoopDev {
    dev: PathBuf,
    id: u64,
}

impl LoopDev {
    /// `losetup --find --show --direct-io=off --sector-size 4096 file`:
    /// a device of 4 KiB sectors (the unit a device writes whole).
    pub fn attach(file: &Path) -> Result<LoopDev, String> {
        let out = run(
            "losetup",
            &[
                "--find".as_ref(),
                "--show".as_ref(),
                "--direct-io=off".as_ref(),
                "--sector-size".as_ref(),
                SECTOR.to_string().as_ref(),
                file.as_os_str(),
            ],
        )?;
        let dev = PathBuf::from(out.trim());
        let id = hold(Held::Loop(dev.clone()));
        Ok(LoopDev { dev, id })
    }

    pub fn path(&self) -> &Path {
        &self.dev
    }
}

impl LoopDev {
    /// Detaches the device and waits (up to 10 s) until it let go of its
    /// file.
    pub fn detach(self) -> Result<(), String> {
        let name = self
            .dev
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let backing = PathBuf::from(format!("/sys/block/{name}/loop/backing_file"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let _ = run("losetup", &["-d".as_ref(), self.dev.as_os_str()]);
        while backing.exists() {
            if std::time::Instant::now() > deadline {
                return Err(format!("{} still attached after 10 s", self.dev.display()));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        undo(&Held::Loop(self.dev.clone()));
        release(self.id);
    }
}

/// A mounted file system, unmounted on drop (lazily if it is busy).
pub struct Mounted {
    dir: PathBuf,
    id: u64,
    done: bool,
}

impl Mounted {
    /// `mount -t fs source dir` (`options` with `-o` if not empty).
    pub fn mount(fs: Fs, source: &Path, dir: &Path, options: &str) -> Result<Mounted, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut a: Vec<&std::ffi::OsStr> = vec!["-t".as_ref(), fs.name().as_ref()];
        if !options.is_empty() {
            a.push(std::ffi::OsStr::new("-o"));
            a.push(std::ffi::OsStr::new(options));
        }
        a.push(source.as_os_str());
        a.push(dir.as_os_str());
        run("mount", &a)?;
        let id = hold(Held::Mount(dir.to_path_buf()));
        Ok(Mounted {
            dir: dir.to_path_buf(),
            id,
            done: false,
        })
    }

    /// The mount of a replayed image for a check (`-o loop`, the loop
    /// device going with the unmount).
    pub fn check_mount(fs: Fs, image: &Path, dir: &Path) -> Result<Mounted, String> {
        Mounted::mount(fs, image, dir, fs.check_options())
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Unmounts, trying again for up to 10 s while the file system is
    /// busy (an io_uring ring's teardown runs after its owner closed it,
    /// and holds the files it used until then); reports a failure (the
    /// guard then unmounts lazily).
    pub fn unmount(mut self) -> Result<(), String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match run("umount", &[self.dir.as_os_str()]) {
                Ok(_) => {
                    self.done = true;
                    release(self.id);
                    return Ok(());
                }
                Err(e) if e.contains("busy") && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if !self.done {
            undo(&Held::Mount(self.dir.clone()));
            release(self.id);
        }
    }
}
