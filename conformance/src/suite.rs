//! The whole run for one backend and version: one shared etcd (with one proxy per flag profile in front of it)
//! for the scenarios that stay under their own key prefix, a fresh etcd per target for the scenarios that change
//! cluster-wide state (`@own-etcd`); `direct` is checked against its insta snapshot, the proxy under every profile
//! (and the model) against `direct`.
//!
//! Besides its answers, a run through the proxy must leave etcd holding what the direct run left (read on etcd
//! itself, under the profile's namespace: see [`runner::Stored`]); and on a fresh etcd it must start at the
//! revision direct started at, which with equal transcripts (revisions relative to the start) means the absolute
//! revisions agree too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use testkit::{Backend, Etcd, Spec};

use crate::profile::Profile;
use crate::report::{Outcome, Status};
use crate::runner::{self, Place, Played, Stored, Transcript};
use crate::scenario::Scenario;
use crate::target::{self, TargetKind};

/// What a group needs besides its scenarios.
pub struct Context {
    /// `testdata/conformance/snapshots`: one folder per etcd version.
    pub snapshots: PathBuf,
    /// Scenario id → why the proxy differs there by design.
    pub differences: BTreeMap<String, String>,
    /// The flag profiles the proxy runs under.
    pub profiles: Vec<Profile>,
}

/// Where a scenario runs through the proxy under a profile, or on direct etcd or the model (`None`).
type Lane = Option<Profile>;

/// The key prefix and scratch folder name of a scenario on a target: targets share an etcd, so each gets its own.
fn place_name(target: TargetKind, profile: Lane) -> String {
    match profile {
        Some(p) => format!("{target}-{}", p.name),
        None => target.to_string(),
    }
}

fn prefix(scenario: &Scenario, target: TargetKind, profile: Lane) -> String {
    format!("/cf/{}/{}/", place_name(target, profile), scenario.id)
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
        .partition(|s| spec.backend == Backend::Container && s.container_unsupported.is_some());
    let (shared, own): (Vec<&Scenario>, Vec<&Scenario>) =
        runnable.into_iter().partition(|s| !s.own_etcd);
    let (mut a, b) = tokio::join!(
        shared_lane(spec, &shared, ctx, with_model),
        own_lane(spec, &own, ctx, with_model)
    );
    a.extend(b);
    for sc in unsupported {
        let why = sc.container_unsupported.clone().unwrap_or_default();
        a.extend(for_each_lane(ctx, |lane| {
            let target = if lane.is_some() {
                TargetKind::Proxy
            } else {
                TargetKind::Direct
            };
            outcome(
                spec,
                sc,
                target,
                lane,
                Status::Skipped(format!("unsupported in a container: {why}")),
            )
        }));
    }
    a
}

/// One outcome per lane of `direct` and the proxy under each profile.
fn for_each_lane(ctx: &Context, mut f: impl FnMut(Lane) -> Outcome) -> Vec<Outcome> {
    let mut out = vec![f(None)];
    out.extend(ctx.profiles.iter().map(|p| f(Some(*p))));
    out
}

/// The model's seed: fixed, so its IDs are the same in every run.
const MODEL_SEED: u64 = 7;

/// Judges the model's run of `sc` against `direct`'s transcript.
fn judge_model(
    spec: &Spec,
    sc: &Scenario,
    direct: &Result<Played, String>,
    model: Option<Result<Played, String>>,
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
        (None, Ok(d), Some(Ok(m))) if d.transcript == m.transcript => Status::Passed,
        (None, Ok(d), Some(Ok(m))) => Status::Failed(format!(
            "the model's answers differ from etcd's (- direct, + model):\n{}",
            transcript_diff(&d.transcript, &m.transcript)
        )),
    };
    outcome(spec, sc, TargetKind::Model, None, status)
}

/// A scratch folder per scenario and target, under one temporary directory that the lane removes.
fn scratch(root: &Path, sc: &Scenario, target: TargetKind, lane: Lane) -> String {
    let dir = root.join(sc.snapshot_name()).join(place_name(target, lane));
    let _ = std::fs::create_dir_all(&dir);
    dir.display().to_string()
}

async fn shared_lane(
    spec: &Spec,
    scenarios: &[&Scenario],
    ctx: &Context,
    with_model: bool,
) -> Vec<Outcome> {
    if scenarios.is_empty() {
        return Vec::new();
    }
    let fail_all = |why: String| {
        scenarios
            .iter()
            .flat_map(|sc| all_failed(spec, sc, ctx, &why))
            .collect::<Vec<_>>()
    };
    let Ok(binaries) = &spec.binaries else {
        return fail_all(spec.missing().unwrap_or_default().to_string());
    };
    let etcd = match Etcd::start(spec, &[]).await {
        Ok(e) => e,
        Err(e) => return fail_all(format!("starting etcd: {e}")),
    };
    let mut proxies = Vec::new();
    for profile in &ctx.profiles {
        match target::start_proxy(profile, &etcd.endpoint(), &[]).await {
            Ok(p) => proxies.push((*profile, p)),
            Err(e) => {
                etcd.stop().await;
                return fail_all(format!("starting the proxy: {e}"));
            }
        }
    }
    let root = match testkit::dirs::temp_dir("conformance-scratch-") {
        Ok(d) => d,
        Err(e) => return fail_all(format!("scratch directory: {e}")),
    };
    let model = if with_model {
        Some(target::start_model(MODEL_SEED).await)
    } else {
        None
    };
    let mut outcomes = Vec::new();
    for sc in scenarios {
        let place = |endpoint: &str, target: TargetKind, lane: Lane| {
            let prefix = prefix(sc, target, lane);
            let stored = (target != TargetKind::Model).then(|| Stored {
                ctl: binaries.etcdctl(&etcd.endpoint()),
                root: format!("{}{prefix}", lane.map_or("", |p| p.namespace())),
                whole_keyspace: false,
            });
            Place {
                ctl: binaries.etcdctl(endpoint),
                prefix,
                dir: scratch(root.path(), sc, target, lane),
                stored,
            }
        };
        let d = runner::run(sc, &place(&etcd.endpoint(), TargetKind::Direct, None)).await;
        let mut through = Vec::new();
        for (profile, proxy) in &proxies {
            let p = place(&proxy.addr(), TargetKind::Proxy, Some(*profile));
            through.push((*profile, runner::run(sc, &p).await));
        }
        if let Some(model) = &model {
            let m = match (model, &sc.model_unsupported) {
                (_, Some(_)) => None,
                (Err(e), None) => Some(Err(format!("starting the model: {e}"))),
                (Ok(served), None) => {
                    let p = place(&served.addr(), TargetKind::Model, None);
                    Some(runner::run(sc, &p).await)
                }
            };
            outcomes.push(judge_model(spec, sc, &d, m));
        }
        outcomes.extend(judge(spec, sc, ctx, false, d, through));
    }
    if let Some(Ok(model)) = model {
        model.stop().await;
    }
    drop(proxies);
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
        let root = match testkit::dirs::temp_dir("conformance-scratch-") {
            Ok(d) => d,
            Err(e) => {
                outcomes.extend(all_failed(
                    spec,
                    sc,
                    ctx,
                    &format!("scratch directory: {e}"),
                ));
                continue;
            }
        };
        let root = root.path();
        let direct = run_on_fresh_etcd(spec, sc, None, scratch(root, sc, TargetKind::Direct, None));
        let through = futures::future::join_all(ctx.profiles.iter().map(|p| async move {
            let dir = scratch(root, sc, TargetKind::Proxy, Some(*p));
            (*p, run_on_fresh_etcd(spec, sc, Some(p), dir).await)
        }));
        let (d, through) = tokio::join!(direct, through);
        if with_model {
            let m = match &sc.model_unsupported {
                Some(_) => None,
                None => {
                    let dir = scratch(root, sc, TargetKind::Model, None);
                    Some(run_on_fresh_model(spec, sc, dir).await)
                }
            };
            outcomes.push(judge_model(spec, sc, &d, m));
        }
        outcomes.extend(judge(spec, sc, ctx, true, d, through));
    }
    outcomes
}

/// Runs `sc` on a fresh etcd of its own, directly or (with a profile) through a proxy of its own.
async fn run_on_fresh_etcd(
    spec: &Spec,
    sc: &Scenario,
    profile: Option<&Profile>,
    dir: String,
) -> Result<Played, String> {
    let binaries = spec.binaries.as_ref().map_err(Clone::clone)?;
    let etcd = Etcd::start(spec, &[])
        .await
        .map_err(|e| format!("starting etcd: {e}"))?;
    let proxy = match profile {
        Some(p) => match target::start_proxy(p, &etcd.endpoint(), &[]).await {
            Ok(proxy) => Some(proxy),
            Err(e) => {
                etcd.stop().await;
                return Err(format!("starting the proxy: {e}"));
            }
        },
        None => None,
    };
    let endpoint = proxy.as_ref().map_or_else(|| etcd.endpoint(), |p| p.addr());
    let target = if profile.is_some() {
        TargetKind::Proxy
    } else {
        TargetKind::Direct
    };
    let prefix = prefix(sc, target, profile.copied());
    let place = Place {
        ctl: binaries.etcdctl(&endpoint),
        stored: Some(Stored {
            ctl: binaries.etcdctl(&etcd.endpoint()),
            root: format!("{}{prefix}", profile.map_or("", |p| p.namespace())),
            whole_keyspace: true,
        }),
        prefix,
        dir,
    };
    let result = match runner::run(sc, &place).await {
        Err(e) => Err(format!("{e}\netcd log tail:\n{}", etcd.log_tail().await)),
        ok => ok,
    };
    drop(proxy);
    etcd.stop().await;
    result
}

async fn run_on_fresh_model(spec: &Spec, sc: &Scenario, dir: String) -> Result<Played, String> {
    let binaries = spec.binaries.as_ref().map_err(Clone::clone)?;
    let model = target::start_model(MODEL_SEED)
        .await
        .map_err(|e| format!("starting the model: {e}"))?;
    let place = Place {
        ctl: binaries.etcdctl(&model.addr()),
        prefix: prefix(sc, TargetKind::Model, None),
        dir,
        stored: None,
    };
    let result = runner::run(sc, &place).await;
    model.stop().await;
    result
}

fn outcome(
    spec: &Spec,
    sc: &Scenario,
    target: TargetKind,
    profile: Lane,
    status: Status,
) -> Outcome {
    Outcome {
        scenario: sc.id.clone(),
        target,
        profile: profile.map(|p| p.name),
        backend: spec.backend,
        version: spec.version,
        status,
    }
}

/// `direct` and every profile failed for the same reason.
fn all_failed(spec: &Spec, sc: &Scenario, ctx: &Context, why: &str) -> Vec<Outcome> {
    for_each_lane(ctx, |lane| {
        let target = if lane.is_some() {
            TargetKind::Proxy
        } else {
            TargetKind::Direct
        };
        outcome(spec, sc, target, lane, Status::Failed(why.to_string()))
    })
}

/// direct vs its snapshot; the proxy under each profile vs direct (or vs the differences file). `fresh`: each
/// target ran on a fresh etcd of its own, so they must also start at the same revision.
fn judge(
    spec: &Spec,
    sc: &Scenario,
    ctx: &Context,
    fresh: bool,
    direct: Result<Played, String>,
    through: Vec<(Profile, Result<Played, String>)>,
) -> Vec<Outcome> {
    let version = spec.version.name();
    let direct_status = match &direct {
        Err(e) => Status::Failed(format!("could not be carried out on direct: {e}")),
        Ok(d) => match check_snapshot(&ctx.snapshots, version, sc, &d.transcript) {
            Ok(()) => Status::Passed,
            Err(e) => Status::Failed(e),
        },
    };
    let mut outcomes = vec![outcome(spec, sc, TargetKind::Direct, None, direct_status)];
    for (profile, proxy) in through {
        let status = match (&direct, &proxy) {
            (_, Err(e)) => {
                Status::Failed(format!("could not be carried out through the proxy: {e}"))
            }
            (Err(_), Ok(_)) => {
                Status::Failed("direct failed, so there is nothing to compare with".into())
            }
            (Ok(d), Ok(p)) => {
                let listed = ctx
                    .differences
                    .get(&format!("{}@{version}", sc.id))
                    .or_else(|| ctx.differences.get(&sc.id));
                let differences = differences(d, p, fresh, &profile);
                match (differences.is_empty(), listed) {
                    (true, None) => Status::Passed,
                    (false, None) => Status::Failed(differences.join("\n")),
                    (false, Some(reason)) => {
                        Status::Skipped(format!("listed difference: {reason}"))
                    }
                    // An intermittent defect may not show in a run: not a failure, but the report says so.
                    (true, Some(_)) => {
                        eprintln!(
                            "note: {} is listed in differences.txt but answered like etcd on {} ({} profile)",
                            sc.id,
                            spec.label(),
                            profile.name
                        );
                        Status::Passed
                    }
                }
            }
        };
        outcomes.push(outcome(spec, sc, TargetKind::Proxy, Some(profile), status));
    }
    outcomes
}

/// How a run through the proxy under `profile` differs from the direct run: its answers, what it left in etcd,
/// and (`fresh`) the revision it started at.
fn differences(d: &Played, p: &Played, fresh: bool, profile: &Profile) -> Vec<String> {
    let mut out = Vec::new();
    if d.transcript != p.transcript {
        out.push(format!(
            "the proxy's answers ({} profile) differ from etcd's (- direct, + proxy):\n{}",
            profile.name,
            transcript_diff(&d.transcript, &p.transcript)
        ));
    }
    if d.stored != p.stored {
        let lines = |s: &Option<Vec<String>>| s.as_deref().unwrap_or_default().join("\n");
        out.push(format!(
            "etcd holds other keys after the run through the proxy ({} profile, namespace {:?}) than after the \
             direct run (- direct, + proxy; the run's keys under the namespace as <P>):\n{}",
            profile.name,
            profile.namespace(),
            testkit::diff::line_diff(&lines(&d.stored), &lines(&p.stored))
        ));
    }
    if fresh && d.start_revision != p.start_revision {
        out.push(format!(
            "on a fresh etcd the run through the proxy ({} profile) started at revision {}, the direct run at {}: \
             their absolute revisions differ",
            profile.name, p.start_revision, d.start_revision
        ));
    }
    out
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
    testkit::diff::line_diff(&render(a), &render(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::Record;

    fn played(stdout: &str, start_revision: i64, stored: &[&str]) -> Played {
        Played {
            transcript: Transcript {
                scenario: "kv/x".into(),
                records: vec![Record {
                    step: vec!["$ get <P>a".into()],
                    exit: Some(0),
                    stdout: vec![stdout.into()],
                    stderr: Vec::new(),
                }],
            },
            start_revision,
            stored: Some(stored.iter().map(|s| s.to_string()).collect()),
        }
    }

    const NAMESPACE: Profile = Profile {
        name: "namespace",
        flags: &["--namespace=/ns/"],
    };

    #[test]
    fn a_run_through_the_proxy_differs_in_its_answers_its_keys_in_etcd_or_on_a_fresh_etcd_its_start()
     {
        let direct = played("<P>a", 1, &[r#"{"key":"<P>a"}"#]);
        let cases = [
            (
                "same everything",
                played("<P>a", 1, &[r#"{"key":"<P>a"}"#]),
                vec![],
            ),
            (
                "other answers",
                played("<P>b", 1, &[r#"{"key":"<P>a"}"#]),
                vec!["the proxy's answers (namespace profile) differ"],
            ),
            (
                "a key outside the namespace",
                played("<P>a", 1, &[r#"{"key":"/cf/p/a"}"#]),
                vec![
                    "etcd holds other keys after the run through the proxy (namespace profile, namespace \"/ns/\")",
                ],
            ),
            (
                "a later start",
                played("<P>a", 2, &[r#"{"key":"<P>a"}"#]),
                vec!["started at revision 2, the direct run at 1"],
            ),
        ];
        for (what, proxy, expected) in cases {
            let found = differences(&direct, &proxy, true, &NAMESPACE);
            assert_eq!(found.len(), expected.len(), "{what}: {found:#?}");
            for (f, e) in found.iter().zip(&expected) {
                assert!(f.contains(e), "{what}: {f:?} lacks {e:?}");
            }
        }
        let shared = differences(
            &direct,
            &played("<P>a", 40, &[r#"{"key":"<P>a"}"#]),
            false,
            &NAMESPACE,
        );
        assert!(
            shared.is_empty(),
            "on a shared etcd runs start anywhere: {shared:#?}"
        );
    }
}
