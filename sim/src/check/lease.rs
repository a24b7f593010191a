//! Lease keep-alive: fan-out towards etcd, no early expiry, and prompt expiry once a client stops.

use std::time::Duration;

use crate::model::{History, LeaseEnd, StreamKind, StreamRecord};

/// Whether the proxy coalesces keep-alive streams: it does, so all client streams of one proxy share one
/// upstream stream (without coalescing the bound would be one upstream stream per client stream).
pub const KEEPALIVE_STREAMS_COALESCED: bool = true;

/// Requests a member receives on a stream the proxy has already left behind: messages sent before the proxy
/// moved to another stream, delivered late because the link held them or was slow. A member sees them arrive, but
/// the proxy sent them while that stream was its only one, so the last `DELIVERY_SLACK` of a stream's requests do
/// not count as use. A second stream used in parallel for longer than this is still caught.
pub const DELIVERY_SLACK: Duration = Duration::from_secs(1);

/// How long past its client's stop a lease may live beyond TTL: one keep-alive interval. The client's last
/// request was sent before the stop but renews the lease only when it reaches the member (as etcd renews on
/// arrival), which a held or slow link delays; and etcd itself promises no sooner expiry, since its lessor looks
/// for expired leases every 500 ms. What this hides, shown by a checker test: a renewal the proxy made by itself
/// within one interval of the stop.
pub fn expiry_slack(log: &LeaseClientLog) -> Duration {
    log.interval
}

/// How many upstream keep-alive streams `clients` client streams through one proxy may cause at the same time.
pub fn expected_upstream_keepalive_streams(clients: usize) -> usize {
    if KEEPALIVE_STREAMS_COALESCED {
        1
    } else {
        clients
    }
}

/// One client's use of its lease.
#[derive(Clone, Debug)]
pub struct LeaseClientLog {
    pub client: String,
    pub lease: i64,
    pub ttl: Duration,
    pub interval: Duration,
    /// When the client stopped keeping the lease alive; `None` if it kept it alive to the end of its run.
    pub stopped_at: Option<Duration>,
    /// When the client last asked to renew the lease (`None`: never). etcd keeps a lease at least TTL past a
    /// renewal, so a lease kept alive to the end of its client's run may expire TTL after this, while the world
    /// runs on (the proxy's shutdown, the wait for its tasks).
    pub last_request_at: Option<Duration>,
}

/// Checks the lease invariants. `run_end` is the virtual time the run ended.
pub fn check_leases(
    history: &History,
    logs: &[LeaseClientLog],
    max_upstream_streams: usize,
    run_end: Duration,
) -> Vec<String> {
    let mut violations = Vec::new();
    let in_use = history
        .streams
        .iter()
        .filter(|s| s.kind == StreamKind::LeaseKeepAlive)
        // A stream the member saw opened, sent to and closed at one instant had been given up by the proxy before
        // the member read any of it (a held link released, a hung member resumed, delivers it all at once); an
        // answer and a close take a round trip, so a stream the proxy used lives longer than an instant.
        .filter(|s| s.closed_at != Some(s.opened_at))
        .filter(|s| !handed_over(s, &history.streams))
        // A stream a stopped proxy instance had sent, which reached the member after the restart.
        .filter(|s| !history.sent_by_a_stopped_proxy(s))
        .filter_map(|s| {
            // A stream's first requests that the member read as a hang or a held link ended were sent before,
            // while the stream may still have been the proxy's only one: in use from the start of that wait, or
            // from the start of the proxy instance that sent them, if that was later.
            let first = history
                .arrived_by(s.member, s.first_request_at?)
                .max(history.sender_started(s));
            let last = s.last_request_at?;
            Some((first, last.saturating_sub(DELIVERY_SLACK).max(first)))
        });
    let streams = crate::model::max_overlap(in_use);
    if streams > max_upstream_streams {
        let records: Vec<String> = history
            .streams
            .iter()
            .filter(|s| s.kind == StreamKind::LeaseKeepAlive)
            .map(|s| {
                format!(
                    "member {} connected {:?} opened {:?} requests {:?}..{:?} closed {:?}",
                    s.member,
                    s.connected_at,
                    s.opened_at,
                    s.first_request_at,
                    s.last_request_at,
                    s.closed_at
                )
            })
            .collect();
        violations.push(format!(
            "{streams} upstream keep-alive streams were in use at once (bound {max_upstream_streams}); \
             streams: {records:?}"
        ));
    }
    for log in logs {
        let Some(record) = history.leases.get(&log.lease) else {
            violations.push(format!(
                "{}: lease {} was never granted",
                log.client, log.lease
            ));
            continue;
        };
        match (log.stopped_at, record.ended) {
            (None, Some((at, LeaseEnd::Expired)))
                if log
                    .last_request_at
                    .is_some_and(|last| at >= last + log.ttl) => {}
            (None, Some((at, how))) => violations.push(format!(
                "{}: lease {} ended ({how:?}) at {:.3}s while its client kept it alive (last renewals: {})",
                log.client,
                log.lease,
                at.as_secs_f64(),
                last_renewals(record)
            )),
            (Some(stopped), Some((at, LeaseEnd::Expired))) => {
                let latest = latest_expiry(history, record, log, stopped);
                if at > latest {
                    violations.push(format!(
                        "{}: lease {} expired at {:.3}s, later than stop {:.3}s + TTL + one interval, or TTL \
                         after a renewal sent before that (last renewals: {})",
                        log.client,
                        log.lease,
                        at.as_secs_f64(),
                        stopped.as_secs_f64(),
                        last_renewals(record)
                    ));
                }
                if at < stopped {
                    violations.push(format!(
                        "{}: lease {} expired at {:.3}s, before its client stopped at {:.3}s (last renewals: {})",
                        log.client,
                        log.lease,
                        at.as_secs_f64(),
                        stopped.as_secs_f64(),
                        last_renewals(record)
                    ));
                }
            }
            (Some(stopped), None) if run_end > latest_expiry(history, record, log, stopped) => {
                violations.push(format!(
                    "{}: lease {} still alive at {:.3}s, its client stopped at {:.3}s",
                    log.client,
                    log.lease,
                    run_end.as_secs_f64(),
                    stopped.as_secs_f64()
                ))
            }
            _ => {}
        }
    }
    violations
}

/// Whether `stream` was given up as it opened because the proxy moved to another member: the proxy picked its
/// member while a failover was under way, sent the renewals it owed, and moved a few milliseconds later, sending
/// them again on a stream to the next member. Both reached their members: a member serves a stream's requests
/// until it reads the close, as etcd does. So the member saw `stream` open at about the time the next member saw
/// the new stream open (within the links' jitter), and close within that jitter too. A stream the proxy used lives
/// longer: an answer and a close take a round trip. What this hides, shown by a checker test: a second stream on
/// another member opened together with the one in use and closed within the jitter; the same on one member is
/// caught.
fn handed_over(stream: &StreamRecord, streams: &[StreamRecord]) -> bool {
    let within_jitter = |a: Duration, b: Duration| a.abs_diff(b) <= crate::fault::MAX_JITTER;
    stream
        .closed_at
        .is_some_and(|closed| within_jitter(closed, stream.opened_at))
        && streams.iter().any(|next| {
            next.kind == StreamKind::LeaseKeepAlive
                && next.member != stream.member
                && within_jitter(next.opened_at, stream.opened_at)
        })
}

/// The latest a lease whose client stopped at `stopped` may expire: TTL and the slack after the stop, or TTL after
/// a renewal a member read as it resumed from a hang (or as its held link was released), if that renewal had
/// arrived by the stop and the slack: etcd renews when it reads a request, and a stopped member reads what was sent
/// to it while it was stopped only once it runs again (as real etcd would, after SIGCONT), as a member reads what
/// its link held only once the link delivers it.
fn latest_expiry(
    history: &History,
    record: &crate::model::LeaseRecord,
    log: &LeaseClientLog,
    stopped: Duration,
) -> Duration {
    // A new leader renewed every live lease for TTL and an election timeout (etcd's lessor does on promotion),
    // whenever it was elected: just before the stop, that outlasts the stop's own bound.
    let promoted = history
        .elections
        .iter()
        .filter(|&&at| record.ended.is_none_or(|(end, _)| at <= end))
        .map(|&at| at + log.ttl + crate::model::ELECTION_TIMEOUT)
        .max();
    let latest = (stopped + log.ttl + expiry_slack(log)).max(promoted.unwrap_or_default());
    let late_read = record.keep_alives.last().filter(|&&(at, member)| {
        at > stopped && history.arrived_by(member, at) <= stopped + expiry_slack(log)
    });
    match late_read {
        Some(&(at, _)) => latest.max(at + log.ttl),
        None => latest,
    }
}

/// The last few renewals of a lease as `time@member`, for a violation's message.
fn last_renewals(record: &crate::model::LeaseRecord) -> String {
    let shown: Vec<String> = record
        .keep_alives
        .iter()
        .rev()
        .take(4)
        .rev()
        .map(|(at, member)| format!("{:.3}s@m{member}", at.as_secs_f64()))
        .collect();
    if shown.is_empty() {
        "none".into()
    } else {
        shown.join(", ")
    }
}
