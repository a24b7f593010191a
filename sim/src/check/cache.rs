//! The range cache (`--range-cache-max-bytes`): reads through the proxy judged against the model's history.
//!
//! - **Answers are the model's state** ([`check_answers`]): every Range answer, serializable or linearizable, from
//!   the cache or from etcd, holds exactly what etcd holds for that range at the revision its header reports, with
//!   the request's options applied as etcd applies them (see [`expected_answer`]): its keys with every field, its
//!   `count` and its `more`. The state at a revision is rebuilt from every revision's events in the history
//!   ([`Timeline`]), so answers at revisions a compaction has since discarded (the model's store no longer holds
//!   them) are checked as strictly as current ones: a copy that a compaction overtook and that kept answering
//!   without the events it missed is caught. A header revision newer than anything the model had committed when
//!   the answer arrived is caught too.
//! - **Revisions never go backwards for one client** ([`check_monotonic`]): a reader makes one call at a time, so
//!   each answer's revision is at least the previous answer's (serializable or not).
//! - **Linearizable answers reflect every acknowledged write** ([`check_linearizable`]): every write acknowledged
//!   before the read started (by a writer straight on a member or through the proxy) is at or below the answer's
//!   revision; together with the first check, every key of the range has the value and `mod_revision` the model
//!   has at that revision.
//! - **No vacuous pass** ([`check_coverage`]): enough serializable and linearizable answers were checked, the
//!   proxy's own `etcd_grpc_proxy_cache_hits_total` says reads were answered from the cache, and compactions ran
//!   while the readers did.
//!
//! [`check_cache`] runs them all.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use proto::etcdserverpb::{RangeRequest, RangeResponse};
use proto::mvccpb::KeyValue;
use proto::mvccpb::event::EventType;
use tonic::Code;

use crate::model::History;
use crate::model::keyspace::KeyRange;

/// How one Range call through the proxy ended.
#[derive(Clone, Debug, PartialEq)]
pub enum ReadOutcome {
    Answer(RangeResponse),
    Failed {
        code: Code,
        message: String,
    },
    /// The client gave up waiting.
    TimedOut,
}

/// One Range call as a reader saw it. A reader makes one call at a time.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadLog {
    pub client: String,
    pub started: Duration,
    pub finished: Duration,
    pub request: RangeRequest,
    pub outcome: ReadOutcome,
}

impl ReadLog {
    fn label(&self) -> String {
        format!(
            "{} {} at {:.3}s",
            self.client,
            describe(&self.request),
            self.started.as_secs_f64()
        )
    }
}

/// A write some client saw acknowledged: the key ranges it wrote (a single key has an empty end) and the revision
/// the acknowledgement reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckedWrite {
    pub writer: String,
    pub what: String,
    pub ranges: Vec<(Vec<u8>, Vec<u8>)>,
    pub revision: i64,
    pub started: Duration,
    pub acked: Duration,
}

/// What the proxy's `/metrics` said over the run: the cache's hit and miss counters, summed over every proxy
/// process (a restarted proxy starts its counters from zero; a fall is taken as a restart).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheMetrics {
    /// Successful reads of `/metrics`.
    pub scrapes: usize,
    pub hits: u64,
    pub misses: u64,
}

impl CacheMetrics {
    /// Adds one reading of the counters (`previous` is the last reading of this proxy process, if any).
    pub fn observe(&mut self, previous: Option<(u64, u64)>, now: (u64, u64)) {
        self.scrapes += 1;
        let (hits_before, misses_before) = match previous {
            Some((hits, misses)) if hits <= now.0 && misses <= now.1 => (hits, misses),
            // First reading, or the counters fell: a new proxy process counted these from zero.
            _ => (0, 0),
        };
        self.hits += now.0 - hits_before;
        self.misses += now.1 - misses_before;
    }
}

/// The least a run must have checked for its pass to mean something.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Minimums {
    pub serializable: usize,
    pub linearizable: usize,
    pub cache_hits: u64,
    /// Compactions made between the first read's start and the last read's end.
    pub compactions: usize,
}

/// What the checks counted, besides the violations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheSummary {
    pub serializable_answers: usize,
    pub linearizable_answers: usize,
    pub failed_reads: usize,
    /// Answers at a revision a compaction had already discarded when the read started.
    pub answers_below_compaction: usize,
    /// Compactions made while the readers ran.
    pub compactions_during_reads: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheVerdict {
    pub violations: Vec<String>,
    pub summary: CacheSummary,
}

/// Every check of this module.
pub fn check_cache(
    history: &History,
    reads: &[ReadLog],
    writes: &[AckedWrite],
    metrics: Option<&CacheMetrics>,
    minimums: &Minimums,
) -> CacheVerdict {
    let timeline = Timeline::new(history);
    let mut violations = check_answers(&timeline, reads);
    violations.extend(check_monotonic(reads));
    violations.extend(check_linearizable(reads, writes));
    let summary = summarize(&timeline, reads);
    violations.extend(check_coverage(&summary, metrics, minimums));
    CacheVerdict {
        violations,
        summary,
    }
}

/// The model's keys through time, rebuilt from every revision's events (compaction discards nothing here).
pub struct Timeline {
    /// Per key, its versions in revision order: the value from that revision on, or `None` once deleted.
    versions: BTreeMap<Vec<u8>, Vec<(i64, Option<KeyValue>)>>,
    /// `(committed at, revision)` of every revision, in order.
    commits: Vec<(Duration, i64)>,
    compactions: Vec<(Duration, i64)>,
}

impl Timeline {
    pub fn new(history: &History) -> Self {
        let mut versions: BTreeMap<Vec<u8>, Vec<(i64, Option<KeyValue>)>> = BTreeMap::new();
        let mut commits = Vec::new();
        for record in &history.revisions {
            commits.push((record.at, record.revision));
            for event in &record.events {
                let Some(kv) = &event.kv else { continue };
                let live = (event.r#type == EventType::Put as i32).then(|| kv.clone());
                versions
                    .entry(kv.key.to_vec())
                    .or_default()
                    .push((record.revision, live));
            }
        }
        Self {
            versions,
            commits,
            compactions: history.compactions.clone(),
        }
    }

    /// The live keys of `range` at `revision`, in key order.
    pub fn live_at(&self, range: &KeyRange, revision: i64) -> Vec<KeyValue> {
        let Some(bounds) = range.bounds() else {
            return Vec::new();
        };
        self.versions
            .range::<Vec<u8>, _>(bounds)
            .filter_map(|(_, versions)| {
                let index = versions.partition_point(|(r, _)| *r <= revision);
                versions[..index].last()?.1.clone()
            })
            .collect()
    }

    /// The newest revision committed at or before `at` (1, the empty store's, before any).
    pub fn revision_at(&self, at: Duration) -> i64 {
        let index = self.commits.partition_point(|(t, _)| *t <= at);
        self.commits[..index].last().map_or(1, |(_, r)| *r)
    }

    /// The compaction revision in force at `at` (0 before any compaction).
    pub fn compacted_at(&self, at: Duration) -> i64 {
        self.compactions
            .iter()
            .filter(|(t, _)| *t <= at)
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(0)
    }

    /// How many compactions were made within `[from, to]`.
    pub fn compactions_within(&self, from: Duration, to: Duration) -> usize {
        self.compactions
            .iter()
            .filter(|(t, _)| *t >= from && *t <= to)
            .count()
    }
}

/// What etcd answers to `request` when its range holds `live` (every key of the range, in key order) at the
/// answer's revision: `(kvs, count, more)`. etcd (`server/etcdserver/txn`, `mvcc/kvstore_txn.go`): `count` is the
/// number of keys in the range, before the revision filters and the limit; the filters drop keys, then the sort,
/// then the limit cuts and sets `more`; `count_only` makes mvcc return no keys at all, so nothing is cut and
/// `more` stays false; `keys_only` empties the values. A sort on a target other than the key without an order is
/// ascending; keys that tie on such a target stay in key order (the model's sort is stable; the cache sends such
/// reads to etcd).
pub fn expected_answer(request: &RangeRequest, live: Vec<KeyValue>) -> (Vec<KeyValue>, i64, bool) {
    let count = live.len() as i64;
    if request.count_only {
        return (Vec::new(), count, false);
    }
    let within =
        |value: i64, min: i64, max: i64| (min == 0 || value >= min) && (max == 0 || value <= max);
    let mut kvs: Vec<KeyValue> = live
        .into_iter()
        .filter(|kv| {
            within(
                kv.mod_revision,
                request.min_mod_revision,
                request.max_mod_revision,
            ) && within(
                kv.create_revision,
                request.min_create_revision,
                request.max_create_revision,
            )
        })
        .collect();
    let target = SortTarget::try_from(request.sort_target).unwrap_or(SortTarget::Key);
    let order = match SortOrder::try_from(request.sort_order).unwrap_or(SortOrder::None) {
        SortOrder::None if target != SortTarget::Key => SortOrder::Ascend,
        other => other,
    };
    if order != SortOrder::None {
        kvs.sort_by(|a, b| {
            let ordering = match target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            };
            match order {
                SortOrder::Descend => ordering.reverse(),
                _ => ordering,
            }
        });
    }
    let mut more = false;
    if request.limit > 0 && kvs.len() as i64 > request.limit {
        kvs.truncate(request.limit as usize);
        more = true;
    }
    if request.keys_only {
        for kv in &mut kvs {
            kv.value = Default::default();
        }
    }
    (kvs, count, more)
}

/// Check 1: every answer holds the model's state of its range at the revision its header reports.
pub fn check_answers(timeline: &Timeline, reads: &[ReadLog]) -> Vec<String> {
    let mut violations = Vec::new();
    for read in reads {
        let ReadOutcome::Answer(answer) = &read.outcome else {
            continue;
        };
        let Some(revision) = answer.header.map(|h| h.revision) else {
            violations.push(format!("{}: an answer without a header", read.label()));
            continue;
        };
        let committed = timeline.revision_at(read.finished);
        if revision < 1 || revision > committed {
            violations.push(format!(
                "{}: answered at revision {revision}, but the model had committed only through {committed} when \
                 the answer arrived",
                read.label()
            ));
            continue;
        }
        let range = KeyRange::new(&read.request.key, &read.request.range_end);
        let (kvs, count, more) = expected_answer(&read.request, timeline.live_at(&range, revision));
        let mut wrong = String::new();
        if answer.kvs != kvs {
            let _ = write!(
                wrong,
                " kvs {} where the model has {}",
                show_kvs(&answer.kvs),
                show_kvs(&kvs)
            );
        }
        if answer.count != count {
            let _ = write!(wrong, " count {} where the model has {count}", answer.count);
        }
        if answer.more != more {
            let _ = write!(wrong, " more {} where the model has {more}", answer.more);
        }
        if !wrong.is_empty() {
            let compacted = timeline.compacted_at(read.started);
            let note = match revision < compacted {
                true => {
                    format!(" (revision {revision} was compacted at {compacted} before the read)")
                }
                false => String::new(),
            };
            violations.push(format!(
                "{}: the answer at revision {revision} is not the model's state{note}:{wrong}",
                read.label()
            ));
        }
    }
    violations
}

/// Check 2: each client's answers never go back in revision (its calls are sequential).
pub fn check_monotonic(reads: &[ReadLog]) -> Vec<String> {
    let mut violations = Vec::new();
    let mut last: BTreeMap<&str, (i64, &ReadLog)> = BTreeMap::new();
    let mut ordered: Vec<&ReadLog> = reads.iter().collect();
    ordered.sort_by_key(|read| read.started);
    for read in ordered {
        let ReadOutcome::Answer(answer) = &read.outcome else {
            continue;
        };
        let Some(revision) = answer.header.map(|h| h.revision) else {
            continue;
        };
        if let Some((before, previous)) = last.get(read.client.as_str())
            && revision < *before
        {
            violations.push(format!(
                "{}: answered at revision {revision}, but an earlier answer to the same client ({}, finished at \
                 {:.3}s) was at revision {before}: revisions went backwards",
                read.label(),
                describe(&previous.request),
                previous.finished.as_secs_f64()
            ));
        }
        let entry = last.entry(&read.client).or_insert((revision, read));
        if revision >= entry.0 {
            *entry = (revision, read);
        }
    }
    violations
}

/// Check 3: a linearizable answer is at or after the revision of every write acknowledged before the read started.
pub fn check_linearizable(reads: &[ReadLog], writes: &[AckedWrite]) -> Vec<String> {
    let mut violations = Vec::new();
    for read in reads.iter().filter(|r| !r.request.serializable) {
        let ReadOutcome::Answer(answer) = &read.outcome else {
            continue;
        };
        let revision = answer.header.map_or(0, |h| h.revision);
        let range = KeyRange::new(&read.request.key, &read.request.range_end);
        // The latest acknowledged write before the read started, preferring one on the read's range.
        let missed = writes
            .iter()
            .filter(|w| w.acked < read.started && w.revision > revision)
            .max_by_key(|w| (touches(w, &range), w.revision));
        if let Some(write) = missed {
            let place = match touches(write, &range) {
                true => "on the read's range",
                false => "elsewhere",
            };
            violations.push(format!(
                "{}: a linearizable answer at revision {revision} misses {} {} {place}, acknowledged at revision \
                 {} at {:.3}s, before the read started",
                read.label(),
                write.writer,
                write.what,
                write.revision,
                write.acked.as_secs_f64()
            ));
        }
    }
    violations
}

fn touches(write: &AckedWrite, range: &KeyRange) -> bool {
    write
        .ranges
        .iter()
        .any(|(key, end)| KeyRange::new(key, end).overlaps(range))
}

fn summarize(timeline: &Timeline, reads: &[ReadLog]) -> CacheSummary {
    let mut summary = CacheSummary::default();
    for read in reads {
        match &read.outcome {
            ReadOutcome::Answer(answer) => {
                match read.request.serializable {
                    true => summary.serializable_answers += 1,
                    false => summary.linearizable_answers += 1,
                }
                let revision = answer.header.map_or(0, |h| h.revision);
                if revision < timeline.compacted_at(read.started) {
                    summary.answers_below_compaction += 1;
                }
            }
            _ => summary.failed_reads += 1,
        }
    }
    let from = reads.iter().map(|r| r.started).min();
    let to = reads.iter().map(|r| r.finished).max();
    if let (Some(from), Some(to)) = (from, to) {
        summary.compactions_during_reads = timeline.compactions_within(from, to);
    }
    summary
}

/// No vacuous pass: enough answers were checked, the cache answered some of them, compactions overlapped the reads.
pub fn check_coverage(
    summary: &CacheSummary,
    metrics: Option<&CacheMetrics>,
    minimums: &Minimums,
) -> Vec<String> {
    let mut violations = Vec::new();
    if summary.serializable_answers < minimums.serializable {
        violations.push(format!(
            "only {} serializable answers were checked (at least {} wanted)",
            summary.serializable_answers, minimums.serializable
        ));
    }
    if summary.linearizable_answers < minimums.linearizable {
        violations.push(format!(
            "only {} linearizable answers were checked (at least {} wanted)",
            summary.linearizable_answers, minimums.linearizable
        ));
    }
    match metrics {
        None => violations.push("the proxy's /metrics was never read".into()),
        Some(metrics) if metrics.scrapes == 0 => {
            violations.push("the proxy's /metrics was never read".into())
        }
        Some(metrics) if metrics.hits < minimums.cache_hits => violations.push(format!(
            "the proxy answered {} reads from its cache (etcd_grpc_proxy_cache_hits_total, {} misses), at least {} \
             wanted: the checks did not exercise the cache",
            metrics.hits, metrics.misses, minimums.cache_hits
        )),
        Some(_) => {}
    }
    if summary.compactions_during_reads < minimums.compactions {
        violations.push(format!(
            "{} compactions while the readers ran (at least {} wanted)",
            summary.compactions_during_reads, minimums.compactions
        ));
    }
    violations
}

/// A Range request in a trace line or a violation: its range, consistency and options.
pub fn describe(request: &RangeRequest) -> String {
    let mut text = format!("range {}", show_range(&request.key, &request.range_end),);
    text.push_str(match request.serializable {
        true => " serializable",
        false => " linearizable",
    });
    if request.limit != 0 {
        let _ = write!(text, " limit={}", request.limit);
    }
    if request.count_only {
        text.push_str(" count_only");
    }
    if request.keys_only {
        text.push_str(" keys_only");
    }
    if request.sort_order != 0 || request.sort_target != 0 {
        let order = SortOrder::try_from(request.sort_order).map_or("?", |o| o.as_str_name());
        let target = SortTarget::try_from(request.sort_target).map_or("?", |t| t.as_str_name());
        let _ = write!(text, " sort={target}/{order}");
    }
    for (name, value) in [
        ("min_mod", request.min_mod_revision),
        ("max_mod", request.max_mod_revision),
        ("min_create", request.min_create_revision),
        ("max_create", request.max_create_revision),
    ] {
        if value != 0 {
            let _ = write!(text, " {name}={value}");
        }
    }
    text
}

fn show_range(key: &[u8], end: &[u8]) -> String {
    match end {
        [] => show(key),
        [0] => format!("[{}, end of keyspace)", show(key)),
        _ => format!("[{}, {})", show(key), show(end)),
    }
}

fn show(bytes: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(bytes))
}

fn show_kvs(kvs: &[KeyValue]) -> String {
    let items: Vec<String> = kvs
        .iter()
        .map(|kv| {
            format!(
                "{}={}@{} (created {}, v{})",
                String::from_utf8_lossy(&kv.key),
                String::from_utf8_lossy(&kv.value),
                kv.mod_revision,
                kv.create_revision,
                kv.version
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}
