//! The leasing session: a lease of the proxy's own, kept alive through the keep-alive coalescer, and one watch
//! stream on which a watcher on the leasing prefix hears revocations and a watcher per owned key keeps that key's
//! entry current (writes from clients that know nothing of leasing included).
//!
//! The session is *known alive* only until the send time of its last answered renewal plus the TTL etcd gave it: a
//! lower bound of when etcd expires the lease. Past that instant no read is answered locally (etcd #19091's defect:
//! Go's leasing client serves reads after its session expired, because it learns of expiry only from a keep-alive
//! answer). Any loss (the lease gone, not renewed in time, the watch stream or the prefix watcher ended) clears
//! every entry and revokes the lease (its ownership keys go at once, so writers waiting on them go on), and a new
//! session starts.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    WatchCreateRequest, WatchResponse,
};
use proto::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;

use super::keys::OwnershipKeys;
use super::owned::{Owned, PREFIX_WATCH_ID, Rescind};
use super::protocol::Calls;
use crate::metrics::Metrics;
use crate::upstream::{path, shutting_down};
use crate::watch::{LocalStream, StreamHandle, WatchService};

/// The pause before a new session after one could not start.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// How long a stopping proxy waits for etcd to revoke its session's lease.
const REVOKE_WAIT: Duration = Duration::from_secs(2);

/// A session that is running.
pub struct Live {
    pub lease: i64,
    /// Until when the lease is known alive on etcd.
    pub alive_until: Instant,
    /// The session's watch stream, on which key watchers are created.
    pub watch: StreamHandle,
}

/// The state the session's actor and the calls share.
#[derive(Default)]
pub struct State {
    pub owned: Owned,
    /// The running session, once its prefix watcher is confirmed.
    pub live: Option<Live>,
    /// Counts sessions, so that an acquisition begun in one is not kept in the next.
    pub generation: u64,
    /// A lease etcd said it does not know.
    pub lease_gone: Option<i64>,
}

impl State {
    /// The lease and generation of a session known alive at `now`.
    pub fn alive(&self, now: Instant) -> Option<(i64, u64)> {
        self.live
            .as_ref()
            .filter(|live| now < live.alive_until)
            .map(|live| (live.lease, self.generation))
    }
}

/// The shared state behind a lock, and the calls' way to report that etcd no longer knows the session's lease.
#[derive(Default)]
pub struct Shared {
    state: Mutex<State>,
    lease_gone: tokio::sync::Notify,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// etcd answered that the session's lease is not found (revoked behind the proxy's back, or expired): the
    /// session ends now rather than at its next renewal.
    pub fn report_lease_gone(&self, lease: i64) {
        self.lock().lease_gone = Some(lease);
        self.lease_gone.notify_one();
    }
}

/// Whether etcd's answer says a lease does not exist.
pub fn is_lease_not_found(status: &Status) -> bool {
    status.code() == tonic::Code::NotFound && status.message().contains("lease not found")
}

/// What ended a session.
#[derive(Debug)]
enum Ended {
    Lost(&'static str),
    Shutdown,
}

/// Runs sessions one after another until the proxy shuts down.
pub async fn run(
    shared: Arc<Shared>,
    calls: Arc<Calls>,
    keys: OwnershipKeys,
    watch: Arc<WatchService>,
    metrics: Metrics,
    ttl: i64,
) {
    let mut shutdown = calls.upstream.shutdown_signal();
    loop {
        let granted = tokio::select! {
            biased;
            _ = shutting_down(&mut shutdown) => return,
            granted = grant(&calls, ttl) => granted,
        };
        let (lease, alive_until, revision) = match granted {
            Ok(granted) => granted,
            Err(status) => {
                tracing::warn!(%status, "cannot start the leasing session; trying again");
                tokio::select! {
                    biased;
                    _ = shutting_down(&mut shutdown) => return,
                    _ = tokio::time::sleep(RETRY_PAUSE) => continue,
                }
            }
        };
        let stream = watch.attach(None, 1024);
        let (start, end) = keys.all();
        stream.handle.create(WatchCreateRequest {
            key: start,
            range_end: end,
            start_revision: revision + 1,
            watch_id: PREFIX_WATCH_ID,
            ..Default::default()
        });
        let session = Session {
            shared: &shared,
            calls: &calls,
            keys: &keys,
            metrics: &metrics,
            lease,
            ttl,
        };
        let ended = session.serve(stream, alive_until, &mut shutdown).await;
        {
            let mut state = shared.lock();
            state.live = None;
            state.generation += 1;
            state.owned.clear();
            metrics.leasing_owned_keys.set(0);
        }
        let revoked = tokio::time::timeout(REVOKE_WAIT, revoke(&calls, lease)).await;
        let why = match &ended {
            Ended::Lost(why) => *why,
            Ended::Shutdown => "the proxy stops",
        };
        match revoked {
            Ok(Ok(())) => tracing::info!(lease, why, "leasing session ended"),
            Ok(Err(status)) => {
                tracing::warn!(lease, why, %status, "leasing session ended; its lease was not revoked")
            }
            Err(_) => tracing::warn!(
                lease,
                why,
                "leasing session ended; revoking its lease timed out"
            ),
        }
        if matches!(ended, Ended::Shutdown) {
            return;
        }
    }
}

/// Grants the session's lease: its id, until when it is known alive, and the revision of the grant.
async fn grant(calls: &Calls, ttl: i64) -> Result<(i64, Instant, i64), Status> {
    let sent = Instant::now();
    let granted: LeaseGrantResponse = calls
        .own(path::LEASE_GRANT, LeaseGrantRequest { ttl, id: 0 })
        .await?;
    if !granted.error.is_empty() {
        return Err(Status::unavailable(granted.error));
    }
    let revision = granted.header.map_or(0, |h| h.revision);
    Ok((granted.id, sent + secs(granted.ttl), revision))
}

async fn revoke(calls: &Calls, lease: i64) -> Result<(), Status> {
    let _: LeaseRevokeResponse = calls
        .own(path::LEASE_REVOKE, LeaseRevokeRequest { id: lease })
        .await?;
    Ok(())
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}

/// One running session.
struct Session<'a> {
    shared: &'a Shared,
    calls: &'a Arc<Calls>,
    keys: &'a OwnershipKeys,
    metrics: &'a Metrics,
    lease: i64,
    ttl: i64,
}

impl Session<'_> {
    async fn serve(
        &self,
        stream: LocalStream,
        mut alive_until: Instant,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Ended {
        let LocalStream {
            handle,
            mut responses,
            mut aborted,
        } = stream;
        let mut handle = Some(handle);
        let (renewed_tx, mut renewed) = mpsc::channel(1);
        let renewer = tokio::spawn(renew(self.calls.clone(), self.lease, self.ttl, renewed_tx));
        let _stop_renewing = AbortOnDrop(renewer);
        loop {
            tokio::select! {
                biased;
                _ = shutting_down(shutdown) => return Ended::Shutdown,
                _ = tokio::time::sleep_until(alive_until) => return Ended::Lost("lease not renewed in time"),
                _ = self.shared.lease_gone.notified() => {
                    // A report about an earlier session's lease does not end this one.
                    if self.shared.lock().lease_gone == Some(self.lease) {
                        return Ended::Lost("lease not found");
                    }
                }
                Some(status) = aborted.recv() => {
                    tracing::debug!(%status, "leasing watch stream ended");
                    return Ended::Lost("watch stream ended");
                }
                renewal = renewed.recv() => match renewal {
                    Some(Ok((sent, ttl))) if ttl > 0 => {
                        alive_until = sent + secs(ttl);
                        if let Some(live) = &mut self.shared.lock().live {
                            live.alive_until = alive_until;
                        }
                    }
                    Some(Ok(_)) => return Ended::Lost("lease gone"),
                    Some(Err(status)) => tracing::debug!(%status, "leasing session renewal failed"),
                    None => return Ended::Lost("renewals ended"),
                },
                response = responses.recv() => {
                    let Some(response) = response else {
                        return Ended::Lost("watch stream ended");
                    };
                    if let Err(why) = self.apply(response, &mut handle, alive_until) {
                        return Ended::Lost(why);
                    }
                }
            }
        }
    }

    /// Applies one watch response.
    fn apply(
        &self,
        response: WatchResponse,
        handle: &mut Option<StreamHandle>,
        alive_until: Instant,
    ) -> Result<(), &'static str> {
        let now = Instant::now();
        let mut state = self.shared.lock();
        let header = response.header.unwrap_or_default();
        if response.watch_id == PREFIX_WATCH_ID {
            if response.canceled {
                return Err("prefix watcher cancelled");
            }
            if response.created {
                if let Some(watch) = handle.take() {
                    state.live = Some(Live {
                        lease: self.lease,
                        alive_until,
                        watch,
                    });
                    tracing::info!(lease = self.lease, "leasing session started");
                }
                return Ok(());
            }
            for event in response.events {
                let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Put);
                let Some(ownership) = event.kv else { continue };
                let Some(key) = self.keys.owned_key(&ownership.key) else {
                    continue;
                };
                let (cancelled, rescind) = state
                    .owned
                    .ownership_event(&key, kind, &ownership, self.lease, now);
                if let (Some(id), Some(live)) = (cancelled, &state.live) {
                    live.watch.cancel(id);
                }
                if let Rescind::Delete {
                    ownership_key,
                    before,
                } = rescind
                {
                    let calls = self.calls.clone();
                    tokio::spawn(async move { calls.rescind(ownership_key, before).await });
                }
            }
            state.owned.forget_old_backoffs(now);
        } else if response.created {
            state.owned.watcher_created(response.watch_id);
        } else if response.canceled {
            if let Some((key, ownership_revision)) = state.owned.watcher_ended(response.watch_id)
                && let Some(ownership_key) = self.keys.of(&key)
            {
                let calls = self.calls.clone();
                tokio::spawn(
                    async move { calls.rescind(ownership_key, ownership_revision + 1).await },
                );
            }
        } else {
            for event in response.events {
                let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Put);
                if let Some(kv) = event.kv {
                    state.owned.key_event(response.watch_id, kind, kv, &header);
                }
            }
        }
        self.metrics
            .leasing_owned_keys
            .set(state.owned.len() as i64);
        Ok(())
    }
}

/// Renews `lease` every third of its TTL, reporting each answer with the instant its renewal was sent.
async fn renew(
    calls: Arc<Calls>,
    lease: i64,
    ttl: i64,
    answers: mpsc::Sender<Result<(Instant, i64), Status>>,
) {
    let every = secs(ttl) / 3;
    loop {
        tokio::time::sleep(every).await;
        let sent = Instant::now();
        let answer = calls.renew(lease).await.map(|renewed| (sent, renewed.ttl));
        if answers.send(answer).await.is_err() {
            return;
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
