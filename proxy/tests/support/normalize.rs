//! Makes `etcdctl` output (text and `-w json`) from two different etcd instances comparable.
//!
//! Both instances are fresh and get the same command sequence, so keys, values, revisions,
//! versions and counts match exactly and are kept. What differs by nature is redacted:
//! ports and temp paths, timings, database and snapshot sizes and hashes, raft terms and
//! indexes, and remaining lease TTLs. Cluster, member and lease IDs are replaced by
//! placeholders `<ID1>`, `<ID2>`, ... numbered in order of first appearance (hex and decimal
//! forms of one ID get the same placeholder), which keeps "same lease as before" checkable.
//! A placeholder can be turned back into this instance's real ID with [`Normalizer::resolve`],
//! so a step can say `lease revoke <ID3>`.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::{Captures, Regex};

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).unwrap_or_else(|e| panic!("bad regex {pattern:?}: {e}"))
}

static PORT: LazyLock<Regex> = LazyLock::new(|| re(r"(127\.0\.0\.1|localhost):\d+"));
static JSON_ID: LazyLock<Regex> =
    LazyLock::new(|| re(r#""(cluster_id|member_id|ID|id|lease|leader)":(\d+)"#));
static JSON_REDACT: LazyLock<Regex> = LazyLock::new(|| {
    re(r#""(raft_term|raftTerm|raftIndex|raftAppliedIndex|dbSize|dbSizeInUse|hash|totalSize)":\d+"#)
});
static JSON_TOOK: LazyLock<Regex> = LazyLock::new(|| re(r#""took":"[^"]*""#));
static JSON_REMAINING_TTL: LazyLock<Regex> = LazyLock::new(|| re(r#""(TTL|ttl)":-?\d+"#));
static HEX_ID: LazyLock<Regex> = LazyLock::new(|| re(r"\b[0-9a-f]{12,16}\b"));
static TOOK: LazyLock<Regex> = LazyLock::new(|| re(r"took = [0-9.]+[a-zµ]+"));
static REMAINING: LazyLock<Regex> = LazyLock::new(|| re(r"remaining\(-?\d+s\)"));
static ENDPOINT_STATUS: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?m)^(\S+), (<ID\d+>), ([0-9.]+), [0-9.]+ [kMGT]?B, (true|false), (true|false), \d+, \d+, \d+, ",
    )
});
static SNAPSHOT_STATUS: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?m)^[0-9a-f]{1,8}, (\d+), (\d+), [0-9.]+ [kMGT]?B$"));
static SIZE: LazyLock<Regex> = LazyLock::new(|| re(r"\b\d+(\.\d+)? (B|kB|MB|GB|TB)\b"));
static ATTACHED_KEYS: LazyLock<Regex> = LazyLock::new(|| re(r"attached keys\(\[([^\]]*)\]\)"));
static JSON_KEYS: LazyLock<Regex> = LazyLock::new(|| re(r#""keys":\[([^\]]*)\]"#));
static PLACEHOLDER: LazyLock<Regex> = LazyLock::new(|| re(r"<ID(\d+)>"));

/// The normaliser for one target (one etcd, direct or behind the proxy). It is stateful: IDs
/// keep their placeholders across all the steps of a scenario.
#[derive(Default)]
pub struct Normalizer {
    ids: HashMap<u64, usize>,
    values: Vec<u64>,
    literals: Vec<(String, String)>,
}

impl Normalizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces every occurrence of `from` by `to` before anything else (e.g. a temp dir).
    pub fn add_literal(&mut self, from: impl Into<String>, to: impl Into<String>) {
        self.literals.push((from.into(), to.into()));
    }

    /// The placeholder for an ID value (0 stays `0`: "no lease").
    pub fn id(&mut self, value: u64) -> String {
        if value == 0 {
            return "0".to_string();
        }
        let next = self.values.len() + 1;
        let n = *self.ids.entry(value).or_insert(next);
        if n == next {
            self.values.push(value);
        }
        format!("<ID{n}>")
    }

    /// Replaces placeholders `<IDn>` in `text` with this target's real IDs in hex (the form
    /// etcdctl takes them in). Panics on a placeholder this target has not seen.
    pub fn resolve(&self, text: &str) -> String {
        PLACEHOLDER
            .replace_all(text, |c: &Captures<'_>| {
                let n: usize = c[1].parse().expect("placeholder number");
                let value = self
                    .values
                    .get(n.wrapping_sub(1))
                    .unwrap_or_else(|| panic!("placeholder <ID{n}> not seen yet on this target"));
                format!("{value:x}")
            })
            .into_owned()
    }

    /// Normalises an `etcdctl` stdout.
    pub fn stdout(&mut self, text: &str) -> String {
        let mut s = text.to_string();
        for (from, to) in &self.literals {
            s = s.replace(from.as_str(), to);
        }
        let s = PORT.replace_all(&s, "$1:<PORT>");
        let s = JSON_ID
            .replace_all(&s, |c: &Captures<'_>| {
                let value: u64 = c[2].parse().expect("u64 id");
                format!("\"{}\":{}", &c[1], self.id(value))
            })
            .into_owned();
        let s = JSON_REDACT.replace_all(&s, "\"$1\":<N>");
        let s = JSON_TOOK.replace_all(&s, "\"took\":\"<DURATION>\"");
        // `lease timetolive -w json`: "ttl" is what remains, "granted-ttl" what was granted.
        let s = if s.contains("\"grantedTTL\"") || s.contains("\"granted-ttl\"") {
            JSON_REMAINING_TTL
                .replace_all(&s, "\"$1\":<N>")
                .into_owned()
        } else {
            s.into_owned()
        };
        let s = HEX_ID
            .replace_all(&s, |c: &Captures<'_>| {
                let value = u64::from_str_radix(&c[0], 16).expect("hex id");
                self.id(value)
            })
            .into_owned();
        let s = TOOK.replace_all(&s, "took = <DURATION>");
        let s = REMAINING.replace_all(&s, "remaining(<N>s)");
        let s = ENDPOINT_STATUS
            .replace_all(&s, "$1, $2, $3, <SIZE>, $4, $5, <TERM>, <INDEX>, <INDEX>, ");
        let s = SNAPSHOT_STATUS.replace_all(&s, "<HASH>, $1, $2, <SIZE>");
        let s = SIZE.replace_all(&s, "<SIZE>");
        // etcd lists a lease's keys in map order, which varies from run to run.
        let s = ATTACHED_KEYS.replace_all(&s, |c: &Captures<'_>| {
            format!("attached keys([{}])", sorted(&c[1], " "))
        });
        let s = JSON_KEYS.replace_all(&s, |c: &Captures<'_>| {
            format!("\"keys\":[{}]", sorted(&c[1], ","))
        });
        s.into_owned()
    }

    /// Normalises an `etcdctl` stderr: drops the client library's JSON log lines (timestamps,
    /// client UUIDs, retry attempts) and normalises the rest, e.g. `Error: ...` lines.
    pub fn stderr(&mut self, text: &str) -> String {
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("{\"level\":"))
            .collect();
        let mut joined = kept.join("\n");
        if !joined.is_empty() && text.ends_with('\n') {
            joined.push('\n');
        }
        self.stdout(&joined)
    }
}

fn sorted(list: &str, sep: &str) -> String {
    let mut items: Vec<&str> = list.split(sep).collect();
    items.sort_unstable();
    items.join(sep)
}
