//! Progress requests through the proxy against real etcd, where etcd's own rules for answering them (from 3.5.8:
//! only when every watcher of the stream is synced) meet the proxy's sharing of one upstream stream between
//! clients: what one client's watcher does to that stream must not leave another client's request unanswered.
//! They matter from etcd 3.5.8 (and 3.5.30 adds a rule), so CI runs them on 3.4.23, 3.5.30 and 3.6.16 as well as on
//! the default, 3.7.3.

mod support;

use proto::etcdserverpb::CompactionRequest;
use proto::etcdserverpb::kv_client::KvClient;
use support::grpc::{channel, put};
use support::watch::{WatchStream, create, create_from, progress};

/// Three progress requests on `stream`, each answered as etcd answers one, at the store's `revision`.
async fn assert_progress_answered(stream: &mut WatchStream, revision: i64) {
    for round in 0..3 {
        stream.send(progress()).await;
        let answer = stream.expect(&format!("progress answer {round}")).await;
        assert_eq!(answer.watch_id, -1, "a progress answer: {answer:?}");
        assert!(answer.events.is_empty() && !answer.canceled, "{answer:?}");
        assert_eq!(answer.header.unwrap().revision, revision, "{answer:?}");
    }
}

/// etcd keeps a watcher it cancelled for compaction (created from a compacted revision, cancelled before it
/// synced) among its stream's watchers until the client cancels it, and from 3.5.8 answers no progress request on
/// that stream meanwhile. On etcd that only silences the client who made it; through the proxy the upstream stream
/// is shared, so the proxy cancels it upstream itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_etcd_cancelled_for_compaction_leaves_progress_answered_for_other_clients() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let direct = channel(&etcd.endpoint(0)).await;
    let first = put(&direct, "old", "1").await;
    put(&direct, "old", "2").await;
    let compacted = put(&direct, "old", "3").await;
    KvClient::new(direct.clone())
        .compact(CompactionRequest {
            revision: compacted,
            physical: true,
        })
        .await
        .unwrap();

    // A client watches a live key: the proxy opens its upstream stream for it.
    let mut live = WatchStream::open(channel(&proxy.addr()).await, create("live", 0)).await;
    let created = live.expect("the live watcher's create").await;
    assert!(created.created && !created.canceled, "{created:?}");

    // Another watches from before the compaction: etcd creates the watcher on that stream, then cancels it.
    let mut stale =
        WatchStream::open(channel(&proxy.addr()).await, create_from("old", 0, first)).await;
    let created = stale.expect("the stale watcher's create").await;
    assert!(created.created && !created.canceled, "{created:?}");
    let cancelled = stale.expect("the compaction cancel").await;
    assert!(cancelled.canceled, "{cancelled:?}");
    assert_eq!(cancelled.compact_revision, compacted, "{cancelled:?}");

    // The first client asks for progress.
    assert_progress_answered(&mut live, compacted).await;
}

/// etcd 3.5.30 answers no progress request on a stream while one of its watchers starts at a revision the store has
/// not reached. A client that reads and then watches from the revision after the read (as etcd's own clients do)
/// silences only its own stream on etcd; through the proxy, whose upstream stream it shares with others, it must not
/// silence theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_from_the_next_revision_leaves_progress_answered_for_other_clients() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let direct = channel(&etcd.endpoint(0)).await;
    let mut live = WatchStream::open(channel(&proxy.addr()).await, create("live", 0)).await;
    let created = live.expect("the live watcher's create").await;
    assert!(created.created && !created.canceled, "{created:?}");
    let now = put(&direct, "other", "1").await;

    // Another client watches from the next revision, which the store has not reached.
    let mut next = WatchStream::open(
        channel(&proxy.addr()).await,
        create_from("later", 0, now + 1),
    )
    .await;
    let created = next.expect("the next-revision watcher's create").await;
    assert!(created.created && !created.canceled, "{created:?}");

    assert_progress_answered(&mut live, now).await;
    // The watcher from the next revision sees that revision and nothing before it.
    put(&direct, "later", "2").await;
    let event = next.expect("the event at the next revision").await;
    let revisions: Vec<i64> = event
        .events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().mod_revision)
        .collect();
    assert_eq!(revisions, vec![now + 1], "{event:?}");
}
