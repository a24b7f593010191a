//! `cargo test -p conformance --test gateway [-- FILTER...]`: replays every case of `testdata/gateway` (HTTP/JSON
//! requests to etcd's gateway, sent with `curl`) on every etcd version found here as a process, directly and
//! through the proxy binary under every flag profile (`CONFORMANCE_PROFILES=a,b` selects some; the container
//! profiles do not run here), prints the report table, and fails on any failure. Direct etcd in the clear is
//! checked against its insta snapshot per version (`testdata/gateway/snapshots/etcd-<v>/`); direct etcd over TLS
//! and the proxy under each profile against direct etcd on the same transport. A missing version is a skip with a
//! message naming the script that installs it, and a failure under `CI=true`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use conformance::gateway::case::{self, Case};
use conformance::gateway::curl::Server;
use conformance::gateway::play::{self, Played, Transcript};
use conformance::profile::{self, Endpoint, Profile, Proxies, Setup, Transport};
use conformance::report::{self, Outcome, Status};
use conformance::target::TargetKind;
use futures::StreamExt as _;
use testkit::{Backend, Etcd, Spec};

/// How many etcd versions run at once.
const VERSIONS_AT_ONCE: usize = 2;

struct Context {
    root: PathBuf,
    differences: BTreeMap<String, String>,
    profiles: Vec<Profile>,
    setup: Setup,
}

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let failed = runtime.block_on(run(filters));
    drop(runtime);
    if failed {
        std::process::exit(1);
    }
}

async fn run(filters: Vec<String>) -> bool {
    let started = tokio::time::Instant::now();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/gateway");
    let mut cases = case::load_all(&root).unwrap_or_else(|e| panic!("loading cases: {e}"));
    if !filters.is_empty() {
        cases.retain(|c| filters.iter().any(|f| c.id.contains(f.as_str())));
    }
    let differences = conformance::differences::load(&root.join("differences.txt"))
        .unwrap_or_else(|e| panic!("loading differences: {e}"));
    let profiles: Vec<Profile> = profile::selected()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .filter(|p| !p.image)
        .collect();
    let setup = Setup::new(&profiles).unwrap_or_else(|e| panic!("setting the profiles up: {e}"));
    if let Err(e) = testkit::proxy::binary() {
        panic!("the proxy's release binary: {e}");
    }
    let ctx = Context {
        root,
        differences,
        profiles,
        setup,
    };
    let mut outcomes = Vec::new();
    let mut runs = Vec::new();
    for spec in testkit::etcd::discover().await {
        if spec.backend != Backend::Process {
            continue;
        }
        match spec.missing() {
            Some(why) => {
                let status = if testkit::ci() {
                    Status::Failed(format!("etcd missing under CI=true: {why}"))
                } else {
                    eprintln!("SKIPPED {}: {why}", spec.label());
                    Status::Skipped(format!("etcd missing: {why}"))
                };
                for c in &cases {
                    outcomes.push(outcome(&spec, c, TargetKind::Direct, None, status.clone()));
                }
            }
            None => runs.push(run_version(spec, &cases, &ctx)),
        }
    }
    eprintln!(
        "gateway: {} cases on {} etcd version(s), through the proxy binary under {} profile(s)",
        cases.len(),
        runs.len(),
        ctx.profiles.len()
    );
    let groups: Vec<Vec<Outcome>> = futures::stream::iter(runs)
        .buffer_unordered(VERSIONS_AT_ONCE)
        .collect()
        .await;
    outcomes.extend(groups.into_iter().flatten());
    outcomes.sort_by(|a, b| {
        (a.target, a.profile, a.version, &a.scenario).cmp(&(
            b.target,
            b.profile,
            b.version,
            &b.scenario,
        ))
    });
    println!("{}", report::render(&outcomes));
    let (passed, failed, skipped) = report::totals(&outcomes);
    println!(
        "gateway: {passed} passed, {failed} failed, {skipped} skipped in {} s",
        started.elapsed().as_secs()
    );
    failed > 0
}

fn outcome(
    spec: &Spec,
    c: &Case,
    target: TargetKind,
    profile: Option<&'static str>,
    status: Status,
) -> Outcome {
    Outcome {
        scenario: c.id.clone(),
        target,
        profile,
        backend: spec.backend,
        version: spec.version,
        status,
    }
}

fn server(at: &Endpoint) -> Server {
    Server {
        url: at.url(),
        tls: at.tls.clone(),
    }
}

/// The run's key prefix on one target: its own, so that targets sharing an etcd do not meet.
fn prefix(c: &Case, place: &str) -> String {
    format!("/gw/{place}/{}/", c.id)
}

/// Every case on one etcd version: the shared cases on one etcd per transport (with every profile's proxies in
/// front of the etcd of its transport), the `@own-etcd` cases on a fresh etcd per target.
async fn run_version(spec: Spec, cases: &[Case], ctx: &Context) -> Vec<Outcome> {
    let (own, shared): (Vec<&Case>, Vec<&Case>) = cases.iter().partition(|c| c.own_etcd);
    let mut outcomes = Vec::new();
    let transports = profile::transports(&ctx.profiles);
    let mut etcds: Vec<(Transport, Etcd)> = Vec::new();
    let mut proxies: Vec<(Profile, Proxies)> = Vec::new();
    let mut failed_start = None;
    for t in &transports {
        match ctx.setup.start_etcd(&spec, *t, &[]).await {
            Ok(e) => etcds.push((*t, e)),
            Err(e) => failed_start = Some(format!("starting etcd ({}): {e}", t.name())),
        }
    }
    if failed_start.is_none() {
        for p in &ctx.profiles {
            let etcd = etcds
                .iter()
                .find(|(t, _)| *t == p.transport)
                .map(|(_, e)| e);
            match ctx
                .setup
                .start_proxy(p, etcd.expect("an etcd per transport"), &[])
                .await
            {
                Ok(row) => proxies.push((*p, row)),
                Err(e) => failed_start = Some(format!("starting the proxy: {e}")),
            }
        }
    }
    for c in shared {
        if let Some(why) = &failed_start {
            outcomes.push(outcome(
                &spec,
                c,
                TargetKind::Direct,
                None,
                Status::Failed(why.clone()),
            ));
            continue;
        }
        let mut directs = Vec::new();
        for (t, etcd) in &etcds {
            let at = server(&Endpoint::etcd(etcd));
            directs.push((
                *t,
                play::play(c, &at, &prefix(c, &format!("direct-{}", t.name()))).await,
            ));
        }
        let mut through = Vec::new();
        for (p, row) in &proxies {
            let at = server(&Endpoint::proxy(row));
            through.push((*p, play::play(c, &at, &prefix(c, p.name)).await));
        }
        outcomes.extend(judge(&spec, c, ctx, false, directs, through));
    }
    drop(proxies);
    for (_, e) in etcds {
        e.stop().await;
    }
    // Each target of an `@own-etcd` case has an etcd of its own: they run at once.
    for c in own {
        let directs = futures::future::join_all(
            transports
                .iter()
                .map(|t| async { (*t, on_fresh_etcd(&spec, c, ctx, *t, None).await) }),
        )
        .await;
        let through = futures::future::join_all(
            ctx.profiles
                .iter()
                .map(|p| async { (*p, on_fresh_etcd(&spec, c, ctx, p.transport, Some(p)).await) }),
        )
        .await;
        outcomes.extend(judge(&spec, c, ctx, true, directs, through));
    }
    outcomes
}

/// Plays `c` on a fresh etcd of its own, directly or through `profile`'s proxies.
async fn on_fresh_etcd(
    spec: &Spec,
    c: &Case,
    ctx: &Context,
    transport: Transport,
    profile: Option<&Profile>,
) -> Result<Played, String> {
    let etcd = ctx.setup.start_etcd(spec, transport, &[]).await?;
    let played = match profile {
        None => {
            let at = server(&Endpoint::etcd(&etcd));
            play::play(c, &at, &prefix(c, &format!("direct-{}", transport.name()))).await
        }
        Some(p) => match ctx.setup.start_proxy(p, &etcd, &[]).await {
            Ok(row) => {
                let at = server(&Endpoint::proxy(&row));
                play::play(c, &at, &prefix(c, p.name)).await
            }
            Err(e) => Err(format!("starting the proxy: {e}")),
        },
    };
    etcd.stop().await;
    played
}

/// Direct in the clear against its snapshot, direct on another transport against it, each profile against direct
/// on its transport (or the differences file). `fresh`: each target ran on an etcd of its own, so they must also
/// start at the same revision.
fn judge(
    spec: &Spec,
    c: &Case,
    ctx: &Context,
    fresh: bool,
    directs: Vec<(Transport, Result<Played, String>)>,
    through: Vec<(Profile, Result<Played, String>)>,
) -> Vec<Outcome> {
    let version = spec.version.name();
    let mut outcomes = Vec::new();
    let plain = &directs[0].1;
    for (t, d) in &directs {
        let status = match (t, d, plain) {
            (_, Err(e), _) => Status::Failed(format!("could not be carried out on direct: {e}")),
            (Transport::Plain, Ok(d), _) => {
                match check_snapshot(&ctx.root, version, c, &d.transcript) {
                    Ok(()) => Status::Passed,
                    Err(e) => Status::Failed(e),
                }
            }
            (_, Ok(_), Err(_)) => Status::Failed("direct in the clear failed".into()),
            // Over TLS etcd answers as in the clear but for the scheme of its URLs (member list).
            (_, Ok(d), Ok(p)) => {
                let neutral = |t: &Transcript| play::render(t).replace("https://", "http://");
                if neutral(&d.transcript) == neutral(&p.transcript) {
                    Status::Passed
                } else {
                    Status::Failed(format!(
                        "direct over {} differs from direct in the clear (- clear, + {}):\n{}",
                        t.name(),
                        t.name(),
                        testkit::diff::line_diff(&neutral(&p.transcript), &neutral(&d.transcript))
                    ))
                }
            }
        };
        let label = (*t != Transport::Plain).then(|| t.name());
        outcomes.push(outcome(spec, c, TargetKind::Direct, label, status));
    }
    for (p, proxied) in through {
        let direct = directs
            .iter()
            .find(|(t, _)| *t == p.transport)
            .map(|(_, d)| d);
        let status = match (direct, &proxied) {
            (_, Err(e)) => {
                Status::Failed(format!("could not be carried out through the proxy: {e}"))
            }
            (None | Some(Err(_)), Ok(_)) => {
                Status::Failed("direct failed, so there is nothing to compare with".into())
            }
            (Some(Ok(d)), Ok(x)) => {
                let mut found = Vec::new();
                if d.transcript != x.transcript {
                    found.push(format!(
                        "answers differ (- direct, + proxy under the {} profile):\n{}",
                        p.name,
                        testkit::diff::line_diff(
                            &play::render(&d.transcript),
                            &play::render(&x.transcript)
                        )
                    ));
                }
                if fresh && d.start_revision != x.start_revision {
                    found.push(format!(
                        "on a fresh etcd the run through the proxy started at revision {}, the direct run at {}",
                        x.start_revision, d.start_revision
                    ));
                }
                let listed = ctx
                    .differences
                    .get(&format!("{}@{version}", c.id))
                    .or_else(|| ctx.differences.get(&format!("{}#{}", c.id, p.name)))
                    .or_else(|| ctx.differences.get(&c.id));
                match (found.is_empty(), listed) {
                    (true, None) => Status::Passed,
                    (false, None) => Status::Failed(found.join("\n")),
                    (false, Some(reason)) => {
                        Status::Skipped(format!("listed difference: {reason}"))
                    }
                    (true, Some(_)) => {
                        eprintln!(
                            "note: {} is listed in differences.txt but answered like etcd on {} ({} profile)",
                            c.id,
                            spec.label(),
                            p.name
                        );
                        Status::Passed
                    }
                }
            }
        };
        outcomes.push(outcome(spec, c, TargetKind::Proxy, Some(p.name), status));
    }
    outcomes
}

/// Checks direct etcd's transcript against `snapshots/etcd-<version>/<area>__<name>.snap` with insta. A missing or
/// different snapshot fails (insta writes a `.snap.new` to review; `INSTA_UPDATE=always` records instead).
fn check_snapshot(root: &Path, version: &str, c: &Case, t: &Transcript) -> Result<(), String> {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root.join("snapshots").join(format!("etcd-{version}")));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_input_file(&c.path);
    settings.set_description(c.description.clone());
    let name = c.snapshot_name();
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
