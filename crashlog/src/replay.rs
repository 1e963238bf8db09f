//! Rebuilding the device as a power cut would leave it.
//!
//! A flush point is a good flush record: every write logged before it is
//! on stable media. The state at flush point `k` is the image before the
//! log plus every write before that flush, in log order. A state between
//! flush `k` and the next adds any subset of the writes logged between
//! them, each cut at the device's sectors (4 KiB: the device may have
//! kept any sector of any write it had not been asked to flush yet),
//! still in log order. A failed flush is no flush point: what was written before it
//! may or may not be there, which the states after the last good flush
//! cover.
//!
//! A commit acknowledged at a mark needed a flush that completed before
//! the mark was written (the workload writes it after its `fdatasync`
//! returned, and the logger serves requests one at a time), so every
//! state from the last good flush before the mark on must hold it:
//! [`Replayer::acked`] gives, for a state, the marks before the next good
//! flush after it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use std::ops::Range;

use crate::log::{Kind, Log};
use crate::system::{FINE_SECTOR, SECTOR};

/// One replayed state (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Records before this index are applied (writes) or passed: a good
    /// flush's index, or 0 for the device as it was before the log.
    pub at: usize,
    /// `Some(seed)`: a subset of the writes between `at` and the next good
    /// flush, drawn from `seed`, applied too.
    pub torn: Option<u64>,
}

/// Builds the images of states, in increasing order of `at`.
pub struct Replayer<'a> {
    log: &'a Log,
    /// The image with every write before `applied` applied.
    cur: File,
    cur_path: PathBuf,
    applied: usize,
    flushes: Vec<usize>,
    /// Device byte ranges cut at [`FINE_SECTOR`] in torn states, sorted.
    fine: Vec<Range<u64>>,
}

impl<'a> Replayer<'a> {
    /// A replayer of `log` over a copy of `base` (the device before the
    /// log), kept at `work`.
    ///
    /// Errors: copying `base`.
    pub fn new(log: &'a Log, base: &Path, work: &Path) -> Result<Replayer<'a>, String> {
        let cur_path = work.join("replay-state.img");
        sparse_copy(base, &cur_path)?;
        let cur = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&cur_path)
            .map_err(|e| format!("{}: {e}", cur_path.display()))?;
        Ok(Replayer {
            log,
            cur,
            cur_path,
            applied: 0,
            flushes: log.flushes(),
            fine: Vec::new(),
        })
    }

    /// Torn states cut writes into `ranges` (device bytes: the page file's
    /// data blocks) at [`FINE_SECTOR`], the rest at [`SECTOR`].
    pub fn fine_sectors(&mut self, mut ranges: Vec<Range<u64>>) {
        ranges.sort_by_key(|r| r.start);
        self.fine = ranges;
    }

    /// The sector of the device byte at `offset`: its first byte and
    /// length.
    fn sector_of(&self, offset: u64) -> (u64, u64) {
        let i = self.fine.partition_point(|r| r.end <= offset);
        if self.fine.get(i).is_some_and(|r| r.start <= offset) {
            (offset - offset % FINE_SECTOR, FINE_SECTOR)
        } else {
            (offset - offset % SECTOR, SECTOR)
        }
    }

    /// The good flush points: every state's `at` is 0 or one of these.
    pub fn flush_points(&self) -> &[usize] {
        &self.flushes
    }

    /// The index of the next good flush after `at` (or the log's end).
    pub fn next_flush(&self, at: usize) -> usize {
        self.flushes
            .iter()
            .copied()
            .find(|&f| f > at)
            .unwrap_or(self.log.records.len())
    }

    /// The acknowledged commits every image of `state` must hold: the
    /// marks logged before the next good flush after it.
    ///
    /// Errors: a mark that is not `ack N` lines.
    pub fn acked(&self, state: State) -> Result<Vec<usize>, String> {
        let end = self.next_flush(state.at);
        let mut acked = Vec::new();
        for r in &self.log.records[..end] {
            if r.kind != Kind::Mark {
                continue;
            }
            let text = self
                .log
                .payload(r)
                .map_err(|e| format!("reading a mark: {e}"))?;
            for line in String::from_utf8_lossy(&text).lines() {
                match line.strip_prefix("ack ").map(str::parse::<usize>) {
                    Some(Ok(n)) => acked.push(n),
                    _ => return Err(format!("a mark that is not \"ack N\": {line:?}")),
                }
            }
        }
        Ok(acked)
    }

    /// Writes the image of `state` to `out` (replaced). States must come
    /// in increasing order of `at`.
    ///
    /// Errors: reading the log, writing the images, or a state before the
    /// last one built.
    pub fn build(&mut self, state: State, out: &Path) -> Result<(), String> {
        if state.at < self.applied {
            return Err(format!(
                "states out of order: {} after {}",
                state.at, self.applied
            ));
        }
        for i in self.applied..state.at {
            let r = self.log.records[i];
            if r.kind == Kind::Write {
                let bytes = self.log.payload(&r).map_err(|e| format!("log: {e}"))?;
                self.cur
                    .write_all_at(&bytes, r.offset)
                    .map_err(|e| format!("{}: {e}", self.cur_path.display()))?;
            }
        }
        self.applied = state.at;
        sparse_copy(&self.cur_path, out)?;
        if let Some(seed) = state.torn {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(out)
                .map_err(|e| format!("{}: {e}", out.display()))?;
            let mut rng = seed | 1;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let end = self.next_flush(state.at);
            for r in &self.log.records[state.at..end] {
                if r.kind != Kind::Write {
                    continue;
                }
                // Whole, dropped, or sector by sector.
                let how = next() % 3;
                if how == 1 {
                    continue;
                }
                let bytes = self.log.payload(r).map_err(|e| format!("log: {e}"))?;
                // One draw per sector; a write is a whole number of 4 KiB
                // sectors, each of one size.
                let mut at = 0u64;
                while at < bytes.len() as u64 {
                    let (start, len) = self.sector_of(r.offset + at);
                    let len = (start + len - (r.offset + at)).min(bytes.len() as u64 - at);
                    let keep = how == 0 || next() % 2 == 1;
                    if keep {
                        let chunk = &bytes[at as usize..(at + len) as usize];
                        f.write_all_at(chunk, r.offset + at)
                            .map_err(|e| format!("{}: {e}", out.display()))?;
                    }
                    at += len;
                }
            }
        }
        Ok(())
    }
}

/// Copies `from` to `to` keeping holes (`cp --sparse=auto`: holes found with SEEK_HOLE).
pub fn sparse_copy(from: &Path, to: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(to);
    crate::system::run(
        "cp",
        &[
            "--sparse=auto".as_ref(),
            "--reflink=never".as_ref(),
            from.as_os_str(),
            to.as_os_str(),
        ],
    )
    .map(|_| ())
}
