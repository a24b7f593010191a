//! SVG charts drawn with `plotters`: for each etcd version, throughput, p99 latency, the load that reached etcd,
//! the watch fan-out's put-to-last-delivery p99 and the proxies' CPU per operation, one panel per scenario case
//! with one bar per target (each panel has its own scale: the scenarios count different things). Write-to-visible
//! has no bars (a target that never shows a write has no latency, and a zero bar would read as the best); its
//! table says it all.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::plan::{Scenario, Target};
use crate::results::{Report, ScenarioResult, TargetSummary, VersionResult};

const PANEL_COLUMNS: usize = 3;
const PANEL_WIDTH: u32 = 420;
const PANEL_HEIGHT: u32 = 300;

/// One chart: which number of a summary it shows, for which scenarios.
struct Metric {
    file_suffix: &'static str,
    title: &'static str,
    unit: &'static str,
    value: fn(&TargetSummary) -> f64,
    /// The scenarios the number means something for (a chart with none of them is not drawn).
    applies: fn(Scenario) -> bool,
}

const METRICS: [Metric; 5] = [
    Metric {
        file_suffix: "throughput",
        title: "throughput (median)",
        unit: "ops/s",
        value: |s| s.throughput,
        applies: throughput_scenario,
    },
    Metric {
        file_suffix: "p99",
        title: "p99 latency (median)",
        unit: "ms",
        value: |s| s.p99_ms,
        applies: throughput_scenario,
    },
    Metric {
        file_suffix: "upstream",
        title: "load reaching etcd per client op (1 = all of it)",
        unit: "etcd ops per client op",
        value: |s| s.upstream_per_client,
        applies: throughput_scenario,
    },
    Metric {
        file_suffix: "fanout-p99",
        title: "p99 from a put to its last watcher's delivery",
        unit: "ms",
        value: |s| s.fanout_p99_ms.unwrap_or(f64::NAN),
        applies: |s| s == Scenario::WatchFanout,
    },
    Metric {
        file_suffix: "proxy-cpu",
        title: "proxy CPU per operation (event, keep-alive, request)",
        unit: "µs per op",
        value: |s| s.proxy_cpu_ms_per_1k.unwrap_or(f64::NAN),
        applies: throughput_scenario,
    },
];

/// A bar's name, short enough for five bars in a panel.
fn bar_label(target: Target) -> &'static str {
    match target {
        Target::Direct => "direct",
        Target::GoProxy => "go-proxy",
        Target::RustProxy => "this",
        Target::RustProxyNoCache => "this-nocache",
        Target::BaselineProxy => "baseline",
    }
}

/// Every scenario but write-to-visible, which measures no operations per second.
fn throughput_scenario(scenario: Scenario) -> bool {
    scenario != Scenario::WriteToVisible
}

fn color(target: Target) -> RGBColor {
    match target {
        Target::Direct => RGBColor(120, 120, 120),
        Target::GoProxy => RGBColor(31, 119, 180),
        Target::RustProxy => RGBColor(230, 120, 20),
        Target::RustProxyNoCache => RGBColor(240, 190, 120),
        Target::BaselineProxy => RGBColor(44, 160, 44),
    }
}

/// Draws every chart of `report` into `dir`; returns the files written.
pub fn draw_all(report: &Report, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for version in report.versions.iter().filter(|v| !v.scenarios.is_empty()) {
        for metric in &METRICS {
            if !version
                .scenarios
                .iter()
                .any(|s| (metric.applies)(s.scenario))
            {
                continue;
            }
            let path = dir.join(format!(
                "{}-{}-{}.svg",
                report.name, version.version, metric.file_suffix
            ));
            draw(version, metric, &path)
                .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
            written.push(path);
        }
    }
    Ok(written)
}

fn draw(
    version: &VersionResult,
    metric: &Metric,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let scenarios: Vec<&ScenarioResult> = version
        .scenarios
        .iter()
        .filter(|s| (metric.applies)(s.scenario))
        .collect();
    let panels = scenarios.len();
    let rows = panels.div_ceil(PANEL_COLUMNS);
    let size = (
        PANEL_WIDTH * PANEL_COLUMNS as u32,
        PANEL_HEIGHT * rows as u32 + 40,
    );
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    // The baseline build is named only in the charts that have its bars: without it, nothing changes.
    let baseline = scenarios
        .iter()
        .any(|s| s.summary(Target::BaselineProxy).is_some());
    let root = root.titled(
        &format!(
            "etcd {}: {} — direct (grey), Go proxy (blue), this proxy (orange; light: cache off){}",
            version.version,
            metric.title,
            if baseline {
                ", baseline build (green)"
            } else {
                ""
            }
        ),
        ("sans-serif", 18),
    )?;
    let areas = root.split_evenly((rows, PANEL_COLUMNS));
    for (scenario, area) in scenarios.iter().zip(areas.iter()) {
        let bars: Vec<(Target, f64)> = scenario
            .summaries
            .iter()
            .map(|s| (s.target, (metric.value)(s)))
            .map(|(t, v)| (t, if v.is_finite() { v } else { 0.0 }))
            .collect();
        let top = bars.iter().map(|(_, v)| *v).fold(0.0, f64::max);
        let top = if top > 0.0 { top * 1.2 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(scenario.name(), ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(56)
            .build_cartesian_2d((0u32..bars.len() as u32).into_segmented(), 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            // Only the labelled grid lines: the fine ones in between clutter small panels.
            .light_line_style(TRANSPARENT)
            .y_desc(metric.unit)
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => bars
                    .get(*i as usize)
                    .map_or(String::new(), |(t, _)| bar_label(*t).into()),
                _ => String::new(),
            })
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (target, value))| {
            let i = i as u32;
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), *value),
                ],
                color(*target).filled(),
            );
            bar.set_margin(0, 0, 14, 14);
            bar
        }))?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, value))| {
            Text::new(
                short(*value),
                (SegmentValue::CenterOf(i as u32), *value + top * 0.02),
                ("sans-serif", 12),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}

/// A bar's label: three significant figures, k for thousands.
fn short(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.1}k", value / 1000.0)
    } else if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}
