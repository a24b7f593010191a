//! What the model remembers for the invariant checkers: every revision's events, every compaction, every lease's
//! life (grant, keep-alives, end), every Watch or LeaseKeepAlive stream a client (the proxy) opened on a member, and
//! every key range a request named (so that a checker can tell a namespaced proxy never reached outside its prefix).
//!
//! Times are virtual (`Duration` since the start of the run), so the history of one seed is the same every run.

use std::collections::BTreeMap;
use std::time::Duration;

use proto::mvccpb::Event;

/// One committed revision: its number, when it was committed and its events in order.
#[derive(Clone, Debug, PartialEq)]
pub struct RevisionRecord {
    pub revision: i64,
    pub at: Duration,
    /// Events carry `prev_kv` always; a watcher that did not ask for it gets it stripped.
    pub events: Vec<Event>,
}

/// How a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEnd {
    Revoked,
    Expired,
}

/// The life of one lease.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseRecord {
    pub id: i64,
    pub granted_ttl: i64,
    pub granted_at: Duration,
    /// Every successful renewal, with the member that served it.
    pub keep_alives: Vec<(Duration, usize)>,
    pub ended: Option<(Duration, LeaseEnd)>,
}

/// Which bidirectional stream kind a client opened on a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StreamKind {
    Watch,
    LeaseKeepAlive,
}

/// One stream a client opened on a member (in the simulation the only client of the members is the proxy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamRecord {
    pub member: usize,
    pub kind: StreamKind,
    pub opened_at: Duration,
    pub closed_at: Option<Duration>,
    /// When the member accepted the connection the stream came on (`None`: not known).
    pub connected_at: Option<Duration>,
    /// When the first and the latest request arrived on it (a stream cut off by a partition stops receiving, even
    /// though the member cannot tell that it is dead).
    pub first_request_at: Option<Duration>,
    pub last_request_at: Option<Duration>,
}

/// What named a key range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AccessKind {
    Range,
    Put,
    DeleteRange,
    /// A compare of a Txn.
    Compare,
    /// A Watch create.
    Watch,
}

/// One key range a request named, as the member received it: recorded before any check, whether or not the
/// request was valid, and for a Txn every compare and every operation of both branches, nested txns included (what
/// the client asked for, not only what ran). Time is virtual, as everywhere in the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyAccess {
    pub at: Duration,
    pub member: usize,
    pub kind: AccessKind,
    pub key: Vec<u8>,
    /// As sent: empty for a single key (always for a Put), `"\0"` for every key from `key` on.
    pub range_end: Vec<u8>,
}

/// A member's process stopped as by SIGSTOP, from `since` until it was `resumed`. Messages it reads at the
/// instant it resumes waited in its sockets: they were sent before, at the latest while it was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hang {
    pub member: usize,
    pub since: Duration,
    pub resumed: Duration,
}

/// The proxy's link with a member held its messages from `since` until it was `released` ([`crate::fault::Fault::Hold`]).
/// Messages the member reads at the instant of the release waited in the link: they were sent before, at the latest
/// while it held them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    pub member: usize,
    pub since: Duration,
    pub released: Duration,
}

/// Everything the model records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    pub revisions: Vec<RevisionRecord>,
    pub compactions: Vec<(Duration, i64)>,
    pub leases: BTreeMap<i64, LeaseRecord>,
    pub streams: Vec<StreamRecord>,
    pub accesses: Vec<KeyAccess>,
    pub hangs: Vec<Hang>,
    pub holds: Vec<Hold>,
    /// When a new leader was elected (each renewed every lease: [`super::Store::promote_leases`]).
    pub elections: Vec<Duration>,
    /// When the proxy (the members' client) was restarted: streams sent by an instance before its restart may
    /// reach a member after it.
    pub proxy_restarts: Vec<Duration>,
}

impl History {
    /// Records a key range a request read or wrote. A request etcd refuses touches nothing and is not recorded:
    /// etcd checks a whole request (every key of a Txn) before it reads or writes any of it.
    pub fn record_access(
        &mut self,
        at: Duration,
        member: usize,
        kind: AccessKind,
        key: &[u8],
        range_end: &[u8],
    ) {
        self.accesses.push(KeyAccess {
            at,
            member,
            kind,
            key: key.to_vec(),
            range_end: range_end.to_vec(),
        });
    }

    /// The earliest time a message member `member` read at `at` can have arrived: the start of a hang that ended at
    /// `at` (the message waited unread in the member's socket) or of a hold of its link released at `at` (it waited
    /// in the link), else `at`.
    pub fn arrived_by(&self, member: usize, at: Duration) -> Duration {
        let hang = self
            .hangs
            .iter()
            .find(|h| h.member == member && h.resumed == at);
        let hold = self
            .holds
            .iter()
            .find(|h| h.member == member && h.released == at);
        hang.map(|h| h.since)
            .into_iter()
            .chain(hold.map(|h| h.since))
            .min()
            .unwrap_or(at)
    }

    /// Whether `stream` was sent by a proxy instance that had been restarted before the member saw it open: it came
    /// on a connection the member accepted before a restart, and opened after it (late, on a slow link). The
    /// restart had closed that connection; the stream was never in use by the running proxy.
    pub fn sent_by_a_stopped_proxy(&self, stream: &StreamRecord) -> bool {
        stream.connected_at.is_some_and(|connected| {
            self.proxy_restarts
                .iter()
                .any(|&restart| connected <= restart && restart < stream.opened_at)
        })
    }

    /// When the proxy instance that sent `stream` started: the latest restart before the member accepted the
    /// stream's connection (zero, the first instance's start, if none was or the connection is not known). A
    /// stream cannot have been sent before the process that sent it existed.
    pub fn sender_started(&self, stream: &StreamRecord) -> Duration {
        stream
            .connected_at
            .and_then(|connected| {
                self.proxy_restarts
                    .iter()
                    .copied()
                    .filter(|&restart| restart < connected)
                    .max()
            })
            .unwrap_or(Duration::ZERO)
    }

    /// The events of revisions `from..=to`, in order, paired with their revision.
    pub fn events_between(&self, from: i64, to: i64) -> impl Iterator<Item = &Event> + '_ {
        // Revisions are appended in increasing order, so a binary search finds the start.
        let start = self.revisions.partition_point(|r| r.revision < from);
        self.revisions[start..]
            .iter()
            .take_while(move |r| r.revision <= to)
            .flat_map(|r| r.events.iter())
    }

    /// The highest number of streams of `kind` in use at the same time on all members together. A stream is in use
    /// from its first request to its latest one: a member cannot see that a partition killed a stream, but a dead
    /// stream receives no more requests.
    pub fn max_concurrent_streams(&self, kind: StreamKind) -> usize {
        max_overlap(
            self.streams
                .iter()
                .filter(|s| s.kind == kind)
                .filter_map(|s| Some((s.first_request_at?, s.last_request_at?))),
        )
    }
}

/// The largest number of closed intervals `[from, to]` that share an instant.
pub fn max_overlap(intervals: impl Iterator<Item = (Duration, Duration)>) -> usize {
    // +1 at a start, -1 just after an end; at equal times starts count first (the intervals are closed).
    let mut edges: Vec<(Duration, i32)> = Vec::new();
    for (from, to) in intervals {
        edges.push((from, -1));
        edges.push((to, 1));
    }
    // Sorting (time, -1 before +1) puts starts first; the sign is flipped back when counting.
    edges.sort();
    let (mut open, mut max) = (0i32, 0i32);
    for (_, edge) in edges {
        open -= edge;
        max = max.max(open);
    }
    max as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn overlap_counts_intervals_sharing_an_instant() {
        assert_eq!(max_overlap([].into_iter()), 0);
        assert_eq!(
            max_overlap([(secs(1), secs(2)), (secs(3), secs(4))].into_iter()),
            1
        );
        assert_eq!(
            max_overlap([(secs(1), secs(3)), (secs(2), secs(4))].into_iter()),
            2
        );
        // Touching intervals share their end instant.
        assert_eq!(
            max_overlap([(secs(1), secs(2)), (secs(2), secs(4))].into_iter()),
            2
        );
    }
}
