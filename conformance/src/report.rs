//! Outcomes per scenario, target, flag profile, backend and version, and the table `cargo test -p conformance` prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use testkit::{Backend, Version};

use crate::target::TargetKind;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Passed,
    Failed(String),
    Skipped(String),
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub scenario: String,
    pub target: TargetKind,
    /// The proxy's flag profile (`None` for direct etcd and the model).
    pub profile: Option<&'static str>,
    pub backend: Backend,
    pub version: Version,
    pub status: Status,
}

impl Outcome {
    /// The profile column: its name, `-` where no proxy runs.
    pub fn profile_label(&self) -> &'static str {
        self.profile.unwrap_or("-")
    }

    /// `proxy (default)`, `direct`, `model`: for failure and skip lines.
    pub fn target_label(&self) -> String {
        match self.profile {
            Some(p) => format!("{} ({p} profile)", self.target),
            None => self.target.to_string(),
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Counts {
    passed: usize,
    failed: usize,
    skipped: usize,
}

/// The summary table, then every failure and every distinct skip reason.
pub fn render(outcomes: &[Outcome]) -> String {
    let mut rows: BTreeMap<(TargetKind, &'static str, Backend, Version), Counts> = BTreeMap::new();
    for o in outcomes {
        let c = rows
            .entry((o.target, o.profile_label(), o.backend, o.version))
            .or_default();
        match o.status {
            Status::Passed => c.passed += 1,
            Status::Failed(_) => c.failed += 1,
            Status::Skipped(_) => c.skipped += 1,
        }
    }
    // The profile column is as wide as its longest name.
    let w = rows
        .keys()
        .map(|(_, profile, _, _)| profile.len())
        .fold("profile ".len(), usize::max);
    let mut s = String::new();
    let _ = writeln!(s, "\nconformance report");
    let _ = writeln!(
        s,
        "| target    | {:<w$} | backend        | etcd   | passed | failed | skipped |",
        "profile"
    );
    let _ = writeln!(
        s,
        "|-----------|{}|----------------|--------|--------|--------|---------|",
        "-".repeat(w + 2)
    );
    for ((target, profile, backend, version), c) in &rows {
        let _ = writeln!(
            s,
            "| {:<9} | {:<w$} | {:<14} | {:<6} | {:>6} | {:>6} | {:>7} |",
            target.to_string(),
            profile,
            backend.to_string(),
            version.name(),
            c.passed,
            c.failed,
            c.skipped
        );
    }
    let mut skips: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for o in outcomes {
        if let Status::Skipped(reason) = &o.status {
            skips
                .entry(format!(
                    "{} on {} etcd {}: {reason}",
                    o.target_label(),
                    o.backend,
                    o.version
                ))
                .or_default()
                .push(o.scenario.clone());
        }
    }
    for (reason, scenarios) in &skips {
        let _ = writeln!(s, "skipped: {reason} [{}]", scenarios.join(", "));
    }
    for o in outcomes {
        if let Status::Failed(why) = &o.status {
            let _ = writeln!(
                s,
                "\nFAILED {} on {} ({} etcd {}):\n{why}",
                o.scenario,
                o.target_label(),
                o.backend,
                o.version
            );
        }
    }
    s
}

/// The closing line CI reads: `N passed, N failed, N skipped`.
pub fn totals(outcomes: &[Outcome]) -> (usize, usize, usize) {
    let mut t = (0, 0, 0);
    for o in outcomes {
        match o.status {
            Status::Passed => t.0 += 1,
            Status::Failed(_) => t.1 += 1,
            Status::Skipped(_) => t.2 += 1,
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(profile: Option<&'static str>, status: Status) -> Outcome {
        Outcome {
            scenario: "kv/put-get".into(),
            target: if profile.is_some() {
                TargetKind::Proxy
            } else {
                TargetKind::Direct
            },
            profile,
            backend: Backend::Process,
            version: Version::ALL[0],
            status,
        }
    }

    #[test]
    fn the_table_fits_the_longest_profile_name_and_lists_failures() {
        let outcomes = [
            outcome(None, Status::Passed),
            outcome(Some("default"), Status::Passed),
            outcome(Some("namespace"), Status::Failed("differs".into())),
            Outcome {
                target: TargetKind::Container,
                ..outcome(Some("container"), Status::Passed)
            },
        ];
        let table = render(&outcomes);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(rows.len(), 6, "{table}");
        let width = rows[0].len();
        assert!(rows.iter().all(|r| r.len() == width), "{table}");
        assert!(rows[4].contains("| namespace |"), "{table}");
        assert!(
            table.contains("FAILED kv/put-get on proxy (namespace profile)"),
            "{table}"
        );
        assert!(rows[5].starts_with("| container | container "), "{table}");
        assert_eq!(totals(&outcomes), (3, 1, 0));
    }
}
