//! A member's process as the faults leave it: its connections and timers stand still while it is hung.
//!
//! A member runs, is crashed (its host is gone), or is *hung*: stopped as by SIGSTOP. A hung member's kernel still
//! completes TCP handshakes and keeps its connections open, but the process reads nothing, writes nothing and runs
//! no timer until it is resumed; then it carries on where it stopped (what it had read is served). [`serve`] runs
//! each connection through [`WhileRunning`] and gives hyper a [`ProcessTimer`], so neither the connection nor its
//! HTTP/2 keep-alive makes progress while the member is hung.
//!
//! Who may lead, and the pause state itself, are in [`super::pause`].
//!
//! [`serve`]: super::serve

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio_stream::wrappers::WatchStream;

use super::cluster::Cluster;
use super::pause::Pause;

/// Runs a future only while member `member` is not hung: it is not polled from the moment the member hangs until
/// it resumes, so it reads and writes nothing in between (its wakers fire into the void, and it is polled once on
/// resume to pick up what happened).
pub struct WhileRunning<F> {
    inner: Pin<Box<F>>,
    pauses: WatchStream<Pause>,
    hung: bool,
    /// The pause signal is gone (the cluster was dropped): nothing can hang the member any more.
    free: bool,
}

impl<F: Future> WhileRunning<F> {
    pub fn new(cluster: &Cluster, member: usize, inner: F) -> Self {
        Self {
            inner: Box::pin(inner),
            pauses: WatchStream::new(cluster.pauses(member)),
            hung: false,
            free: false,
        }
    }
}

impl<F: Future> Future for WhileRunning<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Drain the pause changes; a pending poll leaves the waker to be woken by the next change.
        while !this.free {
            match Pin::new(&mut this.pauses).poll_next(cx) {
                Poll::Ready(Some(pause)) => this.hung = pause.is_hung(),
                Poll::Ready(None) => {
                    this.free = true;
                    this.hung = false;
                }
                Poll::Pending => break,
            }
        }
        if this.hung {
            return Poll::Pending;
        }
        this.inner.as_mut().poll(cx)
    }
}

/// hyper's timer for a member's connections: its sleeps measure the member's running time, so a keep-alive ping
/// that was due, or a ping acknowledgement that was awaited, while the member was hung is dealt with after it
/// resumes as if no time had passed, not by closing the connection at once. (etcd's keep-alive goroutine and its
/// reader both wake on resume; the acknowledgement it already received counts.)
#[derive(Clone)]
pub struct ProcessTimer {
    cluster: Cluster,
    member: usize,
}

impl ProcessTimer {
    pub fn new(cluster: Cluster, member: usize) -> Self {
        Self { cluster, member }
    }

    fn sleep_for(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let (cluster, mut pauses) = (self.cluster.clone(), self.cluster.pauses(self.member));
        let sleep = async move {
            let running = |pause: &Pause| pause.running_time(cluster.now());
            let until = running(&pauses.borrow()) + duration;
            loop {
                // A hung process's timers do not run; a closed signal means it can no longer hang.
                let _ = pauses.wait_for(|pause| !pause.is_hung()).await;
                let left = until.saturating_sub(running(&pauses.borrow()));
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left).await;
            }
        };
        Box::pin(ProcessSleep(Mutex::new(Box::pin(sleep))))
    }
}

impl hyper::rt::Timer for ProcessTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_for(duration)
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let deadline = tokio::time::Instant::from_std(deadline);
        self.sleep_for(deadline.saturating_duration_since(tokio::time::Instant::now()))
    }

    fn now(&self) -> std::time::Instant {
        // tokio's clock, which turmoil pauses and steps (as hyper-util's TokioTimer does).
        tokio::time::Instant::now().into_std()
    }
}

/// A [`ProcessTimer`] sleep. hyper wants `Sync`; the future is only ever polled through `&mut`, so a mutex that is
/// never contended provides it.
struct ProcessSleep(Mutex<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Future for ProcessSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let sleep = self
            .get_mut()
            .0
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        sleep.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for ProcessSleep {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timer of a member measures the member's running time: a sleep that a hang interrupts ends that much later.
    #[tokio::test(start_paused = true)]
    async fn a_members_timer_stands_still_while_it_hangs() {
        use hyper::rt::Timer;
        let cluster = Cluster::new(2, 1);
        let timer = ProcessTimer::new(cluster.clone(), 0);
        let started = tokio::time::Instant::now();
        let sleep = timer.sleep(Duration::from_secs(1));
        let other = ProcessTimer::new(cluster.clone(), 1).sleep(Duration::from_secs(1));
        let hang = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            cluster.hang(0);
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.resume(0);
        };
        let (ended, other_ended, ()) = tokio::join!(
            async {
                sleep.await;
                started.elapsed()
            },
            async {
                other.await;
                started.elapsed()
            },
            hang
        );
        assert_eq!(ended, Duration::from_secs(3), "1 s of running time");
        assert_eq!(
            other_ended,
            Duration::from_secs(1),
            "another member's timer runs"
        );
    }
}
