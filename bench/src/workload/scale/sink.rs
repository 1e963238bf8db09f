//! Where a `scale` writer thread's transactions go and how they commit
//! ([`CommitKind`]): through the shared file (`sync`, `flush`), or through
//! a [`Writer`] of the thread's own (`scoped`, `async:N`, which keeps up to
//! N tickets in flight and waits for the oldest when it has that many).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pagewriter::{CommitTicket, PagedCachedFile, WritablePage, Writer};

use super::CommitKind;
use crate::error::Result;

/// One writer thread's way into the file (see the module docs).
pub(super) enum Sink<'a> {
    File {
        file: &'a PagedCachedFile,
        commit: CommitKind,
    },
    Writer {
        writer: Writer<'a>,
        /// Tickets kept in flight at most (1 for `scoped`, whose commits
        /// block).
        in_flight: Option<usize>,
        /// Commits started and their start times, oldest first.
        tickets: VecDeque<(CommitTicket, Instant)>,
    },
}

impl<'a> Sink<'a> {
    pub(super) fn new(file: &'a PagedCachedFile, commit: CommitKind) -> Self {
        match commit {
            CommitKind::Sync | CommitKind::Flush => Sink::File { file, commit },
            CommitKind::Scoped | CommitKind::Through => Sink::Writer {
                writer: file.writer(),
                in_flight: None,
                tickets: VecDeque::new(),
            },
            CommitKind::Async { in_flight } => Sink::Writer {
                writer: file.writer(),
                in_flight: Some(in_flight.max(1)),
                tickets: VecDeque::with_capacity(in_flight + 1),
            },
        }
    }

    /// A zeroed guard over `len` bytes at `offset` (`overwrite`).
    pub(super) fn overwrite(&mut self, offset: u64, len: usize) -> Result<WritablePage<'_>> {
        Ok(match self {
            Sink::File { file, .. } => file.overwrite(offset, len)?,
            Sink::Writer { writer, .. } => writer.overwrite(offset, len)?,
        })
    }

    /// Whole pages at `offset`: `write_page`, or with `bytes`
    /// `write_all_at` (an engine's bytes from its own buffer).
    pub(super) fn write(&mut self, offset: u64, data: &[u8], bytes: bool) -> Result<()> {
        match (self, bytes) {
            (Sink::File { file, .. }, false) => file.write_page(offset, data)?,
            (Sink::File { file, .. }, true) => file.write_all_at(offset, data)?,
            (Sink::Writer { writer, .. }, false) => writer.write_page(offset, data)?,
            (Sink::Writer { writer, .. }, true) => writer.write_all_at(offset, data)?,
        }
        Ok(())
    }

    /// Ends a transaction as the commit kind says; records the latency
    /// of every commit that completed (µs: `wrote`, the time its page
    /// writes took, plus the commit's own) and returns how many did.
    pub(super) fn commit(&mut self, wrote: Duration, latency: &mut Histogram<u64>) -> Result<u64> {
        let record = |latency: &mut Histogram<u64>, t0: Instant| {
            latency.saturating_record(t0.elapsed().as_micros().max(1) as u64);
        };
        // Started `wrote` ago, as far as its latency goes.
        let t0 = Instant::now()
            .checked_sub(wrote)
            .unwrap_or_else(Instant::now);
        match self {
            Sink::File { file, commit } => {
                match commit {
                    CommitKind::Flush => file.flush()?,
                    _ => file.sync()?,
                }
                record(latency, t0);
                Ok(1)
            }
            Sink::Writer {
                writer,
                in_flight: None,
                ..
            } => {
                writer.commit()?;
                record(latency, t0);
                Ok(1)
            }
            Sink::Writer {
                writer,
                in_flight: Some(n),
                tickets,
            } => {
                tickets.push_back((writer.commit_async()?, t0));
                let mut done = 0;
                while tickets.len() >= *n {
                    let (ticket, started) = tickets.pop_front().expect("not empty");
                    ticket.wait()?;
                    record(latency, started);
                    done += 1;
                }
                Ok(done)
            }
        }
    }

    /// Writes whole pages at `offset` and ends the transaction with them
    /// (`Writer::write_and_commit`, timed whole as a commit's latency);
    /// returns the commits that completed. Kinds without a writer of
    /// their own write, then commit as [`commit`](Self::commit) does.
    pub(super) fn write_and_commit(
        &mut self,
        offset: u64,
        data: &[u8],
        wrote: Duration,
        latency: &mut Histogram<u64>,
    ) -> Result<u64> {
        match self {
            Sink::Writer {
                writer,
                in_flight: None,
                ..
            } => {
                let t0 = Instant::now()
                    .checked_sub(wrote)
                    .unwrap_or_else(Instant::now);
                writer.write_and_commit(offset, data)?;
                latency.saturating_record(t0.elapsed().as_micros().max(1) as u64);
                Ok(1)
            }
            _ => {
                let t0 = Instant::now();
                self.write(offset, data, true)?;
                self.commit(wrote + t0.elapsed(), latency)
            }
        }
    }

    /// Waits for the commits still in flight; returns how many.
    pub(super) fn finish(&mut self, latency: &mut Histogram<u64>) -> Result<u64> {
        let Sink::Writer { tickets, .. } = self else {
            return Ok(0);
        };
        let mut done = 0;
        while let Some((ticket, started)) = tickets.pop_front() {
            ticket.wait()?;
            latency.saturating_record(started.elapsed().as_micros().max(1) as u64);
            done += 1;
        }
        Ok(done)
    }
}
