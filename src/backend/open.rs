//! Opening a [`FileBackend`] with the `O_DIRECT` policy every user of a
//! file shares (the cached file, the streaming writer, the I/O worker):
//! asked for and refused is an error, `Auto` and refused is a reported
//! fallback to buffered I/O.

use super::engine::DirectIo;
use super::file::{FileBackend, OpenOptions};
use crate::error::{Error, Result, short_error};

/// Opens `path` (created if missing, never truncated) with `O_DIRECT` as
/// `direct` asks. `misfit` says why an `O_DIRECT` file cannot serve the
/// caller's sizes, if so: with `On` that is an [`Error::InvalidConfig`]
/// ("O_DIRECT: why"), with `Auto` the file is reopened buffered. Returns
/// the backend and, for `Auto` falling back to buffered, why.
///
/// Shared by the cached file and the tools that bypass it (the streaming
/// writer, the I/O worker), so all decide and report `O_DIRECT` the same
/// way.
///
/// Errors: [`Error::Open`] with op "open" or "open O_DIRECT", naming
/// `path`;
/// [`Error::InvalidConfig`] with `On` and a misfit;
/// [`Error::Unsupported`] with `On` on a platform without direct I/O.
pub fn open_with_direct(
    path: &std::path::Path,
    direct: DirectIo,
    misfit: &dyn Fn(&FileBackend) -> Option<String>,
) -> Result<(FileBackend, Option<String>)> {
    open_with_options(path, &OpenOptions::new().lock(false), direct, misfit)
}

/// [`open_with_direct`] with access, creation and locking as `options`
/// say. A lock held elsewhere is [`Error::Locked`].
pub fn open_with_options(
    path: &std::path::Path,
    options: &OpenOptions,
    direct: DirectIo,
    misfit: &dyn Fn(&FileBackend) -> Option<String>,
) -> Result<(FileBackend, Option<String>)> {
    let open = |direct: bool, op: &'static str| {
        FileBackend::open_with(path, options, direct).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                Error::Locked
            } else {
                Error::open(op, path, e)
            }
        })
    };
    let buffered = || open(false, "open");
    let Some(name) = super::sys::PLATFORM.direct_io else {
        return match direct {
            DirectIo::Off => Ok((buffered()?, None)),
            DirectIo::On => Err(Error::Unsupported {
                setting: "DirectIo::On",
                platform: super::sys::PLATFORM.os,
                why: "no direct I/O call here (O_DIRECT, F_NOCACHE)".into(),
            }),
            DirectIo::Auto => Ok((
                buffered()?,
                Some(format!("no direct I/O on {}", super::sys::PLATFORM.os)),
            )),
        };
    };
    match direct {
        DirectIo::Off => Ok((buffered()?, None)),
        DirectIo::On => {
            let b = open(true, "open O_DIRECT")?;
            match misfit(&b) {
                Some(why) => Err(Error::InvalidConfig(format!("{name}: {why}"))),
                None => Ok((b, None)),
            }
        }
        DirectIo::Auto => match open(true, "open O_DIRECT") {
            Ok(b) => match misfit(&b) {
                None => Ok((b, None)),
                Some(why) => {
                    drop(b);
                    Ok((buffered()?, Some(why)))
                }
            },
            Err(Error::Open { source: e, .. }) => Ok((
                buffered()?,
                Some(format!("{name} refused: {}", short_error(&e))),
            )),
            Err(other) => Err(other),
        },
    }
}
