//! Which way a `sync` goes: a group commit round, or a direct commit
//! (the caller writes what it drained and `fdatasync`s itself, unless a
//! completed `fdatasync` already covers its writes). [`CommitStrategy`]
//! pins one; `Auto` measures both while the file is used and keeps the
//! faster.
//!
//! Owns: the pinned or current way (an atomic read by every `sync`), the
//! running epoch's counters (atomics), and the decision state (a leaf
//! lock, taken once per epoch by the call that ends it). Calls: nothing.
//!
//! How `Auto` decides. Time is cut into epochs of [`EPOCH_COMMITS`]
//! commits (or [`EPOCH_MAX`], whichever ends first); an epoch runs one
//! way, and the mean latency of the `sync` calls that ran that way is its
//! score (in a closed loop of committers, lower latency is higher
//! throughput; in an open loop it is what the callers feel). After
//! [`PROBE_EVERY`] epochs of the incumbent way, one epoch probes the other
//! (the interval doubles, up to [`PROBE_EVERY_MAX`], while probes lose).
//! The probe wins when its mean latency is below [`WIN_RATIO`] times the
//! incumbent's epoch just before it, twice in a row; then it becomes the
//! incumbent. Epochs next to each other are compared, as an A/B run
//! interleaves its sides, so the drift of a device's speed falls on both.
//! Where neither way is clearly faster (one committer, where both do the
//! same I/O) the incumbent stays.
//!
//! Why both: group commit coalesces the committers' pages into few writes
//! and one `fdatasync`, which wins where the file system has work to do
//! per write or per flush (a growing file: each write allocates, each
//! `fdatasync` commits the journal); direct commits write in parallel and
//! let the kernel merge concurrent `fdatasync`s, which wins where a flush
//! is cheap (pages rewritten in place) and grouping only adds hand-offs.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::sync::{AtomicU64, AtomicUsize, Mutex};

/// How `sync` commits ([`Config::commit_strategy`](crate::Config::commit_strategy)).
///
/// Component: commit (`cached_file/commit.rs`, the chooser in `chooser.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum CommitStrategy {
    /// Measure both ways while the file is used and keep the faster (see
    /// `cached_file/chooser.rs`; [`Stats::direct_commits`](crate::Stats::direct_commits)
    /// and [`Stats::strategy_switches`](crate::Stats::strategy_switches)
    /// say what it did). The default.
    #[default]
    Auto,
    /// Group commit: callers wait for a round; one leader drains, writes
    /// and `fdatasync`s for every caller it covers
    /// ([`Config::rounds_in_flight`](crate::Config::rounds_in_flight) and
    /// [`Config::sync_lanes`](crate::Config::sync_lanes) shape the rounds).
    Group,
    /// Direct commits: each caller drains and writes what is buffered from
    /// its own thread (up to [`MAX_DIRECT_WRITERS`](crate::MAX_DIRECT_WRITERS)
    /// at once), then `fdatasync`s on a free sync lane, unless an
    /// `fdatasync` that began after its writes completed has returned
    /// (the durable watermark), which covers it. Not with
    /// [`Config::commit_dsync`](crate::Config::commit_dsync).
    Direct,
}

impl CommitStrategy {
    /// The strategy's name, as in the enum.
    pub fn name(self) -> &'static str {
        match self {
            CommitStrategy::Auto => "Auto",
            CommitStrategy::Group => "Group",
            CommitStrategy::Direct => "Direct",
        }
    }
}

/// Commits per epoch of `Auto`'s measurement.
pub(crate) const EPOCH_COMMITS: usize = 128;
/// Longest epoch: a slow commit load still moves on (an epoch needs
/// [`EPOCH_MIN_COMMITS`] to count).
pub(crate) const EPOCH_MAX: Duration = Duration::from_millis(250);
/// Fewest commits for an epoch's score to count.
pub(crate) const EPOCH_MIN_COMMITS: usize = 8;
/// Commits at the start of an epoch whose way differs from the one before
/// that are not scored: the calls of the other way still in flight (a
/// round still writing, direct writes the new round waits for) slow the
/// first ones down, which says nothing about the way itself.
pub(crate) const WARMUP_COMMITS: usize = 32;
/// Epochs of the incumbent way between two probes of the other: probing
/// costs at most one epoch in `PROBE_EVERY + 1` at the slower way's speed.
/// Each probe that loses doubles the interval, up to [`PROBE_EVERY_MAX`]; a
/// probe that wins brings it back.
pub(crate) const PROBE_EVERY: u32 = 8;
/// Longest interval between probes (epochs): a load where one way is
/// clearly slower pays for one epoch of it in 65.
pub(crate) const PROBE_EVERY_MAX: u32 = 64;
/// A probe wins when its mean latency is below this fraction of the
/// incumbent's (twice in a row): well outside the epoch-to-epoch noise of
/// this crate's test disk.
pub(crate) const WIN_RATIO: f64 = 0.85;

/// Epoch length, fewest commits for a score, epochs between probes, and
/// the warm-up after a change of way:
/// the constants above, or what a test set with
/// [`testing::auto_commit_epochs`](crate::testing::auto_commit_epochs).
fn tuning() -> (usize, usize, u32, usize) {
    #[cfg(feature = "testing")]
    {
        let epoch = TEST_EPOCH.load(std::sync::atomic::Ordering::Relaxed);
        if epoch > 0 {
            let probe = TEST_PROBE_EVERY.load(std::sync::atomic::Ordering::Relaxed);
            return (epoch, epoch.min(EPOCH_MIN_COMMITS), probe.max(1), 0);
        }
    }
    (
        EPOCH_COMMITS,
        EPOCH_MIN_COMMITS,
        PROBE_EVERY,
        WARMUP_COMMITS,
    )
}

/// Sets the test tuning ([`testing::auto_commit_epochs`](crate::testing::auto_commit_epochs)).
#[cfg(feature = "testing")]
pub(crate) fn set_test_tuning(epoch: usize, probe_every: u32) {
    TEST_PROBE_EVERY.store(probe_every, std::sync::atomic::Ordering::Relaxed);
    TEST_EPOCH.store(epoch, std::sync::atomic::Ordering::Relaxed);
}

/// A test's epoch length for `Auto` (0: the constants).
#[cfg(feature = "testing")]
static TEST_EPOCH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// A test's epochs between probes.
#[cfg(feature = "testing")]
static TEST_PROBE_EVERY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// One `sync` call's way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    Group,
    Direct,
}

impl Way {
    fn other(self) -> Way {
        match self {
            Way::Group => Way::Direct,
            Way::Direct => Way::Group,
        }
    }

    fn code(self) -> usize {
        match self {
            Way::Group => 0,
            Way::Direct => 1,
        }
    }

    fn from_code(c: usize) -> Way {
        if c == 1 { Way::Direct } else { Way::Group }
    }
}

/// Picks each `sync`'s way (see the module docs).
pub(crate) struct Chooser {
    /// `Auto`: `None`.
    pinned: Option<Way>,
    /// The running epoch's way ([`Way::code`]).
    way: AtomicUsize,
    /// Commits and summed latency (ns) of the running epoch (the latency
    /// of its scored commits only, past `warmup`).
    commits: AtomicUsize,
    latency_ns: AtomicU64,
    /// Unscored commits at the start of the running epoch.
    warmup: AtomicUsize,
    /// Direct commits and switches of the incumbent way, for `Stats`.
    direct_commits: AtomicU64,
    switches: AtomicU64,
    state: Mutex<Decision>,
    /// An epoch of a slow load ends after this long ([`EPOCH_MAX`]; the
    /// unit tests set their own, so their verdicts do not depend on how
    /// fast the machine runs them).
    epoch_max: Duration,
}

struct Decision {
    started: Instant,
    incumbent: Way,
    /// Incumbent epochs since the last probe.
    since_probe: u32,
    /// Incumbent epochs between probes now (backs off while probes lose).
    interval: u32,
    /// Mean latency (ns) of the incumbent's last scored epoch.
    incumbent_mean: Option<f64>,
    /// Probes in a row that beat the incumbent.
    wins: u32,
}

impl Chooser {
    /// A chooser for `strategy`; `Auto` starts with group commit.
    pub(crate) fn new(strategy: CommitStrategy) -> Self {
        let pinned = match strategy {
            CommitStrategy::Auto => None,
            CommitStrategy::Group => Some(Way::Group),
            CommitStrategy::Direct => Some(Way::Direct),
        };
        let first = pinned.unwrap_or(Way::Group);
        Self {
            pinned,
            way: AtomicUsize::new(first.code()),
            commits: AtomicUsize::new(0),
            latency_ns: AtomicU64::new(0),
            warmup: AtomicUsize::new(0),
            direct_commits: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            epoch_max: EPOCH_MAX,
            state: Mutex::new(Decision {
                started: Instant::now(),
                incumbent: first,
                since_probe: 0,
                interval: 0,
                incumbent_mean: None,
                wins: 0,
            }),
        }
    }

    /// The way the next `sync` goes.
    #[inline]
    pub(crate) fn way(&self) -> Way {
        match self.pinned {
            Some(w) => w,
            // The model check: `Auto` alternates call by call, so every
            // schedule mixes both ways (and replays the same).
            #[cfg(feature = "shuttle")]
            None => Way::from_code(self.commits.fetch_add(1, Ordering::Relaxed) % 2),
            #[cfg(not(feature = "shuttle"))]
            None => Way::from_code(self.way.load(Ordering::Acquire)),
        }
    }

    /// A `sync` that went `way` succeeded after `elapsed`.
    pub(crate) fn record(&self, way: Way, elapsed: Duration) {
        if way == Way::Direct {
            self.direct_commits.fetch_add(1, Ordering::Relaxed);
        }
        if cfg!(feature = "shuttle")
            || self.pinned.is_some()
            || Way::from_code(self.way.load(Ordering::Acquire)) != way
        {
            // Pinned, or a call of the epoch before (its way is not this
            // epoch's): no score.
            return;
        }
        let n = self.commits.fetch_add(1, Ordering::AcqRel) + 1;
        let warmup = self.warmup.load(Ordering::Relaxed);
        if n <= warmup {
            return;
        }
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.latency_ns.fetch_add(ns, Ordering::Relaxed);
        let (epoch, min, _, _) = tuning();
        let n = n - warmup;
        if n >= epoch {
            self.end_epoch();
        } else if n >= min && n.is_multiple_of(min) {
            // A slow load: end the epoch on time.
            if let Some(st) = self.state.try_lock()
                && st.started.elapsed() >= self.epoch_max
            {
                drop(st);
                self.end_epoch();
            }
        }
    }

    /// Scores the running epoch and picks the next one's way.
    fn end_epoch(&self) {
        let mut st = self.state.lock();
        let warmup = self.warmup.load(Ordering::Relaxed);
        let n = self
            .commits
            .swap(0, Ordering::AcqRel)
            .saturating_sub(warmup);
        let sum = self.latency_ns.swap(0, Ordering::AcqRel);
        let (_, min, probe_every, _) = tuning();
        if n < min {
            // Another call ended it a moment ago; this one's samples go to
            // the next epoch's count, a few more or less.
            return;
        }
        let mean = sum as f64 / n as f64;
        let way = Way::from_code(self.way.load(Ordering::Acquire));
        let next = if way == st.incumbent {
            st.incumbent_mean = Some(mean);
            st.since_probe += 1;
            if st.since_probe >= st.interval.max(probe_every) {
                st.since_probe = 0;
                way.other()
            } else {
                way
            }
        } else {
            // The probe's epoch: against the incumbent's epoch before it.
            let beat = st.incumbent_mean.is_some_and(|inc| mean < inc * WIN_RATIO);
            st.wins = if beat { st.wins + 1 } else { 0 };
            if st.wins >= 2 {
                st.wins = 0;
                st.interval = probe_every;
                st.incumbent = way;
                st.incumbent_mean = Some(mean);
                self.switches.fetch_add(1, Ordering::Relaxed);
                way
            } else {
                if beat {
                    // One win: probe again after one incumbent epoch (a
                    // fresh neighbour to compare with).
                    st.interval = probe_every;
                    st.since_probe = probe_every - 1;
                } else {
                    st.interval =
                        (st.interval.max(probe_every) * 2).min(PROBE_EVERY_MAX.max(probe_every));
                }
                st.incumbent
            }
        };
        st.started = Instant::now();
        let warm = if next == way { 0 } else { tuning().3 };
        self.warmup.store(warm, Ordering::Relaxed);
        self.way.store(next.code(), Ordering::Release);
    }

    /// Commits that went the direct way.
    pub(crate) fn direct_commits(&self) -> u64 {
        self.direct_commits.load(Ordering::Relaxed)
    }

    /// Times `Auto` switched ways.
    pub(crate) fn switches(&self) -> u64 {
        self.switches.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    /// An `Auto` chooser whose epochs end by count only, whatever the
    /// machine's speed.
    fn counting() -> Chooser {
        Chooser {
            epoch_max: Duration::MAX,
            ..Chooser::new(CommitStrategy::Auto)
        }
    }

    /// Feeds `n` commits of `us` µs going the way the chooser picks, and
    /// checks they all went `way`.
    fn feed(c: &Chooser, way: Way, n: usize, us: u64) {
        for _ in 0..n {
            assert_eq!(c.way(), way);
            c.record(way, Duration::from_micros(us));
        }
    }

    #[test]
    fn auto_switches_after_two_winning_probes_and_backs_off_after_losing_ones() {
        let c = counting();
        assert_eq!(c.way(), Way::Group, "group commit first");
        // Group at 100 µs: after PROBE_EVERY epochs, a probe of direct.
        feed(&c, Way::Group, PROBE_EVERY as usize * EPOCH_COMMITS, 100);
        // Direct at 50 µs (its warm-up is not scored): one win, back to
        // group for one epoch, then the second probe wins and switches.
        feed(&c, Way::Direct, WARMUP_COMMITS + EPOCH_COMMITS, 50);
        feed(&c, Way::Group, WARMUP_COMMITS + EPOCH_COMMITS, 100);
        feed(&c, Way::Direct, WARMUP_COMMITS + EPOCH_COMMITS, 50);
        assert_eq!(c.switches(), 1);
        assert_eq!(c.way(), Way::Direct);
        // Probes of group lose now: the interval doubles each time.
        let mut epochs_between = Vec::new();
        for i in 0..4 {
            let mut n = 0;
            while c.way() == Way::Direct {
                c.record(Way::Direct, Duration::from_micros(50));
                n += 1;
            }
            // An epoch after a change of way starts with a warm-up (the
            // switch itself kept the way).
            let warm = if i == 0 { 0 } else { WARMUP_COMMITS };
            assert_eq!((n - warm) % EPOCH_COMMITS, 0);
            epochs_between.push((n - warm) / EPOCH_COMMITS);
            feed(&c, Way::Group, WARMUP_COMMITS + EPOCH_COMMITS, 100);
        }
        assert_eq!(epochs_between, [8, 16, 32, 64]);
        assert_eq!(c.switches(), 1, "losing probes never switch");
        assert!(c.direct_commits() > 0);
    }

    #[test]
    fn a_probe_within_the_noise_never_switches() {
        let c = counting();
        for _ in 0..6 {
            while c.way() == Way::Group {
                c.record(Way::Group, Duration::from_micros(100));
            }
            // 10% faster: inside the margin (`WIN_RATIO`).
            feed(&c, Way::Direct, WARMUP_COMMITS + EPOCH_COMMITS, 90);
        }
        assert_eq!(c.switches(), 0);
        assert_eq!(c.way(), Way::Group);
    }

    #[test]
    fn a_pinned_strategy_never_moves() {
        for (s, w) in [
            (CommitStrategy::Group, Way::Group),
            (CommitStrategy::Direct, Way::Direct),
        ] {
            let c = Chooser::new(s);
            for i in 0..(20 * EPOCH_COMMITS) {
                assert_eq!(c.way(), w);
                c.record(w, Duration::from_micros(1 + (i % 7) as u64 * 100));
            }
            assert_eq!(c.switches(), 0);
        }
    }

    #[test]
    fn a_slow_load_ends_its_epoch_on_time() {
        // An epoch past its time ends at the next multiple of the fewest
        // commits that count, long before its full count.
        let c = Chooser {
            epoch_max: Duration::ZERO,
            ..Chooser::new(CommitStrategy::Auto)
        };
        for _ in 0..PROBE_EVERY {
            feed(&c, Way::Group, EPOCH_MIN_COMMITS, 100);
        }
        // PROBE_EVERY epochs of group ended on time (by count each would
        // have taken EPOCH_COMMITS): the next one probes.
        assert_eq!(c.way(), Way::Direct);
    }
}
