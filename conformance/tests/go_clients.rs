//! `cargo test -p conformance --test go_clients`: Go's etcd clients (clientv3 v3.7.3, Kubernetes' storage layer of
//! k8s.io/apiserver v0.37.2; the module `goclients/`) against etcd directly and through the proxy binary, on
//! etcd 3.5.30 and the newest etcd, each run on a fresh three-member cluster: on the newest directly and under the
//! `default`, `namespace`, `cache` and `chain` profiles; on 3.5.30 directly and under `default` (where RangeStream
//! is the proxy's own, built from Range calls). The `leasing` package starts a proxy of its own with
//! `--experimental-leasing-prefix` (through the control endpoint, with the run's profile flags) beside Go's leasing
//! KV on the members, on every run. Prints a table of every package on
//! every run and fails on any failed Go test, or on a run where a package passed no test at all.
//!
//! Selection (all optional): `TESTKIT_ETCD_VERSIONS=3.7.3` (else 3.5.30 and the newest), `GOCLIENTS_TARGETS=direct,
//! default,namespace,cache,chain` (the proxy's profiles by name, on every version), `GOCLIENTS_PACKAGES=kube`,
//! `GOCLIENTS_RUN=<go test -run regexp>`, `GOCLIENTS_RUNS_AT_ONCE=N` (else 2), `GOCLIENTS_MEASURE=1` (the Go
//! measurement tests run too; the table shows what they measured). A missing Go or etcd is a skip with a message,
//! and a failure under `CI=true`.

use std::sync::Arc;
use tokio::time::Instant;

use conformance::go_clients::control::Control;
use conformance::go_clients::fleet::{Fleet, Target};
use conformance::go_clients::{self, Package, Tally};
use conformance::profile;
use futures::StreamExt as _;
use testkit::Version;

/// The proxy's profiles the Go tests run under: those that change what a client sees of the proxy (TLS changes only
/// the transport, which the conformance suite covers).
const PROFILES: &[&str] = &["default", "namespace", "cache", "chain"];

struct RunResult {
    version: Version,
    target: Target,
    packages: Vec<(String, Result<Tally, String>, f64)>,
    peak_rss_kib: Vec<u64>,
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let failed = runtime.block_on(run());
    // Dropped before exiting: that drops every task still holding a run's processes (the control endpoint's), and
    // with them the processes, killed on drop. `exit` alone would leave them running after a failed run.
    drop(runtime);
    if failed {
        std::process::exit(1);
    }
}

fn env_list(name: &str) -> Option<Vec<String>> {
    std::env::var(name).ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

fn skip_or_fail(why: &str) -> bool {
    if testkit::ci() {
        eprintln!("go_clients: FAILED under CI=true: {why}");
        true
    } else {
        eprintln!("go_clients: SKIPPED: {why}");
        false
    }
}

async fn run() -> bool {
    let Some(go) = go_clients::go() else {
        return skip_or_fail(
            "no Go command (set GO, or put go on the PATH; Go is installed at /usr/local/go)",
        );
    };
    let versions = match std::env::var("TESTKIT_ETCD_VERSIONS") {
        Ok(_) => Version::selected(),
        Err(_) => vec![Version::V3_5_30, Version::NEWEST],
    };
    let targets = match targets() {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    if let Err(e) = testkit::proxy::binary() {
        panic!("the proxy's release binary: {e}");
    }
    let out = tempfile::tempdir().expect("temp dir for the Go test binaries");
    let started = Instant::now();
    let mut packages = match go_clients::build(&go, out.path()).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("go_clients: {e}");
            return true;
        }
    };
    eprintln!(
        "go_clients: built {} package(s) in {:.0} s",
        packages.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(only) = env_list("GOCLIENTS_PACKAGES") {
        packages.retain(|p| only.contains(&p.name));
    }
    if packages.is_empty() {
        eprintln!("go_clients: no Go test package selected");
        return true;
    }
    let mut failed = false;
    let mut runs = Vec::new();
    for version in versions {
        let Some(binaries) = version.require() else {
            failed |= skip_or_fail(&format!("etcd {version} is not installed"));
            continue;
        };
        let on_version = targets.clone().unwrap_or_else(|| default_targets(version));
        for &target in &on_version {
            runs.push(run_one(binaries.clone(), version, target, packages.clone()));
        }
    }
    let at_once = std::env::var("GOCLIENTS_RUNS_AT_ONCE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let results: Vec<RunResult> = futures::stream::iter(runs)
        .buffered(at_once)
        .collect()
        .await;
    failed |= report(&results);
    eprintln!(
        "go_clients: {} run(s) in {:.0} s",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    failed
}

/// Every profile on the newest etcd; directly and under `default` on an older one.
fn default_targets(version: Version) -> Vec<Target> {
    let all = all_targets();
    match version == Version::NEWEST {
        true => all,
        false => all.into_iter().take(2).collect(),
    }
}

fn all_targets() -> Vec<Target> {
    std::iter::once(Target::Direct)
        .chain(PROFILES.iter().map(|name| {
            let p = profile::ALL
                .iter()
                .find(|p| p.name == *name)
                .expect("a profile of PROFILES");
            Target::Proxy(*p)
        }))
        .collect()
}

/// The targets `GOCLIENTS_TARGETS` names, if it is set.
fn targets() -> Result<Option<Vec<Target>>, String> {
    let all = all_targets();
    let Some(names) = env_list("GOCLIENTS_TARGETS") else {
        return Ok(None);
    };
    names
        .iter()
        .map(|n| {
            all.iter().copied().find(|t| t.name() == n).ok_or_else(|| {
                format!(
                    "GOCLIENTS_TARGETS: unknown {n:?}; known: direct, {}",
                    PROFILES.join(", ")
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

async fn run_one(
    binaries: testkit::Binaries,
    version: Version,
    target: Target,
    packages: Vec<Package>,
) -> RunResult {
    let mut result = RunResult {
        version,
        target,
        packages: Vec::new(),
        peak_rss_kib: Vec::new(),
    };
    let fleet = match Fleet::start(&binaries, target).await {
        Ok(f) => Arc::new(tokio::sync::Mutex::new(f)),
        Err(e) => {
            result
                .packages
                .push(("(start)".into(), Err(format!("starting the run: {e}")), 0.0));
            return result;
        }
    };
    let control = match Control::serve(fleet.clone()).await {
        Ok(c) => c,
        Err(e) => {
            result.packages.push(("(start)".into(), Err(e), 0.0));
            return result;
        }
    };
    let filter = std::env::var("GOCLIENTS_RUN").ok();
    for package in &packages {
        let started = Instant::now();
        // Locked only to read what the Go test is told: the control endpoint locks it for each action it takes.
        let view = fleet.lock().await.view();
        let outcome =
            go_clients::run_package(package, &view, version, control.url(), filter.as_deref())
                .await;
        let secs = started.elapsed().as_secs_f64();
        let outcome = match outcome {
            Ok((tally, out)) => {
                if !tally.failed.is_empty() || tally.passed == 0 {
                    eprintln!(
                        "==== go_clients {} on {} {}: output ====\n{out}\n==== processes ====\n{}",
                        package.name,
                        version,
                        target.name(),
                        fleet.lock().await.logs(30)
                    );
                }
                Ok(tally)
            }
            Err(e) => Err(e),
        };
        result.packages.push((package.name.clone(), outcome, secs));
    }
    result.peak_rss_kib = fleet.lock().await.proxies_peak_rss_kib();
    result
}

/// Prints the table; whether anything failed.
fn report(results: &[RunResult]) -> bool {
    let mut failed = false;
    println!("\n| etcd | target | package | passed | failed | skipped | seconds |");
    println!("|---|---|---|---|---|---|---|");
    for r in results {
        for (package, outcome, secs) in &r.packages {
            let target = match r.target {
                Target::Direct => "direct".to_string(),
                Target::Proxy(p) => format!("proxy {}", p.name),
            };
            match outcome {
                Ok(t) => {
                    let none = t.passed == 0;
                    failed |= !t.failed.is_empty() || none;
                    println!(
                        "| {} | {target} | {package} | {} | {} | {} | {secs:.0} |",
                        r.version,
                        t.passed,
                        if none && t.failed.is_empty() {
                            "none passed".to_string()
                        } else {
                            t.failed.len().to_string()
                        },
                        t.skipped
                    );
                    for f in &t.failed {
                        println!("|  |  |  | FAILED: {f} |  |  |  |");
                    }
                    for m in &t.measures {
                        println!("|  |  |  | {m} |  |  |  |");
                    }
                }
                Err(e) => {
                    failed = true;
                    println!(
                        "| {} | {target} | {package} | error: {} |  |  |  |",
                        r.version,
                        e.lines().next().unwrap_or_default()
                    );
                    eprintln!("go_clients: {e}");
                }
            }
        }
        if !r.peak_rss_kib.is_empty() {
            println!(
                "|  |  | proxy peak RSS (KiB, front first) | {:?} |  |  |  |",
                r.peak_rss_kib
            );
        }
    }
    failed
}
