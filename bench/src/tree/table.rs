//! `bench tree`'s report in markdown: a warning per tree whose clients lost or repeated events, the summary table
//! (one row per tree, then this tree's figures over the Go tree's), the details, and how the run was made.

use std::fmt::Write as _;

use super::report::{Ratios, TreeReport, TreeRun};
use super::usage::ByTier;
use crate::load::recorder::Latency;

pub fn render(report: &TreeReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Watch fan-out through a tree of proxies: etcd {}\n\n\
         One etcd member; one mid proxy in front of it; {} leaf proxies in front of the mid proxy. {} watchers on \
         one key, {} per Watch stream, the streams spread evenly over the leaves (connections per leaf: {}). After \
         every watcher was created and had received one warm-up event, a writer put the key straight to etcd at {} \
         puts/s for {} s ({} puts, {} B values). Each tree ran on a fresh etcd, one tree after the other; every \
         process on this machine's loopback.\n",
        report.etcd_version,
        report.leaves,
        report.watchers,
        report.watchers_per_stream,
        report.connections_per_leaf,
        report.put_rate,
        report.measure_seconds,
        report.planned_puts(),
        report.value_size,
    );
    for tree in &report.trees {
        let losses = tree.losses(report.planned_puts());
        if !losses.is_empty() {
            let _ = writeln!(
                out,
                "**WARNING: the {} tree's clients did not get exactly every event:**\n",
                tree.target.label()
            );
            for loss in losses {
                let _ = writeln!(out, "- {}", loss.replace('\n', "\n  "));
            }
            out.push('\n');
        }
    }
    out.push_str(&summary(report));
    out.push_str(&details(report));
    let load = |l: Option<f64>| l.map_or("?".into(), |l| format!("{l:.2}"));
    let _ = writeln!(
        out,
        "\nCommand: `{}`. Machine: {}. Machine load (1-minute load average) {} at the start, {} at the end. CPU \
         times read from `/proc/PID/stat` at {} ticks per second.",
        report.command,
        report.machine,
        load(report.load_average.0),
        load(report.load_average.1),
        report.clock_ticks_per_second,
    );
    for tree in &report.trees {
        for problem in &tree.measured.problems {
            let _ = writeln!(
                out,
                "\nMetering problem ({}): {problem}",
                tree.target.label()
            );
        }
    }
    out
}

/// One row per tree, then the ratios.
fn summary(report: &TreeReport) -> String {
    let mut out = String::from(
        "| tree | watchers on etcd | fan-out p50 / p99 / max ms | missing / duplicate events | CPU etcd | CPU mid \
         proxy | CPU leaves (sum) | CPU leaf (max) | CPU bench client |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for tree in &report.trees {
        let cpu = tree.measured.cpu;
        let tier =
            |f: fn(&ByTier) -> f64| cpu.as_ref().map_or("?".into(), |c| format!("{:.3}", f(c)));
        let _ = writeln!(
            out,
            "| {} | {} (before: {}) | {} | {} | {} | {} | {} | {} | {} |",
            tree.target.label(),
            tree.measured
                .etcd
                .map_or("?".into(), |g| g.watchers.describe()),
            optional(tree.etcd_watchers_before),
            latency(tree.watch.as_ref().and_then(|w| w.fanout.as_ref())),
            tree.watch
                .as_ref()
                .map_or("?".into(), |w| format!("{} / {}", w.missing, w.duplicates)),
            tier(|c| c.etcd),
            tier(|c| c.mid),
            tier(|c| c.leaves_sum),
            tier(|c| c.leaf_max),
            tier(|c| c.bench),
        );
    }
    if let Some(r) = Ratios::of(report) {
        let _ = writeln!(
            out,
            "| **this / Go** | | p99 {} | | {} | {} | {} | {} | |",
            ratio(r.fanout_p99),
            ratio(r.cpu.etcd),
            ratio(r.cpu.mid),
            ratio(r.cpu.leaves_sum),
            ratio(r.cpu.leaf_max),
        );
    }
    out.push_str(
        "\nWatchers on etcd: `etcd_debugging_mvcc_watcher_total` during the measured window (lowest–highest when \
         it moved), and before the clients' watchers were created (the proxies' own: this proxy's mid proxy keeps a \
         range-cache watch on key `a`, which the leaves' `/health` reads). Fan-out: from a put's issue to the moment its last watcher received it, over the puts. CPU: CPU \
         seconds per second of the measured window (1.00 is one core busy). this / Go: this tree's figure over the \
         Go tree's (below 1: faster or cheaper).\n",
    );
    out
}

/// Deliveries, etcd's gauges before and during, memory, the window.
fn details(report: &TreeReport) -> String {
    let mut out = String::from(
        "\n| tree | watchers created / warmed up | Watch streams | puts | events delivered / expected | every \
         delivery p50 / p99 / max ms | etcd watchers before → during | etcd watch streams before → during | peak \
         RSS MiB: etcd / mid / leaves (sum) / leaf (max) / bench | window s | load before → after |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for tree in &report.trees {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} → {} | {} → {} | {} | {:.1} | {} |",
            tree.target.label(),
            tree.watch.as_ref().map_or("?".into(), |w| format!(
                "{} / {}",
                w.watchers_created,
                w.warmed.map_or("-".into(), |n| n.to_string())
            )),
            tree.watch
                .as_ref()
                .map_or("?".into(), |w| w.streams.to_string()),
            tree.watch
                .as_ref()
                .map_or("?".into(), |w| w.puts.to_string()),
            tree.watch
                .as_ref()
                .map_or("?".into(), |w| format!("{} / {}", w.delivered, w.expected)),
            latency(tree.deliveries.as_ref().and_then(|d| d.latency.as_ref())),
            optional(tree.etcd_watchers_before),
            tree.measured
                .etcd
                .map_or("?".into(), |g| g.watchers.describe()),
            optional(tree.etcd_watch_streams_before),
            tree.measured
                .etcd
                .map_or("?".into(), |g| g.watch_streams.describe()),
            memory(tree),
            tree.measured.window_seconds,
            {
                let load = |l: Option<f64>| l.map_or("?".into(), |l| format!("{l:.2}"));
                format!(
                    "{} → {}",
                    load(tree.load_average.0),
                    load(tree.load_average.1)
                )
            },
        );
    }
    out
}

fn memory(tree: &TreeRun) -> String {
    tree.measured.peak_rss_mib.map_or("?".into(), |m| {
        format!(
            "{:.0} / {:.0} / {:.0} / {:.0} / {:.0}",
            m.etcd, m.mid, m.leaves_sum, m.leaf_max, m.bench
        )
    })
}

fn latency(latency: Option<&Latency>) -> String {
    latency.map_or("-".into(), |l| {
        format!("{:.1} / {:.1} / {:.1}", l.p50_ms, l.p99_ms, l.max_ms)
    })
}

fn optional(value: Option<f64>) -> String {
    value.map_or("?".into(), |v| v.to_string())
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::recorder::Tally;
    use crate::load::watch::WatchStats;
    use crate::tree::TreeTarget;
    use crate::tree::etcd_gauges::{GaugesDuring, Range};
    use crate::tree::probe::Measured;

    fn ms(p50_ms: f64, p99_ms: f64, max_ms: f64) -> Latency {
        Latency {
            p50_ms,
            p99_ms,
            max_ms,
        }
    }

    fn run(
        target: TreeTarget,
        fanout_p99: f64,
        cpu_mid: f64,
        missing: u64,
        etcd_watchers: f64,
    ) -> TreeRun {
        TreeRun {
            target,
            failure: None,
            watch: Some(WatchStats {
                watchers: 100,
                watchers_created: 100,
                streams: 4,
                puts: 10,
                expected: 1000,
                delivered: 1000 - missing,
                completeness: 1.0,
                puts_complete: if missing > 0 { 9 } else { 10 },
                fanout: Some(ms(2.0, fanout_p99, fanout_p99 + 1.0)),
                idle_memory: None,
                warmed: Some(100),
                missing,
                duplicates: 0,
            }),
            deliveries: Some(Tally {
                completed: 1000,
                errors: 0,
                error_samples: Vec::new(),
                seconds: 2.0,
                throughput: 500.0,
                latency: Some(ms(1.0, 3.0, 4.0)),
            }),
            etcd_watchers_before: Some(0.0),
            etcd_watch_streams_before: Some(1.0),
            measured: Measured {
                window_seconds: 2.0,
                cpu: Some(ByTier {
                    etcd: 0.1,
                    mid: cpu_mid,
                    leaves_sum: 0.4,
                    leaf_max: 0.2,
                    bench: 0.9,
                }),
                peak_rss_mib: Some(ByTier {
                    etcd: 30.0,
                    mid: 20.0,
                    leaves_sum: 40.0,
                    leaf_max: 21.0,
                    bench: 50.0,
                }),
                etcd: Some(GaugesDuring {
                    watchers: Range {
                        min: etcd_watchers,
                        max: etcd_watchers,
                    },
                    watch_streams: Range { min: 1.0, max: 2.0 },
                    samples: 4,
                }),
                problems: Vec::new(),
            },
            unhealthy: Vec::new(),
            load_average: (Some(0.5), Some(1.5)),
        }
    }

    fn report(trees: Vec<TreeRun>) -> TreeReport {
        TreeReport {
            etcd_version: "3.5.30".into(),
            command: "bench tree".into(),
            machine: "test".into(),
            leaves: 2,
            watchers: 100,
            watchers_per_stream: 25,
            connections_per_leaf: 1,
            put_rate: 5.0,
            measure_seconds: 2.0,
            value_size: 64,
            clock_ticks_per_second: 100.0,
            load_average: (Some(0.5), Some(2.0)),
            trees,
        }
    }

    #[test]
    fn the_summary_has_a_row_per_tree_and_this_trees_figures_over_the_go_trees() {
        let md = render(&report(vec![
            run(TreeTarget::This, 5.0, 0.1, 0, 1.0),
            run(TreeTarget::Go, 20.0, 0.4, 0, 3.0),
        ]));
        assert!(
            md.contains(
                "| this proxy | 1 (before: 0) | 2.0 / 5.0 / 6.0 | 0 / 0 | 0.100 | 0.100 | 0.400 | 0.200 | 0.900 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| Go proxy | 3 (before: 0) | 2.0 / 20.0 / 21.0 | 0 / 0 |"),
            "{md}"
        );
        assert!(
            md.contains("| **this / Go** | | p99 0.25 | | 1.00 | 0.25 | 1.00 | 1.00 | |"),
            "{md}"
        );
        assert!(
            md.contains("| 0 → 1 | 1 → 1–2 | 30 / 20 / 40 / 21 / 50 | 2.0 | 0.50 → 1.50 |"),
            "{md}"
        );
        assert!(
            !md.contains("WARNING"),
            "a clean run warns of nothing:\n{md}"
        );
    }

    #[test]
    fn missing_events_and_a_failed_tree_are_announced_before_the_figures() {
        let failed = TreeRun::failed(
            TreeTarget::Go,
            "the mid proxy did not start".into(),
            (None, None),
        );
        let md = render(&report(vec![
            run(TreeTarget::This, 5.0, 0.1, 7, 1.0),
            failed,
        ]));
        let warning = md
            .find("**WARNING: the this proxy tree's clients did not get exactly every event:**")
            .expect("a warning for the lossy tree");
        assert!(warning < md.find("| tree |").expect("a table"), "{md}");
        assert!(
            md.contains("- 7 events missing (1 of 10 puts did not reach every watcher)"),
            "{md}"
        );
        assert!(
            md.contains("- not measured: the mid proxy did not start"),
            "{md}"
        );
        assert!(
            !md.contains("**this / Go**"),
            "no ratios without both trees:\n{md}"
        );
    }

    #[test]
    fn losses_name_every_shortfall() {
        let mut tree = run(TreeTarget::This, 5.0, 0.1, 0, 1.0);
        assert_eq!(tree.losses(10), Vec::<String>::new());
        let watch = tree.watch.as_mut().expect("stats");
        watch.watchers_created = 90;
        watch.warmed = Some(80);
        watch.duplicates = 2;
        watch.puts = 8;
        assert_eq!(
            tree.losses(10),
            vec![
                "only 90 of 100 watchers were created".to_string(),
                "only 80 of 90 watchers received the warm-up event".into(),
                "2 events received twice (or out of order)".into(),
                "only 8 of 10 puts were acknowledged".into(),
            ]
        );
    }
}
