//! Direct commits ([`CommitStrategy::Direct`](crate::CommitStrategy::Direct),
//! or `Auto` where it measures faster): the caller is its own leader. It
//! drains and writes what is buffered from its own thread (an inline write
//! slot, beside other callers' writes), then makes it durable the
//! leaderless way (`Durability::sync_to`): it returns at once if a
//! completed `fdatasync` covers its writes, waits for one in flight that
//! covers them, or issues its own on a free sync lane.
//!
//! Owns: nothing; a function over [`Parts`] and the flush pipeline. Calls:
//! `FlushPipeline::flush_for_commit` (inline), the sync lanes and the watermark
//! (`Durability`), the doublewrite area (a commit its records make durable
//! needs no `fdatasync`), the lifecycle (poison).
//!
//! Why it is correct (durability: what `sync` returned Ok for survives a
//! crash; an `fdatasync` covers exactly the writes completed before it
//! began):
//! - the flush returns once every generation drained before or with the
//!   caller's own has written, so every page written before the call
//!   (by any thread) has reached the OS, and `pass.seq` counts all those
//!   writes;
//! - an `fdatasync` covers the `write_seq` read when it began
//!   (`Durability::fdatasync_on`), and `fsynced` is the highest such value
//!   among the ones that returned successfully: so `fsynced >= pass.seq`
//!   means an `fdatasync` began after all of this caller's writes
//!   completed and has returned, and the caller needs none of its own
//!   (PostgreSQL's `XLogFlush` returns at once for a record already
//!   flushed, the same rule). One in flight that covers `pass.seq` began
//!   after those writes too: waiting for it is enough;
//! - a failed `fdatasync` poisons the file; a caller that sees the poison
//!   before it returns reports it, so no caller is told durable past a
//!   failed `fdatasync` (it may have lost pages another caller wrote).

use super::flush::FlushPipeline;
use super::flush_mode::FlushMode;
use super::parts::Parts;
use crate::error::{Error, Result};

/// One direct commit (see the module docs).
///
/// Errors: [`Error::Poisoned`]; a write error of this caller's flush (its
/// failed pages stay dirty; the rest were still synced); the `fdatasync`'s
/// (the file is poisoned; the batch's pages go back to the write buffer).
pub(crate) fn commit(p: &Parts<'_>, flush: &FlushPipeline) -> Result<()> {
    if p.life.is_poisoned() {
        return Err(Error::Poisoned);
    }
    let pass = flush.flush_for_commit(p, FlushMode::DIRECT);
    // Doublewrite: every change since the last fdatasync is in a durable
    // record (see `group.rs`, the same rule).
    let by_area = p.torn.area().is_some() && pass.unstaged_at <= p.durability.fsynced();
    let synced = if by_area {
        Ok(())
    } else {
        p.durability.sync_to(pass.seq)
    };
    match synced {
        Ok(()) => {
            if let Some(b) = pass.batch {
                flush.settle(p, b);
            }
        }
        Err(e) => {
            if let Some(b) = pass.batch {
                flush.settle_failed(p, b);
            }
            // Writers waiting for room would wait for a settle that frees
            // nothing: wake them to see the poison.
            p.buffer.notify_room();
            return Err(e);
        }
    }
    if let Some(e) = pass.error {
        return Err(e);
    }
    if p.life.is_poisoned() {
        return Err(Error::Poisoned);
    }
    Ok(())
}
