//! Group commit: many `sync()` callers, one flush and one `fdatasync`.
//!
//! Each caller takes a ticket under the commit lock. Whatever it wrote
//! before that moment is in the write buffer or already on the OS. A round
//! led by one caller covers every ticket issued before the round started:
//! its drain begins after those tickets were taken, so it writes their pages,
//! and its `fdatasync` covers what earlier flushes put on the OS. When the
//! round succeeds, `durable` moves to the round's last ticket and every
//! caller at or below it returns `Ok`; callers that arrived during the round
//! wait, and one of them leads the next.

use parking_lot::MutexGuard;

use super::PagedCachedFile;
use super::stats::add;
use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub(crate) struct CommitState {
    /// Last ticket handed out.
    next_ticket: u64,
    /// Every ticket at or below this one is durable.
    durable: u64,
    /// Last ticket covered by a finished round (successful or not).
    round_end: u64,
    /// A round is running.
    leader: bool,
    /// The latest failed round: tickets in `(lo, hi]` get its error.
    failure: Option<(u64, u64, Error)>,
}

impl PagedCachedFile {
    pub(super) fn group_commit(&self) -> Result<()> {
        let mut st = self.commit.lock();
        st.next_ticket += 1;
        let ticket = st.next_ticket;
        loop {
            if st.durable >= ticket {
                add(&self.counters.commits, 1);
                return Ok(());
            }
            if let Some((lo, hi, e)) = &st.failure {
                if *lo < ticket && ticket <= *hi {
                    return Err(e.duplicate());
                }
            }
            if self.is_poisoned() {
                return Err(Error::Poisoned);
            }
            if st.leader {
                self.commit_done.wait(&mut st);
                continue;
            }
            st.leader = true;
            let (lo, hi) = (st.round_end, st.next_ticket);
            let result = MutexGuard::unlocked(&mut st, || self.flush_and_sync());
            st.leader = false;
            st.round_end = hi;
            add(&self.counters.commit_rounds, 1);
            self.counters
                .max_commit_group
                .fetch_max(hi - lo, std::sync::atomic::Ordering::Relaxed);
            let outcome = match result {
                Ok(()) => {
                    st.durable = hi;
                    add(&self.counters.commits, 1);
                    Ok(())
                }
                Err(e) => {
                    st.failure = Some((lo, hi, e.duplicate()));
                    Err(e)
                }
            };
            self.commit_done.notify_all();
            return outcome;
        }
    }
}
