//! Handshakes: each request is a whole short-lived client. It opens a new connection to the target (TCP, with
//! `--tls` the full TLS handshake, then HTTP/2's), makes one call, a linearizable Range of one hot key (relayed to
//! etcd by both proxies alike, so the call costs them what it costs in the range scenario), and closes the
//! connection. A proxy's CPU per request is its CPU per handshake; in the clear, per connection set up.

use futures::FutureExt;
use futures::future::BoxFuture;

use super::Operation;
use super::dial::Dialer;
use super::kv::Range;

/// A new connection per request, with `call` made on it.
pub struct Handshake {
    pub call: Range,
}

impl Operation<Dialer> for Handshake {
    fn call(&self, dialer: Dialer, draw: u64) -> BoxFuture<'static, Result<(), tonic::Status>> {
        let call = self.call.clone();
        async move {
            let channel = dialer.dial().await.map_err(tonic::Status::unavailable)?;
            // The channel is the connection's only handle: it closes when the call's future drops it.
            call.call(channel, draw).await
        }
        .boxed()
    }
}
