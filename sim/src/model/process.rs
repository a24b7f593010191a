//! A member's process as the faults leave it, and who leads the cluster.
//!
//! A member runs, is crashed (its host is gone), or is *hung*: stopped as by SIGSTOP. A hung member's kernel still
//! completes TCP handshakes and keeps its connections open, but the process reads nothing, writes nothing and runs
//! no timer until it is resumed; then it carries on where it stopped (what it had read is served). [`serve`] runs
//! each connection through [`WhileRunning`] and gives hyper a [`ProcessTimer`], so neither the connection nor its
//! HTTP/2 keep-alive makes progress while the member is hung.
//!
//! [`Leadership`] picks the leader among the members that run and are not hung: a crashed or hung member cannot
//! lead (its followers elect another, a new term), a member cut off from the proxy still can (partitions only cut
//! proxy↔member links; the members still hear each other).
//!
//! [`serve`]: super::serve

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use super::cluster::Cluster;

/// When a member was stopped, in the cluster's virtual time ([`Cluster::now`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pause {
    /// Since when it is hung (`None`: it runs).
    pub since: Option<Duration>,
    /// How long it was hung before, in all.
    pub total: Duration,
}

impl Pause {
    pub fn is_hung(&self) -> bool {
        self.since.is_some()
    }

    /// How long the process has run by virtual time `now`: `now` less the time it spent hung. Its timers measure
    /// this, so a timer does not expire while its process is stopped.
    pub fn running_time(&self, now: Duration) -> Duration {
        let hung_now = self
            .since
            .map_or(Duration::ZERO, |since| now.saturating_sub(since));
        now.saturating_sub(self.total + hung_now)
    }

    pub(super) fn hang(&mut self, now: Duration) {
        self.since.get_or_insert(now);
    }

    pub(super) fn resume(&mut self, now: Duration) {
        if let Some(since) = self.since.take() {
            self.total += now.saturating_sub(since);
        }
    }
}

/// Which members can lead and which one does. Elections are instant: the model has no raft, so there is no
/// leaderless interval after a leader is lost (etcd has about an election timeout of one).
#[derive(Clone, Debug)]
pub struct Leadership {
    crashed: Vec<bool>,
    hung: Vec<bool>,
    leader: Option<usize>,
}

impl Leadership {
    /// Every member runs; the first leads.
    pub fn new(members: usize) -> Self {
        Self {
            crashed: vec![false; members],
            hung: vec![false; members],
            leader: Some(0),
        }
    }

    pub fn leader(&self) -> Option<usize> {
        self.leader
    }

    fn can_lead(&self, member: usize) -> bool {
        !self.crashed[member] && !self.hung[member]
    }

    /// Records a change of one member's process and re-elects if the leader can no longer lead (or there was none);
    /// returns whether a new leader was elected (a new term). The next member after the old leader, in order, that
    /// can lead wins: deterministic, and not always the same member.
    pub fn set(&mut self, member: usize, crashed: bool, hung: bool) -> bool {
        self.crashed[member] = crashed;
        self.hung[member] = hung;
        if self.leader.is_some_and(|l| self.can_lead(l)) {
            return false;
        }
        let members = self.crashed.len();
        let after = self.leader.map_or(0, |l| l + 1);
        let next = (0..members)
            .map(|i| (after + i) % members)
            .find(|&m| self.can_lead(m));
        self.leader = next;
        next.is_some()
    }
}

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

/// The per-member pause signals of a cluster.
pub(super) fn pause_signals(members: usize) -> Vec<watch::Sender<Pause>> {
    (0..members)
        .map(|_| watch::Sender::new(Pause::default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_time_leaves_out_the_time_hung() {
        let mut pause = Pause::default();
        let s = Duration::from_secs;
        assert_eq!(pause.running_time(s(3)), s(3));
        pause.hang(s(3));
        assert_eq!(pause.running_time(s(5)), s(3));
        pause.resume(s(6));
        assert_eq!(pause.running_time(s(8)), s(5));
        pause.hang(s(9));
        assert_eq!(pause.running_time(s(10)), s(6));
    }

    #[test]
    fn a_crashed_or_hung_leader_is_replaced_by_the_next_member_that_can_lead() {
        let mut leadership = Leadership::new(3);
        assert_eq!(leadership.leader(), Some(0));
        // A follower that hangs changes nothing.
        assert!(!leadership.set(2, false, true));
        assert_eq!(leadership.leader(), Some(0));
        // The leader crashes: member 1 is next (2 is hung).
        assert!(leadership.set(0, true, false));
        assert_eq!(leadership.leader(), Some(1));
        // Member 0 comes back as a follower.
        assert!(!leadership.set(0, false, false));
        assert_eq!(leadership.leader(), Some(1));
        // Member 1 hangs: 2 is still hung, so 0 leads.
        assert!(leadership.set(1, false, true));
        assert_eq!(leadership.leader(), Some(0));
        // With nobody able to lead there is no leader, until one can again.
        assert!(!leadership.set(0, true, false));
        assert_eq!(leadership.leader(), None);
        assert!(leadership.set(2, false, false));
        assert_eq!(leadership.leader(), Some(2));
    }

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
