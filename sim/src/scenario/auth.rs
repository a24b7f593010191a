//! The `auth` scenario: etcd's auth on, with tokens that expire after two seconds unused (etcd's
//! `--auth-token-ttl=2`), under `watch`'s faults. Watchers go through the proxy as users who may read some of the
//! watched ranges and not others; writers write straight on the members as root.
//!
//! On even seeds the proxy runs with `--user=proxy:proxypw`: it holds its upstream watch streams as its own user
//! (who may read everything), renews its own token when etcd refuses it, and admits each watcher by a check of the
//! caller's token. On odd seeds it runs without: upstream watch streams are shared only by callers with one token.
//!
//! Readers read through the proxy as alice and bob, one Range at a time, ranges each may read and ranges it may
//! not, serializable (the proxy's range cache, on by default, answers many) or linearizable.
//!
//! Clients keep their logins as etcd's clients do ([`super::login`]): a watcher refused for an invalid token (a
//! member forgot it: unused for two seconds, or the member restarted) is created again, with a new token, from the
//! revision after the last one it received; a reader's next call authenticates again. Checks: a permitted watcher
//! sees exactly the model's events, in time; a forbidden one is refused with etcd's reason and sees nothing; a
//! forbidden read is never answered, even when another user's read of the same range was answered before (a copy
//! in the cache); a permitted read's answer is the model's state at its revision ([`crate::check::auth`]).

use std::time::Duration;

use proto::authpb::Permission;
use proto::authpb::permission::Type as PermissionType;
use proto::etcdserverpb::RangeRequest;
use proto::etcdserverpb::kv_client::KvClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::login::{Login, Session, with_token};
use super::logs::{Logs, now};
use super::watchers::{Start, WatcherSpec};
use super::{spawn_direct_writers, spawn_fence, spawn_watch_client, watch_ranges};
use crate::check::auth::{UserRead, may_read};
use crate::check::cache::{ReadLog, ReadOutcome, describe};
use crate::model::Cluster;
use crate::topology::proxy_authority;
use crate::trace::Trace;
use crate::world::{Settings, World};

/// etcd's `--auth-token-ttl` in this scenario: short, so that tokens expire while the faults make clients and the
/// proxy use them again.
pub const TOKEN_TTL: Duration = Duration::from_secs(2);

/// The proxy's own user (`--user`), who may read every key.
pub const PROXY_LOGIN: (&str, &str) = ("proxy", "proxypw");

/// Who watches: one per client host of `watch` ([`super::watch_clients`]).
const WATCHING_USERS: [&str; super::WATCH_CLIENTS] = ["alice", "bob", "alice"];

/// Who reads: one client host per entry.
const READING_USERS: [&str; 2] = ["alice", "bob"];

/// The readers read until here (past the faults' healing, so that the last reads are of a settled cluster).
const READS_UNTIL: Duration = Duration::from_millis(4400);

/// How long a reader waits for an answer.
const READ_BOUND: Duration = Duration::from_secs(4);

/// Whether the proxy of a seed's run has `--user` (even seeds).
pub fn proxy_has_user(seed: u64) -> bool {
    seed.is_multiple_of(2)
}

/// The scenario's world: `watch`'s ([`super::watch_world_with`]), with `--user` on even seeds.
pub fn world<'a>(settings: Settings) -> World<'a> {
    let user = proxy_has_user(settings.seed).then(|| proxy::config::Credentials {
        user: PROXY_LOGIN.0.to_string(),
        password: PROXY_LOGIN.1.to_string(),
    });
    super::watch_world_with(settings, user)
}

/// Users, roles and auth on, as an operator would set them up with etcdctl before the proxy starts:
/// - root (the root role), who writes;
/// - proxy, who may read every key;
/// - alice, who may read and write `k/`..`k0`;
/// - bob, who may read `k/1` and `k/2`..`k/4`.
///
/// So alice may not watch `"\0"`.. and bob may watch only `k/1`; alice's watch from `k/4` on is a watch etcd 3.5.30
/// lets through while she may not read all of it (see [`crate::check::auth`]): the proxy must refuse it.
pub fn set_up(cluster: &Cluster) {
    let grant = |perm_type: PermissionType, key: &str, range_end: &str| {
        Some(Permission {
            perm_type: perm_type as i32,
            key: key.into(),
            range_end: range_end.into(),
        })
    };
    cluster.set_auth_token_ttl(TOKEN_TTL);
    cluster.with_auth(|auth, _| {
        let mut set_up = || -> Result<(), tonic::Status> {
            auth.user_add("root", "rootpw", false)?;
            auth.user_grant_role("root", "root")?;
            auth.user_add(PROXY_LOGIN.0, PROXY_LOGIN.1, false)?;
            auth.role_add("read-all")?;
            auth.role_grant_permission("read-all", grant(PermissionType::Read, "\0", "\0"))?;
            auth.user_grant_role(PROXY_LOGIN.0, "read-all")?;
            auth.user_add("alice", "alicepw", false)?;
            auth.role_add("k")?;
            auth.role_grant_permission("k", grant(PermissionType::Readwrite, "k/", "k0"))?;
            auth.user_grant_role("alice", "k")?;
            auth.user_add("bob", "bobpw", false)?;
            auth.role_add("some-k")?;
            auth.role_grant_permission("some-k", grant(PermissionType::Read, "k/1", ""))?;
            auth.role_grant_permission("some-k", grant(PermissionType::Read, "k/2", "k/4"))?;
            auth.user_grant_role("bob", "some-k")?;
            auth.enable()
        };
        set_up().expect("the auth set-up is valid");
    });
}

fn login(user: &str) -> Login {
    Login::new(user, &format!("{user}pw"))
}

pub fn build_auth(world: &mut World<'_>, logs: &Logs, rng: &mut StdRng, members: usize) {
    set_up(&world.cluster);
    let (fence_tx, fence_rx) = watch::channel(None);
    for (client, (host, user)) in super::watch_clients()
        .into_iter()
        .zip(WATCHING_USERS)
        .enumerate()
    {
        // Each client watches one range its user may read and one it may not.
        let (allowed, denied): (Vec<_>, Vec<_>) =
            watch_ranges().into_iter().partition(|(key, range_end)| {
                may_read(&world.cluster, user, key.as_bytes(), range_end.as_bytes())
            });
        let mut specs = Vec::new();
        for (index, choices) in [allowed, denied].into_iter().enumerate() {
            let (key, range_end) = choices[rng.random_range(0..choices.len())];
            let start = match rng.random_bool(0.3) {
                true => Start::Revision(rng.random_range(1..4)),
                false => Start::Now,
            };
            let mut spec = WatcherSpec::simple(format!("w{client}.{index}"), key, range_end, start);
            spec.prev_kv = rng.random_bool(0.5);
            specs.push(spec);
        }
        let delay = Duration::from_millis(rng.random_range(0..1500));
        spawn_watch_client(
            world,
            logs,
            &host,
            specs,
            delay,
            &fence_rx,
            Some(login(user)),
        );
    }
    for (reader, user) in READING_USERS.into_iter().enumerate() {
        let name = format!("reader{reader}");
        let (seed, logs) = (rng.random(), logs.clone());
        let (trace, dialer) = (world.trace.clone(), world.dialer());
        world.client(&name.clone(), async move {
            let channel = dialer.channel(&proxy_authority());
            read_as(name, user, seed, channel, logs, trace).await;
            Ok(())
        });
    }
    spawn_direct_writers(world, rng, members, Some(login("root")));
    spawn_fence(world, members, fence_tx, Some(login("root")));
}

/// One reader client of `user` through the proxy until [`READS_UNTIL`]: one Range at a time, of a range picked at
/// random among `watch`'s (so each user reads ranges it may read and ranges it may not), serializable (which the
/// proxy may answer from its cache) or, one in four, linearizable; a token etcd refuses is replaced.
async fn read_as(name: String, user: &str, seed: u64, channel: Channel, logs: Logs, trace: Trace) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut session = Session::new(login(user));
    let mut kv = KvClient::new(channel.clone());
    let ranges = watch_ranges();
    while now() < READS_UNTIL {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
        let (key, range_end) = ranges[rng.random_range(0..ranges.len())];
        let request = RangeRequest {
            key: key.into(),
            range_end: range_end.into(),
            serializable: rng.random_bool(0.75),
            ..Default::default()
        };
        let Some(token) = session.token(&channel).await else {
            continue;
        };
        let started = now();
        let call = kv.range(with_token(request.clone(), Some(&token)));
        let outcome = match tokio::time::timeout(READ_BOUND, call).await {
            Ok(Ok(answer)) => ReadOutcome::Answer(answer.into_inner()),
            Ok(Err(status)) => {
                session.failed(&status);
                ReadOutcome::Failed {
                    code: status.code(),
                    message: status.message().to_string(),
                }
            }
            Err(_) => ReadOutcome::TimedOut,
        };
        trace.record(format!(
            "{name} ({user}): {} -> {outcome:?}",
            describe(&request)
        ));
        let read = ReadLog {
            client: name.clone(),
            started,
            finished: now(),
            request,
            outcome,
        };
        logs.push_user_read(UserRead {
            user: user.to_string(),
            read,
        });
    }
}
