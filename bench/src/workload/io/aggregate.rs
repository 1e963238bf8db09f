//! Shared-file runs: one report directory per run, and their merge.

use super::*;

/// Refuses reports that are not exactly one run's ranks: two run ids, two
/// rank counts or sizes, a rank twice, or a rank missing.
pub(super) fn check_one_run(dir: &Path, reports: &[IoReport]) -> Result<()> {
    let bad = |why: String| Err(Error::config(format!("{}: {why}", dir.display())));
    let mut ids: Vec<&str> = reports.iter().map(|r| r.config.run_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > 1 {
        return bad(format!(
            "reports of several runs ({}); one run per directory",
            ids.join(", ")
        ));
    }
    let shape = |r: &IoReport| (r.config.shared.map_or(1, |s| s.ranks), r.config.size);
    if reports.iter().any(|r| shape(r) != shape(&reports[0])) {
        return bad("reports disagree on the rank count or the size: not one run".into());
    }
    let ranks = shape(&reports[0]).0;
    let mut seen = vec![false; ranks as usize];
    for r in reports {
        let rank = r.config.shared.map_or(0, |s| s.rank);
        match seen.get_mut(rank as usize) {
            Some(s) if !*s => *s = true,
            Some(_) => return bad(format!("rank {rank} reported twice")),
            None => return bad(format!("rank {rank} is not below the rank count {ranks}")),
        }
    }
    let missing: Vec<String> = (0..ranks)
        .filter(|&r| !seen[r as usize])
        .map(|r| r.to_string())
        .collect();
    if !missing.is_empty() {
        return bad(format!(
            "{} of {ranks} ranks reported; missing: {}",
            ranks as usize - missing.len(),
            missing.join(", ")
        ));
    }
    Ok(())
}

/// Prepares `dir` for the report of rank `rank` of run `run_id`: refuses a
/// directory holding reports of another run (by run id), or this rank's
/// report of this run already (a rank run again from the same shell, whose
/// default run id is the same: its report would silently replace the
/// first and `report` would merge two runs), unless `overwrite`, which
/// removes them (only `rank-*.json` files that parse as reports).
///
/// Errors: [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) naming the other run or the rank;
/// `Error::Io`.
pub fn claim_report_dir(dir: &Path, run_id: &str, rank: u32, overwrite: bool) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create report dir", None, e))?;
    let entries = std::fs::read_dir(dir).map_err(|e| read_dir_error(dir, e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("rank-") && name.ends_with(".json")) {
            continue;
        }
        let Ok(text) = std::fs::read(&path) else {
            continue;
        };
        let Ok(other) = serde_json::from_slice::<IoReport>(&text) else {
            continue;
        };
        let other_rank = other.config.shared.map_or(0, |s| s.rank);
        if other.config.run_id == run_id && other_rank != rank {
            continue;
        }
        if !overwrite && other.config.run_id == run_id {
            return Err(Error::config(format!(
                "{} already holds rank {rank}'s report of run {run_id}: a rank run twice \
                 would mix two runs; use --run-id (or another --report-dir) for a new run, \
                 or --overwrite to replace it",
                dir.display()
            )));
        }
        if !overwrite {
            return Err(Error::config(format!(
                "{} holds reports of another run ({}): use another --report-dir, or \
                 --overwrite to replace them",
                dir.display(),
                other.config.run_id
            )));
        }
        std::fs::remove_file(&path).map_err(|e| Error::io("remove old report", None, e))?;
    }
    Ok(())
}

/// The aggregate of several ranks' reports (`pagewriter report DIR`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Aggregate {
    /// Reports read.
    pub ranks: usize,
    /// Ranks the reports say there should be (the largest `ranks` seen).
    pub ranks_expected: u32,
    /// Bytes read and written by all ranks.
    pub total_bytes: u64,
    /// From the earliest start to the latest end, seconds.
    pub span_s: f64,
    /// `total_bytes / span_s` in GiB/s.
    pub aggregate_gib_per_s: f64,
    /// The rank that took longest: (rank, host, seconds).
    pub slowest: (u32, String, f64),
    /// Per rank: (rank, host, bytes, GiB/s).
    pub per_rank: Vec<(u32, String, u64, f64)>,
}

/// Reads every `*.json` in `dir` as an [`IoReport`] and aggregates them.
///
/// Errors: [`CoreError::Io`](crate::error::CoreError::Io) reading the directory or a file;
/// [`CoreError::InvalidConfig`](crate::error::CoreError::InvalidConfig) for a file that is not a report, or no reports.
pub fn aggregate(dir: &Path) -> Result<Aggregate> {
    let mut reports: Vec<IoReport> = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| read_dir_error(dir, e))?;
    for entry in entries {
        let path = entry.map_err(|e| read_dir_error(dir, e))?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read(&path).map_err(|e| Error::io("read", None, e))?;
            let r = serde_json::from_slice(&text)
                .map_err(|e| Error::config(format!("{} is not a report: {e}", path.display())))?;
            reports.push(r);
        }
    }
    if reports.is_empty() {
        return Err(Error::config(format!(
            "no *.json reports in {}",
            dir.display()
        )));
    }
    reports.sort_by_key(|r| r.config.shared.map_or(0, |s| s.rank));
    check_one_run(dir, &reports)?;
    let bytes = |r: &IoReport| {
        r.read.as_ref().map_or(0, |d| d.bytes) + r.write.as_ref().map_or(0, |d| d.bytes)
    };
    let rank = |r: &IoReport| r.config.shared.map_or(0, |s| s.rank);
    let first = reports.iter().map(|r| r.start_unix_ns).min().unwrap_or(0);
    let last = reports.iter().map(|r| r.end_unix_ns).max().unwrap_or(0);
    let span_s = (last.saturating_sub(first)) as f64 / 1e9;
    let total: u64 = reports.iter().map(bytes).sum();
    let slowest = reports
        .iter()
        .max_by(|a, b| a.runtime_s.total_cmp(&b.runtime_s))
        .expect("not empty");
    Ok(Aggregate {
        ranks: reports.len(),
        ranks_expected: reports
            .iter()
            .filter_map(|r| r.config.shared.map(|s| s.ranks))
            .max()
            .unwrap_or(1),
        total_bytes: total,
        span_s,
        aggregate_gib_per_s: total as f64 / span_s.max(1e-9) / (1u64 << 30) as f64,
        slowest: (rank(slowest), slowest.host.clone(), slowest.runtime_s),
        per_rank: reports
            .iter()
            .map(|r| {
                (
                    rank(r),
                    r.host.clone(),
                    bytes(r),
                    bytes(r) as f64 / r.runtime_s.max(1e-9) / (1u64 << 30) as f64,
                )
            })
            .collect(),
    })
}

/// A failed `read_dir` of `dir`, naming it (`Error::Io`'s own text names
/// only the call).
fn read_dir_error(dir: &std::path::Path, e: std::io::Error) -> Error {
    Error::io(
        "read_dir",
        None,
        std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())),
    )
}
