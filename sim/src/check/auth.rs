//! Permissions under auth, for watchers and for reads ([`check_reads`]).
//!
//! Watchers: a client watcher is served exactly when etcd's auth lets its user read every key
//! it watches (as the model's users and roles decide). A permitted watcher is checked like any other
//! ([`super::watch`]); a forbidden one must be refused with etcd's reason and receive nothing. A run must have
//! both kinds, or it proved nothing about admission.
//!
//! "Every key it watches" is the proxy's promise, and etcd's own rule from 3.5.33: etcd before that (the model is
//! 3.5.30) checks a watch from a key on (`range_end` `"\0"`) as the key alone and lets through a watcher that
//! then receives writes to keys its user may not read (GHSA-xg4h-6gfc-h4m8); the proxy checks such a watch on the
//! range it covers and refuses it as etcd refuses any forbidden watch.

use tonic::Code;

use super::cache::{ReadLog, ReadOutcome, Timeline, check_answers, check_monotonic, describe};
use super::watch::{WatchEnd, WatcherLog};
use crate::model::auth::{Access, Caller};
use crate::model::{Cluster, History};

/// The cancel reason of a watcher etcd refuses for want of read permission.
pub const PERMISSION_DENIED_REASON: &str =
    "rpc error: code = PermissionDenied desc = etcdserver: permission denied";

/// Whether `log`'s watcher may watch its range: always without auth or without a user to ask about.
pub fn permitted(cluster: &Cluster, log: &WatcherLog) -> bool {
    let Some(user) = &log.caller else {
        return true;
    };
    may_read(cluster, user, &log.key, &log.range_end)
}

/// Whether `user` may read every key of the watched range `key`..`range_end` (an empty key watches `"\0"`).
pub fn may_read(cluster: &Cluster, user: &str, key: &[u8], range_end: &[u8]) -> bool {
    let key = if key.is_empty() { &[0][..] } else { key };
    let caller = Caller::User(user.to_string());
    cluster.with_auth(|auth, _| {
        !auth.is_enabled() || auth.check(&caller, Access::Read, key, range_end).is_ok()
    })
}

/// A forbidden watcher was refused with etcd's reason and got no event.
pub fn check_forbidden_watcher(log: &WatcherLog) -> Result<(), String> {
    let refused =
        matches!(&log.end, WatchEnd::Refused { reason } if reason == PERMISSION_DENIED_REASON);
    if !refused {
        return Err(format!(
            "{}: may not read its range, but was not refused with {PERMISSION_DENIED_REASON:?}: it ended {:?}",
            log.name, log.end
        ));
    }
    if !log.received.is_empty() {
        return Err(format!(
            "{}: may not read its range, but received {} events",
            log.name,
            log.received.len()
        ));
    }
    Ok(())
}

/// The run had at least one permitted and one forbidden watcher (`counts`: permitted, forbidden).
pub fn check_both_kinds(permitted: usize, forbidden: usize) -> Result<(), String> {
    if permitted == 0 || forbidden == 0 {
        return Err(format!(
            "an auth run needs permitted and forbidden watchers; it had {permitted} permitted and {forbidden} forbidden"
        ));
    }
    Ok(())
}

/// One Range call through the proxy by a user.
#[derive(Clone, Debug, PartialEq)]
pub struct UserRead {
    pub user: String,
    pub read: ReadLog,
}

/// The least an auth run's reads must have shown: answers checked, refusals, and refusals of a range some other
/// user's read (serializable or not: the cache serves both) had been answered for before (what a shared copy in
/// the proxy's cache would leak). Counting only reads of the same consistency, seed 3467 of the first 4096-seed
/// sweep had none.
pub const READ_MINIMUMS: (usize, usize, usize) = (5, 5, 1);

/// Reads under auth: a user's read of a range it may not read all of is never answered (etcd refuses it with
/// "permission denied"; a read may also fail for want of a token or an endpoint, which leaks nothing); a
/// permitted read's answer is the model's state at its revision, and a reader's revisions never go back
/// ([`check_answers`], [`check_monotonic`]). No vacuous pass ([`READ_MINIMUMS`]).
pub fn check_reads(cluster: &Cluster, history: &History, reads: &[UserRead]) -> Vec<String> {
    let mut violations = Vec::new();
    let (permitted, forbidden): (Vec<&UserRead>, Vec<&UserRead>) = reads.iter().partition(|r| {
        may_read(
            cluster,
            &r.user,
            &r.read.request.key,
            &r.read.request.range_end,
        )
    });
    let mut refused = 0;
    let mut refused_after_another_users_answer = 0;
    for read in &forbidden {
        match &read.read.outcome {
            ReadOutcome::Answer(_) => violations.push(format!(
                "{} ({}) may not read {} but was answered",
                read.read.client,
                read.user,
                describe(&read.read.request)
            )),
            ReadOutcome::Failed { code, message }
                if *code == Code::PermissionDenied
                    && message == "etcdserver: permission denied" =>
            {
                refused += 1;
                let answered_before = permitted.iter().any(|other| {
                    other.user != read.user
                        && other.read.finished < read.read.started
                        && other.read.request.key == read.read.request.key
                        && other.read.request.range_end == read.read.request.range_end
                        && matches!(other.read.outcome, ReadOutcome::Answer(_))
                });
                refused_after_another_users_answer += usize::from(answered_before);
            }
            ReadOutcome::Failed { .. } | ReadOutcome::TimedOut => {}
        }
    }
    let permitted: Vec<ReadLog> = permitted.iter().map(|r| r.read.clone()).collect();
    violations.extend(check_answers(&Timeline::new(history), &permitted));
    violations.extend(check_monotonic(&permitted));
    let answered = permitted
        .iter()
        .filter(|r| matches!(r.outcome, ReadOutcome::Answer(_)))
        .count();
    let (min_answered, min_refused, min_after) = READ_MINIMUMS;
    if answered < min_answered
        || refused < min_refused
        || refused_after_another_users_answer < min_after
    {
        violations.push(format!(
            "too little checked: {answered} permitted answers (at least {min_answered}), {refused} refusals (at \
             least {min_refused}), {refused_after_another_users_answer} refusals of a read another user had been \
             answered (at least {min_after})"
        ));
    }
    violations
}
