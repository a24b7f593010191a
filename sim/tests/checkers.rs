//! Each checker is fed a correct history (it must pass) and deliberately broken ones (it must fail): a dropped
//! event, a duplicate, a reordering, a broken progress promise, an event delivered late after the faults healed, an
//! early expiry, a late expiry (and what the expiry slack hides), two upstream streams,
//! two upstream watchers on one range, a leftover upstream watcher, a failed read, a write with the wrong code, a
//! lost acknowledged write, a hung call, a proxy that left tasks running, a namespaced proxy reaching outside its
//! prefix, a stale or wrongly cut Range answer, a client's revisions going backwards, a linearizable answer missing
//! an acknowledged write, a cache run that checked too little or never hit the cache.

use std::time::Duration;

use proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, ResponseHeader,
};
use proto::mvccpb::{Event, KeyValue};
use std::collections::{BTreeMap, BTreeSet};

use sim::check::cache::{
    AckedWrite, CacheMetrics, Minimums, ReadLog, ReadOutcome, Timeline, check_answers, check_cache,
    check_linearizable, check_monotonic,
};
use sim::check::calls::{CallKind, CallLog, CallOutcome, check_calls};
use sim::check::census::{CensusLog, check_census};
use sim::check::hygiene::check_hygiene;
use sim::check::lease::{LeaseClientLog, check_leases, expected_upstream_keepalive_streams};
use sim::check::namespace::check_confinement;
use sim::check::watch::{
    Lateness, WatchEnd, WatchStart, WatcherLog, check_delivery, check_lag, check_watcher,
};
use sim::model::{
    AccessKind, Hang, History, LeaseEnd, LeaseRecord, Store, StreamKind, StreamRecord,
    StreamWatchers, WatchCensus,
};
use sim::world::{Finished, ProxyExit};
use tonic::Code;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A history with puts of a=1 (2), b=1 (3), a=2 (4), delete a (5), c=1 (6).
fn kv_history() -> History {
    let mut store = Store::new();
    for (key, value) in [("a", "1"), ("b", "1"), ("a", "2")] {
        store
            .put(
                &PutRequest {
                    key: key.into(),
                    value: value.into(),
                    ..Default::default()
                },
                Duration::ZERO,
            )
            .unwrap();
    }
    store
        .delete_range(
            &DeleteRangeRequest {
                key: b"a".to_vec(),
                ..Default::default()
            },
            Duration::ZERO,
        )
        .unwrap();
    store
        .put(
            &PutRequest {
                key: b"c".to_vec(),
                value: b"1".to_vec(),
                ..Default::default()
            },
            Duration::ZERO,
        )
        .unwrap();
    store.history
}

/// What a correct watcher on everything (no prev_kv) from revision 2 receives through revision 6.
fn all_events(history: &History) -> Vec<Event> {
    history
        .events_between(2, 6)
        .map(|e| Event {
            prev_kv: None,
            ..e.clone()
        })
        .collect()
}

fn watcher(received: Vec<Event>) -> WatcherLog {
    WatcherLog {
        name: "w".into(),
        key: b"\0".to_vec(),
        range_end: b"\0".to_vec(),
        prev_kv: false,
        no_put: false,
        no_delete: false,
        caller: None,
        start: Some(WatchStart::Revision(2)),
        received_at: vec![Duration::ZERO; received.len()],
        received,
        progress: Vec::new(),
        problems: Vec::new(),
        end: WatchEnd::CompleteThrough(6),
    }
}

#[test]
fn watch_checker_accepts_exactly_the_models_events() {
    let history = kv_history();
    assert_eq!(
        check_watcher(&history, &watcher(all_events(&history))),
        Ok(())
    );
}

/// Events received after the revision a watcher waited for (writes that went on after the fence) are checked
/// too, through the last one received.
#[test]
fn watch_checker_checks_events_past_the_fence_through_the_last_received() {
    let history = kv_history();
    let mut past = watcher(all_events(&history));
    past.end = WatchEnd::CompleteThrough(4);
    assert_eq!(check_watcher(&history, &past), Ok(()));
    // A made-up event past the fence: its revision has the model's event on another key.
    let mut made_up = past.clone();
    let last = made_up.received.last_mut().expect("events");
    last.kv.as_mut().expect("a key").key = b"z".to_vec().into();
    assert!(check_watcher(&history, &made_up).is_err());
    // A gap past the fence: revision 5 missing before 6.
    let mut gap = past.clone();
    gap.received.remove(3);
    gap.received_at.remove(3);
    assert!(check_watcher(&history, &gap).is_err());
}

#[test]
fn watch_checker_catches_a_dropped_event() {
    let history = kv_history();
    let mut events = all_events(&history);
    events.remove(2);
    let err = check_watcher(&history, &watcher(events)).unwrap_err();
    assert!(err.contains("expected PUT a@4"), "{err}");
}

#[test]
fn watch_checker_catches_a_missing_tail_and_a_duplicate_and_a_reordering() {
    let history = kv_history();
    let mut short = all_events(&history);
    short.pop();
    assert!(
        check_watcher(&history, &watcher(short))
            .unwrap_err()
            .contains("missing")
    );
    let mut duplicated = all_events(&history);
    duplicated.insert(2, duplicated[1].clone());
    assert!(
        check_watcher(&history, &watcher(duplicated))
            .unwrap_err()
            .contains("duplicate")
    );
    let mut reordered = all_events(&history);
    reordered.swap(0, 1);
    assert!(check_watcher(&history, &watcher(reordered)).is_err());
}

#[test]
fn watch_checker_applies_range_filters_and_prev_kv() {
    let history = kv_history();
    let mut log = watcher(
        history
            .events_between(2, 6)
            .filter(|e| e.kv.as_ref().unwrap().key == b"a"[..] && e.r#type == 0)
            .cloned()
            .collect(),
    );
    log.key = b"a".to_vec();
    log.range_end = Vec::new();
    log.no_delete = true;
    log.prev_kv = true;
    assert_eq!(check_watcher(&history, &log), Ok(()));
    // Without prev_kv requested, an event that carries one is not what etcd sends.
    log.prev_kv = false;
    assert!(check_watcher(&history, &log).is_err());
}

#[test]
fn watch_checker_requires_a_reason_for_a_cancel_and_confirmation_otherwise() {
    let mut history = kv_history();
    history.compactions.push((Duration::ZERO, 4));
    // Received revision 2 only: revision 3, which it needs next, is gone after a compaction at 4.
    let mut log = watcher(all_events(&history)[..1].to_vec());
    log.end = WatchEnd::Cancelled {
        reason: String::new(),
        compact_revision: 0,
    };
    assert!(
        check_watcher(&history, &log)
            .unwrap_err()
            .contains("reason")
    );
    log.end = WatchEnd::Cancelled {
        reason: String::new(),
        compact_revision: 4,
    };
    assert_eq!(check_watcher(&history, &log), Ok(()));
    log.end = WatchEnd::Unconfirmed;
    assert!(check_watcher(&history, &log).is_err());
}

#[test]
fn watch_checker_accepts_only_the_models_compaction_cancels() {
    let mut history = kv_history();
    history.compactions.push((Duration::ZERO, 4));
    let cancelled_at = |received: usize, compact_revision| {
        let mut log = watcher(all_events(&history)[..received].to_vec());
        log.end = WatchEnd::Cancelled {
            reason: String::new(),
            compact_revision,
        };
        check_watcher(&history, &log)
    };
    assert_eq!(cancelled_at(1, 4), Ok(()), "needed 3, compacted at 4");
    // Needed 4 next: etcd keeps the compaction revision, so it would not have cancelled this watcher (another
    // watcher's cancel handed to this one looks like this).
    let err = cancelled_at(2, 4).unwrap_err();
    assert!(err.contains("compaction kept"), "{err}");
    let err = cancelled_at(1, 5).unwrap_err();
    assert!(err.contains("never made"), "{err}");
    // A reason the model never gives a created watcher.
    let mut log = watcher(all_events(&history)[..1].to_vec());
    log.end = WatchEnd::Cancelled {
        reason: "etcdserver: no leader".into(),
        compact_revision: 0,
    };
    let err = check_watcher(&history, &log).unwrap_err();
    assert!(err.contains("never gives"), "{err}");
}

#[test]
fn watch_checker_fails_a_watcher_that_was_never_created() {
    let history = kv_history();
    let mut log = watcher(Vec::new());
    log.start = None;
    log.end = WatchEnd::Unconfirmed;
    let err = check_watcher(&history, &log).unwrap_err();
    assert!(err.contains("never created"), "{err}");
}

#[test]
fn delivery_checker_bounds_each_event_after_the_later_of_its_commit_and_the_last_heal() {
    let mut history = kv_history();
    // Revisions 2..=6 committed at 1, 2, 3, 4 and 5 s; the last fault healed at 3 s.
    for record in &mut history.revisions {
        record.at = secs(record.revision as f64 - 1.0);
    }
    let (healed, bound) = (secs(3.0), secs(0.5));
    let mut on_time = watcher(all_events(&history));
    // Revisions 2 and 3 were committed during the faults and may wait for the heal; 4, 5 and 6 may not.
    on_time.received_at = vec![secs(3.4), secs(3.5), secs(3.2), secs(4.3), secs(5.1)];
    let (worst, violations) = check_delivery(&history, &[on_time.clone()], healed, bound);
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(
        worst,
        Some(Lateness {
            late_by: secs(0.5),
            revision: 3
        })
    );
    // Completeness alone passes both of these; the bound does not.
    let mut held_past_the_heal = on_time.clone();
    held_past_the_heal.received_at[0] = secs(3.6);
    let (_, violations) = check_delivery(&history, &[held_past_the_heal], healed, bound);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].contains("revision 2") && violations[0].contains("0.600s late"),
        "{violations:?}"
    );
    let mut slow_after_the_heal = on_time.clone();
    slow_after_the_heal.received_at[4] = secs(5.6);
    let (_, violations) = check_delivery(&history, &[slow_after_the_heal], healed, bound);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("revision 6"), "{violations:?}");
    // A watcher that received nothing has nothing late (its completeness is the other checker's).
    let (worst, violations) = check_delivery(&history, &[watcher(Vec::new())], healed, bound);
    assert_eq!((worst, violations.len()), (None, 0));
}

#[test]
fn watch_checker_filters_puts_out_for_noput_and_ends_a_client_cancel_at_the_last_event() {
    let history = kv_history();
    // Only the delete of a (at 5) is left with NOPUT.
    let deletes: Vec<Event> = all_events(&history)
        .into_iter()
        .filter(|e| e.r#type == 1)
        .collect();
    let mut log = watcher(deletes.clone());
    log.no_put = true;
    assert_eq!(check_watcher(&history, &log), Ok(()));
    log.received = all_events(&history);
    assert!(
        check_watcher(&history, &log).is_err(),
        "puts got through NOPUT"
    );
    // Cancelled by its client after two events: those two must be right, nothing more is owed.
    let mut cancelled = watcher(all_events(&history)[..2].to_vec());
    cancelled.end = WatchEnd::CancelledByClient;
    assert_eq!(check_watcher(&history, &cancelled), Ok(()));
    cancelled.received.remove(0);
    assert!(check_watcher(&history, &cancelled).is_err());
}

#[test]
fn watch_checker_holds_progress_notifications_to_their_promise() {
    let history = kv_history();
    let mut log = watcher(all_events(&history));
    // After 3 events (revisions 2, 3, 4) a notification at revision 4 is right; at 5 it promises the delete too.
    log.progress = vec![(0, 1), (3, 4)];
    assert_eq!(check_watcher(&history, &log), Ok(()));
    log.progress = vec![(3, 5)];
    let err = check_watcher(&history, &log).unwrap_err();
    assert!(err.contains("progress notification at revision 5"), "{err}");
    // Beyond the revision the check covers (6 here), a notification promises nothing it can check.
    log.progress = vec![(5, 9)];
    assert_eq!(check_watcher(&history, &log), Ok(()));
}

#[test]
fn watch_checker_rejects_a_refused_create_and_protocol_problems() {
    let history = kv_history();
    let mut refused = watcher(Vec::new());
    refused.start = None;
    refused.end = WatchEnd::Refused {
        reason: "mvcc: duplicate watch ID provided on the WatchStream".into(),
    };
    assert!(
        check_watcher(&history, &refused)
            .unwrap_err()
            .contains("refused")
    );
    let mut wrong_id = watcher(all_events(&history));
    wrong_id
        .problems
        .push("asked for watch ID 1000, was created as 3".into());
    assert!(
        check_watcher(&history, &wrong_id)
            .unwrap_err()
            .contains("1000")
    );
}

fn range(key: &str, range_end: &str) -> (Vec<u8>, Vec<u8>) {
    (key.as_bytes().to_vec(), range_end.as_bytes().to_vec())
}

fn stream(member: usize, index: usize, ranges: &[((&str, &str), usize)]) -> StreamWatchers {
    StreamWatchers {
        member,
        stream: index,
        ranges: ranges
            .iter()
            .map(|((k, e), n)| (range(k, e), *n))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn census(streams: Vec<StreamWatchers>, client_ranges: &[(&str, &str)]) -> CensusLog {
    CensusLog {
        at: secs(5.5),
        census: WatchCensus { streams },
        client_ranges: client_ranges
            .iter()
            .map(|(k, e)| range(k, e))
            .collect::<BTreeSet<_>>(),
    }
}

#[test]
fn census_checker_accepts_one_upstream_watcher_per_client_range_on_one_stream() {
    let good = census(
        vec![stream(1, 4, &[(("a", ""), 1), (("b", "c"), 1)])],
        &[("a", ""), ("b", "c")],
    );
    assert!(check_census(&good).is_empty());
    let nothing = census(Vec::new(), &[]);
    assert!(check_census(&nothing).is_empty());
}

#[test]
fn census_checker_catches_duplicates_leftovers_missing_ranges_and_a_second_stream() {
    let clients = [("a", ""), ("b", "c")];
    let duplicate = census(
        vec![stream(0, 1, &[(("a", ""), 2), (("b", "c"), 1)])],
        &clients,
    );
    let violations = check_census(&duplicate);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("2 upstream watchers"));
    let leftover = census(
        vec![stream(
            0,
            1,
            &[(("a", ""), 1), (("b", "c"), 1), (("z", ""), 1)],
        )],
        &clients,
    );
    let violations = check_census(&leftover);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("no client watcher watches"));
    let missing = census(vec![stream(0, 1, &[(("a", ""), 1)])], &clients);
    assert_eq!(check_census(&missing).len(), 1);
    // Each range once, but split over two streams (two members): not one upstream stream.
    let split = census(
        vec![
            stream(0, 1, &[(("a", ""), 1)]),
            stream(2, 7, &[(("b", "c"), 1)]),
        ],
        &clients,
    );
    let violations = check_census(&split);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("2 upstream Watch stream(s)"));
}

#[test]
fn lag_is_the_model_revision_minus_the_reported_one_and_is_bounded() {
    let mut behind = watcher(Vec::new());
    behind.start = Some(WatchStart::Current {
        applied: 10,
        reported: 7,
    });
    let mut ahead = watcher(Vec::new());
    ahead.start = Some(WatchStart::Current {
        applied: 10,
        reported: 11,
    });
    let (worst, violations) = check_lag(&[behind.clone(), ahead.clone()], 0);
    assert_eq!(worst, Some(3));
    assert_eq!(violations.len(), 1);
    assert!(check_lag(&[behind, ahead], 3).1.is_empty());
}

fn call(kind: CallKind, outcome: CallOutcome) -> CallLog {
    CallLog {
        client: "c".into(),
        what: "op".into(),
        kind,
        started: secs(1.0),
        finished: secs(1.5),
        outcome,
    }
}

#[test]
fn calls_checker_rejects_failed_reads_wrong_write_codes_lost_writes_and_hangs() {
    let history = kv_history();
    let bound = secs(4.0);
    let put_a2 = CallKind::Put {
        key: b"a".to_vec(),
        value: b"2".to_vec(),
    };
    let good = [
        call(CallKind::Read, CallOutcome::Ok { revision: 3 }),
        call(put_a2.clone(), CallOutcome::Ok { revision: 4 }),
        call(
            CallKind::OtherWrite,
            CallOutcome::Failed {
                code: Code::Unavailable,
                message: "x".into(),
            },
        ),
    ];
    assert_eq!(check_calls(&history, &good, bound, &[]), Default::default());
    let bad = [
        call(
            CallKind::Read,
            CallOutcome::Failed {
                code: Code::Unavailable,
                message: "down".into(),
            },
        ),
        call(
            CallKind::OtherWrite,
            CallOutcome::Failed {
                code: Code::Unknown,
                message: "transport error".into(),
            },
        ),
        // Acknowledged at a revision where the model has a different put.
        call(put_a2, CallOutcome::Ok { revision: 3 }),
        call(CallKind::Read, CallOutcome::TimedOut),
        CallLog {
            finished: secs(9.0),
            ..call(CallKind::Read, CallOutcome::Ok { revision: 3 })
        },
    ];
    let verdict = check_calls(&history, &bad, bound, &[]);
    assert_eq!(verdict.violations.len(), bad.len(), "{verdict:#?}");
    // A tolerated known defect is reported as such, not as a violation; nothing else is excused.
    let verdict = check_calls(&history, &bad, bound, &[(Code::Unknown, "transport error")]);
    assert_eq!(verdict.violations.len(), bad.len() - 1);
    assert_eq!(verdict.tolerated.len(), 1);
}

fn lease_history(ended: Option<(Duration, LeaseEnd)>, streams: &[(f64, f64)]) -> History {
    let mut history = History::default();
    history.leases.insert(
        7,
        LeaseRecord {
            id: 7,
            granted_ttl: 3,
            granted_at: Duration::ZERO,
            keep_alives: Vec::new(),
            ended,
        },
    );
    for (first, last) in streams {
        history.streams.push(StreamRecord {
            member: 0,
            kind: StreamKind::LeaseKeepAlive,
            opened_at: secs(*first),
            closed_at: None,
            connected_at: None,
            first_request_at: Some(secs(*first)),
            last_request_at: Some(secs(*last)),
        });
    }
    history
}

fn lease_client(stopped_at: Option<f64>) -> LeaseClientLog {
    LeaseClientLog {
        client: "l".into(),
        lease: 7,
        ttl: secs(3.0),
        interval: secs(0.7),
        stopped_at: stopped_at.map(secs),
        last_request_at: Some(secs(stopped_at.unwrap_or(5.0))),
    }
}

#[test]
fn lease_checker_catches_an_early_expiry() {
    let mut early = lease_history(Some((secs(2.0), LeaseEnd::Expired)), &[(0.0, 5.0)]);
    let record = early.leases.get_mut(&7).expect("the lease is recorded");
    record.keep_alives = vec![(secs(0.25), 1), (secs(0.5), 2)];
    let violations = check_leases(&early, &[lease_client(None)], 1, secs(8.0));
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].ends_with("(last renewals: 0.250s@m1, 0.500s@m2)"),
        "the message shows when the lease was last renewed: {violations:?}"
    );
    let before_stop = lease_history(Some((secs(1.0), LeaseEnd::Expired)), &[(0.0, 0.5)]);
    assert_eq!(
        check_leases(&before_stop, &[lease_client(Some(2.0))], 1, secs(8.0)).len(),
        1
    );
    let kept = lease_history(None, &[(0.0, 5.0)]);
    assert!(check_leases(&kept, &[lease_client(None)], 1, secs(8.0)).is_empty());
    // A lease kept alive to the end of its client's run (last asked at 5 s) may expire TTL after the last request,
    // while the world runs on; not a moment earlier.
    let after_the_end = lease_history(Some((secs(8.0), LeaseEnd::Expired)), &[(0.0, 5.0)]);
    assert!(check_leases(&after_the_end, &[lease_client(None)], 1, secs(9.0)).is_empty());
    let just_before = lease_history(Some((secs(7.9), LeaseEnd::Expired)), &[(0.0, 5.0)]);
    assert_eq!(
        check_leases(&just_before, &[lease_client(None)], 1, secs(9.0)).len(),
        1
    );
    let revoked = lease_history(Some((secs(8.0), LeaseEnd::Revoked)), &[(0.0, 5.0)]);
    assert_eq!(
        check_leases(&revoked, &[lease_client(None)], 1, secs(9.0)).len(),
        1
    );
}

#[test]
fn lease_checker_catches_a_late_expiry_and_a_lease_that_never_ends() {
    let on_time = lease_history(Some((secs(5.5), LeaseEnd::Expired)), &[(0.0, 2.0)]);
    assert!(check_leases(&on_time, &[lease_client(Some(2.0))], 1, secs(8.0)).is_empty());
    let late = lease_history(Some((secs(5.8), LeaseEnd::Expired)), &[(0.0, 2.0)]);
    assert_eq!(
        check_leases(&late, &[lease_client(Some(2.0))], 1, secs(8.0)).len(),
        1
    );
    let never = lease_history(None, &[(0.0, 2.0)]);
    assert_eq!(
        check_leases(&never, &[lease_client(Some(2.0))], 1, secs(8.0)).len(),
        1
    );
}

/// The expiry rule's slack (one keep-alive interval past the client's stop) and what it hides: a renewal the
/// proxy sent by itself after the client stopped, if it came within the slack. etcd gives no tighter promise to a
/// direct client: it renews a lease when a request arrives, not when it was sent, and its lessor looks for expired
/// leases every 500 ms, so a lease may outlive TTL after its last renewal by up to half a second on etcd itself.
#[test]
fn lease_checker_slack_hides_one_renewal_within_an_interval_of_the_stop_and_no_later() {
    // The client stopped at 2 s; its lease was renewed once more at the member, and expired TTL (3 s) after that.
    let renewed_at = |after_stop: f64| {
        let mut history = lease_history(
            Some((secs(2.0 + after_stop + 3.0), LeaseEnd::Expired)),
            &[(0.0, 2.0 + after_stop)],
        );
        let record = history.leases.get_mut(&7).expect("the lease is recorded");
        record.keep_alives = vec![(secs(1.0), 0), (secs(2.0 + after_stop), 0)];
        history
    };
    let client = [lease_client(Some(2.0))];
    assert!(check_leases(&renewed_at(0.6), &client, 1, secs(9.0)).is_empty());
    let caught = check_leases(&renewed_at(0.8), &client, 1, secs(9.0));
    assert_eq!(caught.len(), 1, "{caught:?}");
    assert!(caught[0].contains("2.800s@m0"), "{caught:?}");
}

/// A renewal a hung member reads as it resumes arrived while it was stopped: if that was by the stop (and the
/// slack), it renews the lease then, as etcd would after SIGCONT; if the hang began only after, the renewal was sent
/// after the client stopped. What this hides: a renewal the proxy sent by itself during a hang that began by then.
#[test]
fn lease_checker_accepts_a_renewal_sent_before_the_stop_and_read_when_a_hung_member_resumed() {
    let client = [lease_client(Some(2.0))];
    let resumed_renewal = |hung_since: f64| {
        // Renewed at 3.3 s by member 1 as it resumed; expired TTL (3 s) after that.
        let mut history = lease_history(Some((secs(6.3), LeaseEnd::Expired)), &[(0.0, 2.0)]);
        let record = history.leases.get_mut(&7).expect("the lease is recorded");
        record.keep_alives = vec![(secs(1.5), 0), (secs(3.3), 1)];
        history.hangs.push(Hang {
            member: 1,
            since: secs(hung_since),
            resumed: secs(3.3),
        });
        history
    };
    assert!(check_leases(&resumed_renewal(1.8), &client, 1, secs(9.0)).is_empty());
    let sent_after = check_leases(&resumed_renewal(2.9), &client, 1, secs(9.0));
    assert_eq!(sent_after.len(), 1, "{sent_after:?}");
    // The same renewal read by a member that was not hung came after the stop and the slack: caught.
    let mut not_hung = resumed_renewal(1.8);
    not_hung.hangs.clear();
    assert_eq!(check_leases(&not_hung, &client, 1, secs(9.0)).len(), 1);
}

/// A new leader renewed every lease for TTL and an election timeout, as etcd's lessor does on promotion: the lease
/// may live that long after the election, and no longer.
#[test]
fn lease_checker_allows_the_renewal_a_new_leader_gives_every_lease() {
    let client = [lease_client(Some(2.0))];
    let expired_at = |at: f64| {
        let mut history = lease_history(Some((secs(at), LeaseEnd::Expired)), &[(0.0, 2.0)]);
        history.elections.push(secs(2.5));
        history
    };
    assert!(check_leases(&expired_at(6.4), &client, 1, secs(9.0)).is_empty());
    assert_eq!(
        check_leases(&expired_at(6.7), &client, 1, secs(9.0)).len(),
        1
    );
    // Without the election the same lease had to be gone by stop + TTL + one interval.
    let mut no_election = expired_at(6.4);
    no_election.elections.clear();
    assert_eq!(check_leases(&no_election, &client, 1, secs(9.0)).len(), 1);
    // An election just before the stop renewed the lease too.
    let mut before_the_stop = expired_at(5.9);
    before_the_stop.elections = vec![secs(1.9)];
    assert!(check_leases(&before_the_stop, &client, 1, secs(9.0)).is_empty());
    before_the_stop.leases.get_mut(&7).expect("the lease").ended =
        Some((secs(6.0), LeaseEnd::Expired));
    assert_eq!(
        check_leases(&before_the_stop, &client, 1, secs(9.0)).len(),
        1
    );
}

#[test]
fn lease_checker_catches_two_upstream_streams_when_one_is_allowed() {
    let two = lease_history(None, &[(0.0, 4.0), (1.0, 5.0)]);
    let violations = check_leases(&two, &[lease_client(None)], 1, secs(8.0));
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("2 upstream keep-alive streams"));
    // A stream replaced by another (no overlap in use) is one at a time.
    let sequential = lease_history(None, &[(0.0, 2.0), (2.5, 5.0)]);
    assert!(check_leases(&sequential, &[lease_client(None)], 1, secs(8.0)).is_empty());
    // Requests held on the old stream's link and delivered just after the new stream started are not a second
    // stream in use; a longer parallel use is.
    let held = lease_history(None, &[(0.0, 2.5), (2.0, 5.0)]);
    assert!(check_leases(&held, &[lease_client(None)], 1, secs(8.0)).is_empty());
    let parallel = lease_history(None, &[(0.0, 3.5), (2.0, 5.0)]);
    assert_eq!(
        check_leases(&parallel, &[lease_client(None)], 1, secs(8.0)).len(),
        1
    );
    // A stream the member saw opened, used and closed at one instant (given up before a hung member resumed and
    // read it) was not in use beside the one that started then; one that lived on was.
    let mut resumed = lease_history(None, &[(3.0, 3.0), (3.0, 5.0)]);
    resumed.streams[0].closed_at = Some(secs(3.0));
    assert!(check_leases(&resumed, &[lease_client(None)], 1, secs(8.0)).is_empty());
    resumed.streams[0].closed_at = Some(secs(3.1));
    assert_eq!(
        check_leases(&resumed, &[lease_client(None)], 1, secs(8.0)).len(),
        1
    );
    // A stream opened as a failover moved the proxy to another member (seeds lease-scale 30557 and 31088): its
    // member saw it open as the next member saw the new stream open, and close within the links' jitter, so it
    // was not in use beside it. One closed later than that was; so was the same pair on one member.
    let mut handover = lease_history(None, &[(0.0, 1.0), (2.19, 2.199), (2.19, 5.0)]);
    handover.streams[1].closed_at = Some(secs(2.199));
    handover.streams[2].member = 1;
    assert!(check_leases(&handover, &[lease_client(None)], 1, secs(8.0)).is_empty());
    handover.streams[2].member = 0;
    assert_eq!(
        check_leases(&handover, &[lease_client(None)], 1, secs(8.0)).len(),
        1
    );
    handover.streams[2].member = 1;
    handover.streams[1].closed_at =
        Some(secs(2.19) + sim::fault::MAX_JITTER + Duration::from_millis(1));
    assert_eq!(
        check_leases(&handover, &[lease_client(None)], 1, secs(8.0)).len(),
        1
    );
    // A stream whose requests its member read only as a held link was released (lease 34022 and five more seeds of
    // the 32768 sweep): the proxy sent them while that stream was its only one, during the hold, and moved before the
    // release; the member read them as the next stream was in use. In use from the start of the hold, so not
    // beside the next stream. Without that hold, or with a hold released at another instant, or one that began
    // after the next stream was in use, it is a second stream.
    let mut held_link = lease_history(None, &[(0.0, 1.4), (2.961, 2.961), (2.595, 6.21)]);
    held_link.streams[1].opened_at = secs(1.485);
    held_link.streams[1].closed_at = Some(secs(2.961));
    held_link.streams[1].member = 1;
    held_link.streams[2].member = 2;
    let hold = |since: f64, released: f64| sim::model::Hold {
        member: 1,
        since: secs(since),
        released: secs(released),
    };
    let client = [lease_client(None)];
    assert_eq!(check_leases(&held_link, &client, 1, secs(8.0)).len(), 1);
    held_link.holds = vec![hold(2.163, 2.961)];
    assert!(check_leases(&held_link, &client, 1, secs(8.0)).is_empty());
    held_link.holds = vec![hold(2.163, 2.95)];
    assert_eq!(check_leases(&held_link, &client, 1, secs(8.0)).len(), 1);
    held_link.holds = vec![hold(2.7, 2.961)];
    assert_eq!(check_leases(&held_link, &client, 1, secs(8.0)).len(), 1);
    // A stream a proxy instance sent just before it was restarted, which reached the member (on the instance's
    // connection, accepted earlier) after the restart, beside the new instance's stream: not in use by the proxy.
    // The same stream on a connection accepted after the restart was the new instance's: a second stream.
    let mut late = lease_history(None, &[(0.0, 2.0), (2.313, 5.0), (2.316, 2.316)]);
    late.streams[2].closed_at = Some(secs(2.319));
    late.streams[2].connected_at = Some(secs(0.5));
    late.proxy_restarts.push(secs(2.301));
    assert!(check_leases(&late, &[lease_client(None)], 1, secs(8.0)).is_empty());
    late.streams[2].connected_at = Some(secs(2.310));
    assert_eq!(
        check_leases(&late, &[lease_client(None)], 1, secs(8.0)).len(),
        1
    );
}

#[test]
fn lease_checker_counts_a_resumed_members_stream_in_use_only_from_its_senders_start() {
    // Seed lease-scale 47370: member 2 hung at 1.947 s; the proxy instance started at 1.35 s used a stream on
    // member 1 at 2.367 s and was restarted at 2.553 s; the new instance dialled member 2 (accepted at 3.31 s, by
    // the kernel) and sent on a stream the member read as it resumed at 3.33 s. That stream's requests were sent
    // after the restart, not from the hang's start: one stream at a time.
    let mut resumed = lease_history(None, &[(2.367, 2.37), (3.33, 6.381)]);
    resumed.streams[0].member = 1;
    resumed.streams[0].closed_at = Some(secs(2.37));
    resumed.streams[1].member = 2;
    resumed.streams[1].connected_at = Some(secs(3.31));
    resumed.hangs.push(Hang {
        member: 2,
        since: secs(1.947),
        resumed: secs(3.33),
    });
    resumed.proxy_restarts = vec![secs(1.35), secs(2.553)];
    let client = [lease_client(None)];
    assert!(check_leases(&resumed, &client, 1, secs(8.0)).is_empty());
    // Sent by the instance that used the stream on member 1 (no restart between): it may have been in use from
    // the hang's start, beside that one.
    resumed.proxy_restarts = vec![secs(1.35)];
    assert_eq!(check_leases(&resumed, &client, 1, secs(8.0)).len(), 1);
    // An instance that started before the stream on member 1 was used sent both: two streams.
    resumed.proxy_restarts = vec![secs(1.35), secs(2.36)];
    assert_eq!(check_leases(&resumed, &client, 1, secs(8.0)).len(), 1);
}

#[test]
fn the_fan_out_bound_is_one_per_client_stream_until_coalescing_lands() {
    if sim::check::lease::KEEPALIVE_STREAMS_COALESCED {
        assert_eq!(expected_upstream_keepalive_streams(5), 1);
    } else {
        assert_eq!(expected_upstream_keepalive_streams(5), 5);
    }
}

fn finished(exits: Vec<ProxyExit>, sim_error: Option<String>) -> Finished {
    Finished {
        cluster: sim::model::Cluster::new(1, 0),
        trace: Default::default(),
        proxy_exits: exits,
        elapsed: Duration::ZERO,
        healed_at: Duration::ZERO,
        sim_error,
    }
}

#[test]
fn hygiene_checker_catches_leftover_tasks_errors_and_failed_runs() {
    let clean = ProxyExit {
        result: Ok(()),
        tasks_left: 0,
    };
    assert!(check_hygiene(&finished(vec![clean.clone()], None)).is_empty());
    let leftover = ProxyExit {
        tasks_left: 2,
        ..clean.clone()
    };
    assert_eq!(check_hygiene(&finished(vec![leftover], None)).len(), 1);
    let failed = ProxyExit {
        result: Err("boom".into()),
        ..clean
    };
    assert_eq!(check_hygiene(&finished(vec![failed], None)).len(), 1);
    assert_eq!(check_hygiene(&finished(vec![], None)).len(), 1);
    assert_eq!(
        check_hygiene(&finished(vec![], Some("panicked".into()))).len(),
        1
    );
}

/// A history in which member 0 (a proxy with namespace `a\xff`) put `a\xffk` and read its whole namespace, and
/// member 1 (namespace `\xff\xff`) watched everything in its own.
fn confined_history() -> History {
    let mut store = Store::new();
    store
        .put(
            &PutRequest {
                key: b"a\xffk".to_vec(),
                value: b"1".to_vec(),
                ..Default::default()
            },
            Duration::ZERO,
        )
        .unwrap();
    let mut history = store.history;
    let at = Duration::ZERO;
    history.record_access(at, 0, AccessKind::Put, b"a\xffk", b"");
    history.record_access(at, 0, AccessKind::Range, b"a\xff", b"b");
    history.record_access(at, 0, AccessKind::Compare, b"a\xffk", b"a\xffz");
    history.record_access(at, 1, AccessKind::Watch, b"\xff\xff", b"\0");
    history
}

fn namespaces() -> BTreeMap<usize, Vec<u8>> {
    BTreeMap::from([(0, b"a\xff".to_vec()), (1, b"\xff\xff".to_vec())])
}

#[test]
fn confinement_checker_accepts_requests_and_writes_inside_the_namespaces() {
    assert_eq!(
        check_confinement(&confined_history(), &namespaces()),
        Vec::<String>::new()
    );
}

#[test]
fn confinement_checker_catches_a_request_or_a_write_outside_the_namespace() {
    let at = Duration::ZERO;
    // Go's proxy ends the namespace `a\xff` at `b\0`, which reaches key `b`.
    let mut past_the_end = confined_history();
    past_the_end.record_access(at, 0, AccessKind::Range, b"a\xff", b"b\0");
    // A from-key range reaches the end of the keyspace, past a namespace that does not end in 0xff bytes only.
    let mut from_key = confined_history();
    from_key.record_access(at, 0, AccessKind::DeleteRange, b"a\xffk", b"\0");
    // Member 0's proxy named a key of member 1's namespace.
    let mut neighbour = confined_history();
    neighbour.record_access(at, 0, AccessKind::Compare, b"\xff\xffk", b"");
    // A key without the prefix (the client's empty key sent on as it came).
    let mut unprefixed = confined_history();
    unprefixed.record_access(at, 1, AccessKind::Watch, b"", b"");
    let mut no_namespace = confined_history();
    no_namespace.record_access(at, 2, AccessKind::Range, b"a\xffk", b"");
    for (what, history) in [
        ("past the end", past_the_end),
        ("from key", from_key),
        ("neighbour", neighbour),
        ("unprefixed", unprefixed),
        ("no namespace", no_namespace),
    ] {
        assert_eq!(
            check_confinement(&history, &namespaces()).len(),
            1,
            "{what}"
        );
    }
    let mut store = Store::new();
    store
        .put(
            &PutRequest {
                key: b"b".to_vec(),
                value: b"1".to_vec(),
                ..Default::default()
            },
            Duration::ZERO,
        )
        .unwrap();
    let violations = check_confinement(&store.history, &namespaces());
    assert_eq!(violations.len(), 1);
    assert!(violations[0].contains("b\"b\""), "{violations:?}");
}

/// Puts a=1 (2, at 1 s), b=1 (3, 2 s), a=2 (4, 3 s), deletes a (5, 4 s), puts c=1 (6, 5 s); compacts at 5 (5.5 s).
fn cache_history() -> History {
    let mut store = Store::new();
    let put = |store: &mut Store, key: &str, value: &str, at: f64| {
        store
            .put(
                &PutRequest {
                    key: key.into(),
                    value: value.into(),
                    ..Default::default()
                },
                secs(at),
            )
            .unwrap();
    };
    put(&mut store, "a", "1", 1.0);
    put(&mut store, "b", "1", 2.0);
    put(&mut store, "a", "2", 3.0);
    store
        .delete_range(
            &DeleteRangeRequest {
                key: b"a".to_vec(),
                ..Default::default()
            },
            secs(4.0),
        )
        .unwrap();
    put(&mut store, "c", "1", 5.0);
    store.compact(5, secs(5.5)).unwrap();
    store.history
}

fn kv(key: &str, value: &str, create: i64, modified: i64, version: i64) -> KeyValue {
    KeyValue {
        key: key.as_bytes().to_vec().into(),
        value: value.as_bytes().to_vec().into(),
        create_revision: create,
        mod_revision: modified,
        version,
        lease: 0,
    }
}

/// The model's a=1, a=2, b=1 and c=1 as etcd returns them.
fn a1() -> KeyValue {
    kv("a", "1", 2, 2, 1)
}
fn a2() -> KeyValue {
    kv("a", "2", 2, 4, 2)
}
fn b1() -> KeyValue {
    kv("b", "1", 3, 3, 1)
}
fn c1() -> KeyValue {
    kv("c", "1", 6, 6, 1)
}

/// A serializable read of every key.
fn everything() -> RangeRequest {
    RangeRequest {
        key: b"\0".to_vec(),
        range_end: b"\0".to_vec(),
        serializable: true,
        ..Default::default()
    }
}

fn answer(revision: i64, kvs: Vec<KeyValue>, count: i64, more: bool) -> ReadOutcome {
    ReadOutcome::Answer(RangeResponse {
        header: Some(ResponseHeader {
            revision,
            ..Default::default()
        }),
        kvs,
        count,
        more,
    })
}

fn read(client: &str, at: f64, request: RangeRequest, outcome: ReadOutcome) -> ReadLog {
    ReadLog {
        client: client.into(),
        started: secs(at),
        finished: secs(at + 0.05),
        request,
        outcome,
    }
}

/// Correct answers at revisions 3, 4 and 6 with every option the cache applies (one of them after the compaction
/// at 5, of a revision it discarded).
fn good_reads() -> Vec<ReadLog> {
    let keys_only = |kv: KeyValue| KeyValue {
        value: Default::default(),
        ..kv
    };
    vec![
        read(
            "r",
            3.1,
            everything(),
            answer(4, vec![a2(), b1()], 2, false),
        ),
        read(
            "r",
            3.2,
            RangeRequest {
                limit: 1,
                ..everything()
            },
            answer(4, vec![a2()], 2, true),
        ),
        // etcd's count_only returns no keys, so the limit cuts nothing: `more` is false.
        read(
            "r",
            3.3,
            RangeRequest {
                limit: 1,
                count_only: true,
                ..everything()
            },
            answer(4, vec![], 2, false),
        ),
        read(
            "r",
            3.4,
            RangeRequest {
                min_mod_revision: 4,
                ..everything()
            },
            answer(4, vec![a2()], 2, false),
        ),
        read(
            "s",
            2.5,
            RangeRequest {
                keys_only: true,
                ..everything()
            },
            answer(3, vec![keys_only(a1()), keys_only(b1())], 2, false),
        ),
        read(
            "s",
            5.1,
            RangeRequest {
                sort_order: SortOrder::Descend as i32,
                limit: 1,
                ..everything()
            },
            answer(6, vec![c1()], 2, true),
        ),
        read(
            "s",
            5.2,
            RangeRequest {
                sort_target: SortTarget::Mod as i32,
                ..everything()
            },
            answer(6, vec![b1(), c1()], 2, false),
        ),
        // A copy that had no event since revision 6 answers after the compaction at 5.
        read(
            "t",
            5.8,
            RangeRequest {
                key: b"c".to_vec(),
                range_end: Vec::new(),
                ..everything()
            },
            answer(6, vec![c1()], 1, false),
        ),
        read(
            "t",
            5.9,
            RangeRequest {
                serializable: false,
                ..everything()
            },
            answer(6, vec![b1(), c1()], 2, false),
        ),
    ]
}

#[test]
fn cache_answers_checker_accepts_the_models_state_with_etcds_options() {
    let timeline = Timeline::new(&cache_history());
    assert_eq!(
        check_answers(&timeline, &good_reads()),
        Vec::<String>::new()
    );
    assert_eq!(check_monotonic(&good_reads()), Vec::<String>::new());
}

#[test]
fn cache_answers_checker_catches_stale_answers_wrong_counts_and_future_revisions() {
    let timeline = Timeline::new(&cache_history());
    let bad = [
        // A stale copy: a=1 (revision 2) presented as the state at 4.
        read(
            "r",
            3.5,
            everything(),
            answer(4, vec![a1(), b1()], 2, false),
        ),
        // A copy that missed the delete at 5 (a compaction overtook its watcher) and moved on with c's event.
        read(
            "r",
            5.7,
            everything(),
            answer(6, vec![a2(), b1(), c1()], 3, false),
        ),
        // Wrong count, and `more` where etcd cuts nothing (count_only): the model's former reading.
        read(
            "r",
            3.6,
            everything(),
            answer(4, vec![a2(), b1()], 3, false),
        ),
        read(
            "r",
            3.7,
            RangeRequest {
                limit: 1,
                count_only: true,
                ..everything()
            },
            answer(4, vec![], 2, true),
        ),
        // keys_only with the values still there; a filter not applied.
        read(
            "r",
            3.8,
            RangeRequest {
                keys_only: true,
                ..everything()
            },
            answer(4, vec![a2(), b1()], 2, false),
        ),
        read(
            "r",
            3.9,
            RangeRequest {
                min_mod_revision: 4,
                ..everything()
            },
            answer(4, vec![a2(), b1()], 2, false),
        ),
        // Revision 6 was committed at 5 s: an answer at 4.5 s cannot hold it.
        read(
            "r",
            4.4,
            everything(),
            answer(6, vec![b1(), c1()], 2, false),
        ),
        read(
            "r",
            4.6,
            everything(),
            ReadOutcome::Answer(RangeResponse::default()),
        ),
    ];
    let violations = check_answers(&timeline, &bad);
    assert_eq!(violations.len(), bad.len(), "{violations:#?}");
    assert!(violations[0].contains("a=1@2"), "{}", violations[0]);
    assert!(
        violations[6].contains("committed only through 5"),
        "{}",
        violations[6]
    );
    // The stale answer at a revision the compaction discarded says so.
    let compacted = read(
        "r",
        5.7,
        everything(),
        answer(4, vec![a1(), b1()], 2, false),
    );
    let violations = check_answers(&timeline, &[compacted]);
    assert!(violations[0].contains("compacted at 5"), "{violations:?}");
}

#[test]
fn cache_monotonic_checker_catches_a_client_going_back_in_revision() {
    let at = |client: &str, time: f64, revision: i64| {
        read(
            client,
            time,
            everything(),
            answer(revision, vec![], 0, false),
        )
    };
    let failed = read(
        "r",
        1.5,
        everything(),
        ReadOutcome::Failed {
            code: Code::Unavailable,
            message: "x".into(),
        },
    );
    // Another client may be behind; a failed read has no revision.
    let good = [
        at("r", 1.0, 4),
        at("s", 1.1, 3),
        failed,
        at("r", 2.0, 4),
        at("r", 3.0, 6),
    ];
    assert!(check_monotonic(&good).is_empty());
    let back = [
        at("r", 1.0, 4),
        at("r", 2.0, 6),
        at("s", 2.1, 3),
        at("r", 3.0, 5),
        at("r", 4.0, 5),
    ];
    let violations = check_monotonic(&back);
    // Both answers at 5 come after the answer at 6.
    assert_eq!(violations.len(), 2, "{violations:#?}");
    assert!(
        violations[0].contains("went backwards"),
        "{}",
        violations[0]
    );
}

#[test]
fn cache_linearizable_checker_catches_an_answer_missing_an_acknowledged_write() {
    let write = AckedWrite {
        writer: "w".into(),
        what: "put c".into(),
        ranges: vec![(b"c".to_vec(), Vec::new())],
        revision: 6,
        started: secs(4.9),
        acked: secs(5.1),
    };
    let linearizable = |key: &str, at: f64, revision: i64, kvs: Vec<KeyValue>| {
        let request = RangeRequest {
            key: key.as_bytes().to_vec(),
            serializable: false,
            ..Default::default()
        };
        let count = kvs.len() as i64;
        read("r", at, request, answer(revision, kvs, count, false))
    };
    let good = [
        // Started before the acknowledgement: it may or may not see the write.
        linearizable("c", 5.0, 5, vec![]),
        linearizable("c", 5.2, 6, vec![c1()]),
        // A serializable answer may be older.
        read("r", 5.3, everything(), answer(5, vec![b1()], 1, false)),
    ];
    assert!(check_linearizable(&good, std::slice::from_ref(&write)).is_empty());
    let bad = [
        // The shared answer of a read sent before the write, handed to a read that started after it.
        linearizable("c", 5.2, 5, vec![]),
        // A write on another key acknowledged before the read started is still before it.
        linearizable("b", 5.3, 5, vec![b1()]),
    ];
    let violations = check_linearizable(&bad, std::slice::from_ref(&write));
    assert_eq!(violations.len(), 2, "{violations:#?}");
    assert!(
        violations[0].contains("on the read's range"),
        "{}",
        violations[0]
    );
    assert!(violations[1].contains("elsewhere"), "{}", violations[1]);
}

#[test]
fn cache_coverage_checker_fails_a_run_that_checked_too_little_or_never_hit_the_cache() {
    let minimums = Minimums {
        serializable: 5,
        linearizable: 1,
        cache_hits: 1,
        compactions: 1,
    };
    let metrics = CacheMetrics {
        scrapes: 3,
        hits: 4,
        misses: 2,
    };
    let history = cache_history();
    let verdict = check_cache(&history, &good_reads(), &[], Some(&metrics), &minimums);
    assert_eq!(verdict.violations, Vec::<String>::new());
    assert_eq!(verdict.summary.serializable_answers, 8);
    assert_eq!(verdict.summary.linearizable_answers, 1);
    assert_eq!(verdict.summary.compactions_during_reads, 1);
    // No read at all: nothing was checked, no compaction overlapped a read.
    let verdict = check_cache(&history, &[], &[], Some(&metrics), &minimums);
    assert_eq!(verdict.violations.len(), 3, "{:#?}", verdict.violations);
    // Every read went to etcd (no hit), or /metrics was never read.
    let missed = CacheMetrics {
        hits: 0,
        ..metrics.clone()
    };
    let verdict = check_cache(&history, &good_reads(), &[], Some(&missed), &minimums);
    assert_eq!(verdict.violations.len(), 1);
    assert!(verdict.violations[0].contains("did not exercise the cache"));
    let verdict = check_cache(&history, &good_reads(), &[], None, &minimums);
    assert_eq!(verdict.violations, ["the proxy's /metrics was never read"]);
}

#[test]
fn cache_hits_are_summed_over_proxy_restarts() {
    let mut metrics = CacheMetrics::default();
    metrics.observe(None, (3, 1));
    metrics.observe(Some((3, 1)), (5, 2));
    // The counters fell: a new proxy process, which counted these from zero.
    metrics.observe(Some((5, 2)), (1, 4));
    assert_eq!((metrics.scrapes, metrics.hits, metrics.misses), (3, 6, 6));
}

/// The auth scenario's users, on a model cluster: alice may read `k/`..`k0`.
fn auth_cluster() -> sim::model::Cluster {
    let cluster = sim::model::Cluster::new(3, 1);
    sim::scenario::auth::set_up(&cluster);
    cluster
}

fn alices(key: &str, range_end: &str, end: WatchEnd, received: Vec<Event>) -> WatcherLog {
    let mut log = watcher(received);
    log.caller = Some("alice".into());
    log.key = key.into();
    log.range_end = range_end.into();
    log.end = end;
    log
}

#[test]
fn a_forbidden_watcher_must_be_refused_with_etcds_reason_and_receive_nothing() {
    use sim::check::auth::{PERMISSION_DENIED_REASON, check_forbidden_watcher, permitted};
    let cluster = auth_cluster();
    let refused = || WatchEnd::Refused {
        reason: PERMISSION_DENIED_REASON.into(),
    };
    // Every key from "\0" on: alice may not read it all.
    let forbidden = alices("\0", "\0", refused(), Vec::new());
    assert!(!permitted(&cluster, &forbidden));
    assert_eq!(check_forbidden_watcher(&forbidden), Ok(()));
    // It received events: a leak.
    let history = kv_history();
    let leaked = alices("\0", "\0", refused(), all_events(&history));
    assert!(check_forbidden_watcher(&leaked).is_err());
    // Never refused (the run ended before anything came, or it was served): not checked, so a violation.
    for end in [WatchEnd::Unconfirmed, WatchEnd::CompleteThrough(6)] {
        assert!(check_forbidden_watcher(&alices("\0", "\0", end, Vec::new())).is_err());
    }
    // Refused for another reason (an invalid token): not the refusal etcd gives a forbidden watcher.
    let other = WatchEnd::Refused {
        reason: "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token".into(),
    };
    assert!(check_forbidden_watcher(&alices("\0", "\0", other, Vec::new())).is_err());
    // Her own prefix is permitted, and checked as any watcher; without a caller, nothing is forbidden.
    assert!(permitted(
        &cluster,
        &alices("k/", "k0", refused(), Vec::new())
    ));
    assert!(permitted(&cluster, &watcher(Vec::new())));
}

/// etcd 3.5.30 (the model) lets alice watch from `k/4` on, checking `k/4` alone; she may not read every key from
/// there on, so the checker holds the proxy to refusing it (GHSA-xg4h-6gfc-h4m8), and a run must have watchers of
/// both kinds.
#[test]
fn a_watch_from_a_key_on_is_judged_on_every_key_it_covers_and_a_run_needs_both_kinds() {
    use sim::check::auth::{check_both_kinds, permitted};
    let cluster = auth_cluster();
    let from_k4 = alices("k/4", "\0", WatchEnd::Unconfirmed, Vec::new());
    assert!(!permitted(&cluster, &from_k4));
    assert_eq!(check_both_kinds(2, 1), Ok(()));
    assert!(check_both_kinds(3, 0).is_err());
    assert!(check_both_kinds(0, 3).is_err());
}

/// A read by `user` of `key`..`range_end` at `at` seconds, answered with nothing at revision 1 (the model's state
/// there: `kv_history` writes from revision 2), or failed with `code`.
fn user_read(
    user: &str,
    key: &str,
    range_end: &str,
    at: f64,
    failed: Option<Code>,
) -> sim::check::auth::UserRead {
    use proto::etcdserverpb::{RangeResponse, ResponseHeader};
    use sim::check::cache::{ReadLog, ReadOutcome};
    let outcome = match failed {
        None => ReadOutcome::Answer(RangeResponse {
            header: Some(ResponseHeader {
                revision: 1,
                ..Default::default()
            }),
            ..Default::default()
        }),
        Some(code) => ReadOutcome::Failed {
            code,
            message: match code {
                Code::PermissionDenied => "etcdserver: permission denied".into(),
                _ => "etcdserver: invalid auth token".into(),
            },
        },
    };
    sim::check::auth::UserRead {
        user: user.into(),
        read: ReadLog {
            client: format!("{user}-reader"),
            started: secs(at),
            finished: secs(at + 0.01),
            request: RangeRequest {
                key: key.into(),
                range_end: range_end.into(),
                serializable: true,
                ..Default::default()
            },
            outcome,
        },
    }
}

#[test]
fn a_forbidden_read_is_never_answered_even_after_another_users_read_of_it_was() {
    use sim::check::auth::check_reads;
    let cluster = auth_cluster();
    let history = kv_history();
    // Alice reads her prefix (answered, at a revision where it is empty) five times; bob, who may not read it,
    // is refused five times after.
    let mut reads: Vec<_> = (0..5)
        .map(|i| user_read("alice", "k/", "k0", 0.001 * f64::from(i), None))
        .collect();
    reads.extend((0..5).map(|i| {
        user_read(
            "bob",
            "k/",
            "k0",
            0.1 + 0.001 * f64::from(i),
            Some(Code::PermissionDenied),
        )
    }));
    assert_eq!(
        check_reads(&cluster, &history, &reads),
        Vec::<String>::new()
    );
    // One of bob's reads answered (from a copy alice's reads filled): a leak.
    let mut leaked = reads.clone();
    leaked.push(user_read("bob", "k/", "k0", 0.2, None));
    let violations = check_reads(&cluster, &history, &leaked);
    assert!(
        violations.iter().any(|v| v.contains("may not read")),
        "{violations:?}"
    );
    // Refusals for an invalid token leak nothing, but do not count: too little was checked.
    let mut expired = reads[..5].to_vec();
    expired.extend((0..5).map(|i| {
        user_read(
            "bob",
            "k/",
            "k0",
            0.1 + 0.001 * f64::from(i),
            Some(Code::Unauthenticated),
        )
    }));
    let violations = check_reads(&cluster, &history, &expired);
    assert!(
        violations.iter().any(|v| v.contains("too little checked")),
        "{violations:?}"
    );
}
