//! Under etcd's auth, etcd 3.5.30 answers Status only to a user with the root role, so the proxy's heartbeat
//! (which asks Status without a token) cannot read from it whether the active member has a leader. A member cut
//! off from the others must still be left within the proxy's replacement bound, as without auth: the writes sent
//! after that go to a member with a leader and succeed, instead of waiting on the cut-off member for etcd's
//! request timeout (7 s).

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, PutResponse};
use sim::model::AccessKind;
use sim::scenario::login::{Login, Session, with_token};
use sim::topology::{Dialer, proxy_authority};
use sim::world::{Settings, World};

/// How long a write may take once the proxy has had time to leave the cut-off member.
const WRITE_BOUND: Duration = Duration::from_secs(1);

fn at() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// Puts `key` through the proxy as `token`'s user, waiting at most `bound`.
async fn put(
    kv: &mut KvClient<tonic::transport::Channel>,
    token: &str,
    key: &str,
    bound: Duration,
) -> Result<PutResponse, String> {
    let request = PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    match tokio::time::timeout(bound, kv.put(with_token(request, Some(token)))).await {
        Ok(Ok(answer)) => Ok(answer.into_inner()),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err(format!("no answer within {bound:?}")),
    }
}

#[test]
fn under_auth_a_member_cut_off_from_the_others_is_left_as_without_auth() {
    for seed in 0..4 {
        let mut world = World::new(Settings::quiet(seed, 3));
        sim::scenario::auth::set_up(&world.cluster);
        let cluster = world.cluster.clone();
        let dialer: Dialer = world.dialer();
        world.client("alice", async move {
            let channel = dialer.channel(&proxy_authority());
            let mut session = Session::new(Login::new("alice", "alicepw"));
            let token = session.token(&channel).await.expect("a token");
            let mut kv = KvClient::new(channel);
            put(&mut kv, &token, "k/before", Duration::from_secs(3)).await?;
            // The member that served that write is the proxy's active member: cut it off from the others.
            let served_by = |key: &[u8]| {
                cluster.history().accesses.iter().rev().find_map(|access| {
                    (access.kind == AccessKind::Put && access.key == key).then_some(access.member)
                })
            };
            let active = served_by(b"k/before").expect("the write was served");
            cluster.isolate(active);
            let isolated_at = at();
            tokio::time::sleep(proxy::upstream::replacement_bound() + Duration::from_millis(100))
                .await;
            let after = put(&mut kv, &token, "k/after", WRITE_BOUND).await;
            assert!(
                after.is_ok(),
                "seed {seed}: a write {:?} after member {active} was cut off failed: {after:?}",
                at() - isolated_at
            );
            let moved_to = served_by(b"k/after").expect("the write was served");
            assert_ne!(
                moved_to, active,
                "seed {seed}: served by the cut-off member"
            );
            Ok(())
        });
        let finished = world.run();
        assert_eq!(finished.sim_error, None, "seed {seed}");
    }
}
