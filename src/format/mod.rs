//! The on-disk records a file writes beside its pages, and reading them
//! back at open: the doublewrite area's records ([`doublewrite`]) and
//! grow-ahead's trailer ([`trailer`]). Each is a byte layout with a
//! checksum and the recovery scan over it; the cached file writes them
//! while open (`cached_file::torn`, `cached_file::grow`) and runs the
//! scans before anything else is written.

pub(crate) mod doublewrite;
pub(crate) mod trailer;
