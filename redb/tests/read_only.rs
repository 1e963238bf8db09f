//! A read-only open never asks for write access: redb's
//! `open_read_only_with_backend` on `PagewriterBackend::open_read_only`
//! works on a file the process may only read (mode 0444, as a non-root
//! user) and on a read-only mount, with the default configuration (four
//! sync lanes, O_DIRECT where it fits, io_uring).
//!
//! Linux only: the cases drop root with `setpriv` and remount a loop
//! device read-only.
#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::Command;

use pagewriter_redb::PagewriterBackend;
use redb::{Database, ReadableDatabase, TableDefinition};

const T: TableDefinition<u64, u64> = TableDefinition::new("t");
const ROWS: u64 = 1000;

fn make_db(path: &Path) {
    let db = Database::builder()
        .create_with_backend(PagewriterBackend::open(path).unwrap())
        .unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut t = txn.open_table(T).unwrap();
        for k in 0..ROWS {
            t.insert(k, k * 3).unwrap();
        }
    }
    txn.commit().unwrap();
}

/// Opens `path` read-only through the adapter and checks every row.
fn read_db(path: &Path) -> Result<(), String> {
    let backend = PagewriterBackend::open_read_only(path).map_err(|e| format!("open: {e}"))?;
    let db = Database::builder()
        .open_read_only_with_backend(backend)
        .map_err(|e| format!("redb open: {e}"))?;
    let r = db.begin_read().map_err(|e| e.to_string())?;
    let t = r.open_table(T).map_err(|e| e.to_string())?;
    for k in 0..ROWS {
        match t.get(k).map_err(|e| e.to_string())? {
            Some(v) if v.value() == k * 3 => {}
            other => return Err(format!("row {k}: {:?}", other.map(|v| v.value()))),
        }
    }
    Ok(())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Run as a child (by `read_only_file_as_a_user_without_write_access`):
/// `PW_RO_PATH` names the 0444 file.
#[test]
fn read_only_child() {
    let Some(path) = std::env::var_os("PW_RO_PATH") else {
        return;
    };
    let path = Path::new(&path);
    // This process may not write the file: a read-write open is refused.
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path);
    assert_eq!(
        rw.map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::PermissionDenied,
        "the child can write the file: the test tests nothing"
    );
    read_db(path).unwrap();
    println!("read-only child: {ROWS} rows read");
}

#[test]
fn read_only_file_as_a_user_without_write_access() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.redb");
    make_db(&path);
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if is_root() {
        // root ignores file modes: run the child as nobody, which must be
        // able to reach the file and the test binary.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let out = match cmd
        .args([
            "--exact",
            "read_only_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PW_RO_PATH", &path)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("setpriv unavailable ({e}): test skipped");
            return;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains(&format!("read-only child: {ROWS} rows read")),
        "{text}"
    );
}

#[test]
fn read_only_mount() {
    let base = tempfile::tempdir().unwrap();
    let Some(fs) = pagewriter::testing::ScratchFs::ext4(base.path(), 32) else {
        return;
    };
    let path = fs.path().join("ro.redb");
    make_db(&path);
    let remount = |opt: &str| {
        Command::new("mount")
            .args(["-o", opt])
            .arg(fs.path())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    // The closed database's io_uring ring may keep the file open for
    // writing until the kernel tears it down ("mount point is busy").
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !remount("remount,ro") {
        assert!(
            std::time::Instant::now() < deadline,
            "remount read-only refused for 5 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The mount is read-only: a read-write open is EROFS.
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path);
    assert_eq!(
        rw.map(|_| ()).unwrap_err().raw_os_error(),
        Some(libc::EROFS)
    );
    let res = read_db(&path);
    assert!(remount("remount,rw"), "remount read-write refused");
    res.unwrap();
}
