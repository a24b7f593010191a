//! The hub's side towards etcd: creates sent on the upstream stream, etcd's responses (created and ended
//! s-watchers, events dispatched to their receivers), and what a lost stream or leader does to the watchers.

use super::*;

impl Hub {
    /// Whether etcd refused a create, taken as the proxy's token gone stale (once per refusal; see
    /// `HubConfig::own_identity`): the stream must be re-opened with a fresh token.
    pub fn take_token_refused(&mut self) -> bool {
        std::mem::take(&mut self.token_refused)
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
    pub(super) fn retry_with_fresh_token(&mut self, sw_id: i64) -> bool {
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

    pub(super) fn s_watcher_created(&mut self, sw_id: i64, response: &WatchResponse) {
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

    pub(super) fn s_watcher_ended(&mut self, sw_id: i64, response: &WatchResponse) {
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
    pub(super) fn resume_receiver(
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

    pub(super) fn dispatch_events(&mut self, sw_id: i64, response: &WatchResponse) {
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

    pub(super) fn dispatch_progress(&mut self, sw_id: i64, response: &WatchResponse) {
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
}
