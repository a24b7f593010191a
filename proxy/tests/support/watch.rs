//! A raw client Watch stream on a tonic channel, for tests that drive the etcd v3 Watch API request by request
//! (client-chosen IDs, progress requests, half-close), against etcd or the proxy alike.

use std::time::Duration;

use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

/// The longest a test waits for one watch response: far above any answer's time.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A create request for `key` from the current revision, with the client-chosen `watch_id` (0: etcd picks).
pub fn create(key: &str, watch_id: i64) -> WatchRequest {
    create_from(key, watch_id, 0)
}

/// A create request for `key` from `start_revision`, with the client-chosen `watch_id` (0: etcd picks).
pub fn create_from(key: &str, watch_id: i64, start_revision: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.into(),
            watch_id,
            start_revision,
            ..Default::default()
        })),
    }
}

/// A progress request.
pub fn progress() -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
    }
}

/// A client Watch stream: requests go in through `requests` (`None` once half-closed), answers come out of
/// `responses`.
pub struct WatchStream {
    pub requests: Option<mpsc::Sender<WatchRequest>>,
    responses: Streaming<WatchResponse>,
}

impl WatchStream {
    /// Opens a stream and sends `first` (etcd answers the stream's headers only with its first response).
    pub async fn open(channel: Channel, first: WatchRequest) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        tx.send(first).await.unwrap();
        let responses = WatchClient::new(channel)
            .watch(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Self {
            requests: Some(tx),
            responses,
        }
    }

    pub async fn send(&self, request: WatchRequest) {
        self.requests.as_ref().unwrap().send(request).await.unwrap();
    }

    /// The next response; panics with `what` if none comes within [`DEADLINE`].
    pub async fn expect(&mut self, what: &str) -> WatchResponse {
        tokio::time::timeout(DEADLINE, self.responses.next())
            .await
            .unwrap_or_else(|_| panic!("{what}: no watch response within {DEADLINE:?}"))
            .expect("the stream is open")
            .expect("no error")
    }

    /// The next response.
    pub async fn next(&mut self) -> WatchResponse {
        self.expect("a watch response").await
    }
}
