//! `cargo test -p conformance [-- FILTER...]`: replays every scenario of `testdata/conformance` on every
//! backend and etcd version found here, directly and through the proxy binary under every flag profile
//! (`CONFORMANCE_PROFILES=a,b` selects some), prints the report table, and fails on any failure. A missing backend
//! is a skip with a message naming the script that installs it, and a failure under `CI=true`.

use std::path::PathBuf;

use conformance::profile;
use conformance::report::{self, Outcome, Status};
use conformance::scenario;
use conformance::suite::{self, Context};
use futures::StreamExt as _;
use testkit::{Backend, Spec};

/// How many backend-and-version groups run at once.
const GROUPS_AT_ONCE: usize = 3;

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // Failures are collected and reported in the table; a panic (an insta mismatch, caught per scenario) should
    // print its message, not a backtrace per scenario.
    std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let failed = runtime.block_on(run(filters));
    // Dropped before exiting, so that whatever a task still holds (processes are killed on drop) goes with it.
    drop(runtime);
    if failed {
        std::process::exit(1);
    }
}

async fn run(filters: Vec<String>) -> bool {
    let started = tokio::time::Instant::now();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance");
    let mut scenarios =
        scenario::load_all(&root).unwrap_or_else(|e| panic!("loading scenarios: {e}"));
    if !filters.is_empty() {
        scenarios.retain(|s| filters.iter().any(|f| s.id.contains(f.as_str())));
    }
    let differences = conformance::differences::load(&root.join("differences.txt"))
        .unwrap_or_else(|e| panic!("loading differences: {e}"));
    let profiles = profile::selected().unwrap_or_else(|e| panic!("{e}"));
    let setup =
        profile::Setup::new(&profiles).unwrap_or_else(|e| panic!("setting the profiles up: {e}"));
    let ctx = Context {
        snapshots: root.join("snapshots"),
        differences,
        profiles,
        setup,
    };
    // Built (or confirmed up to date) once, before any group starts: the build blocks the thread that asks.
    if let Err(e) = testkit::proxy::binary() {
        panic!("the proxy's release binary: {e}");
    }
    let specs = testkit::etcd::discover().await;
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut runs = Vec::new();
    // The model runs once, next to the newest etcd available as a process: its answers are compared with that
    // etcd's, through that version's etcdctl.
    let model_spec = specs
        .iter()
        .rev()
        .find(|s| s.backend == Backend::Process && s.missing().is_none())
        .map(Spec::label);
    for spec in &specs {
        match spec.missing() {
            Some(why) => {
                let status = if testkit::ci() {
                    Status::Failed(format!("backend missing under CI=true: {why}"))
                } else {
                    eprintln!("SKIPPED {}: {why}", spec.label());
                    Status::Skipped(format!("backend missing: {why}"))
                };
                for sc in &scenarios {
                    for lane in ctx.lanes(spec.backend, spec.version) {
                        outcomes.push(Outcome {
                            scenario: sc.id.clone(),
                            target: lane.target(),
                            profile: lane.profile(),
                            backend: spec.backend,
                            version: spec.version,
                            status: status.clone(),
                        });
                    }
                }
            }
            None => runs.push(suite::run_group(
                spec,
                &scenarios,
                &ctx,
                model_spec.as_deref() == Some(spec.label().as_str()),
            )),
        }
    }
    eprintln!(
        "conformance: {} scenarios on {} backend(s) and version(s), through the proxy binary under {} profile(s)",
        scenarios.len(),
        runs.len(),
        ctx.profiles.len()
    );
    // Groups run a few at a time: each runs two lanes of etcdctl processes, and a 2-core machine running every
    // group at once slows etcd's answers towards etcdctl's timeouts.
    let groups: Vec<Vec<Outcome>> = futures::stream::iter(runs)
        .buffer_unordered(GROUPS_AT_ONCE)
        .collect()
        .await;
    outcomes.extend(groups.into_iter().flatten());
    outcomes.sort_by(|a, b| {
        (a.target, a.profile, a.backend, a.version, &a.scenario).cmp(&(
            b.target,
            b.profile,
            b.backend,
            b.version,
            &b.scenario,
        ))
    });
    println!("{}", report::render(&outcomes));
    let (passed, failed, skipped) = report::totals(&outcomes);
    println!(
        "conformance: {passed} passed, {failed} failed, {skipped} skipped in {} s",
        started.elapsed().as_secs()
    );
    failed > 0
}
