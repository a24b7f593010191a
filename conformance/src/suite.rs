//! The whole run for one backend and version: one shared etcd per transport (with the proxies of every flag profile
//! of that transport in front of it: one each, two in a row for `chain`) for the scenarios that stay under their
//! own key prefix, a fresh etcd per target for the scenarios that change cluster-wide state (`@own-etcd`); `direct`
//! (in the clear) is checked against its insta snapshot, direct etcd on another transport (TLS) against `direct`,
//! beyond what the transport changes (`TRANSPORT_NEUTRAL`); the proxy under every profile against direct etcd on
//! the profile's transport, and the model against `direct`.
//!
//! Besides its answers, a run through the proxy must leave etcd holding what the direct run left (read on etcd
//! itself, under the profile's namespace: see [`runner::Stored`]); and on a fresh etcd it must start at the
//! revision direct started at, which with equal transcripts (revisions relative to the start) means the absolute
//! revisions agree too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use futures::StreamExt as _;

use testkit::{Backend, Etcd, Spec, Version};

use crate::profile::{self, Endpoint, Profile, Proxies, Setup, Transport};
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
    /// What they need made for the run, and how etcd and the proxy start under each.
    pub setup: Setup,
}

impl Context {
    /// The profiles that run in front of etcd `version` of `backend` ([`Profile::runs_on`]: those of the
    /// container image only in front of the newest etcd in a container).
    pub fn profiles_on(&self, backend: Backend, version: Version) -> Vec<Profile> {
        self.profiles
            .iter()
            .copied()
            .filter(|p| p.runs_on(backend, version))
            .collect()
    }

    /// Every lane a scenario runs in on etcd `version` of `backend`, in report order: direct etcd on each
    /// transport its profiles need, then the proxy under each profile (the model, where it runs, comes on top).
    pub fn lanes(&self, backend: Backend, version: Version) -> Vec<Lane> {
        let profiles = self.profiles_on(backend, version);
        profile::transports(&profiles)
            .into_iter()
            .map(Lane::Direct)
            .chain(profiles.into_iter().map(Lane::Proxy))
            .collect()
    }
}

/// Where a scenario runs: on direct etcd over a transport, through the proxy under a profile, or on the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Direct(Transport),
    Proxy(Profile),
    Model,
}

impl Lane {
    pub fn target(self) -> TargetKind {
        match self {
            Lane::Direct(_) => TargetKind::Direct,
            Lane::Proxy(p) => p.target(),
            Lane::Model => TargetKind::Model,
        }
    }

    /// Its profile column in the report: the profile's name, the transport's for direct etcd on another
    /// transport than plain, `None` for direct etcd in the clear and the model.
    pub fn profile(self) -> Option<&'static str> {
        match self {
            Lane::Direct(Transport::Plain) | Lane::Model => None,
            Lane::Direct(t) => Some(t.name()),
            Lane::Proxy(p) => Some(p.name),
        }
    }

    /// The key prefix and scratch folder name of a scenario in it: lanes share an etcd, so each gets its own.
    fn place_name(self) -> String {
        match self.profile() {
            Some(p) => format!("{}-{p}", self.target()),
            None => self.target().to_string(),
        }
    }
}

fn prefix(scenario: &Scenario, lane: Lane) -> String {
    format!("/cf/{}/{}/", lane.place_name(), scenario.id)
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
        a.extend(
            ctx.lanes(spec.backend, spec.version)
                .into_iter()
                .map(|lane| {
                    outcome(
                        spec,
                        sc,
                        lane,
                        Status::Skipped(format!("unsupported in a container: {why}")),
                    )
                }),
        );
    }
    a
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
    outcome(spec, sc, Lane::Model, status)
}

/// A scratch folder per scenario and lane, under one temporary directory that the lane removes.
fn scratch(root: &Path, sc: &Scenario, lane: Lane) -> String {
    let dir = root.join(sc.snapshot_name()).join(lane.place_name());
    let _ = std::fs::create_dir_all(&dir);
    dir.display().to_string()
}

/// Where `sc` runs in `lane`: etcdctl on `at`, with etcd itself (`etcd`, read after the run) where there is one.
fn place(
    binaries: &testkit::Binaries,
    sc: &Scenario,
    lane: Lane,
    at: &Endpoint,
    etcd: Option<&Etcd>,
    whole_keyspace: bool,
    root: &Path,
) -> Place {
    let prefix = prefix(sc, lane);
    let namespace = match lane {
        Lane::Proxy(p) => p.namespace(),
        Lane::Direct(_) | Lane::Model => String::new(),
    };
    let stored = etcd.map(|etcd| Stored {
        ctl: Endpoint::etcd(etcd).etcdctl(binaries),
        root: format!("{namespace}{prefix}"),
        whole_keyspace,
    });
    Place {
        ctl: at.etcdctl(binaries),
        prefix,
        dir: scratch(root, sc, lane),
        stored,
        // Only a real etcd settles one (the model has no storage version).
        storage_version: (sc.storage_version_settled && etcd.is_some())
            .then(|| binaries.version.storage_version())
            .flatten(),
    }
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
    // One etcd per transport, then the proxies of each profile in front of the etcd of its transport.
    let mut etcds: Vec<(Transport, Etcd)> = Vec::new();
    let profiles = ctx.profiles_on(spec.backend, spec.version);
    for transport in profile::transports(&profiles) {
        match ctx.setup.start_etcd(spec, transport, &[]).await {
            Ok(e) => etcds.push((transport, e)),
            Err(e) => {
                stop_all(etcds).await;
                return fail_all(format!("starting etcd ({}): {e}", transport.name()));
            }
        }
    }
    let etcd_of = |t: Transport| {
        etcds
            .iter()
            .find(|(et, _)| *et == t)
            .map(|(_, e)| e)
            .expect("an etcd per transport")
    };
    let mut proxies = Vec::new();
    for profile in &profiles {
        match ctx
            .setup
            .start_proxy(profile, etcd_of(profile.transport), &[])
            .await
        {
            Ok(p) => proxies.push((*profile, p)),
            Err(e) => {
                drop(proxies);
                stop_all(etcds).await;
                return fail_all(format!("starting the proxy: {e}"));
            }
        }
    }
    let root = match testkit::dirs::temp_dir("conformance-scratch-") {
        Ok(d) => d,
        Err(e) => return fail_all(format!("scratch directory: {e}")),
    };
    let model = if with_model {
        Some(target::start_model(MODEL_SEED, spec.version).await)
    } else {
        None
    };
    let mut outcomes = Vec::new();
    for sc in scenarios {
        let mut directs = Vec::new();
        for (transport, etcd) in &etcds {
            let lane = Lane::Direct(*transport);
            let at = Endpoint::etcd(etcd);
            let p = place(binaries, sc, lane, &at, Some(etcd), false, root.path());
            directs.push((*transport, runner::run(sc, &p).await));
        }
        let mut through = Vec::new();
        for (profile, proxy) in &proxies {
            let lane = Lane::Proxy(*profile);
            let etcd = etcd_of(profile.transport);
            let at = Endpoint::proxy(proxy);
            let p = place(binaries, sc, lane, &at, Some(etcd), false, root.path());
            through.push((*profile, runner::run(sc, &p).await));
        }
        if let Some(model) = &model {
            let m = match (model, &sc.model_unsupported) {
                (_, Some(_)) => None,
                (Err(e), None) => Some(Err(format!("starting the model: {e}"))),
                (Ok(served), None) => {
                    let at = Endpoint::plain(served.addr());
                    let p = place(binaries, sc, Lane::Model, &at, None, false, root.path());
                    Some(runner::run(sc, &p).await)
                }
            };
            outcomes.push(judge_model(spec, sc, &directs[0].1, m));
        }
        outcomes.extend(judge(spec, sc, ctx, false, directs, through));
    }
    if let Some(Ok(model)) = model {
        model.stop().await;
    }
    for (profile, proxies) in &proxies {
        if let Some(outcome) = cache_was_used(spec, *profile, proxies).await {
            outcomes.push(outcome);
        }
    }
    drop(proxies);
    stop_all(etcds).await;
    outcomes
}

/// Under a profile with the range cache on (by default, or `--range-cache-max-bytes` other than 0), whether the
/// scenarios were answered from the cache at all: without a single answer from it the profile would pass without
/// testing it. An outcome of its own, `cache/answered`.
async fn cache_was_used(spec: &Spec, profile: Profile, proxies: &Proxies) -> Option<Outcome> {
    let cache_on = profile
        .flags
        .iter()
        .rev()
        .find_map(|f| f.strip_prefix("--range-cache-max-bytes="))
        .is_none_or(|bytes| bytes != "0");
    if !cache_on {
        return None;
    }
    let metrics = proxies.front().metrics().await;
    let hits: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_grpc_proxy_cache_hits_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    let status = if hits > 0.0 {
        Status::Passed
    } else {
        Status::Failed("no Range call was answered from the range cache".into())
    };
    let lane = Lane::Proxy(profile);
    Some(Outcome {
        scenario: "cache/answered".into(),
        target: lane.target(),
        profile: lane.profile(),
        backend: spec.backend,
        version: spec.version,
        status,
    })
}

async fn stop_all(etcds: Vec<(Transport, Etcd)>) {
    for (_, etcd) in etcds {
        etcd.stop().await;
    }
}

/// How many lanes of one `@own-etcd` scenario run at once, each on a fresh etcd of its own: as many as there were
/// before the `tls` profile added two (direct over TLS, and the proxy under it), so that every profile at once
/// loads a machine no more than the first three did.
const OWN_ETCDS_AT_ONCE: usize = 3;

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
        // Each lane on an etcd of its own, a few at a time: every one is an etcd (and a proxy) of its own, and
        // the @own-etcd scenarios are the heavy ones (bcrypt under auth).
        let runs: Vec<(Lane, Result<Played, String>)> =
            futures::stream::iter(ctx.lanes(spec.backend, spec.version).into_iter().map(
                |lane| async move { (lane, run_on_fresh_etcd(spec, sc, ctx, lane, root).await) },
            ))
            .buffered(OWN_ETCDS_AT_ONCE)
            .collect()
            .await;
        let mut directs = Vec::new();
        let mut through = Vec::new();
        for (lane, run) in runs {
            match lane {
                Lane::Direct(t) => directs.push((t, run)),
                Lane::Proxy(p) => through.push((p, run)),
                Lane::Model => {}
            }
        }
        if with_model {
            let m = match &sc.model_unsupported {
                Some(_) => None,
                None => Some(run_on_fresh_model(spec, sc, root).await),
            };
            outcomes.push(judge_model(spec, sc, &directs[0].1, m));
        }
        outcomes.extend(judge(spec, sc, ctx, true, directs, through));
    }
    outcomes
}

/// Runs `sc` on a fresh etcd of its own, directly (`Lane::Direct`, on that transport) or through a proxy of its
/// own (`Lane::Proxy`, etcd on the profile's transport).
async fn run_on_fresh_etcd(
    spec: &Spec,
    sc: &Scenario,
    ctx: &Context,
    lane: Lane,
    root: &Path,
) -> Result<Played, String> {
    let binaries = spec.binaries.as_ref().map_err(Clone::clone)?;
    let (transport, profile) = match lane {
        Lane::Direct(t) => (t, None),
        Lane::Proxy(p) => (p.transport, Some(p)),
        Lane::Model => return Err("the model is no etcd".into()),
    };
    let etcd = ctx
        .setup
        .start_etcd(spec, transport, &[])
        .await
        .map_err(|e| format!("starting etcd: {e}"))?;
    let proxy = match profile {
        Some(p) => match ctx.setup.start_proxy(&p, &etcd, &[]).await {
            Ok(proxy) => Some(proxy),
            Err(e) => {
                etcd.stop().await;
                return Err(format!("starting the proxy: {e}"));
            }
        },
        None => None,
    };
    let at = proxy
        .as_ref()
        .map_or_else(|| Endpoint::etcd(&etcd), Endpoint::proxy);
    let place = place(binaries, sc, lane, &at, Some(&etcd), true, root);
    let result = match runner::run(sc, &place).await {
        Err(e) => Err(format!("{e}\netcd log tail:\n{}", etcd.log_tail().await)),
        ok => ok,
    };
    drop(proxy);
    etcd.stop().await;
    result
}

async fn run_on_fresh_model(spec: &Spec, sc: &Scenario, root: &Path) -> Result<Played, String> {
    let binaries = spec.binaries.as_ref().map_err(Clone::clone)?;
    let model = target::start_model(MODEL_SEED, spec.version)
        .await
        .map_err(|e| format!("starting the model: {e}"))?;
    let at = Endpoint::plain(model.addr());
    let place = place(binaries, sc, Lane::Model, &at, None, false, root);
    let result = runner::run(sc, &place).await;
    model.stop().await;
    result
}

fn outcome(spec: &Spec, sc: &Scenario, lane: Lane, status: Status) -> Outcome {
    Outcome {
        scenario: sc.id.clone(),
        target: lane.target(),
        profile: lane.profile(),
        backend: spec.backend,
        version: spec.version,
        status,
    }
}

/// Every lane failed for the same reason.
fn all_failed(spec: &Spec, sc: &Scenario, ctx: &Context, why: &str) -> Vec<Outcome> {
    ctx.lanes(spec.backend, spec.version)
        .into_iter()
        .map(|lane| outcome(spec, sc, lane, Status::Failed(why.to_string())))
        .collect()
}

/// direct (in the clear) vs its snapshot; direct on another transport vs direct, URL schemes aside; the proxy under
/// each profile vs direct on its transport (or vs the differences file). `fresh`: each target ran on a fresh etcd
/// of its own, so they must also start at the same revision. `directs` starts with the plain run.
fn judge(
    spec: &Spec,
    sc: &Scenario,
    ctx: &Context,
    fresh: bool,
    directs: Vec<(Transport, Result<Played, String>)>,
    through: Vec<(Profile, Result<Played, String>)>,
) -> Vec<Outcome> {
    let version = spec.version.name();
    let mut outcomes = Vec::new();
    let plain = &directs[0].1;
    for (transport, direct) in &directs {
        let status = match (transport, direct, plain) {
            (_, Err(e), _) => Status::Failed(format!("could not be carried out on direct: {e}")),
            (Transport::Plain, Ok(d), _) => {
                match check_snapshot(&ctx.snapshots, version, sc, &d.transcript) {
                    Ok(()) => Status::Passed,
                    Err(e) => Status::Failed(e),
                }
            }
            (_, Ok(_), Err(_)) => {
                Status::Failed("direct failed, so there is nothing to compare with".into())
            }
            (t, Ok(d), Ok(p)) => {
                let found = transport_differences(p, d, fresh, *t);
                if found.is_empty() {
                    Status::Passed
                } else {
                    Status::Failed(found.join("\n"))
                }
            }
        };
        outcomes.push(outcome(spec, sc, Lane::Direct(*transport), status));
    }
    for (profile, proxy) in through {
        let direct = directs
            .iter()
            .find(|(t, _)| *t == profile.transport)
            .map(|(_, d)| d);
        let status = match (direct, &proxy) {
            (_, Err(e)) => {
                Status::Failed(format!("could not be carried out through the proxy: {e}"))
            }
            (None, Ok(_)) => Status::Failed(format!(
                "direct etcd did not run on the {} transport",
                profile.transport.name()
            )),
            (Some(Err(_)), Ok(_)) => {
                Status::Failed("direct failed, so there is nothing to compare with".into())
            }
            (Some(Ok(d)), Ok(p)) => {
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
        outcomes.push(outcome(spec, sc, Lane::Proxy(profile), status));
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

/// What etcd over TLS prints differently from etcd in the clear for the same requests, each rewritten the same way
/// on both sides before they are compared:
/// - its URLs carry the scheme `https://` (in the clear `http://`, or none where etcdctl echoes its endpoint);
/// - with `--client-cert-auth` a request without a token has a verified client certificate, in which etcd finds a
///   user: `""` for ours, which have no Common Name; under auth that user is refused `permission denied` where a
///   request in the clear, with no user at all, is refused `user name is empty`.
const TRANSPORT_NEUTRAL: &[(&str, &str)] = &[
    ("https://", ""),
    ("http://", ""),
    ("user name is empty", "permission denied"),
];

/// `t` with its output rewritten by [`TRANSPORT_NEUTRAL`].
fn transport_neutral(t: &Transcript) -> Transcript {
    let strip = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .map(|l| {
                TRANSPORT_NEUTRAL
                    .iter()
                    .fold(l.clone(), |l, (from, to)| l.replace(from, to))
            })
            .collect()
    };
    Transcript {
        scenario: t.scenario.clone(),
        records: t
            .records
            .iter()
            .map(|r| runner::Record {
                step: r.step.clone(),
                exit: r.exit,
                stdout: strip(&r.stdout),
                stderr: strip(&r.stderr),
            })
            .collect(),
    }
}

/// How direct etcd over `transport` (`d`) differs from direct etcd in the clear (`plain`): its answers (what the
/// transport itself changes aside: [`TRANSPORT_NEUTRAL`]), what it holds after the run, and (`fresh`) the revision
/// it started at.
fn transport_differences(
    plain: &Played,
    d: &Played,
    fresh: bool,
    transport: Transport,
) -> Vec<String> {
    let name = transport.name();
    let mut out = Vec::new();
    let (a, b) = (
        transport_neutral(&plain.transcript),
        transport_neutral(&d.transcript),
    );
    if a != b {
        out.push(format!(
            "etcd's answers over {name} differ from its answers in the clear, beyond what the transport changes \
             (- plain, + {name}):\n{}",
            transcript_diff(&a, &b)
        ));
    }
    if plain.stored != d.stored {
        let lines = |s: &Option<Vec<String>>| s.as_deref().unwrap_or_default().join("\n");
        out.push(format!(
            "etcd holds other keys after the run over {name} than after the run in the clear (- plain, + {name}):\n{}",
            testkit::diff::line_diff(&lines(&plain.stored), &lines(&d.stored))
        ));
    }
    if fresh && plain.start_revision != d.start_revision {
        out.push(format!(
            "on a fresh etcd the run over {name} started at revision {}, the run in the clear at {}",
            d.start_revision, plain.start_revision
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
        transport: Transport::Plain,
        proxies: 1,
        image: false,
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

    #[test]
    fn etcd_over_tls_answers_like_etcd_in_the_clear_when_only_url_schemes_differ() {
        let plain = played(
            "<ID1>, started, m0, http://127.0.0.1:<PORT>, http://127.0.0.1:<PORT>, false",
            1,
            &[],
        );
        let tls = played(
            "<ID1>, started, m0, http://127.0.0.1:<PORT>, https://127.0.0.1:<PORT>, false",
            1,
            &[],
        );
        assert!(transport_differences(&plain, &tls, true, Transport::Tls).is_empty());
        let health = played("127.0.0.1:<PORT> is healthy", 1, &[]);
        let tls_health = played("https://127.0.0.1:<PORT> is healthy", 1, &[]);
        assert!(transport_differences(&health, &tls_health, false, Transport::Tls).is_empty());
        let anonymous = played("Error: etcdserver: user name is empty", 1, &[]);
        let cn_less = played("Error: etcdserver: permission denied", 1, &[]);
        assert!(transport_differences(&anonymous, &cn_less, false, Transport::Tls).is_empty());
        let refused = played("Error: context deadline exceeded", 1, &[]);
        let found = transport_differences(&health, &refused, false, Transport::Tls);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].contains("over tls differ"), "{}", found[0]);
        let later = transport_differences(
            &health,
            &played("127.0.0.1:<PORT> is healthy", 2, &[]),
            true,
            Transport::Tls,
        );
        assert_eq!(later.len(), 1, "{later:#?}");
    }

    #[test]
    fn lanes_are_labelled_by_target_and_profile_or_transport() {
        let tls = *crate::profile::ALL
            .iter()
            .find(|p| p.name == "tls")
            .unwrap();
        assert_eq!(Lane::Direct(Transport::Plain).profile(), None);
        assert_eq!(Lane::Direct(Transport::Tls).profile(), Some("tls"));
        assert_eq!(Lane::Direct(Transport::Tls).place_name(), "direct-tls");
        assert_eq!(Lane::Proxy(tls).place_name(), "proxy-tls");
        assert_eq!(Lane::Proxy(NAMESPACE).target(), TargetKind::Proxy);
        assert_eq!(Lane::Model.place_name(), "model");
        let ctx = Context {
            snapshots: PathBuf::new(),
            differences: BTreeMap::new(),
            profiles: vec![NAMESPACE, tls],
            setup: Setup::new(&[]).unwrap(),
        };
        assert_eq!(
            ctx.lanes(Backend::Process, Version::NEWEST),
            [
                Lane::Direct(Transport::Plain),
                Lane::Direct(Transport::Tls),
                Lane::Proxy(NAMESPACE),
                Lane::Proxy(tls)
            ]
        );
    }

    #[test]
    fn the_image_profiles_run_in_front_of_the_newest_etcd_in_a_container_only_as_the_container_target()
     {
        let image_tls = *crate::profile::ALL
            .iter()
            .find(|p| p.name == "container-tls")
            .unwrap();
        assert_eq!(Lane::Proxy(image_tls).target(), TargetKind::Container);
        let ctx = Context {
            snapshots: PathBuf::new(),
            differences: BTreeMap::new(),
            profiles: vec![NAMESPACE, image_tls],
            setup: Setup::new(&[]).unwrap(),
        };
        let only_newer = [Lane::Direct(Transport::Plain), Lane::Proxy(NAMESPACE)];
        assert_eq!(ctx.lanes(Backend::Process, Version::NEWEST), only_newer);
        assert_eq!(ctx.lanes(Backend::Container, Version::V3_5_30), only_newer);
        assert_eq!(
            ctx.lanes(Backend::Container, Version::NEWEST),
            [
                Lane::Direct(Transport::Plain),
                Lane::Direct(Transport::Tls),
                Lane::Proxy(NAMESPACE),
                Lane::Proxy(image_tls)
            ]
        );
    }
}
