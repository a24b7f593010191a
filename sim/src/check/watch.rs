//! Watch completeness and revision lag.
//!
//! A client watcher's log is everything it received, across every stream it had to re-open. It must hold exactly
//! the model's events on its range from its start revision through the revision it last knew to be complete, in
//! order, with no gap and no duplicate. A watcher created without a start revision starts after the revision its
//! Created response reported; the lag is how far that report was behind the model when the watcher was created.
//! A progress notification at revision R promises the watcher has every event through R: the events received
//! before it must be exactly the expected ones through R.
//!
//! Delivery is timely too: a watcher gets each event within a bound of the later of its commit and the healing of
//! the last fault ([`check_delivery`]); completeness alone would pass an event that came seconds late.

use std::time::Duration;

use proto::mvccpb::Event;
use proto::mvccpb::event::EventType;

use crate::model::History;
use crate::model::keyspace::KeyRange;

/// How a watcher chose where to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// Asked for this revision.
    Revision(i64),
    /// Asked for "now" when every member had applied at least `applied` (the model's revision, unless a member
    /// was cut off from the others: etcd's member reports the revision it has applied, and so would a watcher
    /// created on it directly); the Created response reported `reported`, so the watcher starts at
    /// `reported + 1`.
    Current { applied: i64, reported: i64 },
}

impl WatchStart {
    pub fn first_revision(&self) -> i64 {
        match self {
            Self::Revision(revision) => *revision,
            Self::Current { reported, .. } => reported + 1,
        }
    }

    /// The revision every member had applied at creation minus the revision the watcher was told it starts after.
    pub fn lag(&self) -> Option<i64> {
        match self {
            Self::Revision(_) => None,
            Self::Current { applied, reported } => Some(applied - reported),
        }
    }
}

/// How a watcher's observation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEnd {
    /// It saw everything through this revision (the run's final revision).
    CompleteThrough(i64),
    /// The server cancelled it, saying why (compaction sets `compact_revision`).
    Cancelled {
        reason: String,
        compact_revision: i64,
    },
    /// Its client cancelled it (what it received until then must still be right).
    CancelledByClient,
    /// The server refused to create it (watch ID -1); the scenarios only send valid creates.
    Refused { reason: String },
    /// The run ended before the watcher could confirm anything (for example it never got a Created response).
    Unconfirmed,
}

/// What one client watcher observed.
#[derive(Clone, Debug)]
pub struct WatcherLog {
    pub name: String,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub prev_kv: bool,
    pub no_put: bool,
    pub no_delete: bool,
    /// Under auth: the user who watched.
    pub caller: Option<String>,
    pub start: Option<WatchStart>,
    pub received: Vec<Event>,
    /// When each event of `received` reached the client (virtual time).
    pub received_at: Vec<Duration>,
    /// Progress notifications: how many events had been received when one came, and its header revision.
    pub progress: Vec<(usize, i64)>,
    /// What the client saw wrong with the protocol (a Created answer with another watch ID than asked for, ...).
    pub problems: Vec<String>,
    pub end: WatchEnd,
}

/// Checks one watcher against the history. `Ok` carries nothing; the lag is checked separately.
pub fn check_watcher(history: &History, log: &WatcherLog) -> Result<(), String> {
    if let Some(problem) = log.problems.first() {
        return Err(format!("{}: {problem}", log.name));
    }
    let Some(start) = &log.start else {
        if let WatchEnd::Refused { reason } = &log.end {
            return Err(format!(
                "{}: a valid create was refused: {reason:?}",
                log.name
            ));
        }
        // Every fault plan keeps a member reachable and heals before the quiet period, so a watcher the proxy
        // never created is a failure, not a run that proved nothing.
        return Err(match log.end {
            WatchEnd::Unconfirmed if log.received.is_empty() => format!(
                "{}: never created (no Created response before the run gave up, with a member reachable)",
                log.name
            ),
            _ => format!("{}: events or an end without a Created response", log.name),
        });
    };
    let first = start.first_revision();
    let through = match &log.end {
        // Events after the revision it waited for (writes go on after the fence in some scenarios: leases expire)
        // are checked too, through the last one received: events come in order, so none before it may be missing.
        WatchEnd::CompleteThrough(revision) => (*revision).max(last_received(log, first)),
        WatchEnd::Cancelled {
            reason,
            compact_revision,
        } => {
            // The model cancels a created watcher only for a compaction (etcd also does for auth and leader
            // loss, which the model does not simulate): any other cancel was made up on the way.
            if *compact_revision == 0 {
                return Err(if reason.is_empty() {
                    format!("{}: cancelled without a reason", log.name)
                } else {
                    format!(
                        "{}: cancelled with {reason:?}, a reason the model never gives (it cancels only for a \
                         compaction)",
                        log.name
                    )
                });
            }
            check_compaction_cancel(history, log, first, *compact_revision)?;
            // Everything received before the cancel must still be right.
            last_received(log, first)
        }
        WatchEnd::CancelledByClient => last_received(log, first),
        WatchEnd::Refused { reason } => {
            return Err(format!(
                "{}: refused after it was created: {reason:?}",
                log.name
            ));
        }
        WatchEnd::Unconfirmed => {
            return Err(format!(
                "{}: never confirmed it was complete (no final event, no cancel)",
                log.name
            ));
        }
    };
    let range = KeyRange::new(&log.key, &log.range_end);
    let expected: Vec<Event> = history
        .events_between(first, through)
        .filter(|e| e.kv.as_ref().is_some_and(|kv| range.contains(&kv.key)))
        .filter(|e| !(log.no_delete && e.r#type == EventType::Delete as i32))
        .filter(|e| !(log.no_put && e.r#type == EventType::Put as i32))
        .map(|e| {
            let mut e = e.clone();
            if !log.prev_kv {
                e.prev_kv = None;
            }
            e
        })
        .collect();
    compare_events(&log.name, &expected, &log.received)?;
    check_progress(log, &expected, through)
}

/// The revision of the last event received (`first - 1` if none).
/// A compaction cancel must be the model's: a revision the model compacted at, past the next revision the watcher
/// still needed (etcd cancels a watcher only when that revision is gone: `minRev < compactRev`). One that is not
/// handed this client another watcher's cancel, or made one up.
fn check_compaction_cancel(
    history: &History,
    log: &WatcherLog,
    first: i64,
    compact_revision: i64,
) -> Result<(), String> {
    if !history
        .compactions
        .iter()
        .any(|&(_, r)| r == compact_revision)
    {
        return Err(format!(
            "{}: cancelled for a compaction at {compact_revision}, which the model never made",
            log.name
        ));
    }
    let next = last_received(log, first) + 1;
    if next >= compact_revision {
        return Err(format!(
            "{}: cancelled for the compaction at {compact_revision} although it needed only revisions from {next} on, \
             which the compaction kept",
            log.name
        ));
    }
    Ok(())
}

fn last_received(log: &WatcherLog, first: i64) -> i64 {
    log.received
        .last()
        .map_or(first - 1, |e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision))
}

fn revision_of(event: &Event) -> i64 {
    event.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

/// Every progress notification at a revision the check covers came after exactly the expected events through it.
fn check_progress(log: &WatcherLog, expected: &[Event], through: i64) -> Result<(), String> {
    for &(received, revision) in &log.progress {
        if revision > through {
            continue;
        }
        let promised = expected
            .iter()
            .take_while(|e| revision_of(e) <= revision)
            .count();
        if received != promised {
            return Err(format!(
                "{}: a progress notification at revision {revision} came after {received} event(s); \
                 the model has {promised} through that revision",
                log.name
            ));
        }
    }
    Ok(())
}

/// The first difference between the expected and the received events, described for a person.
fn compare_events(name: &str, expected: &[Event], received: &[Event]) -> Result<(), String> {
    let describe = |e: &Event| {
        let kv = e.kv.clone().unwrap_or_default();
        format!(
            "{} {}@{}",
            if e.r#type == EventType::Delete as i32 {
                "DELETE"
            } else {
                "PUT"
            },
            String::from_utf8_lossy(&kv.key),
            kv.mod_revision
        )
    };
    for (index, (want, got)) in expected.iter().zip(received).enumerate() {
        if want != got {
            let duplicate = received[..index].contains(got);
            return Err(format!(
                "{name}: event #{index}: expected {}, received {}{}",
                describe(want),
                describe(got),
                if duplicate { " (a duplicate)" } else { "" }
            ));
        }
    }
    if received.len() > expected.len() {
        return Err(format!(
            "{name}: {} unexpected extra event(s), first {}",
            received.len() - expected.len(),
            describe(&received[expected.len()])
        ));
    }
    if received.len() < expected.len() {
        return Err(format!(
            "{name}: {} event(s) missing, first {}",
            expected.len() - received.len(),
            describe(&expected[received.len()])
        ));
    }
    Ok(())
}

/// The worst lag among the watchers, and an error for each watcher over `bound`.
pub fn check_lag(logs: &[WatcherLog], bound: i64) -> (Option<i64>, Vec<String>) {
    let mut worst = None;
    let mut violations = Vec::new();
    for log in logs {
        if let Some(lag) = log.start.as_ref().and_then(WatchStart::lag) {
            worst = Some(worst.map_or(lag, |w: i64| w.max(lag)));
            if lag > bound {
                violations.push(format!(
                    "{}: started {lag} revisions behind the model (bound {bound})",
                    log.name
                ));
            }
        }
    }
    (worst, violations)
}

/// How late one event reached a watcher: after its commit, or after the last fault healed if that was later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lateness {
    pub late_by: Duration,
    pub revision: i64,
}

/// The latest delivery among the watchers, and an error for each watcher that got an event more than `bound`
/// after the later of its commit and `healed_at` (when the last fault of the plan healed). While a fault lasts an
/// event may wait (a member is down, a link cut); once everything is healed, nothing excuses a wait longer than
/// the proxy needs to notice a dead connection and resume.
pub fn check_delivery(
    history: &History,
    logs: &[WatcherLog],
    healed_at: Duration,
    bound: Duration,
) -> (Option<Lateness>, Vec<String>) {
    let mut worst: Option<Lateness> = None;
    let mut violations = Vec::new();
    for log in logs {
        let mut late: Option<(Lateness, Duration, Duration)> = None;
        for (event, &at) in log.received.iter().zip(&log.received_at) {
            let revision = revision_of(event);
            let Some(committed) = committed_at(history, revision) else {
                // An event the model never committed is the completeness check's to report.
                continue;
            };
            let lateness = Lateness {
                late_by: at.saturating_sub(committed.max(healed_at)),
                revision,
            };
            if late.is_none_or(|(l, _, _)| lateness.late_by > l.late_by) {
                late = Some((lateness, committed, at));
            }
        }
        let Some((lateness, committed, at)) = late else {
            continue;
        };
        worst = worst.max(Some(lateness));
        if lateness.late_by > bound {
            violations.push(format!(
                "{}: the event at revision {} (committed at {:.3}s, faults healed at {:.3}s) arrived at {:.3}s, \
                 {:.3}s late (bound {:.3}s)",
                log.name,
                lateness.revision,
                committed.as_secs_f64(),
                healed_at.as_secs_f64(),
                at.as_secs_f64(),
                lateness.late_by.as_secs_f64(),
                bound.as_secs_f64()
            ));
        }
    }
    (worst, violations)
}

/// When the model committed `revision`.
fn committed_at(history: &History, revision: i64) -> Option<Duration> {
    let index = history
        .revisions
        .binary_search_by_key(&revision, |r| r.revision)
        .ok()?;
    Some(history.revisions[index].at)
}
