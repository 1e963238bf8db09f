//! What a run reports: per-direction volume and latency, progress.

use super::*;

/// Latency and volume of one direction (reads or writes).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DirStats {
    /// Bytes transferred.
    pub bytes: u64,
    /// I/Os completed.
    pub ios: u64,
    /// Bytes per second over the run (wall time of the slowest job).
    pub bw_bytes_per_s: f64,
    /// I/Os per second.
    pub iops: f64,
    /// Latency samples (one per I/O).
    pub lat_samples: u64,
    /// Latency, µs: min, mean, p50, p90, p99, p99.9, p99.99, max.
    pub lat_us: LatencyUs,
    /// The latency percentile curve: (percentile, µs) at each of
    /// [`PERCENTILES`], for plots. Empty in reports written before it was.
    #[serde(default)]
    pub percentiles_us: Vec<(f64, f64)>,
}

/// Percentiles of the latency curve in a report ([`DirStats::percentiles_us`]).
pub const PERCENTILES: [f64; 14] = [
    1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999,
];

/// Latency figures in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyUs {
    /// Minimum.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// 99.99th percentile.
    pub p99_99: f64,
    /// Maximum.
    pub max: f64,
}

/// The result of [`run`]: one rank's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IoReport {
    /// What was run.
    pub config: IoConfig,
    /// I/O actually used: engine, options, `O_DIRECT` verdict.
    pub io_mode: String,
    /// Host name.
    pub host: String,
    /// Start, ns since the Unix epoch (for aggregating ranks).
    pub start_unix_ns: u128,
    /// End (after the final fdatasync), ns since the Unix epoch.
    pub end_unix_ns: u128,
    /// Wall time of the run, seconds.
    pub runtime_s: f64,
    /// CPU seconds (user + system, whole process) while the jobs ran,
    /// setup and verify excluded (0 in reports written before it existed).
    #[serde(default)]
    pub cpu_s: f64,
    /// Reads, if any.
    pub read: Option<DirStats>,
    /// Writes, if any.
    pub write: Option<DirStats>,
    /// `fdatasync` calls made (every N writes and at the end).
    pub fsyncs: u64,
    /// Blocks verified after the run (0 without `verify`).
    pub verified_blocks: u64,
}

/// A verify failure: the first block that is not what was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    /// Byte offset of the first bad block.
    pub offset: u64,
    /// What is wrong with it.
    pub why: String,
}

/// Live figures passed to [`run`]'s progress callback about twice a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IoProgress {
    /// Since the start.
    pub elapsed: Duration,
    /// Bytes done so far, all jobs.
    pub bytes: u64,
    /// Bytes per second over the last interval.
    pub bytes_per_sec: f64,
    /// Fraction done (by bytes or by time), 0..=1.
    pub fraction: f64,
}

/// What a job hands back.
pub(super) struct JobOut {
    /// First I/O issued (after the job's setup), and its last completed.
    pub(super) began: Option<Instant>,
    pub(super) ended: Option<Instant>,
    pub(super) read: Histogram<u64>,
    pub(super) write: Histogram<u64>,
    pub(super) read_bytes: u64,
    pub(super) write_bytes: u64,
    pub(super) fsyncs: u64,
}

impl JobOut {
    /// Accounts one completed I/O and its latency.
    pub(super) fn record(&mut self, io: Io, latency: Duration) {
        let ns = (latency.as_nanos() as u64).max(1);
        if io.read {
            self.read.saturating_record(ns);
            self.read_bytes += io.len as u64;
        } else {
            self.write.saturating_record(ns);
            self.write_bytes += io.len as u64;
        }
    }
}

pub(super) fn new_hist() -> Histogram<u64> {
    // 1 ns .. 1 hour at 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

impl DirStats {
    /// One direction's figures from its latency histogram (ns) and bytes,
    /// over a run of `secs` seconds; `None` if it did no I/O.
    pub(super) fn from_hist(h: &Histogram<u64>, bytes: u64, secs: f64) -> Option<Self> {
        (!h.is_empty()).then(|| DirStats {
            bytes,
            ios: h.len(),
            bw_bytes_per_s: bytes as f64 / secs,
            iops: h.len() as f64 / secs,
            lat_samples: h.len(),
            lat_us: LatencyUs {
                min: h.min() as f64 / 1e3,
                mean: h.mean() / 1e3,
                p50: h.value_at_quantile(0.50) as f64 / 1e3,
                p90: h.value_at_quantile(0.90) as f64 / 1e3,
                p99: h.value_at_quantile(0.99) as f64 / 1e3,
                p99_9: h.value_at_quantile(0.999) as f64 / 1e3,
                p99_99: h.value_at_quantile(0.9999) as f64 / 1e3,
                max: h.max() as f64 / 1e3,
            },
            percentiles_us: PERCENTILES
                .iter()
                .map(|&p| (p, h.value_at_quantile(p / 100.0) as f64 / 1e3))
                .collect(),
        })
    }
}
