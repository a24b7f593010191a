//! Watch coalescing against real etcd: many client watchers on one key become one watcher on etcd, every watcher
//! gets every event, and the etcd semantics the Go proxy lacks (half-close, progress requests, client-chosen IDs)
//! behave as on etcd itself.

mod support;

use proto::etcdserverpb::WatchResponse;
use support::grpc::{channel, put};
use support::watch::{DEADLINE, WatchStream, create, progress};

/// etcd's gauge of its watchers (from its /metrics).
async fn etcd_watchers(etcd: &str) -> i64 {
    let (_, body) = testkit::http::get(etcd, "/metrics")
        .await
        .expect("etcd /metrics");
    body.lines()
        .find(|l| l.starts_with("etcd_debugging_mvcc_watcher_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .expect("etcd_debugging_mvcc_watcher_total") as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_watchers_on_one_key_are_one_watcher_on_etcd_and_all_get_every_event() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    const STREAMS: usize = 10;
    const PER_STREAM: usize = 100;
    const PUTS: usize = 5;
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let direct = channel(&etcd.endpoint(0)).await;
    let before = etcd_watchers(&etcd.endpoint(0)).await;

    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let stream = WatchStream::open(channel(&proxy.addr()).await, create("hot", 0)).await;
        for _ in 1..PER_STREAM {
            stream.send(create("hot", 0)).await;
        }
        streams.push(stream);
    }
    for stream in &mut streams {
        let mut ids = Vec::new();
        for _ in 0..PER_STREAM {
            let created = stream.next().await;
            assert!(created.created && !created.canceled, "{created:?}");
            assert_ne!(created.header.unwrap().cluster_id, 0, "a real header");
            ids.push(created.watch_id);
        }
        assert_eq!(
            ids,
            (0..PER_STREAM as i64).collect::<Vec<_>>(),
            "etcd's ID order"
        );
    }
    testkit::wait_for(
        "etcd to hold only the proxy's watchers",
        DEADLINE,
        || async {
            let now = etcd_watchers(&etcd.endpoint(0)).await;
            if now - before <= 1 {
                Ok(())
            } else {
                Err(format!("{} watchers on etcd", now - before))
            }
        },
    )
    .await;

    let mut revisions = Vec::new();
    for i in 0..PUTS {
        revisions.push(put(&direct, "hot", &format!("v{i}")).await);
    }
    for stream in &mut streams {
        let mut seen = vec![Vec::new(); PER_STREAM];
        while seen.iter().any(|s| s.len() < PUTS) {
            let response = stream.next().await;
            for event in &response.events {
                seen[response.watch_id as usize].push(event.kv.as_ref().unwrap().mod_revision);
            }
        }
        assert!(
            seen.iter().all(|s| *s == revisions),
            "every watcher saw exactly {revisions:?}: {seen:?}"
        );
    }
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("etcd_grpc_proxy_watch_client_watchers 1000"),
        "{metrics}"
    );
    assert!(
        metrics.contains("etcd_grpc_proxy_watch_upstream_watchers 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_keeps_watching_and_progress_and_duplicate_ids_answer_as_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let writer = channel(&etcd.endpoint(0)).await;
    let mut transcripts = Vec::new();
    for target in [etcd.endpoint(0), proxy.addr()] {
        let mut stream = WatchStream::open(channel(&target).await, create("k", 7)).await;
        let mut transcript = Vec::new();
        let mut note = |r: &WatchResponse| {
            let events: Vec<String> = r
                .events
                .iter()
                .map(|e| String::from_utf8_lossy(&e.kv.as_ref().unwrap().value).into_owned())
                .collect();
            transcript.push(format!(
                "id={} created={} canceled={} reason={:?} events={events:?}",
                r.watch_id, r.created, r.canceled, r.cancel_reason
            ));
        };
        note(&stream.next().await);
        stream.send(create("k", 7)).await;
        note(&stream.next().await);
        stream.send(progress()).await;
        let progress = stream.next().await;
        assert!(progress.header.unwrap().revision > 0);
        note(&progress);
        // Half-close: the watcher keeps running.
        stream.requests = None;
        put(
            &writer,
            "k",
            &format!("after-half-close-{}", transcripts.len()),
        )
        .await;
        note(&stream.next().await);
        transcripts.push(transcript);
    }
    let normalised: Vec<String> = transcripts[1]
        .iter()
        .map(|l| l.replace("after-half-close-1", "after-half-close-0"))
        .collect();
    assert_eq!(
        transcripts[0], normalised,
        "direct etcd (left) and the proxy (right) differ"
    );
}
