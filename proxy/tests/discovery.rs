//! Discovery, against real etcd: MemberList through the proxy lists etcd's members reached at the proxy
//! (`--advertise-client-url`, on by default as in etcd's Go proxy) or at every proxy registered under
//! `--resolver-prefix` (`member_ids.rs` checks the members themselves); a registration lives under a
//! lease the proxy keeps alive, comes back when the lease is lost, goes at once when the proxy stops gracefully
//! and within its TTL when the proxy is killed.

mod support;

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use testkit::{EtcdCluster, ProxyProcess, wait_for};
use tokio::time::Instant;

/// The registration lease's TTL in these tests, in seconds.
const TTL: u64 = 2;
/// etcd revokes expired leases from a loop that runs every 500 ms (its lessor's `revokeExpiredLeases`), so a key
/// may outlive its lease by that much.
const ETCD_EXPIRY_CHECK: Duration = Duration::from_millis(500);
/// How long a proxy may take to register (its start, one LeaseGrant and one Put, on a loaded CI machine).
const REGISTER_WITHIN: Duration = Duration::from_secs(20);

async fn client(endpoint: &str) -> Client {
    Client::connect([endpoint], None).await.expect("connect")
}

/// The client URLs and names MemberList lists through `endpoint`.
async fn members(endpoint: &str) -> Vec<(String, String)> {
    let mut client = client(endpoint).await;
    let list = client.member_list().await.expect("member list");
    list.members()
        .iter()
        .map(|m| (m.client_urls().join(","), m.name().to_owned()))
        .collect()
}

/// The registration keys under `prefix` in etcd.
async fn registrations(etcd: &str, prefix: &str) -> Vec<(String, String)> {
    let mut client = client(etcd).await;
    let got = client
        .get(format!("{prefix}/"), Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    got.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                kv.value_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn registered_proxy(cluster: &EtcdCluster, prefix: &str) -> ProxyProcess {
    let flags = [
        format!("--resolver-prefix={prefix}"),
        format!("--resolver-ttl={TTL}"),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    support::proxy::start(&cluster.endpoints(), &flags).await
}

async fn wait_registered(etcd: &str, prefix: &str, expected: &[String]) {
    wait_for("the registrations", REGISTER_WITHIN, || async {
        let keys: Vec<String> = registrations(etcd, prefix)
            .await
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let mut want: Vec<String> = expected.iter().map(|a| format!("{prefix}/{a}")).collect();
        want.sort();
        if keys == want {
            Ok(())
        } else {
            Err(format!("registered: {keys:?}, expected {want:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_lists_the_proxy_by_default_and_passes_through_when_told() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&cluster.endpoints(), &[]).await;
    let listed = members(&proxy.addr()).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        listed[0].0,
        proxy.addr(),
        "the proxy's own address, as clients reach it"
    );
    assert!(
        !listed[0].1.is_empty(),
        "a name, or clientv3's Sync drops it"
    );

    let passing = support::proxy::start(&cluster.endpoints(), &["--advertise-client-url="]).await;
    assert_eq!(
        members(&passing.addr()).await,
        members(&cluster.endpoint(0)).await,
        "an empty --advertise-client-url passes MemberList through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_proxies_list_each_other_and_leave_when_stopped_or_killed() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let etcd = cluster.endpoint(0);
    let prefix = "fleet";
    let first = registered_proxy(&cluster, prefix).await;
    let second = registered_proxy(&cluster, prefix).await;
    wait_registered(&etcd, prefix, &[first.addr(), second.addr()]).await;

    // The value is etcd's naming format, as Go clients resolving etcd:///fleet read it.
    let (_, value) = registrations(&etcd, prefix).await.remove(0);
    assert!(value.starts_with(r#"{"Op":0,"Addr":""#), "{value}");
    assert!(value.contains(r#""Metadata":"{\"name\":"#), "{value}");

    // Either proxy lists both.
    for proxy in [&first, &second] {
        let mut urls: Vec<String> = members(&proxy.addr())
            .await
            .into_iter()
            .flat_map(|m| m.0.split(',').map(str::to_owned).collect::<Vec<_>>())
            .collect();
        urls.sort();
        urls.dedup();
        let mut want = vec![first.addr(), second.addr()];
        want.sort();
        assert_eq!(urls, want, "MemberList through {}", proxy.addr());
    }

    // Stopped gracefully: its key is gone by the time it has exited.
    let mut first = first;
    first.terminate();
    support::proxy::wait_exited(&mut first, Duration::from_secs(30)).await;
    let left: Vec<String> = registrations(&etcd, prefix)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        left,
        [format!("{prefix}/{}", second.addr())],
        "deregistered at once"
    );

    // Killed: its key goes when its lease expires, within the TTL (it renewed at most a third of it ago) and
    // etcd's expiry check.
    let killed_at = Instant::now();
    drop(second);
    wait_for(
        "the killed proxy's key to expire",
        Duration::from_secs(TTL) + ETCD_EXPIRY_CHECK + Duration::from_millis(500),
        || async {
            match registrations(&etcd, prefix).await.len() {
                0 => Ok(()),
                n => Err(format!("{n} left")),
            }
        },
    )
    .await;
    eprintln!("killed proxy's key gone after {:?}", killed_at.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_registration_lease_is_replaced() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let etcd = cluster.endpoint(0);
    let prefix = "fleet";
    let proxy = registered_proxy(&cluster, prefix).await;
    wait_registered(&etcd, prefix, &[proxy.addr()]).await;

    // Revoke its lease behind its back, as an operator or a lease expiry during a partition would.
    let mut direct = client(&etcd).await;
    let got = direct
        .get(format!("{prefix}/"), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let lease = got.kvs()[0].lease();
    direct.lease_revoke(lease).await.expect("revoke");
    assert!(registrations(&etcd, prefix).await.is_empty());

    // The next renewal (a third of the TTL away) says the lease is gone; the proxy registers again.
    wait_registered(&etcd, prefix, &[proxy.addr()]).await;
    let got = direct
        .get(format!("{prefix}/"), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_ne!(got.kvs()[0].lease(), lease, "under a new lease");
}

/// A client of `endpoint` logged in as `user` with `password`.
async fn client_as(endpoint: &str, user: &str, password: &str) -> Client {
    let options = ConnectOptions::new().with_user(user, password);
    Client::connect([endpoint], Some(options))
        .await
        .expect("connect with a user")
}

/// Turns etcd's auth on with root, `fleet` (who may read and write under `fleet/`) and `others` (`NAME:PASSWORD`,
/// without roles).
async fn enable_auth_with_fleet_writer(cluster: &EtcdCluster, others: &[&str]) {
    let grant = [
        "role",
        "grant-permission",
        "--prefix=true",
        "fleet-writer",
        "readwrite",
        "fleet/",
    ];
    let mut steps: Vec<Vec<&str>> = vec![
        vec!["user", "add", "root:rootpw"],
        vec!["user", "add", "fleet:fleetpw"],
        vec!["role", "add", "fleet-writer"],
        grant.to_vec(),
        vec!["user", "grant-role", "fleet", "fleet-writer"],
    ];
    steps.extend(others.iter().map(|other| vec!["user", "add", other]));
    steps.push(vec!["auth", "enable"]);
    for args in &steps {
        cluster.etcdctl(0).ok(args).await;
    }
}

/// Under etcd auth the proxy registers as its own user (`--user`). A proxy whose user may not write under the
/// prefix logs etcd's refusal and tries again, serves its clients meanwhile, and leaves no lease behind for a
/// refused attempt (each attempt grants a lease before the write is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_auth_a_proxy_registers_as_its_user_and_a_refused_one_retries_and_keeps_serving() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let etcd = cluster.endpoint(0);
    enable_auth_with_fleet_writer(&cluster, &["nobody:nobodypw"]).await;
    let prefix = "fleet";
    let start = |user: &'static str| {
        let endpoints = cluster.endpoints();
        async move {
            // A long TTL, so that a lease a refused attempt left behind would still be there to see.
            let flags = [
                format!("--user={user}"),
                format!("--resolver-prefix={prefix}"),
                "--resolver-ttl=60".to_string(),
            ];
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            support::proxy::start(&endpoints, &flags).await
        }
    };
    let allowed = start("fleet:fleetpw").await;
    let refused = start("nobody:nobodypw").await;

    let mut root = client_as(&etcd, "root", "rootpw").await;
    let registered = |kvs: &[etcd_client::KeyValue]| -> Vec<(String, i64)> {
        kvs.iter()
            .map(|kv| (kv.key_str().unwrap().to_owned(), kv.lease()))
            .collect()
    };
    let mut lease = 0;
    wait_for("the allowed proxy's registration", REGISTER_WITHIN, || {
        let mut root = root.clone();
        let want = format!("{prefix}/{}", allowed.addr());
        async move {
            let got = root
                .get(format!("{prefix}/"), Some(GetOptions::new().with_prefix()))
                .await
                .map_err(|e| e.to_string())?;
            match registered(got.kvs()).as_slice() {
                [(key, _)] if *key == want => Ok(()),
                other => Err(format!("registered: {other:?}")),
            }
        }
    })
    .await;
    let got = root
        .get(format!("{prefix}/"), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    if let [(_, registration)] = registered(got.kvs()).as_slice() {
        lease = *registration;
    }
    assert_ne!(lease, 0, "the registration lives under a lease");

    // The refused proxy says why, and tries again (once a second).
    let refused = &refused;
    let refusals = || {
        refused
            .log_tail(2000)
            .lines()
            .filter(|line| line.contains("cannot register in etcd; trying again"))
            .filter(|line| line.contains("permission denied"))
            .count()
    };
    wait_for("three logged refusals", REGISTER_WITHIN, || {
        let seen = refusals();
        let tail = refused.log_tail(5);
        async move {
            if seen >= 3 {
                Ok(())
            } else {
                Err(format!("{seen} refusals logged: {tail}"))
            }
        }
    })
    .await;

    // It serves its clients meanwhile.
    let mut through_refused = client_as(&refused.addr(), "root", "rootpw").await;
    through_refused
        .put("k", "v", None)
        .await
        .expect("a put through the refused proxy");
    let read = through_refused
        .get("k", None)
        .await
        .expect("a read through it");
    assert_eq!(read.kvs()[0].value(), b"v");

    // No refused attempt's lease outlives it: a lease other than the registration's seen twice, a refusal apart,
    // was left behind.
    let leases = |mut root: Client| async move {
        let listed = root.leases().await.expect("lease list");
        listed
            .leases()
            .iter()
            .map(|l| l.id())
            .filter(|&id| id != lease)
            .collect::<Vec<i64>>()
    };
    let before = leases(root.clone()).await;
    let refusals_before = refusals();
    wait_for("another refusal", REGISTER_WITHIN, || {
        let seen = refusals();
        async move {
            if seen > refusals_before {
                Ok(())
            } else {
                Err("no new refusal".to_string())
            }
        }
    })
    .await;
    let after = leases(root.clone()).await;
    let left: Vec<&i64> = before.iter().filter(|id| after.contains(id)).collect();
    assert!(
        left.is_empty(),
        "refused attempts left leases behind: {left:?} (before {before:?}, after {after:?})"
    );
    root.delete("k", None).await.expect("clean up");
}

/// Under etcd auth the registration lease is renewed as the proxy's own user: etcd 3.5.30 refuses a renewal
/// without a token ("user name is empty"), so a proxy renewing without one loses its registration within its
/// TTL. The lease and the key must outlive two TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_auth_the_registration_is_renewed_as_the_proxys_user() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let etcd = cluster.endpoint(0);
    enable_auth_with_fleet_writer(&cluster, &[]).await;
    let flags = [
        "--user=fleet:fleetpw".to_string(),
        "--resolver-prefix=fleet".to_string(),
        format!("--resolver-ttl={TTL}"),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = support::proxy::start(&cluster.endpoints(), &flags).await;
    let key = format!("fleet/{}", proxy.addr());
    let mut root = client_as(&etcd, "root", "rootpw").await;
    let lease = {
        let root = root.clone();
        let key = key.clone();
        wait_for("the registration", REGISTER_WITHIN, move || {
            let (mut root, key) = (root.clone(), key.clone());
            async move {
                let got = root
                    .get(key.as_str(), None)
                    .await
                    .map_err(|e| e.to_string())?;
                got.kvs()
                    .first()
                    .map(|kv| kv.lease())
                    .ok_or_else(|| "not registered yet".to_string())
            }
        })
        .await
    };
    // Unrenewed, the lease would be gone after its TTL (plus etcd's expiry loop). It must live through two TTLs:
    // renewals come every third of it.
    let registered_at = Instant::now();
    let outlive = Duration::from_secs(2 * TTL) + ETCD_EXPIRY_CHECK;
    while registered_at.elapsed() < outlive {
        let ttl = root
            .lease_time_to_live(lease, None)
            .await
            .expect("TimeToLive as root")
            .ttl();
        assert!(
            ttl > 0,
            "the registration lease expired {:?} after the registration: the proxy did not renew it",
            registered_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = root.get(key.as_str(), None).await.unwrap();
    assert_eq!(got.kvs().len(), 1, "the registration is still there");
}

/// MemberList through a proxy that answers it with the fleet (the default) refuses whom etcd refuses: under auth,
/// etcd 3.5.30 lists its members only to a caller with a valid token ("user name is empty" without one); earlier
/// versions list them to anyone. Each caller's outcome through the proxy matches its outcome directly; a caller
/// etcd lets list gets the proxy's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_auth_member_list_through_the_proxy_is_refused_as_etcd_refuses_it() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let etcd = cluster.endpoint(0);
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "plain:plainpw"],
        &["auth", "enable"],
    ] {
        cluster.etcdctl(0).ok(args).await;
    }
    let proxy = support::proxy::start(&cluster.endpoints(), &[]).await;
    let addr = proxy.addr();
    let root = support::grpc::token(&etcd, "root", "rootpw").await;
    let plain = support::grpc::token(&etcd, "plain", "plainpw").await;
    let list = |endpoint: String, token: String| async move {
        let request = proto::etcdserverpb::MemberListRequest {
            linearizable: false,
        };
        let request = if token.is_empty() {
            tonic::Request::new(request)
        } else {
            support::grpc::with_meta(request, "token", &token)
        };
        proto::etcdserverpb::cluster_client::ClusterClient::new(
            support::grpc::channel(&endpoint).await,
        )
        .member_list(request)
        .await
        .map(|answer| {
            answer
                .into_inner()
                .members
                .iter()
                .map(|m| m.client_ur_ls.join(","))
                .collect::<Vec<_>>()
        })
        .map_err(|refused| support::grpc::status(&refused))
    };
    for (who, token) in [
        ("root", root),
        ("a user without the root role", plain),
        ("no token", String::new()),
    ] {
        let direct = list(etcd.clone(), token.clone()).await;
        let proxied = list(addr.clone(), token).await;
        match (&direct, &proxied) {
            (Ok(_), Ok(listed)) => {
                assert_eq!(listed, &vec![addr.clone()], "{who}: the proxy lists itself")
            }
            (Err(direct), Err(proxied)) => assert_eq!(proxied, direct, "{who}"),
            _ => panic!("{who}: directly {direct:?}, through the proxy {proxied:?}"),
        }
    }
}
