//! Namespace confinement: a proxy with `--namespace` reaches only the keys under its prefix. Every key range a
//! request named on a member (the model's [`KeyAccess`](crate::model::KeyAccess) record) lies within the prefix of
//! the proxy that member serves, and every key a revision changed lies within one of the prefixes.

use std::collections::BTreeMap;

use crate::model::History;
use crate::model::keyspace::KeyRange;

/// Checks `history` against the prefix each member's only client (a proxy) was configured with. A member missing
/// from `prefixes` must have been named no key at all.
pub fn check_confinement(history: &History, prefixes: &BTreeMap<usize, Vec<u8>>) -> Vec<String> {
    let mut violations = Vec::new();
    for access in &history.accesses {
        let Some(prefix) = prefixes.get(&access.member) else {
            violations.push(format!(
                "member {} was named {:?} {} by a client with no namespace",
                access.member,
                access.kind,
                show_range(&access.key, &access.range_end)
            ));
            continue;
        };
        let range = KeyRange::new(&access.key, &access.range_end);
        if !range.within(&KeyRange::prefix(prefix)) {
            violations.push(format!(
                "member {} at {:.3}s: {:?} {} is outside namespace {}",
                access.member,
                access.at.as_secs_f64(),
                access.kind,
                show_range(&access.key, &access.range_end),
                show(prefix)
            ));
        }
    }
    let namespaces: Vec<KeyRange> = prefixes.values().map(|p| KeyRange::prefix(p)).collect();
    for record in &history.revisions {
        for event in &record.events {
            let key = event.kv.as_ref().map_or(&[][..], |kv| &kv.key[..]);
            let single = KeyRange::new(key, b"");
            if !namespaces.iter().any(|ns| single.within(ns)) {
                violations.push(format!(
                    "revision {} wrote key {} outside every namespace",
                    record.revision,
                    show(key)
                ));
            }
        }
    }
    violations
}

/// Bytes as a Rust byte string literal (`b"a\xff"`), for messages about keys.
pub fn show(bytes: &[u8]) -> String {
    format!("b\"{}\"", bytes.escape_ascii())
}

/// A key range as `key` alone, `[key, end)` or `[key, ∞)`.
pub fn show_range(key: &[u8], range_end: &[u8]) -> String {
    match range_end {
        [] => show(key),
        [0] => format!("[{}, ∞)", show(key)),
        end => format!("[{}, {})", show(key), show(end)),
    }
}
