//! The io_uring engine's interface where there is no io_uring (not Linux,
//! or built without the `io-uring` feature): [`SlotRing::new`] always
//! fails, so no ring exists and the writer's ring arms are never reached.
//! It keeps the platform out of `cached_file/`, which is written once
//! against this interface and the real one (`ring/`).

use std::fs::File;
use std::io::{self, IoSlice};

use super::storage::UringFault;
use crate::buffer::AlignedBuf;

/// As the real ring's: the test fail point.
pub(crate) type FaultHook<'a> = Option<&'a dyn Fn(u64, usize) -> Option<UringFault>>;

/// As the real ring's options (the fields the cached file sets).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingOptions {
    pub(crate) queue_depth: u32,
    pub(crate) fixed_buffers: bool,
    pub(crate) single_issuer: bool,
}

impl RingOptions {
    pub(crate) fn new(queue_depth: u32) -> Self {
        Self {
            queue_depth,
            fixed_buffers: true,
            single_issuer: true,
        }
    }
}

/// Why there is no ring: always `Unsupported`.
#[derive(Debug)]
pub(crate) struct RingSetupError {
    pub(crate) stage: &'static str,
    pub(crate) source: io::Error,
}

impl From<RingSetupError> for io::Error {
    fn from(e: RingSetupError) -> Self {
        e.source
    }
}

/// Where a vectored transfer's bytes are, and at which file offset.
#[expect(dead_code, reason = "made by the writer, read by no ring here")]
pub(crate) struct VectoredRun<'a, 'b> {
    pub(crate) offset: u64,
    pub(crate) bufs: &'a [IoSlice<'b>],
}

/// A copied write of `len` bytes at file `offset`.
#[derive(Clone, Copy)]
#[expect(dead_code, reason = "made by the writer, read by no ring here")]
pub(crate) struct CopyJob {
    pub(crate) offset: u64,
    pub(crate) len: usize,
}

/// No value of this type exists: [`new`](Self::new) always fails.
#[derive(Debug)]
pub(crate) enum SlotRing {}

impl SlotRing {
    /// Fails: `Unsupported`, saying why there is no io_uring here.
    pub(crate) fn new(
        _file: &File,
        opts: RingOptions,
        _bufs: Vec<AlignedBuf>,
    ) -> Result<Self, RingSetupError> {
        let _ = (opts.queue_depth, opts.fixed_buffers, opts.single_issuer);
        let why = if cfg!(target_os = "linux") {
            "built without the io-uring feature".to_string()
        } else {
            format!(
                "io_uring is a Linux interface; this is {}",
                std::env::consts::OS
            )
        };
        Err(RingSetupError {
            stage: "io_uring setup",
            source: io::Error::new(io::ErrorKind::Unsupported, why),
        })
    }

    pub(crate) fn enter_calls(&self) -> u64 {
        match *self {}
    }

    pub(crate) fn set_atomic(&mut self, _on: bool) {
        match *self {}
    }

    pub(crate) fn write_vectored(
        &mut self,
        _runs: &[VectoredRun<'_, '_>],
        _errors: &mut Vec<Option<io::Error>>,
        _fault: FaultHook<'_>,
    ) -> io::Result<()> {
        match *self {}
    }

    pub(crate) fn write_copied(
        &mut self,
        _jobs: &[CopyJob],
        _fill: &mut dyn FnMut(usize, &mut [u8]),
        _errors: &mut Vec<Option<io::Error>>,
        _fault: FaultHook<'_>,
    ) -> io::Result<()> {
        match *self {}
    }
}
