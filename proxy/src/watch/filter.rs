//! What one client watcher sees of a shared upstream watcher's responses: events from its own next revision on,
//! its NOPUT/NODELETE filters, prev_kv only if it asked, and etcd's fragmentation of large responses.

use prost::Message;
use proto::etcdserverpb::watch_create_request::FilterType;
use proto::etcdserverpb::{WatchCreateRequest, WatchResponse};
use proto::mvccpb::{Event, event::EventType};

/// A client watcher's options, applied in the proxy so that they do not prevent sharing upstream watchers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Interest {
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
    pub progress_notify: bool,
    pub fragment: bool,
}

impl Interest {
    pub fn of(request: &WatchCreateRequest) -> Self {
        let has = |f: FilterType| request.filters.contains(&(f as i32));
        Self {
            no_put: has(FilterType::Noput),
            no_delete: has(FilterType::Nodelete),
            prev_kv: request.prev_kv,
            progress_notify: request.progress_notify,
            fragment: request.fragment,
        }
    }
}

/// The events of an upstream batch that a client watcher must receive, given the revision of the next event it
/// may receive (`next_rev`), which is advanced past every event of the batch, filtered ones included.
pub fn select_events(events: &[Event], next_rev: &mut i64, interest: &Interest) -> Vec<Event> {
    let mut selected = Vec::with_capacity(events.len());
    let mut last_seen = None;
    for event in events {
        let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
        if revision < *next_rev {
            continue;
        }
        last_seen = Some(revision);
        let is_put = event.r#type == EventType::Put as i32;
        if (is_put && interest.no_put) || (!is_put && interest.no_delete) {
            continue;
        }
        // Field by field: the upstream watcher always asks for prev_kv, most watchers do not want it.
        selected.push(Event {
            r#type: event.r#type,
            kv: event.kv.clone(),
            prev_kv: if interest.prev_kv {
                event.prev_kv.clone()
            } else {
                None
            },
        });
    }
    // Advance only after the batch: one transaction yields several events with the same revision.
    if let Some(revision) = last_seen {
        *next_rev = (*next_rev).max(revision + 1);
    }
    selected
}

/// Splits a large response into fragments, by etcd's rule for watchers that asked for `fragment`: a response
/// whose encoding is smaller than `limit`, or that holds one event, goes whole; otherwise each fragment takes events
/// in order while it stays below `limit` (always at least one), and every fragment but the last has `fragment` set.
/// Sizes are those of the response the client receives: `hidden_prefix` bytes (the namespace's) come off every key.
pub fn fragments(
    response: WatchResponse,
    limit: usize,
    hidden_prefix: usize,
) -> Vec<WatchResponse> {
    if response.events.len() < 2 {
        return vec![response];
    }
    let template = WatchResponse {
        events: Vec::new(),
        fragment: true,
        ..response.clone()
    };
    // Sizes are exact: a repeated field's encoding is the sum of its elements' encodings.
    let overhead = template.encoded_len();
    let sizes: Vec<usize> = response
        .events
        .iter()
        .map(|event| client_size(event, hidden_prefix))
        .collect();
    // The whole response, as the client would receive it unfragmented (its `fragment` flag is not set).
    let whole = overhead
        - WatchResponse {
            fragment: true,
            ..Default::default()
        }
        .encoded_len()
        + sizes.iter().sum::<usize>();
    if whole < limit {
        return vec![response];
    }
    let mut events = response.events.into_iter().zip(sizes);
    let mut out: Vec<WatchResponse> = Vec::new();
    let mut current = template.clone();
    let mut size = overhead;
    for (event, event_size) in events.by_ref() {
        if !current.events.is_empty() && size + event_size >= limit {
            out.push(std::mem::replace(&mut current, template.clone()));
            size = overhead;
        }
        size += event_size;
        current.events.push(event);
    }
    current.fragment = false;
    out.push(current);
    out
}

/// The encoded size of `event` in a WatchResponse once `hidden_prefix` bytes are off its keys.
fn client_size(event: &Event, hidden_prefix: usize) -> usize {
    if hidden_prefix == 0 {
        return prost::encoding::message::encoded_len(WATCH_RESPONSE_EVENTS_FIELD, event);
    }
    let mut seen = event.clone();
    for kv in seen.kv.iter_mut().chain(seen.prev_kv.iter_mut()) {
        kv.key = kv.key.slice(hidden_prefix.min(kv.key.len())..);
    }
    prost::encoding::message::encoded_len(WATCH_RESPONSE_EVENTS_FIELD, &seen)
}

/// The field number of `WatchResponse.events`.
const WATCH_RESPONSE_EVENTS_FIELD: u32 = 11;

#[cfg(test)]
mod tests {
    use super::*;
    use proto::mvccpb::KeyValue;

    fn event(kind: EventType, key: &str, revision: i64) -> Event {
        Event {
            r#type: kind as i32,
            kv: Some(KeyValue {
                key: key.as_bytes().to_vec().into(),
                mod_revision: revision,
                value: vec![b'v'; 10].into(),
                ..Default::default()
            }),
            prev_kv: Some(KeyValue {
                key: key.as_bytes().to_vec().into(),
                ..Default::default()
            }),
        }
    }

    fn revisions(events: &[Event]) -> Vec<i64> {
        events
            .iter()
            .map(|e| e.kv.as_ref().unwrap().mod_revision)
            .collect()
    }

    #[test]
    fn events_before_the_watchers_next_revision_are_skipped() {
        let batch = [
            event(EventType::Put, "a", 4),
            event(EventType::Put, "b", 5),
            event(EventType::Delete, "a", 6),
        ];
        let mut next_rev = 5;
        let got = select_events(
            &batch,
            &mut next_rev,
            &Interest {
                prev_kv: true,
                ..Default::default()
            },
        );
        assert_eq!(revisions(&got), vec![5, 6]);
        assert_eq!(next_rev, 7);
    }

    #[test]
    fn filters_hide_events_but_still_advance_the_next_revision() {
        let batch = [
            event(EventType::Put, "a", 4),
            event(EventType::Delete, "a", 5),
        ];
        let mut next_rev = 0;
        let got = select_events(
            &batch,
            &mut next_rev,
            &Interest {
                no_delete: true,
                ..Default::default()
            },
        );
        assert_eq!(revisions(&got), vec![4]);
        assert_eq!(next_rev, 6, "a filtered event is not delivered later");
        let mut next_rev = 0;
        let got = select_events(
            &batch,
            &mut next_rev,
            &Interest {
                no_put: true,
                no_delete: true,
                ..Default::default()
            },
        );
        assert!(got.is_empty());
        assert_eq!(next_rev, 6);
    }

    #[test]
    fn events_of_one_transaction_share_a_revision_and_all_arrive() {
        let batch = [event(EventType::Put, "a", 7), event(EventType::Put, "b", 7)];
        let mut next_rev = 7;
        assert_eq!(
            revisions(&select_events(&batch, &mut next_rev, &Interest::default())),
            vec![7, 7]
        );
    }

    #[test]
    fn prev_kv_is_stripped_unless_asked_for() {
        let batch = [event(EventType::Put, "a", 4)];
        let mut next_rev = 0;
        assert!(
            select_events(&batch, &mut next_rev, &Interest::default())[0]
                .prev_kv
                .is_none()
        );
        let mut next_rev = 0;
        let with = Interest {
            prev_kv: true,
            ..Default::default()
        };
        assert!(
            select_events(&batch, &mut next_rev, &with)[0]
                .prev_kv
                .is_some()
        );
    }

    #[test]
    fn large_responses_are_fragmented_with_every_event_kept_in_order() {
        let events: Vec<Event> = (1..=10).map(|r| event(EventType::Put, "k", r)).collect();
        let response = WatchResponse {
            watch_id: 3,
            events: events.clone(),
            ..Default::default()
        };
        let limit = events[0].encoded_len() * 3;
        let parts = fragments(response.clone(), limit, 0);
        assert!(parts.len() > 1);
        assert!(
            parts[..parts.len() - 1].iter().all(|p| p.fragment) && !parts.last().unwrap().fragment
        );
        assert!(
            parts
                .iter()
                .all(|p| p.watch_id == 3 && !p.events.is_empty())
        );
        let rejoined: Vec<Event> = parts.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(rejoined, events);
        assert_eq!(fragments(response.clone(), usize::MAX, 0), vec![response]);
    }

    #[test]
    fn fragment_boundaries_follow_etcd_whole_below_the_limit_and_each_fragment_below_it() {
        let events: Vec<Event> = (1..=4).map(|r| event(EventType::Put, "k", r)).collect();
        let response = WatchResponse {
            watch_id: 1,
            events,
            ..Default::default()
        };
        let whole = response.encoded_len();
        // Smaller than the limit: whole. Exactly the limit: etcd fragments.
        assert_eq!(fragments(response.clone(), whole + 1, 0).len(), 1);
        let parts = fragments(response.clone(), whole, 0);
        assert!(parts.len() > 1);
        for part in &parts {
            assert!(
                part.events.len() == 1 || part.encoded_len() < whole,
                "{part:?}"
            );
        }
        // Each fragment is as full as the limit allows: one more event would reach it.
        for pair in parts.windows(2) {
            let mut fuller = pair[0].clone();
            fuller.events.push(pair[1].events[0].clone());
            assert!(fuller.encoded_len() >= whole);
        }
        // One event too large for any limit still goes, alone.
        let tiny_limit = fragments(response.clone(), 1, 0);
        assert_eq!(tiny_limit.len(), 4);
        assert!(tiny_limit.iter().all(|p| p.events.len() == 1));
    }

    #[test]
    fn fragments_are_sized_as_the_client_receives_them_without_the_namespace() {
        let prefix = "/a-long-namespace-prefix/";
        let stored: Vec<Event> = (1..=40)
            .map(|r| event(EventType::Put, &format!("{prefix}k{r:03}"), r))
            .collect();
        let seen: Vec<Event> = (1..=40)
            .map(|r| event(EventType::Put, &format!("k{r:03}"), r))
            .collect();
        let response = |events: &Vec<Event>| WatchResponse {
            watch_id: 1,
            events: events.clone(),
            ..Default::default()
        };
        let boundaries =
            |parts: Vec<WatchResponse>| parts.iter().map(|p| p.events.len()).collect::<Vec<_>>();
        for limit in [
            seen[0].encoded_len() * 7,
            response(&seen).encoded_len(),
            1 << 20,
        ] {
            let as_stored = fragments(response(&stored), limit, prefix.len());
            let as_seen = fragments(response(&seen), limit, 0);
            assert_eq!(boundaries(as_stored), boundaries(as_seen), "limit {limit}");
        }
        let unsized_ = fragments(response(&stored), response(&seen).encoded_len(), 0);
        assert_ne!(
            unsized_.len(),
            1,
            "sized with the prefix, the same limit would split it"
        );
    }

    #[test]
    fn interest_reads_filters_and_flags() {
        let request = WatchCreateRequest {
            filters: vec![FilterType::Nodelete as i32],
            prev_kv: true,
            fragment: true,
            ..Default::default()
        };
        assert_eq!(
            Interest::of(&request),
            Interest {
                no_put: false,
                no_delete: true,
                prev_kv: true,
                progress_notify: false,
                fragment: true
            }
        );
    }
}
