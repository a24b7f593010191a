//! `bench list`: issue 32's measurement of listing a large keyspace with RangeStream (etcd 3.7). One etcd member is
//! loaded with N keys of realistic values; then the whole keyspace is listed with RangeStream straight from etcd
//! and through this proxy in front of it, in turn, several times, each list timed from the call to its last chunk
//! and checked (every key, the last chunk's `count`). Reported: each target's median time, the proxy's against
//! direct, and the proxy's peak resident memory (`VmHWM`) before and after its lists.
//!
//! On an etcd before 3.7 the proxy builds the stream from Range pages and direct etcd refuses it: the run then
//! fails at the first direct list. The benchmark asserts nothing about speed; it measures.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest, RequestOp, TxnRequest, request_op};
use serde::{Deserialize, Serialize};
use testkit::{EtcdCluster, ProxyProcess};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::load::dial::Dialer;
use crate::plan::EtcdBinary;
use crate::sys::procfs;

/// Puts per Txn while loading (etcd's default `--max-txn-ops` is 128).
const PUTS_PER_TXN: usize = 100;
/// Txns in flight while loading.
const LOADERS: usize = 8;
/// How long one list may take before the run fails.
const LIST_DEADLINE: Duration = Duration::from_secs(600);

/// `bench list`'s flags.
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// The etcd to run, as VERSION=PATH to its `etcd`. Default: the newest version the test kit finds installed.
    #[arg(long = "etcd", value_parser = EtcdBinary::parse)]
    pub etcd: Option<EtcdBinary>,
    /// The `etcd-grpc-proxy` binary. Default: the test kit's (`ETCD_GRPC_PROXY_BIN`, else the release build, built
    /// or confirmed up to date by cargo).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// Keys loaded and listed.
    #[arg(long, default_value_t = 100_000)]
    pub keys: usize,
    /// The smallest value, in bytes; values range evenly from it to --value-max.
    #[arg(long, default_value_t = 100)]
    pub value_min: usize,
    /// The largest value, in bytes.
    #[arg(long, default_value_t = 1000)]
    pub value_max: usize,
    /// Lists per target; each target's median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Where `list.md` and `list.json` go.
    #[arg(long, default_value = "target/bench-list")]
    pub out_dir: PathBuf,
    /// A line describing the machine, for the report.
    #[arg(long, default_value = "unspecified")]
    pub machine: String,
}

/// What `bench list` measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ListReport {
    pub etcd_version: String,
    pub command: String,
    pub machine: String,
    pub keys: usize,
    pub value_min: usize,
    pub value_max: usize,
    /// Bytes of keys and values loaded.
    pub loaded_bytes: u64,
    /// Seconds of each list straight from etcd, in the order run.
    pub direct_seconds: Vec<f64>,
    /// Seconds of each list through the proxy, in the order run.
    pub proxy_seconds: Vec<f64>,
    /// Chunks of the first list of each target (direct, proxy).
    pub chunks: (usize, usize),
    /// The proxy's resident memory before its first list and its peak after its last, in KiB.
    pub proxy_rss_before_kib: u64,
    pub proxy_peak_before_kib: u64,
    pub proxy_peak_after_kib: u64,
}

impl ListReport {
    pub fn direct_median(&self) -> f64 {
        median(&self.direct_seconds)
    }

    pub fn proxy_median(&self) -> f64 {
        median(&self.proxy_seconds)
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

impl Options {
    fn check(&self) -> Result<(), String> {
        if self.keys == 0 || self.runs == 0 {
            return Err("--keys and --runs must be at least 1".into());
        }
        if self.value_min > self.value_max {
            return Err("--value-min must not exceed --value-max".into());
        }
        Ok(())
    }

    /// Key `i` and its value's length.
    fn key(&self, i: usize) -> (String, usize) {
        let spread = self.value_max - self.value_min + 1;
        // A fixed stride through the lengths: every length comes up, neighbours differ.
        let len = self.value_min + (i * 7919) % spread;
        (format!("/registry/pods/ns-{:03}/pod-{i:07}", i % 100), len)
    }
}

/// Loads the keys, then lists them directly and through the proxy in turn, `runs` times each.
pub async fn run(options: &Options, command: String) -> Result<ListReport, String> {
    options.check()?;
    let binaries = crate::plan::named_or_newest(options.etcd.as_ref())?;
    let proxy_bin = crate::plan::proxy_binary(options.proxy_bin.as_ref())?;
    eprintln!(
        "list: etcd {} ({}), this proxy {}",
        binaries.version,
        binaries.etcd.display(),
        proxy_bin.display()
    );
    let etcd = EtcdCluster::start(&binaries, 1, &["--log-level=warn"]).await?;
    let direct = Dialer::new(&etcd.addr(0), None).dial().await?;
    let started = Instant::now();
    let loaded_bytes = load(options, &direct).await?;
    eprintln!(
        "list: loaded {} keys ({:.1} MiB) in {:.1} s",
        options.keys,
        loaded_bytes as f64 / (1024.0 * 1024.0),
        started.elapsed().as_secs_f64()
    );
    let proxy = ProxyProcess::start(&proxy_bin, &etcd.endpoints(), &[] as &[&str]).await?;
    let through = Dialer::new(&proxy.addr(), None).dial().await?;
    let before = procfs::memory(proxy.pid()).map_err(|e| format!("proxy memory: {e}"))?;
    let mut report = ListReport {
        etcd_version: binaries.version.to_string(),
        command,
        machine: options.machine.clone(),
        keys: options.keys,
        value_min: options.value_min,
        value_max: options.value_max,
        loaded_bytes,
        direct_seconds: Vec::new(),
        proxy_seconds: Vec::new(),
        chunks: (0, 0),
        proxy_rss_before_kib: before.rss_kib,
        proxy_peak_before_kib: before.peak_kib,
        proxy_peak_after_kib: 0,
    };
    for round in 0..options.runs {
        for (name, channel) in [("direct", &direct), ("proxy", &through)] {
            let (seconds, chunks) = list(options.keys, channel)
                .await
                .map_err(|e| format!("{name} list {}: {e}", round + 1))?;
            eprintln!(
                "list: {name} {}: {seconds:.3} s, {chunks} chunks",
                round + 1
            );
            let (times, first) = match name {
                "direct" => (&mut report.direct_seconds, &mut report.chunks.0),
                _ => (&mut report.proxy_seconds, &mut report.chunks.1),
            };
            times.push(seconds);
            if *first == 0 {
                *first = chunks;
            }
        }
    }
    report.proxy_peak_after_kib = procfs::memory(proxy.pid())
        .map_err(|e| format!("proxy memory: {e}"))?
        .peak_kib;
    Ok(report)
}

/// Puts every key, `PUTS_PER_TXN` to a Txn, `LOADERS` Txns at a time; the bytes of keys and values put.
async fn load(options: &Options, channel: &Channel) -> Result<u64, String> {
    let batches: Vec<Vec<(String, usize)>> = (0..options.keys)
        .map(|i| options.key(i))
        .collect::<Vec<_>>()
        .chunks(PUTS_PER_TXN)
        .map(<[_]>::to_vec)
        .collect();
    let bytes = batches
        .iter()
        .flatten()
        .map(|(key, len)| (key.len() + len) as u64)
        .sum();
    let puts = futures::stream::iter(batches.into_iter().map(|batch| {
        let mut kv = KvClient::new(channel.clone());
        async move {
            let success = batch
                .into_iter()
                .map(|(key, len)| RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        value: vec![b'v'; len],
                        key: key.into_bytes(),
                        ..Default::default()
                    })),
                })
                .collect();
            kv.txn(TxnRequest {
                success,
                ..Default::default()
            })
            .await
            .map(drop)
            .map_err(|s| format!("load: {:?}: {}", s.code(), s.message()))
        }
    }))
    .buffer_unordered(LOADERS);
    let outcomes: Vec<Result<(), String>> = puts.collect().await;
    outcomes.into_iter().collect::<Result<(), String>>()?;
    Ok(bytes)
}

/// Lists the whole keyspace with RangeStream on `channel`: seconds from the call to the last chunk, and chunks.
/// Fails unless every key came and the last chunk counts them.
async fn list(keys: usize, channel: &Channel) -> Result<(f64, usize), String> {
    let mut kv = KvClient::new(channel.clone());
    let started = Instant::now();
    let listing = async {
        let mut stream = kv
            .range_stream(RangeRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            })
            .await
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
            .into_inner();
        let (mut chunks, mut listed, mut count) = (0, 0, 0);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
            let range = chunk.range_response.unwrap_or_default();
            chunks += 1;
            listed += range.kvs.len();
            count = range.count;
        }
        Ok::<_, String>((chunks, listed, count))
    };
    let (chunks, listed, count) = tokio::time::timeout(LIST_DEADLINE, listing)
        .await
        .map_err(|_| format!("not listed within {LIST_DEADLINE:?}"))??;
    let seconds = started.elapsed().as_secs_f64();
    if listed != keys || count != keys as i64 {
        return Err(format!(
            "listed {listed} keys with count {count}, not {keys}"
        ));
    }
    Ok((seconds, chunks))
}

/// The report as markdown.
pub fn render(report: &ListReport) -> String {
    let times = |seconds: &[f64]| {
        seconds
            .iter()
            .map(|s| format!("{s:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mib = |kib: u64| kib as f64 / 1024.0;
    let (direct, proxy) = (report.direct_median(), report.proxy_median());
    format!(
        "# RangeStream list of {keys} keys, etcd {version}\n\n\
         {keys} keys of {min} to {max} bytes ({loaded:.1} MiB of keys and values), listed with one RangeStream\n\
         over the whole keyspace, {runs} times per target, alternating.\n\n\
         | target | median (s) | runs (s) | chunks |\n|---|---|---|---|\n\
         | direct etcd | {direct:.3} | {direct_runs} | {direct_chunks} |\n\
         | this proxy | {proxy:.3} | {proxy_runs} | {proxy_chunks} |\n\n\
         Proxy / direct: {ratio:.2}x. Proxy memory: {rss:.1} MiB resident before its first list (peak so far \
         {peak_before:.1} MiB), peak {peak_after:.1} MiB after its last (`VmHWM`).\n\n\
         Machine: {machine}. Command: `{command}`.\n",
        keys = report.keys,
        version = report.etcd_version,
        min = report.value_min,
        max = report.value_max,
        loaded = report.loaded_bytes as f64 / (1024.0 * 1024.0),
        runs = report.direct_seconds.len(),
        direct_runs = times(&report.direct_seconds),
        proxy_runs = times(&report.proxy_seconds),
        direct_chunks = report.chunks.0,
        proxy_chunks = report.chunks.1,
        ratio = proxy / direct,
        rss = mib(report.proxy_rss_before_kib),
        peak_before = mib(report.proxy_peak_before_kib),
        peak_after = mib(report.proxy_peak_after_kib),
        machine = report.machine,
        command = report.command,
    )
}

/// Writes `list.md` and `list.json` into `dir`; returns their paths.
pub fn write(report: &ListReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    crate::report::write_md_json(dir, "list", render(report), report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn value_lengths_stay_within_the_bounds_and_take_every_length() {
        let options = Options {
            etcd: None,
            proxy_bin: None,
            keys: 1000,
            value_min: 100,
            value_max: 1000,
            runs: 3,
            out_dir: PathBuf::new(),
            machine: String::new(),
        };
        let lengths: std::collections::BTreeSet<usize> =
            (0..901).map(|i| options.key(i).1).collect();
        assert_eq!(lengths.len(), 901);
        assert_eq!((lengths.first(), lengths.last()), (Some(&100), Some(&1000)));
    }
}
