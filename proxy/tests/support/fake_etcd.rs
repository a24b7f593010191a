//! A fake etcd member for what real etcd cannot be made to do on cue (a member that lags behind the others):
//! it answers every unary call with what a test's function returns for it, records every request, and can be
//! stopped like a crashed member (its listener and connections close).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use proxy::upstream::codec::RawCodec;
use tokio::task::{JoinHandle, JoinSet};
use tonic::{Request, Response, Status};

/// What the fake answers a call on `path` with `request`'s bytes.
pub type Answer = Arc<dyn Fn(&str, &Bytes) -> Result<Bytes, Status> + Send + Sync>;

/// A running fake member.
pub struct FakeEtcd {
    pub addr: String,
    received: Arc<Mutex<Vec<(String, Bytes)>>>,
    serving: JoinHandle<()>,
}

impl FakeEtcd {
    /// Listens on a free loopback port and answers with `answer`.
    pub async fn start(answer: Answer) -> Self {
        let mut listener = proxy::net::Net::bind(&proxy::net::TokioNet, ([127, 0, 0, 1], 0).into())
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("a bound address").to_string();
        let received: Arc<Mutex<Vec<(String, Bytes)>>> = Arc::default();
        let record = received.clone();
        let serving = tokio::spawn(async move {
            // Connections live in this set: stopping the fake drops it, which closes them all.
            let mut connections = JoinSet::new();
            while let Ok((accepted, _)) = listener.accept().await {
                let Ok(conn) = accepted.open() else {
                    continue;
                };
                let (answer, record) = (answer.clone(), record.clone());
                let service = hyper::service::service_fn(move |request: http::Request<_>| {
                    let (answer, record) = (answer.clone(), record.clone());
                    async move { Ok::<_, Infallible>(serve(request, answer, record).await) }
                });
                connections.spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(conn), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            received,
            serving,
        }
    }

    /// The requests received on `path`, in order.
    pub fn received(&self, path: &str) -> Vec<Bytes> {
        let received = self.received.lock().expect("not poisoned");
        received
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Stops answering, as a crashed member: the listener and every connection close.
    pub fn stop(&self) {
        self.serving.abort();
    }
}

impl Drop for FakeEtcd {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

async fn serve(
    request: http::Request<hyper::body::Incoming>,
    answer: Answer,
    record: Arc<Mutex<Vec<(String, Bytes)>>>,
) -> http::Response<tonic::body::Body> {
    let path = request.uri().path().to_owned();
    let service = tower::service_fn(move |request: Request<Bytes>| {
        let message = request.into_inner();
        record
            .lock()
            .expect("not poisoned")
            .push((path.clone(), message.clone()));
        let answered = answer(&path, &message).map(Response::new);
        async move { answered }
    });
    tonic::server::Grpc::new(RawCodec)
        .unary(service, request)
        .await
}
