//! The range cache against real etcd: a write made directly on etcd reaches serializable reads through the proxy
//! by the cache's watch (answered from the cache, not by going to etcd), reads never go back in revision, a write
//! through the proxy is read back at once, every option of Range is answered from a copy exactly as etcd answers
//! it (ranges inside a cached prefix included), linearizable reads from the cache reflect every acknowledged write,
//! a copy that keeps failing to answer is retired and its range filled again after resting, a cache whose copies
//! answer nothing sleeps (every read to etcd, no copy kept) and wakes, and under auth a copy
//! another user's read filled reaches only users etcd lets read it.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use proto::etcdserverpb::{PutRequest, RangeRequest, RangeResponse};
use support::metrics;
use testkit::wait_for;
use tonic::transport::Channel;

const CACHE_ON: &str = "--range-cache-max-bytes=67108864";
/// A hang guard, far above an event's delivery on loopback.
const DELIVERY_GUARD: Duration = Duration::from_secs(10);

async fn put(client: &mut KvClient<Channel>, key: &str, value: &str) -> i64 {
    let request = PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    };
    let answer = client.put(request).await.expect("put").into_inner();
    answer.header.expect("header").revision
}

fn serializable(key: &str, range_end: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        range_end: range_end.to_vec(),
        serializable: true,
        ..Default::default()
    }
}

async fn read(client: &mut KvClient<Channel>, request: RangeRequest) -> RangeResponse {
    client.range(request).await.expect("range").into_inner()
}

fn revision(answer: &RangeResponse) -> i64 {
    answer.header.expect("header").revision
}

/// One etcd member, the proxy in front of it with the cache on, and a KV client of each.
struct Stack {
    _cluster: testkit::EtcdCluster,
    proxy: testkit::ProxyProcess,
    direct: KvClient<Channel>,
    through: KvClient<Channel>,
}

impl Stack {
    async fn start(binaries: &testkit::Binaries) -> Self {
        let cluster = support::cluster(binaries, 1, &[]).await;
        let proxy = support::proxy::start(&cluster.endpoints(), &[CACHE_ON]).await;
        let direct = KvClient::new(support::grpc::channel(&cluster.addr(0)).await);
        let through = KvClient::new(support::grpc::channel(&proxy.addr()).await);
        Self {
            _cluster: cluster,
            proxy,
            direct,
            through,
        }
    }
}

fn hits_and_misses(text: &str) -> (f64, f64) {
    let get = |name| metrics::value(text, name, &[]).unwrap_or(0.0);
    (
        get("etcd_grpc_proxy_cache_hits_total"),
        get("etcd_grpc_proxy_cache_misses_total"),
    )
}

/// Reads `request` until the cache answers it (the copy answers once etcd has confirmed its watcher; reads before
/// that go to etcd); returns that answer.
async fn first_answer_from_the_copy(
    through: &KvClient<Channel>,
    proxy: &testkit::ProxyProcess,
    request: RangeRequest,
) -> RangeResponse {
    let (hits_before, _) = hits_and_misses(&proxy.metrics().await);
    wait_for("an answer from the copy", DELIVERY_GUARD, || {
        let (mut through, request) = (through.clone(), request.clone());
        async move {
            let answer = read(&mut through, request).await;
            let (hits, _) = hits_and_misses(&proxy.metrics().await);
            if hits > hits_before {
                Ok(answer)
            } else {
                Err("no answer from the cache yet".to_string())
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_write_reaches_cached_reads_through_the_cache_watch() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let Stack {
        _cluster,
        proxy,
        mut direct,
        mut through,
    } = Stack::start(&binaries).await;

    let first = put(&mut direct, "k", "v1").await;
    let filled = read(&mut through, serializable("k", b"")).await;
    assert_eq!(filled.kvs[0].value, b"v1"[..]);
    let again = first_answer_from_the_copy(&through, &proxy, serializable("k", b"")).await;
    assert_eq!(again, filled, "the copy answers as etcd did");
    let (hits, misses) = hits_and_misses(&proxy.metrics().await);
    assert_eq!(hits, 1.0, "one answer from the copy");

    let second = put(&mut direct, "k", "v2").await;
    assert!(second > first);
    let mut last_revision = revision(&again);
    let seen = wait_for("the direct write through the cache", DELIVERY_GUARD, || {
        let mut through = through.clone();
        async move {
            let answer = read(&mut through, serializable("k", b"")).await;
            Ok::<_, String>(answer).and_then(|a| {
                if a.kvs[0].value == b"v2"[..] {
                    Ok(a)
                } else {
                    Err(format!("still {:?} at {}", a.kvs[0].value, revision(&a)))
                }
            })
        }
    })
    .await;
    assert!(revision(&seen) >= second);
    assert!(revision(&seen) >= last_revision);
    last_revision = revision(&seen);
    let (hits_after, misses_after) = hits_and_misses(&proxy.metrics().await);
    assert_eq!(
        misses_after, misses,
        "the new value came from the cache's watch"
    );
    assert!(hits_after > hits);

    // A write through the proxy is read back at once: the copy waits for the write's revision.
    let third = put(&mut through, "k", "v3").await;
    let answer = read(&mut through, serializable("k", b"")).await;
    assert_eq!(answer.kvs[0].value, b"v3"[..]);
    assert!(revision(&answer) >= third && revision(&answer) >= last_revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_range_option_is_answered_from_a_copy_as_etcd_answers_it() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let Stack {
        _cluster,
        proxy,
        mut direct,
        mut through,
    } = Stack::start(&binaries).await;
    for (key, value) in [
        ("p/a", "3"),
        ("p/b", "1"),
        ("p/c", "2"),
        ("p/b", "4"),
        ("q", "x"),
    ] {
        put(&mut direct, key, value).await;
    }
    let prefix = |request: RangeRequest| RangeRequest {
        key: b"p/".to_vec(),
        range_end: b"p0".to_vec(),
        serializable: true,
        ..request
    };
    // Fill the copy of the prefix, and wait until it answers.
    read(&mut through, prefix(RangeRequest::default())).await;
    first_answer_from_the_copy(&through, &proxy, prefix(RangeRequest::default())).await;
    let cases = [
        RangeRequest::default(),
        RangeRequest {
            limit: 2,
            ..Default::default()
        },
        RangeRequest {
            limit: 3,
            ..Default::default()
        },
        RangeRequest {
            sort_order: SortOrder::Descend as i32,
            limit: 1,
            ..Default::default()
        },
        RangeRequest {
            sort_target: SortTarget::Value as i32,
            ..Default::default()
        },
        RangeRequest {
            sort_target: SortTarget::Mod as i32,
            sort_order: SortOrder::Descend as i32,
            ..Default::default()
        },
        RangeRequest {
            keys_only: true,
            ..Default::default()
        },
        RangeRequest {
            count_only: true,
            limit: 1,
            ..Default::default()
        },
        RangeRequest {
            min_mod_revision: 3,
            limit: 1,
            ..Default::default()
        },
        RangeRequest {
            max_create_revision: 3,
            ..Default::default()
        },
    ];
    let (hits_before, _) = hits_and_misses(&proxy.metrics().await);
    for case in cases {
        let request = prefix(case);
        let expected = read(&mut direct, request.clone()).await;
        let answer = read(&mut through, request.clone()).await;
        assert_eq!(answer, expected, "{request:?}");
    }
    // Ranges inside the prefix come from its copy too: a key, a span, a key it does not hold, and a span cut by
    // a limit.
    let inside = [
        serializable("p/b", b""),
        serializable("p/b", b"p/c"),
        serializable("p/z", b""),
        RangeRequest {
            limit: 1,
            ..serializable("p/a", b"p/bz")
        },
    ];
    for request in inside {
        let expected = read(&mut direct, request.clone()).await;
        let answer = read(&mut through, request.clone()).await;
        assert_eq!(answer, expected, "{request:?}");
    }
    let (hits_after, _) = hits_and_misses(&proxy.metrics().await);
    assert_eq!(
        hits_after - hits_before,
        14.0,
        "every case came from the copy"
    );
}

/// Whether this etcd's progress answers can move a copy (from 3.5.8: every watcher of the stream is synced).
fn progress_moves_copies(version: testkit::Version) -> bool {
    version >= testkit::Version::V3_5_30
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_reads_from_the_cache_reflect_every_acknowledged_write() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let Stack {
        _cluster,
        proxy,
        mut direct,
        mut through,
    } = Stack::start(&binaries).await;
    let linearizable = |key: &str| RangeRequest {
        key: key.into(),
        ..Default::default()
    };

    put(&mut direct, "k", "0").await;
    // A linearizable answer that holds the whole range fills a copy too. Until etcd has synced the copy's watcher
    // (within its 100 ms resync), a linearizable read goes to etcd rather than wait for a progress answer etcd
    // would not give yet; then the copy answers.
    read(&mut through, linearizable("k")).await;
    // For 200 ms after a copy's watcher is created (two of etcd's 100 ms resync periods), a linearizable read that
    // needs a progress answer goes to etcd instead: etcd may not have synced the new watcher, and answers no
    // progress request until it has. Waiting that long is the condition itself: no later read may go to etcd.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (hits_after_fill, misses_after_fill) = hits_and_misses(&proxy.metrics().await);
    for round in 1..=20 {
        let value = round.to_string();
        let written = put(&mut direct, "k", &value).await;
        // A write elsewhere moves etcd's revision without an event on the cached range.
        let elsewhere = put(&mut direct, "elsewhere", &value).await;
        let answer = read(&mut through, linearizable("k")).await;
        assert_eq!(answer.kvs[0].value, value.as_bytes(), "round {round}");
        assert_eq!(answer.kvs[0].mod_revision, written, "round {round}");
        assert!(revision(&answer) >= elsewhere, "round {round}: {answer:?}");
    }
    let (hits, misses) = hits_and_misses(&proxy.metrics().await);
    if progress_moves_copies(binaries.version) {
        assert_eq!(
            (hits - hits_after_fill, misses),
            (20.0, misses_after_fill),
            "every read came from the copy"
        );
    } else {
        // An older etcd's progress answers prove nothing: no copy can answer a linearizable read, so once the
        // cache's first stream has learnt the version, it leaves such reads alone, as with the cache off.
        assert_eq!(hits, 0.0, "an older etcd's progress answers prove nothing");
        assert_eq!(
            misses, misses_after_fill,
            "linearizable reads pass the cache by, not even counted as misses"
        );
    }
}

async fn authenticate(addr: &str, name: &str, password: &str) -> String {
    let request = proto::etcdserverpb::AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    };
    proto::etcdserverpb::auth_client::AuthClient::new(support::grpc::channel(addr).await)
        .authenticate(request)
        .await
        .expect("authenticate")
        .into_inner()
        .token
}

async fn read_as(
    client: &mut KvClient<Channel>,
    token: &str,
    request: RangeRequest,
) -> Result<RangeResponse, tonic::Status> {
    let request = support::grpc::with_meta(request, "token", token);
    client.range(request).await.map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_auth_a_cached_answer_reaches_only_users_etcd_lets_read_it() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let ep = cluster.endpoint(0);
    let mut direct = KvClient::new(support::grpc::channel(&cluster.addr(0)).await);
    put(&mut direct, "s/1", "secret").await;
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "reader:readerpw"],
        &["user", "add", "other:otherpw"],
        &["role", "add", "reads"],
        &["role", "grant-permission", "reads", "read", "s/", "s0"],
        &["user", "grant-role", "reader", "reads"],
        &["auth", "enable"],
    ] {
        cluster.etcdctl(0).ok(args).await;
    }
    let proxy =
        support::proxy::start(&cluster.endpoints(), &[CACHE_ON, "--user=root:rootpw"]).await;
    let addr = proxy.addr();
    let mut through = KvClient::new(support::grpc::channel(&addr).await);
    let reader = authenticate(&addr, "reader", "readerpw").await;
    let other = authenticate(&addr, "other", "otherpw").await;
    let prefix = |serializable| RangeRequest {
        key: b"s/".to_vec(),
        range_end: b"s0".to_vec(),
        serializable,
        ..Default::default()
    };

    // How etcd refuses the other user.
    let refused = read_as(
        &mut direct,
        &authenticate(&ep, "other", "otherpw").await,
        prefix(true),
    )
    .await
    .expect_err("etcd refuses a user without the permission");
    // The reader fills the copy and is then answered from it.
    let filled = read_as(&mut through, &reader, prefix(true)).await.unwrap();
    let again = wait_for("an answer from the copy", DELIVERY_GUARD, || {
        let (mut through, reader, proxy) = (through.clone(), reader.clone(), &proxy);
        async move {
            let answer = read_as(&mut through, &reader, prefix(true)).await.unwrap();
            let (hits, _) = hits_and_misses(&proxy.metrics().await);
            if hits >= 1.0 {
                Ok(answer)
            } else {
                Err("no answer from the cache yet".to_string())
            }
        }
    })
    .await;
    assert_eq!(again.kvs, filled.kvs);
    let (hits, _) = hits_and_misses(&proxy.metrics().await);
    // The other user gets etcd's refusal, never the copy, serializable or linearizable, however often it asks.
    for serializable in [true, false, true] {
        let answer = read_as(&mut through, &other, prefix(serializable)).await;
        let status = answer.expect_err("the other user must not read the copy");
        assert_eq!(
            (status.code(), status.message()),
            (refused.code(), refused.message())
        );
    }
    // Without a token at all: etcd's refusal too.
    let anonymous = through.range(prefix(true)).await.expect_err("no token");
    assert_eq!(
        anonymous.code(),
        tonic::Code::InvalidArgument,
        "{anonymous:?}"
    );
    let (hits_after, _) = hits_and_misses(&proxy.metrics().await);
    assert_eq!(hits_after, hits, "nothing more was answered from the copy");

    // A permission revoked directly on etcd takes effect at once.
    cluster
        .etcdctl(0)
        .ok(&[
            "--user=root:rootpw",
            "role",
            "revoke-permission",
            "reads",
            "s/",
            "s0",
        ])
        .await;
    let revoked = read_as(&mut through, &reader, prefix(true)).await;
    assert!(revoked.is_err(), "served after revocation: {revoked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_requires_a_leader_is_answered_by_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let Stack {
        _cluster,
        proxy,
        mut direct,
        mut through,
    } = Stack::start(&binaries).await;
    put(&mut direct, "k", "v").await;
    // Filled, and answered from the copy once its watcher runs.
    read(&mut through, serializable("k", b"")).await;
    wait_for("an answer from the copy", DELIVERY_GUARD, || {
        let (mut through, proxy) = (through.clone(), &proxy);
        async move {
            read(&mut through, serializable("k", b"")).await;
            match hits_and_misses(&proxy.metrics().await) {
                (hits, _) if hits >= 1.0 => Ok(()),
                other => Err(format!("hits and misses: {other:?}")),
            }
        }
    })
    .await;
    let before = hits_and_misses(&proxy.metrics().await);
    // Only etcd can answer "no leader" when there is none: such a read never comes from a copy.
    for _ in 0..3 {
        let request = support::grpc::with_meta(serializable("k", b""), "hasleader", "true");
        let answer = through.range(request).await.expect("range").into_inner();
        assert_eq!(answer.kvs[0].value, b"v"[..]);
    }
    assert_eq!(hits_and_misses(&proxy.metrics().await), before);
}

fn cache_gauges(text: &str) -> (f64, f64) {
    let get = |name| metrics::value(text, name, &[]).unwrap_or(0.0);
    (
        get("etcd_grpc_proxy_cache_keys_total"),
        get("etcd_grpc_proxy_cache_retired_total"),
    )
}

/// One write through the proxy to "elsewhere", then a serializable read of "k" through it, which must see the
/// write's revision; then reads of "elsewhere" until its copy answers one (it does once the write's event came).
/// Returns how many of the reads of "k" the cache answered (0 or 1).
async fn read_k_after_write_elsewhere(
    through: &KvClient<Channel>,
    proxy: &testkit::ProxyProcess,
) -> f64 {
    let written = put(&mut through.clone(), "elsewhere", "x").await;
    let (hits_before, _) = hits_and_misses(&proxy.metrics().await);
    let answer = read(&mut through.clone(), serializable("k", b"")).await;
    let (hits, _) = hits_and_misses(&proxy.metrics().await);
    assert_eq!(answer.kvs[0].value, b"v"[..]);
    assert!(revision(&answer) >= written, "{answer:?}");
    let answer = first_answer_from_the_copy(through, proxy, serializable("elsewhere", b"")).await;
    assert!(revision(&answer) >= written, "{answer:?}");
    hits - hits_before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_cannot_answer_is_retired_and_its_range_filled_again_after_resting() {
    use proxy::cache::store::{MISSES_TO_RETIRE, UNANSWERED_FOR};
    let Some(binaries) = support::etcd() else {
        return;
    };
    let Stack {
        _cluster,
        proxy,
        mut direct,
        through,
    } = Stack::start(&binaries).await;
    put(&mut direct, "k", "v").await;
    put(&mut direct, "elsewhere", "x").await;
    for key in ["k", "elsewhere"] {
        read(&mut through.clone(), serializable(key, b"")).await;
        first_answer_from_the_copy(&through, &proxy, serializable(key, b"")).await;
    }
    assert_eq!(cache_gauges(&proxy.metrics().await), (2.0, 0.0));

    // Each write through the proxy to "elsewhere" moves the revision a serializable read of "k" must reach. Only a
    // progress answer (etcd 3.5.8 on) can bring the copy of "k" there; before, it never answers again. The copy
    // of "elsewhere" answers once its event came, so the cache as a whole answers and stays awake (see the next
    // test): the copy of "k" is judged on its own.
    let started = tokio::time::Instant::now();
    if progress_moves_copies(binaries.version) {
        let reads = 2 * MISSES_TO_RETIRE;
        let mut answered = 0.0;
        while started.elapsed() < 2 * UNANSWERED_FOR {
            answered += read_k_after_write_elsewhere(&through, &proxy).await;
        }
        for _ in 0..reads {
            answered += read_k_after_write_elsewhere(&through, &proxy).await;
        }
        assert!(
            answered >= f64::from(reads),
            "{answered} reads of k answered"
        );
        assert_eq!(
            cache_gauges(&proxy.metrics().await),
            (2.0, 0.0),
            "a copy that answers is kept"
        );
        assert_eq!(
            sleeps(&proxy.metrics().await),
            0.0,
            "a cache that answers stays awake"
        );
        return;
    }
    let mut reads = 0;
    wait_for("the copy retired", DELIVERY_GUARD, || {
        reads += 1;
        let (through, proxy) = (through.clone(), &proxy);
        async move {
            let answered = read_k_after_write_elsewhere(&through, proxy).await;
            assert_eq!(answered, 0.0, "an older etcd's copy cannot answer");
            match cache_gauges(&proxy.metrics().await) {
                (1.0, 1.0) => Ok(()),
                other => Err(format!("ranges held and retired: {other:?}")),
            }
        }
    })
    .await;
    assert!(
        reads >= MISSES_TO_RETIRE && started.elapsed() >= UNANSWERED_FOR,
        "retired after only {reads} misses in {:?}",
        started.elapsed()
    );
    assert_eq!(
        sleeps(&proxy.metrics().await),
        0.0,
        "a cache that answers stays awake"
    );
    // Its range rests, then a read fills it again.
    wait_for("the range filled again", DELIVERY_GUARD, || {
        let (through, proxy) = (through.clone(), &proxy);
        async move {
            read_k_after_write_elsewhere(&through, proxy).await;
            match cache_gauges(&proxy.metrics().await) {
                (2.0, 1.0) => Ok(()),
                other => Err(format!("ranges held and retired: {other:?}")),
            }
        }
    })
    .await;
}

fn sleeps(text: &str) -> f64 {
    metrics::value(text, "etcd_grpc_proxy_cache_sleeps_total", &[]).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_whose_copies_answer_nothing_sleeps_with_every_read_going_to_etcd_then_wakes() {
    use proxy::cache::rest::REST_MIN;
    use proxy::cache::sleep::{SLEEP_MAX, judged_over};
    use proxy::cache::store::MISSES_TO_RETIRE;
    use tokio::time::Instant;
    let Some(binaries) = support::etcd() else {
        return;
    };
    let Stack {
        _cluster,
        proxy,
        direct: _,
        mut through,
    } = Stack::start(&binaries).await;

    // A scan: each range read once fills a copy that never answers, on every etcd version.
    const SCAN_STEP: u32 = 8;
    let started = Instant::now();
    let mut scanned = 0;
    let mut seen_asleep = false;
    for slept in 1..=4 {
        // The sleep begins during one of these reads, so no earlier than the start of the last one.
        let mut last_read_started = Instant::now();
        wait_for("the cache asleep", DELIVERY_GUARD, || {
            // Reads come faster than MISSES_TO_RETIRE in twice the judged period, even between polls.
            let keys: Vec<String> = (0..SCAN_STEP)
                .map(|n| format!("scan/{}", scanned + n))
                .collect();
            scanned += SCAN_STEP;
            last_read_started = Instant::now();
            let (mut through, proxy) = (through.clone(), &proxy);
            async move {
                for key in keys {
                    read(&mut through, serializable(&key, b"")).await;
                }
                match sleeps(&proxy.metrics().await) {
                    n if n >= f64::from(slept) => Ok(()),
                    n => Err(format!("{n} sleeps")),
                }
            }
        })
        .await;
        if slept == 1 {
            assert!(
                // The shorter period at least (before etcd 3.5.8, once the version is known).
                scanned >= MISSES_TO_RETIRE && started.elapsed() >= judged_over(false),
                "asleep after only {scanned} reads in {:?}",
                started.elapsed()
            );
        }
        let text = proxy.metrics().await;
        let (hits, misses) = hits_and_misses(&text);
        assert_eq!(cache_gauges(&text).0, 0.0, "its copies dropped");
        // Asleep, reads go to etcd past the cache: counted neither as hits nor as misses, filling nothing.
        for key in ["scan/1", "asleep"] {
            let answer = read(&mut through, serializable(key, b"")).await;
            assert!(answer.kvs.is_empty() && revision(&answer) > 0, "{answer:?}");
        }
        let text = proxy.metrics().await;
        // The sleeps of a cache that never answers last REST_MIN, doubling up to SLEEP_MAX: these reads surely
        // came within this one only if they ended before it could have ended. Each next sleep is longer, so that
        // a slow machine is told too.
        let length = (REST_MIN * 2u32.pow(slept - 1)).min(SLEEP_MAX);
        if last_read_started.elapsed() < length {
            assert_eq!(
                hits_and_misses(&text),
                (hits, misses),
                "reads looked up while asleep"
            );
            assert_eq!(cache_gauges(&text).0, 0.0, "a copy filled while asleep");
            seen_asleep = true;
            break;
        }
    }
    assert!(
        seen_asleep,
        "reads asleep were never made within a sleep (the machine too slow to tell)"
    );
    // Then it wakes: a read fills a copy again, which answers.
    wait_for("the cache awake", DELIVERY_GUARD, || {
        let (mut through, proxy) = (through.clone(), &proxy);
        async move {
            read(&mut through, serializable("awake", b"")).await;
            match cache_gauges(&proxy.metrics().await).0 {
                0.0 => Err("no copy yet".to_string()),
                _ => Ok(()),
            }
        }
    })
    .await;
    first_answer_from_the_copy(&through, &proxy, serializable("awake", b"")).await;
}
