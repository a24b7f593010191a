//! Watch completeness and revision lag.
//!
//! A client watcher's log is everything it received, across every stream it had to re-open. It must hold exactly
//! the model's events on its range from its start revision through the revision it last knew to be complete, in
//! order, with no gap and no duplicate. A watcher created without a start revision starts after the revision its
//! Created response reported; the lag is how far that report was behind the model when the watcher was created.

use proto::mvccpb::Event;
use proto::mvccpb::event::EventType;

use crate::model::History;
use crate::model::keyspace::KeyRange;

/// How a watcher chose where to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// Asked for this revision.
    Revision(i64),
    /// Asked for "now" when the model was at `model_revision`; the Created response reported `reported`, so the
    /// watcher starts at `reported + 1`.
    Current { model_revision: i64, reported: i64 },
}

impl WatchStart {
    pub fn first_revision(&self) -> i64 {
        match self {
            Self::Revision(revision) => *revision,
            Self::Current { reported, .. } => reported + 1,
        }
    }

    /// The model revision at creation minus the revision the watcher was told it starts after.
    pub fn lag(&self) -> Option<i64> {
        match self {
            Self::Revision(_) => None,
            Self::Current {
                model_revision,
                reported,
            } => Some(model_revision - reported),
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
    pub no_delete: bool,
    pub start: Option<WatchStart>,
    pub received: Vec<Event>,
    pub end: WatchEnd,
}

/// Checks one watcher against the history. `Ok` carries nothing; the lag is checked separately.
pub fn check_watcher(history: &History, log: &WatcherLog) -> Result<(), String> {
    let Some(start) = &log.start else {
        return match log.end {
            WatchEnd::Unconfirmed if log.received.is_empty() => Ok(()),
            _ => Err(format!(
                "{}: events or an end without a Created response",
                log.name
            )),
        };
    };
    let first = start.first_revision();
    let through = match &log.end {
        WatchEnd::CompleteThrough(revision) => *revision,
        WatchEnd::Cancelled {
            reason,
            compact_revision,
        } => {
            if reason.is_empty() && *compact_revision == 0 {
                return Err(format!("{}: cancelled without a reason", log.name));
            }
            // Everything received before the cancel must still be right.
            log.received
                .last()
                .map_or(first - 1, |e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision))
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
        .map(|e| {
            let mut e = e.clone();
            if !log.prev_kv {
                e.prev_kv = None;
            }
            e
        })
        .collect();
    compare_events(&log.name, &expected, &log.received)
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
