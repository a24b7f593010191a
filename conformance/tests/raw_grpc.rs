//! The raw etcd v3 gRPC API where etcdctl cannot reach: client-chosen watch IDs, progress requests, fragmented
//! watch responses, half-closed watch and keep-alive streams, watches across compaction. Every case runs on etcd
//! directly (in the clear, and over TLS when the `tls` profile runs), through the proxy under every profile and
//! (where it can) on the sim's model etcd, for every etcd version installed as a process. The normalised transcripts (keys without the run's prefix, revisions relative to its start) must be
//! identical, and `direct`'s is pinned per etcd version by an insta snapshot
//! (`testdata/conformance/snapshots/etcd-<version>/raw-grpc__<case>.snap`; `INSTA_UPDATE=always` records).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use conformance::profile::{self, Endpoint, Setup, Transport};
use conformance::target;
use prost::Message as _;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseRevokeRequest, PutRequest, RangeRequest, ResponseHeader, WatchCancelRequest,
    WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use proto::mvccpb::KeyValue;
use proto::mvccpb::event::EventType;
use testkit::Backend;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A hang guard for one stream read: far above what any answer takes.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// The model's seed, as in the scenario suite.
const MODEL_SEED: u64 = 7;

/// One run of a case on one target: its clients, its key prefix, the revision it started from, and what it saw.
struct Run {
    endpoint: String,
    channel: Channel,
    prefix: String,
    base: i64,
    lines: Vec<String>,
}

impl Run {
    async fn start(at: &Endpoint, prefix: &str) -> Result<Run, String> {
        let endpoint = at.url();
        let mut builder = Channel::from_shared(endpoint.clone())
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = &at.tls {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|e| format!("read {}: {e}", p.display()))
            };
            let config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(read(&tls.ca)?))
                .identity(Identity::from_pem(read(&tls.cert)?, read(&tls.key)?));
            builder = builder
                .tls_config(config)
                .map_err(|e| format!("TLS for {endpoint}: {e}"))?;
        }
        let channel = builder
            .connect()
            .await
            .map_err(|e| format!("connect to {endpoint}: {e}"))?;
        let base = KvClient::new(channel.clone())
            .range(RangeRequest {
                key: format!("{prefix}none").into_bytes(),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("range: {e}"))?
            .into_inner()
            .header
            .map_or(0, |h| h.revision);
        Ok(Run {
            endpoint,
            channel,
            prefix: prefix.to_string(),
            base,
            lines: Vec::new(),
        })
    }

    fn key(&self, k: &str) -> Vec<u8> {
        format!("{}{k}", self.prefix).into_bytes()
    }

    fn name(&self, k: &[u8]) -> String {
        let k = String::from_utf8_lossy(k);
        k.strip_prefix(&self.prefix).unwrap_or(&k).to_string()
    }

    /// A revision relative to the run's start (`0` stays `0`: "none").
    fn rev(&self, r: i64) -> String {
        if r == 0 {
            "0".into()
        } else {
            format!("+{}", r - self.base)
        }
    }

    /// A response header's revision, relative; `none` for a response without header.
    fn header_rev(&self, header: Option<ResponseHeader>) -> String {
        header.map_or_else(|| "none".into(), |h| self.rev(h.revision))
    }

    /// The absolute revision of `+relative`.
    fn at(&self, relative: i64) -> i64 {
        self.base + relative
    }

    fn log(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    fn kv(&self, kv: &KeyValue) -> String {
        let value = if kv.value.len() > 16 {
            format!("<{} bytes>", kv.value.len())
        } else {
            String::from_utf8_lossy(&kv.value).into_owned()
        };
        format!(
            "{}={value} create={} mod={} ver={} lease={}",
            self.name(&kv.key),
            self.rev(kv.create_revision),
            self.rev(kv.mod_revision),
            kv.version,
            kv.lease != 0
        )
    }

    /// Every field of a watch response a client can see, keys and revisions normalised.
    fn watch_response(&self, r: &WatchResponse) -> String {
        let mut s = format!(
            "watch_id={} created={} canceled={} cancel_reason={:?} compact_revision={} fragment={} header_rev={}",
            r.watch_id,
            r.created,
            r.canceled,
            r.cancel_reason,
            self.rev(r.compact_revision),
            r.fragment,
            self.header_rev(r.header),
        );
        for ev in &r.events {
            let kind = if ev.r#type == EventType::Put as i32 {
                "PUT"
            } else {
                "DELETE"
            };
            let kv = ev.kv.as_ref().map(|kv| self.kv(kv)).unwrap_or_default();
            let prev = ev
                .prev_kv
                .as_ref()
                .map(|kv| self.kv(kv))
                .unwrap_or_else(|| "none".into());
            let _ = write!(s, "\n    {kind} {kv} prev={prev}");
        }
        s
    }

    async fn put(&mut self, k: &str, value: impl Into<Vec<u8>>) -> Result<i64, String> {
        let value = value.into();
        let len = value.len();
        let revision = self.put_quietly(k, value).await?;
        self.log(format!("put {k} ({len} bytes) rev={}", self.rev(revision)));
        Ok(revision)
    }

    /// A put left out of the transcript (the caller summarises), returning its revision.
    async fn put_quietly(&mut self, k: &str, value: Vec<u8>) -> Result<i64, String> {
        Ok(KvClient::new(self.channel.clone())
            .put(PutRequest {
                key: self.key(k),
                value,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("put {k}: {e}"))?
            .into_inner()
            .header
            .map_or(0, |h| h.revision))
    }

    async fn compact(&mut self, relative: i64) -> Result<(), String> {
        KvClient::new(self.channel.clone())
            .compact(CompactionRequest {
                revision: self.at(relative),
                physical: false,
            })
            .await
            .map_err(|e| format!("compact +{relative}: {e}"))?;
        self.log(format!("compact +{relative}"));
        Ok(())
    }

    /// A new Watch stream whose first request is `first` (etcd sends the response headers with its first answer,
    /// so the call itself returns only once a request has been answered).
    async fn watch_stream(&mut self, first: RequestUnion) -> Result<WatchStream, String> {
        self.watch_stream_with(vec![first]).await
    }

    /// A new Watch stream whose first requests are `firsts`, all queued before the stream opens: etcd sends the
    /// stream's headers with its first answer, so a first request it does not answer would leave nothing sent.
    async fn watch_stream_with(
        &mut self,
        firsts: Vec<RequestUnion>,
    ) -> Result<WatchStream, String> {
        let (tx, rx) = mpsc::channel(16);
        for first in firsts {
            self.log(format!("new stream {}", self.describe(&first)));
            tx.send(WatchRequest {
                request_union: Some(first),
            })
            .await
            .map_err(|_| "queue a first watch request".to_string())?;
        }
        let mut client = WatchClient::new(self.channel.clone());
        let responses = tokio::time::timeout(READ_TIMEOUT, client.watch(ReceiverStream::new(rx)))
            .await
            .map_err(|_| self.failed(&format!("Watch: no answer within {READ_TIMEOUT:?}")))?
            .map_err(|e| format!("Watch: {e}"))?
            .into_inner();
        Ok(WatchStream {
            requests: Some(tx),
            responses,
        })
    }

    /// A create request for `key` (or everything under it with `prefix`), the other fields left to `adjust`.
    fn create(&self, key: &str, adjust: impl FnOnce(&mut WatchCreateRequest)) -> RequestUnion {
        let mut create = WatchCreateRequest {
            key: self.key(key),
            ..Default::default()
        };
        adjust(&mut create);
        RequestUnion::CreateRequest(create)
    }

    /// A watch request as the transcript shows it.
    fn describe(&self, request: &RequestUnion) -> String {
        match request {
            RequestUnion::CreateRequest(c) => {
                let mut s = format!("-> create key={}", self.name(&c.key));
                if !c.range_end.is_empty() {
                    let _ = write!(s, " range_end={}", self.name(&c.range_end));
                }
                if c.start_revision != 0 {
                    let _ = write!(s, " start_revision={}", self.rev(c.start_revision));
                }
                if c.watch_id != 0 {
                    let _ = write!(s, " watch_id={}", c.watch_id);
                }
                for (set, flag) in [(c.prev_kv, "prev_kv"), (c.fragment, "fragment")] {
                    if set {
                        let _ = write!(s, " {flag}");
                    }
                }
                s
            }
            RequestUnion::CancelRequest(c) => format!("-> cancel watch_id={}", c.watch_id),
            RequestUnion::ProgressRequest(_) => "-> progress request".into(),
        }
    }

    /// Sends `request` on `stream`, logged.
    async fn send(
        &mut self,
        stream: &mut WatchStream,
        request: RequestUnion,
    ) -> Result<(), String> {
        self.log(self.describe(&request));
        stream.send(request).await
    }

    /// The next response on `stream`, logged.
    async fn expect(&mut self, stream: &mut WatchStream) -> Result<WatchResponse, String> {
        let r = stream.next().await.map_err(|e| self.failed(&e))?;
        self.log(format!("<- {}", self.watch_response(&r)));
        Ok(r)
    }

    /// An error that shows what the run saw before it.
    fn failed(&self, what: &str) -> String {
        format!(
            "{what} (on {}; saw so far:\n{})",
            self.endpoint,
            self.lines.join("\n")
        )
    }
}

/// One Watch stream: its request side (until half-closed) and its responses.
struct WatchStream {
    requests: Option<mpsc::Sender<WatchRequest>>,
    responses: Streaming<WatchResponse>,
}

impl WatchStream {
    async fn send(&mut self, request: RequestUnion) -> Result<(), String> {
        let tx = self
            .requests
            .as_ref()
            .ok_or("the request side is already closed")?;
        tx.send(WatchRequest {
            request_union: Some(request),
        })
        .await
        .map_err(|_| "the Watch call ended".to_string())
    }

    fn half_close(&mut self) {
        self.requests = None;
    }

    async fn next(&mut self) -> Result<WatchResponse, String> {
        match tokio::time::timeout(READ_TIMEOUT, self.responses.message()).await {
            Err(_) => Err(format!("no watch response within {READ_TIMEOUT:?}")),
            Ok(Err(e)) => Err(format!(
                "watch stream error {:?}: {}",
                e.code(),
                e.message()
            )),
            Ok(Ok(None)) => Err("the watch stream ended".into()),
            Ok(Ok(Some(r))) => Ok(r),
        }
    }
}

fn progress() -> RequestUnion {
    RequestUnion::ProgressRequest(WatchProgressRequest {})
}

fn cancel(watch_id: i64) -> RequestUnion {
    RequestUnion::CancelRequest(WatchCancelRequest { watch_id })
}

/// Two watchers with client-chosen IDs 7 and 9, a duplicate ID, auto-assigned IDs after chosen ones, cancel by ID
/// (a known one is answered, an unknown one is not: the next answer is the progress request sent after it).
async fn watch_ids(run: &mut Run) -> Result<(), String> {
    let mut s = run
        .watch_stream(run.create("a", |c| c.watch_id = 7))
        .await?;
    run.expect(&mut s).await?;
    run.send(&mut s, run.create("b", |c| c.watch_id = 9))
        .await?;
    run.expect(&mut s).await?;
    run.put("a", "1").await?;
    run.expect(&mut s).await?;
    run.put("b", "2").await?;
    run.expect(&mut s).await?;
    run.send(&mut s, run.create("c", |c| c.watch_id = 7))
        .await?;
    run.expect(&mut s).await?;
    run.send(&mut s, run.create("c", |c| c.watch_id = 1))
        .await?;
    run.expect(&mut s).await?;
    run.send(&mut s, run.create("c", |_| {})).await?;
    run.expect(&mut s).await?;
    run.send(&mut s, run.create("c", |_| {})).await?;
    run.expect(&mut s).await?;
    run.send(&mut s, cancel(7)).await?;
    run.expect(&mut s).await?;
    run.log("cancel the unknown id 42, then a progress request");
    run.send(&mut s, cancel(42)).await?;
    run.send(&mut s, progress()).await?;
    run.expect(&mut s).await?;
    run.log("a's watcher is gone: the next event is b's");
    run.put("a", "3").await?;
    run.put("b", "4").await?;
    run.expect(&mut s).await?;
    run.log("three watchers on c each get the event (sorted: their order is etcd's map order)");
    run.put("c", "5").await?;
    let mut answers = Vec::new();
    for _ in 0..3 {
        let r = s.next().await.map_err(|e| run.failed(&e))?;
        answers.push(run.watch_response(&r));
    }
    answers.sort();
    for a in answers {
        run.log(format!("<- {a}"));
    }
    Ok(())
}

/// A progress request on a stream with a synced watcher answers at the current revision, also after writes the
/// watcher does not see; and on a stream without watchers.
async fn progress_request(run: &mut Run) -> Result<(), String> {
    let mut s = run.watch_stream(run.create("a", |_| {})).await?;
    run.expect(&mut s).await?;
    run.put("a", "1").await?;
    run.expect(&mut s).await?;
    run.send(&mut s, progress()).await?;
    run.expect(&mut s).await?;
    run.put("other", "x").await?;
    run.log("progress request after a write the watcher does not see");
    run.send(&mut s, progress()).await?;
    run.expect(&mut s).await?;
    run.log("the watcher still gets its next event");
    run.put("a", "2").await?;
    run.expect(&mut s).await?;

    run.log("a stream without watchers: progress request, then a create, then a write");
    // etcd 3.5.1 answers the progress request; from 3.5.8 etcd answers one only when every watcher of the stream
    // is synced, and sends nothing on a stream with none. Everything up to the created answer is recorded.
    let create = run.create("a", |_| {});
    let mut empty = run.watch_stream_with(vec![progress(), create]).await?;
    while !run.expect(&mut empty).await?.created {}
    run.put("a", "3").await?;
    run.expect(&mut empty).await?;
    Ok(())
}

/// etcd's fragment threshold: a response of at least `--max-request-bytes` plus gRPC's overhead allowance
/// (512 KiB) is fragmented for a watcher that asked for it.
const fn etcd_fragment_limit(max_request_bytes: usize) -> usize {
    max_request_bytes + 512 * 1024
}

/// Keys `<dir>/001`..`<dir>/<n>` of `size` bytes each, then one delete of them all: one revision with `n` events,
/// each with a prev_kv of `size` bytes, watched with and without `fragment` on one stream. Each answer shows its
/// fragment flag, how many events it holds and whether it is under etcd's fragment threshold `limit`.
async fn fragmented_delete(
    run: &mut Run,
    dir: &str,
    n: usize,
    size: usize,
    limit: usize,
) -> Result<(), String> {
    for i in 1..=n {
        let key = format!("{dir}/{i:03}");
        run.put_quietly(&key, vec![b'x'; size]).await?;
    }
    run.log(format!("put {dir}/001..{dir}/{n:03}, {size} bytes each"));
    let (from, end) = (run.key(&format!("{dir}/")), run.key(&format!("{dir}0")));
    let watch = |fragment: bool| {
        RequestUnion::CreateRequest(WatchCreateRequest {
            key: from.clone(),
            range_end: end.clone(),
            prev_kv: true,
            fragment,
            ..Default::default()
        })
    };
    let mut s = run.watch_stream(watch(true)).await?;
    run.expect(&mut s).await?;
    run.send(&mut s, watch(false)).await?;
    run.expect(&mut s).await?;
    let r = KvClient::new(run.channel.clone())
        .delete_range(DeleteRangeRequest {
            key: from,
            range_end: end,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("delete {dir}/: {e}"))?
        .into_inner();
    run.log(format!(
        "delete {dir}/ deleted={} rev={}",
        r.deleted,
        run.header_rev(r.header)
    ));
    // Each watcher's answers in their order; which watcher is served first is not etcd's promise.
    let mut by_watcher: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    let mut done = BTreeSet::new();
    while done.len() < 2 {
        let r = s.next().await.map_err(|e| run.failed(&e))?;
        let keys: Vec<String> = r
            .events
            .iter()
            .filter_map(|e| e.kv.as_ref())
            .map(|kv| run.name(&kv.key))
            .collect();
        by_watcher.entry(r.watch_id).or_default().push(format!(
            "<- watch_id={} fragment={} events={} keys={}..{} header_rev={} size < {limit}: {}",
            r.watch_id,
            r.fragment,
            r.events.len(),
            keys.first().map_or("", |k| k.as_str()),
            keys.last().map_or("", |k| k.as_str()),
            run.header_rev(r.header),
            r.encoded_len() < limit
        ));
        if !r.fragment {
            done.insert(r.watch_id);
        }
        if by_watcher.values().map(Vec::len).sum::<usize>() > n + 2 {
            return Err(run.failed("more answers than events"));
        }
    }
    for line in by_watcher.into_values().flatten() {
        run.log(line);
    }
    Ok(())
}

/// etcd started with `--max-request-bytes=4096` (fragments from 4096 + 512 KiB), the proxy with
/// `--max-send-bytes=4096`: a 570 kB revision is over etcd's threshold.
async fn fragment_small_limit(run: &mut Run) -> Result<(), String> {
    fragmented_delete(run, "f", 160, 3500, etcd_fragment_limit(SMALL_LIMIT)).await
}

/// Both at their defaults (etcd: 1.5 MiB + 512 KiB = 2 MiB): a 2.0 MB revision is under etcd's threshold, a
/// 2.4 MB one over it.
async fn fragment_default_limit(run: &mut Run) -> Result<(), String> {
    let limit = etcd_fragment_limit(DEFAULT_MAX_REQUEST_BYTES);
    fragmented_delete(run, "g", 5, 400_000, limit).await?;
    fragmented_delete(run, "f", 6, 400_000, limit).await
}

/// The `--max-request-bytes` of the small-limit case; the proxy gets the same as `--max-send-bytes`.
const SMALL_LIMIT: usize = 4096;
/// etcd's default `--max-request-bytes` (and the proxy's default `--max-send-bytes`).
const DEFAULT_MAX_REQUEST_BYTES: usize = 1_572_864;

/// A watcher keeps receiving events after the client half-closes its request side.
async fn half_closed_watch(run: &mut Run) -> Result<(), String> {
    let mut s = run.watch_stream(run.create("a", |_| {})).await?;
    run.expect(&mut s).await?;
    run.log("half-close");
    s.half_close();
    run.put("a", "1").await?;
    run.expect(&mut s).await?;
    run.put("a", "2").await?;
    run.expect(&mut s).await?;
    Ok(())
}

/// Three writes to `a`, then a compaction at the third.
async fn compacted_history(run: &mut Run) -> Result<(), String> {
    for v in ["1", "2", "3"] {
        run.put("a", v).await?;
    }
    run.compact(3).await
}

/// A watch from a compacted revision is created, then canceled with the compaction revision; one from the
/// compaction revision itself replays it.
async fn watch_from_compacted_revision(run: &mut Run) -> Result<(), String> {
    compacted_history(run).await?;
    let from = run.at(1);
    let mut s = run
        .watch_stream(run.create("a", |c| c.start_revision = from))
        .await?;
    run.expect(&mut s).await?;
    run.expect(&mut s).await?;
    let from = run.at(3);
    run.send(&mut s, run.create("a", |c| c.start_revision = from))
        .await?;
    run.expect(&mut s).await?;
    run.expect(&mut s).await?;
    Ok(())
}

/// A live watcher keeps receiving events across a compaction of revisions it has seen.
async fn watch_across_compaction(run: &mut Run) -> Result<(), String> {
    compacted_history(run).await?;
    let mut s = run.watch_stream(run.create("a", |_| {})).await?;
    run.expect(&mut s).await?;
    run.put("a", "4").await?;
    run.expect(&mut s).await?;
    run.compact(4).await?;
    run.put("a", "5").await?;
    run.expect(&mut s).await?;
    run.log("a progress request shows nothing else is pending");
    run.send(&mut s, progress()).await?;
    run.expect(&mut s).await?;
    Ok(())
}

/// `ids` sent on one LeaseKeepAlive stream that is then half-closed: every answer until the end of the stream.
async fn keep_alive_then_half_close(
    run: &mut Run,
    what: &str,
    ids: Vec<i64>,
) -> Result<(), String> {
    let asked: Vec<i64> = ids.clone();
    let mut answers = LeaseClient::new(run.channel.clone())
        .lease_keep_alive(tokio_stream::iter(
            ids.into_iter().map(|id| LeaseKeepAliveRequest { id }),
        ))
        .await
        .map_err(|e| format!("LeaseKeepAlive: {e}"))?
        .into_inner();
    run.log(format!(
        "{what}: {} request(s), then half-close",
        asked.len()
    ));
    for _ in 0..10 {
        match tokio::time::timeout(READ_TIMEOUT, answers.message()).await {
            Err(_) => return Err(run.failed("no keep-alive answer or end within the deadline")),
            Ok(Ok(Some(r))) => run.log(format!(
                "<- keep-alive id={} ttl={}",
                if asked.contains(&r.id) {
                    "asked"
                } else {
                    "other"
                },
                r.ttl
            )),
            Ok(Ok(None)) => {
                run.log("<- end of stream");
                return Ok(());
            }
            Ok(Err(e)) => {
                run.log(format!("<- error {:?}: {}", e.code(), e.message()));
                return Ok(());
            }
        }
    }
    Err(run.failed("more than 10 keep-alive answers"))
}

/// LeaseKeepAlive: one request then half-close, two requests then half-close, an unknown lease.
async fn lease_keep_alive_half_close(run: &mut Run) -> Result<(), String> {
    let mut lease = LeaseClient::new(run.channel.clone());
    let id = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .map_err(|e| format!("grant: {e}"))?
        .into_inner()
        .id;
    run.log("lease grant ttl=60");
    keep_alive_then_half_close(run, "granted lease", vec![id]).await?;
    keep_alive_then_half_close(run, "granted lease twice", vec![id, id]).await?;
    // An id no test grants (leases are granted with server-chosen ids, and the model's are seeded).
    keep_alive_then_half_close(run, "unknown lease", vec![0x0bad_1ea5e]).await?;
    lease
        .lease_revoke(LeaseRevokeRequest { id })
        .await
        .map_err(|e| format!("revoke: {e}"))?;
    keep_alive_then_half_close(run, "revoked lease", vec![id]).await?;
    Ok(())
}

/// How a case is set up on each etcd version.
struct Case {
    /// The snapshot name: `raw-grpc__<name>`.
    name: &'static str,
    /// Extra etcd flags.
    etcd_flags: &'static [&'static str],
    /// Proxy flags beyond the profile's (the flags an operator would give it for this etcd).
    proxy_flags: &'static [&'static str],
    /// Why the model cannot run the case, if it cannot.
    model_unsupported: Option<&'static str>,
}

const PLAIN: Case = Case {
    name: "",
    etcd_flags: &[],
    proxy_flags: &[],
    model_unsupported: None,
};

async fn transcript(
    endpoint: &Endpoint,
    prefix: &str,
    body: &impl AsyncFn(&mut Run) -> Result<(), String>,
) -> Result<Vec<String>, String> {
    let mut run = Run::start(endpoint, prefix).await?;
    body(&mut run).await?;
    Ok(run.lines)
}

fn check_snapshot(version: &str, name: &str, lines: &[String]) -> Result<(), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance/snapshots");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root.join(format!("etcd-{version}")));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    let name = format!("raw-grpc__{name}");
    let text = lines.join("\n");
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        settings.bind(|| insta::assert_snapshot!(name.as_str(), text));
    }))
    .map_err(|_| format!("direct differs from its snapshot {name} (etcd {version})"))
}

fn compare(who: &str, direct: &[String], other: &Result<Vec<String>, String>) -> Option<String> {
    match other {
        Err(e) => Some(format!("{who} could not carry out the case: {e}")),
        Ok(lines) if lines == direct => None,
        Ok(lines) => {
            let diff = testkit::diff::line_diff(&direct.join("\n"), &lines.join("\n"));
            Some(format!(
                "{who} answers differently (- direct, + {who}):\n{diff}"
            ))
        }
    }
}

/// The key prefix of one target on the etcd the targets share, marked by one character (`d`irect, `m`odel, the
/// proxy's profiles `0`..`9`): every target's keys have one length, because where a watch response is fragmented
/// depends on the size of its keys, and a longer prefix alone would move the fragment boundaries.
fn prefix(mark: char) -> String {
    format!("/raw/{mark}/")
}

/// Runs `body` on every etcd version installed as a process: direct (in the clear, and on every other transport a
/// profile uses), through the proxy binary under every flag profile (in front of etcd on its transport), on the
/// model; checks direct's snapshot, that direct on another transport answers like direct, and that the others
/// answer like direct on their transport. Every difference is reported, then the test fails.
async fn check(case: Case, body: impl AsyncFn(&mut Run) -> Result<(), String>) {
    let profiles = profile::selected().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        profiles.len() <= 10,
        "one prefix character per profile: 0 to 9"
    );
    let setup = Setup::new(&profiles).unwrap_or_else(|e| panic!("setting the profiles up: {e}"));
    let mut failures = Vec::new();
    let mut ran = 0;
    for spec in testkit::etcd::discover()
        .await
        .into_iter()
        .filter(|s| s.backend == Backend::Process)
    {
        let label = spec.label();
        if let Some(why) = spec.missing() {
            assert!(!testkit::ci(), "{label} missing under CI=true: {why}");
            eprintln!("SKIPPED {label}: {why}");
            continue;
        }
        // Plain first: its transcript is the reference for the other transports and the model.
        let mut plain: Option<Vec<String>> = None;
        for transport in profile::transports(&profiles) {
            let etcd = setup
                .start_etcd(&spec, transport, case.etcd_flags)
                .await
                .unwrap_or_else(|e| panic!("{label} ({}): {e}", transport.name()));
            let direct = transcript(&Endpoint::etcd(&etcd), &prefix('d'), &body).await;
            let mut through = Vec::new();
            for (p, mark) in profiles.iter().zip('0'..='9') {
                if p.transport != transport {
                    continue;
                }
                let proxy = setup
                    .start_proxy(p, &etcd, case.proxy_flags)
                    .await
                    .unwrap_or_else(|e| panic!("{label}: start the proxy: {e}"));
                through.push((
                    p.name,
                    transcript(&Endpoint::proxy(&proxy), &prefix(mark), &body).await,
                ));
            }
            let direct = match direct {
                Ok(d) => d,
                Err(e) => {
                    let tail = etcd.log_tail().await;
                    etcd.stop().await;
                    panic!(
                        "{label} direct ({}): {e}\netcd log tail:\n{tail}",
                        transport.name()
                    );
                }
            };
            etcd.stop().await;
            match (&plain, transport) {
                (_, Transport::Plain) => {
                    if let Err(e) = check_snapshot(spec.version.name(), case.name, &direct) {
                        failures.push(format!("{label}: {e}"));
                    }
                }
                (Some(reference), t) => {
                    let who = format!("direct over {}", t.name());
                    if let Some(d) = compare(&who, reference, &Ok(direct.clone())) {
                        failures.push(format!("{label}: {d}"));
                    }
                }
                (None, t) => panic!("{} ran before plain", t.name()),
            }
            for (name, t) in &through {
                if let Some(d) = compare(&format!("proxy ({name} profile)"), &direct, t) {
                    failures.push(format!("{label}: {d}"));
                }
            }
            if transport == Transport::Plain {
                plain = Some(direct);
            }
        }
        let direct = plain.expect("direct in the clear ran");
        match case.model_unsupported {
            Some(why) => eprintln!("SKIPPED model for {} ({label}): {why}", case.name),
            None => {
                let model = target::start_model(MODEL_SEED, spec.version)
                    .await
                    .unwrap_or_else(|e| panic!("start the model: {e}"));
                let m = transcript(&Endpoint::plain(model.addr()), &prefix('m'), &body).await;
                model.stop().await;
                if let Some(d) = compare("model", &direct, &m) {
                    failures.push(format!("{label}: {d}"));
                }
            }
        }
        ran += 1;
    }
    eprintln!("raw gRPC case {} ran on {ran} etcd version(s)", case.name);
    assert!(
        ran > 0,
        "raw gRPC case {} ran on no etcd version",
        case.name
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_chosen_watch_ids_duplicates_and_cancel_answer_like_etcd() {
    let case = Case {
        name: "watch-ids",
        ..PLAIN
    };
    check(case, watch_ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_progress_requests_answer_like_etcd() {
    let case = Case {
        name: "progress-request",
        ..PLAIN
    };
    check(case, progress_request).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragmented_watch_responses_match_etcd_with_the_same_small_limit() {
    let case = Case {
        name: "fragment-small-limit",
        etcd_flags: &["--max-request-bytes=4096"],
        // The proxy cannot learn etcd's limit: an operator gives it the same number as --max-send-bytes (the
        // proxy's counterpart of etcd's request limit: the largest request it forwards to etcd); under `chain`
        // every proxy of the row gets it, as an operator would give it to each.
        proxy_flags: &["--max-send-bytes=4096"],
        model_unsupported: Some("the model does not fragment watch responses"),
    };
    check(case, fragment_small_limit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragmented_watch_responses_match_etcd_at_default_limits() {
    let case = Case {
        name: "fragment-default-limit",
        model_unsupported: Some("the model does not fragment watch responses"),
        ..PLAIN
    };
    check(case, fragment_default_limit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_watch_stream_keeps_delivering_like_etcd() {
    let case = Case {
        name: "watch-half-close",
        ..PLAIN
    };
    check(case, half_closed_watch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_compacted_revision_is_canceled_like_etcd() {
    let case = Case {
        name: "watch-compacted-revision",
        ..PLAIN
    };
    check(case, watch_from_compacted_revision).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_watch_across_compaction_answers_like_etcd() {
    let case = Case {
        name: "watch-across-compaction",
        ..PLAIN
    };
    check(case, watch_across_compaction).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keep_alive_half_close_answers_like_etcd() {
    let case = Case {
        name: "lease-keep-alive-half-close",
        ..PLAIN
    };
    check(case, lease_keep_alive_half_close).await;
}
