//! A hung member (`Fault::Hang`, stopped as by SIGSTOP) accepts connections and answers nothing, not even on the
//! connections it already had, until it resumes; then it serves what it had been sent, on the same connections.
//! Meanwhile the other members elect another leader, which Status reports.

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    PutRequest, RangeRequest, StatusRequest, StatusResponse, WatchCreateRequest, WatchRequest,
};
use sim::fault::{Fault, FaultPlan, Scheduled};
use sim::topology::{Dialer, member_authority};
use sim::world::{Settings, World};
use tonic::transport::Channel;

const HANG_AT: Duration = Duration::from_secs(1);
const RESUME_AT: Duration = Duration::from_secs(3);

fn at() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

async fn status(channel: Channel) -> Result<StatusResponse, tonic::Status> {
    let mut client = MaintenanceClient::new(channel);
    Ok(client.status(StatusRequest {}).await?.into_inner())
}

#[test]
fn a_hung_member_accepts_answers_nothing_and_carries_on_when_resumed() {
    let mut settings = Settings::quiet(5, 3);
    settings.plan = Some(FaultPlan {
        faults: vec![
            Scheduled {
                at: HANG_AT,
                fault: Fault::Hang(0),
            },
            Scheduled {
                at: RESUME_AT,
                fault: Fault::Resume(0),
            },
        ],
    });
    let mut world = World::new(settings);
    let cluster = world.cluster.clone();
    let dialer: Dialer = world.dialer();
    world.client("c", async move {
        let (m0, m1) = (
            dialer.channel(&member_authority(0)),
            dialer.channel(&member_authority(1)),
        );
        // A watcher on m0, created before the hang; the members ping it every 500 ms (world::MEMBER_KEEPALIVE).
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: b"k".to_vec(),
                ..Default::default()
            })),
        })
        .await?;
        let mut events = WatchClient::new(m0.clone())
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        assert!(events.message().await?.expect("created").created);
        let before = status(m1.clone()).await?;
        assert_eq!(before.leader, cluster.member_id(0), "m0 leads at first");

        tokio::time::sleep(HANG_AT + Duration::from_millis(200) - at()).await;
        assert!(cluster.is_hung(0));
        // The kernel of a stopped process still completes the TCP handshake.
        tokio::time::timeout(
            Duration::from_millis(100),
            turmoil::net::TcpStream::connect(member_authority(0).as_str()),
        )
        .await
        .expect("a hung member's listener accepts")?;
        // A call on the connection it already had waits for the resume.
        let pending = tokio::spawn({
            let m0 = m0.clone();
            async move {
                let answer = KvClient::new(m0)
                    .range(RangeRequest {
                        key: b"k".to_vec(),
                        ..Default::default()
                    })
                    .await;
                (answer.map(|a| a.into_inner().count), at())
            }
        });
        // Status on a new connection is not answered either.
        let silent = tokio::time::timeout(
            Duration::from_secs(1),
            status(dialer.channel(&member_authority(0))),
        )
        .await;
        assert!(silent.is_err(), "a hung member answered Status: {silent:?}");
        // The others elected the next member, in a new term.
        let during = status(m1.clone()).await?;
        assert_eq!(during.leader, cluster.member_id(1));
        assert!(during.raft_term > before.raft_term, "{during:?}");
        // A write through m1 reaches m0's watcher only once m0 runs again, on the same stream.
        KvClient::new(m1.clone())
            .put(PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await?;
        let event = events.message().await?.expect("the put's event");
        assert!(
            at() >= RESUME_AT,
            "an event from a hung member at {:?}",
            at()
        );
        assert_eq!(event.events[0].kv.as_ref().expect("kv").value, &b"v"[..]);
        let (count, answered_at) = pending.await?;
        assert_eq!(count?, 1, "served after the resume, so after the put");
        assert!(answered_at >= RESUME_AT, "answered at {answered_at:?}");
        // Resumed, it answers again, and names the leader elected while it was stopped.
        let after = status(m0).await?;
        assert_eq!(after.leader, cluster.member_id(1));
        assert_eq!(after.raft_term, during.raft_term);
        Ok(())
    });
    let finished = world.run();
    assert_eq!(finished.sim_error, None);
    let lines = finished.trace.lines();
    assert!(
        lines.iter().any(|l| l.contains("fault Hang(0)")),
        "{lines:?}"
    );
}
