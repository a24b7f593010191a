//! Where the ownership key of a key lies: `P+key` inside `--namespace`, as etcd's Go proxy puts it (its leasing KV
//! wraps the namespaced KV), so the ownership key of the client's `k` is `namespace + P + k` in etcd.

use crate::namespace::Namespace;

/// The leasing prefix within the namespace.
#[derive(Debug, Clone)]
pub struct OwnershipKeys {
    /// `--namespace`, if any.
    namespace: Option<Namespace>,
    /// `namespace + P`.
    owners: Namespace,
}

impl OwnershipKeys {
    /// `None` for an empty prefix (leasing off).
    pub fn new(namespace: &[u8], prefix: &[u8]) -> Option<Self> {
        if prefix.is_empty() {
            return None;
        }
        let owners = Namespace::new(&[namespace, prefix].concat())?;
        Some(Self {
            namespace: Namespace::new(namespace),
            owners,
        })
    }

    /// The key as the client sees it (`None` if it is not in the namespace, which the namespace layer refuses).
    fn client_key<'a>(&self, key: &'a [u8]) -> Option<&'a [u8]> {
        match &self.namespace {
            Some(namespace) => namespace.strip(key),
            None => Some(key),
        }
    }

    /// The ownership key of `key` (as etcd sees both).
    pub fn of(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.client_key(key).map(|k| self.owners.key(k))
    }

    /// The ownership keys of the range `[key, end)` (end non-empty), as a range in etcd.
    pub fn of_range(&self, key: &[u8], end: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        let start = self.of(key)?;
        let client_end = match &self.namespace {
            Some(namespace) => namespace.strip_range_end(end)?,
            None => end.to_vec(),
        };
        Some((start, self.owners.range_end(&client_end)))
    }

    /// The key an ownership key stands for, if `owner` is one.
    pub fn owned_key(&self, owner: &[u8]) -> Option<Vec<u8>> {
        let client_key = self.owners.strip(owner)?;
        Some(match &self.namespace {
            Some(namespace) => namespace.key(client_key),
            None => client_key.to_vec(),
        })
    }

    /// The range every ownership key lies in.
    pub fn all(&self) -> (Vec<u8>, Vec<u8>) {
        (self.owners.prefix().to_vec(), self.owners.range_end(&[0]))
    }

    /// Whether `key` is itself an ownership key (read and written as an ordinary key, never leased).
    pub fn is_ownership_key(&self, key: &[u8]) -> bool {
        self.owners.strip(key).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_keys_live_inside_the_namespace() {
        let keys = OwnershipKeys::new(b"/ns/", b"L/").unwrap();
        assert_eq!(keys.of(b"/ns/a").unwrap(), b"/ns/L/a");
        assert_eq!(keys.owned_key(b"/ns/L/a").unwrap(), b"/ns/a");
        assert_eq!(keys.of(b"/other"), None);
        // "\0" from the client became the namespace's end: the ownership range ends where the prefix ends.
        assert_eq!(
            keys.of_range(b"/ns/", b"/ns0").unwrap(),
            (b"/ns/L/".to_vec(), b"/ns/L0".to_vec())
        );
        assert_eq!(
            keys.of_range(b"/ns/a", b"/ns/c").unwrap(),
            (b"/ns/L/a".to_vec(), b"/ns/L/c".to_vec())
        );
        assert!(keys.is_ownership_key(b"/ns/L/x") && !keys.is_ownership_key(b"/ns/x"));
    }

    #[test]
    fn without_a_namespace_the_prefix_is_the_whole_story() {
        let keys = OwnershipKeys::new(b"", b"L/").unwrap();
        assert_eq!(keys.of(b"a").unwrap(), b"L/a");
        assert_eq!(
            keys.of_range(b"a", &[0]).unwrap(),
            (b"L/a".to_vec(), b"L0".to_vec())
        );
        assert_eq!(keys.all(), (b"L/".to_vec(), b"L0".to_vec()));
        assert!(OwnershipKeys::new(b"", b"").is_none());
    }
}
