//! proptest drives the fault schedule: random crashes, hangs, partitions, isolations, holds and latency on random
//! members at
//! random times, applied to the failover and watch scenarios. A failing schedule shrinks to the fewest, shortest
//! faults that still break an invariant, and proptest prints it.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use sim::fault::{Fault, FaultPlan, Scheduled};
use sim::scenario::{self, Scenario};

/// One impairment: what, to whom, from when (ms) and for how long (ms).
#[derive(Clone, Debug)]
struct Impairment {
    kind: u8,
    member: usize,
    at_ms: u64,
    for_ms: u64,
}

fn impairment() -> impl Strategy<Value = Impairment> {
    (0u8..7, 0usize..3, 300u64..3000, 100u64..1500).prop_map(|(kind, member, at_ms, for_ms)| {
        Impairment {
            kind,
            member,
            at_ms,
            for_ms,
        }
    })
}

/// Turns impairments into a plan, dropping any that would leave no member healthy (the scenarios promise one
/// reachable member) and healing everything before the quiet period.
fn plan(impairments: &[Impairment]) -> FaultPlan {
    let quiet = scenario::profile(Scenario::Failover, 3).quiet_from;
    let mut accepted: Vec<(Duration, Duration, usize)> = Vec::new();
    let mut faults = Vec::new();
    for imp in impairments {
        let from = Duration::from_millis(imp.at_ms);
        let until = (from + Duration::from_millis(imp.for_ms)).min(quiet);
        let overlapping = |m: usize| {
            accepted
                .iter()
                .any(|(f, u, am)| *am == m && *f < until && from < *u)
        };
        let others_healthy = (0..3)
            .filter(|&m| m != imp.member && !overlapping(m))
            .count();
        if overlapping(imp.member) || others_healthy == 0 || from >= until {
            continue;
        }
        accepted.push((from, until, imp.member));
        let m = imp.member;
        let (start, end) = match imp.kind {
            0 => (Fault::Crash(m), Fault::Restart(m)),
            1 => (Fault::Partition(m), Fault::Repair(m)),
            2 => (
                Fault::PartitionOneWay {
                    member: m,
                    to_member: imp.for_ms % 2 == 0,
                },
                Fault::Repair(m),
            ),
            3 => (Fault::Hold(m), Fault::Release(m)),
            4 => (Fault::Hang(m), Fault::Resume(m)),
            5 => (Fault::Isolate(m), Fault::Rejoin(m)),
            _ => (
                Fault::Latency {
                    member: m,
                    latency: Duration::from_millis(imp.for_ms % 50 + 1),
                },
                Fault::Latency {
                    member: m,
                    latency: Duration::ZERO,
                },
            ),
        };
        faults.push(Scheduled {
            at: from,
            fault: start,
        });
        faults.push(Scheduled {
            at: until,
            fault: end,
        });
    }
    faults.sort_by_key(|s| s.at);
    FaultPlan { faults }
}

proptest! {
    // Each case is a whole simulation (about a second of real time in a debug build), so few cases by default.
    // The generator's seed is fixed (or SIM_SEED), so every run explores the same schedules: a flaky test is broken.
    #![proptest_config(ProptestConfig {
        cases: 6,
        max_shrink_iters: 64,
        rng_seed: RngSeed::Fixed(sim::seeds::sweep()[0] ^ 0x5eed),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn failover_holds_under_any_schedule(seed in 0u64..1_000_000, impairments in prop::collection::vec(impairment(), 0..5)) {
        let mut settings = scenario::settings(Scenario::Failover, seed);
        settings.plan = Some(plan(&impairments));
        let report = scenario::run_with(Scenario::Failover, settings);
        prop_assert!(report.passed(), "{}", report.failure_text());
    }

    #[test]
    fn watch_completeness_holds_under_any_schedule(seed in 0u64..1_000_000, impairments in prop::collection::vec(impairment(), 0..5)) {
        let mut settings = scenario::settings(Scenario::Watch, seed);
        settings.plan = Some(plan(&impairments));
        let report = scenario::run_with(Scenario::Watch, settings);
        prop_assert!(report.passed(), "{}", report.failure_text());
    }
}
