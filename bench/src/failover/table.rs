//! The failover run in markdown: per fault kind and route the reads, failures and failures per minute of fault;
//! this proxy's replacement times; every fault on a line of its own; the most frequent errors.

use std::fmt::Write as _;

use super::load::Via;
use super::tally::{Counts, FailoverReport, Fault, Phase, count, percentile};

/// How many distinct error messages are listed per route and fault kind.
const ERRORS_SHOWN: usize = 3;

pub fn render(report: &FailoverReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Failover: etcd {}, 3 members, loopback\n\n\
         Each fault kind: fresh proxies (default flags, the three members as `--endpoints`); per route one reader \
         (linearizable Range) and one writer (Put), one call at a time, a call every {} ms, {} s client timeout; \
         {} round(s), each faulting every member once (this proxy's active member first), {} s per fault.\n\n\
         Command: `{}`. Machine: {}.\n",
        report.etcd_version,
        report.pace_ms,
        report.client_timeout_seconds,
        report.rounds,
        report.fault_seconds,
        report.command,
        report.machine,
    );
    out.push_str(&routes_table(report));
    out.push_str(&replacement_table(report));
    out.push_str(&faults_table(report));
    out.push_str(&errors(report));
    let loads: Vec<String> = report
        .phases
        .iter()
        .map(|p| {
            let show = |l: Option<f64>| l.map_or("?".into(), |l| format!("{l:.1}"));
            format!(
                "{} {} → {}",
                p.kind.label(),
                show(p.load_average.0),
                show(p.load_average.1)
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "\nMachine load (1-minute load average at the start → end of each phase): {}.",
        loads.join("; ")
    );
    for phase in &report.phases {
        if let Some(failure) = &phase.failure {
            let _ = writeln!(
                out,
                "\n**{} phase stopped early:** {failure}",
                phase.kind.label()
            );
        }
    }
    out
}

/// Counts by fault kind and route; for this proxy also over the faults of its active member alone.
fn routes_table(report: &FailoverReport) -> String {
    let mut out = String::from(
        "| fault | route | faults | fault s | reads | failed reads | failed reads / min of fault | writes | \
         failed writes | slowest ok read s | failed outside faults (r/w) |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    let timeout = report.client_timeout_seconds;
    for phase in &report.phases {
        for via in Via::ALL {
            let all = count(phase, via, timeout, |_| true);
            out.push_str(&route_row(phase, via.label(), &all));
            if via == Via::ThisProxy {
                let active = count(phase, via, timeout, |f| f.this_proxys_active);
                out.push_str(&route_row(
                    phase,
                    "this proxy, its active member faulted",
                    &active,
                ));
            }
        }
    }
    out.push('\n');
    out
}

fn route_row(phase: &Phase, route: &str, c: &Counts) -> String {
    format!(
        "| {} | {route} | {} | {:.1} | {} | {} | {} | {} | {} | {:.2} | {}/{} |\n",
        phase.kind.label(),
        c.faults,
        c.fault_seconds,
        c.reads,
        c.failed_reads,
        c.failed_reads_per_minute()
            .map_or("–".into(), |r| format!("{r:.1}")),
        c.writes,
        c.failed_writes,
        c.slowest_read_s,
        c.failed_outside.0,
        c.failed_outside.1,
    )
}

/// Replacement of this proxy's active member: from injection to its `/metrics` naming another member active.
fn replacement_table(report: &FailoverReport) -> String {
    let mut out = String::from(
        "Time to replace this proxy's active endpoint (fault injected → its `/metrics` names another member active; \
         polled every 10 ms; nearest-rank percentiles, so with under 100 faults p99 is the slowest):\n\n\
         | fault | faults of its active member | replaced | p50 ms | p99 ms | failovers per fault |\n\
         |---|--:|--:|--:|--:|---|\n",
    );
    for phase in &report.phases {
        let active: Vec<&Fault> = phase
            .faults
            .iter()
            .filter(|f| f.this_proxys_active)
            .collect();
        let times: Vec<f64> = active.iter().filter_map(|f| f.replaced_after_s).collect();
        let ms = |p| percentile(&times, p).map_or("–".into(), |s| format!("{:.0}", s * 1000.0));
        let failovers: Vec<String> = phase
            .faults
            .iter()
            .map(|f| f.failovers.map_or("?".into(), |n| format!("{n:.0}")))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            phase.kind.label(),
            active.len(),
            times.len(),
            ms(50.0),
            ms(99.0),
            failovers.join(", ")
        );
    }
    out.push('\n');
    out
}

/// Every fault: which member, what it was, how long, and each route's failures in its window.
fn faults_table(report: &FailoverReport) -> String {
    let mut out = String::from(
        "Every fault (failed reads / failed writes per route: this proxy; Go proxy; etcdctl):\n\n\
         | fault | round | member | leader | this proxy's active | fault s | replaced after ms | this | Go | etcdctl | notes |\n\
         |---|--:|--:|---|---|--:|--:|--:|--:|--:|---|\n",
    );
    let timeout = report.client_timeout_seconds;
    for phase in &report.phases {
        for (i, fault) in phase.faults.iter().enumerate() {
            let failures = |via| {
                let c = count(phase, via, timeout, |f| std::ptr::eq(f, &phase.faults[i]));
                format!("{}/{}", c.failed_reads, c.failed_writes)
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} |",
                phase.kind.label(),
                fault.round + 1,
                fault.member,
                fault.leader.map_or("?", |l| if l { "yes" } else { "no" }),
                if fault.this_proxys_active {
                    "yes"
                } else {
                    "no"
                },
                fault.seconds(),
                fault
                    .replaced_after_s
                    .map_or("–".into(), |s| format!("{:.0}", s * 1000.0)),
                failures(Via::ThisProxy),
                failures(Via::GoProxy),
                failures(Via::Etcdctl),
                fault.notes.join("; "),
            );
        }
    }
    out.push('\n');
    out
}

/// The most frequent error messages per fault kind and route.
fn errors(report: &FailoverReport) -> String {
    let mut out = String::from("Most frequent errors in fault windows:\n\n");
    let mut any = false;
    for phase in &report.phases {
        for via in Via::ALL {
            let counts = count(phase, via, report.client_timeout_seconds, |_| true);
            let mut errors: Vec<(&String, &usize)> = counts.errors.iter().collect();
            errors.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            for (message, n) in errors.into_iter().take(ERRORS_SHOWN) {
                any = true;
                let _ = writeln!(
                    out,
                    "- {}, {}: {n} × `{}`",
                    phase.kind.label(),
                    via.label(),
                    message.replace('`', "'")
                );
            }
        }
    }
    if !any {
        out.push_str("- none\n");
    }
    out
}
