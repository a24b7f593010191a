//! One supervisor for every long-lived upstream stream: each watch hub's Watch stream (the range cache's among them,
//! through its own watch service) and each keep-alive coalescer's LeaseKeepAlive stream. It opens the stream on the
//! active endpoint when there is work for it, re-opens it when it ends, and says once what each end means:
//! - the proxy moved to another endpoint (a failover, a move to a member with a leader): re-opened there at once;
//! - etcd's "no leader": the proxy looks for a member with one, and the stream's clients that require a leader get
//!   the error, as etcd ends their streams;
//! - an endpoint failure (a broken connection, a member that does not answer in time): reported, so the proxy
//!   fails over, and re-opened after a pause;
//! - any other error is etcd refusing the stream's caller: the stream answers its clients as etcd would;
//! - the pause between re-opens after failures grows from [`REOPEN_BACKOFF_START`] to [`REOPEN_BACKOFF_MAX`], and
//!   an end that is not a failure resets it.
//!
//! The bounds the streams use to notice a member that stopped answering are here too, so that each is named once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tonic::Status;

use super::{Active, NO_LEADER, Upstream};
use crate::error;
use crate::otel::span::OpenSpan;

/// How often a stream looks at its own health (answers overdue, progress to ask again). A move to another endpoint
/// is not waited for: a stream leaves in the instant the proxy moves ([`Upstream::abandoned`]).
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// After this long without a message from etcd on a Watch stream, the proxy asks for progress: a stream whose
/// watchers see no events is quiet on a healthy member too, so silence alone proves nothing...
pub const WATCH_PROBE_AFTER_SILENCE: Duration = Duration::from_secs(5);
/// ...and if that request (or a create) stays unanswered this long, the member is taken as failed. A member that
/// keeps sending events but no longer hears the proxy would otherwise leave new watchers unanswered.
pub const WATCH_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// A lease renewal unanswered this long means the member cannot serve (a partition, a hung member). Shorter than
/// the Watch bound: a healthy member answers a renewal at once, and a lease may have only a few seconds to live.
pub const RENEWAL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long renewals whose answers were lost wait for etcd to say whether they were performed (LeaseTimeToLive, see
/// `lease::confirm`) before they are sent again anyway. Short: the lease may be about to expire, and a member whose
/// answers are lost on their way back may well have renewed what it is sent, which is the one renewal that then keeps
/// the lease alive. Past this bound the proxy falls back to renewing, as it would with no lookup at all.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(100);
/// The pause before re-opening a stream after a failure, doubled after each failure up to the maximum.
pub const REOPEN_BACKOFF_START: Duration = Duration::from_millis(50);
pub const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Whether a stream has work before it is opened.
pub enum Ready {
    /// Open it now.
    Serve,
    /// Not yet (its credentials could not be had): ask again after the pause.
    Retry,
    /// Nothing will ever need it again: the supervisor ends.
    Finish,
}

/// How one upstream stream ended.
pub enum Ended {
    /// Nothing will ever need it again.
    Finished,
    /// It ended without a failure (nothing left to do on it, the proxy moved, a fresh token wanted): open the next
    /// one at once.
    Reopen,
    /// It failed with this status.
    Failed(Status),
}

/// One kind of long-lived upstream stream, as the supervisor drives it.
pub trait Supervised {
    /// What the stream is, for logs ("watch", "keep-alive").
    const KIND: &'static str;

    /// Waits until the stream has work, readying what it needs to open (a token, etcd's version).
    fn ready(&mut self) -> impl Future<Output = Ready> + Send;

    /// Serves one upstream stream on `pick` until it ends; with tracing on, `span` gets the stream's own span
    /// (see [`crate::otel::own_stream`]), which the supervisor ends.
    fn serve(
        &mut self,
        pick: &Active,
        span: &mut Option<OpenSpan>,
    ) -> impl Future<Output = Ended> + Send;

    /// The member answered "no leader": the clients that require one get `status`.
    fn leader_lost(&mut self, status: &Status);

    /// etcd refused the stream's caller with `status` (not an endpoint failure, not "no leader").
    fn refused(&mut self, pick: &Active, status: &Status) -> impl Future<Output = ()> + Send;

    /// After a stream ended and before the next one opens (after the pause, if any).
    fn lost(&mut self);
}

/// Runs `stream`'s upstream streams, one after another, until it finishes.
pub async fn supervise<S: Supervised>(upstream: &Arc<Upstream>, stream: &mut S) {
    let mut backoff = Backoff::default();
    loop {
        match stream.ready().await {
            Ready::Serve => {}
            Ready::Retry => {
                backoff.pause().await;
                continue;
            }
            Ready::Finish => return,
        }
        let pick = upstream.serving().await;
        let mut span = None;
        let ended = stream.serve(&pick, &mut span).await;
        if let Some(span) = span {
            span.end(match &ended {
                Ended::Failed(status) => status.code(),
                _ => tonic::Code::Ok,
            });
        }
        match ended {
            Ended::Finished => return,
            Ended::Reopen => backoff = Backoff::default(),
            Ended::Failed(status) => {
                if status.message() == NO_LEADER {
                    // The member answers, without a leader: another member may have one (during an election,
                    // none has, and nothing moves).
                    upstream.seek_leader(&pick);
                    stream.leader_lost(&status);
                } else if error::is_endpoint_failure(&status) {
                    upstream.report_failure(&pick);
                } else {
                    stream.refused(&pick, &status).await;
                }
                tracing::debug!(%status, kind = S::KIND, "upstream stream ended; re-opening");
                backoff.pause().await;
            }
        }
        stream.lost();
    }
}

/// The pause before the next re-open.
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: REOPEN_BACKOFF_START,
        }
    }
}

impl Backoff {
    async fn pause(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(REOPEN_BACKOFF_MAX);
    }
}
