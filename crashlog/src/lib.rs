//! Crash replay below the file system, for pagewriter's tests: a write
//! logger that serves a block device image over FUSE (a loop device on
//! top turns the block layer's writes and cache flushes into FUSE writes
//! and `fsync`s, logged in order), workloads on a file system made on that
//! device, and a replayer that rebuilds the device as a power cut at each
//! flush point (or between two, with the writes since in any subset) would
//! leave it, mounts it (the file system recovers its journal), opens the
//! page file and checks every acknowledged commit, torn pages, the
//! file's length and `fsck`.
//!
//! See `.project/crash-replay.md` for what the kernel sends and why the
//! log's order is a faithful model.

pub mod expect;
pub mod families;
pub mod log;
pub mod replay;
pub mod run;
pub mod serve;
pub mod system;
pub mod workload;
