//! The hub's join, merge, cancel, resume and slow-consumer rules, driven without I/O.

use super::*;
use proto::etcdserverpb::watch_create_request::FilterType;
use proto::mvccpb::{Event, KeyValue, event::EventType};

const CLUSTER: u64 = 77;

struct Client {
    id: StreamId,
    responses: mpsc::Receiver<WatchResponse>,
    abort: mpsc::Receiver<Status>,
    finish: mpsc::Receiver<Status>,
}

impl Client {
    fn open(hub: &mut Hub, id: StreamId, buffer: usize) -> Self {
        let (responses, responses_rx) = mpsc::channel(buffer);
        let (abort, abort_rx) = mpsc::channel(1);
        let (finish, finish_rx) = mpsc::channel(1);
        hub.open_stream(
            id,
            StreamSink {
                responses,
                abort,
                finish,
                requires_leader: false,
            },
        );
        Self {
            id,
            responses: responses_rx,
            abort: abort_rx,
            finish: finish_rx,
        }
    }

    fn received(&mut self) -> Vec<WatchResponse> {
        std::iter::from_fn(|| self.responses.try_recv().ok()).collect()
    }
}

fn hub() -> Hub {
    Hub::new(
        HubConfig {
            max_join_lag: 0,
            fragment_limit: 1 << 20,
            own_identity: false,
            hidden_prefix: 0,
        },
        Metrics::new(prometheus::Registry::new()).unwrap(),
    )
}

fn watch(key: &str, start_revision: i64) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.into(),
        start_revision,
        ..Default::default()
    }
}

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        cluster_id: CLUSTER,
        member_id: 1,
        revision,
        raft_term: 2,
    })
}

fn created(sw: i64, revision: i64) -> WatchResponse {
    WatchResponse {
        header: header(revision),
        watch_id: sw,
        created: true,
        ..Default::default()
    }
}

fn put(sw: i64, key: &str, revision: i64) -> WatchResponse {
    let kv = KeyValue {
        key: key.as_bytes().to_vec().into(),
        mod_revision: revision,
        ..Default::default()
    };
    let event = Event {
        r#type: EventType::Put as i32,
        kv: Some(kv),
        prev_kv: None,
    };
    WatchResponse {
        header: header(revision),
        watch_id: sw,
        events: vec![event],
        ..Default::default()
    }
}

/// The upstream requests queued since the last call, as short labels.
fn sent(hub: &mut Hub) -> Vec<String> {
    hub.flush_creates();
    hub.outbox
        .drain(..)
        .map(|r| match r.request_union.unwrap() {
            RequestUnion::CreateRequest(c) => {
                format!("create {} from {}", c.watch_id, c.start_revision)
            }
            RequestUnion::CancelRequest(c) => format!("cancel {}", c.watch_id),
            RequestUnion::ProgressRequest(_) => "progress".into(),
        })
        .collect()
}

/// (watch_id, created, canceled, event revisions) of each response.
fn summary(responses: &[WatchResponse]) -> Vec<(i64, bool, bool, Vec<i64>)> {
    responses
        .iter()
        .map(|r| {
            let revisions = r
                .events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision)
                .collect();
            (r.watch_id, r.created, r.canceled, revisions)
        })
        .collect()
}

#[test]
fn watchers_from_now_share_a_create_that_was_not_sent_yet() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    let mut b = Client::open(&mut hub, 2, 8);
    hub.create(a.id, watch("k", 0));
    hub.create(b.id, watch("k", 0));
    assert_eq!(sent(&mut hub), vec!["create 1 from 0"]);
    hub.upstream_response(created(1, 10));
    let (ra, rb) = (a.received(), b.received());
    assert_eq!(summary(&ra), vec![(0, true, false, vec![])]);
    assert_eq!(summary(&rb), vec![(0, true, false, vec![])]);
    assert_eq!(
        ra[0].header,
        header(10),
        "etcd's real Created header, not an emulated one"
    );
    hub.upstream_response(put(1, "k", 11));
    assert_eq!(summary(&a.received()), vec![(0, false, false, vec![11])]);
    assert_eq!(summary(&b.received()), vec![(0, false, false, vec![11])]);
}

#[test]
fn a_watcher_from_now_gets_its_own_create_and_is_merged_into_the_older_one() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    let mut b = Client::open(&mut hub, 2, 8);
    hub.create(a.id, watch("k", 0));
    assert_eq!(sent(&mut hub), vec!["create 1 from 0"]);
    hub.upstream_response(created(1, 10));
    hub.create(b.id, watch("k", 0));
    assert_eq!(
        sent(&mut hub),
        vec!["create 2 from 0"],
        "no join of a running watcher at lag 0"
    );
    hub.upstream_response(created(2, 12));
    assert_eq!(b.received()[0].header, header(12));
    assert_eq!(
        sent(&mut hub),
        vec!["cancel 2"],
        "merged into the watcher behind it"
    );
    a.received();
    // The older s-watcher still delivers revision 12, which b must not see (it started after 12).
    hub.upstream_response(put(1, "k", 12));
    hub.upstream_response(put(1, "k", 13));
    assert_eq!(
        summary(&a.received()),
        vec![(0, false, false, vec![12]), (0, false, false, vec![13])]
    );
    assert_eq!(summary(&b.received()), vec![(0, false, false, vec![13])]);
}

#[test]
fn a_start_revision_joins_a_running_watcher_only_if_it_is_not_past_it() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    hub.create(a.id, watch("k", 11));
    assert_eq!(
        sent(&mut hub),
        Vec::<String>::new(),
        "joined: next revision 11 is not past 11"
    );
    let joined = a.received();
    assert_eq!(summary(&joined)[1], (1, true, false, vec![]));
    assert_eq!(
        joined[1].header.unwrap().cluster_id,
        CLUSTER,
        "a real header, not zeros"
    );
    hub.create(a.id, watch("k", 5));
    assert_eq!(
        sent(&mut hub),
        vec!["create 2 from 5"],
        "revision 5 was already passed"
    );
}

#[test]
fn compaction_reaches_every_receiver_and_the_dead_watcher_is_never_reused() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 3));
    hub.create(a.id, watch("k", 3));
    assert_eq!(sent(&mut hub), vec!["create 1 from 3"]);
    hub.upstream_response(created(1, 20));
    hub.upstream_response(WatchResponse {
        header: header(20),
        watch_id: 1,
        canceled: true,
        compact_revision: 9,
        cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
        ..Default::default()
    });
    let responses = a.received();
    assert_eq!(
        summary(&responses),
        vec![
            (0, true, false, vec![]),
            (1, true, false, vec![]),
            (0, false, true, vec![]),
            (1, false, true, vec![])
        ]
    );
    assert!(
        responses[2..]
            .iter()
            .all(|r| r.compact_revision == 9 && r.cancel_reason.contains("compacted"))
    );
    assert_eq!(
        sent(&mut hub),
        vec!["cancel 1"],
        "etcd keeps a watcher it cancelled for compaction on the stream until it is cancelled"
    );
    hub.create(a.id, watch("k", 12));
    assert_eq!(sent(&mut hub), vec!["create 2 from 12"]);
}

#[test]
fn no_watcher_is_merged_into_one_etcd_may_still_cancel_for_compaction() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    let mut b = Client::open(&mut hub, 2, 8);
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    // b asks for an old revision: its s-watcher is behind a's, and etcd may yet cancel it for compaction.
    hub.create(b.id, watch("k", 3));
    assert_eq!(sent(&mut hub), vec!["create 2 from 3"]);
    hub.upstream_response(created(2, 10));
    assert_eq!(
        sent(&mut hub),
        Vec::<String>::new(),
        "a is not moved onto it"
    );
    hub.upstream_response(WatchResponse {
        header: header(10),
        watch_id: 2,
        canceled: true,
        compact_revision: 5,
        cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
        ..Default::default()
    });
    assert_eq!(
        summary(&b.received()),
        vec![(0, true, false, vec![]), (0, false, true, vec![])]
    );
    assert_eq!(sent(&mut hub), vec!["cancel 2"]);
    hub.upstream_response(put(1, "k", 11));
    assert_eq!(
        summary(&a.received()),
        vec![(0, true, false, vec![]), (0, false, false, vec![11])],
        "a, which etcd would have kept, is still watching"
    );
}

#[test]
fn a_catching_up_watcher_is_merged_once_it_stands_where_the_other_does() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    let mut b = Client::open(&mut hub, 2, 8);
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    hub.create(b.id, watch("k", 3));
    sent(&mut hub);
    hub.upstream_response(created(2, 10));
    hub.upstream_response(put(2, "k", 7));
    assert_eq!(
        sent(&mut hub),
        Vec::<String>::new(),
        "still behind and unsynced"
    );
    hub.upstream_response(put(1, "k", 11));
    hub.upstream_response(put(2, "k", 11));
    assert_eq!(sent(&mut hub), vec!["cancel 2"], "both at 12: merged");
    hub.upstream_response(put(1, "k", 12));
    assert_eq!(summary(&a.received()).last().unwrap().3, vec![12]);
    assert_eq!(
        summary(&b.received()),
        vec![
            (0, true, false, vec![]),
            (0, false, false, vec![7]),
            (0, false, false, vec![11]),
            (0, false, false, vec![12])
        ]
    );
}

#[test]
fn cancelling_the_last_receiver_cancels_upstream_and_unknown_ids_are_ignored() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 4));
    a.received();
    hub.cancel(a.id, 0);
    assert_eq!(
        sent(&mut hub),
        Vec::<String>::new(),
        "another receiver remains"
    );
    hub.cancel(a.id, 1);
    assert_eq!(sent(&mut hub), vec!["cancel 1"]);
    hub.cancel(a.id, 42);
    assert_eq!(
        summary(&a.received()),
        vec![(0, false, true, vec![]), (1, false, true, vec![])]
    );
}

#[test]
fn client_chosen_watch_ids_are_kept_and_duplicates_refused_as_etcd_does() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(
        a.id,
        WatchCreateRequest {
            watch_id: 1,
            ..watch("k", 0)
        },
    );
    hub.create(a.id, watch("k", 0));
    hub.create(a.id, watch("k", 0));
    hub.create(
        a.id,
        WatchCreateRequest {
            watch_id: 1,
            ..watch("j", 0)
        },
    );
    sent(&mut hub);
    assert!(
        a.received().is_empty(),
        "the refusal waits for the answers to the earlier creates"
    );
    hub.upstream_response(created(1, 4));
    let answers = a.received();
    let ids: Vec<i64> = answers.iter().map(|r| r.watch_id).collect();
    assert_eq!(
        ids,
        vec![1, 0, 2, -1],
        "automatic IDs skip the one the client chose; answers keep request order"
    );
    assert_eq!(answers[3].cancel_reason, DUPLICATE_WATCH_ID);
    assert!(answers[3].created && answers[3].canceled);
}

#[test]
fn after_the_upstream_stream_is_lost_watchers_resume_without_gap_or_duplicate() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    hub.upstream_response(put(1, "k", 11));
    a.received();
    hub.upstream_lost();
    assert_eq!(sent(&mut hub), vec!["create 1 from 12"]);
    hub.upstream_response(created(1, 15));
    hub.upstream_response(put(1, "k", 12));
    assert_eq!(
        summary(&a.received()),
        vec![(0, false, false, vec![12])],
        "no second Created"
    );
}

#[test]
fn a_slow_consumer_loses_only_its_own_stream() {
    let mut hub = hub();
    let mut slow = Client::open(&mut hub, 1, 1);
    let mut fast = Client::open(&mut hub, 2, 8);
    hub.create(slow.id, watch("k", 0));
    hub.create(fast.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 1));
    hub.upstream_response(put(1, "k", 2));
    let status = slow.finish.try_recv().expect("the slow stream is ended");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("--watch-buffer-size"));
    assert_eq!(
        summary(&fast.received()),
        vec![(0, true, false, vec![]), (0, false, false, vec![2])]
    );
    hub.upstream_response(put(1, "k", 3));
    assert_eq!(summary(&fast.received()), vec![(0, false, false, vec![3])]);
}

#[test]
fn a_stream_ended_for_a_full_buffer_still_gets_what_the_buffer_held_then_the_status() {
    // A proxy in front of this one re-creates its watchers after a failover from the revisions it had reached: the
    // catch-up can fill the buffer before the client had a turn to read. Aborted at once, the stream lost the answers
    // queued for it, so the client re-created from the same revisions into the same overflow on every re-open
    // (fleet seed 16408). The answers queued go out first: the client gets further each time.
    let mut hub = hub();
    let mut client = Client::open(&mut hub, 1, 2);
    hub.create(client.id, watch("k", 5));
    sent(&mut hub);
    hub.upstream_response(created(1, 9));
    hub.upstream_response(put(1, "k", 5));
    hub.upstream_response(put(1, "k", 6));
    assert!(
        client.abort.try_recv().is_err(),
        "a full buffer does not end the stream at once, ahead of the answers it holds"
    );
    let why = client
        .finish
        .try_recv()
        .expect("the stream ends after what it holds");
    assert_eq!(why.code(), tonic::Code::ResourceExhausted);
    assert!(why.message().contains("--watch-buffer-size"), "{why:?}");
    assert_eq!(
        summary(&client.received()),
        vec![(0, true, false, vec![]), (0, false, false, vec![5])],
        "the Created answer and the first event, which fit in the buffer, reach the client"
    );
    assert_eq!(
        client.responses.try_recv().unwrap_err(),
        mpsc::error::TryRecvError::Disconnected,
        "nothing is queued after the end: the stream is gone from the hub"
    );
    hub.upstream_response(put(1, "k", 7));
    assert!(client.responses.try_recv().is_err());
}

#[test]
fn created_answers_leave_in_the_order_of_the_creates() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    a.received();
    // A create waiting for etcd, then one that could be answered at once: the answers keep that order.
    hub.create(a.id, watch("j", 0));
    hub.create(a.id, watch("k", 11));
    assert_eq!(sent(&mut hub), vec!["create 2 from 0"]);
    assert!(
        a.received().is_empty(),
        "the second answer waits for the first"
    );
    hub.upstream_response(put(1, "k", 11));
    assert_eq!(
        summary(&a.received()),
        vec![(0, false, false, vec![11])],
        "the announced watcher gets it; the one not yet announced waits"
    );
    hub.upstream_response(created(2, 11));
    assert_eq!(
        summary(&a.received()),
        vec![
            (1, true, false, vec![]),
            (2, true, false, vec![]),
            (2, false, false, vec![11])
        ]
    );
}

#[test]
fn a_create_etcd_refuses_is_answered_with_its_reason_and_later_creates_still_match() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("secret", 0));
    hub.create(a.id, watch("open", 0));
    assert_eq!(sent(&mut hub), vec!["create 1 from 0", "create 2 from 0"]);
    // etcd refuses the first (say, permission denied) with watch ID -1, then creates the second.
    hub.upstream_response(WatchResponse {
        header: header(5),
        watch_id: -1,
        created: true,
        canceled: true,
        cancel_reason: "etcdserver: permission denied".into(),
        ..Default::default()
    });
    hub.upstream_response(created(2, 5));
    let answers = a.received();
    assert_eq!(
        summary(&answers),
        vec![(-1, true, true, vec![]), (1, true, false, vec![])]
    );
    assert_eq!(answers[0].cancel_reason, "etcdserver: permission denied");
    assert_eq!(
        sent(&mut hub),
        Vec::<String>::new(),
        "nothing to cancel: etcd never created it"
    );
}

#[test]
fn progress_requests_are_answered_with_etcds_progress() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.request_progress(a.id);
    hub.request_progress(a.id);
    assert_eq!(sent(&mut hub), vec!["progress"]);
    hub.upstream_response(WatchResponse {
        header: header(30),
        watch_id: -1,
        ..Default::default()
    });
    let answers = a.received();
    assert_eq!(summary(&answers), vec![(-1, false, false, vec![])]);
    assert_eq!(answers[0].header, header(30));
}

#[test]
fn a_liveness_probe_is_sent_only_when_etcd_would_answer_it() {
    let mut hub = hub();
    hub.set_etcd_version(Some("3.5.30"));
    let mut a = Client::open(&mut hub, 1, 8);
    assert!(
        !hub.liveness_probe(),
        "no watcher: etcd from 3.5.8 answers nothing"
    );
    // The hub has heard of no revision yet, so a watcher from revision 15 is created from 15, a revision etcd (at
    // 10) has not reached: etcd 3.5.30 answers no progress request on the stream until it has.
    hub.create(a.id, watch("k", 15));
    hub.flush_creates();
    assert!(!hub.liveness_probe(), "the create is not answered yet");
    assert_eq!(sent(&mut hub), vec!["create 1 from 15"]);
    hub.upstream_response(created(1, 10));
    assert_eq!(a.received().len(), 1, "created");
    // Now that the hub knows revision 10, the watcher is created again from there before anything is asked.
    assert!(!hub.liveness_probe(), "a watcher starts in the future");
    assert_eq!(sent(&mut hub), vec!["cancel 1", "create 2 from 10"]);
    assert!(!hub.liveness_probe(), "its create is not answered yet");
    hub.upstream_response(created(2, 10));
    assert!(
        a.received().is_empty(),
        "the client's watcher was created already"
    );
    assert!(hub.liveness_probe(), "no watcher starts in the future");
    assert_eq!(sent(&mut hub), vec!["progress"]);
    hub.upstream_response(put(2, "k", 11));
    hub.upstream_response(put(2, "k", 15));
    assert_eq!(
        summary(&a.received()),
        vec![(0, false, false, vec![15])],
        "only what it asked for"
    );
    // etcd dropped it (a watcher was not synced yet): it is sent again for the actor, which waits for it.
    assert!(!hub.resend_progress(false), "nobody waits");
    assert!(hub.liveness_probe());
    sent(&mut hub);
    assert!(hub.resend_progress(true), "the actor waits");
    assert_eq!(sent(&mut hub), vec!["progress"]);
    // Before 3.5.8 etcd answers every progress request, watchers or not.
    let mut old = self::hub();
    old.set_etcd_version(Some("3.4.23"));
    Client::open(&mut old, 2, 8);
    assert!(old.liveness_probe());
    assert_eq!(sent(&mut old), vec!["progress"]);
}

#[test]
fn a_watcher_from_a_future_revision_is_created_from_the_known_one() {
    let mut hub = hub();
    hub.set_etcd_version(Some("3.5.30"));
    let a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    // b asks for revision 12; the newest the hub knows is 10. etcd 3.5.30 would answer no progress request on the
    // stream while a watcher waits for 12, so it is created from 10.
    let mut b = Client::open(&mut hub, 2, 8);
    hub.create(b.id, watch("j", 12));
    hub.flush_creates();
    assert_eq!(sent(&mut hub), vec!["create 2 from 10"]);
    hub.upstream_response(created(2, 11));
    assert!(hub.liveness_probe(), "no watcher starts in the future");
    assert_eq!(sent(&mut hub), vec!["progress"]);
    hub.upstream_response(put(2, "j", 11));
    hub.upstream_response(put(2, "j", 12));
    assert_eq!(
        summary(&b.received()),
        vec![(0, true, false, vec![]), (0, false, false, vec![12])],
        "revision 11 is before what b asked for"
    );
    // A compaction at 12 (from 10 etcd would cancel the watcher) takes nothing b needs: b carries on from 13.
    hub.create(b.id, watch("i", 20));
    hub.flush_creates();
    assert_eq!(sent(&mut hub), vec!["create 3 from 12"]);
    hub.upstream_response(created(3, 12));
    hub.upstream_response(WatchResponse {
        header: header(12),
        watch_id: 3,
        canceled: true,
        compact_revision: 12,
        cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
        ..Default::default()
    });
    assert_eq!(
        summary(&b.received()),
        vec![(1, true, false, vec![])],
        "no cancel for the watcher of i"
    );
    assert_eq!(sent(&mut hub), vec!["cancel 3", "create 4 from 12"]);
}

#[test]
fn a_progress_request_etcd_dropped_is_sent_again_and_the_client_answered() {
    let mut hub = hub();
    hub.set_etcd_version(Some("3.5.30"));
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    hub.flush_creates();
    assert_eq!(sent(&mut hub).len(), 1, "the create");
    hub.upstream_response(created(1, 10));
    assert_eq!(a.received().len(), 1, "created");
    hub.request_progress(a.id);
    assert_eq!(sent(&mut hub), vec!["progress"]);
    // etcd found the watcher not synced yet and dropped it: nothing comes back, and a second request from the
    // client waits on the first.
    hub.request_progress(a.id);
    assert!(sent(&mut hub).is_empty());
    assert!(hub.progress_in_flight());
    assert!(
        hub.resend_progress(false),
        "sent again for the waiting client"
    );
    assert_eq!(sent(&mut hub), vec!["progress"]);
    hub.upstream_response(WatchResponse {
        header: header(12),
        watch_id: -1,
        ..Default::default()
    });
    assert_eq!(summary(&a.received()), vec![(-1, false, false, vec![])]);
    assert!(!hub.resend_progress(false), "nothing in flight");
    // Before 3.5.8 etcd answers every request: nothing to send again.
    let mut old = self::hub();
    old.set_etcd_version(Some("3.4.23"));
    let b = Client::open(&mut old, 2, 8);
    old.request_progress(b.id);
    sent(&mut old);
    assert!(!old.resend_progress(false));
}

#[test]
fn a_progress_request_sent_while_a_watcher_may_be_unsynced_is_marked_for_an_early_resend() {
    let mut hub = hub();
    hub.set_etcd_version(Some("3.7.3"));
    let mut a = Client::open(&mut hub, 1, 8);
    // A watcher from now: etcd creates it synced.
    hub.create(a.id, watch("a", 0));
    hub.request_progress(a.id);
    assert_eq!(sent(&mut hub), vec!["create 1 from 0", "progress"]);
    assert!(
        !hub.progress_maybe_dropped(),
        "a watcher from now is synced on etcd"
    );
    hub.upstream_response(created(1, 10));
    hub.upstream_response(WatchResponse {
        header: header(10),
        watch_id: -1,
        ..Default::default()
    });
    assert_eq!(a.received().len(), 2, "created, then the progress answer");
    // A watcher from revision 10, which etcd has reached (as the range cache creates its copies' watchers): etcd
    // keeps it unsynced until its next resync and drops a progress request meanwhile.
    hub.create(a.id, watch("b", 10));
    hub.request_progress(a.id);
    assert_eq!(sent(&mut hub), vec!["create 2 from 10", "progress"]);
    assert!(
        hub.progress_maybe_dropped(),
        "the new watcher may be unsynced"
    );
    hub.upstream_response(created(2, 10));
    assert!(
        hub.progress_maybe_dropped(),
        "created is not synced: etcd says nothing when it syncs a watcher with nothing to send"
    );
    // Sent again after the resync: still marked until an answer shows every watcher synced.
    assert!(hub.resend_progress(false));
    assert_eq!(sent(&mut hub), vec!["progress"]);
    assert!(hub.progress_maybe_dropped());
    hub.upstream_response(WatchResponse {
        header: header(10),
        watch_id: -1,
        ..Default::default()
    });
    assert!(!hub.progress_maybe_dropped(), "answered: nothing in flight");
    let _ = a.received();
    hub.request_progress(a.id);
    assert_eq!(sent(&mut hub), vec!["progress"]);
    assert!(
        !hub.progress_maybe_dropped(),
        "every watcher was synced by the last answer"
    );
    // Before 3.5.8 etcd answers every request whatever its watchers: never marked.
    let mut old = self::hub();
    old.set_etcd_version(Some("3.4.23"));
    let b = Client::open(&mut old, 2, 8);
    old.create(b.id, watch("k", 5));
    old.request_progress(b.id);
    sent(&mut old);
    assert!(!old.progress_maybe_dropped());
}

#[test]
fn a_stream_closed_while_its_progress_request_waits_leaves_nothing_upstream() {
    let mut hub = hub();
    hub.set_etcd_version(Some("3.5.30"));
    let a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    hub.request_progress(a.id);
    // A watcher from revision 5, created while the hub knew no revision: etcd runs it ahead of its store, so the
    // next progress request restarts it from the newest known revision.
    hub.create(a.id, watch("j", 5));
    assert_eq!(
        sent(&mut hub),
        vec!["create 1 from 0", "progress", "create 2 from 5"]
    );
    hub.upstream_response(created(1, 1));
    hub.upstream_response(created(2, 1));
    // Closing takes upstream watcher 1, the only one the request in flight covers: the hub stops waiting for it.
    // No progress may be asked for the stream that went, and no restart may carry its watcher on.
    hub.close_stream(a.id);
    assert_eq!(sent(&mut hub), vec!["cancel 1", "cancel 2"]);
    assert!(!hub.needs_upstream(), "nothing left to watch for");
}

#[test]
fn a_stream_closed_while_another_waits_for_progress_leaves_nothing_upstream() {
    let mut hub = hub();
    hub.set_etcd_version(Some("3.5.30"));
    let a = Client::open(&mut hub, 1, 8);
    let b = Client::open(&mut hub, 2, 8);
    hub.create(b.id, watch("m", 0));
    hub.create(a.id, watch("k", 0));
    hub.request_progress(b.id);
    hub.create(a.id, watch("j", 5));
    assert_eq!(
        sent(&mut hub),
        vec![
            "create 1 from 0",
            "create 2 from 0",
            "progress",
            "create 3 from 5"
        ]
    );
    // b keeps waiting for progress without a watcher; a's watcher on "k" is what the request in flight covers.
    hub.cancel(b.id, 0);
    assert_eq!(sent(&mut hub), vec!["cancel 1"]);
    hub.upstream_response(created(1, 1));
    hub.upstream_response(created(2, 1));
    hub.upstream_response(created(3, 1));
    // Closing a ends the request's cover: a request asked again for b must not restart a's watcher ahead (upstream
    // watcher 3) under a new ID that a's remaining watchers are no longer traced to.
    hub.close_stream(a.id);
    assert_eq!(sent(&mut hub), vec!["cancel 2", "cancel 3"]);
    assert!(!hub.needs_upstream(), "nothing left to watch for");
}

#[test]
fn filters_and_progress_notify_apply_per_watcher() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    let mut b = Client::open(&mut hub, 2, 8);
    hub.create(
        a.id,
        WatchCreateRequest {
            filters: vec![FilterType::Noput as i32],
            ..watch("k", 0)
        },
    );
    hub.create(
        b.id,
        WatchCreateRequest {
            progress_notify: true,
            ..watch("k", 0)
        },
    );
    assert_eq!(
        sent(&mut hub),
        vec!["create 1 from 0"],
        "options do not prevent sharing"
    );
    hub.upstream_response(created(1, 1));
    hub.upstream_response(put(1, "k", 2));
    hub.upstream_response(WatchResponse {
        header: header(9),
        watch_id: 1,
        ..Default::default()
    });
    assert_eq!(summary(&a.received()), vec![(0, true, false, vec![])]);
    assert_eq!(
        summary(&b.received()),
        vec![
            (0, true, false, vec![]),
            (0, false, false, vec![2]),
            (0, false, false, vec![])
        ]
    );
}

#[test]
fn the_coalescing_gauge_counts_shared_watchers_and_never_goes_negative() {
    let metrics = Metrics::new(prometheus::Registry::new()).unwrap();
    let mut hub = Hub::new(
        HubConfig {
            max_join_lag: 0,
            fragment_limit: 1 << 20,
            own_identity: false,
            hidden_prefix: 0,
        },
        metrics.clone(),
    );
    let a = Client::open(&mut hub, 1, 8);
    for _ in 0..3 {
        hub.create(a.id, watch("k", 0));
    }
    hub.create(a.id, watch("other", 0));
    assert_eq!(metrics.watchers_coalescing.get(), 2);
    assert_eq!(metrics.watch_upstream_watchers.get(), 2);
    hub.close_stream(a.id);
    assert_eq!(metrics.watchers_coalescing.get(), 0);
    assert_eq!(metrics.watch_client_watchers.get(), 0);
    assert_eq!(
        sent(&mut hub),
        Vec::<String>::new(),
        "never-sent creates need no cancel"
    );
}

#[test]
fn create_progress_counts_answers_while_creates_wait_for_etcd() {
    let mut hub = hub();
    let _client = Client::open(&mut hub, 1, 16);
    assert_eq!(hub.create_progress(), None, "nothing sent");
    hub.create(1, watch("a", 0));
    hub.create(1, watch("b", 0));
    hub.flush_creates();
    assert_eq!(
        hub.create_progress(),
        Some(0),
        "two creates wait, none answered"
    );
    hub.upstream_response(created(1, 5));
    assert_eq!(hub.create_progress(), Some(1), "one answered, one waits");
    hub.upstream_response(created(2, 5));
    assert_eq!(hub.create_progress(), None, "all answered");
}

fn own_identity_hub() -> Hub {
    Hub::new(
        HubConfig {
            max_join_lag: 0,
            fragment_limit: 1 << 20,
            own_identity: true,
            hidden_prefix: 0,
        },
        Metrics::new(prometheus::Registry::new()).unwrap(),
    )
}

fn permission_refusal(sw: i64, revision: i64) -> WatchResponse {
    WatchResponse {
        header: header(revision),
        watch_id: sw,
        created: true,
        canceled: true,
        cancel_reason: "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
            .into(),
        ..Default::default()
    }
}

#[test]
fn a_refusal_before_the_hub_is_answered_in_its_turn_among_the_streams_creates() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    hub.refuse(a.id, "denied", -1);
    hub.create(a.id, watch("j", 0));
    assert!(
        a.received().is_empty(),
        "the refusal waits for the earlier create's answer"
    );
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    let got = a.received();
    assert_eq!(
        summary(&got),
        vec![(0, true, false, vec![]), (-1, true, true, vec![])]
    );
    assert_eq!(got[1].cancel_reason, "denied");
    hub.upstream_response(created(2, 10));
    assert_eq!(summary(&a.received()), vec![(1, true, false, vec![])]);
}

#[test]
fn with_the_proxys_identity_a_refused_create_is_retried_once_with_a_fresh_token() {
    let mut hub = own_identity_hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    hub.create(a.id, watch("j", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    hub.upstream_response(put(1, "k", 11));
    hub.upstream_response(permission_refusal(2, 11));
    assert!(hub.take_token_refused(), "the stream must be re-opened");
    assert!(!hub.take_token_refused(), "reported once");
    let before = a.received();
    assert_eq!(
        summary(&before),
        vec![(0, true, false, vec![]), (0, false, false, vec![11])],
        "nobody hears of the first refusal"
    );
    hub.upstream_lost();
    assert_eq!(
        sent(&mut hub),
        vec!["create 1 from 12", "create 2 from 0"],
        "the running watcher resumes after what it delivered"
    );
    hub.upstream_response(created(1, 12));
    hub.upstream_response(permission_refusal(2, 12));
    assert!(
        !hub.take_token_refused(),
        "refused again with a fresh token: the proxy's user may not read it"
    );
    let refused = a.received();
    assert_eq!(
        summary(&refused),
        vec![(0, true, true, vec![])],
        "etcd 3.5's refusal: the ID the client asked for"
    );
    assert!(refused[0].cancel_reason.contains("invalid auth token"));
}

#[test]
fn with_callers_tokens_a_refused_create_reaches_its_watchers_at_once_with_the_id_etcd_would_give() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 8);
    // etcd 3.4 answers a refused create with watch ID -1.
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(WatchResponse {
        watch_id: -1,
        ..permission_refusal(1, 10)
    });
    assert!(!hub.take_token_refused());
    assert_eq!(summary(&a.received()), vec![(-1, true, true, vec![])]);
    // etcd 3.5 answers with the ID the create asked for: the hub's s-watcher ID upstream, the client's own (0 when
    // it let the server choose) downstream.
    hub.create(a.id, watch("j", 0));
    hub.create(
        a.id,
        WatchCreateRequest {
            watch_id: 7,
            ..watch("l", 0)
        },
    );
    assert_eq!(sent(&mut hub), vec!["create 2 from 0", "create 3 from 0"]);
    hub.upstream_response(permission_refusal(2, 10));
    hub.upstream_response(permission_refusal(3, 10));
    assert_eq!(
        summary(&a.received()),
        vec![(0, true, true, vec![]), (7, true, true, vec![])]
    );
}

#[test]
fn ending_all_tells_running_and_waiting_watchers_why() {
    let mut hub = own_identity_hub();
    let mut a = Client::open(&mut hub, 1, 8);
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    hub.create(a.id, watch("j", 0));
    hub.upstream_lost();
    hub.end_all("credentials refused");
    let got = a.received();
    assert_eq!(
        summary(&got),
        vec![
            (0, true, false, vec![]),
            (0, false, true, vec![]),
            (-1, true, true, vec![])
        ]
    );
    assert!(
        got[1..]
            .iter()
            .all(|r| r.cancel_reason == "credentials refused")
    );
    assert!(!hub.needs_upstream());
}

#[test]
fn responses_held_behind_an_unanswered_create_are_bounded_by_the_stream_buffer() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 4);
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    a.received();
    // A create etcd does not answer, then a watcher that joins at once: its events wait behind the first answer.
    hub.create(a.id, watch("j", 0));
    hub.create(a.id, watch("k", 11));
    assert_eq!(sent(&mut hub), vec!["create 2 from 0"]);
    a.received();
    for revision in 11..14 {
        hub.upstream_response(put(1, "k", revision));
    }
    // The announced watcher took its 3 events; the waiting one holds its Created answer and 3 events: the limit.
    assert_eq!(a.received().len(), 3);
    assert!(
        a.finish.try_recv().is_err(),
        "at the limit the stream lives"
    );
    hub.upstream_response(put(1, "k", 14));
    let why = a.finish.try_recv().expect("past the limit the stream ends");
    assert_eq!(why.code(), tonic::Code::ResourceExhausted);
    assert!(why.message().contains("--watch-buffer-size"), "{why:?}");
}

#[test]
fn the_running_count_of_held_responses_is_the_true_count_after_every_step() {
    let mut hub = hub();
    let mut a = Client::open(&mut hub, 1, 4096);
    let mut b = Client::open(&mut hub, 2, 4096);
    let check = |hub: &Hub, step: &str| {
        assert_eq!(hub.miscounted_holds(), vec![], "after {step}");
    };
    // A running upstream watcher on "k".
    hub.create(a.id, watch("k", 0));
    sent(&mut hub);
    hub.upstream_response(created(1, 10));
    a.received();
    check(&hub, "the first watcher");
    // On each stream a create etcd has not answered, then many slots behind it: watchers joining "k" at once (their
    // answers and events wait), duplicate IDs refused at once, invalid ranges left for etcd to refuse.
    for client in [&a, &b] {
        hub.create(client.id, watch("j", 0));
        for i in 0..60 {
            hub.create(client.id, watch("k", 11));
            check(&hub, &format!("join {i}"));
            if i % 10 == 0 {
                let duplicate = WatchCreateRequest {
                    watch_id: 2,
                    ..watch("k", 11)
                };
                hub.create(client.id, duplicate);
                check(&hub, &format!("duplicate {i}"));
            }
            if i % 25 == 0 {
                hub.create(client.id, watch_range("z", "a"));
                check(&hub, &format!("invalid range {i}"));
            }
        }
    }
    let creates = sent(&mut hub);
    assert_eq!(
        creates.len(),
        1 + 2 * 3,
        "\"j\" (shared: not sent before both asked) and 3 invalid ranges per stream"
    );
    check(&hub, "the creates sent");
    for revision in 11..16 {
        hub.upstream_response(put(1, "k", revision));
        check(&hub, &format!("event {revision}"));
    }
    assert_eq!(
        a.received().len(),
        5,
        "only the announced watcher's events went out"
    );
    assert!(b.received().is_empty(), "all of b's wait");
    // Watchers cancelled before their Created went out: their last answer is held too.
    for watch_id in (5..60).step_by(7) {
        hub.cancel(a.id, watch_id);
        check(&hub, &format!("cancel {watch_id}"));
    }
    // etcd answers the creates in the order they were sent: everything held goes out.
    for (sw, create) in (2..).zip(&creates) {
        // The hub sends an invalid range with watch ID 0, for etcd to refuse.
        let answer = if !create.starts_with("create 0 ") {
            created(sw, 15)
        } else {
            WatchResponse {
                header: header(15),
                watch_id: -1,
                created: true,
                canceled: true,
                cancel_reason: "mvcc: watcher range is empty".into(),
                ..Default::default()
            }
        };
        hub.upstream_response(answer);
        check(&hub, &format!("the answer to {create}"));
    }
    assert!(a.abort.try_recv().is_err() && b.abort.try_recv().is_err());
    assert!(a.finish.try_recv().is_err() && b.finish.try_recv().is_err());
    assert!(a.received().len() > 60 * 5 && b.received().len() > 60 * 5);
    hub.upstream_response(put(1, "k", 16));
    check(&hub, "an event after the answers");
    hub.close_stream(a.id);
    check(&hub, "a stream closed");
}

fn watch_range(key: &str, range_end: &str) -> WatchCreateRequest {
    WatchCreateRequest {
        range_end: range_end.into(),
        ..watch(key, 0)
    }
}
