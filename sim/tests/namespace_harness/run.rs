//! Running a case in one turmoil world: the model members and the production proxies as `World` runs them, a
//! fresh model per namespace served directly as the reference, and one client that sends every request to both,
//! compares, and finally fences and compares the watchers; then the model's history is checked for confinement.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::etcdserverpb::PutRequest;
use proxy::net::Net;
use sim::check::hygiene::check_hygiene;
use sim::check::namespace::{check_confinement, show};
use sim::fault::FaultPlan;
use sim::model::{self, Cluster};
use sim::net::TurmoilNet;
use sim::topology::{self, MEMBER_PORT, PROXY_PORT, member_authority};
use sim::world::{self, Settings, World};

use super::answers::{Target, align_ttl, strip_event_revisions, strip_revisions};
use super::case::{Case, End, Key, Op, RangeOp};

/// Whether revisions may appear in requests: not when two namespaces share one model's revisions and each is
/// compared with a model of its own.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exact,
    RevisionFree,
}

/// What answers under test: the production proxies (one per namespace), or, to check the harness itself, fresh
/// models answering directly (`preloaded`: one holding a key the reference lacks, which must be noticed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    Proxies,
    Direct { preloaded: bool },
}

pub fn quiet_settings(seed: u64, members: usize) -> Settings {
    Settings {
        plan: Some(FaultPlan::default()),
        limit: Duration::from_secs(300),
        ..Settings::quiet(seed, members)
    }
}

/// Serves a fresh model of one member on `host`.
pub fn serve_model(world: &mut World<'_>, host: &str, cluster: Cluster) {
    world.sim.host(host, move || {
        let cluster = cluster.clone();
        async move {
            let listener = TurmoilNet::default()
                .bind(topology::listen_addr(MEMBER_PORT))
                .await?;
            model::serve(cluster, 0, listener, std::future::pending()).await?;
            Ok(())
        }
    });
}

/// Runs a case; returns what went wrong (nothing if the property holds).
pub fn run_case(case: &Case, mode: Mode, subject: Subject) -> Vec<String> {
    let sides = case.namespaces.len();
    let proxies = match subject {
        Subject::Proxies => (0..sides)
            .map(|side| {
                let mut config = world::proxy_config(case.seed, sides);
                // `--endpoints=m<side>:2379 --namespace=<prefix>`: each proxy fronts its own member.
                config.endpoints =
                    vec![proxy::Endpoint::parse(&member_authority(side)).expect("valid endpoint")];
                config.namespace = case.namespaces[side].0.clone();
                (format!("proxy{side}"), config)
            })
            .collect(),
        Subject::Direct { .. } => Vec::new(),
    };
    let mut world = World::with_proxies(quiet_settings(case.seed, sides), proxies);
    // The references (and the direct subjects of a harness check) are one-member clusters with the world's seed,
    // so their headers carry the same cluster and member IDs as member 0 of the world.
    for side in 0..sides {
        serve_model(
            &mut world,
            &format!("reference{side}"),
            Cluster::new(1, case.seed),
        );
    }
    let direct_subjects: Vec<Cluster> = match subject {
        Subject::Proxies => Vec::new(),
        Subject::Direct { .. } => (0..sides).map(|_| Cluster::new(1, case.seed)).collect(),
    };
    for (side, cluster) in direct_subjects.iter().enumerate() {
        serve_model(&mut world, &format!("subject{side}"), cluster.clone());
    }
    let found: Arc<Mutex<Vec<String>>> = Arc::default();
    let client = {
        let case = case.clone();
        let found = found.clone();
        async move {
            let problems = drive(&case, mode, subject).await;
            found.lock().unwrap().extend(problems);
            Ok(())
        }
    };
    world.client("client", client);
    let finished = world.run();
    let mut violations = match subject {
        Subject::Proxies => check_hygiene(&finished),
        Subject::Direct { .. } => finished.sim_error.into_iter().collect(),
    };
    let client_problems: Vec<String> = found.lock().unwrap().drain(..).collect();
    let completed = client_problems.is_empty();
    violations.extend(client_problems);
    if subject == Subject::Proxies {
        let prefixes = case
            .namespaces
            .iter()
            .enumerate()
            .map(|(member, ns)| (member, ns.0.clone()))
            .collect();
        let history = finished.cluster.history();
        violations.extend(check_confinement(&history, &prefixes));
        // A completed case ends with a read through each proxy: a member that recorded nothing would make the
        // confinement check vacuous.
        for member in (0..case.namespaces.len()).filter(|_| completed) {
            if !history.accesses.iter().any(|a| a.member == member) {
                violations.push(format!(
                    "member {member} recorded no request from proxy{member}"
                ));
            }
        }
    }
    violations
}

/// The client: every step on its side's subject and reference, answers compared; then every watcher fenced and
/// compared. Stops at the first difference (the states differ from there on).
pub async fn drive(case: &Case, mode: Mode, subject: Subject) -> Vec<String> {
    let mut problems = Vec::new();
    let mut subjects: Vec<Target> = (0..case.namespaces.len())
        .map(|side| match subject {
            Subject::Proxies => {
                Target::new(format!("proxy{side}"), &format!("proxy{side}:{PROXY_PORT}"))
            }
            Subject::Direct { .. } => Target::new(
                format!("subject{side}"),
                &format!("subject{side}:{MEMBER_PORT}"),
            ),
        })
        .collect();
    let mut references: Vec<Target> = (0..case.namespaces.len())
        .map(|side| {
            Target::new(
                format!("reference{side}"),
                &format!("reference{side}:{MEMBER_PORT}"),
            )
        })
        .collect();
    if subject == (Subject::Direct { preloaded: true }) {
        let _ = subjects[0]
            .kv
            .put(PutRequest {
                key: b"a".to_vec(),
                value: b"preloaded".to_vec(),
                ..Default::default()
            })
            .await;
    }
    // Every case ends by reading each side's whole keyspace.
    let everything = Op::Range(RangeOp {
        key: Key::Bytes(vec![0]),
        end: End::FromKey,
        revision: 0,
        limit: 0,
        sort: (0, 0),
        keys_only: false,
        count_only: false,
        serializable: false,
        filters: (0, 0, 0, 0),
    });
    let finale = (0..case.namespaces.len()).map(|side| (side, everything.clone()));
    for (step, (side, op)) in case.steps.iter().cloned().chain(finale).enumerate() {
        let mut got = subjects[side].call(&op, &case.namespaces).await;
        let mut want = references[side].call(&op, &case.namespaces).await;
        if mode == Mode::RevisionFree {
            strip_revisions(&mut got);
            strip_revisions(&mut want);
        }
        align_ttl(&mut got, &want);
        if got != want {
            problems.push(format!(
                "step {step} through {} ({}): {op:?}\n      {}: {got:?}\n      {}: {want:?}",
                subjects[side].name,
                namespace_name(case, side),
                subjects[side].name,
                references[side].name,
            ));
            return problems;
        }
    }
    for side in 0..case.namespaces.len() {
        let (got_name, want_name) = (subjects[side].name.clone(), references[side].name.clone());
        let (Some(got), Some(want)) =
            (subjects[side].line.as_mut(), references[side].line.as_mut())
        else {
            continue;
        };
        // Nothing is written any more: once a stream has answered a progress request, every event its watchers
        // will ever get has arrived (etcd, and the proxy, answer progress only after the events before it).
        for (line, name) in [(&mut *want, &want_name), (&mut *got, &got_name)] {
            if let Err(why) = line.fence().await {
                problems.push(format!(
                    "through {name} ({}): watch stream: {why}",
                    namespace_name(case, side)
                ));
            }
        }
        let mut got_watchers = got.watchers();
        let mut want_watchers = want.watchers();
        if mode == Mode::RevisionFree {
            got_watchers.iter_mut().for_each(strip_event_revisions);
            want_watchers.iter_mut().for_each(strip_event_revisions);
        }
        let creates = case.steps.iter().filter_map(|(s, op)| match op {
            Op::Watch(create) if *s == side => Some(create),
            _ => None,
        });
        let compared = creates.zip(got_watchers.iter().zip(&want_watchers));
        if let Some((index, (create, (got, want)))) = compared
            .enumerate()
            .find(|(_, (_, (got, want)))| got != want)
        {
            problems.push(format!(
                "watcher {index} through {got_name} ({}): {create:?}\n      {got_name}: {got:?}\n      {want_name}: {want:?}",
                namespace_name(case, side),
            ));
        } else if got_watchers.len() != want_watchers.len() {
            problems.push(format!(
                "through {got_name} ({}): {} watchers created, {} on {want_name}",
                namespace_name(case, side),
                got_watchers.len(),
                want_watchers.len(),
            ));
        }
    }
    problems
}

pub fn namespace_name(case: &Case, side: usize) -> String {
    format!("namespace {}", show(&case.namespaces[side].0))
}

pub fn failure_text(test: &str, violations: &[String]) -> String {
    format!(
        "reproduce: cargo test -p sim --test namespace {test} (generator seed {:#x}; the minimal case is printed below)\n  {}",
        generator_seed(),
        violations.join("\n  ")
    )
}

/// The generator's seed: fixed, so that a run explores the same cases every time (`SIM_SEED` picks another).
pub fn generator_seed() -> u64 {
    sim::seeds::sweep()[0] ^ 0x6e73
}
