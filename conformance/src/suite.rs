//! The whole run for one backend and version: one shared etcd (and one proxy in front of it) for the scenarios
//! that stay under their own key prefix, a fresh etcd per target for the scenarios that change cluster-wide
//! state (`@own-etcd`); `direct` is checked against its insta snapshot, `proxy` (and `model`) against `direct`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::backend::{Etcd, Kind, Spec};
use crate::report::{Outcome, Status};
use crate::runner::{self, Place, Transcript};
use crate::scenario::Scenario;
use crate::target::{self, TargetKind};

/// What a group needs besides its scenarios.
pub struct Context {
    /// `testdata/conformance/snapshots`: one folder per etcd version.
    pub snapshots: PathBuf,
    /// Scenario id → why the proxy differs there by design.
    pub differences: BTreeMap<String, String>,
}

/// The key prefix of a scenario on a target: targets share an etcd, so each gets its own.
fn prefix(scenario: &Scenario, target: TargetKind) -> String {
    format!("/cf/{target}/{}/", scenario.id)
}

/// Runs every scenario on `spec` (both lanes concurrently) and returns one outcome per scenario and target.
/// With `with_model`, the sim's model etcd runs every scenario too and is compared with `direct`.
pub async fn run_group(
    spec: &Spec,
    scenarios: &[Scenario],
    ctx: &Context,
    with_model: bool,
) -> Vec<Outcome> {
    let (unsupported, runnable): (Vec<&Scenario>, Vec<&Scenario>) = scenarios
        .iter()
        .partition(|s| spec.kind == Kind::Testcontainers && s.container_unsupported.is_some());
    let (shared, own): (Vec<&Scenario>, Vec<&Scenario>) =
        runnable.into_iter().partition(|s| !s.own_etcd);
    let (mut a, b) = tokio::join!(
        shared_lane(spec, &shared, ctx, with_model),
        own_lane(spec, &own, ctx, with_model)
    );
    a.extend(b);
    a.extend(unsupported.iter().flat_map(|sc| {
        let why = sc.container_unsupported.clone().unwrap_or_default();
        [TargetKind::Direct, TargetKind::Proxy].map(|t| {
            outcome(
                spec,
                sc,
                t,
                Status::Skipped(format!("unsupported in a container: {why}")),
            )
        })
    }));
    a
}

/// The model's seed: fixed, so its IDs are the same in every run.
const MODEL_SEED: u64 = 7;

/// Judges the model's run of `sc` against `direct`'s transcript.
fn judge_model(
    spec: &Spec,
    sc: &Scenario,
    direct: &Result<Transcript, String>,
    model: Option<Result<Transcript, String>>,
) -> Outcome {
    let status = match (&sc.model_unsupported, direct, model) {
        (Some(reason), _, _) => Status::Skipped(format!("unsupported by the model: {reason}")),
        (None, _, None) => Status::Failed("the model did not run".into()),
        (None, Err(_), Some(_)) => {
            Status::Failed("direct failed, so there is nothing to compare with".into())
        }
        (None, _, Some(Err(e))) => {
            Status::Failed(format!("could not be carried out on the model: {e}"))
        }
        (None, Ok(d), Some(Ok(m))) if d == &m => Status::Passed,
        (None, Ok(d), Some(Ok(m))) => Status::Failed(format!(
            "the model's answers differ from etcd's (- direct, + model):\n{}",
            transcript_diff(d, &m)
        )),
    };
    outcome(spec, sc, TargetKind::Model, status)
}

async fn shared_lane(
    spec: &Spec,
    scenarios: &[&Scenario],
    ctx: &Context,
    with_model: bool,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let etcd = match Etcd::start(spec).await {
        Ok(e) => e,
        Err(e) => return all_failed(spec, scenarios, &format!("starting etcd: {e}")),
    };
    let proxy = match target::start_proxy(&etcd.endpoint()).await {
        Ok(p) => p,
        Err(e) => {
            etcd.stop().await;
            return all_failed(spec, scenarios, &format!("starting the proxy: {e}"));
        }
    };
    let scratch = match crate::backend::process::temp_dir("conformance-scratch-") {
        Ok(d) => d,
        Err(e) => return all_failed(spec, scenarios, &e),
    };
    let model = if with_model {
        Some(target::start_model(MODEL_SEED).await)
    } else {
        None
    };
    for sc in scenarios {
        let dir = scratch.path().join(sc.snapshot_name());
        let _ = std::fs::create_dir_all(dir.join("direct"));
        let _ = std::fs::create_dir_all(dir.join("proxy"));
        let direct = Place {
            ctl: spec.version.etcdctl(&etcd.endpoint()),
            prefix: prefix(sc, TargetKind::Direct),
            dir: dir.join("direct").display().to_string(),
        };
        let through = Place {
            ctl: spec.version.etcdctl(&proxy.addr()),
            prefix: prefix(sc, TargetKind::Proxy),
            dir: dir.join("proxy").display().to_string(),
        };
        let d = runner::run(sc, &direct).await;
        let p = runner::run(sc, &through).await;
        if let Some(model) = &model {
            let m = match (model, &sc.model_unsupported) {
                (_, Some(_)) => None,
                (Err(e), None) => Some(Err(format!("starting the model: {e}"))),
                (Ok(served), None) => {
                    let _ = std::fs::create_dir_all(dir.join("model"));
                    let place = Place {
                        ctl: spec.version.etcdctl(&served.addr()),
                        prefix: prefix(sc, TargetKind::Model),
                        dir: dir.join("model").display().to_string(),
                    };
                    Some(runner::run(sc, &place).await)
                }
            };
            outcomes.push(judge_model(spec, sc, &d, m));
        }
        outcomes.extend(judge(spec, sc, ctx, d, p));
    }
    if let Some(Ok(model)) = model {
        model.stop().await;
    }
    proxy.stop().await;
    etcd.stop().await;
    outcomes
}

async fn own_lane(
    spec: &Spec,
    scenarios: &[&Scenario],
    ctx: &Context,
    with_model: bool,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for sc in scenarios {
        let scratch = match crate::backend::process::temp_dir("conformance-scratch-") {
            Ok(d) => d,
            Err(e) => {
                outcomes.extend(all_failed(spec, &[sc], &e));
                continue;
            }
        };
        let dir = scratch.path().display().to_string();
        let (d, p) = tokio::join!(
            run_on_fresh_etcd(spec, sc, false, format!("{dir}/direct")),
            run_on_fresh_etcd(spec, sc, true, format!("{dir}/proxy"))
        );
        if with_model {
            let m = match &sc.model_unsupported {
                Some(_) => None,
                None => Some(run_on_fresh_model(spec, sc, format!("{dir}/model")).await),
            };
            outcomes.push(judge_model(spec, sc, &d, m));
        }
        outcomes.extend(judge(spec, sc, ctx, d, p));
    }
    outcomes
}

async fn run_on_fresh_etcd(
    spec: &Spec,
    sc: &Scenario,
    through_proxy: bool,
    dir: String,
) -> Result<Transcript, String> {
    let _ = std::fs::create_dir_all(&dir);
    let etcd = Etcd::start(spec)
        .await
        .map_err(|e| format!("starting etcd: {e}"))?;
    let proxy = if through_proxy {
        match target::start_proxy(&etcd.endpoint()).await {
            Ok(p) => Some(p),
            Err(e) => {
                etcd.stop().await;
                return Err(format!("starting the proxy: {e}"));
            }
        }
    } else {
        None
    };
    let endpoint = proxy.as_ref().map(|p| p.addr()).unwrap_or(etcd.endpoint());
    let target = if through_proxy {
        TargetKind::Proxy
    } else {
        TargetKind::Direct
    };
    let place = Place {
        ctl: spec.version.etcdctl(&endpoint),
        prefix: prefix(sc, target),
        dir,
    };
    let result = runner::run(sc, &place).await;
    let result = match result {
        Err(e) => Err(format!("{e}\netcd log tail:\n{}", etcd.log_tail().await)),
        ok => ok,
    };
    if let Some(p) = proxy {
        p.stop().await;
    }
    etcd.stop().await;
    result
}

async fn run_on_fresh_model(spec: &Spec, sc: &Scenario, dir: String) -> Result<Transcript, String> {
    let _ = std::fs::create_dir_all(&dir);
    let model = target::start_model(MODEL_SEED)
        .await
        .map_err(|e| format!("starting the model: {e}"))?;
    let place = Place {
        ctl: spec.version.etcdctl(&model.addr()),
        prefix: prefix(sc, TargetKind::Model),
        dir,
    };
    let result = runner::run(sc, &place).await;
    model.stop().await;
    result
}

fn outcome(spec: &Spec, sc: &Scenario, target: TargetKind, status: Status) -> Outcome {
    Outcome {
        scenario: sc.id.clone(),
        target,
        backend: spec.kind,
        version: spec.version.name,
        status,
    }
}

fn all_failed(spec: &Spec, scenarios: &[&Scenario], why: &str) -> Vec<Outcome> {
    scenarios
        .iter()
        .flat_map(|sc| {
            [TargetKind::Direct, TargetKind::Proxy]
                .map(|t| outcome(spec, sc, t, Status::Failed(why.to_string())))
        })
        .collect()
}

/// direct vs its snapshot; proxy vs direct (or vs the differences file).
fn judge(
    spec: &Spec,
    sc: &Scenario,
    ctx: &Context,
    direct: Result<Transcript, String>,
    proxy: Result<Transcript, String>,
) -> Vec<Outcome> {
    let direct_status = match &direct {
        Err(e) => Status::Failed(format!("could not be carried out on direct: {e}")),
        Ok(t) => match check_snapshot(&ctx.snapshots, spec.version.name, sc, t) {
            Ok(()) => Status::Passed,
            Err(e) => Status::Failed(e),
        },
    };
    let proxy_status = match (&direct, &proxy) {
        (_, Err(e)) => Status::Failed(format!("could not be carried out through the proxy: {e}")),
        (Err(_), Ok(_)) => {
            Status::Failed("direct failed, so there is nothing to compare with".into())
        }
        (Ok(d), Ok(p)) => {
            let listed = ctx
                .differences
                .get(&format!("{}@{}", sc.id, spec.version.name))
                .or_else(|| ctx.differences.get(&sc.id));
            match (d == p, listed) {
                (true, None) => Status::Passed,
                (false, None) => Status::Failed(format!(
                    "the proxy's answers differ from etcd's (- direct, + proxy):\n{}",
                    transcript_diff(d, p)
                )),
                (false, Some(reason)) => Status::Skipped(format!("listed difference: {reason}")),
                // An intermittent defect may not show in a run: not a failure, but the report says so.
                (true, Some(_)) => {
                    eprintln!(
                        "note: {} is listed in differences.txt but answered like etcd on {}",
                        sc.id,
                        spec.label()
                    );
                    Status::Passed
                }
            }
        }
    };
    vec![
        outcome(spec, sc, TargetKind::Direct, direct_status),
        outcome(spec, sc, TargetKind::Proxy, proxy_status),
    ]
}

/// Checks `direct`'s transcript against `snapshots/etcd-<version>/<area>__<name>.snap` with insta. A missing or
/// different snapshot fails (insta writes a `.snap.new` to review; `INSTA_UPDATE=always` records instead).
fn check_snapshot(
    snapshots: &Path,
    version: &str,
    sc: &Scenario,
    t: &Transcript,
) -> Result<(), String> {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(snapshots.join(format!("etcd-{version}")));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_input_file(&sc.path);
    settings.set_description(sc.description.clone());

    let name = sc.snapshot_name();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        settings.bind(|| insta::assert_yaml_snapshot!(name.as_str(), t));
    }));
    result.map_err(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("direct differs from its snapshot (etcd {version}): {msg}")
    })
}

fn render(t: &Transcript) -> String {
    let mut s = String::new();
    for r in &t.records {
        let _ = writeln!(s, "step: {}", r.step.join("\n      "));
        let _ = writeln!(s, "exit: {:?}", r.exit);
        for l in &r.stdout {
            let _ = writeln!(s, "out | {l}");
        }
        for l in &r.stderr {
            let _ = writeln!(s, "err | {l}");
        }
    }
    s
}

/// A line diff of two transcripts (only the changed lines and their neighbours are worth reading).
pub fn transcript_diff(a: &Transcript, b: &Transcript) -> String {
    let (ra, rb) = (render(a), render(b));
    let a: Vec<&str> = ra.lines().collect();
    let b: Vec<&str> = rb.lines().collect();
    line_diff(&a, &b)
}

/// A longest-common-subsequence diff of two line lists: `    ` same, `  - ` only in `a`, `  + ` only in `b`.
pub fn line_diff(a: &[&str], b: &[&str]) -> String {
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = String::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "    {}", a[i]);
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            let _ = writeln!(out, "  + {}", b[j]);
            j += 1;
        } else {
            let _ = writeln!(out, "  - {}", a[i]);
            i += 1;
        }
    }
    out
}
