//! The production proxy serves the model etcd over turmoil: a put, a get and a watch through it see the model.

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{PutRequest, RangeRequest, WatchCreateRequest, WatchRequest};
use sim::topology::{channel, etcd_client, proxy_authority};
use sim::world::{Settings, World};

fn quiet_settings(seed: u64) -> Settings {
    Settings::quiet(seed, 3)
}

#[test]
fn tonic_and_etcd_client_reach_the_model_through_the_proxy() {
    let mut world = World::new(quiet_settings(1));
    let cluster = world.cluster.clone();
    world.client("c0", async move {
        let channel = channel(&proxy_authority());
        let mut kv = KvClient::new(channel.clone());
        let put = kv
            .put(PutRequest {
                key: b"greeting".to_vec(),
                value: b"hello".to_vec(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let header = put.header.unwrap();
        assert_eq!(header.revision, 2);
        assert_eq!(header.cluster_id, cluster.cluster_id());

        let mut watch = WatchClient::new(channel);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: b"greeting".to_vec(),
                start_revision: 1,
                ..Default::default()
            })),
        })
        .await?;
        let mut events = watch
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        let created = events.message().await?.unwrap();
        assert!(created.created);
        let first = events.message().await?.unwrap();
        assert_eq!(first.events[0].kv.as_ref().unwrap().value, &b"hello"[..]);

        let mut client = etcd_client("proxy:23790").await?;
        let got = client.get("greeting", None).await?;
        assert_eq!(got.kvs()[0].value(), b"hello");
        let range = kv
            .range(RangeRequest {
                key: b"greeting".to_vec(),
                ..Default::default()
            })
            .await?
            .into_inner();
        assert_eq!(range.count, 1);
        drop(tx);
        Ok(())
    });
    let finished = world.run();
    assert_eq!(finished.sim_error, None);
    assert_eq!(finished.proxy_exits.len(), 1);
    assert_eq!(finished.proxy_exits[0].result, Ok(()));
    assert_eq!(finished.proxy_exits[0].tasks_left, 0);
    assert_eq!(finished.cluster.history().revisions.len(), 1);
}

/// The hygiene check counts tasks with tokio's runtime metrics; this proves the count sees tasks on a turmoil host.
#[test]
fn runtime_metrics_count_tasks_on_a_simulated_host() {
    let mut sim = turmoil::Builder::new().build();
    sim.client("c", async {
        let alive = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = alive();
        let sleeper = tokio::spawn(tokio::time::sleep(Duration::from_secs(60)));
        assert_eq!(alive(), before + 1);
        sleeper.abort();
        let _ = sleeper.await;
        assert_eq!(alive(), before);
        Ok(())
    });
    sim.run().unwrap();
}
