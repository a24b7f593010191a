//! Delivery to client streams: create answers in the order the creates came, responses within each stream's
//! buffer (a stream whose buffer fills is ended after what it holds), watchers and streams ended with a reason,
//! and the watcher gauges.

use super::*;

impl Hub {
    pub(super) fn refusal(&self, reason: &str) -> WatchResponse {
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
    pub(super) fn answer_create(
        &mut self,
        stream_id: StreamId,
        watch_id: Option<i64>,
        answer: WatchResponse,
    ) {
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
    pub(super) fn deliver_to(
        &mut self,
        stream_id: StreamId,
        watch_id: i64,
        response: WatchResponse,
    ) {
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
    pub(super) fn finish_watcher(
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
    pub(super) fn flush_slots(&mut self, stream_id: StreamId) {
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
    pub(super) fn send(&mut self, stream_id: StreamId, response: WatchResponse) {
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
    pub(super) fn end_stream(&mut self, stream_id: StreamId, why: String) {
        if let Some(stream) = self.streams.get(&stream_id) {
            let _ = stream.sink.finish.try_send(Status::resource_exhausted(why));
        }
        self.close_stream(stream_id);
    }

    /// Adds this hub's change in watcher counts to the proxy-wide gauges (several hubs share them).
    pub(super) fn update_gauges(&mut self) {
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
