//! The response side of a client stream fed by a proxy task (a watch hub, the keep-alive coalescer): items in
//! order, an out-of-band status that ends the stream (a bad request), a status that ends it after the items sent
//! before it (a slow consumer), and the proxy's shutdown.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use super::BoxStream;

/// What feeds one client stream.
pub struct Outbound<T> {
    /// Items in order; the stream ends cleanly when every sender is gone.
    pub items: mpsc::Receiver<T>,
    /// A status that ends the stream at once.
    pub abort: mpsc::Receiver<Status>,
    /// A status that ends the stream once every item went out: it is sent before the item senders are dropped, so
    /// it is read when `items` reports its end. Without one (or nothing sent on it), that end is clean.
    pub finish: Option<mpsc::Receiver<Status>>,
    /// Becomes true when the proxy shuts down: the stream ends with Unavailable so the client reconnects.
    pub shutdown: watch::Receiver<bool>,
}

impl<T: Send + 'static> Outbound<T> {
    /// The client's response stream. `into_response` turns an item into what the client receives (an `Err` ends
    /// the stream); `on_end` is kept until the stream is dropped, for what must happen when the client is gone.
    pub fn into_stream<R, F>(
        self,
        into_response: F,
        on_end: impl Send + Unpin + 'static,
    ) -> BoxStream<R>
    where
        R: Send + 'static,
        F: Fn(T) -> Result<R, Status> + Send + Unpin + 'static,
    {
        let mut shutdown = self.shutdown;
        Box::pin(OutboundStream {
            items: self.items,
            abort: self.abort,
            finish: self.finish,
            // Made once per stream: a watch stream can carry hundreds of thousands of items, and building the
            // shutdown wait anew for each (as a `select!` per item would) showed up in profiles.
            shutdown: Box::pin(async move { super::shutting_down(&mut shutdown).await }),
            into_response,
            _on_end: on_end,
            done: false,
        })
    }
}

/// See [`Outbound::into_stream`]. Checks, in this order: an abort, the proxy's shutdown, the next item (and after the
/// last one, the finishing status).
struct OutboundStream<T, F, E> {
    items: mpsc::Receiver<T>,
    abort: mpsc::Receiver<Status>,
    finish: Option<mpsc::Receiver<Status>>,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    into_response: F,
    _on_end: E,
    done: bool,
}

impl<T, R, F, E> Stream for OutboundStream<T, F, E>
where
    F: Fn(T) -> Result<R, Status> + Unpin,
    E: Unpin,
{
    type Item = Result<R, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let next = if let Poll::Ready(Some(status)) = this.abort.poll_recv(cx) {
            Err(status)
        } else if this.shutdown.as_mut().poll(cx).is_ready() {
            Err(Status::unavailable("etcd-grpc-proxy: shutting down"))
        } else {
            match this.items.poll_recv(cx) {
                Poll::Ready(Some(item)) => (this.into_response)(item),
                // Every sender is gone: the finishing status if one was sent, else a clean end.
                Poll::Ready(None) => {
                    this.done = true;
                    return match this.finish.as_mut().map(mpsc::Receiver::try_recv) {
                        Some(Ok(status)) => Poll::Ready(Some(Err(status))),
                        _ => Poll::Ready(None),
                    };
                }
                Poll::Pending => return Poll::Pending,
            }
        };
        this.done = next.is_err();
        Poll::Ready(Some(next))
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
                finish: None,
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
    async fn a_finishing_status_ends_the_stream_after_the_items_sent_before_it() {
        let (items, abort, _shutdown, mut outbound) = channels();
        let (finish, finish_rx) = mpsc::channel(1);
        outbound.finish = Some(finish_rx);
        let mut stream = outbound.into_stream(Ok, ());
        items.send(1).await.unwrap();
        items.send(2).await.unwrap();
        finish
            .send(Status::resource_exhausted("full"))
            .await
            .unwrap();
        drop(items);
        assert_eq!(stream.next().await.unwrap().unwrap(), 1);
        assert_eq!(stream.next().await.unwrap().unwrap(), 2);
        assert_eq!(
            stream.next().await.unwrap().unwrap_err().code(),
            tonic::Code::ResourceExhausted,
            "the status comes after the items"
        );
        assert!(stream.next().await.is_none());
        drop(abort);
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
