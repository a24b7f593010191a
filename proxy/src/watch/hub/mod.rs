//! The watch hub: the state machine that maps client watchers (c-watchers) onto shared upstream watchers
//! (s-watchers) on one upstream Watch stream. It is synchronous and does no I/O: the [`actor`](super::actor) feeds
//! it client commands and upstream responses, and sends what it puts in [`Hub::outbox`] upstream.
//!
//! Invariants (the reason each rule below exists):
//! - `s.next_rev`: every event of the s-watcher's range with a lower revision has been received and dispatched.
//! - `c.next_rev >= s.next_rev` for every receiver `c` of `s`; `c` gets only events at or after `c.next_rev`, so
//!   moving `c` to an s-watcher that is *behind* it loses nothing and duplicates nothing (the extra events are
//!   filtered), while moving it to one *ahead* of it would lose events; the hub never does that.
//! - A watcher created without a start revision always gets etcd's own Created answer (a fresh s-watcher, or one
//!   whose create has not been sent yet), so its reported start revision is exact; it is merged into an older
//!   s-watcher on the same range afterwards. With `max_join_lag > 0` it may instead join a running s-watcher at
//!   most that many revisions behind the newest revision the hub has seen.
//! - A cancelled or compacted s-watcher is removed at once and never reused; its receivers are told why.
//! - An s-watcher lives only while it has receivers: when the last goes, it is cancelled on etcd (a create in flight
//!   is cancelled right behind it, etcd handles both in order) and forgotten, even when a whole stream goes at once.
//! - After the upstream stream is lost, every s-watcher is re-created from its `next_rev`: no gap, no duplicate.
//! - Answers to creates leave in the order the creates arrived on their stream (clients match them in order).
//!
//! Its parts, one concern each:
//! - this file: the state, and what clients ask (streams opening and closing, creates that join or merge into
//!   shared s-watchers, cancels);
//! - [`upstream`]: what goes to etcd and what it answers (creates sent, created and ended s-watchers, events
//!   dispatched to their receivers, a lost stream or leader);
//! - [`progress`]: progress requests, from clients and as the actor's liveness probe, and their answers;
//! - [`delivery`]: answers on their way to client streams (in order, within each stream's buffer) and the gauges;
//! - [`slots`]: the answers to a stream's creates waiting for their turn.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    ResponseHeader, WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse,
};
use tokio::sync::mpsc;
use tonic::Status;

use super::filter::{Interest, fragments, select_events};
use crate::metrics::Metrics;
use slots::{Slot, Slots};

mod delivery;
mod progress;
mod slots;
mod upstream;

/// Identifies one client Watch stream within the hub.
pub type StreamId = u64;

/// How often etcd syncs the watchers that are not synced (its `watchResyncPeriod`): a watcher created from a
/// revision etcd has reached is synced within this, unless it has much to catch up on.
pub const ETCD_RESYNC_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);
/// etcd's reply to a create with a watch ID already used on the stream.
pub const DUPLICATE_WATCH_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
/// etcd's reply to a create whose range is empty.
pub const EMPTY_RANGE: &str = "mvcc: watcher range is empty";

/// The sending side of one client stream: answers in order, an out-of-band channel to end it with a status at once,
/// and one to end it with a status after the answers already queued.
pub struct StreamSink {
    pub responses: mpsc::Sender<WatchResponse>,
    pub abort: mpsc::Sender<Status>,
    /// Why the stream ends once its client has read every answer queued before: the hub sends it, then drops
    /// `responses`. A stream whose buffer filled ends this way: a client that reads, but whose catch-up after
    /// re-creating its watchers is larger than the buffer (a proxy in front of this one, after a failover), keeps
    /// the answers it was sent and re-creates its watchers from further on each time. Ended at once, it lost them
    /// and re-created every watcher from where it had been, into the same overflow, for good.
    pub finish: mpsc::Sender<Status>,
    pub requires_leader: bool,
}

struct ClientStream {
    sink: StreamSink,
    watchers: BTreeMap<i64, CWatcher>,
    next_auto_id: i64,
    /// Answers to creates, in the order the creates arrived: an answer known early waits for earlier ones.
    slots: Slots,
}

struct CWatcher {
    sw: i64,
    interest: Interest,
    next_rev: i64,
    /// etcd created the s-watcher for this watcher: its start revision is known and events may flow.
    created: bool,
    /// Its Created answer went out; later responses go straight to the client.
    announced: bool,
    /// The watch ID the client asked for (0: let the server choose): etcd 3.5 answers a refused create with it.
    requested_id: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The create has not been sent on the current upstream stream yet.
    Unsent,
    /// The create was sent; etcd has not answered it yet.
    Creating,
    /// etcd created it; events flow.
    Running,
}

struct SWatcher {
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// 0 for "from the current revision" (until created); else the revision to start (or resume) from.
    start_rev: i64,
    next_rev: i64,
    phase: Phase,
    /// Created for a request the hub does not share (a negative start revision): etcd answers it as it is.
    private: bool,
    /// etcd refused its create and the hub is retrying it with a fresh proxy token (see `HubConfig::own_identity`).
    refused_once: bool,
    /// etcd can no longer cancel it for compaction: it started at etcd's current revision or later, or etcd has sent
    /// it a progress notification (sent only to watchers that have caught up). Until then it may still be ended by
    /// a compaction of its start, so no other watcher joins it or is merged into it.
    synced: bool,
    /// The start revision its create carried: `start_rev`, or an earlier one (see [`Hub::flush_creates`]).
    sent_start: i64,
    receivers: BTreeSet<(StreamId, i64)>,
}

/// Settings of the hub.
#[derive(Clone, Copy, Debug)]
pub struct HubConfig {
    /// A watcher without start revision may join a running s-watcher at most this many revisions behind.
    pub max_join_lag: i64,
    /// Responses larger than this are fragmented for watchers that asked for it.
    pub fragment_limit: usize,
    /// The upstream stream carries the proxy's own token (`--user`), and callers were admitted by a check of their
    /// own token: a refused create (etcd refuses creates only for want of permission or a valid token; the hub
    /// never sends a duplicate ID, and invalid ranges are matched apart) means the proxy's token went stale, so it
    /// is retried once on a stream with a fresh token before its receivers are told.
    pub own_identity: bool,
    /// Bytes `--namespace` takes off every key before a client sees it: fragments are sized as clients get them.
    pub hidden_prefix: usize,
}

/// See the module documentation.
pub struct Hub {
    config: HubConfig,
    metrics: Metrics,
    streams: BTreeMap<StreamId, ClientStream>,
    swatchers: BTreeMap<i64, SWatcher>,
    ranges: BTreeMap<(Vec<u8>, Vec<u8>), BTreeSet<i64>>,
    next_sw_id: i64,
    latest_header: ResponseHeader,
    /// Streams that asked for progress, waiting for etcd's progress answer.
    progress_waiters: BTreeSet<StreamId>,
    progress_in_flight: bool,
    /// The upstream watchers etcd had when the request in flight reached it: when all of them are gone, etcd may
    /// never answer it.
    progress_covers: BTreeSet<i64>,
    /// Whether the request in flight reached etcd while one of the stream's watchers may not have been synced yet
    /// (one created from a revision etcd had reached, or catching up): etcd from 3.5.13 drops such a request, and
    /// syncs the watcher within its resync period ([`ETCD_RESYNC_PERIOD`]), so the actor asks again after that.
    progress_maybe_dropped: bool,
    /// Whether the member behind answers a progress request on a stream without watchers (etcd before 3.5.8); the
    /// actor sets it from the member's version each time it opens an upstream stream.
    answers_idle_progress: bool,
    /// Streams of creates with an invalid range, sent as they are; etcd answers each with watch ID -1, in order.
    invalid_creates: VecDeque<StreamId>,
    /// Creates sent on the current stream and not answered yet, in order (`None`: an invalid-range create). etcd
    /// answers creates in order, and a refused create is answered with watch ID -1, so order is what matches them.
    creates_in_flight: VecDeque<Option<i64>>,
    /// Creates etcd has answered on any stream, ever: the actor watches it move while creates are in flight.
    creates_answered: u64,
    /// etcd refused a create and it is to be retried with a fresh proxy token.
    token_refused: bool,
    /// Requests to send upstream.
    pub outbox: Vec<WatchRequest>,
    /// Client watchers of every stream (kept as a count: summing them per response would cost O(streams)).
    client_watchers: i64,
    /// This hub's share of the watcher gauges (client watchers, upstream watchers), last reported.
    reported: (i64, i64),
}

impl Hub {
    pub fn new(config: HubConfig, metrics: Metrics) -> Self {
        Self {
            config,
            metrics,
            streams: BTreeMap::new(),
            swatchers: BTreeMap::new(),
            ranges: BTreeMap::new(),
            next_sw_id: 1,
            latest_header: ResponseHeader::default(),
            progress_waiters: BTreeSet::new(),
            progress_in_flight: false,
            progress_covers: BTreeSet::new(),
            progress_maybe_dropped: false,
            answers_idle_progress: true,
            invalid_creates: VecDeque::new(),
            creates_in_flight: VecDeque::new(),
            creates_answered: 0,
            token_refused: false,
            outbox: Vec::new(),
            client_watchers: 0,
            reported: (0, 0),
        }
    }

    /// While creates wait for etcd's answer: how many creates etcd has answered so far (`None`: none waits).
    pub fn create_progress(&self) -> Option<u64> {
        (!self.creates_in_flight.is_empty()).then_some(self.creates_answered)
    }

    /// Whether the hub needs an upstream stream.
    pub fn needs_upstream(&self) -> bool {
        !self.swatchers.is_empty() || self.progress_in_flight || !self.invalid_creates.is_empty()
    }

    /// Whether no client stream is attached.
    pub fn has_no_streams(&self) -> bool {
        self.streams.is_empty()
    }

    /// Each stream whose running count of held responses is not what its slots hold: (stream, count, held).
    /// Never any: the tests check it after every step.
    #[cfg(test)]
    pub fn miscounted_holds(&self) -> Vec<(StreamId, usize, usize)> {
        self.streams
            .iter()
            .map(|(&id, stream)| (id, stream.slots.held(), stream.slots.counted()))
            .filter(|(_, count, held)| count != held)
            .collect()
    }

    pub fn open_stream(&mut self, id: StreamId, sink: StreamSink) {
        let stream = ClientStream {
            sink,
            watchers: BTreeMap::new(),
            next_auto_id: 0,
            slots: Slots::default(),
        };
        self.streams.insert(id, stream);
    }

    /// The client stream ended (cancelled or disconnected): drop all its watchers.
    pub fn close_stream(&mut self, id: StreamId) {
        // A stream that went waits for no progress answer (none may be asked for it below).
        self.progress_waiters.remove(&id);
        if let Some(stream) = self.streams.remove(&id) {
            self.client_watchers -= stream.watchers.len() as i64;
            self.detach_all(id, stream.watchers);
        }
        self.update_gauges();
    }

    /// Removes every watcher of a stream that went, and cancels the s-watchers left without receivers, all before
    /// the hub asks etcd for progress again (see `progress_may_be_dropped`): that request restarts an s-watcher
    /// ahead of the store under a new ID (see `restart_watchers_ahead`), and a restart between two detaches would
    /// carry receivers of this stream still on it to an s-watcher that nothing would ever cancel.
    fn detach_all(&mut self, stream_id: StreamId, watchers: BTreeMap<i64, CWatcher>) {
        let mut emptied = BTreeSet::new();
        for (watch_id, watcher) in watchers {
            if let Some(sw) = self.swatchers.get_mut(&watcher.sw) {
                sw.receivers.remove(&(stream_id, watch_id));
                if sw.receivers.is_empty() {
                    emptied.insert(watcher.sw);
                }
            }
        }
        for sw_id in emptied {
            self.forget_s_watcher(sw_id, true);
        }
        self.progress_may_be_dropped();
    }

    pub fn create(&mut self, stream_id: StreamId, request: WatchCreateRequest) {
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return;
        };
        let invalid_range = !request.range_end.is_empty()
            && request.range_end != [0]
            && request.range_end <= request.key;
        if invalid_range {
            // etcd answers with watch ID -1 and its own reason: let it answer, in order.
            stream.slots.push_back(Slot::waiting(None));
            self.invalid_creates.push_back(stream_id);
            self.creates_in_flight.push_back(None);
            self.outbox.push(create_request(WatchCreateRequest {
                watch_id: 0,
                ..request
            }));
            return;
        }
        let watch_id = if request.watch_id != 0 {
            if stream.watchers.contains_key(&request.watch_id) {
                self.refuse(stream_id, DUPLICATE_WATCH_ID, -1);
                return;
            }
            request.watch_id
        } else {
            while stream.watchers.contains_key(&stream.next_auto_id) {
                stream.next_auto_id += 1;
            }
            stream.next_auto_id += 1;
            stream.next_auto_id - 1
        };
        let interest = Interest::of(&request);
        let start = request.start_revision;
        let range = (request.key.clone(), request.range_end.clone());
        let joinable = if start < 0 {
            None
        } else {
            self.find_joinable(&range, start)
        };
        let (sw_id, created, next_rev) = match joinable {
            Some(sw_id) => {
                let sw = &self.swatchers[&sw_id];
                match sw.phase {
                    Phase::Running if start > 0 => (sw_id, true, start),
                    Phase::Running => (sw_id, true, sw.next_rev),
                    Phase::Unsent | Phase::Creating => (sw_id, false, start),
                }
            }
            None => {
                let sw_id = self.next_sw_id;
                self.next_sw_id += 1;
                let sw = SWatcher {
                    key: request.key,
                    range_end: request.range_end,
                    start_rev: start,
                    next_rev: start.max(0),
                    phase: Phase::Unsent,
                    private: start < 0,
                    refused_once: false,
                    synced: false,
                    sent_start: 0,
                    receivers: BTreeSet::new(),
                };
                self.swatchers.insert(sw_id, sw);
                self.ranges.entry(range).or_default().insert(sw_id);
                (sw_id, false, start.max(0))
            }
        };
        self.swatchers
            .get_mut(&sw_id)
            .expect("just found or made")
            .receivers
            .insert((stream_id, watch_id));
        let stream = self.streams.get_mut(&stream_id).expect("checked above");
        let watcher = CWatcher {
            sw: sw_id,
            interest,
            next_rev,
            created,
            announced: false,
            requested_id: request.watch_id,
        };
        stream.watchers.insert(watch_id, watcher);
        self.client_watchers += 1;
        stream.slots.push_back(Slot::waiting(Some(watch_id)));
        if created {
            // Joined a running s-watcher: answer at once, as etcd would. A watcher without start revision starts
            // where the s-watcher stands, and its header says so.
            let mut header = self.latest_header;
            if start == 0 {
                header.revision = next_rev - 1;
            }
            let answer = WatchResponse {
                header: Some(header),
                watch_id,
                created: true,
                ..Default::default()
            };
            self.answer_create(stream_id, Some(watch_id), answer);
        }
        // Clients left waiting when etcd dropped a progress request for want of watchers (see
        // `progress_may_be_dropped`) are asked for again now that there is one.
        if !self.progress_waiters.is_empty() && !self.progress_in_flight {
            self.probe();
        }
        self.update_gauges();
    }

    /// Answers a create with a refusal (created and cancelled, `reason`, `watch_id`), in its turn among the
    /// stream's create answers.
    pub fn refuse(&mut self, stream_id: StreamId, reason: &str, watch_id: i64) {
        let refusal = WatchResponse {
            watch_id,
            ..self.refusal(reason)
        };
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return;
        };
        stream.slots.push_back(Slot::answered(refusal));
        self.flush_slots(stream_id);
    }

    /// Ends every watcher with `reason` (the proxy cannot watch for them: etcd refused its own credentials).
    pub fn end_all(&mut self, reason: &str) {
        let ids: Vec<i64> = self.swatchers.keys().copied().collect();
        for sw_id in ids {
            // As etcd's refusal of the s-watcher's create: receivers not created yet are refused, others cancelled.
            let ending = self.refusal(reason);
            self.s_watcher_ended(sw_id, &ending);
        }
        for stream_id in std::mem::take(&mut self.invalid_creates) {
            let refusal = self.refusal(reason);
            self.answer_create(stream_id, None, refusal);
        }
        self.update_gauges();
    }

    /// An s-watcher a new watcher on `range` starting at `start` (0: now) can share without loss or lag.
    fn find_joinable(&self, range: &(Vec<u8>, Vec<u8>), start: i64) -> Option<i64> {
        let candidates = self.ranges.get(range)?;
        candidates.iter().copied().find(|id| {
            let sw = &self.swatchers[id];
            if sw.private {
                return false;
            }
            match (sw.phase, start) {
                // Not sent yet: etcd's answer will be produced after this watcher arrived.
                (Phase::Unsent, _) => sw.start_rev == start,
                (Phase::Creating, _) => false,
                (Phase::Running, _) if !sw.synced => false,
                // Behind by at most the lag, never ahead (a watcher started at a future revision): a watcher from now
                // must not miss the revisions before that.
                (Phase::Running, 0) => {
                    let lag = self.latest_header.revision - (sw.next_rev - 1);
                    self.config.max_join_lag > 0 && (0..=self.config.max_join_lag).contains(&lag)
                }
                (Phase::Running, start) => sw.next_rev <= start,
            }
        })
    }

    pub fn cancel(&mut self, stream_id: StreamId, watch_id: i64) {
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return;
        };
        // etcd ignores a cancel of an unknown watch ID.
        let Some(watcher) = stream.watchers.remove(&watch_id) else {
            return;
        };
        self.client_watchers -= 1;
        self.detach(watcher.sw, (stream_id, watch_id));
        let reply = WatchResponse {
            header: Some(self.latest_header),
            watch_id,
            canceled: true,
            ..Default::default()
        };
        self.finish_watcher(stream_id, watch_id, watcher.announced, reply);
        self.update_gauges();
    }

    /// Merges running s-watchers of one range into the one furthest behind (see the invariants), once etcd can no
    /// longer cancel that one for compaction (a watcher moved onto it would be cancelled with it, where etcd would
    /// have kept it) or when both stand at the same revision.
    fn merge_range_of(&mut self, sw_id: i64) {
        let Some(sw) = self.swatchers.get(&sw_id) else {
            return;
        };
        let range = (sw.key.clone(), sw.range_end.clone());
        let Some(ids) = self.ranges.get(&range) else {
            return;
        };
        let running: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| {
                let sw = &self.swatchers[id];
                sw.phase == Phase::Running && !sw.private
            })
            .collect();
        let Some(&target) = running
            .iter()
            .min_by_key(|id| (self.swatchers[id].next_rev, **id))
        else {
            return;
        };
        let (target_rev, target_synced) = {
            let sw = &self.swatchers[&target];
            (sw.next_rev, sw.synced)
        };
        for other in running.into_iter().filter(|&id| id != target) {
            if !target_synced && self.swatchers[&other].next_rev != target_rev {
                continue;
            }
            let Some(moved) = self.remove_s_watcher(other) else {
                continue;
            };
            for (stream_id, watch_id) in moved.receivers {
                if let Some(watcher) = self.watcher_mut(stream_id, watch_id) {
                    watcher.sw = target;
                    self.swatchers
                        .get_mut(&target)
                        .expect("target is live")
                        .receivers
                        .insert((stream_id, watch_id));
                }
            }
        }
    }

    fn watcher_mut(&mut self, stream_id: StreamId, watch_id: i64) -> Option<&mut CWatcher> {
        self.streams
            .get_mut(&stream_id)?
            .watchers
            .get_mut(&watch_id)
    }

    /// Removes a receiver; an s-watcher left without receivers is cancelled upstream.
    fn detach(&mut self, sw_id: i64, receiver: (StreamId, i64)) {
        let Some(sw) = self.swatchers.get_mut(&sw_id) else {
            return;
        };
        sw.receivers.remove(&receiver);
        if sw.receivers.is_empty() {
            self.remove_s_watcher(sw_id);
        }
    }

    /// Forgets an s-watcher (cancelling it upstream if etcd knows it) and returns it.
    fn remove_s_watcher(&mut self, sw_id: i64) -> Option<SWatcher> {
        let removed = self.forget_s_watcher(sw_id, true);
        self.progress_may_be_dropped();
        removed
    }

    /// Forgets an s-watcher; `cancel_upstream` is false when etcd never added it to the stream's watchers.
    fn forget_s_watcher(&mut self, sw_id: i64, cancel_upstream: bool) -> Option<SWatcher> {
        let sw = self.swatchers.remove(&sw_id)?;
        self.progress_covers.remove(&sw_id);
        let range = (sw.key.clone(), sw.range_end.clone());
        if let Some(ids) = self.ranges.get_mut(&range) {
            ids.remove(&sw_id);
            if ids.is_empty() {
                self.ranges.remove(&range);
            }
        }
        if cancel_upstream && sw.phase != Phase::Unsent {
            self.outbox.push(WatchRequest {
                request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
                    watch_id: sw_id,
                })),
            });
        }
        Some(sw)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.streams.clear();
        self.client_watchers = 0;
        self.swatchers.clear();
        self.update_gauges();
    }
}

fn create_request(create: WatchCreateRequest) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(create)),
    }
}

#[cfg(test)]
mod tests;
