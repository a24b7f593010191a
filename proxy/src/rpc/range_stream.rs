//! RangeStream (etcd 3.7): a Range answered as a stream of chunks, all read at one revision.
//!
//! Relayed to an etcd that serves it. An etcd that does not (every version before 3.7) answers Unimplemented; the
//! proxy then remembers that of the endpoint and serves the stream itself from Range calls, the way 3.7 builds it
//! (server/etcdserver/v3_server.go, `rangeStream`): the first chunk holds at most 10 keys, each next chunk's limit
//! doubles or halves to keep chunks near the request size limit, the revision is pinned to the store revision of
//! the first chunk, and `header`, `more` and `count` come on the last chunk only. A client such as Kubernetes
//! then lists as a stream through the proxy whatever etcd it runs.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use http::uri::PathAndQuery;
use prost::Message;
use proto::etcdserverpb::{RangeRequest, RangeResponse, RangeStreamResponse, range_request};
use tokio::sync::watch;
use tonic::{Code, Request, Response, Status};

use crate::upstream::{BoxStream, Forwarded, Retry, Upstream, path};

/// etcd 3.7's first chunk limit (`initialStreamChunkLimit`).
const FIRST_CHUNK_LIMIT: i64 = 10;

/// What etcd 3.7.3 answers a RangeStream whose bytes are not a RangeRequest (Go's protobuf puts a space or, chosen
/// per binary, a no-break space after "proto:"; this is the space).
pub const MALFORMED: &str =
    "grpc: failed to unmarshal the received message: proto: cannot parse invalid wire-format data";

/// Serves one RangeStream call.
pub async fn serve(
    upstream: &Arc<Upstream>,
    request: Request<Bytes>,
) -> Result<Response<BoxStream<Bytes>>, Status> {
    let forwarded = Forwarded::capture(&request);
    let bytes = request.into_inner();
    // Bytes the proxy cannot read go to etcd to judge; only an etcd without RangeStream gets the proxy's words.
    let range = RangeRequest::decode(bytes.clone());
    if let Ok(range) = &range {
        check(range)?;
    }
    let index = upstream.active().index;
    if !upstream.lacks_range_stream(index) {
        let relayed = upstream
            .server_stream(
                PathAndQuery::from_static(path::RANGE_STREAM),
                forwarded.request(bytes.clone()),
            )
            .await;
        match relayed {
            // The request passed 3.7's own checks above, so Unimplemented means the method is missing. The
            // endpoint is the one active before the call: during a failover, another may be marked, which costs
            // one more relayed attempt or one emulated stream on a 3.7 member, both with the same answer.
            Err(status) if status.code() == Code::Unimplemented => {
                upstream.note_lacks_range_stream(index)
            }
            answered => return answered,
        }
    }
    // etcd 3.7.3's words (grpc-go's, whatever the fault in the bytes), not the older grpc-go of the etcd behind.
    let range = range.map_err(|_| Status::internal(MALFORMED))?;
    let mut pages = Pages::new(upstream.clone(), forwarded, range);
    // The first page is read before answering, as 3.7 reads its first chunk before sending anything: a request
    // refused on reading (a compacted or future revision) is then refused before any chunk, with no response
    // headers (a trailers-only answer), as 3.7 refuses it, not as a stream that opens and then fails.
    let first = match pages.next().await {
        Some(Err(status)) => return Err(status),
        first => first,
    };
    let rest = futures::stream::unfold(pages, |mut pages| async move {
        let chunk = pages.next().await?;
        Some((chunk, pages))
    });
    Ok(Response::new(Box::pin(
        futures::stream::iter(first).chain(rest),
    )))
}

/// What etcd 3.7 refuses before reading (api/v3rpc/key.go, `checkRangeStreamRequest`), with its codes and words.
pub fn check(range: &RangeRequest) -> Result<(), Status> {
    if range.key.is_empty() {
        return Err(Status::invalid_argument("etcdserver: key is not provided"));
    }
    let order = range_request::SortOrder::try_from(range.sort_order);
    let target = range_request::SortTarget::try_from(range.sort_target);
    let (Ok(order), Ok(target)) = (order, target) else {
        return Err(Status::invalid_argument("etcdserver: invalid sort option"));
    };
    let key_order = order == range_request::SortOrder::None
        || (target == range_request::SortTarget::Key && order == range_request::SortOrder::Ascend);
    if !key_order {
        return Err(Status::unimplemented(
            "RangeStream does not support custom sort orders",
        ));
    }
    let filtered = range.min_mod_revision != 0
        || range.max_mod_revision != 0
        || range.min_create_revision != 0
        || range.max_create_revision != 0;
    if filtered {
        return Err(Status::unimplemented(
            "RangeStream does not support revision filters",
        ));
    }
    Ok(())
}

/// The next chunk's limit from the last one's and its size: doubled when the chunk was under half the target,
/// halved when over twice, never below 1 (a limit of 0 would mean no limit).
pub fn next_chunk_limit(last_limit: i64, last_size: usize, target_size: usize) -> i64 {
    let limit = if last_size < target_size / 2 {
        last_limit.saturating_mul(2)
    } else if last_size > target_size.saturating_mul(2) {
        last_limit / 2
    } else {
        last_limit
    };
    limit.max(1)
}

/// The pages of one emulated RangeStream.
struct Pages {
    upstream: Arc<Upstream>,
    forwarded: Forwarded,
    /// The next page's Range: its key moves on, its revision is pinned after the first page.
    range: RangeRequest,
    /// The client's limit (none: `i64::MAX`).
    total_limit: i64,
    sent: i64,
    /// The store revision of the first page, which every page's header would say.
    header_revision: Option<i64>,
    /// Becomes true when the proxy shuts down: the stream then ends, between two pages, with Unavailable (so the
    /// client lists again elsewhere), as relayed streams do.
    shutdown: watch::Receiver<bool>,
    done: bool,
}

impl Pages {
    fn new(upstream: Arc<Upstream>, forwarded: Forwarded, mut range: RangeRequest) -> Self {
        let total_limit = if range.limit == 0 {
            i64::MAX
        } else {
            range.limit
        };
        range.limit = FIRST_CHUNK_LIMIT.min(total_limit);
        Self {
            shutdown: upstream.shutdown_signal(),
            upstream,
            forwarded,
            range,
            total_limit,
            sent: 0,
            header_revision: None,
            done: false,
        }
    }

    async fn next(&mut self) -> Option<Result<Bytes, Status>> {
        if self.done {
            return None;
        }
        if *self.shutdown.borrow() {
            self.done = true;
            return Some(Err(Status::unavailable("etcd-grpc-proxy: shutting down")));
        }
        let chunk = self.next_chunk().await;
        self.done = !matches!(chunk, Ok((_, false)));
        Some(chunk.map(|(response, _)| {
            let chunk = RangeStreamResponse {
                range_response: Some(response),
            };
            Bytes::from(chunk.encode_to_vec())
        }))
    }

    /// The next chunk, and whether it is the last.
    async fn next_chunk(&mut self) -> Result<(RangeResponse, bool), Status> {
        // Every page goes with the client's token and serializable flag: a linearizable page cannot fail on a
        // member that has not yet caught up with the pinned revision after a failover.
        let page = self.read(self.range.clone()).await?;
        if self.range.count_only {
            let only_count = RangeResponse {
                header: page.header,
                count: page.count,
                ..Default::default()
            };
            return Ok((only_count, true));
        }
        let size = page.encoded_len();
        let header_revision = *self
            .header_revision
            .get_or_insert(page.header.as_ref().map_or(0, |h| h.revision));
        if self.range.revision == 0 {
            self.range.revision = header_revision;
        }
        self.sent += page.kvs.len() as i64;
        let next_key = match page.kvs.last() {
            Some(last) if page.more => {
                let mut key = last.key.to_vec();
                key.push(0);
                Some(key)
            }
            _ => None,
        };
        let last = next_key.is_none() || self.sent == self.total_limit;
        let mut chunk = RangeResponse {
            kvs: page.kvs,
            ..Default::default()
        };
        if last {
            let mut header = page.header.unwrap_or_default();
            header.revision = header_revision;
            chunk.header = Some(header);
            chunk.more = page.more;
            chunk.count = self.sent;
            if let Some(rest) = next_key {
                chunk.count += self.count_from(rest).await?;
            }
            return Ok((chunk, true));
        }
        self.range.key = next_key.unwrap_or_default();
        let target = self.upstream.max_send_bytes;
        self.range.limit =
            next_chunk_limit(self.range.limit, size, target).min(self.total_limit - self.sent);
        Ok((chunk, false))
    }

    /// How many keys lie from `key` to the end of the range at the pinned revision.
    async fn count_from(&self, key: Vec<u8>) -> Result<i64, Status> {
        let count = RangeRequest {
            key,
            count_only: true,
            limit: 0,
            ..self.range.clone()
        };
        Ok(self.read(count).await?.count)
    }

    async fn read(&self, range: RangeRequest) -> Result<RangeResponse, Status> {
        self.upstream
            .call(Retry::ReadOnly, path::RANGE, self.forwarded.request(range))
            .await
            .map(Response::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_limits_double_or_halve_around_the_target_and_stay_positive() {
        assert_eq!(next_chunk_limit(10, 100, 1000), 20, "under half: doubled");
        assert_eq!(
            next_chunk_limit(10, 600, 1000),
            10,
            "within [0.5x, 2x]: kept"
        );
        assert_eq!(next_chunk_limit(10, 2001, 1000), 5, "over twice: halved");
        assert_eq!(
            next_chunk_limit(1, 5000, 1000),
            1,
            "never 0, which means no limit"
        );
        assert_eq!(next_chunk_limit(i64::MAX, 0, 1000), i64::MAX);
    }

    #[test]
    fn requests_are_refused_as_etcd_3_7_refuses_them() {
        let base = RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        };
        assert!(check(&base).is_ok());
        let key_ascending = RangeRequest {
            sort_order: range_request::SortOrder::Ascend as i32,
            ..base.clone()
        };
        assert!(check(&key_ascending).is_ok());
        let cases = [
            (
                RangeRequest::default(),
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                RangeRequest {
                    sort_order: 9,
                    ..base.clone()
                },
                Code::InvalidArgument,
                "etcdserver: invalid sort option",
            ),
            (
                RangeRequest {
                    sort_order: range_request::SortOrder::Descend as i32,
                    ..base.clone()
                },
                Code::Unimplemented,
                "RangeStream does not support custom sort orders",
            ),
            (
                RangeRequest {
                    sort_order: range_request::SortOrder::Ascend as i32,
                    sort_target: range_request::SortTarget::Value as i32,
                    ..base.clone()
                },
                Code::Unimplemented,
                "RangeStream does not support custom sort orders",
            ),
            (
                RangeRequest {
                    max_create_revision: 3,
                    ..base.clone()
                },
                Code::Unimplemented,
                "RangeStream does not support revision filters",
            ),
        ];
        for (request, code, message) in cases {
            let refused = check(&request).expect_err(message);
            assert_eq!((refused.code(), refused.message()), (code, message));
        }
    }
}
