//! The proxy's long-lived upstream streams (keep-alive, watch) follow a failover at once. When the proxy gives up
//! the active member, a write in flight there fails that instant (its outcome unknown); the keep-alive stream and
//! the watch stream must move in the same instant, not at their next periodic look: a renewal left waiting on the
//! member the proxy has left can let a lease expire (simulation seeds lease-scale 20345, fleet 20322 and 20345
//! did, when the streams looked every 500 ms).

use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest, WatchCreateRequest, WatchRequest,
};
use sim::fault::{Fault, FaultPlan, Scheduled};
use sim::topology::{Dialer, member_authority, proxy_authority};
use sim::world::{Settings, World};

/// The proxy's link to m0 (the member it starts on) is cut then, and mended long after the failover.
const CUT_AT: Duration = Duration::from_secs(1);
const MENDED_AT: Duration = Duration::from_secs(6);
/// How often the client renews its lease.
const RENEW_EVERY: Duration = Duration::from_millis(100);
/// How long after the failover the streams may take to serve again from the next member: a few simulation steps
/// (3 ms each) and round trips, well under the half second the streams' periodic checks took.
const FOLLOW_WITHIN: Duration = Duration::from_millis(60);
const LEASE: i64 = 7;
const SEEDS: [u64; 6] = [0, 1, 2, 4, 5, 7];

fn at() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

#[test]
fn keep_alive_and_watch_streams_move_in_the_instant_the_proxy_fails_over() {
    // Seeds whose proxy starts on m0 (it starts on the first member to answer Status with a leader); checked below.
    for seed in SEEDS {
        let mut settings = Settings::quiet(seed, 3);
        settings.plan = Some(FaultPlan {
            faults: vec![
                Scheduled {
                    at: CUT_AT,
                    fault: Fault::Partition(0),
                },
                Scheduled {
                    at: MENDED_AT,
                    fault: Fault::Repair(0),
                },
            ],
        });
        let mut world = World::new(settings);
        let dialer: Dialer = world.dialer();
        let (moved_tx, moved_rx) = tokio::sync::oneshot::channel();
        world.client("c", async move {
            let failover = run(dialer).await?;
            let _ = moved_tx.send(failover);
            Ok(())
        });
        let finished = world.run();
        let history = finished.cluster.history();
        let renewals = &history.leases[&LEASE].keep_alives;
        assert!(
            renewals.iter().any(|&(t, m)| m == 0 && t < CUT_AT),
            "seed {seed}: the proxy was expected to start on m0: {renewals:?}"
        );
        assert_eq!(finished.sim_error, None, "seed {seed}");
        let (failed_over_at, event_at) = moved_rx.blocking_recv().expect("the client finished");
        assert!(
            event_at <= failed_over_at + FOLLOW_WITHIN,
            "seed {seed}: the proxy failed over at {failed_over_at:?}, but its watcher saw a write made then only \
             at {event_at:?}"
        );
        let first_elsewhere = renewals
            .iter()
            .find(|&&(_, member)| member != 0)
            .map(|&(t, _)| t)
            .expect("renewals reached another member after the failover");
        assert!(
            first_elsewhere <= failed_over_at + FOLLOW_WITHIN,
            "seed {seed}: the proxy failed over at {failed_over_at:?}, but its first renewal on another member \
             came at {first_elsewhere:?}: {renewals:?}"
        );
    }
}

/// Keeps a lease alive and a watcher open through the proxy, cuts nothing itself, and returns when the proxy
/// failed over (a write in flight on the cut member fails then) and when the watcher saw a write made at that
/// moment on another member.
async fn run(dialer: Dialer) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    let proxy = dialer.channel(&proxy_authority());
    LeaseClient::new(proxy.clone())
        .lease_grant(LeaseGrantRequest { ttl: 30, id: LEASE })
        .await?;
    let (renew_tx, renew_rx) = tokio::sync::mpsc::channel(16);
    let mut answers = LeaseClient::new(proxy.clone())
        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(renew_rx))
        .await?
        .into_inner();
    tokio::spawn(async move {
        while renew_tx
            .send(LeaseKeepAliveRequest { id: LEASE })
            .await
            .is_ok()
        {
            tokio::time::sleep(RENEW_EVERY).await;
        }
    });
    // Answers are read so that the stream flows; what matters is where the renewals land (the model's history).
    tokio::spawn(async move { while let Some(Ok(_)) = answers.next().await {} });

    let (watch_tx, watch_rx) = tokio::sync::mpsc::channel(4);
    watch_tx
        .send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: b"moved".to_vec(),
                ..Default::default()
            })),
        })
        .await?;
    let mut events = WatchClient::new(proxy.clone())
        .watch(tokio_stream::wrappers::ReceiverStream::new(watch_rx))
        .await?
        .into_inner();
    assert!(events.message().await?.expect("created").created);

    tokio::time::sleep(CUT_AT + RENEW_EVERY - at()).await;
    // A write sent to the cut member waits there; the proxy ends it, outcome unknown, when it gives the member up.
    let stuck = KvClient::new(proxy.clone())
        .put(PutRequest {
            key: b"stuck".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await;
    let failed_over_at = at();
    if let Ok(answer) = stuck {
        return Err(format!(
            "a write on the cut member answered at {failed_over_at:?}: {answer:?}"
        )
        .into());
    }
    KvClient::new(dialer.channel(&member_authority(1)))
        .put(PutRequest {
            key: b"moved".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await?;
    let event = tokio::time::timeout(Duration::from_secs(3), events.message())
        .await?
        .map_err(|status| format!("watch: {status:?}"))?;
    assert!(event.is_some_and(|e| !e.events.is_empty()), "an event");
    Ok((failed_over_at, at()))
}
