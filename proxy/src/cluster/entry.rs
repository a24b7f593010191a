//! The naming format etcd's clients resolve (`etcd:///<prefix>`, `client/v3/naming`) and etcd's Go proxy writes:
//! one key per proxy, `<prefix>/<advertise-client-url>`, whose value is the JSON
//! `{"Op":0,"Addr":"<url>","Metadata":"{\"name\":\"<host name>\"}"}` (Metadata is a JSON string that holds JSON;
//! `Op` 0 is "add" for etcd 3.4's resolver, and later ones ignore it).

use serde::{Deserialize, Serialize};

/// The key of the proxy advertised at `url` under `prefix` (a prefix ending in `/` gives `//`, as in Go).
pub fn key(prefix: &[u8], url: &str) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.push(b'/');
    key.extend_from_slice(url.as_bytes());
    key
}

/// The first key of every registration under `prefix`, and the end of their range.
pub fn range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let start = key(prefix, "");
    let mut end = start.clone();
    // The start ends in `/`, so incrementing that last byte gives `0`: the end of the range of keys it starts.
    *end.last_mut().expect("ends in /") += 1;
    (start, end)
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Update {
    #[serde(default)]
    op: u8,
    addr: String,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
struct Metadata {
    name: String,
}

/// The value registering `url` for the host `name`.
pub fn value(url: &str, name: &str) -> String {
    let metadata = serde_json::to_string(&Metadata {
        name: name.to_owned(),
    })
    .expect("a string field serialises");
    serde_json::to_string(&Update {
        op: 0,
        addr: url.to_owned(),
        metadata: Some(serde_json::Value::String(metadata)),
    })
    .expect("strings serialise")
}

/// A registered proxy: its client URL, and the host name it gave (its URL when it gave none).
#[derive(Debug, PartialEq, Eq)]
pub struct Registered {
    pub url: String,
    pub name: String,
}

/// Reads a registration value; `None` for one that is not in the naming format (it is skipped, as etcd's resolver
/// skips it: etcd's Go proxy instead fails every MemberList while such a value exists).
pub fn parse(value: &[u8]) -> Option<Registered> {
    let update: Update = serde_json::from_slice(value).ok()?;
    if update.addr.is_empty() {
        return None;
    }
    let name = match update.metadata {
        // Go writes the metadata as a JSON string holding JSON; accept the object itself too.
        Some(serde_json::Value::String(text)) => serde_json::from_str::<Metadata>(&text).ok(),
        Some(object @ serde_json::Value::Object(_)) => {
            serde_json::from_value::<Metadata>(object).ok()
        }
        _ => None,
    }
    .map(|m| m.name)
    .filter(|name| !name.is_empty())
    // clientv3's Sync drops members without a name, so a nameless registration is named by its URL.
    .unwrap_or_else(|| update.addr.clone());
    Some(Registered {
        url: update.addr,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_is_gos_naming_format() {
        assert_eq!(
            value("127.0.0.1:23790", "host-a"),
            r#"{"Op":0,"Addr":"127.0.0.1:23790","Metadata":"{\"name\":\"host-a\"}"}"#
        );
    }

    #[test]
    fn values_round_trip_and_odd_ones_are_read_or_skipped() {
        assert_eq!(
            parse(value("https://p:1", "h").as_bytes()),
            Some(Registered {
                url: "https://p:1".into(),
                name: "h".into()
            })
        );
        // etcd 3.5's endpoints manager writes no Op; an object as metadata; no metadata at all.
        assert_eq!(
            parse(br#"{"Addr":"p:2","Metadata":{"name":"n"}}"#).map(|r| r.name),
            Some("n".into())
        );
        assert_eq!(
            parse(br#"{"Addr":"p:3"}"#).map(|r| r.name),
            Some("p:3".into())
        );
        assert_eq!(parse(b"not json"), None);
        assert_eq!(parse(br#"{"Addr":""}"#), None);
    }

    #[test]
    fn keys_and_their_range_follow_go() {
        assert_eq!(key(b"proxies", "a:1"), b"proxies/a:1");
        assert_eq!(key(b"proxies/", "a:1"), b"proxies//a:1");
        let (start, end) = range(b"proxies");
        assert_eq!(start, b"proxies/");
        assert_eq!(end, b"proxies0");
    }
}
