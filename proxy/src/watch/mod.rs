//! The Watch service. For now each client stream is forwarded 1:1 to one upstream stream carrying the caller's
//! token; coalescing of watchers is a later step.

use std::sync::Arc;

use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_server::Watch;
use proto::etcdserverpb::{WatchRequest, WatchResponse};
use tonic::{Request, Response, Status, Streaming};

use crate::upstream::{BoxStream, Upstream, forward_bidi};

/// The proxy's Watch service.
pub struct WatchService {
    upstream: Arc<Upstream>,
}

impl WatchService {
    pub fn new(upstream: Arc<Upstream>) -> Self {
        Self { upstream }
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = BoxStream<WatchResponse>;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        forward_bidi!(self.upstream, request, WatchClient::watch)
    }
}
