//! Commits: each `sync` goes the way the chooser picks, a group commit
//! round (`group.rs`) or a direct commit (`direct.rs`), and its latency
//! goes back to the chooser (`chooser.rs`).
//!
//! Owns: the group commit machinery, the chooser, and how many commits
//! are under way (a hint for large writes, never part of a promise:
//! [`Commit::busy`]). Calls: the flush
//! pipeline (through either way). Lock order: as `group.rs` (the commit
//! lock is taken before any other and released around I/O); a direct
//! commit takes no lock of its own; the chooser's lock is a leaf.
//!
//! The two ways can run at once (`Auto` switches between epochs while
//! calls of the last epoch finish): both follow the same rules, a flush
//! covers every generation drained before it and an `fdatasync` covers
//! the `write_seq` read when it began, so a round and a direct commit
//! never tell a caller durable what is not. A group round skips its
//! `fdatasync` when a completed one already covers its writes, whoever
//! made it.

use std::time::Instant;

use super::chooser::{Chooser, CommitStrategy, Way};
use super::direct;
use super::flush::FlushPipeline;
use super::group::GroupCommit;
use super::parts::Parts;
use super::stats::add;
use crate::error::Result;
use crate::sync::AtomicUsize;

/// The commit component of one file (see the module docs).
pub(crate) struct Commit {
    group: GroupCommit,
    chooser: Chooser,
    /// Calls of [`sync`](Commit::sync) under way (relaxed: a hint).
    under_way: AtomicUsize,
}

/// Counts a [`Commit::sync`] call as under way until dropped.
struct UnderWay<'a>(&'a AtomicUsize);

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Commit {
    /// Commits as `strategy` says; group rounds shaped by
    /// `rounds_in_flight` and `commit_dsync`.
    pub(crate) fn new(
        strategy: CommitStrategy,
        rounds_in_flight: usize,
        commit_dsync: bool,
    ) -> Self {
        Self {
            group: GroupCommit::new(rounds_in_flight, commit_dsync),
            chooser: Chooser::new(strategy),
            under_way: AtomicUsize::new(0),
        }
    }

    /// Whether a commit of this kind (`sync`, and the scoped commits that
    /// allocate, which are grouped as `sync`'s are) is under way on some
    /// thread: a writer's large write into unwritten space then goes into
    /// the buffer, so its commit joins theirs rather than issuing its own
    /// `fdatasync`. A hint only (relaxed).
    pub(crate) fn busy(&self) -> bool {
        self.under_way.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// A durable commit: returns once everything written before the call
    /// (by any thread) is durable.
    ///
    /// Errors: as the way taken (`GroupCommit::join_round`, `direct::commit`).
    pub(crate) fn sync(&self, p: &Parts<'_>, flush: &FlushPipeline) -> Result<()> {
        self.under_way
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _under_way = UnderWay(&self.under_way);
        let way = self.chooser.way();
        let started = Instant::now();
        match way {
            Way::Group => self.group.join_round(p, flush)?,
            Way::Direct => {
                direct::commit(p, flush)?;
                add(&p.counters.commits, 1);
            }
        }
        self.chooser.record(way, started.elapsed());
        Ok(())
    }

    /// Commits that went the direct way.
    pub(crate) fn direct_commits(&self) -> u64 {
        self.chooser.direct_commits()
    }

    /// Times `Auto` switched ways.
    pub(crate) fn switches(&self) -> u64 {
        self.chooser.switches()
    }
}
