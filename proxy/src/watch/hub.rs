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

/// Identifies one client Watch stream within the hub.
pub type StreamId = u64;

/// etcd's reply to a create with a watch ID already used on the stream.
/// How often etcd syncs the watchers that are not synced (its `watchResyncPeriod`): a watcher created from a
/// revision etcd has reached is synced within this, unless it has much to catch up on.
pub const ETCD_RESYNC_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

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

/// The answers to a stream's creates waiting for their turn, with a running count of the responses they hold.
mod slots {
    use std::collections::VecDeque;
    use std::ops::{Deref, DerefMut};

    use proto::etcdserverpb::WatchResponse;

    /// The answer to one create, and what its watcher received before that answer could go out.
    pub(super) struct Slot {
        pub(super) watch_id: Option<i64>,
        pub(super) waiting: bool,
        /// Only [`Slots`] changes it, so that its count stays true.
        responses: Vec<WatchResponse>,
    }

    impl Slot {
        /// The slot of a create whose answer is not known yet.
        pub(super) fn waiting(watch_id: Option<i64>) -> Self {
            Self {
                watch_id,
                waiting: true,
                responses: Vec::new(),
            }
        }

        /// The slot of a create answered at once with `answer`.
        pub(super) fn answered(answer: WatchResponse) -> Self {
            Self {
                watch_id: None,
                waiting: false,
                responses: vec![answer],
            }
        }

        /// What the slot held, to go out now.
        pub(super) fn into_responses(self) -> Vec<WatchResponse> {
            self.responses
        }
    }

    /// A stream's slots in create order. The stream's bound on held responses is checked on every response held
    /// behind an unanswered create: summing over the slots there would cost O(slots) per response (quadratic in
    /// the watchers of a stream), so the sum is kept as the slots change.
    #[derive(Default)]
    pub(super) struct Slots {
        queue: VecDeque<Slot>,
        /// Responses held in `queue`, all slots together.
        held: usize,
    }

    /// One slot, open for change through [`Slots`].
    pub(super) struct SlotMut<'a> {
        slot: &'a mut Slot,
        held: &'a mut usize,
    }

    impl Slots {
        pub(super) fn push_back(&mut self, slot: Slot) {
            self.held += slot.responses.len();
            self.queue.push_back(slot);
        }

        /// The first slot that `pick` accepts.
        pub(super) fn find(&mut self, pick: impl Fn(&Slot) -> bool) -> Option<SlotMut<'_>> {
            let slot = self.queue.iter_mut().find(|slot| pick(slot))?;
            Some(SlotMut {
                slot,
                held: &mut self.held,
            })
        }

        /// The first slot, if its answer is known: its turn has come.
        pub(super) fn pop_answered(&mut self) -> Option<Slot> {
            if self.queue.front().is_none_or(|slot| slot.waiting) {
                return None;
            }
            let slot = self.queue.pop_front()?;
            self.held -= slot.responses.len();
            Some(slot)
        }

        /// Responses held in every slot.
        pub(super) fn held(&self) -> usize {
            self.held
        }

        /// `held`, counted anew (for tests of the running count).
        #[cfg(test)]
        pub(super) fn counted(&self) -> usize {
            self.queue.iter().map(|slot| slot.responses.len()).sum()
        }
    }

    impl SlotMut<'_> {
        /// Holds `response` after what the slot holds.
        pub(super) fn push(&mut self, response: WatchResponse) {
            self.slot.responses.push(response);
            *self.held += 1;
        }

        /// Holds `response` before what the slot holds (a create's answer precedes its watcher's events).
        pub(super) fn push_first(&mut self, response: WatchResponse) {
            self.slot.responses.insert(0, response);
            *self.held += 1;
        }
    }

    impl Deref for SlotMut<'_> {
        type Target = Slot;
        fn deref(&self) -> &Slot {
            self.slot
        }
    }

    impl DerefMut for SlotMut<'_> {
        fn deref_mut(&mut self) -> &mut Slot {
            self.slot
        }
    }
}
use slots::{Slot, Slots};

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

    /// Whether a progress request was sent and not answered yet.
    pub fn progress_in_flight(&self) -> bool {
        self.progress_in_flight
    }

    /// Whether the progress request in flight may have been dropped by etcd because a watcher of the stream was not
    /// synced when it arrived: the actor sends it again once etcd has synced its watchers
    /// ([`ETCD_RESYNC_PERIOD`]), rather than at its next health check.
    pub fn progress_maybe_dropped(&self) -> bool {
        self.progress_in_flight && self.progress_maybe_dropped
    }

    /// etcd from 3.5.8 does not answer a progress request that finds a watcher of the stream not synced yet (one
    /// that catches up, or was created a moment ago): 3.5.8 to 3.5.12 answer it once they are, 3.5.13 and 3.6 on
    /// drop it. A request the actor finds unanswered for a while is therefore sent again for the client streams
    /// still waiting, and for the actor's liveness probe (`liveness_waiting`), which would otherwise take etcd for
    /// hung; an answer to the first that comes after all is harmless (see [`Hub::progress_answered`]). Returns
    /// whether a request was sent.
    pub fn resend_progress(&mut self, liveness_waiting: bool) -> bool {
        if !self.progress_in_flight || self.answers_idle_progress {
            return false;
        }
        self.progress_in_flight = false;
        (liveness_waiting || !self.progress_waiters.is_empty()) && self.probe()
    }

    /// Answers progress requests as etcd of `version` does (`None`: the member would not say; the newest way).
    pub fn set_etcd_version(&mut self, version: Option<&str>) {
        self.answers_idle_progress =
            super::etcd_version::answers_progress_without_watchers(version);
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

    /// Whether etcd refused a create, taken as the proxy's token gone stale (once per refusal; see
    /// `HubConfig::own_identity`): the stream must be re-opened with a fresh token.
    pub fn take_token_refused(&mut self) -> bool {
        std::mem::take(&mut self.token_refused)
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

    pub fn request_progress(&mut self, stream_id: StreamId) {
        let Some(stream) = self.streams.get(&stream_id) else {
            return;
        };
        // etcd from 3.5.8 sends nothing for a progress request on a stream without watchers.
        if stream.watchers.is_empty() && !self.answers_idle_progress {
            return;
        }
        self.progress_waiters.insert(stream_id);
        self.probe();
    }

    /// Asks etcd for progress to learn that the stream still works, if etcd would answer (see
    /// [`Hub::progress_answerable`]): a request etcd keeps unanswered by its own rules would look like a hung
    /// member. Returns whether a request is in flight now.
    pub fn liveness_probe(&mut self) -> bool {
        self.restart_watchers_ahead();
        if !self.progress_answerable() {
            return false;
        }
        self.probe()
    }

    /// Whether etcd answers a progress request on the stream now. Before 3.5.8 it answers every one. From 3.5.8 it
    /// answers none on a stream without watchers, and none while a watcher is not synced; from 3.5.30 (and 3.7) none
    /// while a watcher starts at a revision the store has not reached (the newest revision the hub has heard of is
    /// at most etcd's, so a watcher it counts as started has started). A watcher etcd created from an old revision
    /// is synced within etcd's 100 ms sync interval, so it only delays an answer, and [`Hub::resend_progress`]
    /// asks again.
    pub fn progress_answerable(&self) -> bool {
        self.answers_idle_progress
            || (!self.swatchers.is_empty()
                && self.swatchers.values().all(|sw| {
                    sw.phase == Phase::Running && sw.sent_start <= self.latest_header.revision
                }))
    }

    /// An s-watcher created from a revision the hub could not know etcd had reached (it knew none yet, see
    /// [`Hub::flush_creates`]) and still ahead of the newest it knows would keep etcd 3.5.30 from answering progress
    /// requests on the stream: it is cancelled and created again from the newest known revision. Its receivers have
    /// had nothing from it (etcd sends nothing before its start) and keep their own start revisions.
    fn restart_watchers_ahead(&mut self) {
        let known = self.latest_header.revision;
        if self.answers_idle_progress || known == 0 {
            return;
        }
        let ahead: Vec<i64> = self
            .swatchers
            .iter()
            .filter(|(_, sw)| sw.phase == Phase::Running && !sw.private && sw.sent_start > known)
            .map(|(&id, _)| id)
            .collect();
        for old_id in ahead {
            let Some(sw) = self.forget_s_watcher(old_id, true) else {
                continue;
            };
            let new_id = self.next_sw_id;
            self.next_sw_id += 1;
            for &(stream_id, watch_id) in &sw.receivers {
                if let Some(watcher) = self.watcher_mut(stream_id, watch_id) {
                    watcher.sw = new_id;
                }
            }
            self.ranges
                .entry((sw.key.clone(), sw.range_end.clone()))
                .or_default()
                .insert(new_id);
            self.swatchers.insert(
                new_id,
                SWatcher {
                    phase: Phase::Unsent,
                    synced: false,
                    ..sw
                },
            );
        }
    }

    /// Asks etcd for progress (for clients, or as a liveness probe). Returns false if a request is in flight.
    pub fn probe(&mut self) -> bool {
        if self.progress_in_flight {
            return false;
        }
        self.restart_watchers_ahead();
        self.progress_in_flight = true;
        // Creates not sent yet go first: etcd from 3.5.8 never answers a progress request that reaches a stream
        // without watchers, which would leave this one (and every later one) unanswered.
        self.flush_creates();
        self.progress_covers = self.swatchers.keys().copied().collect();
        // Every watcher just created (from a revision etcd has reached), and every one not yet seen synced, may be
        // unsynced on etcd when the request arrives.
        self.progress_maybe_dropped = !self.answers_idle_progress
            && self.swatchers.values().any(|sw| match sw.phase {
                Phase::Running => !sw.synced,
                // etcd creates a watcher from now synced, and one from a revision it has reached unsynced.
                _ => sw.sent_start != 0,
            });
        self.outbox.push(WatchRequest {
            request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
        });
        true
    }

    /// Queues the creates of every s-watcher not yet sent on the current stream.
    ///
    /// etcd 3.5.30 (and 3.7) answers no progress request on a stream while one of its watchers starts at a revision
    /// the store has not reached: one client watching from the next revision (a read, then a watch from the revision
    /// after it, as etcd's clients do; or a watcher resumed after a failover) would leave every client sharing the
    /// stream without progress answers, and the liveness probe without one, until the next write. Such a watcher
    /// is created from the newest revision the hub has heard of instead (at most etcd's, so not in the future), and
    /// its receivers, which start where they asked, skip the events before that.
    pub fn flush_creates(&mut self) {
        let known = self.latest_header.revision;
        for (&id, sw) in self.swatchers.iter_mut() {
            if sw.phase == Phase::Unsent {
                sw.sent_start = if !self.answers_idle_progress
                    && !sw.private
                    && known > 0
                    && sw.start_rev > known
                {
                    known
                } else {
                    sw.start_rev
                };
                sw.phase = Phase::Creating;
                self.creates_in_flight.push_back(Some(id));
                self.outbox.push(create_request(WatchCreateRequest {
                    key: sw.key.clone(),
                    range_end: sw.range_end.clone(),
                    start_revision: sw.sent_start,
                    prev_kv: true,
                    progress_notify: true,
                    watch_id: id,
                    ..Default::default()
                }));
            }
        }
    }

    /// The upstream stream was lost: everything must be re-created, from where each s-watcher stands.
    pub fn upstream_lost(&mut self) {
        self.outbox.clear();
        self.creates_in_flight.clear();
        for sw in self.swatchers.values_mut() {
            if sw.phase == Phase::Running {
                // From where the receiver furthest behind stands: one that joined with a later start revision must
                // not be cancelled for a compaction of revisions it never asked for.
                let needed = sw
                    .receivers
                    .iter()
                    .filter_map(|(stream, id)| self.streams.get(stream)?.watchers.get(id))
                    .map(|watcher| watcher.next_rev)
                    .min();
                sw.next_rev = sw.next_rev.max(needed.unwrap_or(sw.next_rev));
                sw.start_rev = sw.next_rev;
            }
            sw.phase = Phase::Unsent;
        }
        for stream_id in std::mem::take(&mut self.invalid_creates) {
            // The invalid create was lost with the stream; answer it as etcd does.
            let refusal = self.refusal(EMPTY_RANGE);
            self.answer_create(stream_id, None, refusal);
        }
        self.progress_in_flight = false;
        // A request on a stream without watchers would go unanswered from 3.5.8 (see `progress_may_be_dropped`).
        if !self.progress_waiters.is_empty()
            && (self.answers_idle_progress || !self.swatchers.is_empty())
        {
            self.probe();
        }
    }

    /// Ends every client stream that requires a leader with `status` (etcd lost its leader).
    pub fn fail_leader_requirers(&mut self, status: &Status) {
        let doomed: Vec<StreamId> = self
            .streams
            .iter()
            .filter(|(_, s)| s.sink.requires_leader)
            .map(|(&id, _)| id)
            .collect();
        for id in doomed {
            if let Some(stream) = self.streams.get(&id) {
                let _ = stream
                    .sink
                    .abort
                    .try_send(Status::new(status.code(), status.message()));
            }
            self.close_stream(id);
        }
    }

    /// Handles one response from etcd.
    pub fn upstream_response(&mut self, response: WatchResponse) {
        if let Some(header) = response.header
            && header.revision >= self.latest_header.revision
        {
            self.latest_header = header;
        }
        let sw_id = if response.created {
            self.creates_answered += 1;
            match self.creates_in_flight.pop_front() {
                Some(Some(sw_id)) => sw_id,
                Some(None) => {
                    if let Some(stream_id) = self.invalid_creates.pop_front() {
                        self.answer_create(stream_id, None, response);
                    }
                    return;
                }
                None => return,
            }
        } else if response.watch_id == -1 {
            self.progress_answered(response);
            return;
        } else {
            response.watch_id
        };
        // Responses for an s-watcher the hub cancelled are late; nobody listens.
        if !self.swatchers.contains_key(&sw_id) {
            return;
        }
        if response.canceled {
            if response.created && self.retry_with_fresh_token(sw_id) {
                return;
            }
            self.s_watcher_ended(sw_id, &response);
        } else if response.created {
            self.s_watcher_created(sw_id, &response);
        } else if !response.events.is_empty() {
            self.dispatch_events(sw_id, &response);
        } else {
            self.dispatch_progress(sw_id, &response);
        }
        self.merge_range_of(sw_id);
        self.update_gauges();
    }

    /// With the proxy's own identity, a refused create is retried once with a fresh token (callers were admitted
    /// with their own tokens already; the proxy's token is what etcd refused: "invalid auth token" once it
    /// expired, "permission denied" from some versions).
    fn retry_with_fresh_token(&mut self, sw_id: i64) -> bool {
        if !self.config.own_identity {
            return false;
        }
        let sw = self.swatchers.get_mut(&sw_id).expect("checked by caller");
        if sw.refused_once {
            return false;
        }
        sw.refused_once = true;
        sw.phase = Phase::Unsent;
        self.token_refused = true;
        true
    }

    fn progress_answered(&mut self, response: WatchResponse) {
        self.progress_in_flight = false;
        // etcd from 3.5.8 answers only once every watcher of the stream is synced: each one etcd has created has
        // received everything up to this revision, and a resume after it can no longer be compacted.
        if !self.answers_idle_progress {
            let revision = response.header.map_or(0, |h| h.revision);
            for sw in self.swatchers.values_mut() {
                if sw.phase == Phase::Running {
                    sw.next_rev = sw.next_rev.max(revision + 1);
                    sw.synced = true;
                }
            }
        }
        let mut ask_again = false;
        for stream_id in std::mem::take(&mut self.progress_waiters) {
            // From 3.5.8, etcd's answer covers the watchers it had when the request reached it. A client watcher
            // whose upstream watcher was not created by then (created later, or moved after a compaction) may still
            // be missing events up to this revision: its stream waits for the next answer, as it would wait on
            // etcd. An older etcd answers at once whatever its watchers have sent, and so does the proxy then.
            if !self.answers_idle_progress && !self.covered_by_progress(stream_id) {
                tracing::trace!(stream_id, "progress answer deferred: not covered");
                self.progress_waiters.insert(stream_id);
                ask_again = true;
                continue;
            }
            tracing::trace!(stream_id, "progress answered");
            let answer = WatchResponse {
                header: response.header,
                watch_id: -1,
                ..Default::default()
            };
            self.send(stream_id, answer);
        }
        if ask_again {
            self.probe();
        }
    }

    /// Whether every watcher of the stream is on an upstream watcher etcd is running.
    fn covered_by_progress(&self, stream_id: StreamId) -> bool {
        self.streams.get(&stream_id).is_none_or(|stream| {
            stream.watchers.values().all(|watcher| {
                self.swatchers
                    .get(&watcher.sw)
                    .is_none_or(|sw| sw.phase == Phase::Running)
            })
        })
    }

    /// etcd from 3.5.8 drops a progress request that finds no watcher on its stream, and one that waits for a
    /// watcher to catch up when that watcher goes. When every upstream watcher etcd had for the request in flight
    /// has ended, that request may never be answered: stop waiting for it (a late answer is harmless), and ask
    /// again for the streams waiting, once there is a watcher to answer for (a request that would find none would
    /// be dropped too).
    fn progress_may_be_dropped(&mut self) {
        if !self.progress_in_flight
            || self.answers_idle_progress
            || !self.progress_covers.is_empty()
        {
            return;
        }
        self.progress_in_flight = false;
        if !self.progress_waiters.is_empty() && !self.swatchers.is_empty() {
            self.probe();
        }
    }

    fn s_watcher_created(&mut self, sw_id: i64, response: &WatchResponse) {
        let header = response.header.unwrap_or_default();
        let sw = self.swatchers.get_mut(&sw_id).expect("checked by caller");
        sw.phase = Phase::Running;
        sw.refused_once = false;
        sw.synced = sw.sent_start == 0 || sw.sent_start > header.revision;
        if sw.start_rev == 0 {
            sw.next_rev = header.revision + 1;
        }
        let next_rev = sw.next_rev;
        let receivers: Vec<_> = sw.receivers.iter().copied().collect();
        for (stream_id, watch_id) in receivers {
            let Some(watcher) = self.watcher_mut(stream_id, watch_id) else {
                continue;
            };
            // Receivers created before (this is a re-create after the upstream stream was lost) hear nothing.
            if watcher.created {
                continue;
            }
            watcher.created = true;
            watcher.next_rev = watcher.next_rev.max(next_rev);
            let answer = WatchResponse {
                header: Some(header),
                watch_id,
                created: true,
                ..Default::default()
            };
            self.answer_create(stream_id, Some(watch_id), answer);
        }
    }

    fn s_watcher_ended(&mut self, sw_id: i64, response: &WatchResponse) {
        // A watcher etcd ends after creating it (compaction caught it before it synced) leaves etcd's set of the
        // stream's watchers only on a cancel request; until then etcd from 3.5.8 counts it as never synced and
        // answers no progress request on the stream, for any of the clients sharing it. A refused create was
        // never added.
        let Some(sw) = self.forget_s_watcher(sw_id, !response.created) else {
            return;
        };
        let range = (sw.key, sw.range_end);
        // Its receivers need nothing before the revision it was to start at (which may be later than the one it
        // was created from).
        let needed_from = sw.start_rev;
        for (stream_id, watch_id) in sw.receivers {
            // etcd cancels a watcher for compaction only while it still needs a compacted revision. A receiver
            // already past the compaction (it joined with a later start, the s-watcher resumed from an earlier
            // receiver's revision, or was created from before the revision it was to start at) carries on from
            // where it stands, as it would on etcd.
            if response.compact_revision > 0
                && !response.created
                && let Some(watcher) = self.watcher_mut(stream_id, watch_id)
                && watcher.created
                && watcher.next_rev.max(needed_from) >= response.compact_revision
            {
                let from = watcher.next_rev.max(needed_from);
                self.resume_receiver(&range, (stream_id, watch_id), from);
                continue;
            }
            let Some(stream) = self.streams.get_mut(&stream_id) else {
                continue;
            };
            let Some(watcher) = stream.watchers.remove(&watch_id) else {
                continue;
            };
            self.client_watchers -= 1;
            // A create etcd refused is answered as etcd answers it: with watch ID -1 (3.4) or with the ID the create
            // asked for (3.5, which gets back the s-watcher's ID the hub asked for).
            let refused = response.created && !watcher.created;
            let reply_id = match (refused, response.watch_id) {
                (false, _) => watch_id,
                (true, -1) => -1,
                (true, _) => watcher.requested_id,
            };
            let reply = WatchResponse {
                header: response.header,
                watch_id: reply_id,
                created: refused,
                canceled: true,
                compact_revision: response.compact_revision,
                cancel_reason: response.cancel_reason.clone(),
                ..Default::default()
            };
            self.finish_watcher(stream_id, watch_id, watcher.announced, reply);
        }
        self.progress_may_be_dropped();
    }

    /// Moves a created receiver onto an s-watcher of its range from revision `from`: one it can join, or a new one.
    /// It hears nothing of the move (no second Created).
    fn resume_receiver(
        &mut self,
        range: &(Vec<u8>, Vec<u8>),
        receiver: (StreamId, i64),
        from: i64,
    ) {
        let sw_id = match self.find_joinable(range, from) {
            Some(sw_id) => sw_id,
            None => {
                let sw_id = self.next_sw_id;
                self.next_sw_id += 1;
                self.swatchers.insert(
                    sw_id,
                    SWatcher {
                        key: range.0.clone(),
                        range_end: range.1.clone(),
                        start_rev: from,
                        next_rev: from,
                        phase: Phase::Unsent,
                        private: false,
                        refused_once: false,
                        synced: false,
                        sent_start: 0,
                        receivers: BTreeSet::new(),
                    },
                );
                self.ranges.entry(range.clone()).or_default().insert(sw_id);
                sw_id
            }
        };
        self.swatchers
            .get_mut(&sw_id)
            .expect("just found or made")
            .receivers
            .insert(receiver);
        if let Some(watcher) = self.watcher_mut(receiver.0, receiver.1) {
            watcher.sw = sw_id;
        }
    }

    fn dispatch_events(&mut self, sw_id: i64, response: &WatchResponse) {
        let sw = self.swatchers.get_mut(&sw_id).expect("checked by caller");
        if let Some(last) = response
            .events
            .iter()
            .filter_map(|e| e.kv.as_ref())
            .map(|kv| kv.mod_revision)
            .max()
        {
            sw.next_rev = sw.next_rev.max(last + 1);
        }
        let receivers: Vec<_> = sw.receivers.iter().copied().collect();
        self.metrics
            .watch_events_coalescing
            .inc_by(receivers.len().saturating_sub(1) as u64);
        let limit = self.config.fragment_limit;
        for (stream_id, watch_id) in receivers {
            let Some(watcher) = self.watcher_mut(stream_id, watch_id) else {
                continue;
            };
            if !watcher.created {
                continue;
            }
            let interest = watcher.interest;
            let events = select_events(&response.events, &mut watcher.next_rev, &interest);
            if events.is_empty() {
                continue;
            }
            let reply = WatchResponse {
                header: response.header,
                watch_id,
                events,
                ..Default::default()
            };
            if interest.fragment {
                for part in fragments(reply, limit, self.config.hidden_prefix) {
                    self.deliver_to(stream_id, watch_id, part);
                }
            } else {
                self.deliver_to(stream_id, watch_id, reply);
            }
        }
    }

    fn dispatch_progress(&mut self, sw_id: i64, response: &WatchResponse) {
        let revision = response.header.map_or(0, |h| h.revision);
        let sw = self.swatchers.get_mut(&sw_id).expect("checked by caller");
        sw.next_rev = sw.next_rev.max(revision + 1);
        sw.synced = true;
        let receivers: Vec<_> = sw.receivers.iter().copied().collect();
        for (stream_id, watch_id) in receivers {
            let Some(watcher) = self.watcher_mut(stream_id, watch_id) else {
                continue;
            };
            // A watcher ahead of this s-watcher (merged from a faster one) must not hear of an older revision.
            if !watcher.created || revision + 1 < watcher.next_rev {
                continue;
            }
            watcher.next_rev = revision + 1;
            if watcher.interest.progress_notify {
                let notice = WatchResponse {
                    header: response.header,
                    watch_id,
                    ..Default::default()
                };
                self.deliver_to(stream_id, watch_id, notice);
            }
        }
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

    fn refusal(&self, reason: &str) -> WatchResponse {
        WatchResponse {
            header: Some(self.latest_header),
            watch_id: -1,
            created: true,
            canceled: true,
            cancel_reason: reason.into(),
            ..Default::default()
        }
    }

    /// Fills the answer slot of a create (the first waiting anonymous slot when `watch_id` is `None`).
    fn answer_create(&mut self, stream_id: StreamId, watch_id: Option<i64>, answer: WatchResponse) {
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return;
        };
        let Some(mut slot) = stream
            .slots
            .find(|slot| slot.waiting && slot.watch_id == watch_id)
        else {
            return;
        };
        slot.waiting = false;
        slot.push_first(answer);
        self.flush_slots(stream_id);
    }

    /// A response for one watcher: straight out once its Created went out, else after it.
    fn deliver_to(&mut self, stream_id: StreamId, watch_id: i64, response: WatchResponse) {
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return;
        };
        if stream.watchers.get(&watch_id).is_some_and(|w| w.announced) {
            self.send(stream_id, response);
        } else if let Some(mut slot) = stream.slots.find(|slot| slot.watch_id == Some(watch_id)) {
            slot.push(response);
            // Responses held behind a create etcd has not answered count against the stream's buffer too, so that
            // a create etcd is slow to answer cannot make the proxy hold an unbounded backlog for later watchers.
            let held = stream.slots.held();
            let capacity = stream.sink.responses.max_capacity();
            if held > capacity {
                self.end_stream(
                    stream_id,
                    format!(
                        "etcd-grpc-proxy: watch stream closed: more than {capacity} responses waited for an earlier \
                         create's answer (see --watch-buffer-size)"
                    ),
                );
            }
        }
    }

    /// The last response of a watcher that is gone (cancelled, compacted): if its Created never went out, it goes
    /// out first (etcd always answers a create before it cancels).
    fn finish_watcher(
        &mut self,
        stream_id: StreamId,
        watch_id: i64,
        announced: bool,
        last: WatchResponse,
    ) {
        if announced {
            self.send(stream_id, last);
            return;
        }
        let created = WatchResponse {
            header: Some(self.latest_header),
            watch_id,
            created: true,
            ..Default::default()
        };
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return;
        };
        let Some(mut slot) = stream.slots.find(|slot| slot.watch_id == Some(watch_id)) else {
            return;
        };
        if slot.waiting {
            slot.waiting = false;
            if !last.created {
                slot.push_first(created);
            }
        }
        slot.push(last);
        self.flush_slots(stream_id);
    }

    /// Sends the answers whose turn has come.
    fn flush_slots(&mut self, stream_id: StreamId) {
        loop {
            let Some(stream) = self.streams.get_mut(&stream_id) else {
                return;
            };
            let Some(slot) = stream.slots.pop_answered() else {
                return;
            };
            if let Some(watcher) = slot.watch_id.and_then(|id| stream.watchers.get_mut(&id)) {
                watcher.announced = true;
            }
            let latest = self.latest_header;
            for mut response in slot.into_responses() {
                // Held events leave with the newest header, as etcd's catch-up responses carry its current revision:
                // the stream's other watchers may have received newer events meanwhile, and headers never go back.
                if let Some(header) = response
                    .header
                    .as_mut()
                    .filter(|_| !response.events.is_empty())
                    && header.revision < latest.revision
                {
                    *header = latest;
                }
                self.send(stream_id, response);
            }
        }
    }

    /// Queues a response to a client stream; a stream whose buffer is full is ended (slow consumer).
    fn send(&mut self, stream_id: StreamId, response: WatchResponse) {
        let Some(stream) = self.streams.get(&stream_id) else {
            return;
        };
        match stream.sink.responses.try_send(response) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let capacity = stream.sink.responses.max_capacity();
                self.end_stream(
                    stream_id,
                    format!(
                        "etcd-grpc-proxy: watch stream closed: the client did not read its responses \
                         (buffer of {capacity} responses full, see --watch-buffer-size)"
                    ),
                );
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.close_stream(stream_id),
        }
    }

    /// Ends a client stream with ResourceExhausted and `why`: it would hold more than its buffer allows. What its
    /// buffer holds still reaches the client, before the status (see [`StreamSink::finish`]); nothing more is queued.
    fn end_stream(&mut self, stream_id: StreamId, why: String) {
        if let Some(stream) = self.streams.get(&stream_id) {
            let _ = stream.sink.finish.try_send(Status::resource_exhausted(why));
        }
        self.close_stream(stream_id);
    }

    /// Adds this hub's change in watcher counts to the proxy-wide gauges (several hubs share them).
    fn update_gauges(&mut self) {
        debug_assert_eq!(
            self.client_watchers,
            self.streams
                .values()
                .map(|s| s.watchers.len())
                .sum::<usize>() as i64
        );
        let clients = self.client_watchers;
        let upstream = self.swatchers.len() as i64;
        let (old_clients, old_upstream) =
            std::mem::replace(&mut self.reported, (clients, upstream));
        self.metrics
            .watch_client_watchers
            .add(clients - old_clients);
        self.metrics
            .watch_upstream_watchers
            .add(upstream - old_upstream);
        // Client watchers served by an s-watcher they share: never negative, since every s-watcher has a receiver.
        let coalesced = |c: i64, u: i64| (c - u).max(0);
        self.metrics
            .watchers_coalescing
            .add(coalesced(clients, upstream) - coalesced(old_clients, old_upstream));
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
#[path = "hub_tests.rs"]
mod tests;
