//! Failover transparency: while a member is reachable (the fault plans guarantee one always is), no read through
//! the proxy fails, every call completes within a bound, a write fails only with a code that says its outcome is
//! unknown, and every acknowledged write is in the model's history at the revision its response reported.

use std::time::Duration;

use tonic::Code;

use crate::model::History;

/// What kind of call a client made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallKind {
    Read,
    /// A put of `value` to `key` (values are unique per run, so the history shows whether it happened).
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Any other write.
    OtherWrite,
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// Succeeded; the response header's revision.
    Ok {
        revision: i64,
    },
    Failed {
        code: Code,
        message: String,
    },
    /// The client gave up waiting (the call did not complete within the bound).
    TimedOut,
}

/// One call as a client saw it.
#[derive(Clone, Debug)]
pub struct CallLog {
    pub client: String,
    pub what: String,
    pub kind: CallKind,
    pub started: Duration,
    pub finished: Duration,
    pub outcome: CallOutcome,
}

/// Codes with which etcd says a write's outcome is unknown.
pub const OUTCOME_UNKNOWN_CODES: &[Code] = &[Code::Unavailable, Code::DeadlineExceeded];

/// A write failure the checker is told to accept although it is wrong (a known, reported defect): its code and
/// message. Accepted failures are returned separately so that a run still reports them.
pub type ToleratedWriteFailure = (Code, &'static str);

/// What the checker found: violations, and accepted known defects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallVerdict {
    pub violations: Vec<String>,
    pub tolerated: Vec<String>,
}

pub fn check_calls(
    history: &History,
    calls: &[CallLog],
    bound: Duration,
    tolerated: &[ToleratedWriteFailure],
) -> CallVerdict {
    let mut verdict = CallVerdict::default();
    let violations = &mut verdict.violations;
    for call in calls {
        let label = format!(
            "{} {} at {:.3}s",
            call.client,
            call.what,
            call.started.as_secs_f64()
        );
        let took = call.finished.saturating_sub(call.started);
        if call.outcome == CallOutcome::TimedOut || took > bound {
            violations.push(format!("{label}: took {took:?}, over the bound {bound:?}"));
            continue;
        }
        match (&call.kind, &call.outcome) {
            (CallKind::Read, CallOutcome::Failed { code, message }) => violations.push(format!(
                "{label}: a read failed while a member was reachable: {code:?} {message}"
            )),
            (_, CallOutcome::Failed { code, message })
                if tolerated.iter().any(|(c, m)| c == code && m == message) =>
            {
                verdict
                    .tolerated
                    .push(format!("{label}: {code:?} {message} (known defect)"));
            }
            (_, CallOutcome::Failed { code, message }) if !OUTCOME_UNKNOWN_CODES.contains(code) => {
                violations.push(format!(
                    "{label}: a write failed with {code:?} {message}, which does not say its outcome is unknown"
                ))
            }
            (CallKind::Put { key, value }, CallOutcome::Ok { revision }) => {
                let landed = history
                    .events_between(*revision, *revision)
                    .filter_map(|e| e.kv.as_ref())
                    .any(|kv| kv.key == *key && kv.value == *value);
                if !landed {
                    violations.push(format!(
                        "{label}: acknowledged at revision {revision}, but the model has no such put there"
                    ));
                }
            }
            _ => {}
        }
    }
    verdict
}
