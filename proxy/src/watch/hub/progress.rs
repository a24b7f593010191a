//! Progress: client progress requests (one upstream request answers every stream that asked), the actor's
//! liveness probe, and what etcd's answers mean for each stream (see [`Hub::progress_answerable`]).

use super::*;

impl Hub {
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
            crate::upstream::etcd_version::answers_progress_without_watchers(version);
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
    pub(super) fn restart_watchers_ahead(&mut self) {
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

    pub(super) fn progress_answered(&mut self, response: WatchResponse) {
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
    pub(super) fn covered_by_progress(&self, stream_id: StreamId) -> bool {
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
    pub(super) fn progress_may_be_dropped(&mut self) {
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
}
