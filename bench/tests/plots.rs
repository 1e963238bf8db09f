//! The plots: each SVG parses as XML, has one line per mode / direction /
//! rank, labelled axes with units, and its points are the values of the
//! same run's JSON, where plotters put them.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use pagewriter::DirectIo;
use pagewriter_bench::plot::{self, Drawn};
use pagewriter_bench::workload::io::{self, Aggregate, IoConfig, Rw};
use pagewriter_bench::workload::scale::{self, Mode, ScaleConfig};

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Every polyline's points, and every text, of an SVG (which must parse).
fn parse_svg(path: &std::path::Path) -> (Vec<Vec<(i32, i32)>>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .map(|n| {
            n.attribute("points")
                .unwrap()
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect();
    let texts = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect();
    (lines, texts)
}

/// Each drawn solid series is exactly one polyline of the SVG.
fn assert_lines_drawn(drawn: &Drawn, lines: &[Vec<(i32, i32)>], solid: &[&str]) {
    for (panel, label, pixels) in &drawn.series {
        if solid.contains(&label.as_str()) {
            assert!(
                lines.iter().any(|l| l == pixels),
                "panel {panel} series {label}: {pixels:?} not among the SVG's lines"
            );
        }
    }
}

#[test]
fn scale_plot_has_a_line_per_mode_at_the_runs_values() {
    let d = dir();
    let config = ScaleConfig {
        threads: vec![1, 2, 4],
        modes: vec![
            Mode::Engine(pagewriter::FlushEngine::PerPage),
            Mode::Engine(pagewriter::FlushEngine::Vectored),
        ],
        cell_duration: Duration::from_millis(150),
        repeats: 1,
        dir: d.path().to_path_buf(),
        direct: DirectIo::Off,
        ..ScaleConfig::default()
    };
    let report = scale::run(&config, |_| {}).unwrap();
    let json = serde_json::to_value(&report).unwrap();
    let reference = plot::Reference {
        label: "fio".into(),
        points: vec![
            plot::ReferencePoint {
                threads: 1,
                commits_per_s: 100.0,
                p99_us: 900.0,
            },
            plot::ReferencePoint {
                threads: 4,
                commits_per_s: 300.0,
                p99_us: 1200.0,
            },
        ],
    };
    let fig = plot::scale_figure(&report, Some(&reference));
    assert_eq!(fig.panels.len(), 2);
    // The plotted values are the JSON's, mode by mode.
    for (panel, field) in [(0, "commits_per_s"), (1, "p99_us")] {
        let series = &fig.panels[panel].series;
        assert_eq!(series.len(), 3, "two modes and the reference");
        for s in &series[..2] {
            let want: Vec<(f64, f64)> = json["rows"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["mode"] == s.label.as_str())
                .map(|r| {
                    (
                        r["threads"].as_f64().unwrap(),
                        r[field].as_f64().unwrap().max(1.0),
                    )
                })
                .collect();
            assert_eq!(s.points, want, "{field} of {}", s.label);
        }
        assert!(series[2].dashed);
    }
    let svg = d.path().join("s.svg");
    let drawn = plot::line_svg(&fig, &svg).unwrap();
    assert_eq!(drawn.series.len(), 6);
    let (lines, texts) = parse_svg(&svg);
    assert_lines_drawn(&drawn, &lines, &["per-page", "vectored"]);
    for label in [
        "writer threads",
        "commits/s",
        "p99 commit latency (µs)",
        "per-page",
        "vectored",
        "fio",
    ] {
        assert!(
            texts.iter().any(|t| t == label),
            "no text {label:?} in {texts:?}"
        );
    }
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("pagewriter scale") && t.contains("4096 B"))
    );
    assert!(
        texts.iter().any(|t| t == "1") && texts.iter().any(|t| t == "4"),
        "log2 ticks"
    );
}

#[test]
fn io_plot_has_a_curve_per_direction_and_fios_beside_it() {
    let d = dir();
    let mut cfg = IoConfig::new(d.path().join("io.bin"));
    cfg.rw = Rw::RandRw;
    cfg.bs = 4096;
    cfg.size = 8 << 20;
    cfg.direct = DirectIo::Off;
    let report = io::run(&cfg, &mut |_| {}).unwrap();
    let json = serde_json::to_value(&report).unwrap();
    // A fio JSON with a write curve only.
    let fio = serde_json::json!({"jobs": [{"write": {"clat_ns": {"percentile": {
        "1.000000": 2000, "50.000000": 9000, "99.000000": 40000, "99.990000": 90000
    }}}}]});
    let fig = plot::io_figure(&report, Some(&fio));
    let labels: Vec<&str> = fig.panels[0]
        .series
        .iter()
        .map(|s| s.label.as_str())
        .collect();
    assert_eq!(labels, ["pagewriter read", "pagewriter write", "fio write"]);
    for (s, dir) in fig.panels[0].series.iter().zip(["read", "write"]) {
        let want: Vec<(f64, f64)> = json[dir]["percentiles_us"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap().max(0.001)))
            .collect();
        assert_eq!(s.points, want, "{dir}");
        assert_eq!(want.len(), io::PERCENTILES.len());
    }
    assert_eq!(fig.panels[0].series[2].points[1], (50.0, 9.0));
    let svg = d.path().join("l.svg");
    let drawn = plot::line_svg(&fig, &svg).unwrap();
    let (lines, texts) = parse_svg(&svg);
    assert_lines_drawn(&drawn, &lines, &["pagewriter read", "pagewriter write"]);
    for label in ["percentile", "completion latency (µs)", "p99", "p99.9"] {
        assert!(
            texts.iter().any(|t| t == label),
            "no text {label:?} in {texts:?}"
        );
    }
}

#[test]
fn report_plot_has_a_bar_per_rank_and_the_aggregate() {
    let a = Aggregate {
        ranks: 3,
        ranks_expected: 3,
        total_bytes: 3 << 30,
        span_s: 2.0,
        aggregate_gib_per_s: 1.5,
        slowest: (1, "h".into(), 2.0),
        per_rank: vec![
            (0, "h".into(), 1 << 30, 0.8),
            (1, "h".into(), 1 << 30, 0.5),
            (2, "h".into(), 1 << 30, 0.7),
        ],
    };
    let bars = plot::report_bars(&a);
    assert_eq!(
        bars,
        [
            ("rank 0".into(), 0.8),
            ("rank 1".into(), 0.5),
            ("rank 2".into(), 0.7),
            ("aggregate".into(), 1.5)
        ]
    );
    let d = dir();
    let svg = d.path().join("r.svg");
    let drawn = plot::bars_svg(&plot::report_title(&a), "bandwidth (GiB/s)", &bars, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    // Bars are filled rects whose top is where the value maps (the first
    // rect is the background).
    let tops: Vec<i32> = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("fill") != Some("#FFFFFF"))
        .map(|n| n.attribute("y").unwrap().parse::<f64>().unwrap().round() as i32)
        .collect();
    let want: Vec<i32> = drawn.series[0].2.iter().map(|p| p.1).collect();
    assert_eq!(tops.len(), 4, "{tops:?}");
    for (t, w) in tops.iter().zip(&want) {
        assert!((t - w).abs() <= 1, "bar top {t} vs {w}");
    }
    // The tallest bar is the aggregate.
    assert_eq!(tops.iter().min(), tops.last());
    let (_, texts) = parse_svg(&svg);
    for label in ["rank 0", "rank 2", "aggregate", "bandwidth (GiB/s)", "rank"] {
        assert!(texts.iter().any(|t| t == label), "no text {label:?}");
    }
}

#[test]
fn rounds_plot_has_a_line_per_case() {
    let r = plot::Rounds {
        title: "compare-fio flush".into(),
        cases: BTreeMap::from([
            ("pwritev buffered".to_string(), vec![0.9, 1.1, 1.0]),
            ("io_uring direct".to_string(), vec![1.2, 1.3, 1.25]),
        ]),
    };
    let d = dir();
    let svg = d.path().join("f.svg");
    let drawn = plot::line_svg(&plot::rounds_figure(&r), &svg).unwrap();
    let (lines, texts) = parse_svg(&svg);
    assert_lines_drawn(&drawn, &lines, &["pwritev buffered", "io_uring direct"]);
    assert!(texts.iter().any(|t| t == "ratio pagewriter / fio"));
}

#[test]
fn an_unwritable_plot_path_fails_before_the_benchmark_runs() {
    let d = dir();
    for plot_path in [
        d.path().join("missing-dir/s.svg"),
        d.path().to_path_buf(), // a directory
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pagewriter"))
            .args(["scale", "--threads", "1", "--duration", "5", "--path"])
            .arg(d.path())
            .arg("--plot")
            .arg(&plot_path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(&plot_path.display().to_string()), "{err}");
        assert!(
            !err.contains("repeat 1"),
            "a cell ran before the check: {err}"
        );
    }
    let ro = d.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pagewriter"))
        .args(["report"])
        .arg(d.path())
        .arg("--plot")
        .arg(d.path().join("nope/r.svg"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}
