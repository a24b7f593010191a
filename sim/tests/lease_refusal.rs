//! etcd 3.5.30 lets a user renew only a lease whose keys it may write, and refuses any other renewal by ending the
//! keep-alive stream. Through the proxy, two keep-alive streams of one client (one token) share one upstream
//! stream: when one renews a lease it may not and the other its own, at the same moment, only the first ends with
//! etcd's refusal, and the other is renewed, as each would be on a stream of its own to etcd. (The same case on
//! real etcd: `proxy/tests/lease_auth.rs`.)

use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest};
use sim::scenario::login::{Login, Session, with_token};
use sim::topology::{Dialer, proxy_authority};
use sim::world::{Settings, World};
use tonic::Code;
use tonic::transport::Channel;

/// Lease IDs chosen by the test: the refused lease has the lower, so that sent in one batch it goes first, and
/// the member, which answers a stream's renewals in order, refuses it with the other still unanswered.
const FORBIDDEN: i64 = 1;
const OWN: i64 = 2;

/// Grants lease `id` as `token` and attaches `key` to it.
async fn lease_with_key(channel: &Channel, token: &str, id: i64, key: &str) -> Result<(), String> {
    LeaseClient::new(channel.clone())
        .lease_grant(with_token(LeaseGrantRequest { ttl: 60, id }, Some(token)))
        .await
        .map_err(|s| format!("grant {id}: {s:?}"))?;
    let put = PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        lease: id,
        ..Default::default()
    };
    KvClient::new(channel.clone())
        .put(with_token(put, Some(token)))
        .await
        .map_err(|s| format!("put {key}: {s:?}"))?;
    Ok(())
}

#[test]
fn a_refused_renewal_ends_only_its_own_stream_not_another_stream_with_the_same_token() {
    for seed in 0..8 {
        let mut world = World::new(Settings::quiet(seed, 1));
        sim::scenario::auth::set_up(&world.cluster);
        let dialer: Dialer = world.dialer();
        world.client("alice", async move {
            run(dialer, seed).await.map_err(Into::into)
        });
        let finished = world.run();
        assert_eq!(finished.sim_error, None, "seed {seed}");
    }
}

/// Renews a lease alice may not renew and one of her own on two streams with her token, at once: the first stream
/// must end with etcd's refusal, the second get its renewal.
async fn run(dialer: Dialer, seed: u64) -> Result<(), String> {
    let channel = dialer.channel(&proxy_authority());
    let root = Session::new(Login::new("root", "rootpw"))
        .token(&channel)
        .await
        .expect("root's token");
    let alice = Session::new(Login::new("alice", "alicepw"))
        .token(&channel)
        .await
        .expect("alice's token");
    // alice may write k/ to k0 only.
    lease_with_key(&channel, &root, FORBIDDEN, "x/1").await?;
    lease_with_key(&channel, &alice, OWN, "k/1").await?;

    let (refused_tx, refused_rx) = tokio::sync::mpsc::channel(1);
    let (renewed_tx, renewed_rx) = tokio::sync::mpsc::channel(1);
    let mut lease = LeaseClient::new(channel.clone());
    let as_alice = |rx| {
        with_token(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            Some(&alice),
        )
    };
    let mut refused = lease
        .lease_keep_alive(as_alice(refused_rx))
        .await
        .map_err(|s| format!("{s:?}"))?
        .into_inner();
    let mut renewed = lease
        .lease_keep_alive(as_alice(renewed_rx))
        .await
        .map_err(|s| format!("{s:?}"))?
        .into_inner();
    refused_tx
        .send(LeaseKeepAliveRequest { id: FORBIDDEN })
        .await
        .map_err(|e| e.to_string())?;
    renewed_tx
        .send(LeaseKeepAliveRequest { id: OWN })
        .await
        .map_err(|e| e.to_string())?;

    let bound = Duration::from_secs(5);
    let first_refused = tokio::time::timeout(bound, refused.next()).await;
    let first_renewed = tokio::time::timeout(bound, renewed.next()).await;
    match first_refused {
        Ok(Some(Err(status))) if status.code() == Code::PermissionDenied => {}
        other => {
            return Err(format!(
                "seed {seed}: the forbidden lease's stream got {other:?}"
            ));
        }
    }
    match first_renewed {
        Ok(Some(Ok(answer))) if answer.id == OWN && answer.ttl > 0 => {}
        other => return Err(format!("seed {seed}: the other stream got {other:?}")),
    }
    Ok(())
}
