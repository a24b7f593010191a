//! The response side of a client stream fed by a proxy task (a watch hub, the keep-alive coalescer): items in
//! order, an out-of-band status that ends the stream (a slow consumer, a bad request), and the proxy's shutdown.

use tokio::sync::{mpsc, watch};
use tonic::Status;

use super::BoxStream;

/// What feeds one client stream.
pub struct Outbound<T> {
    /// Items in order; the stream ends cleanly when every sender is gone.
    pub items: mpsc::Receiver<T>,
    /// A status that ends the stream at once.
    pub abort: mpsc::Receiver<Status>,
    /// Becomes true when the proxy shuts down: the stream ends with Unavailable so the client reconnects.
    pub shutdown: watch::Receiver<bool>,
}

impl<T: Send + 'static> Outbound<T> {
    /// The client's response stream. `into_response` turns an item into what the client receives (an `Err` ends
    /// the stream); `on_end` is kept until the stream is dropped, for what must happen when the client is gone.
    pub fn into_stream<R, F>(self, into_response: F, on_end: impl Send + 'static) -> BoxStream<R>
    where
        R: Send + 'static,
        F: Fn(T) -> Result<R, Status> + Send + 'static,
    {
        let state = (self, into_response, on_end, false);
        Box::pin(futures::stream::unfold(
            state,
            |(mut outbound, into_response, on_end, done)| async move {
                if done {
                    return None;
                }
                let item = tokio::select! {
                    biased;
                    Some(status) = outbound.abort.recv() => Err(status),
                    _ = super::shutting_down(&mut outbound.shutdown) => {
                        Err(Status::unavailable("etcd-grpc-proxy: shutting down"))
                    }
                    item = outbound.items.recv() => match item {
                        Some(item) => into_response(item),
                        // Every sender is gone: a clean end.
                        None => return None,
                    },
                };
                let done = item.is_err();
                Some((item, (outbound, into_response, on_end, done)))
            },
        ))
    }
}

/// Runs a closure when dropped: what a client stream does when the client is gone.
pub struct OnDrop<F: FnMut() + Send>(pub F);

impl<F: FnMut() + Send> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn channels() -> (
        mpsc::Sender<u32>,
        mpsc::Sender<Status>,
        watch::Sender<bool>,
        Outbound<u32>,
    ) {
        let (items_tx, items) = mpsc::channel(4);
        let (abort_tx, abort) = mpsc::channel(1);
        let (shutdown_tx, shutdown) = watch::channel(false);
        (
            items_tx,
            abort_tx,
            shutdown_tx,
            Outbound {
                items,
                abort,
                shutdown,
            },
        )
    }

    #[tokio::test]
    async fn items_flow_until_the_senders_are_gone_then_the_stream_ends_cleanly() {
        let (items, _abort, _shutdown, outbound) = channels();
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = dropped.clone();
        let mut stream =
            outbound.into_stream(Ok, OnDrop(move || flag.store(true, Ordering::SeqCst)));
        items.send(1).await.unwrap();
        items.send(2).await.unwrap();
        drop(items);
        assert_eq!(stream.next().await.unwrap().unwrap(), 1);
        assert_eq!(stream.next().await.unwrap().unwrap(), 2);
        assert!(stream.next().await.is_none());
        drop(stream);
        assert!(
            dropped.load(Ordering::SeqCst),
            "on_end runs when the stream is dropped"
        );
    }

    #[tokio::test]
    async fn an_abort_or_the_shutdown_ends_the_stream_with_a_status() {
        let (_items, abort, _shutdown, outbound) = channels();
        let mut stream = outbound.into_stream(Ok, ());
        abort
            .send(Status::resource_exhausted("full"))
            .await
            .unwrap();
        assert_eq!(
            stream.next().await.unwrap().unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        assert!(stream.next().await.is_none());

        let (_items, _abort, shutdown, outbound) = channels();
        let mut stream = outbound.into_stream(Ok, ());
        shutdown.send(true).unwrap();
        assert_eq!(
            stream.next().await.unwrap().unwrap_err().code(),
            tonic::Code::Unavailable
        );
    }
}
