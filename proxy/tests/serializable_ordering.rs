//! `--experimental-serializable-ordering` (on by default): a serializable read through the proxy never returns an
//! older revision than one the proxy already returned, even when the member that answers it lags behind.
//!
//! Real etcd cannot be made to lag on cue (a member catches up within a heartbeat of being reachable), so the two
//! members here are fakes: one serves at revision 100, then stops; the other answers serializable reads from
//! revision 5 (it lags) and linearizable ones from revision 120 (as a member that asks the leader would).
//!
//! The range cache is on (the default): its own check of a read (a `count_only` read of the range) is not a
//! client's read, so a lagging answer to it is neither asked again nor counted (it once counted a second re-ask).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use proto::etcdserverpb as pb;
use proto::etcdserverpb::kv_client::KvClient;
use support::fake_etcd::{Answer, FakeEtcd};
use support::metrics;
use testkit::wait_for;
use tonic::Status;

const RANGE: &str = "/etcdserverpb.KV/Range";

/// The revisions a fake member answers reads from.
#[derive(Clone, Copy)]
struct Revisions {
    serializable: i64,
    linearizable: i64,
}

fn member(revisions: Arc<Mutex<Revisions>>) -> Answer {
    member_answering_status(revisions, true)
}

/// A member that refuses Status to the proxy, as etcd 3.5.30 with auth on refuses a caller without root's role.
fn member_refusing_status(revisions: Arc<Mutex<Revisions>>) -> Answer {
    member_answering_status(revisions, false)
}

fn member_answering_status(revisions: Arc<Mutex<Revisions>>, status: bool) -> Answer {
    Arc::new(move |path: &str, request: &Bytes| {
        let current = *revisions.lock().unwrap();
        let header = |revision| {
            Some(pb::ResponseHeader {
                cluster_id: 1,
                member_id: 1,
                revision,
                raft_term: 2,
            })
        };
        match path {
            "/etcdserverpb.Maintenance/Status" if !status => {
                Err(Status::invalid_argument("etcdserver: user name is empty"))
            }
            "/etcdserverpb.Maintenance/Status" => Ok(Bytes::from(
                pb::StatusResponse {
                    header: header(current.linearizable),
                    version: "3.5.30".into(),
                    leader: 1,
                    ..Default::default()
                }
                .encode_to_vec(),
            )),
            RANGE => {
                let range = pb::RangeRequest::decode(request.clone())
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                let revision = if range.serializable {
                    current.serializable
                } else {
                    current.linearizable
                };
                Ok(Bytes::from(
                    pb::RangeResponse {
                        header: header(revision),
                        ..Default::default()
                    }
                    .encode_to_vec(),
                ))
            }
            other => Err(Status::unimplemented(format!(
                "the fake does not serve {other}"
            ))),
        }
    })
}

async fn serializable_read(client: &mut KvClient<tonic::transport::Channel>) -> i64 {
    let request = pb::RangeRequest {
        key: b"k".to_vec(),
        serializable: true,
        ..Default::default()
    };
    let answer = tokio::time::timeout(Duration::from_secs(30), client.range(request))
        .await
        .expect("the read is answered")
        .expect("the read succeeds");
    answer.into_inner().header.expect("a header").revision
}

/// Reads at revision 100 from one member, stops it, and reads again once the proxy serves from the lagging one.
/// Returns the revision of that second read and the lagging member's requests.
async fn read_after_failing_over_to_a_lagging_member(flags: &[&str]) -> (i64, Vec<Bytes>, f64) {
    let at = |serializable, linearizable| {
        Arc::new(Mutex::new(Revisions {
            serializable,
            linearizable,
        }))
    };
    let revisions = [at(100, 100), at(100, 100)];
    let fakes = [
        FakeEtcd::start(member(revisions[0].clone())).await,
        FakeEtcd::start(member(revisions[1].clone())).await,
    ];
    let endpoints: Vec<String> = fakes.iter().map(|f| f.addr.clone()).collect();
    let proxy = support::proxy::start(&endpoints, flags).await;
    let mut client = KvClient::new(support::grpc::channel(&proxy.addr()).await);

    assert_eq!(serializable_read(&mut client).await, 100);
    let metrics_text = proxy.metrics().await;
    let active = metrics::active_endpoint(&metrics_text).expect("an active endpoint");
    let (serving, lagging) = if active == endpoints[0] {
        (0, 1)
    } else {
        (1, 0)
    };
    *revisions[lagging].lock().unwrap() = Revisions {
        serializable: 5,
        linearizable: 120,
    };
    fakes[serving].stop();
    // The heartbeat replaces the stopped member; the read then goes to the lagging one.
    wait_for(
        "the proxy to leave the stopped member",
        Duration::from_secs(30),
        || {
            let proxy = &proxy;
            let lagging = endpoints[lagging].clone();
            async move {
                let text = proxy.metrics().await;
                match metrics::active_endpoint(&text) {
                    Some(active) if active == lagging => Ok(()),
                    other => Err(format!("active: {other:?}")),
                }
            }
        },
    )
    .await;
    let revision = serializable_read(&mut client).await;
    let reasked = metrics::value(
        &proxy.metrics().await,
        "etcd_grpc_proxy_serializable_reads_reasked_total",
        &[],
    )
    .unwrap_or(0.0);
    (revision, fakes[lagging].received(RANGE), reasked)
}

#[tokio::test]
async fn a_lagging_members_serializable_answer_is_replaced_by_a_linearizable_one() {
    let (revision, received, reasked) = read_after_failing_over_to_a_lagging_member(&[]).await;
    assert_eq!(revision, 120, "the client got the linearizable answer");
    let last =
        pb::RangeRequest::decode(received.last().expect("a read reached it").clone()).unwrap();
    assert!(!last.serializable, "the read was asked again linearizably");
    assert_eq!(
        last.key, b"k",
        "with the client's request otherwise unchanged"
    );
    assert_eq!(reasked, 1.0);
}

#[tokio::test]
async fn with_the_flag_off_the_lagging_answer_goes_back_in_time() {
    let (revision, _, reasked) = read_after_failing_over_to_a_lagging_member(&[
        "--experimental-serializable-ordering=false",
    ])
    .await;
    assert_eq!(revision, 5, "what the check prevents: revision 5 after 100");
    assert_eq!(reasked, 0.0);
}

/// Issue 38: a proxy that could learn no committed revision at start (every member refuses its Status, as under
/// auth) cannot tell a lagging serializable answer, so it asks the read again linearizably; that answer teaches it
/// a committed revision, and from then on a serializable answer as new passes without a second read.
#[tokio::test]
async fn without_a_status_serializable_answers_are_asked_again_until_a_committed_revision_is_known()
{
    let revisions = Arc::new(Mutex::new(Revisions {
        serializable: 21,
        linearizable: 26,
    }));
    let fakes = [
        FakeEtcd::start(member_refusing_status(revisions.clone())).await,
        FakeEtcd::start(member_refusing_status(revisions.clone())).await,
    ];
    let endpoints: Vec<String> = fakes.iter().map(|f| f.addr.clone()).collect();
    let proxy = support::proxy::start(&endpoints, &[]).await;
    let mut client = KvClient::new(support::grpc::channel(&proxy.addr()).await);
    let reasked = || async {
        metrics::value(
            &proxy.metrics().await,
            "etcd_grpc_proxy_serializable_reads_reasked_total",
            &[],
        )
        .unwrap_or(0.0)
    };

    assert_eq!(
        serializable_read(&mut client).await,
        26,
        "a member's serializable answer at 21 may be an isolated member's: the linearizable one is given"
    );
    assert_eq!(reasked().await, 1.0);

    *revisions.lock().unwrap() = Revisions {
        serializable: 27,
        linearizable: 28,
    };
    assert_eq!(
        serializable_read(&mut client).await,
        27,
        "at or past the committed revision learnt: passed on"
    );
    assert_eq!(reasked().await, 1.0, "without a second read");
}
