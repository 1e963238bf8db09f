//! SVG plots of the tools' results, drawn with plotters' SVG backend (no
//! system libraries, no fonts: text is SVG `<text>`).
//!
//! Data goes through [`Axis`] transforms (log2 threads, log10 latency, the
//! "nines" of a percentile) onto plain linear plotters axes whose labels
//! print the original values, so one code path draws every chart. Each
//! drawing returns where every point landed in SVG pixels ([`Drawn`]), which
//! is what the tests compare with the SVG and with the run's JSON.

use std::path::Path;

use crate::error::{Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// How values map onto an axis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// As they are, from 0.
    Linear,
    /// log2, labelled at powers of two (thread counts).
    Log2,
    /// log10, labelled at powers of ten (latencies).
    Log10,
    /// Percentiles as nines, `-log10(1 - p/100)`: p90 at 1, p99 at 2,
    /// p99.9 at 3 (latency percentile curves).
    Nines,
    /// Whole numbers (round 1, 2, ...), not anchored at 0.
    Count,
}

impl Scale {
    fn to_plot(self, v: f64) -> f64 {
        match self {
            Scale::Linear | Scale::Count => v,
            Scale::Log2 => v.max(f64::MIN_POSITIVE).log2(),
            Scale::Log10 => v.max(f64::MIN_POSITIVE).log10(),
            Scale::Nines => -(1.0 - v / 100.0).max(1e-12).log10(),
        }
    }

    /// The label at plot coordinate `p`: only at whole steps for the log
    /// scales (empty elsewhere, so ticks between powers stay unlabelled).
    fn label(self, p: f64) -> String {
        let whole = (p - p.round()).abs() < 1e-6;
        match self {
            Scale::Linear => compact(p),
            Scale::Count if whole => format!("{}", p.round()),
            Scale::Log2 if whole => format!("{}", 2f64.powf(p.round())),
            // Every tick: a narrow latency range may hold no power of ten.
            Scale::Log10 => compact(round_sig(10f64.powf(p), 2)),
            Scale::Nines if whole => {
                let pct = 100.0 * (1.0 - 10f64.powf(-p.round()));
                let s = format!("{pct:.5}");
                format!("p{}", s.trim_end_matches('0').trim_end_matches('.'))
            }
            _ => String::new(),
        }
    }
}

/// 1234567 -> "1.2M", 0.5 -> "0.5".
fn compact(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// `v` rounded to `digits` significant digits.
fn round_sig(v: f64, digits: i32) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(digits - 1 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// An axis: its title (with units) and scale.
#[derive(Debug, Clone)]
pub struct Axis {
    /// Axis title, with the unit, e.g. "commits/s" or "latency (µs)".
    pub label: String,
    /// How values map onto it.
    pub scale: Scale,
}

/// One line on a panel.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (x, y) in data units, x ascending.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (a reference, such as fio's figure).
    pub dashed: bool,
}

/// A chart sharing the figure's x axis.
#[derive(Debug, Clone)]
pub struct Panel {
    /// The y axis.
    pub y: Axis,
    /// Its lines.
    pub series: Vec<Series>,
}

/// A figure of one or more stacked panels.
#[derive(Debug, Clone)]
pub struct Figure {
    /// Title: what ran (engine, I/O mode, page size, machine).
    pub title: String,
    /// The shared x axis.
    pub x: Axis,
    /// Panels, top to bottom.
    pub panels: Vec<Panel>,
}

/// One drawn series: panel index, label, and the SVG pixel of every point
/// in order.
pub type DrawnSeries = (usize, String, Vec<(i32, i32)>);

/// Where a drawing put its data, in SVG pixels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Drawn {
    /// Per series (for a bar chart, one series of bar tops).
    pub series: Vec<DrawnSeries>,
}

/// Width and height of every figure, pixels.
const PANEL_SIZE: (u32, u32) = (900, 420);

/// Checks that an SVG can be written at `path` before minutes of work
/// happen: not a directory, its directory exists and takes a new file.
///
/// Errors: `Error::Io` with op "plot path" naming the path.
pub fn check_writable(path: &Path) -> Result<()> {
    let bad = |why: String| {
        Error::io(
            "plot path",
            None,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: {why}", path.display()),
            ),
        )
    };
    if path.is_dir() {
        return Err(bad("is a directory".into()));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(bad(format!("directory {} does not exist", dir.display())));
    }
    tempfile::Builder::new()
        .prefix(".pagewriter-plot-check")
        .tempfile_in(dir)
        .map(drop)
        .map_err(|e| bad(format!("cannot create a file there ({e})")))
}

fn draw_error(e: impl std::fmt::Display) -> Error {
    Error::io("write plot", None, std::io::Error::other(e.to_string()))
}

/// Plot range of some transformed values, padded by 5%; from 0 for a
/// linear scale of non-negative values.
fn range(scale: Scale, values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.map(|v| scale.to_plot(v)).filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if scale == Scale::Linear && lo >= 0.0 {
        lo = 0.0;
    }
    let pad = ((hi - lo) * 0.05).max(0.25);
    (
        lo - if scale == Scale::Linear && lo == 0.0 {
            0.0
        } else {
            pad
        },
        hi + pad,
    )
}

/// Draws `fig` into the SVG file `path`.
///
/// Errors: `Error::Io` with op "write plot" if the file cannot be written.
pub fn line_svg(fig: &Figure, path: &Path) -> Result<Drawn> {
    let height = PANEL_SIZE.1 * fig.panels.len().max(1) as u32;
    let root = SVGBackend::new(path, (PANEL_SIZE.0, height)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let root = root
        .titled(&fig.title, ("sans-serif", 20))
        .map_err(draw_error)?;
    let areas = root.split_evenly((fig.panels.len().max(1), 1));
    let xs = fig
        .panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter().map(|q| q.0)));
    let x_range = range(fig.x.scale, xs);
    let mut drawn = Drawn::default();
    for (i, (panel, area)) in fig.panels.iter().zip(&areas).enumerate() {
        draw_panel(fig, i, panel, area, x_range, &mut drawn)?;
    }
    root.present().map_err(draw_error)?;
    Ok(drawn)
}

fn draw_panel(
    fig: &Figure,
    index: usize,
    panel: &Panel,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    x_range: (f64, f64),
    drawn: &mut Drawn,
) -> Result<()> {
    let ys = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| q.1));
    let y_range = range(panel.y.scale, ys);
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range.0..x_range.1, y_range.0..y_range.1)
        .map_err(draw_error)?;
    let (xs, ys) = (fig.x.scale, panel.y.scale);
    let x_fmt = move |v: &f64| xs.label(*v);
    let y_fmt = move |v: &f64| ys.label(*v);
    chart
        .configure_mesh()
        .x_desc(fig.x.label.as_str())
        .y_desc(panel.y.label.as_str())
        .x_labels(whole_steps(x_range, xs))
        .y_labels(whole_steps(y_range, ys))
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .draw()
        .map_err(draw_error)?;
    for (k, s) in panel.series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(x, y)| (xs.to_plot(x), ys.to_plot(y)))
            .collect();
        let style = color.stroke_width(2);
        let legend_style = style;
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
                .map_err(draw_error)?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], legend_style));
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(draw_error)?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], legend_style));
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(draw_error)?;
        }
        let pixels = pts.iter().map(|p| chart.backend_coord(p)).collect();
        drawn.series.push((index, s.label.clone(), pixels));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

/// How many labels put one at every whole step of a log2, nines or count
/// scale (plotters places them at round positions), or ~8 for linear and
/// log10 scales (labelled at every tick).
fn whole_steps(range: (f64, f64), scale: Scale) -> usize {
    match scale {
        Scale::Linear | Scale::Log10 => 8,
        _ => ((range.1.floor() - range.0.ceil()) as usize + 1).clamp(2, 12),
    }
}

/// Draws labelled bars (`(label, value)`, value in `y_label`'s unit) into
/// the SVG file `path`; the returned series holds the pixel of each bar's
/// top centre.
///
/// Errors: `Error::Io` with op "write plot".
pub fn bars_svg(title: &str, y_label: &str, bars: &[(String, f64)], path: &Path) -> Result<Drawn> {
    let root = SVGBackend::new(path, PANEL_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(draw_error)?;
    let top = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let n = bars.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(draw_error)?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let x_fmt = move |v: &f64| {
        let i = v.floor() as usize;
        if (v - (i as f64 + 0.5)).abs() < 1e-6 {
            names.get(i).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let y_fmt = |v: &f64| compact(*v);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("rank")
        .y_desc(y_label)
        .x_labels(n * 2 + 1)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .draw()
        .map_err(draw_error)?;
    let mut tops = Vec::new();
    for (i, (_, v)) in bars.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let (x0, x1) = (i as f64 + 0.15, i as f64 + 0.85);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x1, *v)],
                color.filled(),
            )))
            .map_err(draw_error)?;
        tops.push(chart.backend_coord(&(i as f64 + 0.5, *v)));
    }
    root.present().map_err(draw_error)?;
    Ok(Drawn {
        series: vec![(0, y_label.to_string(), tops)],
    })
}

// ---- the tools' figures ----

use crate::workload::io::{Aggregate, IoReport};
use crate::workload::scale::{CommitKind, ScaleReport};

/// "host, N cores": the machine a figure's numbers come from.
pub fn machine() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown host".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{host}, {cores} cores")
}

/// A reference line for the scale plot, e.g. fio's commits/s at the same
/// thread counts. JSON: `{"label": "fio psync fdatasync=1", "points":
/// [{"threads": 1, "commits_per_s": 5300.0, "p99_us": 410.0}, ...]}`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reference {
    /// Legend text.
    pub label: String,
    /// One point per thread count.
    pub points: Vec<ReferencePoint>,
}

/// One thread count of a [`Reference`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReferencePoint {
    /// Threads (fio: numjobs).
    pub threads: usize,
    /// Commits per second.
    pub commits_per_s: f64,
    /// p99 commit latency, µs.
    pub p99_us: f64,
}

/// `scale`: commits/s (pages/s for `--commit flush`) against threads, one
/// line per mode, log2 threads; below it p99 commit latency; `reference`
/// dashed in both.
pub fn scale_figure(r: &ScaleReport, reference: Option<&Reference>) -> Figure {
    let flush = r.config.commit == CommitKind::Flush;
    let (what, unit) = if flush {
        ("page writes", "pages/s")
    } else {
        ("commits", "commits/s")
    };
    let mut rate = Vec::new();
    let mut p99 = Vec::new();
    for &mode in &r.config.modes {
        let rows: Vec<_> = r.rows.iter().filter(|row| row.mode == mode).collect();
        let y = |row: &&crate::workload::scale::Row| {
            if flush {
                row.page_writes_per_s
            } else {
                row.commits_per_s
            }
        };
        rate.push(Series {
            label: mode.name().to_string(),
            points: rows
                .iter()
                .map(|row| (row.threads as f64, y(row)))
                .collect(),
            dashed: false,
        });
        p99.push(Series {
            label: mode.name().to_string(),
            points: rows
                .iter()
                .map(|row| (row.threads as f64, row.p99_us.max(1) as f64))
                .collect(),
            dashed: false,
        });
    }
    if let Some(f) = reference {
        let pts = |g: fn(&ReferencePoint) -> f64| {
            f.points.iter().map(|p| (p.threads as f64, g(p))).collect()
        };
        rate.push(Series {
            label: f.label.clone(),
            points: pts(|p| p.commits_per_s),
            dashed: true,
        });
        p99.push(Series {
            label: f.label.clone(),
            points: pts(|p| p.p99_us.max(1.0)),
            dashed: true,
        });
    }
    // The I/O mode line is "<engine>, <O_DIRECT or buffered ...>": the
    // second half is common to the modes.
    let io = r
        .io_modes
        .first()
        .and_then(|(_, io)| io.split_once(", ").map(|(_, d)| d.to_string()))
        .unwrap_or_default();
    Figure {
        title: format!(
            "pagewriter scale: {what}, {} x {} B pages per txn, {io}, {}",
            r.config.pages_per_txn,
            r.config.page_size,
            machine()
        ),
        x: Axis {
            label: "writer threads".into(),
            scale: Scale::Log2,
        },
        panels: vec![
            Panel {
                y: Axis {
                    label: unit.into(),
                    scale: Scale::Linear,
                },
                series: rate,
            },
            Panel {
                y: Axis {
                    label: "p99 commit latency (µs)".into(),
                    scale: Scale::Log10,
                },
                series: p99,
            },
        ],
    }
}

/// The latency percentile curve of fio's JSON output (`--output-format=json`)
/// for `dir` ("read" or "write") of its first job: (percentile, µs), or
/// `None` if the file has no such curve.
pub fn fio_percentiles(fio: &serde_json::Value, dir: &str) -> Option<Vec<(f64, f64)>> {
    let job = fio.get("jobs")?.get(0)?.get(dir)?;
    let map = job
        .get("clat_ns")
        .or_else(|| job.get("lat_ns"))?
        .get("percentile")?
        .as_object()?;
    let mut v: Vec<(f64, f64)> = map
        .iter()
        .filter_map(|(p, ns)| Some((p.parse::<f64>().ok()?, ns.as_f64()? / 1e3)))
        .filter(|&(p, ns)| p > 0.0 && p < 100.0 && ns > 0.0)
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!v.is_empty()).then_some(v)
}

/// `io`: latency percentile curve per direction (p1 .. p99.999 as nines,
/// log latency), with fio's curve of the same direction dashed beside it.
pub fn io_figure(r: &IoReport, fio: Option<&serde_json::Value>) -> Figure {
    let mut series = Vec::new();
    for (name, d) in [("read", &r.read), ("write", &r.write)] {
        let Some(d) = d else { continue };
        series.push(Series {
            label: format!("pagewriter {name}"),
            points: d
                .percentiles_us
                .iter()
                .map(|&(p, us)| (p, us.max(0.001)))
                .collect(),
            dashed: false,
        });
        if let Some(curve) = fio.and_then(|f| fio_percentiles(f, name)) {
            series.push(Series {
                label: format!("fio {name}"),
                points: curve,
                dashed: true,
            });
        }
    }
    let c = &r.config;
    Figure {
        title: format!(
            "pagewriter io: {} bs {} B, iodepth {}, {} on {}",
            c.rw.name(),
            c.bs,
            c.iodepth,
            r.io_mode,
            machine()
        ),
        x: Axis {
            label: "percentile".into(),
            scale: Scale::Nines,
        },
        panels: vec![Panel {
            y: Axis {
                label: "completion latency (µs)".into(),
                scale: Scale::Log10,
            },
            series,
        }],
    }
}

/// `report`: one bar per rank (GiB/s) and the aggregate last.
pub fn report_bars(a: &Aggregate) -> Vec<(String, f64)> {
    let mut bars: Vec<(String, f64)> = a
        .per_rank
        .iter()
        .map(|(rank, _, _, gib)| (format!("rank {rank}"), *gib))
        .collect();
    bars.push(("aggregate".into(), a.aggregate_gib_per_s));
    bars
}

/// The title of the `report` plot.
pub fn report_title(a: &Aggregate) -> String {
    format!(
        "pagewriter report: {} ranks, {:.2} GiB in {:.2} s (slowest rank {} on {})",
        a.ranks,
        a.total_bytes as f64 / (1u64 << 30) as f64,
        a.span_s,
        a.slowest.0,
        a.slowest.1
    )
}

/// Rounds of a comparison, for `compare-fio.sh --plot`: JSON
/// `{"title": "...", "cases": {"case": [ratio, ...], ...}}`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Rounds {
    /// What was compared.
    pub title: String,
    /// Ratio per round, per case.
    pub cases: std::collections::BTreeMap<String, Vec<f64>>,
}

/// Every round's ratio per case against the round number, with the
/// parity line at 1.0 dashed.
pub fn rounds_figure(r: &Rounds) -> Figure {
    let mut series: Vec<Series> = r
        .cases
        .iter()
        .map(|(case, v)| Series {
            label: case.clone(),
            points: v
                .iter()
                .enumerate()
                .map(|(i, &x)| ((i + 1) as f64, x))
                .collect(),
            dashed: false,
        })
        .collect();
    let n = r.cases.values().map(Vec::len).max().unwrap_or(1).max(1);
    series.push(Series {
        label: "parity (1.0)".into(),
        points: vec![(1.0, 1.0), (n as f64, 1.0)],
        dashed: true,
    });
    Figure {
        title: format!("{} on {}", r.title, machine()),
        x: Axis {
            label: "round".into(),
            scale: Scale::Count,
        },
        panels: vec![Panel {
            y: Axis {
                label: "ratio pagewriter / fio".into(),
                scale: Scale::Linear,
            },
            series,
        }],
    }
}
