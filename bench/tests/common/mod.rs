//! The harness of the CLI tests that make file systems (libtest-mimic,
//! `harness = false`): a test whose file system this machine cannot make
//! is reported as ignored, with the reason printed, not as passed; with
//! `PAGEWRITER_REQUIRE_FS` set it runs regardless, and fails.
#![allow(dead_code)]

use pagewriter::testing::FsKind;

/// A test on a file system of `kind` made for it.
pub fn fs_trial(
    name: &str,
    kind: FsKind,
    f: impl FnOnce() + Send + 'static,
) -> libtest_mimic::Trial {
    let ignored = kind.missing().is_some() && std::env::var_os("PAGEWRITER_REQUIRE_FS").is_none();
    trial(name, f).with_ignored_flag(ignored)
}

/// A plain test (a panic fails it).
pub fn trial(name: &str, f: impl FnOnce() + Send + 'static) -> libtest_mimic::Trial {
    libtest_mimic::Trial::test(name, move || {
        f();
        Ok(())
    })
}

/// Prints why the tests on each kind this machine cannot make are ignored.
pub fn print_fs_reasons(kinds: &[FsKind]) {
    if std::env::var_os("PAGEWRITER_REQUIRE_FS").is_some() {
        return;
    }
    for k in kinds {
        if let Some(why) = k.missing() {
            println!("ignored: the tests on {} ({why})", k.name());
        }
    }
}

/// Panics where a file system could not be made and the run requires it.
pub fn require_fs(kind: FsKind) {
    if std::env::var_os("PAGEWRITER_REQUIRE_FS").is_some() {
        panic!(
            "{}: could not be made or mounted, and PAGEWRITER_REQUIRE_FS is set",
            kind.name()
        );
    }
}
